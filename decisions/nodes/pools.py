"""What a GPU node pool is, as plain values: Kubernetes labels and taints, autoscaler tags, priorities,
instance-refresh pacing and the verifier's expectations. components/nodes/nodepool.py turns these into resources.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from decisions.catalog.catalog import load_catalog
from decisions.config.model import ACCELERATOR_LABEL, REPLICATED_MODES
from decisions.nodes.efa import efa_device_count

GPU_TAINT = ("nvidia.com/gpu", "true", "NoSchedule")
LABEL_PREFIX = "gpu-cloud.io/"
# Spot nodes take only work that says it may be interrupted, by tolerating this taint. Kueue's spot flavors
# list it as a node taint (decisions/platform/kueue.py), so only such jobs are admitted to spot; others skip to
# on-demand.
INTERRUPTIBLE_TAINT = (f"{LABEL_PREFIX}interruptible", "true", "NoSchedule")
CA_PREFIX = "k8s.io/cluster-autoscaler"
TEMPLATE_LABEL_PREFIX = f"{CA_PREFIX}/node-template/label/"
TEMPLATE_TAINT_PREFIX = f"{CA_PREFIX}/node-template/taint/"
TEMPLATE_RESOURCE_PREFIX = f"{CA_PREFIX}/node-template/resources/"
ASG_TAG_KEY_MAX = 128     # EC2 Auto Scaling tag keys: 1 to 128 characters

# Names the node's pool; each Kueue flavor selects its pool's nodes by it (decisions/platform/kueue.py).
POOL_LABEL = f"{LABEL_PREFIX}pool"
QUEUE_WORKLOADS = ("training", "general")   # pools whose nodes the training queue (Kueue) places jobs on
# Spelt once for decisions/platform/kueue.py and the job templates (mpijob, jobset, single_job, acceptance), here
# because kueue imports acceptance, which imports mpijob: neither can import the other's. The label a job names its
# LocalQueue by (kubernetes-sigs/kueue v0.19.2 pkg/controller/constants/constants.go:23), and the EFA device plugin's
# resource.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# Priority-expander weights (higher wins): capacity that is already paid for first, then spot, then on-demand.
DEFAULT_PRIORITY = {"reserved": 50, "capacity-block": 50, "spot": 30, "on-demand": 10}


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class RefreshPreferences:
    min_healthy_percentage: int
    max_healthy_percentage: int


def asg_name(cluster_name: str, pool_name: str) -> str:
    """Fixed physical ASG name: the autoscaler's priorities and the drain handler refer to it."""
    return f"{cluster_name}-{pool_name}"


def asg_arn_pattern(partition: str, region: str, account_id: str, asg: str) -> str:
    """Every ARN an ASG of this name can have (the ARN embeds a UUID known only after creation): IAM grants
    name the group by it, so they can exist before the group and outlive it."""
    return f"arn:{partition}:autoscaling:{region}:{account_id}:autoScalingGroup:*:autoScalingGroupName/{asg}"


