"""The processes a benchmark starts: ``fatura`` commands as children of their own process groups
(``services.common.procs``), their logs where the bench says; one that does not become ready ends
the run, naming its log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from services.common.procs import ChildProcess, NotReady, fatura_command

ROOT = Path(__file__).resolve().parents[1]


class Proc(ChildProcess):
    """A ``fatura`` child; a context manager that stops it when the block ends."""

    def wait_ready(self, url: str | None = None, timeout: float = 60.0) -> Proc:
        """Until its ``ready_url`` answers 200; one that exits first or is not ready within ``timeout``
        is stopped, and the run ends with the end of its log."""
        try:
            return super().wait_ready(url, timeout)
        except NotReady as exc:
            self.stop()
            raise SystemExit(str(exc)) from None

    def stop(self, grace: float = 20.0) -> int:
        return super().stop(grace)


def start(name: str, command: Sequence[str], log_path: Path, env: Mapping[str, str], ready_url: str) -> Proc:
    """Start ``fatura COMMAND`` with ``env`` over this process's, its output in ``log_path``; it is
    ready when ``ready_url`` answers 200."""
    return Proc.start(
        name, fatura_command(*command), env=env, log_path=log_path, cwd=ROOT, ready_url=ready_url
    )


def spawn(name: str, command: Sequence[str], log_path: Path, env: Mapping[str, str], ready_url: str) -> Proc:
    """``start``, then wait until it is ready."""
    return start(name, command, log_path, env, ready_url).wait_ready()
