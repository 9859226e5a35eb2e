"""The monitoring stack's decisions: kube-prometheus-stack values, the labels Prometheus selects, where alerts go,
and where node-exporter finds the node verifier's metrics. Pure: no Pulumi (components/monitoring.py builds it).

Prometheus keeps the chart's default selectors. With `*SelectorNilUsesHelmValues: true` (values.yaml defaults) and
no selector of our own, the chart renders `matchLabels: {release: <release name>}` for ServiceMonitors, PodMonitors
and PrometheusRules, and an empty namespace selector, which matches every namespace (prometheus-community/helm-charts
tag kube-prometheus-stack-88.5.3, charts/kube-prometheus-stack/templates/prometheus/prometheus.yaml lines 193-224
and 277-283). So every ServiceMonitor and PrometheusRule gpu-cloud creates, and those the GPU operator creates for
the DCGM exporter and itself, carry SELECTOR_LABELS. Exporters whose chart cannot label its own ServiceMonitor (the
node-status exporter, Kueue) or installs it before the CRD (the termination handler) are scraped by ServiceMonitors
of components/monitoring.py. tests/test_monitoring.py holds every exporter the stack relies on against the monitors
as the pinned charts render them (tests/chart_values.py models their templates).
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from decisions.config.model import Monitoring
from decisions.nodes.pods import system_tolerations
from decisions.nodes.pools import LABEL_PREFIX, POOL_LABEL

NAMESPACE = "monitoring"
RELEASE_NAME = "kube-prometheus-stack"
# What Prometheus selects (see the module docstring).
SELECTOR_LABELS: Mapping[str, str] = {"release": RELEASE_NAME}

# Where Prometheus answers inside the cluster (templates/prometheus/service.yaml: <fullname>-prometheus, fullname =
# the release name when it contains the chart's name, _helpers.tpl; port: prometheus.service.port, 9090 by default,
# values.yaml line 3780). prometheus-adapter queries it.
PROMETHEUS_URL = f"http://{RELEASE_NAME}-prometheus.{NAMESPACE}.svc"
PROMETHEUS_PORT = 9090

# Prometheus and Alertmanager volumes: gp3, encrypted with the account's EBS key, through the EBS CSI add-on
# (components/cluster.py installs it). WaitForFirstConsumer: the volume is made in the zone the pod lands in.
STORAGE_CLASS = "gp3-encrypted"
EBS_CSI_PROVISIONER = "ebs.csi.aws.com"
STORAGE_CLASS_PARAMETERS: Mapping[str, str] = {"type": "gp3", "encrypted": "true"}
ALERTMANAGER_VOLUME_GIB = 10          # silences and the notification log only
RETENTION_SIZE_SHARE = 0.9            # Prometheus drops old blocks before its volume fills

# The webhook receiver's URL is a secret (gpu-cloud:alertWebhookUrl): it goes into a Kubernetes Secret that the
# Alertmanager pods mount under /etc/alertmanager/secrets/<name>/ (alertmanagerSpec.secrets), and the config names
# the file (webhook_config url_file), so the URL is in neither the Helm values nor the plan.
WEBHOOK_SECRET = "alertmanager-webhook"
WEBHOOK_SECRET_KEY = "url"
WEBHOOK_RECEIVER = "webhook"
WEBHOOK_URL_FILE = f"/etc/alertmanager/secrets/{WEBHOOK_SECRET}/{WEBHOOK_SECRET_KEY}"

# The node verifier's textfile (userdata/gate.sh writes gpu_cloud_verify.prom there on the host). node-exporter sees
# the host's root at /host/root (prometheus-node-exporter 4.56.1 templates/daemonset.yaml: --path.rootfs=/host/root,
# hostRootFsMount on by default), so the collector reads the same directory through it.
HOST_TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
NODE_EXPORTER_ROOT = "/host/root"

# kube-prometheus-stack's own default node-exporter arguments (values.yaml line 2734): a list, so setting ours
# replaces them, and they are repeated here to keep the chart's filesystem exclusions.
_CHART_NODE_EXPORTER_ARGS = (
    "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run/containerd/.+|var/lib/docker/.+|var/lib/kubelet/.+)($|/)",
    "--collector.filesystem.fs-types-exclude=^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|sysfs|tracefs|erofs)$",
)

# Helm value paths set -> line in kube-prometheus-stack 88.5.3's values.yaml (a path ends where our value replaces
# the chart's whole value: a list or a free-form map).
KUBE_PROMETHEUS_STACK_VALUE_PATHS: Mapping[str, int] = {
    "alertmanager.config.route": 579,
    "alertmanager.config.receivers": 589,
    "alertmanager.alertmanagerSpec.secrets": 1033,
    "alertmanager.alertmanagerSpec.storage": 1126,
    "alertmanager.alertmanagerSpec.nodeSelector": 1160,
    "alertmanager.alertmanagerSpec.tolerations": 1198,
    "prometheus-node-exporter.extraArgs": 2734,
    "prometheus-node-exporter.prometheus.monitor.relabelings": 2800,
    "prometheusOperator.admissionWebhooks.patch.nodeSelector": 3144,
    "prometheusOperator.admissionWebhooks.patch.tolerations": 3146,
    "prometheusOperator.nodeSelector": 3434,
    "prometheusOperator.tolerations": 3439,
    "prometheus.prometheusSpec.tolerations": 4354,
    "prometheus.prometheusSpec.nodeSelector": 4421,
    "prometheus.prometheusSpec.retention": 4567,
    "prometheus.prometheusSpec.retentionSize": 4571,
    "prometheus.prometheusSpec.storageSpec": 4675,
}
# Subchart values (set under the subchart's name) -> version pinned by the chart's Chart.yaml dependencies at that
# tag, and the line in the subchart's own values.yaml.
SUBCHARTS: Mapping[str, str] = {"kube-state-metrics": "8.4.0", "prometheus-node-exporter": "4.56.1",
                                "grafana": "12.11.1"}
SUBCHART_VALUE_PATHS: Mapping[str, Mapping[str, int]] = {
    "kube-state-metrics": {"metricLabelsAllowlist": 416, "metricAnnotationsAllowList": 425, "nodeSelector": 360,
                           "tolerations": 376},
    "grafana": {"nodeSelector": 438, "tolerations": 443},
}


def service_monitor_spec(namespace: str, selector: Mapping[str, str], port: str,
                         endpoint: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """A ServiceMonitor's spec: scrape `port` (a Service port name) of the Services with `selector` in `namespace`
    every 30 s (the chart's default interval), job named after the Service. `endpoint`: more endpoint settings (the
    scheme, TLS, credentials)."""
    return {"namespaceSelector": {"matchNames": [namespace]}, "selector": {"matchLabels": dict(selector)},
            "endpoints": [{"port": port, "path": "/metrics", "interval": "30s", **(endpoint or {})}]}


# How a series finds its node and pool.
# - The DCGM exporter's and node-exporter's targets are pod addresses (kube-prometheus-stack 88.5.3 values.yaml
#   prometheus-node-exporter.prometheus.monitor.relabelings: [], gpu-operator v26.7.0 values.yaml
#   dcgmExporter.serviceMonitor.relabelings: []), and the exporter's own host label changed spelling between releases
#   (NVIDIA/dcgm-exporter d5e5f510, after 4.5.3-4.8.2): both ServiceMonitors copy the pod's node name into NODE_LABEL.
# - kube-state-metrics' kube_node_labels{node} carries the node labels its allowlist names (chart value
#   kube-state-metrics.metricLabelsAllowlist), as label_<key with every character outside [a-zA-Z0-9_] as "_">
#   (kube-state-metrics v2.20.0 internal/store/utils.go). Alert rules and dashboards join on these.
NODE_LABEL = "node"
NODE_LABEL_RELABELINGS: Tuple[Mapping[str, Any], ...] = (
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": NODE_LABEL, "action": "replace"},)
POOL_NODE_LABEL = POOL_LABEL                     # the pool's name on its nodes (decisions/nodes/pools.py)
CAPACITY_NODE_LABEL = f"{LABEL_PREFIX}capacity"
WORKLOAD_NODE_LABEL = f"{LABEL_PREFIX}workload"  # training, general or inference (decisions/nodes/pools.node_labels)
INSTANCE_TYPE_NODE_LABEL = "node.kubernetes.io/instance-type"    # the kubelet's well-known label
KUBE_STATE_NODE_LABELS: Tuple[str, ...] = (POOL_NODE_LABEL, CAPACITY_NODE_LABEL, WORKLOAD_NODE_LABEL,
                                           INSTANCE_TYPE_NODE_LABEL)
# Node annotations kube-state-metrics keeps in kube_node_annotations (chart value metricAnnotationsAllowList): the
# repair controller's mark on a node it cordoned (decisions/nodes/repair.py REPAIR_ANNOTATION, which imports this
# module), read by the GPU-hour ledger (decisions/observability/gpu_hours.py).
KUBE_STATE_NODE_ANNOTATIONS: Tuple[str, ...] = (f"{LABEL_PREFIX}repair",)


def ksm_sanitized(name: str) -> str:
    """A name as kube-state-metrics writes it into a label name or value: every character outside [a-zA-Z0-9_] as
    "_" (v2.20.0 internal/store/utils.go)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def ksm_label(node_label: str) -> str:
    """kube_node_labels' label for a Kubernetes node label key: gpu-cloud.io/pool -> label_gpu_cloud_io_pool."""
    return "label_" + ksm_sanitized(node_label)


