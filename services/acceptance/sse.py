"""Server-sent events: ``GET /v1/events`` (every job of the tenant) and
``GET /v1/extraction-jobs/{id}/events`` (one job), read from the process's event feed (``feed.py``).

Each job event is a frame whose ``id:`` is its seq and whose data is the JSON the feed encoded once
for every stream. A client that reconnects with ``Last-Event-ID`` gets what it missed, within the
retention. A comment goes out after every ``FATURA_EVENT_HEARTBEAT_SECONDS`` without an event, so
proxies keep the connection and a vanished client is noticed. The key is looked up again while the
stream is open (``KeyWatch``): a revoked key's stream gets an ``end`` event saying so and closes.
A client that disconnects releases its subscription at once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from types import FrameType
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from services.acceptance.feed import End, EventFeed, FeedItem, JobEvent, Snapshot, Subscription
from services.acceptance.settings import EventSettings
from services.common.api.context import ApiContext, only_query
from services.common.api.errors import ApiError, NotFound
from services.common.api.keywatch import KeyWatch
from services.common.ids import parse_uuid

MEDIA_TYPE = "text/event-stream"
# How long an EventSource waits before reconnecting (ms), sent once at the start.
RETRY_MS = 2000
_HEARTBEAT = b": heartbeat\n\n"
_MAX_SEQ_DIGITS = 18  # below 2**63


def frame(item: FeedItem) -> bytes:
    """One SSE frame. Job events have no ``event:`` line (EventSource's ``message``); snapshots and
    the end name theirs."""
    if isinstance(item, JobEvent):
        return item.sse
    if isinstance(item, Snapshot):
        return b"id: %d\nevent: snapshot\ndata: %s\n\n" % (item.seq, _json(item.body()))
    return b"event: end\ndata: %s\n\n" % _json(item.body())


def _json(body: object) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def last_event_id(request: Request) -> int | None:
    """The ``Last-Event-ID`` header as a seq; absent or empty is no cursor."""
    raw = request.headers.get("last-event-id")
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > _MAX_SEQ_DIGITS:
        raise ApiError(
            "Last-Event-ID must be the id of an event this server sent (a non-negative integer)",
            code="invalid_last_event_id",
        )
    return int(value)


class EventStream(Response):
    """The streaming response of one subscription, until the client leaves or the stream ends."""

    media_type = MEDIA_TYPE

    def __init__(self, subscription: Subscription, keys: KeyWatch, key_prefix: str, heartbeat: float) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._subscription = subscription
        self._keys = keys
        self._key_prefix = key_prefix
        self._heartbeat = heartbeat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subscription = self._subscription
        unwatch = self._keys.watch(
            self._key_prefix,
            lambda: subscription.end(
                "key_revoked",
                "The API key of this stream has been revoked; the stream is closed. Use a valid key.",
            ),
        )
        finished = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with anyio.create_task_group() as tasks:

                async def until_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()

                tasks.start_soon(until_disconnect)
                await self._pump(send)
                finished = True
                tasks.cancel_scope.cancel()
            if finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            unwatch()
            subscription.close()

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.body", "body": b"retry: %d\n\n" % RETRY_MS, "more_body": True})
        async for batch in self._subscription.batches(self._heartbeat):
            body = b"".join(frame(item) for item in batch) if batch else _HEARTBEAT
            await send({"type": "http.response.body", "body": body, "more_body": True})
            if batch and isinstance(batch[-1], End):
                return


def end_streams_on_exit(feed: EventFeed) -> None:
    """When the server is told to stop (SIGTERM, SIGINT), end every open stream at once with an
    ``end`` event: uvicorn would otherwise wait out its graceful shutdown for responses that never
    finish, then cancel them. Call it from the application's start-up, in the main thread; the
    server's own handler is kept and still runs after this one."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(feed.end_streams)
            previous(signum, frame)

        signal.signal(sig, handler)


def event_routes(
    ctx: ApiContext, feed: EventFeed, keys: KeyWatch, settings: EventSettings
) -> list[BaseRoute]:
    async def tenant_events(request: Request) -> Response:
        key = await ctx.tenant_key(request)
        assert key.tenant is not None
        only_query(request)
        subscription = await feed.subscribe(key.tenant.id, last_seq=last_event_id(request))
        return EventStream(subscription, keys, key.prefix, settings.heartbeat_seconds)

    async def job_events(request: Request) -> Response:
        key = await ctx.tenant_key(request)
        assert key.tenant is not None
        only_query(request)
        job_id = parse_uuid(request.path_params["job_id"])
        if job_id is None:
            raise NotFound("no such extraction job for this tenant", code="job_not_found")
        last = last_event_id(request)
        subscription = await feed.subscribe(key.tenant.id, job_id=job_id, last_seq=last)
        return EventStream(subscription, keys, key.prefix, settings.heartbeat_seconds)

    return [
        Route("/v1/events", tenant_events, methods=["GET"], name="tenant_events"),
        Route("/v1/extraction-jobs/{job_id}/events", job_events, methods=["GET"], name="job_events"),
    ]
