"""The acceptance edge's named SQL, loaded once from ``sql/acceptance.sql``."""

from __future__ import annotations

from pathlib import Path

from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "acceptance.sql")
