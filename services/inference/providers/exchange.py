"""One hop: one streamed chat completion request to one channel, read through the stream gate.

No retries here and none in httpx (``retries=0``): retries live in the database's schedule, and
failover between channels is the gateway's. A hop ends in a ``HopOutcome``; it never raises for
anything the provider or the network does.

Timeouts: waiting for the response headers is bounded by the header timeout or what is left of the
attempt's deadline, whichever is less; once headers arrive, the watchdog ends the stream at the
deadline. The same bound is httpx's read timeout, so it also ends a stream that pauses longer than
it between two chunks (a connection error, retried by the schedule). The stream gate holds the
opening frames until one is decisive: content commits the hop to this channel, an error frame
before any content is a retryable ``STREAM_ERROR`` (the gateway fails over), and with nothing
decisive after ``stream_gate_s`` the hop is committed anyway, because a slow model is not a broken
one. After commitment an error ends the attempt without failover.
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import orjson

from services.inference.providers.base import ErrorClass, ProviderRequest
from services.inference.providers.cancel import Attachment
from services.inference.providers.catalog import Channel
from services.inference.providers.classify import exception_error_class, retry_after_ms, status_error_class
from services.inference.providers.frames import (
    BadCompletion,
    Completion,
    Frame,
    error_message,
    parse_body,
    sse_raw_lines,
)
from services.inference.providers.settings import GatewaySettings
from services.inference.providers.watchdog import Watchdog

_ERROR_BODY_MAX = 64 * 1024  # an error's body is read only for its message
# The request goes straight to the transport, not through an ``httpx.Client`` (whose cookies,
# redirects and auth a hop never uses: a third less CPU per request), so these are the headers the
# client would have added.
_HEADERS = {
    "accept": "text/event-stream",
    "content-type": "application/json",
    "accept-encoding": "gzip, deflate",
    "connection": "keep-alive",
    "user-agent": "fatura-inference/1",
}


@dataclass
class HopOutcome:
    """What one hop came to. Not frozen, though nothing changes it once made: it is made on every
    hop, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) costs three times
    as much."""

    error_class: ErrorClass | None  # None: answered
    sent: bool
    committed: bool = False  # past the stream gate: no failover from here
    http_status: int | None = None
    retry_after_ms: int | None = None
    content: str | None = None
    model: str | None = None  # the model the response says answered
    input_tokens: int | None = None
    output_tokens: int | None = None
    message: str | None = None
    # No response headers came back before the header timeout or the deadline: the channel was
    # silent for the whole wait, which counts against its breaker even when the deadline ended it.
    silent: bool = False
    # When the first content frame of a stream arrived (time.monotonic()): time to first token.
    first_token_at: float | None = None
    # Seconds between consecutive content frames of a stream: inter-token latency (a frame holds
    # one token at vLLM and OpenAI; a provider that sends several per frame shows longer gaps).
    token_gaps: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Target:
    url: httpx.URL
    before_id: tuple[tuple[bytes, bytes], ...]  # the headers ahead of x-request-id
    after_id: tuple[tuple[bytes, bytes], ...]  # and between it and Content-Length


@functools.lru_cache(maxsize=1024)
def _target(url: str, api_key: str | None) -> _Target:
    """A channel's URL, parsed once (httpx parses a str on every request, 8.6 µs here, and only copies
    a URL, 0.3 µs), and its request headers encoded once, in the order and case in which
    ``httpx.Request(content=...)`` would put them on the wire: Host first, then ours, Content-Length
    last. Handing httpx the finished list and the body as a stream spares it normalizing every header
    twice and looking each automatic one up (10 µs a request here)."""
    parsed = httpx.URL(url)
    host = ((b"Host", parsed.netloc),) if parsed.host else ()
    ours = tuple((name.encode("ascii"), value.encode("ascii")) for name, value in _HEADERS.items())
    auth = ((b"authorization", f"Bearer {api_key}".encode("ascii")),) if api_key else ()
    return _Target(parsed, host + ours, auth)


def request_body(channel: Channel, request: ProviderRequest) -> dict[str, object]:
    return {
        "model": channel.upstream_model,
        "messages": request.messages,
        "max_tokens": request.max_output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def exchange(
    transport: httpx.BaseTransport,
    channel: Channel,
    request: ProviderRequest,
    *,
    deadline: float,
    settings: GatewaySettings,
    watchdog: Watchdog,
) -> HopOutcome:
    """Send ``request`` to ``channel`` and read its answer, all before ``deadline`` (monotonic)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return HopOutcome(ErrorClass.DEADLINE, sent=False, message="no time left in the attempt")
    header_wait = min(settings.header_timeout_s, remaining)
    connect = min(settings.connect_timeout_s, remaining)
    target = _target(channel.url, channel.api_key)
    body = orjson.dumps(request_body(channel, request))  # httpx's json= is the stdlib's, 5x slower
    headers = [
        *target.before_id,
        (b"x-request-id", request.request_id.encode("ascii")),
        *target.after_id,
        (b"Content-Length", str(len(body)).encode("ascii")),
    ]
    # httpx's ``timeout`` request extension, as ``httpx.Timeout.as_dict()`` spells it.
    timeout = {"connect": connect, "read": header_wait, "write": remaining, "pool": connect}
    http_request = httpx.Request(
        "POST", target.url, headers=headers, stream=httpx.ByteStream(body), extensions={"timeout": timeout}
    )
    # While the hop runs, its sockets belong to the request's cancel scope; the scope lets go of
    # them before the response is closed and the connection goes back to the pool.
    with Attachment(request.cancel) as scope:
        try:
            response = transport.handle_request(http_request)
        except httpx.HTTPError as exc:
            if request.cancel is not None and request.cancel.cancelled:
                return HopOutcome(ErrorClass.CANCELLED, sent=True, message="the worker lost the job")
            error_class, sent = exception_error_class(exc, headers_received=False)
            silent = error_class is ErrorClass.HEADER_TIMEOUT
            if silent and header_wait < settings.header_timeout_s:
                error_class = ErrorClass.DEADLINE  # the attempt's budget ran out first
            message = f"{type(exc).__name__}: {exc}"[:300]
            return HopOutcome(error_class, sent=sent, message=message, silent=silent)
        alarm = watchdog.arm(deadline, response)
        try:
            return _read(response, deadline, settings)
        except Exception as exc:
            if request.cancel is not None and request.cancel.cancelled:
                return HopOutcome(
                    ErrorClass.CANCELLED,
                    sent=True,
                    http_status=response.status_code,
                    message="the worker lost the job",
                )
            if alarm.fired or time.monotonic() >= deadline:
                # The watchdog shut the socket; whatever the read raised (a TLS read may raise more
                # than httpx maps), the cause is the deadline.
                return HopOutcome(ErrorClass.DEADLINE, sent=True, http_status=response.status_code)
            if not isinstance(exc, httpx.HTTPError):
                raise
            error_class, _ = exception_error_class(exc, headers_received=True)
            message = f"{type(exc).__name__}: {exc}"[:300]
            return HopOutcome(error_class, sent=True, http_status=response.status_code, message=message)
        finally:
            alarm.cancel()
            scope.close()
            response.close()


