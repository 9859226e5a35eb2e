"""Team tenancy as plain values: the team namespaces, their GPU quotas sized from the pools, what each team
may do through the Kubernetes API, which EKS access entries put a team's IAM roles into its group, and the
network policies of each namespace. components/platform/tenancy.py turns these into resources.

Pure: no Pulumi. Rules and network policies are frozen dataclasses rather than dicts: a misspelt key in a
dict peer would silently widen a rule (a peer without its namespaceSelector matches pods of its own
namespace instead), a dataclass with a misspelt field cannot be constructed.

Quotas
------
A namespace's `requests.<resource>` quota is what its pools can offer at maxNodes: pools of its workload,
plus `general` pools, which count for both namespaces. A general pool is, by its label, capacity for
either team (dev's only pool is one); leaving it out would give every namespace of such a stack a quota of
0 GPUs. So the two quotas may add up to more than the cluster has: they cap each team, they do not divide
the general pools between teams (that is Kueue's job, which comes next).

Per node, a pool offers:
- no sharing: `nvidia.com/gpu` = GPUs;
- time-slicing or MPS: `nvidia.com/gpu` = GPUs x replicas (the device plugin advertises each GPU `replicas`
  times, under its own name);
- MIG: the GPU operator's `mixed` strategy advertises each instance as `nvidia.com/mig-<profile>` and no
  `nvidia.com/gpu` at all; a pool's GPUs are all cut into its layout (one profile as many as fit, or its
  migProfiles), so it offers, per profile, GPUs x instances of it per GPU (decisions.nodes.pools.offered_gpu_resources,
  which cluster-autoscaler's node templates and Kueue's flavors use too).
Every GPU resource any pool of the cluster offers, and `nvidia.com/gpu` always, is quota'd in every team
namespace, at 0 where the namespace's pools offer none: extended resources that have no quota item are
unlimited, so a team could otherwise take another's MIG slices through a resource its quota forgot.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from decisions.catalog.catalog import load_catalog
from decisions.config.model import IAM_ROLE_ARN
from decisions.nodes.drain import WORKLOAD_MAX_GRACE_S
from decisions.nodes.pods import SYSTEM_NODE_TAINT
from decisions.nodes.pools import GPU_RESOURCE, offered_gpu_resources

TRAINING_NAMESPACE = "training"
INFERENCE_NAMESPACE = "inference"
TEAM_NAMESPACES = (TRAINING_NAMESPACE, INFERENCE_NAMESPACE)
# A team namespace's deletion waits for its pods to stop, a checkpointing job up to the workload contract's grace
# (decisions/nodes/drain.py WORKLOAD_MAX_GRACE_S, 780 s), then for the controllers to clear their finalizers (the load
# balancer controller deletes its NLB): the provider's own 10 minutes (pulumi-kubernetes provider/pkg/await/await.go,
# a delete's default) on top of that grace, not instead of it.
NAMESPACE_DELETE_TIMEOUT_S = WORKLOAD_MAX_GRACE_S + 600
# Where the monitoring stack (a later issue) runs Prometheus; its scrapes are the only ingress from there.
MONITORING_NAMESPACE = "monitoring"

# On each team namespace, value = the namespace: one key selects every team namespace (Exists), or one of them.
TENANT_LABEL = "gpu-cloud.io/tenant"
# The AWS Load Balancer Controller adds a readiness gate to pods behind an IP-target load balancer in namespaces with
# this label (aws-load-balancer-controller v3.5.0 docs/deploy/pod_readiness_gate.md): a rolling update of Triton then
# waits until each new pod is a healthy target, instead of dropping requests while the NLB registers it.
READINESS_GATE_LABEL = ("elbv2.k8s.aws/pod-readiness-gate-inject", "enabled")


# Pod Security Admission's baseline profile (built into the API server; no version label, so the server's own
# version's rules). Only inference carries the label: the training namespace cannot take it (MPI workers add IPC_LOCK:
# EFA registers pinned memory). The admission policy below holds both team namespaces to every baseline rule but that
# one (capabilities: baseline's list plus IPC_LOCK), and to two rules of its own (system nodes' toleration, nodeName).
POD_SECURITY_BASELINE = ("pod-security.kubernetes.io/enforce", "baseline")


def namespace_labels(namespace: str) -> Dict[str, str]:
    labels = {TENANT_LABEL: namespace}
    if namespace == INFERENCE_NAMESPACE:
        labels[READINESS_GATE_LABEL[0]] = READINESS_GATE_LABEL[1]
        labels[POD_SECURITY_BASELINE[0]] = POD_SECURITY_BASELINE[1]
    return labels


# A team's pod must not reach its node: a pod on the host network bypasses the NetworkPolicies (the VPC CNI's
# agent enforces them on the pod's own interface) and the IMDS hop limit, and a privileged one or a hostPath owns
# the node and the other tenants' pods on it. A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in
# Kubernetes 1.30) refuses such pods in every namespace with TENANT_LABEL.
HOST_ISOLATION_POLICY = "gpu-cloud-tenant-host-isolation"
# Capabilities a team's container may add: Pod Security baseline's list, plus IPC_LOCK for EFA.
ALLOWED_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "IPC_LOCK")
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# The same policy keeps team pods off the system nodes (decisions/nodes/pods.py SYSTEM_NODE_TAINT): their taint alone
# would not, as a pod may write the toleration itself. A toleration with the taint's key is refused whatever its
# operator, value or effect, and so is one with an empty key and operator Exists, which tolerates every taint (the
# scheduler's rule, decisions/nodes/pods.tolerates; the API server refuses an empty key with any other operator).
# Refusing them whatever their effect keeps the rule true if the taint's effect ever changes. Nothing the program puts
# in a team namespace tolerates either: the across-node NCCL starter runs on the pool it tests
# (decisions/platform/acceptance.py).
SYSTEM_TOLERATION_MESSAGE = (f"spec.tolerations may not tolerate the system nodes' taint {SYSTEM_NODE_TAINT.key} "
                             "(by its key, or by an empty key with operator Exists) in team namespaces: the system "
                             "nodes run the cluster's add-ons")
# A pod created with spec.nodeName is bound to that node without the scheduler ("the scheduler ignores the Pod and the
# kubelet on the named node tries to place the Pod on that node": Kubernetes docs, Assigning Pods to Nodes, "nodeName"),
# and a NoSchedule taint is the scheduler's alone: it lets "all pods submitted to Kubelet without going through the
# scheduler" start (k8s.io/api core/v1 types.go, TaintEffectNoSchedule), and the kubelet's own admission checks only
# NoExecute taints (kubernetes/kubernetes pkg/kubelet/lifecycle/predicate.go: "Kubelet is only interested in the
# NoExecute taint"). So a team, which can list node names (NODE_READER_RULES), could otherwise put a pod on the system
# nodes without any toleration. Refused on CREATE only: the scheduler binds through the pods/binding subresource, which
# the policy does not match (and TEAM_RULES do not grant), and every later UPDATE of a scheduled pod (the Job
# controller removing its finalizer, an ephemeral container) carries the nodeName it was bound to. `request` is one of
# the variables ValidatingAdmissionPolicy's CEL is given (Kubernetes docs, Validating Admission Policy, "Validation
# expression": object, oldObject, request, params, namespaceObject, authorizer); request.operation is the admission
# request's (CREATE, UPDATE, ...). The API server keeps spec.nodeName immutable on update anyway.
NODE_NAME_MESSAGE = ("spec.nodeName may not be set when a pod is created in team namespaces: it binds the pod to a "
                     "node past the scheduler, which alone enforces the system nodes' taint")

# The rest of Pod Security's baseline (Kubernetes docs, Pod Security Standards, "Baseline"; the checks are
# kubernetes/kubernetes staging/src/k8s.io/pod-security-admission/policy/check_*.go), for training, which has no
# Pod Security label, and restated for inference. Each allowed set is baseline's at Kubernetes 1.35:
# - Seccomp (check_seccompProfile_baseline.go): securityContext.seccompProfile.type undefined, RuntimeDefault or
#   Localhost, pod and every container (Unconfined turns the syscall filter off);
# - AppArmor (check_appArmorProfile.go; the appArmorProfile field is GA in 1.30): appArmorProfile.type undefined,
#   RuntimeDefault or Localhost, pod and every container, and the older per-container annotations
#   container.apparmor.security.beta.kubernetes.io/<name> empty, runtime/default or localhost/<profile>;
# - SELinux (check_seLinuxOptions.go): seLinuxOptions.type undefined or one of SELINUX_TYPES (container_engine_t since
#   1.31), user and role unset, pod and every container;
# - /proc mount type (check_procMount_baseline.go): procMount undefined or Default. Baseline 1.35 also admits any
#   procMount in a pod with hostUsers: false (a user namespace); this policy does not: stricter, and no team pod needs
#   an unmasked /proc;
# - Sysctls (check_sysctls.go): spec.securityContext.sysctls only SAFE_SYSCTLS (the kubelet's safe set: namespaced,
#   isolated from other pods; the list as of 1.32);
# - HostProcess (check_windowsHostProcess.go): windowsOptions.hostProcess not true, pod and every container;
# - Host probes and lifecycle hooks (check_hostProbesAndhostLifecycle.go, baseline since 1.34): no httpGet or tcpSocket
#   host in a probe or lifecycle handler: the kubelet connects from the node, so a host there reaches any address
#   the node can, past the pod's NetworkPolicies.
# None of gpu-cloud's own team pods sets any of these but the RuntimeDefault seccomp profile
# (decisions/platform/pod_security.py).
SECCOMP_PROFILE_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_PROFILE_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SELINUX_TYPES = ("container_t", "container_init_t", "container_kvm_t", "container_engine_t")
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HOOKS = ("postStart", "preStop")


def _cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def _unset_or(base: str, path: str, test: str) -> str:
    """CEL true when a field on `path` (dotted, below `base`) is unset, or `test` holds of it (`test` names the field
    `{0}`, or `{}`)."""
    fields = path.split(".")
    unset = [f"!has({base}.{'.'.join(fields[:i + 1])})" for i in range(len(fields))]
    return "(" + " || ".join(unset + [test.format(f"{base}.{path}")]) + ")"


def _security_context_rules(base: str) -> List[Tuple[str, str]]:
    """(CEL, what it refuses) of the baseline rules a pod's and a container's securityContext share."""
    selinux = ("((!has({0}.type) || {0}.type == '' || {0}.type in " + _cel_list(SELINUX_TYPES) + ") && "
               "(!has({0}.user) || {0}.user == '') && (!has({0}.role) || {0}.role == ''))")
    return [
        (_unset_or(base, "securityContext.seccompProfile.type", "{} in " + _cel_list(SECCOMP_PROFILE_TYPES)),
         f"securityContext.seccompProfile.type other than {' or '.join(SECCOMP_PROFILE_TYPES)}"),
        (_unset_or(base, "securityContext.appArmorProfile.type", "{} in " + _cel_list(APPARMOR_PROFILE_TYPES)),
         f"securityContext.appArmorProfile.type other than {' or '.join(APPARMOR_PROFILE_TYPES)}"),
        (_unset_or(base, "securityContext.seLinuxOptions", selinux),
         f"securityContext.seLinuxOptions with a user, a role or a type other than {', '.join(SELINUX_TYPES)}"),
        (_unset_or(base, "securityContext.windowsOptions.hostProcess", "!{}"),
         "securityContext.windowsOptions.hostProcess"),
    ]


def host_isolation_validations() -> List[Tuple[str, str]]:
    """(CEL expression true for an acceptable Pod, message) pairs of the host isolation policy."""
    rules = [(f"!has(object.spec.{field}) || !object.spec.{field}", f"spec.{field} is not allowed in team namespaces")
             for field in ("hostNetwork", "hostPID", "hostIPC")]
    rules.append(("!has(object.spec.tolerations) || object.spec.tolerations.all(t, "
                  f"(!has(t.key) || t.key != '{SYSTEM_NODE_TAINT.key}') && "
                  "((has(t.key) && t.key != '') || !has(t.operator) || t.operator != 'Exists'))",
                  SYSTEM_TOLERATION_MESSAGE))
    rules.append(("request.operation != 'CREATE' || !has(object.spec.nodeName) || object.spec.nodeName == ''",
                  NODE_NAME_MESSAGE))
    rules.append(("!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))",
                  "hostPath volumes are not allowed in team namespaces"))
    # The rest of Pod Security baseline (see above), pod level first, then each container list.
    rules += [(expression, f"spec.{what} is not allowed in team namespaces (Pod Security baseline)")
              for expression, what in _security_context_rules("object.spec")]
    rules.append((_unset_or("object.spec", "securityContext.sysctls", "{}.all(s, s.name in "
                            + _cel_list(SAFE_SYSCTLS) + ")"),
                  "spec.securityContext.sysctls may set only these in team namespaces (Pod Security baseline): "
                  + ", ".join(SAFE_SYSCTLS)))
    annotation = "object.metadata.annotations[k]"
    rules.append(("!has(object.metadata.annotations) || object.metadata.annotations.all(k, "
                  f"!k.startsWith('{APPARMOR_ANNOTATION_PREFIX}') || {annotation} == '' || "
                  f"{annotation} == 'runtime/default' || {annotation}.startsWith('localhost/'))",
                  f"metadata.annotations {APPARMOR_ANNOTATION_PREFIX}* other than runtime/default or "
                  "localhost/<profile> are not allowed in team namespaces (Pod Security baseline)"))
    allowed = ", ".join(f"'{cap}'" for cap in ALLOWED_CAPABILITIES)
    for containers in CONTAINER_LISTS:
        each = f"!has(object.spec.{containers}) || object.spec.{containers}.all(c, "
        rules += [
            (each + "!has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged)",
             f"privileged {containers} are not allowed in team namespaces"),
            (each + "!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))",
             f"hostPort on {containers} is not allowed in team namespaces"),
            (each + "!has(c.securityContext) || !has(c.securityContext.capabilities) || "
                    f"!has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(x, x in [{allowed}]))",
             f"{containers} may add only these capabilities: {', '.join(ALLOWED_CAPABILITIES)}"),
        ]
        rules += [(each + expression + ")", f"{containers}[*].{what} is not allowed in team namespaces (Pod Security "
                                            "baseline)") for expression, what in _security_context_rules("c")]
        rules.append((each + _unset_or("c", "securityContext.procMount", "{} == 'Default'") + ")",
                      f"{containers}[*].securityContext.procMount other than Default is not allowed in team namespaces "
                      "(Pod Security baseline)"))
        hosts = [_unset_or("c", f"{handler}.{action}.host", "{} == ''")
                 for handler in (*PROBES, *(f"lifecycle.{hook}" for hook in LIFECYCLE_HOOKS))
                 for action in ("httpGet", "tcpSocket")]
        rules.append((each + " && ".join(hosts) + ")",
                      f"{containers}[*] probes and lifecycle handlers may not name a host in team namespaces (Pod "
                      "Security baseline): the kubelet would connect there from the node"))
    return rules


# A Service with spec.externalIPs makes kube-proxy on every node send traffic for those addresses to the Service's
# pods: a team could take over any address the cluster talks to, another team's or an AWS endpoint's
# (CVE-2020-8554, kubernetes/kubernetes#97076; the upstream mitigation is exactly an admission check on this field).
# gpu-cloud's load balancers need no externalIPs (the NLB targets pod IPs). A second ValidatingAdmissionPolicy,
# in the same namespaces as the host isolation one, refuses them on create and update.
SERVICE_EXTERNAL_IPS_POLICY = "gpu-cloud-tenant-no-external-ips"


def service_validations() -> List[Tuple[str, str]]:
    """(CEL expression true for an acceptable Service, message) pairs of the external IPs policy."""
    return [("!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
             "spec.externalIPs is not allowed in team namespaces (CVE-2020-8554)")]


# Set by the API server on every namespace (Kubernetes 1.22+): selects a namespace that gpu-cloud does not label.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# Pool workloads (nodePools[].workload) whose GPUs each namespace's quota counts (see the module docstring).
NAMESPACE_WORKLOADS: Mapping[str, Tuple[str, ...]] = {
    TRAINING_NAMESPACE: ("training", "general"),
    INFERENCE_NAMESPACE: ("inference", "general"),
}


def _require_team_namespace(namespace: str) -> None:
    if namespace not in TEAM_NAMESPACES:
        raise ValueError(f"{namespace!r} is not a team namespace; team namespaces: {', '.join(TEAM_NAMESPACES)}")


def gpu_quota(pools: Sequence, namespace: str) -> Dict[str, str]:
    """ResourceQuota `hard` for `namespace`: per GPU resource of the cluster, what its pools offer at maxNodes."""
    _require_team_namespace(namespace)
    catalog = load_catalog()
    totals = {GPU_RESOURCE: 0}
    for pool in pools:
        for resource, per_node in offered_gpu_resources(pool, catalog).items():
            totals.setdefault(resource, 0)
            if pool.spec.workload in NAMESPACE_WORKLOADS[namespace]:
                totals[resource] += per_node * pool.spec.max_nodes
    # Extended resources take only the requests. prefix in a quota (a container's limit equals its request).
    return {f"requests.{resource}": str(count) for resource, count in sorted(totals.items())}


def gpu_quotas(pools: Sequence) -> Dict[str, Dict[str, str]]:
    """Every team namespace's GPU quota (what components.platform.tenancy.TenancyArgs.gpu_quotas takes)."""
    return {namespace: gpu_quota(pools, namespace) for namespace in TEAM_NAMESPACES}


