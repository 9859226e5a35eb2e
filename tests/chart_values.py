"""Holds the Helm values the program sets against the pinned chart's own values.yaml (recorded without the authors'
prose from the chart's repository at its release tag in tests/upstream/chart-values/, by scripts/upstream_records.py,
which names each file's source in tests/upstream/chart-values.json), and models what the pinned charts render for Prometheus
from those values: the Prometheus CR's selectors, and each chart's ServiceMonitors and Services."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Tuple

import pytest
import yaml

from decisions.catalog import charts
from decisions.catalog.charts import ChartPin
from tests import upstream_records

VALUES_DIR = upstream_records.CHART_VALUES_DIR


def values_file(pin: ChartPin) -> Path:
    """The chart's own values.yaml at the pinned version, as recorded from its repository."""
    path = VALUES_DIR / upstream_records.chart_values_name(pin.chart, pin.version)
    if not path.is_file():
        pytest.fail(f"{path.name} is not recorded in tests/upstream/chart-values/ ({pin.chart} {pin.version}): "
                    f"{upstream_records.RERECORD}")
    return path


def set_paths(values: Mapping[str, Any], confirmed: Mapping[str, int], prefix: Tuple[str, ...] = ()) -> Iterator[str]:
    """Each path the program sets: a confirmed path (which may hold a list or a free-form map), else a leaf."""
    for key, value in values.items():
        path = ".".join(prefix + (key,))
        if path not in confirmed and isinstance(value, dict) and value:
            yield from set_paths(value, confirmed, prefix + (key,))
        else:
            yield path


def assert_values_confirmed(values: Mapping[str, Any], pin: ChartPin, confirmed: Mapping[str, int]) -> None:
    """Every path in `values` is in `confirmed`, and each confirmed path is at its stated line of the pinned
    chart's values.yaml."""
    path = values_file(pin)
    text = path.read_text()
    chart_values, lines = yaml.safe_load(text), text.splitlines()
    unconfirmed = sorted(set(set_paths(values, confirmed)) - set(confirmed))
    assert not unconfirmed, f"set but not confirmed in {path.name}: {unconfirmed}"
    for dotted, line in confirmed.items():
        node: Any = chart_values
        for key in dotted.split("."):
            assert isinstance(node, dict) and key in node, f"{dotted} is not in {path.name}"
            node = node[key]
        assert lines[line - 1].strip().startswith(f"{dotted.split('.')[-1]}:"), \
            f"{path.name}:{line} is not {dotted}: {lines[line - 1]!r}"


def merged_values(pin: ChartPin, values: Mapping[str, Any]) -> Dict[str, Any]:
    """What the chart's templates read: its values.yaml with `values` over it (Helm merges maps key by key and
    replaces anything else)."""
    return _merge(yaml.safe_load(values_file(pin).read_text()), values)


