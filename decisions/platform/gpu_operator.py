"""The GPU platform on EKS as plain values: the NVIDIA GPU operator's Helm values and device-plugin configs, and
the AWS EFA device plugin's values. components/platform/gpu_operator.py turns these into a namespace, a ConfigMap and
two Helm releases. Pure: no Pulumi.

What the node already has, and what the operator adds
-----------------------------------------------------
The EKS AL2023 NVIDIA AMI carries the driver and the NVIDIA container toolkit, and nodeadm makes
nvidia-container-runtime containerd's default runtime (handler `nvidia`). With `gpuDriver.source: install` the
node gate installs both and the NodeConfig sets the same runtime (userdata/render.py). So the operator installs
neither (driver.enabled, toolkit.enabled false) and runs only what the node lacks:
- node-feature-discovery (the chart's subchart), whose PCI labels tell the operator which nodes have GPUs;
- the device plugin, which advertises `nvidia.com/gpu` (or `nvidia.com/mig-<profile>`), with GPU feature
  discovery next to it;
- the MIG manager, which cuts MIG pools' GPUs into instances;
- the DCGM exporter (GPU metrics), the operator validator (always deployed: controllers/state_manager.go
  isStateEnabled, no value turns it off) and the node-status exporter (the validator's verdict as metrics).

Time-slicing, MPS and MIG per pool, chosen by node labels (decisions/nodes/pools.node_labels)
-----------------------------------------------------------------------------------
- `nvidia.com/device-plugin.config=time-slicing-<N>` or `mps-<N>`: the device plugin's config-manager picks that
  entry of the ConfigMap below; the plugin advertises each GPU N times. Nodes without the label get the `default`
  entry (whole GPUs). Time-slicing shares compute by turns and does not partition memory: every replica sees the
  whole GPU. MPS runs one MPS server per node and limits each client (a container given one replica) to 1/N of
  the GPU's memory and 100/N % of its SMs (k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/daemon.go lines
  119-130 and 252-280: memory in MiB rounded down, so 10240 MiB of an A100 80GB's 81920 with N = 8).
- The MPS server is the operator's DaemonSet nvidia-device-plugin-mps-control-daemon: deployed whenever the device
  plugin is (gpu-operator v26.7.0 controllers/state_manager.go lines 1017-1018), on the nodes GPU feature
  discovery labels `nvidia.com/mps.capable=true`, which are those whose config is MPS and whose GPUs are not in MIG
  mode (assets/state-mps-control-daemon/0400_daemonset.yaml lines 19-21; k8s-device-plugin internal/lm/nvml.go
  lines 176-211). It tolerates what every operand does (daemonsets.tolerations: controllers/object_controls.go
  lines 739, 759 and 826-828) and shares the plugin's MPS root, the chart's /run/nvidia/mps (values.yaml line 283),
  so nothing more is set for it.
- `nvidia.com/mig.config=<layout>`, for example `1g.10gbx2-3g.40gbx1`: the MIG manager cuts every GPU into that
  layout (decisions/nodes/pools.mig_layout: a pool's migProfiles, or its migProfile as many as fit), from the program's
  own config (mig_manager_config) whenever some pool uses MIG; with strategy `mixed` each instance is advertised as
  `nvidia.com/mig-<profile>` (decisions/nodes/pools.mig_resource). MIG instances have their own memory and compute.
  MIG-capable GPUs of other pools get `all-disabled`, which is the state the node gate checked, so the MIG
  manager changes nothing there.
- The bootstrap turned MIG mode on before the gate (a GPU whose mode change needed a reset was rejected), so the
  MIG manager finds the mode already applied and only creates instances; it is told never to reboot a node.
- The MIG strategy is each config entry's, not the cluster's: the device plugin refuses MPS under `mixed`
  (k8s-device-plugin v0.20.0 cmd/nvidia-device-plugin/main.go lines 227-230), and a cluster-wide `mig.strategy`
  reaches the plugin, GPU feature discovery and the MPS daemon as MIG_STRATEGY, which overrides any config file
  (controllers/object_controls.go lines 2787-2798; the plugin's api/config/v1/flags.go lines 32-33 and 118-124).
  So `mig.strategy` is empty (templates/clusterpolicy.yaml lines 139-142 then leave it out) and every entry says
  `flags.migStrategy`: `mixed`, or `none` for MPS.

Every Helm value set here exists in the pinned chart's own values.yaml: GPU_OPERATOR_VALUE_PATHS and
EFA_PLUGIN_VALUE_PATHS list each path with its line, and tests/test_gpu_operator.py holds both.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Sequence, Tuple

import yaml

from decisions.catalog.catalog import load_catalog
from decisions.catalog.charts import ChartPin
from decisions.nodes import pools as pool_rules
from decisions.nodes.pods import system_placement, system_tolerations
from decisions.nodes.pools import GPU_TAINT, LABEL_PREFIX, Taint, toleration
from decisions.observability import dcgm, monitoring

if TYPE_CHECKING:
    from decisions.config.stack import ResolvedPool

NAMESPACE = "gpu-operator"
RELEASE_NAME = "gpu-operator"
EFA_PLUGIN_NAMESPACE = "kube-system"          # where the EKS user guide installs it
EFA_PLUGIN_RELEASE_NAME = "aws-efa-k8s-device-plugin"

DEVICE_PLUGIN_CONFIGMAP = "device-plugin-config"
DEFAULT_DEVICE_PLUGIN_CONFIG = "default"      # nodes without nvidia.com/device-plugin.config: whole GPUs
MIG_STRATEGY = "mixed"                        # one resource per MIG profile: nvidia.com/mig-<profile>
MPS_MIG_STRATEGY = "none"                     # MPS pools' GPUs are never in MIG mode
MIG_MANAGER_CONFIGMAP = "mig-parted-config"   # the MIG layouts of the stack's MIG pools, when it has any
MIG_MANAGER_CONFIG_KEY = "config.yaml"        # the key the operator mounts (values.yaml lines 423-425)
MIG_DISABLED_CONFIG = "all-disabled"          # MIG-capable GPUs of pools that do not ask for MIG
EFA_LABEL = f"{LABEL_PREFIX}efa"              # decisions/nodes/pools.node_labels: "true" on EFA pools' nodes

# Plugins before 0.5.10 count a p6-b200.48xlarge's two NVLink controllers (ibp*) as EFA devices and hand them to
# pods, which breaks NCCL (aws/sagemaker-hyperpod-cli PR #282). Held for the chart and for the image it ships.
EFA_PLUGIN_MIN_VERSION = (0, 5, 10)

# Helm value paths this program sets -> line of that key in the chart's values.yaml at the pinned version
# (NVIDIA/gpu-operator tag v26.7.0 deployments/gpu-operator/values.yaml, where the nfd subchart's values sit
# under `node-feature-discovery`). A path ends where the program's value replaces the chart's whole value: a
# list, or a map of free-form keys (a nodeSelector). What each does, from templates/clusterpolicy.yaml and
# templates/operator.yaml at the same tag, is in operator_values().
GPU_OPERATOR_VALUE_PATHS: Mapping[str, int] = {
    "nfd.enabled": 9,
    "daemonsets.tolerations": 45,
    "operator.nodeSelector": 82,
    "operator.tolerations": 90,
    "mig.strategy": 135,
    "driver.enabled": 138,
    "toolkit.enabled": 230,
    "devicePlugin.enabled": 242,
    "devicePlugin.config.create": 273,
    "devicePlugin.config.name": 275,
    "devicePlugin.config.default": 277,
    "dcgmExporter.enabled": 300,
    "dcgmExporter.serviceMonitor.enabled": 327,
    "dcgmExporter.serviceMonitor.additionalLabels": 331,
    "dcgmExporter.serviceMonitor.relabelings": 332,
    "migManager.enabled": 371,
    "migManager.env": 377,
    "migManager.config.default": 420,
    "migManager.config.name": 426,
    "nodeStatusExporter.enabled": 434,
    "node-feature-discovery.worker.tolerations": 631,
}
# Set under `node-feature-discovery` and held in that subchart's own values.yaml (node-feature-discovery 0.19.0, the
# version gpu-operator v26.7.0's Chart.yaml depends on; the parent file has no such keys): path -> line there.
NFD_SUBCHART_VERSION = "0.19.0"
NFD_SUBCHART_VALUE_PATHS: Mapping[str, int] = {
    "master.nodeSelector": 227,
    "master.tolerations": 231,
    "gc.nodeSelector": 1182,
    "gc.tolerations": 1186,
}

# Values the chart's values.yaml documents only in a comment, and its templates read: path -> (values.yaml line of
# the commented key, template and line that reads it). dcgmExporter.config.name (values.yaml lines 348-349 show
# `# config:` / `# name: custom-dcgm-exporter-metrics`) names the ConfigMap with the exporter's counter file
# (templates/clusterpolicy.yaml lines 561-563 copy it into the ClusterPolicy; decisions/observability/dcgm.py says what
# the operator does with it). The program makes that ConfigMap itself, so the chart's own create/data stay unset.
# operator.metrics.serviceMonitor.additionalLabels (values.yaml lines 121-125, all commented) labels the operator's
# own metrics ServiceMonitor (templates/clusterpolicy.yaml lines 32-37 copy operator.metrics into the ClusterPolicy;
# controllers/object_controls.go lines 5070-5084 add the labels).
GPU_OPERATOR_COMMENTED_VALUE_PATHS: Mapping[str, Tuple[int, str]] = {
    "dcgmExporter.config.name": (349, "templates/clusterpolicy.yaml:561"),
    "operator.metrics.serviceMonitor.additionalLabels": (125, "templates/clusterpolicy.yaml:35"),
}

# The node-status exporter's own ServiceMonitor carries only `app: nvidia-node-status-exporter`: the operator adds
# no labels to it (controllers/object_controls.go lines 5086-5093, against 5045-5084 for the others) and the
# ClusterPolicy has no field for them (api/nvidia/v1/clusterpolicy_types.go lines 1216-1241; unchanged on main at
# a22dbf67, 2026-08-21). So the stack's Prometheus, which selects by SELECTOR_LABELS, never selects it, and the
# monitoring stack scrapes the exporter's Service with a ServiceMonitor of its own (components/monitoring.py). The
# Service: assets/state-node-status-exporter/0500_service.yaml lines 5-17 (in the operator's namespace); its series
# carry the node already (cmd/nvidia-validator/metrics.go lines 75-81: label `node`).
NODE_STATUS_EXPORTER_SELECTOR: Mapping[str, str] = {"app": "nvidia-node-status-exporter"}
NODE_STATUS_EXPORTER_PORT_NAME = "node-status"

# The same for aws/eks-charts bfe91c4b92 stable/aws-efa-k8s-device-plugin/values.yaml (templates/daemonset.yaml
# renders both into the DaemonSet's pod spec; tolerations after its own CriticalAddonsOnly one).
EFA_PLUGIN_VALUE_PATHS: Mapping[str, int] = {
    "nodeSelector": 328,
    "tolerations": 332,
}

# NVIDIA's own partitions per catalog GPU: profile -> instances of it per GPU under mig-config `all-<profile>`.
# Transcribed from the operator's fallback config, assets/state-mig-manager/0400_configmap.yaml at gpu-operator
# v26.7.0 (`all-1g.10gb` is 7 on A100 80GB and H100, 4 on A100 40GB, by device filter; `all-1g.35gb` is 4 on H200);
# mig-manager v0.15.0 generates the same from the hardware's maximum counts (NVIDIA/mig-parted v0.15.0
# pkg/mig/builder/builder.go lines 86-139). tests/test_gpu_operator.py holds these equal to
# decisions/catalog/catalog.yaml, whose counts are what a `migProfile` pool's layout cuts (mig_manager_config), the
# autoscaler's scale-from-zero templates and the team quotas count.
MIG_MANAGER_PARTITIONS: Mapping[str, Mapping[str, int]] = {
    "A100 40GB": {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    "A100 80GB": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H100": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H200": {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
    "B200": {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
}

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")


def replicated_sharing(pools: Sequence["ResolvedPool"]) -> Tuple[Tuple[str, int], ...]:
    """The distinct (mode, replicas) of the time-slicing and MPS pools, sorted: one device-plugin config each."""
    return tuple(sorted({(pool.spec.gpu_sharing.mode, pool.spec.gpu_sharing.replicas) for pool in pools
                         if pool.spec.gpu_sharing.mode in pool_rules.REPLICATED_MODES}))


def device_plugin_mounts_shm(pool: "ResolvedPool") -> bool:
    """Whether the device plugin mounts /dev/shm in every container given a GPU of `pool`, so that no pod there may
    mount its own: on MPS pools. The plugin hands each MPS client the MPS server's pipe folder and its shared memory
    at /dev/shm (k8s-device-plugin v0.20.0, the version gpu-operator v26.7.0 deploys: its values.yaml line 245;
    internal/plugin/mps.go lines 74-90, cmd/mps-control-daemon/mps/daemon.go lines 195-196). That shared memory is one
    tmpfs per node, half the node's memory, that the MPS daemon's init container mounts at <MPS root>/shm
    (cmd/mps-control-daemon/mount/mount-shm.go lines 43-69 and 74-105; gpu-operator
    assets/state-mps-control-daemon/0400_daemonset.yaml lines 40-48 and 129-135), shared by every MPS client of the
    node (mps/root.go lines 44-48: "the same for all resources"). A pod's own /dev/shm volume is mounted over it,
    and its CUDA clients cannot reach the server (NVIDIA/k8s-device-plugin#805)."""
    return pool.spec.gpu_sharing.mode == "mps"


def mig_layouts(pools: Sequence["ResolvedPool"]) -> Dict[str, Dict[str, int]]:
    """The MIG pools' layouts by config name (decisions/nodes/pools.mig_config_name), each once; empty without MIG
    pools."""
    catalog = load_catalog()
    layouts = (pool_rules.mig_layout(pool, catalog) for pool in pools if pool.spec.gpu_sharing.mode == "mig")
    return {pool_rules.mig_config_name(layout): layout for layout in layouts}


def gpu_node_taints(pools: Sequence["ResolvedPool"]) -> Tuple[Taint, ...]:
    """Every taint some GPU node carries, once each, the GPU taint first: what the operands must tolerate to run
    on every GPU node (a device plugin that cannot run there leaves the node without GPUs)."""
    taints = [Taint(*GPU_TAINT)]
    for pool in pools:
        taints.extend(t for t in pool_rules.node_taints(pool) if t not in taints)
    return tuple(taints)


def device_plugin_configs(shared: Iterable[Tuple[str, int]]) -> Dict[str, str]:
    """ConfigMap data for the device plugin (k8s-device-plugin v0.20.0 config v1, api/config/v1/config.go lines
    34-40, sharing.go lines 20-25, replicas.go lines 29-34 and 80-86): the default (no sharing) and one config per
    (mode, replicas) of `shared`, mode time-slicing (`sharing.timeSlicing`) or mps (`sharing.mps`).

    renameByDefault false: a replica stays `nvidia.com/gpu` (renamed, it would be `nvidia.com/gpu.shared`:
    replicas.go lines 204-208), the resource whole GPUs are, which the pools' autoscaler templates, the team quotas
    and Kueue count; pods pick a pool by its label. failRequestsGreaterThanOne true: 2 replicas would be 2 turns on
    the same GPU, or 2 MPS clients of 1/N each, never one client with more memory or a second GPU, so such a pod
    fails admission instead of running on a false promise (internal/rm/rm.go lines 95-105; for MPS the plugin's
    own default, config.go lines 72-76, said here). Each entry carries its MIG strategy (module docstring).
    """
    configs = {DEFAULT_DEVICE_PLUGIN_CONFIG: _dump({"version": "v1", "flags": {"migStrategy": MIG_STRATEGY}})}
    for mode, count in shared:
        if mode not in pool_rules.REPLICATED_MODES:
            raise ValueError(f"{mode!r} is not a sharing mode of the device plugin; modes: "
                             f"{', '.join(pool_rules.REPLICATED_MODES)}")
        # The plugin refuses fewer than 2 (replicas.go lines 251-253) and would stop advertising GPUs on the node;
        # the MPS daemon more than 48 clients (cmd/mps-control-daemon/mps/device.go lines 35-49).
        if isinstance(count, bool) or not isinstance(count, int) or count < 2:
            raise ValueError(f"{mode} replicas must be an integer of at least 2, got {count!r}")
        if mode == "mps" and count > 48:
            raise ValueError(f"mps replicas must be at most 48 (the MPS server's client limit), got {count}")
        configs[pool_rules.device_plugin_config_name(mode, count)] = _dump({
            "version": "v1",
            "flags": {"migStrategy": MPS_MIG_STRATEGY if mode == "mps" else MIG_STRATEGY},
            "sharing": {"mps" if mode == "mps" else "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": pool_rules.GPU_RESOURCE, "replicas": count}],
            }},
        })
    return configs


