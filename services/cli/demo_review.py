"""The review part of ``fatura demo`` (DESIGN §5.13): the samples that ended in review wait for a
reviewer and were never sent to the ERP; a reviewer approves one and rejects one through the review
API; the ERP's ledger then holds both outcomes, with its business acknowledgements.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from services.acceptance.keys import create_key
from services.acceptance.settings import AcceptanceSettings
from services.common.db import sync_pool

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# The reviewer knows this supplier, which is not in the master data yet: the result stands.
APPROVE = "07_review_unknown_supplier_try.txt"
# Two IBANs and a paragraph addressed to the model: not an invoice to post as it is.
REJECT = "08_review_injected_instruction_try.txt"
REJECT_REASON = (
    "two different IBANs and a note addressed to the model; a clean copy was asked of the supplier"
)
JSON = dict[str, Any]


def read_ledger(erp_url: str, job_ids: set[str]) -> dict[str, JSON]:
    """The reference ERP's ledger entries of these jobs, by job id (empty while it does not answer)."""
    try:
        body = httpx.get(f"{erp_url}/ledger", timeout=5.0).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {entry["job_id"]: entry for entry in body.get("jobs", []) if entry["job_id"] in job_ids}


def ack_text(entry: Mapping[str, Any] | None) -> str:
    """The ERP's business acknowledgement of a ledger entry, in a word or two."""
    ack = (entry or {}).get("ack")
    if ack is None:
        return "—"
    if ack["state"] == "sent":
        return str(ack["outcome"]) + (f": {ack['reason']}" if ack.get("reason") else "")
    return f"{ack['outcome']} (ack {ack['state']})"


