"""The pure decisions in decisions/serving/lb_controller.py: the AWS Load Balancer Controller's Helm values, IAM policy
and the Service annotations that get Triton its NLB.

What users rely on: the controller is the pinned release, runs twice on system nodes without the instance metadata
service, and every Helm value set is one the pinned chart has; its IAM policy is upstream's for that release,
grants nothing on everything, and lets it create, retag or delete only load balancers, target groups and security
groups that carry the cluster tag; the NLB checks Triton's readiness on the path, port, interval and threshold the
failover's detection time is computed from; the tags the stack finds the NLB by are tags the controller really puts
on it.

Value paths are held against the chart's own values.yaml at 3.5.0, recorded from the chart's repository at tag
v3.5.0 in tests/upstream/chart-values/ (tests/chart_values.py).
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List

import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from decisions.catalog import charts
from decisions.nodes.pods import SYSTEM_NODE_TAINT
from decisions.serving import failover
from decisions.serving import lb_controller as lbc
from tests.chart_values import assert_values_confirmed, values_file

CLUSTER = "gpu-cloud-prod-us-east-1"
REGION = "us-east-1"
VPC = "vpc-0123456789abcdef0"
ACCOUNT = "123456789012"
TRITON_TAGS = {"gpu-cloud:stack": "prod-us-east-1", "Owner": "ml-platform", "CostCenter": "gpu 42"}


def _values(**kwargs) -> Dict[str, Any]:
    return lbc.controller_values(CLUSTER, REGION, VPC, lbc.SERVICE_ACCOUNT, SYSTEM_NODE_LABELS, **kwargs)


def _triton_annotations(scheme: str = "internal", **kwargs) -> Dict[str, str]:
    return lbc.nlb_service_annotations(
        scheme, health_path=failover.HEALTH_PATH, health_port=failover.HTTP_PORT,
        interval_s=failover.TARGET_CHECK_INTERVAL_S, unhealthy_threshold=failover.TARGET_UNHEALTHY_THRESHOLD,
        **kwargs)


def _pin() -> charts.ChartPin:
    return charts.chart(charts.AWS_LOAD_BALANCER_CONTROLLER)


def _chart_defaults() -> Dict[str, Any]:
    return yaml.safe_load(values_file(_pin()).read_text())


def _parse_string_map(raw: str) -> Dict[str, str]:
    """The controller's stringMap parsing (pkg/annotations/parser.go at v3.5.0) for input without escapes:
    pairs split on ',', each on its first '=', both sides trimmed, empty pairs skipped."""
    out = {}
    for pair in (p.strip() for p in raw.split(",")):
        if pair:
            key, sep, value = pair.partition("=")
            assert sep and key.strip(), f"unparsable pair {pair!r}"
            out[key.strip()] = value.strip()
    return out


# --- the pin and the values ---------------------------------------------------------------------------------

def test_the_pin_is_chart_3_5_0_of_app_v3_5_0_from_eks_charts():
    pin = _pin()
    assert (pin.chart, pin.version, pin.app_version) == ("aws-load-balancer-controller", "3.5.0", "v3.5.0")
    assert pin.repository == "https://aws.github.io/eks-charts" and not pin.is_oci
    assert lbc.CHART_NAME == pin.chart, "the topology spread selector uses the chart name as app.kubernetes.io/name"


def test_the_chart_ships_the_image_of_its_app_version():
    assert _chart_defaults()["image"] == {"repository": "public.ecr.aws/eks/aws-load-balancer-controller",
                                          "tag": _pin().app_version, "pullPolicy": "IfNotPresent"}


@pytest.mark.parametrize("webhook_namespaces", [None, ("inference", "training")])
def test_every_value_set_is_in_the_pinned_values_file_at_its_line(webhook_namespaces):
    assert_values_confirmed(_values(webhook_namespaces=webhook_namespaces), _pin(), lbc.LB_CONTROLLER_VALUE_PATHS)


def test_every_confirmed_path_is_used():
    used = set(_values(webhook_namespaces=["inference"]))
    assert {path.split(".")[0] for path in lbc.LB_CONTROLLER_VALUE_PATHS} == used


def test_values_name_the_cluster_region_and_vpc_so_no_instance_metadata_is_needed():
    values = _values()
    assert (values["clusterName"], values["region"], values["vpcId"]) == (CLUSTER, REGION, VPC)
    assert values["serviceAccount"] == {"create": True, "name": lbc.SERVICE_ACCOUNT}


def test_two_replicas_on_system_nodes_with_a_disruption_budget_spread_over_zones():
    values = _values()
    assert values["replicaCount"] == 2
    assert values["nodeSelector"] == SYSTEM_NODE_LABELS and values["nodeSelector"] is not SYSTEM_NODE_LABELS
    # the system nodes' taint tolerated, which the chart does not by default
    assert values["tolerations"] == [{"key": SYSTEM_NODE_TAINT.key, "operator": "Exists",
                                      "effect": SYSTEM_NODE_TAINT.effect}]
    assert values["podDisruptionBudget"] == {"maxUnavailable": 1}
    (spread,) = values["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway", "must never keep a replica from scheduling"
    assert spread["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": _pin().chart,
                                                      "app.kubernetes.io/instance": lbc.RELEASE_NAME}
    assert "limits" not in values["resources"]


def test_the_controller_is_placed_as_every_system_pod_is(monkeypatch):
    """Its nodeSelector and tolerations are decisions/nodes/pods.system_placement's, so a change there reaches it."""
    placement = {"nodeSelector": {"pool": "elsewhere"}, "tolerations": [{"key": "planted", "operator": "Exists"}]}
    monkeypatch.setattr(lbc, "system_placement", lambda labels: placement if labels == SYSTEM_NODE_LABELS else None)
    values = _values()
    assert {key: values[key] for key in placement} == placement


