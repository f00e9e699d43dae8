"""The pure rules of inference: the retry schedule, the fair-share order, what an attempt ends in,
and how a consumer reads (or refuses) an event message."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.common import states
from services.common.messages import BadMessage, parse_event
from services.inference.claims import ClaimedJob
from services.inference.fairness import TenantLoad, order_tenants, prefer
from services.inference.outcomes import decide
from services.inference.providers.base import ErrorClass, Hop, ProviderResult
from services.inference.retry import GiveUp, RetryAt, RetryPolicy, backoff_seconds, next_step
from services.inference.validation import POLICY_VERSION, Verdict

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=5, base_seconds=2, cap_seconds=60, attempt_seconds=45, margin_seconds=5)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (20, 60)])
def test_backoff_is_full_jitter_under_the_capped_exponential(attempt: int, ceiling: float) -> None:
    rng = random.Random(attempt)
    draws = [backoff_seconds(attempt, POLICY, rng) for _ in range(500)]
    assert all(0 <= d <= ceiling for d in draws)
    assert max(draws) > ceiling * 0.9  # the whole range is used, not a fixed delay


def test_retry_after_is_a_floor_for_the_delay() -> None:
    step = next_step(1, NOW, NOW + timedelta(hours=1), POLICY, retry_after_ms=30_000, rng=random.Random(1))
    assert isinstance(step, RetryAt)
    assert step.at >= NOW + timedelta(seconds=30)


def test_no_retry_after_the_last_attempt() -> None:
    assert next_step(5, NOW, NOW + timedelta(days=1), POLICY) == GiveUp("retry_budget_exhausted")


def test_no_retry_unless_the_next_attempt_and_its_margin_fit_before_the_deadline() -> None:
    step = next_step(1, NOW, NOW + timedelta(seconds=49), POLICY, rng=random.Random(0))
    assert step == GiveUp("deadline_exceeded")


def _load(running: int, weight: int = 1, cap: int = 10, head_s: int = 0) -> TenantLoad:
    return TenantLoad(uuid.uuid4(), weight, cap, running, None, NOW - timedelta(seconds=head_s))


def test_least_served_tenant_per_unit_of_weight_goes_first() -> None:
    busy, idle, heavy = _load(running=4), _load(running=1), _load(running=4, weight=8)
    assert order_tenants([busy, idle, heavy], NOW, timedelta(seconds=30)) == [
        heavy.tenant_id,
        idle.tenant_id,
        busy.tenant_id,
    ]


def test_a_tenant_at_its_cap_or_with_nothing_due_is_left_out() -> None:
    capped = _load(running=3, cap=3)
    later = TenantLoad(uuid.uuid4(), 1, 10, 0, None, NOW + timedelta(seconds=5))
    assert order_tenants([capped, later], NOW, timedelta(seconds=30)) == []


def test_ties_go_to_the_tenant_that_has_waited_longest() -> None:
    new, old = _load(running=0, head_s=1), _load(running=0, head_s=100)
    assert order_tenants([new, old], NOW, timedelta(seconds=30))[0] == old.tenant_id


def test_interactive_first_unless_batch_has_waited_longer_than_the_aging() -> None:
    aging = timedelta(seconds=30)
    assert prefer(NOW, NOW - timedelta(seconds=10), aging) == "interactive"
    assert prefer(NOW, NOW - timedelta(seconds=31), aging) == "batch"
    assert prefer(None, NOW, aging) == "batch"
    assert prefer(None, None, aging) is None


JOB = ClaimedJob(
    job_id=uuid.uuid4(),
    tenant_id=uuid.uuid4(),
    state_version=2,
    attempt=1,
    fence=1,
    document_id=uuid.uuid4(),
    document_version=1,
    estimated_tokens=100,
    deadline_at=NOW + timedelta(days=1),
    schema_version="invoice.v1",
    priority="batch",
)


def _hop(outcome: str = "ok", error: ErrorClass | None = None) -> Hop:
    return Hop(
        "c1", "m", NOW, NOW, outcome, 200 if error is None else 503, error, input_tokens=5, output_tokens=7
    )


def test_an_answer_that_passes_validation_succeeds_with_its_usage() -> None:
    verdict = Verdict("succeeded", {"schema": "invoice.v1"}, (), None, None, POLICY_VERSION)
    completion = decide(JOB, ProviderResult("{}", [_hop()]), verdict, NOW, POLICY)
    assert completion.state == states.SUCCEEDED
    assert completion.usage == {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}
    assert completion.policy_version == POLICY_VERSION


def test_broken_json_is_a_model_error_retried_and_logged_on_the_attempt() -> None:
    verdict = Verdict("model_error", None, (), "broken_json", "not JSON", POLICY_VERSION)
    completion = decide(JOB, ProviderResult("{", [_hop()]), verdict, NOW, POLICY, random.Random(1))
    assert completion.state == states.RETRY_SCHEDULED
    assert completion.error_class == "broken_json"
    assert completion.hops[-1].outcome == "broken_json"


def test_a_final_provider_error_fails_at_once_and_a_retryable_one_is_scheduled() -> None:
    bad = ProviderResult(None, [_hop("bad_request", ErrorClass.BAD_REQUEST)], ErrorClass.BAD_REQUEST)
    assert decide(JOB, bad, None, NOW, POLICY).state == states.FAILED_TERMINAL
    busy = ProviderResult(None, [_hop("server_error", ErrorClass.SERVER_ERROR)], ErrorClass.SERVER_ERROR)
    assert decide(JOB, busy, None, NOW, POLICY).state == states.RETRY_SCHEDULED


def test_nothing_sent_because_the_limiter_said_wait_is_a_deferral_not_an_attempt() -> None:
    deferred = ProviderResult(None, deferred_ms=1500, deferred_reason="RPM")
    completion = decide(JOB, deferred, None, NOW, POLICY)
    assert completion.refund_attempt
    assert completion.available_at == NOW + timedelta(milliseconds=1500)


EVENT = {
    "event_id": str(uuid.uuid4()),
    "event_type": "extraction.requested.v1",
    "tenant_id": str(uuid.uuid4()),
    "job_id": str(uuid.uuid4()),
    "state": "READY",
    "state_version": 1,
}
TYPES = {"extraction.requested.v1", "extraction.cancelled.v1"}


def test_a_good_event_parses_with_a_stable_digest() -> None:
    parsed = parse_event(dict(EVENT), TYPES)
    assert parsed.digest == parse_event(dict(reversed(list(EVENT.items()))), TYPES).digest
    assert parsed.digest != parse_event({**EVENT, "state_version": 2}, TYPES).digest


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ([1, 2], "malformed"),
        ({**EVENT, "event_type": "extraction.requested.v2"}, "unknown_version"),
        ({**EVENT, "event_type": "payment.made.v1"}, "unknown_type"),
        ({**EVENT, "job_id": "not-a-uuid"}, "malformed"),
        ({**EVENT, "state_version": True}, "malformed"),
        ({**EVENT, "pad": "x" * 10_000}, "too_large"),
    ],
)
def test_a_bad_event_is_refused_with_its_reason(event: object, reason: str) -> None:
    with pytest.raises(BadMessage) as refused:
        parse_event(event, TYPES)
    assert refused.value.reason == reason


def test_every_channel_open_in_its_breaker_is_a_wait_not_an_attempt() -> None:
    skipped = Hop("c1", "m", NOW, NOW, "skipped", sent=False)
    result = ProviderResult(
        None, [skipped], ErrorClass.NO_CHANNEL, "every channel is open", retry_after_ms=40_000
    )
    completion = decide(JOB, result, None, NOW, POLICY)
    assert completion.state == states.RETRY_SCHEDULED
    assert completion.refund_attempt
    assert completion.available_at == NOW + timedelta(seconds=40)
