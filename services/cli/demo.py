"""``fatura demo``: run the pipeline on the sample invoices and show what happens to each job.

Starts the local stack (or uses one already answering), creates a demo tenant with the sample
supplier master data, submits every sample invoice over HTTP, shows a submission that repeats an
earlier one coming back as the same job, then follows each job live until the stack has carried
it as far as the processes present can: done, or handed to RabbitMQ for extraction.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import TenantSpec, create_tenant, import_suppliers, parse_suppliers
from services.cli.processes import PROCESSES
from services.cli.stack import Stack, check_dependencies, ready_url
from services.common.db import sync_pool
from services.common.migrate import migrate
from services.sandbox.samples import SUPPLIERS_CSV, Sample, load_samples

OUT_DIR = Path("out")

_PUBLISHED_SQL = """
SELECT job_id, bool_and(published_at IS NOT NULL) AS published
FROM outbox_events WHERE job_id = ANY(%(job_ids)s) AND event_type = 'extraction.requested.v1'
GROUP BY job_id
"""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the pipeline on the sample invoices and show each job's state"
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to follow the jobs (default 180)"
    )
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    console = Console() if Console().is_terminal else Console(width=110)
    settings = AcceptanceSettings.from_env()
    problems = check_dependencies(settings.common)
    if problems:
        for line in problems:
            console.print(f"[red]fatura demo:[/red] {line}")
        return 1
    for m in migrate(settings.common.database_url):
        console.print(f"applied migration {m.version:04d}_{m.name}")

    OUT_DIR.mkdir(exist_ok=True)
    stack: Stack | None = None
    base_url = f"http://{settings.http_host}:{settings.http_port}"
    if _answers(ready_url("http")):
        console.print(f"Using the stack already running at {base_url}.")
    else:
        log_path = OUT_DIR / "demo-stack.log"
        log_file = log_path.open("w", encoding="utf-8")
        stack = Stack(log=log_file)
        console.print(
            f"Starting the local stack ({', '.join(s.name for s in stack.specs)}); logs in {log_path}"
        )
        stack.start()
        with console.status("waiting for the stack to answer..."):
            missing = stack.wait_ready(
                timeout=90, progress=lambda name, _: console.print(f"  {name} is ready")
            )
        if missing:
            console.print(f"[red]fatura demo:[/red] not ready: {', '.join(missing)}; see {log_path}")
            stack.stop()
            return 1
    try:
        return _run_pipeline(console, settings, base_url, args.timeout)
    finally:
        if stack is not None:
            console.print("Stopping the local stack.")
            stack.stop()


def _answers(url: str | None) -> bool:
    if url is None:
        return False
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _run_pipeline(console: Console, settings: AcceptanceSettings, base_url: str, timeout: float) -> int:
    samples = load_samples()
    run_id = uuid.uuid4().hex[:8]
    with sync_pool(settings.common, name="demo", max_size=2) as pool:
        tenant_id, api_key = create_tenant(pool, TenantSpec(name=f"demo-{run_id}"))
        imported = import_suppliers(pool, tenant_id, parse_suppliers(SUPPLIERS_CSV))
        console.print(f"Created demo tenant {tenant_id} with {imported} suppliers of master data.")

        headers = {"Authorization": f"Bearer {api_key}"}
        jobs: dict[str, dict[str, Any]] = {}
        with httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as client:
            for sample in samples:
                reply = _submit(client, sample, run_id)
                if reply.status_code != 202:
                    console.print(f"[red]{sample.filename}: HTTP {reply.status_code}: {reply.text}[/red]")
                    return 1
                jobs[sample.filename] = reply.json()
            console.print(f"Submitted {len(samples)} sample invoices; each was answered 202 at once.")
            first = samples[0]
            again = _submit(client, first, run_id)
            same = again.json().get("job_id") == jobs[first.filename]["job_id"]
            console.print(
                f"Submitted {first.filename} again with the same Idempotency-Key: HTTP {again.status_code}, "
                f"{'the same job' if same else 'a DIFFERENT job (bug!)'} "
                f"(Idempotent-Replayed: {again.headers.get('idempotent-replayed')})."
            )
            console.print(f"The 202 body says: [italic]{jobs[first.filename]['message']}[/italic]")

            follow_until_done = any(p.name == "inference" for p in PROCESSES)
            deadline = time.monotonic() + timeout
            statuses: dict[str, dict[str, Any]] = {}
            published: dict[str, bool] = {}
            with Live(console=console, refresh_per_second=4) as live:
                while True:
                    for sample in samples:
                        job_id = jobs[sample.filename]["job_id"]
                        statuses[sample.filename] = client.get(f"/v1/extraction-jobs/{job_id}").json()
                    with pool.connection() as conn:
                        rows = conn.execute(
                            _PUBLISHED_SQL, {"job_ids": [uuid.UUID(j["job_id"]) for j in jobs.values()]}
                        ).fetchall()
                    by_job = {str(r["job_id"]): bool(r["published"]) for r in rows}
                    published = {f: by_job.get(jobs[f]["job_id"], False) for f in jobs}
                    live.update(_table(samples, statuses, published))
                    if follow_until_done:
                        finished = all(s["done"] for s in statuses.values())
                    else:
                        finished = all(published.values())
                    if finished or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
            console.print()

    done = sum(1 for s in statuses.values() if s["done"])
    handed_on = sum(published.values())
    console.print(
        f"{len(samples)} jobs accepted durably; {handed_on} handed to RabbitMQ by the outbox relay "
        f"(queue {settings.common.queue_prefix}.inference.ingest); {done} finished."
    )
    if not follow_until_done:
        console.print(
            "This stack has no inference worker yet, so the jobs wait in READY: accepted, durable, and "
            "queued for extraction."
        )
    ok = handed_on == len(samples) and (done == len(samples) or not follow_until_done)
    return 0 if ok else 1


def _submit(client: httpx.Client, sample: Sample, run_id: str) -> httpx.Response:
    return client.post(
        "/v1/extraction-jobs",
        json={"document": {"text": sample.text, "filename": sample.filename}, "priority": "interactive"},
        headers={"Idempotency-Key": f"demo-{run_id}-{sample.filename}"},
    )


def _table(samples: list[Sample], statuses: dict[str, dict[str, Any]], published: dict[str, bool]) -> Table:
    table = Table(title="Sample invoices", expand=False)
    table.add_column("invoice", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("done", no_wrap=True, min_width=4)
    table.add_column("published", no_wrap=True, min_width=9)
    table.add_column("should end in", no_wrap=True)
    for sample in samples:
        status = statuses.get(sample.filename, {})
        table.add_row(
            sample.filename.removesuffix(".txt"),
            "…" + str(status.get("job_id", ""))[-6:],
            str(status.get("state", "")),
            "yes" if status.get("done") else "no",
            "yes" if published.get(sample.filename) else "waiting",
            sample.expect,
        )
    return table
