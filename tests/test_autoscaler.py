"""components/nodes/autoscaler.py under the mock engine, and the pure decisions in decisions/nodes/autoscaling.py and
decisions/catalog/charts.py.

What users rely on: the pinned chart runs an autoscaler whose minor equals the cluster's, for every
supported Kubernetes version; it discovers this cluster's GPU pools (and only those, not the system node group) by
tag, and may change exactly the groups it discovers; it grows reserved capacity before spot before on-demand; it never
starts before its Pod Identity association exists; and a pool with no node grows for every job `python -m jobs`
renders for it, because the node the autoscaler imagines for it (as cluster-autoscaler 1.35.2 builds it from the
group's tags) takes the job.
"""
from __future__ import annotations

import base64
import contextlib
import email
import io
import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Mapping

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.nodes.autoscaler import AutoscalerArgs, ClusterAutoscaler
from decisions.catalog import charts
from decisions.catalog.catalog import load_catalog
from decisions.config.validate import ResolvedPool, supported_kubernetes_versions
from decisions.nodes import autoscaling, boot, drain
from decisions.nodes.pods import tolerates
from decisions.nodes.pools import Taint, queue_flavor, toleration
from decisions.platform import kueue as kueue_rules
from jobs.__main__ import main as jobs_main
from plan.stackfile import load_stack
from tests.conftest import STACKS, run_component
from tests.test_validate import load, valid_config

REGION = "us-east-1"
CLUSTER = "gpu-cloud-prod-us-east-1"
ASG_ARNS = tuple(f"arn:aws:autoscaling:{REGION}:123456789012:autoScalingGroup:*:autoScalingGroupName/{CLUSTER}-{pool}"
                 for pool in ("train", "infer"))
NODEGROUPS = autoscaling.nodegroup_arn_pattern("aws", REGION, "123456789012", CLUSTER)
RESERVED = f"{CLUSTER}-reserved"
SPOT = (f"{CLUSTER}-spot-a", f"{CLUSTER}-spot.b")          # a dot: must be matched literally
ON_DEMAND = f"{CLUSTER}-on-demand"
PRIORITIES = {50: (RESERVED,), 30: SPOT, 10: (ON_DEMAND,)}
ALL_ASGS = (RESERVED, *SPOT, ON_DEMAND)

COMPONENT = "gpu-cloud:autoscaler:ClusterAutoscaler"
RELEASE = "kubernetes:helm.sh/v3:Release"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
K8S_PROVIDER = "pulumi:providers:kubernetes"


def _build(kubernetes_version: str = "1.33", priorities=PRIORITIES):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        ClusterAutoscaler("autoscaler", AutoscalerArgs(
            cluster_name=CLUSTER, cluster_name_plain=CLUSTER, region=REGION,
            kubernetes_version=kubernetes_version, priorities=priorities,
            max_node_provision_time=boot.max_node_provision_time("ami"), asg_arn_patterns=ASG_ARNS,
            nodegroup_arns=NODEGROUPS),
            opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build(), region=REGION)


def _values(run) -> Dict:
    return run.one(RELEASE).inputs["values"]


def _as_list(value) -> List:
    return value if isinstance(value, list) else [value]


# --- the release ------------------------------------------------------------------------------------------

def test_release_is_the_pinned_chart_from_the_autoscaler_repo(run):
    release = run.one(RELEASE)
    pin = charts.chart(charts.CLUSTER_AUTOSCALER)
    assert release.inputs["chart"] == "cluster-autoscaler"
    assert release.inputs["repositoryOpts"]["repo"] == "https://kubernetes.github.io/autoscaler"
    assert release.inputs["version"] == pin.version
    assert release.inputs["namespace"] == "kube-system"
    assert release.provider.startswith(run.one(K8S_PROVIDER).urn), "must deploy with the caller's cluster provider"


@pytest.mark.parametrize("version", supported_kubernetes_versions())
def test_autoscaler_minor_equals_the_cluster_minor(version):
    image = _values(run_component(_build(kubernetes_version=version), region=REGION))["image"]
    assert image["repository"] == "registry.k8s.io/autoscaling/cluster-autoscaler"
    assert re.fullmatch(rf"v{re.escape(version)}\.\d+", image["tag"]), f"{image['tag']} on Kubernetes {version}"


def test_unsupported_kubernetes_version_fails_before_registering():
    with pytest.raises(Exception, match="no cluster-autoscaler image pinned for Kubernetes 1.31"):
        run_component(_build(kubernetes_version="1.31"), region=REGION)


