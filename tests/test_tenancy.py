"""components/platform/tenancy.py under the mock engine, and the pure decisions in decisions/platform/tenancy.py.

What users rely on: each team namespace's GPU quota is what its pools can offer at maxNodes (time-sliced
replicas and MIG slices counted as the device plugin advertises them); a team may run jobs and pods in its
own namespace and read nodes, and nothing else: no secrets, no exec, no cluster-wide write, never
cluster-admin; a team's IAM roles reach the cluster only through an access entry that names its group;
every pod of a team namespace is denied in and out except the traffic listed below; and every object is
one the Kubernetes 1.35 API accepts.
"""
from __future__ import annotations

import json
from typing import Dict, List

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes
import pytest

from components.platform.tenancy import Tenancy, TenancyArgs
from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool, load_stack_spec
from decisions.nodes.pods import SYSTEM_NODE_LABELS
from decisions.nodes.pools import offered_gpu_resources
from decisions.platform import tenancy
from plan.stackfile import project_keys
from tests.conftest import run_component, stack_config, validate_kubernetes

CLUSTER = "gpu-cloud-test"
VPC_CIDR = "10.64.0.0/16"
ACCOUNT = "123456789012"
TRAIN_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ml-training"
SERVE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/teams/ml-serving"     # a role with a path
SHARED_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ml-oncall"           # in both teams
ADMIN_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ml-platform-admin"

COMPONENT = "gpu-cloud:tenancy:Tenancy"
NAMESPACE = "kubernetes:core/v1:Namespace"
QUOTA = "kubernetes:core/v1:ResourceQuota"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
K8S_PROVIDER = "pulumi:providers:kubernetes"

catalog = load_catalog()


def gpu_pool(name: str, instance_type: str, workload: str, max_nodes: int, sharing=None) -> ResolvedPool:
    """A resolved pool; desiredNodes differs from maxNodes so a quota sized from the wrong one shows."""
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": "on-demand", "minNodes": 0,
        "desiredNodes": min(1, max_nodes), "maxNodes": max_nodes, "workload": workload,
        "gpuSharing": sharing or {"mode": "none"}})
    return ResolvedPool(spec=spec, types=(catalog.instance_types[instance_type],), efa=False)


# A cluster with every kind of pool. Per node: p5 8 H100; p4de 8 A100 80GB cut 1g.10gb (7 per GPU); p4d 8
# A100 40GB cut 1g.10gb (4 per GPU on the 40 GB part: the same resource name, a different count); g6e.12xlarge
# 4 L40S time-sliced x3; g6.12xlarge 4 L4.
POOLS = (
    gpu_pool("train-h100", "p5.48xlarge", "training", 4),
    gpu_pool("train-mig", "p4de.24xlarge", "training", 3, {"mode": "mig", "migProfile": "1g.10gb"}),
    gpu_pool("infer-mig", "p4d.24xlarge", "inference", 2, {"mode": "mig", "migProfile": "1g.10gb"}),
    gpu_pool("infer-l40s", "g6e.12xlarge", "inference", 5, {"mode": "time-slicing", "replicas": 3}),
    gpu_pool("shared-l4", "g6.12xlarge", "general", 2),
)


# --- quotas (decisions/platform/tenancy.py)
# ------------------------------------------------------------------------------

def test_quotas_are_what_each_namespaces_pools_offer_at_max_nodes():
    assert tenancy.gpu_quotas(POOLS) == {
        "training": {
            "requests.nvidia.com/gpu": str(4 * 8 + 2 * 4),                  # H100 pool + the general L4 pool
            "requests.nvidia.com/mig-1g.10gb": str(3 * 8 * 7),               # A100 80GB: 7 slices per GPU
        },
        "inference": {
            "requests.nvidia.com/gpu": str(5 * 4 * 3 + 2 * 4),              # time-sliced L40S + the general L4 pool
            "requests.nvidia.com/mig-1g.10gb": str(2 * 8 * 4),               # A100 40GB: 4 slices per GPU
        },
    }


@pytest.mark.parametrize("pool,offered", [
    (POOLS[0], {"nvidia.com/gpu": 8}),
    (POOLS[1], {"nvidia.com/mig-1g.10gb": 56}),                       # no nvidia.com/gpu: mixed strategy
    (POOLS[2], {"nvidia.com/mig-1g.10gb": 32}),
    (POOLS[3], {"nvidia.com/gpu": 12}),
    (gpu_pool("t", "g6e.12xlarge", "inference", 1, {"mode": "time-slicing", "replicas": 48}), {"nvidia.com/gpu": 192}),
    (gpu_pool("m", "p5en.48xlarge", "training", 1, {"mode": "mig", "migProfile": "1g.35gb"}), {"nvidia.com/mig-1g.35gb": 32}),
    (gpu_pool("m", "p6-b200.48xlarge", "training", 1, {"mode": "mig", "migProfile": "3g.90gb"}), {"nvidia.com/mig-3g.90gb": 16}),
    (gpu_pool("m", "p5.48xlarge", "training", 1, {"mode": "mig", "migProfile": "7g.80gb"}), {"nvidia.com/mig-7g.80gb": 8}),
    (gpu_pool("s", "p4de.24xlarge", "inference", 1, {"mode": "mps", "replicas": 8}), {"nvidia.com/gpu": 64}),
    (gpu_pool("s", "g6.12xlarge", "inference", 1, {"mode": "mps", "replicas": 48}), {"nvidia.com/gpu": 192}),
    (gpu_pool("m", "p4d.24xlarge", "training", 1, {"mode": "mig", "migProfiles": {"1g.5gb": 3, "2g.10gb": 2}}),
     {"nvidia.com/mig-1g.5gb": 24, "nvidia.com/mig-2g.10gb": 16}),
], ids=["whole", "mig-a100-80", "mig-a100-40", "time-sliced", "48-replicas", "mig-h200-1g35", "mig-b200-3g",
        "mig-h100-7g", "mps-8x10gb", "mps-48", "mig-mixed-a100-40"])
def test_each_pool_offers_what_the_device_plugin_advertises(pool, offered):
    assert offered_gpu_resources(pool, catalog) == offered


