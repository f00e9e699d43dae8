"""The chaos suite's invariants, decided from what a scenario left behind: each counts what held
and names what did not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.chaos.invariants import (
    Attempt,
    Event,
    Expected,
    Facts,
    Job,
    LedgerEntry,
    check_all,
    erp_exactly_once,
    final_states,
    limiter_cap,
    no_model_call_from_delivery,
    no_process_exited,
    no_stale_overwrite,
    none_lost,
    recovery,
)
from services.chaos.scenarios import SCENARIOS, SMOKE, select


def _healthy(n: int = 3) -> Facts:
    """n jobs that ran once each and reached the ERP once: every invariant holds."""
    accepted = [Expected(f"j{i}", f"s{i}.txt", "SUCCEEDED" if i % 2 else "REVIEW_REQUIRED") for i in range(n)]
    jobs, events, attempts, ledger = {}, [], [], {}
    for e in accepted:
        jobs[e.job_id] = Job(e.job_id, e.expect, 3, 1, 1)
        events += [
            Event(e.job_id, 1, "READY", 1),
            Event(e.job_id, 2, "RUNNING", 2),
            Event(e.job_id, 3, e.expect, 3),
        ]
        attempts.append(Attempt(e.job_id, 1, 1, "ok"))
        if e.expect != "REVIEW_REQUIRED":  # a job awaiting review never reaches the ERP
            ledger[e.job_id] = LedgerEntry(e.job_id, e.expect, 3, 1)
    return Facts(
        accepted=accepted,
        jobs=jobs,
        events=events,
        attempts=attempts,
        ledger=ledger,
        pool_cap=6,
        provider_peak_in_flight=6,
        provider_requests_total=n,
        provider_requests_at_inference_done=n,
        fault_ended_at=100.0,
        drained_at=112.5,
    )


def test_a_healthy_run_keeps_every_invariant() -> None:
    checks = check_all(_healthy())
    assert [c.ok for c in checks] == [True] * len(checks)
    assert recovery(_healthy()).count == 12.5


def test_a_stranded_job_is_lost_and_not_as_built() -> None:
    facts = _healthy()
    facts.jobs["j1"] = Job("j1", "READY", 1, 0, 0)  # due now, no lease: nobody will run it
    facts.jobs["j2"] = Job("j2", "RETRY_SCHEDULED", 4, 1, 2)
    lost = none_lost(facts)
    assert lost.ok is False and lost.count == 2
    assert "READY (attempt 0) due, no lease" in lost.summary
    assert final_states(facts).ok is False


def test_a_job_with_a_live_lease_or_a_later_due_time_is_explainable() -> None:
    facts = _healthy()
    facts.jobs["j1"] = Job("j1", "RUNNING", 2, 1, 1, live_lease=True)
    facts.jobs["j2"] = Job("j2", "RETRY_SCHEDULED", 4, 1, 2, due_later=True)
    assert none_lost(facts).ok is True
    check = final_states(facts)
    assert check.ok is True and check.count == 1
    assert "2 explainable" in check.summary


def test_an_accepted_job_missing_from_the_database_is_lost() -> None:
    facts = _healthy()
    del facts.jobs["j0"]
    assert none_lost(facts).count == 1


def test_a_job_in_another_final_state_than_its_sample_is_named() -> None:
    facts = _healthy()
    facts.jobs["j1"] = replace(facts.jobs["j1"], state="FAILED_TERMINAL")
    check = final_states(facts)
    assert check.ok is False
    assert "j1 s1.txt: FAILED_TERMINAL, built for SUCCEEDED" in check.examples


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda f: f.events.append(Event("j1", 9, "RUNNING", 3)), "went 3 -> 3"),
        (lambda f: f.events.append(Event("j1", 9, "RETRY_SCHEDULED", 4)), "after final SUCCEEDED"),
        (lambda f: f.attempts.append(Attempt("j1", 2, 2, "ok")), "written 2 times"),
        (lambda f: f.attempts.__setitem__(1, Attempt("j1", 1, 0, "ok")), "under fence 0, job at 1"),
    ],
)
def test_a_stale_write_is_caught(change: object, expected: str) -> None:
    facts = _healthy()
    assert callable(change)
    change(facts)
    check = no_stale_overwrite(facts)
    assert check.ok is False
    assert any(expected in e for e in check.examples), check.examples


def test_a_stale_attempt_that_was_refused_is_fine() -> None:
    facts = _healthy()
    facts.attempts.append(Attempt("j1", 1, 1, "stale"))
    check = no_stale_overwrite(facts)
    assert check.ok is True and "1 stale attempt(s) were refused" in check.summary


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (None, "never applied"),
        (LedgerEntry("j1", "SUCCEEDED", 3, 2), "applied 2 times"),
        (LedgerEntry("j1", "RUNNING", 2, 1), "ERP holds RUNNING v2"),
    ],
)
def test_the_erp_must_hold_each_final_state_once(entry: LedgerEntry | None, expected: str) -> None:
    facts = _healthy()
    if entry is None:
        del facts.ledger["j1"]
    else:
        facts.ledger["j1"] = entry
    check = erp_exactly_once(facts)
    assert check.ok is False and check.count == 0
    assert expected in check.examples[0]


def test_a_job_awaiting_review_must_not_be_in_the_erp() -> None:
    facts = _healthy()
    facts.ledger["j0"] = LedgerEntry("j0", "REVIEW_REQUIRED", 3, 1)
    check = erp_exactly_once(facts)
    assert check.ok is False and check.count == 1
    assert "awaiting review, yet the ERP holds it" in check.examples[0]


def test_a_model_call_after_every_job_finished_came_from_delivery() -> None:
    facts = _healthy()
    facts.provider_requests_total += 2
    assert no_model_call_from_delivery(facts).count == 2
    assert no_model_call_from_delivery(facts).ok is False
    facts.provider_requests_at_inference_done = None
    assert no_model_call_from_delivery(facts).ok is None  # not measured, not a pass


def test_the_provider_never_sees_more_calls_at_once_than_the_pool_cap() -> None:
    facts = _healthy()
    facts.provider_peak_in_flight = 7
    assert limiter_cap(facts).ok is False


def test_an_exit_nobody_caused_fails_and_a_backlog_that_never_drained_fails() -> None:
    facts = _healthy()
    facts.unexpected_exits = ["relay exited with code 1 after 3.0 s"]
    facts.drained_at = None
    assert no_process_exited(facts).ok is False
    assert recovery(facts).ok is False and recovery(facts).count is None


def test_scenarios_are_picked_by_name_smoke_or_all() -> None:
    assert [s.name for s in select("smoke")] == list(SMOKE)
    assert len(select("all")) == len(SCENARIOS)
    assert [s.name for s in select("redis-cut-8s, erp-outage")] == ["redis-cut-8s", "erp-outage"]
    with pytest.raises(ValueError, match="nope"):
        select("nope")
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names))
    for dependency in ("postgres", "rabbitmq", "redis"):
        assert {f"{dependency}-cut-8s", f"{dependency}-cut-30s"} <= set(names)