def ksm_annotation(annotation: str) -> str:
    """kube_node_annotations' label for an annotation key: gpu-cloud.io/repair -> annotation_gpu_cloud_io_repair
    (v2.20.0 internal/store/utils.go, the same sanitizing as labels)."""
    return "annotation_" + ksm_sanitized(annotation)


def webhook_receiver() -> Dict[str, Any]:
    return {"name": WEBHOOK_RECEIVER, "webhook_configs": [{"url_file": WEBHOOK_URL_FILE, "send_resolved": True}]}


def alertmanager_config(monitoring: Monitoring, webhook: bool) -> Dict[str, Any]:
    """Alertmanager's route and receivers. Every alert goes to the webhook when the stack has one; without it alerts
    stay in Alertmanager's UI (the chart's 'null' receiver). The chart's Watchdog alert (always firing, to prove the
    pipeline works) never pages."""
    receiver = WEBHOOK_RECEIVER if webhook else "null"
    route = {
        "group_by": ["alertname", "namespace", "pool"],
        "group_wait": f"{monitoring.alertmanager.group_wait_s}s",
        "group_interval": "5m",
        "repeat_interval": f"{monitoring.alertmanager.repeat_interval_h}h",
        "receiver": receiver,
        "routes": [{"receiver": "null", "matchers": ['alertname = "Watchdog"']}],
    }
    receivers = [{"name": "null"}] + ([webhook_receiver()] if webhook else [])
    return {"route": route, "receivers": receivers}


