"""Runs chaos scenarios one after another, each on a fresh private stack, with a live view, and
writes the report. The exit status is non-zero when any invariant of any scenario failed."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from services.chaos.environment import ChaosStack, wait_until
from services.chaos.invariants import check_all
from services.chaos.observe import Observer, gather
from services.chaos.proxy import ProxyThread
from services.chaos.report import ScenarioResult, plot_timeline, scenario_table, summary_table, write_json
from services.chaos.scenarios import Context, Scenario
from services.chaos.settings import ChaosSettings
from services.cli.stack import describe_exit

log = logging.getLogger(__name__)


class ScenarioError(RuntimeError):
    """The scenario could not be run as designed (for example, its stack never became ready)."""


@dataclass
class View:
    """What the live display shows, updated by the runner as it goes."""

    index: int = 0
    total: int = 0
    scenario: str = ""
    phase: str = ""
    phase_since: float = 0.0
    context: Context | None = None
    observer: Observer | None = None
    stack: ChaosStack | None = None


class Runner:
    def __init__(self, settings: ChaosSettings, jobs: int, report_dir: Path, console: Console) -> None:
        self.settings = settings
        self.jobs = jobs
        self.report_dir = report_dir
        self.console = console
        self.view = View()
        self.run_id = uuid.uuid4().hex[:8]
        self.results: list[ScenarioResult] = []

    def run(self, scenarios: list[Scenario]) -> int:
        self.view.total = len(scenarios)
        started = time.time()
        proxies = ProxyThread()
        live = Live(get_renderable=self._render, console=self.console, refresh_per_second=2, transient=True)
        try:
            with live if self.console.is_terminal else _Quiet():
                for index, scenario in enumerate(scenarios, start=1):
                    self.view.index, self.view.scenario = index, scenario.name
                    result = self._run_one(scenario, proxies)
                    self.results.append(result)
                    self._write(started)
                    self.console.print(scenario_table(result))
        finally:
            proxies.close()
            self._write(started)
        self.console.print(summary_table(self.results))
        self.console.print(f"Report: {self.report_dir / 'report.json'}")
        return 0 if self.results and all(r.ok for r in self.results) else 1

    def _write(self, started: float) -> None:
        run = {
            "run_id": self.run_id,
            "started_at": started,
            "finished_at": time.time(),
            "jobs_per_burst": self.jobs,
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "common"},
        }
        write_json(self.report_dir / "report.json", run, self.results)

    def _phase(self, text: str) -> None:
        self.view.phase, self.view.phase_since = text, time.monotonic()
        if not self.console.is_terminal:
            self.console.print(f"[{self.view.scenario}] {text}", markup=False, highlight=False)

    # ------------------------------------------------------------ one scenario

    def _run_one(self, scenario: Scenario, proxies: ProxyThread) -> ScenarioResult:
        log_path = self.report_dir / "logs" / f"{scenario.name}.log"
        result = ScenarioResult(
            scenario.name, scenario.family, scenario.description, self.jobs, log_path=str(log_path)
        )
        result.started_at = time.time()
        stack = ChaosStack(self.settings, f"{self.run_id}-{scenario.name}", log_path, proxies)
        self.view.stack, self.view.observer, self.view.context = stack, None, None
        observer: Observer | None = None
        context: Context | None = None
        try:
            self._phase("starting its stack (database, proxies, processes)")
            missing = stack.start()
            if missing:
                within = f"{self.settings.start_seconds:g} s"
                raise ScenarioError(f"not ready within {within}: {', '.join(missing)}")
            stack.setup_tenant()
            observer = Observer(stack, self.settings.sample_seconds)
            observer.start()
            context = Context(stack, observer)
            self.view.observer, self.view.context = observer, context
            self._phase("preparing the fault")
            scenario.prepare(context)
            self._phase(f"submitting {self.jobs} sample invoices")
            result.burst_at = time.time()
            accepted, result.refusals = stack.submit(self.jobs)
            result.accepted = len(accepted)
            observer.expect(accepted)
            self._phase("fault")
            scenario.inject(context)
            fault_end = context.fault_ended_at or time.time()
            result.fault_ended_at = fault_end
            self._phase("draining the backlog")
            wait_until(
                lambda: observer is not None and observer.progress.drained_at is not None,
                max(0.0, fault_end + self.settings.drain_seconds - time.time()),
                step=0.5,
            )
            self._phase("checking the invariants")
            assert stack.stack is not None
            exits = [
                f"{r.key} exited with code {describe_exit(r.exit_code)} after {r.uptime_seconds:.1f} s"
                for r in stack.stack.unexpected_restarts()
            ]
            cap = self.settings.pool_max_in_flight
            facts, result.figures = gather(stack, observer, cap, exits, fault_end)
            result.checks = check_all(facts) + context.checks
        except ScenarioError as exc:
            result.error = str(exc)
        except Exception as exc:  # a broken run is reported as such, and the next scenario still runs
            log.exception("scenario %s could not run", scenario.name)
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._phase("cleaning up (processes, database, queues, Redis keys)")
            if observer is not None:
                observer.stop()
                result.timeline = observer.progress.samples
            if context is not None:
                result.windows, result.kills = context.windows, context.kills
            if stack.stack is not None:
                result.restarts = [asdict(r) for r in stack.stack.restarts]
            result.cleanup_problems = stack.close()
            result.finished_at = time.time()
            self.view.stack = self.view.observer = self.view.context = None
        png = self.report_dir / f"{scenario.name}.png"
        try:
            plot_timeline(result, png)
            result.timeline_png = str(png) if png.exists() else ""
        except (OSError, ValueError) as exc:
            log.warning("no timeline for %s: %s", scenario.name, exc)
        return result

    # ------------------------------------------------------------ the live view

    def _render(self) -> Group:
        view = self.view
        title = Text.assemble(
            (f"chaos {view.index}/{view.total} ", "bold"),
            (view.scenario, "bold cyan"),
            f"  {view.phase} ({time.monotonic() - view.phase_since:.0f} s)",
        )
        parts: list[Text | Table] = [title]
        if view.context is not None and view.context.status:
            parts.append(Text(f"fault: {view.context.status}", style="red"))
        latest = view.observer.progress.latest if view.observer is not None else None
        if latest is not None:
            table = Table(box=None, pad_edge=False)
            states = dict(sorted(latest.states.items()))
            for name in [*states, "delivered"]:
                table.add_column(name, justify="right")
            table.add_row(*[str(n) for n in states.values()], str(latest.deliveries.get("delivered", 0)))
            parts.append(table)
        if view.stack is not None and view.stack.stack is not None:
            restarts = view.stack.stack.restarts
            if restarts:
                parts.append(Text(f"restarts: {', '.join(r.key for r in restarts)}", style="yellow"))
        return Group(*parts)


class _Quiet:
    """Stands in for the live view when the output is not a terminal: phases are printed instead."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