def _merge(base: Any, over: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    return {**copy.deepcopy(base), **{key: _merge(base.get(key), value) for key, value in over.items()}}


# --- what Prometheus scrapes, modelled from the pinned charts' templates --------------------------------------------
# No Helm binary or chart archive is on the machine (nor in CI), so the template lines that decide which
# ServiceMonitors a release renders, with which labels in which namespace, and the Services they scrape, are
# transcribed below, each with its source. Labels that carry the chart's version (helm.sh/chart, chart,
# app.kubernetes.io/version) or Helm's name (managed-by, heritage) are left out: no selector reads them.

@dataclass(frozen=True)
class Monitor:
    """A ServiceMonitor or PodMonitor: what Prometheus selects it by (kind, namespace, labels) and what it scrapes
    (the Services, for a PodMonitor the pods, labelled `selector` in `namespaces`, at each of `ports`)."""
    kind: str
    name: str
    namespace: str
    labels: Mapping[str, str]
    namespaces: Tuple[str, ...]
    selector: Mapping[str, str]
    ports: Tuple[str, ...]


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: Tuple[str, ...]


@dataclass(frozen=True)
class Prometheus:
    """The kube-prometheus-stack Prometheus CR's monitor selection: per kind, the label selector over the monitors
    and the one over their namespaces."""
    selectors: Mapping[str, Tuple[Mapping[str, Any], Mapping[str, Any]]]
    ignore_namespace_selectors: bool

    def selects(self, monitor: Monitor) -> bool:
        selector, namespace_selector = self.selectors[monitor.kind]
        # The API server labels every namespace kubernetes.io/metadata.name=<name> (Kubernetes' well-known labels,
        # since 1.21).
        return (label_selector_matches(selector, monitor.labels)
                and label_selector_matches(namespace_selector, {"kubernetes.io/metadata.name": monitor.namespace}))

    def scrapes(self, monitor: Monitor, service: Service) -> bool:
        """`monitor` is a selected ServiceMonitor that reaches `service` at every port it names. Its namespace
        selector counts unless ignoreNamespaceSelectors (then only its own namespace: prometheus-operator v0.93.0
        pkg/apis/monitoring/v1/prometheus_types.go lines 649-654)."""
        namespaces = (monitor.namespace,) if self.ignore_namespace_selectors else monitor.namespaces
        return (monitor.kind == "ServiceMonitor" and self.selects(monitor) and service.namespace in namespaces
                and all(service.labels.get(key) == value for key, value in monitor.selector.items())
                and set(monitor.ports) <= set(service.ports))


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector: `{}` matches everything. Only matchLabels is modelled (nothing here sets
    matchExpressions)."""
    assert set(selector) <= {"matchLabels"}, f"selector not modelled: {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def prometheus_selection(values: Mapping[str, Any], release: str) -> Prometheus:
    """What the Prometheus CR selects, from kube-prometheus-stack's merged values (prometheus-community/helm-charts
    tag kube-prometheus-stack-88.5.3, charts/kube-prometheus-stack/templates/prometheus/prometheus.yaml):
    - lines 193-202 (podMonitorSelector: 209-218): the value's selector if set, else with
      `serviceMonitorSelectorNilUsesHelmValues` (values.yaml line 4476, true) `matchLabels: {release: <release>}`,
      else `{}`;
    - lines 203-208 (podMonitorNamespaceSelector: 219-224): the value's selector if set, else `{}`, which matches
      every namespace (prometheus-operator v0.93.0 pkg/apis/monitoring/v1/prometheus_types.go lines 151-153 and
      170-172; a null one, which the template never renders, would match Prometheus' own namespace only; the
      chart's v0.93.1 was not in the snapshot read);
    - lines 444-445: ignoreNamespaceSelectors (values.yaml line 4909, false)."""
    spec = values["prometheus"]["prometheusSpec"]

    def pair(kind: str) -> Tuple[Mapping[str, Any], Mapping[str, Any]]:
        selector = spec[f"{kind}Selector"] or (
            {"matchLabels": {"release": release}} if spec[f"{kind}SelectorNilUsesHelmValues"] else {})
        return selector, spec[f"{kind}NamespaceSelector"] or {}

    return Prometheus(selectors={"ServiceMonitor": pair("serviceMonitor"), "PodMonitor": pair("podMonitor")},
                      ignore_namespace_selectors=bool(spec["ignoreNamespaceSelectors"]))


def _fullname(values: Mapping[str, Any], chart: str, release: str, limit: int = 63) -> str:
    """The charts' common `<chart>.fullname` helper: fullnameOverride, else the release name when it contains the
    chart's name, else `<release>-<name>`, cut to `limit`."""
    name = values.get("nameOverride") or chart
    full = values.get("fullnameOverride") or (release if name in release else f"{release}-{name}")
    return full[:limit].rstrip("-")


def _kube_prometheus_stack(pin: ChartPin, values: Mapping[str, Any], release: str, namespace: str,
                           subcharts: Mapping[str, str]) -> Tuple[List[Monitor], List[Service]]:
    """The prometheus-operator's own ServiceMonitor, node-exporter's and kube-state-metrics' (subcharts at the
    versions `subcharts` names), with the Services they scrape. Sources: prometheus-community/helm-charts at tags
    kube-prometheus-stack-88.5.3, prometheus-node-exporter-4.56.1 and kube-state-metrics-8.4.0."""
    v = merged_values(pin, values)
    monitors: List[Monitor] = []
    services: List[Service] = []
    # templates/_helpers.tpl lines 3-5 (name), 14-25 (fullname, cut to 26), 76-87 (labels), 138-144 (namespace).
    name = v["nameOverride"] or pin.chart
    ns = v["namespaceOverride"] or namespace
    labels = {"app.kubernetes.io/instance": release, "app.kubernetes.io/part-of": name, "release": release,
              **v["commonLabels"]}
    operator = v["prometheusOperator"]
    if operator["enabled"]:
        # templates/prometheus-operator/_prometheus-operator.tpl lines 2-7 (labels); service.yaml lines 1-11 and
        # 40-56 (port http, or https with tls.enabled); servicemonitor.yaml lines 1-27 (the same port) and 40-46.
        operator_labels = {**labels, "app": f"{name}-operator", "app.kubernetes.io/name": f"{name}-prometheus-operator",
                           "app.kubernetes.io/component": "prometheus-operator"}
        port = "https" if operator["tls"]["enabled"] else "http"
        fullname = operator["fullnameOverride"] or f"{_fullname(v, pin.chart, release, 26)}-operator"
        services.append(Service(fullname, ns, {**operator_labels, **operator["service"]["labels"]}, (port,)))
        if operator["serviceMonitor"]["selfMonitor"]:
            monitors.append(Monitor("ServiceMonitor", fullname, ns,
                                    {**operator_labels, **operator["serviceMonitor"]["additionalLabels"]}, (ns,),
                                    {"app": f"{name}-operator", "release": release}, (port,)))
    for chart, enabled, render in (("prometheus-node-exporter", v["nodeExporter"]["enabled"], _node_exporter),
                                   ("kube-state-metrics", v["kubeStateMetrics"]["enabled"], _kube_state_metrics)):
        if enabled:   # Chart.yaml lines 54-61: each subchart's condition
            sub_pin = pin.model_copy(update={"chart": chart, "version": subcharts[chart]})
            sub_monitors, sub_services = render(merged_values(sub_pin, v[chart]), release, namespace)
            monitors += sub_monitors
            services += sub_services
    return monitors, services


def _node_exporter(v: Mapping[str, Any], release: str, namespace: str) -> Tuple[List[Monitor], List[Service]]:
    """prometheus-node-exporter: templates/_helpers.tpl lines 5-7 (name), 14-25 (fullname), 37-52 (labels; release
    with releaseLabel, which kube-prometheus-stack's values.yaml line 2733 sets), 57-60 (selector labels), 98-119
    (namespaces); service.yaml lines 1-11 and 38 (port service.portName); servicemonitor.yaml lines 1-35 (no
    namespace selector: its own namespace)."""
    name = v["nameOverride"] or "prometheus-node-exporter"
    fullname = _fullname(v, "prometheus-node-exporter", release)
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release}
    labels = {"app.kubernetes.io/component": "metrics", "app.kubernetes.io/part-of": name, **selector,
              **v["commonLabels"], **({"release": release} if v["releaseLabel"] else {})}
    monitor, port = v["prometheus"]["monitor"], v["service"]["portName"]
    monitor_namespace = v["namespaceOverride"] or monitor["namespace"] or namespace
    services = [Service(fullname, v["namespaceOverride"] or namespace, {**labels, **v["service"]["labels"]}, (port,))
                ] if v["service"]["enabled"] else []
    monitors = [Monitor("ServiceMonitor", fullname, monitor_namespace, {**labels, **monitor["additionalLabels"]},
                        (monitor_namespace,), monitor["selectorOverride"] or selector, (port,))
                ] if monitor["enabled"] else []
    return monitors, services


