"""The operator's dead-letter routes on the live edge: listing with filters, one dead letter with its
message, and a redrive request that the schedulers carry out."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from fix_db import SyncPool, TenantHandle
from fix_ops import KeyHandle, dead_letter, dead_letter_row, make_operator


@pytest.fixture(scope="module")
def operator(pool: SyncPool) -> KeyHandle:
    return make_operator(pool, label="ops api tests")


@pytest.fixture
def ops(client: httpx.Client, operator: KeyHandle) -> Iterator[httpx.Client]:
    client.headers.update(operator.headers)
    yield client


@pytest.fixture
def reason() -> str:
    """A reason of this test's own, so dead letters other tests record never match its filters."""
    return f"test_{uuid.uuid4().hex[:10]}"


def _ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [d["id"] for d in response.json()["dead_letters"]]


def test_operator_lists_open_dead_letters_newest_first_by_since_reason_and_queue(
    ops: httpx.Client, pool: SyncPool, queue_prefix: str, reason: str
) -> None:
    ingest, deliver = f"{queue_prefix}.inference.ingest", f"{queue_prefix}.delivery.deliver"
    old = dead_letter(pool, queue=ingest, reason=reason, at=datetime.now(UTC) - timedelta(hours=3))
    first = dead_letter(pool, queue=ingest, reason=reason)
    second = dead_letter(pool, queue=deliver, reason=reason, source="broker")
    redriven = dead_letter(pool, queue=ingest, reason=reason)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE dead_letters SET redriven_at = now(), redrive_count = 1 WHERE id = %s", (redriven,)
        )

    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason})) == [second, first, old]
    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason, "since": "2h"})) == [second, first]
    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason, "queue": "inference.ingest"})) == [
        first,
        old,
    ]
    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason, "queue": deliver})) == [second]
    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason, "limit": "1"})) == [second]
    every = ops.get("/v1/ops/dead-letters", params={"reason": reason, "include_redriven": "true"})
    assert _ids(every) == [redriven, second, first, old]
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert _ids(ops.get("/v1/ops/dead-letters", params={"reason": reason, "since": since})) == [second, first]
    summary = every.json()["dead_letters"][0]
    assert summary["redriven_at"] is not None and summary["redrive_count"] == 1
    assert summary["queue"] == ingest and summary["source"] == "consumer" and "message" not in summary


def test_one_dead_letter_carries_the_whole_stored_message(
    ops: httpx.Client, pool: SyncPool, queue_prefix: str, reason: str
) -> None:
    sendable = dead_letter(pool, queue=f"{queue_prefix}.inference.ingest", reason=reason)
    undecodable = dead_letter(pool, queue=f"{queue_prefix}.inference.ingest", reason=reason, sendable=False)

    found = ops.get(f"/v1/ops/dead-letters/{sendable}")
    body_only = ops.get(f"/v1/ops/dead-letters/{undecodable}")

    assert found.status_code == 200
    letter = found.json()
    assert letter["id"] == sendable and letter["reason"] == reason
    assert letter["message"]["message_id"] == letter["message_id"]
    assert letter["message"]["kwargs"]["event"]["type"] == "test.v1"
    assert body_only.json()["message"] is None and "not a message" in body_only.json()["body"]
    for missing in ("999999999999", "abc", "0", "-1", "99999999999999999999999"):
        answer = ops.get(f"/v1/ops/dead-letters/{missing}")
        assert answer.status_code == 404, missing
        assert answer.json()["error"]["code"] == "not_found"


def test_a_redrive_request_marks_what_to_publish_and_asking_twice_is_asking_once(
    ops: httpx.Client, pool: SyncPool, queue_prefix: str, reason: str
) -> None:
    queue = f"{queue_prefix}.inference.ingest"
    one, two = dead_letter(pool, queue=queue, reason=reason), dead_letter(pool, queue=queue, reason=reason)
    undecodable = dead_letter(pool, queue=queue, reason=reason, sendable=False)
    done = dead_letter(pool, queue=queue, reason=reason)
    with pool.connection() as conn:
        conn.execute("UPDATE dead_letters SET redriven_at = now(), redrive_count = 1 WHERE id = %s", (done,))

    by_ids = ops.post("/v1/ops/dead-letters:redrive", json={"ids": [one, undecodable, done]})
    requested_at = dead_letter_row(pool, one)["redrive_requested_at"]
    again = ops.post("/v1/ops/dead-letters:redrive", json={"ids": [one]})
    by_filter = ops.post("/v1/ops/dead-letters:redrive", json={"reason": reason, "queue": "inference.ingest"})

    assert by_ids.status_code == 202, by_ids.text
    assert by_ids.json() == {"requested": [one], "unsendable": [undecodable], "already_redriven": [done]}
    assert requested_at is not None
    assert again.json()["requested"] == [one]
    assert dead_letter_row(pool, one)["redrive_requested_at"] == requested_at
    assert by_filter.status_code == 202
    assert sorted(by_filter.json()["requested"]) == sorted([one, two])
    assert dead_letter_row(pool, two)["redrive_requested_at"] is not None
    assert dead_letter_row(pool, done)["redrive_count"] == 1


