"""The egress guard (DESIGN §5.10): which URLs a webhook may target and which addresses it may reach.

A URL is checked as text (scheme, credentials, host, port), its host resolved once, and every
address checked: only public unicast may be reached (IPv6: global unicast 2000::/3 less its special
ranges), and the IPv4 address an IPv6 address carries (compatible, mapped, SIIT, NAT64, 6to4,
Teredo) is checked like any IPv4 address, unless ``FATURA_EGRESS_ALLOW`` names it. A refusal
tells the client no address; the log says which and why. The sender then connects to a vetted
address, so a second DNS answer cannot rebind the connection. Plain HTTP only to allow-listed targets.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import SplitResult, urlsplit

from services.delivery.errors import EgressRefused, InvalidEndpoint

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

MAX_URL_LENGTH = 2048
_HOST_NAME = re.compile(r"[a-z0-9_.-]+")
# The same words whatever was refused: no address, range or host from our side of the wire.
REFUSED_MESSAGE = (
    "the url's host is not a public address webhooks may reach "
    "(only public unicast addresses; FATURA_EGRESS_ALLOW lists exceptions)"
)


class HostNotResolved(EgressRefused):
    """The host name did not resolve (no such name, or DNS unreachable): may work later."""


@dataclass(frozen=True)
class Target:
    """A URL that passed the text checks: what to connect to and what to say in Host/SNI."""

    url: str
    scheme: str
    host: str  # lower-case, without brackets; an internationalised name in its ASCII (IDNA) form
    port: int
    path: str  # path and query, never empty

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port == default else f"{shown}:{self.port}"


def parse_allow(raw: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs of ``FATURA_EGRESS_ALLOW``; raises ValueError naming a bad one."""
    networks: list[IPNetwork] = []
    for item in raw:
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP network (CIDR)") from None
    return tuple(networks)


def parse_url(url: str) -> Target:
    """Check a URL as text; raises InvalidEndpoint with the reason."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise InvalidEndpoint(f"the url must be a string of 1 to {MAX_URL_LENGTH} characters")
    return _parse_url(url)


# A worker sends to the same few endpoints all day: each URL is parsed once. Bounded, so a stream of
# distinct URLs only evicts; a refused URL raises and is not remembered.
@lru_cache(maxsize=1024)
def _parse_url(url: str) -> Target:
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise InvalidEndpoint("the url must not contain spaces or control characters")
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidEndpoint(f"the url is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidEndpoint("the url must use https (or http to an allow-listed local target)")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise InvalidEndpoint("the url must not contain credentials; the signature authenticates us")
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidEndpoint("the url has no host")
    host = _ascii_host(host)
    if parts.fragment:
        raise InvalidEndpoint("the url must not have a fragment")
    if port == 0:
        raise InvalidEndpoint("the url's port must be 1-65535")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def _ascii_host(host: str) -> str:
    """An IP literal as is; a host name as DNS, the Host header and TLS SNI carry it (IDNA A-labels).

    Done here, once, so that a name that cannot be encoded (a label over 63 characters, an empty
    label, a character IDNA prohibits) is a malformed URL rather than an error deep in a socket call.
    """
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        # The codec getaddrinfo() and ssl apply to a str host themselves (IDNA 2003).
        encoded = host.encode("idna").decode("ascii").lower()
    except UnicodeError as exc:
        raise InvalidEndpoint(f"the url's host {host!r} is not a valid host name: {exc}") from None
    if not _HOST_NAME.fullmatch(encoded):
        raise InvalidEndpoint(f"the url's host {host!r} has characters a host name cannot have")
    return encoded


# Address rules. A webhook may reach a public unicast address and nothing else: what follows is
# decided here, not left to the running Python's ``ipaddress`` (its ``is_global`` has changed
# between releases), which is only consulted as a last, stricter word.
_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Not public, by the IANA IPv4 special-purpose registry (and multicast, reserved, broadcast).
_IPV4_NOT_PUBLIC: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata at 169.254.169.254)"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved or broadcast"),
)

# IPv6: global unicast only, less the special ranges inside it that are not public. The whole of
# 2001::/23 (IETF protocol assignments: Teredo, benchmarking 2001:2::/48, AMT, AS112, ORCHID and
# ORCHIDv2, DRIP, the PCP and TURN anycast addresses) is refused: none of it is an ERP's address.
_GLOBAL_UNICAST = _V6("2000::/3")
_IPV6_NOT_PUBLIC: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("2001::/23"), "reserved for IETF protocols (2001::/23: Teredo, benchmarking, ORCHIDv2, ...)"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("3fff::/20"), "documentation"),
)

# Encodings that carry an IPv4 address in the low 32 bits.
_COMPATIBLE = _V6("::/96")  # IPv4-compatible (deprecated); :: and ::1 are not in this sense
_MAPPED = _V6("::ffff:0:0/96")
_TRANSLATED = _V6("::ffff:0:0:0/96")  # SIIT (RFC 7915)
# NAT64's well-known prefix (RFC 6052) is accepted when the IPv4 address it carries is public: a
# deployment on an IPv6-only network reaches IPv4-only ERPs through DNS64 answers in this prefix,
# the translator is what connects to the IPv4 address, and RFC 6052 forbids the prefix for
# non-global IPv4 anyway. The local-use prefix 64:ff9b:1::/48 (RFC 8215) places the IPv4 address
# where the site decides, so it is not decoded; it lies outside 2000::/3 and is refused.
_NAT64 = _V6("64:ff9b::/96")
_6TO4 = _V6("2002::/16")  # the IPv4 address in bits 16-48; admitted when that address is public
_TEREDO = _V6("2001::/32")  # server IPv4 in bits 32-64, client IPv4 inverted in the last 32
_LOW32 = 0xFFFFFFFF


def embedded_ipv4s(ip: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """Every IPv4 address an IPv6 address carries (compatible, mapped, SIIT, NAT64, 6to4, Teredo)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ()
    value = int(ip)
    low = ipaddress.IPv4Address(value & _LOW32)
    if ip in _COMPATIBLE:
        return () if value <= 1 else (low,)  # :: (unspecified) and ::1 (loopback) are themselves
    if ip in _MAPPED or ip in _TRANSLATED or ip in _NAT64:
        return (low,)
    if ip in _6TO4:
        return (ipaddress.IPv4Address((value >> 80) & _LOW32),)
    if ip in _TEREDO:
        server = ipaddress.IPv4Address((value >> 64) & _LOW32)
        return (server, ipaddress.IPv4Address(~value & _LOW32))
    return ()


