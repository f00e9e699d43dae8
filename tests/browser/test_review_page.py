"""The reviewer page (DESIGN §5.13, §6) in a real headless Chromium against real processes: the edge,
the inference pipeline, the delivery worker and scheduler, and the reference ERP.

A reviewer opens /review, signs in with a reviewer key, opens the task of the invoice whose total
does not add up, sees every evidence span highlighted, corrects the total and approves; the ERP's
ledger then holds the corrected result, once. Markup inside an invoice is shown as text.

``FATURA_SCREENSHOT=1`` also writes the task view to docs/review-page.png (the README's picture).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from fix_browser import Problems
from fix_db import TenantHandle
from fix_delivery import DELIVERY_ENV, Erp, wait_for
from fix_pipeline import TERMINAL, Pipeline, StartPipeline, sample_text
from services.acceptance.keys import create_key
from services.edge import review_page
from services.sandbox.erp.ledger import result_digest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "review-page.png"
BAD_ARITHMETIC = "06_review_bad_arithmetic_try.txt"  # states 1.316,80 where 1.014,00 + 202,80 = 1.216,80


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Pipeline:
    """The pipeline, with the delivery service sending its results to the ERP."""
    pipeline = pipeline_factory(**DELIVERY_ENV)
    pipeline.start_processing(delivery=True)
    return pipeline


@pytest.fixture(scope="module")
def http(pipe: Pipeline) -> Iterator[httpx.Client]:
    with pipe.client() as client:
        yield client


@pytest.fixture(scope="module")
def tenant(pipe: Pipeline, http: httpx.Client, erp: Erp, erp_secret: str) -> TenantHandle:
    """A tenant whose webhook endpoint is the reference ERP, verified by its ping."""
    tenant = pipe.make_tenant()
    registered = http.post(
        "/v1/webhook-endpoints", json={"url": erp.webhook_url, "secret": erp_secret}, headers=tenant.headers
    )
    assert registered.status_code == 201, registered.text
    endpoint = f"/v1/webhook-endpoints/{registered.json()['endpoint_id']}"
    wait_for(
        lambda: http.get(endpoint, headers=tenant.headers).json()["verified"], 30, "the ERP endpoint verified"
    )
    return tenant


@pytest.fixture(scope="module")
def reviewer_key(pipe: Pipeline, tenant: TenantHandle) -> str:
    _, key = create_key(pipe.pool, scope="reviewer", tenant_id=tenant.id, label="Ayşe")
    return key


def _in_review(
    pipe: Pipeline, http: httpx.Client, tenant: TenantHandle, key: str, text: str
) -> tuple[str, str]:
    """Submit an invoice that ends in review; its job id and its review id."""
    job_id = pipe.submit(tenant, text)
    assert pipe.wait_state(job_id, TERMINAL)["state"] == "REVIEW_REQUIRED"
    listed = http.get("/v1/reviews", params={"state": "all", "limit": 200}, headers=_bearer(key)).json()
    (review_id,) = [r["review_id"] for r in listed["reviews"] if r["job_id"] == job_id]
    return job_id, review_id


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _review(http: httpx.Client, key: str, review_id: str) -> dict[str, Any]:
    body: dict[str, Any] = http.get(f"/v1/reviews/{review_id}", headers=_bearer(key)).json()
    return body


def _sign_in(tab: Page, key: str) -> None:
    tab.fill("#key-input", key)
    tab.press("#key-input", "Enter")


def _highlighted(tab: Page, field: str) -> str:
    """The text of every mark that names ``field``, in document order."""
    return "".join(tab.locator(f'#document mark.span[data-fields~="{field}"]').all_text_contents())


def _focused(tab: Page, attribute: str) -> str | None:
    value: str | None = tab.evaluate(f"document.activeElement.getAttribute({attribute!r})")
    return value


def test_the_page_loads_without_a_key_under_a_strict_content_security_policy(http: httpx.Client) -> None:
    page = http.get("/review")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    # Its own files only: no third-party asset, no inline script
    assert "http://" not in page.text and "https://" not in page.text and "<script>" not in page.text
    for path, media in review_page.ASSETS.values():
        asset = http.get(path)
        assert asset.status_code == 200 and asset.headers["content-type"] == media, path
        assert asset.headers["content-security-policy"] == policy
    # The data behind it still needs a reviewer key
    assert http.get("/v1/reviews").status_code == 401


def test_a_reviewer_corrects_the_total_in_the_page_and_the_erp_holds_the_corrected_result_once(
    pipe: Pipeline,
    http: httpx.Client,
    tenant: TenantHandle,
    reviewer_key: str,
    erp: Erp,
    page: tuple[Page, Problems],
    tmp_path: Path,
) -> None:
    tab, problems = page
    # Given an invoice in review because its total is not its subtotal plus tax, never sent to the ERP
    job_id, review_id = _in_review(pipe, http, tenant, reviewer_key, sample_text(BAD_ARITHMETIC))
    assert erp.ledger(uuid.UUID(job_id)) is None
    review = _review(http, reviewer_key, review_id)

    # When a reviewer opens the page and enters a key that is not theirs, they are told so
    tab.goto(f"{pipe.edge.base_url}/review")
    _sign_in(tab, "fat_notarealkey_0000000000000000")
    expect(tab.get_by_role("alert")).to_contain_text("not accepted")
    # and with their reviewer key they see the queue
    _sign_in(tab, reviewer_key)
    task = tab.locator(f'#queue a[data-review-id="{review_id}"]')
    expect(task).to_be_visible()
    expect(tab.get_by_role("alert")).to_be_hidden()

    # When they move to the task with j and open it with Enter
    for _ in range(50):
        if _focused(tab, "data-review-id") == review_id:
            break
        tab.keyboard.press("j")
    assert _focused(tab, "data-review-id") == review_id
    tab.keyboard.press("Enter")
    expect(tab.locator("#task-view")).to_be_visible()
    expect(tab.locator("#task-state")).to_have_text("open")

    # Then the source text shows every evidence span highlighted, reading what the evidence names
    evidence = [e for e in review["evidence"] if e["text"] is not None]
    assert {e["field"] for e in evidence} >= {"/total", "/subtotal", "/tax_total", "/invoice_number"}
    expect(tab.locator("#document mark.span").first).to_be_visible()
    for entry in evidence:
        assert _highlighted(tab, entry["field"]) == entry["text"], entry["field"]
    assert _highlighted(tab, "/total") == "1.316,80"
    # and the reason in words
    expect(tab.locator("#reasons")).to_contain_text("total 1316.80 is not subtotal 1014.00 + tax 202.80")

    # When they correct the total to a figure that still does not add up, the page says why
    tab.keyboard.press("c")
    assert _focused(tab, "data-pointer") == "/total"
    tab.keyboard.type("1300.00")
    tab.keyboard.press("Escape")
    tab.keyboard.press("a")
    alert = tab.get_by_role("alert")
    expect(alert).to_contain_text("still does not pass validation")
    expect(alert).to_contain_text("Total: total 1300.00 is not subtotal")
    assert pipe.job(job_id)["state"] == "REVIEW_REQUIRED"

    # When they correct it to subtotal + tax and approve
    tab.keyboard.press("c")
    tab.keyboard.type("1216.80")
    tab.keyboard.press("Escape")
    expect(tab.locator("#approve")).to_have_text("Approve with 1 correction")
    shot = tmp_path / "review-page.png"
    tab.screenshot(path=str(shot), full_page=True)
    if os.environ.get("FATURA_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
    tab.keyboard.press("a")

    # Then the page says it is done, and the job succeeded with the reviewer's total
    expect(tab.get_by_role("status")).to_contain_text("Approved with 1 correction")
    expect(tab.locator("#task-state")).to_have_text("corrected")
    expect(tab.get_by_role("alert")).to_be_hidden()
    job = pipe.wait_state(job_id, {"SUCCEEDED"})
    assert job["result"]["total"] == "1216.80" and job["decided_by"] == "reviewer"

    # And the ERP's ledger holds that corrected result, applied once
    entry = wait_for(
        lambda: (e := erp.ledger(uuid.UUID(job_id))) and e["state"] == "SUCCEEDED" and e,
        30,
        "the corrected result in the ERP's ledger",
    )
    assert entry["effects"] == 1 and entry["state_version"] == job["state_version"]
    assert entry["result_digest"] == result_digest(job["result"])
    assert entry["counts"]["received"] == 1
    assert problems.found == []


def test_markup_inside_an_invoice_is_shown_as_text_and_never_runs(
    pipe: Pipeline, http: httpx.Client, tenant: TenantHandle, reviewer_key: str, page: tuple[Page, Problems]
) -> None:
    tab, problems = page
    # Given an invoice carrying an image tag in a line's description, a script in a note, and a
    # character outside the Basic Multilingual Plane ahead of every span (JavaScript counts it twice)
    script = "<script>window.pwned = 'script'</script>"
    image = "<img src=x onerror=\"window.pwned = 'img'\">"
    text = (
        sample_text(BAD_ARITHMETIC)
        .replace("Moda Cad. No:12,", "Moda Cad. No:12 🏢,", 1)
        .replace("Dosya Klasörü      ", f"{image} Klasör", 1)
        .replace("Ödeme:", f"Not: {script} lütfen ödeyin.\n\nÖdeme:", 1)
    )
    job_id, review_id = _in_review(pipe, http, tenant, reviewer_key, text)
    review = _review(http, reviewer_key, review_id)
    description = next(e for e in review["evidence"] if e["field"] == "/lines/1/description")
    assert image in description["text"]

    # When a reviewer follows the task's link (the review URL a webhook carries) and signs in
    tab.goto(f"{pipe.edge.base_url}/review#{review_id}")
    _sign_in(tab, reviewer_key)
    expect(tab.locator("#task-view")).to_be_visible()
    expect(tab.locator("#document mark.span").first).to_be_visible()

    # Then the markup is on the page as text, in the document, the evidence and the field
    assert tab.locator("#document img, #document script, #fields img, #fields script").count() == 0
    assert script in tab.locator("#document").text_content()
    assert _highlighted(tab, "/lines/1/description") == description["text"]
    assert (
        tab.locator('#fields input[data-pointer="/lines/1/description"]').input_value() == description["text"]
    )
    for entry in review["evidence"]:
        if entry["text"] is not None:
            assert _highlighted(tab, entry["field"]) == entry["text"], entry["field"]
    # and nothing of it ran
    assert tab.evaluate("window.pwned") is None
    assert problems.found == []
    assert pipe.job(job_id)["state"] == "REVIEW_REQUIRED"