def _kube_state_metrics(v: Mapping[str, Any], release: str, namespace: str) -> Tuple[List[Monitor], List[Service]]:
    """kube-state-metrics: templates/_helpers.tpl lines 5-7 (name), 14-25 (fullname), 41-47 (namespace), 59-74
    (labels; release with releaseLabel, which kube-prometheus-stack's values.yaml line 2686 sets), 79-86 (selector
    labels); service.yaml lines 1-7 and 25-37 (port http, and metrics with selfMonitor); servicemonitor.yaml lines
    1-11, 27-42 and 80-81 (the same ports)."""
    name = v["nameOverride"] or "kube-state-metrics"
    fullname = _fullname(v, "kube-state-metrics", release)
    ns = v["namespaceOverride"] or namespace
    selector = v["selectorOverride"] or {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release}
    labels = {"app.kubernetes.io/component": "metrics", "app.kubernetes.io/part-of": name, **selector,
              **v["customLabels"], **({"release": release} if v["releaseLabel"] else {})}
    ports = ("http", "metrics") if v["selfMonitor"]["enabled"] else ("http",)
    monitor = v["prometheus"]["monitor"]
    monitors = [Monitor("ServiceMonitor", fullname, ns, {**labels, **monitor["additionalLabels"]},
                        tuple(monitor["namespaceSelector"] or (ns,)), monitor["selectorOverride"] or selector, ports)
                ] if monitor["enabled"] else []
    return monitors, [Service(fullname, ns, labels, ports)]


