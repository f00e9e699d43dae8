"""The gRPC JobService answers as the HTTP job API does, because it runs the same code: the same
jobs, idempotency, admission, tenancy, validation and wording, with gRPC codes and google.rpc details."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
from fix_jobs_grpc import INVOICE, JobsGrpc, details, key_of, refusal, submit_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fix_api import job_body
from fix_db import MakeTenant, SyncPool, TenantHandle, count_rows
from fix_processes import SpawnFn, free_port
from services.acceptance.keys import create_key, revoke_key
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

SERVICE = "fatura.jobs.v1.JobService"


def _key() -> str:
    return f"grpc-{uuid.uuid4()}"


def test_a_submitted_job_reads_the_same_over_grpc_and_http(
    stub: pb_grpc.JobServiceStub, client: httpx.Client, tenant: TenantHandle
) -> None:
    """Given a job submitted over gRPC
    When it is read over gRPC and over HTTP
    Then both say the same state, version, wait and words, and neither says it is complete."""
    accepted = stub.Submit(submit_request(_key(), priority=pb.PRIORITY_INTERACTIVE), metadata=key_of(tenant))

    assert uuid.UUID(accepted.job_id)
    assert accepted.state == pb.JOB_STATE_READY and not accepted.done and not accepted.replayed
    assert (
        "has STARTED and is NOT complete" in accepted.message and "Do not report success" in accepted.message
    )
    assert accepted.status_url == f"/v1/extraction-jobs/{accepted.job_id}"
    assert accepted.poll_after_seconds >= 1

    status = stub.Get(pb.GetRequest(job_id=accepted.job_id), metadata=key_of(tenant))
    http = client.get(accepted.status_url, headers=tenant.headers).json()
    assert pb.JobState.Name(status.state) == f"JOB_STATE_{http['state']}"
    assert status.done is http["done"] is False
    assert status.state_version == http["state_version"] == 1
    assert status.message == http["message"] and "NOT complete" in status.message
    assert status.HasField("poll_after_seconds") and status.poll_after_seconds == http["poll_after_seconds"]
    assert status.priority == pb.PRIORITY_INTERACTIVE and http["priority"] == "interactive"
    assert status.document.document_id == http["document"]["document_id"]
    assert status.created_at.ToDatetime().isoformat()[:19] == http["created_at"][:19]
    assert not status.HasField("result") and not status.HasField("error")


def test_the_same_key_and_request_return_the_same_job_through_either_door(
    stub: pb_grpc.JobServiceStub, client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    key = _key()
    first = stub.Submit(submit_request(key), metadata=key_of(tenant))
    again = stub.Submit(submit_request(key), metadata=key_of(tenant))
    # The same request as HTTP JSON under the same key: one idempotency, not one per door.
    http = client.post(
        "/v1/extraction-jobs", json=job_body(), headers={**tenant.headers, "Idempotency-Key": key}
    )

    assert again.job_id == first.job_id and again.replayed and not first.replayed
    assert "repeats an earlier one" in again.message
    assert http.status_code == 202 and http.json()["job_id"] == first.job_id
    assert http.headers["idempotent-replayed"] == "true"
    assert count_rows(pool, tenant.id)["jobs"] == 1


def test_a_key_reused_for_another_request_is_already_exists_naming_the_job(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle, pool: SyncPool
) -> None:
    key = _key()
    first = stub.Submit(submit_request(key), metadata=key_of(tenant))
    before = count_rows(pool, tenant.id)

    error = refusal(
        lambda: stub.Submit(submit_request(key, text=INVOICE + "changed"), metadata=key_of(tenant))
    )

    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert first.job_id in error.details()
    found = details(error)
    assert found["ErrorInfo"].reason == "IDEMPOTENCY_KEY_REUSED" and found["ErrorInfo"].domain == "fatura"
    assert found["ErrorInfo"].metadata["job_id"] == first.job_id
    assert found["ResourceInfo"].resource_type == "fatura.jobs.v1.Job"
    assert found["ResourceInfo"].resource_name == first.job_id
    assert count_rows(pool, tenant.id) == before


def test_a_tenant_at_its_limit_is_resource_exhausted_with_the_retry_delay(
    stub: pb_grpc.JobServiceStub, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant(max_pending_jobs=1)
    stub.Submit(submit_request(_key()), metadata=key_of(tenant))
    before = count_rows(pool, tenant.id)

    error = refusal(lambda: stub.Submit(submit_request(_key()), metadata=key_of(tenant)))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    found = details(error)
    assert found["RetryInfo"].retry_delay.seconds == 30  # FATURA_ADMISSION_RETRY_AFTER_SECONDS
    info = found["ErrorInfo"]
    assert info.reason == "TENANT_QUOTA_EXCEEDED"
    assert (info.metadata["limit"], info.metadata["current"], info.metadata["maximum"]) == (
        "pending_jobs",
        "1",
        "1",
    )
    assert "Nothing was created" in error.details()
    assert count_rows(pool, tenant.id) == before


def test_another_tenants_job_is_not_found(stub: pb_grpc.JobServiceStub, make_tenant: MakeTenant) -> None:
    owner, other = make_tenant(), make_tenant()
    job_id = stub.Submit(submit_request(_key()), metadata=key_of(owner)).job_id

    for call in (
        lambda: stub.Get(pb.GetRequest(job_id=job_id), metadata=key_of(other)),
        lambda: stub.Cancel(pb.CancelRequest(job_id=job_id), metadata=key_of(other)),
        lambda: stub.Get(pb.GetRequest(job_id="not-a-job-id"), metadata=key_of(owner)),
        lambda: stub.Get(pb.GetRequest(job_id=str(uuid.uuid4())), metadata=key_of(owner)),
    ):
        error = refusal(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert details(error)["ErrorInfo"].reason == "JOB_NOT_FOUND"
    assert stub.Get(pb.GetRequest(job_id=job_id), metadata=key_of(owner)).state == pb.JOB_STATE_READY


@pytest.mark.parametrize(
    ("fields", "violations"),
    [
        ({"deadline_seconds": 5}, {"deadline_seconds"}),
        ({"priority": 9}, {"priority"}),
        ({"schema": "invoice.v9"}, {"schema"}),
        (
            {"options": pb.Options(language="english", model_policy="cheapest")},
            {"options.language", "options.model_policy"},
        ),
        ({"document": pb.InlineDocument(text="")}, {"document.text"}),
        ({"document": pb.InlineDocument(text="a\x00b")}, {"document.text"}),
        ({"document_id": str(uuid.uuid4()), "document_version": 1}, {"document"}),
        ({"idempotency_key": ""}, {"idempotency_key"}),
        ({"idempotency_key": "with space"}, {"idempotency_key"}),
    ],
)
def test_bad_fields_are_invalid_argument_naming_each_field(
    stub: pb_grpc.JobServiceStub,
    tenant: TenantHandle,
    pool: SyncPool,
    fields: dict[str, object],
    violations: set[str],
) -> None:
    request = submit_request(_key())
    for name, value in fields.items():
        if isinstance(value, pb.Options | pb.InlineDocument):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)

    error = refusal(lambda: stub.Submit(request, metadata=key_of(tenant)))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = details(error)["BadRequest"]
    assert {v.field for v in bad.field_violations} == violations
    assert all(v.description for v in bad.field_violations)
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_a_document_over_the_cap_is_invalid_argument_on_the_text(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle
) -> None:
    error = refusal(
        lambda: stub.Submit(submit_request(_key(), text="x" * (2 * 1024 * 1024 + 1)), metadata=key_of(tenant))
    )

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    found = details(error)
    assert found["ErrorInfo"].reason == "DOCUMENT_TOO_LARGE"
    assert [v.field for v in found["BadRequest"].field_violations] == ["document.text"]


def test_a_stored_document_that_does_not_exist_is_invalid_argument_on_its_id(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle
) -> None:
    request = pb.SubmitRequest(idempotency_key=_key(), document_id=str(uuid.uuid4()), document_version=1)

    error = refusal(lambda: stub.Submit(request, metadata=key_of(tenant)))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details(error)["BadRequest"].field_violations] == ["document_id"]


def test_no_key_a_bad_key_or_a_revoked_key_is_unauthenticated(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle, pool: SyncPool
) -> None:
    request = submit_request(_key())
    for metadata in (
        (),
        (("authorization", "Basic abc"),),
        (("authorization", "Bearer fat_nope_nope"),),
        (("authorization", f"Bearer {tenant.api_key}"), ("authorization", f"Bearer {tenant.api_key}")),
    ):
        error = refusal(lambda metadata=metadata: stub.Submit(request, metadata=metadata))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
        assert details(error)["ErrorInfo"].reason == "UNAUTHORIZED"

    revoke_key(pool, tenant.api_key)
    error = refusal(lambda: stub.Get(pb.GetRequest(job_id=str(uuid.uuid4())), metadata=key_of(tenant)))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_a_key_of_another_scope_is_permission_denied(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle, pool: SyncPool
) -> None:
    _, reviewer = create_key(pool, scope="reviewer", tenant_id=tenant.id)

    error = refusal(lambda: stub.List(pb.ListRequest(), metadata=(("authorization", f"Bearer {reviewer}"),)))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    info = details(error)["ErrorInfo"]
    assert info.reason == "WRONG_KEY_SCOPE" and info.metadata["required_scope"] == "tenant"


def test_cancel_cancels_once_and_a_finished_job_is_failed_precondition(
    stub: pb_grpc.JobServiceStub, tenant: TenantHandle, pool: SyncPool
) -> None:
    job_id = stub.Submit(submit_request(_key()), metadata=key_of(tenant)).job_id

    cancelled = stub.Cancel(pb.CancelRequest(job_id=job_id), metadata=key_of(tenant))
    again = stub.Cancel(pb.CancelRequest(job_id=job_id), metadata=key_of(tenant))

    assert cancelled.state == again.state == pb.JOB_STATE_CANCELLED
    assert cancelled.done and cancelled.state_version == again.state_version == 2
    assert cancelled.message.startswith("Cancelled")
    assert not cancelled.HasField("poll_after_seconds") and cancelled.HasField("finished_at")

    finished = stub.Submit(submit_request(_key()), metadata=key_of(tenant)).job_id
    with pool.connection() as conn:  # stands in for the inference worker finishing the job
        conn.execute("UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %s", (uuid.UUID(finished),))
        conn.execute(
            "UPDATE extraction_jobs SET state = 'SUCCEEDED', state_version = 2, finished_at = now()"
            " WHERE id = %s",
            (uuid.UUID(finished),),
        )
    error = refusal(lambda: stub.Cancel(pb.CancelRequest(job_id=finished), metadata=key_of(tenant)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details(error)["ErrorInfo"].metadata["state"] == "SUCCEEDED"


def test_list_pages_with_a_cursor_and_filters_by_state(
    stub: pb_grpc.JobServiceStub, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()
    ids = [stub.Submit(submit_request(_key()), metadata=key_of(tenant)).job_id for _ in range(3)]
    stub.Cancel(pb.CancelRequest(job_id=ids[0]), metadata=key_of(tenant))

    first = stub.List(pb.ListRequest(limit=2), metadata=key_of(tenant))
    second = stub.List(pb.ListRequest(limit=2, cursor=first.next_cursor), metadata=key_of(tenant))
    cancelled = stub.List(pb.ListRequest(state=pb.JOB_STATE_CANCELLED), metadata=key_of(tenant))

    assert [j.job_id for j in first.jobs] + [j.job_id for j in second.jobs] == ids[::-1]
    assert first.next_cursor and second.next_cursor == ""
    assert [j.job_id for j in cancelled.jobs] == [ids[0]] and cancelled.jobs[0].done
    assert first.jobs[0].status_url == f"/v1/extraction-jobs/{ids[2]}"

    for request, field in (
        (pb.ListRequest(limit=500), "limit"),
        (pb.ListRequest(limit=-1), "limit"),
        (pb.ListRequest(state=42), "state"),
        (pb.ListRequest(cursor="not-ours"), "cursor"),
    ):
        error = refusal(lambda request=request: stub.List(request, metadata=key_of(tenant)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        assert [v.field for v in details(error)["BadRequest"].field_violations] == [field]


def test_health_says_serving_and_reflection_lists_the_service(
    channel: grpc.Channel, jobs_grpc: JobsGrpc
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert SERVICE in names and "grpc.health.v1.Health" in names

    metrics = httpx.get(f"http://127.0.0.1:{jobs_grpc.metrics_port}/metrics").text
    assert "# HELP fatura_jobs_grpc_rpc_seconds " in metrics


def test_bytes_that_are_not_a_request_are_invalid_argument(
    channel: grpc.Channel, tenant: TenantHandle, pool: SyncPool
) -> None:
    """Given a Submit whose document text is not UTF-8 (protobuf strings must be)
    Then the answer is INVALID_ARGUMENT with a BadRequest, not UNKNOWN, and nothing is written."""
    raw = pb.SubmitRequest(idempotency_key=_key(), document=pb.InlineDocument(text="abc")).SerializeToString()
    submit = channel.unary_unary("/fatura.jobs.v1.JobService/Submit")

    error = refusal(lambda: submit(raw.replace(b"abc", b"a\xffc"), metadata=key_of(tenant)))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    found = details(error)
    assert found["ErrorInfo"].reason == "MALFORMED_REQUEST"
    assert "fatura.jobs.v1.SubmitRequest" in error.details()
    assert len(found["BadRequest"].field_violations) == 1
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_it_will_not_serve_keys_in_clear_beyond_loopback(spawn: SpawnFn) -> None:
    process = spawn("jobs-grpc", FATURA_JOBS_GRPC_HOST="0.0.0.0", FATURA_JOBS_GRPC_PORT=str(free_port()))

    assert process.wait_exit(timeout=30) == 2
    assert "FATURA_JOBS_GRPC_TLS_CERT" in process.log()