def test_a_namespace_without_pools_gets_zero_and_every_cluster_resource_is_covered():
    # Only inference pools: training may request nothing, including the MIG slices of the inference pool
    # (a resource missing from a quota would be unlimited).
    quotas = tenancy.gpu_quotas((POOLS[2], POOLS[3]))
    assert quotas["training"] == {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": "0"}
    assert quotas["inference"] == {"requests.nvidia.com/gpu": "60", "requests.nvidia.com/mig-1g.10gb": "64"}
    # Only MIG pools: nvidia.com/gpu is still quota'd, at 0.
    assert tenancy.gpu_quota((POOLS[1],), "training") == {"requests.nvidia.com/gpu": "0",
                                                           "requests.nvidia.com/mig-1g.10gb": "168"}
    # A pool that may not scale offers nothing; no pools at all is 0 GPUs.
    assert tenancy.gpu_quota((gpu_pool("off", "p5.48xlarge", "training", 0),), "training") == {"requests.nvidia.com/gpu": "0"}
    assert tenancy.gpu_quotas(()) == {ns: {"requests.nvidia.com/gpu": "0"} for ns in tenancy.TEAM_NAMESPACES}


def test_mps_and_mixed_mig_pools_are_quotad_as_the_plugin_advertises_them():
    # MPS replicas are nvidia.com/gpu like whole GPUs; a mixed MIG pool quotas each of its profiles, in every namespace.
    shared = (gpu_pool("serve-mps", "p4de.24xlarge", "inference", 3, {"mode": "mps", "replicas": 8}),
              gpu_pool("train-mixed", "p5.48xlarge", "training", 2, {"mode": "mig", "migProfiles": {"1g.10gb": 2, "3g.40gb": 1}}))
    assert tenancy.gpu_quotas(shared) == {
        "training": {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/mig-1g.10gb": str(2 * 8 * 2),
                     "requests.nvidia.com/mig-3g.40gb": str(2 * 8 * 1)},
        "inference": {"requests.nvidia.com/gpu": str(3 * 8 * 8), "requests.nvidia.com/mig-1g.10gb": "0",
                      "requests.nvidia.com/mig-3g.40gb": "0"},
    }


def test_general_pools_count_for_both_namespaces():
    quotas = tenancy.gpu_quotas((POOLS[4],))
    assert quotas["training"] == quotas["inference"] == {"requests.nvidia.com/gpu": "8"}


@pytest.mark.parametrize("stack,training,inference", [
    ("prod-us-east-1", 4 * 8 + 3 * 8 + 3 * 8, 3 * 4 * 2),     # H100, A100 80GB, A100 40GB; L40S time-sliced x2
    ("prod-eu-west-1", 4 * 8, 4 * 4 + 8 * 4),                 # p4d; two g5.12xlarge pools
    ("dev", 3 * 4, 3 * 4),                                    # one general g6.12xlarge pool: both
])
def test_shipped_stacks_quotas(stack, training, inference):
    config = stack_config(stack)
    spec = load_stack_spec(project_keys(config), stack=stack, region=config["aws:region"])
    assert tenancy.gpu_quotas(spec.pools) == {"training": {"requests.nvidia.com/gpu": str(training)},
                                              "inference": {"requests.nvidia.com/gpu": str(inference)}}


def test_quota_refuses_what_it_cannot_size():
    with pytest.raises(ValueError, match="not a team namespace"):
        tenancy.gpu_quota(POOLS, "research")


@pytest.mark.parametrize("decide", [
    lambda ns: tenancy.gpu_quota(POOLS, ns), lambda ns: tenancy.cpu_memory_quota(POOLS, ns),
    lambda ns: tenancy.container_defaults(POOLS, ns), lambda ns: tenancy.network_policies(ns, VPC_CIDR),
], ids=["gpu-quota", "cpu-memory-quota", "container-defaults", "network-policies"])
def test_every_per_namespace_decision_refuses_a_namespace_that_is_no_teams(decide):
    with pytest.raises(ValueError, match=r"^'research' is not a team namespace; team namespaces: training, inference$"):
        decide("research")
    assert decide("training") is not None


def test_a_gpu_quota_reads_the_catalog_once(monkeypatch):
    calls = []
    monkeypatch.setattr(tenancy, "load_catalog", lambda: calls.append(1) or load_catalog())
    assert tenancy.gpu_quota(POOLS, "training") and len(POOLS) > 1
    assert len(calls) == 1


def test_the_cpu_memory_quota_has_exactly_its_items_each_at_its_resources_amount():
    for hard in tenancy.cpu_memory_quotas(POOLS).values():
        assert tuple(hard) == tenancy.CPU_MEMORY_QUOTA_ITEMS
        assert hard["requests.memory"] == hard["limits.memory"]


# --- access entries (decisions/platform/tenancy.py)
# ---------------------------------------------------------------------

# CPU and memory. Per node (catalog): p5.48xlarge 192 vCPU 2048 GiB 8 GPUs; p4de/p4d.24xlarge 96 vCPU 1152 GiB 8;
# g6e.12xlarge 48 vCPU 384 GiB 4; g6.12xlarge 48 vCPU 192 GiB 4. At maxNodes (desiredNodes is 1: a quota sized from
# it would read 336 CPUs for training):
#   training  = 4 x p5 + 3 x p4de + 2 x g6 (general): 768 + 288 + 96 = 1152 CPUs; 8192 + 3456 + 384 = 12032 GiB
#   inference = 2 x p4d + 5 x g6e + 2 x g6 (general): 192 + 240 + 96 = 528 CPUs; 2304 + 1920 + 384 = 4608 GiB
def test_cpu_and_memory_quotas_are_what_each_namespaces_pools_hold_at_max_nodes():
    assert tenancy.cpu_memory_quotas(POOLS) == {
        "training": {"requests.cpu": "1152", "requests.memory": f"{12032 * 1024}Mi",
                     "limits.memory": f"{12032 * 1024}Mi"},
        "inference": {"requests.cpu": "528", "requests.memory": f"{4608 * 1024}Mi",
                      "limits.memory": f"{4608 * 1024}Mi"},
    }


def test_container_defaults_are_one_gpus_share_of_the_namespaces_smallest_node():
    # One GPU's share per node: p5 24 CPUs 256 GiB; p4de/p4d 12 CPUs 144 GiB; g6e 12 CPUs 96 GiB; g6 12 CPUs 48 GiB.
    only_h100 = (POOLS[0],)
    assert tenancy.container_defaults(only_h100, "training") == {
        "defaultRequest": {"cpu": "24000m", "memory": f"{256 * 1024}Mi"}, "default": {"memory": f"{256 * 1024}Mi"}}
    # The minimum over the namespace's own pools only: p5 + p4de -> 12 CPUs and 144 GiB (p4de); the inference g6e
    # does not count for training; the general g6 brings memory down to 48 GiB for both.
    assert tenancy.container_defaults((POOLS[0], POOLS[1], POOLS[3]), "training") == \
        tenancy.container_defaults((POOLS[0], POOLS[1]), "training")
    assert tenancy.container_defaults((POOLS[0], POOLS[1]), "training")["defaultRequest"] == {
        "cpu": "12000m", "memory": f"{144 * 1024}Mi"}
    assert tenancy.container_defaults((POOLS[2], POOLS[3]), "inference") == {
        "defaultRequest": {"cpu": "12000m", "memory": f"{96 * 1024}Mi"}, "default": {"memory": f"{96 * 1024}Mi"}}
    assert tenancy.container_defaults(POOLS, "training")["default"] == {"memory": f"{48 * 1024}Mi"}


@pytest.mark.parametrize("stack, training, inference", [
    # (CPUs, GiB, default CPU millicores, default GiB), as docs/tenancy.md lists them
    ("prod-us-east-1", (1344, 15104, 12000, 144), (144, 1152, 12000, 96)),
    ("prod-eu-west-1", (384, 4608, 12000, 144), (576, 2304, 12000, 48)),
    ("dev", (144, 576, 12000, 48), (144, 576, 12000, 48)),
])
def test_shipped_stacks_cpu_memory_quotas_and_defaults(stack, training, inference):
    config = stack_config(stack)
    pools = load_stack_spec(project_keys(config), stack=stack, region=config["aws:region"]).pools
    for namespace, (cpus, gib, default_m, default_gib) in (("training", training), ("inference", inference)):
        assert tenancy.cpu_memory_quota(pools, namespace) == {
            "requests.cpu": str(cpus), "requests.memory": f"{gib * 1024}Mi", "limits.memory": f"{gib * 1024}Mi"}
        assert tenancy.container_defaults(pools, namespace) == {
            "defaultRequest": {"cpu": f"{default_m}m", "memory": f"{default_gib * 1024}Mi"},
            "default": {"memory": f"{default_gib * 1024}Mi"}}


def test_a_namespace_without_pools_gets_zero_cpu_and_memory_and_no_defaults():
    training_only = (POOLS[0], POOLS[1])
    assert tenancy.cpu_memory_quota(training_only, "inference") == {
        "requests.cpu": "0", "requests.memory": "0Mi", "limits.memory": "0Mi"}
    assert tenancy.team_container_defaults(training_only)["inference"] is None
    with pytest.raises(ValueError, match="not a team namespace"):
        tenancy.cpu_memory_quota(POOLS, "kube-system")


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1", "dev"])
def test_shipped_stacks_project_pods_in_team_namespaces_state_cpu_and_memory(stack_runs, stack):
    """With a CPU/memory quota the API server refuses a container that states neither and gets no default; a
    container with a memory request above the default limit and no limit of its own is refused too. The program's
    own pods in team namespaces state requests below the default limit, or their own limits."""
    run = stack_runs[stack]
    quotas = {r.inputs["metadata"]["namespace"]: r.inputs["spec"]["hard"]
              for r in run.of_type(QUOTA) if r.inputs["metadata"]["name"] == "cpu-memory"}
    assert set(quotas) == set(tenancy.TEAM_NAMESPACES)
    assert all(set(hard) == set(tenancy.CPU_MEMORY_QUOTA_ITEMS) for hard in quotas.values())
    defaults = {r.inputs["metadata"]["namespace"]: r.inputs["spec"]["limits"][0]
                for r in run.of_type("kubernetes:core/v1:LimitRange")}

    def mib(quantity: str) -> float:
        units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
        return float(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else float(quantity) / 2**20

    checked = 0
    for resource in run.resources:
        template = _pod_template(resource)
        namespace = resource.inputs.get("metadata", {}).get("namespace")
        if template is None or namespace not in tenancy.TEAM_NAMESPACES:
            continue
        for container in template.get("containers", []) + template.get("initContainers", []):
            resources = container.get("resources") or {}
            limit = (resources.get("limits") or {}).get("memory") or defaults[namespace]["default"]["memory"]
            request = (resources.get("requests") or {}).get("memory") or defaults[namespace]["defaultRequest"]["memory"]
            assert mib(request) <= mib(limit), (resource.name, container["name"])
            if template.get("nodeSelector") == SYSTEM_NODE_LABELS:
                # The defaults are a GPU node's share (12 CPUs and more): a system node (4 vCPUs) could never take it.
                assert {"cpu", "memory"} <= set(resources.get("requests") or {}), (resource.name, container["name"])
            checked += 1
    assert checked or stack == "dev"      # dev runs no Triton and no NCCL checks


def _pod_template(resource):
    """The pod spec of a Deployment, Job or CronJob the program creates directly, else None."""
    spec = resource.inputs.get("spec") or {}
    if resource.type in ("kubernetes:apps/v1:Deployment", "kubernetes:batch/v1:Job"):
        return spec["template"]["spec"]
    if resource.type == "kubernetes:batch/v1:CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return None


def test_a_role_in_both_teams_gets_one_entry_with_both_groups():
    access = tenancy.team_access({"training": [TRAIN_ROLE, SHARED_ROLE], "inference": [SERVE_ROLE, SHARED_ROLE]})
    assert access == {TRAIN_ROLE: ("gpu-cloud:training",), SERVE_ROLE: ("gpu-cloud:inference",),
                      SHARED_ROLE: ("gpu-cloud:training", "gpu-cloud:inference")}


@pytest.mark.parametrize("roles,admins,words", [
    ({"research": [TRAIN_ROLE]}, (), "'research' is not a team namespace"),
    ({"training": [f"arn:aws:iam::{ACCOUNT}:user/alice"]}, (), "is not an IAM role ARN"),
    ({"training": TRAIN_ROLE}, (), "must be a list"),
    ({"training": [TRAIN_ROLE, TRAIN_ROLE]}, (), "listed twice"),
    ({"inference": [ADMIN_ROLE]}, (ADMIN_ROLE,), "already has a cluster-admin access entry"),
], ids=["unknown-namespace", "user-not-role", "string-not-list", "duplicate", "admin-role"])
def test_team_roles_that_eks_or_rbac_would_refuse_are_errors(roles, admins, words):
    with pytest.raises(ValueError, match=words):
        tenancy.team_access(roles, admins)


# --- the component under the mock engine ------------------------------------------------------------------

def _build(**overrides):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        # A stand-in cluster: the component gets its name as an Output, as __main__ passes it.
        eks = aws.eks.Cluster("eks", name=CLUSTER, role_arn=f"arn:aws:iam::{ACCOUNT}:role/eks",
                              vpc_config=aws.eks.ClusterVpcConfigArgs(subnet_ids=["subnet-0123456789abcdef0"]))
        args = dict(cluster_name=eks.name, vpc_cidr=VPC_CIDR, gpu_quotas=tenancy.gpu_quotas(POOLS),
                    cpu_memory_quotas=tenancy.cpu_memory_quotas(POOLS),
                    container_defaults=tenancy.team_container_defaults(POOLS),
                    team_role_arns={"training": [TRAIN_ROLE, SHARED_ROLE], "inference": [SERVE_ROLE, SHARED_ROLE]},
                    admin_principal_arns=(ADMIN_ROLE,))
        args.update(overrides)
        Tenancy("tenancy", TenancyArgs(**args), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build())


def _in(run, type_token: str, namespace: str):
    return [r for r in run.of_type(type_token) if r.inputs["metadata"].get("namespace") == namespace]


def _policies(run, namespace: str) -> Dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in _in(run, NETWORK_POLICY, namespace)}


def _all_rules(run) -> List[dict]:
    return [rule for r in run.of_type(ROLE) + run.of_type(CLUSTER_ROLE) for rule in r.inputs["rules"]]


def test_every_kubernetes_object_validates_against_kubernetes_1_35(run):
    k8s_objects = [r for r in run.resources if r.type.startswith("kubernetes:")]
    # per namespace: ns, GPU and CPU/memory quotas, limit range, role+binding, 5 policies; node reader
    # role+binding; host isolation policy+binding; external IPs policy+binding
    assert len(k8s_objects) == 2 * (1 + 2 + 1 + 2 + 5) + 2 + 2 + 2
    assert validate_kubernetes(run, "1.35") == len(k8s_objects)


def test_team_namespaces_are_labelled_for_selection_and_protected(run):
    namespaces = {r.inputs["metadata"]["name"]: r for r in run.of_type(NAMESPACE)}
    assert set(namespaces) == {"training", "inference"} == set(tenancy.TEAM_NAMESPACES)
    for name, namespace in namespaces.items():
        # Triton's namespace also gets the load balancer controller's readiness gates (IP targets), and Pod
        # Security's baseline profile (training's MPI workers add IPC_LOCK, which baseline refuses).
        extra = {"elbv2.k8s.aws/pod-readiness-gate-inject": "enabled",
                 "pod-security.kubernetes.io/enforce": "baseline"} if name == "inference" else {}
        assert namespace.inputs["metadata"]["labels"] == {"gpu-cloud.io/tenant": name, **extra}
        assert namespace.protect, "deleting a team namespace deletes every job in it"


POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
POLICY_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _assert_tenant_policy(run, resource_name: str, policy_name: str, resources: List[str], validations) -> None:
    """A Deny-bound ValidatingAdmissionPolicy over core `resources` in every team namespace, with `validations`."""
    policy = run.one(POLICY, resource_name)
    binding = run.one(POLICY_BINDING, resource_name)
    spec = policy.inputs["spec"]
    assert policy.inputs["metadata"]["name"] == policy_name
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "gpu-cloud.io/tenant", "operator": "Exists"}]}
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": resources}]
    assert [(v["expression"], v["message"]) for v in spec["validations"]] == validations
    assert binding.inputs["spec"] == {"policyName": policy_name, "validationActions": ["Deny"]}
    assert policy.urn in binding.dependencies


