"""gRPC load for the benchmarks: generator processes that call ``JobService.Submit`` on the open-loop
schedule of ``bench/load.py`` (same steps, same outcome, same latency from the scheduled send time).

Requests are encoded once per document and the idempotency key appended per call (protobuf merges
concatenated messages, the last value of a field wins), and answers are read as bytes: the client
does what the HTTP generator does with its pre-encoded JSON, so neither door's client pays for
building messages the other does not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection as MpConnection
from typing import Any

from bench.load import Outcome, Step, open_loop

SUBMIT = "/fatura.jobs.v1.JobService/Submit"


@dataclass(frozen=True)
class GrpcTarget:
    """What the generators send: the server's address, the call metadata (the API key) and each
    document's encoded ``SubmitRequest`` without its key, taken in turn."""

    address: str
    metadata: tuple[tuple[str, str], ...]
    requests: list[bytes]


def encoded_requests(documents: list[tuple[str, str]], priority: str) -> list[bytes]:
    """``SubmitRequest`` bytes for each (text, filename), without an idempotency key."""
    from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

    level = pb.Priority.Value(f"PRIORITY_{priority.upper()}")
    return [
        pb.SubmitRequest(
            document=pb.InlineDocument(text=text, filename=name), priority=level
        ).SerializeToString()
        for text, name in documents
    ]


def key_bytes(key: str) -> bytes:
    from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

    return pb.SubmitRequest(idempotency_key=key).SerializeToString()


def generator_main(pipe: MpConnection, target: GrpcTarget, channels: int, timeout: float, slot: Any) -> None:
    asyncio.run(_generator_loop(pipe, target, channels, timeout, slot))


async def _generator_loop(
    pipe: MpConnection, target: GrpcTarget, channels: int, timeout: float, slot: Any
) -> None:
    import grpc

    loop = asyncio.get_running_loop()
    # One HTTP/2 connection per channel (a local subchannel pool keeps them apart), open for the
    # whole run as a long-lived internal client's would be.
    opened = [
        grpc.aio.insecure_channel(target.address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, channels))
    ]
    calls = [channel.unary_unary(SUBMIT) for channel in opened]
    try:
        while (step := await loop.run_in_executor(None, pipe.recv)) is not None:
            pipe.send(await _send_share(calls, target, step, timeout, slot))
    finally:
        for channel in opened:
            await channel.close()


async def _send_share(calls: list[Any], target: GrpcTarget, step: Step, timeout: float, slot: Any) -> Outcome:
    import grpc

    outcome = Outcome()

    async def one(i: int, scheduled: float) -> None:
        slot[0] += 1
        request = target.requests[i % len(target.requests)] + key_bytes(f"{step.tag}-{i}")
        outcome.lags.append(time.monotonic() - scheduled)
        ok = False
        try:
            await calls[i % len(calls)](request, metadata=target.metadata, timeout=timeout)
            ok = True
        except grpc.aio.AioRpcError as exc:
            outcome.errors[exc.code().name] += 1
        done = time.monotonic()
        if ok:
            outcome.latencies.append(done - scheduled)
        outcome.last_done = max(outcome.last_done, done)
        slot[1] += 1

    await open_loop(
        step.rate, step.duration, one, start_at=step.start_at, share=step.share, shares=step.shares
    )
    return outcome
