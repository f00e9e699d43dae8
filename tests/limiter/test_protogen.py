"""The committed gRPC stubs are exactly what `make proto` generates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "services" / "common" / "protos"


def check(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.common.protogen", "--check", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_committed_stubs_match_a_fresh_generation() -> None:
    done = check(STUBS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_fails_when_a_stub_was_edited_or_left_behind(tmp_path: Path) -> None:
    """Given a copy of the stubs with one file edited by hand and one stale file
    When the check runs against the copy
    Then it fails and names both."""
    copy = tmp_path / "protos"
    shutil.copytree(STUBS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    edited = copy / "fatura" / "limiter" / "v1" / "limiter_pb2.py"
    edited.write_text(edited.read_text() + "\n# hand edit\n")
    (copy / "fatura" / "limiter" / "v1" / "old_pb2.py").write_text("# generated — do not edit\n")
    done = check(copy)
    assert done.returncode == 1
    assert "changed: fatura/limiter/v1/limiter_pb2.py" in done.stdout
    assert "stale:   fatura/limiter/v1/old_pb2.py" in done.stdout


def test_every_generated_file_says_it_is_generated() -> None:
    files = [p for p in STUBS.rglob("*") if p.suffix in {".py", ".pyi"}]
    assert files
    for path in files:
        assert path.read_text().startswith("# generated — do not edit"), path
