"""The SDK's wait for a job (seed 004): the polling policy as a pure function, and start_and_await
against a scripted API on a fake clock (httpx.MockTransport; every sleep advances the clock)."""

from __future__ import annotations

import random

import httpx
import pytest
from sdk_fakes import JOB, FakeTime, Script, accepted, make_client, respond, status

from fatura_sdk import AwaitResult, PollPolicy, TransportError, Unauthorized
from fatura_sdk._polling import Waiter, outcome_of
from fatura_sdk.models import JobStatus

NO_JITTER = PollPolicy(jitter=0.0)


def _delays(policy: PollPolicy, hints: list[int | None], seed: int = 1) -> list[float]:
    rng, base, sleeps = random.Random(seed), None, []
    for hint in hints:
        base, sleep = policy.next_delay(base, hint, rng)
        sleeps.append(sleep)
    return sleeps


def test_the_first_delay_is_the_servers_and_each_next_one_grows_by_half_up_to_sixty_seconds() -> None:
    delays = _delays(NO_JITTER, [5] + [2] * 9)
    assert delays == pytest.approx([5, 7.5, 11.25, 16.875, 25.3125, 37.96875, 56.953125, 60, 60, 60])


def test_a_longer_poll_after_from_the_server_is_honoured_even_above_the_cap() -> None:
    assert _delays(NO_JITTER, [5, 30, 2]) == pytest.approx([5, 30, 45])
    assert _delays(NO_JITTER, [5, 300]) == pytest.approx([5, 300])


def test_without_a_hint_the_default_starts_the_backoff() -> None:
    assert _delays(NO_JITTER, [None, None, None]) == pytest.approx([2, 3, 4.5])


@pytest.mark.parametrize("seed", range(200))
def test_jitter_stays_between_the_delay_and_a_tenth_above_it_and_never_passes_the_cap(seed: int) -> None:
    policy = PollPolicy()
    rng, base = random.Random(seed), None
    for hint in [5, 2, 2, 2, 2, 2, 2, 2, 2, 2, 7]:
        base, sleep = policy.next_delay(base, hint, rng)
        assert hint <= base <= sleep <= min(60.0, base * 1.1) + 1e-9


def test_jitter_spreads_waiters_apart() -> None:
    sleeps = {round(_delays(PollPolicy(), [5, 2, 2], seed)[-1], 6) for seed in range(50)}
    assert len(sleeps) > 40


def test_only_a_done_succeeded_status_is_success() -> None:
    def of(state: str, done: bool) -> str | None:
        return outcome_of(JobStatus.from_json({**status(state), "done": done}))

    assert of("SUCCEEDED", True) == "succeeded"
    assert of("SUCCEEDED", False) is None  # never success before done
    assert of("REVIEW_REQUIRED", False) == "review_required"
    for final in ("FAILED_TERMINAL", "REJECTED", "CANCELLED", "SOME_FUTURE_FINAL_STATE"):
        assert of(final, True) == "failed"
    for running in ("READY", "RUNNING", "RETRY_SCHEDULED"):
        assert of(running, False) is None


# -- start_and_await on a fake clock -----------------------------------------------------------


def _script(*statuses: httpx.Response | Exception, poll_after: int = 5) -> tuple[FakeTime, Script]:
    time = FakeTime()
    script = Script(time)
    script.on("POST /v1/extraction-jobs", respond(202, accepted(poll_after=poll_after)))
    script.on(f"GET /v1/extraction-jobs/{JOB}", *statuses)
    return time, script


def test_a_slow_job_is_polled_with_backoff_and_succeeds_once_it_is_done() -> None:
    """Given a job that is READY, RUNNING, RUNNING, RUNNING and then SUCCEEDED
    When start_and_await waits for it
    Then it sleeps the server's 5 s first, then 1.5 times longer each time, submits once, and
    answers succeeded with the result and the job id."""
    time, script = _script(
        respond(200, status("READY")),
        *[respond(200, status("RUNNING")) for _ in range(3)],
        respond(200, status("SUCCEEDED", version=3, result={"invoice_number": "INV-1"})),
    )
    with make_client(script, poll_policy=NO_JITTER) as client:
        result = client.start_and_await("FATURA ...", max_wait=600)

    assert result.outcome == "succeeded" and result.succeeded and result.done
    assert (result.job_id, result.state, result.state_version) == (JOB, "SUCCEEDED", 3)
    assert result.result == {"invoice_number": "INV-1"}
    assert time.sleeps == pytest.approx([5, 7.5, 11.25, 16.875, 25.3125])
    assert [s.method for s in script.seen].count("POST") == 1
    assert result.polls == 5 and "COMPLETE" in result.message


def test_a_job_that_is_still_running_is_never_reported_as_succeeded() -> None:
    _, script = _script(respond(200, status("RUNNING")))
    with make_client(script) as client:
        result = client.start_and_await("text", max_wait=120)
    assert result.outcome == "timed_out" and not result.done and result.result is None


