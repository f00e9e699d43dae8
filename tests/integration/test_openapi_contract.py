"""The published contract: schemathesis generates valid and invalid requests from /openapi.json and
checks that the live edge never answers 5xx and that every response matches the document."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_ops import KeyHandle, make_operator
from fix_processes import ServiceProcess
from services.acceptance.keys import create_key
from services.acceptance.settings import AcceptanceSettings
from services.cli.http_edge import openapi_document

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# The document the edge serves is built by this function from the schemas it enforces; the last
# test below checks that the live /openapi.json is exactly this document.
DOCUMENT = openapi_document(AcceptanceSettings())
# The event streams stay open until the client leaves, and schemathesis reads a response to its end:
# their answers (the stream, and each typed error) are checked in test_event_stream.py instead.
STREAMS = ("/v1/events", "/v1/extraction-jobs/{job_id}/events")
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path=list(STREAMS))
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=40)


@pytest.fixture(scope="module")
def fuzz_tenant(make_tenant_module: MakeTenant) -> TenantHandle:
    return make_tenant_module()


@pytest.fixture(scope="module")
def fuzz_operator(pool: SyncPool) -> KeyHandle:
    return make_operator(pool, label="contract test")


@pytest.fixture(scope="module")
def fuzz_reviewer(pool: SyncPool, fuzz_tenant: TenantHandle) -> KeyHandle:
    _info, key = create_key(pool, scope="reviewer", tenant_id=fuzz_tenant.id, label="contract test")
    return KeyHandle(key)


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_edge_honours_its_openapi_document(
    case: schemathesis.Case,
    edge: ServiceProcess,
    fuzz_tenant: TenantHandle,
    fuzz_operator: KeyHandle,
    fuzz_reviewer: KeyHandle,
) -> None:
    # A negative case that mutates the headers may have dropped Authorization on purpose; adding the
    # key back would turn it into a valid request that is then "wrongly" accepted. The operator
    # routes take the operator's key, the review routes the reviewer's, every other route the tenant's.
    headers_info = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    mutated_headers = headers_info is not None and headers_info.mode == GenerationMode.NEGATIVE
    key: KeyHandle | TenantHandle = fuzz_tenant
    if case.path.startswith("/v1/ops/"):
        key = fuzz_operator
    elif case.path.startswith("/v1/reviews"):
        key = fuzz_reviewer
    headers = {} if mutated_headers else key.headers
    case.call_and_validate(base_url=edge.base_url, headers=headers, checks=CHECKS)


def test_the_document_describes_the_routes_the_server_has(edge: ServiceProcess) -> None:
    document = httpx.get(f"{edge.base_url}/openapi.json").json()
    assert document == DOCUMENT
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/v1/documents",
        "/v1/extraction-jobs",
        "/v1/extraction-jobs/{job_id}",
        "/v1/extraction-jobs/{job_id}:cancel",
        "/v1/extraction-jobs/{job_id}/events",
        "/v1/events",
        "/v1/extraction-batches",
        "/v1/extraction-batches/{batch_id}",
        "/v1/extraction-batches/{batch_id}/items",
        "/v1/webhook-endpoints",
        "/v1/webhook-endpoints/{endpoint_id}",
        "/v1/webhook-endpoints/{endpoint_id}:disable",
        "/v1/webhook-endpoints/{endpoint_id}:enable",
        "/v1/webhook-endpoints/{endpoint_id}:rotate-secret",
        "/v1/webhook-endpoints/{endpoint_id}:recover",
        "/v1/deliveries",
        "/v1/deliveries/{delivery_id}:resend",
        "/v1/deliveries/{delivery_id}:ack",
        "/v1/reviews",
        "/v1/reviews/{review_id}",
        "/v1/reviews/{review_id}:claim",
        "/v1/reviews/{review_id}:approve",
        "/v1/reviews/{review_id}:correct",
        "/v1/reviews/{review_id}:reject",
        "/v1/ops/dead-letters",
        "/v1/ops/dead-letters/{dead_letter_id}",
        "/v1/ops/dead-letters:redrive",
        "/v1/ops/jobs/{job_id}",
        "/v1/ops/quarantine",
        "/v1/ops/endpoints",
        "/v1/ops/limiter/pools",
        "/healthz",
        "/readyz",
    }
