"""The sender against a receiver in the test process: it connects to the vetted address while the
Host header keeps the registered name, and refuses what the guard refuses without connecting."""

from __future__ import annotations

import httpx
import pytest

from fix_delivery import Receiver
from services.delivery import sender as sender_module
from services.delivery.egress import EgressGuard, parse_allow
from services.delivery.sender import Sender, SendLimits


def test_the_post_goes_to_the_vetted_address_with_the_registered_host_name(receiver: Receiver) -> None:
    port = receiver.url.split(":")[2].split("/")[0]
    resolved: list[str] = []

    def resolver(host: str, p: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"]), resolver), SendLimits())
    result = sender.post(f"http://erp.test:{port}/hooks?x=1", {"content-type": "application/json"}, b"{}")
    sender.close()
    assert result.status == 200 and resolved == ["erp.test"]
    assert receiver.received[0].headers["host"] == f"erp.test:{port}"
    assert receiver.received[0].body == b"{}"


def test_a_refused_target_is_never_contacted(receiver: Receiver) -> None:
    sender = Sender(EgressGuard(()), SendLimits())
    result = sender.post(receiver.url, {}, b"{}")
    assert result.status is None and result.refused and result.error_class == "egress_refused"
    assert receiver.received == []


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (httpx.ConnectTimeout("x"), "connect_timeout"),
        (httpx.ReadTimeout("x"), "read_timeout"),
        (httpx.WriteTimeout("x"), "read_timeout"),
        (httpx.PoolTimeout("x"), "read_timeout"),
        (httpx.ConnectError("x"), "connect_error"),
        (httpx.RemoteProtocolError("x"), "protocol_error"),
        (httpx.ReadError("x"), "network_error"),
        (httpx.WriteError("x"), "network_error"),
    ],
)
def test_transport_errors_get_names_an_operator_can_act_on(exc: Exception, name: str) -> None:
    assert sender_module._error_class(exc) == name
