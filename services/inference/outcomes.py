"""What an attempt ends in, decided from the provider's answer and the validation verdict (pure).

Validation failures are the data's problem and go to review; broken JSON and schema failures are
the model's problem and are retried within the budget; transport errors follow the retry schedule
(DESIGN §5.7, §5.8). Nothing sent (every channel denied by the limiter) is a deferral, not an
attempt.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

from services.common import states
from services.inference.claims import ClaimedJob, Completion
from services.inference.providers.base import ErrorClass, Hop, ProviderResult
from services.inference.retry import GiveUp, RetryPolicy, next_step
from services.inference.validation import Verdict

WORKER_ERROR = "worker_error"
NO_CHANNEL_WAIT_MS = 1_000


def decide(
    job: ClaimedJob,
    result: ProviderResult,
    verdict: Verdict | None,
    now: datetime,
    policy: RetryPolicy,
    rng: random.Random | None = None,
) -> Completion:
    hops = tuple(result.hops)
    usage = {
        "input_tokens": result.input_tokens,
        "output_tokens": result.output_tokens,
        "total_tokens": result.input_tokens + result.output_tokens,
    }
    if result.deferred_ms is not None and not result.sent:
        return Completion(
            states.RETRY_SCHEDULED,
            hops,
            available_at=now + timedelta(milliseconds=result.deferred_ms),
            error_class="deferred",
            error_message=f"limiter denied every channel ({result.deferred_reason}); not an attempt",
            refund_attempt=True,
        )
    if result.error_class == ErrorClass.NO_CHANNEL and not result.sent:
        # Every channel's breaker is open: nothing was sent, so this is a wait, not an attempt.
        # Counting it would spend a job's whole retry budget during one breaker cooldown.
        wait_ms = result.retry_after_ms or NO_CHANNEL_WAIT_MS
        return Completion(
            states.RETRY_SCHEDULED,
            hops,
            available_at=now + timedelta(milliseconds=wait_ms),
            error_class="deferred",
            error_message=f"{result.error_message}; not an attempt",
            refund_attempt=True,
        )
    if result.ok and verdict is not None:
        if verdict.outcome == "succeeded":
            return Completion(
                states.SUCCEEDED,
                hops,
                result=verdict.result,
                usage=usage,
                policy_version=verdict.policy_version,
            )
        if verdict.outcome == "review_required":
            return Completion(
                states.REVIEW_REQUIRED,
                hops,
                result=verdict.result,
                review_reasons=[reason.to_json() for reason in verdict.reasons],
                usage=usage,
                policy_version=verdict.policy_version,
            )
        model_error = verdict.error_class or "model_error"
        if hops:  # the exchange went fine; the answer did not: the attempt's row says so
            hops = (*hops[:-1], replace(hops[-1], outcome=model_error, error_message=verdict.error_message))
        return _retry_or_fail(
            job,
            hops,
            model_error,
            verdict.error_message,
            None,
            now,
            policy,
            usage,
            rng,
        )
    error_class = result.error_class.value if result.error_class else WORKER_ERROR
    if result.error_class is not None and not result.retryable:
        return Completion(
            states.FAILED_TERMINAL,
            hops,
            error_class=error_class,
            error_message=result.error_message,
            usage=usage,
        )
    return _retry_or_fail(
        job, hops, error_class, result.error_message, result.retry_after_ms, now, policy, usage, rng
    )


def _retry_or_fail(
    job: ClaimedJob,
    hops: tuple[Hop, ...],
    error_class: str,
    message: str | None,
    retry_after_ms: int | None,
    now: datetime,
    policy: RetryPolicy,
    usage: dict[str, int],
    rng: random.Random | None,
) -> Completion:
    step = next_step(job.attempt, now, job.deadline_at, policy, retry_after_ms, rng)
    if isinstance(step, GiveUp):
        text = f"{message or error_class}; no retry: {step.reason}"
        return Completion(
            states.FAILED_TERMINAL, hops, error_class=error_class, error_message=text, usage=usage
        )
    return Completion(
        states.RETRY_SCHEDULED,
        hops,
        error_class=error_class,
        error_message=message,
        usage=usage,
        available_at=step.at,
    )
