"""Named SQL kept in ``.sql`` files: a ``-- name: foo`` line starts the query called ``foo``.

The text a query is run with is compact: no comments and no indentation. psycopg converts a
query's ``%(name)s`` placeholders with a regular expression and keeps the result only for a query
of at most 4096 bytes (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one is converted
again at every execution. The ``.sql`` files keep their comments and layout for the reader."""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
# Outside quotes: a quoted string or identifier (a doubled quote inside it escapes it), a line
# comment, a run of whitespace, or a dollar quote's opening tag.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\s+|\$(?:[A-Za-z_]\w*)?\$")


def compact_sql(sql: str) -> str:
    """``sql`` without its line comments, and with every run of whitespace that holds a line break
    (comments between them dropped) made one line break, so no line is indented or blank. Quoted
    strings and identifiers are kept as they are; text with a dollar-quoted body, whose whitespace
    may matter, is returned unchanged."""
    out: list[str] = []
    space = ""  # whitespace met since the last text, emitted before the next text
    pos = 0
    for m in _TOKEN.finditer(sql):
        token = m.group()
        if token.startswith("$"):
            return sql
        if m.start() > pos:
            out += (space, sql[pos : m.start()])
            space = ""
        pos = m.end()
        if token.startswith("--"):
            continue
        if token.isspace():
            space = "\n" if "\n" in token or "\n" in space else (space or token)
        else:
            out += (space, token)
            space = ""
    out += (space, sql[pos:])
    return "".join(out).strip()


def load_queries(path: Path) -> dict[str, str]:
    """Return ``{name: sql}`` for every named query in ``path``, compacted (``compact_sql``);
    duplicate names are an error."""
    text = path.read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        sql = compact_sql(body)
        if not sql:
            raise ValueError(f"{path}: query {name!r} is empty")
        queries[name] = sql
    return queries
