"""The simulated provider's HTTP app: OpenAI-compatible routes, health, metrics and the admin API.

``/admin/*`` is the test and chaos interface (faults, counts). It has no key: the simulator is a
local stand-in and binds 127.0.0.1 by default.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.sandbox.provider import wire
from services.sandbox.provider.chat import Simulator, authorized, chat_completions, unauthorized
from services.sandbox.provider.faults import FaultError, parse_fault
from services.sandbox.provider.settings import ProviderSettings

SIMULATOR_HEADER = (b"x-fatura-simulator", wire.FINGERPRINT.encode())


async def models(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not authorized(sim.settings, request):
        return unauthorized(sim)
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "fatura-sandbox"} for m in sim.settings.models
    ]
    return JSONResponse({"object": "list", "data": data})


async def model(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    if not authorized(sim.settings, request):
        return unauthorized(sim)
    name = request.path_params["name"]
    if name not in sim.settings.models:
        message = f"The model `{name}` does not exist or you do not have access to it."
        return JSONResponse(
            wire.error_body(message, "invalid_request_error", "model_not_found", "model"), 404
        )
    return JSONResponse({"id": name, "object": "model", "created": 0, "owned_by": "fatura-sandbox"})


async def healthz(_request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def readyz(_request: Request) -> Response:
    return PlainTextResponse("ready\n")  # nothing to depend on: the simulator is self-contained


async def metrics(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return Response(generate_latest(sim.stats.registry), media_type=CONTENT_TYPE_LATEST)


async def get_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse(sim.faults.to_json())


async def set_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    try:
        fault = parse_fault(json.loads(await request.body()))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _admin_error(f"the body is not valid JSON: {exc}")
    except FaultError as exc:
        return _admin_error(str(exc))
    sim.faults.set(fault)
    return JSONResponse(sim.faults.to_json())


async def clear_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.faults.clear()
    return JSONResponse(sim.faults.to_json())


async def get_stats(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse(_stats(sim))


async def reset_stats(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.stats.reset(sim.limits.in_flight)
    return JSONResponse(_stats(sim))


def _stats(sim: Simulator) -> dict[str, Any]:
    settings = sim.settings
    return {
        **sim.stats.snapshot(),
        "in_flight": sim.limits.in_flight,
        **sim.limits.usage(),
        "limits": {"rpm": settings.rpm, "tpm": settings.tpm, "concurrency": settings.concurrency},
        "latency": {"mean_ms": settings.latency_ms, "distribution": settings.latency_distribution},
        "models": list(settings.models),
        "fault": sim.faults.to_json(),
    }


def _admin_error(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": None}}, 400)


async def _http_error(_request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse(wire.error_body(str(detail), "invalid_request_error", None), status)


class _SimulatorHeader:
    """Labels every response, errors included, as coming from the simulator."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), SIMULATOR_HEADER]
            await send(message)

        await self.app(scope, receive, labelled)


def create_app(settings: ProviderSettings) -> Starlette:
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{name:path}", model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/faults", get_faults, methods=["GET"]),
            Route("/admin/faults", set_faults, methods=["POST"]),
            Route("/admin/faults", clear_faults, methods=["DELETE"]),
            Route("/admin/stats", get_stats, methods=["GET"]),
            Route("/admin/stats", reset_stats, methods=["DELETE"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    app.state.sim = Simulator.from_settings(settings)
    app.add_middleware(_SimulatorHeader)
    return app


def create_app_from_env() -> Starlette:
    return create_app(ProviderSettings.from_env())
