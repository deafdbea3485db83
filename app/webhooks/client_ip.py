"""Which address a request really comes from, for per-client rate limits.

``X-Forwarded-For`` is written by whoever sent the request, so it is only
believed when the socket peer is one of our own proxies (``TRUSTED_PROXIES``).
Each trusted proxy appends the address it received from, so the header is
read from the right: the first address that is not one of our proxies is the
client. Anything to the left of it was written by the client and may be a lie.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence
from typing import TypeAlias

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

IPV6_LIMIT_PREFIX = 64
"""IPv6 clients are limited per /64: one host usually holds a whole /64, so a limit per address
would give it 2^64 buckets."""

UNKNOWN_CLIENT = "unknown"
"""The client when the server reports no peer (e.g. a Unix socket): all such
requests share one bucket rather than believing a header."""


def client_ip(
    peer: str | None,
    forwarded_for: str | None,
    trusted: Sequence[Network],
) -> str:
    """The client address: the socket peer, unless the peer is a trusted proxy.

    Behind trusted proxies, ``X-Forwarded-For`` is walked from the right,
    skipping our own proxies; if every hop is trusted the left-most wins. A
    malformed entry stops the walk at the last address that parsed, since
    nothing left of garbage can be attributed to a trusted hop. Several
    ``X-Forwarded-For`` headers must be joined with commas, in order, first.
    """
    if not peer:
        return UNKNOWN_CLIENT
    peer_address, peer_text = _peer(peer)
    if peer_address is None:
        return peer  # not an IP (e.g. a test client's name): cannot be trusted
    if not forwarded_for or not _is_trusted(peer_address, trusted):
        return peer_text
    candidate = peer_address
    for entry in reversed(forwarded_for.split(",")):
        hop = _parse_address(entry)
        if hop is None:
            break
        candidate = hop
        if not _is_trusted(hop, trusted):
            break
    return str(candidate)


def forwarded_for(lines: Sequence[str]) -> str | None:
    """Several ``X-Forwarded-For`` lines are one list: joined with commas, in the order received.

    A proxy that appends its own line instead of extending the first must not
    leave its hop unread (reading only the first line let a client past its limit).
    """
    if not lines:
        return None
    return lines[0] if len(lines) == 1 else ",".join(lines)


@functools.lru_cache(maxsize=4096)
def rate_limit_key(client: str) -> str:
    """The bucket of a client address: itself, or its /64 network for IPv6."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, IPV6_LIMIT_PREFIX), strict=False))
    return client


@functools.lru_cache(maxsize=4096)
def _peer(peer: str) -> tuple[Address | None, str]:
    """The parsed socket peer and its text, cached: a provider sends from a few addresses, again and again."""
    address = _parse_address(peer)
    return address, str(address) if address is not None else peer


def _parse_address(text: str) -> Address | None:
    """Parse one hop, tolerating the ports and brackets some proxies append.

    IPv4-mapped IPv6 peers (``::ffff:10.0.0.1`` from a dual-stack socket) are
    unwrapped so that IPv4 trusted networks and IPv4 buckets still match.
    """
    text = text.strip()
    if text.startswith("["):  # [2001:db8::1] or [2001:db8::1]:443
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not _is_port_suffix(rest)):
            return None
        text = host
    elif text.count(":") == 1:  # 192.0.2.1:443
        text, _, port = text.partition(":")
        if not port.isdigit():
            return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _is_port_suffix(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit()


def _is_trusted(address: Address, trusted: Sequence[Network]) -> bool:
    # `in` is simply False across IP versions, so mixed lists need no filtering.
    return any(address in network for network in trusted)