def test_the_api_server_refuses_team_pods_that_reach_their_host(run):
    assert len(run.of_type(POLICY)) == len(run.of_type(POLICY_BINDING)) == 2     # host isolation, external IPs
    _assert_tenant_policy(run, "tenancy-host-isolation", "gpu-cloud-tenant-host-isolation",
                          ["pods", "pods/ephemeralcontainers"], tenancy.host_isolation_validations())


def _cel_refusals(kind: str, spec, validations, *, operation: str = "CREATE", metadata=None) -> List[str]:
    """The messages of `validations` an object of `kind` with `spec` (and `metadata`) breaks in a request of
    `operation`, evaluated with a CEL interpreter given the variables the API server gives a ValidatingAdmissionPolicy
    that these rules use: `object`, and `request` (its `operation`). An expression that errors, or yields anything
    but a boolean, fails the test (the API server would refuse the object: failurePolicy Fail)."""
    import celpy
    from celpy.celtypes import BoolType
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel({"apiVersion": "v1", "kind": kind, "metadata": metadata or {},
                                               "spec": spec}),
                  "request": celpy.json_to_cel({"operation": operation})}
    refused = []
    for expression, message in validations:
        result = env.program(env.compile(expression)).evaluate(activation)
        assert isinstance(result, BoolType), (expression, result)
        if not result:
            refused.append(message)
    return refused


