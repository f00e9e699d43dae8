"""Request validation and error mapping, without Redis: a bad request never reaches a script."""

from __future__ import annotations

import grpc
import pytest

from services.limiter import client as client_module
from services.limiter import errors
from services.limiter.config import parse_config
from services.limiter.errors import InvalidArgument, LimiterError, UnknownPool
from services.limiter.ids import parse_permit_id, permit_id_for
from services.limiter.model import AcquireRequest, Outcome
from services.limiter.operations import KeyLayout, LimiterOps, ServerLimits
from services.limiter.servicer import STATUS_BY_ERROR, status_for

CONFIG = parse_config("[pools.p]\nrpm = 10\ntpm = 10000\nmax_in_flight = 4\n")
OPS = LimiterOps(lambda: CONFIG, ServerLimits(max_lease_ms=60_000, max_tokens=50_000), KeyLayout("t"))


def request(**changes: object) -> AcquireRequest:
    fields: dict[str, object] = {
        "pool": "p",
        "tenant": "acme",
        "estimated_input_tokens": 100,
        "max_output_tokens": 100,
        "lease_ms": 0,
        "request_key": "k1",
    }
    fields.update(changes)
    return AcquireRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"pool": ""}, InvalidArgument, "pool must not be empty"),
        ({"pool": "nope"}, UnknownPool, "unknown pool 'nope'"),
        ({"tenant": ""}, InvalidArgument, "tenant must not be empty"),
        ({"tenant": "a/b"}, InvalidArgument, "tenant 'a/b' must match"),
        ({"request_key": ""}, InvalidArgument, "request_key must not be empty"),
        ({"request_key": "x" * 201}, InvalidArgument, "request_key is longer"),
        ({"estimated_input_tokens": -1}, InvalidArgument, "estimated_input_tokens=-1 must not be negative"),
        ({"max_output_tokens": 10**15}, InvalidArgument, "over the maximum of 50000 tokens"),
        (
            {"estimated_input_tokens": 9_000, "max_output_tokens": 2_000},
            InvalidArgument,
            "can never fit pool 'p'",
        ),
        ({"lease_ms": -5}, InvalidArgument, "lease_ms=-5 must not be negative"),
        ({"lease_ms": 60_001}, InvalidArgument, "over the maximum lease of 60000 ms"),
    ],
)
def test_bad_acquire_requests_are_refused_before_any_script_runs(
    changes: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        OPS.acquire(request(**changes))


def test_a_valid_acquire_touches_only_keys_of_its_pools_hash_tag() -> None:
    """Every key carries {pool}: one Redis Cluster slot per script call."""
    op = OPS.acquire(request())
    assert op.script == "acquire"
    assert all(b"{p}" in key for key in op.keys)  # as Redis receives them
    assert op.args[0] == permit_id_for("p", "acme", "k1").encode()
    assert op.args[2] == b"%d" % ServerLimits().default_lease_ms  # lease 0 means the default


def test_other_operations_validate_their_input() -> None:
    with pytest.raises(InvalidArgument, match="malformed permit_id"):
        OPS.release("not-a-permit", Outcome.COMPLETED, 1, 1)
    with pytest.raises(InvalidArgument, match="input_tokens=-3"):
        OPS.release(permit_id_for("p", "acme", "k"), Outcome.COMPLETED, -3, 1)
    with pytest.raises(InvalidArgument, match="over the maximum lease"):
        OPS.renew(permit_id_for("p", "acme", "k"), 10**9)
    with pytest.raises(InvalidArgument, match="retry_after_ms=0 must be positive"):
        OPS.report_throttle("p", 0)
    with pytest.raises(InvalidArgument, match="over the maximum cooldown"):
        OPS.report_throttle("p", 10**10)
    with pytest.raises(UnknownPool):
        OPS.pool_status("nope")


def test_permit_ids_round_trip_and_differ_per_request_key() -> None:
    permit = permit_id_for("p", "acme", "key-1")
    assert parse_permit_id(permit)[:2] == ("p", "acme")
    assert permit != permit_id_for("p", "acme", "key-2")
    assert permit == permit_id_for("p", "acme", "key-1")


def test_every_limiter_error_has_a_grpc_status_and_the_client_maps_it_back() -> None:
    """The servicer's error -> status table covers every error class, and for each status the
    client maps it back to the same kind of error (or to LimiterUnavailable for UNAVAILABLE)."""
    classes = {
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, LimiterError) and obj is not LimiterError
    }
    assert classes <= set(STATUS_BY_ERROR)
    for cls in classes:
        code = status_for(cls("x"))
        back = client_module.ERROR_BY_STATUS.get(code, errors.BackendError)
        assert (
            issubclass(cls, back) or back is errors.LimiterUnavailable or code is grpc.StatusCode.INTERNAL
        ), cls
