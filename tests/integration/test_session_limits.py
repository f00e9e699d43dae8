"""Database sessions cannot hang the system: each role's sessions carry their timeouts, and a
transaction left idle by a frozen process is ended by PostgreSQL, releasing its locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest

from services.common.db import ROLE_LIMITS, session_kwargs


@pytest.mark.parametrize("role", sorted(ROLE_LIMITS))
def test_every_role_s_sessions_carry_its_timeouts_and_keepalives(database_url: str, role: str) -> None:
    limits = ROLE_LIMITS[role]
    with psycopg.connect(database_url, **session_kwargs("limits-test", role)) as conn:
        shown = {
            name: conn.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,)).fetchone()[
                "setting"
            ]  # type: ignore[index]
            for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        }
        assert conn.info.get_parameters()["keepalives"] == "1"
    assert shown == {
        "statement_timeout": str(limits.statement_timeout_ms),
        "lock_timeout": str(limits.lock_timeout_ms),
        "idle_in_transaction_session_timeout": str(limits.idle_in_transaction_ms),
    }


def test_a_frozen_process_holding_a_row_lock_loses_its_session_and_the_lock(database_url: str) -> None:
    # Given a process that locks a row inside a transaction and then freezes (SIGSTOP)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS frozen_lock_test (id int PRIMARY KEY)")
        admin.execute("INSERT INTO frozen_lock_test VALUES (1) ON CONFLICT DO NOTHING")
    script = (
        "import psycopg, sys, time\n"
        "conn = psycopg.connect(sys.argv[1], options='-c idle_in_transaction_session_timeout=1000')\n"
        "conn.execute('SELECT * FROM frozen_lock_test WHERE id = 1 FOR UPDATE')\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, database_url], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        os.kill(holder.pid, signal.SIGSTOP)
        # When a worker session wants the row: it gets it (had the frozen session kept its lock, the
        # worker's lock_timeout would have refused with LockNotAvailable)
        with psycopg.connect(database_url, **session_kwargs("limits-test", "worker")) as conn:
            row = conn.execute("SELECT id FROM frozen_lock_test WHERE id = 1 FOR UPDATE").fetchone()
        assert row == {"id": 1}
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS frozen_lock_test")
