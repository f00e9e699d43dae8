"""A one-channel, non-streaming provider: the worker's provider until the gateway's routing chains
are configured. Every failure is classified, never raised."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx

from services.inference.providers.base import (
    ErrorClass,
    Hop,
    PermitDenied,
    Permits,
    ProviderRequest,
    ProviderResult,
)


class DirectProvider:
    def __init__(self, base_url: str, pool: str, api_key: str = "sandbox") -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._pool = pool
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(retries=0), headers={"authorization": f"Bearer {api_key}"}
        )

    def close(self) -> None:
        self._client.close()

    def complete(self, request: ProviderRequest, permits: Permits) -> ProviderResult:
        permit = permits.acquire(self._pool)
        if isinstance(permit, PermitDenied):
            return ProviderResult(None, deferred_ms=permit.retry_after_ms, deferred_reason=permit.reason)
        body: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
            "max_tokens": request.max_output_tokens,
        }
        started, t0 = datetime.now(UTC), time.monotonic()
        status: int | None = None
        try:
            response = self._client.post(self._url, json=body, timeout=request.deadline_s)
            status = response.status_code
            if status == 200:
                data = response.json()
                content = data["choices"][0]["message"]["content"]
                usage = data.get("usage") or {}
                hop = self._hop(request, started, t0, "ok", status, None)
                hop = Hop(
                    **{
                        **hop.__dict__,
                        "input_tokens": usage.get("prompt_tokens"),
                        "output_tokens": usage.get("completion_tokens"),
                    }
                )
                permits.release(permit, "COMPLETED", hop.input_tokens or 0, hop.output_tokens or 0)
                return ProviderResult(str(content), [hop])
            error = (
                ErrorClass.RATE_LIMITED
                if status == 429
                else (ErrorClass.SERVER_ERROR if status >= 500 else ErrorClass.BAD_REQUEST)
            )
            retry_after = response.headers.get("retry-after")
            retry_ms = int(float(retry_after) * 1000) if retry_after and retry_after.isdigit() else None
            if status == 429 and retry_ms:
                permits.throttle(self._pool, retry_ms)
            permits.release(permit, "COMPLETED", 0, 0)
            hop = self._hop(request, started, t0, error.value, status, error, retry_ms)
            return ProviderResult(None, [hop], error, f"HTTP {status}", retry_ms)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            error = (
                ErrorClass.CONNECTION if isinstance(exc, httpx.TransportError) else ErrorClass.BAD_RESPONSE
            )
            permits.release(permit, "UNKNOWN", 0, 0)
            hop = self._hop(request, started, t0, error.value, status, error)
            return ProviderResult(None, [hop], error, str(exc)[:500])

    def _hop(
        self,
        request: ProviderRequest,
        started: datetime,
        t0: float,
        outcome: str,
        status: int | None,
        error: ErrorClass | None,
        retry_ms: int | None = None,
    ) -> Hop:
        return Hop(
            channel="direct",
            model=request.model,
            started_at=started,
            ended_at=datetime.now(UTC),
            outcome=outcome,
            http_status=status,
            error_class=error,
            retry_after_ms=retry_ms,
            latency_ms=int((time.monotonic() - t0) * 1000),
        )
