"""``fatura run kafka-ingress`` against a real Kafka-protocol broker (Tansu) and the real
PostgreSQL: records become jobs exactly once, offsets are committed only over what is in the inbox,
and neither a crash, a rebalance, admission nor poison loses or duplicates a record."""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import httpx
from fix_kafka import Broker, record_key, request, wait_for
from psycopg import Connection

from fix_db import MakeTenant, SyncPool
from fix_processes import ServiceProcess, SpawnFn
from services.acceptance.accept import plan_job, write_params
from services.acceptance.queries import Q
from services.acceptance.requests import DocumentBody, RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.common.procs import free_port


def start_ingress(spawn: SpawnFn, broker: Broker, topic: str, group: str, **env: str) -> ServiceProcess:
    port = free_port()
    process = spawn(
        "kafka-ingress",
        FATURA_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        FATURA_KAFKA_INGRESS_TOPIC=topic,
        FATURA_KAFKA_INGRESS_GROUP=group,
        FATURA_KAFKA_DEAD_LETTER_TOPIC=f"{topic}.dead-letter",
        FATURA_KAFKA_INGRESS_METRICS_PORT=str(port),
        # Tansu holds a rebalance until the session timeout of the members it waits for.
        FATURA_KAFKA_SESSION_TIMEOUT_MS="2000",
        **env,
    )
    process.base_url = f"http://127.0.0.1:{port}"
    return process


def blocker_params(tenant_id: uuid.UUID, key: str, text: str) -> dict[str, Any]:
    """The acceptance of the job a record would make, written CANCELLED: in an open transaction it
    holds the record's key (the record waits on it) without moving an admission counter, which
    other records share."""
    settings = AcceptanceSettings()
    body = RequestParser(settings).create_job({"document": {"text": text, "filename": f"{key}.txt"}})
    assert isinstance(body.document, DocumentBody)
    plan = plan_job(settings, tenant_id, key, body, body.document.size_bytes, body.document.sha256)
    return {**write_params(settings, tenant_id, key, body, plan, uuid.uuid4()), "state": "CANCELLED"}


def _jobs_by_key(conn: Connection[Any], tenant_id: uuid.UUID) -> dict[str, int]:
    rows = conn.execute(
        "SELECT idempotency_key, count(*) AS n FROM extraction_jobs WHERE tenant_id = %s "
        "GROUP BY idempotency_key",
        (tenant_id,),
    ).fetchall()
    return {row["idempotency_key"]: row["n"] for row in rows}


def _inbox(conn: Connection[Any], topic: str) -> dict[tuple[int, int], dict[str, Any]]:
    rows = conn.execute(
        'SELECT partition, "offset", outcome, job_id, reason FROM kafka_ingress_inbox WHERE topic = %s',
        (topic,),
    ).fetchall()
    return {(row["partition"], row["offset"]): row for row in rows}


def jobs_by_key(pool: SyncPool, tenant_id: uuid.UUID) -> dict[str, int]:
    with pool.connection() as conn:
        return _jobs_by_key(conn, tenant_id)


def inbox(pool: SyncPool, topic: str) -> dict[tuple[int, int], dict[str, Any]]:
    with pool.connection() as conn:
        return _inbox(conn, topic)


def inbox_and_jobs(
    pool: SyncPool, topic: str, tenant_id: uuid.UUID
) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[str, int]]:
    """The inbox and the jobs as one snapshot: a killed ingress's last COMMIT may still land after
    its process is gone, between two separate reads."""
    with pool.connection() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return _inbox(conn, topic), _jobs_by_key(conn, tenant_id)