def test_priority_expander_grows_reserved_first_then_spot_then_on_demand(run):
    values = _values(run)
    assert values["extraArgs"]["expander"].split(",")[0] == "priority"
    config = {int(weight): patterns for weight, patterns in values["expanderPriorities"].items()}
    assert all(weight > 0 for weight in config), "the expander ignores non-positive priorities"

    def weight_of(asg: str) -> int:
        matches = [w for w, patterns in config.items() if any(re.fullmatch(p, asg) for p in patterns)]
        assert len(matches) == 1, f"{asg} matched by {matches}"
        return matches[0]

    assert weight_of(RESERVED) == max(config)
    assert {weight_of(s) for s in SPOT} == {30}
    assert weight_of(RESERVED) > weight_of(SPOT[0]) > weight_of(ON_DEMAND)
    # Exact names: a dot is literal, and another cluster's similarly named pool is not matched.
    for stranger in (f"{CLUSTER}-spotXb", f"{RESERVED}-2", f"x{ON_DEMAND}"):
        assert not any(re.fullmatch(p, stranger) for patterns in config.values() for p in patterns), stranger


def test_auto_discovery_is_by_this_clusters_tags(run):
    values = _values(run)
    assert values["cloudProvider"] == "aws" and values["awsRegion"] == REGION
    discovery = values["autoDiscovery"]
    assert discovery["clusterName"] == CLUSTER
    # one tag, key and value, that only this cluster's GPU pools carry (test_the_autoscaler_discovers_and_may_scale_...)
    assert discovery["tags"] == [f"k8s.io/cluster-autoscaler/{CLUSTER}/gpu-pool=owned"]


def test_scale_down_honours_the_workload_contract(run):
    extra = _values(run)["extraArgs"]
    assert extra["max-graceful-termination-sec"] == drain.WORKLOAD_MAX_GRACE_S
    assert extra["skip-nodes-with-local-storage"] is False
    assert extra["balance-similar-node-groups"] is True


def test_a_node_still_in_the_gate_is_not_given_up_on(run):
    # CA's default 15m0s is shorter than the 20-minute verification hook: it would remove a healthy node mid-gate.
    assert _values(run)["extraArgs"]["max-node-provision-time"] == "25m0s"


@pytest.mark.parametrize("source,expected", [("ami", "25m0s"), ("install", "55m0s")])
def test_max_node_provision_time_outlasts_the_hook_plus_registration(source, expected):
    assert boot.max_node_provision_time(source) == expected
    minutes, seconds = map(int, re.fullmatch(r"(\d+)m(\d+)s", expected).groups())
    assert minutes * 60 + seconds > boot.verify_hook_timeout(source)


