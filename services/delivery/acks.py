"""The ERP's business acknowledgement of a delivery (DESIGN §5.13): ``posted`` or ``rejected``.

A 2xx to a webhook means received; the acknowledgement, signed with the endpoint's own secret in
the Standard Webhooks scheme, is the business outcome. It is recorded on the delivery, on the job
(``erp``) and in the job's events in one transaction, and a rejection opens a review task there
too. An acknowledgement is idempotent: the same outcome again changes nothing, another outcome
after one was recorded is a conflict. Deliveries received but not acknowledged within the window
are listed here; the delivery scheduler counts them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter
from psycopg.types.json import Jsonb

from fatura_sdk import webhooks
from services.common.db import AsyncPool
from services.common.ids import new_id
from services.common.keyring import Keyring, KeyringError, Sealed
from services.common.queries import load_queries
from services.delivery import payload
from services.delivery.errors import (
    BadQuery,
    Conflict,
    InvalidRequest,
    NotFound,
    SecretUnavailable,
    Unauthenticated,
)
from services.delivery.views import delivery_view, iso

Q = load_queries(Path(__file__).with_name("sql") / "acks.sql")
_DELIVERY_BY_ID = load_queries(Path(__file__).with_name("sql") / "endpoints.sql")["delivery_by_id"]

ACKNOWLEDGEABLE = payload.ACKNOWLEDGEABLE
OUTCOMES = ("posted", "rejected")
MAX_REASON_LENGTH = 1000
# A fresh signature: the acknowledgement's timestamp may be this far from the edge's clock.
TOLERANCE_SECONDS = webhooks.DEFAULT_TOLERANCE_S
NOT_DELIVERED = "delivery_not_delivered"  # the SDK's AckResponse.retryable knows this code

# Counted where the route runs (the edge); the delivery scheduler keeps the unacknowledged gauge.
ACKS = Counter("fatura_delivery_acks_total", "ERP acknowledgements recorded, by outcome", ["outcome"])


@dataclass(frozen=True)
class Ack:
    outcome: str
    reason: str | None
    ack_id: str  # the acknowledgement's own webhook-id, kept in the job event


def decide(recorded: str | None, outcome: str) -> str:
    """``record`` the first acknowledgement, ``same`` for a repeat, ``conflict`` for a change of mind."""
    if recorded is None:
        return "record"
    return "same" if recorded == outcome else "conflict"


def erp_view(
    delivery_id: uuid.UUID, received_at: datetime | None, ack: Ack, at: datetime, review_id: uuid.UUID | None
) -> dict[str, Any]:
    """The job's ``erp``: the latest acknowledgement of one of its deliveries."""
    view: dict[str, Any] = {
        "delivery_id": str(delivery_id),
        "received_at": iso(received_at),
        "outcome": ack.outcome,
        "reason": ack.reason,
        "at": iso(at),
    }
    if review_id is not None:
        view["review_id"] = str(review_id)
    return view


def rejection_reasons(reason: str, delivery_id: uuid.UUID) -> list[dict[str, Any]]:
    detail = {"delivery_id": str(delivery_id)}
    return [{"code": "erp_rejected", "field": None, "message": reason, "detail": detail}]


