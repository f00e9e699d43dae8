"""The operator's cross-tenant views on the live edge: a job's whole attempt log with the raw error
text the tenant never reads, the inbox quarantine, endpoint health, the limiter's pools; and each
kind of key opens only its own routes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb

from fix_api import job_body
from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_ops import KeyHandle, make_operator
from fix_processes import SpawnFn, start_edge
from services.common.procs import free_port

# What a provider and a worker write: a host name, a port, a pid. None of it is the tenant's business.
# Fragments that no id or timestamp of the answer can contain by chance (not hex, not bare digits).
PROVIDER_TEXT = "upstream gpu-node-17.provider.internal:port-8443 overloaded (req zq-9f2c, pid wk-4711)"
WORKER = "inference-7f9c.cluster.local:4711"


@pytest.fixture(scope="module")
def operator(pool: SyncPool) -> KeyHandle:
    return make_operator(pool, label="ops views tests")


@pytest.fixture
def tenant(make_tenant: MakeTenant) -> TenantHandle:
    return make_tenant()


@pytest.fixture
def failed_job(client: httpx.Client, pool: SyncPool, tenant: TenantHandle) -> Iterator[str]:
    """A job whose two attempts met a provider 503 and which then failed for good."""
    accepted = client.post(
        "/v1/extraction-jobs",
        json=job_body(),
        headers={**tenant.headers, "Idempotency-Key": f"ops-{uuid.uuid4().hex[:8]}"},
    )
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["job_id"]
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            """UPDATE extraction_jobs SET state = 'FAILED_TERMINAL', state_version = state_version + 1,
                      attempt = 2, fence = 2, claimed_by = %(worker)s, error_class = 'server_error',
                      error_message = %(raw)s, finished_at = now(), updated_at = now()
               WHERE id = %(id)s""",
            {"id": job_id, "worker": WORKER, "raw": f"HTTP 503: {PROVIDER_TEXT}; no retry: budget spent"},
        )
        for attempt in (1, 2):
            conn.execute(
                """INSERT INTO job_attempts (job_id, attempt, fence, channel, model, started_at, ended_at,
                                             outcome, http_status, error_class, input_tokens,
                                             output_tokens, latency_ms, error_message, worker_id)
                   VALUES (%s, %s, %s, 'vllm-a', 'qwen2.5-7b', now(), now(), 'server_error', 503,
                           'server_error', 0, 0, 812, %s, %s)""",
                (job_id, attempt, attempt, PROVIDER_TEXT, WORKER),
            )
    yield job_id


def test_the_tenant_reads_a_stable_class_and_the_operator_the_raw_text(
    client: httpx.Client, tenant: TenantHandle, operator: KeyHandle, failed_job: str
) -> None:
    status = client.get(f"/v1/extraction-jobs/{failed_job}", headers=tenant.headers)
    ops = client.get(f"/v1/ops/jobs/{failed_job}", headers=operator.headers)

    assert status.status_code == 200 and ops.status_code == 200, (status.text, ops.text)
    assert status.json()["error"]["class"] == "server_error"
    for secret in ("gpu-node-17", "port-8443", "wk-4711", "inference-7f9c", "zq-9f2c"):
        assert secret not in status.text
    view = ops.json()
    assert view["tenant_id"] == str(tenant.id) and view["state"] == "FAILED_TERMINAL"
    assert view["claimed_by"] == WORKER and view["review_reasons"] == []
    assert PROVIDER_TEXT in view["error"]["message"]
    assert view["error"]["tenant_sees"] == status.json()["error"]
    assert [
        (a["attempt"], a["channel"], a["model"], a["status"], a["http_status"], a["latency_ms"])
        for a in view["attempts"]
    ] == [
        (1, "vllm-a", "qwen2.5-7b", "server_error", 503, 812),
        (2, "vllm-a", "qwen2.5-7b", "server_error", 503, 812),
    ]
    assert all(a["error_message"] == PROVIDER_TEXT and a["worker_id"] == WORKER for a in view["attempts"])
    assert all(a["input_tokens"] == 0 and a["error_class"] == "server_error" for a in view["attempts"])


def test_an_unknown_job_is_404_for_the_operator(client: httpx.Client, operator: KeyHandle) -> None:
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        answer = client.get(f"/v1/ops/jobs/{job_id}", headers=operator.headers)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "job_not_found"


OPS_ROUTES = ("/v1/ops/quarantine", "/v1/ops/endpoints", "/v1/ops/limiter/pools", "/v1/ops/dead-letters")


def test_a_tenant_key_opens_no_operator_route_and_an_operator_key_no_tenant_route(
    client: httpx.Client, tenant: TenantHandle, operator: KeyHandle, failed_job: str
) -> None:
    for path in (*OPS_ROUTES, f"/v1/ops/jobs/{failed_job}"):
        refused = client.get(path, headers=tenant.headers)
        assert refused.status_code == 403, (path, refused.text)
        error = refused.json()["error"]
        assert (error["key_scope"], error["required_scope"]) == ("tenant", "operator")
    for path in (f"/v1/extraction-jobs/{failed_job}", "/v1/extraction-jobs", "/v1/webhook-endpoints"):
        refused = client.get(path, headers=operator.headers)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["error"]["key_scope"] == "operator"


def test_the_operator_lists_the_inbox_quarantine_newest_first(
    client: httpx.Client, pool: SyncPool, operator: KeyHandle
) -> None:
    event_ids = [uuid.uuid4(), uuid.uuid4()]
    with pool.connection() as conn:
        for inbox, event_id in zip(("execution_inbox", "delivery_inbox"), event_ids, strict=True):
            conn.execute(
                """INSERT INTO inbox_quarantine (inbox, event_id, stored_digest, received_digest, payload)
                   VALUES (%s, %s, 'aaa', 'bbb', %s)""",
                (inbox, event_id, Jsonb({"event_id": str(event_id), "version": 1})),
            )

    every = client.get("/v1/ops/quarantine", params={"since": "1h"}, headers=operator.headers)
    delivery = client.get("/v1/ops/quarantine", params={"inbox": "delivery_inbox"}, headers=operator.headers)
    wrong = client.get("/v1/ops/quarantine", params={"inbox": "outbox"}, headers=operator.headers)

    assert every.status_code == 200, every.text
    listed = [(q["inbox"], q["event_id"]) for q in every.json()["quarantine"]]
    assert listed[:2] == [("delivery_inbox", str(event_ids[1])), ("execution_inbox", str(event_ids[0]))]
    assert every.json()["quarantine"][0]["received_digest"] == "bbb"
    assert {q["inbox"] for q in delivery.json()["quarantine"]} == {"delivery_inbox"}
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_query"


def _endpoint(pool: SyncPool, tenant: TenantHandle, *, breaker_open: bool, failures: int) -> str:
    endpoint_id = uuid.uuid4()
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, consecutive_failures,
                                              breaker_open_until, verified_at)
               VALUES (%s, %s, %s, ARRAY['extraction.completed.v1'], %s,
                       CASE WHEN %s THEN now() + interval '1 hour' END, now())""",
            (
                endpoint_id,
                tenant.id,
                "https://user:pw@erp.example:8443/hooks/tok_s3cr3t?sig=abc",
                failures,
                breaker_open,
            ),
        )
        if breaker_open:
            delivery_id = uuid.uuid4()
            conn.execute(
                """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id,
                                           state, body, attempts)
                   VALUES (%s, %s, 'extraction.completed.v1', %s, %s, 'pending', '\\x7b7d', 2)""",
                (delivery_id, uuid.uuid4(), endpoint_id, tenant.id),
            )
            for attempt, status in ((1, 502), (2, 503)):
                conn.execute(
                    """INSERT INTO delivery_attempts (delivery_id, attempt, fence, started_at, outcome,
                                                      http_status, error_class)
                       VALUES (%s, %s, %s, now(), 'retry', %s, 'http_5xx')""",
                    (delivery_id, attempt, attempt, status),
                )
    return str(endpoint_id)


