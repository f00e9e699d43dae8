"""A newcomer's first invoice through the simulated provider's HTTP API (issue 11, point 6).

The issue's plain Turkish invoice (``FATURA / INVOICE No: INV-2026-0042   Tarih: 2026-11-02``,
lines like ``1  Hydraulic pump service   2 x 1,250.00 = 2,500.00``) used to come back without its
invoice number and lines, a schema violation that ends a job FAILED_TERMINAL. Given that invoice
in the worker's prompt, when the official client asks the provider process for a completion, then
the answer is a schema-valid invoice.v1 that validation accepts when the supplier is known.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fix_processes import ServiceProcess, SpawnFn
from services.common.procs import free_port
from services.inference.prompt import build_messages
from services.inference.validation import MasterSupplier, ValidationContext, resolve_span, validate

ISSUE_INVOICE = (
    Path(__file__).resolve().parents[1] / "unit" / "provider_dev_cases" / "d01_tr_issue_example.txt"
)


@pytest.fixture(scope="module")
def provider(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    port = free_port()
    process = spawn("provider", FATURA_SANDBOX_PROVIDER_PORT=str(port))
    process.base_url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{process.base_url}/readyz")
    yield process
    process.stop()


def test_the_issues_plain_turkish_invoice_is_extracted_over_http_and_validates(
    provider: ServiceProcess,
) -> None:
    # Given the issue's invoice in the worker's prompt
    text = ISSUE_INVOICE.read_text(encoding="utf-8")
    client = openai.OpenAI(base_url=f"{provider.base_url}/v1", api_key="sk-any", max_retries=0, timeout=10.0)
    # When the provider process answers it
    answer = client.chat.completions.create(
        model="fatura-sim-1", messages=build_messages(text), temperature=0
    )
    content = answer.choices[0].message.content or ""
    result = json.loads(content)
    # Then the invoice number, the date and the lines are there, each with the span it was read from
    assert (result["invoice_number"], result["issue_date"], result["currency"]) == (
        "INV-2026-0042",
        "2026-11-02",
        "TRY",
    )
    assert [
        (line["description"], line["quantity"], line["unit_price"], line["amount"])
        for line in result["lines"]
    ] == [
        ("Hydraulic pump service", "2", "1250.00", "2500.00"),
        ("Seal kit replacement", "4", "180.00", "720.00"),
    ]
    assert resolve_span(text, result["evidence"]["/invoice_number"]) == "INV-2026-0042"
    # And validation, with the supplier in the tenant's master data, lets it succeed: no schema
    # violation, no arithmetic or evidence reason
    supplier = MasterSupplier("7350012284", "Marmara Hidrolik Servis Ltd. Şti.", None, "TRY")
    context = ValidationContext(text, frozenset({"TRY"}), {"7350012284": supplier})
    verdict = validate(content, context)
    assert (verdict.outcome, verdict.error_message, verdict.review_codes) == ("succeeded", None, [])
