"""Helpers and fixtures of the delivery tests: the reference ERP, an edge that may reach it,
the delivery worker and scheduler as real processes with short timers, and helpers that complete
jobs the way the inference worker does (row + job event + outbox event in one unit of work) and
hand the event to the delivery ingest queue exactly as the relay publishes it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dramatiq
import httpx
import pika
import pytest
from psycopg.types.json import Jsonb

from fix_amqp import AMQP_URL
from fix_api import job_body
from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.common import events
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.event_batches import events_message
from services.common.keyring import DEVELOPMENT_KEY, Keyring
from services.common.procs import free_port, stop_all
from services.common.settings import CommonSettings
from services.common.uow import JobChange, unit_of_work
from services.delivery import signing

# Short timers: the schedule 5 s, 5 min, 30 min ... becomes 10 ms, 0.6 s, 3.6 s ...
DELIVERY_ENV = {
    "FATURA_EGRESS_ALLOW": "127.0.0.0/8,::1/128",
    "FATURA_DELIVERY_RETRY_SCALE": "0.002",
    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.1",
    "FATURA_DELIVERY_REWAKE_SECONDS": "2",
    "FATURA_DELIVERY_BREAKER_THRESHOLD": "5",
    "FATURA_DELIVERY_BREAKER_COOLDOWN_SECONDS": "1",
    "FATURA_DELIVERY_AUTH_FAILURE_LIMIT": "2",
    "FATURA_DELIVERY_CONNECT_TIMEOUT_SECONDS": "1",
    "FATURA_DELIVERY_READ_TIMEOUT_SECONDS": "1",
    "FATURA_DELIVERY_TOTAL_TIMEOUT_SECONDS": "2",
    "FATURA_DELIVERY_LEASE_SECONDS": "3",
    "FATURA_DELIVERY_WORKER_THREADS": "4",
}


# The key the tests' processes seal and open webhook secrets with (tests/conftest.py).
KEYRING = Keyring.from_env({"FATURA_SECRETS_KEY": DEVELOPMENT_KEY})
assert KEYRING is not None


def insert_secret(conn: Any, endpoint_id: uuid.UUID, secret: str) -> None:
    """Store ``secret`` for an endpoint the way registration does: sealed."""
    key_id = signing.key_id(secret)
    sealed = KEYRING.seal(endpoint_id, key_id, secret)
    conn.execute(
        """INSERT INTO webhook_secrets (endpoint_id, key_id, master_key_id, nonce, ciphertext)
           VALUES (%s, %s, %s, %s, %s)""",
        (endpoint_id, key_id, sealed.master_key_id, sealed.nonce, sealed.ciphertext),
    )


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s")


@dataclass
class Erp:
    process: ServiceProcess
    url: str

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/webhooks"

    def fault(self, mode: str, **options: Any) -> None:
        httpx.post(f"{self.url}/admin/faults", json={"mode": mode, **options}).raise_for_status()

    def clear(self) -> None:
        httpx.delete(f"{self.url}/admin/faults").raise_for_status()

    def ledger(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        jobs = httpx.get(f"{self.url}/ledger", params={"job_id": str(job_id)}).json()["jobs"]
        assert len(jobs) <= 1
        return jobs[0] if jobs else None

    def stats(self) -> dict[str, Any]:
        counts: dict[str, Any] = httpx.get(f"{self.url}/admin/stats").json()["counts"]
        return counts


@pytest.fixture(scope="module")
def erp_secret() -> str:
    return signing.new_secret()


@pytest.fixture(scope="module")
def erp(spawn: SpawnFn, tmp_path_factory: pytest.TempPathFactory, erp_secret: str) -> Iterator[Erp]:
    port = free_port()
    db = tmp_path_factory.mktemp("erp") / "erp.sqlite"
    process = spawn("erp", FATURA_ERP_PORT=str(port), FATURA_ERP_DB=str(db), FATURA_ERP_SECRETS=erp_secret)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/readyz")
    yield Erp(process, url)
    process.stop()


@pytest.fixture(scope="module")
def dedge(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    """An edge whose webhook API may register local targets (the ERP, a test receiver)."""
    edge = start_edge(spawn, workers=1, FATURA_AUTH_CACHE_SECONDS="0", **DELIVERY_ENV)
    yield edge
    edge.stop()


@pytest.fixture(scope="module")
def dclient(dedge: ServiceProcess) -> Iterator[httpx.Client]:
    assert dedge.base_url is not None
    with httpx.Client(base_url=dedge.base_url, timeout=30.0) as c:
        yield c


StartProcess = Callable[..., ServiceProcess]


@pytest.fixture(scope="module")
def start_worker(spawn: SpawnFn, queue_prefix: str) -> Iterator[StartProcess]:
    started: list[ServiceProcess] = []

    def start(wait: bool = True, **env: str) -> ServiceProcess:
        port = free_port()
        worker = spawn(
            "delivery-worker", FATURA_DELIVERY_WORKER_METRICS_PORT=str(port), **{**DELIVERY_ENV, **env}
        )
        worker.base_url = f"http://127.0.0.1:{port}"
        started.append(worker)
        if wait:
            worker.wait_ready(f"{worker.base_url}/readyz")
        return worker

    yield start
    stop_all(started)
    _delete_queues(queue_prefix, ("delivery.deliver",))


@pytest.fixture(scope="module")
def scheduler(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    port = free_port()
    process = spawn("delivery-scheduler", FATURA_DELIVERY_SCHEDULER_METRICS_PORT=str(port), **DELIVERY_ENV)
    process.wait_ready(f"http://127.0.0.1:{port}/readyz")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def worker(start_worker: StartProcess, scheduler: ServiceProcess) -> ServiceProcess:
    return start_worker()


def _delete_queues(prefix: str, names: tuple[str, ...]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    for name in names:
        for suffix in ("", ".DQ", ".XQ"):
            channel.queue_delete(f"{prefix}.{name}{suffix}")
    connection.close()


@pytest.fixture(scope="module")
def publisher(common_settings: CommonSettings) -> Iterator[QuorumRabbitmqBroker]:
    broker = make_broker(common_settings)
    yield broker
    broker.close()


@dataclass
class Jobs:
    """Makes jobs through the edge and completes them as the inference worker would."""

    pool: SyncPool
    client: httpx.Client
    broker: QuorumRabbitmqBroker
    prefix: str
    published: list[dict[str, Any]] = field(default_factory=list)

    def submit(self, tenant: TenantHandle) -> uuid.UUID:
        response = self.client.post(
            "/v1/extraction-jobs",
            json=job_body(),
            headers={**tenant.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
        )
        assert response.status_code == 202, response.text
        return uuid.UUID(response.json()["job_id"])

    def complete(
        self,
        tenant: TenantHandle,
        job_id: uuid.UUID,
        *,
        state: str = "SUCCEEDED",
        event_type: str = events.EXTRACTION_COMPLETED,
        result: dict[str, Any] | None = None,
        publish: bool = True,
    ) -> dict[str, Any]:
        """The job's terminal state change (row, job event, outbox event in one unit of work)."""
        reasons = (
            [{"code": "arithmetic", "message": "lines do not sum"}] if state == "REVIEW_REQUIRED" else None
        )
        with unit_of_work(self.pool) as uow:
            # As a worker would: the job was claimed (RUNNING) before it finished
            uow.execute(
                "UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %(id)s AND state <> 'RUNNING'",
                {"id": job_id},
            )
            row = uow.execute(
                """UPDATE extraction_jobs
                   SET state = %(state)s, state_version = state_version + 1, result = %(result)s,
                       review_reasons = %(reasons)s, finished_at = now(), updated_at = now()
                   WHERE id = %(id)s RETURNING state_version""",
                {
                    "state": state,
                    "result": Jsonb(result or {"invoice_number": f"AK-{job_id.hex[:6]}", "total": "5400.00"}),
                    "reasons": Jsonb(reasons) if reasons else None,
                    "id": job_id,
                },
            ).fetchone()
            assert row is not None
            event_id = uow.record(JobChange(tenant.id, job_id, state, row["state_version"], event_type))
        with self.pool.connection() as conn:
            outbox = conn.execute(
                "UPDATE outbox_events SET published_at = now() WHERE event_id = %s RETURNING payload",
                (event_id,),
            ).fetchone()
        assert outbox is not None
        event: dict[str, Any] = outbox["payload"]
        if publish:
            self.publish(event)
        return event

    def publish_together(self, events: list[dict[str, Any]], message_id: str) -> None:
        """Several events in one message, as the relay packs a batch's events for one queue."""
        self.broker.enqueue(events_message(f"{self.prefix}.delivery.ingest", "ingest", events, message_id))

    def publish(self, event: dict[str, Any], message_id: str | None = None) -> None:
        """Exactly what the relay sends for a completion event."""
        self.broker.enqueue(
            dramatiq.Message(
                queue_name=f"{self.prefix}.delivery.ingest",
                actor_name="ingest",
                args=(),
                kwargs={"event": event},
                options={},
                message_id=message_id or event["event_id"],
            )
        )


