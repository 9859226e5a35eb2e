"""gpu-cloud's guardrails as CrossGuard policies: one list, run by `pulumi preview --policy-pack policy` (through
policy/__main__.py) and, the very same validate functions, by the offline plan (plan/policy_runner.py).

Each policy is written against what the program really registers (see the plan document of any stack):
launch templates and Auto Scaling groups per GPU pool (components/nodes/nodepool.py), SecureBucket children
(components/storage/buckets.py), the DR replication (components/storage/replication.py), the interruption queue and the
termination handler (components/nodes/node_drain.py), and the Kubernetes objects the program renders itself.

Cross-resource facts come from what the engine gives a stack policy: dependencies (an Auto Scaling group depends on
its launch template, a launch template on its placement group and security groups, a rule on its group), property
dependencies (which resource a bucket setting's `bucket` came from) and each resource's provider (the AWS provider's
defaultTags). A resource policy's props are the resource's inputs, a stack policy's are its outputs (state), as the
engine names them: camelCase, numbers as floats, some booleans as the strings "true"/"false" (pulumi_aws types them
as strings).

In a preview the engine hands over what it cannot know yet as unknown values, and, under a provider whose
configuration is unknown (the Kubernetes provider of a cluster the preview creates), a resource as an empty map
(plan/views.py has the rules and their sources in the engine). A policy never reads "cannot know yet" as a
violation: it skips what it cannot judge, the update judges it with every value known, and it still reports what is
already visible. Each policy says how in `IN_PREVIEW`, which docs/policies.md shows.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, PolicyResource, ReportViolation,
                           ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs,
                           StackValidationPolicy)
from pulumi_policy.proxy import UnknownValueError

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:   # the engine runs the pack from policy/; decisions/ is at the root
    sys.path.insert(0, str(ROOT))

from decisions.catalog.catalog import Catalog, load_catalog  # noqa: E402
from decisions.config.model import AssumedPrice  # noqa: E402
from decisions.config.validate import REQUIRED_TAGS, resource_tags  # noqa: E402
from decisions.cost import cost  # noqa: E402
from decisions.network.public_access import WIDEST_PUBLIC_PREFIX, too_wide  # noqa: E402
from decisions.nodes.drain import NTH_MANAGED_TAG  # noqa: E402
from decisions.nodes.efa import EFA_ONLY, ENA, interface_layout  # noqa: E402
from decisions.observability.logs import PROD_MIN_RETENTION_DAYS  # noqa: E402
from decisions.catalog.charts import load_charts  # noqa: E402
from decisions.platform.release_manifest import RELEASE_ANNOTATION, release_label  # noqa: E402
from decisions.storage.buckets import LOG_BUCKET_SSE, LOGS, REPLICATED, bucket_name  # noqa: E402
from decisions.storage.lustre import protection_problems  # noqa: E402
from decisions.storage.replication import PEER_REFERENCE  # noqa: E402

PACK_NAME = "gpu-cloud"
PACK_ENFORCEMENT = EnforcementLevel.MANDATORY    # the issue: mandatory unless marked advisory (by config)

# --- resource types the program registers --------------------------------------------------------------------
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
LIFECYCLE_HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
DEFAULT_SG = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
VPC = "aws:ec2/vpc:Vpc"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
BUCKET_TYPES = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_SSE = ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
              "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2")
BUCKET_VERSIONING = ("aws:s3/bucketVersioning:BucketVersioning", "aws:s3/bucketVersioningV2:BucketVersioningV2")
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
BUCKET_LOGGING = ("aws:s3/bucketLogging:BucketLogging", "aws:s3/bucketLoggingV2:BucketLoggingV2")
BUCKET_REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
KMS_KEY = "aws:kms/key:Key"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
# audit trails are kept a year (decisions/observability/logs.py)
PROD_LOG_RETENTION_DAYS = PROD_MIN_RETENTION_DAYS
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
DATA_REPOSITORY = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
IAM_ROLE = "aws:iam/role:Role"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
IAM_POLICY = "aws:iam/policy:Policy"
IAM_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
SQS_QUEUE = "aws:sqs/queue:Queue"
AWS_PROVIDER = "pulumi:providers:aws"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
BINDINGS = ("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
            "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
# Where a pod template sits in each workload kind the program may render.
POD_SPEC_PATHS = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
}

# --- config (the pack's config schema; the same defaults when a key is left out) ------------------------------
# What every stack tags: the keys its gpu-cloud:tags must give, and the ones gpu-cloud adds (decisions/config/validate.py).
REQUIRED_TAG_KEYS = list(dict.fromkeys([*REQUIRED_TAGS, *resource_tags({}, environment="", stack="")]))
PUBLIC_LISTENER_PORTS = [80, 443]     # what a load balancer listener may take from anywhere
GPU_RESOURCE = "nvidia.com/gpu"
NTH_CHART = "aws-node-termination-handler"
GPU_OPERATOR_CHART = "gpu-operator"
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")   # all EKS has
ANYWHERE = ("0.0.0.0/0", "::/0")
# Managed policies that amount to admin (AWS managed policies reference, job-function and power-user pages).
ADMIN_POLICY_ARNS = ("arn:aws:iam::aws:policy/AdministratorAccess", "arn:aws:iam::aws:policy/PowerUserAccess",
                     "arn:aws:iam::aws:policy/IAMFullAccess")
# Actions with no resource type in the Service Authorization Reference, so `"Resource": "*"` is the only way to
# grant them: EC2 and Auto Scaling Describe* ("Describe actions do not support resource-level permissions"), and
# ec2:GetInstanceTypesFromInstanceRequirements (the cluster autoscaler's). Anything else must name its resources.
# Read actions that take no resource ARN (Service Authorization Reference: no resource types listed), so "*" is
# their only Resource: EC2, Auto Scaling and Elastic Load Balancing Describe*, and the EC2 reads the AWS Load
# Balancer Controller makes.
UNSCOPABLE_ACTION_PREFIXES = ("ec2:Describe", "autoscaling:Describe", "elasticloadbalancing:Describe")
# Reads the Service Authorization Reference gives no resource type (ec2:GetCoipPoolUsage and
# ec2:GetSecurityGroupsForVpc are not among them: they take a coip-pool and a vpc resource).
UNSCOPABLE_ACTIONS = ("ec2:GetInstanceTypesFromInstanceRequirements",)
STATEFUL_TYPES = (EKS_CLUSTER, LUSTRE, KMS_KEY) + BUCKET_TYPES
REPLICATED_PURPOSES = REPLICATED                    # what a primary prod stack copies (decisions/storage/buckets.py)
DR_PEER_REFERENCE = PEER_REFERENCE                   # the StackReference layers.foundation registers
# The releases whose own namespaces k8s-namespace-default-deny excepts: the pinned release manifests, name@version.
PINNED_RELEASES = frozenset(release_label(name, pin.version) for name, pin in load_charts().manifests.items())


@lru_cache(maxsize=1)
def catalog() -> Catalog:
    return load_catalog()


def allowed_instance_types_default() -> List[str]:
    return sorted(catalog().instance_types)


# --- reading props --------------------------------------------------------------------------------------------
class _Unknown:
    """A value the engine cannot know during preview (an ID not yet allocated)."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


def known(*values: Any) -> bool:
    """None of the values is one the preview cannot know yet."""
    return not any(value is UNKNOWN for value in values)


def unseen(resource: PolicyResource) -> bool:
    """The engine shows none of the resource's outputs yet: a preview's Create under a provider whose configuration
    is unknown "hand[s] back an empty property map" (pulumi/pulumi pkg/resource/plugin/provider_plugin.go). Every
    resource the program registers has outputs once it can be seen (a Kubernetes object its apiVersion and kind, a
    Helm release its chart)."""
    return len(resource.props) == 0


def get(props: Any, *path: Any, default: Any = None) -> Any:
    """props[path...], or default where a key is absent; UNKNOWN where the engine does not know it yet."""
    value = props
    for key in path:
        if value is UNKNOWN:
            return UNKNOWN
        try:
            if isinstance(value, Mapping):
                if key not in value:
                    return default
                value = value[key]
            elif isinstance(value, Sequence) and not isinstance(value, str) and isinstance(key, int):
                value = value[key]
            else:
                return default
        except UnknownValueError:
            return UNKNOWN
        except IndexError:
            return default
    return default if value is None else value


