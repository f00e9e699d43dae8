"""``fatura bench delivery``: webhook deliveries/s to the local reference ERP through the real delivery
worker (claim under a fence, sign, POST through the egress guard, record the attempt), beside raw
httpx POSTs of the same bodies, signed in advance, to the same receiver from as many threads, in the
same run.

The bench recreates its own database, starts the ERP (`fatura run erp`, its own SQLite file) and
registers one endpoint. It inserts N pending deliveries and queues one ``deliver`` wake-up for each
before the worker starts, so the rate counts only sending: (N - 1) / (last delivered_at - first).
Then the raw phase POSTs the same bodies with fresh webhook-ids (the ERP verifies and stores each).
Numbers and a chart go to ``out/``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg

from bench import cpu, load, report
from bench.resources import add_database_argument
from bench.stack import Stack
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.broker import make_broker
from services.common.keyring import DEVELOPMENT_KEY, Keyring
from services.common.procs import free_port
from services.delivery import payload, signing
from services.delivery.endpoints import register_endpoint
from services.delivery.settings import DeliverySettings
from services.delivery.store import Wake
from services.delivery.worker import wakeup_messages

GOAL_RATIO = 0.5
DELIVERED = "SELECT count(*) FROM deliveries WHERE state = 'delivered' AND job_id IS NOT NULL"
SPAN = """SELECT count(*) AS n, extract(epoch FROM max(delivered_at) - min(delivered_at)) AS span,
                 (SELECT count(*) FROM delivery_attempts a JOIN deliveries d USING (delivery_id)
                  WHERE d.job_id IS NOT NULL) AS attempts
          FROM deliveries WHERE state = 'delivered' AND job_id IS NOT NULL"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deliveries", type=int, default=2000, help="deliveries per phase (default 2000)")
    p.add_argument("--threads", type=int, default=8, help="threads per worker = raw POST threads (default 8)")
    p.add_argument("--workers", type=int, default=1, help="delivery worker processes (default 1)")
    add_database_argument(p, "fatura_bench_delivery")
    report.add_out_argument(p, "bench-delivery.png")


def _bodies(tenant_id: uuid.UUID, n: int) -> list[tuple[uuid.UUID, uuid.UUID, bytes]]:
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
        out.append((event_id, job_id, body))
    return out


