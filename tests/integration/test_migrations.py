"""`fatura migrate`: ordered, recorded, under an advisory lock; safe twice and from several processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fix_db import drop_database
from fix_processes import ROOT
from services.common.migrate import MigrationError, discover, migrate


@pytest.fixture
def scratch_url(database_url: str) -> Iterator[str]:
    url = database_url + "_migrations"
    drop_database(url)
    yield url
    drop_database(url)


def _migrate_process(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "migrate"],
        cwd=ROOT,
        env={**os.environ, "FATURA_DATABASE_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_four_processes_migrating_a_new_database_at_once_apply_each_migration_once(scratch_url: str) -> None:
    processes = [_migrate_process(scratch_url) for _ in range(4)]
    outputs = [p.communicate(timeout=60)[0] for p in processes]

    assert [p.returncode for p in processes] == [0] * 4, outputs
    applied_lines = sum(out.count("applied 0001_core") for out in outputs)
    assert applied_lines == 1
    with psycopg.connect(scratch_url) as conn:
        rows = conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert rows == [(m.version, m.name) for m in discover()]


def test_migrating_twice_does_nothing_the_second_time(scratch_url: str) -> None:
    assert [m.version for m in migrate(scratch_url)] == [m.version for m in discover()]
    assert migrate(scratch_url) == []


def test_a_migration_edited_after_it_was_applied_is_refused(scratch_url: str, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_first.sql").write_text("CREATE TABLE t1 (id int);")
    migrate(scratch_url, migrations)
    (migrations / "0001_first.sql").write_text("CREATE TABLE t1 (id bigint);")

    with pytest.raises(MigrationError, match="edited after it was applied"):
        migrate(scratch_url, migrations)


def test_a_failing_migration_leaves_nothing_half_applied(scratch_url: str, tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_first.sql").write_text("CREATE TABLE t1 (id int);")
    (migrations / "0002_broken.sql").write_text("CREATE TABLE t2 (id int); SELECT no_such_function();")

    with pytest.raises(psycopg.Error):
        migrate(scratch_url, migrations)

    with psycopg.connect(scratch_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
        t2 = conn.execute("SELECT to_regclass('t2')").fetchone()
    assert versions == [1]
    assert t2 == (None,)


def test_badly_named_migration_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "1_x.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_lower_snake\.sql"):
        discover(tmp_path)
