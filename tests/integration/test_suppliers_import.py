"""``fatura suppliers import`` as an operator meets it: a bad row is named, the command exits 1 and
the tenant's master data is as it was; tax ids are stored normalized, one row per supplier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fix_db import SyncPool
from fix_processes import ROOT

GOOD = b"tax_id,name,iban,currency\n94-1234567,Pinecrest Supply Co.,,USD\n"


def _fatura(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _suppliers(pool: SyncPool, tenant_id: str) -> dict[str, str]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT tax_id, name FROM suppliers WHERE tenant_id = %s", (uuid.UUID(tenant_id),)
        ).fetchall()
    return {r["tax_id"]: r["name"] for r in rows}


@pytest.fixture
def tenant_id(base_env: dict[str, str]) -> str:
    created = _fatura("tenants", "create", "suppliers", env=base_env)
    assert created.returncode == 0, created.stderr
    return str(json.loads(created.stdout)["tenant_id"])


# Each file renames the known supplier in its first row, so a partial write would show.
RENAME = b"941234567,Renamed Ltd,,USD\n"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (RENAME + b"2,Extra Ltd,,TRY,surplus\n", "row 2 (line 3): 5 fields, but the header names 4"),
        (RENAME + b"\xef\xbb\xbf3,Joined Ltd,,TRY\n", "row 2 (line 3): tax_id holds a byte-order mark"),
        (RENAME + b"4,Nul\x00Ltd,,TRY\n", "row 2 (line 3): name holds a NUL byte"),
        (
            RENAME + b"94 1234567,Twin Ltd,,USD\n",
            "row 2 (line 3): tax_id '94 1234567' is the same supplier as row 1 (line 2)'s '941234567'",
        ),
        (
            RENAME + b"5,Wrong Account Ltd,TR33 0006 1005 1978 6457 8413 27,TRY\n",
            "row 2 (line 3): the IBAN TR330006100519786457841327 fails its checksum",
        ),
    ],
    ids=["extra-fields", "bom-in-a-row", "nul-byte", "duplicate-after-normalizing", "bad-iban"],
)
def test_a_bad_row_is_named_and_nothing_is_written(
    base_env: dict[str, str], pool: SyncPool, tmp_path: Path, tenant_id: str, body: bytes, named: str
) -> None:
    # Given a tenant whose master data knows Pinecrest
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_bytes(GOOD)
    bad.write_bytes(b"tax_id,name,iban,currency\n" + body)
    assert _fatura("suppliers", "import", str(good), "--tenant", tenant_id, env=base_env).returncode == 0
    before = _suppliers(pool, tenant_id)

    # When a file with one bad row is imported
    result = _fatura("suppliers", "import", str(bad), "--tenant", tenant_id, env=base_env)

    # Then the operator reads which row, the command fails, and the master data is as it was
    assert result.returncode == 1, result.stdout + result.stderr
    assert named in result.stderr and "nothing was imported" in result.stderr
    assert "Traceback" not in result.stderr
    assert _suppliers(pool, tenant_id) == before == {"941234567": "Pinecrest Supply Co."}


def test_a_supplier_reimported_under_another_spelling_stays_one_row(
    base_env: dict[str, str], pool: SyncPool, tmp_path: Path, tenant_id: str
) -> None:
    sample = ROOT / "services" / "sandbox" / "samples" / "suppliers.csv"
    respelled = tmp_path / "respelled.json"
    respelled.write_text(json.dumps([{"tax_id": "94 123 4567", "name": "Pinecrest Supply Company"}]))

    first = _fatura("suppliers", "import", str(sample), "--tenant", tenant_id, env=base_env)
    again = _fatura("suppliers", "import", str(respelled), "--tenant", tenant_id, env=base_env)

    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    stored = _suppliers(pool, tenant_id)
    assert len(stored) == len(sample.read_text(encoding="utf-8").splitlines()) - 1
    assert stored["941234567"] == "Pinecrest Supply Company" and "94-1234567" not in stored
