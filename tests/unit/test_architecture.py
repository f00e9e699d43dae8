"""The import graph keeps its shape (DESIGN §1, STYLE §11): no service imports another (the limiter's
public client is the one door into it), ``services/common`` imports no service, and the partner SDK
stands alone. The HTTP edge imports no service (but the limiter's client, for its pool view): the
process that runs it (``services/cli/http_edge.py``) takes each service's routes through that
service's one public module for it (``http_api``) and hands them in; the CLI and the chaos runner,
which start and break every process, may import any."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("acceptance", "inference", "delivery", "limiter", "sandbox")
COMPOSERS = ("edge", "cli", "chaos")
# The only names one service may import from another.
PUBLIC = {"services.limiter", "services.limiter.client"}
# What the HTTP process may import of a service: each service's module for the edge.
EDGE_PUBLIC = {f"services.{service}.http_api" for service in SERVICES}
HTTP_PROCESS = "services/cli/http_edge.py"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "services" and len(parts) > 1 else None


def _sources(folder: str) -> list[Path]:
    return [p for p in (ROOT / folder).rglob("*.py") if "protos" not in p.parts]


def test_no_service_imports_another_except_through_a_public_client() -> None:
    crossings = []
    for path in _sources("services"):
        own = path.relative_to(ROOT).parts[1]
        if own not in SERVICES:
            continue
        for line, module in _imports(path):
            target = _package(module)
            if target in SERVICES and target != own and module not in PUBLIC:
                crossings.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert crossings == []


def test_common_imports_no_service_and_no_composer() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources("services/common")
        for line, module in _imports(path)
        if _package(module) in (*SERVICES, *COMPOSERS)
    ]
    assert found == []


def test_the_partner_sdk_stands_alone() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources("sdk")
        for line, module in _imports(path)
        if module.split(".")[0] in ("services", "bench")
    ]
    assert found == []


def test_the_edge_imports_no_service_but_the_limiter_s_public_client() -> None:
    crossings = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources("services/edge")
        for line, module in _imports(path)
        if _package(module) in SERVICES and module not in PUBLIC
    ]
    assert crossings == []


def test_the_http_process_mounts_each_service_through_its_public_module() -> None:
    path = ROOT / HTTP_PROCESS
    crossings = [
        f"{HTTP_PROCESS}:{line} imports {module}"
        for line, module in _imports(path)
        if _package(module) in SERVICES and module not in EDGE_PUBLIC
    ]
    assert crossings == []


def test_the_walk_sees_the_imports_it_guards() -> None:
    # The HTTP process composes acceptance and delivery: a walk that found neither would be blind.
    mounted = {module for _, module in _imports(ROOT / HTTP_PROCESS)}
    assert {"services.acceptance.http_api", "services.delivery.http_api"} <= mounted