@pytest.fixture(scope="module")
def jobs(pool: SyncPool, dclient: httpx.Client, publisher: QuorumRabbitmqBroker, queue_prefix: str) -> Jobs:
    return Jobs(pool, dclient, publisher, queue_prefix)


@dataclass
class Endpoint:
    tenant: TenantHandle
    endpoint_id: str
    secret: str
    body: dict[str, Any]


RegisterFn = Callable[..., Endpoint]


@pytest.fixture
def register(
    dclient: httpx.Client,
    make_tenant: MakeTenant,
    erp_secret: str,
    pool: SyncPool,
    request: pytest.FixtureRequest,
) -> Iterator[RegisterFn]:
    """Register a tenant's endpoint (the ERP unless told otherwise); disabled again at the end, so a
    test's leftover retries never reach the next test's faults. When the test runs a delivery
    worker, the endpoint's verification ping has been answered before this returns, so the faults a
    test sets next meet its own deliveries, not the ping."""
    made: list[Endpoint] = []
    sends = "worker" in request.fixturenames

    def ping_settled(delivery_id: str) -> bool:
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT state FROM deliveries WHERE delivery_id = %s", (delivery_id,)
            ).fetchone()
        return row is not None and row["state"] not in ("pending", "delivering")

    def make(
        url: str, *, secret: str | None = None, tenant: TenantHandle | None = None, **extra: Any
    ) -> Endpoint:
        tenant = tenant or make_tenant()
        secret = secret or erp_secret
        response = dclient.post(
            "/v1/webhook-endpoints", json={"url": url, "secret": secret, **extra}, headers=tenant.headers
        )
        assert response.status_code == 201, response.text
        endpoint = Endpoint(tenant, response.json()["endpoint_id"], secret, response.json())
        made.append(endpoint)
        if sends:
            ping = endpoint.body["verification"]["delivery_id"]
            wait_for(lambda: ping_settled(ping), 20, f"the verification ping {ping} to be answered")
        return endpoint

    yield make
    for endpoint in made:
        dclient.post(f"/v1/webhook-endpoints/{endpoint.endpoint_id}:disable", headers=endpoint.tenant.headers)


