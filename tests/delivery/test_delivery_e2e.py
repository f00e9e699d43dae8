"""Deliveries end to end: the edge, the delivery worker and scheduler, and the reference ERP as real
processes, on real PostgreSQL and RabbitMQ. Faults are armed on the ERP at run time."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from typing import Any

import dramatiq
import httpx
import pytest
import standardwebhooks

from fix_db import MakeTenant, SyncPool
from fix_delivery import (
    Erp,
    Jobs,
    Receiver,
    RegisterFn,
    StartProcess,
    count_extraction_work,
    deliveries,
    settled,
    wait_for,
)
from fix_processes import ServiceProcess
from services.common import events


@pytest.fixture(autouse=True)
def _clean_erp(erp: Erp) -> Any:
    erp.clear()
    yield
    erp.clear()


def _applied(erp: Erp, job_id: uuid.UUID) -> dict[str, Any]:
    entry: dict[str, Any] = wait_for(lambda: erp.ledger(job_id), 20, f"job {job_id} in the ERP ledger")
    return entry


def test_a_finished_job_reaches_the_erp_once_signed_and_every_attempt_is_recorded(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    # Given a tenant whose endpoint is the ERP, verified by the ping the delivery service sends
    endpoint = register(erp.webhook_url)
    assert endpoint.body["verification"]["state"] == "pending"
    wait_for(
        lambda: dclient.get(
            f"/v1/webhook-endpoints/{endpoint.endpoint_id}", headers=endpoint.tenant.headers
        ).json()["verified"],
        20,
        "the endpoint to be verified by its ping",
    )
    # When one of its jobs completes
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    # Then the ERP applies it once, and the delivery shows one 2xx attempt
    entry = _applied(erp, job_id)
    assert entry["state"] == "SUCCEEDED" and entry["effects"] == 1
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "delivered"
    assert entry["webhook_ids"] == [delivery["delivery_id"]]
    assert [(a["attempt"], a["outcome"], a["http_status"]) for a in delivery["attempts"]] == [
        (1, "delivered", 200)
    ]


def test_while_the_erp_is_down_deliveries_wait_and_drain_when_it_returns_without_rerunning_extraction(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client, pool: SyncPool
) -> None:
    # Given an ERP that drops every connection
    endpoint = register(erp.webhook_url)
    erp.fault("down")
    job_ids = [jobs.submit(endpoint.tenant) for _ in range(3)]
    before = {j: count_extraction_work(pool, j) for j in job_ids}
    # When three jobs complete and their deliveries have failed at least twice each
    for job_id in job_ids:
        jobs.complete(endpoint.tenant, job_id)

    def failed_twice() -> bool:
        found = [deliveries(dclient, endpoint.tenant, j) for j in job_ids]
        return all(len(d) == 1 and len(d[0]["attempts"]) >= 2 for d in found)

    wait_for(failed_twice, 20, "two failed attempts per delivery")
    assert all(erp.ledger(j) is None for j in job_ids)
    waiting = [deliveries(dclient, endpoint.tenant, j)[0] for j in job_ids]
    assert {d["state"] for d in waiting} <= {"pending", "delivering"}
    # Then, once it is back, each job is applied exactly once
    erp.clear()
    for job_id in job_ids:
        assert settled(dclient, endpoint.tenant, job_id, timeout=30)["state"] == "delivered"
        entry = _applied(erp, job_id)
        assert entry["effects"] == 1 and len(entry["webhook_ids"]) == 1
    # And the model was never asked again: no new attempts, no new extraction requests
    assert {j: count_extraction_work(pool, j) for j in job_ids} == before


def test_410_disables_the_endpoint_and_recover_sends_what_failed_meanwhile(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    # Given the ERP answers 410 Gone once
    endpoint = register(erp.webhook_url)
    headers = endpoint.tenant.headers
    erp.fault("gone", count=1)
    first = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, first)
    # Then that delivery fails without a retry and the endpoint is disabled
    delivery = settled(dclient, endpoint.tenant, first)
    assert delivery["state"] == "failed" and delivery["last_status"] == 410
    assert len(delivery["attempts"]) == 1
    listed = dclient.get("/v1/webhook-endpoints", headers=headers).json()["endpoints"]
    assert listed[0]["state"] == "disabled" and "410" in listed[0]["disabled_reason"]
    # And an event arriving while it is disabled waits as a failed delivery
    second = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, second)
    assert settled(dclient, endpoint.tenant, second)["reason"].startswith("endpoint_disabled")
    # When the tenant enables it and recovers everything since the registration
    assert (
        dclient.post(f"/v1/webhook-endpoints/{endpoint.endpoint_id}:enable", headers=headers).status_code
        == 200
    )
    recovered = dclient.post(
        f"/v1/webhook-endpoints/{endpoint.endpoint_id}:recover",
        json={"since": endpoint.body["created_at"]},
        headers=headers,
    )
    assert recovered.status_code == 200 and recovered.json()["resent"] == 2
    # Then both jobs reach the ERP once
    for job_id in (first, second):
        assert settled(dclient, endpoint.tenant, job_id)["state"] == "delivered"
        assert _applied(erp, job_id)["effects"] == 1


def test_repeated_401_raise_an_alarm_and_disable_the_endpoint(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    # Given an ERP that refuses us with 401 (the worker's limit is 2 in a row)
    endpoint = register(erp.webhook_url)
    erp.fault("unauthorized")
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    # Then after two refusals the endpoint is disabled, the alarm is logged, and the delivery stops
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "failed" and delivery["reason"].startswith("endpoint_disabled")
    assert [a["http_status"] for a in delivery["attempts"]] == [401, 401]
    listed = dclient.get("/v1/webhook-endpoints", headers=endpoint.tenant.headers).json()["endpoints"]
    assert listed[0]["state"] == "disabled" and "401/403" in listed[0]["disabled_reason"]
    assert f"ALARM endpoint {endpoint.endpoint_id}" in worker.log()
    assert erp.ledger(job_id) is None


def test_429_with_retry_after_is_retried_no_sooner_than_asked(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    endpoint = register(erp.webhook_url)
    erp.fault("rate_limited", count=1, retry_after=1)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "delivered"
    limited, ok = delivery["attempts"]
    assert (limited["http_status"], limited["retry_after_ms"], ok["http_status"]) == (429, 1000, 200)
    waited = datetime.fromisoformat(ok["started_at"]) - datetime.fromisoformat(limited["ended_at"])
    assert waited.total_seconds() >= 0.9  # the schedule alone would have waited about 10 ms
    assert _applied(erp, job_id)["effects"] == 1


def test_a_redirect_is_a_failure_and_is_never_followed(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    endpoint = register(erp.webhook_url)
    erp.fault("redirect", count=1, location="http://169.254.169.254/latest/meta-data/")
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "failed" and delivery["last_status"] == 307
    assert "redirects are not followed" in delivery["reason"]
    assert erp.stats()["redirects_followed"] == 0
    assert erp.ledger(job_id) is None


def test_a_huge_response_is_cut_off_and_a_slow_one_times_out_without_stalling_the_worker(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    endpoint = register(erp.webhook_url)
    # Given the ERP answers one delivery with 64 MiB and then takes 5 s (read timeout: 1 s) for one
    erp.fault("huge_response", count=1, size_bytes=64 * 1024 * 1024)
    huge = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, huge)
    first = settled(dclient, endpoint.tenant, huge)
    erp.fault("slow", count=1, delay_s=5)
    slow = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, slow)
    second = settled(dclient, endpoint.tenant, slow)
    # Then each is retried and delivered, the huge body stored only up to 4 KiB
    assert first["state"] == "delivered" and second["state"] == "delivered"
    cut = first["attempts"][0]
    assert cut["http_status"] == 500 and 0 < len(cut["response_body"].encode()) <= 4096
    assert second["attempts"][0]["error_class"] == "read_timeout"


def test_rotation_signs_with_both_secrets_during_the_overlap_and_only_the_new_one_after(
    worker: ServiceProcess, register: RegisterFn, receiver: Receiver, jobs: Jobs, dclient: httpx.Client
) -> None:
    # Given an endpoint whose every request a test receiver keeps raw
    old = standardwebhooks_secret()
    endpoint = register(receiver.url, secret=old)
    wait_for(lambda: receiver.received, 5, "the registration ping")
    ping = receiver.received[0]
    assert json.loads(ping.body)["type"] == "webhook.ping.v1"
    standardwebhooks.Webhook(old).verify(ping.body, ping.headers)
    # When the secret is rotated with a 2 s overlap
    rotated = dclient.post(
        f"/v1/webhook-endpoints/{endpoint.endpoint_id}:rotate-secret",
        json={"overlap_seconds": 2},
        headers=endpoint.tenant.headers,
    )
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    during = _deliver_one(jobs, endpoint.tenant, receiver)
    # Then a delivery inside the overlap verifies with either secret (the standardwebhooks library)
    assert len(during.headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        assert (
            standardwebhooks.Webhook(secret).verify(during.body, during.headers)["type"]
            == "extraction.completed.v1"
        )
    # And after the overlap only the new secret signs
    time.sleep(2.1)
    after = _deliver_one(jobs, endpoint.tenant, receiver)
    assert len(after.headers["webhook-signature"].split()) == 1
    standardwebhooks.Webhook(new).verify(after.body, after.headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(old).verify(after.body, after.headers)


def standardwebhooks_secret() -> str:
    from services.delivery.signing import new_secret

    return new_secret()


def _deliver_one(jobs: Jobs, tenant: Any, receiver: Receiver) -> Any:
    seen = len(receiver.received)
    job_id = jobs.submit(tenant)
    jobs.complete(tenant, job_id)
    wait_for(lambda: len(receiver.received) > seen, 20, "a delivery at the test receiver")
    request = receiver.received[seen]
    body = json.loads(request.body)
    assert body["data"]["job_id"] == str(job_id) and request.headers["webhook-id"]
    return request


def test_an_event_delivered_twice_by_the_broker_makes_one_delivery_and_a_changed_one_is_quarantined(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client, pool: SyncPool
) -> None:
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    event = jobs.complete(endpoint.tenant, job_id)
    jobs.publish(event)  # the relay crashed after the confirm and published again
    jobs.publish({**event, "state_version": event["state_version"] + 5})  # same id, other payload
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "delivered"

    def quarantined() -> int:
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM inbox_quarantine WHERE inbox = 'delivery_inbox' AND event_id = %s",
                (event["event_id"],),
            ).fetchone()
        return int(row["n"]) if row else 0

    assert wait_for(quarantined, 10, "the changed event in quarantine") == 1
    assert len(deliveries(dclient, endpoint.tenant, job_id)) == 1
    assert _applied(erp, job_id)["effects"] == 1


def test_a_job_awaiting_review_never_reaches_an_erp_endpoint_only_a_review_tool_that_asked(
    worker: ServiceProcess,
    register: RegisterFn,
    erp: Erp,
    receiver: Receiver,
    make_tenant: MakeTenant,
    jobs: Jobs,
    dclient: httpx.Client,
) -> None:
    # Given a tenant with an ERP endpoint (default event types) and a review tool that asked for
    # review requests
    tenant = make_tenant()
    erp_endpoint = register(erp.webhook_url, tenant=tenant)
    tool = register(
        receiver.url, secret=standardwebhooks_secret(), tenant=tenant, event_types=["review.requested.v1"]
    )
    # When a job ends in review
    review = jobs.submit(tenant)
    jobs.complete(tenant, review, state="REVIEW_REQUIRED", event_type=events.REVIEW_REQUESTED)
    # Then only the review tool gets it: ids and reason codes, not the unvalidated fields
    found = settled(dclient, tenant, review)
    assert found["endpoint_id"] == tool.endpoint_id and found["event_type"] == "review.requested.v1"
    body = next(
        json.loads(r.body) for r in receiver.received if json.loads(r.body)["type"] == "review.requested.v1"
    )
    assert body["data"]["review"]["reasons"] == [{"code": "arithmetic", "field": None}]
    assert "result" not in body["data"] and "AK-" not in json.dumps(body)
    assert erp.ledger(review) is None
    assert erp_endpoint.endpoint_id not in [d["endpoint_id"] for d in deliveries(dclient, tenant, review)]


def test_resend_sends_the_same_webhook_id_again_and_the_erp_does_not_apply_it_twice(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery = settled(dclient, endpoint.tenant, job_id)
    resent = dclient.post(f"/v1/deliveries/{delivery['delivery_id']}:resend", headers=endpoint.tenant.headers)
    assert resent.status_code == 200 and resent.json()["state"] == "pending"
    again = wait_for(
        lambda: (d := settled(dclient, endpoint.tenant, job_id)) and len(d["attempts"]) == 2 and d,
        20,
        "the resend",
    )
    assert again["state"] == "delivered"
    entry = _applied(erp, job_id)
    assert entry["effects"] == 1 and entry["counts"]["duplicates"] == 1


def test_a_bad_message_is_dead_lettered_with_its_reason_and_changes_nothing(
    worker: ServiceProcess, jobs: Jobs, pool: SyncPool, queue_prefix: str, register: RegisterFn, erp: Erp
) -> None:
    # Given a malformed event, one naming a job that does not exist, and one that misstates a job
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    real = jobs.complete(endpoint.tenant, job_id, publish=False)
    liar_id = str(uuid.uuid4())
    jobs.publish(
        {**real, "event_id": liar_id, "state": "FAILED_TERMINAL", "event_type": "extraction.failed.v1"}
    )
    bad_id, ghost_id = str(uuid.uuid4()), str(uuid.uuid4())
    jobs.publish({"event_type": "extraction.completed.v1", "event_id": "not-a-uuid"}, message_id=bad_id)
    ghost = {
        "event_id": ghost_id,
        "event_type": "extraction.completed.v1",
        "tenant_id": str(uuid.uuid4()),
        "job_id": str(uuid.uuid4()),
        "state": "SUCCEEDED",
        "state_version": 2,
    }
    jobs.publish(ghost)

    def refusals() -> dict[str, str]:
        with pool.connection() as conn:
            rows = conn.execute(
                "SELECT message_id, reason FROM dead_letters WHERE queue = %s AND message_id = ANY(%s)",
                (f"{queue_prefix}.delivery.ingest", [bad_id, ghost_id, liar_id]),
            ).fetchall()
        return {r["message_id"]: r["reason"] for r in rows}

    # Then each is refused with its reason, and nothing was taken in
    assert wait_for(lambda: len(refusals()) == 3 and refusals(), 10, "three refusals") == {
        bad_id: "malformed",
        ghost_id: "unknown_job",
        liar_id: "state_mismatch",
    }
    assert deliveries(jobs.client, endpoint.tenant, job_id) == []
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM delivery_inbox WHERE event_id = %s", (ghost_id,)
        ).fetchone()
    assert row is not None and row["n"] == 0
    assert worker.alive()


def test_a_message_of_several_events_delivers_the_good_one_and_dead_letters_each_bad_one_alone(
    worker: ServiceProcess,
    jobs: Jobs,
    pool: SyncPool,
    queue_prefix: str,
    register: RegisterFn,
    erp: Erp,
    dclient: httpx.Client,
) -> None:
    # Given a completion, one that misstates its job, and one that is malformed, in one message
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    real = jobs.complete(endpoint.tenant, job_id, publish=False)
    liar_id, bad_id = str(uuid.uuid4()), f"not-a-uuid-{uuid.uuid4().hex[:8]}"
    liar = {**real, "event_id": liar_id, "state": "FAILED_TERMINAL", "event_type": "extraction.failed.v1"}
    bad = {"event_type": "extraction.completed.v1", "event_id": bad_id}
    pack_id = str(uuid.uuid4())
    jobs.publish_together([liar, real, bad], pack_id)

    def refusals() -> dict[str, Any]:
        with pool.connection() as conn:
            rows = conn.execute(
                "SELECT message_id, reason, message FROM dead_letters"
                " WHERE queue = %s AND message_id = ANY(%s)",
                (f"{queue_prefix}.delivery.ingest", [liar_id, bad_id, pack_id]),
            ).fetchall()
        return {r["message_id"]: r for r in rows}

    # Then the good one is delivered once, and each bad one is a dead letter of its own
    assert settled(dclient, endpoint.tenant, job_id)["state"] == "delivered"
    assert _applied(erp, job_id)["effects"] == 1
    found = wait_for(lambda: len(refusals()) == 2 and refusals(), 10, "two refusals")
    assert {key: row["reason"] for key, row in found.items()} == {
        liar_id: "state_mismatch",
        bad_id: "malformed",
    }
    assert found[liar_id]["message"]["kwargs"] == {"event": liar}
    assert worker.alive()


def test_one_message_of_five_completions_delivers_each_once_through_shared_wake_ups(
    worker: ServiceProcess, jobs: Jobs, register: RegisterFn, erp: Erp, dclient: httpx.Client
) -> None:
    # Given five jobs of one endpoint completed together (one relay message, so one wake-up)
    endpoint = register(erp.webhook_url)
    job_ids = [jobs.submit(endpoint.tenant) for _ in range(5)]
    done = [jobs.complete(endpoint.tenant, job_id, publish=False) for job_id in job_ids]
    jobs.publish_together(done, str(uuid.uuid4()))
    # Then the ERP applies each exactly once
    for job_id in job_ids:
        assert settled(dclient, endpoint.tenant, job_id)["state"] == "delivered"
        assert _applied(erp, job_id)["effects"] == 1


@pytest.mark.parametrize("args", [(), ("not-a-uuid",), tuple(str(uuid.uuid4()) for _ in range(65))])
def test_a_wake_up_naming_no_delivery_a_bad_one_or_too_many_is_dead_lettered(
    worker: ServiceProcess, jobs: Jobs, pool: SyncPool, queue_prefix: str, args: tuple[str, ...]
) -> None:
    message_id = str(uuid.uuid4())
    jobs.broker.enqueue(
        dramatiq.Message(
            queue_name=f"{queue_prefix}.delivery.deliver",
            actor_name="deliver",
            args=args,
            kwargs={},
            options={},
            message_id=message_id,
        )
    )

    def refusal() -> str | None:
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT reason FROM dead_letters WHERE message_id = %s", (message_id,)
            ).fetchone()
        return None if row is None else str(row["reason"])

    assert wait_for(refusal, 10, "the refusal") == "malformed"
    assert worker.alive()


def _park_other_deliveries(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    """Put every other tenant's unfinished delivery an hour away."""
    with pool.connection() as conn:
        conn.execute(
            """UPDATE deliveries
               SET next_attempt_at = now() + interval '1 hour',
                   lease_until = CASE WHEN state = 'delivering' THEN now() + interval '1 hour' END
               WHERE tenant_id <> %s AND state IN ('pending', 'delivering')""",
            (tenant_id,),
        )


