"""Named SQL shipped inside the package: a ``-- name: foo`` line starts the query called ``foo``."""

from __future__ import annotations

import re
from importlib.resources import files

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(resource: str) -> dict[str, str]:
    text = files("fatura_sdk").joinpath(resource).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries or not body.strip():
            raise ValueError(f"{resource}: query {name!r} is defined twice or empty")
        queries[name] = body.strip()
    return queries