def gpu_model_label(model: str) -> str:
    """'A100 40GB' -> 'A100-40GB' (label values allow no spaces)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", model)


def accelerator_label(model: str) -> str:
    """'A100 40GB' -> 'nvidia-a100-40gb', the value for k8s.amazonaws.com/accelerator."""
    return "nvidia-" + gpu_model_label(model).lower()


def node_labels(pool) -> Dict[str, str]:
    """Labels every node of the pool registers with (pool: a decisions.config.stack.ResolvedPool). The pool's types
    share one GPU shape (decisions/config/validate.py), so one set of labels describes every node."""
    s, itype = pool.spec, pool.primary_type
    labels = {
        ACCELERATOR_LABEL: accelerator_label(itype.gpu.model),
        POOL_LABEL: s.name,
        f"{LABEL_PREFIX}capacity": s.capacity,
        f"{LABEL_PREFIX}workload": s.workload,
        f"{LABEL_PREFIX}gpu-model": gpu_model_label(itype.gpu.model),
        f"{LABEL_PREFIX}gpu-count": str(itype.gpu.count),
        f"{LABEL_PREFIX}efa": str(pool.efa).lower(),
    }
    sharing = s.gpu_sharing
    if sharing.mode == "mig":
        labels[MIG_CONFIG_LABEL] = mig_config_name(mig_layout(pool, load_catalog()))
    elif sharing.mode in REPLICATED_MODES:
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = device_plugin_config_name(sharing.mode, sharing.replicas)
    return {**labels, **dict(s.labels)}


def toleration(taint: Taint) -> Dict[str, str]:
    """The pod toleration that matches exactly this taint."""
    return {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}


def queue_flavor(pool) -> Optional[str]:
    """The Kueue ResourceFlavor of the pool's nodes: one per pool the training queue uses, named as the pool and
    selecting its nodes by POOL_LABEL (decisions/platform/kueue.py); None for pools the queue does not use
    (inference)."""
    return pool.spec.name if pool.spec.workload in QUEUE_WORKLOADS else None


def node_taints(pool) -> Tuple[Taint, ...]:
    """The GPU taint, the interruptible taint on spot pools, then the pool's own taints."""
    spot = (Taint(*INTERRUPTIBLE_TAINT),) if pool.spec.capacity == "spot" else ()
    return (Taint(*GPU_TAINT),) + spot + tuple(Taint(t.key, t.value, t.effect) for t in pool.spec.taints)


GPU_RESOURCE = "nvidia.com/gpu"

# The labels that pick a node's sharing: the device plugin's config-manager selects its entry of the plugin's
# ConfigMap by the first, the MIG manager the layout it cuts the GPUs into by the second
# (decisions/platform/gpu_operator.py).
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
# MPS limits each client to 1/replicas of a GPU's memory, and the plugin's MPS daemon takes up to 48 clients from
# compute capability 7.5 (Turing) on, 16 below (NVIDIA/k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/
# device.go lines 43-55). Every catalog GPU is Turing or newer; an older one is refused rather than given 16.
MPS_ARCHITECTURES = ("turing", "ampere", "ada", "hopper", "blackwell")


def device_plugin_config_name(mode: str, replicas: int) -> str:
    """The device-plugin config a time-slicing or MPS pool's nodes select: 'time-slicing-4', 'mps-8'."""
    return f"{mode}-{replicas}"


def mig_resource(profile: str) -> str:
    """The extended resource the device plugin advertises a MIG instance as under the mixed strategy."""
    return f"nvidia.com/mig-{profile}"


def mig_layout(pool, catalog) -> Dict[str, int]:
    """Instances of each MIG profile on every GPU of a MIG pool: its migProfiles, or its migProfile as many times as
    fit on its GPU (decisions/catalog/catalog.yaml migProfiles)."""
    sharing = pool.spec.gpu_sharing
    if sharing.mig_profiles is not None:
        return dict(sharing.mig_profiles)
    return {sharing.mig_profile: catalog.gpus[pool.primary_type.gpu.model].mig_profiles[sharing.mig_profile]}


def mig_config_name(layout: Mapping[str, int]) -> str:
    """The MIG manager config that cuts every GPU into `layout`, named by it ({'3g.40gb': 1, '1g.10gb': 2} ->
    '1g.10gbx2-3g.40gbx1'): pools with one layout share a config, and a node's label says what its GPUs hold."""
    return "-".join(f"{profile}x{count}" for profile, count in sorted(layout.items()))


def offered_gpu_resources(pool, catalog) -> Dict[str, int]:
    """GPU resources one node of `pool` offers to pods, by resource name, as the device plugin advertises them:
    GPUs; GPUs x replicas under time-slicing and MPS (still `nvidia.com/gpu`: decisions/platform/gpu_operator.py says
    why); or (MIG, mixed strategy) per profile of the pool's layout, GPUs x its instances per GPU."""
    sharing, gpus = pool.spec.gpu_sharing, pool.gpus_per_node
    if sharing.mode == "mig":
        return {mig_resource(profile): gpus * count for profile, count in mig_layout(pool, catalog).items()}
    if sharing.mode in REPLICATED_MODES:
        return {GPU_RESOURCE: gpus * sharing.replicas}
    return {GPU_RESOURCE: gpus}


