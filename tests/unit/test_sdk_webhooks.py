"""fatura_sdk.webhooks: the signature matrix, and a cross-check with the standardwebhooks library."""

from __future__ import annotations

import ast
import base64
import json
import re
import subprocess
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import standardwebhooks

from fatura_sdk import webhooks
from fatura_sdk.webhooks import (
    BadSignatureError,
    FutureTimestampError,
    InvalidSecretError,
    MalformedHeaderError,
    MalformedPayloadError,
    MissingHeaderError,
    StaleTimestampError,
    WebhookVerificationError,
    generate_secret,
    sign_headers,
    verify,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_790_000_000
OLD_SECRET = "whsec_" + base64.b64encode(b"old-secret-of-the-endpoint-000").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"new-secret-of-the-endpoint-111").decode()
EVENT = {
    "type": "extraction.completed.v1",
    "id": "0b9f3c1e-5f0a-4f55-9a53-3b8f0f4b6d10",
    "timestamp": "2026-11-30T07:00:00Z",
    "data": {"job_id": "j-1", "state": "SUCCEEDED", "state_version": 4, "result": {"total": "118.00"}},
}
BODY = json.dumps(EVENT, ensure_ascii=False).encode()


def test_a_correctly_signed_webhook_verifies_and_returns_the_event() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)

    assert verify(NEW_SECRET, headers, BODY, now=NOW) == EVENT


def test_during_rotation_a_receiver_with_only_the_new_secret_accepts_the_double_signature() -> None:
    # Given a sender that signs with the old and the new secret while the endpoint rotates
    headers = sign_headers([OLD_SECRET, NEW_SECRET], "dlv-1", BODY, timestamp=NOW)
    assert len(headers["webhook-signature"].split()) == 2

    # Then a receiver that already switched, and one that has not, both accept it
    assert verify(NEW_SECRET, headers, BODY, now=NOW) == EVENT
    assert verify(OLD_SECRET, headers, BODY, now=NOW) == EVENT


def test_a_receiver_holding_two_secrets_accepts_a_signature_made_with_either() -> None:
    headers = sign_headers(OLD_SECRET, "dlv-1", BODY, timestamp=NOW)

    assert verify([NEW_SECRET, OLD_SECRET], headers, BODY, now=NOW) == EVENT


def test_a_signature_made_with_another_secret_is_refused() -> None:
    headers = sign_headers(generate_secret(), "dlv-1", BODY, timestamp=NOW)

    with pytest.raises(BadSignatureError):
        verify(NEW_SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda b: b.replace(b"118.00", b"918.00"),
        lambda b: b + b" ",
        lambda b: b[:-1],
    ],
    ids=["changed-amount", "trailing-space", "truncated"],
)
def test_a_tampered_body_is_refused(tamper: object) -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)
    assert callable(tamper)

    with pytest.raises(BadSignatureError):
        verify(NEW_SECRET, headers, tamper(BODY), now=NOW)


def test_a_signature_moved_to_another_webhook_id_is_refused() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)
    headers["webhook-id"] = "dlv-2"

    with pytest.raises(BadSignatureError):
        verify(NEW_SECRET, headers, BODY, now=NOW)


def test_a_timestamp_older_than_the_tolerance_is_refused_as_stale() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW - 301)

    with pytest.raises(StaleTimestampError):
        verify(NEW_SECRET, headers, BODY, now=NOW)


def test_a_timestamp_further_ahead_than_the_tolerance_is_refused_as_future() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW + 301)

    with pytest.raises(FutureTimestampError):
        verify(NEW_SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize("skew", [-300, -1, 0, 1, 300])
def test_a_timestamp_inside_the_window_in_either_direction_is_accepted(skew: int) -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW + skew)

    assert verify(NEW_SECRET, headers, BODY, now=NOW)["id"] == EVENT["id"]


def test_the_tolerance_is_configurable() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW - 30)

    with pytest.raises(StaleTimestampError):
        verify(NEW_SECRET, headers, BODY, now=NOW, tolerance_s=10)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_missing_header_is_named(missing: str) -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)
    del headers[missing]

    with pytest.raises(MissingHeaderError, match=missing):
        verify(NEW_SECRET, headers, BODY, now=NOW)


def test_header_names_are_matched_without_regard_to_case() -> None:
    headers = {k.upper(): v for k, v in sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW).items()}

    assert verify(NEW_SECRET, headers, BODY, now=NOW) == EVENT


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("webhook-timestamp", "soon"),
        ("webhook-timestamp", "1790000000.5"),
        ("webhook-timestamp", "-5"),
        ("webhook-signature", "garbage"),
        ("webhook-signature", "v1,not*base64"),
        ("webhook-signature", "v2,c2lnbmF0dXJl"),
        ("webhook-id", "dlv\n1"),
        ("webhook-id", "x" * 257),
    ],
)
def test_a_malformed_header_is_a_typed_error_not_a_crash(header: str, value: str) -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)
    headers[header] = value

    with pytest.raises(MalformedHeaderError):
        verify(NEW_SECRET, headers, BODY, now=NOW)


