"""HTTP routes of the reference ERP: the webhook endpoint, its ledger, and the admin knobs tests turn.

aiohttp rather than Starlette because the ``down`` fault has to drop a connection without any
response, and ASGI cannot express that (uvicorn answers 500 when an app fails before responding);
aiohttp hands the handler its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from aiohttp import web

from fatura_sdk import InvalidSecretError, Receiver
from fatura_sdk.receiver import DEFAULT_MAX_BODY_BYTES
from fatura_sdk.webhooks import decode_secret
from services.common import faults as fault_points
from services.common import readiness
from services.sandbox.erp import ledger
from services.sandbox.erp.acks import AckSender
from services.sandbox.erp.faults import Fault, Faults, FaultSpecError, parse_fault
from services.sandbox.erp.settings import ERP_CRASH_AFTER_COMMIT, ErpSettings

log = logging.getLogger("services.sandbox.erp")

MAX_POSTED_SECRETS = 10
_CHUNK = b"x" * 65536
T = TypeVar("T")


class BadJson(ValueError):
    """An admin request body that is not JSON."""


class Erp:
    """What the routes share: the receiver (inbox + ledger database), the armed fault, counters."""

    def __init__(self, settings: ErpSettings) -> None:
        self.settings = settings
        apply = ledger.applier(acknowledge=settings.ack_url is not None)
        self.receiver = Receiver([], settings.db_path, apply, schema=ledger.SCHEMA)
        self.faults = Faults()
        self.faulted: Counter[str] = Counter()
        self.redirects_followed = 0
        with self.receiver.connection() as conn:
            posted = ledger.posted_secrets(conn)
        self.secrets = self.effective_secrets(posted)
        self.receiver.set_secrets(self.secrets)
        # Acknowledgements are signed with the secrets webhooks verify with (one signature each).
        self.acks: AckSender | None = None
        if settings.ack_url is not None:
            self.acks = AckSender(self.receiver, self.db, settings.ack_url, lambda: self.secrets)

    def effective_secrets(self, posted: list[str]) -> list[str]:
        # FATURA_ERP_SECRETS and the secrets last posted to /admin/secrets are all accepted.
        return list(dict.fromkeys([*self.settings.secrets, *posted]))

    async def db(self, function: Callable[..., T], *args: Any) -> T:
        # SQLite commits fsync; keep them off the event loop so admin and health stay responsive.
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    def counts(self) -> dict[str, Any]:
        counts: dict[str, Any] = dict(self.receiver.stats())
        counts["faulted"] = dict(self.faulted)
        counts["redirects_followed"] = self.redirects_followed
        return counts


ERP = web.AppKey("erp", Erp)


def build_app(settings: ErpSettings) -> web.Application:
    app = web.Application(client_max_size=DEFAULT_MAX_BODY_BYTES + 1)
    app[ERP] = Erp(settings)
    app.router.add_post("/webhooks", webhooks)
    app.router.add_route("*", "/redirected", redirected)
    app.router.add_get("/ledger", ledger_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/admin/stats", stats)
    app.router.add_post("/admin/faults", arm_fault)
    app.router.add_delete("/admin/faults", clear_fault)
    app.router.add_post("/admin/secrets", set_secrets)
    app.cleanup_ctx.append(_acknowledging)
    app.on_cleanup.append(_close)
    return app


async def _acknowledging(app: web.Application) -> AsyncIterator[None]:
    acks = app[ERP].acks
    task = None if acks is None else asyncio.create_task(acks.run(), name="erp-acks")
    yield
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _close(app: web.Application) -> None:
    app[ERP].receiver.close()


async def webhooks(request: web.Request) -> web.StreamResponse:
    erp = request.app[ERP]
    fault = erp.faults.take()
    if fault is not None:
        erp.faulted[fault.mode] += 1
        log.warning(
            "fault %s answers webhook %s (%s left)",
            fault.mode,
            request.headers.get("webhook-id", "?"),
            "until cleared" if fault.count is None else fault.count - 1,
        )
        return await _answer_fault(request, fault)
    body = await request.read()
    headers = {k.lower(): v for k, v in request.headers.items()}
    response = await erp.db(erp.receiver.handle, headers, body)
    if response.outcome == "accepted":
        # The chaos point the design names: the inbox has committed, the sender has no answer yet.
        fault_points.point(erp.settings.common.faults, ERP_CRASH_AFTER_COMMIT)
    if erp.acks is not None and response.outcome in ("accepted", "duplicate"):
        if response.outcome == "duplicate" and response.webhook_id is not None:
            await erp.db(_rearm, erp, response.webhook_id)
        erp.acks.wake()  # the acknowledgement goes after the commit, outside this request
    log.info("webhook %s -> %d %s", response.webhook_id or "?", response.status, response.outcome)
    return web.json_response(response.body, status=response.status)


def _rearm(erp: Erp, webhook_id: str) -> None:
    with erp.receiver.connection() as conn:
        ledger.rearm_ack(conn, webhook_id, time.time())


async def _answer_fault(request: web.Request, fault: Fault) -> web.StreamResponse:
    await request.read()
    body = {"error": {"code": f"fault_{fault.mode}", "message": "fault injected; nothing was stored"}}
    if fault.mode == "down":
        # Looks like a dead server: the request is read, then the socket closes with no response.
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=503)  # never reaches the sender: its socket is already closed
    if fault.mode == "error_500":
        return web.json_response(body, status=500)
    if fault.mode == "rate_limited":
        return web.json_response(body, status=429, headers={"Retry-After": str(fault.retry_after)})
    if fault.mode == "slow":
        await asyncio.sleep(fault.delay_s)
        return web.json_response(body, status=503)
    if fault.mode == "unauthorized":
        return web.json_response(body, status=401)
    if fault.mode == "gone":
        return web.json_response(body, status=410)
    if fault.mode == "redirect":
        return web.json_response(body, status=307, headers={"Location": fault.location})
    return await _huge(request, fault)


async def _huge(request: web.Request, fault: Fault) -> web.StreamResponse:
    """A body far larger than any sender should read; streamed, so the ERP never holds it."""
    response = web.StreamResponse(status=fault.status, headers={"Content-Type": "application/json"})
    response.content_length = fault.size_bytes
    await response.prepare(request)
    left = fault.size_bytes
    try:
        while left > 0:
            await response.write(_CHUNK[: min(left, len(_CHUNK))])
            left -= min(left, len(_CHUNK))
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        log.info("huge_response: the sender stopped reading after %d bytes", fault.size_bytes - left)
        raise
    return response


async def redirected(request: web.Request) -> web.Response:
    # A sender must never follow a webhook redirect (DESIGN §5.10); arriving here means it did.
    erp = request.app[ERP]
    erp.redirects_followed += 1
    log.error("a sender followed the redirect fault to %s", request.path)
    return web.json_response({"status": "redirect_followed", "stored": False})


async def ledger_view(request: web.Request) -> web.Response:
    erp = request.app[ERP]
    job_id = request.query.get("job_id") or None

    def read() -> list[dict[str, Any]]:
        with erp.receiver.connection() as conn:
            return ledger.read(conn, job_id)

    jobs = await erp.db(read)
    return web.json_response({"jobs": jobs, "counts": erp.counts()})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    erp = request.app[ERP]

    def check() -> None:
        with erp.receiver.connection() as conn:
            conn.execute("SELECT 1").fetchone()

    async def database() -> None:
        await erp.db(check)  # what it raises is the reason it is not ready

    status, text = await readiness.verdict_async(database)
    return web.Response(text=text, status=status)


async def stats(request: web.Request) -> web.Response:
    erp = request.app[ERP]
    return web.json_response(
        {
            "counts": erp.counts(),
            "fault": erp.faults.snapshot(),
            "secrets": erp.receiver.secret_count,
            "db": str(erp.settings.db_path),
            "pid": os.getpid(),
        }
    )


async def arm_fault(request: web.Request) -> web.Response:
    erp = request.app[ERP]
    try:
        fault = parse_fault(await _json(request))
    except (BadJson, FaultSpecError) as exc:
        return _bad_request("bad_fault", str(exc))
    erp.faults.arm(fault)
    log.warning("fault armed: %s", erp.faults.snapshot())
    return web.json_response({"fault": erp.faults.snapshot()})


async def clear_fault(request: web.Request) -> web.Response:
    request.app[ERP].faults.clear()
    log.info("faults cleared")
    return web.json_response({"fault": None})


async def set_secrets(request: web.Request) -> web.Response:
    erp = request.app[ERP]
    try:
        body = await _json(request)
    except BadJson as exc:
        return _bad_request("bad_json", str(exc))
    secrets = body.get("secrets") if isinstance(body, dict) else None
    if (
        not isinstance(secrets, list)
        or len(secrets) > MAX_POSTED_SECRETS
        or not all(isinstance(s, str) for s in secrets)
    ):
        return _bad_request("bad_secrets", f'expected {{"secrets": [up to {MAX_POSTED_SECRETS} strings]}}')
    try:
        for secret in secrets:
            decode_secret(secret)
    except InvalidSecretError as exc:
        return _bad_request("bad_secrets", str(exc))

    def store() -> None:
        with erp.receiver.connection() as conn:
            ledger.replace_posted_secrets(conn, secrets)
        erp.secrets = erp.effective_secrets(secrets)
        erp.receiver.set_secrets(erp.secrets)

    await erp.db(store)
    log.info("secrets replaced: %d posted, %d in force", len(secrets), erp.receiver.secret_count)
    return web.json_response({"secrets": erp.receiver.secret_count})


async def _json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (UnicodeDecodeError, ValueError):
        raise BadJson("the body is not JSON") from None


def _bad_request(code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=400)
