"""The Kafka tests' fixtures live in fix_kafka.py (importable by the tests for its helpers)."""

from __future__ import annotations

from fix_kafka import broker  # noqa: F401  (imported to register the fixture)
