"""The reference ERP's effect and its ledger: per job, only a newer state_version is applied.

``apply`` runs inside the fatura_sdk inbox transaction, so a webhook is either recorded and applied
together, or neither. The ledger is what the tests and the chaos suite read to count effects.

When the ERP acknowledges (``FATURA_ERP_ACK_URL``), applying a result also decides its business
outcome, in the same transaction: ``posted``, or ``rejected`` when the tenant's books already hold
the same supplier's invoice number from another job. The acknowledgement owed is written beside
the effect (``erp_acks``) and sent after the commit (``services/sandbox/erp/acks.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from fatura_sdk import Apply, Event, InvalidEvent
from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "ledger.sql")
SCHEMA = Q["create_schema"]

COMPLETED = "extraction.completed.v1"
JOB_EVENTS = frozenset({COMPLETED, "extraction.failed.v1", "extraction.rejected.v1"})


def result_digest(result: Any) -> str | None:
    if result is None:
        return None
    canonical = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def applier(acknowledge: bool) -> Apply:
    """The inbox's effect; with ``acknowledge`` it also owes Fatura each result's business outcome."""
    return functools.partial(apply, acknowledge=acknowledge)


def apply(conn: sqlite3.Connection, event: Event, *, acknowledge: bool = False) -> None:
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
    if acknowledge and event.type == COMPLETED:
        outcome, reason = _post(conn, tenant_id if isinstance(tenant_id, str) else "", job_id, data, now)
        params = {"webhook_id": event.webhook_id, "job_id": job_id, "outcome": outcome, "reason": reason}
        conn.execute(Q["owe_ack"], {**params, "now": now})


def _post(
    conn: sqlite3.Connection, tenant_id: str, job_id: str, data: dict[str, Any], now: float
) -> tuple[str, str | None]:
    """Put the invoice on the tenant's books, or refuse a second job's copy of one already there."""
    result = data.get("result")
    supplier = result.get("supplier") if isinstance(result, dict) else None
    tax_id = supplier.get("tax_id") if isinstance(supplier, dict) else None
    number = result.get("invoice_number") if isinstance(result, dict) else None
    if not isinstance(tax_id, str) or not isinstance(number, str) or not tax_id.strip() or not number.strip():
        return "posted", None  # nothing to match a duplicate by
    key = {
        "tenant_id": tenant_id,
        "supplier_tax_id": normalize_tax_id(tax_id),
        "invoice_number": number.strip(),
    }
    owner = conn.execute(Q["invoice_owner"], key).fetchone()
    if owner is not None and owner["job_id"] != job_id:
        return (
            "rejected",
            f"duplicate invoice number {key['invoice_number']} for supplier {key['supplier_tax_id']}",
        )
    conn.execute(Q["post_invoice"], {**key, "job_id": job_id, "now": now})
    return "posted", None


def normalize_tax_id(tax_id: str) -> str:
    """Letters and digits, upper-case: "DE 123.456-789" and "de123456789" are one supplier."""
    return re.sub(r"[^0-9A-Za-z]", "", tax_id).upper()


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
    acks: dict[str, dict[str, Any]] = {}
    for row in conn.execute(Q["ledger_acks"], {"job_id": job_id}):
        # The latest acknowledgement owed for the job (one per delivery of a result).
        acks[row["job_id"]] = {
            "delivery_id": row["webhook_id"],
            "outcome": row["outcome"],
            "reason": row["reason"],
            "state": row["state"],
            "attempts": row["attempts"],
            "last_error": row["last_error"],
            "sent_at": row["sent_at"],
        }
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
                # The business outcome owed to Fatura and whether it was sent; null when the ERP
                # does not acknowledge (no FATURA_ERP_ACK_URL) or the event carries no result.
                "ack": acks.get(row["job_id"]),
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


# ------------------------------------------------------------------ acknowledgements owed to Fatura


def due_acks(conn: sqlite3.Connection, now: float, limit: int) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(Q["due_acks"], {"now": now, "limit": limit})]


def next_ack_at(conn: sqlite3.Connection) -> float | None:
    row = conn.execute(Q["next_ack_at"]).fetchone()
    return None if row is None or row["at"] is None else float(row["at"])


def ack_sent(conn: sqlite3.Connection, webhook_id: str, now: float) -> None:
    conn.execute(Q["ack_sent"], {"webhook_id": webhook_id, "now": now})


def ack_retry(conn: sqlite3.Connection, webhook_id: str, next_attempt_at: float, error: str) -> None:
    conn.execute(
        Q["ack_retry"], {"webhook_id": webhook_id, "next_attempt_at": next_attempt_at, "error": error}
    )


def ack_failed(conn: sqlite3.Connection, webhook_id: str, error: str) -> None:
    conn.execute(Q["ack_failed"], {"webhook_id": webhook_id, "error": error})


def rearm_ack(conn: sqlite3.Connection, webhook_id: str, now: float) -> bool:
    return conn.execute(Q["rearm_ack"], {"webhook_id": webhook_id, "now": now}).rowcount > 0
