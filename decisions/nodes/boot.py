"""How long a GPU node may take from launch to a verdict: the gate's waits, its launch-hook timeout, and the
cluster-autoscaler provision time derived from them. Pure: no Pulumi.

The launch lifecycle hook starts at launch, so its timeout must hold the whole boot up to the gate's
CONTINUE: instance start and cloud-init before the gate runs, every step's worst case, and the calls that
report the verdict. `worst_case` lists those steps; a test holds every pool shape inside its timeout.
cluster-autoscaler treats a node that has not registered within `--max-node-provision-time` as a failed
scale-up and removes it, so that flag must outlast the slowest hook plus the kubelet's registration.

An instance refresh and the ASG's health checks wait only from InService, which a node reaches when the gate sends
CONTINUE; the gate's time is spent before it, in Pending:Wait. So the refresh's warmup and the health-check grace
are the node's time from CONTINUE to offering its GPUs (`node_ready_seconds`), never the hook timeout.
"""
from __future__ import annotations

from typing import Dict

VERIFY_HOOK_NAME = "gpu-cloud-verify"
VERIFY_BUDGET_S = 60                 # gpu_verify.py's own budget
# The gate kills the verifier this long after its budget: a call stuck in the NVIDIA library cannot hold the node.
VERIFY_KILL_GRACE_S = 60

# Waits the gate makes on the accelerated AMI (exported into user-data).
KMOD_LOAD_WAIT_S = 300               # nvidia-kmod-load.service: unpack + `dkms install` of the archived module
FABRIC_MANAGER_WAIT_S = 300          # NVSwitch training before nvidia-fabricmanager reports active

# Worst cases of the steps around them (seconds).
_BEFORE_GATE_S = 240                 # EC2 start, kernel, nodeadm-config, cloud-init up to cloud-final
_CHECKS_S = 60                       # persistence, MIG mode, EFA count, artifact download (retried)
_VERIFIER_S = VERIFY_BUDGET_S + VERIFY_KILL_GRACE_S
_REPORT_S = 60                       # CreateTags + CompleteLifecycleAction, retried
# Pools that mount FSx for Lustre: `dnf install lustre-client` from the AL2023 repository (a few MB, through the
# S3 gateway endpoint; five tries 1+2+4+8 s apart) and modprobe.
_LUSTRE_CLIENT_S = 90
_INSTALL_S = {                       # gpuDriver.source: install, on the standard AMI (userdata/install.sh)
    "packages": 300,                 # NVIDIA repo, kernel headers, container toolkit, persistenced
    "driver-dkms-build": 900,        # nvidia-open built by DKMS for the running kernel
    "fabric-manager": 180,           # NVSwitch types: NVLSM, libibumad, infiniband-diags, then fabric manager
}
# No EFA step on either path: the standard AMI carries the same EFA software as the NVIDIA AMI
# (decisions/nodes/amis.yaml).

# Launch-hook timeout per driver source. The hook's default result is ABANDON, so a node that hangs fails closed.
VERIFY_HOOK_TIMEOUT_S = {"ami": 1200, "install": 3000}
# After CONTINUE: nodeadm-run starts containerd and the kubelet, which registers the node.
NODE_REGISTRATION_S = 300
# After registration, until the node offers its GPUs: NFD labels it, the GPU operator's validator checks the driver
# and the toolkit, then the device plugin advertises nvidia.com/gpu. The validator gives the plugin 150 s to do so
# (NVIDIA/gpu-operator v26.7.0 cmd/nvidia-validator/main.go: gpuResourceDiscoveryWaitRetries 30 x
# gpuResourceDiscoveryIntervalSeconds 5); as much again for what runs before it on a new node (image pulls, NFD's
# labels, the validator's driver and toolkit checks).
GPU_ADVERTISE_S = 300


def worst_case(source: str, *, nvswitch: bool, efa: bool, lustre: bool = False) -> Dict[str, int]:
    """Each boot step's longest allowed time, in order, for one pool shape."""
    steps = {"before-gate": _BEFORE_GATE_S}
    if source == "install":
        steps["packages"] = _INSTALL_S["packages"]
        steps["driver-dkms-build"] = _INSTALL_S["driver-dkms-build"]
        if nvswitch:
            steps["fabric-manager-install"] = _INSTALL_S["fabric-manager"]
    else:
        steps["kmod-load"] = KMOD_LOAD_WAIT_S
    if nvswitch:
        steps["fabric-manager-start"] = FABRIC_MANAGER_WAIT_S
    if lustre:
        steps["lustre-client"] = _LUSTRE_CLIENT_S
    steps.update({"checks": _CHECKS_S, "verifier": _VERIFIER_S, "report": _REPORT_S})
    return steps


def verify_hook_timeout(source: str) -> int:
    return VERIFY_HOOK_TIMEOUT_S[source]


def node_ready_seconds() -> int:
    """From InService (the gate's CONTINUE) to a node that offers its GPUs: the instance refresh's warmup and the
    health-check grace period. Both start at InService, once the launch hook is complete, so they hold only this,
    not the gate (read 2026-12-04: docs.aws.amazon.com/autoscaling/ec2/userguide/lifecycle-hooks-overview.html,
    step 3; docs.aws.amazon.com/autoscaling/ec2/APIReference/API_RefreshPreferences.html, InstanceWarmup). The
    same for both driver sources: either has its driver before CONTINUE."""
    return NODE_REGISTRATION_S + GPU_ADVERTISE_S


def max_node_provision_seconds(source: str) -> int:
    """The longest a node booting with this driver source may take to register: the hook timeout plus
    registration."""
    return verify_hook_timeout(source) + NODE_REGISTRATION_S


def max_node_provision_time(source: str) -> str:
    """cluster-autoscaler's `--max-node-provision-time` as a Go duration, so the autoscaler never gives up on a
    node still in the gate."""
    return go_duration(max_node_provision_seconds(source))


def go_duration(seconds: int) -> str:
    """Seconds as a Go duration: 1530 -> '25m30s'."""
    return f"{seconds // 60}m{seconds % 60}s"
