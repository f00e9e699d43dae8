"""The synchronous client of Fatura's job API."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from fatura_sdk import _http, _requests
from fatura_sdk._http import Call
from fatura_sdk._polling import AwaitResult, PollPolicy, Waiter
from fatura_sdk._requests import BatchEntry, Document
from fatura_sdk._retry import RetryPolicy
from fatura_sdk._sse import END, Resumption, ServerEvent, SseDecoder
from fatura_sdk.errors import FaturaError, is_transient
from fatura_sdk.models import (
    Accepted,
    Batch,
    BatchItem,
    BatchItemsPage,
    JobPage,
    JobStatus,
    JobSummary,
    StoredDocument,
)

DEFAULT_MAX_WAIT = 600.0


class Client:
    """``Client("https://api.example", "fat_...")``; use it as a context manager or ``close()`` it.

    Transient failures (429 and 503 with their ``Retry-After``, a connection that could not be made)
    are retried by ``retry``; a client mistake raises its typed ``ApiError`` at once.
    ``sleep``, ``clock`` and ``rng`` are the waiting, the monotonic time and the jitter source.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = _http.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        poll_policy: PollPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers=_http.client_headers(api_key, dict(headers or {})),
            timeout=timeout,
            transport=transport,
        )
        self.retry = retry or RetryPolicy()
        self.poll_policy = poll_policy or PollPolicy()
        self._sleep, self._clock = sleep, clock
        self._rng = rng or random.Random()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- documents and jobs ---------------------------------------------------------------------

    def upload(
        self, text: str, *, filename: str | None = None, document_id: str | None = None
    ) -> StoredDocument:
        """Store a document (or, with ``document_id``, its next version) to submit by reference."""
        body: dict[str, Any] = {"text": text}
        if filename is not None:
            body["filename"] = filename
        if document_id is not None:
            body["document_id"] = document_id
        # Not repeatable after it was sent: a second copy would be stored. 429/503 wrote nothing.
        response = self._call(Call("POST", "/v1/documents", json=body, idempotent=False))
        return StoredDocument.from_json(_http.read(response))

    def submit(
        self,
        document: Document,
        *,
        filename: str | None = None,
        idempotency_key: str | None = None,
        schema: str | None = None,
        priority: str | None = None,
        deadline_seconds: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Accepted:
        """Start an extraction job. Returns at once: the job has STARTED and is NOT complete.

        Without ``idempotency_key`` one is made for this call and sent on each of its retries, so a
        retry never makes a second job. Pass your own to make a repeated call (a restarted process,
        an agent's second turn) return the same job.
        """
        key = idempotency_key or _requests.new_idempotency_key()
        body = _requests.job_body(
            document,
            filename=filename,
            schema=schema,
            priority=priority,
            deadline_seconds=deadline_seconds,
            options=options,
        )
        call = Call("POST", "/v1/extraction-jobs", json=body, headers={"Idempotency-Key": key})
        response = self._call(call)
        return Accepted.from_json(
            _http.read(response), idempotency_key=key, replayed=_http.replayed(response)
        )

    def get(self, job_id: str) -> JobStatus:
        return JobStatus.from_json(_http.read(self._call(Call("GET", _http.job_path(job_id)))))

    def list(
        self, *, state: str | None = None, cursor: str | None = None, limit: int | None = None
    ) -> JobPage:
        """One page of this tenant's jobs, newest first; ``next_cursor`` pages on."""
        params = _requests.list_params(state, cursor, limit)
        return JobPage.from_json(_http.read(self._call(Call("GET", "/v1/extraction-jobs", params=params))))

    def iter_jobs(self, *, state: str | None = None, page_size: int | None = None) -> Iterator[JobSummary]:
        cursor: str | None = None
        while True:
            page = self.list(state=state, cursor=cursor, limit=page_size)
            yield from page.jobs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: str) -> JobStatus:
        """Cancel a job that has not finished; a finished job raises ``Conflict``."""
        response = self._call(Call("POST", f"{_http.job_path(job_id)}:cancel"))
        return JobStatus.from_json(_http.read(response))

    # -- waiting ----------------------------------------------------------------------------------

    def start_and_await(
        self,
        document: Document,
        *,
        max_wait: float = DEFAULT_MAX_WAIT,
        filename: str | None = None,
        idempotency_key: str | None = None,
        priority: str | None = "interactive",
        schema: str | None = None,
        deadline_seconds: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AwaitResult:
        """Submit once and wait for the job, outside any model loop; one call, one answer.

        Returns exactly one of ``succeeded`` (done in SUCCEEDED, the result attached),
        ``review_required`` (a human reviewer decides; check later), ``failed`` (done without a
        result, with the error) or ``timed_out`` (still running after ``max_wait`` seconds; the
        job goes on). Always with the job id. A slow job never raises; a request the API refuses
        (a 4xx) does, since no job exists then.
        """
        accepted = self.submit(
            document,
            filename=filename,
            idempotency_key=idempotency_key,
            schema=schema,
            priority=priority,
            deadline_seconds=deadline_seconds,
            options=options,
        )
        return self.await_job(accepted.job_id, max_wait=max_wait, accepted=accepted)

    def await_job(
        self, job_id: str, *, max_wait: float = DEFAULT_MAX_WAIT, accepted: Accepted | None = None
    ) -> AwaitResult:
        """Wait for a job submitted earlier, with the same outcomes as ``start_and_await``."""
        waiter = Waiter(job_id, max_wait=max_wait, policy=self.poll_policy, clock=self._clock, rng=self._rng)
        step = waiter.start(accepted)
        while not isinstance(step, AwaitResult):
            if step > 0:
                self._sleep(step)
            try:
                status = self._get_once(job_id)
            except FaturaError as exc:
                if not is_transient(exc):
                    raise
                step = waiter.observe_failure(exc)
            else:
                step = waiter.observe(status)
        return step

    def _get_once(self, job_id: str) -> JobStatus:
        # The waiter paces the polls; a failed poll is its business, not the retry policy's.
        response = self._send(Call("GET", _http.job_path(job_id)))
        return JobStatus.from_json(_http.read(response))

    # -- batches ----------------------------------------------------------------------------------

    def submit_batch(
        self,
        items: Sequence[BatchEntry],
        *,
        idempotency_key: str | None = None,
        schema: str | None = None,
        priority: str | None = None,
        deadline_seconds: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Batch:
        """Start a batch of extraction jobs under one key (each item's key is derived from it)."""
        key = idempotency_key or _requests.new_idempotency_key("sdk-batch")
        body = _requests.batch_body(
            items, schema=schema, priority=priority, deadline_seconds=deadline_seconds, options=options
        )
        call = Call("POST", "/v1/extraction-batches", json=body, headers={"Idempotency-Key": key})
        response = self._call(call)
        return Batch.from_json(_http.read(response), idempotency_key=key, replayed=_http.replayed(response))

    def get_batch(self, batch_id: str) -> Batch:
        return Batch.from_json(_http.read(self._call(Call("GET", _http.batch_path(batch_id)))))

    def batch_items(
        self, batch_id: str, *, state: str | None = None, cursor: str | None = None, limit: int | None = None
    ) -> BatchItemsPage:
        """One page of a batch's items (``state="errors"``: those that ended without a result)."""
        params = _requests.list_params(state, cursor, limit)
        call = Call("GET", f"{_http.batch_path(batch_id)}/items", params=params)
        return BatchItemsPage.from_json(_http.read(self._call(call)))

    def iter_batch_items(self, batch_id: str, *, state: str | None = None) -> Iterator[BatchItem]:
        cursor: str | None = None
        while True:
            page = self.batch_items(batch_id, state=state, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    # -- events -----------------------------------------------------------------------------------

    def events(
        self,
        *,
        job_id: str | None = None,
        last_event_id: str | None = None,
        until_done: bool = False,
        max_reconnects: int | None = None,
        read_timeout: float = 60.0,
    ) -> Iterator[ServerEvent]:
        """The tenant's job events (or one job's) as they happen, resuming by itself.

        After a dropped connection, a silent one (nothing, not even a heartbeat, for
        ``read_timeout`` seconds) or a transient error answer, it reconnects with ``Last-Event-ID``
        and the server replays what was missed. ``until_done`` ends the iteration after an event
        whose data says ``done: true`` (or a snapshot whose jobs all are). The first event is a
        ``snapshot`` of the state when there is no cursor. A 4xx (a revoked key, an unknown job)
        raises.
        """
        resume = Resumption(last_event_id=last_event_id, max_reconnects=max_reconnects, rng=self._rng)
        path = _http.events_path(job_id)
        timeout = httpx.Timeout(self._http.timeout.connect, read=read_timeout, write=10.0, pool=10.0)
        while True:
            decoder = SseDecoder()
            try:
                with self._http.stream("GET", path, headers=resume.headers(), timeout=timeout) as response:
                    if not response.is_success:
                        response.read()
                        _http.read(response)
                    for line in response.iter_lines():
                        event = decoder.feed(line)
                        if event is None or event.event == END:
                            continue  # after an end the server closes, and the loop reconnects
                        resume.delivered(event)
                        yield event
                        if until_done and event.done:
                            return
                error: FaturaError | None = None
            except httpx.TransportError as exc:
                error = _http.translate(exc)
            except FaturaError as exc:
                if not is_transient(exc):
                    raise
                error = exc
            resume.connected(decoder)
            delay = resume.next_delay()
            if delay is None:
                raise error or FaturaError("the event stream ended and max_reconnects is spent")
            retry_after = getattr(error, "retry_after", None)
            self._sleep(max(delay, float(retry_after)) if isinstance(retry_after, int | float) else delay)

    # -- transport --------------------------------------------------------------------------------

    def _call(self, call: Call) -> httpx.Response:
        """Send with retries: the answer (any status), or the last error when retrying is over."""
        attempt = 1
        while True:
            response: httpx.Response | None = None
            try:
                response = self._send(call)
            except FaturaError as exc:
                error = exc
            else:
                if response.is_success or not is_transient(error := _http.error_of(response)):
                    return response
            delay = self.retry.delay(attempt, error, idempotent=call.idempotent, rng=self._rng)
            if delay is None:
                if response is not None:
                    return response
                raise error
            self._sleep(delay)
            attempt += 1

    def _send(self, call: Call) -> httpx.Response:
        try:
            return self._http.request(
                call.method, call.path, json=call.json, params=call.params or None, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise _http.translate(exc) from exc