def test_mutating_calls_are_limited_to_this_clusters_asgs(run):
    statements = json.loads(run.one(ROLE_POLICY).inputs["policy"])["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    actions = [a for s in statements for a in _as_list(s["Action"])]
    assert not any("*" in a for a in actions), "no wildcard actions"
    read_only = re.compile(r"^[a-z0-9]+:(Describe|Get)[A-Za-z]+$")
    mutating = {a for a in actions if not read_only.match(a)}
    assert mutating == {"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
    for statement in statements:
        if set(_as_list(statement["Action"])) & mutating:
            condition = statement["Condition"]["StringEquals"]
            assert condition == {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{CLUSTER}/gpu-pool": "owned"}
    needed_for_scale_from_zero = {"ec2:DescribeImages", "ec2:GetInstanceTypesFromInstanceRequirements",
                                  "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeInstanceTypes",
                                  "eks:DescribeNodegroup", "autoscaling:DescribeAutoScalingGroups"}
    assert needed_for_scale_from_zero <= set(actions)


def test_release_waits_for_its_pod_identity(run):
    release = run.one(RELEASE)
    association = run.one(ASSOCIATION)
    assert association.inputs["clusterName"] == CLUSTER
    assert association.inputs["namespace"] == release.inputs["namespace"]
    assert association.inputs["serviceAccount"] == _values(run)["rbac"]["serviceAccount"]["name"]
    assert association.urn in release.dependencies, "pods admitted before the association get no credentials"


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one(COMPONENT, "autoscaler")
    by_urn = {r.urn: r for r in run.resources}

    def under_component(resource) -> bool:
        parent = resource.parent
        while parent and parent != component.urn:
            parent = by_urn[parent].parent if parent in by_urn else None
        return parent == component.urn

    children = [r for r in run.resources if under_component(r)]
    strays = [r.name for r in run.resources if r not in children and r.urn != component.urn and r.type != K8S_PROVIDER]
    assert not strays, f"registered outside the component: {strays}"
    assert children and all(r.name.startswith("autoscaler-") for r in children)


# --- decisions/nodes/autoscaling.py ----------------------------------------------------------------------------------

@pytest.mark.parametrize("priorities", [{}, {0: ["^a$"]}, {-5: ["^a$"]}, {10: []}, {10: "^a$"}, {True: ["^a$"]}])
def test_priority_config_rejects_what_the_expander_would_ignore(priorities):
    with pytest.raises(ValueError):
        autoscaling.priority_config(priorities)


def test_exact_name_regex_escapes_re2_metacharacters():
    pattern = autoscaling.exact_name_regex("pool.v2+(a)")
    assert re.fullmatch(pattern, "pool.v2+(a)")
    assert not re.fullmatch(pattern, "poolXv2+(a)")
    assert pattern.startswith("^") and pattern.endswith("$")


def test_restrictable_actions_name_this_clusters_resources(run):
    statements = {s["Sid"]: s for s in json.loads(run.one(ROLE_POLICY).inputs["policy"])["Statement"]}
    assert statements["ScaleOwnNodeGroups"]["Resource"] == list(ASG_ARNS)          # and the tag condition above
    assert statements["DescribeOwnManagedNodeGroups"] == {
        "Sid": "DescribeOwnManagedNodeGroups", "Effect": "Allow", "Action": "eks:DescribeNodegroup",
        "Resource": f"arn:aws:eks:{REGION}:123456789012:nodegroup/{CLUSTER}/*/*"}
    assert "*" not in [s["Resource"] for s in statements.values() if "eks:DescribeNodegroup" in _as_list(s["Action"])]


def test_policy_needs_the_asgs_and_a_plain_cluster_name():
    with pytest.raises(ValueError):
        autoscaling.autoscaler_policy_statements(CLUSTER, [], NODEGROUPS)
    with pytest.raises(ValueError):
        autoscaling.autoscaler_policy_statements("a/b", ASG_ARNS, NODEGROUPS)


# --- decisions/catalog/charts.py
# ---------------------------------------------------------------------------------------

def test_every_supported_kubernetes_version_has_an_image_pin():
    assert set(supported_kubernetes_versions()) <= set(charts.autoscaler_minors())
    for version in supported_kubernetes_versions():
        assert charts.autoscaler_image(f"{version}.4") == charts.autoscaler_image(version)


def _write_pins(tmp_path: Path, tags: Dict[str, str]) -> Path:
    data = yaml.safe_load(charts.CHARTS_PATH.read_text())
    data["clusterAutoscalerImage"]["tags"] = tags
    path = tmp_path / "charts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("tags", [
    {"1.32": "v1.32.6"},           # amd64 image ships an arm64 binary
    {"1.33": "v1.32.7"},           # minor mismatch
    {"1.34": "1.34.5"},            # not a v-prefixed release tag
])
def test_charts_file_rejects_bad_image_pins(tmp_path, tags):
    with pytest.raises(ValueError):
        charts.load_charts(_write_pins(tmp_path, tags))


def test_chart_pins_point_at_the_official_repositories():
    nth = charts.chart(charts.NODE_TERMINATION_HANDLER)
    assert nth.is_oci and nth.repository == "oci://public.ecr.aws/aws-ec2/helm"
    ca = charts.chart(charts.CLUSTER_AUTOSCALER)
    assert not ca.is_oci and ca.chart_ref == "cluster-autoscaler"
    with pytest.raises(KeyError):
        charts.chart("karpenter")


def test_it_runs_on_the_system_nodes_past_their_taint_with_values_the_chart_has(run):
    from decisions.nodes.pods import SYSTEM_NODE_LABELS, SYSTEM_NODE_TAINT, tolerates
    from tests.chart_values import assert_values_confirmed

    values = _values(run)
    assert values["nodeSelector"] == SYSTEM_NODE_LABELS
    assert tolerates(values["tolerations"], SYSTEM_NODE_TAINT)
    placement = {key: values[key] for key in autoscaling.AUTOSCALER_PLACEMENT_VALUE_PATHS}
    assert_values_confirmed(placement, charts.chart(charts.CLUSTER_AUTOSCALER), autoscaling.AUTOSCALER_PLACEMENT_VALUE_PATHS)


# --- scale from zero: the autoscaler's template node, as cluster-autoscaler 1.35.2 builds it ------------------------
# The stacks run Kubernetes 1.35, so the autoscaler is v1.35.2 (decisions/catalog/charts.yaml); its source, at tag
# cluster-autoscaler-1.35.2 of kubernetes/autoscaler, is what this section imitates, line by line:
# - cloudprovider/aws/aws_cloud_provider.go:403-416 TemplateNodeInfo: buildNodeFromTemplate's node, with one pod
#   already on it, cloudprovider.BuildKubeProxy (cloudprovider/utils.go:75-113: 100m CPU, KubeProxyCpuRequestMillis);
# - cloudprovider/aws/aws_manager.go:268-342 buildNodeFromTemplate: capacity pods 110, cpu = the type's vCPUs,
#   nvidia.com/gpu = its GPUs, memory = its MiB x 2^20 (:283-286); then every `.../node-template/resources/<name>` tag
#   overwrites capacity[<name>] (:290-294, extractAllocatableResourcesFromAsg :441-461: a value ParseQuantity refuses
#   is skipped); allocatable IS capacity (:297), so a tag states allocatable, not capacity; labels: the generic ones
#   (buildGenericLabels :389-402) then every `.../node-template/label/<key>` tag, or the part after `eks:` of any key
#   (extractLabelsFromAsg :404-424); taints from `.../node-template/taint/<key>` tags whose value matches
#   `(.*):(?:NoSchedule|NoExecute|PreferNoSchedule)`, value and effect split at the first colon
#   (extractTaintsFromAsg :484-507);
# - the type is the first override of a mixed-instances policy, else the launch template's (aws_wrapper.go:754-808);
#   its vCPUs, MiB and GPUs come from DescribeInstanceTypes at start (aws_util.go:34-79, BuildAWS
#   aws_cloud_provider.go:419-460), the static list ec2_instance_types.go as fallback (CA_INSTANCE_TYPES below);
# - simulator/node_info_utils.go:45-89: the node is then sanitized (a new name, the template-node label) and given
#   the DaemonSet pods that would run on it. Those are not modelled here: most come from charts, which the offline
#   run does not expand; what they ask for must fit in what a template leaves of the node.
# The scheduler's Filter decides whether a pending pod fits that node: requests per resource (a pod asks the larger of
# its containers' sum and its largest init container), the pod count, taints (NoSchedule and NoExecute), nodeSelector
# and required node affinity. Kueue first adds its flavor's node labels and tolerations to the pods of every pod set
# that asks for a resource the queue covers (decisions/platform/kueue.py).
ASG = "aws:autoscaling/group:Group"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
LABEL_TAG, TAINT_TAG = "k8s.io/cluster-autoscaler/node-template/label/", "k8s.io/cluster-autoscaler/node-template/taint/"
RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
TAINT_VALUE = re.compile(r"(.*):(?:NoSchedule|NoExecute|PreferNoSchedule)")
# What the autoscaler reads each type the stacks use as (VCPU, MemoryMb, GPU, Architecture): ec2_instance_types.go at
# the tag (StaticListLastUpdateTime 2026-01-22), lines 5075, 5082, 5089, 2247, 2191 and 2093.
CA_INSTANCE_TYPES = {
    "p4d.24xlarge": (96, 1179648, 8, "amd64"),
    "p4de.24xlarge": (96, 1179648, 8, "amd64"),
    "p5.48xlarge": (192, 2097152, 8, "amd64"),
    "g6e.12xlarge": (48, 393216, 4, "amd64"),
    "g6.12xlarge": (48, 196608, 4, "amd64"),
    "g5.12xlarge": (48, 196608, 4, "amd64"),
}
KUBE_PROXY_CPU = Fraction(1, 10)
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": Fraction(1, 1000), "": 1}


def quantity(text) -> Fraction:
    """A Kubernetes quantity in the forms the tags and templates use (a number with a binary or decimal suffix, or
    millis) as an exact number; None for anything else, as ParseQuantity refuses what is no quantity (exponent forms,
    which it takes, are not used here)."""
    match = re.fullmatch(r"([+-]?[0-9]+(?:\.[0-9]*)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|)", str(text))
    return Fraction(match[1]) * _SUFFIXES[match[2]] if match else None


@dataclass(frozen=True)
class TemplateNode:
    pool: str
    instance_type: str
    labels: Dict[str, str]
    taints: tuple
    allocatable: Dict[str, Fraction]
    requested: Dict[str, Fraction]        # by the pods CA puts on it: kube-proxy
    pods: int


def template_node(run, asg) -> TemplateNode:
    """The node cluster-autoscaler 1.35.2 imagines for an empty `asg` (a registered Group) of `run`."""
    mixed = asg.inputs.get("mixedInstancesPolicy")
    if mixed:
        itype = mixed["launchTemplate"]["overrides"][0]["instanceType"]
    else:
        [template] = [lt for lt in run.of_type(LAUNCH_TEMPLATE) if lt.id == asg.inputs["launchTemplate"]["id"]]
        itype = template.inputs["instanceType"]
    vcpu, memory_mb, gpus, arch = CA_INSTANCE_TYPES[itype]
    capacity = {"pods": Fraction(110), "cpu": Fraction(vcpu), "nvidia.com/gpu": Fraction(gpus),
                "memory": Fraction(memory_mb * 1024 * 1024)}
    tags = {tag["key"]: tag["value"] for tag in asg.inputs["tags"]}
    for key, value in tags.items():
        parts = key.split(RESOURCE_TAG)
        if len(parts) > 1 and parts[1] and quantity(value) is not None:
            capacity[parts[1]] = quantity(value)
    labels = {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": itype,
              "topology.kubernetes.io/region": run.region, "kubernetes.io/hostname": f"{asg.inputs['name']}-asg-1",
              # the zone labels name the group's first zone, which offline mocks do not resolve: left out, so a
              # template that selected a zone would not fit here and fail loudly
              "cluster-autoscaler.kubernetes.io/template-node": "true"}
    taints = []
    for key, value in tags.items():
        parts = key.split(LABEL_TAG)
        if len(parts) <= 1:
            parts = key.split("eks:")
        if len(parts) > 1 and parts[1]:
            labels[parts[1]] = value
        if TAINT_VALUE.search(value):
            taint_parts = key.split(TAINT_TAG)
            if len(taint_parts) > 1:
                taint_value, _, effect = value.partition(":")
                taints.append(Taint(taint_parts[1], taint_value, effect))
    pool = asg.inputs["name"].removeprefix(f"gpu-cloud-{run.stack}-")
    return TemplateNode(pool=pool, instance_type=itype, labels=labels, taints=tuple(taints), allocatable=capacity,
                        requested={"cpu": KUBE_PROXY_CPU}, pods=1)


def pod_requests(pod: dict) -> Dict[str, Fraction]:
    """What the scheduler counts for a pod: per resource the larger of its containers' sum (with restartable init
    containers) and each ordinary init container's own (plus the restartable ones started before it); a container's
    request defaults to its limit."""
    def requests(container) -> Dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity(value) for name, value in merged.items()}

    def add(into, more):
        for name, value in more.items():
            into[name] = into.get(name, 0) + value

    sidecars: Dict[str, Fraction] = {}
    peak: Dict[str, Fraction] = {}
    for init in pod.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":
            add(sidecars, requests(init))
            continue
        candidate = dict(sidecars)
        add(candidate, requests(init))
        peak = {name: max(peak.get(name, 0), candidate.get(name, 0)) for name in {*peak, *candidate}}
    total = dict(sidecars)
    for container in pod["containers"]:
        add(total, requests(container))
    return {name: max(total.get(name, 0), peak.get(name, 0)) for name in {*total, *peak}}


