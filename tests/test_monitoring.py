"""components/monitoring.py under the mock engine, and the pure decisions in decisions/observability/monitoring.py.

What users rely on: Prometheus keeps `monitoring.retentionDays` on an encrypted gp3 volume it never fills; every
PrometheusRule gpu-cloud creates is one Prometheus selects, and every exporter the stack relies on is scraped by a
ServiceMonitor Prometheus selects (held over gpu-cloud's own objects and the monitors the pinned charts render,
tests/chart_values.py); alerts reach the stack's webhook without its URL appearing anywhere but a Kubernetes Secret;
node-exporter reads the node verifier's textfile where the gate writes it; every Helm value set is one the pinned
chart (or its pinned subchart) has; every object created directly is valid Kubernetes.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import re

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from components.monitoring import MonitoringArgs, MonitoringStack
from decisions.catalog import charts
from decisions.catalog.charts import ChartPin
from decisions.config.model import Monitoring
from decisions.observability import alert_rules as ar, dashboards, monitoring
from plan.engine import REDACTED
from tests.chart_values import Monitor, Service, assert_values_confirmed, merged_values, prometheus_selection, \
    release_monitors, values_file
from tests.conftest import ROOT, run_component, validate_kubernetes

RELEASE = "kubernetes:helm.sh/v3:Release"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"
POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
SERVICE = "kubernetes:core/v1:Service"
SECRET = "kubernetes:core/v1:Secret"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
CONFIGMAP = "kubernetes:core/v1:ConfigMap"
WEBHOOK = "https://hooks.example.com/services/T04ALERTS/B07GPUCLOUD/q9Zk3LmW8vRt2YpHc6"
WEBHOOK_TOKEN = WEBHOOK.rsplit("/", 1)[1]     # the part that must never show
GROUPS = ({"name": "gpu", "rules": [{"alert": "GpuTooHot", "expr": "DCGM_FI_DEV_GPU_TEMP > 85", "for": "1m"}]},)
DASHBOARDS = {"gpu-fleet.json": {"uid": "gpu-fleet", "title": "GPU fleet", "panels": []}}


def settings(**overrides) -> Monitoring:
    return Monitoring.model_validate({"retentionDays": 21, "prometheusVolumeGiB": 300, **overrides})


def values(webhook: bool = True, **overrides):
    return monitoring.stack_values(settings(**overrides), webhook=webhook, system_node_labels=SYSTEM_NODE_LABELS,
                                   node_exporter_args=ar.NODE_EXPORTER_ARGS)


def _build(webhook_url=WEBHOOK):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        MonitoringStack("monitoring", MonitoringArgs(
            settings=settings(), rule_groups=GROUPS, dashboards=DASHBOARDS,
            node_exporter_args=ar.NODE_EXPORTER_ARGS,
            webhook_url=pulumi.Output.secret(webhook_url) if webhook_url else None),
            opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build())


@pytest.fixture(scope="module")
def run_without_webhook():
    return run_component(_build(None))


# --- Prometheus' storage -------------------------------------------------------------------------------------------
def test_retention_is_the_configured_days_and_stops_short_of_a_full_volume():
    spec = values()["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "21d"
    assert spec["retentionSize"] == "270GiB"                     # 90 % of 300 GiB
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "300Gi"
    assert claim["storageClassName"] == monitoring.STORAGE_CLASS


@pytest.mark.parametrize("gib, size", [(20, "18GiB"), (200, "180GiB"), (201, "180GiB"), (16384, "14745GiB")])
def test_retention_size_rounds_down_to_whole_gib(gib, size):
    assert monitoring.retention_size(gib) == size


def test_volumes_are_encrypted_gp3_from_the_ebs_csi_driver(run):
    (storage_class,) = run.of_type(STORAGE_CLASS)
    assert storage_class.inputs["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.inputs["parameters"] == {"type": "gp3", "encrypted": "true"}
    assert storage_class.inputs["metadata"]["name"] == monitoring.STORAGE_CLASS
    assert storage_class.inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    release = run.one(RELEASE)
    assert storage_class.urn in release.dependencies


# --- what Prometheus selects ---------------------------------------------------------------------------------------
def test_our_rules_and_the_dcgm_service_monitor_carry_the_labels_prometheus_selects(run):
    # The chart keeps its default selectors (no selector of ours), which select `release: <release name>`.
    prometheus = run.one(RELEASE).inputs["values"]["prometheus"]["prometheusSpec"]
    assert not {"ruleSelector", "serviceMonitorSelector", "ruleSelectorNilUsesHelmValues",
                "serviceMonitorSelectorNilUsesHelmValues"} & set(prometheus)
    assert run.one(RELEASE).inputs["name"] == monitoring.RELEASE_NAME
    assert monitoring.SELECTOR_LABELS == {"release": monitoring.RELEASE_NAME}
    (rule,) = run.of_type(PROMETHEUS_RULE)
    assert rule.inputs["metadata"]["labels"] == dict(monitoring.SELECTOR_LABELS)
    assert rule.inputs["spec"]["groups"] == [dict(g) for g in GROUPS]
    assert run.one(RELEASE).urn in rule.dependencies                 # the release installs the CRD


def test_the_dcgm_service_monitor_is_labelled_for_prometheus(stack_runs):
    for stack, run in stack_runs.items():
        operator = next(r for r in run.of_type(RELEASE) if r.inputs["chart"] == "gpu-operator")
        labels = operator.inputs["values"]["dcgmExporter"]["serviceMonitor"]["additionalLabels"]
        assert labels == dict(monitoring.SELECTOR_LABELS), stack


# Every exporter the stack relies on, by its Service (namespace, name) as its chart or the program renders it.
RELIED_ON = {
    ("monitoring", "kube-prometheus-stack-operator"): "the prometheus-operator's own metrics",
    ("monitoring", "kube-prometheus-stack-prometheus-node-exporter"): "node metrics, the verifier's textfile",
    ("monitoring", "kube-prometheus-stack-kube-state-metrics"): "node labels and conditions, Jobs",
    ("gpu-operator", "nvidia-dcgm-exporter"): "GPU metrics",
    ("gpu-operator", "nvidia-node-status-exporter"): "the GPU validator's verdicts",
    ("gpu-operator", "gpu-operator"): "the GPU operator's own metrics",
    ("kueue-system", "kueue-controller-manager-metrics-service"): "Kueue's queues",
    ("kube-system", "aws-node-termination-handler"): "spot interruptions and drains",
    ("inference", "triton-metrics"): "Triton",
    ("kube-system", "gpu-node-repair"): "the gate's rejections, repairs and brakes",
}


def _scrape_view(run):
    """The stack's Prometheus CR selection, and every monitor and Service: the program's own objects and what each
    Helm release's chart renders (tests/chart_values.py)."""
    releases = [r.inputs for r in run.of_type(RELEASE)]
    stack = next(r for r in releases if r["chart"] == charts.KUBE_PROMETHEUS_STACK)
    prometheus = prometheus_selection(merged_values(charts.chart(charts.KUBE_PROMETHEUS_STACK), stack["values"]),
                                      stack["name"])
    monitors = [Monitor("ServiceMonitor", r.inputs["metadata"]["name"], r.inputs["metadata"]["namespace"],
                        r.inputs["metadata"].get("labels", {}),
                        tuple(r.inputs["spec"]["namespaceSelector"]["matchNames"]),
                        r.inputs["spec"]["selector"]["matchLabels"],
                        tuple(e["port"] for e in r.inputs["spec"]["endpoints"]))
                for r in run.of_type(SERVICE_MONITOR)]
    assert not run.of_type(POD_MONITOR), "PodMonitors are not modelled here"
    services = [Service(r.inputs["metadata"]["name"], r.inputs["metadata"]["namespace"],
                        r.inputs["metadata"].get("labels", {}),
                        # a monitor names the port it scrapes; a Service's only port may be unnamed (JobSet's webhook)
                        tuple(p["name"] for p in r.inputs["spec"]["ports"] if "name" in p))
                for r in run.of_type(SERVICE)]
    for release in releases:
        rendered_monitors, rendered_services = release_monitors(release, monitoring.SUBCHARTS)
        monitors += rendered_monitors
        services += rendered_services
    return prometheus, monitors, services


