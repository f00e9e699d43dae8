"""The reference ERP as a real process (``fatura run erp``) receiving signed webhooks over HTTP.

What a sender sees (status codes, dropped connections) and what the ERP's ledger holds afterwards:
every effect once, only newer state versions, nothing from a refused or faulted request.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks

from fatura_sdk import generate_secret, sign_headers
from fix_processes import ROOT, ServiceProcess, SpawnFn
from services.common.procs import fatura_command, free_port

SECRET = generate_secret()
ROTATED_OUT = generate_secret()


def start_erp(spawn: SpawnFn, db: Path, **env: str) -> ServiceProcess:
    port = free_port()
    erp = spawn("erp", FATURA_ERP_PORT=str(port), FATURA_ERP_DB=str(db), **env)
    erp.base_url = f"http://127.0.0.1:{port}"
    erp.wait_ready(f"{erp.base_url}/readyz")
    return erp


@pytest.fixture(scope="module")
def erp(spawn: SpawnFn, tmp_path_factory: pytest.TempPathFactory) -> ServiceProcess:
    return start_erp(spawn, tmp_path_factory.mktemp("erp") / "erp.sqlite", FATURA_ERP_SECRETS=SECRET)


@pytest.fixture
def http(erp: ServiceProcess) -> Iterator[httpx.Client]:
    assert erp.base_url is not None
    with httpx.Client(base_url=erp.base_url, timeout=10.0) as client:
        yield client
        client.delete("/admin/faults")


def job_event(
    job_id: str, version: int, state: str = "SUCCEEDED", kind: str = "extraction.completed.v1"
) -> dict[str, Any]:
    return {
        "type": kind,
        "id": str(uuid.uuid4()),
        "timestamp": datetime.now(tz=UTC).isoformat(),
        "data": {
            "job_id": job_id,
            "tenant_id": "7d0c5b0e-1f7e-4c56-8f0e-2a3b4c5d6e7f",
            "state": state,
            "state_version": version,
            "result": {"invoice_number": "FTR-2026-184", "total": "1180.00", "currency": "TRY"},
            "policy_version": "invoice-policy.v1",
            "status_url": f"/v1/extraction-jobs/{job_id}",
            "occurred_at": datetime.now(tz=UTC).isoformat(),
        },
    }


def deliver(
    http: httpx.Client,
    webhook_id: str,
    event: dict[str, Any] | bytes,
    secrets: list[str] | None = None,
    timestamp: int | None = None,
) -> httpx.Response:
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    headers = sign_headers(secrets or [SECRET], webhook_id, body, timestamp=timestamp)
    return http.post("/webhooks", content=body, headers=headers)


def ledger_entry(http: httpx.Client, job_id: str) -> dict[str, Any] | None:
    jobs = http.get("/ledger", params={"job_id": job_id}).json()["jobs"]
    assert len(jobs) <= 1
    return jobs[0] if jobs else None


def new_ids() -> tuple[str, str]:
    return str(uuid.uuid4()), str(uuid.uuid4())


def test_a_signed_completion_is_applied_and_shows_in_the_ledger(http: httpx.Client) -> None:
    job_id, webhook_id = new_ids()

    answer = deliver(http, webhook_id, job_event(job_id, 4))

    assert (answer.status_code, answer.json()["status"]) == (200, "accepted")
    entry = ledger_entry(http, job_id)
    assert entry is not None
    assert (entry["state"], entry["state_version"], entry["effects"]) == ("SUCCEEDED", 4, 1)
    assert entry["webhook_ids"] == [webhook_id]
    assert entry["result_digest"] is not None


def test_during_rotation_a_delivery_signed_with_old_and_new_secret_is_accepted(
    http: httpx.Client,
) -> None:
    job_id, webhook_id = new_ids()

    answer = deliver(http, webhook_id, job_event(job_id, 2), secrets=[ROTATED_OUT, SECRET])

    assert answer.json()["status"] == "accepted"


def _wrong_secret(h: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    return sign_headers(generate_secret(), h["webhook-id"], body), body


def _tampered(h: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    return h, body.replace(b"1180.00", b"9180.00")


def _stale(h: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    return sign_headers(SECRET, h["webhook-id"], body, timestamp=int(time.time()) - 3600), body


def _future(h: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    return sign_headers(SECRET, h["webhook-id"], body, timestamp=int(time.time()) + 3600), body


def _without(name: str) -> Any:
    def strip(h: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        return {k: v for k, v in h.items() if k != name}, body

    return strip


@pytest.mark.parametrize(
    ("spoil", "code"),
    [
        (_wrong_secret, "bad_signature"),
        (_tampered, "bad_signature"),
        (_stale, "stale_timestamp"),
        (_future, "future_timestamp"),
        (_without("webhook-id"), "missing_header"),
        (_without("webhook-timestamp"), "missing_header"),
        (_without("webhook-signature"), "missing_header"),
    ],
    ids=["wrong-secret", "tampered-body", "stale", "future", "no-id", "no-timestamp", "no-signature"],
)
def test_a_webhook_that_fails_verification_is_401_and_stores_nothing(
    http: httpx.Client, spoil: Any, code: str
) -> None:
    job_id, webhook_id = new_ids()
    body = json.dumps(job_event(job_id, 3)).encode()
    headers, sent = spoil(sign_headers(SECRET, webhook_id, body), body)
    refused_before = http.get("/admin/stats").json()["counts"]["unauthorized"]

    answer = http.post("/webhooks", content=sent, headers=headers)

    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == code
    assert ledger_entry(http, job_id) is None
    assert http.get("/admin/stats").json()["counts"]["unauthorized"] == refused_before + 1
    # The same delivery, correctly signed, is then new to the ERP: nothing was stored for it.
    assert deliver(http, webhook_id, body).json()["status"] == "accepted"


def test_a_redelivered_webhook_is_applied_once(http: httpx.Client) -> None:
    job_id, webhook_id = new_ids()
    event = job_event(job_id, 5)

    answers = [deliver(http, webhook_id, event) for _ in range(3)]

    assert [(a.status_code, a.json()["status"]) for a in answers] == [
        (200, "accepted"),
        (200, "duplicate"),
        (200, "duplicate"),
    ]
    entry = ledger_entry(http, job_id)
    assert entry is not None
    assert entry["effects"] == 1
    assert entry["counts"] == {"received": 1, "applied": 1, "not_newer": 0, "duplicates": 2}


def test_concurrent_copies_of_one_delivery_are_applied_exactly_once(erp: ServiceProcess) -> None:
    # Given a sender that (after timeouts) has the same delivery in flight sixteen times at once
    job_id, webhook_id = new_ids()
    body = json.dumps(job_event(job_id, 2)).encode()
    barrier = threading.Barrier(16)

    def send() -> str:
        with httpx.Client(base_url=erp.base_url or "", timeout=30.0) as own:
            barrier.wait()
            answer = deliver(own, webhook_id, body)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["status"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = Counter(pool.map(lambda _: send(), range(16)))

    # Then one copy is accepted, the rest are duplicates, and the ledger holds one effect
    assert outcomes == Counter({"accepted": 1, "duplicate": 15})
    with httpx.Client(base_url=erp.base_url or "", timeout=10.0) as http:
        entry = ledger_entry(http, job_id)
    assert entry is not None
    assert (entry["effects"], entry["counts"]["duplicates"]) == (1, 15)


def test_the_same_webhook_id_with_a_different_payload_is_409_and_alerted(
    http: httpx.Client, erp: ServiceProcess
) -> None:
    job_id, webhook_id = new_ids()
    deliver(http, webhook_id, job_event(job_id, 3))
    conflicts_before = http.get("/admin/stats").json()["counts"]["conflict"]

    clash = deliver(http, webhook_id, job_event(job_id, 3, state="REVIEW_REQUIRED"))

    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "webhook_id_conflict"
    assert http.get("/admin/stats").json()["counts"]["conflict"] == conflicts_before + 1
    entry = ledger_entry(http, job_id)
    assert entry is not None and entry["state"] == "SUCCEEDED"
    assert any("ERROR" in line and webhook_id in line for line in erp.log().splitlines())


def test_an_older_state_version_arriving_after_a_newer_one_is_not_applied(http: httpx.Client) -> None:
    job_id = str(uuid.uuid4())
    newer, older = str(uuid.uuid4()), str(uuid.uuid4())

    first = deliver(http, newer, job_event(job_id, 6, state="REJECTED", kind="extraction.rejected.v1"))
    late = deliver(http, older, job_event(job_id, 4, state="SUCCEEDED"))

    assert first.status_code == late.status_code == 200
    entry = ledger_entry(http, job_id)
    assert entry is not None
    assert (entry["state"], entry["state_version"], entry["effects"]) == ("REJECTED", 6, 1)
    assert [r["outcome"] for r in entry["receipts"]] == ["applied", "not_newer"]


def test_a_ping_is_answered_after_verification_with_no_ledger_effect(http: httpx.Client) -> None:
    ping = {"type": "webhook.ping.v1", "id": str(uuid.uuid4()), "timestamp": "2026-11-30T07:00:00Z"}
    ping["data"] = {"endpoint_id": str(uuid.uuid4())}
    jobs_before = len(http.get("/ledger").json()["jobs"])

    answer = deliver(http, str(uuid.uuid4()), ping)
    forged = deliver(http, str(uuid.uuid4()), ping, secrets=[generate_secret()])

    assert (answer.status_code, answer.json()) == (200, {"status": "pong"})
    assert forged.status_code == 401
    assert len(http.get("/ledger").json()["jobs"]) == jobs_before


def test_a_delivery_signed_by_the_standardwebhooks_library_is_accepted(http: httpx.Client) -> None:
    job_id, webhook_id = new_ids()
    body = json.dumps(job_event(job_id, 3), ensure_ascii=False)
    now = datetime.now(tz=UTC).replace(microsecond=0)
    headers = {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(SECRET).sign(webhook_id, now, body),
    }

    answer = http.post("/webhooks", content=body.encode(), headers=headers)

    assert answer.json()["status"] == "accepted"


@pytest.mark.parametrize(
    ("fault", "status", "header"),
    [
        ({"mode": "error_500"}, 500, None),
        ({"mode": "rate_limited", "retry_after": 7}, 429, ("retry-after", "7")),
        ({"mode": "slow", "delay_s": 0.3}, 503, None),
        ({"mode": "unauthorized"}, 401, None),
        ({"mode": "gone"}, 410, None),
        ({"mode": "redirect"}, 307, ("location", "/redirected")),
        ({"mode": "huge_response", "size_bytes": 3_000_000}, 500, ("content-length", "3000000")),
    ],
    ids=lambda v: v["mode"] if isinstance(v, dict) else None,
)
def test_each_fault_answers_as_specified_and_stores_nothing(
    http: httpx.Client, fault: dict[str, Any], status: int, header: tuple[str, str] | None
) -> None:
    job_id, webhook_id = new_ids()
    assert http.post("/admin/faults", json={**fault, "count": 1}).status_code == 200

    answer = deliver(http, webhook_id, job_event(job_id, 3))

    assert answer.status_code == status
    if header is not None:
        assert answer.headers[header[0]] == header[1]
    assert ledger_entry(http, job_id) is None
    # count=1: the next delivery of the same webhook reaches the inbox and is new to it.
    assert deliver(http, webhook_id, job_event(job_id, 3)).json()["status"] == "accepted"


def test_down_drops_the_connection_without_a_response_until_cleared(http: httpx.Client) -> None:
    job_id, webhook_id = new_ids()
    http.post("/admin/faults", json={"mode": "down", "count": None})

    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            deliver(http, webhook_id, job_event(job_id, 3))
    assert http.get("/admin/stats").json()["fault"]["mode"] == "down"
    assert ledger_entry(http, job_id) is None

    http.delete("/admin/faults")
    assert deliver(http, webhook_id, job_event(job_id, 3)).json()["status"] == "accepted"


def test_a_fault_with_a_count_clears_itself_after_that_many_webhooks(http: httpx.Client) -> None:
    job_id, webhook_id = new_ids()
    http.post("/admin/faults", json={"mode": "error_500", "count": 2})

    statuses = [deliver(http, webhook_id, job_event(job_id, 3)).status_code for _ in range(3)]

    assert statuses == [500, 500, 200]
    assert http.get("/admin/stats").json()["fault"] is None


@pytest.mark.parametrize(
    "body",
    [{"mode": "melt"}, {"mode": "error_500", "count": 0}, {"mode": "slow", "delay_s": "x"}, {"color": 1}, []],
)
def test_a_bad_fault_request_is_400_and_arms_nothing(http: httpx.Client, body: Any) -> None:
    answer = http.post("/admin/faults", json=body)

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_fault"
    assert http.get("/admin/stats").json()["fault"] is None


def test_erp_killed_after_its_commit_takes_the_resend_as_a_duplicate(spawn: SpawnFn, tmp_path: Path) -> None:
    # Given an ERP that dies right after committing the inbox row, before it answers
    db = tmp_path / "erp.sqlite"
    doomed = start_erp(spawn, db, FATURA_ERP_SECRETS=SECRET, FATURA_FAULTS="erp_crash_after_commit")
    assert doomed.base_url is not None
    job_id, webhook_id = new_ids()
    event = job_event(job_id, 7)

    # When the sender delivers, it gets no answer and the process is gone (SIGKILL)
    with httpx.Client(base_url=doomed.base_url, timeout=10.0) as first, pytest.raises(httpx.TransportError):
        deliver(first, webhook_id, event)
    assert doomed.wait_exit(timeout=10) == -9

    # Then after a restart the sender's resend is a duplicate and the ledger holds one effect
    erp = start_erp(spawn, db, FATURA_ERP_SECRETS=SECRET)
    assert erp.base_url is not None
    with httpx.Client(base_url=erp.base_url, timeout=10.0) as http:
        resend = deliver(http, webhook_id, event)
        entry = ledger_entry(http, job_id)
    assert (resend.status_code, resend.json()["status"]) == (200, "duplicate")
    assert entry is not None
    assert (entry["effects"], entry["webhook_ids"], entry["counts"]["duplicates"]) == (1, [webhook_id], 1)


def test_secrets_posted_at_run_time_are_used_and_survive_a_restart(spawn: SpawnFn, tmp_path: Path) -> None:
    # Given an ERP started without any secret
    db = tmp_path / "erp.sqlite"
    erp = start_erp(spawn, db)
    assert erp.base_url is not None
    job_id = str(uuid.uuid4())
    with httpx.Client(base_url=erp.base_url, timeout=10.0) as http:
        before = deliver(http, str(uuid.uuid4()), job_event(job_id, 1))
        bad = http.post("/admin/secrets", json={"secrets": ["whsec_***"]})
        # When the endpoint's secret is posted
        posted = http.post("/admin/secrets", json={"secrets": [SECRET]})
        after = deliver(http, str(uuid.uuid4()), job_event(job_id, 2))
    assert (before.status_code, before.json()["error"]["code"]) == (401, "no_secret_configured")
    assert bad.status_code == 400
    assert (posted.status_code, posted.json()) == (200, {"secrets": 1})
    assert after.json()["status"] == "accepted"

    # Then a restarted ERP still accepts it
    assert erp.stop() == 0
    again = start_erp(spawn, db)
    assert again.base_url is not None
    with httpx.Client(base_url=again.base_url, timeout=10.0) as http:
        assert deliver(http, str(uuid.uuid4()), job_event(job_id, 3)).json()["status"] == "accepted"
        entry = ledger_entry(http, job_id)
    assert entry is not None and entry["state_version"] == 3


def test_fatura_sandbox_erp_serves_the_same_receiver(tmp_path: Path, base_env: dict[str, str]) -> None:
    port = free_port()
    env = {
        **base_env,
        "FATURA_ERP_PORT": str(port),
        "FATURA_ERP_DB": str(tmp_path / "erp.sqlite"),
        "FATURA_ERP_SECRETS": SECRET,
    }
    command = fatura_command("sandbox", "erp")
    handle = ServiceProcess.start(
        "sandbox-erp", command, env=env, log_path=tmp_path / "sandbox-erp.log", cwd=ROOT
    )
    try:
        handle.wait_ready(f"http://127.0.0.1:{port}/readyz")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as http:
            job_id, webhook_id = new_ids()
            assert deliver(http, webhook_id, job_event(job_id, 1)).json()["status"] == "accepted"
    finally:
        assert handle.stop() == 0, handle.log()
