"""Who is calling, by address: the peer, or the client a trusted proxy names.

The failed-authentication limit (ratelimit.py) is keyed by the caller's address. Behind
a load balancer or a proxy every call comes from the proxy's address, so one client's
bad tokens would throttle every other client's. A proxy that appends the address it
received the call from to `x-forwarded-for` tells us the client's; but anyone can send
that header, so it is believed only from peers listed in TORCHFARM_TRUSTED_PROXIES, and
only as far as the chain of trusted proxies goes: the header is read from the right,
and the first address that is not a trusted proxy is the client. What lies to its left
was written by the client itself and is never used. Anything that does not parse falls
back to the last address known to be true.

grpc Python does not speak the PROXY protocol, so a TCP proxy in front must be one that
ends HTTP/2 and sets the header (Envoy, nginx's grpc_pass, a cloud gRPC load balancer).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

FORWARDED_FOR = "x-forwarded-for"
"""The metadata key proxies append the address they received a call from to."""

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d; the CIDRs name it in IPv4.
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


class TrustedProxies:
    """The addresses (CIDRs) whose `x-forwarded-for` is believed; empty: nobody's."""

    def __init__(self, networks: Iterable[_Network] = ()):
        self.networks = tuple(networks)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TrustedProxies:
        """From TORCHFARM_TRUSTED_PROXIES: addresses or CIDRs ("10.0.0.0/8", "::1");
        ValueError naming the setting for one that does not parse."""
        networks = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError as e:
                raise ValueError(f"TORCHFARM_TRUSTED_PROXIES: {entry!r} is not an address or CIDR: {e}") from e
        return cls(networks)

    def trusts(self, host: str) -> bool:
        address = _address(host)
        return address is not None and any(address in n for n in self.networks)

    def client(self, peer_host: str, forwarded_for: str) -> str:
        """The caller's address: `peer_host`, or, when that is a trusted proxy, the
        rightmost address in `forwarded_for` that is not one."""
        host = peer_host
        if not self.networks:
            return host
        hops = [h for h in forwarded_for.split(",") if h.strip()]
        while self.trusts(host) and hops:
            address = _address(hops.pop())
            if address is None:
                break  # a hop we cannot read: the proxy that wrote it is the last we know
            host = str(address)
        return host


def forwarded_for(metadata: Iterable[tuple[str, object]] | None) -> str:
    """Every `x-forwarded-for` value of the call's metadata, joined in order."""
    values = [str(v) for k, v in metadata or () if k == FORWARDED_FOR]
    return ",".join(values)


IPV6_BUCKET_PREFIX = 64
"""IPv6 clients are counted by /64: one host holds a whole /64 and could otherwise
present a fresh address with every guess."""


def bucket_of(address: str) -> str:
    """The address a failure is counted against: an IPv6 address's /64, else itself."""
    parsed = _address(address)
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{parsed}/{IPV6_BUCKET_PREFIX}", strict=False))
    return str(parsed) if parsed is not None else address
