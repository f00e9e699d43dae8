"""Small helpers for talking to the HTTP edge the way a customer's app does."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from fix_db import TenantHandle

INVOICE = (
    "ANADOLU KIRTASİYE A.Ş.\nVKN: 1234567890\nFATURA\nFatura No: AK-1\nPara Birimi: TRY\n"
    "A4 Kağıt  10  450,00  4.500,00\nAra Toplam: 4.500,00\nKDV %20: 900,00\nGenel Toplam: 5.400,00\n"
)

SubmitFn = Callable[..., httpx.Response]


def job_body(text: str = INVOICE, **extra: Any) -> dict[str, Any]:
    return {"document": {"text": text, "filename": "invoice.txt"}, **extra}


@pytest.fixture
def submit(client: httpx.Client) -> SubmitFn:
    """POST /v1/extraction-jobs for a tenant; a fresh Idempotency-Key unless one is given."""

    def post(
        tenant: TenantHandle, body: dict[str, Any] | None = None, *, key: str | None = None
    ) -> httpx.Response:
        return client.post(
            "/v1/extraction-jobs",
            json=job_body() if body is None else body,
            headers={**tenant.headers, "Idempotency-Key": key or f"k-{uuid.uuid4()}"},
        )

    return post
