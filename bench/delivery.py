"""``fatura bench delivery``: webhook deliveries/s to the local reference ERP through the real delivery
worker (claim under a fence, sign, POST through the egress guard, record the attempt), beside raw
httpx POSTs of the same bodies, signed in advance, to the same receiver from as many threads, in the
same run.

The bench recreates its own database, starts the ERP (`fatura sandbox erp`, its own SQLite file) and
registers one endpoint. It inserts N pending deliveries and queues one ``deliver`` wake-up for each
before the worker starts, so the rate counts only sending: (N - 1) / (last delivered_at - first).
Then the raw phase POSTs the same bodies with fresh webhook-ids (the ERP verifies and stores each).
Numbers and a chart go to ``out/``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pika
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.broker import make_broker
from services.common.db import sync_pool
from services.common.keyring import DEVELOPMENT_KEY, Keyring
from services.common.migrate import migrate
from services.common.settings import CommonSettings
from services.delivery import payload, signing
from services.delivery.endpoints import register_endpoint
from services.delivery.settings import DeliverySettings
from services.delivery.worker import deliver_message

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 0.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deliveries", type=int, default=2000, help="deliveries per phase (default 2000)")
    p.add_argument("--threads", type=int, default=8, help="threads per worker = raw POST threads (default 8)")
    p.add_argument("--workers", type=int, default=1, help="delivery worker processes (default 1)")
    p.add_argument("--database", default="fatura_bench_delivery", help="the bench's own database (recreated)")
    p.add_argument("--out", type=Path, default=Path("out") / "bench-delivery.png", help="chart path")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recreate(base_url: str, name: str) -> str:
    url = make_conninfo(base_url, dbname=name)
    admin = make_conninfo(base_url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(url)
    return url


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url}: the process exited; see {log}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} was not ready within {timeout}s; see {log}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def _bodies(tenant_id: uuid.UUID, n: int) -> list[tuple[uuid.UUID, bytes]]:
    from datetime import UTC, datetime

    result = {"invoice_number": "AK-2026-000184", "currency": "TRY", "total": "5400.00", "lines": 1}
    out = []
    for _ in range(n):
        event_id, job_id = uuid.uuid4(), uuid.uuid4()
        body = payload.event_body(
            event_id=event_id,
            event_type="extraction.completed.v1",
            tenant_id=tenant_id,
            job_id=job_id,
            state="SUCCEEDED",
            state_version=3,
            occurred_at=datetime.now(UTC),
            job={"state_version": 3, "result": result, "policy_version": "invoice-policy.v1"},
        )
        out.append((event_id, body))
    return out


def _progress(label: str, done: Any, total: int, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        print(f"\r  {label}: {done()}/{total}", end="", file=sys.stderr, flush=True)
    print(f"\r  {label}: {done()}/{total}", file=sys.stderr, flush=True)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _delivered(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM deliveries WHERE state = 'delivered'").fetchone()
    return int(row[0]) if row else 0


def _raw_phase(url: str, secret: str, bodies: list[bytes], threads: int) -> tuple[float, list[float], int]:
    now = int(time.time())
    signed = [(signing.headers([secret], f"raw_{uuid.uuid4().hex}", now, b), b) for b in bodies]
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    cursor = iter(signed)

    def run() -> None:
        nonlocal errors
        with httpx.Client(timeout=10.0) as client:
            while True:
                with lock:
                    item = next(cursor, None)
                if item is None:
                    return
                t0 = time.perf_counter()
                response = client.post(url, content=item[1], headers=item[0])
                with lock:
                    latencies.append((time.perf_counter() - t0) * 1000)
                    errors += not 200 <= response.status_code < 300

    started = time.perf_counter()
    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    stop = threading.Event()
    threading.Thread(target=_progress, args=("raw POSTs", lambda: len(latencies), len(bodies), stop)).start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    stop.set()
    return len(bodies) / elapsed, latencies, errors


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _chart(path: Path, figures: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, lat) = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["delivery worker\n(claim, sign, POST, record)", "raw httpx POST\n(pre-signed)"]
    values = [figures["delivery_per_s"], figures["raw_per_s"]]
    rates.bar(names, values, color=["#3b7dd8", "#999999"])
    rates.set_ylabel("deliveries / s")
    rates.set_title(f"ratio {figures['ratio']:.0%} (goal ≥ {GOAL_RATIO:.0%})")
    for x, v in enumerate(values):
        rates.text(x, v, f"{v:,.0f}", ha="center", va="bottom")
    xs = [0, 1]
    worker_ms = [figures["delivery_post_p50_ms"], figures["delivery_post_p99_ms"]]
    raw_ms = [figures["raw_p50_ms"], figures["raw_p99_ms"]]
    lat.bar([x - 0.2 for x in xs], worker_ms, width=0.4, color="#3b7dd8", label="worker's POST")
    lat.bar([x + 0.2 for x in xs], raw_ms, width=0.4, color="#999999", label="raw POST")
    lat.set_xticks(xs, ["p50", "p99"])
    lat.set_ylabel("ms")
    lat.set_title("POST latency")
    lat.legend()
    fig.suptitle(
        f"fatura bench delivery: {figures['deliveries']} deliveries, "
        f"{figures['workers']} worker(s) x {figures['threads']} threads"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    common = CommonSettings.from_env()
    base = common.database_url
    if conninfo_to_dict(base).get("dbname") == args.database:
        raise SystemExit("--database must differ from FATURA_DATABASE_URL's database")
    database_url = _recreate(base, args.database)
    prefix = f"bench-delivery-{uuid.uuid4().hex[:6]}"
    env = {
        "FATURA_DATABASE_URL": database_url,
        "FATURA_QUEUE_PREFIX": prefix,
        "FATURA_LOG_LEVEL": "WARNING",
        "FATURA_SECRETS_KEY": DEVELOPMENT_KEY,
    }
    logs = Path("out") / "bench-delivery-logs"
    logs.mkdir(parents=True, exist_ok=True)
    secret = signing.new_secret()
    erp_port = free_port()
    erp_db = logs / f"erp-{prefix}.sqlite"
    erp = _spawn(
        ["sandbox", "erp"],
        {
            **env,
            "FATURA_ERP_PORT": str(erp_port),
            "FATURA_ERP_DB": str(erp_db.resolve()),
            "FATURA_ERP_SECRETS": secret,
        },
        logs / "erp.log",
    )
    workers: list[subprocess.Popen[bytes]] = []
    bench_common = CommonSettings(database_url=database_url, queue_prefix=prefix)
    try:
        erp_url = f"http://127.0.0.1:{erp_port}"
        _wait_ready(f"{erp_url}/readyz", erp, logs / "erp.log")
        with sync_pool(bench_common, name="bench", max_size=2) as pool:
            tenant_id, _key = create_tenant(pool, TenantSpec(name="bench-delivery"))
        settings = DeliverySettings(
            common=bench_common,
            egress_allow=(ipaddress.ip_network("127.0.0.0/8"),),
            keyring=Keyring.from_env({"FATURA_SECRETS_KEY": DEVELOPMENT_KEY}),
        )
        endpoint = register_endpoint(tenant_id, f"{erp_url}/webhooks", settings=settings, secret=secret)
        endpoint_id = uuid.UUID(endpoint["endpoint_id"])
        n = args.deliveries
        events = _bodies(tenant_id, n)
        print(f"inserting {n} deliveries and queueing their wake-ups ...", file=sys.stderr)
        with psycopg.connect(database_url) as conn, conn.cursor() as cur:
            conn.execute(
                "UPDATE webhook_endpoints SET max_concurrency = %s WHERE id = %s",
                (args.threads * args.workers, endpoint_id),
            )
            cur.executemany(
                """INSERT INTO deliveries
                       (delivery_id, event_id, event_type, endpoint_id, tenant_id, body, woken_at)
                   VALUES (%s, %s, 'extraction.completed.v1', %s, %s, %s, now())""",
                [(signing.delivery_id(e, endpoint_id), e, endpoint_id, tenant_id, b) for e, b in events],
            )
        broker = make_broker(bench_common)
        for event_id, _ in events:
            broker.enqueue(deliver_message(prefix, signing.delivery_id(event_id, endpoint_id)))
        broker.close()
        # The scheduler wakes what the concurrency cap postponed (it should be rare here).
        workers.append(
            _spawn(
                ["run", "delivery-scheduler"],
                {
                    **env,
                    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.2",
                    "FATURA_DELIVERY_SCHEDULER_METRICS_PORT": str(free_port()),
                },
                logs / "scheduler.log",
            )
        )
        for number in range(args.workers):
            workers.append(
                _spawn(
                    ["run", "delivery-worker"],
                    {
                        **env,
                        "FATURA_EGRESS_ALLOW": "127.0.0.0/8",
                        "FATURA_DELIVERY_WORKER_THREADS": str(args.threads),
                        "FATURA_DELIVERY_WORKER_METRICS_PORT": str(free_port()),
                    },
                    logs / f"worker-{number}.log",
                )
            )
        erp_cpu_before = _cpu_s(erp.pid)
        stop = threading.Event()
        threading.Thread(
            target=_progress, args=("deliveries", lambda: _delivered(database_url), n, stop)
        ).start()
        deadline = time.monotonic() + 600
        while _delivered(database_url) < n and time.monotonic() < deadline:
            if any(w.poll() is not None for w in workers):
                raise SystemExit(f"a delivery worker exited; see {logs}/worker-*.log")
            time.sleep(0.2)
        stop.set()
        worker_cpu = sum(_cpu_s(w.pid) for w in workers[1:])
        erp_cpu_delivery = _cpu_s(erp.pid) - erp_cpu_before
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                """SELECT count(*) AS n, extract(epoch FROM max(delivered_at) - min(delivered_at)) AS span,
                          (SELECT count(*) FROM delivery_attempts) AS attempts
                   FROM deliveries WHERE state = 'delivered'"""
            ).fetchone()
            posts = [float(r[0]) for r in conn.execute("SELECT latency_ms FROM delivery_attempts")]
        assert row is not None
        delivered, span, attempts = int(row[0]), float(row[1] or 0), int(row[2])
        delivery_rate = (delivered - 1) / span if span > 0 else float("nan")
        erp_cpu_before = _cpu_s(erp.pid)
        bench_cpu_before = time.process_time()
        raw_rate, raw_ms, raw_errors = _raw_phase(
            f"{erp_url}/webhooks", secret, [b for _, b in events], args.threads
        )
        erp_cpu_raw = _cpu_s(erp.pid) - erp_cpu_before
        raw_client_cpu = time.process_time() - bench_cpu_before
        ledger = httpx.get(f"{erp_url}/admin/stats").json()["counts"]
    finally:
        for w in workers:
            _stop(w)
        _stop(erp)
        _delete_queues(common.amqp_url, prefix)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{erp_db}{suffix}").unlink(missing_ok=True)
    figures = {
        "deliveries": n,
        "threads": args.threads,
        "workers": args.workers,
        "delivered": delivered,
        "attempts": attempts,
        "delivery_per_s": delivery_rate,
        "delivery_post_p50_ms": _pct(posts, 0.5),
        "delivery_post_p99_ms": _pct(posts, 0.99),
        "raw_per_s": raw_rate,
        "raw_p50_ms": _pct(raw_ms, 0.5),
        "raw_p99_ms": _pct(raw_ms, 0.99),
        "raw_errors": raw_errors,
        "ratio": delivery_rate / raw_rate,
        # CPU per delivery; the worker's includes its start-up (imports, connections).
        "worker_cpu_ms_per_delivery": worker_cpu * 1000 / n,
        "erp_cpu_ms_per_delivery": erp_cpu_delivery * 1000 / n,
        "erp_cpu_ms_per_raw_post": erp_cpu_raw * 1000 / n,
        # The raw client's CPU (this process, signing excluded: done before the clock starts).
        "raw_client_cpu_ms_per_post": raw_client_cpu * 1000 / n,
        "load_average_1m": os.getloadavg()[0],
        "erp_counts": ledger,
    }
    print(
        f"delivery worker x{args.workers}: {delivered}/{n} delivered in {attempts} attempts, "
        f"{delivery_rate:,.0f} deliveries/s "
        f"(POST p50 {figures['delivery_post_p50_ms']:.1f} ms, p99 {figures['delivery_post_p99_ms']:.1f} ms)\n"
        f"raw httpx POST:  {raw_rate:,.0f} POSTs/s (p50 {figures['raw_p50_ms']:.1f} ms, "
        f"p99 {figures['raw_p99_ms']:.1f} ms, {raw_errors} non-2xx)\n"
        f"CPU per delivery: worker {figures['worker_cpu_ms_per_delivery']:.1f} ms (with its start-up) "
        f"vs raw client {figures['raw_client_cpu_ms_per_post']:.1f} ms per POST, "
        f"ERP {figures['erp_cpu_ms_per_delivery']:.1f} ms "
        f"(raw phase: {figures['erp_cpu_ms_per_raw_post']:.1f} ms); "
        f"load average {figures['load_average_1m']:.1f} on {os.cpu_count()} cores\n"
        f"ratio: {figures['ratio']:.0%} of raw "
        f"(goal ≥ {GOAL_RATIO:.0%}: {'met' if figures['ratio'] >= GOAL_RATIO else 'NOT met'})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=2))
    _chart(args.out, figures)
    print(f"chart: {args.out}  numbers: {args.out.with_suffix('.json')}")
    return 0


def _delete_queues(amqp_url: str, prefix: str) -> None:
    try:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    except pika.exceptions.AMQPError:
        return
    channel = connection.channel()
    for suffix in ("", ".DQ", ".XQ"):
        channel.queue_delete(f"{prefix}.delivery.deliver{suffix}")
    connection.close()