def retention_size(volume_gib: int) -> str:
    """Prometheus' retentionSize: RETENTION_SIZE_SHARE of its volume, whole GiB rounded down."""
    return f"{math.floor(volume_gib * RETENTION_SIZE_SHARE)}GiB"


def volume_claim(gib: int) -> Dict[str, Any]:
    return {"volumeClaimTemplate": {"spec": {
        "storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{gib}Gi"}}}}}


def node_exporter_flags(extra_args: Sequence[str]) -> list:
    """The chart's own arguments, the verifier's textfile directory, and what the alert rules add."""
    return [*_CHART_NODE_EXPORTER_ARGS, f"--collector.textfile.directory={NODE_EXPORTER_ROOT}{HOST_TEXTFILE_DIR}",
            *extra_args]


def stack_values(monitoring: Monitoring, *, webhook: bool, system_node_labels: Mapping[str, str],
                 node_exporter_args: Sequence[str]) -> Dict[str, Any]:
    """Helm values for kube-prometheus-stack. node_exporter_args: what the alert rules need of node-exporter beyond
    its defaults (decisions/observability/alert_rules.py NODE_EXPORTER_ARGS)."""
    on_system = dict(system_node_labels)
    # Every component that runs on the system nodes tolerates their taint (decisions/nodes/pods.py); the chart and its
    # subcharts tolerate nothing by default. The CRD upgrade Job (crds.upgradeJob), the webhook Deployment
    # (admissionWebhooks.deployment) and Thanos Ruler stay off (values.yaml lines 40, 2900, 5307).
    tolerate = system_tolerations
    return {
        "prometheus": {"prometheusSpec": {
            "retention": f"{monitoring.retention_days}d",
            "retentionSize": retention_size(monitoring.prometheus_volume_gib),
            "storageSpec": volume_claim(monitoring.prometheus_volume_gib),
            "nodeSelector": on_system, "tolerations": tolerate(),
        }},
        "alertmanager": {
            "config": alertmanager_config(monitoring, webhook),
            "alertmanagerSpec": {"secrets": [WEBHOOK_SECRET] if webhook else [],
                                 "storage": volume_claim(ALERTMANAGER_VOLUME_GIB), "nodeSelector": on_system,
                                 "tolerations": tolerate()},
        },
        # Dashboards: the chart's sidecar defaults load them (decisions/observability/dashboards.py
        # GRAFANA_SIDECAR_LABEL).
        "grafana": {"nodeSelector": on_system, "tolerations": tolerate()},
        "prometheusOperator": {"nodeSelector": on_system, "tolerations": tolerate(),
                               "admissionWebhooks": {"patch": {"nodeSelector": on_system, "tolerations": tolerate()}}},
        "kube-state-metrics": {"metricLabelsAllowlist": [f"nodes=[{','.join(KUBE_STATE_NODE_LABELS)}]"],
                               "metricAnnotationsAllowList": [f"nodes=[{','.join(KUBE_STATE_NODE_ANNOTATIONS)}]"],
                               "nodeSelector": on_system, "tolerations": tolerate()},
        "prometheus-node-exporter": {
            "extraArgs": node_exporter_flags(node_exporter_args),
            "prometheus": {"monitor": {"relabelings": [dict(r) for r in NODE_LABEL_RELABELINGS]}},
        },
    }
