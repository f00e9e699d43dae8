"""Reading supplier master data (``parse_suppliers``): every bad row is named, tax ids are compared
normalized, IBANs are checksum-checked, and the sample file reads cleanly (no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.acceptance.tenants import Supplier, SupplierFileError, parse_suppliers
from services.sandbox.samples import SUPPLIERS_CSV

HEADER = b"tax_id,name,iban,currency\n"


def _problems(path: Path) -> list[str]:
    with pytest.raises(SupplierFileError) as refused:
        parse_suppliers(path)
    return refused.value.problems


def _csv(tmp_path: Path, body: bytes, header: bytes = HEADER) -> Path:
    path = tmp_path / "suppliers.csv"
    path.write_bytes(header + body)
    return path


def test_a_row_with_more_fields_than_the_header_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path, b"1,Good Ltd,,TRY\n2,Extra Ltd,,TRY,surplus\n")
    assert _problems(path) == ["row 2 (line 3): 5 fields, but the header names 4"]


def test_a_header_with_an_unknown_column_is_refused_without_a_type_error(tmp_path: Path) -> None:
    # Before: sorting the unknown names [None, "notes"] raised a TypeError
    path = _csv(tmp_path, b"1,Good Ltd,,TRY,n,surplus\n", header=b"tax_id,name,iban,currency,notes\n")
    (problem,) = _problems(path)
    assert "header (line 1)" in problem and "notes" in problem


def test_a_leading_byte_order_mark_is_read_past_and_one_inside_a_row_is_named(tmp_path: Path) -> None:
    # Given a file saved by a spreadsheet (UTF-8 with a BOM) and one concatenated from two of them
    saved = _csv(tmp_path, b"1,Good Ltd,,TRY\n", header=b"\xef\xbb\xbf" + HEADER)
    assert parse_suppliers(saved) == [Supplier("1", "Good Ltd", None, "TRY")]
    joined = _csv(tmp_path, b"1,Good Ltd,,TRY\n\xef\xbb\xbf2,Other Ltd,,TRY\n")
    assert _problems(joined) == ["row 2 (line 3): tax_id holds a byte-order mark (U+FEFF)"]


def test_a_nul_byte_or_a_control_character_is_named_not_left_to_the_database(tmp_path: Path) -> None:
    path = _csv(tmp_path, b'1,Good\x00Ltd,,TRY\n2,"Two\nLines",,TRY\n')
    assert _problems(path) == [
        "row 1 (line 2): name holds a NUL byte",
        "row 2 (line 4): name holds a control character (U+000A)",
    ]


def test_tax_ids_are_normalized_before_duplicates_are_looked_for(tmp_path: Path) -> None:
    path = _csv(tmp_path, b"94-1234567,Pinecrest,,USD\n5,Other,,USD\n94 123 4567,Pinecrest Again,,USD\n")
    assert _problems(path) == [
        "row 3 (line 4): tax_id '94 123 4567' is the same supplier as row 1 (line 2)'s '94-1234567' "
        "(both are 941234567 once normalized)"
    ]


def test_a_supplier_is_keyed_by_its_normalized_tax_id(tmp_path: Path) -> None:
    path = _csv(tmp_path, b"de 811-907-980,Muller,de89 3704 0044 0532 0130 00,eur\n")
    assert parse_suppliers(path) == [Supplier("DE811907980", "Muller", "DE89370400440532013000", "EUR")]


def test_an_iban_that_fails_iso_13616_is_named_and_an_empty_one_is_allowed(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        b"1,Checksum Ltd,TR33 0006 1005 1978 6457 8413 27,TRY\n"
        b"2,Short Ltd,DE51 3704 0044 0532 0130 0,EUR\n"  # the checksum holds, one digit is missing
        b"3,Nowhere Ltd,XX42 1234 5678 9012 34,EUR\n"
        b"4,Symbols Ltd,DE89-3704/0044,EUR\n"
        b"5,No Account Ltd,,TRY\n",
    )
    assert _problems(path) == [
        "row 1 (line 2): the IBAN TR330006100519786457841327 fails its checksum",
        "row 2 (line 3): the IBAN DE5137040044053201300 is not in its country's IBAN format",
        "row 3 (line 4): the IBAN XX4212345678901234 names a country without IBANs",
        "row 4 (line 5): the IBAN DE89-3704/0044 holds characters other than letters and digits",
    ]


def test_a_json_row_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    path = tmp_path / "suppliers.json"
    path.write_text(
        '[{"tax_id": 12, "name": "Number Ltd"}, {"tax_id": "2", "name": "x", "notes": "n"}, 3,'
        ' {"tax_id": "4", "name": "Bad\\u0000Name"}]'
    )
    assert _problems(path) == [
        "row 1: tax_id must be text, not int",
        "row 2: unknown fields ['notes']; known: ['tax_id', 'name', 'iban', 'currency']",
        "row 3: expected an object, not int",
        "row 4: name holds a NUL byte",
    ]


def test_the_sample_master_data_reads_cleanly_with_normalized_tax_ids() -> None:
    suppliers = parse_suppliers(SUPPLIERS_CSV)
    assert len(suppliers) == len(SUPPLIERS_CSV.read_text(encoding="utf-8").splitlines()) - 1
    assert {"941234567", "843312907", "IE6388047V"} <= {s.tax_id for s in suppliers}


def test_validation_and_import_normalize_tax_ids_with_one_function() -> None:
    from services.common.taxids import normalize_tax_id
    from services.inference import validation

    assert validation.normalize_tax_id is normalize_tax_id
    assert normalize_tax_id("\uff44\uff45 811-907.980") == "DE811907980"  # fullwidth letters, NFKC