def _term_matches(term: dict, labels: Mapping[str, str]) -> bool:
    for expression in term.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present, value = key in labels, labels.get(key)
        if not {"In": present and value in values, "NotIn": not present or value not in values,
                "Exists": present, "DoesNotExist": not present,
                "Gt": present and value.isdigit() and int(value) > int(values[0]),
                "Lt": present and value.isdigit() and int(value) < int(values[0])}[operator]:
            return False
    return not term.get("matchFields")


def misfits(pod: dict, node: TemplateNode) -> List[str]:
    """Why the scheduler would not place `pod` on `node` (nothing when it fits)."""
    reasons = []
    for name, wanted in sorted(pod_requests(pod).items()):
        free = node.allocatable.get(name, 0) - node.requested.get(name, 0)
        if wanted > free:
            reasons.append(f"{name}: asks {float(wanted):g}, the template node has {float(free):g}")
    if node.pods + 1 > node.allocatable["pods"]:
        reasons.append(f"pods: the template node holds {node.allocatable['pods']}")
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not tolerates(pod.get("tolerations") or [], taint):
            reasons.append(f"taint {taint.key}={taint.value}:{taint.effect} not tolerated")
    for key, value in (pod.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            reasons.append(f"nodeSelector {key}={value}: the template node has {node.labels.get(key)!r}")
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if required is not None and not any(_term_matches(term, node.labels) for term in required):
        reasons.append(f"required node affinity {required} matches no label of the template node")
    return reasons


# What `python -m jobs` renders for a pool, one command line each; a pool a command refuses (exit 2) is skipped.
JOB_COMMANDS = {
    "job": ["job", "--name", "fit", "--image", "example.com/train:1", "--", "python", "train.py"],
    "job --gpus 1": ["job", "--name", "fit", "--image", "example.com/train:1", "--gpus", "1", "--", "python",
                     "train.py"],
    "mpijob": ["mpijob", "--name", "fit", "--image", "example.com/train:1", "--", "python", "train.py"],
    "pytorch-job": ["pytorch-job", "--name", "fit", "--image", "example.com/train:1", "--", "train.py"],
    "nccl-acceptance": ["nccl-acceptance"],
}


def rendered(stack: str, pool: str, command: List[str]):
    """The manifest `python -m jobs` prints for `command` on `pool` of `stack`, or None where it refuses the pool."""
    out, err = io.StringIO(), io.StringIO()
    argv = [command[0], stack, "--pool", pool, *command[1:]]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = jobs_main(argv)
    if code != 0:
        return None
    return yaml.safe_load(out.getvalue())


def pod_sets(manifest: dict) -> Dict[str, dict]:
    """Each pod template of a rendered job by its pod set: the Job's, a JobSet's per replicated job, an MPIJob's
    per replica type."""
    kind = manifest["kind"]
    if kind == "Job":
        return {"main": manifest["spec"]["template"]["spec"]}
    if kind == "JobSet":
        return {job["name"]: job["template"]["spec"]["template"]["spec"] for job in manifest["spec"]["replicatedJobs"]}
    return {role: spec["template"]["spec"] for role, spec in manifest["spec"]["mpiReplicaSpecs"].items()}


def admitted(pod: dict, flavor) -> dict:
    """The pod as Kueue starts it on `flavor`: the flavor's node labels joined to its nodeSelector and its
    tolerations added (a pod set asking for nothing the queue covers gets no flavor and is left alone)."""
    if flavor is None or not set(pod_requests(pod)) & set(flavor.quotas):
        return pod
    return {**pod, "nodeSelector": {**(pod.get("nodeSelector") or {}), **flavor.node_labels},
            "tolerations": [*(pod.get("tolerations") or []), *(toleration(t) for t in flavor.tolerations)]}


@pytest.fixture(scope="module")
def template_nodes(stack_runs):
    return {stack: {node.pool: node for node in (template_node(stack_runs[stack], asg)
                                                 for asg in stack_runs[stack].of_type(ASG))} for stack in STACKS}


def _stack_spec(stack: str):
    return load_stack(stack)[1]


def test_the_catalog_gives_every_type_what_the_autoscaler_reads_it_as():
    catalog = load_catalog()
    for name, (vcpu, memory_mb, gpus, _) in CA_INSTANCE_TYPES.items():
        itype = catalog.instance_types[name]
        assert (itype.vcpu, itype.memory_gib * 1024, itype.gpu.count) == (vcpu, memory_mb, gpus), name


@pytest.mark.parametrize("stack", STACKS)
def test_every_job_the_cli_renders_fits_the_template_node_of_its_pool(template_nodes, stack):
    spec = _stack_spec(stack)
    flavors = {flavor.name: flavor for flavor in kueue_rules.flavors(spec.pools, spec.catalog)}
    failures, rendered_on = [], {}
    for pool in spec.pools:
        node = template_nodes[stack][pool.name]
        for label, command in JOB_COMMANDS.items():
            manifest = rendered(stack, pool.name, command)
            if manifest is None:
                continue
            rendered_on.setdefault(pool.name, []).append(label)
            for pod_set, pod in pod_sets(manifest).items():
                reasons = misfits(admitted(pod, flavors.get(queue_flavor(pool) or "")), node)
                if reasons:
                    failures.append(f"{pool.name} (minNodes {pool.spec.min_nodes}) {label} {pod_set}: "
                                    + "; ".join(reasons))
    assert set(rendered_on) == {p.name for p in spec.pools if queue_flavor(p)}, "every queue pool renders a job"
    assert not failures, "\n".join(failures)


# --- discovery: the GPU groups, and only they ---------------------------------------------------------------------
# The chart passes autoDiscovery.tags joined by commas as --node-group-auto-discovery=asg:tag=... (chart 9.59.0
# templates/deployment.yaml line 89). cluster-autoscaler 1.35.2 parses each comma-separated item as a key or key=value
# (cloudprovider/aws/aws_manager.go:530-567), and finds the groups that match all of them in one
# DescribeAutoScalingGroups call: a key alone is a `tag-key` filter, key=value a `tag:<key>` filter (aws_wrapper.go
# :208-250); the API ANDs filters.
# EKS tags the Auto Scaling group of every managed node group for that discovery (EKS User Guide, "Simplify node
# lifecycle with managed node groups": "automatically tagged for auto-discovery by the Kubernetes Cluster Autoscaler"),
# with the two keys the autoscaler's README gives (cloudprovider/aws/README.md lines 163-173 at the tag), and names it
# by its node group (eks:nodegroup-name, README line 512; the group's own name is eks-<nodegroup>-<uuid>).
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def eks_managed_group_tags(cluster: str, nodegroup: str) -> Dict[str, str]:
    return {"eks:cluster-name": cluster, "eks:nodegroup-name": nodegroup, "k8s.io/cluster-autoscaler/enabled": "true",
            f"k8s.io/cluster-autoscaler/{cluster}": "owned", f"kubernetes.io/cluster/{cluster}": "owned"}


def discovered(discovery_tags: List[str], group_tags: Mapping[str, str]) -> bool:
    spec = "asg:tag=" + ",".join(discovery_tags)
    wanted = {}
    for item in spec.split(":", 1)[1].split("=", 1)[1].split(","):
        key, _, value = item.partition("=")
        wanted[key] = value
    return all(key in group_tags and (not value or group_tags[key] == value) for key, value in wanted.items())


def _iam_matches(pattern: str, text: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), text) is not None