def _refusals(pod_spec, **request) -> List[str]:
    """The messages of the host isolation rules a Pod with `pod_spec` breaks (`request`: operation, metadata)."""
    return _cel_refusals("Pod", pod_spec, tenancy.host_isolation_validations(), **request)


def test_the_programs_own_team_pods_pass_host_isolation(stack_runs):
    from tests.test_mpijob import job, launcher, worker_spec
    triton = stack_runs["prod-us-east-1"].one("kubernetes:apps/v1:Deployment", "inference-deployment")
    assert _refusals(triton.inputs["spec"]["template"]["spec"]) == []
    manifest = job()
    from decisions.platform.pod_security import SSHD_CAPABILITIES
    added = worker_spec(manifest)["containers"][0]["securityContext"]["capabilities"]["add"]
    assert sorted(added) == sorted(["IPC_LOCK", *SSHD_CAPABILITIES])
    assert _refusals(worker_spec(manifest)) == []
    assert _refusals({"containers": [launcher(manifest)]}) == []


HOST_CASES = [
    ({"hostNetwork": True}, "spec.hostNetwork is not allowed in team namespaces"),
    ({"hostPID": True}, "spec.hostPID is not allowed in team namespaces"),
    ({"hostIPC": True}, "spec.hostIPC is not allowed in team namespaces"),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "hostPath volumes are not allowed in team namespaces"),
    ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]},
     "privileged containers are not allowed in team namespaces"),
    ({"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]},
     "privileged initContainers are not allowed in team namespaces"),
    ({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]},
     "hostPort on containers is not allowed in team namespaces"),
    ({"ephemeralContainers": [{"name": "e", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
     "ephemeralContainers may add only these capabilities"),
]


@pytest.mark.parametrize("change, refused", HOST_CASES)
def test_each_way_onto_the_host_is_refused(change, refused):
    harmless = {"containers": [{"name": "c", "ports": [{"containerPort": 80}],
                                "securityContext": {"privileged": False, "capabilities": {"add": ["IPC_LOCK"]}}}],
                "volumes": [{"name": "scratch", "emptyDir": {}}], "hostNetwork": False}
    assert _refusals(harmless) == []
    (message,) = _refusals({**harmless, **change})
    assert message.startswith(refused)


SYSTEM_REFUSAL = "spec.tolerations may not tolerate the system nodes' taint CriticalAddonsOnly"


@pytest.mark.parametrize("toleration, refused", [
    # decisions.nodes.pods.system_tolerations
    ({"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "CriticalAddonsOnly", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
    ({"key": "CriticalAddonsOnly", "value": "true"}, True),                   # operator Equal by default, every effect
    ({"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"}, True),   # any effect: refused anyway
    ({"operator": "Exists"}, True),                                           # every taint
    ({"key": "", "operator": "Exists"}, True),
    ({"operator": "Exists", "effect": "NoSchedule"}, True),
    ({"operator": "Exists", "effect": "NoExecute"}, True),
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, False),   # a pool's
    ({"key": "nvidia.com/gpu", "operator": "Exists"}, False),
    ({"key": "gpu-cloud.io/interruptible", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, False),
    ({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",        # the API server's
      "tolerationSeconds": 300}, False),                                                          # default ones
    ({"key": "criticaladdonsonly", "operator": "Exists"}, False),             # taint keys are case-sensitive
], ids=["system-exists", "system-equal", "system-default-operator", "system-noexecute", "empty-key", "empty-key-string",
        "empty-key-noschedule", "empty-key-noexecute", "gpu", "gpu-exists", "interruptible", "not-ready", "other-case"])
def test_a_toleration_of_the_system_nodes_taint_is_refused(toleration, refused):
    from decisions.nodes.pods import SYSTEM_NODE_TAINT, tolerates

    harmless = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    pod = {"containers": [{"name": "c"}], "tolerations": [harmless, toleration]}
    found = _refusals(pod)
    assert [m for m in found if m.startswith(SYSTEM_REFUSAL)] == found
    assert bool(found) == refused
    if refused:
        assert found[0].endswith("the system nodes run the cluster's add-ons")
    # Whatever lets a pod onto the system nodes, as the scheduler decides, is refused (the rule is stricter on effects).
    assert not tolerates([toleration], SYSTEM_NODE_TAINT) or refused
    assert _refusals({"containers": [{"name": "c"}]}) == _refusals({"containers": [{"name": "c"}], "tolerations": []}) == []


NODE_NAME_REFUSAL = "spec.nodeName may not be set when a pod is created in team namespaces"


@pytest.mark.parametrize("spec, operation, refused", [
    ({"containers": [{"name": "c"}], "nodeName": "ip-10-0-0-1.ec2.internal"}, "CREATE", True),    # past the scheduler
    ({"containers": [{"name": "c"}], "nodeName": "ip-10-0-0-1.ec2.internal"}, "UPDATE", False),   # once bound
    ({"containers": [{"name": "c"}], "nodeName": ""}, "CREATE", False),
    ({"containers": [{"name": "c"}]}, "CREATE", False),
    ({"containers": [{"name": "c"}]}, "UPDATE", False),
], ids=["named-on-create", "named-on-update", "empty-on-create", "unset-on-create", "unset-on-update"])
def test_a_pod_created_on_a_named_node_is_refused(spec, operation, refused):
    """A pod created with spec.nodeName skips the scheduler, and with it the system nodes' NoSchedule taint; every
    update of a scheduled pod carries the nodeName the scheduler bound it to (through pods/binding, which the policy
    does not match) and passes."""
    found = _refusals(spec, operation=operation)
    assert found == ([tenancy.NODE_NAME_MESSAGE] if refused else [])
    if refused:
        assert found[0].startswith(NODE_NAME_REFUSAL) and "spec.nodeName" in found[0]


def test_the_node_name_rule_runs_where_pods_are_created_and_teams_cannot_bind(run):
    """The policy sees pod creates and updates; binding (pods/binding) is neither matched nor granted to a team."""
    spec = run.one(POLICY, "tenancy-host-isolation").inputs["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert {"CREATE", "UPDATE"} <= set(rule["operations"]) and "pods" in rule["resources"]
    assert "pods/binding" not in rule["resources"]
    assert not [r for r in _all_rules(run) if "pods/binding" in r["resources"]]
    assert (tenancy.NODE_NAME_MESSAGE in
            [v["message"] for v in spec["validations"] if "request.operation" in v["expression"]])


def _container(**fields):
    return {"name": "c", **fields}


def _in_each_list(field: str, value, message: str):
    """The same container change in each container list, with the message each list's rule gives."""
    return [({lists: [_container(**{field: value})]}, None, f"{lists}[*]{message}")
            for lists in tenancy.CONTAINER_LISTS]


def _context(**context):
    return dict(securityContext=context)


BASELINE_REFUSALS = "in team namespaces (Pod Security baseline)"
# One refused pod per baseline rule the policy adds: (pod spec, metadata, the start of the one message it gets).
BASELINE_CASES = [
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, None,
     "spec.securityContext.seccompProfile.type other than RuntimeDefault or Localhost"),
    ({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}, None,
     "spec.securityContext.appArmorProfile.type other than RuntimeDefault or Localhost"),
    ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, None, "spec.securityContext.seLinuxOptions with"),
    ({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}, None, "spec.securityContext.seLinuxOptions with"),
    ({"securityContext": {"seLinuxOptions": {"role": "system_r"}}}, None, "spec.securityContext.seLinuxOptions with"),
    ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, None,
     "spec.securityContext.windowsOptions.hostProcess"),
    ({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"},
                                      {"name": "kernel.msgmax", "value": "65536"}]}}, None,
     "spec.securityContext.sysctls may set only these"),
    ({}, {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}},
     "metadata.annotations container.apparmor.security.beta.kubernetes.io/*"),
    *_in_each_list("securityContext", {"seccompProfile": {"type": "Unconfined"}},
                   ".securityContext.seccompProfile.type other than RuntimeDefault or Localhost"),
    *_in_each_list("securityContext", {"appArmorProfile": {"type": "Unconfined"}},
                   ".securityContext.appArmorProfile.type other than RuntimeDefault or Localhost"),
    *_in_each_list("securityContext", {"seLinuxOptions": {"level": "s0:c1,c2", "type": "unconfined_t"}},
                   ".securityContext.seLinuxOptions with"),
    *_in_each_list("securityContext", {"windowsOptions": {"hostProcess": True}},
                   ".securityContext.windowsOptions.hostProcess"),
    *_in_each_list("securityContext", {"procMount": "Unmasked"}, ".securityContext.procMount other than Default"),
    *_in_each_list("readinessProbe", {"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}},
                   " probes and lifecycle handlers may not name a host"),
    *_in_each_list("lifecycle", {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}},
                   " probes and lifecycle handlers may not name a host"),
]
# Pod Security baseline's safe sysctls as of Kubernetes 1.32 (Pod Security Standards, "Baseline", Sysctls), written
# out rather than read from tenancy.SAFE_SYSCTLS so that a shorter list there fails.
BASELINE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")
# What baseline allows stays allowed: the profiles it names, SELinux's container types and level, the safe sysctls,
# the AppArmor annotations' allowed values, probes on the pod's own address.
BASELINE_ALLOWED = {
    "containers": [_container(
        securityContext={"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
                         "appArmorProfile": {"type": "Localhost", "localhostProfile": "p"},
                         "seLinuxOptions": {"type": "container_engine_t", "level": "s0:c1,c2"},
                         "windowsOptions": {"hostProcess": False}, "procMount": "Default"},
        livenessProbe={"httpGet": {"path": "/health", "port": 8000, "host": ""}},
        readinessProbe={"tcpSocket": {"port": 8001}}, lifecycle={"preStop": {"sleep": {"seconds": 5}}})],
    "initContainers": [_container(securityContext={"seccompProfile": {"type": "RuntimeDefault"},
                                                   "appArmorProfile": {"type": "RuntimeDefault"},
                                                   "seLinuxOptions": {"type": "container_t", "user": "", "role": ""}})],
    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "appArmorProfile": {"type": "RuntimeDefault"},
                        "seLinuxOptions": {"type": "container_init_t"},
                        "sysctls": [{"name": name, "value": "1"} for name in BASELINE_SYSCTLS]},
    "ephemeralContainers": [_container(securityContext={"seLinuxOptions": {"type": "container_kvm_t"}})],
}
BASELINE_ALLOWED_METADATA = {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "runtime/default",
                                             "container.apparmor.security.beta.kubernetes.io/d": "localhost/p",
                                             "container.apparmor.security.beta.kubernetes.io/e": "",
                                             "example.com/other": "unconfined"}}


