"""No 500 for a client's mistake (DESIGN §5.11), whatever a client makes of an id, a query string or
a cursor: every route of the live edge, fed mutated values, answers with a typed JSON error.

Hypothesis draws the values; each one is a real request to the edge process.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_ops import make_operator
from fix_processes import ServiceProcess

_SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_UUID = "01a22b15-3596-715b-805f-e7647f49c5a8"

# Values a careless or hostile client sends where an id or a number goes.
_IDS = st.one_of(
    st.just(f"{_UUID}\n"),
    st.just(f" {_UUID}"),
    st.just(_UUID.upper() + "0"),
    st.just("²"),
    st.just("٣"),
    st.just("-1"),
    st.just("9" * 40),
    st.text(min_size=1, max_size=80),
)
_NUMBERS = st.one_of(
    st.just("²"),
    st.just("٣٠"),
    st.just("\uff11\uff10"),  # fullwidth digits
    st.just("1e3"),
    st.just("-5"),
    st.just("9" * 40),
    st.text(max_size=20),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["c", "i", "x"]), inner, max_size=3)
    ),
    max_leaves=6,
)


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _cursors() -> st.SearchStrategy[str]:
    return st.one_of(
        _JSON.map(_cursor),
        st.just(_cursor({"i": 123})),
        st.just(_cursor({"c": "2026-01-01T00:00:00", "i": _UUID})),
        st.text(max_size=40),
    )


def _assert_typed(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.url, response.status_code, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)


@pytest.fixture(scope="module")
def client_module(edge: ServiceProcess) -> Iterator[httpx.Client]:
    assert edge.base_url is not None
    with httpx.Client(base_url=edge.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def operator_key(pool: SyncPool) -> str:
    return make_operator(pool, "no-500 tests").api_key


@pytest.fixture(scope="module")
def id_routes(edge: ServiceProcess) -> list[tuple[str, str]]:
    """Every (method, path) of the OpenAPI document whose path takes an id."""
    paths = httpx.get(f"{edge.base_url}/openapi.json", timeout=10).json()["paths"]
    found = [(m.upper(), p) for p, item in paths.items() for m in item if "{" in p]
    assert len(found) >= 6
    return found


def _headers(path: str, tenant: TenantHandle, operator_key: str) -> dict[str, str]:
    key = operator_key if path.startswith("/v1/ops/") else tenant.api_key
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


@_SETTINGS
@given(value=_IDS)
def test_any_id_in_any_path_is_a_typed_answer(
    client: httpx.Client,
    tenant: TenantHandle,
    operator_key: str,
    id_routes: list[tuple[str, str]],
    value: str,
) -> None:
    for method, template in id_routes:
        path = re.sub(r"\{[a-z_]+\}", quote(value, safe=""), template)
        _assert_typed(
            client.request(method, path, headers=_headers(template, tenant, operator_key), content=b"{}")
        )


@_SETTINGS
@given(limit=_NUMBERS, cursor=_cursors(), state=st.text(max_size=20))
def test_any_list_query_is_a_typed_answer(
    client: httpx.Client, tenant: TenantHandle, operator_key: str, limit: str, cursor: str, state: str
) -> None:
    for path, params in (
        ("/v1/extraction-jobs", {"limit": limit, "cursor": cursor, "state": state}),
        ("/v1/extraction-jobs", {"limit": limit}),
        ("/v1/extraction-jobs", {"cursor": cursor}),
        ("/v1/deliveries", {"job_id": state or limit}),
        ("/v1/ops/dead-letters", {"limit": limit, "since": state, "reason": cursor}),
        ("/v1/ops/quarantine", {"limit": limit, "since": state, "inbox": cursor}),
        ("/v1/ops/endpoints", {"limit": limit, "state": state, "breaker": cursor, "tenant_id": state}),
    ):
        _assert_typed(client.get(path, params=params, headers=_headers(path, tenant, operator_key)))


@pytest.fixture(scope="module")
def batch_owner(client_module: httpx.Client, make_tenant_module: MakeTenant) -> tuple[TenantHandle, str]:
    tenant = make_tenant_module()
    reply = client_module.post(
        "/v1/extraction-batches",
        json={"items": [{"document": {"text": "FATURA"}}, {"document": {"text": "FATURA 2"}}]},
        headers={**tenant.headers, "Idempotency-Key": "no-500-batch"},
    )
    assert reply.status_code == 202, reply.text
    return tenant, reply.json()["batch_id"]


@_SETTINGS
@given(limit=_NUMBERS, cursor=_cursors(), state=st.text(max_size=20))
def test_any_batch_items_query_is_a_typed_answer(
    client: httpx.Client, batch_owner: tuple[TenantHandle, str], limit: str, cursor: str, state: str
) -> None:
    tenant, batch_id = batch_owner
    path = f"/v1/extraction-batches/{batch_id}/items"
    for params in ({"limit": limit, "cursor": cursor, "state": state}, {"cursor": cursor}, {"limit": limit}):
        _assert_typed(client.get(path, params=params, headers=tenant.headers))


@_SETTINGS
@given(
    document_id=_IDS,
    version=st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5)),
)
def test_a_job_naming_a_malformed_document_is_a_typed_answer(
    client: httpx.Client, tenant: TenantHandle, document_id: str, version: Any
) -> None:
    response = client.post(
        "/v1/extraction-jobs",
        json={"document_id": document_id, "document_version": version},
        headers={**tenant.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
    )
    _assert_typed(response)
    assert response.status_code in (404, 422)


def test_the_examples_the_audit_found_are_typed_answers(client: httpx.Client, tenant: TenantHandle) -> None:
    newline = client.post(
        "/v1/extraction-jobs",
        json={"document_id": f"{_UUID}\n", "document_version": 1},
        headers={**tenant.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
    )
    superscript = client.get("/v1/extraction-jobs", params={"limit": "²"}, headers=tenant.headers)
    crafted = client.get(
        "/v1/extraction-jobs", params={"cursor": _cursor({"i": 123})}, headers=tenant.headers
    )
    assert [newline.status_code, superscript.status_code, crafted.status_code] == [422, 400, 400]
    assert crafted.json()["error"]["code"] == "invalid_cursor"