def test_prometheus_selects_monitors_labelled_with_its_release_in_every_namespace(stack_runs):
    for stack, run in stack_runs.items():
        prometheus, _, _ = _scrape_view(run)
        assert prometheus.selectors == {"ServiceMonitor": ({"matchLabels": dict(monitoring.SELECTOR_LABELS)}, {}),
                                        "PodMonitor": ({"matchLabels": dict(monitoring.SELECTOR_LABELS)}, {})}, stack
        assert not prometheus.ignore_namespace_selectors, stack


def test_every_exporter_the_stack_relies_on_is_scraped_by_a_monitor_prometheus_selects(stack_runs):
    """Selected (labels and namespace), reaching the exporter's Service (namespace, labels) at a port it has."""
    seen = set()
    for stack, run in stack_runs.items():
        prometheus, monitors, services = _scrape_view(run)
        for service in services:
            if (service.namespace, service.name) in RELIED_ON:
                seen.add((service.namespace, service.name))
                assert any(prometheus.scrapes(m, service) for m in monitors), \
                    f"{stack}: nothing Prometheus selects scrapes {service}, " \
                    f"{RELIED_ON[service.namespace, service.name]}"
    assert seen == set(RELIED_ON), f"not rendered in any shipped stack: {sorted(set(RELIED_ON) - seen)}"


