"""The requests both clients send and what they make of the answers: one description of each call,
httpx's transport errors translated into ours in one place, and one reading of a response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from fatura_sdk.errors import ApiError, TransportError, UnexpectedAnswer, error_from_answer

USER_AGENT = "fatura-sdk/0.2 (python; httpx)"
DEFAULT_TIMEOUT = 30.0

# Raised before a request left this process: sending it again cannot do anything twice.
_NOT_SENT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.ProxyError,
)


@dataclass(frozen=True)
class Call:
    """One API request. ``idempotent``: sending it twice has the effect of sending it once."""

    method: str
    path: str
    json: Any = None
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = True


def translate(exc: httpx.TransportError) -> TransportError:
    sent = not isinstance(exc, _NOT_SENT)
    where = " (the request may have reached the server)" if sent else ""
    return TransportError(f"no answer from Fatura: {type(exc).__name__}: {exc}{where}", sent=sent)


def client_headers(api_key: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    if not api_key or not api_key.strip():
        raise ValueError("an API key is required")
    return {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT, **(extra or {})}


def _body(response: httpx.Response) -> tuple[Any, bool]:
    try:
        return (response.json() if response.content else None), True
    except ValueError:
        return None, False


def error_of(response: httpx.Response) -> ApiError:
    """The typed error of an answer that is not 2xx (not raised)."""
    body, _ = _body(response)
    return error_from_answer(response.status_code, body, response.headers)


def read(response: httpx.Response) -> Any:
    """The JSON body of a 2xx answer; any other answer raises its typed ``ApiError``."""
    if not response.is_success:
        raise error_of(response)
    body, parsed = _body(response)
    if not parsed:
        raise UnexpectedAnswer(
            f"{response.status_code} with a body that is not JSON: {response.text[:200]!r}"
        )
    return body


def replayed(response: httpx.Response) -> bool:
    return str(response.headers.get("idempotent-replayed", "")).lower() == "true"


def segment(identifier: str) -> str:
    if not identifier or not isinstance(identifier, str):
        raise ValueError("an id is a non-empty string")
    return quote(identifier, safe="")


def job_path(job_id: str) -> str:
    return f"/v1/extraction-jobs/{segment(job_id)}"


def batch_path(batch_id: str) -> str:
    return f"/v1/extraction-batches/{segment(batch_id)}"


def events_path(job_id: str | None) -> str:
    return f"{job_path(job_id)}/events" if job_id is not None else "/v1/events"
