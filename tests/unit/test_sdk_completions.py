"""fatura_sdk.Completions: the step after a job's completion runs once per (job_id, state_version),
however many times and however the completion is seen."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from fatura_sdk import AwaitResult, Completions, Event, ServerEvent, completion_key

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"


def _post(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS posted (job_id TEXT)")
    conn.execute("INSERT INTO posted VALUES (?)", (JOB,))


def _posted(completions: Completions) -> int:
    with completions.connection() as conn:
        return int(conn.execute("SELECT count(*) FROM posted").fetchone()[0])


def test_the_same_completion_seen_twice_runs_the_step_once(tmp_path: Path) -> None:
    completions = Completions(tmp_path / "c.sqlite")
    assert completions.run_once(JOB, 3, _post, state="SUCCEEDED", source="poll") is True
    assert completions.run_once(JOB, 3, _post, source="webhook") is False
    assert _posted(completions) == 1 and completions.sightings(JOB, 3) == 2


def test_a_step_that_fails_is_rolled_back_and_runs_on_the_next_sighting(tmp_path: Path) -> None:
    completions = Completions(tmp_path / "c.sqlite")

    def broken(conn: sqlite3.Connection) -> None:
        _post(conn)
        raise RuntimeError("the ERP is down")

    with pytest.raises(RuntimeError):
        completions.run_once(JOB, 3, broken)
    assert completions.sightings(JOB, 3) == 0
    assert completions.run_once(JOB, 3, _post) is True and _posted(completions) == 1


def test_racing_sightings_in_threads_and_in_a_second_handle_on_the_file_run_it_once(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    first, second = Completions(path), Completions(path)
    ran: list[bool] = []
    barrier = threading.Barrier(8)

    def sight(completions: Completions) -> None:
        barrier.wait()
        ran.append(completions.run_once(JOB, 3, _post))

    threads = [threading.Thread(target=sight, args=(c,)) for c in [first, second] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ran) == [False] * 7 + [True] and _posted(first) == 1


def test_the_key_comes_from_a_poll_a_webhook_or_a_server_sent_event() -> None:
    data = {"job_id": JOB, "state": "SUCCEEDED", "state_version": 3}
    poll = AwaitResult("succeeded", JOB, "SUCCEEDED", True, "COMPLETE", state_version=3)
    webhook = Event("wh_1", "extraction.completed.v1", data, {"data": data})
    streamed = ServerEvent("41", "job.state", "{}", json=data)
    assert {completion_key(x) for x in (poll, webhook, streamed, data)} == {(JOB, 3)}
    with pytest.raises(ValueError):
        completion_key({"job_id": JOB})
