"""components/nodes/autoscaler.py under the mock engine, and the pure decisions in decisions/nodes/autoscaling.py and
decisions/catalog/charts.py.

What users rely on: the pinned chart runs an autoscaler whose minor equals the cluster's, for every
supported Kubernetes version; it discovers this cluster's pools (and only those) by tag; it grows reserved
capacity before spot before on-demand; it can change only ASGs tagged as this cluster's; it never starts
before its Pod Identity association exists.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.nodes.autoscaler import AutoscalerArgs, ClusterAutoscaler
from decisions.catalog import charts
from decisions.config.validate import supported_kubernetes_versions
from decisions.nodes import autoscaling, boot, drain
from tests.conftest import run_component

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
    assert set(discovery["tags"]) == {"k8s.io/cluster-autoscaler/enabled", f"k8s.io/cluster-autoscaler/{CLUSTER}"}


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
            assert condition[f"aws:ResourceTag/k8s.io/cluster-autoscaler/{CLUSTER}"] == "owned"
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