def _gpu_operator(pin: ChartPin, values: Mapping[str, Any], release: str,
                  namespace: str) -> Tuple[List[Monitor], List[Service]]:
    """The ServiceMonitors and Services the GPU operator itself creates from the ClusterPolicy the chart renders
    (NVIDIA/gpu-operator tag v26.7.0), all in the operator's namespace, the release's (controllers/object_controls.go
    line 5022):
    - DCGM exporter, when dcgmExporter.enabled and its serviceMonitor.enabled (controllers/state_manager.go lines
      1020-1021; object_controls.go lines 5045-5068): assets/state-dcgm-exporter/0500_service_monitor.yaml lines 4-18
      plus dcgmExporter.serviceMonitor.additionalLabels (templates/clusterpolicy.yaml lines 565-566,
      applyServiceMonitorCustomEdits lines 4980-4987); its Service 0400_service.yaml lines 5-17, port gpu-metrics;
    - node-status exporter, when nodeStatusExporter.enabled (state_manager.go lines 1027-1028):
      assets/state-node-status-exporter/0600_service_monitor.yaml lines 4-18, labels as written: no value reaches
      them (object_controls.go lines 5086-5093 apply no custom edits; the ClusterPolicy's nodeStatusExporter has no
      serviceMonitor field, api/nvidia/v1/clusterpolicy_types.go lines 1216-1241); its Service 0500_service.yaml
      lines 5-17, port node-status;
    - the operator's own metrics, always (state_manager.go lines 1049-1050):
      assets/state-operator-metrics/0300_service_monitor.yaml lines 4-18 plus
      operator.metrics.serviceMonitor.additionalLabels (clusterpolicy.yaml lines 32-37, object_controls.go lines
      5070-5084); its Service 0200_service.yaml lines 4-17, port gpu-operator-metrics."""
    v = merged_values(pin, values)
    monitors: List[Monitor] = []
    services: List[Service] = []

    def exporter(app: str, port: str, extra_labels: Mapping[str, str], monitored: bool) -> None:
        services.append(Service(app, namespace, {"app": app}, (port,)))
        if monitored:
            monitors.append(Monitor("ServiceMonitor", app, namespace, {"app": app, **extra_labels}, (namespace,),
                                    {"app": app}, (port,)))

    dcgm = v["dcgmExporter"]
    if dcgm["enabled"]:
        exporter("nvidia-dcgm-exporter", "gpu-metrics", dcgm["serviceMonitor"]["additionalLabels"],
                 dcgm["serviceMonitor"]["enabled"])
    if v["nodeStatusExporter"]["enabled"]:
        exporter("nvidia-node-status-exporter", "node-status", {}, True)
    # operator.metrics: only a comment in values.yaml (lines 121-125).
    operator_monitor = v["operator"].get("metrics", {}).get("serviceMonitor", {})
    exporter("gpu-operator", "gpu-operator-metrics", operator_monitor.get("additionalLabels", {}), True)
    return monitors, services


def _kueue(pin: ChartPin, values: Mapping[str, Any], release: str,
           namespace: str) -> Tuple[List[Monitor], List[Service]]:
    """kubernetes-sigs/kueue tag v0.19.2 charts/kueue: templates/_helpers.tpl lines 20-22 (name), 29-40 (fullname),
    52-68 (labels, selector labels), 73-76 (the metrics Service's labels); templates/manager/auth_proxy_service.yaml
    lines 17-33 (always rendered, ports from metricsService.ports, values.yaml lines 209-215);
    templates/prometheus/monitor.yaml lines 19-37 (only with enablePrometheus, values.yaml line 10; labels
    kueue.labels only, in the release's namespace, port https)."""
    v = merged_values(pin, values)
    name = v["nameOverride"] or pin.chart
    fullname = _fullname(v, pin.chart, release)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release,
              "control-plane": "controller-manager"}
    metrics_labels = {**labels, "app.kubernetes.io/component": "metrics-service"}
    services = [Service(f"{fullname}-controller-manager-metrics-service", namespace, metrics_labels,
                        tuple(port["name"] for port in v["metricsService"]["ports"]))]
    monitors = [Monitor("ServiceMonitor", f"{fullname}-controller-manager-metrics-monitor", namespace, labels,
                        (namespace,), metrics_labels, ("https",))] if v["enablePrometheus"] else []
    return monitors, services


