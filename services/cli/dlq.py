"""``fatura dlq list|show|redrive``: what was taken off the queues, why, and sending it back.

A redrive is requested in the database; the scheduler of each queue's service publishes the stored
message again (original message id, so the consumers' inboxes dedup) within a sweep of about 5 s.
``redrive`` waits for that by default.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dramatiq.errors import ConnectionError as BrokerConnectionError

from services.cli.extras import require
from services.common import deadletters, events
from services.common.broker import make_broker
from services.common.db import SyncPool, sync_pool
from services.common.deadletters import DeadLetter
from services.common.settings import CommonSettings

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_TIMEOUT = 60.0
_POLL_SECONDS = 0.5


class Refused(Exception):
    """Bad input from the operator: a clear message and exit status 2."""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "dlq", help="dead letters: list, show, redrive", description=__doc__
    )
    actions = parser.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list", help="open dead letters, and what still sits in each queue's .XQ (needs RabbitMQ)"
    )
    _filters(listing)
    listing.add_argument("--all", action="store_true", help="also those already redriven")
    listing.add_argument("--limit", type=_positive, default=100, help="newest N (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    listing.set_defaults(func=_list)

    show = actions.add_parser("show", help="one dead letter with the whole stored message")
    show.add_argument("id", type=_positive)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_show)

    redrive = actions.add_parser(
        "redrive",
        help="publish dead letters again: by id, by filter, or --all; waits until published",
        description="Select by IDs and/or --since/--reason/--queue (all must match), or --all for "
        "every open dead letter. A redrive with no selector is refused.",
    )
    redrive.add_argument("ids", nargs="*", type=_positive, metavar="ID")
    _filters(redrive)
    redrive.add_argument("--all", action="store_true", help="every open dead letter")
    redrive.add_argument("--no-wait", action="store_true", help="request it and return at once")
    redrive.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"how long to wait for the schedulers to publish (default {DEFAULT_TIMEOUT:.0f})",
    )
    redrive.set_defaults(func=_redrive)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="WHEN", help="2h, 30m, 7d, or an ISO 8601 date(-time)")
    parser.add_argument("--reason", help="malformed, unknown_type, delivery_limit, unexpected_error, ...")
    parser.add_argument("--queue", help="e.g. inference.ingest (the deployment's prefix is optional)")


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < 86_400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds between 0 and 86400")
    return value


def _positive(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a positive integer")
    return int(raw)


def _selection(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    since = None
    if args.since is not None:
        try:
            since = deadletters.parse_since(args.since)
        except ValueError as exc:
            raise Refused(str(exc)) from None
    for name in ("reason", "queue"):
        value = getattr(args, name)
        if value is not None and (not value or "\x00" in value):
            raise Refused(f"--{name} must not be empty")
    queue = deadletters.queue_named(args.queue, prefix) if args.queue else None
    return {"since": since, "reason": args.reason, "queue": queue}


def _run(action: str, args: argparse.Namespace, body: Any) -> int:
    settings = CommonSettings.from_env()
    try:
        with sync_pool(settings, name="cli", max_size=1) as pool:
            return int(body(settings, pool, args))
    except Refused as exc:
        print(f"fatura dlq {action}: {exc}", file=sys.stderr)
        return 2


def _console() -> Console:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 180)


def _when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at is not None else ""


def _redrive_state(letter: DeadLetter) -> str:
    if letter.redriven_at is not None:
        return f"redriven {_when(letter.redriven_at)} (x{letter.redrive_count})"
    if letter.message is None:
        return "cannot be redriven (not a message)"
    if letter.redrive_requested_at is not None:
        return f"requested {_when(letter.redrive_requested_at)}"
    return "open"


# -- list ---------------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    if not args.json:
        require("fatura dlq list", "cli", hint="or add --json")
    return _run("list", args, _list_with)


def _list_with(settings: CommonSettings, pool: SyncPool, args: argparse.Namespace) -> int:
    selection = _selection(args, settings.queue_prefix)
    letters = deadletters.listing(pool, **selection, include_redriven=args.all, limit=args.limit)
    undrained, broker_error = _undrained(settings)
    if args.json:
        document = {
            "dead_letters": [letter.summary() for letter in letters],
            "undrained": undrained,
            "broker_error": broker_error,
        }
        print(json.dumps(document))
        return 0
    from rich.table import Table

    console = _console()
    kind = "dead letters" if args.all else "open dead letters"
    title = f"{len(letters)} {kind} (queues under {settings.queue_prefix}., times in UTC, newest first)"
    table = Table(title=title, title_justify="left")
    for column in ("id", "at", "queue", "actor", "reason", "detail", "message id", "source", "redrive"):
        table.add_column(column, overflow="fold", max_width=60 if column == "detail" else None)
    for letter in letters:
        table.add_row(
            str(letter.id),
            _when(letter.at),
            letter.queue.removeprefix(f"{settings.queue_prefix}."),
            letter.actor,
            letter.reason,
            letter.detail[:200],
            letter.message_id or "",
            letter.source,
            _redrive_state(letter),
        )
    console.print(table)
    if len(letters) == args.limit:
        console.print(f"(the newest {args.limit}; --limit for more)")
    if undrained is None:
        console.print(
            f"RabbitMQ does not answer ({broker_error}): how many messages still sit in the "
            "dead-letter queues (.XQ) is unknown. The table above is from the database."
        )
        return 0
    xq = Table(title="Dead-letter queues (.XQ) not yet drained into the table", title_justify="left")
    xq.add_column("queue")
    xq.add_column("messages", justify="right")
    for queue, count in undrained.items():
        xq.add_row(f"{queue}.XQ", "not declared yet" if count is None else str(count))
    console.print(xq)
    if any(undrained.values()):
        console.print("The schedulers move these into the table above within a sweep (about 5 s).")
    return 0


def _undrained(settings: CommonSettings) -> tuple[dict[str, int | None] | None, str | None]:
    """Per known queue, the messages in its .XQ; or None and why, when RabbitMQ does not answer."""
    url = settings.amqp_url
    if "socket_timeout=" not in url:  # an operator's listing should not hang on a silent broker
        url += ("&" if "?" in url else "?") + "socket_timeout=3&stack_timeout=5&connection_attempts=1"
    broker = make_broker(replace(settings, amqp_url=url))
    pika_log = logging.getLogger("pika")
    level = pika_log.level
    pika_log.setLevel(logging.CRITICAL)  # the reason is reported once, below the table
    try:
        return deadletters.undrained(broker, events.all_queues(settings.queue_prefix)), None
    except BrokerConnectionError as exc:
        cause = exc.__cause__ or (exc.args[0] if exc.args else exc)
        return None, f"{type(cause).__name__}: {cause}".rstrip(": ")
    finally:
        broker.close()
        pika_log.setLevel(level)


# -- show ---------------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    if not args.json:
        require("fatura dlq show", "cli", hint="or add --json")
    return _run("show", args, _show_with)


def _show_with(settings: CommonSettings, pool: SyncPool, args: argparse.Namespace) -> int:
    letter = deadletters.get(pool, args.id)
    if letter is None:
        raise Refused(f"there is no dead letter {args.id} (it may have been pruned after the retention)")
    if args.json:
        print(json.dumps(letter.as_json()))
        return 0
    from rich.table import Table

    console = _console()
    table = Table(show_header=False, title=f"dead letter {letter.id}", title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in letter.summary().items():
        table.add_row(name, "" if value is None else str(value))
    table.add_row("redrive", _redrive_state(letter))
    console.print(table)
    if letter.message is not None:
        console.print("message (published again as it is on a redrive):")
        console.print_json(json.dumps(letter.message))
    else:
        console.print("no message was stored (the body was not a message); the body as received:")
        console.print(letter.body, markup=False, highlight=False)
    return 0


# -- redrive ------------------------------------------------------------------------------------


def _redrive(args: argparse.Namespace) -> int:
    if not args.no_wait:
        require("fatura dlq redrive", "cli", hint="or add --no-wait")
    return _run("redrive", args, _redrive_with)


def _redrive_with(settings: CommonSettings, pool: SyncPool, args: argparse.Namespace) -> int:
    selection = _selection(args, settings.queue_prefix)
    if not (args.ids or args.all or any(v is not None for v in selection.values())):
        raise Refused(
            "name what to redrive: IDs, --since, --reason or --queue, or --all for every open dead letter"
        )
    ids = sorted(set(args.ids)) or None
    if ids is not None:
        check = deadletters.check_ids(pool, ids)
        if check.unknown:
            raise Refused(
                f"there is no dead letter {', '.join(map(str, check.unknown))}; nothing was requested"
            )
        for dead_letter_id, at in check.redriven.items():
            print(f"dead letter {dead_letter_id} was redriven already, at {_when(at)} UTC")
    request = deadletters.request_redrive(pool, ids=ids, **selection)
    requested, unsendable = sorted(request.requested), sorted(request.unsendable)
    if unsendable:
        print(
            f"cannot be redriven ({len(unsendable)}; their body was not a message, so nothing "
            f"can be published): {_ids(unsendable)}"
        )
    if not requested:
        print("nothing to redrive: no open dead letter with a message matches")
        return 0
    print(f"requested the redrive of {len(requested)}: {_ids(requested)}")
    if args.no_wait:
        print("the schedulers publish them within a sweep (about 5 s); `fatura dlq list --all` shows when")
        return 0
    return _wait(pool, requested, args.timeout)


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:30]))
    return shown + (f" and {len(ids) - 30} more" if len(ids) > 30 else "")


def _wait(pool: SyncPool, ids: list[int], timeout: float) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    pending = len(ids)
    columns = (TextColumn("published"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console(), transient=False) as progress:
        task = progress.add_task("redrive", total=len(ids))
        while True:
            pending = deadletters.pending_redrives(pool, ids)
            progress.update(task, completed=len(ids) - pending)
            if pending == 0 or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_SECONDS)
    if pending == 0:
        print(f"all {len(ids)} published again; the consumers' inboxes dedup by event id")
        return 0
    print(
        f"fatura dlq redrive: {pending} of {len(ids)} not published after {timeout:g} s. The inference "
        "and delivery schedulers publish requested redrives about every 5 s: are they running "
        "(`fatura up`, or `fatura run inference-scheduler` / `delivery-scheduler`)? The request stays; "
        "they publish it when they run.",
        file=sys.stderr,
    )
    return 1