def metric(process: ServiceProcess, name: str) -> float:
    text = httpx.get(f"{process.base_url}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_records_become_jobs_once_and_every_offset_is_committed(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given 24 extraction requests on two partitions
    When the ingress reads them, 8 at a time
    Then each is one job, each (partition, offset) one inbox row, and both partitions are committed
    to their end."""
    tenant = make_tenant()
    topic = broker.create_topic(2)
    broker.produce(
        topic, [(i % 2, record_key(tenant.id, f"a{i}"), request(tenant.id, f"a{i}")) for i in range(24)]
    )
    ingress = start_ingress(spawn, broker, topic, f"g-{topic}", FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="8")
    wait_for(
        lambda: broker.committed(f"g-{topic}", topic, 2) == {0: 12, 1: 12},
        "committed to the end",
        log=ingress.log_tail,
    )
    assert jobs_by_key(pool, tenant.id) == {f"inv-a{i}": 1 for i in range(24)}
    rows = inbox(pool, topic)
    assert set(rows) == {(p, o) for p in (0, 1) for o in range(12)}
    assert {row["outcome"] for row in rows.values()} == {"accepted"}
    ingress.stop()


def test_a_consumer_killed_between_the_inbox_commit_and_the_offset_commit_makes_no_duplicate(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given an ingress that dies (SIGKILL) right after a record's job and inbox row commit
    When a new ingress reads the partition again from the uncommitted offset
    Then the record is a no-op: one job per key, and the offsets are committed past it."""
    tenant = make_tenant()
    topic = broker.create_topic(1)
    broker.produce(
        topic, [(0, record_key(tenant.id, f"c{i}"), request(tenant.id, f"c{i}")) for i in range(3)]
    )
    group = f"g-{topic}"
    doomed = start_ingress(spawn, broker, topic, group, FATURA_FAULTS="crash_after_ingress_inbox_commit")
    assert doomed.wait_exit(timeout=60) == -signal.SIGKILL
    taken_before, jobs_before = inbox_and_jobs(pool, topic, tenant.id)
    assert taken_before, "the fault point is after the inbox commit"
    assert broker.committed(group, topic, 1).get(0, 0) == 0
    assert sum(jobs_before.values()) == len(taken_before)

    ingress = start_ingress(spawn, broker, topic, group)
    wait_for(lambda: broker.committed(group, topic, 1) == {0: 3}, "committed", log=ingress.log_tail)
    assert jobs_by_key(pool, tenant.id) == {"inv-c0": 1, "inv-c1": 1, "inv-c2": 1}
    after = inbox(pool, topic)
    assert set(after) == {(0, 0), (0, 1), (0, 2)}
    for where, row in taken_before.items():
        assert after[where]["job_id"] == row["job_id"]
    assert metric(ingress, 'fatura_kafka_ingress_records_total{outcome="redelivered"}') >= 1
    ingress.stop()


def test_a_rebalance_to_a_second_consumer_mid_stream_loses_and_duplicates_nothing(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given one ingress reading four partitions
    When a second joins the group mid-stream and then the first leaves
    Then every record of the stream is one job and every partition is committed to its end."""
    tenant = make_tenant()
    topic = broker.create_topic(4)
    group = f"g-{topic}"

    def batch(start: int) -> list[tuple[int, bytes, bytes]]:
        return [
            (i % 4, record_key(tenant.id, f"r{i}"), request(tenant.id, f"r{i}"))
            for i in range(start, start + 40)
        ]

    broker.produce(topic, batch(0))
    first = start_ingress(spawn, broker, topic, group, FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="4")
    wait_for(lambda: len(inbox(pool, topic)) >= 10, "reading", log=first.log_tail)
    second = start_ingress(spawn, broker, topic, group, FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="4")
    broker.produce(topic, batch(40))
    wait_for(lambda: "assigned" in second.log(), "the second consumer assigned", log=second.log_tail)
    broker.produce(topic, batch(80))
    assert first.stop() == 0
    broker.produce(topic, batch(120))
    wait_for(
        lambda: broker.committed(group, topic, 4) == {p: 40 for p in range(4)},
        "committed to the end",
        log=second.log_tail,
    )
    assert jobs_by_key(pool, tenant.id) == {f"inv-r{i}": 1 for i in range(160)}
    assert len(inbox(pool, topic)) == 160
    assert "revoked" in first.log()
    second.stop()


def test_the_committed_offset_never_passes_a_record_still_being_accepted(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given offset 2 of a partition blocked in PostgreSQL (another transaction holds its key)
    while 0, 1 and 3..5 are accepted
    Then the committed offset stays at 2 (not 6), the record is retried, not dead-lettered, and
    once the other transaction commits, the record is its replay and the commit reaches 6."""
    tenant = make_tenant()
    # The blocked record's tenant has no other record: the rows its waiting statement locks (its
    # tenant's document counters) block no other record.
    blocked = make_tenant()
    topic = broker.create_topic(1)
    group = f"g-{topic}"
    records = [(0, record_key(tenant.id, f"o{i}"), request(tenant.id, f"o{i}")) for i in range(6)]
    records[2] = (0, record_key(blocked.id, "o2"), request(blocked.id, "o2"))
    blocker = blocker_params(blocked.id, "inv-o2", "Invoice o2\nTotal: 10.00 EUR")
    with pool.connection() as conn:
        with conn.transaction():
            assert conn.execute(Q["accept_job"], blocker).fetchone() is not None
            broker.produce(topic, records)
            ingress = start_ingress(spawn, broker, topic, group, FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="8")
            wait_for(
                lambda: set(inbox(pool, topic)) == {(0, o) for o in (0, 1, 3, 4, 5)},
                "the records around the blocked one taken",
                log=ingress.log_tail,
            )
            wait_for(lambda: broker.committed(group, topic, 1) == {0: 2}, "committed up to the gap")
            assert broker.committed(group, topic, 1) == {0: 2}
        # The blocker commits: the ingress's retry finds the key taken with the same request.
    wait_for(
        lambda: broker.committed(group, topic, 1) == {0: 6}, "committed to the end", log=ingress.log_tail
    )
    rows = inbox(pool, topic)
    assert rows[(0, 2)]["outcome"] == "replayed"
    assert rows[(0, 2)]["job_id"] == blocker["job_id"]
    assert jobs_by_key(pool, tenant.id) == {f"inv-o{i}": 1 for i in (0, 1, 3, 4, 5)}
    assert jobs_by_key(pool, blocked.id) == {"inv-o2": 1}
    assert broker.read_all(f"{topic}.dead-letter", 1, timeout=1) == []
    ingress.stop()


def test_a_partition_refused_by_admission_is_paused_and_resumed_without_losing_a_record(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given a tenant allowed 2 pending jobs with 5 records on partition 0, and another tenant's
    records on partition 1
    When the third record is refused (429)
    Then partition 0 pauses at offset 2 while partition 1 runs to its end, and once the limit is
    raised partition 0 resumes from offset 2 and every record is one job."""
    small = make_tenant(max_pending_jobs=2)
    other = make_tenant()
    topic = broker.create_topic(2)
    group = f"g-{topic}"
    broker.produce(
        topic,
        [(0, record_key(small.id, f"s{i}"), request(small.id, f"s{i}")) for i in range(5)]
        + [(1, record_key(other.id, f"x{i}"), request(other.id, f"x{i}")) for i in range(5)],
    )
    ingress = start_ingress(
        spawn,
        broker,
        topic,
        group,
        # One record at a time: records accepted in parallel may all read the counters before any
        # of them commits, as concurrent HTTP requests may.
        FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="1",
        FATURA_ADMISSION_RETRY_AFTER_SECONDS="1",
        FATURA_AUTH_CACHE_SECONDS="0.2",
        FATURA_ADMISSION_CACHE_SECONDS="0",
    )
    wait_for(
        lambda: broker.committed(group, topic, 2) == {0: 2, 1: 5}, "partition 1 done", log=ingress.log_tail
    )
    wait_for(lambda: metric(ingress, "fatura_kafka_ingress_held_total") >= 2, "refused twice")
    wait_for(lambda: metric(ingress, "fatura_kafka_ingress_paused_partitions") == 1, "partition 0 paused")
    assert broker.committed(group, topic, 2)[0] == 2
    assert jobs_by_key(pool, small.id) == {"inv-s0": 1, "inv-s1": 1}

    with pool.connection() as conn:
        conn.execute("UPDATE tenants SET max_pending_jobs = 100 WHERE id = %s", (small.id,))
    wait_for(lambda: broker.committed(group, topic, 2) == {0: 5, 1: 5}, "resumed", log=ingress.log_tail)
    assert jobs_by_key(pool, small.id) == {f"inv-s{i}": 1 for i in range(5)}
    assert jobs_by_key(pool, other.id) == {f"inv-x{i}": 1 for i in range(5)}
    assert "dead" not in ingress.log().lower()
    ingress.stop()


def test_a_malformed_record_goes_to_the_dead_letter_topic_with_its_reason(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given a record that is not JSON, one for a tenant that does not exist and a good one
    Then the first two land on the dead-letter topic with their reasons in headers, their offsets
    count as done, and the good one is a job."""
    tenant = make_tenant()
    nobody = uuid.uuid4()
    topic = broker.create_topic(1)
    group = f"g-{topic}"
    broker.produce(
        topic,
        [
            (0, record_key(tenant.id, "m0"), b"{not json"),
            (0, record_key(nobody, "m1"), request(nobody, "m1")),
            (0, record_key(tenant.id, "m2"), request(tenant.id, "m2")),
        ],
    )
    ingress = start_ingress(spawn, broker, topic, group)
    wait_for(lambda: broker.committed(group, topic, 1) == {0: 3}, "committed", log=ingress.log_tail)
    dead = broker.read_all(f"{topic}.dead-letter", 2)
    by_offset = {int(dict(m.headers() or [])["fatura-source-offset"]): m for m in dead}
    reasons = {o: dict(m.headers() or [])["fatura-dead-letter-reason"].decode() for o, m in by_offset.items()}
    assert reasons == {0: "malformed", 1: "unknown_tenant"}
    assert by_offset[0].value() == b"{not json"
    assert by_offset[0].key() == record_key(tenant.id, "m0")
    rows = inbox(pool, topic)
    assert [rows[(0, o)]["outcome"] for o in range(3)] == ["dead_lettered", "dead_lettered", "accepted"]
    assert jobs_by_key(pool, tenant.id) == {"inv-m2": 1}
    ingress.stop()


def test_a_full_pipeline_keeps_polling_within_max_poll_interval(
    broker: Broker, spawn: SpawnFn, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    """Given one slot, held for longer than max.poll.interval.ms by a record waiting in PostgreSQL
    Then the consumer stays in the group (no revoke, no lost partition) and, once the record goes
    through, the rest follow and are committed."""
    tenant = make_tenant()
    topic = broker.create_topic(1)
    group = f"g-{topic}"
    broker.produce(
        topic, [(0, record_key(tenant.id, f"p{i}"), request(tenant.id, f"p{i}")) for i in range(4)]
    )
    blocker = blocker_params(tenant.id, "inv-p0", "Invoice p0\nTotal: 10.00 EUR")
    with pool.connection() as conn:
        with conn.transaction():
            assert conn.execute(Q["accept_job"], blocker).fetchone() is not None
            ingress = start_ingress(
                spawn,
                broker,
                topic,
                group,
                FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT="1",
                FATURA_KAFKA_MAX_POLL_INTERVAL_MS="2000",
            )
            wait_for(lambda: "assigned" in ingress.log(), "assigned", log=ingress.log_tail)
            wait_for(lambda: metric(ingress, "fatura_kafka_ingress_in_flight") == 1, "the slot taken")
            time.sleep(3)  # past max.poll.interval.ms with the only slot taken
            assert inbox(pool, topic) == {}
    wait_for(lambda: broker.committed(group, topic, 1) == {0: 4}, "committed", log=ingress.log_tail)
    log = ingress.log()
    assert log.count("assigned") == 1 and "revoked" not in log and "lost" not in log, ingress.log_tail()
    assert jobs_by_key(pool, tenant.id) == {f"inv-p{i}": 1 for i in range(4)}
    ingress.stop()
