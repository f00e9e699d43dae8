"""Bad input gets a clear, typed JSON error and changes nothing (DESIGN §5.11)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fix_api import INVOICE, job_body
from fix_db import SyncPool, TenantHandle, count_rows

MIB = 1024 * 1024


def _post_raw(
    client: httpx.Client, tenant: TenantHandle, content: bytes, *, headers: dict[str, str] | None = None
) -> httpx.Response:
    base = {**tenant.headers, "Content-Type": "application/json", "Idempotency-Key": "bad-input"}
    return client.post("/v1/extraction-jobs", content=content, headers={**base, **(headers or {})})


CASES: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("malformed JSON", b'{"document": {"text": ', {}, 400, "malformed_json"),
    ("empty body", b"", {}, 400, "malformed_json"),
    ("NaN is not JSON", b'{"document": {"text": "x"}, "deadline_seconds": NaN}', {}, 400, "malformed_json"),
    ("a JSON array", b"[1, 2]", {}, 422, "invalid_request"),
    ("wrong type", json.dumps(job_body(priority=5)).encode(), {}, 422, "invalid_request"),
    ("unknown field", json.dumps(job_body(colour="red")).encode(), {}, 422, "invalid_request"),
    ("unknown option", json.dumps(job_body(options={"temperature": 2})).encode(), {}, 422, "invalid_request"),
    ("unknown schema", json.dumps(job_body(schema="receipt.v9")).encode(), {}, 422, "invalid_request"),
    ("deadline too short", json.dumps(job_body(deadline_seconds=5)).encode(), {}, 422, "invalid_request"),
    (
        "both inline and by reference",
        json.dumps(
            {**job_body(), "document_id": "01a22b15-3596-715b-805f-e7647f49c5a8", "document_version": 1}
        ).encode(),
        {},
        422,
        "invalid_request",
    ),
    ("no document at all", b'{"priority": "batch"}', {}, 422, "invalid_request"),
    ("empty text", json.dumps(job_body("")).encode(), {}, 422, "invalid_request"),
    ("NUL in text", json.dumps(job_body("a\u0000b")).encode(), {}, 422, "invalid_request"),
    ("lone surrogate", b'{"document": {"text": "a\\ud800b"}}', {}, 422, "invalid_text"),
    (
        "missing Idempotency-Key",
        json.dumps(job_body()).encode(),
        {"Idempotency-Key": ""},
        400,
        "idempotency_key_missing",
    ),
    (
        "over-long Idempotency-Key",
        json.dumps(job_body()).encode(),
        {"Idempotency-Key": "k" * 256},
        400,
        "idempotency_key_invalid",
    ),
    (
        "Idempotency-Key with spaces",
        json.dumps(job_body()).encode(),
        {"Idempotency-Key": "a b"},
        400,
        "idempotency_key_invalid",
    ),
    (
        "text/plain body",
        json.dumps(job_body()).encode(),
        {"Content-Type": "text/plain"},
        415,
        "unsupported_media_type",
    ),
    (
        "form body",
        b"a=b",
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        "unsupported_media_type",
    ),
]


@pytest.mark.parametrize(("case", "content", "headers", "status", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_job_submissions_get_a_typed_error_and_write_nothing(
    client: httpx.Client,
    tenant: TenantHandle,
    pool: SyncPool,
    case: str,
    content: bytes,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    reply = _post_raw(client, tenant, content, headers=headers)

    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["code"] == code
    assert error["message"]
    assert count_rows(pool, tenant.id) == {"jobs": 0, "documents": 0, "outbox": 0, "job_events": 0}


def test_a_schema_error_says_where_it_is(client: httpx.Client, tenant: TenantHandle) -> None:
    reply = _post_raw(client, tenant, json.dumps(job_body(priority="urgent")).encode())
    errors = reply.json()["error"]["errors"]
    assert {"path": "/priority"} == {"path": errors[0]["path"]}
    assert "urgent" in errors[0]["message"]


def test_a_missing_content_type_is_415(client: httpx.Client, tenant: TenantHandle, pool: SyncPool) -> None:
    reply = client.post(
        "/v1/extraction-jobs",
        content=json.dumps(job_body()).encode(),
        headers={**tenant.headers, "Idempotency-Key": "no-ctype"},
    )
    assert reply.status_code == 415
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_a_document_over_the_cap_is_413_and_writes_nothing(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    """The default cap is 2 MiB of UTF-8 text; one byte more is refused, inline or stored."""
    at_cap = "a" * (2 * MIB)
    over = at_cap + "b"

    refused = _post_raw(client, tenant, json.dumps(job_body(over)).encode())
    stored = client.post("/v1/documents", json={"text": over}, headers=tenant.headers)

    for reply in (refused, stored):
        assert reply.status_code == 413
        assert reply.json()["error"]["code"] == "document_too_large"
        assert reply.json()["error"]["max_bytes"] == 2 * MIB
    assert count_rows(pool, tenant.id)["documents"] == 0
    accepted = _post_raw(
        client, tenant, json.dumps(job_body(at_cap)).encode(), headers={"Idempotency-Key": "cap"}
    )
    assert accepted.status_code == 202


def test_multibyte_text_is_measured_in_bytes(client: httpx.Client, tenant: TenantHandle) -> None:
    over = "ş" * (MIB + 1)  # 2 bytes each in UTF-8: 2 MiB + 2 bytes
    reply = client.post("/v1/documents", json={"text": over}, headers=tenant.headers)
    assert reply.status_code == 413


def test_a_body_larger_than_any_document_could_need_is_413_before_it_is_read(
    client: httpx.Client, tenant: TenantHandle
) -> None:
    reply = _post_raw(client, tenant, b" " * (5 * MIB))
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "body_too_large"


def test_bad_query_parameters_are_400(client: httpx.Client, tenant: TenantHandle) -> None:
    for params in ({"state": "DONE"}, {"limit": "0"}, {"limit": "abc"}, {"limit": "201"}):
        reply = client.get("/v1/extraction-jobs", params=params, headers=tenant.headers)
        assert reply.status_code == 400, params
        assert reply.json()["error"]["code"] == "invalid_query"


def test_bad_document_bodies_are_refused(client: httpx.Client, tenant: TenantHandle, pool: SyncPool) -> None:
    bodies: list[Any] = [
        {"filename": "x.txt"},
        {"text": "x", "document_id": "nope"},
        {"text": "x", "extra": 1},
    ]
    for body in bodies:
        reply = client.post("/v1/documents", json=body, headers=tenant.headers)
        assert reply.status_code == 422, body
    assert count_rows(pool, tenant.id)["documents"] == 0


def test_unknown_routes_and_methods_answer_json(client: httpx.Client, tenant: TenantHandle) -> None:
    missing = client.get("/v1/nothing-here", headers=tenant.headers)
    wrong_method = client.delete("/v1/extraction-jobs", headers=tenant.headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "route_not_found"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_inline_text_round_trips_exactly(client: httpx.Client, tenant: TenantHandle, pool: SyncPool) -> None:
    text = INVOICE + "\fSayfa 2: ğüşiöç ĞÜŞİÖÇ € ₺ 😀\r\n"
    reply = client.post("/v1/documents", json={"text": text, "filename": "ş.txt"}, headers=tenant.headers)
    assert reply.status_code == 201
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT text, filename FROM documents WHERE tenant_id = %s", (tenant.id,)
        ).fetchone()
    assert row is not None and row["text"] == text and row["filename"] == "ş.txt"