def test_a_late_failure_is_failed_with_its_error_not_a_finished_poll() -> None:
    _, script = _script(
        respond(200, status("RUNNING")),
        respond(
            200, status("RETRY_SCHEDULED", poll_after=3, last_error={"class": "provider_5xx", "message": ""})
        ),
        respond(200, status("RUNNING")),
        respond(
            200, status("FAILED_TERMINAL", version=6, error={"class": "provider_5xx", "message": "gave up"})
        ),
    )
    with make_client(script) as client:
        result = client.start_and_await("text", max_wait=600)
    assert (result.outcome, result.state, result.done) == ("failed", "FAILED_TERMINAL", True)
    assert result.error == {"class": "provider_5xx", "message": "gave up"}
    assert result.result is None and "FAILED" in result.message and "provider_5xx" in result.message


def test_the_timeout_returns_timed_out_with_the_job_id_and_never_sleeps_past_max_wait() -> None:
    """Given a job that stays RUNNING
    When start_and_await waits at most 100 s
    Then it returns timed_out (no exception) with the job id, the last state and the words NOT
    complete, having polled a last time at the deadline and not slept beyond it."""
    time, script = _script(respond(200, status("RUNNING")))
    start = time.now
    with make_client(script) as client:
        result = client.start_and_await("text", max_wait=100)

    assert result.outcome == "timed_out"
    assert (result.job_id, result.state, result.done, result.result) == (JOB, "RUNNING", False, None)
    assert "NOT complete" in result.message and JOB in result.message
    assert sum(time.sleeps) == pytest.approx(100)
    assert script.polls()[-1].at == pytest.approx(start + 100)
    assert result.poll_after_seconds is not None and result.poll_after_seconds >= 1
    assert result.to_dict()["outcome"] == "timed_out"


def test_review_required_ends_the_wait_at_once_without_a_result() -> None:
    reasons = [{"code": "iban_mismatch", "field": "supplier.iban", "message": "..."}]
    _, script = _script(
        respond(200, status("RUNNING")),
        respond(200, status("REVIEW_REQUIRED", poll_after=60, review={"reasons": reasons}, result={"x": 1})),
    )
    with make_client(script) as client:
        result = client.start_and_await("text", max_wait=3600)
    assert (result.outcome, result.done, result.result) == ("review_required", False, None)
    assert result.poll_after_seconds == 60 and len(script.polls()) == 2
    assert (
        "reviewer" in result.message
        and "NOT complete" in result.message
        and "iban_mismatch" in result.message
    )


def test_polls_that_get_no_answer_keep_the_wait_going_and_do_not_raise() -> None:
    time, script = _script(
        httpx.ConnectError("refused"),
        respond(503, {"error": {"code": "unavailable", "message": "down"}}, retry_after="7"),
        respond(500, {"error": {"code": "internal", "message": "oops"}}),
        respond(200, status("SUCCEEDED", result={})),
    )
    with make_client(script, poll_policy=NO_JITTER) as client:
        result = client.start_and_await("text", max_wait=600)
    assert result.outcome == "succeeded"
    assert time.sleeps[:3] == pytest.approx([5, 7.5, 11.25])  # Retry-After 7 < the backoff's 11.25


def test_a_poll_the_server_refuses_for_good_raises_its_typed_error() -> None:
    _, script = _script(respond(401, {"error": {"code": "unauthorized", "message": "revoked"}}))
    with make_client(script) as client, pytest.raises(Unauthorized):
        client.start_and_await("text", max_wait=600)


def test_a_replay_of_a_finished_job_reads_its_result_at_once() -> None:
    time = FakeTime()
    script = Script(time)
    script.on(
        "POST /v1/extraction-jobs",
        respond(202, accepted(state="SUCCEEDED", done=True), Idempotent_Replayed="true"),
    )
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status("SUCCEEDED", result={"a": 1})))
    with make_client(script) as client:
        result = client.start_and_await("text", idempotency_key="k1")
    assert result.outcome == "succeeded" and result.replayed and time.sleeps == []


def test_await_job_with_no_time_reads_once_and_reports_not_complete() -> None:
    time, script = _script(respond(200, status("RUNNING")))
    with make_client(script) as client:
        result = client.await_job(JOB, max_wait=0)
    assert result.outcome == "timed_out" and len(script.polls()) == 1 and time.sleeps == []


def test_the_waiter_is_pure_and_clips_its_last_sleep_to_the_deadline() -> None:
    time = FakeTime()
    waiter = Waiter(JOB, max_wait=10, policy=NO_JITTER, clock=time.clock)
    first = waiter.start(None)
    assert first == 0.0
    step = waiter.observe(JobStatus.from_json(status("RUNNING", poll_after=8)))
    assert step == 8.0
    time.now += 8
    step = waiter.observe(JobStatus.from_json(status("RUNNING", poll_after=8)))
    assert step == pytest.approx(2.0)  # 12 s wanted, 2 s left
    time.now += 2
    final = waiter.observe(JobStatus.from_json(status("RUNNING")))
    assert isinstance(final, AwaitResult) and final.outcome == "timed_out" and final.polls == 3


def test_a_transport_error_says_whether_the_request_was_sent() -> None:
    from fatura_sdk._http import translate

    assert translate(httpx.ConnectError("x")).sent is False
    assert translate(httpx.ReadTimeout("x")).sent is True
    assert isinstance(translate(httpx.RemoteProtocolError("x")), TransportError)
