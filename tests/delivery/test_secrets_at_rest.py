"""Webhook secrets at rest: sealed with AES-256-GCM under a master key (FATURA_SECRETS_KEY), bound to
their row, readable under an old key during a rotation, moved to the new key by
``fatura secrets rewrap``; a process that signs or registers refuses to start without a key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import psycopg
import pytest
import standardwebhooks

from fix_db import MakeTenant, SyncPool, drop_database, recreate_database
from fix_delivery import (
    KEYRING,
    Jobs,
    Receiver,
    RegisterFn,
    StartProcess,
    deliveries,
    insert_secret,
    wait_for,
)
from fix_processes import ROOT, ServiceProcess, SpawnFn
from services.common.keyring import DEVELOPMENT_KEY, Keyring, KeyringError, Sealed, new_key_spec
from services.common.migrate import migrate
from services.common.procs import free_port
from services.common.settings import SettingsError
from services.delivery import signing, store
from services.delivery.settings import DeliverySettings

K0, K1 = new_key_spec("k0"), new_key_spec("k1")


def _keyring(current: str, *old: str) -> Keyring:
    keyring = Keyring.from_env({"FATURA_SECRETS_KEY": current, "FATURA_SECRETS_OLD_KEYS": ",".join(old)})
    assert keyring is not None
    return keyring


# ------------------------------------------------------------------ the seal, without a database


def test_a_sealed_secret_opens_only_in_its_own_row_and_under_its_own_key() -> None:
    keyring = _keyring(K1)
    endpoint_id, secret = uuid.uuid4(), signing.new_secret()
    key_id = signing.key_id(secret)
    sealed = keyring.seal(endpoint_id, key_id, secret)
    assert keyring.open(endpoint_id, key_id, sealed) == secret
    assert secret.encode() not in sealed.ciphertext and len(sealed.nonce) == 12
    assert keyring.seal(endpoint_id, key_id, secret).nonce != sealed.nonce

    moved = [
        (uuid.uuid4(), key_id, sealed),  # copied into another endpoint's row
        (endpoint_id, "key_other", sealed),  # copied into another secret's row of the same endpoint
        (
            endpoint_id,
            key_id,
            replace(sealed, ciphertext=bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]),
        ),
    ]
    for other_endpoint, other_key, other_sealed in moved:
        with pytest.raises(KeyringError, match="does not open"):
            keyring.open(other_endpoint, other_key, other_sealed)
    # Relabelled with another master key's id that this process holds: the id is bound too
    both = _keyring(K1, K0.replace("k0:", "k9:"))
    with pytest.raises(KeyringError, match="does not open"):
        both.open(endpoint_id, key_id, replace(sealed, master_key_id="k9"))


def test_an_old_key_still_opens_what_it_sealed_and_a_key_not_held_is_named() -> None:
    endpoint_id, secret = uuid.uuid4(), signing.new_secret()
    sealed = _keyring(K0).seal(endpoint_id, "key_a", secret)
    assert _keyring(K1, K0).open(endpoint_id, "key_a", sealed) == secret
    with pytest.raises(KeyringError, match=r"'k0'.*FATURA_SECRETS_OLD_KEYS"):
        _keyring(K1).open(endpoint_id, "key_a", sealed)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FATURA_SECRETS_KEY": "c2VjcmV0"}, "ID:BASE64"),
        ({"FATURA_SECRETS_KEY": "k 1:" + K1.split(":")[1]}, "ID:BASE64"),
        ({"FATURA_SECRETS_KEY": "k1:not base64!"}, "not valid base64"),
        ({"FATURA_SECRETS_KEY": "k1:" + "A" * 24}, "holds 18 bytes, not 32"),
        ({"FATURA_SECRETS_KEY": K1, "FATURA_SECRETS_OLD_KEYS": "k1:" + K0.split(":")[1]}, "appear once"),
        ({"FATURA_SECRETS_OLD_KEYS": K0}, "FATURA_SECRETS_KEY is not"),
    ],
)
def test_a_malformed_key_setting_fails_fast_with_its_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        DeliverySettings.from_env(env)


def test_without_a_key_only_the_processes_that_never_touch_a_secret_have_settings() -> None:
    settings = DeliverySettings.from_env({})
    assert settings.keyring is None
    with pytest.raises(SettingsError, match=r"FATURA_SECRETS_KEY is not set.*secrets new-key"):
        settings.require_keyring("the delivery worker")
    assert K1.split(":")[1] not in repr(_keyring(K1))


# ------------------------------------------------------------------ rows in PostgreSQL


def _endpoint_with_delivery(
    pool: SyncPool, tenant_id: uuid.UUID, secret: str | None
) -> tuple[uuid.UUID, uuid.UUID]:
    endpoint_id = uuid.uuid4()
    delivery_id = signing.delivery_id(uuid.uuid4(), endpoint_id)
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types)
               VALUES (%s, %s, 'http://127.0.0.1:9/hook', '{extraction.completed.v1}')""",
            (endpoint_id, tenant_id),
        )
        if secret is not None:
            insert_secret(conn, endpoint_id, secret)
        conn.execute(
            """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, body)
               VALUES (%s, %s, 'extraction.completed.v1', %s, %s, '{}'::bytea)""",
            (delivery_id, uuid.uuid4(), endpoint_id, tenant_id),
        )
    return endpoint_id, delivery_id


