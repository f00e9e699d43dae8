"""The per-channel circuit breaker as a pure state machine (seed 001, layer 1; no I/O here).

``failures`` retryable failures within ``window_ms`` open a channel for ``cooldown_ms``: it is
skipped before anything is sent. After the cooldown, while those failures are still in the window,
the channel is half-open: one caller at a time gets a trial call (held for at most ``trial_ms``, so a
trial whose worker died does not keep it shut). A trial that gets any answer closes the channel and
forgets its failures; a failed trial opens it again at once. ``lua/breaker.lua`` runs this same
machine inside Redis, and a test drives both with the same steps and compares them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from services.inference.providers.settings import BreakerPolicy


class Verdict(StrEnum):
    CLOSED = "closed"  # send
    TRIAL = "trial"  # send: this call is the one half-open trial
    OPEN = "open"  # skip: nothing is sent


class Report(StrEnum):
    FAILURE = "failure"  # a retryable failure (429, 5xx, connection, header timeout, error frame)
    SUCCESS = "success"  # the channel answered (even a 400 proves it is up)
    RELEASE = "release"  # neither: a trial ended by our own deadline gives the trial back


@dataclass(frozen=True)
class BreakerState:
    failures: tuple[int, ...] = ()  # ms timestamps, oldest first
    open_until: int = 0
    trial_until: int = 0


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    wait_ms: int = 0  # when OPEN: how long until the channel may be tried again

    @property
    def allowed(self) -> bool:
        return self.verdict is not Verdict.OPEN


def _recent(failures: tuple[int, ...], now: int, policy: BreakerPolicy) -> tuple[int, ...]:
    return tuple(t for t in failures if now - t < policy.window_ms)


def admit(state: BreakerState, now: int, policy: BreakerPolicy) -> tuple[Admission, BreakerState]:
    if state.open_until > now:
        return Admission(Verdict.OPEN, state.open_until - now), state
    failures = _recent(state.failures, now, policy)
    if len(failures) < policy.failures:
        return Admission(Verdict.CLOSED), replace(state, failures=failures)
    if state.trial_until > now:
        return Admission(Verdict.OPEN, state.trial_until - now), replace(state, failures=failures)
    return Admission(Verdict.TRIAL), replace(state, failures=failures, trial_until=now + policy.trial_ms)


def report(
    state: BreakerState, now: int, policy: BreakerPolicy, outcome: Report, *, trial: bool
) -> BreakerState:
    if outcome is Report.FAILURE:
        failures = (*_recent(state.failures, now, policy), now)
        open_until = now + policy.cooldown_ms if len(failures) >= policy.failures else state.open_until
        trial_until = 0 if trial else state.trial_until
        return BreakerState(failures, open_until, trial_until)
    if not trial:
        # An ordinary success leaves the count alone: failures age out of the window by themselves,
        # so a channel that fails every other call still opens.
        return state
    if outcome is Report.SUCCESS:
        return BreakerState()
    return replace(state, trial_until=0)
