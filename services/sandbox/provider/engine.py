"""Runs the simulated vLLM engine (``vllm.py``) on the event loop and serves vLLM's metric names.

One task steps the engine while it has work, sleeping each step's duration; a request waits for
its sequence to finish, or a streamed one follows its tokens as each step makes them. The metrics
keep vLLM's names and ``model_name`` label, so a dashboard or bench reads this simulator and a
real vLLM server alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.sandbox.provider.vllm import Engine, EngineConfig, Sequence

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class EngineRunner:
    def __init__(self, config: EngineConfig, model_name: str, registry: CollectorRegistry) -> None:
        self.engine = Engine(config)
        self._model = model_name
        self._done: dict[int, asyncio.Future[Sequence]] = {}
        self._progress: dict[int, asyncio.Queue[int]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        labels = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Sequences in the running batch", labels, registry=registry
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests queued in the server", labels, registry=registry
        )
        self.cache = Gauge(
            "vllm:gpu_cache_usage_perc", "KV cache usage (1 means 100 percent)", labels, registry=registry
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Sequences preempted (recomputed) since start", labels, registry=registry
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed", labels, registry=registry
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed", labels, registry=registry
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency",
            labels,
            buckets=_ITL_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency", labels, registry=registry
        )
        self._publish()

    def can_ever_fit(self, prompt_tokens: int, output_tokens: int) -> bool:
        return self.engine.can_ever_fit(prompt_tokens, output_tokens)

    async def generate(self, prompt_tokens: int, output_tokens: int) -> Sequence:
        _, future = self._add(prompt_tokens, output_tokens)
        return await future

    async def tokens(self, prompt_tokens: int, output_tokens: int) -> AsyncIterator[int]:
        """The count of tokens generated so far, each time a step makes one (the first when its
        prefill completes), until the sequence finishes."""
        seq, future = self._add(prompt_tokens, output_tokens)
        queue: asyncio.Queue[int] = asyncio.Queue()
        self._progress[seq.seq_id] = queue
        try:
            generated = 0
            while generated < seq.output_tokens:
                generated = await queue.get()
                yield generated
            await future
        finally:
            self._progress.pop(seq.seq_id, None)

    def _add(self, prompt_tokens: int, output_tokens: int) -> tuple[Sequence, asyncio.Future[Sequence]]:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        seq = self.engine.add(prompt_tokens, output_tokens, loop.time())
        future: asyncio.Future[Sequence] = loop.create_future()
        self._done[seq.seq_id] = future
        self._wake.set()
        self._publish()
        return seq, future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _publish(self) -> None:
        m = self._model
        self.running.labels(m).set(len(self.engine.running))
        self.waiting.labels(m).set(len(self.engine.waiting))
        self.cache.labels(m).set(self.engine.cache_usage)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        m = self._model
        while True:
            if self.engine.idle():
                self._wake.clear()
                await self._wake.wait()
            result = self.engine.step(loop.time())
            self.preemptions.labels(m).inc(len(result.preempted))
            self._publish()
            await asyncio.sleep(result.duration_s)
            for seq in result.emitted:
                queue = self._progress.get(seq.seq_id)
                if queue is not None:
                    queue.put_nowait(seq.generated)
            for seq in result.first_tokens:
                if seq.first_token_at is not None:
                    self.ttft.labels(m).observe(seq.first_token_at - seq.arrived_at)
            for seq in result.finished:
                times = seq.token_times
                for earlier, later in itertools.pairwise(times):
                    self.itl.labels(m).observe(later - earlier)
                self.prompt_tokens.labels(m).inc(seq.prompt_tokens)
                self.generation_tokens.labels(m).inc(seq.generated)
                if seq.finished_at is not None:
                    self.e2e.labels(m).observe(seq.finished_at - seq.arrived_at)
                future = self._done.pop(seq.seq_id, None)
                if future is not None and not future.done():
                    future.set_result(seq)
            self._publish()