def _delivered(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(DELIVERED).fetchone()
    return int(row[0]) if row else 0


def _raw_phase(url: str, secret: str, bodies: list[bytes], threads: int) -> tuple[float, list[float], int]:
    """The ceiling: the same bodies, signed in advance, POSTed by ``threads`` threads until none is left."""
    now = int(time.time())
    signed = iter([(signing.headers([secret], f"raw_{uuid.uuid4().hex}", now, b), b) for b in bodies])
    lock, taken = threading.Lock(), [0]

    def post(client: httpx.Client) -> int:
        with lock:
            item = next(signed, None)
            taken[0] += 1
        if item is None:
            raise load.Exhausted
        return client.post(url, content=item[1], headers=item[0]).status_code

    with report.progress("raw POSTs", lambda: min(taken[0], len(bodies)), len(bodies)):
        calls = load.closed_loop(threads, lambda: httpx.Client(timeout=10.0), post)
    errors = sum(not 200 <= status < 300 for status in calls.values)
    return len(bodies) / calls.seconds, [1000 * s for s in calls.latencies()], errors


def _per_item(seconds: dict[str, float], items: int) -> dict[str, float]:
    return {name: round(1000 * used / items, 3) for name, used in seconds.items() if used > 0}


def _listed(ms: dict[str, float]) -> str:
    if not ms:
        return "not measured"
    parts = [f"{name} {value:.2f}" for name, value in sorted(ms.items(), key=lambda kv: -kv[1])]
    return f"{sum(ms.values()):.2f} in all ({', '.join(parts)})"


def _chart(figures: dict[str, Any]) -> Any:
    fig, (rates, lat) = report.pyplot().subplots(1, 2, figsize=(9, 3.6))
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
    return fig


def run(args: argparse.Namespace) -> int:
    n = args.deliveries
    report.header(
        "delivery",
        f"{n} deliveries by {args.workers} worker(s) x {args.threads} threads, then {args.threads} raw POST "
        "threads",
    )
    with Stack("delivery", args.database) as stack:
        secret = signing.new_secret()
        erp_port = free_port()
        erp_url = f"http://127.0.0.1:{erp_port}"
        erp_db = stack.log_dir / f"erp-{stack.prefix}.sqlite"
        try:
            erp = stack.spawn(
                "erp",
                f"{erp_url}/readyz",
                FATURA_ERP_PORT=str(erp_port),
                FATURA_ERP_DB=str(erp_db.resolve()),
                FATURA_ERP_SECRETS=secret,
            )
            tenant_id, _key = create_tenant(stack.pool, TenantSpec(name="bench-delivery"))
            settings = DeliverySettings(
                common=stack.common,
                egress_allow=(ipaddress.ip_network("127.0.0.0/8"),),
                keyring=Keyring.from_env({"FATURA_SECRETS_KEY": DEVELOPMENT_KEY}),
            )
            endpoint = register_endpoint(tenant_id, f"{erp_url}/webhooks", settings=settings, secret=secret)
            endpoint_id = uuid.UUID(endpoint["endpoint_id"])
            events = _bodies(tenant_id, n)
            print(f"inserting {n} deliveries and queueing their wake-ups ...", flush=True)
            with psycopg.connect(stack.database_url) as conn, conn.cursor() as cur:
                conn.execute(
                    "UPDATE webhook_endpoints SET max_concurrency = %s WHERE id = %s",
                    (args.threads * args.workers, endpoint_id),
                )
                cur.executemany(
                    """INSERT INTO deliveries
                           (delivery_id, event_id, event_type, endpoint_id, tenant_id, job_id, body, woken_at)
                       VALUES (%s, %s, 'extraction.completed.v1', %s, %s, %s, %s, now())""",
                    [
                        (signing.delivery_id(e, endpoint_id), e, endpoint_id, tenant_id, j, b)
                        for e, j, b in events
                    ],
                )
            broker = make_broker(stack.common)
            # As the ingest and the scheduler send them: one endpoint's deliveries share wake-ups,
            # as many to one as a sender's batch takes.
            woken = [Wake(signing.delivery_id(e, endpoint_id), endpoint_id) for e, _, _ in events]
            wakeups = wakeup_messages(stack.prefix, woken, settings.batch_size)
            for start in range(0, len(wakeups), 256):
                if not all(broker.publish_all(wakeups[start : start + 256])):
                    raise SystemExit("RabbitMQ did not take every wake-up; see its log")
            broker.close()
            erp_cpu_before = cpu.process_seconds(erp.pid)
            # The scheduler wakes what the concurrency cap postponed (it should be rare here). All start
            # at once, so the workers begin together; the rate counts from the first delivery.
            key = {"FATURA_SECRETS_KEY": DEVELOPMENT_KEY}
            scheduler = stack.start_metered(
                "delivery-scheduler",
                "FATURA_DELIVERY_SCHEDULER_METRICS_PORT",
                FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS="0.2",
                **key,
            )
            workers = [
                stack.start_metered(
                    "delivery-worker",
                    "FATURA_DELIVERY_WORKER_METRICS_PORT",
                    FATURA_EGRESS_ALLOW="127.0.0.0/8",
                    FATURA_DELIVERY_WORKER_THREADS=str(args.threads),
                    **key,
                )
                for _ in range(args.workers)
            ]
            for proc in (scheduler, *workers):
                proc.wait_ready()
            deadline = time.monotonic() + 600
            # The workers' CPU from the first delivery seen to the last: sending, without start-up.
            steady: tuple[int, float] | None = None
            machine_before: cpu.CpuSample | None = None  # every process's CPU, from the same moment
            with report.progress("deliveries", lambda: _delivered(stack.database_url), n):
                while (done := _delivered(stack.database_url)) < n and time.monotonic() < deadline:
                    if not all(w.alive() for w in workers):
                        raise SystemExit(f"a delivery worker exited; see {stack.log_dir}")
                    if steady is None and done > 0:
                        steady = (done, sum(cpu.process_seconds(w.pid) for w in workers))
                        machine_before = cpu.sample()
                    time.sleep(0.2)
            machine_after = cpu.sample()
            worker_cpu = sum(cpu.process_seconds(w.pid) for w in workers)
            steady_ms = (
                (worker_cpu - steady[1]) * 1000 / (n - steady[0])
                if steady is not None and n > steady[0]
                else float("nan")
            )
            erp_cpu_delivery = cpu.process_seconds(erp.pid) - erp_cpu_before
            with psycopg.connect(stack.database_url) as conn:
                row = conn.execute(SPAN).fetchone()
                posts = [float(r[0]) for r in conn.execute("SELECT latency_ms FROM delivery_attempts")]
            assert row is not None
            delivered, span, attempts = int(row[0]), float(row[1] or 0), int(row[2])
            delivery_rate = (delivered - 1) / span if span > 0 else float("nan")
            erp_cpu_before = cpu.process_seconds(erp.pid)
            bench_cpu_before = time.process_time()
            raw_before = cpu.sample()
            raw_rate, raw_ms, raw_errors = _raw_phase(
                f"{erp_url}/webhooks", secret, [b for _, _, b in events], args.threads
            )
            raw_after = cpu.sample()
            erp_cpu_raw = cpu.process_seconds(erp.pid) - erp_cpu_before
            raw_client_cpu = time.process_time() - bench_cpu_before
            # Every process's share, per delivery and per raw POST: what the two phases cost the
            # machine, beyond the worker's and the raw client's own CPU.
            sent = n - steady[0] if steady is not None else 0
            delivery_split = (
                _per_item(stack.cpu_seconds(machine_before, machine_after), sent)
                if machine_before is not None and sent > 0
                else {}
            )
            raw_split = _per_item(stack.cpu_seconds(raw_before, raw_after), n)
            ledger = httpx.get(f"{erp_url}/admin/stats").json()["counts"]
        finally:
            stack.stop_all()
            for suffix in ("", "-wal", "-shm"):
                erp_db.with_name(erp_db.name + suffix).unlink(missing_ok=True)
    figures = {
        "deliveries": n,
        "threads": args.threads,
        "workers": args.workers,
        "delivered": delivered,
        "attempts": attempts,
        "delivery_per_s": delivery_rate,
        "delivery_post_p50_ms": report.percentile(posts, 0.5),
        "delivery_post_p99_ms": report.percentile(posts, 0.99),
        "raw_per_s": raw_rate,
        "raw_p50_ms": report.percentile(raw_ms, 0.5),
        "raw_p99_ms": report.percentile(raw_ms, 0.99),
        "raw_errors": raw_errors,
        "ratio": delivery_rate / raw_rate,
        # CPU per delivery; the worker's includes its start-up (imports, connections).
        "worker_cpu_ms_per_delivery": worker_cpu * 1000 / n,
        # From the first delivery seen to the last (the start-up left out): the steadier figure.
        "worker_steady_cpu_ms_per_delivery": steady_ms,
        "erp_cpu_ms_per_delivery": erp_cpu_delivery * 1000 / n,
        "erp_cpu_ms_per_raw_post": erp_cpu_raw * 1000 / n,
        # The raw client's CPU (this process, signing excluded: done before the clock starts).
        "raw_client_cpu_ms_per_post": raw_client_cpu * 1000 / n,
        # CPU ms per delivery (from the first delivery seen) and per raw POST, by process group:
        # the bench process is the raw client in the raw phase; PostgreSQL and RabbitMQ work only in
        # the delivery phase.
        "cpu_ms_per_delivery_by_process": delivery_split,
        "cpu_ms_per_raw_post_by_process": raw_split,
        "load_average_1m": os.getloadavg()[0],
        "erp_counts": ledger,
    }
    print(
        f"delivery worker x{args.workers}: {delivered}/{n} delivered in {attempts} attempts, "
        f"{delivery_rate:,.0f} deliveries/s "
        f"(POST p50 {figures['delivery_post_p50_ms']:.1f} ms, p99 {figures['delivery_post_p99_ms']:.1f} ms)\n"
        f"raw httpx POST:  {raw_rate:,.0f} POSTs/s (p50 {figures['raw_p50_ms']:.1f} ms, "
        f"p99 {figures['raw_p99_ms']:.1f} ms, {raw_errors} non-2xx)\n"
        f"CPU per delivery: worker {figures['worker_cpu_ms_per_delivery']:.1f} ms with its start-up, "
        f"{figures['worker_steady_cpu_ms_per_delivery']:.2f} ms while sending, "
        f"vs raw client {figures['raw_client_cpu_ms_per_post']:.1f} ms per POST, "
        f"ERP {figures['erp_cpu_ms_per_delivery']:.1f} ms "
        f"(raw phase: {figures['erp_cpu_ms_per_raw_post']:.1f} ms); "
        f"load average {figures['load_average_1m']:.1f} on {os.cpu_count()} cores\n"
        f"CPU ms per delivery, every process: {_listed(delivery_split)}\n"
        f"CPU ms per raw POST, every process: {_listed(raw_split)}\n"
        f"ratio: {figures['ratio']:.0%} of raw "
        f"(goal ≥ {GOAL_RATIO:.0%}: {report.met(figures['ratio'] >= GOAL_RATIO)})"
    )
    report.save(args.out, _chart(figures), figures)
    return 0
