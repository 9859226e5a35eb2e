"""The EKS control plane and what every cluster needs before GPU pools join.

Contents: a customer-managed KMS key (secrets envelope encryption and the control-plane log group),
the cluster with a private endpoint (public only towards configured CIDRs), all five control-plane
log types, API-only authentication with one cluster-admin access entry per admin role, the pinned
managed add-ons (decisions/catalog/addons.yaml), a small on-demand system node group so GPU nodes run GPU work
only, and a Kubernetes provider that authenticates with `aws eks get-token`.

Decisions, with the reason each was taken:
- Service CIDR: left to EKS. This component does not know the VPC CIDR or what the VPC is peered
  with; EKS picks 10.100.0.0/16 or 172.20.0.0/16, whichever does not overlap the VPC, and the
  choice can never change afterwards (it forces a new cluster). The chosen block is read back from
  the cluster (`service_cidr`) for the node bootstrap, which needs it.
- `bootstrap_self_managed_addons=False`: every core add-on is an EKS managed add-on pinned here, so
  nothing is installed self-managed first and then taken over.
- Add-on conflicts: OVERWRITE on create and on update. The configuration in this file is the
  source of truth; a hand edit made with kubectl is reset at the next add-on update instead of
  silently surviving (PRESERVE) and making clusters drift apart.
- VPC CNI: prefix delegation stays off. GPU nodes run a handful of pods each, so /28 prefixes buy
  nothing there while they consume contiguous subnet blocks; on EFA layouts card 0 carries the
  primary ENA interface plus an efa-only one, so pod IPs come from the primary interface, which has
  room for far more pods than a GPU node runs. WARM_IP_TARGET/MINIMUM_IP_TARGET replace the default
  "one whole warm ENI" so each large GPU node does not hold ~50 idle subnet addresses. The
  EFA-relevant requirement is the version floor (>= 1.18.5, enforced by decisions/catalog/addons.py). The CNI
  gets its own Pod Identity role; the node role has no AmazonEKS_CNI_Policy.
- Log group encryption: the same KMS key. Its policy lets CloudWatch Logs use it only for this
  cluster's log group (encryption-context condition); the account root keeps full control so IAM
  policies (the cluster role's) can grant use and the key can never become unmanageable.
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from components.iam import log_group_key_policy, pod_identity_trust_policy, policy_document
from decisions.catalog.addons import addon_configuration, addon_versions
from decisions.catalog.catalog import load_catalog
from decisions.config.model import IAM_ROLE_ARN
from decisions.nodes.pods import NODEGROUP_TAINT_EFFECTS, SYSTEM_NODE_LABELS, SYSTEM_NODE_TAINT, \
    SYSTEM_NODE_TYPES, SYSTEM_NODES_MAX, VPC_CNI_ENV
from decisions.observability.logs import CLOUDWATCH_RETENTION_DAYS
from decisions.platform.tenancy import SYSTEM_NAMESPACE, access_entry_suffix

CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
KMS_DELETION_WINDOW_DAYS = 30           # the maximum: a scheduled deletion of the secrets key can be cancelled
# SYSTEM_NODE_ROLE_LABEL, SYSTEM_NODE_LABELS and SYSTEM_NODE_TAINT live in decisions/nodes/pods.py (imported above, and
# from here by the components that place pods on the system nodes).
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
DEPLOYER_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]{1,512}$")
# Instance families with GPUs or other accelerators (p*, g*, gr*, inf*, trn*, dl*).
_ACCELERATED_FAMILY = re.compile(r"^(p|g|gr|inf|trn|dl)\d")


ADDON_CONFLICT_RESOLUTION = "OVERWRITE"


@dataclass(frozen=True)
class ClusterArgs:
    name: str                                    # EKS cluster name (physical, fixed: e.g. "gpu-cloud-prod-us-east-1")
    kubernetes_version: str
    subnet_ids: Sequence[pulumi.Input[str]]      # private subnets (control-plane ENIs and system nodes)
    public_access_cidrs: Tuple[str, ...]         # empty -> private endpoint only
    admin_role_arns: Tuple[str, ...]
    log_retention_days: int
    # the IAM principal running Pulumi (decisions.config.deployer.deployer_principal)
    deployer_arn: str
    private_access_cidrs: Tuple[str, ...] = ()   # networks allowed to the private endpoint on 443
    private_access_security_group_ids: Tuple[str, ...] = ()
    token_args: Tuple[str, ...] = ()             # `aws eks get-token` arguments: the deployer's profile and role
    deployer_network: Sequence[pulumi.Resource] = ()   # what the deployer's path to the endpoint needs (routes)
    system_instance_types: Tuple[str, ...] = SYSTEM_NODE_TYPES
    system_min_nodes: int = 2
    system_desired_nodes: int = 2
    system_max_nodes: int = SYSTEM_NODES_MAX


def is_accelerated_instance_type(instance_type: str) -> bool:
    """True for GPU (or other accelerator) instance types: the catalog's, and any p/g/gr/inf/trn/dl family."""
    family = instance_type.split(".", 1)[0]
    return instance_type in load_catalog().instance_types or bool(_ACCELERATED_FAMILY.match(family))


