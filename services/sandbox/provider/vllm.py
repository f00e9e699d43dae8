"""A vLLM-like engine for the simulated provider's ``vllm`` mode: a pure scheduler stepped in time.

Like vLLM's scheduler, each step runs at most ``max_num_seqs`` sequences and
``max_num_batched_tokens`` tokens (decodes first, then prefill chunks, then newly admitted
requests); KV blocks are allocated as tokens are computed, so a batch admitted by count grows
until the cache is full, and then the newest running sequence is preempted: its blocks are freed
and it is recomputed from the start of its prompt when there is room again. A step lasts
``step_base_s`` plus ``prefill_s_per_token`` per prefill token plus ``decode_s_per_seq`` per
decoding sequence. No I/O and no clock: the caller passes the time (``services/sandbox/provider/engine.py``
runs it on the event loop; the tests on a fake clock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineConfig:
    kv_blocks: int = 1_000
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8_192
    step_base_s: float = 0.005
    prefill_s_per_token: float = 0.000_02
    decode_s_per_seq: float = 0.000_2

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


@dataclass
class Sequence:
    seq_id: int
    prompt_tokens: int
    output_tokens: int  # what the answer will be; generation stops there
    arrived_at: float
    computed: int = 0  # tokens in the KV cache
    generated: int = 0
    prefilling: bool = True  # (re)building the cache; a preempted sequence starts over
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    preemptions: int = 0

    @property
    def context(self) -> int:
        """A prefill's target: the prompt and, after a preemption, every token generated so far."""
        return self.prompt_tokens + self.generated


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    finished: list[Sequence]
    first_tokens: list[Sequence]
    preempted: list[Sequence]
    emitted: list[Sequence] = field(default_factory=list)  # every sequence that made a token


class Engine:
    """Waiting queue (FIFO, preempted sequences first) and running batch (admission order)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.blocks_used = 0
        self.preemptions_total = 0
        self._next_id = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    @property
    def cache_usage(self) -> float:
        return self.blocks_used / self.config.kv_blocks

    def can_ever_fit(self, prompt_tokens: int, output_tokens: int) -> bool:
        return self.blocks_for(prompt_tokens + output_tokens) <= self.config.kv_blocks

    def add(self, prompt_tokens: int, output_tokens: int, now: float) -> Sequence:
        self._next_id += 1
        seq = Sequence(self._next_id, max(1, prompt_tokens), max(1, output_tokens), now)
        self.waiting.append(seq)
        return seq

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def _held(self, seq: Sequence) -> int:
        return self.blocks_for(seq.computed)

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Extend ``seq``'s cache by ``tokens``; False when the blocks are not free."""
        extra = self.blocks_for(seq.computed + tokens) - self._held(seq)
        if self.blocks_used + extra > self.config.kv_blocks:
            return False
        self.blocks_used += extra
        seq.computed += tokens
        return True

    def _make_room(self, seq: Sequence, tokens: int, preempted: list[Sequence]) -> bool:
        """Grow ``seq``, preempting the newest running sequences until it fits (or is preempted)."""
        while not self._grow(seq, tokens):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Recompute: free every block; the sequence waits at the head of the queue."""
        self.running.remove(seq)
        self.blocks_used -= self._held(seq)
        seq.computed = 0
        seq.prefilling = True
        seq.preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(seq)

    def step(self, now: float) -> StepResult:
        """One engine iteration starting at ``now``; the sequences it finished end at ``now`` +
        the step's duration."""
        budget = self.config.max_num_batched_tokens
        preempted: list[Sequence] = []
        decoding: list[Sequence] = []
        emitting: list[Sequence] = []  # a completed prefill yields a token in the same step
        prefill_tokens = 0
        # Decodes first (one token each, oldest first); a decode that finds no free block preempts
        # the newest running sequence, which may be itself.
        for seq in list(self.running):
            if seq not in self.running or seq.prefilling or budget <= 0:
                continue
            if self._make_room(seq, 1, preempted):
                decoding.append(seq)
                budget -= 1
        # Then the prefill chunks of running sequences (a chunk that finds no free block preempts
        # too, or two half-prefilled prompts could hold the cache forever), then new admissions.
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq in self.running and seq.prefilling:
                chunk = min(budget, seq.context - seq.computed)
                if self._make_room(seq, chunk, preempted):
                    prefill_tokens += chunk
                    budget -= chunk
                    if seq.computed == seq.context:
                        emitting.append(seq)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not preempted:
            seq = self.waiting[0]
            chunk = min(budget, seq.context)
            if not self._grow(seq, chunk):
                break  # vLLM admits a request only when its blocks are free now
            self.waiting.popleft()
            self.running.append(seq)
            prefill_tokens += chunk
            budget -= chunk
            if seq.computed == seq.context:
                emitting.append(seq)
        duration = (
            self.config.step_base_s
            + prefill_tokens * self.config.prefill_s_per_token
            + len(decoding) * self.config.decode_s_per_seq
        )
        end = now + duration
        finished: list[Sequence] = []
        first_tokens: list[Sequence] = []
        emitted: list[Sequence] = []
        for seq in self.running:
            if seq in decoding or seq in emitting:
                emitted.append(seq)
                seq.prefilling = False
                seq.generated += 1
                seq.token_times.append(end)
                if seq.first_token_at is None:
                    seq.first_token_at = end
                    first_tokens.append(seq)
                if seq.generated >= seq.output_tokens:
                    seq.finished_at = end
                    finished.append(seq)
        for seq in finished:
            self.running.remove(seq)
            self.blocks_used -= self._held(seq)
        return StepResult(duration, finished, first_tokens, preempted, emitted)
