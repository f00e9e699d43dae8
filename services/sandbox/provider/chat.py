"""``POST /v1/chat/completions``: auth, the request, the limits, a fault if one is set, the answer.

Everything a request asks for is decided before the first await (extraction is cheap and pure), so
one event loop serves hundreds of slow or hanging requests at once. A request holds a concurrency
slot from admission until its last byte is sent or its client has gone.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from services.sandbox.provider import faults as fault_modes
from services.sandbox.provider import wire
from services.sandbox.provider.engine import EngineRunner
from services.sandbox.provider.extract import extract
from services.sandbox.provider.faults import Fault, FaultBoard
from services.sandbox.provider.limits import Limits, Stats
from services.sandbox.provider.settings import ProviderSettings

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
CONTENT_FAULTS = frozenset({"broken_json", "hallucinated_iban", "obey_injection"})
DISCONNECT_POLL_S = 0.25


@dataclass
class Simulator:
    """The state one provider process keeps: limits, counts, the active fault."""

    settings: ProviderSettings
    limits: Limits
    stats: Stats = field(default_factory=Stats)
    faults: FaultBoard = field(default_factory=FaultBoard)
    rng: random.Random = field(default_factory=random.Random)
    engine: EngineRunner | None = None  # the ``vllm`` mode's engine: answers wait for it

    @classmethod
    def from_settings(cls, settings: ProviderSettings) -> Simulator:
        limits = Limits(settings.rpm, settings.tpm, settings.concurrency, per_second=settings.per_second)
        sim = cls(settings, limits)
        if settings.mode == "vllm":
            sim.engine = EngineRunner(settings.engine, settings.models[0], sim.stats.registry)
        return sim

    def latency_s(self) -> float:
        mean = self.settings.latency_ms / 1000.0
        if mean <= 0 or self.settings.latency_distribution == "fixed":
            return mean
        if self.settings.latency_distribution == "exponential":
            return self.rng.expovariate(1.0 / mean)
        sigma = 0.5  # lognormal with this spread and the configured mean
        return self.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)

    def release(self) -> None:
        self.limits.release()
        self.stats.in_flight(self.limits.in_flight)


# Benchmarks send the same sample invoices over and over; reading one costs milliseconds of regex
# work on the only event loop. The answer is a pure function of the text, so it is kept (never
# mutated: the content faults copy it). Large documents are not kept, to bound the memory.
_CACHEABLE_CHARS = 64 * 1024


@functools.lru_cache(maxsize=256)
def _cached_extract(document: str) -> dict[str, Any]:
    return extract(document)


def honest_answer(document: str) -> dict[str, Any]:
    return _cached_extract(document) if len(document) <= _CACHEABLE_CHARS else extract(document)


def error(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def authorized(settings: ProviderSettings, request: Request) -> bool:
    if settings.api_key is None:
        return True
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), settings.api_key.encode())


def unauthorized(sim: Simulator) -> JSONResponse:
    sim.stats.count("unauthorized")
    message = "Incorrect API key provided. The simulator was started with FATURA_SANDBOX_PROVIDER_API_KEY."
    return error(401, wire.error_body(message, "invalid_request_error", "invalid_api_key"))


async def chat_completions(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not authorized(sim.settings, request):
        return unauthorized(sim)
    try:
        chat = wire.parse_request(await _json_body(request))
    except wire.RequestError as exc:
        sim.stats.count("bad_request" if exc.status == 400 else "too_large")
        return error(exc.status, exc.body())
    if chat.model not in sim.settings.models:
        sim.stats.count("model_not_found")
        message = f"The model `{chat.model}` does not exist or you do not have access to it."
        return error(404, wire.error_body(message, "invalid_request_error", "model_not_found", "model"))

    document = chat.document
    result = honest_answer(document)
    fault = sim.faults.draw()
    if fault is not None and fault.mode == "hallucinated_iban" and result["supplier"]["name"]:
        result = fault_modes.hallucinate_iban(result, document)
    elif fault is not None and fault.mode == "obey_injection":
        result = fault_modes.obey_injection(result, document)
    content = fault_modes.dumps(result)
    if fault is not None and fault.mode == "broken_json":
        content = fault_modes.broken_json(content)
    finish = "stop"
    if chat.max_tokens is not None and wire.estimate_tokens(content) > chat.max_tokens:
        content, finish = content[: chat.max_tokens * 4], "length"
    prompt_tokens, completion_tokens = chat.prompt_tokens, wire.estimate_tokens(content)

    if fault is not None and fault.mode in {"rate_limit_storm", "server_error"}:
        sim.stats.count(f"fault_{fault.mode}")
        return _transport_fault(fault)
    denial = sim.limits.admit(prompt_tokens + completion_tokens)
    if denial is not None:
        if fault is not None:
            sim.faults.give_back(fault)
        sim.stats.count(f"limited_{denial.limit}")
        body = wire.error_body(
            denial.message,
            "tokens" if denial.limit.startswith("tpm") else "requests",
            "rate_limit_exceeded",
        )
        return error(429, body, {"Retry-After": str(denial.retry_after_s)})
    if sim.engine is not None and not sim.engine.can_ever_fit(
        prompt_tokens, chat.max_tokens or completion_tokens
    ):
        sim.release()
        sim.stats.count("too_long")
        message = (
            f"This model's KV cache holds {sim.settings.engine.kv_tokens} tokens; the request needs"
            f" {prompt_tokens} prompt tokens and up to {chat.max_tokens or completion_tokens} output tokens."
        )
        return error(400, wire.error_body(message, "invalid_request_error", None))
    sim.stats.in_flight(sim.limits.in_flight)
    sim.stats.count("ok" if fault is None else f"fault_{fault.mode}")
    answer = _Answer(chat, content, finish, prompt_tokens, completion_tokens, fault)
    if sim.engine is not None and chat.stream and fault is None:
        # As vLLM streams: the headers at once, then each token's frame when its step makes it,
        # so a client sees the queueing and prefill as time to first token.
        sim.stats.usage(prompt_tokens, completion_tokens)
        progress = sim.engine.tokens(prompt_tokens, completion_tokens)
        return StreamingResponse(
            _released(sim, answer.paced(progress)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        if sim.engine is not None:
            await sim.engine.generate(prompt_tokens, completion_tokens)
            wait = answer.fault_delay("hang_before_headers")
        else:
            wait = answer.fault_delay("hang_before_headers") or sim.latency_s()
        if wait > 0 and not await _sleep_unless_gone(request, wait):
            sim.release()
            return Response(status_code=499)  # nobody is listening any more
        if fault is None or fault.mode in CONTENT_FAULTS | {"hang_before_headers"}:
            sim.stats.usage(prompt_tokens, completion_tokens)
        if answer.fault_delay("slow_stream"):
            return StreamingResponse(
                _released(sim, answer.stream() if chat.stream else answer.slow_body()),
                media_type="text/event-stream" if chat.stream else "application/json",
                headers={"Cache-Control": "no-cache"},
            )
        if chat.stream:
            # Nothing waits between the frames, so they go out in one write: a per-chunk
            # StreamingResponse cost a third of the throughput the pipeline benchmark needs.
            sim.release()
            return Response(b"".join(answer.frames()), media_type="text/event-stream")
        if fault is not None and fault.mode == "error_frame":
            sim.release()
            return JSONResponse(_error_frame())
        sim.release()
        return JSONResponse(wire.completion(chat.model, content, prompt_tokens, completion_tokens, finish))
    except BaseException:
        sim.release()
        raise


@dataclass(frozen=True)
class _Answer:
    chat: wire.ChatRequest
    content: str
    finish: str
    prompt_tokens: int
    completion_tokens: int
    fault: Fault | None

    def fault_delay(self, mode: str) -> float:
        return self.fault.delay_s if self.fault is not None and self.fault.mode == mode else 0.0

    def frames(self) -> list[bytes]:
        """The SSE frames of the streamed answer."""
        if self.fault is not None and self.fault.mode == "error_frame":
            return [_sse(_error_frame())]  # the 200 is already sent: the error can only be a frame
        cid, model = wire.completion_id(), self.chat.model
        frames = [_sse(wire.chunk(cid, model, {"role": "assistant", "content": ""}))]
        frames += [_sse(wire.chunk(cid, model, {"content": piece})) for piece in wire.pieces(self.content)]
        frames.append(_sse(wire.chunk(cid, model, {}, self.finish)))
        if self.chat.include_usage:
            frames.append(_sse(wire.usage_chunk(cid, model, self.prompt_tokens, self.completion_tokens)))
        return [*frames, b"data: [DONE]\n\n"]

    async def paced(self, progress: AsyncIterator[int]) -> AsyncIterator[bytes]:
        """One content frame per generated token, each sent when the engine made its token."""
        cid, model = wire.completion_id(), self.chat.model
        tokens = max(1, self.completion_tokens)
        deltas = wire.pieces(self.content, tokens)
        sent = 0
        async for generated in progress:
            due = len(deltas) * min(generated, tokens) // tokens
            if sent == 0 and due > 0:
                yield _sse(wire.chunk(cid, model, {"role": "assistant", "content": ""}))
            if due > sent:
                yield b"".join(_sse(wire.chunk(cid, model, {"content": d})) for d in deltas[sent:due])
                sent = due
        tail = [_sse(wire.chunk(cid, model, {"role": "assistant", "content": ""}))] if sent == 0 else []
        tail += [_sse(wire.chunk(cid, model, {"content": d})) for d in deltas[sent:]]
        tail.append(_sse(wire.chunk(cid, model, {}, self.finish)))
        if self.chat.include_usage:
            tail.append(_sse(wire.usage_chunk(cid, model, self.prompt_tokens, self.completion_tokens)))
        yield b"".join([*tail, b"data: [DONE]\n\n"])

    async def stream(self) -> AsyncIterator[bytes]:
        """The frames ``slow_stream``'s ``delay_s`` apart."""
        for index, frame in enumerate(self.frames()):
            if index:
                await asyncio.sleep(self.fault_delay("slow_stream"))
            yield frame

    async def slow_body(self) -> AsyncIterator[bytes]:
        """A non-streaming answer under ``slow_stream``: the headers at once, the body in slow pieces."""
        answer = wire.completion(
            self.chat.model, self.content, self.prompt_tokens, self.completion_tokens, self.finish
        )
        body = json.dumps(answer, ensure_ascii=False)
        for index, piece in enumerate(wire.pieces(body)):
            if index:
                await asyncio.sleep(self.fault_delay("slow_stream"))
            yield piece.encode()