def may_scale(statements: List[dict], arn: str, group_tags: Mapping[str, str]) -> bool:
    """Whether the policy allows both of the autoscaler's mutating calls on the group (an IAM evaluation of Allow
    statements with Resource patterns and StringEquals on aws:ResourceTag, the only forms it uses)."""
    def allows(action: str) -> bool:
        for statement in statements:
            if statement["Effect"] != "Allow" or action not in _as_list(statement["Action"]):
                continue
            if not any(_iam_matches(pattern, arn) for pattern in _as_list(statement["Resource"])):
                continue
            conditions = statement.get("Condition") or {}
            assert set(conditions) <= {"StringEquals"}, conditions
            if all(group_tags.get(key.removeprefix("aws:ResourceTag/")) == value
                   for key, value in (conditions.get("StringEquals") or {}).items()):
                return True
        return False
    return all(allows(action) for action in autoscaling.MUTATING_ACTIONS)


@pytest.mark.parametrize("stack", STACKS)
def test_the_autoscaler_discovers_and_may_scale_exactly_the_gpu_groups(stack_runs, stack):
    run = stack_runs[stack]
    cluster = f"gpu-cloud-{stack}"
    [release] = [r for r in run.of_type(RELEASE) if r.inputs["chart"] == "cluster-autoscaler"]
    discovery = release.inputs["values"]["autoDiscovery"]["tags"]
    [policy] = [r for r in run.of_type(ROLE_POLICY) if r.name.startswith("autoscaler-")]
    statements = json.loads(policy.inputs["policy"])["Statement"]
    account = "123456789012"
    groups = {asg.inputs["name"]: ({tag["key"]: tag["value"] for tag in asg.inputs["tags"]}, asg.inputs["name"])
              for asg in run.of_type(ASG)}
    gpu_groups = set(groups)
    for node_group in run.of_type(NODE_GROUP):
        node_group_name = node_group.state.get("nodeGroupName") or node_group.name
        name = f"eks-{node_group_name}-0ac12345-6789-abcd-ef01-23456789abcd"
        groups[name] = (eks_managed_group_tags(cluster, node_group_name), name)
    assert len(groups) > len(gpu_groups), "the system node group is in the plan"
    found = {name for name, (tags, _) in groups.items() if discovered(discovery, tags)}
    arn = "arn:aws:autoscaling:{region}:{account}:autoScalingGroup:1b2c3d4e-aaaa-bbbb-cccc-0123456789ab:" \
          "autoScalingGroupName/{name}"
    scalable = {name for name, (tags, group) in groups.items()
                if may_scale(statements, arn.format(region=run.region, account=account, name=group), tags)}
    assert found == gpu_groups, f"discovered {sorted(found)}"
    assert scalable == found


