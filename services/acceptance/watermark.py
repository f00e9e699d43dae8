"""How far the job event log can be read without ever skipping an event that commits late.

``job_events.seq`` is a bigserial: a transaction takes its number when it inserts, not when it
commits, so seq 41 may become visible after seq 42. A reader that moved its cursor to 42 would
never see 41. The watermark therefore delivers only a gap-free prefix: rows above a missing seq
wait until the gap is either filled (its transaction committed) or known to be dead (its
transaction rolled back, or the number was never used).

A gap is dead once every transaction that could own it has ended. Its owner took the number
before a row above it committed, so before the snapshot in which the gap was first seen; it then
held a transaction id below that snapshot's ``xmax``, except for the instant between taking the
number and inserting the row, when the id is not yet assigned. The fence is therefore the ``xmax``
of a snapshot taken ``grace`` seconds after the gap was first seen, and the gap is dead in a
snapshot whose ``xmin`` (the oldest transaction still running) has reached the fence. A gap older
than ``give_up`` is skipped regardless (no service session keeps a transaction that long; an
administrator's open session might), and counted.

Pure: the caller reads the rows and the snapshot's bounds in one statement and hands them in.
"""

from __future__ import annotations

from dataclasses import dataclass

GRACE_SECONDS = 0.2
GIVE_UP_SECONDS = 120.0


@dataclass
class _Gap:
    start: int
    end: int
    first_seen: float
    fence: int | None = None


@dataclass(frozen=True)
class Advance:
    """What one read allowed: how many of the rows handed in may be delivered (a prefix), and how
    many missing numbers were given up on after ``give_up`` seconds."""

    deliver: int
    skipped: int


class Watermark:
    """Every seq up to ``through`` has been delivered or is known never to exist."""

    def __init__(
        self, through: int, *, grace: float = GRACE_SECONDS, give_up: float = GIVE_UP_SECONDS
    ) -> None:
        self.through = through
        self._grace = grace
        self._give_up = give_up
        self._gaps: list[_Gap] = []

    @property
    def waiting(self) -> bool:
        """A gap is holding rows back."""
        return bool(self._gaps)

    def advance(self, seqs: list[int], *, xmin: int, xmax: int, now: float) -> Advance:
        """``seqs``: the visible seqs above ``through``, ascending, read in the snapshot whose
        bounds are ``xmin`` and ``xmax``. Moves ``through`` over the deliverable prefix."""
        gaps = self._track(seqs, now)
        deliver = skipped = 0
        expected = self.through + 1
        for seq in seqs:
            if seq > expected:
                gap = gaps[0]
                if gap.fence is None and now - gap.first_seen >= self._grace:
                    gap.fence = xmax
                if gap.fence is None or xmin < gap.fence:  # its owner may still commit
                    if now - gap.first_seen < self._give_up:
                        break
                    skipped += seq - expected
                gaps.pop(0)
            deliver += 1
            expected = seq + 1
        self.through = expected - 1
        # Fences are set on every gap that is old enough, not only the first: gaps behind one another
        # then resolve together instead of one grace period each.
        for gap in gaps:
            if gap.fence is None and now - gap.first_seen >= self._grace:
                gap.fence = xmax
        self._gaps = gaps
        return Advance(deliver, skipped)

    def _track(self, seqs: list[int], now: float) -> list[_Gap]:
        """The missing runs below the last visible seq, each keeping when it was first seen. A run
        still missing lies inside a run that was missing before (rows appear, never vanish), so it
        inherits that run's age; a run above everything seen before is new."""
        runs: list[_Gap] = []
        expected = self.through + 1
        for seq in seqs:
            if seq > expected:
                runs.append(self._known(expected, seq - 1, now))
            expected = seq + 1
        return runs

    def _known(self, start: int, end: int, now: float) -> _Gap:
        for old in self._gaps:
            if old.start <= start <= old.end:
                return _Gap(start, end, old.first_seen, old.fence)
        return _Gap(start, end, now)
