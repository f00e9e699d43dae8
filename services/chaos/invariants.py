"""The invariants a chaos scenario must keep, decided from what was read after it (pure: no I/O).

Each check has a count, so a report says how much held, not only whether: every accepted job
ends in the state its sample is built for (or is explainable: a live lease or a due time ahead),
none is lost, no stale attempt changed a job, the ERP applied each final state exactly once, no
model call came from a delivery problem, the provider never saw more calls at once than the
limiter's cap, no process exited that was not killed on purpose, and the backlog drained.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

TERMINAL = frozenset({"SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL", "CANCELLED"})
WITH_RESULT = frozenset({"SUCCEEDED", "REVIEW_REQUIRED"})
# What an ERP receives (DESIGN §5.13): a job awaiting review never reaches it.
TO_ERP = frozenset({"SUCCEEDED", "FAILED_TERMINAL", "REJECTED"})
# The hop outcome of an attempt whose answer was written as the job's result.
RESULT_OUTCOME = "ok"
EXAMPLES = 5
RECOVERY = "backlog drained after the fault (recovery time)"


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    state_version: int
    attempt: int
    fence: int
    live_lease: bool = False
    due_later: bool = False


@dataclass(frozen=True)
class Event:
    job_id: str
    seq: int
    state: str
    state_version: int


@dataclass(frozen=True)
class Attempt:
    job_id: str
    attempt: int
    fence: int
    outcome: str


@dataclass(frozen=True)
class LedgerEntry:
    job_id: str
    state: str
    state_version: int
    effects: int
    duplicates: int = 0


@dataclass(frozen=True)
class Expected:
    job_id: str
    sample: str
    expect: str


@dataclass
class Facts:
    """Everything read at the end of a scenario."""

    accepted: list[Expected]
    jobs: dict[str, Job]
    events: list[Event]
    attempts: list[Attempt]
    ledger: dict[str, LedgerEntry]
    pool_cap: int
    provider_peak_in_flight: int
    provider_requests_total: int
    # provider requests when every job had first finished; None if that never happened
    provider_requests_at_inference_done: int | None
    unexpected_exits: list[str] = field(default_factory=list)
    fault_ended_at: float = 0.0
    drained_at: float | None = None


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: could not be measured in this run
    count: float | None
    summary: str
    examples: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        return {True: "ok", False: "FAILED", None: "n/a"}[self.ok]


def check_all(facts: Facts) -> list[Check]:
    return [
        final_states(facts),
        none_lost(facts),
        no_stale_overwrite(facts),
        erp_exactly_once(facts),
        no_model_call_from_delivery(facts),
        limiter_cap(facts),
        no_process_exited(facts),
        recovery(facts),
    ]


def _stranded(job: Job) -> bool:
    return job.state not in TERMINAL and not job.live_lease and not job.due_later


def final_states(facts: Facts) -> Check:
    as_built = explainable = 0
    wrong: list[str] = []
    for expected in facts.accepted:
        job = facts.jobs.get(expected.job_id)
        if job is None or _stranded(job):
            continue  # counted by none_lost
        if job.state == expected.expect:
            as_built += 1
        elif job.state not in TERMINAL:
            explainable += 1
        else:
            wrong.append(f"{expected.job_id} {expected.sample}: {job.state}, built for {expected.expect}")
    total = len(facts.accepted)
    summary = f"{as_built}/{total} as built"
    if explainable:
        summary += f", {explainable} explainable (live lease or due later)"
    if wrong:
        summary += f", {len(wrong)} in another final state"
    missing = total - as_built - explainable - len(wrong)
    if missing:
        summary += f", {missing} stranded or missing"
    return Check(
        "jobs end in the state their sample is built for",
        as_built + explainable == total,
        as_built,
        summary,
        tuple(wrong[:EXAMPLES]),
    )


def none_lost(facts: Facts) -> Check:
    missing = [e.job_id for e in facts.accepted if e.job_id not in facts.jobs]
    stranded = [facts.jobs[e.job_id] for e in facts.accepted if e.job_id in facts.jobs]
    stranded = [job for job in stranded if _stranded(job)]
    lost = len(missing) + len(stranded)
    parts = Counter(f"{job.state} (attempt {job.attempt}) due, no lease" for job in stranded)
    summary = f"{lost} lost of {len(facts.accepted)} accepted"
    if missing:
        summary += f"; {len(missing)} accepted but not in the database"
    if parts:
        summary += "; " + ", ".join(f"{n} {what}" for what, n in parts.most_common())
    examples = [f"{job_id}: no row" for job_id in missing]
    examples += [f"{job.id}: {job.state}, attempt {job.attempt}" for job in stranded]
    return Check("no job lost", lost == 0, lost, summary, tuple(examples[:EXAMPLES]))


def no_stale_overwrite(facts: Facts) -> Check:
    """A stale attempt never changed a job: each job's events rise strictly in state_version and
    stop at a final state, the row is at its last event, and a result was written once, under the
    fence the job holds."""
    by_job: dict[str, list[Event]] = defaultdict(list)
    for event in facts.events:
        by_job[event.job_id].append(event)
    results: dict[str, list[Attempt]] = defaultdict(list)
    stale = 0
    for attempt in facts.attempts:
        if attempt.outcome == RESULT_OUTCOME:
            results[attempt.job_id].append(attempt)
        elif attempt.outcome == "stale":
            stale += 1
    problems: list[str] = []
    for job_id in sorted({e.job_id for e in facts.accepted} & set(facts.jobs)):
        job = facts.jobs[job_id]
        problems += _event_problems(job, sorted(by_job.get(job_id, []), key=lambda e: e.seq))
        written = results.get(job_id, [])
        if len(written) > 1:
            problems.append(f"{job_id}: a result was written {len(written)} times")
        elif written and job.state in WITH_RESULT and written[0].fence != job.fence:
            problems.append(f"{job_id}: result written under fence {written[0].fence}, job at {job.fence}")
        elif written and job.state not in WITH_RESULT:
            problems.append(f"{job_id}: an attempt wrote a result, the job is {job.state}")
    return Check(
        "no stale attempt overwrote a job",
        not problems,
        len(problems),
        f"{len(problems)} violations; {stale} stale attempt(s) were refused as they should be",
        tuple(problems[:EXAMPLES]),
    )


def _event_problems(job: Job, events: Sequence[Event]) -> list[str]:
    problems = []
    for before, after in itertools.pairwise(events):
        if after.state_version <= before.state_version:
            problems.append(
                f"{job.id}: state_version went {before.state_version} -> {after.state_version} "
                f"({before.state} -> {after.state})"
            )
        if before.state in TERMINAL:
            problems.append(f"{job.id}: {after.state} v{after.state_version} after final {before.state}")
    if events and (events[-1].state_version != job.state_version or events[-1].state != job.state):
        last = events[-1]
        row = f"{job.state} v{job.state_version}"
        problems.append(f"{job.id}: row is {row}, last event {last.state} v{last.state_version}")
    return problems


def erp_exactly_once(facts: Facts) -> Check:
    finished = [facts.jobs[e.job_id] for e in facts.accepted if e.job_id in facts.jobs]
    once, problems = 0, []
    for job in finished:
        if job.state == "REVIEW_REQUIRED" and job.id in facts.ledger:
            problems.append(f"{job.id}: awaiting review, yet the ERP holds it")
    finished = [job for job in finished if job.state in TO_ERP]
    duplicates = sum(entry.duplicates for entry in facts.ledger.values())
    for job in finished:
        entry = facts.ledger.get(job.id)
        if entry is None:
            problems.append(f"{job.id}: {job.state} v{job.state_version} never applied")
        elif entry.effects != 1:
            problems.append(f"{job.id}: applied {entry.effects} times")
        elif entry.state_version != job.state_version or entry.state != job.state:
            held, row = f"{entry.state} v{entry.state_version}", f"{job.state} v{job.state_version}"
            problems.append(f"{job.id}: ERP holds {held}, the job is {row}")
        else:
            once += 1
    return Check(
        "the ERP applied each final state exactly once, and no job awaiting review",
        not problems,
        once,
        f"{once}/{len(finished)} finished jobs applied once; {duplicates} duplicate delivery(ies) ignored",
        tuple(problems[:EXAMPLES]),
    )


def no_model_call_from_delivery(facts: Facts) -> Check:
    name = "no model call caused by delivery"
    if facts.provider_requests_at_inference_done is None:
        return Check(name, None, None, "not measured: the jobs never all finished")
    after = facts.provider_requests_total - facts.provider_requests_at_inference_done
    return Check(name, after == 0, after, f"{after} model call(s) after the last job finished")


def limiter_cap(facts: Facts) -> Check:
    peak = facts.provider_peak_in_flight
    return Check(
        "limiter peak in-flight within the cap",
        peak <= facts.pool_cap,
        peak,
        f"provider peak in-flight {peak}, pool cap {facts.pool_cap}",
    )


def no_process_exited(facts: Facts) -> Check:
    exits = facts.unexpected_exits
    return Check(
        "no process exited on its own",
        not exits,
        len(exits),
        f"{len(exits)} exit(s) of processes nobody killed",
        tuple(exits[:EXAMPLES]),
    )


def recovery(facts: Facts) -> Check:
    name = RECOVERY
    if facts.drained_at is None:
        return Check(name, False, None, "not drained: jobs unfinished or final states not at the ERP")
    seconds = max(0.0, facts.drained_at - facts.fault_ended_at)
    return Check(name, True, round(seconds, 1), f"{seconds:.1f} s from the end of the fault")