def slot_memory_mib(pool, resource: str) -> int:
    """GPU memory one slot of `resource` on `pool` may count on: a MIG instance its profile's (the nominal GB in its
    name, 1g.10gb); a shared GPU its share (MPS enforces it; time-slices share the memory unguarded, so a model sized
    for one must fit its share); else the whole GPU's."""
    gpu_mib, replicas = pool.primary_type.gpu.memory_mib, pool.spec.gpu_sharing.replicas
    if resource.startswith(mig_resource("")):
        return int(re.search(r"\.(\d+)gb$", resource)[1]) * 1024
    return gpu_mib // replicas if replicas else gpu_mib


def efa_devices(pool) -> int:
    return efa_device_count(pool.primary_type, efa=pool.efa)


def autoscaler_priority(pool) -> int:
    return pool.spec.autoscaler_priority or DEFAULT_PRIORITY[pool.spec.capacity]


def cluster_ownership_tag(cluster_name: str) -> Dict[str, str]:
    """The tag the EKS guide for self-managed nodes puts on every node instance."""
    return {f"kubernetes.io/cluster/{cluster_name}": "owned"}


def refresh_preferences(pool) -> RefreshPreferences:
    """Instance-refresh pacing. Reserved and capacity-block pools have no spare capacity to launch into,
    so they never go above 100% and replace one node at a time; the others surge first."""
    if pool.spec.reserved_capacity:
        nodes = max(pool.spec.desired_nodes, 1)
        return RefreshPreferences(min_healthy_percentage=(nodes - 1) * 100 // nodes, max_healthy_percentage=100)
    return RefreshPreferences(min_healthy_percentage=90, max_healthy_percentage=120)


def launches_first(pool, reservations: Mapping[str, object]) -> bool:
    """Whether the pool's replacements launch before the instance they replace terminates (issue #38 item 5): only a
    reserved or capacity-block pool whose reservation, as the account reports it (`reservations`:
    decisions.network.zones.AccountZones.reservations), holds more instances than the pool's maxNodes. Its nodes
    launch only into the reservation (capacity-reservations-only), so without that spare slot a replacement can only
    launch once the old instance is gone. Spot and on-demand pools keep the group's default, terminate and launch at
    once (EC2 Auto Scaling User Guide, "Instance maintenance policy for Auto Scaling group"), which already starts
    the replacement without waiting for the old instance."""
    found = reservations.get(pool.spec.capacity_reservation_id or "")
    count = getattr(found, "instance_count", None)
    return bool(pool.spec.reserved_capacity and count is not None and count > pool.spec.max_nodes)


def launch_first_policy(pool) -> Tuple[int, int]:
    """The group's instance maintenance policy (min, max healthy percentage of the desired capacity) for a pool that
    launches first: never fewer healthy instances than desired while one is replaced, and room for exactly one more
    (Auto Scaling allows 100 to 200 for the maximum: API_InstanceMaintenancePolicy)."""
    nodes = max(pool.spec.desired_nodes, 1)
    return 100, min(200, 100 + -(-100 // nodes))


def verify_expectations(pool, image, max_temp_c: int, catalog) -> Dict[str, Dict[str, object]]:
    """EXPECT.json for userdata/gpu_verify.py per instance type of the pool: what such a node must be
    (image: the stack's decisions.nodes.amis.NodeImage, whose driver the node must run)."""
    return {itype.name: _expectation(itype, pool, image, max_temp_c, catalog) for itype in pool.types}


def _expectation(itype, pool, image, max_temp_c: int, catalog) -> Dict[str, object]:
    gpu = catalog.gpus[itype.gpu.model]
    return {
        "instanceType": itype.name,
        "gpuModel": itype.gpu.model,
        "gpuCount": itype.gpu.count,
        "gpuMemoryMiB": itype.gpu.memory_mib,
        "nvlinkLinksPerGpu": gpu.nvlink_links_per_gpu,
        "nvswitch": gpu.nvswitch,
        "driverBranch": image.driver_branch,
        "driverVersion": image.driver_version,
        "maxTempC": max_temp_c,
        "migMode": "enabled" if pool.spec.gpu_sharing.mode == "mig" else "disabled",
        "eccExpected": gpu.ecc_expected,
        "eccReservesMemory": gpu.ecc_reserves_memory,
    }
