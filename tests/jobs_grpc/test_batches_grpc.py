"""Batches through the JobService: the HTTP batch API's service behind gRPC, so the same batch, keys,
admission, counts, items and wording, with gRPC codes and google.rpc details."""

from __future__ import annotations

import uuid

import grpc
import httpx
from fix_jobs_grpc import INVOICE, details, key_of, refusal

from fix_db import MakeTenant, SyncPool, TenantHandle, count_rows
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc


def _key() -> str:
    return f"grpc-batch-{uuid.uuid4()}"


def _batch(key: str, n: int = 3, **fields: object) -> pb.SubmitBatchRequest:
    items = [pb.BatchItemRequest(document=pb.InlineDocument(text=f"{INVOICE}Not {i}\n")) for i in range(n)]
    return pb.SubmitBatchRequest(idempotency_key=key, items=items, **fields)  # type: ignore[arg-type]


def _http_body(n: int = 3) -> dict[str, object]:
    return {"items": [{"document": {"text": f"{INVOICE}Not {i}\n"}} for i in range(n)]}


def test_a_batch_submitted_over_grpc_reads_the_same_over_grpc_and_http(
    stub: pb_grpc.JobServiceStub, client: httpx.Client, tenant: TenantHandle
) -> None:
    key = _key()
    request = _batch(key)
    request.items[1].idempotency_key = f"{key}-own"

    accepted = stub.SubmitBatch(request, metadata=key_of(tenant))

    assert accepted.state == pb.BATCH_STATE_RUNNING and not accepted.done and not accepted.replayed
    assert accepted.counts.total == 3 and accepted.counts.pending == 3
    assert "has STARTED" in accepted.message and "NONE is complete" in accepted.message
    status = stub.GetBatch(pb.GetBatchRequest(batch_id=accepted.batch_id), metadata=key_of(tenant))
    http = client.get(accepted.status_url, headers=tenant.headers).json()
    assert status.message == http["message"] and status.counts.total == http["counts"]["total"] == 3
    assert status.state == pb.BATCH_STATE_RUNNING and http["state"] == "running"
    assert status.poll_after_seconds == http["poll_after_seconds"]

    first = stub.ListBatchItems(
        pb.ListBatchItemsRequest(batch_id=accepted.batch_id, limit=2), metadata=key_of(tenant)
    )
    rest = stub.ListBatchItems(
        pb.ListBatchItemsRequest(batch_id=accepted.batch_id, limit=2, cursor=first.next_cursor),
        metadata=key_of(tenant),
    )
    items = [*first.items, *rest.items]
    assert [i.index for i in items] == [0, 1, 2] and rest.next_cursor == ""
    assert [i.idempotency_key for i in items] == [f"{key} #0", f"{key}-own", f"{key} #2"]
    assert all(i.state == pb.JOB_STATE_READY and not i.HasField("result") for i in items)


def test_the_same_batch_key_replays_through_either_door_and_another_request_is_already_exists(
    stub: pb_grpc.JobServiceStub, client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    key = _key()
    first = stub.SubmitBatch(_batch(key), metadata=key_of(tenant))
    again = stub.SubmitBatch(_batch(key), metadata=key_of(tenant))
    http = client.post(
        "/v1/extraction-batches", json=_http_body(), headers={**tenant.headers, "Idempotency-Key": key}
    )

    assert again.batch_id == first.batch_id and again.replayed
    assert http.status_code == 202 and http.json()["batch_id"] == first.batch_id
    before = count_rows(pool, tenant.id)
    error = refusal(lambda: stub.SubmitBatch(_batch(key, n=2), metadata=key_of(tenant)))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    found = details(error)
    assert found["ResourceInfo"].resource_type == "fatura.jobs.v1.Batch"
    assert found["ResourceInfo"].resource_name == first.batch_id == found["ErrorInfo"].metadata["batch_id"]
    assert count_rows(pool, tenant.id) == before


def test_a_bad_item_is_invalid_argument_naming_the_item_and_nothing_is_accepted(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle, pool: SyncPool
) -> None:
    empty = _batch(_key())
    empty.items[1].document.text = ""
    twice = _batch(_key())
    twice.items[0].idempotency_key = twice.items[2].idempotency_key = "same"
    large = _batch(_key())
    large.items[2].document.text = "x" * (2 * 1024 * 1024 + 1)

    for request, field in (
        (empty, "items[1].document.text"),
        (twice, "items[2].idempotency_key"),
        (large, "items[2].document.text"),
        (pb.SubmitBatchRequest(idempotency_key=_key()), "items"),
    ):
        error = refusal(lambda request=request: stub.SubmitBatch(request, metadata=key_of(tenant)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in [v.field for v in details(error)["BadRequest"].field_violations]
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_a_batch_over_the_tenants_limit_is_refused_whole_with_the_retry_delay(
    stub: pb_grpc.JobServiceStub, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant(max_pending_jobs=2)

    error = refusal(lambda: stub.SubmitBatch(_batch(_key(), n=3), metadata=key_of(tenant)))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    found = details(error)
    assert found["RetryInfo"].retry_delay.seconds == 30
    assert (
        found["ErrorInfo"].metadata["limit"] == "pending_jobs" and found["ErrorInfo"].metadata["items"] == "3"
    )
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_another_tenants_batch_is_not_found_and_a_bad_filter_names_its_field(
    stub: pb_grpc.JobServiceStub, make_tenant: MakeTenant
) -> None:
    owner, other = make_tenant(), make_tenant()
    batch_id = stub.SubmitBatch(_batch(_key(), n=1), metadata=key_of(owner)).batch_id

    for call in (
        lambda: stub.GetBatch(pb.GetBatchRequest(batch_id=batch_id), metadata=key_of(other)),
        lambda: stub.ListBatchItems(pb.ListBatchItemsRequest(batch_id=batch_id), metadata=key_of(other)),
        lambda: stub.GetBatch(pb.GetBatchRequest(batch_id="nope"), metadata=key_of(owner)),
    ):
        error = refusal(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert details(error)["ErrorInfo"].reason == "BATCH_NOT_FOUND"

    errors_only = stub.ListBatchItems(
        pb.ListBatchItemsRequest(batch_id=batch_id, state="errors"), metadata=key_of(owner)
    )
    assert list(errors_only.items) == []
    for request, field in (
        (pb.ListBatchItemsRequest(batch_id=batch_id, state="DONE"), "state"),
        (pb.ListBatchItemsRequest(batch_id=batch_id, limit=201), "limit"),
        (pb.ListBatchItemsRequest(batch_id=batch_id, cursor="not-ours"), "cursor"),
    ):
        error = refusal(lambda request=request: stub.ListBatchItems(request, metadata=key_of(owner)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in details(error)["BadRequest"].field_violations] == [field]