def _read(response: httpx.Response, deadline: float, settings: GatewaySettings) -> HopOutcome:
    status = response.status_code
    error_class = status_error_class(status)
    if error_class is not None:
        body = _read_capped(response, _ERROR_BODY_MAX, truncate=True)
        return HopOutcome(
            error_class,
            sent=True,
            http_status=status,
            retry_after_ms=retry_after_ms(response.headers),
            message=error_message(body),
        )
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return _read_stream(response, deadline, settings)
    try:
        completion = parse_body(_read_capped(response, settings.max_response_bytes))
    except _TooLarge:
        return HopOutcome(
            ErrorClass.BAD_RESPONSE, sent=True, committed=True, http_status=status, message="too large"
        )
    except BadCompletion as exc:
        return HopOutcome(
            ErrorClass.BAD_RESPONSE, sent=True, committed=True, http_status=status, message=str(exc)
        )
    return _finish(completion, status, committed=completion.error_message is None)


def _read_stream(response: httpx.Response, deadline: float, settings: GatewaySettings) -> HopOutcome:
    token_times: list[float] = []
    outcome = _read_frames(response, deadline, settings, token_times)
    if not token_times or outcome.first_token_at is not None:
        return outcome
    return replace(outcome, first_token_at=token_times[0], token_gaps=_gaps(token_times))


