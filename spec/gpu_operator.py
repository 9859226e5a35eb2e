"""The GPU platform on EKS as plain values: the NVIDIA GPU operator's Helm values and device-plugin configs, and
the AWS EFA device plugin's values. components/gpu_operator.py turns these into a namespace, a ConfigMap and two
Helm releases. Pure: no Pulumi.

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

Time-slicing and MIG per pool, chosen by node labels (spec/pools.node_labels)
-----------------------------------------------------------------------------
- `nvidia.com/device-plugin.config=time-slicing-<N>`: the device plugin's config-manager picks that entry of
  the ConfigMap below; it advertises each GPU N times. Nodes without the label get the `default` entry (whole
  GPUs). Time-slicing shares compute by turns and does not partition memory: every replica sees the whole GPU.
- `nvidia.com/mig.config=all-<profile>`: the MIG manager cuts every GPU into as many <profile> instances as fit;
  with strategy `mixed` each instance is advertised as `nvidia.com/mig-<profile>` (spec/pools.mig_resource).
  MIG instances have their own memory and compute. MIG-capable GPUs of other pools get `all-disabled` (the
  chart's default config), which is the state the node gate checked, so the MIG manager changes nothing there.
- The bootstrap turned MIG mode on before the gate (a GPU whose mode change needed a reset was rejected), so the
  MIG manager finds the mode already applied and only creates instances; it is told never to reboot a node.

Every Helm value set here exists in the pinned chart's own values.yaml: GPU_OPERATOR_VALUE_PATHS and
EFA_PLUGIN_VALUE_PATHS list each path with its line, and tests/test_gpu_operator.py holds both.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Sequence, Tuple

import yaml

from spec import dcgm, monitoring
from spec import pools as pool_rules
from spec.charts import ChartPin
from spec.pools import GPU_TAINT, LABEL_PREFIX, Taint, toleration

if TYPE_CHECKING:
    from spec.validate import ResolvedPool

NAMESPACE = "gpu-operator"
RELEASE_NAME = "gpu-operator"
EFA_PLUGIN_NAMESPACE = "kube-system"          # where the EKS user guide installs it
EFA_PLUGIN_RELEASE_NAME = "aws-efa-k8s-device-plugin"

DEVICE_PLUGIN_CONFIGMAP = "device-plugin-config"
DEFAULT_DEVICE_PLUGIN_CONFIG = "default"      # nodes without nvidia.com/device-plugin.config: whole GPUs
MIG_STRATEGY = "mixed"                        # one resource per MIG profile: nvidia.com/mig-<profile>
MIG_DISABLED_CONFIG = "all-disabled"          # MIG-capable GPUs of pools that do not ask for MIG
EFA_LABEL = f"{LABEL_PREFIX}efa"              # spec/pools.node_labels: "true" on EFA pools' nodes

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
    "nodeStatusExporter.enabled": 434,
    "node-feature-discovery.worker.tolerations": 631,
}

# Values the chart's values.yaml documents only in a comment, and its templates read: path -> (values.yaml line of
# the commented key, template and line that reads it). dcgmExporter.config.name (values.yaml lines 348-349 show
# `# config:` / `# name: custom-dcgm-exporter-metrics`) names the ConfigMap with the exporter's counter file
# (templates/clusterpolicy.yaml lines 561-563 copy it into the ClusterPolicy; spec/dcgm.py says what the operator does
# with it). The program makes that ConfigMap itself, so the chart's own create/data stay unset.
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

# The MIG manager's partitions per catalog GPU: profile -> instances of it per GPU under mig-config
# `all-<profile>`. Transcribed from the operator's fallback config, assets/state-mig-manager/0400_configmap.yaml
# at gpu-operator v26.7.0 (`all-1g.10gb` is 7 on A100 80GB and H100, 4 on A100 40GB, by device filter;
# `all-1g.35gb` is 4 on H200). mig-manager v0.15.0 first generates the same `all-<profile>` entries from the
# hardware's maximum counts (NVIDIA/mig-parted v0.15.0 pkg/mig/builder/builder.go) and falls back to that file
# only when discovery finds no profiles. tests/test_gpu_operator.py holds these equal to spec/catalog.yaml, whose
# counts size the autoscaler's scale-from-zero templates and the team quotas.
MIG_MANAGER_PARTITIONS: Mapping[str, Mapping[str, int]] = {
    "A100 40GB": {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    "A100 80GB": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H100": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H200": {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
    "B200": {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
}

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")


def time_slicing_replicas(pools: Sequence["ResolvedPool"]) -> Tuple[int, ...]:
    """The distinct replica counts of the time-slicing pools, ascending."""
    return tuple(sorted({pool.spec.gpu_sharing.replicas for pool in pools
                         if pool.spec.gpu_sharing.mode == "time-slicing"}))


def gpu_node_taints(pools: Sequence["ResolvedPool"]) -> Tuple[Taint, ...]:
    """Every taint some GPU node carries, once each, the GPU taint first: what the operands must tolerate to run
    on every GPU node (a device plugin that cannot run there leaves the node without GPUs)."""
    taints = [Taint(*GPU_TAINT)]
    for pool in pools:
        taints.extend(t for t in pool_rules.node_taints(pool) if t not in taints)
    return tuple(taints)


def time_slicing_config_name(replicas: int) -> str:
    """The device-plugin config a time-slicing pool's nodes select (their nvidia.com/device-plugin.config label)."""
    return f"time-slicing-{replicas}"


