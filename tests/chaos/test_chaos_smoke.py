"""``fatura chaos run --scenario smoke``, as CI runs it: a killed worker and 8 s cuts of PostgreSQL,
RabbitMQ and Redis during small bursts, each on a private stack. Every invariant must hold, and
the exit status must say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fix_processes import ROOT
from services.chaos.invariants import RECOVERY
from services.chaos.scenarios import SMOKE

pytestmark = pytest.mark.chaos

INVARIANTS = {
    "jobs end in the state their sample is built for",
    "no job lost",
    "no stale attempt overwrote a job",
    "the ERP applied each final state exactly once, and no job awaiting review",
    "no model call caused by delivery",
    "limiter peak in-flight within the cap",
    "no process exited on its own",
    RECOVERY,
}


@pytest.mark.timeout(1200)
def test_the_smoke_scenarios_keep_every_invariant(tmp_path: Path) -> None:
    # Given the smoke subset: one fault point and an 8 s cut of each dependency
    env = {**os.environ, "FATURA_CHAOS_DRAIN_SECONDS": "90", "PYTHONUNBUFFERED": "1"}
    # When the SRE's command runs it
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "chaos",
            "run",
            "--scenario",
            "smoke",
            "--report",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1150,
    )
    output = done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    scenarios = {s["name"]: s for s in report["scenarios"]}
    # Then every scenario ran, with its timeline, and was judged on every invariant
    assert list(scenarios) == list(SMOKE), output
    for name, scenario in scenarios.items():
        assert scenario["error"] is None, f"{name}: {scenario['error']}\n{output}"
        assert INVARIANTS <= {c["name"] for c in scenario["checks"]}, name
        assert any(c["name"].startswith("fault exercised") and c["ok"] for c in scenario["checks"]), name
        assert (tmp_path / f"{name}.png").exists()
        assert scenario["accepted"] == scenario["jobs"] == 20
    # And the exit status is the verdict: every invariant held
    failed = {
        name: [f"{c['name']}: {c['summary']} {c['examples']}" for c in s["checks"] if c["ok"] is False]
        for name, s in scenarios.items()
    }
    assert (done.returncode == 0) == report["ok"]
    assert done.returncode == 0, json.dumps(failed, indent=2) + "\n" + output[-4000:]
