"""The reference ERP's acknowledgements: after the ledger commit, tell Fatura each result's business
outcome with the partner SDK's ``acknowledge`` (signed with the endpoint's secret).

A background task, never the webhook request: the owed acknowledgements are rows written in the
inbox transaction (``erp_acks``), sent oldest first, retried with backoff while Fatura cannot be
reached, answers 5xx/429, or has not yet recorded the delivery as delivered (409
``delivery_not_delivered``: the ERP can be quicker than the sender's bookkeeping). Any other refusal
ends the row as ``failed`` with the answer; a later resend of the delivery owes it again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fatura_sdk import AckUnreachable, acknowledge
from fatura_sdk.receiver import Receiver
from services.sandbox.erp import ledger

log = logging.getLogger("services.sandbox.erp.acks")

T = TypeVar("T")
Db = Callable[..., Awaitable[Any]]

MAX_ATTEMPTS = 8  # about a minute of retries (0.5 s doubling to 30 s)
BATCH = 20
IDLE_SECONDS = 5.0  # a look at the table even without a wake-up (a row due later, a missed wake)
TIMEOUT_SECONDS = 10.0


def retry_delay(attempts: int, rng: random.Random) -> float:
    """After ``attempts`` failed sends: from 0.5 s doubling to 30 s at most, jittered over its upper half."""
    ceiling = min(30.0, 0.5 * 2 ** max(attempts - 1, 0))
    return rng.uniform(ceiling / 2, ceiling)


class AckSender:
    """Sends what the ledger owes; ``wake`` after a commit that owes one."""

    def __init__(self, receiver: Receiver, db: Db, base_url: str, secrets: Callable[[], list[str]]) -> None:
        self._receiver = receiver
        self._db = db
        self._base_url = base_url
        self._secrets = secrets
        self._wake = asyncio.Event()
        self._rng = random.Random()
        self.sent = 0
        self.failed = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        log.info("acknowledging to %s", self._base_url)
        while True:
            self._wake.clear()
            due: list[dict[str, Any]] = []
            try:
                due = await self._db(self._read, ledger.due_acks, time.time(), BATCH)
                for row in due:
                    await self._send(row)
                next_at = await self._db(self._read, ledger.next_ack_at)
            except asyncio.CancelledError:
                raise
            except Exception:  # the sender keeps going: a bad pass is logged and retried
                log.exception("acknowledgement pass failed; trying again shortly")
                next_at = None
            if len(due) >= BATCH and next_at is not None:
                continue
            wait = IDLE_SECONDS if next_at is None else min(IDLE_SECONDS, max(0.0, next_at - time.time()))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            except TimeoutError:
                pass

    def _read(self, function: Callable[..., T], *args: Any) -> T:
        with self._receiver.connection() as conn:
            return function(conn, *args)

    async def _send(self, row: dict[str, Any]) -> None:
        webhook_id, attempts = row["webhook_id"], int(row["attempts"]) + 1
        secrets = self._secrets()
        loop = asyncio.get_running_loop()
        try:
            if not secrets:
                raise AckUnreachable("this ERP holds no webhook secret to sign with yet")
            answer = await loop.run_in_executor(
                None,
                lambda: acknowledge(
                    self._base_url,
                    webhook_id,
                    row["outcome"],
                    row["reason"],
                    secrets,
                    timeout=TIMEOUT_SECONDS,
                ),
            )
        except AckUnreachable as exc:
            await self._again(webhook_id, attempts, f"unreachable: {exc}")
            return
        if answer.ok:
            await self._db(self._read, ledger.ack_sent, webhook_id, time.time())
            self.sent += 1
            log.info("acknowledged %s %s (attempt %d)", webhook_id, row["outcome"], attempts)
        elif answer.retryable:
            await self._again(webhook_id, attempts, f"{answer.status} {answer.code or ''}".strip())
        else:
            error = f"{answer.status} {answer.code or ''}".strip()
            await self._db(self._read, ledger.ack_failed, webhook_id, error)
            self.failed += 1
            log.error("acknowledgement of %s refused (%s); not sent again", webhook_id, error)

    async def _again(self, webhook_id: str, attempts: int, error: str) -> None:
        if attempts >= MAX_ATTEMPTS:
            await self._db(self._read, ledger.ack_failed, webhook_id, f"gave up after {attempts}: {error}")
            self.failed += 1
            log.error("acknowledgement of %s gave up after %d attempts (%s)", webhook_id, attempts, error)
            return
        next_at = time.time() + retry_delay(attempts, self._rng)
        await self._db(self._read, ledger.ack_retry, webhook_id, next_at, error)
        log.warning(
            "acknowledgement of %s not taken (%s); attempt %d again later", webhook_id, error, attempts
        )
