"""What a chaos run leaves behind: a table per scenario, a summary, a JSON report, and a PNG
timeline per scenario (jobs by state over time, fault windows shaded)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from services.chaos.invariants import RECOVERY, Check
from services.chaos.observe import Sample
from services.chaos.scenarios import Mark

STATES = (
    "READY",
    "RETRY_SCHEDULED",
    "RUNNING",
    "SUCCEEDED",
    "REVIEW_REQUIRED",
    "FAILED_TERMINAL",
    "CANCELLED",
)
COLOURS = ("#9ecae1", "#fdae6b", "#3182bd", "#31a354", "#addd8e", "#de2d26", "#969696")


@dataclass
class ScenarioResult:
    name: str
    family: str
    description: str
    jobs: int
    accepted: int = 0
    refusals: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    started_at: float = 0.0
    burst_at: float | None = None
    fault_ended_at: float | None = None
    finished_at: float = 0.0
    windows: list[Mark] = field(default_factory=list)
    kills: list[tuple[float, str]] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    cleanup_problems: list[str] = field(default_factory=list)
    log_path: str = ""
    timeline_png: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok is not False for c in self.checks)

    @property
    def recovery_seconds(self) -> float | None:
        for check in self.checks:
            if check.name == RECOVERY:
                return check.count
        return None

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]


def scenario_table(result: ScenarioResult) -> Table:
    verdict = "passed" if result.ok else "FAILED"
    table = Table(
        title=f"{result.name} — {verdict}\n[dim]{result.description}[/dim]",
        title_justify="left",
        caption=_caption(result),
        caption_justify="left",
    )
    table.add_column("invariant")
    table.add_column("count", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("detail")
    for check in result.checks:
        style = {True: "green", False: "bold red", None: "yellow"}[check.ok]
        detail = check.summary + "".join(f"\n  {e}" for e in check.examples)
        count = "" if check.count is None else f"{check.count:g}"
        table.add_row(check.name, count, f"[{style}]{check.verdict}[/{style}]", detail)
    if result.error:
        table.add_row("the scenario itself", "", "[bold red]ERROR[/bold red]", result.error)
    return table


def _caption(result: ScenarioResult) -> str:
    recovery = result.recovery_seconds
    parts = [
        f"{result.accepted}/{result.jobs} jobs accepted",
        "recovery " + ("not reached" if recovery is None else f"{recovery:g} s"),
    ]
    if result.refusals:
        parts.append(f"{len(result.refusals)} submission(s) refused, first: {result.refusals[0]}")
    figures = result.figures
    if figures:
        parts.append(
            f"dead letters {figures.get('dead_letters', 0)} (in .XQ queues "
            f"{figures.get('dead_letter_queue_messages', 0)}), unpublished events "
            f"{figures.get('unpublished_events', 0)}, stale attempts {figures.get('stale_attempts', 0)}, "
            f"model calls {figures.get('provider_requests', 0)}"
        )
    if result.cleanup_problems:
        parts.append("cleanup: " + "; ".join(result.cleanup_problems))
    parts.append(f"log {result.log_path}")
    if result.timeline_png:
        parts.append(f"timeline {result.timeline_png}")
    return "\n".join(parts)


def summary_table(results: list[ScenarioResult]) -> Table:
    table = Table(title="fatura chaos run", title_justify="left")
    table.add_column("scenario", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("recovery", justify="right", no_wrap=True)
    table.add_column("failed invariants")
    for result in results:
        recovery = result.recovery_seconds
        failed = "; ".join(f"{c.name}: {c.summary}" for c in result.failures())
        if result.error:
            failed = f"error: {result.error}" + (f"; {failed}" if failed else "")
        table.add_row(
            result.name,
            "[green]passed[/green]" if result.ok else "[bold red]FAILED[/bold red]",
            "-" if recovery is None else f"{recovery:g} s",
            failed,
        )
    return table


def to_json(result: ScenarioResult) -> dict[str, Any]:
    data = asdict(result)
    data["ok"] = result.ok
    data["recovery_seconds"] = result.recovery_seconds
    data["checks"] = [{**asdict(c), "verdict": c.verdict} for c in result.checks]
    return data


def write_json(path: Path, run: dict[str, Any], results: list[ScenarioResult]) -> None:
    body = {**run, "ok": all(r.ok for r in results), "scenarios": [to_json(r) for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def plot_timeline(result: ScenarioResult, path: Path) -> None:
    """Jobs by state over time (stacked), deliveries delivered as a line, fault windows shaded,
    deliberate kills and fault-point deaths as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result.timeline
    if not samples:
        return
    zero = result.burst_at or samples[0].at
    xs = [s.at - zero for s in samples]
    figure, axes = plt.subplots(figsize=(11, 4.8), dpi=100)
    layers = [[s.states.get(state, 0) for s in samples] for state in STATES]
    axes.stackplot(xs, layers, labels=STATES, colors=COLOURS, alpha=0.9)
    delivered = [s.deliveries.get("delivered", 0) for s in samples]
    axes.plot(xs, delivered, color="black", linestyle="--", linewidth=1.2, label="delivered to the ERP")
    for mark in result.windows:
        end = max(mark.end, mark.start + 0.3)
        axes.axvspan(mark.start - zero, end - zero, color="red", alpha=0.15, zorder=0)
        axes.text(mark.start - zero, axes.get_ylim()[1] * 0.97, f" {mark.label}", color="darkred", va="top")
    for at, key in result.kills:
        axes.axvline(at - zero, color="darkred", linewidth=0.8, linestyle=":")
        axes.text(at - zero, 0, f" {key}", rotation=90, fontsize=7, color="darkred", va="bottom")
    if result.fault_ended_at is not None and result.recovery_seconds is not None:
        drained = result.fault_ended_at + result.recovery_seconds - zero
        axes.axvline(drained, color="green", linewidth=1.0)
        axes.text(drained, axes.get_ylim()[1] * 0.5, " drained", color="green")
    verdict = "passed" if result.ok else "FAILED"
    recovery = result.recovery_seconds
    axes.set_title(
        f"{result.name}: {verdict}, recovery " + ("not reached" if recovery is None else f"{recovery:g} s")
    )
    axes.set_xlabel("seconds since the burst began")
    axes.set_ylabel("jobs")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