def test_the_only_monitor_prometheus_leaves_is_the_node_status_exporters_own(stack_runs):
    # The GPU operator gives it no labels of ours (decisions/platform/gpu_operator.py NODE_STATUS_EXPORTER_SELECTOR);
    # the monitoring stack's gpu-node-status scrapes the same Service instead.
    for stack, run in stack_runs.items():
        prometheus, monitors, _ = _scrape_view(run)
        left = [(m.kind, m.namespace, m.name) for m in monitors if not prometheus.selects(m)]
        assert left == [("ServiceMonitor", "gpu-operator", "nvidia-node-status-exporter")], stack


def test_a_monitor_without_the_release_label_or_of_another_release_scrapes_nothing(stack_runs):
    prometheus, monitors, services = _scrape_view(stack_runs["prod-us-east-1"])
    triton = next(s for s in services if s.name == "triton-metrics")
    (monitor,) = [m for m in monitors if prometheus.scrapes(m, triton)]
    unlabelled = dataclasses.replace(monitor, labels={k: v for k, v in monitor.labels.items() if k != "release"})
    assert not prometheus.scrapes(unlabelled, triton)
    assert not prometheus.scrapes(dataclasses.replace(monitor, ports=("http",)), triton)
    other = dataclasses.replace(prometheus, selectors={
        kind: ({"matchLabels": {"release": "monitoring"}}, namespaces)
        for kind, (_, namespaces) in prometheus.selectors.items()})
    assert not any(other.scrapes(m, s) for m in monitors for s in services)


# --- alerts reach the webhook, the URL stays secret ------------------------------------------------------------------
def test_alerts_go_to_the_webhook_and_the_watchdog_never_pages():
    config = values()["alertmanager"]["config"]
    assert config["route"]["receiver"] == monitoring.WEBHOOK_RECEIVER
    assert config["route"]["routes"] == [{"receiver": "null", "matchers": ['alertname = "Watchdog"']}]
    (webhook,) = [r for r in config["receivers"] if r["name"] == monitoring.WEBHOOK_RECEIVER]
    assert webhook["webhook_configs"] == [{"url_file": "/etc/alertmanager/secrets/alertmanager-webhook/url",
                                           "send_resolved": True}]
    assert config["route"]["group_wait"] == "30s" and config["route"]["repeat_interval"] == "4h"


def test_without_a_webhook_alerts_stay_in_alertmanager():
    config = values(webhook=False)["alertmanager"]
    assert config["config"]["route"]["receiver"] == "null"
    assert [r["name"] for r in config["config"]["receivers"]] == ["null"]
    assert config["alertmanagerSpec"]["secrets"] == []


def test_alertmanager_timing_comes_from_config():
    route = values(alertmanager={"groupWaitS": 45, "repeatIntervalH": 12})["alertmanager"]["config"]["route"]
    assert (route["group_wait"], route["repeat_interval"]) == ("45s", "12h")


