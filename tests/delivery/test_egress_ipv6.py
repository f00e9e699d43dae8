"""The egress guard and IPv6 (DESIGN §5.10): only global unicast, and the IPv4 address an IPv6
address carries (compatible, mapped, SIIT, NAT64, 6to4, Teredo) is checked like any IPv4 address,
also against FATURA_EGRESS_ALLOW; a refusal names no address (no server, no database)."""

from __future__ import annotations

import ipaddress
import logging

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from services.delivery.egress import EgressGuard, Resolver, parse_allow
from services.delivery.errors import EgressRefused


def _url(ip: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"https://{host}/hook"


def _refused(ip: str, allow: tuple[str, ...] = ()) -> bool:
    try:
        EgressGuard(parse_allow(allow)).vet(_url(ip))
    except EgressRefused:
        return True
    return False


# Each of these passed the guard before it allowed only global unicast and decoded every encoding.
ONCE_ADMITTED = [
    "::127.0.0.1",  # IPv4-compatible loopback, the https://[::127.0.0.1]/
    "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
    "::ffff:0:a00:1",  # SIIT (IPv4-translated) 10.0.0.1, from the issue
    "::ffff:0:7f00:1",  # SIIT 127.0.0.1
    "fec0::1",  # site-local fec0::/10, from the issue
    "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",  # the top of fec0::/10
    "::ffff:8.8.8.8",  # mapped, public: still not global unicast
    "64:ff9b:1::808:808",  # NAT64 local-use prefix: the site decides where the IPv4 address sits
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",  # SRv6 SIDs
    "4000::1",  # unassigned, outside 2000::/3
    "e000::1",
    "192.88.99.1",  # IPv4: 6to4 relay anycast
    "192.0.0.9",  # IPv4: IETF protocol assignments
]


@pytest.mark.parametrize("ip", ONCE_ADMITTED)
def test_an_address_outside_public_unicast_is_refused(ip: str) -> None:
    assert _refused(ip)


def test_a_public_ipv4_is_reached_only_through_encodings_that_route_to_it() -> None:
    expected = {
        "2001:4860:4860::8888": False,  # global unicast
        "2002:808:808::1": False,  # 6to4 of 8.8.8.8
        "64:ff9b::808:808": False,  # NAT64 well-known prefix, 8.8.8.8: a DNS64 network's answer
        "::8.8.8.8": True,  # IPv4-compatible: deprecated, not global unicast
        "::ffff:8.8.8.8": True,  # mapped
        "::ffff:0:808:808": True,  # SIIT
        "2001:0:4136:e378:8000:63bf:3fff:fdd2": True,  # Teredo (RFC 4380's example), in 2001::/23
    }
    assert {ip: _refused(ip) for ip in expected} == expected


def test_an_allow_listed_ipv6_network_does_not_admit_the_ipv4_an_address_carries() -> None:
    # Given local runs that list ::1 (or, carelessly, all of IPv6)
    for allow in (("::1/128",), ("::/0",), ("::/96", "::ffff:0:0/96")):
        # Then an IPv4 loopback wrapped in IPv6 is still refused
        for ip in ("::127.0.0.1", "::ffff:127.0.0.1", "::ffff:0:7f00:1", "2002:7f00:1::1", "64:ff9b::7f00:1"):
            assert _refused(ip, allow), (ip, allow)
    # And ::1 itself is reachable, as the allow list says
    assert not _refused("::1", ("::1/128",))
    # While listing the IPv4 network admits every wrapping of it
    for ip in ("::127.0.0.1", "::ffff:127.0.0.1", "::ffff:0:7f00:1", "2002:7f00:1::1", "64:ff9b::7f00:1"):
        assert not _refused(ip, ("127.0.0.0/8",)), ip


def test_a_refusal_names_no_address_and_the_log_names_it(caplog: pytest.LogCaptureFixture) -> None:
    guard = EgressGuard((), resolver=_answers("2001:4860:4860::8888", "::ffff:0:a00:1"))
    with caplog.at_level(logging.WARNING, logger="services.delivery.egress"):
        with pytest.raises(EgressRefused) as refused:
            guard.vet("https://erp.example/hook")
    message = refused.value.message
    assert "10.0.0.1" not in message and "a00:1" not in message and "private" not in message
    assert "not a public address" in message
    assert "erp.example" in caplog.text and "10.0.0.1" in caplog.text and "private" in caplog.text


def _answers(*addresses: str) -> Resolver:
    return lambda host, port: list(addresses)


def test_every_refused_address_gets_the_same_words() -> None:
    messages = set()
    for ip in ("10.0.0.1", "::127.0.0.1", "fec0::1", "2001:db8::1", "169.254.169.254"):
        with pytest.raises(EgressRefused) as refused:
            EgressGuard((), resolver=_answers(ip)).vet("https://erp.example/hook")
        messages.add(refused.value.message)
    assert len(messages) == 1


# The property: an IPv6 address carrying a non-public IPv4 address, by any encoding, is refused.
NON_PUBLIC_V4 = [
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "169.254.169.254/32",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "255.255.255.255/32",
    )
]


ENCODINGS = ["compatible", "mapped", "siit", "nat64", "6to4", "teredo-client", "teredo-server"]


@st.composite
def non_public_v4(draw: st.DrawFn) -> ipaddress.IPv4Address:
    network = draw(st.sampled_from(NON_PUBLIC_V4))
    return network[draw(st.integers(0, network.num_addresses - 1))]


def _wrap(encoding: str, inner: int, other: int, bits: int) -> int:
    """An IPv6 address (as an integer) carrying ``inner``; ``other`` and ``bits`` fill the rest."""
    if encoding == "compatible":
        return inner
    if encoding == "mapped":
        return 0xFFFF << 32 | inner
    if encoding == "siit":
        return 0xFFFF << 48 | inner
    if encoding == "nat64":
        return 0x64FF9B << 96 | inner
    if encoding == "6to4":
        return 0x2002 << 112 | inner << 80 | bits & (1 << 80) - 1
    # Teredo: prefix, server, flags and port, then the client inverted; the other one is random
    flags_port = bits & 0xFFFFFFFF
    if encoding == "teredo-client":
        return 0x20010000 << 96 | other << 64 | flags_port << 32 | (~inner & 0xFFFFFFFF)
    return 0x20010000 << 96 | inner << 64 | flags_port << 32 | (~other & 0xFFFFFFFF)


@given(
    encoding=st.sampled_from(
        ["compatible", "mapped", "siit", "nat64", "6to4", "teredo-client", "teredo-server"]
    ),
    inner=non_public_v4(),
    other=st.integers(0, 2**32 - 1),
    bits=st.integers(0, 2**80 - 1),
)
def test_an_ipv6_address_carrying_a_non_public_ipv4_is_refused_unless_that_ipv4_is_listed(
    encoding: str, inner: ipaddress.IPv4Address, other: int, bits: int
) -> None:
    assume(not (encoding == "compatible" and int(inner) <= 1))  # :: and ::1 carry no IPv4 address
    ip = str(ipaddress.IPv6Address(_wrap(encoding, int(inner), other, bits)))
    # Refused with no allow list, and with one that lists every IPv6 address but not the IPv4 one
    assert _refused(ip), ip
    assert _refused(ip, ("::/0", "::1/128")), ip
    # Admitted once the IPv4 addresses it carries are listed
    listed = (f"{inner}/32", f"{ipaddress.IPv4Address(other)}/32")
    assert not _refused(ip, listed), ip
