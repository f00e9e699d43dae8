"""The SQL the services run: compacted as loaded, and small enough for psycopg to keep its
conversion of the placeholders (services/common/queries.py)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

from services.common.queries import compact_sql, load_queries

ROOT = Path(__file__).resolve().parents[2]


def test_comments_and_indentation_go_and_quoted_text_stays() -> None:
    sql = (
        "-- what it does\n"
        "SELECT 'a -- not a comment\n  \n  kept', \"odd  name\"  -- a comment\n"
        "\n"
        "    -- a whole line\n"
        "    FROM t\n"
        "    WHERE note = 'it''s'  AND  x--y\n"
        "      = 1\n"
    )
    assert compact_sql(sql) == (
        "SELECT 'a -- not a comment\n  \n  kept', \"odd  name\"\nFROM t\nWHERE note = 'it''s'  AND  x\n= 1"
    )


def test_a_dollar_quoted_body_is_left_as_written() -> None:
    sql = "CREATE FUNCTION f() RETURNS text AS $body$\n  SELECT 'x'  -- kept\n$body$ LANGUAGE sql"
    assert compact_sql(sql) == sql


def test_loaded_queries_are_compact(tmp_path: Path) -> None:
    path = tmp_path / "q.sql"
    path.write_text(
        "-- name: one\n-- reads one row\nSELECT *\n    FROM t  -- the table\n    WHERE id = %(id)s;\n"
    )
    assert load_queries(path) == {"one": "SELECT *\nFROM t\nWHERE id = %(id)s;"}


def _statements() -> list[tuple[str, str]]:
    """Every module-level statement of every module that loads named queries, as composed there."""
    found = []
    for path in sorted((ROOT / "services").rglob("*.py")):
        if path == ROOT / "services" / "common" / "queries.py":
            continue
        if "load_queries(" not in path.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for attr, value in vars(module).items():
            texts = value.items() if isinstance(value, dict) else [(attr, value)]
            for name, text in texts:
                if isinstance(text, str) and "%(" in text:
                    found.append((f"{module.__name__}.{attr}[{name}]", text))
    return found


STATEMENTS = _statements()


def test_the_services_statements_were_found() -> None:
    names = {name for name, _ in STATEMENTS}
    assert "services.inference.claims.Q[complete_job_then_head]" in names
    assert len(STATEMENTS) > 100


def test_psycopg_keeps_each_statements_conversion() -> None:
    too_long = [
        (name, len(sql.encode()))
        for name, sql in STATEMENTS
        if len(sql.encode()) > MAX_CACHED_STATEMENT_LENGTH
        or len(set(re.findall(r"%\((\w+)\)s", sql))) > MAX_CACHED_STATEMENT_PARAMS
    ]
    # Each of these would have its placeholders converted again at every execution.
    assert too_long == []
