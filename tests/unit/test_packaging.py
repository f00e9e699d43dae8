"""What an install gets: the migrations inside the wheel, services that run without the extras,
commands that name the extra they miss, and pins that are the ones the lock installs."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from services.cli.extras import EXTRAS
from services.edge import review_page

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# What the runtime services must never need (they belong to extras).
OPTIONAL = ("matplotlib", "rich", "aiohttp", "confluent_kafka")
# The services' processes, and the CLI that starts them (it imports every command module).
RUNTIME = ("common", "acceptance", "inference", "delivery", "limiter", "edge", "cli", "sandbox/provider")
# Modules that import an extra (the Kafka processes and theirs); `fatura run` checks for the extra first.
EXTRA_MODULES = (
    "services.acceptance.kafka.ingress",
    "services.acceptance.kafka.export",
    "services.acceptance.kafka.dead_letters",
)

# Makes importing the named top-level modules fail, as in an install without them.
BLOCK = """
import importlib, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

BLOCKED = set(sys.argv[1].split(","))
sys.meta_path.insert(0, Blocked())
"""
IMPORT_ALL = """
failed = []
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
RUN_CLI = """
from services.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _without_extras(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + script, ",".join(OPTIONAL), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _runtime_modules() -> list[str]:
    names = []
    for folder in RUNTIME:
        for path in sorted((ROOT / "services" / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [name for name in names if name not in EXTRA_MODULES]


def test_the_runtime_services_import_without_any_extra() -> None:
    """Given matplotlib, rich and aiohttp cannot be imported
    When every module of the services and of the CLI is imported
    Then each one imports."""
    modules = _runtime_modules()
    assert "services.inference.worker" in modules and "services.cli.main" in modules
    done = _without_extras(IMPORT_ALL, *modules)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["keys", "list"], "cli"),
        (["dlq", "show", "1"], "cli"),
        (["run", "erp"], "sandbox"),
        (["sandbox", "erp"], "sandbox"),
        (["up"], "sandbox"),
        (["demo"], "cli"),
        (["bench", "accept"], "bench"),
        (["chaos", "run"], "bench"),
        (["run", "kafka-ingress"], "kafka"),
        (["run", "kafka-export"], "kafka"),
    ],
)
def test_a_command_without_its_extra_names_the_extra_to_install(argv: list[str], extra: str) -> None:
    done = _without_extras(RUN_CLI, *argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"pip install 'fatura[{extra}]'" in done.stderr


def test_the_cli_builds_its_commands_without_any_extra() -> None:
    done = _without_extras(RUN_CLI, "run", "--help")
    assert done.returncode == 0, done.stderr
    assert "inference-worker" in done.stdout


def test_no_migration_is_left_outside_the_package() -> None:
    # Migrations moved from migrations/ to services/migrations/; a file added at the old path
    # would never be applied.
    assert sorted((ROOT / "migrations").glob("*.sql")) == []
    assert sorted((ROOT / "services" / "migrations").glob("*.sql"))


def test_the_wheel_ships_every_migration(tmp_path: Path) -> None:
    """Given a copy of the sources
    When a wheel is built from it with the pinned backend
    Then every migration is inside it, where fatura migrate looks for them, and so is the reviewer page."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools (the build backend, in the dev extra) is not installed")
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    for folder in ("services", "bench", "sdk"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    offline = ("--quiet", "--no-deps", "--no-build-isolation", "--no-index")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("fatura-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"services/migrations/{p.name}" for p in (ROOT / "services" / "migrations").glob("*.sql")}
    assert expected and expected <= names
    assert "services/common/migrate.py" in names
    # The reviewer page's files, which the edge serves at /review
    assert {f"services/edge/review_page/{name}" for name in review_page.ASSETS} <= names


# -- pins ---------------------------------------------------------------------------------------

_PIN = re.compile(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^\s;]+)$")


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        match = _PIN.match(requirement.strip())
        if match:
            pins[_name(match.group(1))] = match.group(2)
    return pins


def _declared() -> list[str]:
    extras = PYPROJECT["project"]["optional-dependencies"]
    return [
        *PYPROJECT["build-system"]["requires"],
        *PYPROJECT["project"]["dependencies"],
        *(r for group in extras.values() for r in group),
    ]


def _lock_lines() -> list[str]:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_every_pin_in_pyproject_is_the_version_the_lock_installs() -> None:
    locked = _pins(_lock_lines())
    declared = _declared()
    pins = _pins(declared)
    assert len(pins) > 20, "no pins found: the parse is broken"
    differ = {name: (pin, locked.get(name)) for name, pin in pins.items() if locked.get(name) != pin}
    assert differ == {}, "run `make lock` (pyproject pin, lock pin)"
    # One pin per package, wherever it is declared.
    for requirement in declared:
        match = _PIN.match(requirement.strip())
        if match:
            assert pins[_name(match.group(1))] == match.group(2), requirement


def test_the_lock_pins_everything_and_names_no_index() -> None:
    lines = _lock_lines()
    assert all(_PIN.match(line) for line in lines), [line for line in lines if not _PIN.match(line)]
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    assert "://" not in text and "--index-url" not in text and "--find-links" not in text


def test_the_grpcio_family_is_pinned_to_one_version() -> None:
    versions = {name: v for name, v in _pins(_declared()).items() if name.startswith("grpcio")}
    assert {"grpcio", "grpcio-tools", "grpcio-health-checking", "grpcio-reflection"} <= versions.keys()
    assert len(set(versions.values())) == 1, versions


def test_the_extras_the_cli_names_are_the_ones_pyproject_declares() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert set(_pins(extras[extra])) == {_name(m) for m in modules}, extra
    # make install installs dev: it holds every other extra.
    for extra in EXTRAS:
        assert set(extras[extra]) <= set(extras["dev"]), extra
    runtime = set(_pins(PYPROJECT["project"]["dependencies"]))
    assert runtime.isdisjoint({*OPTIONAL, "py-spy"})
