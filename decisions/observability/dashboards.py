"""gpu-cloud's Grafana dashboards as code: six dashboard JSON models, rendered from plain values.

Pure: no Pulumi. The monitoring component turns `configmap_data()` into ConfigMaps that the Grafana sidecar of
kube-prometheus-stack loads (GRAFANA_SIDECAR_LABEL = GRAFANA_SIDECAR_LABEL_VALUE on the ConfigMap).

    gpu-fleet.json          GPUs from dcgm-exporter: utilisation, memory, temperature, power, XID, row remapping,
                            ECC, NVLink, throttling; per pool, node and GPU
    triton.json             Triton Inference Server: requests, failures, queue and compute time, p99, its GPUs
    node-verification.json  the boot-time verifier (userdata/gpu_verify.py): verdict, checks, duration, last run
    spot-drains.json        aws-node-termination-handler's actions and errors, GPU nodes by capacity type
    training-queue.json     Kueue: pending workloads and admission wait per ClusterQueue, quota used per flavor
    gpu-hours.json          the GPU-hour ledger (decisions/observability/gpu_hours.py): each pool's paid GPU-hours
                            by state, and each team namespace's busy and idle ones

Every metric name an expression uses is in decisions/observability/dashboards/metrics.yaml with the source that
documents it; tests/test_dashboards.py holds the table against the sources and every expression against the table and
promtool.

How series find their node and pool
-----------------------------------
No exporter here labels its series with the Kubernetes node name in a way that holds across the pinned versions
(dcgm-exporter renamed its Hostname label to hostname after 4.5.3-4.8.2; node-exporter's `instance` is an
address). Every exporter runs as a pod, though, and the scrape gives each series the exporter pod's `namespace`
and `pod`; kube-state-metrics' kube_pod_info maps those to `node`, and kube_node_labels maps `node` to the pool
and capacity labels of decisions/nodes/pools.py node_labels. For dcgm-exporter that needs the operator's ServiceMonitor
to keep honorLabels false (gpu-operator v26.7.0 default): the GPU's workload pod then arrives as `exported_pod` /
`exported_namespace` and the target's own `pod` / `namespace` stay the exporter's.

kube_node_labels carries the node labels only when kube-state-metrics is told to keep them:
decisions/observability/monitoring.py KUBE_STATE_NODE_LABELS (the chart value kube-state-metrics.metricLabelsAllowlist).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import yaml

from decisions.observability import gpu_hours as ledger
from decisions.observability.alert_rules import KUEUE_REPLICAS, QUEUE_DEEP_MINUTES, QUEUE_DEEP_PENDING
from decisions.observability.monitoring import CAPACITY_NODE_LABEL, POOL_NODE_LABEL, ksm_label
from decisions.platform.tenancy import INFERENCE_NAMESPACE

DATA_DIR = Path(__file__).resolve().parent / "dashboards"
METRICS_FILE = DATA_DIR / "metrics.yaml"

# Grafana's dashboard JSON schema version: the one Grafana 12.0 writes (grafana/grafana
# apps/dashboard/pkg/migration/schemaversion: v41.go; later 12.x releases migrate 41 forward on load, so one model
# serves every Grafana 12 the grafana chart 12.11.1 may bring).
SCHEMA_VERSION = 41

# kube-prometheus-stack 88.5.3 values.yaml: grafana.sidecar.dashboards.label / labelValue (lines 1539, 1540);
# searchNamespace ALL (line 1542), so the ConfigMaps may live in any namespace.
GRAFANA_SIDECAR_LABEL = "grafana_dashboard"
GRAFANA_SIDECAR_LABEL_VALUE = "1"
KPS_SIDECAR_VALUE_PATHS: Mapping[str, int] = {
    "grafana.sidecar.dashboards.label": 1539,
    "grafana.sidecar.dashboards.labelValue": 1540,
    "grafana.sidecar.dashboards.searchNamespace": 1542,
}


# aws-node-termination-handler's ServiceMonitor takes the job label from the Service's app.kubernetes.io/name
# (chart 0.27.1 templates/servicemonitor.yaml jobLabel), the chart name without nameOverride.
NTH_JOB = "aws-node-termination-handler"
# actions_total's node_action values (v1.25.1 NodeActionsInc callers: pkg/interruptionevent/draincordon/handler.go
# "cordon", "cordon-and-drain"; pkg/interruptionevent/internal/common/handler.go "pre-drain", "post-drain";
# cmd/node-termination-handler.go "uncordon"); node_status is "success" or "error".
NTH_DRAIN_ACTION = "cordon-and-drain"


DATASOURCE_VAR = "datasource"
DATASOURCE = {"type": "prometheus", "uid": "${%s}" % DATASOURCE_VAR}
# What a PromQL check substitutes for Grafana's interval variables (Grafana fills them in before querying).
# `$__range_s` before `$__range`, which it begins with.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range_s": "3600", "$__range": "1h"}


# --- the metric table ------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def metric_table() -> Dict[str, Any]:
    """decisions/observability/dashboards/metrics.yaml: {"sources": {key: {...}}, "metrics": {name: {"source",
    "type"}}}, checked."""
    data = yaml.safe_load(METRICS_FILE.read_text(encoding="utf-8"))
    sources, metrics = data["sources"], data["metrics"]
    for name, entry in metrics.items():
        if entry.get("source") not in sources:
            raise ValueError(f"{METRICS_FILE.name}: {name} names unknown source {entry.get('source')!r}")
        if entry.get("type") not in ("counter", "gauge", "summary", "histogram"):
            raise ValueError(f"{METRICS_FILE.name}: {name} has type {entry.get('type')!r}")
    return data


def documented_metrics() -> Dict[str, str]:
    """Metric name -> source key."""
    return {name: entry["source"] for name, entry in metric_table()["metrics"].items()}


POOL = ksm_label(POOL_NODE_LABEL)            # label_gpu_cloud_io_pool
CAPACITY = ksm_label(CAPACITY_NODE_LABEL)    # label_gpu_cloud_io_capacity
RATE = "$__rate_interval"


# --- PromQL building blocks ------------------------------------------------------------------------------------

def on_node(series: str, node_filter: str = 'node=~"$node"') -> str:
    """`series` (scraped from an exporter pod) with the exporter pod's node as label `node`; only nodes matching
    `node_filter` are kept."""
    return (f"({series}) * on (namespace, pod) group_left (node) "
            f"max by (namespace, pod, node) (kube_pod_info{{{node_filter}}})")


def with_pool(series: str) -> str:
    """`series` (with a `node` label) with its node's pool label; only nodes of the chosen pools are kept."""
    return (f"({series}) * on (node) group_left ({POOL}) "
            f'max by (node, {POOL}) (kube_node_labels{{{POOL}=~"$pool"}})')


