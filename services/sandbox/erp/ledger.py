"""The reference ERP's effect and its ledger: per job, only a newer state_version is applied.

``apply`` runs inside the fatura_sdk inbox transaction, so a webhook is either recorded and applied
together, or neither. The ledger is what the tests and the chaos suite read to count effects.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from fatura_sdk import Event, InvalidEvent
from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "ledger.sql")
SCHEMA = Q["create_schema"]

JOB_EVENTS = frozenset({"extraction.completed.v1", "extraction.failed.v1", "extraction.rejected.v1"})


def result_digest(result: Any) -> str | None:
    if result is None:
        return None
    canonical = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def apply(conn: sqlite3.Connection, event: Event) -> None:
    """Apply a job event if it is newer than what the ledger holds; always keep a receipt."""
    now = time.time()
    if event.type not in JOB_EVENTS:
        # An event type this ERP does not know yet is acknowledged and kept, not refused: the
        # sender may add types, and refusing would only make it retry forever.
        _receipt(conn, event, None, None, "ignored", now)
        return
    data = event.data
    job_id, state, version = data.get("job_id"), data.get("state"), data.get("state_version")
    if not isinstance(job_id, str) or not job_id:
        raise InvalidEvent("data.job_id must be a non-empty string")
    if not isinstance(state, str) or not state:
        raise InvalidEvent("data.state must be a non-empty string")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidEvent("data.state_version must be a non-negative integer")
    tenant_id = data.get("tenant_id")
    changed = conn.execute(
        Q["apply_newer"],
        {
            "job_id": job_id,
            "tenant_id": tenant_id if isinstance(tenant_id, str) else None,
            "state": state,
            "state_version": version,
            "event_type": event.type,
            "result_digest": result_digest(data.get("result")),
            "webhook_id": event.webhook_id,
            "now": now,
        },
    ).rowcount
    _receipt(conn, event, job_id, version, "applied" if changed else "not_newer", now)


def _receipt(
    conn: sqlite3.Connection, event: Event, job_id: str | None, version: int | None, outcome: str, now: float
) -> None:
    conn.execute(
        Q["insert_receipt"],
        {
            "webhook_id": event.webhook_id,
            "job_id": job_id,
            "event_type": event.type,
            "state_version": version,
            "outcome": outcome,
            "now": now,
        },
    )


def read(conn: sqlite3.Connection, job_id: str | None = None) -> list[dict[str, Any]]:
    """One entry per job: what is applied, and every webhook-id that arrived for it."""
    receipts: dict[str, list[dict[str, Any]]] = {}
    for row in conn.execute(Q["ledger_receipts"], {"job_id": job_id}):
        receipts.setdefault(row["job_id"], []).append(
            {
                "webhook_id": row["webhook_id"],
                "state_version": row["state_version"],
                "outcome": row["outcome"],
                "duplicates": row["duplicates"],
            }
        )
    jobs = []
    for row in conn.execute(Q["ledger_jobs"], {"job_id": job_id}):
        received = receipts.get(row["job_id"], [])
        jobs.append(
            {
                "job_id": row["job_id"],
                "tenant_id": row["tenant_id"],
                "state": row["state"],
                "state_version": row["state_version"],
                "event_type": row["event_type"],
                "result_digest": row["result_digest"],
                "applied_webhook_id": row["applied_webhook_id"],
                # Applied state changes: one per newer version, never one per delivery.
                "effects": row["effects"],
                "webhook_ids": [r["webhook_id"] for r in received],
                "receipts": received,
                "counts": {
                    "received": len(received),
                    "applied": sum(r["outcome"] == "applied" for r in received),
                    "not_newer": sum(r["outcome"] == "not_newer" for r in received),
                    "duplicates": sum(r["duplicates"] for r in received),
                },
            }
        )
    return jobs


def posted_secrets(conn: sqlite3.Connection) -> list[str]:
    return [row["secret"] for row in conn.execute(Q["posted_secrets"])]


def replace_posted_secrets(conn: sqlite3.Connection, secrets: list[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(Q["clear_secrets"])
        now = time.time()
        for secret in secrets:
            conn.execute(Q["add_secret"], {"secret": secret, "now": now})
        conn.execute("COMMIT")
    except sqlite3.Error:
        conn.execute("ROLLBACK")
        raise