def mig_manager_config(layouts: Mapping[str, Mapping[str, int]]) -> Dict[str, str]:
    """ConfigMap data for the MIG manager (NVIDIA/mig-parted v0.15.0 config v1: api/spec/v1/spec.go lines 29-41):
    `all-disabled` for every GPU outside a MIG pool, and each layout by name (mig_layouts), on all of a node's GPUs.

    Given a config, the MIG manager uses it instead of the one it generates from the hardware (mig-parted v0.15.0
    cmd/nvidia-mig-manager/main.go lines 366-376), which has only single-profile `all-<profile>` entries. It tries
    every creation order of a layout's instances until one fits (pkg/mig/config/config.go lines 255-293);
    decisions/config/validate.py keeps a layout within the GPU's 7 compute and 8 memory slices."""
    configs: Dict[str, List[Dict[str, Any]]] = {MIG_DISABLED_CONFIG: [{"devices": "all", "mig-enabled": False}]}
    for name, layout in layouts.items():
        configs[name] = [{"devices": "all", "mig-enabled": True, "mig-devices": dict(layout)}]
    return {MIG_MANAGER_CONFIG_KEY: _dump({"version": "v1", "mig-configs": configs})}


def operator_values(node_taints: Sequence[Taint], system_node_labels: Mapping[str, str],
                    mig_config: bool = False) -> Dict[str, Any]:
    """Helm values for the gpu-operator chart. node_taints: gpu_node_taints(pools); system_node_labels: the
    labels of the system node group, where the operator's own Deployment runs; mig_config: some pool uses MIG, and
    the MIG manager reads the program's MIG_MANAGER_CONFIGMAP (without, its own generated `all-disabled` is all
    the nodes need)."""
    tolerations = _tolerations(node_taints)
    mig_manager_config_values = {"default": MIG_DISABLED_CONFIG}
    if mig_config:
        mig_manager_config_values["name"] = MIG_MANAGER_CONFIGMAP
    return {
        # The node image (or the gate) installed both; a second driver or a rewritten containerd config would
        # fight it.
        "driver": {"enabled": False},
        "toolkit": {"enabled": False},
        "nfd": {"enabled": True},
        # The program owns the ConfigMap (created before the release, checked by kubernetes-validate), so the
        # chart does not create one; the plugin's config-manager follows each node's label.
        "devicePlugin": {"enabled": True, "config": {
            "create": False, "name": DEVICE_PLUGIN_CONFIGMAP, "default": DEFAULT_DEVICE_PLUGIN_CONFIG}},
        # Each device-plugin config says its own strategy (module docstring).
        "mig": {"strategy": ""},
        "migManager": {
            "enabled": True,
            # Only nodes without nvidia.com/mig.config get the default (controllers/nodelabeling_controller.go).
            "config": mig_manager_config_values,
            # Read by nvidia-mig-manager (WITH_REBOOT, default false): a node whose MIG mode would not change
            # without a reboot is left failed (nvidia.com/mig.config.state=failed), never rebooted under its pods.
            "env": [{"name": "WITH_REBOOT", "value": "false"}],
        },
        # The operator skips this ServiceMonitor while its CRD is missing (controllers/object_controls.go
        # ServiceMonitor) and creates it on a reconcile once the monitoring stack has installed the CRD. It carries
        # the labels that stack's Prometheus selects, or nothing scrapes it.
        # It copies each exporter pod's node name into the series (decisions/observability/monitoring.py
        # NODE_LABEL_RELABELINGS), and the exporter reads gpu-cloud's counter file (decisions/observability/dcgm.py),
        # which the component puts in the namespace.
        "dcgmExporter": {"enabled": True,
                         "serviceMonitor": {"enabled": True, "additionalLabels": dict(monitoring.SELECTOR_LABELS),
                                            "relabelings": [dict(r) for r in monitoring.NODE_LABEL_RELABELINGS]},
                         "config": {"name": dcgm.CONFIGMAP}},
        # The validator's per-node verdict as metrics (gpu_operator_node_driver_ready, _toolkit_ready,
        # _plugin_ready, _cuda_ready, _device_plugin_devices_total); off in the chart by default. Scraped through the
        # monitoring stack's own ServiceMonitor (NODE_STATUS_EXPORTER_SELECTOR says why).
        "nodeStatusExporter": {"enabled": True},
        # Every operand DaemonSet (ClusterPolicy spec.daemonsets) and the NFD worker must reach every GPU node.
        "daemonsets": {"tolerations": tolerations},
        # NFD's master and garbage collector are Deployments: on the system nodes, tolerating their taint
        # (decisions/nodes/pods.py). The subchart would leave them anywhere untainted, with only a control-plane
        # toleration (master, values.yaml line 231) or none (gc, line 1186).
        "node-feature-discovery": {"worker": {"tolerations": tolerations},
                                   "master": system_placement(system_node_labels),
                                   "gc": system_placement(system_node_labels)},
        # Merged with the chart's kubernetes.io/os=linux. The operator's own metrics' ServiceMonitor carries the
        # labels the stack's Prometheus selects (its reconciliation status and GPU node count: v26.7.0
        # controllers/operator_metrics.go lines 76-115).
        # tolerations: the system nodes' taint, instead of the chart's control-plane one (values.yaml line 90).
        "operator": {"nodeSelector": dict(system_node_labels), "tolerations": system_tolerations(),
                     "metrics": {"serviceMonitor": {"additionalLabels": dict(monitoring.SELECTOR_LABELS)}}},
    }


