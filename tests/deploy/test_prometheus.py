"""The alert rules, their unit tests, their runbooks and the Grafana dashboard: promtool checks the
rules and runs deploy/prometheus/alerts_test.yaml; every series a rule or a panel reads is one the
code exports; every alert has its runbook. promtool comes from Debian's ``prometheus`` package,
which `make test` and .ci/run install when it is missing; without it the promtool tests skip."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fix_promtool import promtool_or_skip

from services.common.sli import BUCKETS

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fatura.json"
RUNBOOKS = ROOT / "docs" / "runbooks"

_DECLARED = re.compile(
    r'(Gauge|Counter|Histogram|GaugeMetricFamily|CounterMetricFamily)\(\s*"(fatura_[a-z0-9_]+)"'
)
# What PromQL reads that is not a series: functions, keywords, label names and values.
_SERIES = re.compile(r"\bfatura_[a-z0-9_]+\b")


def exported_series() -> set[str]:
    """Every series name the code can put on a /metrics page (histograms with their suffixes)."""
    names: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        if "sandbox" in path.parts:
            continue
        for kind, name in _DECLARED.findall(path.read_text(encoding="utf-8")):
            names.add(name)
            if kind == "Histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    promtool = promtool_or_skip()
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_unit_tested_and_has_a_runbook_its_annotation_names() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    tested = {case["alertname"] for group in tests for case in group.get("alert_rule_test", [])}
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    for alert in _alerts():
        name = alert["alert"]
        assert name in tested, f"{name} has no promtool unit test"
        assert alert["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
        runbook = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
        assert runbook.startswith(f"# {name}\n")
        for part in ("**Means.**", "**Confirm.**", "**Do.**"):
            assert part in runbook, f"{name}'s runbook lacks {part}"
        assert f"[{name}]({name}.md)" in index


def test_the_alerts_cover_what_the_issue_asks_for() -> None:
    names = {alert["alert"] for alert in _alerts()}
    assert names >= {
        "FaturaBacklogAgeOverSLO",
        "FaturaOutboxLag",
        "FaturaLimiterFailClosed",
        "FaturaStaleCompletionSpike",
        "FaturaDeadLetters",
        "FaturaDeliveryFailures",
        "FaturaEndpointBreakerOpen",
        "FaturaDeliveriesUnacknowledged",
    }


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_series_a_rule_or_a_panel_reads_is_exported_by_the_code(source: str) -> None:
    exprs = [a["expr"] for a in _alerts()] if source == "rules" else _dashboard_exprs()
    assert exprs
    exported = exported_series()
    for expr in exprs:
        for series in _SERIES.findall(expr):
            assert series in exported, f"{series} (in {expr!r}) is exported by no process"


def test_the_dashboard_shows_the_sli_the_review_rate_the_backlog_and_the_provider_pools() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == [
        "Completion SLI (acceptance to final state) and review",
        "Backlog",
        "Provider pools",
    ]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exprs = "\n".join(_dashboard_exprs())
    for needle in (
        'fatura_job_completion_seconds_bucket{outcome="succeeded",le="120"}',
        'outcome="review_required"',
        "fatura_scheduler_eligible_jobs",
        "fatura_scheduler_oldest_eligible_age_seconds",
        "fatura_limiter_pool_in_flight_limit",
        "fatura_provider_time_to_first_token_seconds_bucket",
        "fatura_provider_inter_token_latency_seconds_bucket",
    ):
        assert needle in exprs
    # The SLI's threshold is a bucket boundary of the histogram, so the ratio is exact.
    assert 120 in BUCKETS
