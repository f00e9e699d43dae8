"""The compiled schema check (fastjsonschema) and the reference validator (jsonschema) agree: on
every sample extraction, and on those extractions with any one field replaced by arbitrary JSON."""

from __future__ import annotations

import copy
import json
from typing import Any

import fastjsonschema
from hypothesis import given, settings
from hypothesis import strategies as st
from json_paths import json_paths

from services.inference.validation._parse import (
    SCHEMA_PATH,
    counted_required,
    fast_validator,
    inline_refs,
    schema_validator,
)
from services.sandbox.provider.extract import extract
from services.sandbox.samples import load_samples

EXTRACTIONS = [extract(sample.text) for sample in load_samples()]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.sampled_from(["2026-02-30", "1.5", "TRY"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


def _agree(document: Any) -> bool:
    try:
        fast_validator()(document)
        fast = True
    except fastjsonschema.JsonSchemaException:
        fast = False
    return fast == schema_validator().is_valid(document)


def test_both_checks_accept_every_sample_extraction() -> None:
    for document in EXTRACTIONS:
        assert schema_validator().is_valid(document)
        assert _agree(document)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), replacement=json_values)
def test_both_checks_agree_when_any_one_field_is_replaced(data: st.DataObject, replacement: Any) -> None:
    document = copy.deepcopy(data.draw(st.sampled_from(EXTRACTIONS)))
    path = data.draw(st.sampled_from(json_paths(document)))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = replacement
    assert _agree(document)


def test_the_compiled_check_reads_the_schema_with_its_definitions_written_in_place() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    inlined = inline_refs(schema)
    assert '"$ref"' in json.dumps(schema) and '"$ref"' not in json.dumps({**inlined, "$defs": None})
    assert inlined["properties"]["total"] == schema["$defs"]["decimal"]
    # A $ref beside other keywords means both; it is left as it is, and so is what it refers to
    both = {"$defs": {"d": {"type": "string"}}, "$ref": "#/$defs/d", "minLength": 2}
    assert inline_refs(both) == both


def test_the_compiled_check_counts_the_properties_of_an_object_that_allows_only_what_it_requires() -> None:
    counted = counted_required(inline_refs(json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))))
    span = counted["properties"]["evidence"]["additionalProperties"]
    assert "required" not in span and span["minProperties"] == 3
    # An object allowing more than it requires, or anything else, keeps its list; data stays data
    allows_more = {"properties": {"a": {}, "b": {}}, "required": ["a"], "additionalProperties": False}
    open_object = {"properties": {"a": {}}, "required": ["a"]}
    data = {"const": {"properties": {"a": {}}, "required": ["a"], "additionalProperties": False}}
    for schema in (allows_more, open_object, data):
        assert counted_required(schema) == schema
