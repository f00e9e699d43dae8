"""Extraction batches against the real edge and PostgreSQL: 202 at once, keys derived per item,
replays and conflicts, admission of the whole batch, counts and items read while the batch runs.

Items are finished here the way the inference worker finishes a job (row, job event and outbox
event in one unit of work); tests/integration/test_batch_pipeline.py runs the real pipeline.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb

from fix_api import INVOICE, job_body
from fix_db import MakeTenant, SyncPool, TenantHandle, count_rows
from fix_processes import ServiceProcess
from services.acceptance.batches import BatchParser, BatchService, item_key
from services.acceptance.settings import AcceptanceSettings
from services.common import events, states
from services.common.api.tenancy import Tenant, TenantLimits
from services.common.db import async_pool
from services.common.settings import CommonSettings
from services.common.uow import JobChange, unit_of_work

JSON = dict[str, Any]


def _items(n: int, **extra: Any) -> list[JSON]:
    return [{"document": {"text": f"{INVOICE}Not {i}\n", "filename": f"{i}.txt"}, **extra} for i in range(n)]


def _post(client: httpx.Client, tenant: TenantHandle, body: JSON, key: str) -> httpx.Response:
    return client.post(
        "/v1/extraction-batches", json=body, headers={**tenant.headers, "Idempotency-Key": key}
    )


def _finish(pool: SyncPool, tenant: TenantHandle, job_id: str, state: str) -> None:
    """The job's final (or review) state change, as the inference worker writes it."""
    event_type = {
        states.SUCCEEDED: events.EXTRACTION_COMPLETED,
        states.REVIEW_REQUIRED: events.REVIEW_REQUESTED,
        states.FAILED_TERMINAL: events.EXTRACTION_FAILED,
    }[state]
    with unit_of_work(pool) as uow:
        uow.execute("UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %s", (job_id,))
        row = uow.execute(
            """UPDATE extraction_jobs
               SET state = %(state)s, state_version = state_version + 1, result = %(result)s,
                   review_reasons = %(reasons)s, error_class = %(error)s, finished_at = now()
               WHERE id = %(id)s RETURNING state_version""",
            {
                "state": state,
                "result": Jsonb({"invoice_number": f"AK-{job_id[:6]}"})
                if state != states.FAILED_TERMINAL
                else None,
                "reasons": Jsonb([{"code": "arithmetic"}]) if state == states.REVIEW_REQUIRED else None,
                "error": "schema_violation" if state == states.FAILED_TERMINAL else None,
                "id": job_id,
            },
        ).fetchone()
        assert row is not None
        uow.record(JobChange(tenant.id, uuid.UUID(job_id), state, row["state_version"], event_type))


def _items_of(client: httpx.Client, tenant: TenantHandle, batch_id: str, **query: Any) -> list[JSON]:
    found: list[JSON] = []
    params: dict[str, Any] = {"limit": 200, **query}
    while True:
        page = client.get(f"/v1/extraction-batches/{batch_id}/items", params=params, headers=tenant.headers)
        assert page.status_code == 200, page.text
        found += page.json()["items"]
        if page.json()["next_cursor"] is None:
            return found
        params["cursor"] = page.json()["next_cursor"]


