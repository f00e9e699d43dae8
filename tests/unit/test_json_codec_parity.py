"""The edge's JSON with its encoders and decoder built once gives what the library calls it replaced
give, byte for byte and error for error: the request body parser (``json.loads`` with NaN and
Infinity refused), the response renderer (Starlette's ``JSONResponse.render``) and the idempotency
request hash (``json.dumps`` sorted, compact, ASCII). A difference would change a status, a body or
which requests count as the same."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from services.acceptance.idempotency import request_hash
from services.common.api.body import JsonBody, _reject_constant
from services.common.api.context import json_response

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**80)
    | st.floats()
    | st.text()
    | st.sampled_from(["\ud800", "\udc00x", "\x00", "\u2028", "é😀", "\ufeff", "\x7f", "\x1f"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
# Bytes a client might send: JSON as several encoders write it, then possibly cut or corrupted.
ENCODINGS = ["utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"]
TRICKY_BODIES = [
    b"",
    b"NaN",
    b'{"a": -Infinity}',
    b"1e400",
    b"123456789012345678901234567890",
    b'{"a":1,"a":2}',
    b'"\\ud800"',
    b'"\xed\xa0\x80"',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
    b"\x80",
    b"[" * 5000 + b"]" * 5000,
    b"1" * 5000,
    b'{"a":"\x01"}',
    b" {} ",
    b"{} x",
    b"01",
]


def _old_loads(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _new_loads(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", JsonBody(10**9).parse_json(raw)
    except Exception as exc:
        return "error", str(exc)


def _same_parse(raw: bytes) -> None:
    old, new = _old_loads(raw), _new_loads(raw)
    if old[0] == "error" or not raw:
        assert new[0] == "error", (raw, old, new)
        if raw:
            assert new[1] == f"the request body is not valid JSON: {old[1].split(': ', 1)[1]}", (
                raw,
                old,
                new,
            )
    else:
        assert new[0] == "ok" and repr(new[1]) == repr(old[1]), (raw, old, new)


@pytest.mark.parametrize("raw", TRICKY_BODIES, ids=lambda r: repr(r[:20]))
def test_the_body_parser_reads_tricky_bytes_as_json_loads_does(raw: bytes) -> None:
    _same_parse(raw)


@settings(max_examples=400, deadline=None)
@given(
    value=json_values, encoding=st.sampled_from(ENCODINGS), cut=st.integers(0, 3), junk=st.binary(max_size=3)
)
def test_the_body_parser_reads_any_body_as_json_loads_does(
    value: Any, encoding: str, cut: int, junk: bytes
) -> None:
    try:
        raw = json.dumps(value, ensure_ascii=False).encode(encoding, "surrogatepass")
    except ValueError:
        return
    _same_parse(raw)
    _same_parse(raw[: len(raw) - cut] + junk)


@settings(max_examples=400, deadline=None)
@given(value=json_values)
def test_responses_render_as_starlettes_json_response_does(value: Any) -> None:
    try:
        old: tuple[str, Any] = ("ok", JSONResponse(value).body)
    except Exception as exc:
        old = ("error", f"{type(exc).__name__}: {exc}")
    try:
        new: tuple[str, Any] = ("ok", json_response(value).body)
    except Exception as exc:
        new = ("error", f"{type(exc).__name__}: {exc}")
    assert new == old


@settings(max_examples=300, deadline=None)
@given(
    strings=st.lists(st.text(), min_size=5, max_size=5),
    options=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_the_request_hash_is_the_sorted_compact_ascii_dump(
    strings: list[str], options: dict[str, Any]
) -> None:
    document, version, schema, policy, policy_version = strings
    fields = {
        "document": document,
        "object_version": version,
        "schema": schema,
        "model_policy": policy,
        "policy_version": policy_version,
        "options": options,
    }
    try:
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except (ValueError, TypeError):
        return
    assert (
        request_hash(
            document_key=document,
            object_version=version,
            schema=schema,
            model_policy=policy,
            policy_version=policy_version,
            options=options,
        )
        == hashlib.sha256(canonical.encode("ascii")).hexdigest()
    )
