"""The delivery worker's database side: ingest an event, claim a delivery, record an attempt.

Each function is one short transaction; none is open while a webhook is being sent.
"""

from __future__ import annotations

import base64
import logging
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from services.common import inbox
from services.common.keyring import Keyring, KeyringError, Sealed
from services.common.messages import BadMessage, EventMessage
from services.common.queries import load_queries
from services.delivery import metrics, outcomes, payload, signing
from services.delivery.outcomes import AttemptResult, Decision
from services.delivery.settings import DeliverySettings

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "delivery.sql")

# A delivery whose secret does not open waits this long: the key may be added and the worker
# restarted meanwhile, and no attempt is spent on it.
UNREADABLE_SECRET_WAIT_SECONDS = 60.0


class Wake(NamedTuple):
    """A delivery to wake, with its endpoint: one wake-up may carry several of one endpoint's."""

    delivery_id: uuid.UUID
    endpoint_id: uuid.UUID


def ingest(pool: ConnectionPool[Any], event: EventMessage) -> list[Wake]:
    """Take the event in (the inbox protocol) and create one delivery per matching endpoint in the
    same transaction; returns those to wake.

    A replay of an event already taken in returns nothing (its deliveries exist and the scheduler
    wakes any that were not woken). The same id with a different payload is quarantined (committed)
    and then refused as poison, so it is also a dead letter an operator sees.
    """
    with pool.connection() as conn, conn.transaction():
        taken = take_in(conn, event)
    return to_wake(event, taken)


def take_in(conn: Connection[DictRow], event: EventMessage) -> tuple[inbox.Received, list[Wake]]:
    """``ingest``'s write, inside the caller's open transaction (the worker's group commit shares
    one among several events): the inbox, and the deliveries of a new event."""
    received = inbox.take(conn, inbox.DELIVERY, event)
    if received is inbox.Received.NEW:
        return received, _create_deliveries(conn, event)
    return received, []


def to_wake(event: EventMessage, taken: tuple[inbox.Received, list[Wake]]) -> list[Wake]:
    """The deliveries to wake once ``take_in``'s transaction committed; a quarantined event (its
    quarantine committed) is refused as poison."""
    received, woken = taken
    if received is inbox.Received.QUARANTINED:
        raise inbox.conflict(event)
    return woken


def _create_deliveries(conn: Connection[DictRow], event: EventMessage) -> list[Wake]:
    """The deliveries of a newly taken-in event, one per matching endpoint, inside its transaction."""
    if event.job_id is None:
        body = _batch_body(conn, event)
    else:
        body = _job_body(conn, event, event.job_id)
    return _insert_deliveries(conn, event, body)


def _batch_body(conn: Connection[DictRow], event: EventMessage) -> bytes:
    """A batch event's body, from the batch and its counts (final: it ends once)."""
    batch = conn.execute(Q["batch_for_event"], {"batch_id": event.batch_id}).fetchone()
    if batch is None:
        raise BadMessage("unknown_batch", f"batch {event.batch_id} does not exist")
    if batch["tenant_id"] != event.tenant_id:
        raise BadMessage("tenant_mismatch", f"batch {event.batch_id} belongs to another tenant")
    if batch["state"] != event.state:
        raise BadMessage("state_mismatch", f"batch {event.batch_id} is {batch['state']}, not {event.state}")
    return payload.batch_body(
        event_id=event.event_id,
        event_type=event.event_type,
        state=event.state,
        occurred_at=batch["completed_at"] or datetime.now(UTC),
        batch=batch,
    )


def _job_body(conn: Connection[DictRow], event: EventMessage, job_id: uuid.UUID) -> bytes:
    row = conn.execute(
        Q["job_for_event"], {"job_id": job_id, "state_version": event.state_version}
    ).fetchone()
    if row is None:
        raise BadMessage("unknown_job", f"job {job_id} does not exist")
    job: dict[str, Any] = row["job"]
    if job.get("tenant_id") != str(event.tenant_id):
        raise BadMessage("tenant_mismatch", f"job {job_id} belongs to another tenant")
    recorded = row["recorded_state"]
    if recorded is not None and recorded != event.state:
        raise BadMessage(
            "state_mismatch",
            f"job {job_id} was {recorded} at version {event.state_version}, not {event.state}",
        )
    if int(job.get("state_version") or 0) < event.state_version:
        raise BadMessage("from_the_future", f"job {job_id} has not reached version {event.state_version}")
    return payload.event_body(
        event_id=event.event_id,
        event_type=event.event_type,
        tenant_id=event.tenant_id,
        job_id=job_id,
        state=event.state,
        state_version=event.state_version,
        occurred_at=row["occurred_at"] or datetime.now(UTC),
        job=job,
        review_id=row["review_id"],
    )