def test_what_pod_security_baseline_allows_is_admitted():
    assert _refusals(BASELINE_ALLOWED, metadata=BASELINE_ALLOWED_METADATA) == []
    assert _refusals(BASELINE_ALLOWED, operation="UPDATE", metadata=BASELINE_ALLOWED_METADATA) == []


@pytest.mark.parametrize("change, metadata, refused", BASELINE_CASES,
                         ids=[f"{i}-{refused.split()[0]}" for i, (_, _, refused) in enumerate(BASELINE_CASES)])
def test_each_rest_of_pod_security_baseline_is_refused(change, metadata, refused):
    """Each baseline rule the policy adds for training (which has no Pod Security label), in each container list."""
    pod = {"containers": [_container()], **change}
    (message,) = _refusals(pod, metadata=metadata)
    assert message.startswith(refused) and BASELINE_REFUSALS in message, message
    assert _refusals(pod, operation="UPDATE", metadata=metadata) == [message]     # creates and updates alike


def test_every_host_isolation_rule_has_a_pod_it_refuses():
    """One refused pod per rule (a rule no case breaks could be dropped or broken unseen)."""
    messages = [message for _, message in tenancy.host_isolation_validations()]
    assert len(set(messages)) == len(messages)
    base = {"containers": [_container()]}
    refused = {m for change, _ in HOST_CASES for m in _refusals({**base, **change})}
    refused |= {m for change, metadata, _ in BASELINE_CASES for m in _refusals({**base, **change}, metadata=metadata)}
    refused |= set(_refusals({**base, "tolerations": [{"operator": "Exists"}]}))
    refused |= set(_refusals({**base, "nodeName": "ip-10-0-0-1.ec2.internal"}))
    refused |= {m for lists in ("initContainers", "ephemeralContainers") for m in _refusals(
        {**base, lists: [_container(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}, "privileged": True},
                                    ports=[{"containerPort": 80, "hostPort": 80}])]})}
    refused |= set(_refusals({**base, "containers": [_container(
        ports=[{"containerPort": 80, "hostPort": 80}], securityContext={"capabilities": {"add": ["NET_ADMIN"]}})]}))
    assert sorted(set(messages) - refused) == []


def _team_pod_specs(run):
    """(where, pod spec) of every pod template the program registers in a team namespace, and of the MPIJobs its
    across-node starters create."""
    return [(where, spec) for where, _, spec in _team_pod_templates(run)]


