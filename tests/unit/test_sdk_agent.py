"""fatura_sdk.agent: the tools' JSON Schemas, and answers an LLM agent cannot mistake for completion
(seed 004), from a dispatcher driven against a scripted API on a fake clock."""

from __future__ import annotations

import json

import jsonschema
import pytest
from sdk_fakes import JOB, FakeTime, Script, accepted, make_client, respond, status

from fatura_sdk import agent
from fatura_sdk.agent import CHECK, LIST, SUBMIT, InvoiceTools, document_key, parse_arguments


def _tools(script: Script) -> InvoiceTools:
    return InvoiceTools(make_client(script))


def _script() -> Script:
    return Script(FakeTime())


def test_every_tool_has_a_valid_json_schema_and_both_vendor_shapes() -> None:
    assert [t["name"] for t in agent.TOOLS] == [SUBMIT, CHECK, LIST]
    for tool in agent.TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool["parameters"])
        assert "done" in tool["description"] or tool["name"] == LIST
    assert agent.openai_tools()[0]["function"]["parameters"] == agent.TOOLS[0]["parameters"]
    assert agent.anthropic_tools()[1]["input_schema"] == agent.TOOLS[1]["parameters"]


def test_arguments_come_as_json_text_or_a_mapping_and_are_checked() -> None:
    assert parse_arguments(SUBMIT, json.dumps({"text": "x"}))["wait_seconds"] == agent.DEFAULT_WAIT_SECONDS
    assert parse_arguments(CHECK, {"job_id": JOB})["wait_seconds"] == 60
    for name, bad in [
        (SUBMIT, {}),
        (SUBMIT, {"text": "x", "wait_seconds": 601}),
        (SUBMIT, {"text": "x", "wait_seconds": True}),
        (SUBMIT, {"text": "x", "colour": "red"}),
        (CHECK, "{not json"),
        ("delete_everything", {}),
    ]:
        with pytest.raises(agent.ToolArgumentError):
            parse_arguments(name, bad)


def test_a_slow_job_answers_not_complete_with_the_job_id_and_the_tool_to_call_next() -> None:
    script = _script()
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status("RUNNING")))
    answer = _tools(script).call(SUBMIT, {"text": "FATURA 1", "wait_seconds": 30})

    assert answer["status"] == "timed_out" and answer["done"] is False and answer["job_id"] == JOB
    assert answer["next_action"] == f"call_{CHECK}" and answer["check_after_seconds"] >= 1
    assert "NOT complete" in answer["message"] and CHECK in answer["message"] and JOB in answer["message"]
    assert f"do not call {SUBMIT} again" in answer["message"] and "result" not in answer
    assert sum(script.time.sleeps) == pytest.approx(30)


def test_the_same_invoice_submitted_twice_is_one_job_by_its_texts_key() -> None:
    script = _script()
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status("RUNNING")))
    tools = _tools(script)
    tools.call(SUBMIT, {"text": "FATURA 1", "wait_seconds": 0})
    tools.call(SUBMIT, {"text": "FATURA 1", "wait_seconds": 0})
    keys = [s.headers["idempotency-key"] for s in script.seen if s.method == "POST"]
    assert keys == [document_key("FATURA 1")] * 2


def test_success_is_the_only_answer_with_a_result_and_done_true_without_an_error() -> None:
    script = _script()
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status("SUCCEEDED", result={"total": "1.00"})))
    answer = _tools(script).call(SUBMIT, {"text": "x"})
    assert (answer["status"], answer["done"], answer["next_action"]) == ("succeeded", True, "use_result")
    assert answer["result"] == {"total": "1.00"} and answer["message"].startswith("COMPLETE")


@pytest.mark.parametrize(
    ("state", "extra", "expected"),
    [
        (
            "REVIEW_REQUIRED",
            {"review": {"reasons": [{"code": "iban_mismatch"}]}, "result": {"x": 1}},
            "review_required",
        ),
        ("FAILED_TERMINAL", {"error": {"class": "provider_5xx", "message": "gave up"}}, "failed"),
        ("REJECTED", {"error": {"class": "rejected_by_reviewer", "message": "no"}}, "failed"),
        ("CANCELLED", {}, "failed"),
        ("RETRY_SCHEDULED", {}, "timed_out"),
    ],
)
def test_no_other_answer_carries_a_result_or_says_complete(state: str, extra: dict, expected: str) -> None:
    script = _script()
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status(state, **extra)))
    answer = _tools(script).call(CHECK, {"job_id": JOB, "wait_seconds": 0})
    assert answer["status"] == expected and answer["job_id"] == JOB
    assert "result" not in answer and not answer["message"].startswith("COMPLETE")
    assert answer["done"] is (expected == "failed")
    if expected == "review_required":
        assert answer["review_reasons"] == ["iban_mismatch"] and "reviewer" in answer["message"]
        assert "NOT complete" in answer["message"] and answer["check_after_seconds"] == 60
    if expected == "failed":
        assert answer["next_action"] == "report_failure" and "Do not report success" in answer["message"]


def test_a_refused_submission_says_nothing_was_started_and_what_to_do() -> None:
    script = _script()
    script.on(
        "POST /v1/extraction-jobs",
        respond(422, {"error": {"code": "invalid_request", "message": "text is empty"}}),
        respond(429, {"error": {"code": "tenant_quota_exceeded", "message": "m"}}, retry_after="3600"),
        respond(409, {"error": {"code": "idempotency_key_reused", "message": "m", "job_id": JOB}}),
    )
    tools = _tools(script)
    invalid = tools.call(SUBMIT, {"text": "x"})
    busy = tools.call(SUBMIT, {"text": "x"})
    again = tools.call(SUBMIT, {"text": "x", "filename": "other.txt"})
    bad_args = tools.call(CHECK, {"job_id": 7})

    assert (invalid["status"], invalid["job_id"], invalid["next_action"]) == (
        "not_started",
        None,
        "fix_request",
    )
    assert busy["next_action"] == f"call_{SUBMIT}_later" and busy["check_after_seconds"] == 3600
    assert "NOT submitted" in busy["message"]
    assert (again["status"], again["job_id"], again["next_action"]) == (
        "already_submitted",
        JOB,
        f"call_{CHECK}",
    )
    assert bad_args["next_action"] == "fix_request" and bad_args["done"] is False


def test_unfinished_jobs_are_listed_so_a_compacted_conversation_finds_them_again() -> None:
    script = _script()
    summary = {"job_id": JOB, "state": "RUNNING", "done": False, "state_version": 2, "status_url": "/x"}
    script.on("GET /v1/extraction-jobs", respond(200, {"jobs": [summary], "next_cursor": None}))
    answer = _tools(script).call(LIST)
    assert answer["jobs"] == [{"job_id": JOB, "state": "RUNNING", "done": False}] * 4
    assert CHECK in answer["message"] and answer["done"] is False
    assert [s.path for s in script.seen] == ["/v1/extraction-jobs"] * 4
