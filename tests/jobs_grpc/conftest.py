"""The JobService tests' fixtures live in fix_jobs_grpc.py (importable by the tests for its helpers)."""

from __future__ import annotations

from fix_jobs_grpc import channel, jobs_grpc, stub  # noqa: F401  (imported to register the fixtures)