def test_a_worker_killed_after_the_post_makes_the_erp_receive_twice_and_apply_once(
    worker: ServiceProcess,
    start_worker: StartProcess,
    erp: Erp,
    register: RegisterFn,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    # Given the only delivery worker dies right after a webhook POST, before recording it (this test
    # runs last in the module: it replaces the module's worker), and no other delivery falls due
    # while it lives: earlier tests leave retries to receivers that are gone, and the doomed worker
    # must make its one POST to this test's ERP
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    worker.stop()
    _park_other_deliveries(pool, endpoint.tenant.id)
    doomed = start_worker(FATURA_FAULTS="crash_after_webhook_post")
    jobs.complete(endpoint.tenant, job_id)
    doomed.wait_exit(timeout=30)
    entry = _applied(erp, job_id)
    assert entry["effects"] == 1
    # When a healthy worker takes over after the dead one's lease runs out
    start_worker()
    delivery = settled(dclient, endpoint.tenant, job_id, timeout=30)
    # Then the ERP got the same webhook-id twice and applied it once
    assert delivery["state"] == "delivered"
    entry = _applied(erp, job_id)
    assert entry["effects"] == 1
    assert entry["webhook_ids"] == [delivery["delivery_id"]]
    assert entry["counts"]["duplicates"] == 1
    outcomes = [a["outcome"] for a in delivery["attempts"]]
    assert outcomes == ["lost", "delivered"]
