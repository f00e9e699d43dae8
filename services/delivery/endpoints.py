"""Webhook endpoints and deliveries as a tenant manages them: register (secret shown once, a
verification ping), list, disable, enable, rotate the secret, recover, inspect and resend.

Used by the HTTP routes (``services/delivery/api.py``), ``fatura endpoints add`` and the demo
(``register_endpoint``). Every statement is scoped to the tenant. Nothing here calls the endpoint:
registration stores the verification ping as an ordinary pending delivery in the same transaction,
and the delivery service sends it (signed, retried, through the egress guard) like any other.

An endpoint is ``verified`` once it answers a signed request (the ping or any delivery) with a
2xx. Unverified endpoints do receive deliveries: a registration made while the receiver was
briefly down must not lose the events that follow; the egress guard, not the ping, is what keeps
a target safe to call.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.common.db import AsyncPool, async_pool
from services.common.ids import new_id
from services.common.queries import load_queries
from services.delivery import payload, signing
from services.delivery.egress import EgressGuard
from services.delivery.errors import Conflict, InvalidEndpoint, NotFound
from services.delivery.settings import DeliverySettings
from services.delivery.views import delivery_view
from services.delivery.views import iso as _iso

Q = load_queries(Path(__file__).with_name("sql") / "endpoints.sql")

MAX_ENDPOINTS_PER_TENANT = 20


def _endpoint_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "endpoint_id": str(row["id"]),
        "url": row["url"],
        "event_types": list(row["event_types"]),
        "state": row["state"],
        "disabled_reason": row["disabled_reason"],
        "verified": row["verified_at"] is not None,
        "verified_at": _iso(row["verified_at"]),
        "max_concurrency": row["max_concurrency"],
        "consecutive_failures": row["consecutive_failures"],
        "consecutive_auth_failures": row["consecutive_auth_failures"],
        "breaker_open_until": _iso(row["breaker_open_until"]),
        "created_at": _iso(row["created_at"]),
        "secrets": [
            {"key_id": s["key_id"], "created_at": s["created_at"], "not_after": s["not_after"]}
            for s in row["secrets"]
        ],
    }


class Endpoints:
    def __init__(self, pool: AsyncPool, settings: DeliverySettings, guard: EgressGuard | None = None) -> None:
        self.pool = pool
        self.settings = settings
        # Registration and rotation seal the new secret; without a key they cannot, so no process
        # that serves them starts without one.
        self.keyring = settings.require_keyring("webhook endpoint registration")
        self.guard = guard or EgressGuard(settings.egress_allow)

    async def register(
        self,
        tenant_id: uuid.UUID,
        url: str,
        event_types: Sequence[str] | None = None,
        max_concurrency: int | None = None,
        secret: str | None = None,
    ) -> dict[str, Any]:
        """Store the endpoint and its first secret, then ping it; the secret is returned only here."""
        types = list(event_types) if event_types else list(payload.EVENT_TYPES)
        unknown = sorted(set(types) - set(payload.SUBSCRIBABLE))
        if unknown:
            raise InvalidEndpoint(f"unknown event types {unknown}; known: {list(payload.SUBSCRIBABLE)}")
        # Resolving can block: off the event loop. Raises InvalidEndpoint or EgressRefused.
        await asyncio.to_thread(self.guard.vet, url)
        if secret is None:
            secret = signing.new_secret()
        else:
            try:
                signing.secret_key(secret)
            except signing.BadSecret as exc:
                raise InvalidEndpoint(str(exc)) from None
        endpoint_id = new_id()
        async with self.pool.connection() as conn, conn.transaction():
            count = await (await conn.execute(Q["count_endpoints"], {"tenant_id": tenant_id})).fetchone()
            if count is not None and count["n"] >= MAX_ENDPOINTS_PER_TENANT:
                raise Conflict(f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints")
            await conn.execute(
                Q["insert_endpoint"],
                {
                    "endpoint_id": endpoint_id,
                    "tenant_id": tenant_id,
                    "url": url,
                    "event_types": types,
                    "max_concurrency": max_concurrency or self.settings.default_max_concurrency,
                },
            )
            await conn.execute(Q["insert_secret"], self._sealed_row(endpoint_id, secret))
            ping_id = new_id()
            delivery_id = signing.delivery_id(ping_id, endpoint_id)
            await conn.execute(
                Q["insert_ping"],
                {
                    "delivery_id": delivery_id,
                    "event_id": ping_id,
                    "event_type": payload.PING,
                    "endpoint_id": endpoint_id,
                    "tenant_id": tenant_id,
                    "body": payload.ping_body(ping_id, endpoint_id, datetime.now(UTC)),
                },
            )
        view = (await self.list(tenant_id, endpoint_id))[0]
        verification = {
            "delivery_id": str(delivery_id),
            "state": "pending",
            "message": (
                "A signed webhook.ping.v1 is on its way to this URL; the endpoint becomes verified "
                "when it answers 2xx. Follow it with GET /v1/webhook-endpoints/{id}."
            ).replace("{id}", str(endpoint_id)),
        }
        return {**view, "secret": secret, "verification": verification}

    def _sealed_row(self, endpoint_id: uuid.UUID, secret: str) -> dict[str, Any]:
        key_id = signing.key_id(secret)
        sealed = self.keyring.seal(endpoint_id, key_id, secret)
        return {
            "endpoint_id": endpoint_id,
            "key_id": key_id,
            "master_key_id": sealed.master_key_id,
            "nonce": sealed.nonce,
            "ciphertext": sealed.ciphertext,
        }

    async def list(self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                Q["list_endpoints"], {"tenant_id": tenant_id, "endpoint_id": endpoint_id}
            )
            rows = await cur.fetchall()
        if endpoint_id is not None and not rows:
            raise NotFound(f"no webhook endpoint {endpoint_id} for this tenant")
        return [_endpoint_view(r) for r in rows]

    async def _locked(self, conn: Any, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None) -> dict[str, Any]:
        row = None
        if endpoint_id is not None:
            cur = await conn.execute(Q["lock_endpoint"], {"tenant_id": tenant_id, "endpoint_id": endpoint_id})
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"no webhook endpoint {endpoint_id} for this tenant")
        result: dict[str, Any] = row
        return result

    async def disable(self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None) -> dict[str, Any]:
        async with self.pool.connection() as conn, conn.transaction():
            await self._locked(conn, tenant_id, endpoint_id)
            await conn.execute(
                Q["disable_endpoint"], {"endpoint_id": endpoint_id, "reason": "disabled by the tenant"}
            )
        return (await self.list(tenant_id, endpoint_id))[0]

    async def enable(self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None) -> dict[str, Any]:
        async with self.pool.connection() as conn, conn.transaction():
            await self._locked(conn, tenant_id, endpoint_id)
            await conn.execute(Q["enable_endpoint"], {"endpoint_id": endpoint_id})
        return (await self.list(tenant_id, endpoint_id))[0]

    async def rotate_secret(
        self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None, overlap_seconds: int | None = None
    ) -> dict[str, Any]:
        """A new secret signs from now on; the old ones sign beside it until the overlap ends."""
        overlap = self.settings.secret_overlap_seconds if overlap_seconds is None else overlap_seconds
        secret = signing.new_secret()
        async with self.pool.connection() as conn, conn.transaction():
            endpoint = await self._locked(conn, tenant_id, endpoint_id)
            await conn.execute(Q["expire_secrets"], {"endpoint_id": endpoint_id, "overlap_seconds": overlap})
            await conn.execute(Q["insert_secret"], self._sealed_row(endpoint["id"], secret))
        previous = [s["not_after"] for s in (await self.list(tenant_id, endpoint_id))[0]["secrets"]]
        return {
            "endpoint_id": str(endpoint_id),
            "secret": secret,
            "key_id": signing.key_id(secret),
            "previous_not_after": next((p for p in previous if p is not None), None),
        }

    async def recover(
        self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID | None, since: datetime
    ) -> dict[str, Any]:
        """Send again every failed or dead delivery of this endpoint created since ``since``."""
        async with self.pool.connection() as conn, conn.transaction():
            endpoint = await self._locked(conn, tenant_id, endpoint_id)
            if endpoint["state"] != "enabled":
                raise Conflict("the endpoint is disabled; enable it before recovering its deliveries")
            cur = await conn.execute(Q["recover_endpoint"], {"endpoint_id": endpoint_id, "since": since})
            resent = len(await cur.fetchall())
        return {"endpoint_id": str(endpoint_id), "resent": resent}

    async def deliveries(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q["deliveries_for_job"], {"tenant_id": tenant_id, "job_id": job_id})
            rows = await cur.fetchall()
        return {"deliveries": [delivery_view(r) for r in rows]}

    async def resend(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID | None) -> dict[str, Any]:
        """Send a finished delivery again with the same webhook-id (the receiver dedups it)."""
        async with self.pool.connection() as conn, conn.transaction():
            row = None
            if delivery_id is not None:
                cur = await conn.execute(
                    Q["lock_delivery"], {"tenant_id": tenant_id, "delivery_id": delivery_id}
                )
                row = await cur.fetchone()
            if row is None:
                raise NotFound(f"no delivery {delivery_id} for this tenant")
            if row["state"] in ("pending", "delivering"):
                raise Conflict(f"delivery {delivery_id} is {row['state']}: it is being sent already")
            if row["endpoint_state"] != "enabled":
                raise Conflict("the endpoint is disabled; enable it before resending")
            await conn.execute(Q["resend_delivery"], {"delivery_id": delivery_id})
            cur = await conn.execute(Q["delivery_by_id"], {"delivery_id": delivery_id})
            updated = await cur.fetchone()
        assert updated is not None
        return delivery_view(updated)


async def _register(
    settings: DeliverySettings,
    tenant_id: uuid.UUID,
    url: str,
    events: Sequence[str] | None,
    secret: str | None,
) -> dict[str, Any]:
    async with async_pool(settings.common, name="endpoints", max_size=1, autocommit=True) as pool:
        return await Endpoints(pool, settings).register(tenant_id, url, events, secret=secret)


def register_endpoint(
    tenant_id: uuid.UUID,
    url: str,
    event_types: Sequence[str] | None = None,
    settings: DeliverySettings | None = None,
    secret: str | None = None,
) -> dict[str, Any]:
    """Register a webhook endpoint for a tenant (blocking; for the CLI and the demo).

    Returns the endpoint as the API shows it, with its ``secret`` (shown only here) and the
    verification ping it queued. Give ``secret`` (``whsec_...``) to use one the receiver already
    knows, so the ping verifies when the delivery service sends it. Raises InvalidEndpoint or
    EgressRefused for a URL it may not use.
    """
    return asyncio.run(
        _register(settings or DeliverySettings.from_env(), tenant_id, url, event_types, secret)
    )
