"""``pip install ./sdk`` on its own: a wheel built from ``sdk/`` alone installs into a fresh virtual
environment, needs httpx and nothing of the project, and its client works there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = ("--quiet", "--no-deps", "--no-build-isolation", "--no-index")

CHECK = textwrap.dedent(
    """
    import importlib.metadata, importlib.util, sys
    import httpx
    import fatura_sdk
    from fatura_sdk import Client, agent

    assert fatura_sdk.__file__.startswith(sys.prefix), fatura_sdk.__file__
    assert importlib.util.find_spec("services") is None
    print(importlib.metadata.requires("fatura-sdk"))

    STARTED = {"job_id": "j", "state": "READY", "done": False, "message": "NOT complete", "status_url": "/j"}
    DONE = {"job_id": "j", "state": "SUCCEEDED", "done": True, "state_version": 3, "attempts": 1,
            "message": "Complete", "result": {"total": "1.00"}}

    def answer(request):
        body = STARTED if request.method == "POST" else DONE
        return httpx.Response(202 if body is STARTED else 200, json=body)

    transport = httpx.MockTransport(answer)
    with Client("http://fatura.test", "fat_x", transport=transport, sleep=lambda s: None) as c:
        print(c.start_and_await("FATURA", max_wait=5).outcome, len(agent.TOOLS))
    """
)


def test_the_sdk_installs_alone_into_a_fresh_venv_and_its_client_runs(tmp_path: Path) -> None:
    """Given a copy of sdk/ and nothing else
    When a wheel is built from it and installed into a new virtual environment without the project
    Then it declares httpx as its one dependency, imports from that environment, and awaits a job."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools (the build backend, in the dev extra) is not installed")
    source = tmp_path / "sdk"
    shutil.copytree(ROOT / "sdk", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [*pip, "wheel", *OFFLINE, "--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("fatura_sdk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"fatura_sdk/py.typed", "fatura_sdk/inbox.sql", "fatura_sdk/agent.py"} <= names

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    installed = subprocess.run(
        [*pip, "--python", str(python), "install", *OFFLINE, str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # httpx and its dependencies come from the project's environment (there is no index to fetch
    # them from here); the .pth adds that directory only after the new environment's own.
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(target, "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    ran = subprocess.run(
        [str(python), "-c", CHECK], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == ["['httpx<0.29,>=0.27']", "succeeded 3"]


def test_the_readmes_python_examples_compile_and_name_only_what_the_sdk_exports() -> None:
    readme = (ROOT / "sdk" / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) >= 8
    for block in blocks:
        tree = compile(
            block, "sdk/README.md", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fatura_sdk"):
                module = importlib.import_module(node.module)
                assert all(hasattr(module, alias.name) for alias in node.names), ast.unparse(node)
