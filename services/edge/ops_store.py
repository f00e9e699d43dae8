"""The operator's cross-tenant reads: a job with its whole attempt log, the inbox quarantine, webhook
endpoint health, and the limiter's pools. Each function reads and shapes; routes stay in ``ops.py``.

This is where the raw text lives that a tenant never reads (services/common/job_errors.py): a
provider's own error words and the worker that made each attempt.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.common.db import AsyncPool
from services.common.job_errors import tenant_error
from services.common.queries import load_queries
from services.limiter import LimiterClient, PoolStatus

Q = load_queries(Path(__file__).with_name("sql") / "ops.sql")
JSON = dict[str, Any]
MAX_ATTEMPTS_SHOWN = 500


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _ms_iso(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat() if ms is not None else None


async def job(pool: AsyncPool, job_id: uuid.UUID) -> JSON | None:
    """Any tenant's job: its state, what the tenant is told, the raw error and every attempt."""
    async with pool.connection() as conn:
        row = await (await conn.execute(Q["job"], {"job_id": job_id})).fetchone()
        if row is None:
            return None
        attempts = await (
            await conn.execute(Q["job_attempts"], {"job_id": job_id, "limit": MAX_ATTEMPTS_SHOWN})
        ).fetchall()
    body: JSON = {
        "job_id": str(row["id"]),
        "tenant_id": str(row["tenant_id"]),
        "state": row["state"],
        "state_version": row["state_version"],
        "attempt": row["attempt"],
        "fence": row["fence"],
        "priority": row["priority"],
        "schema": row["schema_version"],
        "model_policy": row["model_policy"],
        "model": row["model"],
        "claimed_by": row["claimed_by"],
        "lease_until": _iso(row["lease_until"]),
        "available_at": _iso(row["available_at"]),
        "deadline_at": _iso(row["deadline_at"]),
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "finished_at": _iso(row["finished_at"]),
        "usage": row["usage"],
        # Codes and fields only: a reason's message quotes the invoice, which is the tenant's data.
        "review_reasons": [
            {"code": r.get("code"), "field": r.get("field")}
            for r in (row["review_reasons"] or [])
            if isinstance(r, dict)
        ],
        "decided_by": row["decided_by"],
        "error": None,
        "attempts": [_attempt(a) for a in attempts],
    }
    if row["error_class"] is not None:
        body["error"] = {
            "class": row["error_class"],
            "message": row["error_message"],
            "tenant_sees": tenant_error(row["error_class"], row["error_message"], row["state"]),
        }
    return body


def _attempt(row: JSON) -> JSON:
    return {
        "attempt": row["attempt"],
        "fence": row["fence"],
        "channel": row["channel"],
        "model": row["model"],
        "status": row["outcome"],
        "http_status": row["http_status"],
        "error_class": row["error_class"],
        "error_message": row["error_message"],
        "retry_after_ms": row["retry_after_ms"],
        "input_tokens": row["input_tokens"],
        "output_tokens": row["output_tokens"],
        "latency_ms": row["latency_ms"],
        "time_to_first_token_ms": row["time_to_first_token_ms"],
        "inter_token_ms": row["inter_token_ms"],
        "started_at": _iso(row["started_at"]),
        "ended_at": _iso(row["ended_at"]),
        "worker_id": row["worker_id"],
    }


async def quarantine(pool: AsyncPool, *, inbox: str | None, since: datetime | None, limit: int) -> list[JSON]:
    params = {"inbox": inbox, "since": since, "limit": limit}
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q["quarantine"], params)).fetchall()
    return [
        {
            "id": row["id"],
            "inbox": row["inbox"],
            "event_id": str(row["event_id"]),
            "stored_digest": row["stored_digest"],
            "received_digest": row["received_digest"],
            "payload": row["payload"],
            "received_at": _iso(row["received_at"]),
        }
        for row in rows
    ]


def origin(url: str) -> str:
    """Scheme, host and port of an endpoint's URL. Its path and query may hold the tenant's own
    tokens, which an operator does not need to tell a failing host from a healthy one."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


async def endpoints(
    pool: AsyncPool, *, state: str | None, breaker: str | None, tenant_id: uuid.UUID | None, limit: int
) -> list[JSON]:
    params = {"state": state, "breaker": breaker, "tenant_id": tenant_id, "limit": limit}
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q["endpoints"], params)).fetchall()
    return [
        {
            "endpoint_id": str(row["id"]),
            "tenant_id": str(row["tenant_id"]),
            "origin": origin(row["url"]),
            "state": row["state"],
            "disabled_reason": row["disabled_reason"],
            "disabled_at": _iso(row["disabled_at"]),
            "verified": row["verified_at"] is not None,
            "breaker": "open" if row["breaker_open"] else "closed",
            "breaker_open_until": _iso(row["breaker_open_until"]) if row["breaker_open"] else None,
            "consecutive_failures": row["consecutive_failures"],
            "consecutive_auth_failures": row["consecutive_auth_failures"],
            "max_concurrency": row["max_concurrency"],
            "last_delivery": None
            if row["last_delivery_id"] is None
            else {
                "delivery_id": str(row["last_delivery_id"]),
                "outcome": row["last_outcome"],
                "http_status": row["last_http_status"],
                "error_class": row["last_error_class"],
                "at": _iso(row["last_attempt_at"]),
            },
        }
        for row in rows
    ]


def _pool_json(status: PoolStatus) -> JSON:
    def dimension(d: Any) -> JSON:
        return {"limit": d.limit, "used": d.used, "headroom": d.headroom}

    return {
        "pool": status.pool,
        "window_ms": status.window_ms,
        "requests": dimension(status.requests),
        "tokens": dimension(status.tokens),
        "in_flight": dimension(status.in_flight),
        "cooldown_until": _ms_iso(status.cooldown_until_ms),
        "cooling_down": status.cooldown_until_ms is not None,
        "observed_at": _ms_iso(status.observed_at_ms),
    }


async def limiter_pools(client: LimiterClient) -> list[JSON]:
    """Every configured pool's limits, use, headroom and cooldown, as the limiter sees them now.
    The client blocks (it serves worker threads), so the call runs in a thread."""
    statuses = await asyncio.to_thread(client.pool_statuses)
    return [_pool_json(s) for s in statuses]
