"""Contiguous offset commits for records processed in parallel. Pure: no Kafka, no I/O.

A partition's records arrive in offset order but finish in any order. The offset a consumer may
commit is one past the highest offset below which every record it was handed is finished: with 40
and 42 finished and 41 still running, that is 41, never 43, so a crash redelivers 41 (and 42, which
the inbox then makes a no-op) instead of losing it. Offsets Kafka never hands out (compacted away,
transaction markers) are no gap: only records that were handed in count.

A record can be handed in again after the consumer seeks back to it (its partition was paused by
admission, or a transient failure asked for a retry): ``held`` marks a record that must be taken
again, and only then does ``take`` return True for its offset a second time.
"""

from __future__ import annotations


class PartitionOffsets:
    """The records of one partition that were handed in and are not finished yet."""

    def __init__(self) -> None:
        self._running: set[int] = set()
        self._held: set[int] = set()
        self._highest: int | None = None
        self.committed: int | None = None

    def take(self, offset: int) -> bool:
        """A record was handed in: True when it should be processed, False when it already is, or
        already was (a redelivery of a finished record)."""
        if self._highest is None or offset > self._highest:
            self._highest = offset
            self._running.add(offset)
            return True
        if offset in self._held:
            self._held.discard(offset)
            self._running.add(offset)
            return True
        return False

    def finish(self, offset: int) -> None:
        """The record is durably done (accepted, a replay, or dead-lettered)."""
        self._running.discard(offset)
        self._held.discard(offset)

    def hold(self, offset: int) -> None:
        """The record is not done and will be handed in again (after a seek back to it)."""
        if offset in self._running:
            self._running.discard(offset)
            self._held.add(offset)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def lowest_held(self) -> int | None:
        return min(self._held) if self._held else None

    def committable(self) -> int | None:
        """The offset to commit (the next record to read after a restart), or None before any."""
        pending = self._running | self._held
        if pending:
            return min(pending)
        return None if self._highest is None else self._highest + 1

    def to_commit(self) -> int | None:
        """``committable`` when it moved past what was last committed, else None."""
        offset = self.committable()
        if offset is None or (self.committed is not None and offset <= self.committed):
            return None
        return offset


class OffsetTracker:
    """``PartitionOffsets`` of every partition this consumer owns, by (topic, partition)."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], PartitionOffsets] = {}

    def of(self, topic: str, partition: int) -> PartitionOffsets:
        key = (topic, partition)
        offsets = self.partitions.get(key)
        if offsets is None:
            offsets = self.partitions[key] = PartitionOffsets()
        return offsets

    def drop(self, topic: str, partition: int) -> None:
        """The partition was revoked: another consumer reads it from its committed offset."""
        self.partitions.pop((topic, partition), None)

    def to_commit(self) -> dict[tuple[str, int], int]:
        found = {}
        for key, offsets in self.partitions.items():
            offset = offsets.to_commit()
            if offset is not None:
                found[key] = offset
        return found

    @property
    def running(self) -> int:
        return sum(p.running for p in self.partitions.values())
