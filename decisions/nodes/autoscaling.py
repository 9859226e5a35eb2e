"""cluster-autoscaler for self-managed GPU Auto Scaling groups: Helm values and IAM, as plain values.

Pure: no Pulumi. components/nodes/autoscaler.py turns these into a Helm release and a Pod Identity role.

- Discovery: every ASG carrying both tags `k8s.io/cluster-autoscaler/enabled` and
  `k8s.io/cluster-autoscaler/<cluster>` (decisions/nodes/pools.autoscaler_tags puts them on each GPU pool).
- Choice between pools: the priority expander (`extraArgs.expander: priority`); the chart renders the
  `cluster-autoscaler-priority-expander` ConfigMap from `expanderPriorities` (weight -> ASG name regexes,
  RE2, highest weight wins, unmatched groups are chosen at random, weights must be positive).
- Scale from zero: CA builds a node template for an empty ASG from its instance type (launch template
  or mixed-instances override) plus the ASG tags `k8s.io/cluster-autoscaler/node-template/label/...`,
  `.../taint/...` and `.../resources/...` that the node pools add; it needs the describe permissions below.
- Scale-down drains with the workload contract's budget (decisions/nodes/drain.py WORKLOAD_MAX_GRACE_S), then
  terminates through the ASG, whose termination hook gives NTH the same window.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from decisions.catalog.charts import autoscaler_image
from decisions.nodes.drain import WORKLOAD_MAX_GRACE_S
from decisions.nodes.pods import system_placement
from decisions.nodes.pools import CA_PREFIX

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


def discovery_tags(cluster_name: str) -> List[str]:
    """Tag keys an ASG must carry (values do not matter) to be managed by this cluster's autoscaler."""
    _check_cluster_name(cluster_name)
    return [f"{CA_PREFIX}/enabled", f"{CA_PREFIX}/{cluster_name}"]


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
    this cluster's tags (`k8s.io/cluster-autoscaler/<cluster>` = owned and `.../enabled` = true, as
    decisions/nodes/pools tags them). eks:DescribeNodegroup is on this cluster's node groups (`nodegroup_arns`).
    """
    _check_cluster_name(cluster_name)
    if isinstance(asg_arns, str) or not asg_arns:
        raise ValueError("asg_arns must be a non-empty list of ARNs or ARN patterns")
    return [
        {"Sid": "DiscoverNodeGroups", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*"},
        {"Sid": "DescribeOwnManagedNodeGroups", "Effect": "Allow", "Action": "eks:DescribeNodegroup",
         "Resource": nodegroup_arns},
        {"Sid": "ScaleOwnNodeGroups", "Effect": "Allow", "Action": list(MUTATING_ACTIONS), "Resource": list(asg_arns),
         "Condition": {"StringEquals": {
             f"aws:ResourceTag/{CA_PREFIX}/{cluster_name}": "owned",
             f"aws:ResourceTag/{CA_PREFIX}/enabled": "true",
         }}},
    ]


def nodegroup_arn_pattern(partition: str, region: str, account_id: str, cluster_name: str) -> str:
    """Every managed node group of the cluster: arn:...:nodegroup/<cluster>/<group>/<uuid>."""
    return f"arn:{partition}:eks:{region}:{account_id}:nodegroup/{cluster_name}/*/*"


def _check_cluster_name(cluster_name: str) -> None:
    if not isinstance(cluster_name, str) or not cluster_name or "/" in cluster_name:
        raise ValueError(f"cluster name {cluster_name!r} must be a plain, non-empty name (it becomes a tag key)")