def _delivery(pool: SyncPool, delivery_id: uuid.UUID) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM deliveries WHERE delivery_id = %s", (delivery_id,)).fetchone()
    assert row is not None
    return row


def test_a_secret_that_does_not_open_postpones_the_delivery_without_spending_an_attempt(
    pool: SyncPool, make_tenant: MakeTenant
) -> None:
    # Given a delivery whose secret is sealed under the development key
    _, delivery_id = _endpoint_with_delivery(pool, make_tenant().id, signing.new_secret())
    # When a worker that holds only another key claims it
    settings = DeliverySettings(lease_seconds=30.0, keyring=_keyring(K1))
    assert store.claim(pool, delivery_id, settings) is None
    # Then it waits, pending, with the reason, and no attempt was made
    row = _delivery(pool, delivery_id)
    assert row["state"] == "pending" and row["attempts"] == 0
    assert row["reason"].startswith("secret_unreadable: sealed under master key 'local-dev'")
    # And a worker holding the key as an old one signs it
    with pool.connection() as conn:
        conn.execute("UPDATE deliveries SET next_attempt_at = now() WHERE delivery_id = %s", (delivery_id,))
    claim = store.claim(pool, delivery_id, replace(settings, keyring=_keyring(K1, DEVELOPMENT_KEY)))
    assert claim is not None and claim.secrets[0].startswith("whsec_")


def test_a_ciphertext_copied_to_another_endpoint_does_not_sign_there(
    pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant_id = make_tenant().id
    source, _ = _endpoint_with_delivery(pool, tenant_id, signing.new_secret())
    target, delivery_id = _endpoint_with_delivery(pool, tenant_id, None)
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO webhook_secrets (endpoint_id, key_id, master_key_id, nonce, ciphertext)
               SELECT %s, key_id, master_key_id, nonce, ciphertext
               FROM webhook_secrets WHERE endpoint_id = %s""",
            (target, source),
        )
    assert store.claim(pool, delivery_id, DeliverySettings(keyring=KEYRING)) is None
    assert _delivery(pool, delivery_id)["reason"].startswith("secret_unreadable")


def test_registration_through_the_edge_stores_the_secret_sealed_and_never_in_plaintext(
    register: RegisterFn, receiver: Receiver, pool: SyncPool, dclient: httpx.Client
) -> None:
    endpoint = register(receiver.url, secret=signing.new_secret())
    rotated = dclient.post(
        f"/v1/webhook-endpoints/{endpoint.endpoint_id}:rotate-secret",
        json={},
        headers=endpoint.tenant.headers,
    )
    assert rotated.status_code == 200, rotated.text
    secrets = [endpoint.secret, rotated.json()["secret"]]
    endpoint_id = uuid.UUID(endpoint.endpoint_id)
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT s.*, row_to_json(s)::text AS as_text FROM webhook_secrets s
               WHERE endpoint_id = %s ORDER BY created_at""",
            (endpoint_id,),
        ).fetchall()
    assert [r["master_key_id"] for r in rows] == ["local-dev", "local-dev"]
    for row, secret in zip(rows, secrets, strict=True):
        assert "secret" not in row
        assert secret[len("whsec_") :] not in row["as_text"]
        sealed = Sealed(row["master_key_id"], row["nonce"], row["ciphertext"])
        assert KEYRING.open(endpoint_id, row["key_id"], sealed) == secret


# ------------------------------------------------------------------ processes


def test_a_worker_holding_the_old_key_signs_and_one_without_it_leaves_the_delivery_waiting(
    start_worker: StartProcess,
    scheduler: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
) -> None:
    # Given an endpoint registered while the development key was current
    endpoint = register(receiver.url, secret=signing.new_secret())
    # When the master key is rotated: the worker runs with K1 and keeps the old key
    rotated = start_worker(FATURA_SECRETS_KEY=K1, FATURA_SECRETS_OLD_KEYS=DEVELOPMENT_KEY)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    wait_for(lambda: len(receiver.received) > 1, 20, "the verification ping and a delivery")
    # Then both are signed with the endpoint's secret
    verified = [
        standardwebhooks.Webhook(endpoint.secret).verify(r.body, r.headers) for r in receiver.received
    ]
    assert sorted(v["type"] for v in verified) == ["extraction.completed.v1", "webhook.ping.v1"]
    assert [v["data"]["job_id"] for v in verified if "job_id" in v["data"]] == [str(job_id)]
    rotated.stop()
    # When a worker lacks the old key, the next delivery waits with the reason instead of failing
    start_worker(FATURA_SECRETS_KEY=K1)
    waiting = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, waiting)

    def postponed() -> dict[str, Any] | None:
        found = deliveries(dclient, endpoint.tenant, waiting)
        return found[0] if found and (found[0]["reason"] or "").startswith("secret_unreadable") else None

    delivery = wait_for(postponed, 20, "the delivery to wait for its key")
    assert delivery["state"] == "pending" and delivery["attempt_count"] == 0
    assert len(receiver.received) == 2


