"""cluster-autoscaler for self-managed GPU Auto Scaling groups: Helm values and IAM, as plain values.

Pure: no Pulumi. components/nodes/autoscaler.py turns these into a Helm release and a Pod Identity role.

- Discovery: every ASG carrying the tag `k8s.io/cluster-autoscaler/<cluster>/gpu-pool` = `owned`, which only the GPU
  pools' groups carry (node_group_tags). The usual pair, `k8s.io/cluster-autoscaler/enabled` and
  `k8s.io/cluster-autoscaler/<cluster>`, is on the system node group's group too: EKS tags every managed node group's
  group with them ("automatically tagged for auto-discovery", EKS User Guide, managed node groups), so discovering by
  them hands the autoscaler a group it may not scale, which it would pick for pending system pods and fail on with
  AccessDenied. The autoscaler matches a group that has every listed key, with the listed value where one is given
  (kubernetes/autoscaler cluster-autoscaler-1.35.2 cloudprovider/aws/aws_manager.go:530-567 parses
  `asg:tag=<key>[=<value>],...`; aws_wrapper.go:208-250 asks DescribeAutoScalingGroups with one filter per key).
- Choice between pools: the priority expander (`extraArgs.expander: priority`); the chart renders the
  `cluster-autoscaler-priority-expander` ConfigMap from `expanderPriorities` (weight -> ASG name regexes,
  RE2, highest weight wins, unmatched groups are chosen at random, weights must be positive).
- Scale from zero: CA builds a node template for an empty ASG from its instance type (launch template
  or mixed-instances override) plus the ASG tags `k8s.io/cluster-autoscaler/node-template/label/...`,
  `.../taint/...` and `.../resources/...` (node_group_tags); it needs the describe permissions below. From the type
  alone it knows vCPUs, memory and GPUs, and gives every node 110 pods and no ephemeral storage
  (cluster-autoscaler-1.35.2 aws_manager.go:283-286); a resource tag overwrites a figure, and what a tag says is the
  node's allocatable, as CA makes allocatable equal to capacity (:290-297). So the tags state what the node really
  offers pods: its GPU resources as the device plugin advertises them (no `nvidia.com/gpu` on a MIG pool), its EFA
  devices, its maxPods and its allocatable ephemeral storage (decisions/nodes/scratch.py). Without the last, every
  job that asks for scratch fits no template node, and a pool at zero nodes never grows.
- Scale-down drains with the workload contract's budget (decisions/nodes/drain.py WORKLOAD_MAX_GRACE_S), then
  terminates through the ASG, whose termination hook gives NTH the same window.
- Sizes it can reach: the autoscaler grows a pool only for pods that fit no node it has. Triton's pool grows for
  Triton's pods alone, so its HPA's maxReplicas bounds it (reachable_nodes); decisions/config/validate.py refuses a
  maxNodes above that, because the budget, the inference namespace's quota and the plan's GPU table all count
  maxNodes, and would promise nodes that never come.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from decisions.catalog.catalog import load_catalog
from decisions.catalog.charts import autoscaler_image
from decisions.nodes.drain import WORKLOAD_MAX_GRACE_S
from decisions.nodes.pods import max_pods, system_placement
from decisions.nodes.pools import CA_PREFIX, EFA_RESOURCE, GPU_RESOURCE, TEMPLATE_LABEL_PREFIX, \
    TEMPLATE_RESOURCE_PREFIX, TEMPLATE_TAINT_PREFIX, efa_devices, node_labels, node_taints, offered_gpu_resources
from decisions.nodes.scratch import pool_allocatable_ephemeral_storage_gib

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"
RELEASE_NAME = "cluster-autoscaler"

DESCRIBE_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
)
# Where the release's Deployment runs: the system nodes, tolerating their taint (decisions/nodes/pods.py); the chart
# selects and tolerates nothing by default. Value path -> line in cluster-autoscaler 9.59.0's values.yaml.
AUTOSCALER_PLACEMENT_VALUE_PATHS: Mapping[str, int] = {"nodeSelector": 334, "tolerations": 480}

MUTATING_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")

_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def discovery_tag(cluster_name: str) -> Tuple[str, str]:
    """The tag (key, value) that marks a group as one of this cluster's GPU pools, for its autoscaler to manage. The
    key names the cluster (a name without `/`, so no other cluster's key, of either form, is this one) and ends in a
    segment EKS never writes: no managed node group's group carries it."""
    _check_cluster_name(cluster_name)
    return f"{CA_PREFIX}/{cluster_name}/gpu-pool", "owned"


def discovery_tags(cluster_name: str) -> List[str]:
    """The chart's autoDiscovery.tags: the GPU pools' tag, key and value (a group must carry both)."""
    key, value = discovery_tag(cluster_name)
    return [f"{key}={value}"]


def node_template_resources(pool, nvme_scratch: bool) -> Dict[str, str]:
    """What a node of `pool` (a decisions.config.stack.ResolvedPool) offers pods, by resource, as Kubernetes
    quantities: the values of its `.../node-template/resources/<name>` tags (module docstring)."""
    resources = {GPU_RESOURCE: 0, **offered_gpu_resources(pool, load_catalog())}
    if pool.efa:
        resources[EFA_RESOURCE] = efa_devices(pool)
    resources["pods"] = max_pods(pool.types, efa=pool.efa)
    return {**{name: str(count) for name, count in resources.items()},
            "ephemeral-storage": f"{pool_allocatable_ephemeral_storage_gib(pool, nvme_scratch)}Gi"}


def node_group_tags(pool, cluster_name: str, nvme_scratch: bool) -> Dict[str, str]:
    """The autoscaler's tags on the pool's group: discovery, and the node template (labels, taints, resources) it
    imagines a node of the group as while the group has none."""
    key, value = discovery_tag(cluster_name)
    return {key: value,
            **{f"{TEMPLATE_LABEL_PREFIX}{k}": v for k, v in node_labels(pool).items()},
            **{f"{TEMPLATE_TAINT_PREFIX}{t.key}": f"{t.value}:{t.effect}" for t in node_taints(pool)},
            **{f"{TEMPLATE_RESOURCE_PREFIX}{name}": amount
               for name, amount in node_template_resources(pool, nvme_scratch).items()}}


# Triton's Deployment (components/serving/inference.py) states no rollout strategy, so Kubernetes' default applies: a
# RollingUpdate with maxSurge 25 %, "calculated from percentage by rounding up" (Kubernetes API, apps/v1
# RollingUpdateDeployment): a rollout at maxReplicas runs that many more pods at once.
ROLLOUT_MAX_SURGE_PCT = 25


def rollout_pods(replicas: int) -> int:
    """The most pods a Deployment of `replicas` runs during a rollout under the default strategy."""
    return replicas + math.ceil(replicas * ROLLOUT_MAX_SURGE_PCT / 100)


def reachable_nodes(min_nodes: int, max_replicas: int, slots_per_node: int) -> int:
    """The most nodes the autoscaler can ever give Triton's pool: Triton's pods at its HPA's maxReplicas and a
    rollout's surge, one GPU slot each, packed `slots_per_node` to a node (the autoscaler adds a node only for a pod
    no node has room for), and one more while a node drains (a cordoned node stays in its group until it is gone, and
    its pods need room elsewhere); never fewer than minNodes."""
    if slots_per_node < 1:
        raise ValueError(f"a node of Triton's pool must offer at least one GPU slot, not {slots_per_node}")
    return max(min_nodes, math.ceil(rollout_pods(max_replicas) / slots_per_node) + 1)


def exact_name_regex(asg_name: str) -> str:
    """An RE2 expression matching exactly this ASG name (the priority expander matches by regex)."""
    if not asg_name:
        raise ValueError("ASG name must not be empty")
    return "^" + "".join("\\" + c if c in _RE2_SPECIAL else c for c in asg_name) + "$"


def priority_config(priorities: Mapping[int, Sequence[str]]) -> Dict[str, List[str]]:
    """The priority expander's configuration: weight (as a string key) -> regexes, highest weight first."""
    if not priorities:
        raise ValueError("priorities must name at least one ASG")
    config: Dict[str, List[str]] = {}
    for weight in sorted(priorities, reverse=True):
        if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
            raise ValueError(f"priority weight {weight!r} must be a positive integer (the expander ignores others)")
        patterns = priorities[weight]
        if isinstance(patterns, str) or not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise ValueError(f"priority {weight} needs a non-empty list of regexes, got {patterns!r}")
        config[str(weight)] = list(patterns)
    return config


def autoscaler_values(cluster_name: str, region: str, kubernetes_version: str,
                      priorities: Mapping[int, Sequence[str]], max_node_provision_time: str,
                      service_account: str = SERVICE_ACCOUNT) -> Dict[str, Any]:
    """Helm values for the cluster-autoscaler chart (auto-discovery, priority expander, pinned image)."""
    repository, tag = autoscaler_image(kubernetes_version)
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "fullnameOverride": RELEASE_NAME,
        "image": {"repository": repository, "tag": tag},
        "autoDiscovery": {"clusterName": cluster_name, "tags": discovery_tags(cluster_name)},
        "rbac": {"serviceAccount": {"create": True, "name": service_account}},
        "extraArgs": {
            "expander": "priority",
            # Pools of the same shape in several zones grow together instead of one zone at a time.
            "balance-similar-node-groups": True,
            # GPU pods use emptyDir (/dev/shm, scratch); with `true` CA would never remove such nodes.
            "skip-nodes-with-local-storage": False,
            # Scale-down gives pods the same window as the drain handler (the workload contract).
            "max-graceful-termination-sec": WORKLOAD_MAX_GRACE_S,
            # A node in the verification gate has not registered yet; CA must not count it failed and
            # remove it before the gate's hook times out (decisions/nodes/boot.py derives this from that timeout).
            "max-node-provision-time": max_node_provision_time,
        },
        "expanderPriorities": priority_config(priorities),
        **system_placement(),
    }


