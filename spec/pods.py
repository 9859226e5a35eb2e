"""How many pods a node can run on the addresses the VPC CNI can give it, and how many addresses a node takes
from its subnet. Pure: no Pulumi.

The VPC CNI (prefix delegation off, see VPC_CNI_ENV) gives every pod a secondary IPv4 address of an
interface on the node's default network card; each interface has `ipv4PerInterface` addresses, one of them
its own. The kubelet does not know that, so a node would accept more pods than it can address, and the
extra pods would hang in ContainerCreating. An EFA layout puts an efa-only interface on card 0
(spec/efa.py), which takes one of that card's interface slots: p5.48xlarge has two, so only the primary
interface is left for pods.

nodeadm's own default is `interfaces x (addresses - 1) + 2` over *all* of card 0's interfaces
(nodeadm/internal/kubelet/eni_max_pods.go); gpu-cloud sets maxPods itself from the interfaces the CNI can
really attach, capped at the kubelet's default of 110.
"""
from __future__ import annotations

import math
from typing import Iterable

from spec.catalog import InstanceType
from spec.efa import interface_layout

KUBELET_MAX_PODS = 110      # the kubelet's default maxPods, and Kubernetes' per-node guidance
HOST_NETWORK_PODS = 2       # kube-proxy and aws-node use the node's own address (nodeadm's "+ 2")

# VPC CNI settings the cluster's vpc-cni add-on runs with (components/cluster.py). Values are strings: the
# add-on's configuration schema says so. Warm IPs rather than a warm interface: a GPU node keeps 5 spare
# addresses ready (at least 10 in all) instead of a whole extra interface's worth.
VPC_CNI_ENV = {
    "ENABLE_PREFIX_DELEGATION": "false",
    "WARM_IP_TARGET": "5",
    "MINIMUM_IP_TARGET": "10",
}
WARM_IP_TARGET = int(VPC_CNI_ENV["WARM_IP_TARGET"])
MINIMUM_IP_TARGET = int(VPC_CNI_ENV["MINIMUM_IP_TARGET"])

# The system node group (components/cluster.py): its types, its largest size, and their network interfaces:
# 4 interfaces of 15 addresses on both (awslabs/amazon-eks-ami nodeadm/internal/kubelet/instance-info.jsonl).
SYSTEM_NODE_TYPES = ("m7i.xlarge", "m6i.xlarge")
SYSTEM_NODES_MAX = 4
SYSTEM_NODE_INTERFACES, SYSTEM_NODE_ADDRESSES_PER_INTERFACE = 4, 15


def pod_interfaces(itype: InstanceType, *, efa: bool) -> int:
    """Interfaces on network card 0 the CNI can use for pods: every slot except those the EFA layout takes
    there (the primary interface counts: its secondary addresses go to pods)."""
    taken = sum(1 for nic in interface_layout(itype, efa=efa) if nic.network_card_index == 0 and not nic.primary)
    return itype.eni.default_card_max - taken


def cni_max_pods(interfaces: int, addresses_per_interface: int) -> int:
    return interfaces * (addresses_per_interface - 1) + HOST_NETWORK_PODS


def max_pods(types: Iterable[InstanceType], *, efa: bool) -> int:
    """maxPods for a pool's nodes: what the CNI can address on its tightest type, at most the kubelet's 110."""
    return min(KUBELET_MAX_PODS, *(cni_max_pods(pod_interfaces(t, efa=efa), t.eni.ipv4_per_interface) for t in types))


def addresses_per_node(interfaces: int, addresses_per_interface: int, pods: int) -> int:
    """Subnet addresses one node may hold at `pods` pods: the pods' addresses plus the CNI's warm ones (never
    fewer than its minimum, never more than its interfaces hold), plus each attached interface's own."""
    secondary_per_interface = addresses_per_interface - 1
    secondary = min(interfaces * secondary_per_interface,
                    max(pods - HOST_NETWORK_PODS + WARM_IP_TARGET, MINIMUM_IP_TARGET))
    return secondary + math.ceil(secondary / secondary_per_interface)


def pool_addresses_per_node(types: Iterable[InstanceType], *, efa: bool) -> int:
    types = tuple(types)
    pods = max_pods(types, efa=efa)
    return max(addresses_per_node(pod_interfaces(t, efa=efa), t.eni.ipv4_per_interface, pods) for t in types)


def system_addresses_per_node() -> int:
    pods = cni_max_pods(SYSTEM_NODE_INTERFACES, SYSTEM_NODE_ADDRESSES_PER_INTERFACE)
    return addresses_per_node(SYSTEM_NODE_INTERFACES, SYSTEM_NODE_ADDRESSES_PER_INTERFACE, pods)
