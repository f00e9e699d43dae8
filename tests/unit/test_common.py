"""Shared pieces: settings, named SQL, the state machine, API keys, the request parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.acceptance.requests import DocumentBody, DocumentRef, RequestParser
from services.acceptance.settings import AcceptanceSettings, RelaySettings
from services.common import faults, states
from services.common.api import apikeys
from services.common.api.body import JsonBody
from services.common.api.errors import ApiError, PayloadTooLarge, UnsupportedMediaType
from services.common.queries import load_queries
from services.common.settings import CommonSettings, SettingsError


def test_settings_come_from_fatura_variables_with_defaults() -> None:
    s = AcceptanceSettings.from_env({"FATURA_HTTP_PORT": "9000", "FATURA_MAX_DOCUMENT_BYTES": "4096"})
    assert s.http_port == 9000
    assert s.max_document_bytes == 4096
    assert s.http_workers == 2
    assert s.common.database_url.startswith("postgresql://")


@pytest.mark.parametrize(
    "env",
    [
        {"FATURA_HTTP_PORT": "eighty"},
        {"FATURA_HTTP_PORT": "70000"},
        {"FATURA_LOG_LEVEL": "LOUD"},
        {"FATURA_QUEUE_PREFIX": "a b"},
        {"FATURA_RELAY_BATCH_SIZE": "0"},
        {"FATURA_RELAY_EVENTS_PER_MESSAGE": "65"},
    ],
)
def test_a_bad_setting_fails_fast_naming_the_variable(env: dict[str, str]) -> None:
    name = next(iter(env))
    with pytest.raises(SettingsError, match=name):
        AcceptanceSettings.from_env(env) if not name.startswith("FATURA_RELAY") else RelaySettings.from_env(
            env
        )


def test_unknown_fault_names_are_refused() -> None:
    settings = CommonSettings.from_env({"FATURA_FAULTS": "crash_after_publish_confirm,crash_somewhere"})
    with pytest.raises(SettingsError, match="crash_somewhere"):
        faults.check(settings.faults)


def test_named_queries_load_and_duplicates_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.sql"
    good.write_text("-- name: one\nSELECT 1\n\n-- name: two\nSELECT 2;\n")
    assert load_queries(good) == {"one": "SELECT 1", "two": "SELECT 2;"}
    bad = tmp_path / "bad.sql"
    bad.write_text("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")
    with pytest.raises(ValueError, match="defined twice"):
        load_queries(bad)


def test_final_states_never_change_and_any_running_state_can_be_cancelled() -> None:
    for final in states.FINAL:
        assert not any(states.can_transition(final, target) for target in states.ALL)
    # A job awaiting review leaves it only by a reviewer's decision.
    assert {t for t in states.ALL if states.can_transition(states.REVIEW_REQUIRED, t)} == {
        states.SUCCEEDED,
        states.REJECTED,
    }
    for running in states.NON_TERMINAL:
        assert states.can_transition(running, states.CANCELLED)
        assert states.can_transition(running, states.FAILED_TERMINAL)
    assert states.can_transition(states.RETRY_SCHEDULED, states.RUNNING)
    assert not states.can_transition(states.READY, states.SUCCEEDED)


def test_api_keys_are_stored_as_hashes_and_checked_in_constant_time() -> None:
    key = apikeys.generate()
    assert key.plaintext.startswith(f"fat_{key.prefix}_")
    assert apikeys.parse(key.plaintext) == key.prefix
    assert apikeys.matches(key.plaintext, key.secret_hash)
    assert not apikeys.matches(key.plaintext + "x", key.secret_hash)
    assert key.plaintext.encode() not in key.secret_hash
    assert apikeys.parse("fat_short_x") is None


PARSER = RequestParser(AcceptanceSettings(max_document_bytes=1024))
BODY = JsonBody(max_body_bytes=2048)


def test_the_body_reader_accepts_json_content_types_with_parameters() -> None:
    BODY.check_content_type("application/json; charset=utf-8")
    with pytest.raises(UnsupportedMediaType):
        BODY.check_content_type("application/jsonx")
    with pytest.raises(UnsupportedMediaType):
        BODY.check_content_type(None)


def test_the_parser_applies_defaults_and_measures_documents_in_bytes() -> None:
    job = PARSER.create_job({"document": {"text": "ğ" * 10}})
    assert isinstance(job.document, DocumentBody)
    assert job.document.size_bytes == 20
    assert (job.schema, job.priority, job.deadline_seconds, job.options) == (
        "invoice.v1",
        "batch",
        86_400,
        {},
    )
    ref = PARSER.create_job({"document_id": "01a22b15-3596-715b-805f-e7647f49c5a8", "document_version": 2.0})
    assert isinstance(ref.document, DocumentRef) and ref.document.version == 2
    with pytest.raises(PayloadTooLarge):
        PARSER.create_job({"document": {"text": "x" * 1025}})


def test_the_body_reader_refuses_a_declared_length_that_is_not_a_number() -> None:
    with pytest.raises(ApiError) as refused:
        BODY.check_declared_length("12abc")
    assert refused.value.status == 400


def test_the_acceptance_and_the_unit_of_work_record_a_change_with_one_definition() -> None:
    # The single-statement acceptance embeds the unit of work's own inserts, not a copy of them
    from services.acceptance.queries import Q as ACCEPTANCE
    from services.common import uow

    for table in ("job_events", "outbox_events"):
        line = next(line for line in uow.RECORD_CHANGE.splitlines() if f"INSERT INTO {table}" in line)
        insert = line[line.index("INSERT INTO") :]
        assert insert in ACCEPTANCE["accept_job"]
    assert "{change_ctes}" not in ACCEPTANCE["accept_job"]
    assert ACCEPTANCE["accept_job"].count("INSERT INTO outbox_events") == 1