def deliveries(client: httpx.Client, tenant: TenantHandle, job_id: uuid.UUID) -> list[dict[str, Any]]:
    response = client.get("/v1/deliveries", params={"job_id": str(job_id)}, headers=tenant.headers)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["deliveries"]
    return found


def settled(
    client: httpx.Client, tenant: TenantHandle, job_id: uuid.UUID, timeout: float = 20.0
) -> dict[str, Any]:
    """The job's single delivery once it has left pending/delivering."""

    def check() -> dict[str, Any] | None:
        found = deliveries(client, tenant, job_id)
        if len(found) == 1 and found[0]["state"] not in ("pending", "delivering"):
            return found[0]
        return None

    result: dict[str, Any] = wait_for(check, timeout, f"the delivery of job {job_id} to settle")
    return result


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A webhook receiver inside the test process that keeps every raw request and answers 200."""

    def __init__(self) -> None:
        received: list[Received] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                payload = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def count_extraction_work(pool: SyncPool, job_id: uuid.UUID) -> tuple[int, int]:
    """(job_attempts rows, extraction.requested events) of a job: a delivery problem must add none."""
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM job_attempts WHERE job_id = %(j)s) AS attempts,
                      (SELECT count(*) FROM outbox_events
                       WHERE job_id = %(j)s AND event_type = 'extraction.requested.v1') AS requested""",
            {"j": job_id},
        ).fetchone()
    assert row is not None
    return int(row["attempts"]), int(row["requested"])


ROOT = Path(__file__).resolve().parents[2]
