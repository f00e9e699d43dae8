"""``fatura demo``: run the pipeline on the sample invoices and show what happens to each job.

Starts the local stack (or uses one already answering), creates a demo tenant with the sample
supplier master data and a webhook endpoint at the reference ERP, submits every sample invoice
over HTTP, shows a submission that repeats an earlier one coming back as the same job, then
follows each job live until it is finished and its final state is in the ERP's ledger, once, or it
waits for a reviewer (never sent to the ERP). Then a reviewer approves one of those and rejects one
(``demo_review.py``) and the ERP's ledger is shown with its acknowledgements.
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from fatura_sdk import generate_secret
from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import TenantSpec, create_tenant, import_suppliers, parse_suppliers
from services.cli.demo_review import ack_text, read_ledger, review_story
from services.cli.extras import require
from services.cli.stack import (
    Stack,
    apply_erp_ack_default,
    apply_local_defaults,
    check_dependencies,
    ready_url,
)
from services.common.db import sync_pool
from services.common.migrate import migrate
from services.common.procs import answers
from services.delivery.endpoints import register_endpoint
from services.sandbox.erp.settings import ErpSettings
from services.sandbox.samples import SUPPLIERS_CSV, Sample, load_samples

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

OUT_DIR = Path("out")
REVIEW_REQUIRED = "REVIEW_REQUIRED"


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the pipeline on the sample invoices and show each job's state"
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to follow the jobs (default 180)"
    )
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    # The live table, and the reference ERP the stack starts.
    require("fatura demo", "cli", "sandbox")
    from rich.console import Console

    console = Console() if Console().is_terminal else Console(width=140)
    apply_local_defaults()
    apply_erp_ack_default()
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
    url = ready_url("http")
    if url is not None and answers(url):
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


def _run_pipeline(console: Console, settings: AcceptanceSettings, base_url: str, timeout: float) -> int:
    from rich.live import Live

    samples = load_samples()
    run_id = uuid.uuid4().hex[:8]
    erp = ErpSettings.from_env()
    erp_url = f"http://{erp.host}:{erp.port}"
    with sync_pool(settings.common, name="demo", max_size=2) as pool:
        tenant_id, api_key = create_tenant(pool, TenantSpec(name=f"demo-{run_id}"))
        imported = import_suppliers(pool, tenant_id, parse_suppliers(SUPPLIERS_CSV))
    console.print(f"Created demo tenant {tenant_id} with {imported} suppliers of master data.")

    # The reference ERP must know the endpoint's secret to verify what it receives.
    secret = generate_secret()
    httpx.post(f"{erp_url}/admin/secrets", json={"secrets": [secret]}, timeout=10.0).raise_for_status()
    endpoint = register_endpoint(tenant_id, f"{erp_url}/webhooks", secret=secret)
    console.print(
        f"Registered webhook endpoint {endpoint['endpoint_id']} → {erp_url}/webhooks "
        "(a signed verification ping is queued for the delivery service)."
    )

    headers = {"Authorization": f"Bearer {api_key}"}
    jobs: dict[str, str] = {}
    with httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as client:
        for sample in samples:
            reply = _submit(client, sample, run_id)
            if reply.status_code != 202:
                console.print(f"[red]{sample.filename}: HTTP {reply.status_code}: {reply.text}[/red]")
                return 1
            jobs[sample.filename] = reply.json()["job_id"]
        first = samples[0]
        console.print(f"Submitted {len(samples)} sample invoices; each was answered 202 at once.")
        again = _submit(client, first, run_id)
        same = again.json().get("job_id") == jobs[first.filename]
        console.print(
            f"Submitted {first.filename} again with the same Idempotency-Key: HTTP {again.status_code}, "
            f"{'the same job' if same else 'a DIFFERENT job (bug!)'} "
            f"(Idempotent-Replayed: {again.headers.get('idempotent-replayed')})."
        )
        console.print(f"The 202 body says: [italic]{again.json()['message']}[/italic]")

        deadline = time.monotonic() + timeout
        statuses: dict[str, dict[str, Any]] = {}
        ledger: dict[str, dict[str, Any]] = {}
        with Live(console=console, refresh_per_second=4) as live:
            while True:
                for sample in samples:
                    statuses[sample.filename] = client.get(
                        f"/v1/extraction-jobs/{jobs[sample.filename]}"
                    ).json()
                ledger = read_ledger(erp_url, set(jobs.values()))
                live.update(_table(samples, jobs, statuses, ledger))
                if _delivered(jobs, statuses, ledger) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        console.print()
    finished = _summary(console, samples, jobs, statuses, ledger)
    reviewed = review_story(console, settings, base_url, erp_url, tenant_id, api_key, jobs, timeout)
    if not (finished and reviewed):
        console.print("[red]The demo did not end as expected; see out/demo-stack.log.[/red]")
    return 0 if finished and reviewed else 1


def _delivered(jobs: dict[str, str], statuses: dict[str, dict[str, Any]], ledger: dict[str, Any]) -> bool:
    for filename, job_id in jobs.items():
        status = statuses.get(filename, {})
        entry = ledger.get(job_id)
        if status.get("state") == REVIEW_REQUIRED:
            continue  # waits for a reviewer; never sent to the ERP
        if not status.get("done") or entry is None or entry["state_version"] != status.get("state_version"):
            return False
        if (entry.get("ack") or {}).get("state") == "pending":
            return False  # the ERP's acknowledgement is on its way to the edge
    return True


def _summary(
    console: Console,
    samples: list[Sample],
    jobs: dict[str, str],
    statuses: dict[str, dict[str, Any]],
    ledger: dict[str, dict[str, Any]],
) -> bool:
    as_expected = sum(1 for s in samples if statuses.get(s.filename, {}).get("state") == s.expect)
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[str(status.get("state"))] = counts.get(str(status.get("state")), 0) + 1
    states_text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    console.print(
        f"{len(samples)} jobs: {states_text}; {as_expected} of {len(samples)} as the samples expect."
    )
    in_review = {jobs[f] for f, status in statuses.items() if status.get("state") == REVIEW_REQUIRED}
    delivered = [job_id for job_id in jobs.values() if job_id not in in_review]
    applied_once = sum(1 for job_id in delivered if ledger.get(job_id, {}).get("effects") == 1)
    leaked = len(in_review & ledger.keys())
    received = sum(len(entry.get("webhook_ids", [])) for entry in ledger.values())
    duplicates = sum(entry.get("counts", {}).get("duplicates", 0) for entry in ledger.values())
    console.print(
        f"ERP ledger: {len(ledger)} entries for the {len(delivered)} finished jobs, {applied_once} applied "
        f"exactly once; {received} signed deliveries received, {duplicates} duplicate(s) ignored; "
        f"{leaked} of the {len(in_review)} jobs in review sent to the ERP."
    )
    return as_expected == len(samples) and applied_once == len(delivered) and leaked == 0


def _submit(client: httpx.Client, sample: Sample, run_id: str) -> httpx.Response:
    return client.post(
        "/v1/extraction-jobs",
        json={"document": {"text": sample.text, "filename": sample.filename}, "priority": "interactive"},
        headers={"Idempotency-Key": f"demo-{run_id}-{sample.filename}"},
    )


def _table(
    samples: list[Sample], jobs: dict[str, str], statuses: dict[str, dict[str, Any]], ledger: dict[str, Any]
) -> Table:
    from rich.table import Table

    table = Table(title="Sample invoices (✓ = ended in the state the sample is built for)", expand=False)
    table.add_column("invoice", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("tries", justify="right", min_width=5)
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("review reasons", min_width=24)
    table.add_column("ERP ledger", no_wrap=True)
    for sample in samples:
        status = statuses.get(sample.filename, {})
        result = status.get("result") or {}
        total = f"{result.get('total', '')} {result.get('currency', '')}".strip()
        reasons = ", ".join(sorted({r["code"] for r in (status.get("review") or {}).get("reasons", [])}))
        entry = ledger.get(jobs[sample.filename])
        state = str(status.get("state", ""))
        if entry is not None:  # with the business outcome the ERP acknowledged
            erp_text = f"v{entry['state_version']} applied {entry['effects']}x, {ack_text(entry)}"
        else:
            erp_text = "not sent (in review)" if state == REVIEW_REQUIRED else "waiting"
        mark = ""
        if status.get("done"):
            mark = " ✓" if state == sample.expect else f" ✗ expected {sample.expect}"
        table.add_row(
            sample.filename.removesuffix(".txt"),
            state + mark,
            str(status.get("attempts", "")),
            total,
            reasons,
            erp_text,
        )
    return table
