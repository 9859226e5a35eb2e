"""How many pods a node can run on the addresses the VPC CNI can give it, and how many addresses a node takes
from its subnet. Pure: no Pulumi.

The VPC CNI (prefix delegation off, see VPC_CNI_ENV) gives every pod a secondary IPv4 address of an
interface on the node's default network card; each interface has `ipv4PerInterface` addresses, one of them
its own. The kubelet does not know that, so a node would accept more pods than it can address, and the
extra pods would hang in ContainerCreating. An EFA layout puts an efa-only interface on card 0
(decisions/nodes/efa.py), which takes one of that card's interface slots: p5.48xlarge has two, so only the primary
interface is left for pods.

nodeadm's own default is `interfaces x (addresses - 1) + 2` over *all* of card 0's interfaces
(nodeadm/internal/kubelet/eni_max_pods.go); gpu-cloud sets maxPods itself from the interfaces the CNI can
really attach, capped at the kubelet's default of 110.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Sequence

from decisions.catalog.catalog import InstanceType
from decisions.nodes.efa import interface_layout
from decisions.nodes.pools import Taint

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

# The system node group's label (every pod that must run there selects it) and its taint. The taint keeps team pods
# off the nodes that run CoreDNS and the webhooks of the load balancer controller and Kueue, which fail closed; the
# tenants' admission policy refuses a team pod that tolerates it (decisions/platform/tenancy.py
# host_isolation_validations). CriticalAddonsOnly is the key the add-ons already know: the EKS CoreDNS add-on's schema
# defaults its tolerations to `CriticalAddonsOnly Exists` (describe-addon-configuration coredns, as recorded in
# cloudbees/terraform-aws-cloudbees-ci-eks-addon blueprints/03-windows-builds/README.md), so do the EBS CSI controller
# (aws-ebs-csi-driver v1.60.0 charts/aws-ebs-csi-driver/values.yaml line 313) and the FSx CSI controller
# (aws-fsx-csi-driver chart 1.17.0 values.yaml line 101). Every other pod placed there tolerates it explicitly:
# system_tolerations().
SYSTEM_NODE_ROLE_LABEL = "gpu-cloud.io/node-role"
SYSTEM_NODE_LABELS = {SYSTEM_NODE_ROLE_LABEL: "system"}
SYSTEM_NODE_TAINT = Taint("CriticalAddonsOnly", "true", "NoSchedule")
# EKS managed node groups spell effects in the API's enum (NodeGroup taints: NO_SCHEDULE | NO_EXECUTE | ...).
NODEGROUP_TAINT_EFFECTS = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}


def system_tolerations() -> List[Dict[str, str]]:
    """The toleration every pod placed on the system nodes carries: the taint's key, any value, its effect."""
    return [{"key": SYSTEM_NODE_TAINT.key, "operator": "Exists", "effect": SYSTEM_NODE_TAINT.effect}]


def system_placement(system_node_labels: Mapping[str, str] = SYSTEM_NODE_LABELS) -> Dict[str, Any]:
    """nodeSelector and tolerations of a pod (or a chart's component) that runs on the system nodes."""
    if not system_node_labels:
        raise ValueError("system_node_labels must select the system nodes")
    return {"nodeSelector": dict(system_node_labels), "tolerations": system_tolerations()}


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """Whether a pod with `tolerations` may be scheduled onto a node with `taint`, as the scheduler decides
    (k8s.io/api core/v1 toleration.go ToleratesTaint): an empty effect matches every effect; `Exists` with no key
    matches every taint; `Exists` matches any value of its key; `Equal` (the default operator) needs the value."""
    for toleration in tolerations or ():
        effect = toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if key and key != taint.key:
            continue
        if operator == "Exists":
            return True
        if operator == "Equal" and key and (toleration.get("value") or "") == taint.value:
            return True
    return False


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