def _endpoints(client: httpx.Client, operator: KeyHandle, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/v1/ops/endpoints", params=params, headers=operator.headers)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["endpoints"]
    return rows


def test_endpoint_health_across_tenants_shows_the_breaker_and_the_last_outcome_not_the_path(
    client: httpx.Client, pool: SyncPool, operator: KeyHandle, make_tenant: MakeTenant
) -> None:
    one, other = make_tenant(), make_tenant()
    failing = _endpoint(pool, one, breaker_open=True, failures=7)
    healthy = _endpoint(pool, other, breaker_open=False, failures=0)

    open_ones = {e["endpoint_id"]: e for e in _endpoints(client, operator, breaker="open")}
    closed_ones = {e["endpoint_id"] for e in _endpoints(client, operator, breaker="closed", state="enabled")}
    of_other = _endpoints(client, operator, tenant_id=str(other.id))

    assert failing in open_ones and healthy not in open_ones and healthy in closed_ones
    seen = open_ones[failing]
    assert seen["tenant_id"] == str(one.id) and seen["origin"] == "https://erp.example:8443"
    assert seen["breaker"] == "open" and seen["breaker_open_until"] is not None
    assert seen["consecutive_failures"] == 7 and seen["state"] == "enabled"
    assert seen["last_delivery"]["http_status"] == 503 and seen["last_delivery"]["error_class"] == "http_5xx"
    assert "tok_s3cr3t" not in str(open_ones) and "pw@" not in str(open_ones)
    assert [(e["endpoint_id"], e["breaker"], e["last_delivery"]) for e in of_other] == [
        (healthy, "closed", None)
    ]
    bad = client.get("/v1/ops/endpoints", params={"breaker": "half"}, headers=operator.headers)
    assert bad.status_code == 400


def test_the_operator_reads_every_limiter_pool_with_its_headroom(
    client: httpx.Client, operator: KeyHandle
) -> None:
    answer = client.get("/v1/ops/limiter/pools", headers=operator.headers)

    assert answer.status_code == 200, answer.text
    pools = {p["pool"]: p for p in answer.json()["pools"]}
    assert sorted(pools) == ["edge-a", "edge-b"]  # tests/fix_processes.py EDGE_LIMITER_CONFIG
    b = pools["edge-b"]
    assert b["requests"]["limit"] == 60 and b["tokens"]["limit"] == 50_000
    assert b["in_flight"] == {"limit": 2, "used": 0, "headroom": 2}
    assert b["cooling_down"] is False and b["cooldown_until"] is None and b["window_ms"] == 60_000


def test_the_pool_view_says_the_limiter_is_not_answering_when_it_is_not(
    spawn: SpawnFn, operator: KeyHandle
) -> None:
    edge = start_edge(spawn, workers=1, FATURA_LIMITER_ADDRESS=f"127.0.0.1:{free_port()}")
    try:
        answer = httpx.get(f"{edge.base_url}/v1/ops/limiter/pools", headers=operator.headers, timeout=10)
    finally:
        edge.stop()
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "limiter_unavailable" and answer.headers["retry-after"] == "5"