def _insert_deliveries(conn: Connection[DictRow], event: EventMessage, body: bytes) -> list[Wake]:
    """One delivery of ``body`` per endpoint that takes the event's type; returns those to wake."""
    woken: list[Wake] = []
    endpoints = conn.execute(
        Q["matching_endpoints"], {"tenant_id": event.tenant_id, "event_type": event.event_type}
    ).fetchall()
    for endpoint in endpoints:
        enabled = endpoint["state"] == "enabled"
        created = conn.execute(
            Q["insert_delivery"],
            {
                "delivery_id": signing.delivery_id(event.event_id, endpoint["id"]),
                "event_id": event.event_id,
                "event_type": event.event_type,
                "endpoint_id": endpoint["id"],
                "tenant_id": event.tenant_id,
                "job_id": event.job_id,
                "body": body,
                "state": "pending" if enabled else "failed",
                "reason": None if enabled else "endpoint_disabled: created while the endpoint was disabled",
                "traceparent": event.traceparent,
            },
        ).fetchone()
        if created is not None and created["state"] == "pending":
            woken.append(Wake(created["delivery_id"], endpoint["id"]))
    metrics.DELIVERIES_CREATED.inc(len(endpoints))
    return woken


@dataclass(frozen=True)
class Claim:
    delivery_id: uuid.UUID
    endpoint_id: uuid.UUID
    url: str
    body: bytes
    secrets: tuple[str, ...]
    fence: int
    attempt: int  # the delivery's attempt number (for the log)
    round_attempt: int  # attempts since the last resend (for the retry schedule)
    started_at: datetime
    endpoint_dirty: bool  # the endpoint has failure counters, an open breaker or no verification
    # The trace of the job whose event this delivers (services/common/tracing.py); None untraced.
    traceparent: str | None = None


def claim(pool: ConnectionPool[Any], delivery_id: uuid.UUID, settings: DeliverySettings) -> Claim | None:
    """Take a due delivery under a new fence, or decide why not (wait, fail, skip)."""
    claims = claim_batch(pool, delivery_id, settings, limit=1)
    return claims[0] if claims else None


# A batch starts its POSTs within this many total timeouts of its claim; what it has not started by
# then is given back. The lease therefore stays the same for a batch of 4 or of 64.
BATCH_WINDOW_TIMEOUTS = 3


def batch_send_window(settings: DeliverySettings, size: int) -> float:
    """Seconds after the claim within which a batch of ``size`` may start a POST (0 for one)."""
    return min(size - 1, BATCH_WINDOW_TIMEOUTS) * settings.limits.total_timeout


def batch_lease_seconds(settings: DeliverySettings, size: int) -> float:
    """The lease of a batch of ``size``: its last POST starts within the send window and must still
    be recorded within the lease, so a dead sender's batch is due again after at most this long."""
    return settings.lease_seconds + batch_send_window(settings, size)


