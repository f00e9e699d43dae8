"""The README is part of the contract: its opening commands stay true, it links the documentation, and
the configuration reference (docs/configuration.md) lists exactly the settings the code reads."""

from __future__ import annotations

import re
from pathlib import Path

from services.common.settings_doc import drift, read_by_code

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


def test_the_configuration_reference_lists_every_setting_the_code_reads_and_no_other() -> None:
    found = drift()
    assert read_by_code(), "no settings found: the scan is broken"
    assert found.undocumented == (), "add these to docs/configuration.md"
    assert found.unread == (), "no code reads these: remove them from docs/configuration.md"
    assert found.wrong_defaults == ()


def test_a_default_the_reference_misstates_is_found(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "services" / "settings.py").write_text(
        'LEASE = env_int(env, "FATURA_LEASE_SECONDS", 30)\nKEY = env_str(env, "FATURA_KEY", "")\n'
    )
    (tmp_path / "docs" / "configuration.md").write_text(
        "| `FATURA_LEASE_SECONDS` / `FATURA_KEY` | `60` / (none) | ... |\n| `FATURA_GONE` | `1` | ... |\n"
    )
    found = drift(tmp_path)
    assert found.wrong_defaults == ("FATURA_LEASE_SECONDS: the code says 30, docs/configuration.md `60`",)
    assert found.unread == ("FATURA_GONE",)
    assert found.undocumented == ()


def test_the_readme_links_the_documentation() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link
    for page in ("architecture.md", "operations.md", "configuration.md", "benchmarks.md"):
        assert f"](docs/{page})" in readme, page
