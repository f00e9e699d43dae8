"""The edge's compiled request check (fastjsonschema) and its reference validator (jsonschema with
the ECMA ``$``) give the same verdict on every request body: valid ones, and valid ones with any one
field replaced by arbitrary JSON, dropped, or joined by an unknown one. A body the compiled check
accepted and the reference would refuse would reach the database unchecked."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_paths import json_paths

from services.acceptance import schemas
from services.acceptance.batches import schemas as batch_schemas
from services.common.api.schema import RequestSchema

POLICIES = ("default",)
SCHEMAS = {
    "job": RequestSchema(schemas.create_job_request(POLICIES)),
    "document": RequestSchema(schemas.create_document_request()),
    "batch": RequestSchema(batch_schemas.create_batch_request(POLICIES, 50)),
}
UUID = "0b5e3c4e-8d1f-4b8e-9a53-2f4c1e7d6a10"
INLINE = {"document": {"text": "FATURA AK-2026-000184 ...", "filename": "a.txt"}}
JOB = {**INLINE, "priority": "interactive", "deadline_seconds": 600, "options": {"language": "tr-TR"}}
VALID: dict[str, list[dict[str, Any]]] = {
    "job": [
        JOB,
        INLINE,
        {
            "document_id": UUID,
            "document_version": 2,
            "schema": "invoice.v1",
            "options": {"model_policy": "default"},
        },
    ],
    "document": [{"text": "x"}, {"text": "FATURA", "filename": "f.pdf.txt", "document_id": UUID}],
    "batch": [
        {
            "items": [
                {**INLINE, "options": {"language": "tr"}, "idempotency_key": "k-1"},
                {"document_id": UUID, "document_version": 1},
            ],
            "priority": "batch",
            "deadline_seconds": 3600,
        },
        {"items": [INLINE], "options": {"model_policy": "default"}},
    ],
}
# Values the two libraries could read differently: a trailing newline after a pattern's `$`, NUL,
# booleans and floats where integers go, huge numbers, strings at their length limits.
TRICKY = [
    f"{UUID}\n",
    UUID.upper(),
    "a\u0000b",
    "tr-TR\n",
    "x" * 255,
    "x" * 256,
    "\u001f",
    True,
    False,
    60.0,
    60.5,
    1e300,
    2**31,
    2**31 - 1,
    0,
    -1,
    "",
    "interactive",
    "invoice.v1",
    "default",
    None,
    [],
    {},
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(TRICKY),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _verdicts(kind: str, body: Any) -> tuple[bool, bool]:
    schema = SCHEMAS[kind]
    return schema.accepts_fast(body), not list(schema.reference.iter_errors(body))


@pytest.mark.parametrize("kind", sorted(VALID))
def test_both_checks_accept_the_valid_bodies(kind: str) -> None:
    for body in VALID[kind]:
        assert _verdicts(kind, body) == (True, True), body


@pytest.mark.parametrize("kind", sorted(VALID))
@pytest.mark.parametrize("value", TRICKY, ids=repr)
def test_both_checks_agree_on_values_read_differently_elsewhere(kind: str, value: Any) -> None:
    for body in VALID[kind]:
        for path in json_paths(body):
            changed = copy.deepcopy(body)
            target = changed
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            fast, reference = _verdicts(kind, changed)
            assert fast == reference, (changed, fast, reference)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), replacement=json_values)
def test_both_checks_agree_when_a_field_is_replaced_dropped_or_added(
    data: st.DataObject, replacement: Any
) -> None:
    kind = data.draw(st.sampled_from(sorted(VALID)))
    body = copy.deepcopy(data.draw(st.sampled_from(VALID[kind])))
    path = data.draw(st.sampled_from(json_paths(body)))
    target = body
    for key in path[:-1]:
        target = target[key]
    action = data.draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "replace":
        target[path[-1]] = replacement
    elif action == "drop":
        del target[path[-1]]
    elif isinstance(target, dict):
        target[data.draw(st.text(max_size=10))] = replacement
    else:
        target.append(replacement)
    fast, reference = _verdicts(kind, body)
    assert fast == reference, (body, fast, reference)


def test_the_compiled_check_leaves_the_body_as_it_was() -> None:
    body = copy.deepcopy(INLINE)
    assert SCHEMAS["job"].accepts_fast(body)
    assert body == INLINE  # no "schema"/"priority" defaults written in