def claim_batch(
    pool: ConnectionPool[Any], delivery_id: uuid.UUID, settings: DeliverySettings, *, limit: int
) -> list[Claim]:
    """Take the woken delivery under a new fence, and up to ``limit - 1`` others due to its endpoint
    (sent after it by the same sender: the batch counts once toward the endpoint's concurrency cap),
    or decide why not (wait, fail, skip).

    The woken delivery comes first; an empty list means nothing is to be sent now.
    """
    with pool.connection() as conn, conn.transaction():
        if conn.execute(Q["lock_endpoint_of"], {"delivery_id": delivery_id}).fetchone() is None:
            return []
        row = conn.execute(Q["claim_context"], {"delivery_id": delivery_id}).fetchone()
        if row is None:
            return []
        open_for = None
        if row["breaker_open"]:
            open_for = max((row["breaker_open_until"] - datetime.now(UTC)).total_seconds(), 0.05)
        decision = outcomes.gate(
            delivery_state=row["state"],
            due=bool(row["due"]),
            endpoint_state=row["endpoint_state"],
            breaker_open_for=open_for,
            in_flight=int(row["in_flight"]),
            max_concurrency=int(row["max_concurrency"]),
            has_secret=bool(row["secrets"]),
            concurrency_wait=random.uniform(0.2, 0.6),
        )
        if decision.action == "skip":
            return []
        if decision.action == "wait":
            metrics.POSTPONED.labels("breaker" if open_for else "concurrency").inc()
            conn.execute(
                Q["postpone"],
                {
                    "delivery_id": delivery_id,
                    "delay_seconds": decision.wait_seconds,
                    "reason": decision.reason,
                },
            )
            return []
        if decision.action == "fail":
            conn.execute(Q["fail_unsendable"], {"delivery_id": delivery_id, "reason": decision.reason})
            metrics.OUTCOMES.labels("failed").inc()
            return []
        try:
            secrets = _open_secrets(settings.require_keyring("the delivery worker"), row)
        except KeyringError as exc:
            metrics.POSTPONED.labels("secret").inc()
            log.error("ALARM delivery %s cannot be signed: %s", delivery_id, exc)
            conn.execute(
                Q["postpone"],
                {
                    "delivery_id": delivery_id,
                    "delay_seconds": UNREADABLE_SECRET_WAIT_SECONDS,
                    "reason": f"secret_unreadable: {exc}",
                },
            )
            return []
        # The gate saw room for one more sender; a batch is one sender. A dirty endpoint (failing,
        # its breaker half-open, not yet verified) is probed one delivery at a time.
        size = 1 if row["endpoint_dirty"] else limit
        rows = conn.execute(
            Q["claim"],
            {
                "delivery_id": delivery_id,
                "endpoint_id": row["endpoint_id"],
                "more": size - 1,
                "lease_seconds": batch_lease_seconds(settings, size),
            },
        ).fetchall()
        claims = [
            Claim(
                delivery_id=c["delivery_id"],
                endpoint_id=row["endpoint_id"],
                url=row["url"],
                body=bytes(c["body"]),
                secrets=secrets,
                fence=int(c["fence"]),
                attempt=int(c["attempts"]),
                round_attempt=int(c["attempts"]) - int(c["attempts_base"]),
                started_at=c["started_at"],
                endpoint_dirty=bool(row["endpoint_dirty"]),
                traceparent=c["traceparent"],
            )
            for c in rows
        ]
        claims.sort(key=lambda c: c.delivery_id != delivery_id)
        return claims


def release_unsent(pool: ConnectionPool[Any], claims: list[Claim]) -> None:
    """Give back claims of a batch that were not sent: due again, no attempt spent."""
    if not claims:
        return
    with pool.connection() as conn:
        conn.execute(
            Q["release_unsent"],
            {"delivery_ids": [c.delivery_id for c in claims], "fences": [c.fence for c in claims]},
        )


def _open_secrets(keyring: Keyring, row: dict[str, Any]) -> tuple[str, ...]:
    """The endpoint's secrets in force, opened; every one of them or an error (a receiver may
    already check only the newest)."""
    endpoint_id: uuid.UUID = row["endpoint_id"]
    return tuple(
        keyring.open(
            endpoint_id,
            s["key_id"],
            Sealed(s["master_key_id"], base64.b64decode(s["nonce"]), base64.b64decode(s["ciphertext"])),
        )
        for s in row["secrets"]
    )


def record(
    pool: ConnectionPool[Any],
    claim: Claim,
    result: AttemptResult,
    decision: Decision,
    settings: DeliverySettings,
) -> bool:
    """Record the attempt and its outcome under the claim's fence; False when the claim was lost.

    The endpoint's health is updated first (lock order: endpoint, then delivery), also for a stale
    attempt: what the receiver answered is a true observation of the endpoint either way.
    """
    params = _record_params(claim, result, decision, settings)
    with pool.connection() as conn:
        if touches_endpoint(claim, decision):
            with conn.transaction():
                _endpoint_health(conn, claim, decision, settings)
                row = conn.execute(Q["record_attempt"], params).fetchone()
        else:
            # The common case, a delivery to a healthy endpoint: one atomic statement, one round trip.
            row = conn.execute(Q["record_attempt"], params).fetchone()
    return _recorded(claim, decision, row)


