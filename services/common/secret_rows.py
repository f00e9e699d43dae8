"""The ``webhook_secrets`` rows as a whole: the Python step of migration 0007 that seals the
plaintext secrets, and the rewrap that moves every row to the current master key.

Both run as the database owner (``fatura migrate``, ``fatura secrets rewrap``), never as a
service's role. What a row holds and how it opens is ``services/common/keyring.py``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import Connection, Cursor
from psycopg.rows import tuple_row

from services.common.keyring import Keyring, KeyringError, Sealed
from services.common.queries import load_queries
from services.common.settings import SettingsError

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "secrets.sql")

_NIL = uuid.UUID(int=0)


def _cursor(conn: Connection[Any]) -> Cursor[tuple[Any, ...]]:
    # Tuple rows, whatever row factory the caller's connection has.
    return conn.cursor(row_factory=tuple_row)


def seal_plaintext_step(conn: Connection[Any], keyring: Keyring | None) -> None:
    """Migration 0007's step, inside its transaction: seal every plaintext secret into
    ``pg_temp.fatura_sealed_webhook_secrets`` for the SQL to move into the new columns.

    The key is needed only when there is a secret to seal, so a new database migrates without one.
    """
    cur = _cursor(conn)
    cur.execute(Q["lock_for_sealing"])
    cur.execute(Q["create_sealed"])
    rows = cur.execute(Q["plaintext_secrets"]).fetchall()
    if not rows:
        return
    keyring = keyring or Keyring.from_env()
    if keyring is None:
        raise SettingsError(
            f"FATURA_SECRETS_KEY is not set: migration 0007 must encrypt the {len(rows)} webhook "
            "secret(s) stored in plaintext, with the key the delivery worker and the edge will use; "
            "nothing was changed"
        )
    for endpoint_id, key_id, secret in rows:
        sealed = keyring.seal(endpoint_id, key_id, secret)
        cur.execute(
            Q["insert_sealed"],
            {
                "endpoint_id": endpoint_id,
                "key_id": key_id,
                "master_key_id": sealed.master_key_id,
                "nonce": sealed.nonce,
                "ciphertext": sealed.ciphertext,
            },
        )
    log.info("sealed %d webhook secret(s) under master key %s", len(rows), keyring.current.id)


def count_by_master_key(conn: Connection[Any]) -> dict[str, int]:
    return {row[0]: int(row[1]) for row in _cursor(conn).execute(Q["count_by_master_key"]).fetchall()}


@dataclass
class Rewrapped:
    resealed: int = 0
    # "endpoint/key_id: why" for each row that did not open; it keeps its old seal.
    failed: list[str] = field(default_factory=list)


def rewrap(conn: Connection[Any], keyring: Keyring, *, batch: int = 200) -> Rewrapped:
    """Seal again under the current master key every secret sealed under another one, a batch per
    transaction; a row that does not open (its key is not held, or it was altered) is reported
    and left as it is. Safe to run twice, and beside running services."""
    done = Rewrapped()
    after = (_NIL, "")
    cur = _cursor(conn)
    while True:
        with conn.transaction():
            rows = cur.execute(
                Q["stale_batch"],
                {
                    "current": keyring.current.id,
                    "after_endpoint": after[0],
                    "after_key": after[1],
                    "limit": batch,
                },
            ).fetchall()
            for endpoint_id, key_id, master_key_id, nonce, ciphertext in rows:
                old = Sealed(master_key_id, bytes(nonce), bytes(ciphertext))
                try:
                    secret = keyring.open(endpoint_id, key_id, old)
                except KeyringError as exc:
                    done.failed.append(f"{endpoint_id}/{key_id}: {exc}")
                    continue
                new = keyring.seal(endpoint_id, key_id, secret)
                cur.execute(
                    Q["reseal"],
                    {
                        "endpoint_id": endpoint_id,
                        "key_id": key_id,
                        "old_master_key_id": master_key_id,
                        "master_key_id": new.master_key_id,
                        "nonce": new.nonce,
                        "ciphertext": new.ciphertext,
                    },
                )
                done.resealed += 1
        if len(rows) < batch:
            return done
        after = (rows[-1][0], rows[-1][1])
