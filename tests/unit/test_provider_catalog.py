"""Routing chains load from providers.toml or from FATURA_PROVIDER_BASE_URL, and a chain that could
swap the model, run past three channels or hide a key in the file is refused at start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.common.settings import SettingsError
from services.inference.providers.catalog import CatalogError, load_catalog, parse_catalog
from services.inference.providers.frames import Completion, Frame, parse_body, sse_lines
from services.inference.providers.gateway import Gateway
from services.inference.providers.settings import DEFAULT_CONFIG, GatewaySettings


def channel(serves: str = "m", cost: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"serves": serves, "base_url": "http://127.0.0.1:1/v1", "cost": cost, "pool": "p", **extra}


def test_the_local_file_routes_the_simulated_model_to_the_sandbox() -> None:
    catalog = load_catalog(GatewaySettings.from_env({}), env={})
    assert GatewaySettings().config_path == DEFAULT_CONFIG
    assert catalog.default_model == "fatura-sim-1"
    (sandbox,) = catalog.chain("fatura-sim-1") or ()
    assert (sandbox.name, sandbox.url, sandbox.pool) == (
        "sandbox",
        "http://127.0.0.1:8090/v1/chat/completions",
        "sandbox",
    )


def test_a_base_url_alone_points_the_gateway_at_any_openai_compatible_endpoint() -> None:
    env = {
        "FATURA_PROVIDER_BASE_URL": "https://api.example.com/v1/",
        "FATURA_PROVIDER_API_KEY": "sk-test",
        "FATURA_PROVIDER_MODEL": "gpt-x",
    }
    catalog = load_catalog(GatewaySettings.from_env(env), env=env)
    (only,) = catalog.chain("gpt-x") or ()
    assert catalog.default_model == "gpt-x"
    assert (only.url, only.upstream_model, only.api_key) == (
        "https://api.example.com/v1/chat/completions",
        "gpt-x",
        "sk-test",
    )
    assert "sk-test" not in repr(only)


def test_a_base_url_without_a_model_serves_the_simulated_model_from_the_sandbox_pool() -> None:
    env = {"FATURA_PROVIDER_BASE_URL": "http://127.0.0.1:9999/v1"}
    catalog = load_catalog(GatewaySettings.from_env(env), env=env)
    (only,) = catalog.chain("fatura-sim-1") or ()
    assert (only.base_url, only.pool, only.api_key) == ("http://127.0.0.1:9999/v1", "sandbox", None)


def test_the_api_key_comes_from_the_variable_the_file_names() -> None:
    raw = {"channels": {"a": channel(api_key_env="ACME_KEY")}, "models": {"m": {"chain": ["a"]}}}
    assert parse_catalog(raw, {"ACME_KEY": "secret"}).chains["m"][0].api_key == "secret"
    with pytest.raises(CatalogError, match="ACME_KEY"):
        parse_catalog(raw, {})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"channels": {c: channel() for c in "abcd"}, "models": {"m": {"chain": list("abcd")}}}, "1 to 3"),
        (
            {
                "channels": {"a": channel(), "b": channel(serves="cheaper")},
                "models": {"m": {"chain": ["a", "b"]}},
            },
            "serves",
        ),
        (
            {
                "channels": {"a": channel(cost=2), "b": channel(cost=1)},
                "models": {"m": {"chain": ["a", "b"]}},
            },
            "cheapest",
        ),
        ({"channels": {"a": channel(api_key="sk-1")}, "models": {"m": {"chain": ["a"]}}}, "unknown keys"),
        ({"channels": {"a": channel()}, "models": {"m": {"chain": ["zz"]}}}, "unknown channel"),
        ({"channels": {"a": channel(base_url="ftp://x")}, "models": {"m": {"chain": ["a"]}}}, "http"),
        ({"channels": {"a": channel()}, "models": {}}, "no model"),
    ],
)
def test_a_bad_chain_is_refused_at_load(raw: dict[str, Any], reason: str) -> None:
    with pytest.raises(CatalogError, match=reason):
        parse_catalog(raw, {})


def test_a_missing_file_fails_fast_with_the_variable_name(tmp_path: Path) -> None:
    settings = GatewaySettings.from_env({"FATURA_PROVIDER_CONFIG": str(tmp_path / "none.toml")})
    with pytest.raises(SettingsError, match="FATURA_PROVIDER_CONFIG"):
        load_catalog(settings, env={})


@pytest.mark.parametrize(
    "env",
    [
        {"FATURA_PROVIDER_BASE_URL": "api.example.com", "FATURA_PROVIDER_MODEL": "m"},
        {"FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS": "forever"},
        {"FATURA_PROVIDER_BREAKER_FAILURES": "0"},
        {"FATURA_PROVIDER_BREAKER_PREFIX": "a{b}"},
    ],
)
def test_bad_gateway_settings_fail_fast_naming_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match=next(iter(env))):
        GatewaySettings.from_env(env)


def test_stream_frames_tell_content_from_errors_and_from_frames_that_decide_nothing() -> None:
    c = Completion()
    assert c.feed('{"model": "m", "choices": [{"delta": {"role": "assistant"}}]}') is Frame.PENDING
    assert c.feed('{"choices": [{"delta": {"content": "{\\"a\\""}}]}') is Frame.CONTENT
    assert c.feed('{"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}') is Frame.PENDING
    assert c.feed("[DONE]") is Frame.DONE
    assert (c.content, c.model, c.input_tokens, c.output_tokens) == ('{"a"', "m", 11, 3)
    assert Completion().feed('{"error": {"message": "overloaded"}}') is Frame.ERROR
    assert Completion().feed('{"message": "x"}', event="error") is Frame.ERROR
    assert Completion().feed("{not json") is Frame.BAD


def test_sse_lines_make_events_and_comments_are_ignored() -> None:
    c = Completion()
    frames = [
        c.feed_line(line)
        for line in [": keep-alive", "", 'data: {"choices": [{"delta": {"content": "hi"}}]}', ""]
    ]
    assert frames == [None, None, None, Frame.CONTENT]
    assert c.content == "hi"


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"data: a\n\ndata: b\n\n"], ["data: a", "", "data: b", ""]),
        ([b"data: a\r\n\r\n"], ["data: a", ""]),
        ([b"data: a\r\rdata: b\r"], ["data: a", "", "data: b"]),
        ([b"data: a\r", b"\n\r", b"\n"], ["data: a", ""]),  # CRLF split across chunks
        ([b"da", b"ta: ", b"a\n"], ["data: a"]),
        ([b"data: \xc3", b"\xa7\n"], ["data: \u00e7"]),  # a UTF-8 character split across chunks
        ([b"data: a\n", b"", b"data: b"], ["data: a", "data: b"]),  # the last line has no terminator
        ([b"data: \xff\n"], ["data: \ufffd"]),
        ([b"\n\n"], ["", ""]),
        # SSE ends lines at CR and LF only: a JSON string may hold U+2028, U+2029 or NEL unescaped
        # (str.splitlines, and so httpx's iter_lines, broke such a frame in two)
        (["data: a\u2028b\u2029c\x85d\n".encode()], ["data: a\u2028b\u2029c\x85d"]),
        ([], []),
    ],
)
def test_sse_lines_split_bytes_on_every_terminator_wherever_the_chunks_break(
    chunks: list[bytes], lines: list[str]
) -> None:
    assert list(sse_lines(chunks)) == lines


def test_a_stream_read_byte_by_byte_gives_the_same_completion_as_in_one_chunk() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        b'data: {"model": "m", "choices": [{"delta": {"content": "\xc3\xa7a"}}]}\r\n\r\n'
        b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    whole, bytewise = Completion(), Completion()
    frames = [whole.feed_line(line) for line in sse_lines([stream])]
    split = [bytewise.feed_line(line) for line in sse_lines(stream[i : i + 1] for i in range(len(stream)))]
    assert frames == split
    assert [f for f in frames if f is not None] == [Frame.CONTENT, Frame.CONTENT, Frame.DONE]
    assert (bytewise.content, bytewise.finish_reason, bytewise.done) == ("\u00e7a", "stop", True)


def test_a_frame_orjson_refuses_is_read_as_leniently_as_before() -> None:
    c = Completion()
    assert c.feed('{"choices": [{"delta": {"content": "\\ud800x"}}], "score": NaN}') is Frame.CONTENT
    assert c.content == "\ud800x"  # validation then refuses the unpaired surrogate as a model error
    assert c.feed('{"choices": [], "usage": {"prompt_tokens": 18446744073709551616}}') is Frame.PENDING
    assert c.input_tokens is None  # past 64 bits: not a token count


def test_a_plain_json_answer_is_read_as_one_completion() -> None:
    body = b'{"model": "m", "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}'
    assert parse_body(body).content == "ok"


def test_a_worker_builds_its_gateway_from_the_environment_alone() -> None:
    gateway = Gateway.from_settings(
        GatewaySettings.from_env({"FATURA_REDIS_URL": "redis://127.0.0.1:6379/14"})
    )
    try:
        assert gateway.catalog.default_model == "fatura-sim-1"
        assert [c.name for c in gateway.catalog.channels] == ["sandbox"]
    finally:
        gateway.close()


def test_breakers_live_in_the_deployments_namespace() -> None:
    assert GatewaySettings.from_env({}).breaker_prefix == "fatura:breaker"
    assert GatewaySettings.from_env({"FATURA_QUEUE_PREFIX": "run42"}).breaker_prefix == "run42:breaker"