def record_many(
    pool: ConnectionPool[Any],
    attempts: list[tuple[Claim, AttemptResult, Decision]],
    settings: DeliverySettings,
) -> int:
    """Record attempts that leave their endpoint's health as it is (``touches_endpoint`` is False
    for each), every one under its own claim's fence, in one transaction and round trip; returns how
    many were recorded (the others had lost their claim)."""
    if not attempts:
        return 0
    for claim, _, decision in attempts:
        if touches_endpoint(claim, decision):
            raise ValueError(f"delivery {claim.delivery_id}: its attempt changes the endpoint's health")
    params = [_record_params(c, r, d, settings) for c, r, d in attempts]
    rows: list[DictRow | None] = []
    with pool.connection() as conn, conn.cursor() as cur:
        # Pipelined up to one Sync, so PostgreSQL runs them as one implicit transaction: all are
        # recorded or none (a retry after a blip cannot log an attempt twice).
        cur.executemany(Q["record_attempt"], params, returning=True)
        while True:
            rows.append(cur.fetchone())
            if not cur.nextset():
                break
    return sum(_recorded(c, d, row) for (c, _, d), row in zip(attempts, rows, strict=True))


def _recorded(claim: Claim, decision: Decision, row: DictRow | None) -> bool:
    if row is None or row["outcome"] == "stale":
        metrics.STALE.inc()
        log.warning(
            "delivery %s: fence %d lost its claim; outcome not recorded", claim.delivery_id, claim.fence
        )
        return False
    metrics.OUTCOMES.labels(decision.state).inc()
    return True


def _record_params(
    claim: Claim, result: AttemptResult, decision: Decision, settings: DeliverySettings
) -> dict[str, Any]:
    body = result.response_body
    if body is not None:
        # Decoding with replacement can grow invalid bytes; the stored text keeps the byte cap.
        cap = settings.limits.max_response_bytes
        body = body.encode("utf-8")[:cap].decode("utf-8", errors="ignore")
    return {
        "delivery_id": claim.delivery_id,
        "fence": claim.fence,
        "state": decision.state,
        "reason": decision.reason,
        "http_status": result.status,
        "delay_seconds": decision.delay_seconds or 0.0,
        "attempt": claim.attempt,
        "started_at": claim.started_at,
        "error_class": result.error_class,
        "response_body": body,
        "retry_after_ms": None
        if result.retry_after_seconds is None
        else int(result.retry_after_seconds * 1000),
        "latency_ms": result.latency_ms,
    }


def touches_endpoint(claim: Claim, decision: Decision) -> bool:
    """Whether recording this attempt changes its endpoint's health row."""
    return (
        (decision.healthy and claim.endpoint_dirty)
        or decision.breaker_failure
        or decision.auth_failure
        or decision.disable_endpoint is not None
    )


def _endpoint_health(conn: Any, claim: Claim, decision: Decision, settings: DeliverySettings) -> None:
    endpoint = {"endpoint_id": claim.endpoint_id}
    if decision.healthy and claim.endpoint_dirty:
        conn.execute(Q["endpoint_healthy"], endpoint)
    if decision.breaker_failure:
        row = conn.execute(
            Q["endpoint_failure"],
            {
                **endpoint,
                "threshold": settings.breaker_threshold,
                "cooldown_seconds": settings.breaker_cooldown_seconds,
            },
        ).fetchone()
        if row is not None and row["consecutive_failures"] == settings.breaker_threshold:
            metrics.BREAKER_OPENED.inc()
            log.warning(
                "endpoint %s: circuit breaker open after %d failures",
                claim.endpoint_id,
                settings.breaker_threshold,
            )
    if decision.auth_failure:
        row = conn.execute(
            Q["endpoint_auth_failure"],
            {
                **endpoint,
                "limit": settings.auth_failure_limit,
                "reason": f"repeated 401/403: {settings.auth_failure_limit} in a row",
            },
        ).fetchone()
        if row is not None and row["consecutive_auth_failures"] == settings.auth_failure_limit:
            metrics.AUTH_ALARMS.inc()
            log.error(
                "ALARM endpoint %s refused %d deliveries in a row with 401/403: its secret or access "
                "is misconfigured; the endpoint is disabled until the tenant enables it",
                claim.endpoint_id,
                settings.auth_failure_limit,
            )
    if decision.disable_endpoint is not None:
        if conn.execute(Q["endpoint_disable"], {**endpoint, "reason": decision.disable_endpoint}).fetchone():
            metrics.ENDPOINTS_DISABLED.labels("gone").inc()
            log.warning("endpoint %s disabled: %s", claim.endpoint_id, decision.disable_endpoint)
