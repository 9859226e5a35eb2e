"""Stacks that share an account (dev and prod-us-east-1 do, in one region) cannot change each other's resources.

Three proofs:
- the plan: over every role policy of every shipped stack, each write on a service whose resources several stacks
  hold side by side names this stack's own resources (ARNs with its cluster name, its VPC, resources it registers;
  a DR primary's peer too) or carries a condition that does;
- moto in server mode, where moto evaluates IAM: it matches actions and, for S3, SQS, IAM and STS, resource ARNs,
  and it ignores every condition but sts:ExternalId (moto 5.2.5 moto/iam/access_control.py: IAMPolicyStatement
  _check_conditions reads only the values moto/iam/utils.py format_incoming_conditional_values fills; other services
  authorize against "*"). So it proves the bucket writes of each stack's roles against the other stack's buckets;
- a condition table for the load balancer controller, whose isolation rests on tag conditions moto skips: each
  write action, the resource the Service Authorization Reference (parliament's copy) authorizes it on, that
  resource's support of aws:ResourceTag, and that the controller (v3.5.0) tags that resource with its cluster name.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from decisions.config.validate import cluster_name
from decisions.serving import lb_controller as lbc
from tests.conftest import STACKS, stack_config

ACCOUNT = "123456789012"
# Services whose resources several stacks of one account hold side by side. IAM is left out: its one write here
# creates Elastic Load Balancing's service-linked role, one per account, which every stack shares by design.
SHARED_SERVICES = ("elasticloadbalancing", "ec2", "autoscaling", "s3", "route53", "eks", "sqs", "logs", "kms")
WRITE_LEVELS = ("Write", "Tagging", "Permissions management")
# Positive operators: a value they name is what the request must carry.
MATCHING_OPERATORS = ("StringEquals", "StringLike", "ArnEquals", "ArnLike", "ForAllValues:StringEquals",
                      "ForAnyValue:StringEquals")


@lru_cache(maxsize=None)
def _sar():
    """{service:Action: (access levels, {resource type: its condition keys})} from parliament's Service Authorization
    Reference copy (every entry of a prefix merged: ELB's v1 and v2 share one)."""
    import parliament
    found = {}
    for service in json.loads((Path(parliament.__file__).parent / "iam_definition.json").read_text()):
        keys = {r["resource"]: set(r["condition_keys"]) for r in service["resources"]}
        for privilege in service["privileges"]:
            name = f"{service['prefix']}:{privilege['privilege']}"
            levels, types = found.setdefault(name, (set(), {}))
            levels.add(privilege["access_level"])
            for resource in privilege["resource_types"]:
                kind = resource["resource_type"].rstrip("*")
                if kind:
                    types.setdefault(kind, set()).update(keys.get(kind, set()))
    return found


def is_write(action: str) -> bool:
    """The reference's access level; an action newer than parliament's copy (elasticloadbalancing:ModifyIpPools) is a
    write unless its name reads (Describe, Get, List)."""
    if action not in _sar():
        return not action.split(":")[1].startswith(("Describe", "Get", "List"))
    levels, _ = _sar()[action]
    return bool(levels & set(WRITE_LEVELS))


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def names_own(value: str, tokens) -> bool:
    """Does `value` (an ARN or a condition value) name one of the stack's own things? A token counts only where the
    name it sits in has no wildcard after it (gpu-cloud-dev-* would also name a stack gpu-cloud-dev-alice's)."""
    if "${ec2:InstanceID}" in value:       # the calling instance itself (ec2:SourceInstanceARN)
        return True
    for token in tokens:
        for found in re.finditer(re.escape(token), value):
            rest = re.split(r"[/:]", value[found.end():], maxsplit=1)[0]
            if "*" not in rest:
                return True
    return False


def pins_own(condition, tokens) -> bool:
    """A condition that holds only for this stack's resources: a positive operator whose key or every value names
    them (the cluster tag's value, the VPC, the groups, the buckets)."""
    for operator, block in (condition or {}).items():
        if operator not in MATCHING_OPERATORS:
            continue
        for key, values in block.items():
            if names_own(key, tokens) or all(names_own(str(v), tokens) for v in _as_list(values)):
                return True
    return False


def unscoped_writes(document, tokens, own_arns):
    """(Sid, action) of every Allow of a write on a shared service that neither names own resources nor pins them."""
    found = []
    for statement in _as_list(document.get("Statement", [])):
        if statement.get("Effect") != "Allow":
            continue
        resources = _as_list(statement.get("Resource", "*"))
        own = all(r in own_arns or (r != "*" and names_own(r, tokens)) for r in resources)
        if own or pins_own(statement.get("Condition"), tokens):
            continue
        found += [(statement.get("Sid"), a) for a in _as_list(statement["Action"])
                  if a.split(":")[0] in SHARED_SERVICES and is_write(a)]
    return found


def own_tokens(stack: str, run):
    """What names this stack's own things: its cluster name, its VPC, and a DR primary's peer (it writes the peer's
    replicas)."""
    tokens = {cluster_name("gpu-cloud", stack), run.one("aws:ec2/vpc:Vpc").state["id"]}
    peer = (stack_config(stack).get("gpu-cloud:dr") or {}).get("peerStack")
    if peer and (stack_config(stack).get("gpu-cloud:dr") or {}).get("role") == "primary":
        tokens.add(cluster_name("gpu-cloud", peer.rsplit("/", 1)[-1]))
    return tokens


def role_policies(run):
    """(policy resource name, document) of every inline role policy in the plan."""
    return [(r.name, json.loads(r.inputs["policy"])) for r in run.of_type("aws:iam/rolePolicy:RolePolicy")]


@pytest.mark.parametrize("stack", STACKS)
def test_no_role_of_any_stack_writes_what_another_stack_owns(stack_runs, stack):
    run = stack_runs[stack]
    tokens = own_tokens(stack, run)
    own_arns = {r.state["arn"] for r in run.resources if isinstance(r.state.get("arn"), str)}
    found = {name: unscoped_writes(document, tokens, own_arns) for name, document in role_policies(run)}
    assert {name: writes for name, writes in found.items() if writes} == {}


def test_the_check_finds_what_upstreams_policy_leaves_open():
    """Upstream's statements (v3.5.0 docs/install/iam_policy.json) in the same check: the tag's presence is not this
    cluster's name, and target and listener changes carry no condition at all."""
    tokens = {"gpu-cloud-dev", "vpc-0123456789abcdef0"}
    found = dict.fromkeys(sid for sid, _ in unscoped_writes(lbc.iam_policy(), tokens, set()))
    assert {"RegisterTargets", "ModifyListenersAndRules", "ManageListenersAndRules",
            "ModifyOrDeleteOwnLoadBalancersAndTargetGroups", "ManageOwnSecurityGroups",
            "CreateTaggedLoadBalancersAndTargetGroups", "SecurityGroupIngressAnyGroup"} <= set(found)


@pytest.mark.parametrize("value, tokens, own", [
    ("arn:aws:autoscaling:us-east-1:1:autoScalingGroup:*:autoScalingGroupName/gpu-cloud-dev-gpu", {"gpu-cloud-dev"},
     True),
    ("arn:aws:autoscaling:us-east-1:1:autoScalingGroup:*:autoScalingGroupName/gpu-cloud-dev-*", {"gpu-cloud-dev"},
     False),                                                    # would name gpu-cloud-dev-alice's groups too
    ("arn:aws:eks:us-east-1:1:nodegroup/gpu-cloud-dev/*/*", {"gpu-cloud-dev"}, True),
    ("arn:aws:elasticloadbalancing:us-east-1:1:targetgroup/*/*", {"gpu-cloud-dev"}, False),
    ("gpu-cloud-prod-us-east-1", {"gpu-cloud-dev"}, False),
    ("arn:aws:ec2:us-east-1:1:instance/${ec2:InstanceID}", set(), True),
])
def test_what_names_a_stacks_own_resources(value, tokens, own):
    assert names_own(value, tokens) is own


@pytest.mark.parametrize("condition, pinned", [
    ({"StringEquals": {"aws:ResourceTag/elbv2.k8s.aws/cluster": "gpu-cloud-dev"}}, True),
    ({"Null": {"aws:ResourceTag/elbv2.k8s.aws/cluster": "false"}}, False),          # any cluster's tag
    ({"StringNotEquals": {"aws:ResourceTag/elbv2.k8s.aws/cluster": "gpu-cloud-dev"}}, False),
    ({"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/gpu-cloud-dev": "owned"}}, True),
    ({"StringEquals": {"elasticloadbalancing:Scheme": "internal"}}, False),
])
def test_what_pins_a_write_to_the_stacks_resources(condition, pinned):
    assert pins_own(condition, {"gpu-cloud-dev"}) is pinned


