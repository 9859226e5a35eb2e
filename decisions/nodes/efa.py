"""EFA network interface layout for a launch template, from the catalog.

AWS's current guidance for instances with several network cards (EC2 User Guide, "Maximize network
bandwidth on Amazon EC2 instances with multiple network cards"):
- the primary interface is a plain ENA interface at network card 0, device index 0 (an efa-only
  interface can never be primary);
- card 0 also gets an efa-only interface at device index 1;
- every other EFA card gets an efa-only interface at device index 0;
- optionally, an ENA interface at device index 1 on the cards AWS names, for more IP bandwidth.
The default is the IP-saving layout (one private IP per node); efa-only interfaces take no IP.
EFA-only interfaces need VPC CNI 1.18.5 or later (pinned in decisions/catalog/addons.yaml).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from decisions.catalog.catalog import InstanceType

ENA = "interface"
EFA_ONLY = "efa-only"


@dataclass(frozen=True)
class NetworkInterface:
    network_card_index: int
    device_index: int
    interface_type: str        # "interface" (plain ENA) or "efa-only"

    @property
    def primary(self) -> bool:
        return self.network_card_index == 0 and self.device_index == 0

    @property
    def is_efa(self) -> bool:
        return self.interface_type == EFA_ONLY


def interface_layout(itype: InstanceType, *, efa: bool, max_ip_bandwidth: bool = False) -> Tuple[NetworkInterface, ...]:
    """The launch template's interfaces: just the primary ENA without EFA; else one EFA device per EFA card."""
    primary = NetworkInterface(0, 0, ENA)
    if not efa:
        return (primary,)
    if not itype.supports_efa:
        raise ValueError(f"{itype.name} does not support EFA")
    interfaces = [primary, NetworkInterface(0, 1, EFA_ONLY)]
    interfaces += [NetworkInterface(card, 0, EFA_ONLY) for card in range(1, itype.efa.cards)]
    if max_ip_bandwidth:
        interfaces += [NetworkInterface(card, 1, ENA) for card in itype.efa.ena_bandwidth_cards]
    return tuple(sorted(interfaces, key=lambda i: (i.network_card_index, i.device_index)))


def efa_device_count(itype: InstanceType, *, efa: bool) -> int:
    return sum(i.is_efa for i in interface_layout(itype, efa=efa)) if efa else 0


def ip_bandwidth_gbps(itype: InstanceType, *, efa: bool) -> float:
    """What the node's IP traffic can use: the bandwidth of the network cards its ENA interfaces sit on (an even
    share of the type's networkGbps per card). EFA traffic bypasses the kernel, so on a p5 (3200 Gbps over 32
    cards, one ENA interface) IP gets 100 Gbps: the rest is EFA's (EC2 User Guide, "Maximize network bandwidth on
    Amazon EC2 instances with multiple network cards",
    docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html)."""
    cards = {nic.network_card_index for nic in interface_layout(itype, efa=efa) if nic.interface_type == ENA}
    return itype.network_gbps / itype.network_cards * len(cards)