def validate_cluster_args(args: ClusterArgs) -> None:
    """Raise ValueError naming every problem in `args` (before any resource is registered)."""
    problems: List[str] = []
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z_-]{0,99}", args.name):
        problems.append(f"name {args.name!r} is not a valid EKS cluster name")
    try:
        addon_versions(args.kubernetes_version)
    except ValueError as error:
        problems.append(str(error))
    if not args.subnet_ids:
        problems.append("subnet_ids is empty (EKS needs private subnets in at least two zones)")
    for cidr in args.public_access_cidrs:
        try:
            ipaddress.IPv4Network(cidr, strict=True)
        except ValueError:
            problems.append(f"public access CIDR {cidr!r} is not an IPv4 network")
    for arn in args.admin_role_arns:
        if not IAM_ROLE_ARN.match(arn):
            problems.append(f"admin role {arn!r} is not an IAM role ARN")
    if not DEPLOYER_ARN.match(args.deployer_arn):
        problems.append(f"deployer {args.deployer_arn!r} is not an IAM role or user ARN")
    if len(set(args.admin_role_arns)) != len(args.admin_role_arns):
        problems.append("admin_role_arns lists a role twice")
    if args.log_retention_days not in CLOUDWATCH_RETENTION_DAYS:
        problems.append(f"log retention {args.log_retention_days} days is not a CloudWatch Logs value "
                        "(decisions.observability.logs.cloudwatch_retention_days rounds up to one)")
    if not args.system_instance_types:
        problems.append("system_instance_types is empty")
    accelerated = [t for t in args.system_instance_types if is_accelerated_instance_type(t)]
    if accelerated:
        problems.append(f"system node group must not use accelerated instance types: {', '.join(accelerated)}")
    if not 1 <= args.system_min_nodes <= args.system_desired_nodes <= args.system_max_nodes:
        problems.append(f"system nodes need 1 <= min ({args.system_min_nodes}) <= desired "
                        f"({args.system_desired_nodes}) <= max ({args.system_max_nodes})")
    if problems:
        raise ValueError(f"invalid ClusterArgs for {args.name!r}: " + "; ".join(problems))


def render_kubeconfig(cluster_name: str, endpoint: str, certificate_authority: str, region: str,
                      token_args: Sequence[str] = ()) -> str:
    """A kubeconfig (JSON) that gets a short-lived token from `aws eks get-token`, as the identity the AWS
    provider uses (`token_args`: its profile and role): it holds no credential."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name,
                      "cluster": {"server": endpoint, "certificate-authority-data": certificate_authority}}],
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json",
                     *token_args],
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
    }, indent=2)


def compact_json(value) -> str:
    """JSON with sorted keys and no spaces: the same bytes every run, on every machine."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _source_suffix(source: str) -> str:
    """Resource-name suffix for a CIDR or security group: 10.0.0.0/22 -> 10-0-0-0-22."""
    return re.sub(r"[^\w-]", "-", source)


