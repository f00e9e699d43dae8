"""The delivery service's pure core: signatures, the retry schedule, outcome rules, the claim gate,
the webhook body and the egress guard's address matrix (no server, no database)."""

from __future__ import annotations

import ipaddress
import json
import random
import socket
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import standardwebhooks

from services.common.settings import SettingsError
from services.delivery import outcomes, payload, signing
from services.delivery.egress import EgressGuard, HostNotResolved, parse_allow, parse_url
from services.delivery.errors import EgressRefused, InvalidEndpoint
from services.delivery.outcomes import AttemptResult, decide, gate, parse_retry_after, retry_delay
from services.delivery.settings import DeliverySettings
from services.delivery.store import Wake
from services.delivery.worker import DeliveryWorker, wakeup_messages

BODY = b'{"type":"extraction.completed.v1","id":"e","data":{"job_id":"j","state":"SUCCEEDED"}}'


def test_a_signature_verifies_with_the_standard_webhooks_library() -> None:
    secret = signing.new_secret()
    headers = signing.headers([secret], "msg_1", int(datetime.now(UTC).timestamp()), BODY)
    assert standardwebhooks.Webhook(secret).verify(BODY, headers) == json.loads(BODY)


def test_during_a_rotation_both_secrets_sign_and_either_verifies() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    headers = signing.headers([new, old], "msg_2", int(datetime.now(UTC).timestamp()), BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(BODY, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(signing.new_secret()).verify(BODY, headers)


def test_a_signature_covers_the_exact_bytes() -> None:
    secret = signing.new_secret()
    headers = signing.headers([secret], "msg_3", int(datetime.now(UTC).timestamp()), BODY)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(BODY.replace(b'"j"', b'"k"'), headers)


def test_our_signature_equals_the_librarys() -> None:
    secret = signing.new_secret()
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    theirs = standardwebhooks.Webhook(secret).sign("msg_4", at, BODY.decode())
    ours = signing.headers([secret], "msg_4", int(at.timestamp()), BODY)["webhook-signature"]
    assert ours == theirs


@pytest.mark.parametrize("bad", ["nope", "whsec_", "whsec_!!!!", "whsec_" + "QUFB" * 2])
def test_a_malformed_secret_is_refused(bad: str) -> None:
    with pytest.raises(signing.BadSecret):
        signing.secret_key(bad)


def test_the_delivery_id_is_stable_per_event_and_endpoint() -> None:
    event, endpoint, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert signing.delivery_id(event, endpoint) == signing.delivery_id(event, endpoint)
    assert signing.delivery_id(event, endpoint) != signing.delivery_id(event, other)


def test_the_retry_schedule_follows_standard_webhooks_with_jitter_then_stops() -> None:
    rng = random.Random(7)
    for attempt, nominal in enumerate(outcomes.RETRY_DELAYS_SECONDS, start=1):
        delay = retry_delay(attempt, rng=rng)
        assert delay is not None
        assert nominal * 0.8 <= delay <= nominal * 1.2
    assert retry_delay(len(outcomes.RETRY_DELAYS_SECONDS) + 1) is None
    assert outcomes.MAX_ATTEMPTS == 10


def test_a_scaled_schedule_still_honours_retry_after_in_full() -> None:
    delay = retry_delay(1, scale=0.001, retry_after=30)
    assert delay == 30


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7.0),
        (" 12 ", 12.0),
        ("0", 0.0),
        ("soon", None),
        (None, None),
        ("", None),
        ("999999999", 86400.0),
        ("9" * 5000, 86400.0),  # more digits than int() takes: still capped, not an error
        ("\uff13\uff10", None),  # fullwidth "30": float() would take it, RFC 9110 does not
        ("\u0663\u0660", None),  # Arabic-Indic "30"
        ("\u00b2", None),  # superscript two: str.isdigit() says yes, float() raises
        ("-5", None),
        ("+5", None),
        ("1.5", None),
        ("1e30", None),
        ("inf", None),
        ("nan", None),
        ("1_000", None),
        ("30, 60", None),
        ("\x00", None),
    ],
)
def test_retry_after_is_read_in_ascii_seconds_only(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


NOW = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Mon, 30 Nov 2026 08:00:42 GMT", 42.0),
        ("Monday, 30-Nov-26 08:00:42 GMT", 42.0),  # RFC 850
        ("Mon Nov 30 08:00:42 2026", 42.0),  # asctime
        ("Mon, 30 Nov 2026 08:00:42 -0000", 42.0),  # no zone: read as UTC
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past: now
        ("Fri, 31 Dec 9999 23:59:59 GMT", 86400.0),  # far ahead: a day at most
        ("Fri, 31 Dec 9999 23:59:59 -2359", 86400.0),  # past the last datetime once in UTC
        ("Fri, 31 Dec 99999999999 23:59:59 GMT", None),  # a year no datetime holds
        ("Fri, 31 Dec 99999999999999999999 23:59:59 GMT", None),  # nor a C long
        ("Mon, 30 Nov 2026 08:00:42 +99999999999999999999", None),  # an offset no C int holds
        ("Mon, 30 Nov 2026 08:00:42 +9999", None),  # an offset over a day
        ("Mon, 30 Nov 2026 99:99:99 GMT", None),
        ("Mon, \u0663\u0660 Nov 2026 08:00:42 GMT", None),  # int() reads Arabic-Indic digits too
    ],
)
def test_retry_after_is_read_as_an_http_date(value: str, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_of_several_retry_after_fields_the_longest_valid_one_counts() -> None:
    assert outcomes.retry_after(["30", "120", "soon"], NOW) == 120.0
    assert outcomes.retry_after(["\uff19\uff19", "Mon, 30 Nov 2026 08:00:42 GMT"], NOW) == 42.0
    assert outcomes.retry_after(["soon", "-1"], NOW) is None
    assert outcomes.retry_after([], NOW) is None


@pytest.mark.parametrize(
    ("body", "stored"),
    [
        ("plain", "plain"),
        ("a\x00b", "a\ufffdb"),  # PostgreSQL's text refuses NUL
        ("lone \ud800 surrogate", "lone \ufffd\ufffd\ufffd surrogate"),  # UTF-8 cannot encode one
        ("pair \ud83d\ude00", "pair " + "\ufffd" * 6),
        ("Türkçe fatura ✓", "Türkçe fatura ✓"),
    ],
)
def test_a_response_body_is_always_storable_text(body: str, stored: str) -> None:
    result = AttemptResult(500, response_body=body)
    assert result.response_body == stored
    assert result.response_body is not None
    assert "\x00" not in result.response_body and result.response_body.encode("utf-8")


@pytest.mark.parametrize(
    ("result", "state", "disables", "breaker", "auth"),
    [
        (AttemptResult(200), "delivered", False, False, False),
        (AttemptResult(204), "delivered", False, False, False),
        (AttemptResult(307), "failed", False, False, False),
        (AttemptResult(301), "failed", False, False, False),
        (AttemptResult(410), "failed", True, False, False),
        (AttemptResult(401), "pending", False, False, True),
        (AttemptResult(403), "pending", False, False, True),
        (AttemptResult(400), "failed", False, False, False),
        (AttemptResult(422), "failed", False, False, False),
        (AttemptResult(429, retry_after_seconds=3), "pending", False, True, False),
        (AttemptResult(500), "pending", False, True, False),
        (AttemptResult(503), "pending", False, True, False),
        (AttemptResult(None, "read_timeout"), "pending", False, True, False),
        (AttemptResult(None, "connect_error"), "pending", False, True, False),
        (AttemptResult(None, "egress_refused", refused=True), "failed", False, False, False),
        (AttemptResult(None, "invalid_url", refused=True), "failed", False, False, False),
        (AttemptResult(None, "dns_error"), "pending", False, True, False),
        (AttemptResult(None, "protocol_error"), "pending", False, True, False),
        (AttemptResult(None, "total_timeout"), "pending", False, True, False),
        (AttemptResult(999), "pending", False, True, False),
    ],
)
def test_each_kind_of_answer_has_its_outcome(
    result: AttemptResult, state: str, disables: bool, breaker: bool, auth: bool
) -> None:
    decision = decide(result, 1)
    assert decision.state == state
    assert (decision.disable_endpoint is not None) == disables
    assert decision.breaker_failure == breaker
    assert decision.auth_failure == auth
    assert decision.healthy == (state == "delivered")


def test_a_429_waits_at_least_its_retry_after() -> None:
    decision = decide(AttemptResult(429, retry_after_seconds=120), 1)
    assert decision.delay_seconds is not None and decision.delay_seconds >= 120


def test_the_last_retryable_failure_makes_the_delivery_dead() -> None:
    decision = decide(AttemptResult(503), outcomes.MAX_ATTEMPTS)
    assert decision.state == "dead"
    assert "exhausted" in decision.reason


def _gate(**overrides: object) -> outcomes.Gate:
    values: dict[str, object] = {
        "delivery_state": "pending",
        "due": True,
        "endpoint_state": "enabled",
        "breaker_open_for": None,
        "in_flight": 0,
        "max_concurrency": 2,
        "has_secret": True,
    }
    values.update(overrides)
    return gate(**values)  # type: ignore[arg-type]


def test_the_gate_sends_a_due_delivery_to_a_healthy_endpoint() -> None:
    assert _gate().action == "send"


def test_an_open_breaker_or_a_full_endpoint_makes_a_delivery_wait_not_fail() -> None:
    assert _gate(breaker_open_for=4.0) == outcomes.Gate("wait", _gate(breaker_open_for=4.0).reason, 4.0)
    assert _gate(in_flight=2).action == "wait"


def test_a_disabled_endpoint_fails_the_delivery_so_recover_can_resend_it() -> None:
    assert _gate(endpoint_state="disabled").action == "fail"


def test_a_delivery_that_is_not_pending_or_not_due_is_left_alone() -> None:
    assert _gate(delivery_state="delivered").action == "skip"
    assert _gate(due=False).action == "skip"


def test_the_body_carries_the_events_state_and_the_result_at_that_version() -> None:
    job_id, tenant_id, event_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    job = {"state_version": 3, "result": {"total": "5400.00"}, "policy_version": "invoice-policy.v1"}
    raw = payload.event_body(
        event_id=event_id,
        event_type="extraction.completed.v1",
        tenant_id=tenant_id,
        job_id=job_id,
        state="SUCCEEDED",
        state_version=3,
        occurred_at=datetime(2026, 11, 30, 8, 0, tzinfo=UTC),
        job=job,
    )
    body = json.loads(raw)
    assert body["type"] == "extraction.completed.v1" and body["id"] == str(event_id)
    assert body["data"]["result"] == {"total": "5400.00"}
    assert body["data"]["state_version"] == 3
    assert body["data"]["status_url"] == f"/v1/extraction-jobs/{job_id}"
    assert body["data"]["occurred_at"] == "2026-11-30T08:00:00Z"


def test_a_body_for_an_older_version_leaves_out_the_newer_rows_result() -> None:
    raw = payload.event_body(
        event_id=uuid.uuid4(),
        event_type="extraction.completed.v1",
        tenant_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        state="SUCCEEDED",
        state_version=3,
        occurred_at=datetime.now(UTC) - timedelta(seconds=5),
        job={"state_version": 4, "result": {"x": 1}, "decided_by": "reviewer"},
    )
    data = json.loads(raw)["data"]
    assert data["state"] == "SUCCEEDED" and data["state_version"] == 3
    assert "result" not in data and "decided_by" not in data


def test_a_review_request_carries_ids_reason_codes_and_the_review_url_never_the_fields() -> None:
    review_id = uuid.uuid4()
    raw = payload.event_body(
        event_id=uuid.uuid4(),
        event_type="review.requested.v1",
        tenant_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        state="REVIEW_REQUIRED",
        state_version=3,
        occurred_at=datetime.now(UTC),
        job={
            "state_version": 3,
            "result": {"total": "999.00", "supplier": {"iban": "TR00 0000"}},
            "review_reasons": [
                {"code": "arithmetic_total", "field": "/total", "message": "999.00 is not 100.00 + 18.00"}
            ],
        },
        review_id=review_id,
    )
    data = json.loads(raw)["data"]
    assert data["review"] == {
        "reasons": [{"code": "arithmetic_total", "field": "/total"}],
        "review_id": str(review_id),
        "review_url": f"/review#{review_id}",
    }
    assert "result" not in data
    assert b"999.00" not in raw and b"TR00" not in raw


def test_an_endpoint_takes_the_erp_events_by_default_and_review_requests_only_by_name() -> None:
    assert "review.requested.v1" not in payload.EVENT_TYPES
    assert "review.requested.v1" in payload.SUBSCRIBABLE
    assert set(payload.EVENT_TYPES) == {
        "extraction.completed.v1",
        "extraction.failed.v1",
        "extraction.rejected.v1",
        "batch.completed.v1",
    }


# The SSRF matrix (DESIGN §5.10): each of these is refused unless FATURA_EGRESS_ALLOW names it.
REFUSED = [
    "127.0.0.1",
    "::1",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "fc00::1",
    "fe80::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "ff02::1",
    "2002:7f00:1::1",  # 6to4 wrapping 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 wrapping 169.254.169.254
    "64:ff9b::a00:1",  # NAT64 wrapping 10.0.0.1
    "240.0.0.1",
]


def _url(ip: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"https://{host}/hook"


@pytest.mark.parametrize("ip", REFUSED)
def test_a_private_or_special_address_is_refused(ip: str) -> None:
    with pytest.raises(EgressRefused):
        EgressGuard(()).vet(_url(ip))


@pytest.mark.parametrize("ip", REFUSED[:12])
def test_an_allow_listed_address_is_reachable(ip: str) -> None:
    # An address carrying IPv4 (here ::ffff:a.b.c.d) is admitted by listing the IPv4 address it carries.
    address = ipaddress.ip_address(ip)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    network = ipaddress.ip_network(mapped or address)
    vetted = EgressGuard((network,)).vet(_url(ip))
    assert vetted.address == ipaddress.ip_address(ip)


def test_a_hostname_resolving_to_a_private_address_is_refused() -> None:
    with pytest.raises(EgressRefused, match="not a public address"):
        EgressGuard(()).vet("https://localhost/hook")


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    guard = EgressGuard((), resolver=lambda host, port: ["93.184.216.34", "10.1.2.3"])
    with pytest.raises(EgressRefused):
        guard.vet("https://erp.example/hook")


def test_the_guard_connects_to_the_address_it_checked() -> None:
    answers = iter([["93.184.216.34"], ["10.0.0.1"]])  # a rebinding DNS server
    guard = EgressGuard((), resolver=lambda host, port: next(answers))
    vetted = guard.vet("https://erp.example/hook")
    assert str(vetted.address) == "93.184.216.34"
    assert vetted.target.host_header == "erp.example"


def test_every_attempt_resolves_and_judges_again_under_its_own_guards_list() -> None:
    # URLs and address verdicts are remembered; neither may outlive a new DNS answer or cross guards.
    answers = iter([["93.184.216.34"], ["10.0.0.1"], ["93.184.216.34"]])
    guard = EgressGuard((), resolver=lambda host, port: next(answers))
    assert str(guard.vet("https://erp.example/hook").address) == "93.184.216.34"
    with pytest.raises(EgressRefused):
        guard.vet("https://erp.example/hook")
    assert str(guard.vet("https://erp.example/hook").address) == "93.184.216.34"
    for _ in range(2):
        assert EgressGuard(parse_allow(["127.0.0.0/8"])).vet("http://127.0.0.1:8091/webhooks").allow_listed
        with pytest.raises(EgressRefused):
            EgressGuard(()).vet("http://127.0.0.1:8091/webhooks")


def test_plain_http_is_allowed_only_to_allow_listed_targets() -> None:
    public = EgressGuard((), resolver=lambda host, port: ["93.184.216.34"])
    with pytest.raises(EgressRefused, match="https"):
        public.vet("http://erp.example/hook")
    local = EgressGuard(parse_allow(["127.0.0.0/8"]))
    assert local.vet("http://127.0.0.1:8091/webhooks").allow_listed


@pytest.mark.parametrize(
    "url",
    [
        "",
        "not a url",
        "ftp://erp.example/hook",
        "javascript:alert(1)",
        "https://user:pass@erp.example/hook",
        "https://token@erp.example/hook",
        "https:///nohost",
        "https://erp.example:99999/hook",
        "https://erp.example/hook#fragment",
        "https://erp.example/\nhook",
    ],
)
def test_a_malformed_url_is_refused_before_any_lookup(url: str) -> None:
    def no_lookup(host: str, port: int) -> list[str]:
        raise AssertionError("the guard resolved a URL it should have refused as text")

    with pytest.raises(InvalidEndpoint):
        EgressGuard((), resolver=no_lookup).vet(url)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://bücher.example/hook", "xn--bcher-kva.example"),
        ("https://BÜCHER.Example/hook", "xn--bcher-kva.example"),
        ("https://xn--bcher-kva.example/hook", "xn--bcher-kva.example"),
        ("https://fatura\u3002example/hook", "fatura.example"),  # an ideographic full stop
        ("https://\uff45\uff52\uff50.example/hook", "erp.example"),  # fullwidth letters
        ("https://erp_1.example/hook", "erp_1.example"),
        ("https://[::1]:8443/hook", "::1"),
    ],
)
def test_a_host_name_is_checked_in_the_ascii_form_dns_and_tls_use(url: str, host: str) -> None:
    target = parse_url(url)
    assert target.host == host
    assert target.host_header.isascii()


