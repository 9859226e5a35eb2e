"""Team tenancy: the training and inference namespaces, their GPU quotas, each team's Role, the one
cluster-wide grant (reading nodes), default-deny network policies with what workloads need, and the EKS
access entries that put a team's IAM roles into its Kubernetes group.

Every decision (quota sizes, rules, policies) comes from decisions/platform/tenancy.py; this file only turns them into
resources. Kubernetes objects go through the provider the caller passes in `opts.providers["kubernetes"]`;
access entries through its AWS provider.

Access entries are STANDARD with `kubernetes_groups` and no access policy association: what a team may do is
decided here, by RBAC on the group, not by an EKS access policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from decisions.platform import tenancy

RBAC_API_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class TenancyArgs:
    cluster_name: pulumi.Input[str]       # the cluster's output, so access entries wait for the cluster
    vpc_cidr: str                         # where the inference load balancer reaches Triton from
    # namespace -> ResourceQuota hard (decisions.platform.tenancy.gpu_quotas)
    gpu_quotas: Mapping[str, Mapping[str, str]]
    # namespace -> ResourceQuota hard (decisions.platform.tenancy.cpu_memory_quotas)
    cpu_memory_quotas: Mapping[str, Mapping[str, str]]
    # namespace -> LimitRange Container item, None for none (decisions.platform.tenancy.team_container_defaults)
    container_defaults: Mapping[str, Optional[Mapping[str, Mapping[str, str]]]]
    team_role_arns: Mapping[str, Sequence[str]] = field(default_factory=dict)   # namespace -> IAM role ARNs
    # Principals that already have an access entry on this cluster (admins, the deployer): EKS allows one each.
    admin_principal_arns: Tuple[str, ...] = ()
    # The controllers whose finalizers teams' objects carry (Kueue on Workloads, the load balancer controller on
    # LoadBalancer Services and TargetGroupBindings), and what holds a finalizer until those objects are gone (Kueue's
    # ClusterQueue): the namespaces depend on them, so a destroy deletes the namespaces, and what teams left in them,
    # while those controllers still run to clear their finalizers, and before what waits for them to go.
    controllers: Tuple[pulumi.Resource, ...] = ()


def _in_namespace(object_name: str, namespace: kubernetes.core.v1.Namespace) -> kubernetes.meta.v1.ObjectMetaArgs:
    # The namespace's output, not the constant: the object waits for its namespace.
    return kubernetes.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace.metadata.name)


def _policy_rule(rule: tenancy.RbacRule) -> kubernetes.rbac.v1.PolicyRuleArgs:
    return kubernetes.rbac.v1.PolicyRuleArgs(api_groups=list(rule.api_groups), resources=list(rule.resources),
                                             verbs=list(rule.verbs))


def _group(name: str) -> kubernetes.rbac.v1.SubjectArgs:
    return kubernetes.rbac.v1.SubjectArgs(kind="Group", name=name, api_group=RBAC_API_GROUP)


def _peer(peer: tenancy.Peer) -> kubernetes.networking.v1.NetworkPolicyPeerArgs:
    if isinstance(peer, tenancy.Cidr):
        return kubernetes.networking.v1.NetworkPolicyPeerArgs(
            ip_block=kubernetes.networking.v1.IPBlockArgs(cidr=peer.cidr))
    pods = kubernetes.meta.v1.LabelSelectorArgs(match_labels=dict(peer.labels) or None)
    if peer.namespace is None:
        return kubernetes.networking.v1.NetworkPolicyPeerArgs(pod_selector=pods)
    return kubernetes.networking.v1.NetworkPolicyPeerArgs(
        namespace_selector=kubernetes.meta.v1.LabelSelectorArgs(
            match_labels={tenancy.NAMESPACE_NAME_LABEL: peer.namespace}),
        pod_selector=pods if peer.labels else None)


def _ports(rule: tenancy.TrafficRule) -> List[kubernetes.networking.v1.NetworkPolicyPortArgs]:
    return [kubernetes.networking.v1.NetworkPolicyPortArgs(protocol=port.protocol, port=port.port)
            for port in rule.ports]


def _policy_spec(policy: tenancy.NetworkPolicyRules) -> kubernetes.networking.v1.NetworkPolicySpecArgs:
    return kubernetes.networking.v1.NetworkPolicySpecArgs(
        pod_selector=kubernetes.meta.v1.LabelSelectorArgs(),          # every pod of the namespace
        policy_types=list(policy.policy_types),
        ingress=[kubernetes.networking.v1.NetworkPolicyIngressRuleArgs(
            from_=[_peer(p) for p in rule.peers], ports=_ports(rule)) for rule in policy.ingress] or None,
        egress=[kubernetes.networking.v1.NetworkPolicyEgressRuleArgs(
            to=[_peer(p) for p in rule.peers], ports=_ports(rule)) for rule in policy.egress] or None)


class Tenancy(pulumi.ComponentResource):
    """Namespaces, quotas, RBAC, network policies and access entries for the gpu-cloud teams."""

    namespaces: Dict[str, kubernetes.core.v1.Namespace]
    quotas: Dict[str, kubernetes.core.v1.ResourceQuota]
    cpu_memory_quotas: Dict[str, kubernetes.core.v1.ResourceQuota]
    limit_ranges: Dict[str, kubernetes.core.v1.LimitRange]
    roles: Dict[str, kubernetes.rbac.v1.Role]
    network_policies: Dict[str, List[kubernetes.networking.v1.NetworkPolicy]]
    node_reader: kubernetes.rbac.v1.ClusterRole
    access_entries: Dict[str, aws.eks.AccessEntry]

    def __init__(self, name: str, args: TenancyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        for field_name in ("gpu_quotas", "cpu_memory_quotas", "container_defaults"):
            if set(getattr(args, field_name)) != set(tenancy.TEAM_NAMESPACES):
                raise ValueError(f"{field_name} must have exactly the team namespaces {tenancy.TEAM_NAMESPACES}, "
                                 f"got {tuple(getattr(args, field_name))}")
        policies = {ns: tenancy.network_policies(ns, args.vpc_cidr) for ns in tenancy.TEAM_NAMESPACES}
        access = tenancy.team_access(args.team_role_arns, args.admin_principal_arns)

        super().__init__("gpu-cloud:tenancy:Tenancy", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.namespaces, self.quotas, self.roles, self.network_policies = {}, {}, {}, {}
        self.cpu_memory_quotas, self.limit_ranges = {}, {}
        for ns in tenancy.TEAM_NAMESPACES:
            # Deleting a namespace deletes every Job, pod and ConfigMap in it, running training included: protected.
            # Its delete waits for the pods' grace (decisions/platform/tenancy.py NAMESPACE_DELETE_TIMEOUT_S).
            namespace = kubernetes.core.v1.Namespace(
                f"{name}-{ns}",
                metadata=kubernetes.meta.v1.ObjectMetaArgs(name=ns, labels=tenancy.namespace_labels(ns)),
                opts=pulumi.ResourceOptions(parent=self, protect=True, depends_on=list(args.controllers),
                                            custom_timeouts=pulumi.CustomTimeouts(
                                                delete=f"{tenancy.NAMESPACE_DELETE_TIMEOUT_S}s")))
            self.namespaces[ns] = namespace

            self.quotas[ns] = kubernetes.core.v1.ResourceQuota(
                f"{name}-{ns}-gpu-quota", metadata=_in_namespace("gpu", namespace),
                spec=kubernetes.core.v1.ResourceQuotaSpecArgs(hard=dict(args.gpu_quotas[ns])), opts=child)
            # CPU and memory, sized from the namespace's pools; the LimitRange gives a container that states no
            # requests one GPU's share of its smallest node, which the quota then counts
            # (decisions/platform/tenancy.py).
            self.cpu_memory_quotas[ns] = kubernetes.core.v1.ResourceQuota(
                f"{name}-{ns}-cpu-memory-quota", metadata=_in_namespace("cpu-memory", namespace),
                spec=kubernetes.core.v1.ResourceQuotaSpecArgs(hard=dict(args.cpu_memory_quotas[ns])), opts=child)
            defaults = args.container_defaults[ns]
            if defaults is not None:
                self.limit_ranges[ns] = kubernetes.core.v1.LimitRange(
                    f"{name}-{ns}-container-defaults", metadata=_in_namespace("container-defaults", namespace),
                    spec=kubernetes.core.v1.LimitRangeSpecArgs(limits=[kubernetes.core.v1.LimitRangeItemArgs(
                        type="Container", default_request=dict(defaults["defaultRequest"]),
                        default=dict(defaults["default"]))]), opts=child)
            self.roles[ns] = kubernetes.rbac.v1.Role(
                f"{name}-{ns}-team", metadata=_in_namespace("team", namespace),
                rules=[_policy_rule(rule) for rule in tenancy.TEAM_RULES], opts=child)
            kubernetes.rbac.v1.RoleBinding(
                f"{name}-{ns}-team", metadata=_in_namespace("team", namespace),
                role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group=RBAC_API_GROUP, kind="Role",
                                                        name=self.roles[ns].metadata.name),
                subjects=[_group(tenancy.team_group(ns))], opts=child)
            self.network_policies[ns] = [kubernetes.networking.v1.NetworkPolicy(
                f"{name}-{ns}-{policy.name}", metadata=_in_namespace(policy.name, namespace), spec=_policy_spec(policy), opts=child)
                for policy in policies[ns]]

        # Team pods stay off their nodes' host (decisions/platform/tenancy.py: host network, PID and IPC, privileged,
        # hostPath, hostPort, capabilities) and off the system nodes (their taint's toleration; spec.nodeName on
        # create), and keep the rest of Pod Security baseline, checked by the API server itself on every create and
        # update (pods/binding, the scheduler's, is not matched).
        _tenant_admission_policy(f"{name}-host-isolation", tenancy.HOST_ISOLATION_POLICY,
                                 ["pods", "pods/ephemeralcontainers"], tenancy.host_isolation_validations(), child)
        # Team Services carry no externalIPs (decisions/platform/tenancy.py: CVE-2020-8554), in the same namespaces.
        _tenant_admission_policy(f"{name}-no-external-ips", tenancy.SERVICE_EXTERNAL_IPS_POLICY, ["services"],
                                 tenancy.service_validations(), child)

        self.node_reader = kubernetes.rbac.v1.ClusterRole(
            f"{name}-node-reader", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=tenancy.NODE_READER_NAME),
            rules=[_policy_rule(rule) for rule in tenancy.NODE_READER_RULES], opts=child)
        kubernetes.rbac.v1.ClusterRoleBinding(
            f"{name}-node-reader", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=tenancy.NODE_READER_NAME),
            role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group=RBAC_API_GROUP, kind="ClusterRole",
                                                    name=self.node_reader.metadata.name),
            subjects=[_group(tenancy.team_group(ns)) for ns in tenancy.TEAM_NAMESPACES], opts=child)

        self.access_entries = {
            arn: aws.eks.AccessEntry(
                f"{name}-access-{tenancy.access_entry_suffix(arn)}", cluster_name=args.cluster_name,
                principal_arn=arn, type="STANDARD", kubernetes_groups=list(groups), opts=child)
            for arn, groups in sorted(access.items())}

        self.register_outputs({
            "namespaces": {ns: namespace.metadata.name for ns, namespace in self.namespaces.items()},
            "gpuQuotas": {ns: dict(hard) for ns, hard in args.gpu_quotas.items()},
            "cpuMemoryQuotas": {ns: dict(hard) for ns, hard in args.cpu_memory_quotas.items()},
            "teamGroups": {ns: tenancy.team_group(ns) for ns in tenancy.TEAM_NAMESPACES},
            "accessEntryArns": {arn: entry.access_entry_arn for arn, entry in self.access_entries.items()},
        })


def _tenant_admission_policy(resource_name: str, policy_name: str, resources: List[str], validations,
                             opts: pulumi.ResourceOptions) -> None:
    """A ValidatingAdmissionPolicy over core `resources` in every team namespace, and its Deny binding: the API
    server itself refuses what breaks `validations` ((CEL expression, message) pairs) on every create and update."""
    admission = kubernetes.admissionregistration.v1
    policy = admission.ValidatingAdmissionPolicy(
        resource_name, metadata=kubernetes.meta.v1.ObjectMetaArgs(name=policy_name),
        spec=admission.ValidatingAdmissionPolicySpecArgs(
            failure_policy="Fail",
            match_constraints=admission.MatchResourcesArgs(
                namespace_selector=kubernetes.meta.v1.LabelSelectorArgs(match_expressions=[
                    kubernetes.meta.v1.LabelSelectorRequirementArgs(key=tenancy.TENANT_LABEL, operator="Exists")]),
                resource_rules=[admission.NamedRuleWithOperationsArgs(
                    api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=resources)]),
            validations=[admission.ValidationArgs(expression=expression, message=message)
                         for expression, message in validations]),
        opts=opts)
    admission.ValidatingAdmissionPolicyBinding(
        resource_name, metadata=kubernetes.meta.v1.ObjectMetaArgs(name=policy_name),
        spec=admission.ValidatingAdmissionPolicyBindingSpecArgs(
            policy_name=policy.metadata.name, validation_actions=["Deny"]), opts=opts)
