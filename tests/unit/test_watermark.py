"""The event feed's watermark: rows above a missing seq wait until its transaction has ended."""

from __future__ import annotations

from services.acceptance.watermark import Watermark


def test_a_gap_free_run_is_delivered_at_once() -> None:
    mark = Watermark(10, grace=0.2)
    advance = mark.advance([11, 12, 13], xmin=100, xmax=105, now=0.0)
    assert (advance.deliver, mark.through) == (3, 13)
    assert not mark.waiting


def test_rows_above_a_missing_seq_wait_while_its_owner_may_still_commit() -> None:
    # Given seq 12 missing while 13 is visible, with transactions 100..104 running
    mark = Watermark(10, grace=0.2)
    assert mark.advance([11, 13], xmin=100, xmax=105, now=0.0).deliver == 1
    assert mark.through == 11 and mark.waiting
    # When the grace has passed but a transaction older than the fence still runs
    assert mark.advance([13], xmin=104, xmax=107, now=0.3).deliver == 0
    # Then 13 is held until 12 shows up, and both go out in order
    assert mark.advance([12, 13], xmin=106, xmax=108, now=0.4).deliver == 2
    assert mark.through == 13 and not mark.waiting


def test_a_gap_is_dead_once_every_transaction_that_could_own_it_has_ended() -> None:
    mark = Watermark(10, grace=0.2)
    assert mark.advance([12], xmin=100, xmax=105, now=0.0).deliver == 0
    # Within the grace the fence is not set yet, even with nothing running
    assert mark.advance([12], xmin=105, xmax=105, now=0.1).deliver == 0
    # After it, the fence is this snapshot's xmax; transaction 105 still runs
    assert mark.advance([12], xmin=105, xmax=106, now=0.25).deliver == 0
    # Once the oldest running transaction is past the fence, 11 never existed (rolled back)
    advance = mark.advance([12], xmin=106, xmax=107, now=0.3)
    assert (advance.deliver, advance.skipped, mark.through) == (1, 0, 12)


def test_gaps_behind_one_another_resolve_together() -> None:
    mark = Watermark(0, grace=0.2)
    assert mark.advance([2, 4, 6], xmin=10, xmax=10, now=0.0).deliver == 0
    assert mark.advance([2, 4, 6], xmin=10, xmax=10, now=0.2).deliver == 3
    assert mark.through == 6


def test_a_run_that_narrows_keeps_its_age() -> None:
    mark = Watermark(0, grace=0.2)
    mark.advance([5], xmin=10, xmax=12, now=0.0)  # 1..4 missing
    mark.advance([2, 5], xmin=10, xmax=12, now=0.1)  # 1 and 3..4 missing, still from t=0
    advance = mark.advance([2, 5], xmin=13, xmax=13, now=0.2)
    # 1 and 3..4 are as old as before: past the grace now, with nothing running they are dead
    assert advance.deliver == 2 and mark.through == 5


def test_a_gap_held_past_give_up_is_skipped_and_counted() -> None:
    mark = Watermark(0, grace=0.2, give_up=10.0)
    mark.advance([3], xmin=10, xmax=11, now=0.0)
    assert mark.advance([3], xmin=10, xmax=11, now=5.0).deliver == 0
    advance = mark.advance([3], xmin=10, xmax=11, now=10.0)
    assert (advance.deliver, advance.skipped, mark.through) == (1, 2, 3)


def test_nothing_visible_above_the_watermark_moves_nothing() -> None:
    mark = Watermark(7)
    assert mark.advance([], xmin=1, xmax=1, now=0.0).deliver == 0
    assert mark.through == 7
