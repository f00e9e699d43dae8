"""Group commit (services/common/groupcommit.py): consumer threads' writes that queue while a
transaction commits share the next one; each caller returns only once its write is durable; one
bad write fails alone; a dependency blip fails the whole group, to be redelivered. Against the real
PostgreSQL, and through a real inference worker taking in a backlog of events."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from fix_pipeline import TERMINAL, Pipeline, StartPipeline, wait_until
from services.common.db import SyncPool
from services.common.failures import is_transient
from services.common.groupcommit import GroupCommit
from services.sandbox.samples import load_samples


@pytest.fixture
def table(pool: SyncPool) -> Iterator[str]:
    name = f"group_commit_{uuid.uuid4().hex[:12]}"
    with pool.connection() as conn:
        conn.execute(f"CREATE TABLE {name} (item int PRIMARY KEY, txid bigint NOT NULL)")
    yield name
    with pool.connection() as conn:
        conn.execute(f"DROP TABLE {name}")


def _rows(pool: SyncPool, table: str) -> dict[int, int]:
    with pool.connection() as conn:
        return {r["item"]: r["txid"] for r in conn.execute(f"SELECT item, txid FROM {table}").fetchall()}


def test_writes_queued_during_a_commit_share_the_next_transaction_and_return_once_durable(
    pool: SyncPool, table: str
) -> None:
    # Given a group commit whose first write holds its transaction open until released
    first_in, release = threading.Event(), threading.Event()
    seen_on_return: dict[int, bool] = {}

    def write(conn: psycopg.Connection[Any], item: int) -> int:
        row = conn.execute(
            f"INSERT INTO {table} (item, txid) VALUES (%s, txid_current()) RETURNING txid", (item,)
        ).fetchone()
        assert row is not None
        if item == 0:
            first_in.set()
            assert release.wait(10)
        return int(row["txid"])

    group: GroupCommit[int, int] = GroupCommit(pool, write, name="test")

    def submit(item: int) -> int:
        txid = group.run(item)
        seen_on_return[item] = item in _rows(pool, table)
        return txid

    try:
        with ThreadPoolExecutor(6) as threads:
            first = threads.submit(submit, 0)
            assert first_in.wait(10)
            # When five more threads write while that transaction is open
            rest = [threads.submit(submit, i) for i in range(1, 6)]
            _wait_queued(group, 5)
            release.set()
            txids = [first.result(10)] + [f.result(10) for f in rest]
    finally:
        group.close()
    # Then the five share one transaction after the first's, and each caller returned only once
    # its row could be read by another session
    assert len({txids[0]}) == 1 and len(set(txids[1:])) == 1 and txids[1] != txids[0]
    assert _rows(pool, table) == dict(enumerate(txids))
    assert seen_on_return == dict.fromkeys(range(6), True)


def _wait_queued(group: GroupCommit[Any, Any], count: int) -> None:
    # The committer is busy with the first write meanwhile: the others wait in its queue.
    wait_until(lambda: len(group._queue) >= count, 10, f"{count} writes queued behind the open one")


def test_a_bad_write_fails_alone_and_the_others_of_its_group_are_written(pool: SyncPool, table: str) -> None:
    # Given a group commit whose first write holds the committer while the others queue, one of
    # them a write PostgreSQL refuses (a division by zero: not a dependency blip)
    first_in, release = threading.Event(), threading.Event()

    def write(conn: psycopg.Connection[Any], item: int) -> int:
        if item == 0:
            first_in.set()
            assert release.wait(10)
        divisor = 0 if item == 3 else 1
        conn.execute(f"INSERT INTO {table} (item, txid) VALUES (%s, 1 / %s)", (item, divisor))
        return item

    group: GroupCommit[int, int] = GroupCommit(pool, write, name="test")
    try:
        with ThreadPoolExecutor(5) as threads:
            first = threads.submit(group.run, 0)
            assert first_in.wait(10)
            # When they are committed together
            rest = {i: threads.submit(group.run, i) for i in range(1, 5)}
            _wait_queued(group, 4)
            release.set()
            assert first.result(10) == 0
            # Then the bad one's caller gets PostgreSQL's error, and every other write is durable
            with pytest.raises(psycopg.errors.DivisionByZero):
                rest[3].result(10)
            assert [rest[i].result(10) for i in (1, 2, 4)] == [1, 2, 4]
    finally:
        group.close()
    assert sorted(_rows(pool, table)) == [0, 1, 2, 4]


def test_a_dependency_blip_fails_every_write_of_the_group_and_writes_none(pool: SyncPool, table: str) -> None:
    # Given a group commit whose transaction loses its connection (a transient failure)
    first_in, release = threading.Event(), threading.Event()

    def write(conn: psycopg.Connection[Any], item: int) -> int:
        if item == 0:
            first_in.set()
            assert release.wait(10)
        conn.execute(f"INSERT INTO {table} (item, txid) VALUES (%s, 1)", (item,))
        if item == 2:
            raise psycopg.OperationalError("the server closed the connection")
        return item

    group: GroupCommit[int, int] = GroupCommit(pool, write, name="test")
    try:
        with ThreadPoolExecutor(4) as threads:
            first = threads.submit(group.run, 0)
            assert first_in.wait(10)
            rest = [threads.submit(group.run, i) for i in range(1, 4)]
            _wait_queued(group, 3)
            release.set()
            assert first.result(10) == 0
            # Then each of its callers gets the failure (their messages come back), none written
            for future in rest:
                with pytest.raises(psycopg.OperationalError):
                    future.result(10)
    finally:
        group.close()
    assert sorted(_rows(pool, table)) == [0]


def test_a_write_after_close_fails_as_transient_so_its_message_comes_back(pool: SyncPool, table: str) -> None:
    # Given a group commit that wrote one write and was then closed (its process is stopping)
    def write(conn: psycopg.Connection[Any], item: int) -> int:
        conn.execute(f"INSERT INTO {table} (item, txid) VALUES (%s, 1)", (item,))
        return item

    group: GroupCommit[int, int] = GroupCommit(pool, write, name="test")
    assert group.run(1) == 1
    group.close()
    # When a late delivery writes
    with pytest.raises(Exception) as refused:
        group.run(2)
    # Then it is refused as a transient failure (redelivered, never dead-lettered), and not written
    assert is_transient(refused.value)
    assert sorted(_rows(pool, table)) == [1]


def test_several_writes_of_one_message_each_get_their_own_outcome_in_order(
    pool: SyncPool, table: str
) -> None:
    # Given one message's four writes, the third of which PostgreSQL refuses
    def write(conn: psycopg.Connection[Any], item: int) -> int:
        row = conn.execute(
            f"INSERT INTO {table} (item, txid) VALUES (%s, txid_current() / %s) RETURNING txid",
            (item, 0 if item == 3 else 1),
        ).fetchone()
        assert row is not None
        return int(row["txid"])

    group: GroupCommit[int, int] = GroupCommit(pool, write, name="test")
    try:
        # When they are written at once
        outcomes = group.run_many([1, 2, 3, 4])
    finally:
        group.close()
    # Then the bad one's outcome is PostgreSQL's error, and the others are durable, in order
    assert isinstance(outcomes[2], psycopg.errors.DivisionByZero)
    written = _rows(pool, table)
    assert sorted(written) == [1, 2, 4]
    assert [outcomes[i] for i in (0, 1, 3)] == [written[1], written[2], written[4]]
    # And after close, a message's writes are refused as transient, none written
    with pytest.raises(Exception) as refused:
        group.run_many([5, 6])
    assert is_transient(refused.value)
    assert sorted(_rows(pool, table)) == [1, 2, 4]


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    yield pipeline_factory()


def test_a_worker_takes_in_a_backlog_of_events_in_fewer_transactions_than_events(pipe: Pipeline) -> None:
    # Given 40 accepted jobs whose requested events wait in the queue while no worker runs
    pipe.reset()
    tenant = pipe.make_tenant()
    text = load_samples()[0].text
    jobs = [pipe.submit(tenant, text) for _ in range(40)]
    wait_until(lambda: all(pipe.published(j) for j in jobs), 30, "every requested event published")
    # When a worker starts (the default Dramatiq threads) and takes them in
    worker = pipe.start_worker()
    try:
        for job_id in jobs:
            assert pipe.wait_state(job_id, TERMINAL, timeout=90)["state"] == "SUCCEEDED"
        # Then every event was taken in once, several to a transaction
        with pipe.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n, count(DISTINCT job_id) AS jobs FROM execution_inbox"
                " WHERE job_id = ANY(%s::uuid[])",
                (jobs,),
            ).fetchone()
        assert row is not None and (row["n"], row["jobs"]) == (40, 40)
        text_metrics = httpx.get(f"{worker.base_url}/metrics", timeout=5).text
        written, transactions = (
            float(m)
            for m in (
                _sample(text_metrics, "fatura_group_commit_writes_sum"),
                _sample(text_metrics, "fatura_group_commit_writes_count"),
            )
        )
        assert written == 40
        assert transactions < 40
    finally:
        pipe.reset()


def _sample(text: str, name: str) -> str:
    found = re.search(rf'^{name}\{{group="execution_inbox"\}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name} is not in the worker's metrics"
    return found.group(1)
