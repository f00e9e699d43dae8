"""A bench recreates its own database, but never one another run of it is still using."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from bench.resources import bench_database
from fix_db import drop_database
from services.common.settings import CommonSettings


def test_a_bench_refuses_to_recreate_a_database_another_run_is_still_using() -> None:
    name = f"fatura_bench_test_{uuid.uuid4().hex[:8]}"
    url = bench_database(name)
    try:
        with psycopg.connect(url) as other_run:
            other_run.execute("CREATE TABLE still_here (x int)")
            other_run.commit()
            with pytest.raises(SystemExit, match=f"--database {name}_2"):
                bench_database(name)
            # The other run's connection and data are untouched
            assert other_run.execute("SELECT count(*) FROM still_here").fetchone() == (0,)
        # Once that run has gone, the database is recreated (the table is gone, the migrations are there)
        assert bench_database(name) == url
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('still_here')").fetchone() == (None,)
            assert conn.execute("SELECT to_regclass('extraction_jobs')").fetchone() != (None,)
    finally:
        drop_database(make_conninfo(CommonSettings.from_env().database_url, dbname=name))
