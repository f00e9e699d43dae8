"""The JobService as a real process (``fatura run jobs-grpc``) beside the HTTP edge, a client for
it, and helpers that read the google.rpc details of a failed call."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fix_db import TenantHandle
from fix_processes import ServiceProcess, SpawnFn, free_port
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

INVOICE = (
    "ANADOLU KIRTASİYE A.Ş.\nVKN: 1234567890\nFATURA\nFatura No: AK-1\nPara Birimi: TRY\n"
    "A4 Kağıt  10  450,00  4.500,00\nAra Toplam: 4.500,00\nKDV %20: 900,00\nGenel Toplam: 5.400,00\n"
)


@dataclass
class JobsGrpc:
    process: ServiceProcess
    port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_jobs_grpc(spawn: SpawnFn, **env: str) -> JobsGrpc:
    # Tests send bad keys on purpose: the failed-authentication throttle is off, as for the edge.
    port, metrics_port = free_port(), free_port()
    process = spawn(
        "jobs-grpc",
        FATURA_JOBS_GRPC_PORT=str(port),
        FATURA_JOBS_GRPC_METRICS_PORT=str(metrics_port),
        **{"FATURA_AUTH_FAILURE_LIMIT": "0", "FATURA_AUTH_CACHE_SECONDS": "0", **env},
    )
    process.wait_ready(f"http://127.0.0.1:{metrics_port}/readyz")
    return JobsGrpc(process, port, metrics_port)


@pytest.fixture(scope="session")
def jobs_grpc(spawn: SpawnFn) -> JobsGrpc:
    return start_jobs_grpc(spawn)


@pytest.fixture
def channel(jobs_grpc: JobsGrpc) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(jobs_grpc.address) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.JobServiceStub:
    return pb_grpc.JobServiceStub(channel)


def key_of(tenant: TenantHandle) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {tenant.api_key}"),)


def submit_request(key: str, text: str = INVOICE, **fields: Any) -> pb.SubmitRequest:
    return pb.SubmitRequest(
        idempotency_key=key, document=pb.InlineDocument(text=text, filename="invoice.txt"), **fields
    )


def refusal(call: Any) -> grpc.RpcError:
    """The RpcError a call raises (the test fails if it succeeds)."""
    try:
        call()
    except grpc.RpcError as error:
        return error
    raise AssertionError("the call succeeded")


def details(error: grpc.RpcError) -> dict[str, Any]:
    """The google.rpc details of a failed call, by type name (``ErrorInfo``, ``BadRequest``...)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, f"{error.code()} carries no google.rpc status: {error.details()}"
    found: dict[str, Any] = {}
    for packed in status.details:
        for kind in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.RetryInfo,
            error_details_pb2.ResourceInfo,
        ):
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                found[kind.DESCRIPTOR.name] = message
    return found