# --- CPU and memory: quota and per-container defaults -------------------------------------------------------
# A team's CPU and memory are capped like its GPUs, by what its pools (NAMESPACE_WORKLOADS) hold at maxNodes:
#     requests.cpu    = sum over its pools of maxNodes x vCPUs of the pool's largest type
#     requests.memory = limits.memory = sum over its pools of maxNodes x memory of the pool's largest type (MiB)
# (the node's size, not its allocatable share: a cap, like the GPU quota, not a reservation). A namespace without
# pools gets 0 of each: it has no node to run on (the system nodes are tainted, decisions/nodes/pods.py), so every pod
# is refused at once ("exceeded quota") instead of waiting.
# Once a quota covers cpu or memory, the API server refuses any container that does not state them; the LimitRange
# states them for a container that does not. Its defaults are one GPU's share of the namespace's smallest node:
#     cpu    = min over its pools and their types of vCPUs / GPUs per node (millicores, rounded down)
#     memory = min over its pools and their types of memory / GPUs per node (MiB, rounded down)
# as the request (cpu and memory) and as the memory limit: a container that states nothing is sized like a one-GPU
# worker on the smallest node it may run on, so it fits on any of them. A container that states a memory request
# above that share must state its limit too (a request above the default limit is refused).
CPU_MEMORY_QUOTA_ITEMS = ("requests.cpu", "requests.memory", "limits.memory")
MIB_PER_GIB = 1024