def review_story(
    console: Console,
    settings: AcceptanceSettings,
    base_url: str,
    erp_url: str,
    tenant_id: uuid.UUID,
    api_key: str,
    jobs: Mapping[str, str],
    timeout: float,
) -> bool:
    """Show the waiting reviews, decide two as a reviewer, and show the ERP's ledger; True when the
    ledger ends holding each decided job once and none of the jobs still in review."""
    with sync_pool(settings.common, name="demo-review", max_size=1) as pool:
        _, reviewer_key = create_key(pool, scope="reviewer", tenant_id=tenant_id, label="demo reviewer")
    console.print()
    console.print(
        "Created a reviewer key for the demo tenant (what `fatura keys create --tenant "
        f"{tenant_id} --scope reviewer` prints). The reviewer page is {base_url}/review"
    )
    names = {job_id: filename.removesuffix(".txt") for filename, job_id in jobs.items()}
    tenant = httpx.Client(base_url=base_url, headers=_bearer(api_key), timeout=10.0)
    reviewer = httpx.Client(base_url=base_url, headers=_bearer(reviewer_key), timeout=10.0)
    with tenant, reviewer:
        waiting = [r for r in _open_reviews(reviewer) if r["job_id"] in names]
        ledger = read_ledger(erp_url, set(names))
        console.print(_waiting_table(waiting, names, ledger))
        sent = [r for r in waiting if r["kind"] == "validation" and r["job_id"] in ledger]
        if waiting:
            first = min(waiting, key=lambda r: names[r["job_id"]])
            console.print(
                f"Each is on the reviewer page at /review#<review_id>; {names[first['job_id']]}, "
                f"for example: {base_url}/review#{first['review_id']}"
            )
        console.print(
            f"{len(waiting)} review tasks wait for a reviewer; "
            + (
                "none of their jobs was sent to the ERP."
                if not sent
                else f"[red]{len(sent)} in the ERP ledger![/red]"
            )
        )
        by_file = dict(jobs)
        task = {r["job_id"]: r for r in waiting}
        decided: dict[str, str] = {}  # job id → the state the reviewer's decision gave it
        for filename, action, body in (
            (APPROVE, "approve", {}),
            (REJECT, "reject", {"reason": REJECT_REASON}),
        ):
            review = task.get(by_file[filename])
            if review is None:
                console.print(f"[red]{filename} has no open review task.[/red]")
                return False
            answer = _decide(reviewer, review["review_id"], action, body)
            job = answer["job"]
            decided[job["job_id"]] = job["state"]
            said = f' with the reason "{REJECT_REASON}"' if action == "reject" else ""
            console.print(
                f"The reviewer {answer['state']} {names[job['job_id']]} "
                f"({', '.join(r['code'] for r in review['reasons'])}){said}: "
                f"the job is {job['state']} at state version {job['state_version']}."
            )
        with console.status("waiting for the ERP's ledger to hold both decisions..."):
            ledger = _wait_for_outcomes(erp_url, tenant, decided, set(names), timeout)
        statuses = {job_id: tenant.get(f"/v1/extraction-jobs/{job_id}").json() for job_id in ledger}
    console.print(_ledger_table(names, ledger, statuses, decided))
    return _verdict(console, names, ledger, decided, waiting)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _open_reviews(client: httpx.Client) -> list[JSON]:
    found: list[JSON] = []
    cursor: str | None = None
    while True:
        params = {"state": "open", "limit": "200", **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/reviews", params=params)
        page.raise_for_status()
        found += page.json()["reviews"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return found


def _decide(client: httpx.Client, review_id: str, action: str, body: JSON) -> JSON:
    """Claim a review and decide it under the claim's fence, as the reviewer page does."""
    claimed = client.post(f"/v1/reviews/{review_id}:claim")
    claimed.raise_for_status()
    answer = client.post(f"/v1/reviews/{review_id}:{action}", json={"fence": claimed.json()["fence"], **body})
    answer.raise_for_status()
    result: JSON = answer.json()
    return result


def _wait_for_outcomes(
    erp_url: str, tenant: httpx.Client, decided: Mapping[str, str], job_ids: set[str], timeout: float
) -> dict[str, JSON]:
    """The ledger once it holds every decided job at its new state, its acknowledgement settled."""
    deadline = time.monotonic() + timeout
    versions = {
        job_id: tenant.get(f"/v1/extraction-jobs/{job_id}").json()["state_version"] for job_id in decided
    }
    while True:
        ledger = read_ledger(erp_url, job_ids)
        held = all(
            (entry := ledger.get(job_id)) is not None
            and entry["state_version"] == versions[job_id]
            and (entry.get("ack") or {}).get("state") != "pending"
            for job_id in decided
        )
        if held or time.monotonic() > deadline:
            return ledger
        time.sleep(0.5)


def _waiting_table(waiting: list[JSON], names: Mapping[str, str], ledger: Mapping[str, JSON]) -> Table:
    from rich.table import Table

    table = Table(title="Waiting for a reviewer (REVIEW_REQUIRED: never sent to the ERP)", expand=False)
    table.add_column("invoice", no_wrap=True)
    table.add_column("why it needs a reviewer (the first reason)", min_width=40)
    table.add_column("ERP ledger", no_wrap=True)
    for review in sorted(waiting, key=lambda r: names[r["job_id"]]):
        table.add_row(
            names[review["job_id"]],
            _first_reason(review["reasons"]),
            "not there" if review["job_id"] not in ledger else "[red]present![/red]",
        )
    return table


def _first_reason(reasons: list[JSON]) -> str:
    if not reasons:
        return "—"
    first = str(reasons[0].get("message") or reasons[0]["code"])
    if len(first) > 100:
        first = first[:99] + "…"
    others = sorted({str(r["code"]) for r in reasons[1:]})
    return first + (f" (+{len(reasons) - 1} more: {', '.join(others)})" if others else "")


def _ledger_table(
    names: Mapping[str, str],
    ledger: Mapping[str, JSON],
    statuses: Mapping[str, JSON],
    decided: Mapping[str, str],
) -> Table:
    from rich.table import Table

    table = Table(title="The ERP's ledger for this demo's jobs", expand=False)
    table.add_column("invoice", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("version", justify="right")
    table.add_column("decided by", no_wrap=True)
    table.add_column("effects", justify="right")
    table.add_column("received", justify="right")
    table.add_column("ERP acknowledged", no_wrap=True)
    table.add_column("Fatura's status says", no_wrap=True)
    for job_id, entry in sorted(ledger.items(), key=lambda item: names[item[0]]):
        status = statuses.get(job_id, {})
        erp = status.get("erp") or {}
        table.add_row(
            names[job_id],
            entry["state"],
            str(entry["state_version"]),
            "reviewer" if job_id in decided else str(status.get("decided_by") or "model"),
            str(entry["effects"]),
            str(entry["counts"]["received"]),
            ack_text(entry),
            f"erp: {erp['outcome']}" if erp.get("outcome") else "—",
        )
    return table


def _verdict(
    console: Console,
    names: Mapping[str, str],
    ledger: Mapping[str, JSON],
    decided: Mapping[str, str],
    waiting: list[JSON],
) -> bool:
    still = [r["job_id"] for r in waiting if r["job_id"] not in decided and r["kind"] == "validation"]
    leaked = [job_id for job_id in still if job_id in ledger]
    held = [job_id for job_id, state in decided.items() if (ledger.get(job_id) or {}).get("state") == state]
    once = all(entry["effects"] == 1 for entry in ledger.values())
    outcomes = ", ".join(f"{names[j]} {decided[j]}" for j in decided)
    console.print(
        f"Review: {len(held)} of {len(decided)} decisions in the ERP's ledger ({outcomes}); "
        f"{len(still)} still wait for a reviewer, {len(leaked)} of them sent to the ERP. "
        f"ERP ledger: {len(ledger)} entries, {'each' if once else 'NOT each'} applied exactly once."
    )
    return len(held) == len(decided) and not leaked and once