def test_ip_targets_kept_webhook_cert_and_the_mutator_webhook_on_cluster_wide_by_default():
    values = _values()
    assert values["defaultTargetType"] == "ip"
    assert values["keepTLSSecret"] is True
    assert values["enableServiceMutatorWebhook"] is True
    assert "serviceMutatorWebhookConfig" not in values


def test_the_mutator_webhook_can_be_limited_to_named_namespaces():
    values = _values(webhook_namespaces=["training", "inference"])
    assert values["serviceMutatorWebhookConfig"] == {"namespaceSelectors": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["inference", "training"]}]}


def test_chart_defaults_the_decisions_rest_on():
    """A chart bump that changes any of these changes what the module docstring says; re-decide then."""
    defaults = _chart_defaults()
    assert defaults["serviceMutatorWebhookConfig"]["failurePolicy"] == "Fail"
    assert defaults["serviceMutatorWebhookConfig"]["operations"] == ["CREATE"]
    assert defaults["loadBalancerClass"] is None           # the controller's own default, service.k8s.aws/nlb
    lines = values_file(_pin()).read_text().splitlines()
    assert f"(default {lbc.LOAD_BALANCER_CLASS})" in lines[518]
    assert defaults["configureDefaultAffinity"] is True     # prefers different nodes
    assert defaults["priorityClassName"] == "system-cluster-critical"
    assert defaults["tolerations"] == []                    # system nodes carry no taint
    assert defaults["serviceAccount"]["annotations"] == {}  # Pod Identity needs none


@pytest.mark.parametrize("field,bad", [
    ("cluster_name", ""), ("cluster_name", "-leading-dash"), ("cluster_name", "has{{tpl}}"),
    ("region", "us-east"), ("region", "cn-north-1"), ("region", "us-gov-west-1"),
    ("vpc_id", "vpc-123"), ("vpc_id", "subnet-0123456789abcdef0"), ("vpc_id", ""),
    ("service_account_name", ""), ("service_account_name", "Upper_Case"),
    ("system_node_labels", {}), ("system_node_labels", {"gpu-cloud.io/node-role": "not a label"}),
])
def test_bad_values_arguments_are_refused(field, bad):
    args = dict(cluster_name=CLUSTER, region=REGION, vpc_id=VPC, service_account_name=lbc.SERVICE_ACCOUNT,
                system_node_labels=SYSTEM_NODE_LABELS)
    args[field] = bad
    with pytest.raises(ValueError):
        lbc.controller_values(**args)


@pytest.mark.parametrize("namespaces", [[], ["inference", "inference"], ["Inference"]])
def test_bad_webhook_namespaces_are_refused(namespaces):
    with pytest.raises(ValueError, match="webhook_namespaces"):
        _values(webhook_namespaces=namespaces)


# --- IAM --------------------------------------------------------------------------------------------------

_ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z0-9]+$")
_CONDITION_OPERATORS = {"StringEquals", "StringNotEquals", "StringLike", "ArnEquals", "ArnLike", "Null", "Bool"}
# Actions that make, retag or delete a load balancer, target group or security group.
_OWNERSHIP_ACTIONS = {
    "elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:CreateTargetGroup",
    "elasticloadbalancing:DeleteLoadBalancer", "elasticloadbalancing:DeleteTargetGroup",
    "elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags",
    "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup", "ec2:CreateTags", "ec2:DeleteTags",
}
# Upstream's one unconditioned creation: a new group has no tags to test; its tags at creation are conditioned
# (TagSecurityGroupOnCreate) and everything after needs the tag on the group.
_UPSTREAM_UNCONDITIONED = {"ec2:CreateSecurityGroup"}
_TAG_PRESENT = {("Null", f"aws:RequestTag/{lbc.CLUSTER_TAG_KEY}", "false"),
                ("Null", f"aws:ResourceTag/{lbc.CLUSTER_TAG_KEY}", "false")}


def _as_list(value) -> List[str]:
    return [value] if isinstance(value, str) else list(value)


def _conditions(statement) -> set:
    return {(op, key, value if isinstance(value, str) else tuple(sorted(value)))
            for op, block in statement.get("Condition", {}).items() for key, value in block.items()}


def _acts_on_balancers_or_groups(statement) -> bool:
    """AddTags/RemoveTags on listeners and rules only are not about ownership of balancers or groups."""
    resources = _as_list(statement["Resource"])
    return any(r == "*" or ":loadbalancer/" in r or ":targetgroup/" in r or ":security-group/" in r for r in resources)


@pytest.mark.parametrize("policy", [lbc.iam_policy(), lbc.iam_policy(lbc.vpc_arn(REGION, ACCOUNT, VPC))],
                         ids=["plain", "vpc-scoped"])
def test_the_policy_is_valid_iam_json(policy):
    assert set(policy) == {"Version", "Statement"} and policy["Version"] == "2012-10-17"
    sids = [s["Sid"] for s in policy["Statement"]]
    assert len(sids) == len(set(sids)) and all(re.match(r"^[A-Za-z0-9]+$", sid) for sid in sids)
    for statement in policy["Statement"]:
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, statement["Sid"]
        assert statement["Effect"] == "Allow"
        assert all(_ACTION.match(a) for a in _as_list(statement["Action"])), statement["Sid"]
        assert all(r == "*" or r.startswith("arn:aws:") for r in _as_list(statement["Resource"])), statement["Sid"]
        assert set(statement.get("Condition", {})) <= _CONDITION_OPERATORS, statement["Sid"]
        for op, block in statement.get("Condition", {}).items():
            assert block and all(isinstance(v, (str, list)) for v in block.values())
            if op == "Null":
                assert set(block.values()) <= {"true", "false"}
    # IAM counts an inline policy's characters without whitespace; a role's inline policies share 10,240.
    assert len(json.dumps(policy, separators=(",", ":"))) < 10240


def test_the_policy_is_upstreams_for_the_pinned_app_version_statement_for_statement():
    assert _pin().app_version == "v3.5.0", "re-derive lb_controller_policy.json from the new tag's iam_policy.json"
    assert lbc.upstream_digest(lbc.IAM_POLICY) == lbc.UPSTREAM_POLICY_SHA256
    assert lbc.iam_policy() == json.loads(lbc.POLICY_PATH.read_text())


def test_no_statement_grants_everything_or_wildcard_actions():
    for statement in lbc.IAM_POLICY["Statement"]:
        actions = _as_list(statement["Action"])
        assert "*" not in actions and not any("*" in a for a in actions), statement["Sid"]
        assert "NotAction" not in statement and "NotResource" not in statement


def test_creating_retagging_or_deleting_balancers_and_groups_needs_the_cluster_tag_as_upstream():
    checked = set()
    for statement in lbc.IAM_POLICY["Statement"]:
        owned = set(_as_list(statement["Action"])) & _OWNERSHIP_ACTIONS
        if not owned or not _acts_on_balancers_or_groups(statement):
            continue
        checked |= owned
        if owned <= _UPSTREAM_UNCONDITIONED:
            assert "Condition" not in statement and set(_as_list(statement["Action"])) == owned
            continue
        assert _conditions(statement) & _TAG_PRESENT, f"{statement['Sid']} does not require {lbc.CLUSTER_TAG_KEY}"
    assert checked == _OWNERSHIP_ACTIONS


