"""Uploads are budgeted: a tenant's stored documents stay under its limit (429 + Retry-After beyond
it, nothing written), and documents no job references are deleted after the retention period,
which gives the tenant its room back."""

from __future__ import annotations

import uuid

import httpx

from fix_db import MakeTenant, SyncPool, count_rows
from services.acceptance.relay import Relay
from services.acceptance.settings import RelaySettings
from services.common.broker import make_broker
from services.common.settings import CommonSettings


def _upload(client: httpx.Client, headers: dict[str, str], size: int) -> httpx.Response:
    return client.post("/v1/documents", json={"text": "x" * size, "filename": "a.txt"}, headers=headers)


def _stored(pool: SyncPool, tenant_id: uuid.UUID) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(bytes), 0) AS b FROM document_usage WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
    return int(row["b"]) if row else 0


def test_uploads_beyond_the_tenant_s_storage_limit_are_refused_and_write_nothing(
    client: httpx.Client, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    # Given a tenant allowed to keep 2,500 bytes of documents, holding 2,000 already
    tenant = make_tenant(max_stored_bytes=2500)
    assert _upload(client, tenant.headers, 1000).status_code == 201
    assert _upload(client, tenant.headers, 1000).status_code == 201
    before = count_rows(pool, tenant.id)
    # When it uploads 1,000 more
    refused = _upload(client, tenant.headers, 1000)
    # Then it is told to come back later, with the limit named, and nothing was stored
    assert refused.status_code == 429
    assert refused.headers["Retry-After"].isdigit()
    error = refused.json()["error"]
    assert (error["code"], error["limit"], error["current"], error["maximum"]) == (
        "stored_bytes",
        "stored_bytes",
        2000,
        2500,
    )
    assert count_rows(pool, tenant.id) == before
    # While a small one still fits
    assert _upload(client, tenant.headers, 400).status_code == 201
    assert _stored(pool, tenant.id) == 2400


def test_documents_no_job_references_are_deleted_after_the_retention_and_free_their_room(
    client: httpx.Client, make_tenant: MakeTenant, pool: SyncPool, database_url: str
) -> None:
    # Given a tenant with an old document no job uses, an old one a job uses, and fresh ones
    tenant = make_tenant(max_stored_bytes=10_000)
    job = client.post(
        "/v1/extraction-jobs",
        json={"document": {"text": "y" * 300, "filename": "inline.txt"}},
        headers={**tenant.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
    )
    assert job.status_code == 202
    assert _upload(client, tenant.headers, 500).status_code == 201  # fresh
    orphan, used = uuid.uuid4(), uuid.uuid4()
    with pool.connection() as conn:
        for doc_id, size in ((orphan, 700), (used, 600)):
            conn.execute(
                "INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text, created_at)"
                " VALUES (%s, %s, 1, 'x', %s, %s, now() - interval '40 days')",
                (tenant.id, doc_id, size, "z" * size),
            )
        conn.execute(
            """INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id,
                   document_version, object_version, doc_bytes, estimated_tokens, schema_version,
                   policy_version, model_policy, priority, state, available_at, deadline_at)
               VALUES (%s, %s, 'old', 'h', %s, 1, 'v1', 600, 10, 'invoice.v1', 'p', 'default', 'batch',
                   'READY', now(), now() + interval '1 day')""",
            (uuid.uuid4(), tenant.id, used),
        )
    assert _stored(pool, tenant.id) == 300 + 500 + 700 + 600
    # When the relay's housekeeping runs with a 30-day retention
    settings = RelaySettings(common=CommonSettings(database_url=database_url), document_retention_days=30)
    broker = make_broker(settings.common)
    try:
        pruned = Relay(settings, pool, broker).housekeeping(force=True)
    finally:
        broker.close()
    # Then the old unreferenced document is gone, its bytes are free again, and nothing else moved
    assert pruned >= 1
    with pool.connection() as conn:
        left = conn.execute(
            "SELECT id, size_bytes FROM documents WHERE tenant_id = %s ORDER BY size_bytes", (tenant.id,)
        ).fetchall()
    assert [r["size_bytes"] for r in left] == [300, 500, 600]
    assert orphan not in {r["id"] for r in left}
    assert _stored(pool, tenant.id) == 1400
