"""``fatura run kafka-export``: job events reach a Kafka topic keyed by job, in each job's order,
on a durable cursor that a restart resumes from; off unless switched on."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

from fix_kafka import Broker, wait_for

from fix_db import MakeTenant, SyncPool, accept_by_statement
from fix_processes import SpawnFn
from services.common import events, states
from services.common.procs import free_port
from services.common.uow import JobChange, unit_of_work


def export_env(broker: Broker, topic: str, name: str) -> dict[str, str]:
    return {
        "FATURA_KAFKA_EXPORT": "on",
        "FATURA_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "FATURA_KAFKA_EXPORT_TOPIC": topic,
        "FATURA_KAFKA_EXPORT_NAME": name,
        "FATURA_KAFKA_EXPORT_POLL_SECONDS": "0.05",
        "FATURA_KAFKA_EXPORT_METRICS_PORT": str(free_port()),
    }


def accept_and_cancel(pool: SyncPool, tenant_id: uuid.UUID, key: str) -> str:
    """A job through the acceptance statement, then cancelled: two job events."""
    with pool.connection() as conn:
        job_id = accept_by_statement(conn, tenant_id, key)
    with unit_of_work(pool) as uow:
        uow.execute(
            "UPDATE extraction_jobs SET state = 'CANCELLED', state_version = 2 WHERE id = %s", (job_id,)
        )
        uow.record(JobChange(tenant_id, job_id, states.CANCELLED, 2, events.EXTRACTION_CANCELLED))
    return str(job_id)


def cursor(pool: SyncPool, name: str) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT through FROM kafka_export_cursors WHERE name = %s", (name,)).fetchone()
    return int(row["through"]) if row else -1


def newest_event(pool: SyncPool) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT coalesce(max(seq), 0) AS seq FROM job_events").fetchone()
    assert row is not None
    return int(row["seq"])


def test_the_export_is_off_unless_switched_on(spawn: SpawnFn) -> None:
    process = spawn("kafka-export")
    assert process.wait_exit(timeout=60) == 2
    assert "FATURA_KAFKA_EXPORT=on" in process.log()


def test_job_events_are_exported_keyed_by_job_in_order_and_a_restart_resumes_from_the_cursor(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given jobs accepted and cancelled (two events each)
    When the export runs, stops, more jobs come, and it runs again
    Then every event of those jobs is on the topic once, keyed by its job id, each job's events in
    state-version order, and the cursor stands at the newest event."""
    tenant = make_tenant()
    topic = broker.create_topic(3, prefix="job-events")
    name = f"export-{topic}"
    with pool.connection() as conn:  # start from now: earlier tests' events are not this test's
        conn.execute(
            "INSERT INTO kafka_export_cursors (name, through) VALUES (%s, %s)", (name, newest_event(pool))
        )
    first = [accept_and_cancel(pool, tenant.id, f"e{i}") for i in range(4)]
    exporter = spawn("kafka-export", **export_env(broker, topic, name))
    wait_for(lambda: cursor(pool, name) >= newest_event(pool), "caught up", log=exporter.log_tail)
    assert exporter.stop() == 0, exporter.log_tail(80)
    second = [accept_and_cancel(pool, tenant.id, f"f{i}") for i in range(4)]
    exporter = spawn("kafka-export", **export_env(broker, topic, name))
    wait_for(lambda: cursor(pool, name) >= newest_event(pool), "caught up again", log=exporter.log_tail)
    jobs = {*first, *second}
    messages = broker.read_all(topic, 16, timeout=20)
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    partition_of: dict[str, set[int]] = defaultdict(set)
    for message in messages:
        event = json.loads(message.value() or b"{}")
        assert (message.key() or b"").decode() == event["job_id"]
        seen[event["job_id"]].append((event["seq"], event["state_version"]))
        partition_of[event["job_id"]].add(int(message.partition() or 0))
    assert set(seen) == jobs
    assert len(messages) == 16
    for job, sent in seen.items():
        assert len(sent) == len({seq for seq, _ in sent}), "an event was sent twice"
        assert sent == sorted(sent), f"job {job}'s events out of order"
        assert len(partition_of[job]) == 1
    exporter.stop()
