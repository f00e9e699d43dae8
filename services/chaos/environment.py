"""One scenario's private stack: a database, a RabbitMQ queue prefix, Redis key prefixes and ports
of its own, fault proxies in front of PostgreSQL, RabbitMQ and Redis, and the supervised processes
of ``services.cli.stack`` pointed at those proxies. ``close`` removes all of it.

The processes reach the dependencies only through the proxies; the runner's own checks use the
real ports, so a cut never blinds the observer.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pika
import psycopg
import redis
from pika.exceptions import AMQPError
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fatura_sdk import generate_secret
from services.acceptance.tenants import TenantSpec, create_tenant, import_suppliers, parse_suppliers
from services.chaos.proxy import FaultProxy, ProxyThread
from services.chaos.settings import ChaosSettings
from services.cli.stack import ChildSpec, RestartPolicy, Stack
from services.common import events
from services.common.db import sync_pool
from services.common.keyring import DEVELOPMENT_KEY
from services.common.migrate import migrate
from services.common.procs import free_port
from services.common.settings import CommonSettings
from services.delivery.endpoints import register_endpoint
from services.delivery.settings import DeliverySettings
from services.sandbox.samples import SUPPLIERS_CSV, Sample, load_samples

log = logging.getLogger(__name__)

# Timers short enough that leases expire, retries come due and deliveries are retried within
# seconds (like FAST_TIMERS of the test suite), so recovery is measured in seconds, not hours.
CHAOS_TIMERS = {
    "FATURA_LEASE_SECONDS": "3",
    "FATURA_HEARTBEAT_SECONDS": "0.5",
    "FATURA_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "FATURA_RETRY_BASE_SECONDS": "0.2",
    "FATURA_RETRY_CAP_SECONDS": "2",
    "FATURA_ATTEMPT_DEADLINE_SECONDS": "10",
    "FATURA_DEADLINE_MARGIN_SECONDS": "0",
    # A fault may cost a job attempts (a killed worker's, a 429's): the budget is not what is tested.
    "FATURA_MAX_ATTEMPTS": "10",
    "FATURA_SLOT_WAIT_SECONDS": "2",
    "FATURA_INFERENCE_CONCURRENCY": "4",
    "FATURA_PROVIDER_BREAKER_COOLDOWN_SECONDS": "1",
    "FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS": "8",
    "FATURA_RELAY_CLAIM_TIMEOUT_SECONDS": "2",
    "FATURA_DELIVERY_RETRY_SCALE": "0.002",
    "FATURA_DELIVERY_LEASE_SECONDS": "4",
    "FATURA_DELIVERY_TOTAL_TIMEOUT_SECONDS": "3",
    "FATURA_DELIVERY_CONNECT_TIMEOUT_SECONDS": "1",
    "FATURA_DELIVERY_READ_TIMEOUT_SECONDS": "2",
    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.5",
    "FATURA_DELIVERY_REWAKE_SECONDS": "2",
    "FATURA_DELIVERY_BREAKER_COOLDOWN_SECONDS": "1",
    "FATURA_REDELIVERY_MIN_MS": "200",
    "FATURA_REDELIVERY_MAX_MS": "3000",
    "FATURA_RECONCILE_GRACE_SECONDS": "5",
}
RESTARTS = RestartPolicy(base_seconds=0.5, cap_seconds=4.0, reset_after_seconds=10.0)
LOCAL_EGRESS = "127.0.0.1/32,::1/128"
TERMINAL = frozenset({"SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL", "CANCELLED"})


@dataclass(frozen=True)
class Accepted:
    """A job the edge answered 202 for, and the state its sample is built to end in."""

    job_id: str
    sample: str
    expect: str


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


def _host_port(url: str, default: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default


class ChaosStack:
    """Everything one scenario runs on; a context manager that leaves nothing behind."""

    def __init__(self, settings: ChaosSettings, label: str, log_path: Path, proxies: ProxyThread) -> None:
        self.settings = settings
        self.label = label
        token = uuid.uuid4().hex[:10]
        real = settings.common
        self.database = f"fatura_chaos_{token}"
        self.database_url = make_conninfo(real.database_url, dbname=self.database)  # real port
        self.amqp_url, self.redis_url = real.amqp_url, real.redis_url
        self.prefix = f"chaos-{token}"
        self.key_prefix = f"fatura:chaos:{token}"
        pg = conninfo_to_dict(real.database_url)
        self.proxies = {
            "postgresql": FaultProxy(
                "postgresql", str(pg.get("host") or "127.0.0.1"), int(pg.get("port") or 5432), thread=proxies
            ),
            "rabbitmq": FaultProxy("rabbitmq", *_host_port(real.amqp_url, 5672), thread=proxies),
            "redis": FaultProxy("redis", *_host_port(real.redis_url, 6379), thread=proxies),
        }
        self.ports = {
            name: free_port()
            for name in (
                "erp",
                "provider",
                "limiter",
                "limiter_metrics",
                "http",
                "http_metrics",
                "relay",
                "scheduler",
                "delivery_worker",
                "delivery_scheduler",
            )
        }
        self.worker_ports = [free_port() for _ in range(settings.inference_workers)]
        self.erp_url = f"http://127.0.0.1:{self.ports['erp']}"
        self.provider_url = f"http://127.0.0.1:{self.ports['provider']}"
        self.edge_url = f"http://127.0.0.1:{self.ports['http']}"
        self._tmp = Path(tempfile.mkdtemp(prefix=f"fatura-chaos-{token}-"))
        self.secret = generate_secret()
        self.log_path = log_path
        self._log: IO[str] | None = None
        self.stack: Stack | None = None
        self.tenant_id: uuid.UUID | None = None
        self.api_key = ""
        self._doomed = 0

    # ------------------------------------------------------------ start

    def start(self) -> list[str]:
        """Create the database, start the proxies and the processes; returns the keys not ready."""
        migrate(self.database_url)
        for proxy in self.proxies.values():
            proxy.start()
        limiter_config = self._tmp / "limiter.toml"
        limiter_config.write_text(
            f"[pools.sandbox]\nrpm = 1000000\ntpm = 10000000000\n"
            f"max_in_flight = {self.settings.pool_max_in_flight}\n\n"
            "[tenant_defaults]\nmax_in_flight = 1000\n",
            encoding="utf-8",
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w", encoding="utf-8")
        self.stack = Stack(
            children=self._children(), env=self._env(limiter_config), log=self._log, policy=RESTARTS
        )
        self.stack.start()
        return self.stack.wait_ready(timeout=self.settings.start_seconds)

    def _env(self, limiter_config: Path) -> dict[str, str]:
        pg = self.proxies["postgresql"].port
        p = self.ports
        return {
            **CHAOS_TIMERS,
            "FATURA_DATABASE_URL": make_conninfo(self.database_url, host="127.0.0.1", port=str(pg)),
            "FATURA_AMQP_URL": _with_port(self.amqp_url, self.proxies["rabbitmq"].port),
            "FATURA_REDIS_URL": _with_port(self.redis_url, self.proxies["redis"].port),
            "FATURA_QUEUE_PREFIX": self.prefix,
            "FATURA_LOG_LEVEL": "INFO",
            "FATURA_FAULTS": "",
            "FATURA_EGRESS_ALLOW": LOCAL_EGRESS,
            "FATURA_SECRETS_KEY": DEVELOPMENT_KEY,
            "FATURA_ERP_PORT": str(p["erp"]),
            "FATURA_ERP_DB": str(self._tmp / "erp.sqlite"),
            "FATURA_ERP_SECRETS": self.secret,
            "FATURA_SANDBOX_PROVIDER_PORT": str(p["provider"]),
            "FATURA_SANDBOX_PROVIDER_LATENCY_MS": str(self.settings.provider_latency_ms),
            "FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION": "lognormal",
            "FATURA_SANDBOX_PROVIDER_API_KEY": "",
            "FATURA_LIMITER_PORT": str(p["limiter"]),
            "FATURA_LIMITER_METRICS_PORT": str(p["limiter_metrics"]),
            "FATURA_LIMITER_CONFIG": str(limiter_config),
            "FATURA_LIMITER_KEY_PREFIX": f"{self.key_prefix}:limiter",
            "FATURA_LIMITER_ADDRESS": f"127.0.0.1:{p['limiter']}",
            "FATURA_PROVIDER_BASE_URL": f"{self.provider_url}/v1",
            "FATURA_PROVIDER_BREAKER_PREFIX": f"{self.key_prefix}:breaker",
            "FATURA_HTTP_PORT": str(p["http"]),
            "FATURA_HTTP_METRICS_PORT": str(p["http_metrics"]),
            "FATURA_HTTP_WORKERS": "1",
            "FATURA_RELAY_METRICS_PORT": str(p["relay"]),
            "FATURA_SCHEDULER_METRICS_PORT": str(p["scheduler"]),
            "FATURA_DELIVERY_WORKER_METRICS_PORT": str(p["delivery_worker"]),
            "FATURA_DELIVERY_SCHEDULER_METRICS_PORT": str(p["delivery_scheduler"]),
            "PYTHONUNBUFFERED": "1",
        }

    def _children(self) -> list[ChildSpec]:
        p = self.ports

        def ready(port: int) -> str:
            return f"http://127.0.0.1:{port}/readyz"

        children = [
            ChildSpec("erp", "erp", ready_url=ready(p["erp"])),
            ChildSpec("provider", "provider", ready_url=ready(p["provider"])),
            ChildSpec("limiter", "limiter", ready_url=ready(p["limiter_metrics"])),
            ChildSpec("http", "http", ready_url=ready(p["http"])),
            ChildSpec("relay", "relay", ready_url=ready(p["relay"])),
        ]
        for index, port in enumerate(self.worker_ports, start=1):
            env = {"FATURA_INFERENCE_METRICS_PORT": str(port), "FATURA_WORKER_ID": f"{self.prefix}-w{index}"}
            children.append(ChildSpec(f"inference-worker-{index}", "inference-worker", env, ready(port)))
        children += [
            ChildSpec("inference-scheduler", "inference-scheduler", ready_url=ready(p["scheduler"])),
            ChildSpec("delivery-worker", "delivery-worker", ready_url=ready(p["delivery_worker"])),
            ChildSpec("delivery-scheduler", "delivery-scheduler", ready_url=ready(p["delivery_scheduler"])),
        ]
        return children

    def add_doomed(self, process: str, fault: str) -> str:
        """One more ``process`` with the fault point ``fault`` set, not restarted when it dies;
        returns its key once it is ready (or has already died)."""
        assert self.stack is not None
        self._doomed += 1
        key = f"{process}-doomed-{self._doomed}"
        port = free_port()
        metrics = {
            "relay": "FATURA_RELAY_METRICS_PORT",
            "inference-worker": "FATURA_INFERENCE_METRICS_PORT",
            "delivery-worker": "FATURA_DELIVERY_WORKER_METRICS_PORT",
        }[process]
        env = {
            "FATURA_FAULTS": fault,
            metrics: str(port),
            "FATURA_WORKER_ID": f"{self.prefix}-{key}",
            "FATURA_RELAY_ID": f"{self.prefix}-{key}",
        }
        self.stack.add(ChildSpec(key, process, env, f"http://127.0.0.1:{port}/readyz", supervised=False))
        return key

    # ------------------------------------------------------------ the tenant and its jobs

    def setup_tenant(self) -> None:
        """A tenant with the sample suppliers as master data, and a webhook endpoint at this stack's
        reference ERP (which already knows the secret, so the ping verifies at once)."""
        spec = TenantSpec(
            name=f"chaos-{self.label}"[:200],
            max_in_flight=1000,
            max_pending_jobs=10**6,
            max_pending_bytes=10**12,
            max_pending_tokens=10**13,
            daily_token_budget=10**13,
        )
        with sync_pool(CommonSettings(database_url=self.database_url), name="chaos", max_size=1) as pool:
            self.tenant_id, self.api_key = create_tenant(pool, spec)
            import_suppliers(pool, self.tenant_id, parse_suppliers(SUPPLIERS_CSV))
        delivery = DeliverySettings.from_env(
            {
                "FATURA_DATABASE_URL": self.database_url,
                "FATURA_EGRESS_ALLOW": LOCAL_EGRESS,
                "FATURA_SECRETS_KEY": DEVELOPMENT_KEY,
            }
        )
        register_endpoint(self.tenant_id, f"{self.erp_url}/webhooks", settings=delivery, secret=self.secret)

    def submit(self, count: int) -> tuple[list[Accepted], list[str]]:
        """``count`` sample invoices over HTTP, cycling through the samples; returns the accepted
        jobs and one line per submission that was not accepted."""
        samples = load_samples()
        headers = {"Authorization": f"Bearer {self.api_key}"}

        def one(index: int) -> Accepted | str:
            sample: Sample = samples[index % len(samples)]
            body = {
                "document": {"text": sample.text, "filename": sample.filename},
                "priority": "interactive" if index % 4 == 0 else "batch",
            }
            try:
                response = httpx.post(
                    f"{self.edge_url}/v1/extraction-jobs",
                    json=body,
                    headers={**headers, "Idempotency-Key": f"{self.prefix}-{index}"},
                    timeout=30.0,
                )
            except httpx.HTTPError as exc:
                return f"{sample.filename}: {type(exc).__name__}: {exc}"
            if response.status_code != 202:
                return f"{sample.filename}: HTTP {response.status_code} {response.text[:200]}"
            return Accepted(str(response.json()["job_id"]), sample.filename, sample.expect)

        with ThreadPoolExecutor(4) as threads:
            results = list(threads.map(one, range(count)))
        return [r for r in results if isinstance(r, Accepted)], [r for r in results if isinstance(r, str)]

    # ------------------------------------------------------------ the sandbox's admin endpoints

    def provider_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.provider_url}/admin/stats", timeout=5.0).json()
        return stats

    def provider_fault(self, mode: str | None, **params: object) -> None:
        if mode is None:
            httpx.delete(f"{self.provider_url}/admin/faults", timeout=5.0).raise_for_status()
        else:
            body = {"mode": mode, **params}
            httpx.post(f"{self.provider_url}/admin/faults", json=body, timeout=5.0).raise_for_status()

    def limiter_grants(self) -> int:
        """Permits the limiter has granted so far (its ``fatura_limiter_grants_total``, every pool)."""
        text = httpx.get(f"http://127.0.0.1:{self.ports['limiter_metrics']}/metrics", timeout=5.0).text
        return int(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "fatura_limiter_grants_total"
            )
        )

    def erp_fault(self, mode: str | None) -> None:
        if mode is None:
            httpx.delete(f"{self.erp_url}/admin/faults", timeout=5.0).raise_for_status()
        else:
            httpx.post(f"{self.erp_url}/admin/faults", json={"mode": mode}, timeout=5.0).raise_for_status()

    def erp_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.erp_url}/admin/stats", timeout=5.0).json()
        return stats

    def ledger(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = httpx.get(f"{self.erp_url}/ledger", timeout=10.0).json()["jobs"]
        return jobs

    # ------------------------------------------------------------ RabbitMQ's own view

    def close_broker_connections(self) -> int:
        """Close, on the RabbitMQ server itself, every connection this stack has open, and no one
        else's: they are picked by their server-side peer port, which is one of the proxy's upstream
        sockets. Returns how many were closed."""
        ours = sorted(self.proxies["rabbitmq"].upstream_ports())
        if not ours:
            return 0
        ctl = self.settings.rabbitmqctl
        # One call that picks and closes them inside the server: a rabbitmqctl per connection costs
        # a quarter of a second of CPU each, and the fault would be spread over many seconds.
        code = (
            f"Ports = {ours}, "
            "Ours = [P || P <- rabbit_networking:connections(), (catch lists:member(proplists:get_value("
            "peer_port, rabbit_networking:connection_info(P, [peer_port])), Ports)) =:= true], "
            '[catch rabbit_networking:close_connection(P, "fatura chaos run") || P <- Ours], '
            "length(Ours)."
        )
        try:
            return int(_rabbitmqctl(ctl, "eval", code).strip())
        except (subprocess.SubprocessError, ValueError) as exc:
            log.warning("rabbitmqctl eval failed (%s); closing the connections one by one", exc)
        # Tab-separated, not JSON: close_connection takes the pid as the plain listing prints it.
        listed = _rabbitmqctl(ctl, "list_connections", "pid", "peer_port", "--no-table-headers")
        closed = 0
        for line in listed.splitlines():
            pid, _, peer_port = line.partition("\t")
            if peer_port.strip().isdigit() and int(peer_port) in ours:
                _rabbitmqctl(ctl, "close_connection", pid.strip(), "fatura chaos run")
                closed += 1
        return closed

    def dead_letter_queue_messages(self) -> int:
        """Messages waiting in this stack's dead-letter queues (``<queue>.XQ``) on the server."""
        ctl = self.settings.rabbitmqctl
        listed = _rabbitmqctl(ctl, "list_queues", "name", "messages", "--no-table-headers")
        total = 0
        for line in listed.splitlines():
            name, _, messages = line.partition("\t")
            if name.startswith(f"{self.prefix}.") and name.endswith(".XQ") and messages.strip().isdigit():
                total += int(messages)
        return total

    # ------------------------------------------------------------ the end

    def close(self) -> list[str]:
        """Stop the processes (by pid), the proxies; drop the database, delete the queues and the Redis
        keys. Returns one line per thing that could not be removed."""
        problems: list[str] = []
        if self.stack is not None:
            self.stack.stop()
        for proxy in self.proxies.values():
            proxy.close()
        if self._log is not None:
            self._log.close()
        for step in (self._drop_database, self._delete_queues, self._delete_keys):
            try:
                step()
            except (psycopg.Error, AMQPError, redis.RedisError, OSError, subprocess.SubprocessError) as exc:
                problems.append(f"{step.__name__.strip('_')}: {exc}")
        shutil.rmtree(self._tmp, ignore_errors=True)
        return problems

    def _drop_database(self) -> None:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database))
        with psycopg.connect(make_conninfo(self.database_url, dbname="postgres"), autocommit=True) as conn:
            conn.execute(drop)

    def _delete_queues(self) -> None:
        known = set(events.all_queues(self.prefix))
        names = {name + suffix for name in known for suffix in ("", ".DQ", ".XQ")}
        try:
            listed = _rabbitmqctl(self.settings.rabbitmqctl, "list_queues", "name", "--no-table-headers")
            names |= {line.strip() for line in listed.splitlines() if line.startswith(f"{self.prefix}.")}
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            log.warning("rabbitmqctl list_queues failed (%s); deleting the known queue names only", exc)
        connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
        try:
            channel = connection.channel()
            for name in sorted(names):
                channel.queue_delete(name)
        finally:
            connection.close()

    def _delete_keys(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            for key in client.scan_iter(f"{self.key_prefix}:*", count=1000):
                client.delete(key)
        finally:
            client.close()


def _rabbitmqctl(command: str, *args: str) -> str:
    done = subprocess.run([command, "-q", *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"{command} {args[0]}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def wait_until(condition: object, timeout: float, step: float = 0.25) -> bool:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())