def _node_config(run, asg) -> dict:
    """The nodeadm NodeConfig a node of `asg` boots with, from its launch template's user-data."""
    template_id = (asg.inputs.get("mixedInstancesPolicy") or {}).get("launchTemplate", {}).get(
        "launchTemplateSpecification", {}).get("launchTemplateId") or asg.inputs["launchTemplate"]["id"]
    [template] = [lt for lt in run.of_type(LAUNCH_TEMPLATE) if lt.id == template_id]
    parts = email.message_from_string(base64.b64decode(template.inputs["userData"]).decode())
    [config] = [part.get_payload() for part in parts.walk() if part.get_content_type() == "application/node.eks.aws"]
    return yaml.safe_load(config), template


@pytest.mark.parametrize("stack", STACKS)
def test_the_template_node_offers_pods_what_the_node_it_stands_for_will(stack_runs, template_nodes, stack):
    """Pods: the kubelet's maxPods in the node's own user-data. Ephemeral storage: the kubelet's allocatable on the
    filesystem that holds /var/lib/kubelet, the RAID0 array over every instance-store disk where the user-data asks
    nodeadm for it, else the launch template's root volume: capacity less nodeadm's nodefs.available 10 % and
    kube-reserved 1 GiB (decisions/nodes/scratch.py)."""
    run, catalog = stack_runs[stack], load_catalog()
    for asg in run.of_type(ASG):
        node = template_nodes[stack][asg.inputs["name"].removeprefix(f"gpu-cloud-{stack}-")]
        config, template = _node_config(run, asg)
        assert node.allocatable["pods"] == config["spec"]["kubelet"]["config"]["maxPods"], node.pool
        store = catalog.instance_types[node.instance_type].instance_store
        raid0 = (config["spec"].get("instance", {}).get("localStorage") or {}).get("strategy") == "RAID0"
        [root] = template.inputs["blockDeviceMappings"]
        capacity_gib = store.total_gb * 10**9 // 2**30 if raid0 and store.disks else root["ebs"]["volumeSize"]
        assert node.allocatable["ephemeral-storage"] == (capacity_gib * 9 // 10 - 1) * 2**30, node.pool


def test_tritons_rollouts_surge_by_the_kubernetes_default_the_pool_size_rule_counts(stack_runs):
    # decisions/nodes/autoscaling.ROLLOUT_MAX_SURGE_PCT is the default of a Deployment that states no strategy
    (triton,) = [d for d in stack_runs["prod-us-east-1"].of_type("kubernetes:apps/v1:Deployment")
                 if d.name == "inference-deployment"]
    assert "strategy" not in triton.inputs["spec"] and autoscaling.ROLLOUT_MAX_SURGE_PCT == 25


@pytest.mark.parametrize("stores, nvme_scratch, storage", [
    # (disks, GB each) of each type's instance store, first type first -> what every node of the pool offers pods
    (((8, 3800), (8, 3800)), True, "25479Gi"),   # p5.48xlarge: 30,400 GB = 28,312 GiB in RAID0, less 10 % and 1 GiB
    (((8, 3800), (4, 3800)), True, "12739Gi"),   # a type of half the disks: its 14,156 GiB array, the least of the two
    (((8, 3800), (0, 0)), True, "449Gi"),        # a type without instance store keeps emptyDirs on the 500 GiB root
    # the first type has none, so the user-data asks for no RAID0 and even the 125 GB disk (103 GiB) goes unused
    (((0, 0), (1, 125)), True, "449Gi"),
    (((8, 3800), (8, 3800)), False, "449Gi"),    # storage.nvmeScratch off: the root volume
])
def test_a_pool_of_several_types_advertises_the_storage_every_node_has(stores, nvme_scratch, storage):
    train = load(valid_config()).pools[0]
    p5 = train.primary_type
    types = tuple(p5.model_copy(update={"instance_store": p5.instance_store.model_copy(
        update={"disks": disks, "disk_gb": gb})}) for disks, gb in stores)
    pool = ResolvedPool(spec=train.spec, types=types, efa=train.efa)
    assert autoscaling.node_template_resources(pool, nvme_scratch)["ephemeral-storage"] == storage
