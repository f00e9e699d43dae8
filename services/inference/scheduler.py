"""The inference scheduler process (``fatura run inference-scheduler``).

Every pass: the reaper moves RUNNING jobs whose lease expired to RETRY_SCHEDULED (fence + 1, the
attempt kept) or to FAILED_TERMINAL when the budget or the deadline is gone; jobs past their
deadline fail; and the wake-up top-up keeps enough ``run`` wake-ups queued for the jobs that are
due, which is what makes every eligible job run even when messages were lost. Every few passes
the reconciler publishes again a requested event the execution inbox never recorded, and what
RabbitMQ dead-lettered is moved into ``dead_letters``. Several schedulers may run at once: rows
are locked with SKIP LOCKED and one leader per pass does the top-up. No failure ends the loop.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dramatiq
from psycopg_pool import ConnectionPool

from services.common import deadletters, events, readiness, reconcile, sli, states
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import sync_pool
from services.common.failures import Failure, classify
from services.common.ops_server import start_ops_server
from services.common.queries import load_queries
from services.common.reconcile import EventReconciler
from services.common.uow import JobChange, UnitOfWork, unit_of_work
from services.common.worker import stop_on_signals
from services.inference import metrics
from services.inference.retry import GiveUp, RetryPolicy, next_step
from services.inference.settings import InferenceSettings
from services.inference.worker import queues

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "scheduler.sql")

PRIORITIES = ("interactive", "batch")
TOPUP_LOCK_KEY = 0x46415455  # one leader per pass sends wake-ups
LEASE_EXPIRED = "lease_expired"
DEADLINE_EXCEEDED = "deadline_exceeded"


class Scheduler:
    def __init__(
        self,
        settings: InferenceSettings,
        pool: ConnectionPool[Any],
        broker: QuorumRabbitmqBroker,
        rng: random.Random | None = None,
    ) -> None:
        self._s = settings
        self._pool = pool
        self._broker = broker
        self._rng = rng or random.Random()
        self._queues = list(queues(settings.common.queue_prefix))
        self._run_queue = self._queues[1]
        common = settings.common
        self.reconciler = EventReconciler(
            pool,
            broker,
            kind="requested_event",
            queue=self._queues[0],
            actor=events.INFERENCE_INGEST.actor,
            event_types=events.event_types_for(events.INFERENCE_INGEST),
            inbox_table="execution_inbox",
            grace_seconds=common.reconcile_grace_seconds,
            horizon_seconds=common.reconcile_horizon_seconds,
        )
        self._policy = RetryPolicy(
            max_attempts=settings.max_attempts,
            base_seconds=settings.retry_base_seconds,
            cap_seconds=settings.retry_cap_seconds,
            attempt_seconds=settings.attempt_deadline_seconds,
            margin_seconds=settings.deadline_margin_seconds,
        )

    def run_once(self) -> dict[str, int]:
        done = {"reaped": self.reap(), "expired": self.expire_deadlines(), "woken": self.top_up()}
        self.measure_backlog()
        return done

    def sweep(self) -> dict[str, int]:
        """The slower duties: reconcile the inbox, drain and prune dead letters."""
        done = {
            "redriven": self.reconciler.sweep(),
            "dead_lettered": deadletters.drain(self._pool, self._broker, self._queues),
            "redriven_dead_letters": deadletters.publish_requested(self._pool, self._broker, self._queues),
            "pruned": deadletters.prune(self._pool, self._s.common.dead_letter_retention_days),
        }
        deadletters.refresh_metrics(self._pool, self._queues)
        return done

    def reap(self) -> int:
        failed: list[dict[str, Any]] = []
        with unit_of_work(self._pool) as uow:
            rows = uow.execute(Q["expired_leases"], {"batch": self._s.scheduler_batch}).fetchall()
            now = datetime.now(UTC)
            for row in rows:
                lease = timedelta(seconds=self._s.lease_seconds)
                uow.execute(
                    Q["lease_expired_attempt"], {**_ids(row), "started_at": row["lease_until"] - lease}
                )
                step = next_step(row["attempt"], now, row["deadline_at"], self._policy, rng=self._rng)
                message = f"the lease of {row['claimed_by']} expired during attempt {row['attempt']}"
                if isinstance(step, GiveUp):
                    failed.append(self._fail(uow, row, LEASE_EXPIRED, f"{message}; no retry: {step.reason}"))
                    metrics.REAPED.labels(states.FAILED_TERMINAL).inc()
                    continue
                params = {
                    "job_id": row["id"],
                    "available_at": step.at,
                    "error_class": LEASE_EXPIRED,
                    "error_message": message,
                }
                version = uow.execute(Q["reschedule_job"], params).fetchone()
                assert version is not None
                detail = {"reason": LEASE_EXPIRED, "attempt": row["attempt"]}
                change = JobChange(
                    row["tenant_id"],
                    row["id"],
                    states.RETRY_SCHEDULED,
                    version["state_version"],
                    None,
                    detail,
                )
                uow.record(change)
                metrics.REAPED.labels(states.RETRY_SCHEDULED).inc()
        _observe_failed(failed)
        return len(rows)

    def expire_deadlines(self) -> int:
        failed: list[dict[str, Any]] = []
        with unit_of_work(self._pool) as uow:
            rows = uow.execute(Q["overdue_jobs"], {"batch": self._s.scheduler_batch}).fetchall()
            for row in rows:
                message = f"the deadline passed while the job was {row['state']}"
                failed.append(self._fail(uow, row, DEADLINE_EXCEEDED, message))
                metrics.EXPIRED.inc()
        _observe_failed(failed)
        return len(rows)

    def _fail(self, uow: UnitOfWork, row: dict[str, Any], error_class: str, message: str) -> dict[str, Any]:
        params = {"job_id": row["id"], "error_class": error_class, "error_message": message}
        version = uow.execute(Q["fail_job"], params).fetchone()
        assert version is not None
        detail = {"reason": error_class}
        uow.record(
            JobChange(
                row["tenant_id"],
                row["id"],
                states.FAILED_TERMINAL,
                version["state_version"],
                events.EXTRACTION_FAILED,
                detail,
            )
        )
        return version

    def measure_backlog(self) -> dict[str, int]:
        """Set the exact runnable backlog and oldest eligible age of each priority; returns the counts.

        Every scheduler measures (not only the top-up's leader), so each one's gauges are current.
        """
        with self._pool.connection() as conn:
            rows = conn.execute(Q["runnable_backlog"], {"priorities": list(PRIORITIES)}).fetchall()
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["priority"]] = int(row["due"])
            oldest = row["oldest"]
            metrics.RUNNABLE.labels(row["priority"]).set(row["due"])
            age = (row["now"] - oldest).total_seconds() if oldest else 0.0
            metrics.OLDEST_ELIGIBLE.labels(row["priority"]).set(max(0.0, age))
        return counts

    def top_up(self) -> int:
        # The advisory lock picks one leader per pass; the broker calls happen after the commit, so
        # no transaction waits on RabbitMQ. Two leaders in a row can only send spare wake-ups,
        # which find nothing and are dropped.
        with self._pool.connection() as conn, conn.transaction():
            leader = conn.execute(Q["try_lead"], {"key": TOPUP_LOCK_KEY}).fetchone()
            if not leader or not leader["leader"]:
                return 0
            due = conn.execute(Q["due_jobs"], {"cap": self._s.wakeup_target}).fetchone()
        assert due is not None
        if not due["due"]:
            return 0
        queued = self._broker.queue_depths(self._run_queue)[0]
        missing = max(0, int(due["due"]) - queued)
        wakeup = events.INFERENCE_RUN.actor
        taken = self._broker.publish_all(
            [
                dramatiq.Message(
                    queue_name=self._run_queue, actor_name=wakeup, args=(), kwargs={}, options={}
                )
                for _ in range(missing)
            ]
        )
        sent = taken.count(True)  # the next pass tops up what RabbitMQ did not take
        metrics.WAKEUPS.inc(sent)
        reconcile.count("job_wakeup", sent)
        return sent


def _observe_failed(failed: list[dict[str, Any]]) -> None:
    # After the commit: only a failure that was written is an outcome of the completion SLI.
    for row in failed:
        sli.observe_completion(row["priority"], states.FAILED_TERMINAL, row["since_accepted"])


def _ids(row: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": row["id"], "attempt": row["attempt"], "fence": row["fence"]}


def main() -> int:
    settings = InferenceSettings.from_env()
    stop = threading.Event()
    stop_on_signals(stop, "inference scheduler")
    broker = make_broker(settings.common)
    with sync_pool(
        settings.common, name="inference-scheduler", max_size=2, role="scheduler", db_role="fatura_inference"
    ) as pool:
        scheduler = Scheduler(settings, pool, broker)
        ready = readiness.all_of(readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url))
        port = settings.scheduler_metrics_port
        ops = start_ops_server(port, ready) if port else None
        log.info("inference scheduler: a pass every %.2f s", settings.scheduler_interval_seconds)
        # The sweeps read more and matter less often than the reaper: about every 5 s.
        sweep_every = max(1, round(5.0 / settings.scheduler_interval_seconds))
        passes = failures = 0
        try:
            while not stop.is_set():
                try:
                    done = scheduler.run_once()
                    if passes % sweep_every == 0:
                        done |= scheduler.sweep()
                    passes += 1
                    failures = 0
                    if any(done.values()):
                        log.info("scheduler pass: %s", done)
                    broker.keep_alive()
                    delay = settings.scheduler_interval_seconds
                except Exception as exc:
                    # The scheduler never exits on a blip: it backs off and tries again.
                    failures += 1
                    delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                    if classify(exc) is Failure.TRANSIENT:
                        log.warning(
                            "scheduler pass failed (%s: %s); retrying in %.1fs",
                            type(exc).__name__,
                            exc,
                            delay,
                        )
                    else:
                        log.exception("scheduler pass failed unexpectedly; retrying in %.1fs", delay)
                stop.wait(delay)
        finally:
            broker.close()
            if ops is not None:
                ops.shutdown()
    return 0
