"""Paths into a JSON document, for the parity tests that change one field of it at a time."""

from __future__ import annotations

from typing import Any


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key or index path under ``value`` (the root itself excluded), parents before children."""
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            paths += json_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths += json_paths(child, (*prefix, index))
    return paths