def test_an_unknown_signature_version_beside_a_good_v1_entry_is_ignored() -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", BODY, timestamp=NOW)
    headers["webhook-signature"] = "v2,c2lnbmF0dXJl " + headers["webhook-signature"]

    assert verify(NEW_SECRET, headers, BODY, now=NOW) == EVENT


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_correctly_signed_body_that_is_not_a_json_object_is_a_malformed_payload(body: bytes) -> None:
    headers = sign_headers(NEW_SECRET, "dlv-1", body, timestamp=NOW)

    with pytest.raises(MalformedPayloadError):
        verify(NEW_SECRET, headers, body, now=NOW)


def test_every_verification_error_shares_one_base_class_with_a_code() -> None:
    errors = [
        MissingHeaderError,
        MalformedHeaderError,
        BadSignatureError,
        StaleTimestampError,
        FutureTimestampError,
        MalformedPayloadError,
    ]

    assert all(issubclass(e, WebhookVerificationError) for e in errors)
    assert len({e.code for e in errors}) == len(errors)


@pytest.mark.parametrize("secret", ["whsec_", "whsec_***", "", b""])
def test_a_bad_secret_is_a_setup_error(secret: str | bytes) -> None:
    with pytest.raises(InvalidSecretError):
        verify(secret, {}, BODY, now=NOW)


def test_signatures_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = webhooks.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(webhooks.hmac, "compare_digest", spy)
    headers = sign_headers([OLD_SECRET, NEW_SECRET], "dlv-1", BODY, timestamp=NOW)

    verify(NEW_SECRET, headers, BODY, now=NOW)

    assert len(calls) == 2


# Cross-check with the reference library: partners may verify with any Standard Webhooks library.


def test_a_body_signed_by_standardwebhooks_verifies_with_fatura_sdk() -> None:
    body = json.dumps({**EVENT, "supplier": "Çağrı Ltd. Şti."}, ensure_ascii=False).encode()
    now = datetime.now(tz=UTC).replace(microsecond=0)
    signature = standardwebhooks.Webhook(NEW_SECRET).sign("dlv-9", now, body.decode())
    headers = {
        "webhook-id": "dlv-9",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }

    assert verify(NEW_SECRET, headers, body)["supplier"] == "Çağrı Ltd. Şti."


def test_a_body_signed_by_fatura_sdk_verifies_with_standardwebhooks() -> None:
    body = json.dumps({**EVENT, "note": "Ödeme — ¥ 12.000"}, ensure_ascii=False).encode()
    headers = sign_headers([OLD_SECRET, NEW_SECRET], "dlv-9", body)

    assert standardwebhooks.Webhook(NEW_SECRET).verify(body, headers)["note"] == "Ödeme — ¥ 12.000"
    assert standardwebhooks.Webhook(OLD_SECRET).verify(body, headers)["note"] == "Ödeme — ¥ 12.000"
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(generate_secret()).verify(body, headers)


def test_an_unpadded_secret_means_the_same_key_to_both_libraries() -> None:
    secret = "whsec_" + base64.b64encode(b"key of 17 bytes!!").decode().rstrip("=")
    assert not secret.endswith("=")
    now = datetime.now(tz=UTC).replace(microsecond=0)
    theirs = {
        "webhook-id": "dlv-3",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(secret).sign("dlv-3", now, BODY.decode()),
    }

    assert standardwebhooks.Webhook(secret).verify(BODY, sign_headers(secret, "dlv-3", BODY)) == EVENT
    assert verify(secret, theirs, BODY) == EVENT


def test_fatura_sdk_imports_nothing_outside_the_standard_library_but_httpx() -> None:
    # Partners install only sdk/: anything it imported beyond the stdlib and its one declared
    # dependency (httpx, for the clients) would break their install.
    script = (
        "import sys; sys.path.insert(0, 'sdk'); import httpx; before = set(sys.modules); import fatura_sdk; "
        "roots = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(roots - set(sys.stdlib_module_names) - {'fatura_sdk'}))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], cwd=ROOT, capture_output=True, text=True)

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    dependencies = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [re.split("[<>=]", d)[0] for d in dependencies] == ["httpx"]


# What a webhook receiver uses: none of it needs httpx.
STDLIB_ONLY = ("webhooks", "receiver", "acks", "completions", "_queries")


def test_the_webhook_side_of_the_sdk_imports_only_the_standard_library() -> None:
    found = []
    for name in STDLIB_ONLY:
        path = ROOT / "sdk" / "fatura_sdk" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            for module in modules:
                root, _, rest = module.partition(".")
                if root == "fatura_sdk" and rest in STDLIB_ONLY:
                    continue
                if root not in sys.stdlib_module_names and root != "__future__":
                    found.append(f"{name}.py imports {module}")
    assert found == []