def _pools_of(pools: Sequence, namespace: str) -> List:
    _require_team_namespace(namespace)
    return [pool for pool in pools if pool.spec.workload in NAMESPACE_WORKLOADS[namespace]]


def cpu_memory_quota(pools: Sequence, namespace: str) -> Dict[str, str]:
    """ResourceQuota `hard` items for CPU and memory of `namespace`: what its pools hold at maxNodes."""
    cpu = memory_mib = 0
    for pool in _pools_of(pools, namespace):
        cpu += pool.spec.max_nodes * max(t.vcpu for t in pool.types)
        memory_mib += pool.spec.max_nodes * max(t.memory_gib for t in pool.types) * MIB_PER_GIB
    amounts = {"cpu": str(cpu), "memory": f"{memory_mib}Mi"}
    return {item: amounts[item.split(".", 1)[1]] for item in CPU_MEMORY_QUOTA_ITEMS}


def cpu_memory_quotas(pools: Sequence) -> Dict[str, Dict[str, str]]:
    """Every team namespace's CPU and memory quota (components.platform.tenancy.TenancyArgs.cpu_memory_quotas)."""
    return {namespace: cpu_memory_quota(pools, namespace) for namespace in TEAM_NAMESPACES}


def container_defaults(pools: Sequence, namespace: str) -> Optional[Dict[str, Dict[str, str]]]:
    """The LimitRange's Container item for `namespace` ({"defaultRequest": ..., "default": ...}), or None for a
    namespace without pools (its quota of 0 refuses every pod anyway)."""
    shares = [(t.vcpu * 1000 // t.gpu.count, t.memory_gib * MIB_PER_GIB // t.gpu.count)
              for pool in _pools_of(pools, namespace) for t in pool.types]
    if not shares:
        return None
    cpu_m, memory_mib = min(cpu for cpu, _ in shares), min(memory for _, memory in shares)
    return {"defaultRequest": {"cpu": f"{cpu_m}m", "memory": f"{memory_mib}Mi"},
            "default": {"memory": f"{memory_mib}Mi"}}


def team_container_defaults(pools: Sequence) -> Dict[str, Optional[Dict[str, Dict[str, str]]]]:
    """Every team namespace's LimitRange Container item (components.platform.tenancy.TenancyArgs.container_defaults)."""
    return {namespace: container_defaults(pools, namespace) for namespace in TEAM_NAMESPACES}


# --- RBAC -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RbacRule:
    api_groups: Tuple[str, ...]
    resources: Tuple[str, ...]
    verbs: Tuple[str, ...]


MANAGE = ("create", "get", "list", "watch", "delete")
READ = ("get", "list", "watch")

# What a team may do in its own namespace. Left out on purpose:
# - secrets, every verb: credentials a team needs reach its pods through Pod Identity, not Secrets. (Anyone who
#   may create pods can still mount a Secret of the namespace into one: keep secrets a team must not read out of
#   its namespace.)
# - pods/exec, pods/attach, pods/portforward: a shell in a running pod reads what is mounted there (tokens,
#   Secrets, the credentials of the pod's service account) through a channel whose commands the audit log does
#   not record; teams debug through logs and by re-running jobs.
# - update/patch: workloads are replaced, not edited in place; a Job's pod template is immutable anyway.
# - Kueue Workloads and LocalQueues, read-only: Kueue owns Workloads; a team watches its jobs' admission there
#   and the queue's pending/admitted counts on the LocalQueue. The ClusterQueue is cluster-wide: not granted.
# - CronJobs, read-only: enough for `kubectl create job --from=cronjob/...` (the NVLink check, run by hand).
# - events and resourcequotas, read-only: `kubectl describe` shows why a pod waits, including "exceeded quota".
TEAM_RULES: Tuple[RbacRule, ...] = (
    RbacRule(("batch",), ("jobs",), MANAGE),
    RbacRule(("",), ("pods", "services", "configmaps"), MANAGE),
    RbacRule(("",), ("pods/log",), ("get",)),
    RbacRule(("kubeflow.org",), ("mpijobs",), MANAGE),
    RbacRule(("jobset.x-k8s.io",), ("jobsets",), MANAGE),
    RbacRule(("batch",), ("cronjobs",), READ),
    RbacRule(("kueue.x-k8s.io",), ("workloads", "localqueues"), READ),
    RbacRule(("",), ("events", "resourcequotas"), READ),
)

# The only cluster-wide grant: GPU node status (capacity, allocatable nvidia.com/gpu, conditions, labels).
NODE_READER_RULES: Tuple[RbacRule, ...] = (RbacRule(("",), ("nodes",), READ),)
NODE_READER_NAME = "gpu-cloud:node-reader"


def team_group(namespace: str) -> str:
    """The Kubernetes group of a namespace's team. EKS refuses group names starting with `system:`."""
    return f"gpu-cloud:{namespace}"


# --- EKS access entries -----------------------------------------------------------------------------------

def team_access(team_role_arns: Mapping[str, Sequence[str]],
                admin_principal_arns: Sequence[str] = ()) -> Dict[str, Tuple[str, ...]]:
    """IAM role ARN -> the Kubernetes groups its access entry carries.

    EKS allows one access entry per principal and cluster, so a role listed for both namespaces gets one
    entry with both groups, and a role that already has an entry (`admin_principal_arns`: the admins and the
    deployer) is refused rather than failing `pulumi up` with ResourceInUseException."""
    problems = []
    groups: Dict[str, Tuple[str, ...]] = {}
    for namespace, arns in team_role_arns.items():
        if namespace not in TEAM_NAMESPACES:
            problems.append(f"{namespace!r} is not a team namespace ({', '.join(TEAM_NAMESPACES)})")
            continue
        if isinstance(arns, str):
            problems.append(f"{namespace}: role ARNs must be a list, not the string {arns!r}")
            continue
        for arn in arns:
            if not IAM_ROLE_ARN.match(arn):
                problems.append(f"{namespace}: {arn!r} is not an IAM role ARN")
            elif arn in admin_principal_arns:
                problems.append(f"{namespace}: {arn} already has a cluster-admin access entry "
                                "(EKS allows one entry per principal); use another role for the team")
            elif team_group(namespace) in groups.get(arn, ()):
                problems.append(f"{namespace}: {arn} is listed twice")
            else:
                groups[arn] = groups.get(arn, ()) + (team_group(namespace),)
    if problems:
        raise ValueError("invalid team roles: " + "; ".join(problems))
    return groups


def access_entry_suffix(arn: str) -> str:
    """Stable, readable resource-name suffix for a role: its name plus a short hash of the ARN."""
    role_name = re.sub(r"[^\w-]", "-", arn.rsplit("/", 1)[-1])[:40]
    return f"{role_name}-{hashlib.sha256(arn.encode()).hexdigest()[:6]}"


# --- network policies -------------------------------------------------------------------------------------
# The VPC CNI's network policy agent enforces these (components/cluster.py: enableNetworkPolicy). It always
# lets the node's own address in and out, so kubelet probes need no rule.

DNS_PORT = 53
HTTPS_PORT = 443
# EKS Pod Identity: the agent (a host-network DaemonSet) serves pods' AWS credentials on this link-local
# address, port 80 (EKS User Guide, "EKS Pod Identity considerations"). Without it the HTTPS rule is no use
# to a pod that signs AWS requests.
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
POD_IDENTITY_AGENT_PORT = 80
# Triton Inference Server's default ports: HTTP/REST, gRPC, Prometheus metrics.
TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
TRITON_METRICS_PORT = 8002
# The workload contract's metrics port: a job or server that exports Prometheus metrics serves them here.
WORKLOAD_METRICS_PORT = 9090
# What Prometheus (in MONITORING_NAMESPACE) may scrape in each team namespace.
SCRAPE_PORTS: Mapping[str, Tuple[int, ...]] = {
    TRAINING_NAMESPACE: (WORKLOAD_METRICS_PORT,),
    INFERENCE_NAMESPACE: (TRITON_METRICS_PORT, WORKLOAD_METRICS_PORT),
}
# CoreDNS pods carry this label and the kube-dns Service selects by it. The AWS network policy controller
# adds a Service's ClusterIP to an egress rule only when the Service's selector matches the rule's pod
# selector (amazon-network-policy-controller-k8s, pkg/resolvers/endpoints.go), and pods resolve through
# that ClusterIP: select by exactly the Service's selector.
COREDNS_LABELS = (("k8s-app", "kube-dns"),)
SYSTEM_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class Pods:
    """Pods with all of `labels` (every pod when empty), in `namespace` (selected by its name label), or in
    the policy's own namespace when `namespace` is None."""
    namespace: Optional[str] = None
    labels: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Cidr:
    cidr: str


Peer = Union[Pods, Cidr]


@dataclass(frozen=True)
class Port:
    protocol: str                    # TCP | UDP
    port: Optional[int] = None       # None: every port of the protocol


@dataclass(frozen=True)
class TrafficRule:
    peers: Tuple[Peer, ...]
    ports: Tuple[Port, ...]


@dataclass(frozen=True)
class NetworkPolicyRules:
    """One NetworkPolicy over every pod of its namespace."""
    name: str
    policy_types: Tuple[str, ...]
    ingress: Tuple[TrafficRule, ...] = ()
    egress: Tuple[TrafficRule, ...] = ()

    def __post_init__(self):
        # Kubernetes ignores the rules of a direction missing from policyTypes: that would be an allow that
        # silently allows nothing.
        for direction, rules in (("Ingress", self.ingress), ("Egress", self.egress)):
            if rules and direction not in self.policy_types:
                raise ValueError(f"{self.name}: {direction} rules without {direction} in policy_types")


def network_policies(namespace: str, vpc_cidr: str) -> Tuple[NetworkPolicyRules, ...]:
    """Default deny in both directions, then exactly what the namespace's workloads need.

    `vpc_cidr`: where the inference load balancer's addresses are (its nodes, or its ENIs in IP mode).
    """
    _require_team_namespace(namespace)
    vpc = str(ipaddress.IPv4Network(vpc_cidr, strict=True))
    policies = [
        # No rules: with both types listed, every pod of the namespace gets only what the other policies allow.
        NetworkPolicyRules("default-deny", ("Ingress", "Egress")),
        NetworkPolicyRules("allow-dns", ("Egress",), egress=(TrafficRule(
            (Pods(SYSTEM_NAMESPACE, COREDNS_LABELS),), (Port("UDP", DNS_PORT), Port("TCP", DNS_PORT))),)),
        NetworkPolicyRules("allow-prometheus-scrape", ("Ingress",), ingress=(TrafficRule(
            (Pods(MONITORING_NAMESPACE),), tuple(Port("TCP", port) for port in SCRAPE_PORTS[namespace])),)),
        # HTTPS anywhere: S3 (checkpoints, datasets, Triton's model repository) answers on AWS's public ranges,
        # reached through the S3 gateway endpoint, which a NetworkPolicy cannot name; other AWS APIs answer on
        # interface endpoints in the VPC or through NAT. The API server is reachable this way too; RBAC, not the
        # network, limits what a team's pods may do there (their service accounts are bound to nothing).
        # Image pulls need no rule: containerd on the node pulls, and node traffic is not subject to policies.
        NetworkPolicyRules("allow-aws-apis", ("Egress",), egress=(
            TrafficRule((Cidr("0.0.0.0/0"),), (Port("TCP", HTTPS_PORT),)),
            TrafficRule((Cidr(POD_IDENTITY_AGENT_CIDR),), (Port("TCP", POD_IDENTITY_AGENT_PORT),)),
        )),
    ]
    if namespace == TRAINING_NAMESPACE:
        # NCCL's bootstrap and its socket transport use TCP on ephemeral ports between the job's pods (so do
        # torchrun's rendezvous and MPI's ssh): all TCP, pod to pod, within the namespace only. EFA traffic is
        # RDMA (SRD) that bypasses the kernel's IP stack, so NetworkPolicy neither sees nor blocks it.
        within_namespace = TrafficRule((Pods(),), (Port("TCP"),))
        policies.append(NetworkPolicyRules("allow-nccl", ("Ingress", "Egress"),
                                           ingress=(within_namespace,), egress=(within_namespace,)))
    if namespace == INFERENCE_NAMESPACE:
        # The load balancer reaches Triton from its addresses in the VPC. An NLB that preserves client IPs
        # would present clients' addresses instead: keep client IP preservation off for IP targets.
        policies.append(NetworkPolicyRules("allow-triton-from-vpc", ("Ingress",), ingress=(TrafficRule(
            (Cidr(vpc),), tuple(Port("TCP", p) for p in (TRITON_HTTP_PORT, TRITON_GRPC_PORT, TRITON_METRICS_PORT))),)))
    return tuple(policies)
