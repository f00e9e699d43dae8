"""The processes of the local stack: what ``fatura run NAME`` starts and ``fatura up`` supervises."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.cli.extras import require


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    target: str  # "package.module:function", called with no arguments
    description: str
    # "package.module:function" returning the process's /readyz URL from its own settings.
    ready: str | None = None
    # The extra of pyproject's optional dependencies this process needs (services/cli/extras.py).
    extra: str | None = None

    def require(self, command: str) -> None:
        if self.extra is not None:
            require(command, self.extra)

    def load(self) -> Callable[[], int | None]:
        self.require(f"fatura run {self.name}")
        function: Callable[[], int | None] = _resolve(self.target)
        return function

    def ready_url(self) -> str | None:
        if self.ready is None:
            return None
        function: Callable[[], str] = _resolve(self.ready)
        return function()


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module_name), attr)
    return function


# Order matters: `fatura up` starts them in this order and stops them in reverse.
PROCESSES: tuple[ProcessSpec, ...] = (
    ProcessSpec(
        "erp",
        "services.sandbox.erp.server:main",
        "sandbox: reference ERP webhook receiver (:8091)",
        "services.sandbox.erp.settings:ready_url",
        extra="sandbox",
    ),
    ProcessSpec(
        "provider",
        "services.sandbox.provider.server:main",
        "sandbox: simulated OpenAI-compatible LLM provider (:8090)",
        "services.sandbox.provider.settings:ready_url",
    ),
    ProcessSpec(
        "limiter",
        "services.limiter.server:main",
        "limiter: gRPC LimiterService (:50052)",
        "services.limiter.settings:ready_url",
    ),
    ProcessSpec(
        "http",
        "services.cli.http_edge:main",
        "edge: the HTTP API (:8080), mounting the routes of acceptance and delivery",
        "services.acceptance.settings:http_ready_url",
    ),
    ProcessSpec(
        "jobs-grpc",
        "services.acceptance.jobs_grpc.server:main",
        "acceptance: gRPC JobService (:50051), the same job API for internal callers (metrics :9187)",
        "services.acceptance.jobs_grpc.settings:ready_url",
    ),
    ProcessSpec(
        "relay",
        "services.acceptance.relay:main",
        "acceptance: outbox relay to RabbitMQ",
        "services.acceptance.settings:relay_ready_url",
    ),
    ProcessSpec(
        "inference-worker",
        "services.inference.worker:main",
        "inference: ingest requested events, claim jobs fairly, call the model (metrics :9183)",
        "services.inference.settings:worker_ready_url",
    ),
    ProcessSpec(
        "inference-scheduler",
        "services.inference.scheduler:main",
        "inference: reap expired leases, fail overdue jobs, top up wake-ups (metrics :9184)",
        "services.inference.settings:scheduler_ready_url",
    ),
    ProcessSpec(
        "delivery-worker",
        "services.delivery.worker:main",
        "delivery: ingest completion events, sign and POST webhooks (metrics :9185)",
        "services.delivery.settings:worker_ready_url",
    ),
    ProcessSpec(
        "delivery-scheduler",
        "services.delivery.scheduler:main",
        "delivery: wake due retries, take back dead senders' claims (metrics :9186)",
        "services.delivery.settings:scheduler_ready_url",
    ),
)


# Not part of `fatura up`'s stack: each runs with `fatura run NAME` where a Kafka cluster is wanted.
OPTIONAL_PROCESSES: tuple[ProcessSpec, ...] = (
    ProcessSpec(
        "kafka-ingress",
        "services.acceptance.kafka.ingress:main",
        "acceptance (optional): accept extraction requests from a Kafka topic (metrics :9188)",
        "services.acceptance.kafka.settings:ingress_ready_url",
        extra="kafka",
    ),
    ProcessSpec(
        "kafka-export",
        "services.acceptance.kafka.export:main",
        "acceptance (optional): export job events to a Kafka topic, keyed by job (metrics :9189)",
        "services.acceptance.kafka.settings:export_ready_url",
        extra="kafka",
    ),
)


def by_name(name: str) -> ProcessSpec:
    for spec in (*PROCESSES, *OPTIONAL_PROCESSES):
        if spec.name == name:
            return spec
    raise KeyError(name)