def test_unknown_ids_request_nothing(
    ops: httpx.Client, pool: SyncPool, queue_prefix: str, reason: str
) -> None:
    known = dead_letter(pool, queue=f"{queue_prefix}.inference.ingest", reason=reason)

    answer = ops.post("/v1/ops/dead-letters:redrive", json={"ids": [known, 987654321098]})

    assert answer.status_code == 404
    assert answer.json()["error"]["unknown_ids"] == [987654321098]
    assert dead_letter_row(pool, known)["redrive_requested_at"] is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "no_selector"),
        ({"ids": []}, "invalid_request"),
        ({"ids": ["7"]}, "invalid_request"),
        ({"ids": [0]}, "invalid_request"),
        ({"everything": True}, "invalid_request"),
        ({"since": "yesterday"}, "invalid_request"),
        ({"since": "2026-13-45"}, "invalid_since"),
        ({"since": "99999999d"}, "invalid_request"),
        ({"reason": ""}, "invalid_request"),
        ({"reason": "a\u0000b"}, "invalid_request"),
    ],
)
def test_a_redrive_request_without_a_valid_selector_is_422_and_changes_nothing(
    ops: httpx.Client, body: dict[str, object], code: str
) -> None:
    answer = ops.post("/v1/ops/dead-letters:redrive", json=body)

    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == code


def test_malformed_requests_are_client_errors_never_500(ops: httpx.Client) -> None:
    lone_surrogate = b'{"reason": "\\ud800"}'
    answers = {
        "not json": ops.post(
            "/v1/ops/dead-letters:redrive", content=b"{", headers={"Content-Type": "application/json"}
        ).status_code,
        "not application/json": ops.post(
            "/v1/ops/dead-letters:redrive", content=b"ids=1", headers={"Content-Type": "text/plain"}
        ).status_code,
        "lone surrogate": ops.post(
            "/v1/ops/dead-letters:redrive",
            content=lone_surrogate,
            headers={"Content-Type": "application/json"},
        ).status_code,
        "bad since": ops.get("/v1/ops/dead-letters", params={"since": "last tuesday"}).status_code,
        "impossible date": ops.get("/v1/ops/dead-letters", params={"since": "2026-02-30"}).status_code,
        "limit 0": ops.get("/v1/ops/dead-letters", params={"limit": "0"}).status_code,
        "limit huge": ops.get(
            "/v1/ops/dead-letters", params={"limit": "10000000000000000000000"}
        ).status_code,
        "include yes": ops.get("/v1/ops/dead-letters", params={"include_redriven": "yes"}).status_code,
        "NUL reason": ops.get("/v1/ops/dead-letters", params={"reason": "a\x00"}).status_code,
        "unknown query": ops.get("/v1/ops/dead-letters", params={"state": "open"}).status_code,
    }

    assert answers == {
        "not json": 400,
        "not application/json": 415,
        "lone surrogate": 422,
        "bad since": 400,
        "impossible date": 400,
        "limit 0": 400,
        "limit huge": 400,
        "include yes": 400,
        "NUL reason": 400,
        "unknown query": 400,
    }


def test_the_redrive_route_takes_only_an_operator_key(client: httpx.Client, tenant: TenantHandle) -> None:
    without = client.post("/v1/ops/dead-letters:redrive", json={"reason": "x"})
    with_tenant_key = client.post(
        "/v1/ops/dead-letters:redrive", json={"reason": "x"}, headers=tenant.headers
    )

    assert without.status_code == 401 and without.headers["WWW-Authenticate"].startswith("Bearer")
    assert with_tenant_key.status_code == 403
    assert with_tenant_key.json()["error"]["code"] == "wrong_key_scope"
