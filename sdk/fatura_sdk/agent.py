"""Tools for an LLM agent: ``submit_invoice``, ``check_invoice_job`` and
``list_unfinished_invoice_jobs``, with JSON Schemas for their parameters and a dispatcher whose
answers an agent cannot mistake for completion (seed 004).

The waiting happens inside the tool, never in the model's loop: ``submit_invoice`` submits once and
waits up to ``wait_seconds`` for the answer. Every answer is a JSON object with ``done``,
``status`` (succeeded, review_required, failed, timed_out, not_started), ``state``, ``job_id``,
``next_action`` and a ``message`` that says in words whether the work is complete and what to call
next. The job ids live in Fatura, not only in the conversation: ``list_unfinished_invoice_jobs``
finds them again after the context was compacted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fatura_sdk._async_client import AsyncClient
from fatura_sdk._client import Client
from fatura_sdk._polling import AwaitResult, reason_codes
from fatura_sdk.errors import ApiError, Conflict, FaturaError
from fatura_sdk.models import UNFINISHED_STATES

JSON = dict[str, Any]

SUBMIT = "submit_invoice"
CHECK = "check_invoice_job"
LIST = "list_unfinished_invoice_jobs"
REUSED = "idempotency_key_reused"
DEFAULT_WAIT_SECONDS = 120
MAX_WAIT_SECONDS = 600
_UUID = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"

_WAIT: JSON = {
    "type": "integer",
    "minimum": 0,
    "maximum": MAX_WAIT_SECONDS,
    "default": DEFAULT_WAIT_SECONDS,
    "description": "How long this tool may wait for the job to finish before it answers.",
}

TOOLS: list[JSON] = [
    {
        "name": SUBMIT,
        "description": (
            "Extract an invoice: starts ONE extraction job and waits for it (up to wait_seconds). "
            "The answer's `done` and `status` say whether it is complete; only status 'succeeded' "
            "carries a usable result. If the answer is not done, the job goes on: keep its job_id "
            f"and call {CHECK} later. Never call {SUBMIT} again for the same invoice."
        ),
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["text"],
            "properties": {
                "text": {"type": "string", "minLength": 1, "description": "The invoice's full text."},
                "filename": {"type": "string", "maxLength": 255},
                "idempotency_key": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "description": (
                        "Leave it out: the same text then returns the same job, never a second one. "
                        "Give a new key only to extract the same text again on purpose."
                    ),
                },
                "wait_seconds": _WAIT,
            },
        },
    },
    {
        "name": CHECK,
        "description": (
            "Check an extraction job started by submit_invoice, waiting up to wait_seconds for it to "
            "finish. Only status 'succeeded' (done: true) carries a usable result."
        ),
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["job_id"],
            "properties": {
                "job_id": {"type": "string", "pattern": _UUID},
                "wait_seconds": {**_WAIT, "default": 60},
            },
        },
    },
    {
        "name": LIST,
        "description": (
            "List the extraction jobs that are not finished (queued, running, retrying or waiting "
            f"for a human reviewer), to pick up work started earlier; check each with {CHECK}."
        ),
        "parameters": {"type": "object", "additionalProperties": False, "properties": {}},
    },
]


def openai_tools() -> list[JSON]:
    """``TOOLS`` in the shape of OpenAI's chat completions ``tools``."""
    return [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
        for t in TOOLS
    ]


def anthropic_tools() -> list[JSON]:
    """``TOOLS`` in the shape of Anthropic's messages ``tools``."""
    return [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS
    ]


class ToolArgumentError(ValueError):
    """The agent called a tool with arguments its schema does not allow."""