def test_the_webhook_url_is_only_in_a_secret_the_alertmanager_mounts(run, run_without_webhook):
    (secret,) = run.of_type(SECRET)
    assert secret.inputs["metadata"]["name"] == monitoring.WEBHOOK_SECRET
    assert secret.inputs["stringData"] == REDACTED           # the engine sees a secret, the plan shows none
    release = run.one(RELEASE)
    assert secret.urn in release.dependencies          # mounted by the pods the release creates
    assert release.inputs["values"]["alertmanager"]["alertmanagerSpec"]["secrets"] == [monitoring.WEBHOOK_SECRET]
    for resource in run.resources:
        if resource is not secret:
            assert WEBHOOK_TOKEN not in json.dumps(resource.inputs, default=str), resource.urn
    assert run_without_webhook.of_type(SECRET) == []


# --- node-exporter reads the verifier's textfile ----------------------------------------------------------------------
def test_node_exporter_reads_the_directory_the_gate_and_the_health_check_write():
    bootstrap = (ROOT / "userdata" / "bootstrap.sh").read_text()
    gate = (ROOT / "userdata" / "gate.sh").read_text()
    health = (ROOT / "userdata" / "health.sh").read_text()
    written = re.search(r"^TEXTFILES=\$R(\S+)$", bootstrap, re.M).group(1)
    assert re.search(r"^PROM=\$TEXTFILES/gpu_cloud_verify\.prom$", gate, re.M)
    assert re.search(r"^PROM=\$R(\S+)/gpu_cloud_health\.prom$", health, re.M).group(1) == written
    assert written == monitoring.HOST_TEXTFILE_DIR
    args = values()["prometheus-node-exporter"]["extraArgs"]
    assert f"--collector.textfile.directory=/host/root{written}" in args
    assert "--collector.ethtool" in args
    # The chart's own exclusions stay (setting extraArgs replaces the chart's list).
    chart = yaml.safe_load(_values_text(charts.chart(charts.KUBE_PROMETHEUS_STACK)))
    assert set(chart["prometheus-node-exporter"]["extraArgs"]) <= set(args)


def test_node_exporter_series_carry_the_node_name():
    (relabel,) = values()["prometheus-node-exporter"]["prometheus"]["monitor"]["relabelings"]
    assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}


def test_kube_state_metrics_exposes_the_node_labels_the_rules_join_on():
    assert values()["kube-state-metrics"]["metricLabelsAllowlist"] == [
        "nodes=[gpu-cloud.io/pool,gpu-cloud.io/capacity,gpu-cloud.io/workload,node.kubernetes.io/instance-type]"]


def test_the_stack_runs_on_the_system_nodes():
    v = values()
    for selector in (v["prometheus"]["prometheusSpec"]["nodeSelector"], v["alertmanager"]["alertmanagerSpec"]["nodeSelector"],
                     v["grafana"]["nodeSelector"], v["prometheusOperator"]["nodeSelector"],
                     v["kube-state-metrics"]["nodeSelector"]):
        assert selector == SYSTEM_NODE_LABELS


# --- dashboards ------------------------------------------------------------------------------------------------------
def test_dashboards_are_a_configmap_the_grafana_sidecar_loads(run):
    (configmap,) = run.of_type(CONFIGMAP)
    # The chart's own sidecar settings (tests/test_dashboards.py holds them against its values.yaml).
    assert configmap.inputs["metadata"]["labels"] == {dashboards.GRAFANA_SIDECAR_LABEL: dashboards.GRAFANA_SIDECAR_LABEL_VALUE}
    assert "sidecar" not in run.one(RELEASE).inputs["values"]["grafana"]
    assert json.loads(configmap.inputs["data"]["gpu-fleet.json"]) == DASHBOARDS["gpu-fleet.json"]


# --- the chart's own values -------------------------------------------------------------------------------------------
def _values_text(pin: ChartPin) -> str:
    return values_file(pin).read_text()


def test_every_value_set_is_in_the_pinned_chart_or_its_pinned_subchart():
    pin = charts.chart(charts.KUBE_PROMETHEUS_STACK)
    parent, subcharts = copy.deepcopy(values()), {}
    for name, paths in monitoring.SUBCHART_VALUE_PATHS.items():   # set under the subchart's name, held in its file
        section = parent[name]
        subcharts[name] = {key: section.pop(key) for key in list(section) if key in paths}
        if not section:
            del parent[name]
    assert_values_confirmed(parent, pin, monitoring.KUBE_PROMETHEUS_STACK_VALUE_PATHS)
    for name, own in subcharts.items():
        sub_pin = pin.model_copy(update={"chart": name, "version": monitoring.SUBCHARTS[name]})
        assert_values_confirmed(own, sub_pin, monitoring.SUBCHART_VALUE_PATHS[name])


