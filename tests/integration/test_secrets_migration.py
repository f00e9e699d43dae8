"""Migration 0007 seals the webhook secrets a database holds in plaintext and drops the plaintext
column: through ``fatura migrate``, with FATURA_SECRETS_KEY, all at once or not at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fix_db import drop_database, recreate_database
from fix_processes import ROOT
from services.common.keyring import Keyring, Sealed, new_key_spec
from services.common.migrate import MIGRATIONS_DIR, migrate
from services.delivery import signing


@pytest.fixture
def scratch_url(database_url: str) -> Iterator[str]:
    url = recreate_database(database_url + "_sealing")
    yield url
    drop_database(url)


def _columns(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'webhook_secrets'"
        ).fetchall()
    return {r[0] for r in rows}


def _fatura_migrate(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FATURA_SECRETS_")}
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", "migrate"],
        cwd=ROOT,
        env={**full, "FATURA_DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_new_database_has_no_plaintext_column(scratch_url: str) -> None:
    migrate(scratch_url)
    assert _columns(scratch_url) == {
        "endpoint_id",
        "key_id",
        "master_key_id",
        "nonce",
        "ciphertext",
        "created_at",
        "not_after",
    }


def test_plaintext_secrets_are_sealed_by_fatura_migrate_and_only_with_a_key(
    scratch_url: str, tmp_path: Path
) -> None:
    # Given a database at 0006 whose endpoints have plaintext secrets (two while one rotates)
    before = tmp_path / "migrations"
    before.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if int(path.name[:4]) <= 6:
            shutil.copy(path, before)
    migrate(scratch_url, before)
    tenant_id, endpoint_id = uuid.uuid4(), uuid.uuid4()
    secrets = [signing.new_secret(), signing.new_secret()]
    with psycopg.connect(scratch_url) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 't')", (tenant_id,))
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types)
               VALUES (%s, %s, 'https://erp.example/hook', '{extraction.completed.v1}')""",
            (endpoint_id, tenant_id),
        )
        for secret in secrets:
            conn.execute(
                "INSERT INTO webhook_secrets (endpoint_id, key_id, secret) VALUES (%s, %s, %s)",
                (endpoint_id, signing.key_id(secret), secret),
            )

    # When `fatura migrate` runs without a key, it refuses and changes nothing
    refused = _fatura_migrate(scratch_url)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "FATURA_SECRETS_KEY is not set" in refused.stderr and "2 webhook secret(s)" in refused.stderr
    with psycopg.connect(scratch_url) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (6,)
        plaintext = conn.execute("SELECT count(*) FROM webhook_secrets WHERE secret IS NOT NULL").fetchone()
    assert plaintext == (2,)

    # When it runs with one, every secret is sealed and the plaintext column is gone
    key = new_key_spec("k7")
    applied = _fatura_migrate(scratch_url, FATURA_SECRETS_KEY=key)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "applied 0007_secrets_at_rest" in applied.stdout
    assert "secret" not in _columns(scratch_url)
    keyring = Keyring.from_env({"FATURA_SECRETS_KEY": key})
    assert keyring is not None
    with psycopg.connect(scratch_url) as conn:
        rows = conn.execute(
            "SELECT key_id, master_key_id, nonce, ciphertext FROM webhook_secrets ORDER BY created_at"
        ).fetchall()
    assert [r[1] for r in rows] == ["k7", "k7"]
    opened = [keyring.open(endpoint_id, r[0], Sealed(r[1], r[2], r[3])) for r in rows]
    assert opened == secrets
    assert all(s.encode() not in r[3] for s, r in zip(secrets, rows, strict=True))