def test_a_batch_is_accepted_at_once_and_every_item_key_derives_from_the_batch_key(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    # When a tenant submits three documents under one key, one of them with a key of its own
    body = {
        "items": [*_items(2), {**_items(1)[0], "idempotency_key": "own-key-9"}],
        "priority": "interactive",
    }
    reply = _post(client, tenant, body, "run-1")
    # Then the answer is 202 with the batch id, and says that nothing is complete yet
    assert reply.status_code == 202, reply.text
    accepted = reply.json()
    batch_id = accepted["batch_id"]
    assert reply.headers["location"] == f"/v1/extraction-batches/{batch_id}"
    assert accepted["state"] == "running" and accepted["done"] is False
    assert accepted["counts"]["total"] == 3 and accepted["counts"]["pending"] == 3
    assert "has STARTED" in accepted["message"] and "NONE is complete" in accepted["message"]
    assert "Do not report success" in accepted["message"]
    # And every item is an ordinary job whose key is derived from the batch key and its index
    items = _items_of(client, tenant, batch_id)
    assert [(i["index"], i["idempotency_key"]) for i in items] == [
        (0, item_key("run-1", 0)),
        (1, "run-1 #1"),
        (2, "own-key-9"),
    ]
    for item in items:
        job = client.get(item["status_url"], headers=tenant.headers).json()
        assert job["state"] == states.READY and job["priority"] == "interactive"
    assert count_rows(pool, tenant.id) == {"jobs": 3, "documents": 3, "outbox": 3, "job_events": 3}


def test_the_same_key_and_body_returns_the_same_batch_and_creates_nothing(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    body = {"items": _items(5)}
    first = _post(client, tenant, body, "replayed")
    before = count_rows(pool, tenant.id)
    # When the same request arrives again (priority and deadline do not change the result)
    again = _post(client, tenant, {**body, "priority": "interactive", "deadline_seconds": 600}, "replayed")
    # Then it is the same batch, marked as a replay, and no job was added
    assert again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["batch_id"] == first.json()["batch_id"]
    assert again.json()["message"].startswith("This request repeats an earlier one")
    assert count_rows(pool, tenant.id) == before == {"jobs": 5, "documents": 5, "outbox": 5, "job_events": 5}


def test_the_same_key_with_another_body_is_409_naming_the_batch_and_writes_nothing(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    first = _post(client, tenant, {"items": _items(2)}, "contested")
    before = count_rows(pool, tenant.id)
    for other in ({"items": _items(3)}, {"items": _items(2), "options": {"language": "tr"}}):
        reply = _post(client, tenant, other, "contested")
        assert reply.status_code == 409
        error = reply.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert error["batch_id"] == first.json()["batch_id"]
        assert first.json()["batch_id"] in error["message"]
    assert count_rows(pool, tenant.id) == before


def test_an_item_key_held_by_another_job_with_another_request_is_409_and_no_item_is_accepted(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    # Given a single job under the key "inv-7"
    single = client.post(
        "/v1/extraction-jobs", json=job_body(), headers={**tenant.headers, "Idempotency-Key": "inv-7"}
    )
    assert single.status_code == 202
    before = count_rows(pool, tenant.id)
    # When a batch's last item brings the same key with another document
    body = {"items": [*_items(3), {"document": {"text": INVOICE + "other"}, "idempotency_key": "inv-7"}]}
    reply = _post(client, tenant, body, "clashing")
    # Then the whole batch is refused, naming the item and the job, and nothing was written
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["index"], error["job_id"]) == (
        "idempotency_key_reused",
        3,
        single.json()["job_id"],
    )
    assert count_rows(pool, tenant.id) == before
    assert (
        client.get("/v1/extraction-jobs", headers=tenant.headers).json()["jobs"][0]["job_id"]
        == single.json()["job_id"]
    )


def test_a_batch_over_the_pending_cap_is_refused_whole_with_429_naming_the_limit(
    client: httpx.Client, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    # Given a tenant with room for 10 pending jobs, 4 of them taken
    tenant = make_tenant(max_pending_jobs=10)
    assert _post(client, tenant, {"items": _items(4)}, "first-four").status_code == 202
    before = count_rows(pool, tenant.id)
    # When it submits a batch of 7 (4 + 7 > 10), although 6 would still fit
    reply = _post(client, tenant, {"items": _items(7)}, "seven")
    # Then the batch is refused as a whole: 429, the limit named, Retry-After, and nothing written
    assert reply.status_code == 429
    error = reply.json()["error"]
    assert (error["code"], error["limit"], error["current"], error["maximum"]) == (
        "tenant_quota_exceeded",
        "pending_jobs",
        4,
        10,
    )
    assert error["items"] == 7 and "none of its items was accepted" in error["message"]
    assert int(reply.headers["retry-after"]) >= 1
    assert count_rows(pool, tenant.id) == before
    # And a batch that fits is accepted
    assert _post(client, tenant, {"items": _items(6)}, "six").status_code == 202


def test_batches_racing_for_a_tenants_last_places_are_admitted_one_at_a_time(
    edge: ServiceProcess, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    # Given a tenant with room for 10 pending jobs
    tenant = make_tenant(max_pending_jobs=10)
    barrier = threading.Barrier(6)

    def send(i: int) -> httpx.Response:
        with httpx.Client(base_url=str(edge.base_url), timeout=60.0) as c:
            barrier.wait()
            return _post(c, tenant, {"items": _items(4)}, f"four-{i}")

    # When six batches of four arrive at once (24 items where 10 fit)
    with ThreadPoolExecutor(max_workers=6) as threads:
        replies = list(threads.map(send, range(6)))
    # Then two batches are accepted whole and the others refused whole: never more than the cap
    codes = Counter(r.status_code for r in replies)
    assert codes == {202: 2, 429: 4}, [r.text for r in replies]
    assert {r.json()["error"]["limit"] for r in replies if r.status_code == 429} == {"pending_jobs"}
    assert count_rows(pool, tenant.id)["jobs"] == 8


def test_items_by_document_id_count_their_stored_size_and_a_missing_document_is_422_naming_the_item(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    stored = client.post("/v1/documents", json={"text": INVOICE}, headers=tenant.headers).json()
    ref = {"document_id": stored["document_id"], "document_version": 1}
    missing = {"document_id": str(uuid.uuid4()), "document_version": 1}
    before = count_rows(pool, tenant.id)
    reply = _post(client, tenant, {"items": [ref, *_items(1), missing]}, "by-id-missing")
    assert reply.status_code == 422
    assert (reply.json()["error"]["code"], reply.json()["error"]["index"]) == ("document_not_found", 2)
    assert count_rows(pool, tenant.id) == before
    ok = _post(client, tenant, {"items": [ref, *_items(1), ref]}, "by-id")
    assert ok.status_code == 202, ok.text
    with pool.connection() as conn:
        sizes = conn.execute(
            "SELECT doc_bytes FROM extraction_jobs WHERE batch_id = %s ORDER BY batch_index",
            (ok.json()["batch_id"],),
        ).fetchall()
    assert [r["doc_bytes"] for r in sizes] == [
        stored["size"],
        len((INVOICE + "Not 0\n").encode()),
        stored["size"],
    ]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"items": []}, 422, None),
        ({"items": [{"document": {"text": "x"}, "document_id": str(uuid.uuid4())}]}, 422, None),
        (
            {
                "items": [
                    {"document": {"text": "a"}, "idempotency_key": "k"},
                    {"document": {"text": "b"}, "idempotency_key": "k"},
                ]
            },
            422,
            "duplicate_item_key",
        ),
        ({"items": [{"document": {"text": "a"}, "idempotency_key": "has space"}]}, 422, None),
        ({"items": [{"document": {"text": "x" * (2 * 1024 * 1024 + 1)}}]}, 413, "document_too_large"),
    ],
)
def test_a_bad_batch_is_a_typed_error_and_writes_nothing(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool, body: JSON, status: int, code: str | None
) -> None:
    reply = _post(client, tenant, body, f"bad-{uuid.uuid4()}")
    assert reply.status_code == status, reply.text
    if code is not None:
        assert reply.json()["error"]["code"] == code
    assert count_rows(pool, tenant.id) == {"jobs": 0, "documents": 0, "outbox": 0, "job_events": 0}


def test_counts_and_partial_results_are_readable_while_the_batch_runs_and_it_closes_with_its_event(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    # Given a batch of five
    batch_id = _post(client, tenant, {"items": _items(5)}, "partial").json()["batch_id"]
    jobs = [i["job_id"] for i in _items_of(client, tenant, batch_id)]
    # When two succeed and one waits for review
    _finish(pool, tenant, jobs[0], states.SUCCEEDED)
    _finish(pool, tenant, jobs[3], states.SUCCEEDED)
    _finish(pool, tenant, jobs[1], states.REVIEW_REQUIRED)
    # Then the batch runs, counts them, and the finished results can already be read
    status = client.get(f"/v1/extraction-batches/{batch_id}", headers=tenant.headers).json()
    assert (status["state"], status["done"]) == ("running", False)
    assert status["counts"] == {
        "total": 5,
        "processed": 2,
        "pending": 2,
        "succeeded": 2,
        "review_required": 1,
        "failed": 0,
        "rejected": 0,
        "cancelled": 0,
    }
    assert "NOT complete" in status["message"] and "1 wait for a human reviewer" in status["message"]
    assert status["poll_after_seconds"] >= 1
    succeeded = _items_of(client, tenant, batch_id, state=states.SUCCEEDED)
    assert [(i["index"], i["result"]["invoice_number"]) for i in succeeded] == [
        (0, f"AK-{jobs[0][:6]}"),
        (3, f"AK-{jobs[3][:6]}"),
    ]
    review = _items_of(client, tenant, batch_id, state=states.REVIEW_REQUIRED)
    assert [(i["index"], "result" in i, i["review"]["reasons"]) for i in review] == [
        (1, False, [{"code": "arithmetic"}])
    ]
    # When the pending two finish (one fails) while one still waits for a reviewer
    _finish(pool, tenant, jobs[2], states.FAILED_TERMINAL)
    client.post(f"/v1/extraction-jobs/{jobs[4]}:cancel", headers=tenant.headers)
    # Then the batch is still running: a result awaiting review is not a result
    status = client.get(f"/v1/extraction-batches/{batch_id}", headers=tenant.headers).json()
    assert (status["state"], status["done"], status["counts"]["pending"]) == ("running", False, 0)
    assert "wait for a human reviewer" in status["message"] and status["poll_after_seconds"] == 60
    assert _events(pool, batch_id) == []
    # When a reviewer approves it (REVIEW_REQUIRED -> SUCCEEDED)
    with unit_of_work(pool) as uow:
        row = uow.execute(
            """UPDATE extraction_jobs SET state = 'SUCCEEDED', state_version = state_version + 1,
                      decided_by = 'reviewer' WHERE id = %s RETURNING state_version""",
            (jobs[1],),
        ).fetchone()
        assert row is not None
        uow.record(
            JobChange(
                tenant.id, uuid.UUID(jobs[1]), "SUCCEEDED", row["state_version"], events.EXTRACTION_COMPLETED
            )
        )
    # Then the batch is done, with errors, says so in words, and has written one batch.completed.v1
    status = client.get(f"/v1/extraction-batches/{batch_id}", headers=tenant.headers).json()
    assert (status["state"], status["done"]) == ("completed_with_errors", True)
    assert status["counts"] == {
        "total": 5,
        "processed": 5,
        "pending": 0,
        "succeeded": 3,
        "review_required": 0,
        "failed": 1,
        "rejected": 0,
        "cancelled": 1,
    }
    assert (
        "WITH ERRORS" in status["message"]
        and "Do not report the batch as fully successful" in status["message"]
    )
    assert status["completed_at"] is not None and "poll_after_seconds" not in status
    errors = client.get(status["errors_url"], headers=tenant.headers).json()["items"]
    assert [(i["index"], i["state"], i["error"]["class"]) for i in errors] == [
        (2, states.FAILED_TERMINAL, "schema_violation"),
        (4, states.CANCELLED, "cancelled"),
    ]
    assert [(e["tenant_id"], e["state"], e["state_version"]) for e in _events(pool, batch_id)] == [
        (str(tenant.id), "completed_with_errors", 1)
    ]


def test_a_batch_whose_items_all_succeed_is_completed(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    batch_id = _post(client, tenant, {"items": _items(3)}, "all-good").json()["batch_id"]
    for item in _items_of(client, tenant, batch_id):
        _finish(pool, tenant, item["job_id"], states.SUCCEEDED)
    status = client.get(f"/v1/extraction-batches/{batch_id}", headers=tenant.headers).json()
    assert (status["state"], status["done"], status["counts"]["succeeded"]) == ("completed", True, 3)
    assert status["message"].startswith("Complete: all 3 items")
    assert [e["state"] for e in _events(pool, batch_id)] == ["completed"]


def test_another_tenants_batch_is_404_and_a_bad_cursor_or_state_is_400(
    client: httpx.Client, make_tenant: MakeTenant
) -> None:
    owner, other = make_tenant(), make_tenant()
    batch_id = _post(client, owner, {"items": _items(1)}, "mine").json()["batch_id"]
    for path in (f"/v1/extraction-batches/{batch_id}", f"/v1/extraction-batches/{batch_id}/items"):
        reply = client.get(path, headers=other.headers)
        assert (reply.status_code, reply.json()["error"]["code"]) == (404, "batch_not_found")
    items = f"/v1/extraction-batches/{batch_id}/items"
    for params in ({"cursor": "nonsense"}, {"state": "DONE"}, {"limit": "0"}, {"other": "1"}):
        assert client.get(items, params=params, headers=owner.headers).status_code == 400


def test_identical_batches_racing_under_one_key_make_one_batch_and_different_ones_409(
    edge: ServiceProcess, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant()
    body, other = {"items": _items(20)}, {"items": _items(21)}
    barrier = threading.Barrier(12)

    def send(payload: JSON) -> httpx.Response:
        with httpx.Client(base_url=str(edge.base_url), timeout=60.0) as c:
            barrier.wait()
            return _post(c, tenant, payload, "raced")

    # When twelve requests arrive at once under one key: eight of one batch, four of another
    with ThreadPoolExecutor(max_workers=12) as threads:
        replies = list(threads.map(send, [body] * 8 + [other] * 4))
    # Then one batch exists, all copies of the winning body agree, the others are 409 naming it
    codes = Counter(r.status_code for r in replies)
    assert set(codes) <= {202, 409} and codes[202] in (4, 8), [r.text for r in replies]
    [batch_id] = {r.json()["batch_id"] for r in replies if r.status_code == 202}
    assert {r.json()["error"]["batch_id"] for r in replies if r.status_code == 409} == {batch_id}
    total = 20 if codes[202] == 8 else 21
    assert count_rows(pool, tenant.id) == {
        "jobs": total,
        "documents": total,
        "outbox": total,
        "job_events": total,
    }


def test_a_batch_cut_between_chunks_says_so_and_the_same_request_writes_only_what_is_missing(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool, database_url: str
) -> None:
    settings = AcceptanceSettings(common=CommonSettings(database_url=database_url))
    body = {"items": _items(5)}
    me = Tenant(tenant.id, "t", 1, 8, TenantLimits(20_000, 10**12, 10**12, 10**12))

    class CutAfterOneChunk(BatchService):
        chunks = 0

        async def _write_chunk(self, *args: Any, **kwargs: Any) -> None:
            if CutAfterOneChunk.chunks == 1:
                raise ConnectionResetError("the request's process died")
            CutAfterOneChunk.chunks += 1
            await super()._write_chunk(*args, **kwargs)

    async def submit_and_die() -> None:
        async with async_pool(settings.common, name="cut", autocommit=True) as db:
            service = CutAfterOneChunk(db, None, settings, chunk_items=2)
            with pytest.raises(ConnectionResetError):
                await service.submit(me, "cut", BatchParser(settings).create_batch(body))

    # Given a batch of five whose request died after its first chunk (two items) was committed
    asyncio.run(submit_and_die())
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT id, state, accepted FROM extraction_batches WHERE tenant_id = %s", (tenant.id,)
        ).fetchone()
    assert row is not None and (row["state"], row["accepted"]) == ("accepting", 2)
    written = {i["index"]: i["job_id"] for i in _items_of(client, tenant, str(row["id"]))}
    assert sorted(written) == [0, 1]
    # Then the batch says it is incomplete and what to do
    status = client.get(f"/v1/extraction-batches/{row['id']}", headers=tenant.headers).json()
    assert (status["state"], status["done"]) == ("accepting", False)
    assert (
        "only 2 of 5 items were accepted" in status["message"] and "same Idempotency-Key" in status["message"]
    )
    # When the same request is sent again, it completes the batch: the three missing items only
    again = _post(client, tenant, body, "cut")
    assert again.status_code == 202, again.text
    assert again.json()["batch_id"] == str(row["id"]) and again.json()["state"] == "running"
    items = _items_of(client, tenant, str(row["id"]))
    assert [i["index"] for i in items] == [0, 1, 2, 3, 4]
    assert {i["index"]: i["job_id"] for i in items if i["index"] < 2} == written
    assert count_rows(pool, tenant.id) == {"jobs": 5, "documents": 5, "outbox": 5, "job_events": 5}


def _events(pool: SyncPool, batch_id: str) -> list[JSON]:
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT payload FROM outbox_events
               WHERE event_type = 'batch.completed.v1' AND payload ->> 'batch_id' = %s""",
            (batch_id,),
        ).fetchall()
    return [r["payload"] for r in rows]


@pytest.mark.timeout(180)
def test_ten_thousand_short_documents_are_accepted_in_one_request(
    client: httpx.Client, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant()
    body = {
        "items": [{"document": {"text": f"FATURA No: B-{i}\nGenel Toplam: {i},00\n"}} for i in range(10_000)]
    }
    started = time.perf_counter()
    reply = httpx.post(
        f"{client.base_url}/v1/extraction-batches",
        json=body,
        headers={**tenant.headers, "Idempotency-Key": "ten-thousand"},
        timeout=300.0,
    )
    elapsed = time.perf_counter() - started
    print(f"\n10,000-item batch accepted in {elapsed:.2f} s ({10_000 / elapsed:.0f} items/s)")
    assert reply.status_code == 202, reply.text[:500]
    assert reply.json()["counts"]["total"] == 10_000
    assert count_rows(pool, tenant.id) == {
        "jobs": 10_000,
        "documents": 10_000,
        "outbox": 10_000,
        "job_events": 10_000,
    }
    # And a replay is answered from the batch's key without touching its items
    started = time.perf_counter()
    again = httpx.post(
        f"{client.base_url}/v1/extraction-batches",
        json=body,
        headers={**tenant.headers, "Idempotency-Key": "ten-thousand"},
        timeout=300.0,
    )
    print(f"its replay answered in {time.perf_counter() - started:.2f} s")
    assert again.json()["batch_id"] == reply.json()["batch_id"]
