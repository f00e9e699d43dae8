"""Reading an OpenAI-compatible chat completion: SSE frames of a stream, or one JSON body (pure).

A ``Completion`` collects the frames of one stream. ``feed`` says what each frame was, which is
what the stream gate needs: content (decisive: the channel is answering), an error object (decisive:
the channel failed inside a 200), or something that decides nothing yet (a role-only delta, a
keep-alive comment, a usage frame). Providers put an error inside a 200 either as a frame
``{"error": {...}}`` or as an SSE ``event: error``; both count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson


class Frame(StrEnum):
    CONTENT = "content"  # decisive: text, a tool call or a finish reason
    ERROR = "error"  # decisive: an error object inside the 200
    PENDING = "pending"  # decides nothing
    DONE = "done"  # data: [DONE]
    BAD = "bad"  # not JSON, or not a chat completion chunk


class BadCompletion(ValueError):
    """A 2xx body that is not a chat completion."""


@dataclass
class Completion:
    parts: list[str] = field(default_factory=list)
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    error_message: str | None = None
    saw_choice: bool = False
    done: bool = False
    _event: str | None = None
    _data: list[str | bytes] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(self.parts)

    def feed_line(self, line: str) -> Frame | None:
        """One line of the SSE stream; a frame when a blank line ends an event, else None."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a keep-alive comment (OpenRouter sends them while the model thinks)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def feed_raw_line(self, line: bytes) -> Frame | None:
        """``feed_line`` for a line as it came, not decoded: a data line's value stays bytes, which
        orjson reads as they are (decoding it first, for orjson to encode it back, cost a third of
        reading a frame)."""
        if line.startswith(b"data: "):  # nearly every line: feed_line's reading, spelled out
            self._data.append(line[6:])
            return None
        if not line:
            return self._dispatch()
        return self.feed_line(line.decode("utf-8", "replace"))

    def finish(self) -> Frame | None:
        """The stream ended: an event not followed by a blank line still counts."""
        return self._dispatch()

    def _dispatch(self) -> Frame | None:
        """A blank line: the event so far, if it had data, is a frame."""
        lines, event = self._data, self._event
        self._event = None
        if not lines:
            return None
        data: str | bytes
        if len(lines) == 1:
            data = lines[0]
        else:
            raw = [line for line in lines if isinstance(line, bytes)]
            if len(raw) == len(lines):
                data = b"\n".join(raw)
            else:  # a data line feed_line read, among others feed_raw_line did
                data = "\n".join(
                    line if isinstance(line, str) else line.decode("utf-8", "replace") for line in lines
                )
        lines.clear()
        return self.feed(data, event)

    def feed(self, data: str | bytes, event: str | None = None) -> Frame:
        """One event's data: text, or bytes as the stream held them (read as their UTF-8 text would be,
        a byte that is not UTF-8 as U+FFFD)."""
        if isinstance(data, bytes):
            if not data.startswith(b"{"):
                return self.feed(data.decode("utf-8", "replace"), event)
            try:
                # What orjson reads from valid UTF-8 bytes is what it reads from their text, and it
                # refuses bytes that are not UTF-8: those, like anything else it refuses, go the
                # text's way below.
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                return self.feed(data.decode("utf-8", "replace"), event)
        elif not data.startswith("{") and data.strip() == "[DONE]":  # a chunk's JSON opens with "{"
            self.done = True
            return Frame.DONE
        else:
            try:
                chunk = _loads(data)
            except ValueError:
                return Frame.BAD
        if not isinstance(chunk, dict):
            return Frame.BAD
        if event == "error" or "error" in chunk:
            self.error_message = _error_message(chunk)
            return Frame.ERROR
        return self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> Frame:
        model = chunk.get("model")
        if isinstance(model, str):
            self.model = model
        usage = chunk.get("usage")
        if usage is not None:
            self._usage(usage)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return Frame.BAD
        if not choices:
            return Frame.PENDING
        choice = choices[0]  # n=1: only the first choice is ever asked for
        if not isinstance(choice, dict):
            return Frame.BAD
        self.saw_choice = True
        delta = choice.get("delta") or choice.get("message") or {}
        if not isinstance(delta, dict):
            return Frame.BAD
        decisive = False
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.parts.append(text)
            decisive = True
        elif delta.get("tool_calls") or delta.get("refusal"):
            decisive = True
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = str(finish_reason)
            decisive = True
        return Frame.CONTENT if decisive else Frame.PENDING

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            self.input_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0:
            self.output_tokens = completion


def sse_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of an SSE stream read as byte chunks, without their terminators (LF, CRLF or CR),
    as text: bytes that are not UTF-8 become U+FFFD."""
    for lines in sse_raw_lines(chunks):
        for line in lines:
            yield line.decode("utf-8", "replace")


def sse_raw_lines(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The lines each chunk of an SSE stream completes, without their terminators, not decoded (a
    reader loops over a list faster than it resumes a generator per line).

    Lines are split on the bytes, never on decoded text (str.splitlines also breaks at U+2028 and
    the like, which a JSON string may hold unescaped). A CR that ends a chunk may be the first half
    of a CRLF, so the line it ends waits for the next chunk; so does a line with no terminator yet,
    so a multibyte character split across chunks is whole again. A last line with no terminator
    still counts.
    """
    pending: list[bytes] = []  # the start of a line that has not ended yet
    for chunk in chunks:
        if b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                pending.append(chunk)  # a long line in many chunks is joined once, not per chunk
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
            pending = []
        if b"\r" not in chunk:  # LF only, the usual case
            lines = chunk.split(b"\n")
            rest = lines.pop()  # after the last LF: empty when the chunk ends a line
            if rest:
                pending.append(rest)
            yield lines
            continue
        pieces = chunk.splitlines(keepends=True)
        if not pieces[-1].endswith(b"\n"):
            pending.append(pieces.pop())  # unterminated, or a CR whose LF may be in the next chunk
        yield [piece.rstrip(b"\r\n") for piece in pieces]
    if pending:
        yield [b"".join(pending).rstrip(b"\r\n")]


def _loads(data: str) -> Any:
    """A frame's JSON: orjson, a third of the stdlib's time; what orjson refuses (NaN, an
    unpaired surrogate escape, a number past a double) gets the stdlib's lenient reading, as
    before. An integer past 64 bits reads as a float, so it is no token count."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def parse_body(body: bytes) -> Completion:
    """A non-streamed answer (a provider that ignored ``stream: true``). An error object inside the
    200 sets ``error_message``; anything else that is not a completion raises ``BadCompletion``."""
    completion = Completion()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCompletion("the body is not UTF-8") from None
    frame = completion.feed(text)
    if frame is Frame.BAD or frame is Frame.DONE or (not completion.saw_choice and frame is not Frame.ERROR):
        raise BadCompletion("the body is not a chat completion")
    completion.done = True
    return completion


def error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, or the start of whatever the body is."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace").strip()
    return _error_message(parsed) if isinstance(parsed, dict) else str(parsed)[:300]


def _error_message(chunk: dict[str, Any]) -> str:
    error = chunk.get("error", chunk)
    if isinstance(error, dict):
        message = error.get("message") or error.get("code") or error.get("type") or json.dumps(error)
        return str(message)[:300]
    return str(error)[:300]
