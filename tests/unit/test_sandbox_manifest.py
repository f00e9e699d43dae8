"""The sample manifest holds true: each sample, read by the simulated provider (honestly, or under
the fault it was built for) and judged by validation with the demo tenant's master data, ends in
the state and with the reason codes the manifest gives."""

from __future__ import annotations

import csv
import json

import pytest

from services.inference.validation import MasterSupplier, ValidationContext, normalize_tax_id, validate
from services.sandbox.provider.extract import extract
from services.sandbox.provider.faults import hallucinate_iban, obey_injection
from services.sandbox.samples import SUPPLIERS_CSV, Sample, load_samples

SAMPLES = load_samples()
DEMO_CURRENCIES = frozenset({"TRY", "EUR", "USD", "GBP"})  # a new tenant's default
OUTCOME = {"succeeded": "SUCCEEDED", "review_required": "REVIEW_REQUIRED"}
CONTENT_FAULTS = {"hallucinated_iban": hallucinate_iban, "obey_injection": obey_injection}


def _suppliers() -> dict[str, MasterSupplier]:
    with SUPPLIERS_CSV.open(encoding="utf-8") as rows:
        return {
            normalize_tax_id(row["tax_id"]): MasterSupplier(
                row["tax_id"], row["name"], row["iban"] or None, row["currency"] or None
            )
            for row in csv.DictReader(rows)
        }


def _judge(text: str, answer: dict[str, object]) -> tuple[str, list[str]]:
    context = ValidationContext(text, DEMO_CURRENCIES, _suppliers())
    verdict = validate(json.dumps(answer, ensure_ascii=False), context)
    # the manifest names reason codes; one code may be given for several fields
    return OUTCOME.get(verdict.outcome, verdict.outcome), sorted(verdict.review_codes)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.filename)
def test_each_sample_ends_as_its_manifest_says(sample: Sample) -> None:
    state, reasons = _judge(sample.text, extract(sample.text))
    assert (state, reasons) == (sample.expect, sorted(sample.reasons))


@pytest.mark.parametrize(
    ("sample", "mode"),
    [(s, mode) for s in SAMPLES for mode in s.faults],
    ids=lambda v: getattr(v, "filename", v),
)
def test_a_sample_built_for_a_fault_ends_as_the_manifest_says_under_it(sample: Sample, mode: str) -> None:
    expected = sample.faults[mode]
    answer = CONTENT_FAULTS[mode](extract(sample.text), sample.text)
    assert _judge(sample.text, answer) == (expected.expect, sorted(expected.reasons))


def test_every_supplier_a_sample_expects_to_know_is_in_the_master_data() -> None:
    known = _suppliers()
    for sample in SAMPLES:
        if "supplier_unknown" not in sample.reasons:
            assert normalize_tax_id(extract(sample.text)["supplier"]["tax_id"]) in known, sample.filename
