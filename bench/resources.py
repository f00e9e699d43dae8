"""What a benchmark run owns and removes: a database of its own (dropped and recreated, its name must
contain ``bench``), and the RabbitMQ queues and Redis keys under the run's own prefixes."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable

import psycopg
import redis
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.common.migrate import migrate
from services.common.settings import CommonSettings

# Each queue the services declare comes with a delay queue and a dead-letter queue.
QUEUE_SUFFIXES = ("", ".DQ", ".XQ")


def add_database_argument(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--database", default=default, help="the bench's own database (dropped and recreated)")


def bench_database(name: str) -> str:
    """Drop and recreate the bench's own database, migrate it, and return its URL."""
    base = CommonSettings.from_env().database_url
    if "bench" not in name or conninfo_to_dict(base).get("dbname") == name:
        raise SystemExit(
            f"refusing to drop database {name!r}: its name must contain 'bench' and differ from "
            "FATURA_DATABASE_URL's"
        )
    with psycopg.connect(make_conninfo(base, dbname="postgres"), autocommit=True) as conn:
        # Another run of the same bench would lose its database mid-run (WITH (FORCE) ends its
        # connections): refuse instead, and say how to run beside it.
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()
        if row is not None and row[0]:
            raise SystemExit(
                f"database {name!r} has {row[0]} open connection(s): another run of this bench is using "
                "it (or its processes outlived it). Wait for it, or give this run its own: --database "
                f"{name}_2"
            )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    url = make_conninfo(base, dbname=name)
    # A fresh database applies every migration: one log line each is noise in a bench's output.
    migrate_log = logging.getLogger("services.common.migrate")
    level = migrate_log.level
    migrate_log.setLevel(logging.WARNING)
    try:
        migrate(url)  # creates it
    finally:
        migrate_log.setLevel(level)
    return url


def delete_queues(amqp_url: str, names: Iterable[str]) -> None:
    """Delete each named queue with its delay and dead-letter queues (a missing one is no error)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        for name in sorted(set(names)):
            for suffix in QUEUE_SUFFIXES:
                channel.queue_delete(name + suffix)
    finally:
        connection.close()


def delete_keys(redis_url: str, prefix: str) -> None:
    """Delete every Redis key that starts with ``prefix``."""
    client = redis.Redis.from_url(redis_url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(batch), 1000):
            client.delete(*batch[start : start + 1000])
    finally:
        client.close()
