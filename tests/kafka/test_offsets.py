"""The contiguous offset tracker, as plain functions: the committed offset never passes a record
that is not finished, whatever order parallel records finish in."""

from __future__ import annotations

from services.acceptance.kafka.offsets import OffsetTracker, PartitionOffsets


def test_nothing_is_committable_before_a_record_arrives() -> None:
    assert PartitionOffsets().committable() is None


def test_a_finished_record_commits_one_past_itself() -> None:
    offsets = PartitionOffsets()
    assert offsets.take(41)
    offsets.finish(41)
    assert offsets.committable() == 42


def test_records_finishing_out_of_order_never_commit_past_a_gap() -> None:
    """Given 40..44 running in parallel
    When 41, 43 and 44 finish first
    Then the commit stays at 40 until 40 finishes, then at 42 until 42 does."""
    offsets = PartitionOffsets()
    for offset in range(40, 45):
        assert offsets.take(offset)
    for offset in (41, 43, 44):
        offsets.finish(offset)
    assert offsets.committable() == 40
    offsets.finish(40)
    assert offsets.committable() == 42
    offsets.finish(42)
    assert offsets.committable() == 45


def test_offsets_kafka_never_hands_out_are_no_gap() -> None:
    offsets = PartitionOffsets()
    for offset in (10, 13, 20):  # 11, 12, 14..19 were compacted away
        offsets.take(offset)
        offsets.finish(offset)
    assert offsets.committable() == 21


def test_a_held_record_stops_the_commit_and_is_taken_again_only_once() -> None:
    """Given 5 refused by admission (held) while 6 finished
    Then the commit stays at 5; redelivered after the seek back, 5 is taken again and 6 is not."""
    offsets = PartitionOffsets()
    offsets.take(5)
    offsets.take(6)
    offsets.hold(5)
    offsets.finish(6)
    assert offsets.committable() == 5
    assert offsets.lowest_held == 5
    assert offsets.take(5)
    assert not offsets.take(6)
    assert not offsets.take(5)  # already running again
    offsets.finish(5)
    assert offsets.committable() == 7


def test_a_redelivered_finished_record_is_not_taken() -> None:
    offsets = PartitionOffsets()
    offsets.take(0)
    offsets.finish(0)
    assert not offsets.take(0)


def test_to_commit_names_only_offsets_that_moved() -> None:
    tracker = OffsetTracker()
    tracker.of("t", 0).take(0)
    tracker.of("t", 1).take(0)
    tracker.of("t", 0).finish(0)
    assert tracker.to_commit() == {("t", 0): 1, ("t", 1): 0}
    tracker.of("t", 0).committed = 1
    tracker.of("t", 1).committed = 0
    assert tracker.to_commit() == {}
    assert tracker.running == 1
    tracker.drop("t", 1)
    assert tracker.running == 0
