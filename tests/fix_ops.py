"""Helpers for the operator's tools: the ``fatura`` command as a subprocess, operator keys, dead letters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fix_processes import ROOT
from services.acceptance.keys import OPERATOR, create_key
from services.common import deadletters
from services.common.db import SyncPool


def fatura(
    *args: str, env: dict[str, str], check: bool = True, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``fatura ARGS`` as an operator would, against the test database."""
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


@dataclass(frozen=True)
class KeyHandle:
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def make_operator(pool: SyncPool, label: str | None = None) -> KeyHandle:
    _info, key = create_key(pool, scope=OPERATOR, label=label)
    return KeyHandle(key)


def dramatiq_message(queue: str, event: dict[str, Any], message_id: str | None = None) -> dict[str, Any]:
    """A message as Dramatiq stores it (what a dead letter keeps to publish again)."""
    return {
        "queue_name": queue,
        "actor_name": "ingest",
        "args": [],
        "kwargs": {"event": event},
        "options": {},
        "message_id": message_id or str(uuid.uuid4()),
        "message_timestamp": int(time.time() * 1000),
    }


def dead_letter(
    pool: SyncPool,
    *,
    queue: str,
    reason: str,
    sendable: bool = True,
    at: datetime | None = None,
    source: str = "consumer",
) -> int:
    """Record a dead letter (with a message, or only an undecodable body); returns its id."""
    message_id = str(uuid.uuid4())
    message = dramatiq_message(queue, {"event_id": message_id, "type": "test.v1"}, message_id)
    dead_letter_id = deadletters.record(
        pool,
        queue=queue,
        actor="ingest" if sendable else "?",
        message_id=message_id if sendable else None,
        reason=reason,
        detail=f"refused in a test ({reason})",
        message=message if sendable else None,
        body=None if sendable else "not a message \x00 at all",
        source=source,
    )
    if at is not None:
        with pool.connection() as conn:
            conn.execute("UPDATE dead_letters SET at = %s WHERE id = %s", (at, dead_letter_id))
    return dead_letter_id


def dead_letter_row(pool: SyncPool, dead_letter_id: int) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM dead_letters WHERE id = %s", (dead_letter_id,)).fetchone()
    assert row is not None
    return row
