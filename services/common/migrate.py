"""Apply ``services/migrations/NNNN_name.sql`` in order, once each, under an advisory lock.

Each file runs in its own transaction and is recorded with its checksum; a file edited after it
was applied is refused. Two processes migrating at once serialize on the lock, and the second
finds nothing left to do. A migration SQL cannot express alone has a Python step (``STEPS``), run
in the same transaction just before its SQL; the file's header says what the step does.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.common.keyring import Keyring
from services.common.secret_rows import seal_plaintext_step

log = logging.getLogger(__name__)

# Inside the package, so an installed wheel can migrate.
MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant works; it only has to be the same for every migrating process.
_LOCK_KEY = 0x46415455  # "FATU"

Step = Callable[[psycopg.Connection[Any], Keyring | None], None]
# By (version, name): a scratch directory's own 0007 never runs this step.
STEPS: dict[tuple[int, str], Step] = {(7, "secrets_at_rest"): seal_plaintext_step}


class MigrationError(RuntimeError):
    """The migrations on disk and the ones recorded in the database disagree."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number in {directory}")
    return found


def ensure_database(database_url: str) -> bool:
    """Create the database named in the URL if it does not exist. Returns True when created."""
    params = conninfo_to_dict(database_url)
    dbname = params.get("dbname")
    if not dbname:
        return False
    try:
        psycopg.connect(database_url, connect_timeout=5).close()
        return False
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    admin_url = make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(dbname))))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            return False
    log.info("created database %s", dbname)
    return True


def migrate(
    database_url: str, directory: Path = MIGRATIONS_DIR, *, keyring: Keyring | None = None
) -> list[Migration]:
    """Apply pending migrations; return the ones this call applied.

    ``keyring`` seals webhook secrets a migration finds in plaintext (0007); by default the one
    ``FATURA_SECRETS_KEY`` names, read only when there is such a secret.
    """
    ensure_database(database_url)
    migrations = discover(directory)
    applied_now: list[Migration] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version    integer PRIMARY KEY,
                       name       text NOT NULL,
                       checksum   text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            recorded = {
                row[0]: (row[1], row[2])
                for row in conn.execute("SELECT version, name, checksum FROM schema_migrations")
            }
            on_disk = {m.version for m in migrations}
            missing = sorted(set(recorded) - on_disk)
            if missing:
                raise MigrationError(f"the database has migrations {missing} that are not on disk")
            for migration in migrations:
                if migration.version in recorded:
                    _name, checksum = recorded[migration.version]
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was edited after it was "
                            "applied; add a new migration instead"
                        )
                    continue
                with conn.transaction():
                    step = STEPS.get((migration.version, migration.name))
                    if step is not None:
                        step(conn, keyring)
                    conn.execute(migration.sql.encode("utf-8"))
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                log.info("applied migration %04d_%s", migration.version, migration.name)
                applied_now.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
