"""The JobService's ``Watch``: a stream of the process's event feed (``services/acceptance/feed.py``),
the same feed, subscriptions and revocation watch (``KeyWatch``) as the edge's server-sent events.

A response carries the events the feed handed the stream together (one write per batch, as SSE
writes one chunk), and each job event is encoded once for every stream of the process (as the feed
encodes its JSON once for SSE): a response is the concatenation of its events' encoded entries. A
stream the server ends sends its ``end`` event and then closes with the status of a typed error: a
revoked key ``UNAUTHENTICATED``, a shutdown ``UNAVAILABLE``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from services.acceptance.feed import End, EventFeed, FeedItem, JobEvent, Snapshot
from services.acceptance.views import status_url
from services.common import states
from services.common.api.auth import Principal
from services.common.api.errors import ApiError, NotFound, Unauthorized, Unavailable
from services.common.api.keywatch import KeyWatch
from services.common.ids import parse_uuid
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

# A response without events.
HEARTBEAT = pb.WatchResponse().SerializeToString()
# WatchResponse.events is field 1, length-delimited: an entry is this tag, the length, the event.
_EVENTS_TAG = b"\x0a"
REVOKED = "The API key of this stream has been revoked; the stream is closed. Use a valid key."
# Encoded job events kept for the other streams of the process (by seq).
_ENCODED = 10_000


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def _state(name: str) -> pb.JobState.ValueType:
    return pb.JobState.Value(f"JOB_STATE_{name}")


def job_event(event: JobEvent) -> pb.WatchEvent:
    return pb.WatchEvent(
        job_event=pb.JobEvent(
            seq=event.seq,
            job_id=str(event.job_id),
            state=_state(event.state),
            state_version=event.state_version,
            kind=event.kind,
            at=_timestamp(event.at),
            done=states.is_done(event.state),
            status_url=status_url(event.job_id),
        )
    )


def snapshot(item: Snapshot) -> pb.WatchEvent:
    body = item.body()
    return pb.WatchEvent(
        snapshot=pb.Snapshot(
            seq=item.seq,
            reason=item.reason,
            jobs=[
                pb.SnapshotJob(
                    job_id=str(job.job_id),
                    state=_state(job.state),
                    state_version=job.state_version,
                    done=states.is_done(job.state),
                    status_url=status_url(job.job_id),
                )
                for job in item.jobs
            ],
            truncated=item.truncated,
            message=body["message"],
        )
    )


def entry(event: pb.WatchEvent) -> bytes:
    """``event`` encoded as one entry of ``WatchResponse.events``: responses are their entries joined."""
    data = event.SerializeToString()
    return _EVENTS_TAG + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def ended(end: End) -> ApiError:
    """The status a stream closes with after its ``end`` event."""
    if end.reason == "key_revoked":
        return Unauthorized(end.message, code="key_revoked")
    return Unavailable(
        end.message, code="stream_ended", headers={"Retry-After": "1"}, details={"reason": end.reason}
    )


class Watcher:
    """Opens ``Watch`` streams on the process's feed and key watch."""

    def __init__(self, feed: EventFeed, keys: KeyWatch, heartbeat_seconds: float) -> None:
        self._feed = feed
        self._keys = keys
        self._heartbeat = heartbeat_seconds
        self._encoded: OrderedDict[int, bytes] = OrderedDict()

    def encode(self, item: FeedItem) -> bytes:
        """The item as an entry of ``WatchResponse.events``; a job event's is made once."""
        if isinstance(item, JobEvent):
            cached = self._encoded.get(item.seq)
            if cached is None:
                cached = self._encoded[item.seq] = entry(job_event(item))
                if len(self._encoded) > _ENCODED:
                    self._encoded.popitem(last=False)
            return cached
        if isinstance(item, Snapshot):
            return entry(snapshot(item))
        return entry(pb.WatchEvent(end=pb.StreamEnd(reason=item.reason, message=item.message)))

    async def stream(self, key: Principal, request: pb.WatchRequest) -> AsyncIterator[bytes]:
        """The encoded responses of one stream. Raises a typed error before the first one when the
        request is refused (another tenant's job, a bad cursor, the feed not ready), and after the
        ``end`` event when the server ends the stream."""
        assert key.tenant is not None
        job_id = None
        if request.job_id:
            job_id = parse_uuid(request.job_id)
            if job_id is None:
                raise NotFound("no such extraction job for this tenant", code="job_not_found")
        after = request.after_seq if request.HasField("after_seq") else None
        if after is not None and after < 0:
            raise ApiError(
                "after_seq must be the seq of an event this server sent (a non-negative integer)",
                code="invalid_last_event_id",
                details={"parameter": "after_seq"},
            )
        subscription = await self._feed.subscribe(key.tenant.id, job_id=job_id, last_seq=after)
        unwatch = self._keys.watch(key.prefix, lambda: subscription.end("key_revoked", REVOKED))
        try:
            async for batch in subscription.batches(self._heartbeat):
                yield b"".join(self.encode(item) for item in batch) if batch else HEARTBEAT
                if not batch:
                    continue
                last = batch[-1]
                if isinstance(last, End):
                    raise ended(last)
        finally:
            unwatch()
            subscription.close()