@pytest.mark.parametrize(
    "url",
    [
        "https://" + "a" * 64 + ".example/hook",
        "https://" + "ü" * 60 + ".example/hook",
        "https://erp..example/hook",
        "https://erp.exa%6dple/hook",
        "https://erp.exa\u200fmple/hook",  # a right-to-left mark, which IDNA prohibits
    ],
)
def test_a_host_name_that_cannot_be_encoded_is_a_malformed_url(url: str) -> None:
    def no_lookup(host: str, port: int) -> list[str]:
        raise AssertionError("the guard resolved a host it should have refused as text")

    with pytest.raises(InvalidEndpoint):
        EgressGuard((), resolver=no_lookup).vet(url)


def test_a_lookup_that_fails_is_told_apart_from_a_refused_address() -> None:
    def nxdomain(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(HostNotResolved, match="does not resolve"):
        EgressGuard((), resolver=nxdomain).vet("https://bücher.example/hook")
    with pytest.raises(HostNotResolved, match="no address"):
        EgressGuard((), resolver=lambda host, port: []).vet("https://erp.example/hook")


def test_a_url_keeps_its_path_and_query() -> None:
    target = parse_url("https://erp.example:8443/in/hooks?tenant=7")
    assert (target.host, target.port, target.path) == ("erp.example", 8443, "/in/hooks?tenant=7")
    assert target.host_header == "erp.example:8443"


def test_settings_fail_fast_by_name() -> None:
    with pytest.raises(SettingsError, match="FATURA_EGRESS_ALLOW"):
        DeliverySettings.from_env({"FATURA_EGRESS_ALLOW": "10.0.0.0/8,not-a-cidr"})
    with pytest.raises(SettingsError, match="FATURA_DELIVERY_LEASE_SECONDS"):
        DeliverySettings.from_env(
            {"FATURA_DELIVERY_LEASE_SECONDS": "5", "FATURA_DELIVERY_TOTAL_TIMEOUT_SECONDS": "10"}
        )
    settings = DeliverySettings.from_env({"FATURA_EGRESS_ALLOW": "127.0.0.0/8, ::1/128"})
    assert len(settings.egress_allow) == 2


def test_wake_ups_carry_one_endpoints_deliveries_at_most_a_batch_each_and_every_one_once() -> None:
    endpoints = [uuid.uuid4() for _ in range(3)]
    woken = [Wake(uuid.uuid4(), endpoints[i % 3]) for i in range(40)]  # interleaved, as ingests find them
    messages = wakeup_messages("p", woken, 16)
    named = [[(uuid.UUID(d), m.queue_name, m.actor_name) for d in m.args] for m in messages]
    endpoint_of = {w.delivery_id: w.endpoint_id for w in woken}
    assert all(len({endpoint_of[d] for d, _, _ in ids}) == 1 for ids in named)
    assert sorted(len(ids) for ids in named) == [13, 13, 14]
    assert sorted(d for ids in named for d, _, _ in ids) == sorted(w.delivery_id for w in woken)
    assert {(q, a) for ids in named for _, q, a in ids} == {("p.delivery.deliver", "deliver")}
    one_endpoint = [Wake(uuid.uuid4(), endpoints[0]) for _ in range(40)]
    assert [len(m.args) for m in wakeup_messages("p", one_endpoint, 16)] == [16, 16, 8]
    assert [len(m.args) for m in wakeup_messages("p", one_endpoint[:1], 16)] == [1]


def test_a_wake_up_naming_several_deliveries_attempts_each_in_turn() -> None:
    visited: list[uuid.UUID] = []
    worker = DeliveryWorker.__new__(DeliveryWorker)  # only deliver's own logic, no process around it
    worker.deliver_one = lambda delivery_id: visited.append(delivery_id) is None  # type: ignore[method-assign]
    ids = [uuid.uuid4() for _ in range(5)]
    worker.deliver(*(str(i) for i in ids))
    assert visited == ids