def parse_arguments(name: str, arguments: str | Mapping[str, Any] | None) -> JSON:
    """The arguments of a call (a JSON string, as OpenAI sends them, or a mapping), checked."""
    tool = next((t for t in TOOLS if t["name"] == name), None)
    if tool is None:
        raise ToolArgumentError(f"there is no tool {name!r}; the tools are {SUBMIT}, {CHECK} and {LIST}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ToolArgumentError("the arguments are not a JSON object") from None
    args = dict(arguments or {})
    schema = tool["parameters"]
    unknown = sorted(set(args) - set(schema["properties"]))
    if unknown:
        raise ToolArgumentError(f"unknown arguments: {', '.join(unknown)}")
    for required in schema.get("required", []):
        if not isinstance(args.get(required), str) or not args[required].strip():
            raise ToolArgumentError(f"`{required}` is required and must be a non-empty string")
    for field in ("filename", "idempotency_key"):
        if field in args and not isinstance(args[field], str):
            raise ToolArgumentError(f"`{field}` must be a string")
    if "wait_seconds" in args:
        wait = args["wait_seconds"]
        if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= MAX_WAIT_SECONDS:
            raise ToolArgumentError(f"`wait_seconds` must be an integer from 0 to {MAX_WAIT_SECONDS}")
    else:
        args["wait_seconds"] = schema["properties"].get("wait_seconds", {}).get("default", 0)
    return args


def document_key(text: str) -> str:
    """The key of a submission the agent gave none: the same text is the same job."""
    return "agent-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:48]


def answer(result: AwaitResult) -> JSON:
    """What the agent reads about a job: exactly one status, always the job id, words for the model."""
    job = result.job_id
    body: JSON = {"status": result.outcome, "done": result.done, "state": result.state, "job_id": job}
    if result.outcome == "succeeded":
        body["next_action"] = "use_result"
        body["result"] = result.result
        body["message"] = (
            f"COMPLETE: invoice job {job} SUCCEEDED; the validated extraction is in `result`. This is "
            f"the final answer for this invoice: do not call {SUBMIT} for it again."
        )
    elif result.outcome == "review_required":
        codes = reason_codes(result.review)
        body["next_action"] = f"wait_for_reviewer_then_call_{CHECK}"
        body["check_after_seconds"] = result.poll_after_seconds
        body["review_reasons"] = codes
        body["message"] = (
            f"NOT complete: invoice job {job} did NOT pass validation ({', '.join(codes) or 'see review'}) "
            "and waits for a human reviewer, who approves or rejects it; that can take hours. There is "
            "no usable result: do not report the invoice as extracted. Tell the user it awaits review; "
            f"call {CHECK} with job_id {job} later (no sooner than {result.poll_after_seconds} seconds). "
            f"Do not call {SUBMIT} again for it."
        )
    elif result.outcome == "failed":
        error = result.error or {}
        body["next_action"] = "report_failure"
        body["error"] = error
        body["message"] = (
            f"FAILED: invoice job {job} ended {result.state} without a result "
            f"({error.get('class', 'unknown')}: {error.get('message', '')}). Do not report success; "
            "tell the user the invoice could not be extracted and why."
        )
    else:
        body["next_action"] = f"call_{CHECK}"
        body["check_after_seconds"] = result.poll_after_seconds
        body["message"] = (
            f"NOT complete: invoice job {job} is still {result.state} after {result.waited_seconds:.0f} "
            f"seconds; no result exists yet. Do not report success and do not call {SUBMIT} again. "
            f"Call {CHECK} with job_id {job} after {result.poll_after_seconds} seconds."
        )
    return body


def refusal(exc: FaturaError | ToolArgumentError, *, job_id: str | None = None) -> JSON:
    """A call that could not be carried out: nothing was started (or nothing could be read)."""
    body: JSON = {"status": "not_started" if job_id is None else "unknown", "done": False, "state": None}
    body["job_id"] = job_id
    if isinstance(exc, Conflict) and exc.code == REUSED and exc.job_id:
        # The same invoice went in before (the key is the text's) with other options: that job stands.
        body.update(status="already_submitted", job_id=exc.job_id, next_action=f"call_{CHECK}")
        body["message"] = (
            f"NOT complete: this invoice was already submitted as job {exc.job_id}; no second job was "
            f"started. Call {CHECK} with job_id {exc.job_id} to read how it is doing."
        )
        return body
    if isinstance(exc, ToolArgumentError) or (
        isinstance(exc, ApiError) and exc.status < 500 and exc.status != 429
    ):
        body["next_action"] = "fix_request"
        detail = exc.code if isinstance(exc, ApiError) else "invalid_arguments"
        body["error"] = {"code": detail, "message": str(exc)}
        what = "No job was started" if job_id is None else f"Job {job_id} could not be read"
        body["message"] = f"NOT complete: {what} ({detail}: {exc}). Fix the request before trying again."
        return body
    retry_after = getattr(exc, "retry_after", None)
    wait = int(retry_after) if isinstance(retry_after, int | float) else 30
    body["next_action"] = f"call_{CHECK}_later" if job_id else f"call_{SUBMIT}_later"
    body["check_after_seconds"] = wait
    body["error"] = {"code": getattr(exc, "code", "unreachable"), "message": str(exc)}
    what = (
        "the invoice was NOT submitted; no job exists"
        if job_id is None
        else f"job {job_id} could not be read"
    )
    body["message"] = (
        f"NOT complete: Fatura is busy or unreachable and {what}. Try again after {wait} seconds."
    )
    return body


def unfinished(jobs: list[JSON]) -> JSON:
    ids = ", ".join(j["job_id"] for j in jobs) or "none"
    return {
        "status": "listed",
        "done": not jobs,
        "jobs": jobs,
        "next_action": f"call_{CHECK}_for_each" if jobs else "nothing_pending",
        "message": (
            f"{len(jobs)} invoice job(s) are NOT finished: {ids}. Check each with {CHECK}; do not submit "
            "their invoices again."
            if jobs
            else "No invoice job is waiting: every job started earlier has finished."
        ),
    }


def _summary(job: Any) -> JSON:
    return {"job_id": job.job_id, "state": job.state, "done": job.done}


class InvoiceTools:
    """``InvoiceTools(client).call(name, arguments)`` answers one tool call with a JSON object; it
    never raises for a slow or failed job, nor for a refused request."""

    def __init__(self, client: Client, *, page_size: int = 20) -> None:
        self.client = client
        self.page_size = page_size

    def call(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> JSON:
        try:
            args = parse_arguments(name, arguments)
        except ToolArgumentError as exc:
            return refusal(exc)
        job_id = args.get("job_id")
        try:
            if name == SUBMIT:
                return answer(
                    self.client.start_and_await(
                        args["text"],
                        filename=args.get("filename"),
                        idempotency_key=args.get("idempotency_key") or document_key(args["text"]),
                        max_wait=args["wait_seconds"],
                    )
                )
            if name == CHECK:
                return answer(self.client.await_job(args["job_id"], max_wait=args["wait_seconds"]))
            jobs: list[JSON] = []
            for state in UNFINISHED_STATES:
                jobs += [_summary(j) for j in self.client.list(state=state, limit=self.page_size).jobs]
            return unfinished(jobs)
        except FaturaError as exc:
            return refusal(exc, job_id=job_id)


class AsyncInvoiceTools:
    """``InvoiceTools`` for an ``AsyncClient``: ``await tools.call(name, arguments)``."""

    def __init__(self, client: AsyncClient, *, page_size: int = 20) -> None:
        self.client = client
        self.page_size = page_size

    async def call(self, name: str, arguments: str | Mapping[str, Any] | None = None) -> JSON:
        try:
            args = parse_arguments(name, arguments)
        except ToolArgumentError as exc:
            return refusal(exc)
        job_id = args.get("job_id")
        try:
            if name == SUBMIT:
                return answer(
                    await self.client.start_and_await(
                        args["text"],
                        filename=args.get("filename"),
                        idempotency_key=args.get("idempotency_key") or document_key(args["text"]),
                        max_wait=args["wait_seconds"],
                    )
                )
            if name == CHECK:
                return answer(await self.client.await_job(args["job_id"], max_wait=args["wait_seconds"]))
            jobs: list[JSON] = []
            for state in UNFINISHED_STATES:
                page = await self.client.list(state=state, limit=self.page_size)
                jobs += [_summary(j) for j in page.jobs]
            return unfinished(jobs)
        except FaturaError as exc:
            return refusal(exc, job_id=job_id)