def _team_pod_templates(run):
    """(where, pod metadata, pod spec) of what _team_pod_specs lists."""
    for resource in run.resources:
        template = _pod_template(resource)
        if template is None or resource.inputs["metadata"].get("namespace") not in tenancy.TEAM_NAMESPACES:
            continue
        spec = resource.inputs["spec"]
        outer = spec["jobTemplate"]["spec"] if resource.type.endswith(":CronJob") else spec
        yield f"{run.stack}/{resource.name}", outer["template"].get("metadata") or {}, template
        for container in template["containers"]:
            for env in container.get("env") or []:
                if env["name"] == "MPIJOB":
                    for role, replica in json.loads(env["value"])["spec"]["mpiReplicaSpecs"].items():
                        yield (f"{run.stack}/{resource.name} MPIJOB nccl-efa-{role.lower()}",
                               replica["template"].get("metadata") or {}, replica["template"]["spec"])


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1", "dev"])
def test_the_programs_own_team_pods_stay_off_the_system_nodes(stack_runs, stack):
    """Triton, the NCCL CronJobs (the across-node starter included) and the MPIJobs the starter creates pass every
    host isolation rule, the system toleration's among them, and none selects the system nodes."""
    run = stack_runs[stack]
    found = list(_team_pod_specs(run))
    assert found or stack == "dev"      # dev runs no Triton and no NCCL checks
    # Nothing else starts pods there: no chart is installed into a team namespace, no other kind of workload.
    assert not [r.name for r in run.of_type("kubernetes:helm.sh/v3:Release")
                if r.inputs["namespace"] in tenancy.TEAM_NAMESPACES]
    workloads = ("Deployment", "Job", "CronJob", "DaemonSet", "StatefulSet", "Pod", "ReplicaSet")
    assert not [r.name for r in run.resources if r.type.startswith("kubernetes:") and r.type.endswith(workloads)
                and _pod_template(r) is None and (r.inputs.get("metadata") or {}).get("namespace")
                in tenancy.TEAM_NAMESPACES]
    for where, pod in found:
        assert _refusals(pod) == [], where
        assert not (pod.get("nodeSelector") or {}).items() >= SYSTEM_NODE_LABELS.items(), where
    # With their pod metadata (the AppArmor annotations), as created and as later updated.
    for where, metadata, pod in _team_pod_templates(run):
        assert _refusals(pod, metadata=metadata) == _refusals(pod, operation="UPDATE", metadata=metadata) == [], where
    names = {where.split("/", 1)[1] for where, _ in found}
    if stack == "prod-us-east-1":
        assert {"inference-deployment", "training-nccl-efa-start-train-h100",
                "training-nccl-efa-start-train-h100 MPIJOB nccl-efa-worker",
                "training-nccl-efa-start-train-h100 MPIJOB nccl-efa-launcher"} <= names, sorted(names)
        assert any(name.startswith("training-nccl-nvlink-") for name in names)


def test_the_job_templates_pass_host_isolation():
    """What `python -m jobs` renders for every pool of every stack (the single-node Job, the MPI and PyTorch templates,
    the NCCL acceptance MPIJob), all of it for the training namespace."""
    from tests.test_pod_security import template_pod_specs

    found = list(template_pod_specs())
    assert {workload for _, workload, _ in found} == {
        "single-node-job", "nccl-efa-launcher", "nccl-efa-worker", "training-mpijob-launcher",
        "training-mpijob-worker", "pytorch-jobset"}
    assert [(where, workload) for where, workload, pod in found if _refusals(pod)] == []


def test_the_api_server_refuses_team_services_with_external_ips(run):
    _assert_tenant_policy(run, "tenancy-no-external-ips", tenancy.SERVICE_EXTERNAL_IPS_POLICY, ["services"],
                          tenancy.service_validations())


def _service_refusals(service_spec) -> List[str]:
    return _cel_refusals("Service", service_spec, tenancy.service_validations())


@pytest.mark.parametrize("service_spec, refused", [
    ({"type": "ClusterIP", "ports": [{"port": 80}]}, False),
    ({"type": "ClusterIP", "ports": [{"port": 80}], "externalIPs": []}, False),
    ({"type": "ClusterIP", "ports": [{"port": 80}], "externalIPs": ["169.254.169.254"]}, True),
    ({"type": "LoadBalancer", "ports": [{"port": 80}], "externalIPs": ["10.0.0.1", "10.0.0.2"]}, True),
], ids=["none", "empty", "one", "two-on-a-load-balancer"])
def test_a_service_with_external_ips_is_refused_and_others_pass(service_spec, refused):
    assert _service_refusals(service_spec) == (
        ["spec.externalIPs is not allowed in team namespaces (CVE-2020-8554)"] if refused else [])


def test_the_programs_own_team_services_pass(stack_runs):
    services = [r for r in stack_runs["prod-us-east-1"].of_type("kubernetes:core/v1:Service")
                if r.inputs["metadata"].get("namespace") in tenancy.TEAM_NAMESPACES]
    assert services
    for service in services:
        assert _service_refusals(service.inputs["spec"]) == [], service.name


def test_cpu_memory_quota_and_limit_range_objects_in_their_namespace(run):
    for namespace in tenancy.TEAM_NAMESPACES:
        quotas = {r.inputs["metadata"]["name"]: r for r in _in(run, QUOTA, namespace)}
        assert set(quotas) == {"gpu", "cpu-memory"}
        assert quotas["cpu-memory"].inputs["spec"] == {"hard": tenancy.cpu_memory_quotas(POOLS)[namespace]}
        (limits,) = _in(run, "kubernetes:core/v1:LimitRange", namespace)
        defaults = tenancy.container_defaults(POOLS, namespace)
        assert limits.inputs["spec"] == {"limits": [{"type": "Container", **defaults}]}
        assert run.one(NAMESPACE, f"tenancy-{namespace}").urn in limits.dependencies


def test_a_namespace_without_pools_gets_no_limit_range():
    training_only = (POOLS[0], POOLS[1])
    run = run_component(_build(gpu_quotas=tenancy.gpu_quotas(training_only),
                               cpu_memory_quotas=tenancy.cpu_memory_quotas(training_only),
                               container_defaults=tenancy.team_container_defaults(training_only)))
    assert [r.inputs["metadata"]["namespace"] for r in run.of_type("kubernetes:core/v1:LimitRange")] == ["training"]


def test_quota_objects_carry_the_sized_quotas_in_their_namespace(run):
    for namespace in tenancy.TEAM_NAMESPACES:
        quota, = [q for q in _in(run, QUOTA, namespace) if q.inputs["metadata"]["name"] == "gpu"]
        assert quota.inputs["spec"] == {"hard": tenancy.gpu_quotas(POOLS)[namespace]}
        assert run.one(NAMESPACE, f"tenancy-{namespace}").urn in quota.dependencies


TEAM_ROLE_RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods", "services", "configmaps"],
     "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events", "resourcequotas"], "verbs": ["get", "list", "watch"]},
]


def test_each_team_role_grants_exactly_its_jobs_and_pods_in_its_namespace(run):
    for namespace in tenancy.TEAM_NAMESPACES:
        role, = _in(run, ROLE, namespace)
        assert role.inputs["rules"] == TEAM_ROLE_RULES
        binding, = _in(run, ROLE_BINDING, namespace)
        assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                             "name": role.inputs["metadata"]["name"]}
        assert binding.inputs["subjects"] == [{"kind": "Group", "name": f"gpu-cloud:{namespace}",
                                               "apiGroup": "rbac.authorization.k8s.io"}]


