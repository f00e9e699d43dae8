"""The delivery tests' fixtures live in fix_delivery.py (importable by the tests for its helpers)."""

from __future__ import annotations

from fix_delivery import (  # noqa: F401  (imported to register the fixtures)
    dclient,
    dedge,
    erp,
    erp_secret,
    jobs,
    publisher,
    receiver,
    register,
    scheduler,
    start_worker,
    worker,
)
