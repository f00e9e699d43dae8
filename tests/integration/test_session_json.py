"""A session's JSON parameters store what they stored before orjson dumped them: the same jsonb for
every value the worker, the relay and the edge write, including those orjson alone refuses."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from psycopg.adapt import PyFormat
from psycopg.types.json import Json, Jsonb

from services.common.db import SyncPool, jsonb_dumps


class Priority(enum.StrEnum):
    BATCH = "batch"


VALUES: list[Any] = [
    {"total": "1180.00", "supplier": {"name": "Çağrı Ltd. Şti.", "iban": None}, "lines": [{"n": 1}]},
    {"latency_s": 0.25, "attempt": 3, "ok": True, "text": 'a "quoted"\nline\t\u00e7 \U0001f9fe'},
    {"priority": Priority.BATCH, 7: "an int key becomes a string"},
    {"past_64_bits": 2**70, "negative": -(2**65)},  # orjson refuses these; the stdlib writes them
    [],
]


@pytest.mark.parametrize("value", VALUES)
def test_a_json_parameter_stores_the_value_the_stdlib_would_have_written(pool: SyncPool, value: Any) -> None:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT %s::jsonb AS via_session, %s::jsonb AS via_json, (%s::text)::jsonb AS stdlib",
            (Jsonb(value), Json(value), Jsonb(value, dumps=json.dumps)),
        ).fetchone()
    assert row is not None
    assert row["via_session"] == row["via_json"] == row["stdlib"]


def test_the_project_s_sessions_dump_json_with_orjson_and_fall_back_to_the_stdlib(pool: SyncPool) -> None:
    with pool.connection() as conn:
        dumper = conn.adapters.get_dumper(Jsonb, PyFormat.BINARY)
    assert dumper._dumps is jsonb_dumps  # type: ignore[attr-defined]
    assert jsonb_dumps({"a": "ç"}) == '{"a":"ç"}'.encode()  # orjson's bytes
    assert jsonb_dumps({"a": 2**70}) == json.dumps({"a": 2**70})  # the stdlib's text
