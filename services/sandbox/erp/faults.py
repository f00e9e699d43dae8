"""Run-time faults of the reference ERP (``POST /admin/faults``): how a broken ERP answers a webhook.

Pure state: which fault is armed and for how many more webhook requests. A faulted request is
answered by the fault alone; it is never verified, stored or applied.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

MODES = (
    "down",
    "error_500",
    "rate_limited",
    "slow",
    "unauthorized",
    "gone",
    "redirect",
    "huge_response",
    "none",
)
_FIELDS = {"mode", "count", "retry_after", "delay_s", "size_bytes", "status", "location"}
MAX_HUGE_BYTES = 256 * 1024 * 1024


class FaultSpecError(ValueError):
    """A fault request the ERP cannot arm; nothing changes."""


@dataclass(frozen=True)
class Fault:
    mode: str
    count: int | None = None  # webhook requests left; None = until cleared
    retry_after: int = 1  # rate_limited: the Retry-After header, seconds
    delay_s: float = 5.0  # slow: how long to hold the request before answering 503
    size_bytes: int = 8 * 1024 * 1024  # huge_response: body size
    status: int = 500  # huge_response: the status sent with the huge body
    location: str = "/redirected"  # redirect: where the 307 points


def parse_fault(body: Any) -> Fault:
    if not isinstance(body, dict):
        raise FaultSpecError("the body must be a JSON object")
    unknown = set(body) - _FIELDS
    if unknown:
        raise FaultSpecError(f"unknown fields: {sorted(unknown)}")
    mode = body.get("mode")
    if mode not in MODES:
        raise FaultSpecError(f"mode must be one of {list(MODES)}")
    fault = Fault(mode=mode)
    count = body.get("count")
    if count is not None:
        fault = replace(fault, count=_int(count, "count", 1, 1_000_000))
    if "retry_after" in body:
        fault = replace(fault, retry_after=_int(body["retry_after"], "retry_after", 0, 86_400))
    if "delay_s" in body:
        fault = replace(fault, delay_s=_number(body["delay_s"], "delay_s", 0.0, 600.0))
    if "size_bytes" in body:
        fault = replace(fault, size_bytes=_int(body["size_bytes"], "size_bytes", 1, MAX_HUGE_BYTES))
    if "status" in body:
        fault = replace(fault, status=_int(body["status"], "status", 200, 599))
    if "location" in body:
        location = body["location"]
        if not isinstance(location, str) or not location or any(c in location for c in "\r\n"):
            raise FaultSpecError("location must be a URL or path on one line")
        fault = replace(fault, location=location)
    return fault


class Faults:
    """The armed fault. Used from the event loop only, so taking one needs no lock."""

    def __init__(self) -> None:
        self._fault: Fault | None = None

    def arm(self, fault: Fault) -> None:
        self._fault = None if fault.mode == "none" else fault

    def clear(self) -> None:
        self._fault = None

    def take(self) -> Fault | None:
        """The fault for this webhook request, counting it down; None when the ERP behaves."""
        fault = self._fault
        if fault is None:
            return None
        if fault.count is not None:
            left = fault.count - 1
            self._fault = replace(fault, count=left) if left > 0 else None
        return fault

    def snapshot(self) -> dict[str, Any] | None:
        return None if self._fault is None else asdict(self._fault)


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise FaultSpecError(f"{name} must be an integer in [{lo}, {hi}]")
    return value


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
        raise FaultSpecError(f"{name} must be a number in [{lo}, {hi}]")
    return float(value)
