"""Zone choice and subnet sizing for the cluster VPC: pure functions, no Pulumi.

The VPC CNI gives every pod an address from its node's subnet, and GPU nodes run many pods
(device plugins, DCGM exporter, EFA, log and metric agents, the workloads), so nearly all of the
VPC goes to the private subnets the nodes live in. Public subnets hold only NAT gateways and
internet-facing load balancer nodes, so they stay small.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Dict, Iterable, Sequence, Tuple

# A subnet smaller than this cannot host an Elastic Load Balancer (AWS asks for a /27 at least).
SMALLEST_PUBLIC_PREFIX = 27
# Public subnets are never made larger than this: NAT gateways and load balancer nodes need few addresses.
LARGEST_PUBLIC_PREFIX = 24


def choose_zones(available: Sequence[str], pinned: Iterable[str], count: int) -> Tuple[str, ...]:
    """The `count` zones the VPC spans, sorted.

    Zones the node pools are pinned to come first (a pool's placement group or capacity reservation
    lives in one zone, so the VPC must have a subnet there); the rest are the first `available`
    zones in the order given. Raises ValueError when a pinned zone is not available, when more
    zones are pinned than `count`, or when there are fewer than `count` available zones.
    """
    available = list(dict.fromkeys(available))
    pinned_zones = list(dict.fromkeys(pinned))
    foreign = [zone for zone in pinned_zones if zone not in available]
    if foreign:
        raise ValueError(f"pinned zone(s) {', '.join(sorted(foreign))} not among the available zones "
                         f"{', '.join(available) or '(none)'}")
    if count < 1:
        raise ValueError(f"zone count must be at least 1, got {count}")
    if len(pinned_zones) > count:
        raise ValueError(f"{len(pinned_zones)} zones are pinned ({', '.join(sorted(pinned_zones))}) "
                         f"but the VPC spans only {count}")
    if len(available) < count:
        raise ValueError(f"{count} zones requested but only {len(available)} available: {', '.join(available)}")
    chosen = pinned_zones + [zone for zone in available if zone not in pinned_zones]
    return tuple(sorted(chosen[:count]))


@dataclass(frozen=True)
class SubnetPlan:
    """Subnet CIDRs per zone, in the zone order given to `plan_subnets`."""

    private: Dict[str, str]
    public: Dict[str, str]


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def plan_subnets(cidr: str, zones: Sequence[str]) -> SubnetPlan:
    """Carve the VPC `cidr` into one private and one public subnet per zone.

    The rule, for n zones:

    - Split the VPC into ``slots = next_power_of_two(n + 1)`` equal blocks (n = 2 or 3: 4 blocks;
      n = 4 to 7: 8 blocks). Private subnet i is block i, so the private prefix is
      ``vpc_prefix + log2(slots)``. The "+ 1" keeps at least one block free for the public
      subnets; together the private subnets always hold more than half the VPC (at least
      ``vpc_size / (2 n)`` addresses each).
    - The last block is the public block. Public subnet i is the i-th piece of it, of prefix
      ``max(private_prefix + ceil(log2(n)), 24)``: a /24 when there is room, smaller (never below
      /27, the load balancer minimum) when the VPC is small. What the public subnets leave of that
      block, and any block between the last private one and it, stays free for later use.

    Examples: 10.0.0.0/16, 3 zones -> private /18 (16,384 addresses each: 10.0.0.0/18,
    10.0.64.0/18, 10.0.128.0/18), public /24 (10.0.192.0/24, 10.0.193.0/24, 10.0.194.0/24).
    10.0.0.0/20, 6 zones -> private /23 (512 each, 10.0.0.0/23 .. 10.0.10.0/23), public /26
    (64 each, 10.0.14.0/26 .. 10.0.15.64/26).

    Raises ValueError for a malformed CIDR, no zones, duplicate zones, or a VPC too small for the
    public subnets to reach /27.
    """
    try:
        vpc = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as err:
        raise ValueError(f"{cidr!r} is not an IPv4 network CIDR ({err})") from None
    zones = list(zones)
    if not zones:
        raise ValueError("at least one zone is needed")
    if len(set(zones)) != len(zones):
        raise ValueError(f"zones repeat: {', '.join(zones)}")

    n = len(zones)
    slots = _next_power_of_two(n + 1)
    private_prefix = vpc.prefixlen + (slots.bit_length() - 1)
    public_prefix = max(private_prefix + (_next_power_of_two(n).bit_length() - 1), LARGEST_PUBLIC_PREFIX)
    if public_prefix > SMALLEST_PUBLIC_PREFIX:
        raise ValueError(f"{cidr} is too small for {n} zones: public subnets would be /{public_prefix}, "
                         f"smaller than the /{SMALLEST_PUBLIC_PREFIX} a load balancer needs")

    blocks = list(vpc.subnets(new_prefix=private_prefix))
    public_pieces = blocks[-1].subnets(new_prefix=public_prefix)
    private = {zone: str(block) for zone, block in zip(zones, blocks)}
    public = {zone: str(piece) for zone, piece in zip(zones, public_pieces)}
    return SubnetPlan(private=private, public=public)