def device_plugin_configs(replicas: Iterable[int]) -> Dict[str, str]:
    """ConfigMap data for the device plugin (k8s-device-plugin v0.20.0 config v1): the default (no sharing) and
    one time-slicing config per replica count.

    renameByDefault false: a replica stays `nvidia.com/gpu`, the resource the pools' autoscaler templates and the
    team quotas count. failRequestsGreaterThanOne true: asking for 2 replicas would only mean 2 turns on the same
    GPU, never more memory or a second GPU, so such a pod fails admission instead of running on a false promise.
    The MIG strategy is not repeated here: the operator passes MIG_STRATEGY from `mig.strategy` to the plugin and
    GFD, and an environment variable takes precedence over the file.
    """
    configs = {DEFAULT_DEVICE_PLUGIN_CONFIG: _dump({"version": "v1"})}
    for count in replicas:
        # The plugin refuses fewer than 2 (api/config/v1/replicas.go) and would stop advertising GPUs on the node.
        if isinstance(count, bool) or not isinstance(count, int) or count < 2:
            raise ValueError(f"time-slicing replicas must be an integer of at least 2, got {count!r}")
        configs[time_slicing_config_name(count)] = _dump({
            "version": "v1",
            "sharing": {"timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": count}],
            }},
        })
    return configs


def operator_values(node_taints: Sequence[Taint], system_node_labels: Mapping[str, str]) -> Dict[str, Any]:
    """Helm values for the gpu-operator chart. node_taints: gpu_node_taints(pools); system_node_labels: the
    labels of the system node group, where the operator's own Deployment runs."""
    tolerations = _tolerations(node_taints)
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
        "mig": {"strategy": MIG_STRATEGY},
        "migManager": {
            "enabled": True,
            # Only nodes without nvidia.com/mig.config get this label value (controllers/nodelabeling_controller.go).
            "config": {"default": MIG_DISABLED_CONFIG},
            # Read by nvidia-mig-manager (WITH_REBOOT, default false): a node whose MIG mode would not change
            # without a reboot is left failed (nvidia.com/mig.config.state=failed), never rebooted under its pods.
            "env": [{"name": "WITH_REBOOT", "value": "false"}],
        },
        # The operator skips this ServiceMonitor while its CRD is missing (controllers/object_controls.go
        # ServiceMonitor) and creates it on a reconcile once the monitoring stack has installed the CRD. It carries
        # the labels that stack's Prometheus selects, or nothing scrapes it.
        # It copies each exporter pod's node name into the series (spec/monitoring.py NODE_LABEL_RELABELINGS), and
        # the exporter reads gpu-cloud's counter file (spec/dcgm.py), which the component puts in the namespace.
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
        "node-feature-discovery": {"worker": {"tolerations": tolerations}},
        # Merged with the chart's kubernetes.io/os=linux. The operator's own metrics' ServiceMonitor carries the
        # labels the stack's Prometheus selects (its reconciliation status and GPU node count: v26.7.0
        # controllers/operator_metrics.go lines 76-115).
        "operator": {"nodeSelector": dict(system_node_labels),
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
