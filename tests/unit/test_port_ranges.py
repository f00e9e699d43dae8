"""Each pytest process of ``make test`` hands out ports from a range of its own (tests/fix_ports.py),
even though the xdist workers inherit the controller's environment."""

from __future__ import annotations

from fix_ports import claim_port_range


def test_a_worker_takes_its_own_range_over_the_one_it_inherited_from_the_controller() -> None:
    # Given the controller, which has no worker id, taking the first range for itself
    controller: dict[str, str] = {}
    assert claim_port_range(controller) == "20000-21999"
    # When its two workers start with a copy of its environment
    ranges = [claim_port_range({**controller, "PYTEST_XDIST_WORKER": w}) for w in ("gw0", "gw1")]
    # Then each has its own range
    assert ranges == ["20000-21999", "22000-23999"]


def test_a_run_without_xdist_keeps_a_range_given_in_its_environment() -> None:
    assert claim_port_range({"FATURA_PORT_RANGE": "30000-30999"}) == "30000-30999"