def test_objects_are_valid_kubernetes(run_without_webhook):
    assert validate_kubernetes(run_without_webhook, "1.35") == 3     # namespace, storage class, dashboards


def test_the_termination_handlers_metrics_are_scraped(run):
    monitor = next(r for r in run.of_type("kubernetes:monitoring.coreos.com/v1:ServiceMonitor") if r.name.endswith("-node-drain"))
    assert monitor.inputs["metadata"]["labels"] == dict(monitoring.SELECTOR_LABELS)
    assert monitor.inputs["metadata"]["namespace"] == "kube-system"
    spec = monitor.inputs["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["kube-system"]}
    # The chart's Service (templates/service.yaml at v1.25.1) selects and names exactly these.
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/name": "aws-node-termination-handler",
                                               "app.kubernetes.io/instance": "aws-node-termination-handler",
                                               "app.kubernetes.io/component": "deployment"}
    assert spec["endpoints"][0]["port"] == "http-metrics"
    assert run.one(RELEASE).urn in monitor.dependencies


def test_the_gpu_validators_and_kueues_metrics_are_scraped_from_the_monitoring_namespace(run):
    monitors = {r.inputs["metadata"]["name"]: r for r in run.of_type(SERVICE_MONITOR)}
    status, queue = monitors["gpu-node-status"], monitors["kueue"]
    for monitor in (status, queue):
        assert monitor.inputs["metadata"]["namespace"] == monitoring.NAMESPACE
        assert run.one(RELEASE).urn in monitor.dependencies               # the release installs the CRD
    assert status.inputs["spec"]["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    assert status.inputs["spec"]["endpoints"] == [{"port": "node-status", "path": "/metrics", "interval": "30s"}]
    # As the Kueue chart's own monitor scrapes it (decisions/platform/kueue.py METRICS_ENDPOINT).
    assert queue.inputs["spec"]["namespaceSelector"] == {"matchNames": ["kueue-system"]}
    assert queue.inputs["spec"]["endpoints"] == [{
        "port": "https", "path": "/metrics", "interval": "30s", "scheme": "https",
        "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "tlsConfig": {"insecureSkipVerify": True}}]


def test_prometheus_is_where_the_chart_puts_its_service():
    chart = yaml.safe_load(_values_text(charts.chart(charts.KUBE_PROMETHEUS_STACK)))
    assert chart["prometheus"]["service"]["port"] == monitoring.PROMETHEUS_PORT
    # <release>-prometheus: the release name contains the chart's name, so it is the chart's fullname.
    assert "kube-prometheus-stack" in monitoring.RELEASE_NAME and len(monitoring.RELEASE_NAME) <= 26
    assert monitoring.PROMETHEUS_URL == "http://kube-prometheus-stack-prometheus.monitoring.svc"


@pytest.mark.parametrize("kind, plural", [("PrometheusRule", "prometheusrules"), ("ServiceMonitor", "servicemonitors")])
def test_custom_resources_match_the_pinned_crds(stack_runs, kind, plural):
    """Every PrometheusRule and ServiceMonitor of every shipped stack against prometheus-operator's CRD as the pinned
    chart installs it (unknown fields fail: the API server would drop them silently)."""
    from tests.crds import crd_schema, validate_against_crd
    schema = crd_schema(f"monitoring.coreos.com/{plural}")
    checked = 0
    for run in stack_runs.values():
        for resource in run.of_type(f"kubernetes:monitoring.coreos.com/v1:{kind}"):
            validate_against_crd({k: v for k, v in resource.inputs.items() if not k.startswith("__")}, schema)
            checked += 1
    assert checked >= 3


def test_the_gpu_operator_comes_after_the_crd_its_dcgm_service_monitor_needs(stack_runs):
    for run in stack_runs.values():
        operator = next(r for r in run.of_type(RELEASE) if r.inputs["chart"] == "gpu-operator")
        monitoring_release = run.one(RELEASE, "monitoring-release")
        assert monitoring_release.urn in operator.dependencies
