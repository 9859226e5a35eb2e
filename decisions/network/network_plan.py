"""Subnet layout of the cluster VPC: pure functions, no Pulumi.

The VPC CNI gives every pod an address from its node's subnet, and GPU nodes run many pods
(device plugins, DCGM exporter, EFA, log and metric agents, the workloads), so nearly all of the
VPC goes to the private subnets the nodes live in. Public subnets hold only NAT gateways and
internet-facing load balancer nodes, so they stay small.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Dict, Sequence

# A subnet smaller than this cannot host an Elastic Load Balancer (AWS asks for a /27 at least).
SMALLEST_PUBLIC_PREFIX = 27
# Public subnets are never made larger than this: NAT gateways and load balancer nodes need few addresses.
LARGEST_PUBLIC_PREFIX = 24
MAX_ZONES = 6
# The VPC is always cut into 8 equal blocks, whatever the zone count: the i-th declared zone's private
# subnet is block i, and the last block holds the public subnets. Adding a zone takes the next free block
# and moves nothing that exists.
BLOCKS = 8
PUBLIC_BLOCK = BLOCKS - 1
AWS_RESERVED_ADDRESSES = 5       # the first four and the last address of every subnet


@dataclass(frozen=True)
class SubnetPlan:
    """Subnet CIDRs per zone, in the zone order given to `plan_subnets`."""

    private: Dict[str, str]
    public: Dict[str, str]

    def usable_private(self, zone: str) -> int:
        return ipaddress.IPv4Network(self.private[zone]).num_addresses - AWS_RESERVED_ADDRESSES


def plan_subnets(cidr: str, zones: Sequence[str]) -> SubnetPlan:
    """Carve the VPC `cidr` into one private and one public subnet per zone, by the zone's position.

    Zone i (in the order the stack declares them, at most 6) gets private block i of 8 equal blocks
    (prefix vpc + 3) and the i-th public subnet in block 7, of prefix ``max(vpc + 6, 24)``: a /24 when
    there is room, a /26 in a /20 VPC. Nothing depends on how many zones there are, so appending a
    zone never moves an existing subnet. Block 6 stays free for later use.

    Examples: 10.0.0.0/16 -> private /19 (8,192 addresses: 10.0.0.0/19, 10.0.32.0/19, 10.0.64.0/19, ...),
    public /24 (10.0.224.0/24, 10.0.225.0/24, ...). 10.0.0.0/20 -> private /23 (10.0.0.0/23, 10.0.2.0/23,
    ...), public /26 (10.0.14.0/26, 10.0.14.64/26, ...).

    Raises ValueError for a malformed CIDR, no zones, more than 6, repeated zones, or a VPC too small for
    /27 public subnets.
    """
    try:
        vpc = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as err:
        raise ValueError(f"{cidr!r} is not an IPv4 network CIDR ({err})") from None
    zones = list(zones)
    if not zones or len(zones) > MAX_ZONES:
        raise ValueError(f"1 to {MAX_ZONES} zones are needed, got {len(zones)}")
    if len(set(zones)) != len(zones):
        raise ValueError(f"zones repeat: {', '.join(zones)}")
    private_prefix = vpc.prefixlen + (BLOCKS.bit_length() - 1)
    public_prefix = max(private_prefix + (BLOCKS.bit_length() - 1), LARGEST_PUBLIC_PREFIX)
    if public_prefix > SMALLEST_PUBLIC_PREFIX:
        raise ValueError(f"{cidr} is too small: public subnets would be /{public_prefix}, smaller than the "
                         f"/{SMALLEST_PUBLIC_PREFIX} a load balancer needs")
    blocks = list(vpc.subnets(new_prefix=private_prefix))
    public_pieces = list(blocks[PUBLIC_BLOCK].subnets(new_prefix=public_prefix))
    return SubnetPlan(private={zone: str(blocks[i]) for i, zone in enumerate(zones)},
                      public={zone: str(public_pieces[i]) for i, zone in enumerate(zones)})
