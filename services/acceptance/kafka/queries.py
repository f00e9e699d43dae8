"""The Kafka processes' named SQL, loaded once from ``sql/kafka.sql``."""

from __future__ import annotations

from pathlib import Path

from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "kafka.sql")
