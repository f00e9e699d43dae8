"""Watching a scenario from outside: a timeline of its jobs by state, when the backlog drained, and
the facts the invariants are decided on. Reads the database over the real port and the sandbox's
admin endpoints, never through a fault proxy."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from services.chaos.environment import Accepted, ChaosStack
from services.chaos.invariants import TERMINAL, TO_ERP, Attempt, Event, Expected, Facts, Job, LedgerEntry
from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "chaos.sql")


@dataclass(frozen=True)
class Sample:
    at: float  # wall clock
    states: dict[str, int]
    deliveries: dict[str, int]


@dataclass
class Progress:
    """What the live display shows."""

    samples: list[Sample] = field(default_factory=list)
    inference_done_at: float | None = None
    provider_requests_at_inference_done: int | None = None
    drained_at: float | None = None

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


class Observer:
    """Samples the scenario's jobs every ``interval`` seconds in a thread of its own, and notes when
    every accepted job first finished and when the backlog first drained."""

    def __init__(self, stack: ChaosStack, interval: float) -> None:
        assert stack.tenant_id is not None
        self.stack = stack
        self.tenant_id: uuid.UUID = stack.tenant_id
        self.interval = interval
        self.progress = Progress()
        self.accepted: list[Accepted] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-observer")
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._conn is not None:
            self._conn.close()

    def expect(self, accepted: Sequence[Accepted]) -> None:
        """From now on the backlog is these jobs: drained when each is finished and at the ERP."""
        self.accepted = list(accepted)

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.stack.database_url, autocommit=True, row_factory=dict_row)
        return self._conn

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except (psycopg.Error, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                log.warning("observer: %s", exc)
                if self._conn is not None:
                    self._conn.close()
            self._stop.wait(self.interval)

    def _sample(self) -> None:
        conn = self._connection()
        params = {"tenant_id": self.tenant_id}
        states = {r["state"]: int(r["n"]) for r in conn.execute(Q["state_counts"], params)}
        deliveries = {r["state"]: int(r["n"]) for r in conn.execute(Q["delivery_counts"], params)}
        now = time.time()
        self.progress.samples.append(Sample(now, states, deliveries))
        total = len(self.accepted)
        if not total or self.progress.drained_at is not None:
            return
        finished = sum(n for state, n in states.items() if state in TERMINAL)
        if finished < total:
            self.progress.inference_done_at = None  # a new job (or a reaped one) is back in play
            self.progress.provider_requests_at_inference_done = None
            return
        if self.progress.inference_done_at is None:
            requests = int(self.stack.provider_stats()["requests_total"])
            self.progress.inference_done_at = now
            self.progress.provider_requests_at_inference_done = requests
        unsettled = sum(n for state, n in deliveries.items() if state in ("pending", "delivering"))
        if not unsettled and self._ledger_has_all(conn):
            self.progress.drained_at = now

    def _ledger_has_all(self, conn: psycopg.Connection[dict[str, Any]]) -> bool:
        """Every accepted job whose final state goes to the ERP is there at its version (a job
        awaiting review never goes there, DESIGN §5.13)."""
        rows = conn.execute(Q["jobs"], {"tenant_id": self.tenant_id})
        jobs = {r["id"]: (r["state"], r["state_version"]) for r in rows}
        ledger = {str(e["job_id"]): e for e in self.stack.ledger()}
        for a in self.accepted:
            state, version = jobs.get(a.job_id, (None, None))
            if state not in TO_ERP:
                continue
            if a.job_id not in ledger or ledger[a.job_id]["state_version"] != version:
                return False
        return True


def gather(
    stack: ChaosStack, observer: Observer, pool_cap: int, unexpected_exits: list[str], fault_ended_at: float
) -> tuple[Facts, dict[str, int]]:
    """Read everything the invariants need; also a few operator's figures (dead letters, unpublished
    events) that explain a failure."""
    params = {"tenant_id": observer.tenant_id}
    with psycopg.connect(stack.database_url, autocommit=True, row_factory=dict_row) as conn:
        # The queries' columns are the fields' names.
        jobs = {r["id"]: Job(**r) for r in conn.execute(Q["jobs"], params)}
        events = [Event(**r) for r in conn.execute(Q["job_events"], params)]
        attempts = [Attempt(**r) for r in conn.execute(Q["attempts"], params)]
        backlog = conn.execute(Q["backlog"], params).fetchone() or {}
        delivery_rows = conn.execute(Q["deliveries"], params).fetchall()
    ledger = {
        str(e["job_id"]): LedgerEntry(
            str(e["job_id"]),
            str(e["state"]),
            int(e["state_version"]),
            int(e["effects"]),
            int(e.get("counts", {}).get("duplicates", 0)),
        )
        for e in stack.ledger()
    }
    provider = stack.provider_stats()
    progress = observer.progress
    facts = Facts(
        accepted=[Expected(a.job_id, a.sample, a.expect) for a in observer.accepted],
        jobs=jobs,
        events=events,
        attempts=attempts,
        ledger=ledger,
        pool_cap=pool_cap,
        provider_peak_in_flight=int(provider["peak_in_flight"]),
        provider_requests_total=int(provider["requests_total"]),
        provider_requests_at_inference_done=progress.provider_requests_at_inference_done,
        unexpected_exits=unexpected_exits,
        fault_ended_at=fault_ended_at,
        drained_at=progress.drained_at,
    )
    undelivered = sum(1 for r in delivery_rows if r["state"] != "delivered")
    try:
        queued_dead = stack.dead_letter_queue_messages()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not read the dead-letter queues: %s", exc)
        queued_dead = -1
    figures = {
        "dead_letters": int(backlog.get("dead_letters", 0)),
        "dead_letter_queue_messages": queued_dead,
        "unpublished_events": int(backlog.get("unpublished", 0)),
        "deliveries": len(delivery_rows),
        "deliveries_not_delivered": undelivered,
        "provider_requests": facts.provider_requests_total,
        "attempt_rows": len(attempts),
        "stale_attempts": sum(1 for a in attempts if a.outcome == "stale"),
    }
    return facts, figures
