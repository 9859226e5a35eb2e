"""components/monitoring.py under the mock engine, and the pure decisions in spec/monitoring.py.

What users rely on: Prometheus keeps `monitoring.retentionDays` on an encrypted gp3 volume it never fills; every
ServiceMonitor and PrometheusRule gpu-cloud creates (and the DCGM exporter's, which the GPU operator creates) is one
Prometheus selects; alerts reach the stack's webhook without its URL appearing anywhere but a Kubernetes Secret;
node-exporter reads the node verifier's textfile where the gate writes it; every Helm value set is one the pinned
chart (or its pinned subchart) has; every object created directly is valid Kubernetes.
"""
from __future__ import annotations

import copy
import json
import re

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from components.monitoring import MonitoringArgs, MonitoringStack
from spec import alert_rules as ar, charts, dashboards, monitoring
from spec.charts import ChartPin
from spec.model import Monitoring
from tests.chart_values import assert_values_confirmed, values_file
from plan.engine import REDACTED
from tests.conftest import ROOT, run_component, validate_kubernetes

RELEASE = "kubernetes:helm.sh/v3:Release"
PROMETHEUS_RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
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
def test_node_exporter_reads_the_directory_the_gate_writes():
    gate = (ROOT / "userdata" / "gate.sh").read_text()
    written = re.search(r"^PROM=\$R(\S+)/gpu_cloud_verify\.prom$", gate, re.M).group(1)
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
        "nodes=[gpu-cloud.io/pool,gpu-cloud.io/capacity,node.kubernetes.io/instance-type]"]


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