def _gaps(token_times: list[float]) -> tuple[float, ...]:
    return tuple(map(operator.sub, token_times[1:], token_times[:-1]))  # each later minus earlier


def _read_frames(
    response: httpx.Response, deadline: float, settings: GatewaySettings, token_times: list[float]
) -> HopOutcome:
    status = response.status_code
    opened = time.monotonic()
    gate = settings.stream_gate_s
    committed = False
    completion = Completion()
    feed, parts, texts, monotonic = completion.feed_raw_line, completion.parts, 0, time.monotonic
    try:
        for lines in sse_raw_lines(_capped(_body(response), settings.max_response_bytes)):
            for line in lines:
                frame = feed(line)
                now = monotonic()
                if not committed and now - opened >= gate:
                    committed = True  # nothing decisive within the gate: a slow model is not a broken one
                if frame is None:
                    pass  # a line inside an event: most of them
                elif frame is Frame.CONTENT:
                    if len(parts) > texts or not token_times:
                        token_times.append(now)  # the first decisive frame, then each one that carries text
                        texts = len(parts)
                    committed = True
                elif frame is Frame.ERROR or frame is Frame.BAD:
                    outcome = _step(completion, frame, status, committed)
                    if outcome is not None:
                        return outcome
                if now >= deadline and not completion.done:
                    return HopOutcome(ErrorClass.DEADLINE, sent=True, committed=committed, http_status=status)
    except _TooLarge:
        return HopOutcome(
            ErrorClass.BAD_RESPONSE, sent=True, committed=True, http_status=status, message="too large"
        )
    frame = completion.finish()
    if frame is not None:
        outcome = _step(completion, frame, status, committed)
        if outcome is not None:
            return outcome
    if not completion.done and completion.finish_reason is None:
        message = "the stream ended before the completion did"
        return HopOutcome(
            ErrorClass.CONNECTION, sent=True, committed=committed, http_status=status, message=message
        )
    if not completion.saw_choice:
        message = "the stream held no completion"
        return HopOutcome(
            ErrorClass.BAD_RESPONSE, sent=True, committed=True, http_status=status, message=message
        )
    return _finish(completion, status, committed=True, token_times=token_times)


def _step(completion: Completion, frame: Frame, status: int, committed: bool) -> HopOutcome | None:
    if frame is Frame.ERROR:
        return HopOutcome(
            ErrorClass.STREAM_ERROR,
            sent=True,
            committed=committed,
            http_status=status,
            model=completion.model,
            message=completion.error_message,
        )
    if frame is Frame.BAD:
        return HopOutcome(
            ErrorClass.BAD_RESPONSE,
            sent=True,
            committed=True,
            http_status=status,
            message="a frame is not JSON",
        )
    return None


def _finish(
    completion: Completion, status: int, *, committed: bool, token_times: list[float] | None = None
) -> HopOutcome:
    if completion.error_message is not None:
        return HopOutcome(
            ErrorClass.STREAM_ERROR,
            sent=True,
            committed=committed,
            http_status=status,
            message=completion.error_message,
        )
    return HopOutcome(
        None,
        sent=True,
        committed=True,
        http_status=status,
        content=completion.content,
        model=completion.model,
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        first_token_at=token_times[0] if token_times else None,
        token_gaps=_gaps(token_times) if token_times else (),
    )


def _body(response: httpx.Response) -> Iterator[bytes]:
    """The body's chunks, decompressed. With no Content-Encoding, ``iter_bytes()`` yields exactly the
    chunks ``iter_raw()`` does, through an identity decoder and a re-chunker that change nothing."""
    if "content-encoding" in response.headers:
        return response.iter_bytes()
    return response.iter_raw()


class _TooLarge(Exception):
    pass


def _capped(chunks: Iterator[bytes], cap: int) -> Iterator[bytes]:
    """``chunks`` until more than ``cap`` bytes (decompressed) came, then ``_TooLarge``."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        yield chunk


def _read_capped(response: httpx.Response, cap: int, *, truncate: bool = False) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > cap:
            if truncate:
                chunks.append(chunk[: cap - (size - len(chunk))])
                break
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)
