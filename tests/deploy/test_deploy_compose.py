"""deploy/compose: one pinned, non-root image and a compose file that runs every process of
``fatura up`` with a health check on the port the process itself answers ``/readyz`` on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services.cli.processes import PROCESSES
from services.common.ops_server import ops_host

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "compose" / "Dockerfile"
DEPENDENCIES = ("postgres", "rabbitmq", "redis")


def _interpolated(value: object) -> str:
    """A value as compose passes it when the variable is unset: ``${NAME:-default}`` is the default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return document


def test_every_process_and_dependency_runs_with_a_health_check() -> None:
    services = _compose()["services"]
    for name in (*DEPENDENCIES, *(spec.name for spec in PROCESSES)):
        assert name in services, f"compose.yaml has no service {name}"
        assert services[name]["healthcheck"]["test"], name
    for spec in PROCESSES:
        assert services[spec.name]["command"] == ["run", spec.name]
    assert services["migrate"]["command"] == ["migrate"]


def test_every_dependency_and_volume_a_service_names_is_declared() -> None:
    compose = _compose()
    services, volumes = compose["services"], set(compose.get("volumes", {}))
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on an unknown service {dependency}"
            expected = "service_completed_successfully" if dependency == "migrate" else "service_healthy"
            assert condition == {"condition": expected}, f"{name} -> {dependency}"
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            assert source.startswith((".", "/")) or source in volumes, f"{name}: volume {source} undeclared"


def test_each_health_check_asks_the_port_the_process_answers_readyz_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = _compose()["services"]
    for spec in PROCESSES:
        service = services[spec.name]
        for key, value in service["environment"].items():
            monkeypatch.setenv(key, _interpolated(value))
        url = spec.ready_url()
        assert url is not None
        probe = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{urlsplit(url).port}/readyz" in probe, spec.name
        for key in service["environment"]:
            monkeypatch.delenv(key)


def test_images_are_pinned_and_the_fatura_image_runs_as_a_user() -> None:
    for name, service in _compose()["services"].items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), name
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", dockerfile, flags=re.MULTILINE)
    assert [stage for _, stage in stages] == ["build", "runtime"]
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base.group(1))
    user = re.findall(r"^USER (\S+)$", dockerfile, flags=re.MULTILINE)
    assert user and user[-1].split(":")[0] not in ("0", "root")


def _docker_compose_answers() -> str | None:
    """Why ``docker compose config`` cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    for command in (["docker", "compose", "version"], ["docker", "info"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
            return f"`{' '.join(command)}` fails: {reason[0] if reason else done.returncode}"
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    why_not = _docker_compose_answers()
    if why_not is not None:
        pytest.skip(f"docker compose config not run: {why_not}")
    done = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_ops_ports_bind_loopback_unless_the_deployment_says_otherwise() -> None:
    assert ops_host({}) == "127.0.0.1"
    assert ops_host({"FATURA_METRICS_HOST": "0.0.0.0"}) == "0.0.0.0"
