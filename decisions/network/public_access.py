"""Which source ranges may reach the EKS API endpoint: the one rule that config validation
(decisions/config/validate.py) and the CrossGuard pack (policy/policies.py, eks-endpoint-not-public) both apply.

A range is judged by containment: it is refused when it lies inside a reserved range (`subnet_of`), never because it
merely overlaps one, since 0.0.0.0/0 overlaps every range and is not one of them; it is too wide by its prefix.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional, Tuple

# The widest block IANA ever gave one organisation is a /8 (the legacy "Class A" allocations of the IANA IPv4 Address
# Space Registry, iana.org/assignments/ipv4-address-space): one deployer's egress range, however large the company,
# fits in a /8, and anything wider takes in other organisations' addresses. A corporate egress is a few NAT addresses
# (/32s) or a provider block (/24 to /16), far inside the limit.
WIDEST_PUBLIC_PREFIX = 8


@dataclass(frozen=True)
class ReservedRange:
    network: ipaddress.IPv4Network
    what: str                 # the range's purpose, with the RFC that reserves it
    private_network: bool     # addresses a host may have inside a private network (fine for privateAccessCidrs)


def _reserved(cidr: str, what: str, private_network: bool = False) -> ReservedRange:
    return ReservedRange(ipaddress.IPv4Network(cidr), what, private_network)


# IANA IPv4 Special-Purpose Address Registry (RFC 6890; iana.org/assignments/iana-ipv4-special-registry), the entries
# whose addresses never arrive from the Internet at a public endpoint. 198.18.0.0/15 (benchmarking, RFC 2544) is left
# out: it is the stand-in for a reader's own address in docs/deploying.md, and a lab may route it.
RESERVED_RANGES: Tuple[ReservedRange, ...] = (
    _reserved("0.0.0.0/8", "\"this network\" (RFC 791, RFC 1122 3.2.1.3)"),
    _reserved("10.0.0.0/8", "a private range (RFC 1918)", private_network=True),
    _reserved("100.64.0.0/10", "the carrier-grade NAT shared range (RFC 6598)", private_network=True),
    _reserved("127.0.0.0/8", "loopback (RFC 1122 3.2.1.3)"),
    _reserved("169.254.0.0/16", "link-local (RFC 3927)"),
    _reserved("172.16.0.0/12", "a private range (RFC 1918)", private_network=True),
    _reserved("192.0.2.0/24", "a documentation-only range (RFC 5737)"),
    _reserved("192.168.0.0/16", "a private range (RFC 1918)", private_network=True),
    _reserved("198.51.100.0/24", "a documentation-only range (RFC 5737)"),
    _reserved("203.0.113.0/24", "a documentation-only range (RFC 5737)"),
    _reserved("224.0.0.0/4", "multicast (RFC 5771)"),
    _reserved("240.0.0.0/4", "reserved for future use (RFC 1112 4; 255.255.255.255 is broadcast, RFC 919)"),
)


def reserved_range(cidr: str, private_network: bool = False) -> Optional[ReservedRange]:
    """The reserved range `cidr` lies inside, or None. `private_network`: judged as a source inside a private network
    (privateAccessCidrs), where the RFC 1918 and shared ranges are ordinary."""
    network = ipaddress.IPv4Network(cidr)
    return next((r for r in RESERVED_RANGES
                 if network.subnet_of(r.network) and not (private_network and r.private_network)), None)


def too_wide(cidr: str) -> bool:
    """Wider than one organisation's egress can be (shorter prefix than WIDEST_PUBLIC_PREFIX)."""
    return ipaddress.ip_network(cidr, strict=False).prefixlen < WIDEST_PUBLIC_PREFIX


def public_access_problem(cidr: str) -> Optional[str]:
    """Why `cidr` may not reach the public endpoint, or None when it may."""
    network = ipaddress.IPv4Network(cidr)
    if too_wide(cidr):
        share = "the whole Internet" if network.prefixlen == 0 else f"1/{2 ** network.prefixlen} of the Internet"
        return (f"{cidr} opens the public endpoint to {share} ({network.num_addresses:,} addresses), wider than "
                f"/{WIDEST_PUBLIC_PREFIX}, the largest block IANA ever gave one organisation: list your runners' "
                "egress range (the public addresses of their NAT)")
    reserved = reserved_range(cidr)
    if reserved is not None:
        return (f"{cidr} is inside {reserved.network}, {reserved.what}: no request from the Internet comes from "
                "there; give your runners' public egress range")
    return None


def private_access_problem(cidr: str) -> Optional[str]:
    """Why `cidr` may not reach the private endpoint, or None when it may (private ranges are its ordinary case)."""
    reserved = reserved_range(cidr, private_network=True)
    if reserved is None:
        return None
    return (f"{cidr} is inside {reserved.network}, {reserved.what}: no deployer has such an address; give your "
            "runners' real range")