def test_no_rule_reaches_secrets_exec_or_privilege(run):
    for rule in _all_rules(run):
        fields = rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert "*" not in fields, f"wildcard in {rule}"
        assert not {"secrets", "pods/exec", "pods/attach", "pods/portforward", "pods/ephemeralcontainers",
                    "pods/binding", "roles", "rolebindings", "clusterroles", "clusterrolebindings", "serviceaccounts/token",
                    "namespaces", "resourcequotas/status"} & set(rule["resources"]), rule
        assert not {"escalate", "bind", "impersonate", "update", "patch", "deletecollection"} & set(rule["verbs"]), rule


def test_the_only_cluster_wide_grant_is_reading_nodes(run):
    cluster_role = run.one(CLUSTER_ROLE)
    assert cluster_role.inputs["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    binding = run.one(CLUSTER_ROLE_BINDING)
    assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                         "name": cluster_role.inputs["metadata"]["name"]}
    assert [s["name"] for s in binding.inputs["subjects"]] == ["gpu-cloud:training", "gpu-cloud:inference"]
    # Namespaced bindings reference their own Role: a RoleBinding to a ClusterRole such as admin or edit
    # would grant whatever that role holds.
    refs = [r.inputs["roleRef"] for r in run.of_type(ROLE_BINDING) + run.of_type(CLUSTER_ROLE_BINDING)]
    assert not [ref for ref in refs if ref["name"] in ("cluster-admin", "admin", "edit")]
    assert [ref["kind"] for ref in refs].count("ClusterRole") == 1
    subjects = [s for r in run.of_type(ROLE_BINDING) + run.of_type(CLUSTER_ROLE_BINDING) for s in r.inputs["subjects"]]
    assert {s["kind"] for s in subjects} == {"Group"}
    assert not [s for s in subjects if s["name"].startswith("system:")]


def test_access_entries_depend_on_the_cluster_and_only_name_groups(run):
    cluster = run.one(EKS_CLUSTER)
    entries = {r.inputs["principalArn"]: r for r in run.of_type(ACCESS_ENTRY)}
    assert {arn: e.inputs["kubernetesGroups"] for arn, e in entries.items()} == {
        TRAIN_ROLE: ["gpu-cloud:training"], SERVE_ROLE: ["gpu-cloud:inference"],
        SHARED_ROLE: ["gpu-cloud:training", "gpu-cloud:inference"]}
    for entry in entries.values():
        assert entry.inputs["type"] == "STANDARD"
        assert entry.inputs["clusterName"] == CLUSTER
        assert cluster.urn in entry.dependencies, "an access entry created before the cluster fails"
    assert not run.of_type(ACCESS_POLICY), "teams get RBAC through their group, never an EKS access policy"


def test_default_deny_covers_every_pod_in_both_directions_in_both_namespaces(run):
    for namespace in tenancy.TEAM_NAMESPACES:
        assert _policies(run, namespace)["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def _ports(*ports, protocol="TCP"):
    return [{"protocol": protocol, "port": port} for port in ports]


ALLOWED_IN_EVERY_NAMESPACE = {
    "allow-dns": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
        "ports": _ports(53, protocol="UDP") + _ports(53)}]},
    "allow-aws-apis": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": _ports(443)},
        {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}], "ports": _ports(80)}]},
}
FROM_MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
WITHIN_NAMESPACE = [{"podSelector": {}}]


def test_training_allows_exactly_dns_aws_scrapes_and_nccl_within_the_namespace(run):
    assert _policies(run, "training") == {
        "default-deny": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        **ALLOWED_IN_EVERY_NAMESPACE,
        "allow-prometheus-scrape": {"podSelector": {}, "policyTypes": ["Ingress"],
                                    "ingress": [{"from": FROM_MONITORING, "ports": _ports(9090)}]},
        "allow-nccl": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                       "ingress": [{"from": WITHIN_NAMESPACE, "ports": [{"protocol": "TCP"}]}],
                       "egress": [{"to": WITHIN_NAMESPACE, "ports": [{"protocol": "TCP"}]}]},
    }


def test_inference_allows_exactly_dns_aws_scrapes_and_triton_from_the_vpc(run):
    assert _policies(run, "inference") == {
        "default-deny": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        **ALLOWED_IN_EVERY_NAMESPACE,
        "allow-prometheus-scrape": {"podSelector": {}, "policyTypes": ["Ingress"],
                                    "ingress": [{"from": FROM_MONITORING, "ports": _ports(8002, 9090)}]},
        "allow-triton-from-vpc": {"podSelector": {}, "policyTypes": ["Ingress"],
                                  "ingress": [{"from": [{"ipBlock": {"cidr": VPC_CIDR}}],
                                               "ports": _ports(8000, 8001, 8002)}]},
    }


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one(COMPONENT, "tenancy")
    children = run.children_of(component.urn)
    others = [r for r in run.resources if r not in children and r.type not in (COMPONENT, K8S_PROVIDER, EKS_CLUSTER)]
    assert not others, f"registered outside the component: {[r.name for r in others]}"
    assert all(r.name.startswith("tenancy-") for r in children)
    k8s = run.one(K8S_PROVIDER).urn
    assert all(r.provider.startswith(k8s) for r in children if r.type.startswith("kubernetes:"))


@pytest.mark.parametrize("overrides,words", [
    ({"gpu_quotas": {"training": {"requests.nvidia.com/gpu": "8"}}}, "gpu_quotas must have exactly"),
    ({"cpu_memory_quotas": {"inference": {"requests.cpu": "8"}}}, "cpu_memory_quotas must have exactly"),
    ({"container_defaults": {"training": None}}, "container_defaults must have exactly"),
    ({"vpc_cidr": "10.64.0.1/16"}, "host bits"),
    ({"team_role_arns": {"inference": [ADMIN_ROLE]}}, "cluster-admin access entry"),
], ids=["quota-missing-a-namespace", "cpu-memory-quota-missing-a-namespace", "defaults-missing-a-namespace",
        "vpc-cidr-with-host-bits", "team-role-is-admin"])
def test_bad_arguments_fail_before_anything_is_registered(overrides, words):
    raised = []
    build = _build(**overrides)

    def guarded():
        try:
            build()
        except ValueError as error:
            raised.append(str(error))
    run = run_component(guarded)
    assert len(raised) == 1 and words in raised[0]
    assert not run.of_type(COMPONENT) and not [r for r in run.resources if r.type.startswith("kubernetes:")
                                               and r.type != K8S_PROVIDER]
    assert not run.of_type(ACCESS_ENTRY)


def test_policy_rules_without_their_direction_are_refused():
    with pytest.raises(ValueError, match="Egress rules without Egress"):
        tenancy.NetworkPolicyRules("broken", ("Ingress",),
                                   egress=(tenancy.TrafficRule((tenancy.Pods(),), (tenancy.Port("TCP"),)),))