def _allowed(ip: IPAddress, allow: Sequence[IPNetwork]) -> bool:
    return any(ip.version == net.version and ip in net for net in allow)


def allow_listed(ip: IPAddress, allow: Sequence[IPNetwork]) -> bool:
    """Whether ``FATURA_EGRESS_ALLOW`` lets ``ip`` through whatever it is.

    An address that carries IPv4 is judged by what it carries: every embedded IPv4 address must be
    listed. An IPv6 network on the list (``::1/128``, even ``::/0``) never admits
    ``::ffff:127.0.0.1`` or ``::127.0.0.1``; ``127.0.0.0/8`` does.
    """
    inner = embedded_ipv4s(ip)
    if inner:
        return all(_allowed(v4, allow) for v4 in inner)
    return _allowed(ip, allow)


def _ipv4_problem(ip: ipaddress.IPv4Address) -> str | None:
    for network, label in _IPV4_NOT_PUBLIC:
        if ip in network:
            return label
    return None if ip.is_global else "not globally reachable"


def _ipv6_problem(ip: ipaddress.IPv6Address) -> str | None:
    if ip not in _GLOBAL_UNICAST:
        return "outside global unicast (2000::/3)"
    for network, label in _IPV6_NOT_PUBLIC:
        if ip in network:
            return label
    return None if ip.is_global else "not globally reachable"


def address_problem(ip: IPAddress, allow: Sequence[IPNetwork]) -> str | None:
    """Why ``ip`` may not be reached, or None when it may.

    The reason names addresses and ranges: it is for the server's log, never for the client.
    """
    if allow_listed(ip, allow):
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        problem = _ipv4_problem(ip)
        return None if problem is None else f"{ip} is {problem}"
    for v4 in embedded_ipv4s(ip):
        problem = None if _allowed(v4, allow) else _ipv4_problem(v4)
        if problem is not None:
            return f"{ip} carries {v4}, which is {problem}"
    if ip in _NAT64 or ip in _6TO4:
        # Both route to the public IPv4 address they carry (see _NAT64); decided here because
        # newer Pythons count 2002::/16 as not global, and the answer must not depend on that.
        return None
    problem = _ipv6_problem(ip)
    return None if problem is None else f"{ip} is {problem}"


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Vetted:
    target: Target
    address: IPAddress  # the one to connect to
    allow_listed: bool


class EgressGuard:
    def __init__(self, allow: Sequence[IPNetwork], resolver: Resolver = system_resolver) -> None:
        self.allow = tuple(allow)
        self.resolver = resolver

    def vet(self, url: str) -> Vetted:
        """Resolve once and check every address; raises InvalidEndpoint or EgressRefused
        (HostNotResolved when the lookup itself failed)."""
        target = parse_url(url)
        try:
            literal: IPAddress | None = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            try:
                raw = self.resolver(target.host, target.port)
            except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
                raise HostNotResolved(f"the host {target.host!r} does not resolve: {exc}") from None
            addresses = []
            for text in raw:
                try:
                    addresses.append(ipaddress.ip_address(text.split("%", 1)[0]))
                except ValueError:
                    log.warning("egress refused: %r resolved to %r, not an address", target.host, text)
                    raise EgressRefused(f"{target.host!r} did not resolve to an IP address") from None
            if not addresses:
                raise HostNotResolved(f"the host {target.host!r} resolved to no address")
        # Every address must pass: DNS may hand out any of them, and one bad one is enough to probe.
        verdicts = [_screen(ip, self.allow) for ip in addresses]
        for problem, _ in verdicts:
            if problem is not None:
                # Which address, and why, stays in our log: a client must not map our network.
                log.warning("egress refused: %r: %s", target.host, problem)
                raise EgressRefused(REFUSED_MESSAGE)
        allow_listed_all = all(listed for _, listed in verdicts)
        if target.scheme != "https" and not allow_listed_all:
            raise EgressRefused("plain http is allowed only to targets FATURA_EGRESS_ALLOW lists; use https")
        return Vetted(target, addresses[0], allow_listed_all)


@lru_cache(maxsize=1024)
def _screen(ip: IPAddress, allow: tuple[IPNetwork, ...]) -> tuple[str | None, bool]:
    """``address_problem`` and ``allow_listed`` of one address, remembered: the host is resolved at
    every attempt (a new DNS answer is checked), but the same address is judged once."""
    return address_problem(ip, allow), allow_listed(ip, allow)
