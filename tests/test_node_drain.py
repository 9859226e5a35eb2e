"""components/nodes/node_drain.py under the mock engine, and the pure decisions in decisions/nodes/drain.py.

What users rely on: every kind of "this node is going away" event reaches the queue; only our rules can
write to it; the handler runs the pinned chart in queue mode against that queue with the drain timings of
the workload contract; it may complete lifecycle actions on our pools and nowhere else; it never starts
before its Pod Identity association exists.
"""
from __future__ import annotations

import json
from typing import Dict, List

import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from components.nodes.node_drain import NodeDrain, NodeDrainArgs
from decisions.catalog import charts
from decisions.nodes import drain
from tests.conftest import run_component

REGION = "eu-west-1"
CLUSTER = "gpu-cloud-prod"
ASG_NAMES = ("gpu-cloud-prod-train", "gpu-cloud-prod-spot")
ASG_ARNS = tuple(f"arn:aws:autoscaling:{REGION}:123456789012:autoScalingGroup:*:autoScalingGroupName/{name}"
                 for name in ASG_NAMES)

COMPONENT = "gpu-cloud:node_drain:NodeDrain"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
QUEUE = "aws:sqs/queue:Queue"
QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
RELEASE = "kubernetes:helm.sh/v3:Release"
K8S_PROVIDER = "pulumi:providers:kubernetes"


def _build(asg_names=ASG_NAMES, asg_arns=ASG_ARNS):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        NodeDrain("drain", NodeDrainArgs(cluster_name=CLUSTER, region=REGION, asg_names=tuple(asg_names),
                                         asg_arn_patterns=tuple(asg_arns)),
                  opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build(), region=REGION)


def _statements(document: str) -> List[Dict]:
    return json.loads(document)["Statement"]


def _as_list(value) -> List:
    return value if isinstance(value, list) else [value]


# --- events -> queue -------------------------------------------------------------------------------------

def test_five_rules_each_deliver_to_the_queue(run):
    rules = run.of_type(RULE)
    targets = run.of_type(TARGET)
    queue = run.one(QUEUE)
    assert len(rules) == 5 and len(targets) == 5
    rule_urns = {r.urn for r in rules}
    targeted = []
    for target in targets:
        assert target.inputs["arn"] == queue.state["arn"], f"{target.name} does not deliver to the drain queue"
        deps = [d for d in target.dependencies if d in rule_urns]
        assert len(deps) == 1, f"{target.name} must belong to exactly one rule, got {deps}"
        targeted.append(deps[0])
    assert sorted(targeted) == sorted(rule_urns), "every rule needs exactly one target"


def test_rules_match_every_event_that_takes_a_node_away(run):
    patterns = [json.loads(r.inputs["eventPattern"]) for r in run.of_type(RULE)]
    kinds = {(p["source"][0], p["detail-type"][0]) for p in patterns}
    assert kinds == {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
        ("aws.ec2", "EC2 Instance State-change Notification"),
        ("aws.health", "AWS Health Event"),
        ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"),
    }
    by_source = {p["detail-type"][0]: p for p in patterns}
    health = by_source["AWS Health Event"]["detail"]
    assert health == {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]}
    lifecycle = by_source["EC2 Instance-terminate Lifecycle Action"]["detail"]
    assert sorted(lifecycle["AutoScalingGroupName"]) == sorted(ASG_NAMES), "lifecycle rule must name only our pools"
    states = by_source["EC2 Instance State-change Notification"]["detail"]["state"]
    assert set(states) == {"stopping", "stopped", "shutting-down", "terminated"}


def test_queue_is_encrypted_and_drops_stale_notices(run):
    queue = run.one(QUEUE).inputs
    assert queue.get("sqsManagedSseEnabled") is True
    assert "kmsMasterKeyId" not in queue, "SSE-SQS and a KMS key are mutually exclusive"
    assert queue["messageRetentionSeconds"] == 300


