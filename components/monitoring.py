"""Monitoring: kube-prometheus-stack (Prometheus on encrypted gp3, Alertmanager with the stack's webhook, Grafana,
node-exporter reading the node verifier's textfile, kube-state-metrics), the GPU alert rules and the dashboards.

Values come from decisions/observability/monitoring.py, rules from decisions/observability/alert_rules.py, dashboards
from decisions/observability/dashboards.py; this file only turns them into resources.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_kubernetes as kubernetes
from pulumi_kubernetes.helm.v3 import Release

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from decisions.catalog import charts
from decisions.config.model import Monitoring
from decisions.nodes import drain
from decisions.observability import dashboards, monitoring
from decisions.platform import gpu_operator, kueue


@dataclass(frozen=True)
class MonitoringArgs:
    settings: Monitoring                            # the stack's `monitoring` section
    # PrometheusRule spec.groups (decisions/observability/alert_rules.py)
    rule_groups: Sequence[Mapping[str, Any]]
    # file name -> Grafana dashboard model (decisions/observability/dashboards.py)
    dashboards: Mapping[str, Mapping[str, Any]]
    node_exporter_args: Sequence[str]               # what the rules need of node-exporter (alert_rules.NODE_EXPORTER_ARGS)
    webhook_url: Optional[pulumi.Input[str]] = None  # secret; None: alerts stay in Alertmanager
    depends_on: Sequence[pulumi.Resource] = ()      # the EBS CSI driver: the volumes' provisioner


class MonitoringStack(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    namespace: kubernetes.core.v1.Namespace
    release: Release
    alert_rules: kubernetes.apiextensions.CustomResource
    drain_monitor: kubernetes.apiextensions.CustomResource
    gpu_node_status_monitor: kubernetes.apiextensions.CustomResource
    kueue_monitor: kubernetes.apiextensions.CustomResource
    dashboards: kubernetes.core.v1.ConfigMap

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        values = monitoring.stack_values(
            args.settings, webhook=args.webhook_url is not None, system_node_labels=SYSTEM_NODE_LABELS,
            node_exporter_args=args.node_exporter_args)
        pin = charts.chart(charts.KUBE_PROMETHEUS_STACK)
        dashboard_files = {file: json.dumps(model, sort_keys=True, separators=(",", ":"))
                           for file, model in sorted(args.dashboards.items())}

        super().__init__("gpu-cloud:monitoring:MonitoringStack", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.namespace = kubernetes.core.v1.Namespace(
            f"{name}-namespace", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=monitoring.NAMESPACE), opts=child)
        in_namespace = self.namespace.metadata.name   # an output: objects wait for their namespace

        storage_class = kubernetes.storage.v1.StorageClass(
            f"{name}-storage-class", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=monitoring.STORAGE_CLASS),
            provisioner=monitoring.EBS_CSI_PROVISIONER, parameters=dict(monitoring.STORAGE_CLASS_PARAMETERS),
            volume_binding_mode="WaitForFirstConsumer", allow_volume_expansion=True, reclaim_policy="Delete",
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)))

        before_release = [self.namespace, storage_class]
        if args.webhook_url is not None:
            # Mounted by the Alertmanager pods (alertmanagerSpec.secrets); the config names the file, never the URL.
            before_release.append(kubernetes.core.v1.Secret(
                f"{name}-webhook", metadata=kubernetes.meta.v1.ObjectMetaArgs(
                    name=monitoring.WEBHOOK_SECRET, namespace=in_namespace),
                type="Opaque", string_data={monitoring.WEBHOOK_SECRET_KEY: pulumi.Output.secret(args.webhook_url)},
                opts=child))

        self.release = pinned_release(
            f"{name}-release", pin, release_name=monitoring.RELEASE_NAME, namespace=monitoring.NAMESPACE,
            values=values, opts=pulumi.ResourceOptions(parent=self, depends_on=before_release))

        # After the release: it installs the PrometheusRule CRD.
        self.alert_rules = kubernetes.apiextensions.CustomResource(
            f"{name}-gpu-alerts", api_version="monitoring.coreos.com/v1", kind="PrometheusRule",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name="gpu-cloud-alerts", namespace=in_namespace,
                                                       labels=dict(monitoring.SELECTOR_LABELS)),
            spec={"groups": [dict(group) for group in args.rule_groups]},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release]))

        # The termination handler's metrics (spot interruptions and drains): its chart's own ServiceMonitor would
        # need this stack's CRD before the handler is installed (decisions/nodes/drain.py), so the monitor is made here.
        self.drain_monitor = service_monitor(
            f"{name}-node-drain", "node-drain", drain.NAMESPACE,
            monitoring.service_monitor_spec(drain.NAMESPACE, drain.NTH_SERVICE_SELECTOR, drain.NTH_METRICS_PORT_NAME),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release]))
        # The GPU validator's verdicts and Kueue's queues: their own ServiceMonitors lack the labels this Prometheus
        # selects and cannot be given them (decisions/platform/gpu_operator.py, decisions/platform/kueue.py). These sit
        # in this namespace, which exists before either exporter's, and reach into theirs. Where the stack has no Kueue
        # (no training or general pool), Kueue's finds nothing to scrape.
        self.gpu_node_status_monitor = service_monitor(
            f"{name}-gpu-node-status", "gpu-node-status", in_namespace,
            monitoring.service_monitor_spec(gpu_operator.NAMESPACE, gpu_operator.NODE_STATUS_EXPORTER_SELECTOR,
                                            gpu_operator.NODE_STATUS_EXPORTER_PORT_NAME),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release]))
        self.kueue_monitor = service_monitor(
            f"{name}-kueue", "kueue", in_namespace,
            monitoring.service_monitor_spec(kueue.NAMESPACE, kueue.METRICS_SERVICE_SELECTOR, kueue.METRICS_PORT_NAME,
                                            kueue.METRICS_ENDPOINT),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release]))

        # Grafana's sidecar loads every ConfigMap with the dashboard label, from any namespace.
        self.dashboards = kubernetes.core.v1.ConfigMap(
            f"{name}-dashboards", metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name="gpu-cloud-dashboards", namespace=in_namespace,
                labels={dashboards.GRAFANA_SIDECAR_LABEL: dashboards.GRAFANA_SIDECAR_LABEL_VALUE}),
            data=dashboard_files, opts=child)

        self.register_outputs({"chartVersion": pin.version, "releaseStatus": self.release.status,
                               "alertGroups": [group["name"] for group in args.rule_groups],
                               "dashboards": sorted(dashboard_files)})


def service_monitor(resource_name: str, name: str, namespace: pulumi.Input[str], spec: Mapping[str, Any],
                    opts: pulumi.ResourceOptions) -> kubernetes.apiextensions.CustomResource:
    """A ServiceMonitor the stack's Prometheus selects (its labels: decisions/observability/monitoring.py
    SELECTOR_LABELS). Created after the monitoring release, which installs the CRD (opts says so)."""
    return kubernetes.apiextensions.CustomResource(
        resource_name, api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
        metadata=kubernetes.meta.v1.ObjectMetaArgs(name=name, namespace=namespace,
                                                   labels=dict(monitoring.SELECTOR_LABELS)),
        spec=dict(spec), opts=opts)