def _rate(metric: str, selector: str = "") -> str:
    return f"rate({metric}{selector}[{RATE}])"


# --- dashboard assembly ----------------------------------------------------------------------------------------

class _Board:
    """Collects panels left to right, top to bottom on Grafana's 24-column grid, numbering them from 1."""

    def __init__(self) -> None:
        self.panels: List[Dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def _place(self, w: int, h: int) -> Dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append({"id": len(self.panels) + 1, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []})
        self.y += 1

    def panel(self, kind: str, title: str, targets: Sequence[Tuple[str, str]], *, unit: str = "short",
              description: str = "", w: int = 12, h: int = 8, table: bool = False,
              minimum: Optional[float] = None, maximum: Optional[float] = None,
              thresholds: Sequence[Tuple[Optional[float], str]] = ((None, "green"),),
              options: Optional[Dict[str, Any]] = None) -> None:
        """`targets`: (PromQL, legend) pairs. `table`: instant queries formatted as a table."""
        defaults: Dict[str, Any] = {
            "unit": unit,
            "thresholds": {"mode": "absolute",
                           "steps": [{"color": color, "value": value} for value, color in thresholds]},
        }
        if minimum is not None:
            defaults["min"] = minimum
        if maximum is not None:
            defaults["max"] = maximum
        self.panels.append({
            "id": len(self.panels) + 1,
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DATASOURCE,
            "gridPos": self._place(w, h),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": dict(options or {}),
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                 "range": not table, "instant": table, "format": "table" if table else "time_series"}
                for i, (expr, legend) in enumerate(targets)],
        })


def _datasource_variable() -> Dict[str, Any]:
    return {"name": DATASOURCE_VAR, "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "multi": False, "includeAll": False, "options": []}


def _query_variable(name: str, label: str, query: str, *, multi: bool = True) -> Dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"{name}-variable"}, "definition": query,
            "current": {}, "hide": 0, "refresh": 2, "regex": "", "sort": 1,
            "multi": multi, "includeAll": multi, "options": []}


def _pool_node_variables() -> List[Dict[str, Any]]:
    return [
        _query_variable("pool", "Pool", f'label_values(kube_node_labels{{{POOL}!=""}}, {POOL})'),
        _query_variable("node", "Node", f'label_values(kube_node_labels{{{POOL}=~"$pool"}}, node)'),
    ]


def _dashboard(uid: str, title: str, description: str, board: _Board,
               variables: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpu-cloud"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": False,
        "graphTooltip": 1,
        "timezone": "utc",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
            "type": "dashboard"}]},
        "links": [],
        "templating": {"list": [_datasource_variable(), *variables]},
        "panels": board.panels,
    }


# --- 1. GPU fleet (dcgm-exporter) ------------------------------------------------------------------------------

_NEEDS_EXTRA = " Exported through gpu-cloud's counter file (decisions/observability/dcgm.py EXTRA_COUNTERS)."
_GPU = "{{node}} GPU {{gpu}}"