class Acks:
    def __init__(self, pool: AsyncPool, keyring: Keyring, window_seconds: float) -> None:
        self.pool = pool
        self.keyring = keyring
        self.window_seconds = window_seconds

    async def authenticate(
        self, delivery_id: uuid.UUID | None, headers: Mapping[str, str], raw_body: bytes
    ) -> str:
        """The acknowledgement's webhook-id once its signature verifies with a secret in force of
        the delivery's endpoint. Raises Unauthenticated, NotFound or SecretUnavailable."""
        lowered = {k.lower(): v for k, v in headers.items()}
        missing = [h for h in ("webhook-id", "webhook-timestamp", "webhook-signature") if not lowered.get(h)]
        if missing:
            raise Unauthenticated(
                f"an acknowledgement is signed with the endpoint's secret: {', '.join(missing)} missing",
                code="missing_header",
            )
        rows: list[dict[str, Any]] = []
        if delivery_id is not None:
            async with self.pool.connection() as conn:
                rows = await (await conn.execute(Q["ack_target"], {"delivery_id": delivery_id})).fetchall()
        if not rows:
            raise NotFound(f"no delivery {delivery_id}")
        secrets, unopened = self._open(rows)
        try:
            if not secrets:
                raise webhooks.BadSignatureError("the endpoint has no secret in force")
            return webhooks.verify_signature(secrets, lowered, raw_body, tolerance_s=TOLERANCE_SECONDS)
        except webhooks.WebhookVerificationError as exc:
            if unopened and isinstance(exc, webhooks.BadSignatureError):
                # The signature may be one of the secrets this process cannot open.
                raise SecretUnavailable(
                    "the endpoint's secrets cannot be read here now; nothing was changed, try again later"
                ) from None
            raise Unauthenticated(f"the acknowledgement does not verify: {exc}", code=exc.code) from None

    def _open(self, rows: list[dict[str, Any]]) -> tuple[list[str], int]:
        opened, unopened = [], 0
        for row in rows:
            if row["key_id"] is None:
                continue
            sealed = Sealed(row["master_key_id"], bytes(row["nonce"]), bytes(row["ciphertext"]))
            try:
                opened.append(self.keyring.open(row["endpoint_id"], row["key_id"], sealed))
            except KeyringError:
                unopened += 1
        return opened, unopened

    async def record(self, delivery_id: uuid.UUID, ack: Ack) -> dict[str, Any]:
        """Record the acknowledgement (or find it recorded already) and return the delivery's view."""
        if ack.outcome not in OUTCOMES:
            raise InvalidRequest(f"outcome must be one of {list(OUTCOMES)}")
        if ack.outcome == "rejected" and not (ack.reason or "").strip():
            raise InvalidRequest("a rejection needs a reason")
        recorded = False
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q["lock_delivery"], {"delivery_id": delivery_id})
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"no delivery {delivery_id}")
            if row["event_type"] not in ACKNOWLEDGEABLE or row["job_id"] is None:
                raise Conflict(
                    f"delivery {delivery_id} is a {row['event_type']}: only {', '.join(ACKNOWLEDGEABLE)} "
                    "deliveries carry a result to acknowledge",
                    code="not_acknowledgeable",
                )
            if row["state"] != "delivered":
                raise Conflict(
                    f"delivery {delivery_id} is {row['state']}, not delivered: it can be acknowledged "
                    "once the sender has recorded the receiver's 2xx (ask again shortly)",
                    code=NOT_DELIVERED,
                )
            verdict = decide(row["ack_outcome"], ack.outcome)
            if verdict == "conflict":
                raise Conflict(
                    f"delivery {delivery_id} was acknowledged {row['ack_outcome']} already; an "
                    "acknowledgement is not changed",
                    code="ack_conflict",
                )
            if verdict == "record":
                await self._record(conn, row, ack)
                recorded = True
            view = await self._view(conn, delivery_id)
        if recorded:
            ACKS.labels(ack.outcome).inc()
        return view

    async def _record(self, conn: Any, row: dict[str, Any], ack: Ack) -> None:
        delivery_id: uuid.UUID = row["delivery_id"]
        params = {"delivery_id": delivery_id, "outcome": ack.outcome, "reason": ack.reason}
        acked = await (await conn.execute(Q["record_ack"], params)).fetchone()
        assert acked is not None  # the row is locked by this transaction
        job_key = {"job_id": row["job_id"], "tenant_id": row["tenant_id"]}
        review_id = new_id() if ack.outcome == "rejected" else None
        erp = erp_view(delivery_id, row["delivered_at"], ack, acked["acked_at"], review_id)
        job = await (await conn.execute(Q["job_erp"], {**job_key, "erp": Jsonb(erp)})).fetchone()
        assert job is not None  # a delivery's job is the tenant's and is never deleted
        detail = {
            "delivery_id": str(delivery_id),
            "endpoint_id": str(row["endpoint_id"]),
            "outcome": ack.outcome,
            "reason": ack.reason,
            "ack_id": ack.ack_id,
        }
        at_version = {"state": job["state"], "state_version": job["state_version"]}
        await conn.execute(Q["insert_ack_event"], {**job_key, **at_version, "detail": Jsonb(detail)})
        if review_id is not None:
            assert ack.reason is not None
            await conn.execute(
                Q["open_erp_review"],
                {
                    **job_key,
                    "task_id": review_id,
                    "delivery_id": delivery_id,
                    "job_version": job["state_version"],
                    "reasons": Jsonb(rejection_reasons(ack.reason, delivery_id)),
                    "detail": Jsonb({k: detail[k] for k in ("delivery_id", "endpoint_id")}),
                },
            )

    async def _view(self, conn: Any, delivery_id: uuid.UUID) -> dict[str, Any]:
        cur = await conn.execute(_DELIVERY_BY_ID, {"delivery_id": delivery_id})
        row = await cur.fetchone()
        assert row is not None
        return delivery_view(row)

    async def unacknowledged(
        self, tenant_id: uuid.UUID, cursor: uuid.UUID | None, limit: int
    ) -> dict[str, Any]:
        """Received longer ago than the window and still not acknowledged, oldest first."""
        after_delivered_at = None
        if cursor is not None:
            async with self.pool.connection() as conn:
                cur = await conn.execute(
                    Q["cursor_position"], {"delivery_id": cursor, "tenant_id": tenant_id}
                )
                position = await cur.fetchone()
            if position is None:
                raise BadQuery("the cursor is not one this server issued", code="invalid_cursor")
            after_delivered_at = position["delivered_at"]
        params = {
            "tenant_id": tenant_id,
            "event_types": list(ACKNOWLEDGEABLE),
            "window_seconds": self.window_seconds,
            "after_delivered_at": after_delivered_at,
            "after_id": cursor,
            "limit": limit + 1,
        }
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(Q["unacknowledged"], params)).fetchall()
        page = rows[:limit]
        more = len(rows) > limit
        return {
            "deliveries": [delivery_view(r) for r in page],
            "next_cursor": str(page[-1]["delivery_id"]) if more and page else None,
            "window_seconds": self.window_seconds,
        }