async def _released(sim: Simulator, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for part in body:
            yield part
    finally:
        sim.release()


def _transport_fault(fault: Fault) -> JSONResponse:
    if fault.mode == "rate_limit_storm":
        body = wire.error_body("Rate limit reached (simulated storm).", "requests", "rate_limit_exceeded")
        return error(429, body, {"Retry-After": str(fault.retry_after)})
    message = fault.message or "The server had an error while processing your request (simulated)."
    return error(fault.status, wire.error_body(message, "server_error", None))


def _error_frame() -> dict[str, Any]:
    return wire.error_body(
        "The upstream model failed after the stream started (simulated).", "server_error", "upstream_error"
    )


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


async def _json_body(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise wire.RequestError(
            413, "The request body is too large.", type_="invalid_request_error", code=None
        )
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise wire.RequestError(
            413, "The request body is too large.", type_="invalid_request_error", code=None
        )
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise wire.bad_request(f"The request body is not valid JSON: {exc}") from None


async def _sleep_unless_gone(request: Request, seconds: float) -> bool:
    """Sleep ``seconds``; False as soon as the client has disconnected."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while (left := until - loop.time()) > 0:
        await asyncio.sleep(min(left, DISCONNECT_POLL_S))
        if await request.is_disconnected():
            return False
    return True