def efa_plugin_values(node_taints: Sequence[Taint]) -> Dict[str, Any]:
    """Helm values for aws-efa-k8s-device-plugin: only on EFA pools' nodes (the chart's own instance-type
    affinity still applies), tolerating every GPU node taint."""
    return {"nodeSelector": {EFA_LABEL: "true"}, "tolerations": _tolerations(node_taints)}


def checked_efa_plugin_pin(pin: ChartPin) -> ChartPin:
    """`pin` if both the chart and the plugin it ships are at least EFA_PLUGIN_MIN_VERSION."""
    floor = ".".join(map(str, EFA_PLUGIN_MIN_VERSION))
    for what, version in (("chart", pin.version), ("plugin (appVersion)", pin.app_version)):
        if release_tuple(version) < EFA_PLUGIN_MIN_VERSION:
            raise ValueError(f"{pin.chart} {what} {version} is older than {floor}: it counts a p6-b200's NVLink "
                             "controllers as EFA devices")
    return pin


def release_tuple(version: str) -> Tuple[int, int, int]:
    """'v0.5.30' or '0.5.30' -> (0, 5, 30)."""
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"{version!r} is not a version like v0.5.30")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _tolerations(taints: Sequence[Taint]) -> List[Dict[str, str]]:
    if Taint(*GPU_TAINT) not in taints:
        raise ValueError(f"node taints {list(taints)} lack the GPU taint {GPU_TAINT}: nothing would run on GPU nodes")
    return [toleration(taint) for taint in taints]


def _dump(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False)
