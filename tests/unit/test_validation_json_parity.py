"""The answer's JSON reader (orjson, with the checks that send it to Python's reader) and Python's
reader, the reference: the same value, of the same types, or the same error, on every input."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.inference.validation import Verdict
from services.inference.validation._parse import load_json, parse_invoice, reference_load
from services.sandbox.provider.extract import extract
from services.sandbox.samples import load_samples

ANSWERS = [json.dumps(extract(sample.text), ensure_ascii=False) for sample in load_samples()]
ANSWERS += [json.dumps(extract(sample.text), indent=2) for sample in load_samples()]  # \u escapes

# Members that orjson and Python read differently, or that make one object name a key twice.
MEMBERS = [
    '"a": 1, "a": 2',
    '"a": "x:y", "a": "x"',
    '"a": "x", "a": "\\u003a"',
    '"k:": ":", "k:": 1',
    '"x": NaN',
    '"x": -Infinity',
    '"x": 1e400',
    '"x": -0.0',
    '"x": -0',
    '"x": 99999999999999999999',
    '"x": 18446744073709551615',
    '"x": 18446744073709551616',
    '"x": -9223372036854775808',
    '"x": -9223372036854775809',
    '"x": 5e-324',
    '"x": 2e-400',
    '"x": 1E2',
    '"x": "\\ud800"',
    '"x": "\\u0000"',
    '"x": "\x01"',
    '"x": "a\\/b:\\":"',
    '"x": {"y": 1, "y": 2}',
    '"x": [[[[[]]]]]',
    '"x": 01',
    '"x": .5',
    '"x": tru',
]


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            pairs.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif isinstance(x, float):
            if x != y or math.copysign(1, x) != math.copysign(1, y):
                return False
        elif x != y:
            return False
    return True


def _read(load: Any, text: str) -> tuple[str, Any]:
    try:
        return "value", load(text)
    except (ValueError, RecursionError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def assert_same_reading(text: str) -> None:
    fast, reference = _read(load_json, text), _read(reference_load, text)
    assert fast[0] == reference[0], text
    if fast[0] == "value":
        assert _same(fast[1], reference[1]), text
    else:
        assert fast[1] == reference[1], text


@pytest.mark.parametrize("member", MEMBERS)
def test_each_tricky_member_reads_the_same_at_the_start_of_every_answer(member: str) -> None:
    for answer in ANSWERS:
        assert_same_reading(answer.replace("{", "{" + member + ", ", 1))


def test_a_repeated_key_is_refused_even_where_orjson_would_read_it() -> None:
    # Given a clean answer with one top-level key written twice
    answer = ANSWERS[0].replace("{", '{"currency": "TRY:", ', 1)
    # Then it is broken JSON, as Python's reader says
    verdict = parse_invoice(answer, 1 << 20)
    assert isinstance(verdict, Verdict)
    assert verdict.error_class == "broken_json"
    assert verdict.error_message is not None and "'currency' appears twice" in verdict.error_message


@pytest.mark.parametrize("depth", [200, 254, 255, 256, 600, 1023, 1024, 1025, 5000])
def test_deep_nesting_reads_the_same(depth: int) -> None:
    assert_same_reading('{"lines": ' + "[" * depth + "]" * depth + "}")
    assert_same_reading('{"lines": ' + '{"a": ' * depth + "1" + "}" * depth + "}")


def test_clean_answers_read_the_same() -> None:
    for answer in ANSWERS:
        assert_same_reading(answer)
        assert_same_reading(" \n" + answer + "\n")
        assert_same_reading("\ufeff" + answer)


def test_mutated_answers_read_the_same() -> None:
    rng = random.Random(14)
    alphabet = '{}[]:,"\\0123456789.eE-+ntfu \x00\ud800'
    for answer in ANSWERS:
        for _ in range(150):
            i = rng.randrange(len(answer))
            assert_same_reading(answer[:i] + rng.choice(alphabet) + answer[i + 1 :])
            assert_same_reading(answer[:i])
            assert_same_reading(answer[:i] + answer[i + rng.randint(1, 5) :])


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(alphabet=st.sampled_from('ab:"\\\u00e7\u0130\x00\ud800'), max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ensure_ascii=st.booleans(), repeat=st.booleans())
def test_any_json_text_reads_the_same(value: Any, ensure_ascii: bool, repeat: bool) -> None:
    text = json.dumps({"v": value}, ensure_ascii=ensure_ascii)
    assert_same_reading(text)
    if repeat:
        assert_same_reading(text.replace("{", '{"v": 0, ', 1))