def items(value: Any) -> List[Any]:
    """A list prop as a list (absent: empty)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, _Unknown)):
        return [get(value, i) for i in range(len(value))]
    return []


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def number(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def as_dict(value: Any) -> Dict[str, Any]:
    """A map prop as a plain dict; a JSON string (how provider configs carry nested objects) decoded."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if isinstance(value, Mapping):
        return {k: get(value, k) for k in value}
    return {}


def policy_document(value: Any) -> Dict[str, Any]:
    return as_dict(value) if not isinstance(value, _Unknown) else {}


def statements(document: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    found = document.get("Statement") or []
    return [s for s in ([found] if isinstance(found, Mapping) else found) if isinstance(s, Mapping)]


def as_list(value: Any) -> List[Any]:
    return [value] if isinstance(value, str) else list(value or [])


def config_value(args, key: str, default: Any) -> Any:
    value = args.get_config().get(key)
    return default if value is None else value


# --- resource policies: launch templates ----------------------------------------------------------------------
def launch_template_imdsv2(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != LAUNCH_TEMPLATE:
        return
    options = get(args.props, "metadataOptions", default={})
    if known(get(options, "httpTokens")) and get(options, "httpTokens") != "required":
        report(f"launch template {args.name} allows IMDSv1 (metadataOptions.httpTokens is "
               f"{get(options, 'httpTokens', default='unset')!r}): set http_tokens=\"required\" so only session "
               "tokens reach the instance metadata service")
    hops = number(get(options, "httpPutResponseHopLimit"))
    if known(get(options, "httpPutResponseHopLimit")) and (hops is None or hops > 2):
        report(f"launch template {args.name}: metadataOptions.httpPutResponseHopLimit is "
               f"{'unset' if hops is None else int(hops)}: set it to 1 (2 at most, for pods on the host network) so "
               "containers cannot reach node credentials")


def launch_template_encrypted_volumes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != LAUNCH_TEMPLATE:
        return
    for mapping in items(get(args.props, "blockDeviceMappings")):
        ebs = get(mapping, "ebs")
        if ebs and known(get(ebs, "encrypted")) and not truthy(get(ebs, "encrypted")):
            report(f"launch template {args.name}: block device {get(mapping, 'deviceName', default='?')} is not "
                   "encrypted: set ebs.encrypted=\"true\" (with the account's EBS key or kms_key_id)")


def launch_template_no_public_ip(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != LAUNCH_TEMPLATE:
        return
    for i, nic in enumerate(items(get(args.props, "networkInterfaces"))):
        if truthy(get(nic, "associatePublicIpAddress")):
            report(f"launch template {args.name}: networkInterfaces[{i}] asks for a public IP: GPU nodes live in "
                   "private subnets; set associate_public_ip_address=\"false\"")


def efa_interface_layout(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """An EFA launch template's interfaces are the catalog's layout (decisions/nodes/efa.py) for its instance type."""
    if args.resource_type != LAUNCH_TEMPLATE:
        return
    nics = items(get(args.props, "networkInterfaces"))
    if not any(get(n, "interfaceType") in (EFA_ONLY, "efa") for n in nics):
        return
    itype = get(args.props, "instanceType")
    shown = [itype] + [get(n, field) for n in nics for field in ("networkCardIndex", "deviceIndex", "interfaceType")]
    if not known(*shown):
        return
    listed = catalog().instance_types.get(itype)
    if listed is None or not listed.supports_efa:
        report(f"launch template {args.name} has EFA interfaces but {itype} has no EFA entry in "
               "decisions/catalog/catalog.yaml: "
               "add the type's EFA cards to the catalog or drop the EFA interfaces")
        return
    found = sorted((int(number(get(n, "networkCardIndex")) or 0), int(number(get(n, "deviceIndex")) or 0),
                    get(n, "interfaceType") or ENA) for n in nics)
    layouts = {bandwidth: sorted((i.network_card_index, i.device_index, i.interface_type)
                                 for i in interface_layout(listed, efa=True, max_ip_bandwidth=bandwidth))
               for bandwidth in (False, True)}
    if found not in layouts.values():
        expected = layouts[False]
        report(f"launch template {args.name}: {len(found)} interfaces ({sum(t != ENA for *_, t in found)} EFA) do "
               f"not match {itype}'s catalog layout of {len(expected)} ({listed.efa.cards} EFA cards: primary ENA at "
               "card 0 device 0, efa-only at card 0 device 1 and at device 0 of every other card): build the "
               "interfaces from decisions/nodes/efa.py interface_layout")


# --- resource policies: EKS, network, KMS, FSx, IAM -------------------------------------------------------------
def eks_endpoint_not_public(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != EKS_CLUSTER:
        return
    vpc = get(args.props, "vpcConfig", default={})
    # The EKS API's defaults: public access on, open to 0.0.0.0/0 (EKS User Guide, cluster endpoint access).
    public = get(vpc, "endpointPublicAccess", default=True)
    listed = get(vpc, "publicAccessCidrs")
    cidrs = items(listed) or ["0.0.0.0/0"]
    if not (known(public, listed) and truthy(public)):
        return
    wide = [c for c in cidrs if c in ANYWHERE or _wider_than_one_egress(c)]
    if wide:
        report(f"EKS cluster {args.name}: the public API endpoint is open to {', '.join(map(str, wide))}, wider than "
               f"/{WIDEST_PUBLIC_PREFIX} (the largest block IANA ever gave one organisation): set "
               "endpoint_public_access=False (reach the API through the VPC) or list the runners' egress ranges in "
               "public_access_cidrs")


def _wider_than_one_egress(cidr: Any) -> bool:
    try:
        return too_wide(str(cidr))
    except ValueError:      # not a CIDR: EKS refuses it itself
        return False


def eks_secrets_encrypted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != EKS_CLUSTER:
        return
    config = get(args.props, "encryptionConfig", default={})
    if not known(get(config, "resources")):
        return
    if "secrets" not in items(get(config, "resources")) or not get(config, "provider", "keyArn"):
        report(f"EKS cluster {args.name}: Kubernetes secrets are not envelope-encrypted with a KMS key: set "
               "encryption_config with resources=[\"secrets\"] and provider.key_arn of a customer-managed key")


def eks_control_plane_logs(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != EKS_CLUSTER:
        return
    if not known(get(args.props, "enabledClusterLogTypes")):
        return
    enabled = set(items(get(args.props, "enabledClusterLogTypes")))
    missing = [t for t in CONTROL_PLANE_LOG_TYPES if t not in enabled]
    if missing:
        report(f"EKS cluster {args.name}: control-plane log types {', '.join(missing)} are off: enable all of "
               f"{', '.join(CONTROL_PLANE_LOG_TYPES)} in enabled_cluster_log_types")


def _open_ports(from_port: Any, to_port: Any, protocol: Any) -> Optional[Tuple[int, int]]:
    if str(protocol) in ("-1", "all"):
        return (0, 65535)
    low, high = number(from_port), number(to_port)
    return (0, 65535) if low is None or high is None else (int(low), int(high))


def no_open_ingress(args: ResourceValidationArgs, report: ReportViolation) -> None:
    listener_ports = set(int(p) for p in config_value(args, "publicListenerPorts", PUBLIC_LISTENER_PORTS))
    rules: List[Tuple[str, Any, Any, Any, List[Any]]] = []
    if args.resource_type == SG_INGRESS:
        p = args.props
        rules.append((args.name, get(p, "fromPort"), get(p, "toPort"), get(p, "ipProtocol"),
                      [get(p, "cidrIpv4"), get(p, "cidrIpv6")]))
    elif args.resource_type == SG_RULE and get(args.props, "type") == "ingress":
        p = args.props
        rules.append((args.name, get(p, "fromPort"), get(p, "toPort"), get(p, "protocol"),
                      items(get(p, "cidrBlocks")) + items(get(p, "ipv6CidrBlocks"))))
    elif args.resource_type in (SECURITY_GROUP, DEFAULT_SG):
        for i, rule in enumerate(items(get(args.props, "ingress"))):
            rules.append((f"{args.name} ingress[{i}]", get(rule, "fromPort"), get(rule, "toPort"),
                          get(rule, "protocol"), items(get(rule, "cidrBlocks")) + items(get(rule, "ipv6CidrBlocks"))))
    for where, low, high, protocol, sources in rules:
        open_to = [s for s in sources if s in ANYWHERE]
        if not open_to:
            continue
        ports = _open_ports(low, high, protocol)
        if ports[0] == ports[1] and ports[0] in listener_ports:
            continue
        shown = "all ports" if ports == (0, 65535) else f"ports {ports[0]}-{ports[1]}"
        report(f"{where} opens {shown} to {', '.join(open_to)}: only load balancer listener ports "
               f"({', '.join(map(str, sorted(listener_ports)))}) may take traffic from anywhere; allow the VPC CIDR "
               "or a referenced security group instead")


def kms_rotation(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != KMS_KEY:
        return
    spec = get(args.props, "customerMasterKeySpec") or get(args.props, "keySpec") or "SYMMETRIC_DEFAULT"
    rotation = get(args.props, "enableKeyRotation")
    if spec == "SYMMETRIC_DEFAULT" and known(rotation) and not truthy(rotation):
        report(f"KMS key {args.name} does not rotate: set enable_key_rotation=True (yearly automatic rotation)")


def fsx_customer_key(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != LUSTRE:
        return
    if not get(args.props, "kmsKeyId"):
        report(f"FSx for Lustre {args.name} is encrypted with the AWS-managed key: give kms_key_id a customer-managed "
               "key (PERSISTENT deployment types take one) so access to the data follows the key policy")


def _environment(args) -> Optional[str]:
    """The stack's environment tag: the resource's own tags, else its AWS provider's defaultTags (None where the
    preview cannot know them)."""
    own = as_dict(get(args.props, "tags")).get("environment")
    if own:
        return own
    provider = args.provider
    return _default_tags(provider.props).get("environment") if provider is not None else None


def log_retention_in_prod(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type != LOG_GROUP or _environment(args) != "prod":
        return
    days = get(args.props, "retentionInDays")
    # No retention (or 0) is CloudWatch Logs' "never expire", which keeps them longer still.
    if known(days) and number(days) and number(days) < PROD_LOG_RETENTION_DAYS:
        report(f"log group {args.name} in a prod stack keeps its logs {int(number(days))} days: keep them at least "
               f"{PROD_LOG_RETENTION_DAYS} (gpu-cloud:monitoring.logRetentionDays)")


def _iam_documents(args) -> List[Tuple[str, Dict[str, Any]]]:
    if args.resource_type in (IAM_ROLE_POLICY, IAM_POLICY):
        return [(args.name, policy_document(get(args.props, "policy")))]
    if args.resource_type == IAM_ROLE:
        return [(f"{args.name} inline policy {get(p, 'name', default=i)}", policy_document(get(p, "policy")))
                for i, p in enumerate(items(get(args.props, "inlinePolicies")))]
    return []


def _allows(statement: Mapping[str, Any]) -> bool:
    return statement.get("Effect") == "Allow"


def iam_no_wildcard_admin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for where, document in _iam_documents(args):
        for statement in filter(_allows, statements(document)):
            actions = as_list(statement.get("Action"))
            if any(a in ("*", "*:*") for a in actions) and "*" in as_list(statement.get("Resource")):
                report(f"{where} allows every action on every resource (statement "
                       f"{statement.get('Sid', '(no Sid)')}): grant the actions the workload calls on its own "
                       "resources")


def _unscopable(action: str) -> bool:
    return action in UNSCOPABLE_ACTIONS or action.startswith(UNSCOPABLE_ACTION_PREFIXES)


def iam_actions_name_resources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for where, document in _iam_documents(args):
        for statement in filter(_allows, statements(document)):
            sid = statement.get("Sid", "(no Sid)")
            if "NotAction" in statement or "NotResource" in statement:
                report(f"{where} statement {sid} allows with NotAction/NotResource: list what is allowed instead")
                continue
            if "*" not in as_list(statement.get("Resource")):
                continue
            loose = [a for a in as_list(statement.get("Action")) if not _unscopable(a) and a not in ("*", "*:*")]
            if loose:
                report(f"{where} statement {sid} grants {', '.join(loose)} on \"*\": these actions take resource "
                       "ARNs; name the resources (only reads without resource types need \"*\": "
                       "EC2, Auto Scaling and ELB Describe*, ec2:GetInstanceTypesFromInstanceRequirements)")


def iam_no_admin_policies(args: ResourceValidationArgs, report: ReportViolation) -> None:
    arns: List[Any] = []
    if args.resource_type == IAM_ATTACHMENT:
        arns = [get(args.props, "policyArn")]
    elif args.resource_type == IAM_ROLE:
        arns = items(get(args.props, "managedPolicyArns"))
    for arn in arns:
        if arn in ADMIN_POLICY_ARNS:
            report(f"{args.name} gives the role {arn.rsplit('/', 1)[-1]}: node and add-on roles get only what their "
                   "workload calls (AmazonEKSWorkerNodePolicy, ECR pull, their own inline policy)")


# --- resource policies: Kubernetes objects the program renders ------------------------------------------------
def _pod_spec(args) -> Any:
    path = POD_SPEC_PATHS.get(args.resource_type)
    return get(args.props, *path) if path else None


def _containers(pod: Any) -> List[Any]:
    return [c for kind in ("initContainers", "containers", "ephemeralContainers") for c in items(get(pod, kind))]


def k8s_no_privileged(args: ResourceValidationArgs, report: ReportViolation) -> None:
    # Helm releases (pinned operator charts) carry values, not pods: the program does not render them.
    pod = _pod_spec(args)
    for container in _containers(pod) if pod else []:
        if truthy(get(container, "securityContext", "privileged")):
            report(f"{args.resource_type.split(':')[-1]} {args.name}: container {get(container, 'name')} is "
                   "privileged: drop securityContext.privileged and grant the one capability it needs")


def k8s_gpu_limits(args: ResourceValidationArgs, report: ReportViolation) -> None:
    pod = _pod_spec(args)
    containers = _containers(pod) if pod else []

    def gpus(container, kind):
        return number(get(container, "resources", kind, GPU_RESOURCE))

    if not any(gpus(c, "requests") or gpus(c, "limits") for c in containers):
        return
    for container in containers:
        name = get(container, "name")
        if not known(get(container, "resources", "limits")):
            continue
        limits = as_dict(get(container, "resources", "limits"))
        if not limits:
            report(f"{args.resource_type.split(':')[-1]} {args.name}: container {name} of a GPU pod sets no resource "
                   "limits: a GPU node is shared by the pod's containers; set limits (memory at least)")
        elif gpus(container, "requests") and gpus(container, "requests") != gpus(container, "limits"):
            report(f"{args.resource_type.split(':')[-1]} {args.name}: container {name} requests "
                   f"{int(gpus(container, 'requests'))} {GPU_RESOURCE} without the same limit: GPUs are an "
                   "extended resource; set limits.nvidia.com/gpu to the request")


def k8s_no_cluster_admin_default_sa(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in BINDINGS or get(args.props, "roleRef", "name") != "cluster-admin":
        return
    for subject in items(get(args.props, "subjects")):
        kind, name = get(subject, "kind"), get(subject, "name")
        if (kind == "ServiceAccount" and name == "default") or (
                kind == "Group" and str(name).startswith("system:serviceaccounts")):
            report(f"{args.name} binds cluster-admin to {kind} {get(subject, 'namespace', default='')}/{name}: any "
                   "pod would run as cluster admin; bind a narrow role to a dedicated service account")


def _denies_all(policy: PolicyResource) -> bool:
    spec = get(policy.props, "spec", default={})
    return (as_dict(get(spec, "podSelector")) == {} and get(spec, "podSelector") is not None
            and {"Ingress", "Egress"} <= set(items(get(spec, "policyTypes")))
            and not items(get(spec, "ingress")) and not items(get(spec, "egress")))


def _release_namespaces(resources: Sequence[PolicyResource]) -> Optional[set]:
    """Namespaces that belong to a pinned release manifest, decided from the objects: the namespace and every workload
    the program runs in it carry the annotation of one release pinned in decisions/catalog/charts.yaml
    (decisions/platform/release_manifest.py), and at least one such workload runs there: the release declares the
    namespace for its own controller, and nothing else runs in it. None while an annotation or namespace is not
    visible."""
    workloads = _by_type(resources, *POD_SPEC_PATHS)
    namespaces = _by_type(resources, NAMESPACE)
    if any(map(unseen, workloads + namespaces)):
        return None
    read = [get(r.props, "metadata", "namespace") for r in workloads] + [
        get(r.props, "metadata", "annotations", RELEASE_ANNOTATION) for r in workloads + namespaces] + [
        get(r.props, "metadata", "name") for r in namespaces]
    if not known(*read):
        return None
    running: Dict[Any, set] = {}
    for workload in workloads:
        running.setdefault(get(workload.props, "metadata", "namespace"), set()).add(
            get(workload.props, "metadata", "annotations", RELEASE_ANNOTATION))
    owned = set()
    for namespace in namespaces:
        release = get(namespace.props, "metadata", "annotations", RELEASE_ANNOTATION)
        name = get(namespace.props, "metadata", "name")
        if release in PINNED_RELEASES and running.get(name) == {release}:
            owned.add(name)
    return owned


def k8s_namespace_default_deny(args: StackValidationArgs, report: ReportViolation) -> None:
    # A namespace that belongs to an operator the program installs from a pinned release (the GPU operator's,
    # Kueue's, the MPI Operator's, JobSet's) is excepted, like its pods: the release opens its webhooks and API calls
    # with no NetworkPolicies. A chart's: a Helm release installs into it. A release manifest's: decided from its
    # objects (_release_namespaces).
    releases, network_policies = _by_type(args.resources, HELM_RELEASE), _by_type(args.resources, NETWORK_POLICY)
    if any(map(unseen, releases + network_policies)):
        return      # which namespaces are excepted or denied is not visible yet
    operator_namespaces = {get(r.props, "namespace") for r in releases}
    read = [get(p.props, "metadata", "namespace") for p in network_policies] + [
        get(p.props, "spec", key) for p in network_policies for key in ("podSelector", "policyTypes", "ingress", "egress")]
    manifest_namespaces = _release_namespaces(args.resources)
    if not known(*operator_namespaces, *read) or manifest_namespaces is None:
        return
    denying = {get(p.props, "metadata", "namespace") for p in network_policies if _denies_all(p)}
    for namespace in _by_type(args.resources, NAMESPACE):
        name = get(namespace.props, "metadata", "name")
        if unseen(namespace) or not known(name):
            continue
        if name not in operator_namespaces | manifest_namespaces and name not in denying:
            report(f"namespace {name} has no default-deny NetworkPolicy: add one selecting every pod "
                   "(podSelector {}) with policyTypes Ingress and Egress and no rules, then allow what it needs",
                   namespace.urn)


# --- stack policies: helpers -----------------------------------------------------------------------------------
def _default_tags(props: Any) -> Dict[str, str]:
    return as_dict(as_dict(get(props, "defaultTags")).get("tags"))


def _by_type(resources: Iterable[PolicyResource], *types: str) -> List[PolicyResource]:
    return [r for r in resources if r.resource_type in types]


def _deps(resource: PolicyResource, *types: str) -> List[PolicyResource]:
    return [d for d in resource.dependencies if d.resource_type in types]


@dataclass(frozen=True)
class Pool:
    """A GPU node pool as the engine sees it: its Auto Scaling group and the launch template it launches."""
    asg: PolicyResource
    template: Optional[PolicyResource]

    @property
    def name(self) -> str:
        parent = self.asg.parent
        return parent.name if parent is not None else self.asg.name

    @property
    def instance_types(self) -> List[str]:
        overrides = items(get(self.asg.props, "mixedInstancesPolicy", "launchTemplate", "overrides"))
        types = [get(o, "instanceType") for o in overrides if get(o, "instanceType")]
        own = get(self.template.props, "instanceType") if self.template is not None else None
        return list(dict.fromkeys(([own] if own else []) + types))

    @property
    def efa(self) -> bool:
        return self.template is not None and any(
            get(n, "interfaceType") in (EFA_ONLY, "efa") for n in items(get(self.template.props, "networkInterfaces")))

    @property
    def capacity(self) -> str:
        """How AWS bills it: the launch template's market or reservation, the group's spot distribution."""
        template = self.template.props if self.template is not None else {}
        market = get(template, "instanceMarketOptions", "marketType")
        if market in ("capacity-block", "spot"):
            return market
        distribution = get(self.asg.props, "mixedInstancesPolicy", "instancesDistribution")
        if distribution is not None and (number(get(distribution, "onDemandPercentageAboveBaseCapacity")) == 0
                                         and not number(get(distribution, "onDemandBaseCapacity"))):
            return "spot"
        if get(template, "capacityReservationSpecification", "capacityReservationTarget"):
            return "reserved"
        return "on-demand"

    @property
    def gpu(self) -> bool:
        known = catalog().instance_types
        return any(t in known and known[t].gpu is not None for t in self.instance_types)


def pools(resources: Sequence[PolicyResource]) -> List[Pool]:
    found = []
    for asg in _by_type(resources, ASG):
        templates = _deps(asg, LAUNCH_TEMPLATE)
        found.append(Pool(asg, templates[0] if templates else None))
    return found


# --- stack policies: GPU pools ----------------------------------------------------------------------------------
def efa_placement_and_zone(args: StackValidationArgs, report: ReportViolation) -> None:
    for pool in filter(lambda p: p.efa, pools(args.resources)):
        template = pool.template
        group_name = get(template.props, "placement", "groupName")
        groups = _deps(template, PLACEMENT_GROUP)
        # Reserved capacity is placed where it was reserved: a capacity block by AWS, a capacity reservation in the
        # group it was made in, if any (the config check holds placementGroup to the reservation's own).
        reserved = get(template.props, "capacityReservationSpecification", "capacityReservationTarget",
                       "capacityReservationId")
        if not reserved:
            if not group_name:
                report(f"EFA pool {pool.name}: launch template {template.name} names no placement group: EFA needs "
                       "its nodes on one network spine; launch in a cluster placement group", template.urn)
            for group in groups:
                if known(get(group.props, "strategy")) and get(group.props, "strategy") != "cluster":
                    report(f"EFA pool {pool.name}: placement group {group.name} has strategy "
                           f"{get(group.props, 'strategy')!r}: EFA pools need strategy \"cluster\"", group.urn)
        # During a preview that creates the subnets, the engine may know only that there is a list.
        zone_identifiers = get(pool.asg.props, "vpcZoneIdentifiers")
        subnets = items(zone_identifiers)
        if zone_identifiers is not UNKNOWN and len(subnets) != 1:
            report(f"EFA pool {pool.name}: Auto Scaling group {pool.asg.name} spans {len(subnets)} subnets: a cluster "
                   "placement group lives in one zone; give the pool exactly one subnet", pool.asg.urn)


def _self_referencing(rule: PolicyResource) -> bool:
    group, referenced = get(rule.props, "securityGroupId"), get(rule.props, "referencedSecurityGroupId")
    if UNKNOWN in (group, referenced):    # preview of a new group: both come from the one group it depends on
        return referenced is not None and len(_deps(rule, SECURITY_GROUP)) == 1
    return group is not None and group == referenced


def efa_security_group_self(args: StackValidationArgs, report: ReportViolation) -> None:
    rules = _by_type(args.resources, SG_INGRESS, SG_EGRESS)
    for pool in filter(lambda p: p.efa, pools(args.resources)):
        ok = False
        for group in _deps(pool.template, SECURITY_GROUP):
            candidates = [r for r in rules if group in r.dependencies and _self_referencing(r)]
            if not known(*(get(r.props, "ipProtocol") for r in candidates)):
                ok = True       # cannot judge yet
            mine = [r for r in candidates if str(get(r.props, "ipProtocol")) == "-1"]
            if {r.resource_type for r in mine} == {SG_INGRESS, SG_EGRESS}:
                ok = True
        if not ok:
            report(f"EFA pool {pool.name}: no security group of launch template {pool.template.name} allows all "
                   "traffic to and from itself: EFA's OS-bypass traffic needs an ingress and an egress rule with "
                   "ip_protocol \"-1\" referencing the group itself", pool.template.urn)


def gpu_pool_verification_hook(args: StackValidationArgs, report: ReportViolation) -> None:
    hooks = _by_type(args.resources, LIFECYCLE_HOOK)
    for pool in filter(lambda p: p.gpu, pools(args.resources)):
        listed = items(get(pool.asg.props, "initialLifecycleHooks"))
        if not known(get(pool.asg.props, "initialLifecycleHooks"),
                     *(get(h, field) for h in listed for field in ("lifecycleTransition", "defaultResult"))):
            continue
        launching = [h for h in listed if get(h, "lifecycleTransition") == "autoscaling:EC2_INSTANCE_LAUNCHING"]
        if not any(get(h, "defaultResult") == "ABANDON" for h in launching):
            report(f"GPU pool {pool.name}: Auto Scaling group {pool.asg.name} has no launch lifecycle hook with "
                   "default result ABANDON: a node that fails GPU verification (or never reports) would join the "
                   "cluster; add the verification hook to initial_lifecycle_hooks", pool.asg.urn)
        names = {get(h, "name") for h in launching}
        for hook in hooks:
            if get(hook.props, "name") in names and pool.asg in hook.dependencies and \
                    known(get(hook.props, "defaultResult")) and get(hook.props, "defaultResult") != "ABANDON":
                report(f"GPU pool {pool.name}: lifecycle hook {hook.name} sets default result "
                       f"{get(hook.props, 'defaultResult')!r}: the verification hook must ABANDON", hook.urn)


def gpu_pool_instance_types(args: StackValidationArgs, report: ReportViolation) -> None:
    allowed = set(config_value(args, "allowedInstanceTypes", allowed_instance_types_default()))
    for pool in pools(args.resources):
        for itype in filter(known, pool.instance_types):
            if itype not in allowed:
                report(f"pool {pool.name} launches {itype}, which is not in allowedInstanceTypes "
                       f"({', '.join(sorted(allowed))}): pick an allowed type or extend the pack's config",
                       pool.asg.urn)


def gpu_pool_one_shape(args: StackValidationArgs, report: ReportViolation) -> None:
    known = catalog().instance_types
    for pool in pools(args.resources):
        shapes = {(known[t].gpu.model, known[t].gpu.count) for t in pool.instance_types if t in known}
        if len(shapes) > 1:
            listed = ", ".join(f"{n} x {m}" for m, n in sorted(shapes))
            report(f"pool {pool.name} mixes GPU shapes ({listed}) across {', '.join(pool.instance_types)}: jobs and "
                   "the autoscaler assume one shape per pool; split the types into pools", pool.asg.urn)


def _nth_releases(resources) -> List[PolicyResource]:
    return [r for r in _by_type(resources, HELM_RELEASE) if str(get(r.props, "chart", default="")).endswith(NTH_CHART)]


def spot_interruption_handling(args: StackValidationArgs, report: ReportViolation) -> None:
    spot = [p for p in pools(args.resources) if p.capacity == "spot"]
    if not spot:
        return
    queues = _by_type(args.resources, SQS_QUEUE)
    handlers = [r for r in _nth_releases(args.resources) if truthy(get(r.props, "values", "enableSqsTerminationDraining"))]
    hidden = any(unseen(r) or not known(get(r.props, "chart"), get(r.props, "values", "enableSqsTerminationDraining"))
                 for r in _by_type(args.resources, HELM_RELEASE))
    for pool in spot:
        if not handlers and hidden:
            continue    # the handler may be among the releases the preview cannot show yet
        if not queues or not handlers:
            report(f"spot pool {pool.name} has no interruption handling: two-minute spot notices need the "
                   "interruption queue (SQS, fed by EventBridge) and aws-node-termination-handler in queue mode "
                   "(components/nodes/node_drain.py)", pool.asg.urn)
            continue
        for handler in handlers:
            values = get(handler.props, "values", default={})
            tag = get(values, "managedTag", default=NTH_MANAGED_TAG)
            tagged = {get(t, "key") for t in items(get(pool.asg.props, "tags"))}
            if not known(tag, get(values, "checkASGTagBeforeDraining"), get(pool.asg.props, "tags"), *tagged):
                continue
            if get(values, "checkASGTagBeforeDraining", default=True) is not False and tag not in tagged:
                report(f"spot pool {pool.name}: the termination handler only drains groups tagged {tag}, and "
                       f"{pool.asg.name} is not: tag the group so its interrupted nodes are drained", pool.asg.urn)


def _gpu_alert_rules(resources) -> List[PolicyResource]:
    found = []
    for rule in _by_type(resources, PROMETHEUS_RULE):
        exprs = [str(get(r, "expr", default="")) for g in items(get(rule.props, "spec", "groups"))
                 for r in items(get(g, "rules")) if get(r, "alert")]
        if any("DCGM_" in e for e in exprs):     # the DCGM exporter's metric names
            found.append(rule)
    return found


def gpu_pool_observability(args: StackValidationArgs, report: ReportViolation) -> None:
    gpu_pools = [p for p in pools(args.resources) if p.gpu]
    if not gpu_pools:
        return
    releases = _by_type(args.resources, HELM_RELEASE)
    operators = [r for r in releases if str(get(r.props, "chart", default="")).endswith(GPU_OPERATOR_CHART)]
    exporter = any(truthy(get(r.props, "values", "dcgmExporter", "enabled")) for r in operators)
    exporter_hidden = any(unseen(r) or not known(get(r.props, "chart")) for r in releases) or not known(
        *(get(r.props, "values", "dcgmExporter", "enabled") for r in operators))
    rules_hidden = any(unseen(r) or not known(get(r.props, "spec", "groups"))
                       for r in _by_type(args.resources, PROMETHEUS_RULE))
    names = ", ".join(p.name for p in gpu_pools)
    if not exporter and not exporter_hidden:
        report(f"GPU pools ({names}) without the DCGM exporter: enable dcgmExporter in the GPU operator release so "
               "GPU health and utilization are measured")
    if not _gpu_alert_rules(args.resources) and not rules_hidden:
        report(f"GPU pools ({names}) without GPU alert rules: deploy a PrometheusRule with alerts on the DCGM "
               "metrics (XID errors, temperature, memory) so failing GPUs page someone")


# --- stack policies: S3 --------------------------------------------------------------------------------------
def _buckets(resources) -> List[Tuple[PolicyResource, str]]:
    return [(b, get(b.props, "bucket")) for b in _by_type(resources, *BUCKET_TYPES)]


def _for_bucket(resources, types: Sequence[str], bucket: PolicyResource, name: Any) -> List[PolicyResource]:
    """The settings resources of a bucket: their `bucket` names it, or came from it (their property dependency,
    which the engine gives even where a preview cannot know the name)."""
    return [r for r in _by_type(resources, *types)
            if bucket in r.property_dependencies.get("bucket", ()) or (
                name is not None and known(name) and get(r.props, "bucket") == name)]


def s3_public_access_blocked(args: StackValidationArgs, report: ReportViolation) -> None:
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket, name in _buckets(args.resources):
        blocks = _for_bucket(args.resources, (PUBLIC_ACCESS_BLOCK,), bucket, name)
        if not known(*(get(b.props, f) for b in blocks for f in flags)):
            continue
        if not any(all(truthy(get(b.props, f)) for f in flags) for b in blocks):
            report(f"bucket {bucket.name} does not block public access: add a BucketPublicAccessBlock with "
                   f"{', '.join(flags)} all true", bucket.urn)


def _stack_and_project(urn: str) -> Tuple[str, str]:
    """A URN's stack and project: urn:pulumi:<stack>::<project>::<type>::<name>."""
    head, project = urn.split("::")[:2]
    return head.rsplit(":", 1)[-1], project


_LOG_BUCKET_NAME = re.compile(rf"-(\d{{12}})-{re.escape(LOGS)}$")


def log_bucket(bucket: PolicyResource, name: Any) -> Optional[bool]:
    """Whether `bucket` is the stack's log bucket: its name is decisions.storage.buckets.bucket_name(project, stack,
    account, LOGS) for the project and stack of its URN and the account its name carries. None while the preview
    cannot know the name. Only that bucket receives access logs and is SSE-S3; any other bucket a BucketLogging
    happens to name as its target is held to SSE-KMS and to logging like the rest."""
    if not known(name):
        return None
    found = _LOG_BUCKET_NAME.search(name) if isinstance(name, str) else None
    if not found:
        return False
    stack, project = _stack_and_project(bucket.urn)
    try:
        return name == bucket_name(project, stack, found[1], LOGS)
    except ValueError:
        return False


def _log_target(resources, bucket: PolicyResource, name: Any) -> Optional[bool]:
    """Whether a BucketLogging names `bucket` as its targetBucket, by value or by property dependency (a preview gives
    the dependency even before the name is known); None where a logging's target is unknown and could be it."""
    loggings = _by_type(resources, *BUCKET_LOGGING)
    if any(bucket in l.property_dependencies.get("targetBucket", ()) for l in loggings):
        return True
    targets = [get(l.props, "targetBucket") for l in loggings]
    if known(name) and name in targets:
        return True
    return None if not known(name, *targets) else False


def s3_sse_kms(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket, name in _buckets(args.resources):
        configs = _for_bucket(args.resources, BUCKET_SSE, bucket, name)
        rules = [rule for c in configs for rule in items(get(c.props, "rules"))]
        if not known(*(get(c.props, "rules") for c in configs),
                     *(get(r, "applyServerSideEncryptionByDefault", "sseAlgorithm") for r in rules)):
            continue
        algorithms = [get(r, "applyServerSideEncryptionByDefault", "sseAlgorithm") for r in rules]
        is_log_bucket = log_bucket(bucket, name)
        if is_log_bucket is None:
            continue    # a preview that cannot show the name cannot tell the log bucket from the others
        if is_log_bucket:
            # S3 server access logging writes only to a target whose default encryption is SSE-S3 (S3 User Guide,
            # "Enabling Amazon S3 server access logging": "Default server-side encryption with AWS Key Management
            # Service (AWS KMS) keys (SSE-KMS) is not supported"): the stack's log bucket alone is excepted, and held
            # to AES256.
            if algorithms != [LOG_BUCKET_SSE]:
                report(f"bucket {bucket.name} is the stack's log bucket, which receives S3 server access logs, but its "
                       f"default encryption is {', '.join(map(str, algorithms)) or 'not set'}: log delivery supports "
                       f"SSE-S3 only; set sse_algorithm \"{LOG_BUCKET_SSE}\" with no KMS key", bucket.urn)
            continue
        if not any(get(r, "applyServerSideEncryptionByDefault", "sseAlgorithm") in ("aws:kms", "aws:kms:dsse")
                   and get(r, "applyServerSideEncryptionByDefault", "kmsMasterKeyId") for r in rules):
            report(f"bucket {bucket.name} is not encrypted with SSE-KMS under its own key: add a server-side "
                   "encryption configuration with sse_algorithm \"aws:kms\" and kms_master_key_id", bucket.urn)


def s3_versioning(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket, name in _buckets(args.resources):
        configs = _for_bucket(args.resources, BUCKET_VERSIONING, bucket, name)
        if not known(*(get(c.props, "versioningConfiguration", "status") for c in configs)):
            continue
        if not any(get(c.props, "versioningConfiguration", "status") == "Enabled" for c in configs):
            report(f"bucket {bucket.name} is not versioned: add a BucketVersioning with status \"Enabled\" (an "
                   "overwritten checkpoint or model stays recoverable)", bucket.urn)


def _denies_plain_http(document: Mapping[str, Any]) -> bool:
    for statement in statements(document):
        condition = statement.get("Condition") or {}
        secure = (condition.get("Bool") or {}).get("aws:SecureTransport") if isinstance(condition, Mapping) else None
        if statement.get("Effect") == "Deny" and str(secure).lower() == "false" and \
                any(a in ("s3:*", "*") for a in as_list(statement.get("Action"))):
            return True
    return False


def s3_tls_only(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket, name in _buckets(args.resources):
        documents = [get(p.props, "policy") for p in _for_bucket(args.resources, (BUCKET_POLICY,), bucket, name)]
        if not known(*documents):
            continue    # a policy naming the new bucket's ARN is unknown until the bucket exists
        if not any(_denies_plain_http(policy_document(document)) for document in documents):
            report(f"bucket {bucket.name} accepts plain HTTP: its bucket policy must deny s3:* when "
                   "aws:SecureTransport is false", bucket.urn)


def s3_access_logging(args: StackValidationArgs, report: ReportViolation) -> None:
    for bucket, name in _buckets(args.resources):
        is_log_bucket = log_bucket(bucket, name)
        if is_log_bucket:
            continue    # the stack's log bucket itself: logging it into itself would loop
        if is_log_bucket is None and _log_target(args.resources, bucket, name) is not False:
            continue    # a name the preview cannot show, of a bucket that may be the log bucket
        if not _for_bucket(args.resources, BUCKET_LOGGING, bucket, name):
            report(f"bucket {bucket.name} has no server access logging: add a BucketLogging into the stack's log "
                   "bucket", bucket.urn)


def s3_replication(args: StackValidationArgs, report: ReportViolation) -> None:
    """A primary prod stack (it reads its DR peer, and its provider tags it prod) replicates checkpoints and models."""
    providers = _by_type(args.resources, AWS_PROVIDER)
    prod = any(_default_tags(p.props).get("environment") == "prod" for p in providers)
    primary = any(r.name == DR_PEER_REFERENCE for r in _by_type(args.resources, STACK_REFERENCE))
    if not (prod and primary):
        return
    for bucket, name in _buckets(args.resources):
        if not isinstance(name, str) or not name.endswith(tuple(f"-{p}" for p in REPLICATED_PURPOSES)):
            continue
        configs = _for_bucket(args.resources, (BUCKET_REPLICATION,), bucket, name)
        if not known(*(get(c.props, "rules") for c in configs),
                     *(get(rule, "status") for c in configs for rule in items(get(c.props, "rules")))):
            continue
        if not any(get(rule, "status") == "Enabled" for c in configs for rule in items(get(c.props, "rules"))):
            report(f"bucket {bucket.name} of a primary prod stack does not replicate to the DR peer: add a "
                   "BucketReplicationConfig with an enabled rule (components/storage/replication.py)", bucket.urn)


# --- stack policies: the whole stack --------------------------------------------------------------------------
def vpc_default_security_group_empty(args: StackValidationArgs, report: ReportViolation) -> None:
    defaults = _by_type(args.resources, DEFAULT_SG)
    for vpc in _by_type(args.resources, VPC):
        adopted = [d for d in defaults if vpc in d.dependencies]
        if not adopted:
            report(f"VPC {vpc.name}: its default security group is not managed, so it keeps AWS's allow-within-group "
                   "rules: adopt it with a DefaultSecurityGroup with no rules", vpc.urn)
        for group in adopted:
            if items(get(group.props, "ingress")) or items(get(group.props, "egress")):
                report(f"VPC {vpc.name}: default security group {group.name} has rules: leave ingress and egress "
                       "empty so nothing that lands in it by default can talk", group.urn)


@lru_cache(maxsize=None)
def _taggable(type_token: str) -> bool:
    """Whether pulumi_aws gives the resource type a `tags` input (the provider schema's own answer)."""
    import importlib

    _, module, name = type_token.split(":")
    package = module.split("/")[0]
    try:
        cls = getattr(importlib.import_module("pulumi_aws" if package == "index" else f"pulumi_aws.{package}"), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(getattr(cls, "tags", None), property)


def required_tags(args: StackValidationArgs, report: ReportViolation) -> None:
    keys = list(config_value(args, "requiredTagKeys", REQUIRED_TAG_KEYS))
    for resource in args.resources:
        if not resource.resource_type.startswith("aws:") or not _taggable(resource.resource_type):
            continue
        own = get(resource.props, "tags")
        provider_tags = get(resource.provider.props, "defaultTags") if resource.provider is not None else None
        if unseen(resource) or not known(own, provider_tags):
            continue
        if resource.resource_type == ASG:   # default_tags do not reach Auto Scaling groups (AWS provider docs)
            tags = {get(t, "key") for t in items(own)}
            if not known(*tags):
                continue
        else:
            provider = _default_tags(resource.provider.props) if resource.provider is not None else {}
            tags = set(provider) | set(as_dict(own))
        missing = [k for k in keys if k not in tags]
        if missing:
            report(f"{resource.resource_type.split(':')[-1]} {resource.name} lacks tags {', '.join(missing)}: set them "
                   "in the stack's gpu-cloud:tags (the AWS provider's default_tags) or on the resource", resource.urn)


def stateful_resources_protected(args: StackValidationArgs, report: ReportViolation) -> None:
    for resource in _by_type(args.resources, *STATEFUL_TYPES):
        if not resource.opts.protect:
            report(f"{resource.resource_type.split(':')[-1]} {resource.name} holds data or keys but is not protected: "
                   "set protect=True so a rename or delete cannot destroy it", resource.urn)


def _associations(resources, file_system: PolicyResource) -> Optional[List[PolicyResource]]:
    """The data repository associations of `file_system`: their fileSystemId came from it (the property dependency a
    preview gives before the ID is known) or names its ID; None where an association's file system cannot be told."""
    found = []
    for association in _by_type(resources, DATA_REPOSITORY):
        if file_system in association.property_dependencies.get("fileSystemId", ()):
            found.append(association)
            continue
        named, own = get(association.props, "fileSystemId"), get(file_system.props, "id")
        if not known(named, own):
            return None
        if named is not None and named == own:
            found.append(association)
    return found


def fsx_backups_or_export(args: StackValidationArgs, report: ReportViolation) -> None:
    """One protection, the one FSx allows (decisions/storage/lustre.py protection_problems): a file system linked to
    S3 asks for no backup, which FSx does not take of it; in prod, one linked exports what is written, one not linked
    is backed up."""
    for file_system in _by_type(args.resources, LUSTRE):
        associations = _associations(args.resources, file_system)
        environment = _environment(file_system)
        retention, skip_final = get(file_system.props, "automaticBackupRetentionDays"), get(
            file_system.props, "skipFinalBackup", default=True)     # the provider's default: skip it
        events = [get(a.props, "s3", "autoExportPolicy", "events") for a in associations or []]
        if associations is None or not known(environment, retention, skip_final, *events) or \
                not all(known(*items(e)) for e in events):
            continue        # the update judges it with every value known
        exported = {event for e in events for event in items(e)}
        for problem in protection_problems(
                linked=bool(associations), export_events=sorted(exported),
                backup_retention_days=int(number(retention) or 0), final_backup=not truthy(skip_final),
                prod=environment == "prod"):
            report(f"FSx for Lustre {file_system.name} {problem}", file_system.urn)


def hourly_cost_within_budget(args: StackValidationArgs, report: ReportViolation) -> None:
    """GPU pools at maxSize, priced as the plan prices them (decisions/cost/cost.py), against maxHourlyUsd."""
    budget = args.get_config().get("maxHourlyUsd")
    if budget is None:
        args.not_applicable("no maxHourlyUsd configured")
    providers = _by_type(args.resources, AWS_PROVIDER)
    region = get(providers[0].props, "region") if providers else None
    listed = catalog().instance_types
    group_pools = pools(args.resources)
    if not known(region, *(get(p.asg.props, key) for p in group_pools for key in ("maxSize", "desiredCapacity")),
                 *(t for p in group_pools for t in p.instance_types)):
        return      # the total needs every pool's size and types
    priced = []
    for pool in group_pools:
        types = [t for t in pool.instance_types if t in listed]
        maximum = int(number(get(pool.asg.props, "maxSize")) or 0)
        if not types:
            report(f"pool {pool.name}: {', '.join(pool.instance_types) or 'no type'} has no price in "
                   "decisions/catalog/catalog.yaml, so the budget cannot be checked", pool.asg.urn)
            continue
        # No commitment: none is a resource, and the budget is checked without one in the program too
        # (decisions/cost/cost.py budget_pool_costs).
        priced.append(SimpleNamespace(
            spec=SimpleNamespace(name=pool.name, capacity=pool.capacity, max_nodes=maximum,
                                 desired_nodes=int(number(get(pool.asg.props, "desiredCapacity")) or 0)),
            types=[listed[t] for t in types]))
    assumed = {name: AssumedPrice.model_validate(price)
               for name, price in (args.get_config().get("assumed") or {}).items()}
    rows = cost.budget_pool_costs(priced, catalog(), region, assumed=assumed)
    # A gap the budget cannot cover refuses the stack unless the stack acknowledged it by name
    # (gpu-cloud:budget.unpriced): the rule the config check applies (decisions/cost/cost.py unacknowledged). The pack
    # judges what it sees: the pools, and the file system, whose rate depends on its tier and region.
    acknowledged = args.get_config().get("unpriced") or []
    unpriced = [cost.Unpriced(r.pool, f"pool {r.pool}", r.gap) for r in rows if r.gap]
    urns = {p.name: p.asg.urn for p in group_pools}       # each violation on what it is about
    for file_system in _by_type(args.resources, LUSTRE):
        tier = get(file_system.props, "perUnitStorageThroughput")
        if known(tier) and number(tier) is not None and \
                cost.load_prices().region(region).lustre_persistent2_gb_month.get(int(number(tier))) is None:
            unpriced.append(cost.Unpriced(cost.LUSTRE, f"FSx for Lustre {file_system.name} ({int(number(tier))} "
                                                       "MB/s/TiB)", "no sourced rate in decisions/cost/prices.yaml"))
            urns[cost.LUSTRE] = file_system.urn
    for item in cost.unacknowledged(unpriced, acknowledged):
        report(f"{item.item}: {item.why}, so the budget cannot cover it: price it, or acknowledge it in "
               f"gpu-cloud:budget.unpriced ({item.name})", urns.get(item.name))
    total = cost.over_budget(rows, float(budget))     # the one rule: in whole cents, as the program checks it
    if total is not None:
        detail = ", ".join(f"{r.pool} ${r.hourly_at_max:,.2f}" for r in rows if not r.gap)
        gaps = [r.pool for r in rows if r.gap]
        unpriced = f"; not counted, having no price: {', '.join(gaps)}" if gaps else ""
        report(f"GPU pools at maxSize cost ${total:,.2f}/hour, over the budget of ${float(budget):,.2f}/hour "
               f"({detail}{unpriced}): lower maxNodes or raise gpu-cloud:budget.maxHourlyUsd")


# --- the pack's policies ---------------------------------------------------------------------------------------
def _schema(**properties: Dict[str, Any]) -> PolicyConfigSchema:
    return PolicyConfigSchema(properties=properties)


# What each policy does with values a preview cannot know yet (docs/policies.md shows it).
IN_PREVIEW: Dict[str, str] = {}


def _resource(name: str, description: str, validate: Callable, schema: Optional[PolicyConfigSchema] = None, *,
              in_preview: str):
    IN_PREVIEW[name] = in_preview
    return ResourceValidationPolicy(name=name, description=description, validate=validate, config_schema=schema)


def _stack(name: str, description: str, validate: Callable, schema: Optional[PolicyConfigSchema] = None, *,
           in_preview: str):
    IN_PREVIEW[name] = in_preview
    return StackValidationPolicy(name=name, description=description, validate=validate, config_schema=schema)


POLICIES = [
    _resource("launch-template-imdsv2", "GPU launch templates require IMDSv2 with a hop limit of at most 2.",
              launch_template_imdsv2,
              in_preview="an unknown httpTokens or hop limit is not judged; the update judges it"),
    _resource("launch-template-encrypted-volumes", "Every block device of a launch template is encrypted.",
              launch_template_encrypted_volumes,
              in_preview="a volume whose encrypted flag is unknown is not judged"),
    _resource("launch-template-no-public-ip", "Launch templates never give nodes a public IP.",
              launch_template_no_public_ip,
              in_preview="only an interface known to ask for a public IP is reported"),
    _resource("efa-interface-layout", "EFA launch templates have the instance type's catalog interface layout.",
              efa_interface_layout,
              in_preview="a template whose type or interface indexes are unknown is not judged"),
    _stack("efa-placement-and-zone",
           "EFA pools launch in one zone, in a cluster placement group unless reserved capacity places them.",
           efa_placement_and_zone,
           in_preview="an unknown group name, strategy or subnet list is not judged; one known to be wrong is "
                      "reported"),
    _stack("efa-security-group-self", "EFA pools have a security group allowing all traffic to and from itself.",
           efa_security_group_self,
           in_preview="the rules are found through their dependencies, so IDs unknown on a new group still count; a"
                      " pool whose rules' protocol is unknown is not judged"),
    _stack("gpu-pool-verification-hook", "GPU pools gate new nodes with a launch hook that defaults to ABANDON.",
           gpu_pool_verification_hook,
           in_preview="a group whose hooks are unknown is not judged"),
    _stack("gpu-pool-instance-types", "Pools launch only allowed instance types.", gpu_pool_instance_types,
           _schema(allowedInstanceTypes={"type": "array", "items": {"type": "string"},
                                         "default": allowed_instance_types_default(),
                                         "description": "instance types pools may launch (default: the catalog's)"}),
           in_preview="an unknown instance type is not judged; known ones are"),
    _stack("gpu-pool-one-shape", "Each pool has one GPU shape (model and count per node).", gpu_pool_one_shape,
           in_preview="only known instance types are compared"),
    _stack("spot-interruption-handling", "Spot pools exist only with the interruption queue and termination handler.",
           spot_interruption_handling,
           in_preview="while some Helm release is not visible (its provider is not configured yet), a missing "
                      "handler is not reported; a known untagged spot group is"),
    _resource("eks-endpoint-not-public", "The EKS API endpoint is not open wider than one organisation's egress (/8).", eks_endpoint_not_public,
              in_preview="unknown access settings or CIDRs are not judged"),
    _resource("eks-secrets-encrypted", "EKS secrets are envelope-encrypted with a KMS key.", eks_secrets_encrypted,
              in_preview="an unknown list of encrypted resources is not judged; an unknown key ARN counts as set"),
    _resource("eks-control-plane-logs", "Every EKS control-plane log type is on.", eks_control_plane_logs,
              in_preview="an unknown list of log types is not judged"),
    _resource("no-open-ingress", "No ingress from 0.0.0.0/0 or ::/0 except load balancer listener ports.",
              no_open_ingress,
              _schema(publicListenerPorts={"type": "array", "items": {"type": "integer"},
                                           "default": PUBLIC_LISTENER_PORTS,
                                           "description": "ports a load balancer listener may open to anywhere"}),
              in_preview="only a CIDR known to be open to anywhere is reported"),
    _stack("vpc-default-security-group-empty", "Each VPC's default security group is managed and has no rules.",
           vpc_default_security_group_empty,
           in_preview="adoption is found through dependencies; only rules known to exist are reported"),
    _stack("s3-public-access-blocked", "Buckets block all public access.", s3_public_access_blocked,
           in_preview="a bucket whose block flags are unknown is not judged; settings are found through their "
                      "property dependency on the bucket"),
    _stack("s3-sse-kms", "Buckets are encrypted with SSE-KMS; the stack's log bucket with SSE-S3, the only "
                         "encryption server access log delivery supports.", s3_sse_kms,
           in_preview="a bucket whose algorithm or name is unknown is not judged; an unknown key ID counts as set; "
                      "the log bucket is known by its name, which a preview shows, never by what a logging resource "
                      "targets"),
    _stack("s3-versioning", "Buckets are versioned.", s3_versioning,
           in_preview="a bucket whose versioning status is unknown is not judged"),
    _stack("s3-tls-only", "Bucket policies deny requests without TLS.", s3_tls_only,
           in_preview="a bucket policy that is unknown (it names a bucket the preview creates) is not judged; a "
                      "known one without the TLS statement is reported"),
    _stack("s3-access-logging", "Buckets log access to the log bucket.", s3_access_logging,
           in_preview="the log bucket is known by its name, which a preview shows; a bucket whose name is unknown "
                      "and that a logging resource may target is not judged; a bucket with no logging resource is "
                      "reported"),
    _stack("s3-replication", "A primary prod stack replicates its checkpoints and models buckets to the DR peer.",
           s3_replication,
           in_preview="a bucket whose name or replication rules are unknown is not judged"),
    _resource("kms-key-rotation", "KMS keys rotate yearly.", kms_rotation,
              in_preview="an unknown rotation flag is not judged"),
    _resource("fsx-customer-managed-key", "FSx for Lustre is encrypted with a customer-managed key.",
              fsx_customer_key,
              in_preview="an unknown key ID counts as set"),
    _stack("fsx-backups-or-export",
           "FSx for Lustre asks for no backups where it is linked to S3, which FSx does not back up; in prod it "
           "exports what jobs write to its linked bucket, or, not linked, is backed up.", fsx_backups_or_export,
           in_preview="associations are found through their property dependency on the file system; a file system "
                      "whose retention, final backup, environment or export events are unknown is not judged"),
    _resource("log-retention-in-prod", "CloudWatch log groups of prod stacks keep logs at least 365 days.",
              log_retention_in_prod,
              in_preview="an unknown retention is not judged; a group whose environment tag is unknown is not judged"),
    _resource("iam-no-wildcard-admin", "No IAM policy allows action * on resource *.", iam_no_wildcard_admin,
              in_preview="a policy document that is unknown is not judged"),
    _resource("iam-actions-name-resources", "IAM actions that take resource ARNs name their resources.",
              iam_actions_name_resources,
              in_preview="a policy document that is unknown is not judged"),
    _resource("iam-no-admin-policies", "No admin managed policy on node or add-on roles.", iam_no_admin_policies,
              in_preview="only a policy ARN known to be an admin one is reported"),
    _resource("k8s-no-privileged-containers", "Kubernetes workloads the program renders run no privileged container.",
              k8s_no_privileged,
              in_preview="resource policies see inputs, which a preview shows even before the cluster exists; only "
                         "a container known to be privileged is reported"),
    _resource("k8s-gpu-resource-limits", "Containers of GPU workloads set resource limits.", k8s_gpu_limits,
              in_preview="a container whose limits are unknown is not judged"),
    _resource("k8s-no-cluster-admin-default-sa", "cluster-admin is never bound to default service accounts.",
              k8s_no_cluster_admin_default_sa,
              in_preview="only a binding known to give cluster-admin to a default account is reported"),
    _stack("k8s-namespace-default-deny", "Every namespace the program creates has a default-deny NetworkPolicy.",
           k8s_namespace_default_deny,
           in_preview="while a namespace, workload, NetworkPolicy or Helm release is not visible (its provider is "
                      "not configured yet), namespaces are not judged"),
    _stack("required-tags", "Every taggable AWS resource carries the required tags.", required_tags,
           _schema(requiredTagKeys={"type": "array", "items": {"type": "string"}, "default": REQUIRED_TAG_KEYS,
                                    "description": "tag keys every taggable AWS resource must carry"}),
           in_preview="a resource whose tags or whose provider's default tags are unknown, or that is not visible "
                      "yet, is not judged"),
    _stack("stateful-resources-protected", "EKS clusters, FSx, buckets and KMS keys are protected.",
           stateful_resources_protected,
           in_preview="reads resource options, which are always known"),
    _stack("gpu-pool-observability", "GPU pools come with the DCGM exporter and GPU alert rules.",
           gpu_pool_observability,
           in_preview="while a Helm release or PrometheusRule is not visible, what it would show is not reported "
                      "missing"),
    _stack("hourly-cost-within-budget", "GPU pools at maxSize cost no more than the hourly budget.",
           hourly_cost_within_budget,
           _schema(maxHourlyUsd={"type": "number", "minimum": 0,
                                 "description": "USD per hour the GPU pools may cost at maxSize (the plan fills "
                                                "it from gpu-cloud:budget.maxHourlyUsd)"},
                   unpriced={"type": "array", "items": {"type": "string"},
                             "description": "unpriced items the stack acknowledges, by name (the plan fills it "
                                            "from gpu-cloud:budget.unpriced)"},
                   assumed={"type": "object",
                            "description": "pool -> {usdPerNodeHour, source}: the price the stack assumes where the "
                                           "catalog has none (the plan fills it from gpu-cloud:budget.assumed)"}),
           in_preview="with any pool's size or type, or the region, unknown the total is not judged"),
]


def initial_config(max_hourly_usd: Optional[float], unpriced: Sequence[str] = (),
                   assumed: Optional[Mapping[str, Any]] = None) -> Dict[str, Dict[str, Any]]:
    """The pack's initial config for a stack: its budget (gpu-cloud:budget.maxHourlyUsd) where it has one, with the
    unpriced items it acknowledges (gpu-cloud:budget.unpriced) and the prices it assumes (gpu-cloud:budget.assumed).
    The user's --policy-pack-config goes on top."""
    if max_hourly_usd is None:
        return {}
    return {"hourly-cost-within-budget": {"maxHourlyUsd": float(max_hourly_usd),
                                          **({"unpriced": list(unpriced)} if unpriced else {}),
                                          **({"assumed": dict(assumed)} if assumed else {})}}