@pytest.mark.parametrize("process", ["delivery-worker", "http"])
def test_a_process_that_signs_or_registers_refuses_to_start_without_a_key(
    spawn: SpawnFn, process: str
) -> None:
    started = spawn(
        process,
        FATURA_SECRETS_KEY="",
        FATURA_HTTP_PORT=str(free_port()),
        FATURA_HTTP_METRICS_PORT=str(free_port()),
        FATURA_HTTP_WORKERS="2",
        FATURA_DELIVERY_WORKER_METRICS_PORT=str(free_port()),
    )
    assert started.wait_exit(60) == 2
    assert "bad setting: FATURA_SECRETS_KEY is not set" in started.log()


def test_the_delivery_scheduler_needs_no_key(spawn: SpawnFn) -> None:
    port = free_port()
    scheduler = spawn(
        "delivery-scheduler", FATURA_SECRETS_KEY="", FATURA_DELIVERY_SCHEDULER_METRICS_PORT=str(port)
    )
    try:
        scheduler.wait_ready(f"http://127.0.0.1:{port}/readyz")
    finally:
        scheduler.stop()


# ------------------------------------------------------------------ fatura secrets


@pytest.fixture
def scratch_url(database_url: str) -> Iterator[str]:
    url = recreate_database(database_url + "_rewrap")
    migrate(url)
    yield url
    drop_database(url)


def _fatura(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FATURA_SECRETS_")}
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rewrap_moves_every_secret_to_the_current_key_and_names_the_ones_it_cannot_open(
    scratch_url: str,
) -> None:
    # Given secrets sealed under k0, and one under a key nobody holds any more
    tenant_id, endpoint_id = uuid.uuid4(), uuid.uuid4()
    plain = {signing.new_secret(): K0, signing.new_secret(): K0, signing.new_secret(): new_key_spec("k9")}
    with psycopg.connect(scratch_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 't')", (tenant_id,))
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types)
               VALUES (%s, %s, 'https://erp.example/hook', '{extraction.completed.v1}')""",
            (endpoint_id, tenant_id),
        )
        for secret, key in plain.items():
            sealed = _keyring(key).seal(endpoint_id, signing.key_id(secret), secret)
            conn.execute(
                """INSERT INTO webhook_secrets (endpoint_id, key_id, master_key_id, nonce, ciphertext)
                   VALUES (%s, %s, %s, %s, %s)""",
                (endpoint_id, signing.key_id(secret), sealed.master_key_id, sealed.nonce, sealed.ciphertext),
            )
    env = {"FATURA_DATABASE_URL": scratch_url}
    # When rewrap runs with k1 current and k0 old
    result = _fatura(
        "secrets", "rewrap", "--batch", "1", FATURA_SECRETS_KEY=K1, FATURA_SECRETS_OLD_KEYS=K0, **env
    )
    # Then the k0 secrets are under k1, the k9 one is named and left alone, and the exit says so
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["resealed"] == 2 and report["failed"] == 1
    assert report["secrets_by_key_id"] == {"k1": 2, "k9": 1}
    assert "'k9'" in result.stderr
    with psycopg.connect(scratch_url) as conn:
        rows = conn.execute(
            "SELECT key_id, master_key_id, nonce, ciphertext FROM webhook_secrets WHERE master_key_id = 'k1'"
        ).fetchall()
    opened = {_keyring(K1).open(endpoint_id, r[0], Sealed(r[1], r[2], r[3])) for r in rows}
    assert opened == {s for s, k in plain.items() if k == K0}
    # And a second run has nothing left to do but the row it cannot open
    again = _fatura("secrets", "rewrap", FATURA_SECRETS_KEY=K1, FATURA_SECRETS_OLD_KEYS=K0, **env)
    assert json.loads(again.stdout)["resealed"] == 0
    status = _fatura("secrets", "status", FATURA_SECRETS_KEY=K1, **env)
    assert json.loads(status.stdout) == {"current_key_id": "k1", "secrets_by_key_id": {"k1": 2, "k9": 1}}


def test_new_key_prints_a_key_the_settings_accept() -> None:
    made = _fatura("secrets", "new-key", "--id", "k2")
    assert made.returncode == 0, made.stderr
    keyring = Keyring.from_env({"FATURA_SECRETS_KEY": made.stdout.strip()})
    assert keyring is not None and keyring.current.id == "k2"
    assert _fatura("secrets", "rewrap").returncode == 2