# --- the system nodes: tainted, and every workload placed there tolerates it ---------------------------------------
# Every pod that cannot go to a GPU node (it selects the system nodes, or does not tolerate the GPU taint that every
# GPU node carries) runs on the system nodes, and must select them and tolerate their taint. Where each chart the
# program installs puts the pod spec of each Deployment, Job or StatefulSet it renders (from its pinned values.yaml and
# templates): chart -> {workload: (nodeSelector path, tolerations path)}. DaemonSets are left out: they run on every
# node they tolerate, and the ones on the system nodes tolerate every taint (decisions/nodes/pods.py, docs/tenancy.md).
CHART_WORKLOADS = {
    "aws-load-balancer-controller": {"controller": ("nodeSelector", "tolerations")},
    "cluster-autoscaler": {"autoscaler": ("nodeSelector", "tolerations")},
    "aws-node-termination-handler": {"queue-processor": ("nodeSelector", "tolerations")},
    "prometheus-adapter": {"adapter": ("nodeSelector", "tolerations")},
    "kueue": {"controller-manager": ("controllerManager.nodeSelector", "controllerManager.tolerations")},
    "aws-fsx-csi-driver": {"controller": ("controller.nodeSelector", "controller.tolerations")},
    "gpu-operator": {"operator": ("operator.nodeSelector", "operator.tolerations"),
                     "nfd-master": ("node-feature-discovery.master.nodeSelector",
                                    "node-feature-discovery.master.tolerations"),
                     "nfd-gc": ("node-feature-discovery.gc.nodeSelector", "node-feature-discovery.gc.tolerations")},
    "kube-prometheus-stack": {
        "operator": ("prometheusOperator.nodeSelector", "prometheusOperator.tolerations"),
        "webhook-patch-job": ("prometheusOperator.admissionWebhooks.patch.nodeSelector",
                              "prometheusOperator.admissionWebhooks.patch.tolerations"),
        "prometheus": ("prometheus.prometheusSpec.nodeSelector", "prometheus.prometheusSpec.tolerations"),
        "alertmanager": ("alertmanager.alertmanagerSpec.nodeSelector", "alertmanager.alertmanagerSpec.tolerations"),
        "grafana": ("grafana.nodeSelector", "grafana.tolerations"),
        "kube-state-metrics": ("kube-state-metrics.nodeSelector", "kube-state-metrics.tolerations")},
    "aws-efa-k8s-device-plugin": {},      # a DaemonSet on EFA nodes only
}
# EKS add-ons that run Deployments: add-on -> where its configurationValues hold the pod placement.
ADDON_WORKLOADS = {"coredns": (), "aws-ebs-csi-driver": ("controller",)}


def _at(values, dotted: str, default):
    for key in dotted.split("."):
        if not isinstance(values, dict) or key not in values:
            return default
        values = values[key]
    return values


def _placed_on_system_nodes(where: str, node_selector, tolerations) -> bool:
    """Asserts a pod that cannot run on GPU nodes selects the system nodes and tolerates their taint; True if so."""
    from decisions.nodes.pods import SYSTEM_NODE_LABELS, SYSTEM_NODE_TAINT, tolerates
    from decisions.nodes.pools import GPU_TAINT, Taint

    node_selector = node_selector or {}
    on_system = node_selector.items() >= SYSTEM_NODE_LABELS.items() or not tolerates(tolerations, Taint(*GPU_TAINT))
    if on_system:
        assert node_selector.items() >= SYSTEM_NODE_LABELS.items(), f"{where}: does not select the system nodes"
        assert tolerates(tolerations, SYSTEM_NODE_TAINT), f"{where}: does not tolerate {SYSTEM_NODE_TAINT}"
    return on_system


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1", "dev"])
def test_every_workload_on_the_system_nodes_tolerates_their_taint(stack_runs, stack):
    from decisions.catalog import charts
    from tests.chart_values import merged_values

    run, placed = stack_runs[stack], []
    group = run.one("aws:eks/nodeGroup:NodeGroup")
    assert group.inputs["taints"] == [{"key": "CriticalAddonsOnly", "value": "true", "effect": "NO_SCHEDULE"}]
    # The program's own Deployments, Jobs and CronJobs, the release manifests' Deployments among them.
    for resource in run.resources:
        template = _pod_template(resource)
        if template is not None and _placed_on_system_nodes(resource.name, template.get("nodeSelector"),
                                                            template.get("tolerations")):
            placed.append(resource.name)
    # Helm releases: the chart's own values with the program's over them.
    pins = {pin.chart.rsplit("/", 1)[-1]: pin for pin in charts.load_charts().charts.values()}
    for release in run.of_type("kubernetes:helm.sh/v3:Release"):
        chart = release.inputs["chart"].rsplit("/", 1)[-1]
        assert chart in CHART_WORKLOADS, f"{chart}: say where its workloads run (CHART_WORKLOADS)"
        values = merged_values(pins[chart], release.inputs["values"])
        for workload, (selector, tolerations) in CHART_WORKLOADS[chart].items():
            if _placed_on_system_nodes(f"{chart} {workload}", _at(values, selector, {}), _at(values, tolerations, [])):
                placed.append(f"{chart} {workload}")
    # EKS add-ons.
    for addon in run.of_type("aws:eks/addon:Addon"):
        name = addon.inputs["addonName"]
        if name in ADDON_WORKLOADS:
            config = json.loads(addon.inputs["configurationValues"])
            for key in ADDON_WORKLOADS[name]:
                config = config[key]
            assert _placed_on_system_nodes(name, config.get("nodeSelector"), config.get("tolerations"))
            placed.append(name)
    # Every chart workload in the table is a system-node one; so are these, in every stack.
    releases = {r.inputs["chart"].rsplit("/", 1)[-1] for r in run.of_type("kubernetes:helm.sh/v3:Release")}
    expected = {"coredns", "aws-ebs-csi-driver", "training-operators-webhook-ready",
                "training-operators-mpi-operator:mpi-operator/mpi-operator",
                "training-operators-jobset:jobset-system/jobset-controller-manager",
                *(f"{chart} {w}" for chart in releases for w in CHART_WORKLOADS[chart])}
    assert {"cluster-autoscaler", "kueue", "gpu-operator", "kube-prometheus-stack"} <= releases
    assert expected <= set(placed), sorted(expected - set(placed))


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1", "dev"])
def test_gpu_pools_do_not_carry_the_system_taint(stack, stack_runs):
    from decisions.nodes.pods import SYSTEM_NODE_TAINT
    from decisions.nodes.pools import node_taints

    config = stack_config(stack)
    spec = load_stack_spec(project_keys(config), stack=stack, region=config["aws:region"])
    assert spec.pools
    for pool in spec.pools:
        assert SYSTEM_NODE_TAINT.key not in {t.key for t in node_taints(pool)}, pool.name
    # Nor does anything the pools register with: no autoscaler node template, user-data or tag names it.
    nodepools = [r for r in stack_runs[stack].resources if r.type.startswith("gpu-cloud:nodepool")]
    children = [r for r in stack_runs[stack].resources if r.parent in {n.urn for n in nodepools}]
    assert children and not [r.name for r in children if SYSTEM_NODE_TAINT.key in json.dumps(r.inputs)]


@pytest.mark.parametrize("stack", ["prod-us-east-1", "dev"])
def test_a_team_namespaces_delete_outlasts_its_pods_grace(stack_runs, stack):
    """A destroy deletes a team namespace while a job may still be checkpointing (up to the workload contract's
    780 s, decisions/nodes/drain.py): the provider's default 10 minutes would fail it mid-grace."""
    from decisions.nodes.drain import WORKLOAD_MAX_GRACE_S

    namespaces = [r for r in stack_runs[stack].of_type(NAMESPACE) if r.name.startswith("tenancy-")]
    assert len(namespaces) == 2
    for namespace in namespaces:
        seconds = int(namespace.delete_timeout.removesuffix("s"))
        assert seconds == WORKLOAD_MAX_GRACE_S + 600 > 600, namespace.name