def autoscaler_policy_statements(cluster_name: str, asg_arns: Sequence[Any], nodegroup_arns: Any) -> List[Dict[str, Any]]:
    """Least-privilege IAM for cluster-autoscaler.

    Reads are on `*` where the describe calls take no resource-level permissions. The two mutating calls
    are allowed only on this cluster's ASGs (`asg_arns`, ARN patterns by name) and only while they carry
    the tag it discovers them by (discovery_tag): the groups it may change are the groups it manages.
    eks:DescribeNodegroup is on this cluster's node groups (`nodegroup_arns`).
    """
    if isinstance(asg_arns, str) or not asg_arns:
        raise ValueError("asg_arns must be a non-empty list of ARNs or ARN patterns")
    key, value = discovery_tag(cluster_name)
    return [
        {"Sid": "DiscoverNodeGroups", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*"},
        {"Sid": "DescribeOwnManagedNodeGroups", "Effect": "Allow", "Action": "eks:DescribeNodegroup",
         "Resource": nodegroup_arns},
        {"Sid": "ScaleOwnNodeGroups", "Effect": "Allow", "Action": list(MUTATING_ACTIONS), "Resource": list(asg_arns),
         "Condition": {"StringEquals": {f"aws:ResourceTag/{key}": value}}},
    ]


def nodegroup_arn_pattern(partition: str, region: str, account_id: str, cluster_name: str) -> str:
    """Every managed node group of the cluster: arn:...:nodegroup/<cluster>/<group>/<uuid>."""
    return f"arn:{partition}:eks:{region}:{account_id}:nodegroup/{cluster_name}/*/*"


def _check_cluster_name(cluster_name: str) -> None:
    if not isinstance(cluster_name, str) or not cluster_name or "/" in cluster_name:
        raise ValueError(f"cluster name {cluster_name!r} must be a plain, non-empty name (it becomes a tag key)")
