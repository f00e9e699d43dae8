"""The OpenAI chat completions wire format: reading a request, writing answers, chunks and errors.

Pure functions: the HTTP layer passes parsed JSON in and sends what comes out. Token counts are a
deterministic estimate (about four characters a token), so the same request always costs the same.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

FINGERPRINT = "fatura-sandbox-simulator"
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MESSAGE_OVERHEAD_TOKENS = 4

# How the simulated model finds the document in a prompt, as any reader of a prompt would: a block
# between a "-----BEGIN <label>-----" line and the matching "-----END <label>-----" line (the
# convention PEM made common). It knows nothing of who wrote the prompt.
_BLOCK = re.compile(r"^-----BEGIN ([^\n]{1,80}?)-----\n(.*)\n-----END \1-----$", re.DOTALL | re.MULTILINE)


def delimited_block(content: str) -> str | None:
    """The text of the first BEGIN/END block in ``content``, or None when there is none."""
    match = _BLOCK.search(content)
    return match.group(2) if match else None


class RequestError(ValueError):
    """A request the simulator refuses; ``status`` and the OpenAI-style body say why."""

    def __init__(self, status: int, message: str, *, type_: str, code: str | None, param: str | None = None):
        super().__init__(message)
        self.status, self.type, self.code, self.param = status, type_, code, param

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, type_="invalid_request_error", code="invalid_request", param=param)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool
    max_tokens: int | None

    @property
    def document(self) -> str:
        """The document text: inside a BEGIN/END block of the last user message, else all of it."""
        last = next((m for m in reversed(self.messages) if m["role"] == "user"), self.messages[-1])
        content = message_text(last)
        block = delimited_block(content)
        return content if block is None else block

    @property
    def prompt_tokens(self) -> int:
        return sum(estimate_tokens(message_text(m)) + MESSAGE_OVERHEAD_TOKENS for m in self.messages)


def parse_request(body: Any) -> ChatRequest:
    """A chat completion request, or a ``RequestError`` (400) naming the first problem."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required and must be a non-empty string.", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` is required and must be a non-empty array.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(
                f"messages[{index}] must be an object with a valid `role`.", f"messages[{index}]"
            )
        if not _valid_content(message.get("content")):
            raise bad_request(
                f"messages[{index}].content must be a string or an array of text parts.",
                f"messages[{index}].content",
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object.", "stream_options")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise bad_request("`max_tokens` must be a positive integer.", "max_tokens")
    n = body.get("n", 1)
    if n != 1:
        raise bad_request("Only `n: 1` is supported by the simulator.", "n")
    temperature = body.get("temperature", 1)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise bad_request("`temperature` must be a number between 0 and 2.", "temperature")
    return ChatRequest(
        model=model,
        messages=messages,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        max_tokens=max_tokens,
    )


def _valid_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and (part.get("type") != "text" or isinstance(part.get("text"), str))
        for part in content
    )


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_id() -> str:
    return f"chatcmpl-sim-{uuid.uuid4().hex[:24]}"


def completion(
    model: str, content: str, prompt_tokens: int, completion_tokens: int, finish_reason: str = "stop"
) -> dict[str, Any]:
    return {
        "id": completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(cid: str, model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(cid: str, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    body = chunk(cid, model, {})
    body["choices"] = []
    body["usage"] = usage(prompt_tokens, completion_tokens)
    return body


def pieces(content: str, count: int = 8) -> list[str]:
    """The content cut into about ``count`` deltas (a stream's chunks)."""
    size = max(1, math.ceil(len(content) / count))
    return [content[i : i + size] for i in range(0, len(content), size)] or [""]
