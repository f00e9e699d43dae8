"""The egress guard (DESIGN §5.10): which URLs a webhook may target and which addresses it may reach.

A URL is checked as text (scheme, credentials, host, port), its host resolved once, and every
address checked: loopback, private, link-local, CGNAT, ULA, multicast, unspecified, reserved and
metadata addresses are refused, also when they hide inside IPv6 (mapped, 6to4, NAT64, Teredo),
unless ``FATURA_EGRESS_ALLOW`` names them. The sender then connects to a vetted address, so a
second DNS answer cannot rebind the connection elsewhere. Plain HTTP only to allow-listed targets.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from services.delivery.errors import EgressRefused, InvalidEndpoint

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

MAX_URL_LENGTH = 2048
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_HOST_NAME = re.compile(r"[a-z0-9_.-]+")


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


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo client, NAT64), if any."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or ip in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _allowed(ip: IPAddress, allow: Sequence[IPNetwork]) -> bool:
    return any(ip.version == net.version and ip in net for net in allow)


def _public(ip: IPAddress) -> bool:
    # is_global is False for private, loopback, link-local (incl. 169.254.169.254), CGNAT
    # 100.64/10, ULA fc00::/7, unspecified and reserved ranges; multicast may be "global".
    return ip.is_global and not ip.is_multicast


def address_problem(ip: IPAddress, allow: Sequence[IPNetwork]) -> str | None:
    """Why ``ip`` may not be reached, or None when it may."""
    inner = embedded_ipv4(ip)
    if _allowed(ip, allow) or (inner is not None and _allowed(inner, allow)):
        return None
    if not _public(ip):
        return f"{ip} is not a public address"
    if inner is not None and not _public(inner):
        return f"{ip} carries the non-public IPv4 address {inner}"
    return None


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
                    raise EgressRefused(f"{target.host!r} resolved to {text!r}, not an address") from None
            if not addresses:
                raise HostNotResolved(f"the host {target.host!r} resolved to no address")
        # Every address must pass: DNS may hand out any of them, and one bad one is enough to probe.
        for ip in addresses:
            problem = address_problem(ip, self.allow)
            if problem is not None:
                raise EgressRefused(f"{target.host!r}: {problem} (FATURA_EGRESS_ALLOW does not list it)")
        allow_listed = all(
            _allowed(ip, self.allow) or _allowed(embedded_ipv4(ip) or ip, self.allow) for ip in addresses
        )
        if target.scheme != "https" and not allow_listed:
            raise EgressRefused("plain http is allowed only to targets FATURA_EGRESS_ALLOW lists; use https")
        return Vetted(target, addresses[0], allow_listed)
