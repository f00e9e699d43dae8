"""The processes of the local stack: what ``fatura run NAME`` starts and ``fatura up`` supervises."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    target: str  # "package.module:function", called with no arguments
    description: str

    def load(self) -> Callable[[], int | None]:
        module_name, _, attr = self.target.partition(":")
        function: Callable[[], int | None] = getattr(importlib.import_module(module_name), attr)
        return function


# Order matters: `fatura up` starts them in this order and stops them in reverse.
PROCESSES: tuple[ProcessSpec, ...] = (
    ProcessSpec(
        "limiter",
        "services.limiter.server:main",
        "limiter: gRPC LimiterService (:50052)",
    ),
    ProcessSpec(
        "http",
        "services.acceptance.server:main",
        "acceptance: HTTP edge (:8080)",
    ),
    ProcessSpec(
        "relay",
        "services.acceptance.relay:main",
        "acceptance: outbox relay to RabbitMQ",
    ),
)


def by_name(name: str) -> ProcessSpec:
    for spec in PROCESSES:
        if spec.name == name:
            return spec
    raise KeyError(name)