def test_retagging_cannot_claim_a_resource_for_the_cluster():
    """Tags on existing resources: only on resources already tagged, never adding or changing the cluster tag."""
    for statement in lbc.IAM_POLICY["Statement"]:
        actions = set(_as_list(statement["Action"]))
        if actions & {"ec2:DeleteTags", "elasticloadbalancing:RemoveTags"} and _acts_on_balancers_or_groups(statement):
            assert ("Null", f"aws:RequestTag/{lbc.CLUSTER_TAG_KEY}", "true") in _conditions(statement)
            assert ("Null", f"aws:ResourceTag/{lbc.CLUSTER_TAG_KEY}", "false") in _conditions(statement)


def test_tags_at_creation_are_allowed_only_with_the_cluster_tag_and_only_while_creating():
    by_sid = {s["Sid"]: s for s in lbc.IAM_POLICY["Statement"]}
    sg = _conditions(by_sid["TagSecurityGroupOnCreate"])
    assert ("StringEquals", "ec2:CreateAction", "CreateSecurityGroup") in sg
    assert ("Null", f"aws:RequestTag/{lbc.CLUSTER_TAG_KEY}", "false") in sg
    elb = by_sid["TagLoadBalancersAndTargetGroupsOnCreate"]["Condition"]
    assert sorted(elb["StringEquals"]["elasticloadbalancing:CreateAction"]) == ["CreateLoadBalancer",
                                                                                "CreateTargetGroup"]
    assert elb["Null"] == {f"aws:RequestTag/{lbc.CLUSTER_TAG_KEY}": "false"}


def test_the_vpc_scope_touches_only_the_any_group_ingress_statement():
    arn = lbc.vpc_arn(REGION, ACCOUNT, VPC)
    assert arn == f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{VPC}"
    plain, scoped = lbc.iam_policy(), lbc.iam_policy(arn)
    changed = [(a, b) for a, b in zip(plain["Statement"], scoped["Statement"]) if a != b]
    assert len(changed) == 1
    before, after = changed[0]
    assert before["Sid"] == lbc.ANY_GROUP_INGRESS_SID and "Condition" not in before
    assert set(before["Action"]) == {"ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"}
    assert after["Condition"] == {"ArnEquals": {"ec2:Vpc": arn}}
    assert json.loads(lbc.iam_policy_json(scoped)) == scoped
    assert lbc.upstream_digest(lbc.IAM_POLICY) == lbc.UPSTREAM_POLICY_SHA256, "IAM_POLICY must not be mutated"


@pytest.mark.parametrize("args", [("cn-north-1", ACCOUNT, VPC), (REGION, "12345", VPC), (REGION, ACCOUNT, "vpc-1")])
def test_bad_vpc_arn_parts_are_refused(args):
    with pytest.raises(ValueError):
        lbc.vpc_arn(*args)


