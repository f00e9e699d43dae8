"""`fatura dlq` as an operator uses it: list (with what still sits in the dead-letter queues), show,
and redrive requests. Each test has a queue prefix of its own, so no running scheduler publishes
what it requests; the end-to-end redrive through a scheduler is in test_dlq_redrive.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pika
import pytest

from fix_amqp import AMQP_URL, delete_queues
from fix_db import SyncPool
from fix_ops import dead_letter, dead_letter_row, fatura
from services.common.broker import make_broker
from services.common.procs import free_port
from services.common.settings import CommonSettings


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"dlq-{uuid.uuid4().hex[:8]}"
    yield prefix
    delete_queues(prefix)


@pytest.fixture
def env(base_env: dict[str, str], prefix: str) -> dict[str, str]:
    return {**base_env, "FATURA_QUEUE_PREFIX": prefix}


@pytest.fixture
def reason() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


def _park_in_xq(database_url: str, prefix: str, queue: str, bodies: list[bytes]) -> None:
    """Declare ``queue`` as the stack does and put ``bodies`` in its .XQ, as RabbitMQ would."""
    broker = make_broker(CommonSettings(database_url=database_url, queue_prefix=prefix))
    try:
        broker.declare_queue(queue, ensure=True)
    finally:
        broker.close()
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish(exchange="", routing_key=f"{queue}.XQ", body=body)
    finally:
        connection.close()


def _table_ids(output: str) -> list[int]:
    """The id column of the dead-letter table."""
    cells = [line.split("│")[1].strip() for line in output.splitlines() if line.startswith("│")]
    return [int(cell) for cell in cells if cell.isdigit()]


def test_list_shows_open_dead_letters_and_what_the_dead_letter_queues_still_hold(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str, database_url: str
) -> None:
    ingest = f"{prefix}.inference.ingest"
    _park_in_xq(database_url, prefix, ingest, [b"junk one", b"junk two"])
    old = dead_letter(pool, queue=ingest, reason=reason, at=datetime.now(UTC) - timedelta(hours=5))
    new = dead_letter(pool, queue=ingest, reason=reason, source="broker")
    other_queue = dead_letter(pool, queue=f"{prefix}.delivery.ingest", reason=reason)

    table = fatura("dlq", "list", "--reason", reason, "--queue", "inference.ingest", env=env).stdout
    recent = json.loads(fatura("dlq", "list", "--reason", reason, "--since", "2h", "--json", env=env).stdout)

    assert "2 open dead letters" in table
    assert _table_ids(table) == [new, old]
    assert reason in table and "broker" in table and "inference.ingest" in table
    xq_lines = {line.split()[1]: line for line in table.splitlines() if ".XQ" in line}
    assert xq_lines[f"{ingest}.XQ"].split()[3] == "2"
    assert "not declared yet" in xq_lines[f"{prefix}.delivery.deliver.XQ"]
    assert [d["id"] for d in recent["dead_letters"]] == [other_queue, new]
    assert recent["undrained"][ingest] == 2 and recent["undrained"][f"{prefix}.inference.run"] is None
    assert recent["broker_error"] is None


def test_list_still_shows_the_table_when_rabbitmq_does_not_answer(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str
) -> None:
    letter = dead_letter(pool, queue=f"{prefix}.inference.ingest", reason=reason)
    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"

    result = fatura("dlq", "list", "--reason", reason, env={**env, "FATURA_AMQP_URL": closed})

    assert _table_ids(result.stdout) == [letter]
    assert (
        "RabbitMQ does not answer" in result.stdout
        and "The table above is from the database" in result.stdout
    )


def test_show_prints_everything_including_the_stored_message(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str
) -> None:
    letter = dead_letter(pool, queue=f"{prefix}.inference.ingest", reason=reason)
    body_only = dead_letter(pool, queue=f"{prefix}.inference.ingest", reason=reason, sendable=False)

    text = fatura("dlq", "show", str(letter), env=env).stdout
    as_json = json.loads(fatura("dlq", "show", str(letter), "--json", env=env).stdout)
    undecodable = fatura("dlq", "show", str(body_only), env=env).stdout

    message_id = dead_letter_row(pool, letter)["message_id"]
    assert f"dead letter {letter}" in text and reason in text and message_id in text
    assert "published again as it is" in text and '"actor_name": "ingest"' in text
    assert as_json["message"]["message_id"] == message_id and as_json["redrive_count"] == 0
    assert "no message was stored" in undecodable and "cannot be redriven" in undecodable


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["dlq", "redrive"], "name what to redrive"),
        (["dlq", "redrive", "--no-wait"], "name what to redrive"),
        (["dlq", "redrive", "--since", "yesterday"], "neither a time back from now"),
        (["dlq", "redrive", "--since", "2026-02-30"], "not a real date"),
        (["dlq", "redrive", "--since", "9999999d"], "before the year 1"),
        (["dlq", "list", "--since", "5 minutes"], "neither a time back from now"),
        (["dlq", "redrive", "987654321098"], "there is no dead letter 987654321098"),
        (["dlq", "show", "987654321098"], "there is no dead letter 987654321098"),
        (["dlq", "show", "abc"], "not a positive integer"),
        (["dlq", "redrive", "--all", "--timeout", "nan"], "not a number of seconds"),
    ],
)
def test_bad_input_is_a_clear_message_and_exit_2(env: dict[str, str], args: list[str], says: str) -> None:
    result = fatura(*args, env=env, check=False)

    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr


def test_redrive_with_an_unknown_id_requests_nothing(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str
) -> None:
    known = dead_letter(pool, queue=f"{prefix}.inference.ingest", reason=reason)

    result = fatura("dlq", "redrive", str(known), "987654321097", "--no-wait", env=env, check=False)

    assert result.returncode == 2 and "nothing was requested" in result.stderr
    assert dead_letter_row(pool, known)["redrive_requested_at"] is None


def test_redrive_no_wait_requests_what_matches_and_names_what_cannot_be_sent(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str
) -> None:
    queue = f"{prefix}.inference.ingest"
    sendable = [dead_letter(pool, queue=queue, reason=reason) for _ in range(2)]
    undecodable = dead_letter(pool, queue=queue, reason=reason, sendable=False)
    elsewhere = dead_letter(pool, queue=f"{prefix}.delivery.ingest", reason=reason)

    result = fatura(
        "dlq", "redrive", "--reason", reason, "--queue", "inference.ingest", "--no-wait", env=env
    ).stdout
    listed = fatura("dlq", "list", "--reason", reason, env=env).stdout

    assert f"requested the redrive of 2: {sendable[0]}, {sendable[1]}" in result
    assert "cannot be redriven (1;" in result and str(undecodable) in result
    assert all(dead_letter_row(pool, i)["redrive_requested_at"] is not None for i in sendable)
    assert dead_letter_row(pool, elsewhere)["redrive_requested_at"] is None
    assert "requested" in listed and "cannot be redriven" in listed


def test_redrive_waits_for_the_schedulers_and_says_so_when_none_publishes(
    env: dict[str, str], pool: SyncPool, prefix: str, reason: str
) -> None:
    letter = dead_letter(pool, queue=f"{prefix}.inference.ingest", reason=reason)

    result = fatura("dlq", "redrive", str(letter), "--timeout", "2", env=env, check=False)

    assert result.returncode == 1
    assert "1 of 1 not published after 2 s" in result.stderr and "schedulers" in result.stderr
    row = dead_letter_row(pool, letter)
    assert row["redrive_requested_at"] is not None and row["redriven_at"] is None
