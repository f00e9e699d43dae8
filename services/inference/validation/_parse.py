"""From the model's raw answer to a schema-valid invoice dict, or the class of model error.

The three checks run in order and the first failure wins: size, JSON syntax, JSON Schema
``invoice.v1`` (Draft 2020-12, formats checked). Loading the schema file, once, is the only I/O of
the validation package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import fastjsonschema
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ._model import Verdict

SCHEMA_PATH = Path(__file__).with_name("invoice.v1.schema.json")
MAX_MESSAGE_CHARS = 300

# \u0000 and \uD800-\uDFFF, the escapes of a NUL and of a surrogate (a preceding escaped backslash
# makes a false alarm, which only costs the full walk).
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# Chat models often wrap JSON in one Markdown code fence despite being told not to; the fence
# carries nothing, so it is taken off rather than burning a retry on it.
_CODE_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*)\n```\s*\Z", re.DOTALL | re.IGNORECASE)


class _BrokenJson(ValueError):
    """JSON that parses in Python's lenient reader but is not one unambiguous JSON value."""


@cache
def fast_validator() -> Callable[[Any], Any]:
    """The same schema compiled to Python by fastjsonschema: about fifteen times faster on a valid
    answer (the common case). jsonschema stays the reference: it decides, and names the error,
    whenever the compiled check refuses a document.

    The schema's ``$ref``s are written out in place first: fastjsonschema compiles each ``$ref`` to
    a call that formats the path of the value it checks before it checks anything, which was half
    of the check's time on an answer with a span per field (97 -> 42 us on the samples). Then a
    closed object's ``required`` is written as its property count (``counted_required``)."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    compiled = counted_required(inline_refs(schema))
    check: Callable[[Any], Any] = fastjsonschema.compile(compiled, formats={"date": _is_date})
    return check


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``{"$ref": "#/$defs/<name>"}`` replaced by that definition; the same
    document validates the same way. Only a ``$ref`` alone in its object is replaced (beside other
    keywords it means both, which a copy would not say), so ``$defs`` stays for any other; the
    schema's definitions do not refer to themselves, so the copy ends."""
    definitions: dict[str, Any] = schema.get("$defs", {})

    def copy(node: Any) -> Any:
        if isinstance(node, list):
            return [copy(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if len(node) == 1 and isinstance(ref, str) and ref.startswith("#/$defs/"):
            return copy(definitions[ref.removeprefix("#/$defs/")])
        return {key: copy(value) for key, value in node.items()}

    inlined: dict[str, Any] = copy(schema)
    return inlined


def counted_required(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the ``required`` of every closed object written as ``minProperties``; the
    same document validates the same way.

    A closed object (``additionalProperties: false``, no ``patternProperties``) that requires every
    property it lists holds all of them exactly when it holds that many properties. fastjsonschema
    checks ``required`` with a set difference built per object and ``minProperties`` with len():
    -22% of the check on the samples, whose answers hold a closed span object per field. Values
    under ``const``, ``enum``, ``default`` and ``examples`` are data, not schemas, and stay."""

    def copy(node: Any) -> Any:
        if isinstance(node, list):
            return [copy(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: value if key in _DATA_KEYWORDS else copy(value) for key, value in node.items()}
        listed, required = out.get("properties"), out.get("required")
        if (
            out.get("additionalProperties") is False
            and isinstance(listed, dict)
            and isinstance(required, list)
            and set(required) == set(listed)
            and "patternProperties" not in out
            and "minProperties" not in out
        ):
            del out["required"]
            out["minProperties"] = len(listed)
        return out

    counted: dict[str, Any] = copy(schema)
    return counted


_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


@cache
def schema_validator() -> Draft202012Validator:
    """The ``invoice.v1`` validator, built once per process."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def parse_invoice(content: str, max_bytes: int) -> dict[str, Any] | Verdict:
    """The parsed, schema-valid invoice, or a ``model_error`` verdict saying what is wrong."""
    if len(content) > max_bytes:
        return Verdict.model_error("too_large", f"the answer is larger than {max_bytes} bytes")
    try:
        size, encodes = len(content.encode("utf-8")), True
    except UnicodeEncodeError:  # an unpaired surrogate
        size, encodes = len(content.encode("utf-8", "surrogatepass")), False
    if size > max_bytes:
        return Verdict.model_error("too_large", f"the answer is larger than {max_bytes} bytes")
    fenced = _CODE_FENCE.match(content)
    text = fenced.group(1) if fenced else content
    try:
        document = load_json(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and _BrokenJson are ValueErrors
        return Verdict.model_error("broken_json", _clip(f"the answer is not valid JSON: {exc}"))
    if not isinstance(document, dict):
        return Verdict.model_error(
            "broken_json", f"the answer is JSON but not an object (got {type(document).__name__})"
        )
    # JSON strings refuse raw control characters, so a NUL or an unpaired surrogate in the parsed
    # answer comes from an escape or from a raw surrogate in the text; without either, the walk
    # over every string would find nothing.
    if (not encodes or _UNSTORABLE_ESCAPE.search(text)) and not _storable(document):
        # PostgreSQL text and jsonb refuse both; storing such a result would fail after the fact.
        return Verdict.model_error("broken_json", "the answer holds a NUL character or an unpaired surrogate")
    try:
        fast_validator()(document)
    except fastjsonschema.JsonSchemaException:
        error = best_match(schema_validator().iter_errors(document))
    else:
        error = None
    if error is not None:
        return Verdict.model_error("schema_violation", _clip(f"{error.json_path}: {error.message}"))
    return document


def load_json(text: str) -> Any:
    """The JSON value of ``text``; raises ``ValueError`` (or ``RecursionError``) for text that is not
    one unambiguous JSON value: broken, NaN or Infinity, or an object naming a key twice.

    Python's reader is the reference (``reference_load``), and names what is wrong; orjson reads the
    common case, a clean answer, in a third of its time (measured on the samples' answers: 46 ->
    18 us). orjson keeps one of two equal keys without a word, so its value is taken only when the
    text holds as many colons as orjson's own rendering of it: outside strings a colon follows each
    key, and inside strings (with no ``\\u`` escape, which could spell one) each colon is one of the
    value's, so a key read twice leaves the text with at least one colon more. orjson also reads an
    integer past 64 bits as a float, which it renders with an exponent (``e+``, as every float from
    1e16 up): such a rendering takes the reference too. Anything else, including whatever orjson
    refuses, goes to the reference, which decides.
    """
    if "\\u" not in text:
        try:
            document = orjson.loads(text)
            rendered = orjson.dumps(document)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # the encoder nests less deep
            pass
        else:
            if text.count(":") == rendered.count(b":") and b"e+" not in rendered:
                return document
    return reference_load(text)


def reference_load(text: str) -> Any:
    """Python's reader, refusing a repeated key and NaN or Infinity."""
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated key means two answers for one field; Python would silently keep the last one.
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _BrokenJson(f"the key {key!r} appears twice in one object")
        seen.add(key)
    raise AssertionError("a shorter dict has a repeated key")  # pragma: no cover


def _storable(document: dict[str, Any]) -> bool:
    """No NUL and no unpaired surrogate in any key or string (walked without recursion)."""
    stack: list[Any] = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            if "\x00" in value:
                return False
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


def _no_constant(name: str) -> NoReturn:
    raise _BrokenJson(f"{name} is not JSON")


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"