def test_queue_policy_admits_exactly_our_rules(run):
    queue = run.one(QUEUE)
    policy = run.one(QUEUE_POLICY)
    assert policy.inputs["queueUrl"] == queue.state["url"]
    statements = _statements(policy.inputs["policy"])
    allows = [s for s in statements if s["Effect"] == "Allow"]
    assert len(allows) == 1
    allow = allows[0]
    assert allow["Action"] == "sqs:SendMessage"
    assert allow["Resource"] == queue.state["arn"]
    assert allow["Principal"]["Service"] == "events.amazonaws.com"      # only EventBridge delivers here
    source_arns = allow["Condition"]["ArnEquals"]["aws:SourceArn"]
    assert sorted(source_arns) == sorted(r.state["arn"] for r in run.of_type(RULE))
    deny = [s for s in statements if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


# --- the handler ------------------------------------------------------------------------------------------

def test_nth_release_is_pinned_and_runs_in_queue_mode(run):
    release = run.one(RELEASE)
    pin = charts.chart(charts.NODE_TERMINATION_HANDLER)
    assert release.inputs["chart"] == "oci://public.ecr.aws/aws-ec2/helm/aws-node-termination-handler"
    assert release.inputs["version"] == pin.version
    assert release.inputs["namespace"] == "kube-system"
    assert release.provider.startswith(run.one(K8S_PROVIDER).urn), "must deploy with the caller's cluster provider"
    values = release.inputs["values"]
    assert values["enableSqsTerminationDraining"] is True
    assert values["queueURL"] == run.one(QUEUE).state["url"]
    assert values["awsRegion"] == REGION
    # The contract's timings: NTH's drain window ends before the termination hook; pods keep their own grace.
    assert values["nodeTerminationGracePeriod"] == drain.NTH_NODE_TERMINATION_GRACE_S
    assert drain.NODE_DRAIN_GRACE_S <= values["nodeTerminationGracePeriod"] < drain.LIFECYCLE_DRAIN_TIMEOUT_S
    assert values["podTerminationGracePeriod"] == -1
    # NTH drains only instances the pools tagged at launch (the ASGs propagate this tag).
    assert values["checkTagBeforeDraining"] is True and values["checkASGTagBeforeDraining"] is True
    assert values["managedTag"] == drain.NTH_MANAGED_TAG
    assert values["deleteSqsMsgIfNodeNotFound"] is True


def test_nth_identity_matches_its_service_account_and_is_ready_first(run):
    release = run.one(RELEASE)
    association = run.one(ASSOCIATION)
    assert association.inputs["namespace"] == release.inputs["namespace"]
    assert association.inputs["serviceAccount"] == release.inputs["values"]["serviceAccount"]["name"]
    assert association.inputs["clusterName"] == CLUSTER
    assert association.inputs["roleArn"] == run.one(ROLE).state["arn"]
    assert association.urn in release.dependencies, "pods admitted before the association get no credentials"
    assert run.one(ROLE_POLICY).urn in release.dependencies


def test_nth_role_is_least_privilege(run):
    role = run.one(ROLE)
    trust = _statements(role.inputs["assumeRolePolicy"])
    assert trust[0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    statements = _statements(run.one(ROLE_POLICY).inputs["policy"])
    assert all(s["Effect"] == "Allow" for s in statements)
    by_action = {a: s for s in statements for a in _as_list(s["Action"])}
    assert sorted(_as_list(by_action["autoscaling:CompleteLifecycleAction"]["Resource"])) == sorted(ASG_ARNS)
    queue_arn = run.one(QUEUE).state["arn"]
    assert by_action["sqs:ReceiveMessage"]["Resource"] == queue_arn
    assert by_action["sqs:DeleteMessage"]["Resource"] == queue_arn
    wildcard = {a for s in statements if "*" in _as_list(s["Resource"]) for a in _as_list(s["Action"])}
    assert wildcard == {"autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeTags", "ec2:DescribeInstances"}
    assert not any("*" in a for a in by_action), "no wildcard actions"


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one(COMPONENT, "drain")
    by_urn = {r.urn: r for r in run.resources}
    descendants = []
    for resource in run.resources:
        parent = resource.parent
        while parent and parent != component.urn:
            parent = by_urn[parent].parent if parent in by_urn else None
        if parent == component.urn:
            descendants.append(resource)
    others = [r for r in run.resources if r not in descendants and r.urn != component.urn and r.type != K8S_PROVIDER]
    assert not others, f"registered outside the component: {[r.name for r in others]}"
    assert all(r.name.startswith("drain-") for r in descendants)
    assert len(descendants) >= 5 + 5 + 1 + 1 + 3 + 1


def test_no_pools_is_an_error_before_anything_registers():
    with pytest.raises(Exception, match="asg_names"):
        run_component(_build(asg_names=(), asg_arns=()), region=REGION)


# --- decisions/nodes/drain.py ----------------------------------------------------------------------------------------

def test_drain_timeline_fits_inside_the_termination_hook():
    # A pod using the whole contract grace, evicted after event delivery, must be gone before NTH stops
    # waiting, and NTH must complete the lifecycle action before the hook expires.
    assert drain.WORKLOAD_MAX_GRACE_S + drain.DRAIN_DELIVERY_MARGIN_S <= drain.NTH_NODE_TERMINATION_GRACE_S
    assert drain.NTH_NODE_TERMINATION_GRACE_S + drain.DRAIN_DELIVERY_MARGIN_S <= drain.LIFECYCLE_DRAIN_TIMEOUT_S
    assert drain.SPOT_CHECKPOINT_BUDGET_S + drain.QUEUE_LONG_POLL_S <= drain.NODE_DRAIN_GRACE_S == 120
    assert drain.LIFECYCLE_DRAIN_TIMEOUT_S <= 7200, "ASG lifecycle hook heartbeat timeout is at most 7200 s"


@pytest.mark.parametrize("kwargs", [
    {"node_termination_grace_s": drain.LIFECYCLE_DRAIN_TIMEOUT_S},   # would outlive the hook
    {"node_termination_grace_s": 60},                                # shorter than the spot notice
    {"pod_termination_grace_s": drain.NTH_NODE_TERMINATION_GRACE_S + 1},
    {"pod_termination_grace_s": 0},
])
def test_nth_values_reject_inconsistent_grace_periods(kwargs):
    with pytest.raises(ValueError):
        drain.nth_values("https://sqs.example/q", REGION, **kwargs)


def test_managed_tag_turns_on_the_tag_check():
    default = drain.nth_values("q", REGION)
    assert default["checkTagBeforeDraining"] is False and "managedTag" not in default
    tagged = drain.nth_values("q", REGION, managed_tag="gpu-cloud:pool")
    assert tagged["checkTagBeforeDraining"] is True and tagged["checkASGTagBeforeDraining"] is True
    assert tagged["managedTag"] == "gpu-cloud:pool"


def test_nth_serves_metrics_without_its_own_service_monitor():
    default = drain.nth_values("q", REGION)
    assert default["enablePrometheusServer"] is True
    assert default["prometheusServerPort"] == drain.NTH_METRICS_PORT
    assert "serviceMonitor" not in default, "the chart has no CRD check: components/monitoring.py makes it"


def test_every_nth_value_is_at_its_line_in_the_pinned_chart(run):
    from tests.chart_values import assert_values_confirmed

    pin = charts.chart(charts.NODE_TERMINATION_HANDLER)
    full = drain.nth_values("q", REGION, managed_tag=drain.NTH_MANAGED_TAG)
    assert_values_confirmed(full, pin, drain.NTH_VALUE_PATHS)
    values = dict(run.one(RELEASE).inputs["values"])
    assert_values_confirmed(values, pin, drain.NTH_VALUE_PATHS)


def test_lifecycle_pattern_needs_explicit_pool_names():
    with pytest.raises(ValueError):
        drain.asg_terminate_pattern([])
    with pytest.raises(TypeError):
        drain.asg_terminate_pattern("gpu-cloud-prod-train")
    assert drain.asg_terminate_pattern(["b", "a", "b"])["detail"]["AutoScalingGroupName"] == ["a", "b"]


def test_policies_refuse_empty_resource_lists():
    with pytest.raises(ValueError):
        drain.nth_policy_statements("arn:aws:sqs:eu-west-1:1:q", [])
    with pytest.raises(ValueError):
        drain.queue_policy_statements("arn:aws:sqs:eu-west-1:1:q", [])