def gpu_fleet() -> Dict[str, Any]:
    util = on_node("DCGM_FI_DEV_GPU_UTIL")
    mem_pct = on_node("100 * DCGM_FI_DEV_FB_USED / "
                      "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED)")
    xid_seen = on_node("max_over_time(DCGM_FI_DEV_XID_ERRORS[$__range]) > 0")
    b = _Board()
    b.row("Fleet")
    b.panel("stat", "GPUs reporting", [(f"count({util})", "")], w=4, h=4,
            description="GPUs dcgm-exporter reports on the chosen nodes.")
    b.panel("stat", "Mean utilisation", [(f"avg({util})", "")], unit="percent", w=4, h=4,
            minimum=0, maximum=100)
    b.panel("stat", "Mean memory used", [(f"avg({mem_pct})", "")], unit="percent", w=4, h=4,
            minimum=0, maximum=100)
    b.panel("stat", "Hottest GPU", [(f"max({on_node('DCGM_FI_DEV_GPU_TEMP')})", "")], unit="celsius",
            w=4, h=4, thresholds=((None, "green"), (80, "orange"), (87, "red")))
    b.panel("stat", "GPUs with an XID in range", [(f"count({xid_seen}) or vector(0)", "")], w=4, h=4,
            thresholds=((None, "green"), (1, "red")),
            description="GPUs whose last-XID gauge was non-zero at some point in the time range.")
    b.panel("stat", "Row remap failures", [(f"sum({on_node('DCGM_FI_DEV_ROW_REMAP_FAILURE')}) or vector(0)", "")],
            w=4, h=4, thresholds=((None, "green"), (1, "red")),
            description="GPUs that could not remap a failing memory row: replace the node.")

    b.row("By pool")
    b.panel("timeseries", "Utilisation by pool", [(f"avg by ({POOL}) ({with_pool(util)})", f"{{{{{POOL}}}}}")],
            unit="percent", minimum=0, maximum=100)
    used = with_pool(on_node("DCGM_FI_DEV_FB_USED"))
    total = with_pool(on_node("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED"))
    b.panel("timeseries", "Memory used by pool", [(f"100 * sum by ({POOL}) ({used}) / sum by ({POOL}) ({total})",
                                                   f"{{{{{POOL}}}}}")], unit="percent", minimum=0, maximum=100)

    b.row("Per GPU")
    b.panel("timeseries", "Utilisation", [(util, _GPU)], unit="percent", minimum=0, maximum=100)
    b.panel("timeseries", "Memory used", [(mem_pct, _GPU)], unit="percent", minimum=0, maximum=100,
            description="Framebuffer used of used + free + reserved.")
    b.panel("timeseries", "Temperature", [(on_node("DCGM_FI_DEV_GPU_TEMP"), f"{_GPU} core"),
                                          (on_node("DCGM_FI_DEV_MEMORY_TEMP"), f"{_GPU} memory")],
            unit="celsius")
    b.panel("timeseries", "Power draw", [(on_node("DCGM_FI_DEV_POWER_USAGE"), _GPU)], unit="watt")

    b.row("Errors")
    b.panel("table", "Last XID per GPU in range", [(xid_seen, "")], table=True,
            description="The XID code each GPU last reported, for GPUs that reported one in the time range.")
    b.panel("timeseries", "Remapped rows", [
        (on_node("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), f"{_GPU} correctable"),
        (on_node("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), f"{_GPU} uncorrectable"),
        (on_node("DCGM_FI_DEV_ROW_REMAP_FAILURE"), f"{_GPU} remap failed")])
    b.panel("timeseries", "ECC errors", [
        (on_node(_rate("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")), f"{_GPU} single-bit"),
        (on_node(_rate("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")), f"{_GPU} double-bit")], unit="cps",
        description="Volatile ECC error rate." + _NEEDS_EXTRA)
    b.panel("timeseries", "PCIe replays", [(on_node(_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")), _GPU)], unit="cps")

    b.row("NVLink")
    b.panel("timeseries", "NVLink traffic", [(on_node(_rate("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")), _GPU)],
            description="Rate of the NVLink bandwidth counter, all links of the GPU.")
    b.panel("timeseries", "NVLink errors", [
        (on_node(_rate("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")), f"{_GPU} CRC flit"),
        (on_node(_rate("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")), f"{_GPU} CRC data"),
        (on_node(_rate("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL")), f"{_GPU} replay"),
        (on_node(_rate("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")), f"{_GPU} recovery")], unit="cps",
        description="Error rates over all NVLinks of the GPU." + _NEEDS_EXTRA)

    b.row("Throttling")
    b.panel("timeseries", "SM clock", [(on_node("DCGM_FI_DEV_SM_CLOCK"), _GPU)], unit="rotmhz",
            description="A clock that drops while the GPU is busy is being held back.")
    b.panel("timeseries", "Time throttled", [
        (on_node(_rate("DCGM_FI_DEV_POWER_VIOLATION") + " / 1e9"), f"{_GPU} power"),
        (on_node(_rate("DCGM_FI_DEV_THERMAL_VIOLATION") + " / 1e9"), f"{_GPU} thermal")],
        unit="percentunit", minimum=0, description="Share of time the GPU ran below its clocks." + _NEEDS_EXTRA)
    return _dashboard("gpu-cloud-gpu-fleet", "gpu-cloud / GPU fleet",
                      "GPUs as dcgm-exporter sees them, per pool, node and GPU.", b, _pool_node_variables())


# --- 2. Triton -------------------------------------------------------------------------------------------------

def triton() -> Dict[str, Any]:
    sel = '{namespace=~"$namespace", pod=~"$pod", model=~"$model"}'
    gpu_sel = '{namespace=~"$namespace", pod=~"$pod"}'

    def per_model(metric: str) -> str:
        return f"sum by (model) ({_rate(metric, sel)})"

    requests = f'({per_model("nv_inference_request_success")} + {per_model("nv_inference_request_failure")})'
    ok = per_model("nv_inference_request_success")
    b = _Board()
    b.row("Requests")
    b.panel("timeseries", "Requests", [(ok, "{{model}} success"),
                                       (per_model("nv_inference_request_failure"), "{{model}} failure")],
            unit="reqps")
    b.panel("timeseries", "Failed requests", [(f'100 * {per_model("nv_inference_request_failure")} / {requests}',
                                               "{{model}}")], unit="percent", minimum=0,
            description="Failures of all requests.")
    b.panel("timeseries", "Inferences and batch size", [
        (per_model("nv_inference_count"), "{{model}} inferences/s"),
        (f'{per_model("nv_inference_count")} / {per_model("nv_inference_exec_count")}', "{{model}} mean batch")])
    b.panel("timeseries", "Pending requests", [(f"sum by (model) (nv_inference_pending_request_count{sel})",
                                                "{{model}}")],
            description="Requests queued in Triton, waiting for a model instance.")

    b.row("Latency")
    b.panel("timeseries", "Queue time per request", [
        (f'{per_model("nv_inference_queue_duration_us")} / {ok} / 1000', "{{model}}")], unit="ms",
        description="Mean time a successful request waited in the scheduler queue.")
    compute = " + ".join(per_model(m) for m in ("nv_inference_compute_input_duration_us",
                                                "nv_inference_compute_infer_duration_us",
                                                "nv_inference_compute_output_duration_us"))
    b.panel("timeseries", "Compute time per request", [
        (f"({compute}) / {ok} / 1000", "{{model}} input + infer + output"),
        (f'{per_model("nv_inference_compute_infer_duration_us")} / {ok} / 1000', "{{model}} infer")], unit="ms")
    b.panel("timeseries", "Request time per request", [
        (f'{per_model("nv_inference_request_duration_us")} / {ok} / 1000', "{{model}}")], unit="ms",
        description="Mean end-to-end handling time inside Triton.")
    p99_sel = sel[:-1] + ', quantile="0.99"}'
    b.panel("timeseries", "p99 request time", [
        (f"max by (model) (nv_inference_request_summary_us{p99_sel}) / 1000", "{{model}}")], unit="ms",
        description="Highest p99 of any Triton pod (quantiles of pods cannot be merged). Needs Triton started "
                    "with --metrics-config summary_latencies=true.")

    b.row("GPUs of the Triton pods")
    b.panel("timeseries", "GPU utilisation (Triton)", [
        (f"100 * max by (pod, gpu_uuid) (nv_gpu_utilization{gpu_sel})", "{{pod}} {{gpu_uuid}}")],
        unit="percent", minimum=0, maximum=100)
    b.panel("timeseries", "GPU memory used (Triton)", [
        (f"100 * max by (pod, gpu_uuid) (nv_gpu_memory_used_bytes{gpu_sel}) / "
         f"max by (pod, gpu_uuid) (nv_gpu_memory_total_bytes{gpu_sel})", "{{pod}} {{gpu_uuid}}")],
        unit="percent", minimum=0, maximum=100)
    b.panel("timeseries", "GPU utilisation (DCGM)", [
        (on_node('DCGM_FI_DEV_GPU_UTIL{exported_namespace=~"$namespace", exported_pod=~"$pod"}', 'node=~".+"'),
         "{{exported_pod}} {{node}} GPU {{gpu}}")], unit="percent", minimum=0, maximum=100, w=24,
        description="The same GPUs from dcgm-exporter, which names the pod using each GPU. With time-slicing the "
                    "figure is the whole GPU's, shared with the other pods on it.")
    variables = [
        _query_variable("namespace", "Namespace", "label_values(nv_inference_request_success, namespace)"),
        _query_variable("pod", "Pod", 'label_values(nv_inference_request_success{namespace=~"$namespace"}, pod)'),
        _query_variable("model", "Model",
                        'label_values(nv_inference_request_success{namespace=~"$namespace", pod=~"$pod"}, model)'),
    ]
    variables[0]["current"] = {"text": INFERENCE_NAMESPACE, "value": INFERENCE_NAMESPACE}
    return _dashboard("gpu-cloud-triton", "gpu-cloud / Triton",
                      "Triton Inference Server: requests, latency and the GPUs it runs on.", b, variables)


# --- 3. Node verification --------------------------------------------------------------------------------------

def node_verification() -> Dict[str, Any]:
    b = _Board()
    problems = 'gpu_cloud_node_verify_check_status{status=~"fail|warn"} == 1'
    b.row("Verdicts")
    b.panel("stat", "Nodes reporting", [(f"count({on_node('gpu_cloud_node_verify_pass')})", "")], w=6, h=4)
    b.panel("stat", "Nodes not passing",
            [(f"count({on_node('gpu_cloud_node_verify_pass == 0')}) or vector(0)", "")], w=6, h=4,
            thresholds=((None, "green"), (1, "red")))
    b.panel("stat", "Failing or warning checks", [(f"count({on_node(problems)}) or vector(0)", "")], w=6, h=4,
            thresholds=((None, "green"), (1, "orange")))
    b.panel("stat", "Slowest verification",
            [(f"max({on_node('gpu_cloud_node_verify_duration_seconds')})", "")], unit="s", w=6, h=4)
    b.panel("table", "Verdict per node", [
        (f"max by (node, {POOL}, verdict) ({with_pool(on_node('gpu_cloud_node_verify_verdict == 1'))})", "")],
        table=True, description="The verdict of each node's last verification (pass, fail or error).")
    b.panel("table", "Failing and warning checks", [
        (f"max by (node, check, gpu, status) ({on_node(problems)})", "")], table=True,
        description="Checks of the last verification that failed or warned; gpu is empty for node-wide checks.")

    b.row("Runs")
    b.panel("timeseries", "Verification duration",
            [(on_node("gpu_cloud_node_verify_duration_seconds"), "{{node}}")], unit="s")
    b.panel("table", "Last run", [
        (f"max by (node) ({on_node('gpu_cloud_node_verify_timestamp_seconds')}) * 1000", "")],
        table=True, unit="dateTimeAsIso", description="When each node's last verification finished.")
    b.panel("table", "Time since last run", [
        (f"time() - max by (node) ({on_node('gpu_cloud_node_verify_timestamp_seconds')})", "")],
        table=True, unit="s", description="The verifier runs once, at boot: this is about the node's uptime.")
    b.panel("table", "Outcomes by check", [
        (f"sum by (check, status) ({on_node('gpu_cloud_node_verify_check_status == 1')})", "")], table=True, w=24,
        description="How many nodes (and GPUs) each check passed, failed, warned or skipped on.")
    b.panel("table", "Fault classes found at boot", [
        (f"max by (node, fault, status, remediation) ({on_node('gpu_cloud_node_verify_fault == 1')})", "")],
        table=True, description="The fault classes (decisions/nodes/faults.yaml) the boot gate found, "
        "with the remediation "
        "the table gives.")
    b.panel("table", "Remediation asked at boot", [
        (f"max by (node, remediation) ({on_node('gpu_cloud_node_verify_remediation == 1')})", "")], table=True,
        description="The strongest remediation the boot gate's failed fault classes ask for.")

    # The run-time checker: the same verifier, every few minutes, with what a workload does not disturb.
    health = lambda metric: on_node(f"gpu_cloud_node_health_{metric}")          # noqa: E731
    problems_now = 'gpu_cloud_node_health_check_status{status=~"fail|warn"} == 1'
    b.row("While running")
    b.panel("stat", "Nodes checked", [(f"count({health('pass')})", "")], w=6, h=4)
    b.panel("stat", "Nodes failing their health check",
            [(f"count({health('pass == 0')}) or vector(0)", "")], w=6, h=4, thresholds=((None, "green"), (1, "red")))
    b.panel("stat", "Slowest health check", [(f"max({health('duration_seconds')})", "")], unit="s", w=6, h=4)
    b.panel("stat", "Oldest health check",
            [(f"time() - min({health('timestamp_seconds')})", "")], unit="s", w=6, h=4,
            description="Seconds since the least recent node's check: it runs every few minutes.")
    b.panel("table", "Health verdict per node", [
        (f"max by (node, {POOL}, verdict) ({with_pool(health('verdict == 1'))})", "")], table=True)
    b.panel("table", "Failing and warning checks now", [
        (f"max by (node, check, gpu, status) ({on_node(problems_now)})", "")], table=True)
    b.panel("table", "Fault classes found while running", [
        (f"max by (node, fault, status, remediation) ({health('fault == 1')})", "")], table=True,
        description="What the run-time checker found, with the fault table's remediation: the repair path acts on "
        "the failing ones.")
    b.panel("table", "Remediation asked now", [
        (f"max by (node, remediation) ({health('remediation == 1')})", "")], table=True)

    # The repair controller (jobs/node_repair.py): the gate's published verdicts, its repairs and its brakes.
    pools = 'pool=~"$pool"'
    b.row("Rejections and repairs")
    b.panel("stat", "Gate rejections, last hour", [(f'sum(gpu_cloud_gate_verdicts{{verdict="fail", {pools}}}) '
                                                    "or vector(0)", "")], w=6, h=4,
            thresholds=((None, "green"), (1, "orange")),
            description="Boots the gate refused (launch or reboot), from the verdicts it publishes to S3.")
    b.panel("stat", "Pools braked", [(f"sum(gpu_cloud_pool_launch_suspended{{{pools}}}) or vector(0)", "")], w=6, h=4,
            thresholds=((None, "green"), (1, "red")),
            description="Pools whose Launch process is suspended: rejected launches in a row, until a person resumes.")
    b.panel("stat", "Repairs in flight", [(f"sum(gpu_cloud_repairs_in_flight{{{pools}}}) or vector(0)", "")],
            w=6, h=4)
    b.panel("stat", "Dry run", [("max(gpu_cloud_repair_dry_run)", "")], w=6, h=4,
            description="1: the controller decides and reports every repair and carries out none.")
    b.panel("table", "Rejected boots, last hour", [
        (f"max by (pool, instance_id, instance_type, mode, reason) "
         f"(gpu_cloud_gate_rejection_timestamp_seconds{{{pools}}}) * 1000", "")], table=True, unit="dateTimeAsIso",
        description="Each rejected boot with the gate's reason; the full report is in the artifact bucket under "
        "gate-reports/<pool>/.")
    b.panel("timeseries", "Repair decisions", [
        (f"sum by (pool, action, outcome) (increase(gpu_cloud_repair_decisions_total{{{pools}}}[{RATE}]))",
         "{{pool}} {{action}} {{outcome}}")],
        description="Repairs started, dry-run decisions and refusals (budget, minimum healthy, one at a time, too "
        "many faulty at once); kubectl get events -A --field-selector involvedObject.kind=Node says which node.")
    b.panel("table", "Budget and rejections in a row", [
        (f"max by (pool) (gpu_cloud_repair_budget_remaining{{{pools}}})", ""),
        (f"max by (pool) (gpu_cloud_gate_consecutive_rejections{{{pools}}})", "")], table=True, w=24,
        description="Repairs each pool may still start this hour, and its launches rejected in a row (a pool is "
        "braked at three).")
    return _dashboard(
        "gpu-cloud-node-verification", "gpu-cloud / Node verification",
        "The GPU verifier's textfile metrics, scraped by node-exporter: the boot gate's (gpu_cloud_node_verify_*) and "
        "the run-time checker's (gpu_cloud_node_health_*); and the repair controller's (gpu_cloud_gate_*, "
        "gpu_cloud_repair_*): a node the gate rejects never joins, so its verdict comes from the report it published.",
        b, _pool_node_variables())


# --- 4. Spot interruptions and drains --------------------------------------------------------------------------

def spot_drains() -> Dict[str, Any]:
    nth = f'job="{NTH_JOB}"'
    gpu_nodes = f'kube_node_labels{{{CAPACITY}!="", {POOL}=~"$pool"}}'
    capacity_of_node = f"max by (node, {CAPACITY}) ({gpu_nodes})"

    def by_capacity(node_series: str) -> str:
        return f"count by ({CAPACITY}) (({node_series}) * on (node) group_left ({CAPACITY}) {capacity_of_node})"

    b = _Board()
    b.row("Termination handler")
    b.panel("stat", "Drains in range", [
        (f'sum(increase(actions_total{{{nth}, node_action="{NTH_DRAIN_ACTION}"}}[$__range])) or vector(0)', "")],
        w=6, h=4)
    b.panel("stat", "Failed actions in range", [
        (f'sum(increase(actions_total{{{nth}, node_status="error"}}[$__range])) or vector(0)', "")], w=6, h=4,
        thresholds=((None, "green"), (1, "red")))
    b.panel("stat", "Queue errors in range", [
        (f"sum(increase(events_error_total{{{nth}}}[$__range])) or vector(0)", "")], w=6, h=4,
        thresholds=((None, "green"), (1, "orange")),
        description="Failures reading or handling the SQS drain queue.")
    b.panel("stat", "Managed nodes / instances", [(f"max(nth_tagged_nodes{{{nth}}})", "nodes"),
                                                  (f"max(nth_tagged_instances{{{nth}}})", "instances")],
            w=6, h=4, description="Nodes of the cluster and EC2 instances that carry the managed tag.")
    b.panel("timeseries", "Actions", [
        (f"sum by (node_action, node_status) (increase(actions_total{{{nth}}}[{RATE}]))",
         "{{node_action}} {{node_status}}")],
        options={"legend": {"displayMode": "table", "placement": "right"}},
        description="Cordons, drains and the lifecycle steps around them, as the termination handler counts them.")
    b.panel("timeseries", "Queue errors", [
        (f"sum by (event_error_where) (increase(events_error_total{{{nth}}}[{RATE}]))", "{{event_error_where}}")])

    b.row("GPU nodes by capacity type")
    b.panel("timeseries", "Nodes by capacity", [(f"count by ({CAPACITY}) ({gpu_nodes})", f"{{{{{CAPACITY}}}}}")])
    b.panel("timeseries", "Nodes by pool", [
        (f"count by ({POOL}, {CAPACITY}) ({gpu_nodes})", f"{{{{{POOL}}}}} ({{{{{CAPACITY}}}}})")])
    b.panel("timeseries", "Cordoned nodes by capacity", [(by_capacity("kube_node_spec_unschedulable == 1"),
                                                          f"{{{{{CAPACITY}}}}}")],
            description="Nodes marked unschedulable: being drained, or cordoned by hand.")
    b.panel("timeseries", "Not ready nodes by capacity", [
        (by_capacity('kube_node_status_condition{condition="Ready", status="true"} == 0'), f"{{{{{CAPACITY}}}}}")])
    return _dashboard("gpu-cloud-spot-drains", "gpu-cloud / Spot interruptions and drains",
                      "What aws-node-termination-handler did with the drain queue, and the GPU nodes by capacity.",
                      b, [_query_variable("pool", "Pool", f'label_values(kube_node_labels{{{POOL}!=""}}, {POOL})')])


# --- 5. The training queue (Kueue) ----------------------------------------------------------------------------

def training_queue() -> Dict[str, Any]:
    """Kueue's own series (kubernetes-sigs/kueue v0.19.2 pkg/metrics/metrics.go): per ClusterQueue, pending workloads
    by status (active: waiting to be tried; inadmissible: tried, waiting for something to change) and the time from
    creation or requeue to admission; per flavor (one per pool: decisions/platform/kueue.py) and resource, quota and
    use, which Kueue reports with metrics.enableClusterQueueResources."""
    queues = f'cluster_queue=~"$cluster_queue", {KUEUE_REPLICAS}'
    flavors = f'{queues}, flavor=~"$flavor"'
    pending = f"sum by (cluster_queue, status) (kueue_pending_workloads{{{queues}}})"

    def wait(quantile: str) -> str:
        return (f"histogram_quantile({quantile}, sum by (le, cluster_queue, priority_class) "
                f"({_rate('kueue_admission_wait_time_seconds_bucket', '{' + queues + '}')}))")

    b = _Board()
    b.row("Queue depth")
    b.panel("stat", "Pending workloads", [(f"sum(kueue_pending_workloads{{{queues}}})", "")], w=8, h=4,
            thresholds=((None, "green"), (QUEUE_DEEP_PENDING + 1, "orange")),
            description=f"Workloads not admitted yet. Above {QUEUE_DEEP_PENDING} for {QUEUE_DEEP_MINUTES} minutes, "
                        "TrainingQueueDeep warns: the flavors they fit have no quota left.")
    b.panel("stat", "Admitted workloads", [(f"sum(kueue_admitted_active_workloads{{{queues}}})", "")], w=8, h=4)
    b.panel("stat", "GPUs asked for by pending workloads",
            [(f'sum(kueue_cluster_queue_resource_pending{{{queues}, resource="nvidia.com/gpu"}})', "")], w=8, h=4,
            description="What the pending workloads request; no flavor is assigned to them yet.")
    b.panel("timeseries", "Pending workloads", [(pending, "{{cluster_queue}} {{status}}")],
            description="active: waiting for their turn; inadmissible: tried and did not fit, retried when quota "
                        "frees up or the queue changes.")
    b.panel("timeseries", "Admission wait", [(wait("0.5"), "{{cluster_queue}} {{priority_class}} p50"),
                                             (wait("0.9"), "{{cluster_queue}} {{priority_class}} p90")], unit="s",
            description="From a workload's creation (or requeue) to its admission, by priority class.")

    b.row("Flavors (one per pool)")
    used = f"sum by (flavor, resource) (kueue_cluster_queue_resource_usage{{{flavors}}})"
    quota = f"sum by (flavor, resource) (kueue_cluster_queue_nominal_quota{{{flavors}}})"
    b.panel("timeseries", "Quota used by flavor", [(f"100 * {used} / ({quota} > 0)", "{{flavor}} {{resource}}")],
            unit="percent", minimum=0, maximum=100,
            description="Admitted workloads' requests over the flavor's quota, its pool at maxNodes. A flavor at "
                        "100 % admits nothing more.")
    b.panel("table", "Quota and use by flavor", [(quota, ""), (used, "")], table=True,
            description="Each flavor's quota (A) and what admitted workloads use of it (B), per resource.")
    variables = [
        _query_variable("cluster_queue", "ClusterQueue", "label_values(kueue_pending_workloads, cluster_queue)"),
        _query_variable("flavor", "Flavor (pool)", "label_values(kueue_cluster_queue_nominal_quota, flavor)"),
    ]
    return _dashboard("gpu-cloud-training-queue", "gpu-cloud / Training queue",
                      "Kueue's training queue: how deep it is, how long jobs wait, and how full each flavor is.",
                      b, variables)


# --- 6. Where GPU-hours go ------------------------------------------------------------------------------------

def gpu_hours() -> Dict[str, Any]:
    """The ledger's recorded GPU counts (decisions/observability/gpu_hours.py), as GPU-hours over the dashboard's
    range: the count's average over the range times its hours."""
    pools = 'pool=~"$pool"'
    teams = f'{pools}, namespace=~"$namespace"'

    def hours(selector: str, by: str) -> str:
        return f"sum by ({by}) (avg_over_time({selector}[$__range])) * $__range_s / 3600"

    b = _Board()
    b.row("Paid GPU-hours by state")
    for state, title, color in (("busy", "Busy", "green"), ("allocated_idle", "Allocated, idle", "orange"),
                                ("unallocated", "Unallocated", "yellow"),
                                ("booting_or_gated", "Booting or gated", "blue"),
                                ("draining", "Draining", "purple"), ("repair", "In repair", "red")):
        selector = f'{ledger.POOL_STATE}{{{pools}, state="{state}"}}'
        b.panel("stat", title, [(f"sum({hours(selector, 'pool')}) or vector(0)", "")], w=4, h=4,
                thresholds=((None, color),),
                description=f"GPU-hours in the range the chosen pools spent {title.lower()}.")
    b.panel("timeseries", "GPUs by state", [
        (f"sum by (state) ({ledger.POOL_STATE}{{{pools}}})", "{{state}}"),
        (f"sum({ledger.POOL_PAID}{{{pools}}})", "paid")], w=24,
        options={"legend": {"displayMode": "table", "placement": "right"}},
        description="Paid GPUs and where they are now: the states add up to the paid line. A reserved or "
                    "capacity-block pool is paid at its reservation's whole size; an on-demand or spot pool for its "
                    "registered nodes (instances still booting before they register are not seen).")
    b.panel("table", "GPU-hours by pool and state", [(hours(f"{ledger.POOL_STATE}{{{pools}}}", "pool, state"), ""),
                                                      (hours(f"{ledger.POOL_PAID}{{{pools}}}", "pool, capacity"), "")],
            table=True, w=24, description="Each pool's GPU-hours in the range by state (A) and paid (B).")

    b.row("Teams")
    b.panel("table", "GPU-hours by team namespace", [
        (hours(f"{ledger.NAMESPACE_STATE}{{{teams}}}", "namespace, pool, state"), "")], table=True,
        description="GPU-hours the namespace's pods held, busy or idle (a GPU under "
                    f"{ledger.BUSY_PCT} % busy is idle).")
    b.panel("timeseries", "Team GPUs held, busy and idle", [
        (f"sum by (namespace, state) ({ledger.NAMESPACE_STATE}{{{teams}}})", "{{namespace}} {{state}}")],
        description="GPU-equivalents held by each namespace's pods (a time-sliced replica is a share of a GPU).")
    variables = [
        _query_variable("pool", "Pool", f"label_values({ledger.POOL_PAID}, pool)"),
        _query_variable("namespace", "Namespace", f"label_values({ledger.NAMESPACE_ALLOCATED}, namespace)"),
    ]
    return _dashboard("gpu-cloud-gpu-hours", "gpu-cloud / Where GPU-hours go",
                      "Each pool's paid GPU-hours split into busy, allocated but idle, unallocated, booting or gated, "
                      "draining and in repair, and each team namespace's share.", b, variables)


# --- the set ---------------------------------------------------------------------------------------------------

def dashboards() -> Dict[str, Dict[str, Any]]:
    """File name -> Grafana dashboard JSON model."""
    return {
        "gpu-fleet.json": gpu_fleet(),
        "triton.json": triton(),
        "node-verification.json": node_verification(),
        "spot-drains.json": spot_drains(),
        "training-queue.json": training_queue(),
        "gpu-hours.json": gpu_hours(),
    }


def configmap_data() -> Dict[str, str]:
    """The dashboards as ConfigMap data (file name -> JSON text, stable byte for byte)."""
    return {name: json.dumps(model, indent=2, sort_keys=True) + "\n" for name, model in dashboards().items()}


def expressions(model: Mapping[str, Any]) -> Iterator[Tuple[str, str]]:
    """(where, PromQL) for every panel target of a dashboard model (variables' label_values() excluded)."""
    for panel in model["panels"]:
        for target in panel.get("targets", ()):
            yield f"{model['uid']} panel {panel['id']} {target['refId']}", target["expr"]


def variable_queries(model: Mapping[str, Any]) -> Iterator[Tuple[str, str]]:
    """(variable name, query) of every query variable."""
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["name"], variable["query"]["query"]


_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                       "bool", "offset", "inf", "nan"})


def metric_names(expr: str) -> Set[str]:
    """Metric names a PromQL expression selects (a lexical reading, enough for the expressions built here):
    identifiers that are neither function names, keywords, label names in braces or grouping clauses, nor
    inside strings, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                           # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                                     # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)                                    # ranges, subqueries
    text = re.sub(r"\$\{?\w+(?::\w+)?\}?", " ", text)                          # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d+[eE]\d+", name):
            continue
        names.add(name)
    return names