def test_a_non_vpc_arn_is_refused():
    with pytest.raises(ValueError, match="VPC ARN"):
        lbc.iam_policy(f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/sg-0123")


# --- the Service's annotations ----------------------------------------------------------------------------

def test_triton_gets_an_ip_target_nlb_checked_on_its_readiness_path():
    annotations = _triton_annotations("internal")
    assert annotations == {
        lbc.TYPE: "external",
        lbc.TARGET_TYPE: "ip",
        lbc.SCHEME: "internal",
        lbc.HEALTHCHECK_PROTOCOL: "HTTP",
        lbc.HEALTHCHECK_PATH: "/v2/health/ready",
        lbc.HEALTHCHECK_PORT: "8000",
        lbc.HEALTHCHECK_INTERVAL: "10",
        lbc.HEALTHCHECK_UNHEALTHY_THRESHOLD: "3",
        lbc.HEALTHCHECK_HEALTHY_THRESHOLD: "3",
        lbc.HEALTHCHECK_SUCCESS_CODES: "200",
        lbc.LOAD_BALANCER_ATTRIBUTES: "load_balancing.cross_zone.enabled=true",
    }
    assert _triton_annotations("internet-facing")[lbc.SCHEME] == "internet-facing"
    assert lbc.LOAD_BALANCER_ATTRIBUTES not in _triton_annotations(cross_zone=False)


def test_the_check_is_the_one_failover_detection_is_computed_from():
    annotations = _triton_annotations()
    interval = int(annotations[lbc.HEALTHCHECK_INTERVAL])
    unhealthy = int(annotations[lbc.HEALTHCHECK_UNHEALTHY_THRESHOLD])
    alarm_part = failover.ALARM_PERIOD_S * failover.ALARM_EVALUATION_PERIODS
    internal_lb_part = failover.detection_seconds("internal") - alarm_part
    assert interval * unhealthy == internal_lb_part == 30


def test_every_annotation_is_a_documented_string_annotation():
    annotations = _triton_annotations(extra_tags=TRITON_TAGS)
    assert set(annotations) == set(lbc.SERVICE_ANNOTATION_DOC_LINES)
    assert all(isinstance(v, str) for v in annotations.values()), "Kubernetes annotation values are strings"
    assert all(k.startswith("service.beta.kubernetes.io/aws-load-balancer-") for k in annotations)


def test_extra_tags_reach_the_controller_as_the_same_tags():
    raw = _triton_annotations(extra_tags=TRITON_TAGS)[lbc.ADDITIONAL_RESOURCE_TAGS]
    assert _parse_string_map(raw) == TRITON_TAGS
    assert lbc.ADDITIONAL_RESOURCE_TAGS not in _triton_annotations(extra_tags={})


@pytest.mark.parametrize("tags,match", [
    ({lbc.CLUSTER_TAG_KEY: "other"}, "tracking"),
    ({lbc.SERVICE_STACK_TAG_KEY: "x/y"}, "tracking"),
    ({"aws:cloudformation:stack-name": "x"}, "AWS allows"),
    ({"k" * 129: "v"}, "AWS allows"),
    ({"Team": "a,b"}, "k=v,k=v"),
    ({"a=b": "c"}, "k=v,k=v"),
    ({"Team": " padded"}, "k=v,k=v"),
])
def test_tags_the_controller_would_drop_misparse_or_aws_refuse_are_refused(tags, match):
    with pytest.raises(ValueError, match=match):
        _triton_annotations(extra_tags=tags)


@pytest.mark.parametrize("field,bad", [
    ("scheme", "public"), ("health_path", "v2/health/ready"), ("health_path", "/a b"), ("health_port", 0),
    ("health_port", 70000), ("interval_s", 4), ("interval_s", 301), ("unhealthy_threshold", 1),
    ("unhealthy_threshold", 11), ("healthy_threshold", 1), ("interval_s", True), ("interval_s", "10"),
])
def test_health_checks_an_nlb_would_refuse_are_refused(field, bad):
    args = dict(scheme="internal", health_path=failover.HEALTH_PATH, health_port=failover.HTTP_PORT,
                interval_s=failover.TARGET_CHECK_INTERVAL_S, unhealthy_threshold=failover.TARGET_UNHEALTHY_THRESHOLD)
    args[field] = bad
    with pytest.raises(ValueError):
        lbc.nlb_service_annotations(**args)


# --- the tags on the NLB ----------------------------------------------------------------------------------

def test_the_tags_failover_finds_the_nlb_by_are_tags_the_controller_puts_on_it():
    controller = lbc.controller_load_balancer_tags(CLUSTER, "inference", "triton")
    assert controller == {"elbv2.k8s.aws/cluster": CLUSTER, "service.k8s.aws/stack": "inference/triton",
                          "service.k8s.aws/resource": "LoadBalancer"}
    assert set(controller) <= lbc.TRACKING_TAG_KEYS


def _scoped(scheme="internet-facing", cluster=CLUSTER):
    return lbc.scoped_iam_policy("aws", REGION, ACCOUNT, VPC, scheme, cluster)


def test_the_stacks_policy_names_its_own_resources_for_every_write():
    by_sid = {s["Sid"]: s for s in _scoped()["Statement"]}
    assert lbc.ALB_ADD_ONS_SID not in by_sid                       # NLBs only: no Shield, WAF, Cognito, ACM
    assert [sid for sid, s in by_sid.items() if s["Resource"] == "*"] == ["Describe"]
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in by_sid["Describe"]["Action"])
    # Every ARN names this region and account: upstream's "arn:aws:<service>:*:*:" included.
    arns = [r for s in by_sid.values() for r in _as_list(s["Resource"]) if r != "*"]
    assert all(r.startswith((f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:", f"arn:aws:ec2:{REGION}:{ACCOUNT}:",
                             f"arn:aws:iam::{ACCOUNT}:")) for r in arns)
    assert by_sid["RegisterTargets"]["Resource"] == f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:targetgroup/*/*"
    # Each statement upstream had on "*" names the kinds its actions take, no more.
    assert by_sid["CreateTaggedLoadBalancersAndTargetGroups"]["Resource"] == [
        f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:{tail}"
        for tail in ("loadbalancer/net/*/*", "loadbalancer/app/*/*", "targetgroup/*/*")]
    assert by_sid["ModifyListenersAndRules"]["Resource"] == [
        f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:{tail}"
        for tail in ("listener/net/*/*/*", "listener/app/*/*/*", "listener-rule/net/*/*/*", "listener-rule/app/*/*/*")]
    assert by_sid["ManageOwnSecurityGroups"]["Resource"] == f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/*"
    assert by_sid["CreateSecurityGroup"]["Resource"] == f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/*"
    assert by_sid[lbc.CREATE_GROUP_IN_VPC_SID] == {
        "Sid": lbc.CREATE_GROUP_IN_VPC_SID, "Effect": "Allow", "Action": ["ec2:CreateSecurityGroup"],
        "Resource": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{VPC}"}
    assert by_sid["CreateElbServiceLinkedRole"]["Resource"] == (
        f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/elasticloadbalancing.amazonaws.com/"
        "AWSServiceRoleForElasticLoadBalancing")
    assert by_sid[lbc.ANY_GROUP_INGRESS_SID]["Condition"] == {"ArnEquals": {"ec2:Vpc": lbc.vpc_arn(REGION, ACCOUNT, VPC)}}
    assert not {a for s in by_sid.values() for a in _as_list(s["Action"])} & set(lbc.UNCALLED_WRITES)


# Each upstream statement, and what the stack's policy requires of the cluster tag (v: this cluster's name) on the
# resource and in the request: (resource tag, request tag). None: no condition on it.
PINNED = {
    "TagSecurityGroupOnCreate": (None, CLUSTER),
    "RetagOwnSecurityGroups": (CLUSTER, "absent"),
    "ManageOwnSecurityGroups": (CLUSTER, None),
    "CreateSecurityGroup": (None, CLUSTER),
    "CreateTaggedLoadBalancersAndTargetGroups": (None, CLUSTER),
    "CreateInternalLoadBalancers": (None, CLUSTER),
    "ManageListenersAndRules": (CLUSTER, None),
    "RetagOwnLoadBalancersAndTargetGroups": (CLUSTER, "absent"),
    "TagListenersAndRules": (CLUSTER, "absent"),
    "TagListenersAndRulesOnCreate": (None, CLUSTER),
    "ModifyOrDeleteOwnLoadBalancersAndTargetGroups": (CLUSTER, None),
    "TagLoadBalancersAndTargetGroupsOnCreate": (None, CLUSTER),
    "RegisterTargets": (CLUSTER, None),
    "ModifyListenersAndRules": (CLUSTER, None),
}


def _required(condition, key):
    if key in condition.get("StringEquals", {}):
        return condition["StringEquals"][key]
    return {"true": "absent", "false": "present"}.get(condition.get("Null", {}).get(key))


@pytest.mark.parametrize("sid", sorted(PINNED))
def test_every_write_on_balancers_groups_listeners_and_targets_needs_this_clusters_name(sid):
    by_sid = {s["Sid"]: s for s in _scoped("internal")["Statement"]}
    condition = by_sid[sid].get("Condition", {})
    assert (_required(condition, lbc.RESOURCE_TAG), _required(condition, lbc.REQUEST_TAG)) == PINNED[sid]


def test_the_statements_are_upstreams_plus_the_two_that_split_creation():
    upstream = {s["Sid"] for s in lbc.iam_policy()["Statement"]} - {lbc.ALB_ADD_ONS_SID}
    scoped = {s["Sid"] for s in _scoped("internal")["Statement"]}
    assert scoped - upstream == {lbc.CREATE_GROUP_IN_VPC_SID, lbc.TAG_LISTENERS_ON_CREATE_SID, lbc.INTERNAL_ONLY_SID,
                                 lbc.VPC_READS_SID}
    assert upstream - scoped == set()
    # the statements left without a cluster condition: reads, the VPC-bound ones and the service-linked role
    unpinned = {s["Sid"] for s in _scoped("internal")["Statement"]
                if lbc.RESOURCE_TAG not in json.dumps(s) and lbc.REQUEST_TAG not in json.dumps(s)}
    assert unpinned == {"Describe", lbc.VPC_READS_SID, lbc.ANY_GROUP_INGRESS_SID, lbc.CREATE_GROUP_IN_VPC_SID,
                        "CreateElbServiceLinkedRole"}


def test_listeners_and_rules_are_tagged_on_creation_with_this_clusters_name_only():
    by_sid = {s["Sid"]: s for s in _scoped()["Statement"]}
    on_create = by_sid[lbc.TAG_LISTENERS_ON_CREATE_SID]
    assert on_create["Action"] == "elasticloadbalancing:AddTags"
    assert on_create["Condition"] == {"StringEquals": {
        "elasticloadbalancing:CreateAction": ["CreateListener", "CreateRule"], lbc.REQUEST_TAG: CLUSTER}}
    assert all(":listener/" in r or ":listener-rule/" in r for r in on_create["Resource"])


def test_the_action_kinds_are_the_service_authorization_references():
    """ELB_ACTION_KINDS against parliament's copy of the reference (Elastic Load Balancing V2)."""
    import parliament
    from pathlib import Path
    entries = json.loads((Path(parliament.__file__).parent / "iam_definition.json").read_text())
    reference = {}
    for service in entries:
        if service["prefix"] == "elasticloadbalancing" and service["service_name"].endswith("V2"):
            for privilege in service["privileges"]:
                reference.setdefault(privilege["privilege"], set()).update(
                    r["resource_type"].rstrip("*").split("/")[0] for r in privilege["resource_types"]
                    if r["resource_type"])
    newer = {action for action in lbc.ELB_ACTION_KINDS if action not in reference}
    assert newer == {"ModifyIpPools"}
    for action, kinds in lbc.ELB_ACTION_KINDS.items():
        if action not in newer:
            assert set(kinds) == reference[action], action


def test_a_stack_name_too_long_for_iams_policy_quota_is_refused_by_name():
    assert len(lbc.iam_policy_json(_scoped("internal", "c" * 80))) <= lbc.ROLE_INLINE_POLICY_MAX
    with pytest.raises(ValueError, match="comes to 10[0-9]{3} characters; IAM allows a role's inline policies 10240"):
        lbc.scoped_iam_policy("aws", "ap-southeast-1", ACCOUNT, VPC, "internal", "c" * 100)


def test_the_stacks_policy_drops_outposts_reads_and_reads_security_groups_of_its_own_vpc_only():
    upstream = {s["Sid"]: s for s in lbc.iam_policy()["Statement"]}["Describe"]["Action"]
    scoped = {s["Sid"]: s for s in _scoped("internal")["Statement"]}
    describe, reads = scoped["Describe"], scoped[lbc.VPC_READS_SID]
    # Service Authorization Reference: GetCoipPoolUsage takes a coip-pool (Outposts customer-owned addresses),
    # DescribeCoipPools none; GetSecurityGroupsForVpc takes the vpc it reads.
    assert set(lbc.OUTPOSTS_ONLY_ACTIONS) == {"ec2:GetCoipPoolUsage", "ec2:DescribeCoipPools"}
    assert reads == {"Sid": lbc.VPC_READS_SID, "Effect": "Allow", "Action": ["ec2:GetSecurityGroupsForVpc"],
                     "Resource": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{VPC}"}
    # Everything else upstream reads on "*" stays, in upstream's order: nothing lost, nothing added.
    assert describe["Action"] == [a for a in upstream if a not in lbc.OUTPOSTS_ONLY_ACTIONS + lbc.VPC_SCOPED_READS]
    assert set(upstream) - set(describe["Action"]) == set(lbc.OUTPOSTS_ONLY_ACTIONS) | {"ec2:GetSecurityGroupsForVpc"}
    assert describe["Resource"] == "*" and all(a.split(":")[1].startswith("Describe") for a in describe["Action"])


def test_an_internal_stack_lets_the_controller_create_internal_load_balancers_only():
    internal = {s["Sid"]: s for s in _scoped("internal")["Statement"]}
    public = {s["Sid"]: s for s in _scoped("internet-facing")["Statement"]}
    assert set(internal) - set(public) == {lbc.INTERNAL_ONLY_SID}
    create = internal[lbc.INTERNAL_ONLY_SID]
    assert create["Action"] == "elasticloadbalancing:CreateLoadBalancer"
    assert create["Condition"] == {"StringEquals": {"aws:RequestTag/elbv2.k8s.aws/cluster": CLUSTER,
                                                    "elasticloadbalancing:Scheme": "internal"}}
    assert create["Resource"] == public[lbc.CREATE_SID]["Resource"]
    assert internal[lbc.CREATE_SID]["Action"] == ["elasticloadbalancing:CreateTargetGroup"]
    # Nothing else creates a load balancer.
    assert [sid for sid, s in internal.items()
            if "elasticloadbalancing:CreateLoadBalancer" in lbc._as_list(s["Action"])] == [lbc.INTERNAL_ONLY_SID]
    with pytest.raises(ValueError, match="allowed internal, internet-facing"):
        lbc.scoped_iam_policy("aws", REGION, ACCOUNT, VPC, "public", CLUSTER)


def test_the_values_turn_off_what_the_dropped_permissions_served():
    values = _values()
    assert (values["enableShield"], values["enableWaf"], values["enableWafv2"]) == (False, False, False)


# --- who may connect: source ranges and client IP preservation ------------------------------------------------------

@pytest.mark.parametrize("scheme, vpc, clients, ranges", [
    ("internal", "10.64.0.0/16", ["10.64.0.0/16", "10.80.0.0/16"], ["10.64.0.0/16", "10.80.0.0/16"]),
    ("internal", "10.96.0.0/18", [], ["10.96.0.0/18"]),                      # no clients named: the VPC alone
    ("internal", "10.64.0.0/16", ["10.64.8.0/24", "10.0.0.0/22"], ["10.0.0.0/22", "10.64.0.0/16"]),  # inside: once
    ("internet-facing", "10.64.0.0/16", ["10.80.0.0/16"], ["0.0.0.0/0"]),    # clients and Route 53 anywhere
])
def test_the_load_balancer_admits_the_vpc_and_the_clients_networks(scheme, vpc, clients, ranges):
    assert lbc.load_balancer_source_ranges(scheme, vpc, clients) == ranges


def test_an_internal_load_balancer_never_admits_everyone():
    assert "0.0.0.0/0" not in lbc.load_balancer_source_ranges("internal", "10.64.0.0/16", [])
    with pytest.raises(ValueError, match="allowed internal, internet-facing"):
        lbc.load_balancer_source_ranges("public", "10.64.0.0/16", [])


def test_client_ip_preservation_stays_off_whatever_the_drain_settings():
    """The NLB must present its own VPC addresses to Triton: the inference namespace's NetworkPolicy admits the VPC
    CIDR only, so preserved client addresses (the peer region's clients, any client outside the VPC) would be
    refused at the pod (decisions/platform/tenancy.py allow-triton-from-vpc)."""
    for terminate in (True, False):
        (value,) = lbc.deregistration_delay_annotation(60, terminate_connections=terminate).values()
        attributes = dict(pair.split("=", 1) for pair in value.split(","))
        assert attributes["preserve_client_ip.enabled"] == "false"


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1"])
def test_tritons_service_admits_the_vpc_and_the_dr_clients_and_keeps_client_ips_off(stack_runs, stack):
    from tests.conftest import stack_config
    run = stack_runs[stack]
    (service,) = [s for s in run.of_type("kubernetes:core/v1:Service") if s.name == "inference-service"]
    config = stack_config(stack)
    assert service.inputs["spec"]["loadBalancerSourceRanges"] == lbc.load_balancer_source_ranges(
        "internal", config["gpu-cloud:network"]["cidr"], config["gpu-cloud:dr"]["clientCidrs"])
    assert service.inputs["spec"]["loadBalancerSourceRanges"] == ["10.64.0.0/16", "10.80.0.0/16"]
    attributes = service.inputs["metadata"]["annotations"][lbc.TARGET_GROUP_ATTRIBUTES]
    assert "preserve_client_ip.enabled=false" in attributes.split(",")