# ----------------------------------------------------------------------------- against moto's IAM, where it evaluates

S3_WRITES = ("s3:PutObject", "s3:DeleteObject")     # the writes moto authorizes on the object's ARN


def _bucket_writes(document):
    """(bucket, key) each statement lets the role write, one probe key per Allow of an S3 write on objects."""
    found = []
    for statement in document["Statement"]:
        if statement["Effect"] == "Allow" and set(_as_list(statement["Action"])) & set(S3_WRITES):
            for arn in _as_list(statement["Resource"]):
                bucket, _, prefix = arn.removeprefix("arn:aws:s3:::").partition("/")
                found.append((bucket, prefix.rstrip("*") + "isolation-probe"))
    return found


def test_moto_lets_each_stacks_roles_write_their_own_buckets_and_no_other_stacks(stack_runs):
    """Every role policy of every stack that writes objects, in moto with IAM enforced: its writes succeed in its own
    stack's bucket and are refused, the same key, in each other stack's bucket of the same purpose."""
    import boto3
    from botocore.exceptions import ClientError
    import requests

    from tests.loopback import moto_server

    names = {stack: cluster_name("gpu-cloud", stack) for stack in STACKS}
    with moto_server() as url:
        def client(service, **credentials):
            return boto3.client(service, endpoint_url=url, region_name="us-east-1", **(credentials or {
                "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}))

        iam, s3 = client("iam"), client("s3")
        iam.create_user(UserName="prober")
        iam.put_user_policy(UserName="prober", PolicyName="assume", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="prober")["AccessKey"]
        prober = iam.get_user(UserName="prober")["User"]["Arn"]
        for run in stack_runs.values():
            for bucket in run.of_type("aws:s3/bucket:Bucket"):
                s3.create_bucket(Bucket=bucket.inputs["bucket"])
        writers = {}
        for stack, run in stack_runs.items():
            for name, document in role_policies(run):
                if _bucket_writes(document):
                    role = f"{stack}-{name}"[:64]
                    iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
                        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": prober},
                                                                "Action": "sts:AssumeRole"}]}))
                    iam.put_role_policy(RoleName=role, PolicyName="plan", PolicyDocument=json.dumps(document))
                    writers[(stack, name)] = (iam.get_role(RoleName=role)["Role"]["Arn"], _bucket_writes(document))
        assert {stack for stack, _ in writers} == set(STACKS)
        requests.post(f"{url}/moto-api/reset-auth", data=b"0").raise_for_status()     # IAM enforced from here
        try:
            sts = client("sts", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
            for (stack, name), (role_arn, writes) in writers.items():
                session = sts.assume_role(RoleArn=role_arn, RoleSessionName="probe")["Credentials"]
                as_role = client("s3", aws_access_key_id=session["AccessKeyId"],
                                 aws_secret_access_key=session["SecretAccessKey"],
                                 aws_session_token=session["SessionToken"])
                for bucket, probe in writes:
                    as_role.put_object(Bucket=bucket, Key=probe, Body=b"own")         # its own: allowed
                    for other in set(STACKS) - {stack}:
                        theirs = bucket.replace(names[stack], names[other], 1)
                        with pytest.raises(ClientError, match="AccessDenied"):
                            as_role.put_object(Bucket=theirs, Key=probe, Body=b"not yours")
                        with pytest.raises(ClientError, match="AccessDenied"):
                            as_role.delete_object(Bucket=theirs, Key=probe)
        finally:
            requests.post(f"{url}/moto-api/reset-auth", data=b"inf")


# ----------------------------------------------------------------------------- the condition table, where moto is blind

# The resources the controller tags with `elbv2.k8s.aws/cluster` = its cluster's name when it makes them (v3.5.0):
# resource type (Service Authorization Reference) -> where the controller does it.
CONTROLLER_TAGS = {
    "loadbalancer/net/": "pkg/deploy/elbv2/load_balancer_manager.go Create: trackingProvider.ResourceTags",
    "loadbalancer/app/": "pkg/deploy/elbv2/load_balancer_manager.go Create: trackingProvider.ResourceTags",
    "targetgroup": "pkg/deploy/elbv2/target_group_manager.go Create: trackingProvider.ResourceTags",
    "listener/net": "pkg/deploy/elbv2/listener_manager.go Create, under ListenerRulesTagging (on by default)",
    "listener/app": "pkg/deploy/elbv2/listener_manager.go Create, under ListenerRulesTagging (on by default)",
    "listener-rule/net": "pkg/deploy/elbv2/listener_rule_manager.go Create, under ListenerRulesTagging",
    "listener-rule/app": "pkg/deploy/elbv2/listener_rule_manager.go Create, under ListenerRulesTagging",
    "security-group": "pkg/deploy/ec2/security_group_manager.go Create (frontend); pkg/networking/"
                      "backend_sg_provider.go buildBackendSGTagsMap (backend)",
}


def _controller_statements():
    return lbc.scoped_iam_policy("aws", "us-east-1", ACCOUNT, "vpc-0123456789abcdef0", "internal",
                                 "gpu-cloud-prod-us-east-1")["Statement"]


def test_each_write_pinned_by_resource_tag_acts_on_resources_the_controller_tags_and_iam_can_match():
    """For every action a statement pins with aws:ResourceTag: each resource type the reference authorizes it on
    takes aws:ResourceTag, and the controller tags that type with its cluster's name, so the condition holds for its
    own resources and for no other cluster's."""
    checked = set()
    for statement in _controller_statements():
        if lbc.RESOURCE_TAG not in statement.get("Condition", {}).get("StringEquals", {}):
            continue
        for action in _as_list(statement["Action"]):
            if action not in _sar():
                continue           # newer than parliament's copy (ModifyIpPools): its LoadBalancerArn, as above
            _, types = _sar()[action]
            # the types the statement's ARNs are of; "loadbalancer" alone is the Classic Load Balancer's (ELB v1,
            # loadbalancer/<name>), which no ARN here can be
            named = {kind: keys for kind, keys in types.items() if kind != "loadbalancer"
                     and any(f":{kind.rstrip('/')}/" in arn for arn in _as_list(statement["Resource"]))}
            assert named, (statement["Sid"], action)
            for kind, keys in named.items():
                assert "aws:ResourceTag/${TagKey}" in keys, (action, kind)
                assert kind in CONTROLLER_TAGS, (action, kind)
                checked.add(action)
    assert {"elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets",
            "elasticloadbalancing:ModifyListener", "elasticloadbalancing:ModifyRule",
            "elasticloadbalancing:DeleteLoadBalancer", "ec2:DeleteSecurityGroup"} <= checked


def test_each_creation_pinned_by_request_tag_can_carry_it():
    """Creations carry the cluster's name in the request: the reference gives each such action aws:RequestTag."""
    for statement in _controller_statements():
        if lbc.REQUEST_TAG in statement.get("Condition", {}).get("StringEquals", {}):
            for action in _as_list(statement["Action"]):
                _, types = _sar()[action]
                assert any("aws:RequestTag/${TagKey}" in keys for keys in types.values()) or \
                    action.startswith("elasticloadbalancing:"), action
