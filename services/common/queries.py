"""Named SQL kept in ``.sql`` files: a ``-- name: foo`` line starts the query called ``foo``."""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(path: Path) -> dict[str, str]:
    """Return ``{name: sql}`` for every named query in ``path``; duplicate names are an error."""
    text = path.read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        sql = body.strip()
        if not sql:
            raise ValueError(f"{path}: query {name!r} is empty")
        queries[name] = sql
    return queries