class EksCluster(pulumi.ComponentResource):
    """An EKS cluster ready for GPU node pools (see the module docstring)."""

    cluster: aws.eks.Cluster
    cluster_name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    certificate_authority: pulumi.Output[str]
    service_cidr: pulumi.Output[str]
    cluster_security_group_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    kube_provider: kubernetes.Provider
    addons: Dict[str, aws.eks.Addon]
    kms_key: aws.kms.Key
    system_node_group: aws.eks.NodeGroup

    def __init__(self, name: str, args: ClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        validate_cluster_args(args)          # before anything is registered
        super().__init__("gpu-cloud:cluster:EksCluster", name, None, opts)
        versions = addon_versions(args.kubernetes_version)
        retention = args.log_retention_days
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        identity = aws.get_caller_identity_output(opts=invoke)
        partition = aws.get_partition_output(opts=invoke)
        region = aws.get_region_output(opts=invoke)

        def aws_managed_policy(policy_name: str) -> pulumi.Output[str]:
            return pulumi.Output.concat("arn:", partition.partition, ":iam::aws:policy/", policy_name)

        log_group_name = f"/aws/eks/{args.name}/cluster"

        # --- KMS: secrets envelope encryption and the control-plane log group ----------------------
        # Losing this key makes every Kubernetes Secret in the cluster unreadable: protected, and a
        # deletion can only be scheduled with the longest window.
        self.kms_key = aws.kms.Key(
            f"{name}-kms",
            description=f"EKS {args.name}: Kubernetes secrets envelope encryption and control-plane logs",
            enable_key_rotation=True,
            deletion_window_in_days=KMS_DELETION_WINDOW_DAYS,
            policy=log_group_key_policy(partition.partition, partition.dns_suffix, region.region,
                                        identity.account_id, log_group_name),
            opts=pulumi.ResourceOptions(parent=self, protect=True))
        aws.kms.Alias(f"{name}-kms-alias", name=f"alias/eks/{args.name}", target_key_id=self.kms_key.key_id,
                      opts=child)

        # Created before the cluster so EKS does not create it first without retention or encryption.
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=log_group_name, retention_in_days=retention, kms_key_id=self.kms_key.arn,
            opts=child)

        # --- cluster IAM role --------------------------------------------------------------------
        cluster_role = aws.iam.Role(
            f"{name}-cluster-role",
            description=f"EKS control plane of {args.name}",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"]}]}),
            opts=child)
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy", role=cluster_role.name,
            policy_arn=aws_managed_policy("AmazonEKSClusterPolicy"), opts=child)
        cluster_kms = aws.iam.RolePolicy(
            f"{name}-cluster-kms", role=cluster_role.id,
            policy=policy_document({"Effect": "Allow",
                                    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                                    "Resource": self.kms_key.arn}),
            opts=child)

        # --- the cluster --------------------------------------------------------------------------
        public = bool(args.public_access_cidrs)
        # Replacing the cluster loses every workload, every Secret and every node's registration:
        # protected. Version upgrades are in-place updates.
        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.name,
            version=args.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(args.subnet_ids),
                endpoint_private_access=True,
                endpoint_public_access=public,
                public_access_cidrs=list(args.public_access_cidrs) if public else None),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=False),
            bootstrap_self_managed_addons=False,
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=self.kms_key.arn),
                resources=["secrets"]),
            # Service CIDR left to EKS on purpose (module docstring); only the family is pinned.
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(ip_family="ipv4"),
            opts=pulumi.ResourceOptions(parent=self, protect=True,
                                        depends_on=[log_group, cluster_policy, cluster_kms]))
        self.cluster_name = self.cluster.name
        self.endpoint = self.cluster.endpoint
        self.certificate_authority = self.cluster.certificate_authority.data
        self.service_cidr = self.cluster.kubernetes_network_config.service_ipv4_cidr
        self.cluster_security_group_id = self.cluster.vpc_config.cluster_security_group_id

        # --- admins and the deployer: access entries, cluster scope -------------------------------
        # The deployer (whoever runs Pulumi; the cluster creator gets nothing under API authentication) needs
        # admin to install the Helm releases: its own entry, unless it is one of the admin roles already.
        # Named as team roles' access entries are (the role's name and a short hash of its ARN): stable, readable.
        admins = {access_entry_suffix(arn): arn for arn in args.admin_role_arns}
        if args.deployer_arn not in args.admin_role_arns:
            admins["deployer"] = args.deployer_arn
        admin_grants: List[pulumi.Resource] = []
        for suffix, arn in admins.items():
            entry = aws.eks.AccessEntry(f"{name}-admin-{suffix}", cluster_name=self.cluster.name, principal_arn=arn,
                                        type="STANDARD", opts=child)
            admin_grants.append(aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{suffix}-policy", cluster_name=self.cluster.name, principal_arn=arn,
                policy_arn=pulumi.Output.concat("arn:", partition.partition,
                                                ":eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"),
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry])))

        # --- who else reaches the private endpoint: 443 on the cluster security group -------------
        endpoint_rules = [aws.vpc.SecurityGroupIngressRule(
            f"{name}-api-from-{_source_suffix(source)}", security_group_id=self.cluster_security_group_id,
            ip_protocol="tcp", from_port=443, to_port=443, description="Kubernetes API from the deployer's network",
            **({"referenced_security_group_id": source} if source.startswith("sg-") else {"cidr_ipv4": source}),
            opts=child) for source in (*args.private_access_cidrs, *args.private_access_security_group_ids)]

        # --- Pod Identity roles for the add-ons that call AWS (managed policies, kept current by AWS) --
        def addon_role(short: str, service_account: str, policy: str) -> Tuple[aws.iam.Role, pulumi.Resource]:
            role = aws.iam.Role(f"{name}-{short}-role", assume_role_policy=pod_identity_trust_policy(
                                    partition.partition, region.region, identity.account_id, args.name,
                                    SYSTEM_NAMESPACE, service_account),
                                description=f"Pod Identity role for {SYSTEM_NAMESPACE}/{service_account} on "
                                            f"{args.name}",
                                opts=child)
            attachment = aws.iam.RolePolicyAttachment(f"{name}-{short}-policy", role=role.name,
                                                      policy_arn=aws_managed_policy(policy), opts=child)
            return role, attachment

        cni_role, cni_policy = addon_role("vpc-cni", "aws-node", "AmazonEKS_CNI_Policy")
        ebs_role, ebs_policy = addon_role("ebs-csi", "ebs-csi-controller-sa", "service-role/AmazonEBSCSIDriverPolicy")

        def addon(addon_name: str, *, config: Optional[dict] = None,
                  identity_for: Optional[Tuple[str, aws.iam.Role]] = None, preserve: bool = False,
                  depends_on: Sequence[pulumi.Resource] = ()) -> aws.eks.Addon:
            return aws.eks.Addon(
                f"{name}-{addon_name}",
                cluster_name=self.cluster.name,
                addon_name=addon_name,
                addon_version=versions[addon_name],
                configuration_values=compact_json(config) if config else None,
                pod_identity_associations=[aws.eks.AddonPodIdentityAssociationArgs(
                    service_account=identity_for[0], role_arn=identity_for[1].arn)] if identity_for else None,
                resolve_conflicts_on_create=ADDON_CONFLICT_RESOLUTION,
                resolve_conflicts_on_update=ADDON_CONFLICT_RESOLUTION,
                preserve=preserve,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))

        # DaemonSets that must be in place before any node joins (they need no running node to install).
        # preserve: deleting the add-on object by mistake must not tear networking out of live nodes.
        pod_identity_agent = addon("eks-pod-identity-agent", preserve=True)
        # enableNetworkPolicy: the CNI's network policy agent enforces NetworkPolicies (tenancy relies on them);
        # without it the API accepts them and nothing enforces them.
        vpc_cni = addon("vpc-cni", config={"env": VPC_CNI_ENV, "enableNetworkPolicy": "true"},
                        identity_for=("aws-node", cni_role), preserve=True,
                        depends_on=[cni_policy, pod_identity_agent])
        kube_proxy = addon("kube-proxy", preserve=True)

        # --- the system node group: on-demand, general purpose, no GPUs ---------------------------
        node_role = aws.iam.Role(
            f"{name}-system-node-role",
            description=f"System nodes of {args.name}",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            opts=child)
        # No AmazonEKS_CNI_Policy: the VPC CNI has its own Pod Identity role. PullOnly is the
        # least-privilege ECR policy for nodes (the node pools use it too).
        node_policies = [aws.iam.RolePolicyAttachment(
            f"{name}-system-node-{short}", role=node_role.name, policy_arn=aws_managed_policy(policy), opts=child)
            for short, policy in (("worker", "AmazonEKSWorkerNodePolicy"),
                                  ("ecr", "AmazonEC2ContainerRegistryPullOnly"))]
        # Managed node groups get their EC2_LINUX access entry from EKS itself.
        self.system_node_group = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            version=args.kubernetes_version,
            node_role_arn=node_role.arn,
            subnet_ids=list(args.subnet_ids),
            ami_type=SYSTEM_AMI_TYPE,
            capacity_type="ON_DEMAND",
            instance_types=list(args.system_instance_types),
            labels=dict(SYSTEM_NODE_LABELS),
            # From creation: no team pod ever lands here. Every add-on that runs here tolerates it before it is
            # installed (CoreDNS and the EBS CSI controller by their configuration below; the DaemonSets installed
            # above tolerate every taint).
            taints=[aws.eks.NodeGroupTaintArgs(key=SYSTEM_NODE_TAINT.key, value=SYSTEM_NODE_TAINT.value,
                                               effect=NODEGROUP_TAINT_EFFECTS[SYSTEM_NODE_TAINT.effect])],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.system_min_nodes, desired_size=args.system_desired_nodes,
                max_size=args.system_max_nodes),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            # Sized here, not by the cluster autoscaler: EKS tags the group with the usual discovery pair, but
            # the autoscaler discovers and may scale only the GPU pools, by their own tag (decisions/nodes/
            # autoscaling.py discovery_tag). The desired size is left to whoever changed it since (an operator
            # making room), min and max stay owned here.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*node_policies, vpc_cni, kube_proxy,
                                                                 pod_identity_agent],
                                        ignore_changes=["scalingConfig.desiredSize"]))

        # Deployments: they become ACTIVE only once nodes run them, so they wait for the node group,
        # and they stay on the system nodes, tolerating its taint (decisions/catalog/addons.py addon_configuration).
        coredns = addon("coredns", config=addon_configuration("coredns"), preserve=True,
                        depends_on=[self.system_node_group])
        ebs_csi = addon("aws-ebs-csi-driver", config=addon_configuration("aws-ebs-csi-driver"),
                        identity_for=("ebs-csi-controller-sa", ebs_role),
                        depends_on=[ebs_policy, self.system_node_group])
        self.addons = {"vpc-cni": vpc_cni, "coredns": coredns, "kube-proxy": kube_proxy,
                       "eks-pod-identity-agent": pod_identity_agent, "aws-ebs-csi-driver": ebs_csi}

        # --- Kubernetes provider ------------------------------------------------------------------
        # The kubeconfig holds no credential (exec auth), but kubeconfigs usually do: kept secret.
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.endpoint, self.certificate_authority, region.region,
        ).apply(lambda values: render_kubeconfig(*values, token_args=args.token_args)))
        # Anything deployed through this provider waits for the deployer's admin access and its path to the
        # endpoint, pod networking and DNS. The fixed identifier keeps a kubeconfig change (a new profile, a
        # rotated CA) from replacing every release the provider manages.
        self.kube_provider = kubernetes.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig, cluster_identifier=args.name,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*admin_grants, *endpoint_rules,
                                                                 *args.deployer_network, vpc_cni, coredns]))

        self.register_outputs({
            "clusterName": self.cluster_name,
            "endpoint": self.endpoint,
            "certificateAuthority": self.certificate_authority,
            "serviceCidr": self.service_cidr,
            "clusterSecurityGroupId": self.cluster_security_group_id,
            "kmsKeyArn": self.kms_key.arn,
            "addonVersions": dict(versions),
        })
