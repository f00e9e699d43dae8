"""A job's token usage is the sum over its attempts (``fatura_usage_add``): each numeric member of the
new usage is added to the same member of the total, a member missing on one side counting as 0."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.types.json import Jsonb

from fix_db import SyncPool


@pytest.mark.parametrize(
    ("total", "extra", "expected"),
    [
        (None, None, None),
        (None, {"total_tokens": 5}, {"total_tokens": 5}),
        ({"total_tokens": 5}, None, {"total_tokens": 5}),
        (
            {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100},
            {"prompt_tokens": 190, "completion_tokens": 30, "total_tokens": 220},
        ),
        ({"total_tokens": 7}, {"prompt_tokens": 3}, {"total_tokens": 7, "prompt_tokens": 3}),
        ({"total_tokens": 1.5}, {"total_tokens": 2}, {"total_tokens": 3.5}),
    ],
)
def test_usage_adds_member_by_member(
    pool: SyncPool,
    total: dict[str, Any] | None,
    extra: dict[str, Any] | None,
    expected: dict[str, Any] | None,
) -> None:
    wrap = lambda value: Jsonb(value) if value is not None else None  # noqa: E731
    with pool.connection() as conn:
        # Twice in one session: the second call runs on what the first one planned.
        for _ in range(2):
            row = conn.execute(
                "SELECT fatura_usage_add(%s::jsonb, %s::jsonb) AS usage", (wrap(total), wrap(extra))
            ).fetchone()
            assert row is not None
            assert row["usage"] == expected
