"""Watch subscribers for ``fatura bench events``: processes that each hold hundreds of
``JobService.Watch`` streams (grpc.aio) and note when every job event arrives: ``client_process``
here is what ``bench/sse_clients.py``'s ``Clients`` runs for a Watch phase (same arguments and
results as the SSE client's).

Streams share a few channels (HTTP/2 connections; a connection carries at most 100 streams by
default). A stream keeps the seq of each job event and the ``time.monotonic()`` at which the client
read it; the snapshot that opens a stream marks it ready. A stream that ended with a status other
than OK (or is cancelled at the end, as every stream is) reports 200 when it had opened, as an SSE
stream's HTTP status, and the gRPC status code's number plus 1000 when it was refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from dataclasses import dataclass
from multiprocessing.connection import Connection as MpConnection
from multiprocessing.sharedctypes import Synchronized
from typing import Any

WATCH = "/fatura.jobs.v1.JobService/Watch"
STREAMS_PER_CHANNEL = 90


@dataclass(frozen=True)
class WatchTarget:
    address: str
    api_key: str


class _Stream:
    def __init__(self) -> None:
        self.status = 0
        self.seqs: array[int] = array("q")
        self.times: array[float] = array("d")


def client_process(
    target: WatchTarget,
    streams: int,
    ready: Synchronized[int],
    received: Synchronized[int],
    pipe: MpConnection,
) -> None:
    """Open ``streams`` Watch streams, count them ready and their events received, and send back,
    when the parent says so, every stream's (status, seqs, times)."""

    async def main() -> list[tuple[int, bytes, bytes]]:
        import grpc

        from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

        loop = asyncio.get_running_loop()
        channels = [
            grpc.aio.insecure_channel(target.address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(max(1, math.ceil(streams / STREAMS_PER_CHANNEL)))
        ]
        watches = [c.unary_stream(WATCH, response_deserializer=pb.WatchResponse.FromString) for c in channels]
        request = pb.WatchRequest().SerializeToString()
        metadata = (("authorization", f"Bearer {target.api_key}"),)
        opened = [_Stream() for _ in range(streams)]
        calls: list[Any] = []

        async def read(stream: _Stream, call: Any) -> None:
            try:
                async for response in call:
                    now, count = time.monotonic(), 0
                    for event in response.events:
                        kind = event.WhichOneof("event")
                        if kind == "job_event":
                            stream.seqs.append(event.job_event.seq)
                            stream.times.append(now)
                            count += 1
                        elif kind == "snapshot" and not stream.status:
                            stream.status = 200
                            with ready.get_lock():
                                ready.value += 1
                    if count:
                        with received.get_lock():
                            received.value += count
            except grpc.aio.AioRpcError as error:
                if not stream.status:
                    stream.status = 1000 + error.code().value[0]

        tasks = []
        for n, stream in enumerate(opened):
            call = watches[n % len(watches)](request, metadata=metadata)
            calls.append(call)
            tasks.append(asyncio.create_task(read(stream, call)))
        await loop.run_in_executor(None, pipe.recv)  # the parent's "stop"
        for call in calls:
            call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()
        return [(s.status, s.seqs.tobytes(), s.times.tobytes()) for s in opened]

    pipe.send(asyncio.run(main()))
    pipe.close()