def _node_termination_handler(pin: ChartPin, values: Mapping[str, Any], release: str,
                              namespace: str) -> Tuple[List[Monitor], List[Service]]:
    """aws/aws-node-termination-handler tag v1.25.1 (chart 0.27.1) config/helm/aws-node-termination-handler:
    templates/_helpers.tpl lines 6-8 (name), 15-26 (fullname), 46-57 (labels), 62-65 (the Deployment's labels),
    78-97 (selector labels); service.yaml lines 1-18 (queue mode with the Prometheus server: port http-metrics);
    servicemonitor.yaml lines 1-29 (queue mode, serviceMonitor.create); podmonitor.yaml lines 1-29 (IMDS mode,
    podMonitor.create)."""
    v = merged_values(pin, values)
    name = v["nameOverride"] or pin.chart
    fullname = _fullname(v, pin.chart, release)
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release}
    labels = {**selector, "app.kubernetes.io/part-of": release, **v["customLabels"]}
    queue, served = v["enableSqsTerminationDraining"], v["enablePrometheusServer"]
    monitors: List[Monitor] = []
    services: List[Service] = []
    if queue and served:
        services.append(Service(fullname, namespace, {**labels, "app.kubernetes.io/component": "deployment"},
                                ("http-metrics",)))
    for kind, own, component, wanted in (("ServiceMonitor", v["serviceMonitor"], "deployment", queue),
                                         ("PodMonitor", v["podMonitor"], "daemonset", not queue)):
        if wanted and served and own["create"]:
            monitors.append(Monitor(kind, fullname, own["namespace"] or namespace, {**labels, **own["labels"]},
                                    (namespace,), {**selector, "app.kubernetes.io/component": component},
                                    ("http-metrics",)))
    return monitors, services


# Charts with no monitor template (prometheus-community/helm-charts tag prometheus-adapter-5.3.0, aws/eks-charts
# bfe91c4b92 stable/aws-efa-k8s-device-plugin, kubernetes-sigs/aws-fsx-csi-driver tag
# helm-chart-aws-fsx-csi-driver-1.17.0), and charts whose one is behind serviceMonitor.enabled, false in their
# values.yaml (cluster-autoscaler 9.59.0 line 458, aws-load-balancer-controller 3.5.0 line 457).
_NO_MONITOR_TEMPLATE = (charts.PROMETHEUS_ADAPTER, charts.EFA_DEVICE_PLUGIN, charts.FSX_CSI_DRIVER)
_MONITOR_OFF = (charts.CLUSTER_AUTOSCALER, charts.AWS_LOAD_BALANCER_CONTROLLER)


def release_monitors(release: Mapping[str, Any], subcharts: Mapping[str, str]) -> Tuple[List[Monitor], List[Service]]:
    """The monitors and Services a Helm release's chart renders (or, for the GPU operator, makes), from the
    Release's inputs (chart, version, name, namespace, values). `subcharts`: kube-prometheus-stack's subchart
    versions. A chart not modelled here fails."""
    pins = {pin.chart_ref: pin for pin in charts.load_charts().charts.values()}
    pin = pins[release["chart"]]
    assert release["version"] == pin.version, f"{pin.chart}: release {release['version']} is not the pin {pin.version}"
    args = (pin, release["values"], release["name"], release["namespace"])
    if pin.chart == charts.KUBE_PROMETHEUS_STACK:
        return _kube_prometheus_stack(*args, subcharts)
    renderers = {charts.GPU_OPERATOR: _gpu_operator, charts.KUEUE: _kueue,
                 charts.NODE_TERMINATION_HANDLER: _node_termination_handler}
    if pin.chart in renderers:
        return renderers[pin.chart](*args)
    if pin.chart in _MONITOR_OFF:
        assert not merged_values(pin, release["values"])["serviceMonitor"]["enabled"], f"{pin.chart}: not modelled"
        return [], []
    assert pin.chart in _NO_MONITOR_TEMPLATE, f"{pin.chart}: what it renders for Prometheus is not modelled"
    return [], []
