"""A scripted Fatura for the SDK's unit tests: httpx.MockTransport answers, a fake clock whose sleeps
advance it, and status bodies shaped like the server's."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from fatura_sdk import Client

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
KEY = "fat_test"


@dataclass
class FakeTime:
    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def accepted(
    job_id: str = JOB, *, poll_after: int = 5, state: str = "READY", done: bool = False
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "state": state,
        "done": done,
        "state_version": 1,
        "status_url": f"/v1/extraction-jobs/{job_id}",
        "poll_after_seconds": poll_after,
        "estimated_duration_seconds": 20,
        "message": f"Extraction job {job_id} has STARTED and is NOT complete.",
    }


def status(state: str, *, version: int = 2, poll_after: int | None = 2, **extra: Any) -> dict[str, Any]:
    done = state in ("SUCCEEDED", "FAILED_TERMINAL", "CANCELLED", "REJECTED")
    body: dict[str, Any] = {
        "job_id": JOB,
        "state": state,
        "done": done,
        "state_version": version,
        "attempts": 1,
        "created_at": "2026-01-01T00:00:00+00:00",
        "elapsed_seconds": 1.0,
        "status_url": f"/v1/extraction-jobs/{JOB}",
        "message": f"state {state}",
        **extra,
    }
    if poll_after is not None and not done:
        body["poll_after_seconds"] = poll_after
    return body


def respond(status_code: int, body: Any = None, **headers: str) -> httpx.Response:
    content = b"" if body is None else json.dumps(body).encode()
    merged = {"content-type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.Response(status_code, content=content, headers=merged)


@dataclass
class Seen:
    method: str
    path: str
    at: float
    headers: dict[str, str]
    body: Any


class Script:
    """Answers requests from per-route queues (``"POST /v1/extraction-jobs"``); records each one."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.routes: dict[str, list[httpx.Response | Exception | Callable[[], httpx.Response]]] = {}
        self.seen: list[Seen] = []

    def on(self, route: str, *answers: httpx.Response | Exception | Callable[[], httpx.Response]) -> None:
        self.routes.setdefault(route, []).extend(answers)

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append(Seen(request.method, request.url.path, self.time.now, dict(request.headers), body))
        route = f"{request.method} {request.url.path}"
        queue = self.routes.get(route)
        assert queue, f"unexpected request {route}"
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer() if callable(answer) else answer

    def polls(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.startswith("/v1/extraction-jobs/")]


def make_client(script: Script, **kwargs: Any) -> Client:
    return Client(
        "http://fatura.test",
        KEY,
        transport=httpx.MockTransport(script.handler),
        sleep=script.time.sleep,
        clock=script.time.clock,
        rng=kwargs.pop("rng", random.Random(7)),
        **kwargs,
    )


def client_for(time: FakeTime) -> Iterator[tuple[Client, Script]]:
    script = Script(time)
    with make_client(script) as client:
        yield client, script
