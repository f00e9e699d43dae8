"""Business acknowledgements: tell Fatura what became of a delivery once it is on your books.

A 2xx answer to a webhook means "received". The business outcome comes later, as a signed
``POST /v1/deliveries/{delivery_id}:ack`` with ``{"outcome": "posted"}`` or ``{"outcome":
"rejected", "reason": "..."}``, signed with the endpoint's webhook secret in the same Standard
Webhooks scheme the webhooks use, so only the holder of that endpoint's secret can acknowledge its
deliveries. The delivery id is the ``webhook-id`` the delivery arrived under.

``ack_request`` builds the request (to send with any HTTP client); ``acknowledge`` sends it with
the standard library. The body also names the delivery, which binds the signature to it: a signed
acknowledgement cannot be replayed against another delivery of the same endpoint.
"""

from __future__ import annotations

import http.client
import json
import secrets as _random
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import quote

from fatura_sdk.webhooks import Secrets, sign_headers

POSTED = "posted"
REJECTED = "rejected"
OUTCOMES = (POSTED, REJECTED)
MAX_REASON_LENGTH = 1000
DEFAULT_TIMEOUT_S = 10.0
# The answer while Fatura has not yet recorded the delivery as delivered (an ERP that acknowledges
# right after its commit can be quicker than the sender's bookkeeping): worth asking again.
NOT_DELIVERED_YET = "delivery_not_delivered"
_MAX_ANSWER_BYTES = 64 * 1024


class AckRequest(NamedTuple):
    """What to send: unpacks as ``url, headers, body``."""

    url: str
    headers: dict[str, str]
    body: bytes


class AckUnreachable(Exception):
    """Fatura could not be reached, or it did not answer in time: nothing is known; send again."""


@dataclass(frozen=True)
class AckResponse:
    status: int
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str | None:
        error = self.body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else None

    @property
    def retryable(self) -> bool:
        """Whether sending the same acknowledgement later can succeed (a new signature each time)."""
        if self.status in (408, 425, 429) or self.status >= 500:
            return True
        return self.status == 409 and self.code == NOT_DELIVERED_YET


def ack_body(delivery_id: str, outcome: str, reason: str | None = None) -> bytes:
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
    body: dict[str, Any] = {"outcome": outcome, "delivery_id": delivery_id}
    if outcome == REJECTED:
        if not reason or not reason.strip():
            raise ValueError("a rejection needs a reason")
        if len(reason) > MAX_REASON_LENGTH:
            raise ValueError(f"a reason holds at most {MAX_REASON_LENGTH} characters")
        body["reason"] = reason
    elif reason is not None:
        raise ValueError("only a rejection carries a reason")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def ack_request(
    base_url: str,
    delivery_id: str,
    outcome: str,
    reason: str | None,
    secret: Secrets,
    *,
    ack_id: str | None = None,
    timestamp: int | None = None,
) -> AckRequest:
    """The signed acknowledgement of one delivery.

    ``base_url`` is Fatura's API (``https://api.example``); ``secret`` the endpoint's secret, or
    several while it rotates (one signature each). ``ack_id`` is the request's own
    ``webhook-id``, fresh by default.
    """
    body = ack_body(delivery_id, outcome, reason)
    url = f"{base_url.rstrip('/')}/v1/deliveries/{quote(delivery_id, safe='')}:ack"
    headers = sign_headers(secret, ack_id or f"ack_{_random.token_hex(16)}", body, timestamp=timestamp)
    return AckRequest(url, headers, body)


def acknowledge(
    base_url: str,
    delivery_id: str,
    outcome: str,
    reason: str | None,
    secret: Secrets,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> AckResponse:
    """Send the acknowledgement and return Fatura's answer, whatever its status.

    Raises ``AckUnreachable`` when no answer came. Sending the same outcome again is harmless (a
    recorded acknowledgement answers 200 again); a different outcome after one was recorded is 409.
    """
    url, headers, body = ack_request(base_url, delivery_id, outcome, reason, secret)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return AckResponse(answer.status, _json(answer.read(_MAX_ANSWER_BYTES)))
    except urllib.error.HTTPError as exc:
        return AckResponse(exc.code, _json(_error_body(exc)))
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        raise AckUnreachable(f"{type(exc).__name__}: {exc}") from None


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read(_MAX_ANSWER_BYTES)
    except (OSError, http.client.HTTPException):
        return b""  # the status is the answer; a body cut short changes nothing
    finally:
        exc.close()


def _json(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
