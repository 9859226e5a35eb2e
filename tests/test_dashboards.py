"""decisions/observability/dashboards.py: the Grafana dashboards are valid models, every PromQL expression parses
(promtool), and every metric name they use is documented by its source (decisions/observability/dashboards/metrics.yaml,
held entry by entry)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
import yaml

from decisions.catalog.catalog import load_catalog
from decisions.catalog.charts import KUBE_PROMETHEUS_STACK, chart
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import node_labels
from decisions.observability import dashboards as d, dcgm, monitoring
from tests.chart_values import values_file
from tests.conftest import require_tool
from userdata import gpu_verify

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import metric_sources  # noqa: E402

MODELS = d.dashboards()
UIDS = {
    "gpu-fleet.json": "gpu-cloud-gpu-fleet",
    "triton.json": "gpu-cloud-triton",
    "node-verification.json": "gpu-cloud-node-verification",
    "spot-drains.json": "gpu-cloud-spot-drains",
    "training-queue.json": "gpu-cloud-training-queue",
    "gpu-hours.json": "gpu-cloud-gpu-hours",
}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s"}


def _all_expressions() -> List[Tuple[str, str]]:
    found = [item for model in MODELS.values() for item in d.expressions(model)]
    for model in MODELS.values():
        for name, query in d.variable_queries(model):
            selector = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert selector, f"{model['uid']} variable {name}: not label_values(selector, label): {query}"
            found.append((f"{model['uid']} variable {name}", f"count({selector.group(1)})"))
    return found


EXPRESSIONS = _all_expressions()


# --- the models --------------------------------------------------------------------------------------------------

def test_six_dashboards_with_stable_uids_and_current_schema():
    assert {name: model["uid"] for name, model in MODELS.items()} == UIDS
    for name, model in MODELS.items():
        assert re.fullmatch(r"[a-z0-9-]{1,40}", model["uid"]), model["uid"]
        assert model["title"].startswith("gpu-cloud / ")
        assert model["schemaVersion"] == d.SCHEMA_VERSION == 41
        assert json.loads(json.dumps(model)) == model, f"{name} is not plain JSON"
    assert len({m["title"] for m in MODELS.values()}) == len(MODELS)
    # Rendering is deterministic: the ConfigMap never changes without a change here.
    assert d.configmap_data() == d.configmap_data()
    for name, text in d.configmap_data().items():
        assert json.loads(text) == MODELS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_panel_ids_unique_and_grid_without_overlap(name):
    panels = MODELS[name]["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    cells: Dict[Tuple[int, int], int] = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, f"{name} panel {panel['id']}: {pos}"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{name}: panels {cells[(x, y)]} and {panel['id']} overlap"
                cells[(x, y)] = panel["id"]
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), f"{name} panel {panel['id']}: refIds {refs}"
        assert panel["datasource"] == d.DATASOURCE
        assert all(t["datasource"] == d.DATASOURCE for t in panel["targets"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_templating_defines_every_variable_used(name):
    model = MODELS[name]
    variables = model["templating"]["list"]
    assert variables[0]["name"] == d.DATASOURCE_VAR and variables[0]["type"] == "datasource"
    assert variables[0]["query"] == "prometheus"
    defined = {v["name"] for v in variables}
    assert len(defined) == len(variables)
    used: Set[str] = set()
    text = json.dumps([model["panels"], variables])
    used.update(re.findall(r"\$\{(\w+)\}", text))
    used.update(re.findall(r"\$(\w+)", text))
    assert used - GRAFANA_BUILTINS <= defined, f"{name}: undefined variables {sorted(used - GRAFANA_BUILTINS - defined)}"
    for variable in variables[1:]:
        assert variable["datasource"] == d.DATASOURCE


def test_pool_and_node_variables_where_series_have_nodes():
    for name in ("gpu-fleet.json", "node-verification.json"):
        names = [v["name"] for v in MODELS[name]["templating"]["list"]]
        assert names == ["datasource", "pool", "node"], name
    assert [v["name"] for v in MODELS["spot-drains.json"]["templating"]["list"]] == ["datasource", "pool"]
    # Kueue's series name no node: the queue and the flavor, which is the pool (decisions/platform/kueue.py).
    assert [v["name"] for v in MODELS["training-queue.json"]["templating"]["list"]] == [
        "datasource", "cluster_queue", "flavor"]
    triton = {v["name"]: v for v in MODELS["triton.json"]["templating"]["list"]}
    assert list(triton) == ["datasource", "namespace", "pod", "model"]
    assert triton["namespace"]["current"]["value"] == "inference"


# --- PromQL ------------------------------------------------------------------------------------------------------

def _for_promtool(expr: str) -> str:
    for variable, value in d.GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_expression_parses_with_promtool(tmp_path):
    promtool = require_tool("promtool")
    rules = [{"record": f"dashboard:check:{n}", "expr": _for_promtool(expr)}
             for n, (_, expr) in enumerate(EXPRESSIONS, 1)]
    for rule in rules:
        # Left over, a Grafana variable outside a string would not be PromQL; inside a string it is a regex.
        bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', rule["expr"])
        assert "$" not in bare, f"{rule['record']}: Grafana variable outside a string: {rule['expr']}"
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    where = "\n".join(f"dashboard:check:{n} = {w}" for n, (w, _) in enumerate(EXPRESSIONS, 1))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{where}"
    assert f"{len(rules)} rules found" in result.stdout


def test_metric_names_reads_selectors_not_functions_labels_or_strings():
    expr = ('100 * sum by (model) (rate(nv_x{pod=~"$pod", a="b c"}[$__rate_interval])) / 1e9 '
            '* on (namespace, pod) group_left (node) max by (namespace, pod, node) (kube_pod_info{node=~"$node"}) '
            'or vector(0) > bool 1')
    assert d.metric_names(expr) == {"nv_x", "kube_pod_info"}


def _family(name: str) -> str:
    """A histogram's series (_bucket, _sum, _count) -> the histogram the table documents."""
    types = {n: e["type"] for n, e in d.metric_table()["metrics"].items()}
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return base if types.get(base) == "histogram" else name


def test_every_metric_used_is_documented_and_every_documented_metric_is_used():
    documented = d.documented_metrics()
    used: Dict[str, List[str]] = {}
    for where, expr in EXPRESSIONS:
        for name in d.metric_names(expr):
            used.setdefault(_family(name), []).append(where)
    undocumented = {name: where for name, where in used.items() if name not in documented}
    assert not undocumented, ("metrics no source documents (decisions/observability/dashboards/metrics.yaml): "
                              f"{undocumented}")
    assert set(documented) - set(used) == set(), "documented but unused: drop them from the table"


def test_no_dcgm_hostname_label():
    # dcgm-exporter renamed Hostname to hostname after 4.5.3-4.8.2; the node comes from kube_pod_info instead.
    for where, expr in EXPRESSIONS:
        assert not re.search(r"\b[Hh]ostname\b", expr), where


def test_extra_dcgm_counters_are_exactly_the_table_s_and_each_panel_says_so():
    extra = {name for name, source in d.documented_metrics().items() if source == "dcgm-extra"}
    # The dashboards' extras are among the counter file's (which the alert rules' extras share).
    assert extra <= {field for field, _, _ in dcgm.EXTRA_COUNTERS}
    types = {name: e["type"] for name, e in d.metric_table()["metrics"].items()}
    assert all(types[field] == kind for field, kind, _ in dcgm.EXTRA_COUNTERS if field in extra)
    # Three fields: dcgm-exporter reads the file as CSV, so a comma in the help would make a fourth.
    lines = [line for line in dcgm.metrics_csv().splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"DCGM_(FI|EXP)_\w+, (counter|gauge|label), [^,]+", line) for line in lines), lines
    for panel in MODELS["gpu-fleet.json"]["panels"]:
        uses = {n for t in panel.get("targets", ()) for n in d.metric_names(t["expr"])}
        if uses & extra:
            assert "EXTRA_COUNTERS" in panel["description"], panel["title"]
        else:
            assert "EXTRA_COUNTERS" not in panel.get("description", ""), panel["title"]


# --- the table against its sources -------------------------------------------------------------------------------

def _sample_report() -> dict:
    return {"verdict": "fail", "instanceType": "p5.48xlarge", "instanceId": "i-0abc", "durationS": 12.5,
            "faults": ["row-remap-failure"], "remediation": "replace", "remediations": {"row-remap-failure": "replace"},
            "checks": [{"name": "driver_version", "status": "pass", "gpu": None, "value": "580", "threshold": None,
                        "detail": "", "fault": None},
                       {"name": "remapped_rows", "status": "fail", "gpu": 3, "value": 1, "threshold": 0,
                        "detail": "row remap failed", "fault": "row-remap-failure"}]}


def test_verifier_metrics_are_what_render_textfile_writes():
    # The boot gate's families and the run-time checker's (same writer, the mode picks the prefix).
    text = "".join(gpu_verify.render_textfile(dict(_sample_report(), mode=mode), 1_700_000_000.0)
                   for mode in ("boot", "runtime"))
    written = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    table = {name: e["type"] for name, e in d.metric_table()["metrics"].items() if e["source"] == "verifier"}
    assert table == written
    labels = set(re.findall(r"[{,](\w+)=", text))
    assert labels == set(d.metric_table()["sources"]["verifier"]["labels"])
    # The values the dashboards filter on are the ones written.
    assert 'status="fail"' in text and 'status="warn"' in text and 'verdict="fail"' in text


def test_pool_and_capacity_labels_are_the_node_labels_pools_register():
    spec = NodePool.model_validate({
        "name": "spot-a100", "instanceTypes": ["p4d.24xlarge"], "capacity": "spot", "minNodes": 0,
        "desiredNodes": 0, "maxNodes": 2, "workload": "training", "gpuSharing": {"mode": "none"}})
    labels = node_labels(ResolvedPool(spec=spec, types=(load_catalog().instance_types["p4d.24xlarge"],), efa=False))
    assert labels[d.POOL_NODE_LABEL] == "spot-a100" and labels[d.CAPACITY_NODE_LABEL] == "spot"
    assert d.POOL == "label_gpu_cloud_io_pool" and d.CAPACITY == "label_gpu_cloud_io_capacity"
    assert {"gpu-cloud.io/pool", "gpu-cloud.io/capacity"} <= set(monitoring.KUBE_STATE_NODE_LABELS)


def test_sidecar_label_is_the_one_kube_prometheus_stack_watches():
    path = values_file(chart(KUBE_PROMETHEUS_STACK))
    text = path.read_text()
    values, lines = yaml.safe_load(text), text.splitlines()
    expected = {"grafana.sidecar.dashboards.label": d.GRAFANA_SIDECAR_LABEL,
                "grafana.sidecar.dashboards.labelValue": d.GRAFANA_SIDECAR_LABEL_VALUE,
                "grafana.sidecar.dashboards.searchNamespace": "ALL"}
    assert set(expected) == set(d.KPS_SIDECAR_VALUE_PATHS)
    for dotted, value in expected.items():
        node = values
        for key in dotted.split("."):
            node = node[key]
        assert node == value, f"{dotted} is {node!r} in {path.name}"
        line = lines[d.KPS_SIDECAR_VALUE_PATHS[dotted] - 1].strip()
        assert line.startswith(dotted.split(".")[-1] + ":"), f"{path.name}:{d.KPS_SIDECAR_VALUE_PATHS[dotted]}"


SOURCE_NAMES = yaml.safe_load((Path(metric_sources.SNAPSHOT)).read_text())


def _stated(key: str) -> Dict[str, str]:
    """Metric name -> type as the source states it ("" where it states none), as scripts/metric_sources.py read it
    from the source's recorded blob."""
    recorded = SOURCE_NAMES[key]
    assert recorded["blob"] == d.metric_table()["sources"][key]["blob"], \
        f"{key}: the table names another file than was read; run scripts/metric_sources.py"
    return recorded["names"]


def test_every_public_source_is_recorded():
    public = {key for key, s in d.metric_table()["sources"].items() if s["repo"] != metric_sources.OWN}
    assert set(SOURCE_NAMES) == public


@pytest.mark.parametrize("fmt, text, names", [
    ("dcgm-csv", "# Format\n# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total double-bit errors.\n"
                 "DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).\n",
     {"DCGM_FI_DEV_GPU_UTIL": "gauge"}),
    ("dcgm-csv-commented", "# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total double-bit errors.\n"
                           "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n",
     {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter"}),
    ("markdown-backticks", "|Count |Success Count |`nv_inference_request_success` |Number of successful requests |",
     {"nv_inference_request_success": ""}),
    ("markdown-table", "| Metric name | Metric type | Description |\n| ---- | ---- | ---- |\n"
                       "| kube_node_labels | Gauge | `node`=&lt;node-address&gt; | STABLE |\n",
     {"kube_node_labels": "gauge"}),
    ("go-quoted", 'runtimeMetrics := []string{\n\tkey := fmt.Sprintf("actions_total{node_action=\\"%v\\"}", a)\n'
                  '\tvalidateGauge(t, metricsMap, 2, "nth_tagged_nodes")\n\tname := fmt.Sprintf("%v{x}", n)\n',
     {"actions_total": "", "nth_tagged_nodes": ""}),
    ("go-prometheus", '\t// +metricsdoc:group=health\n\tPendingWorkloads *prometheus.GaugeVec\n'
                      '\tPendingWorkloads = prometheus.NewGaugeVec(\n\t\tprometheus.GaugeOpts{\n'
                      '\t\t\tSubsystem: constants.KueueName,\n\t\t\tName:      "pending_workloads",\n'
                      '\t\t\tHelp: `The number of pending workloads`,\n\t\t}, []string{"cluster_queue"},\n\t)\n'
                      '\tAdmissionWaitTime = prometheus.NewHistogramVec(\n\t\tprometheus.HistogramOpts{\n'
                      '\t\t\tSubsystem: constants.MultiKueueName,\n\t\t\tName:      "wait_seconds",\n',
     {"kueue_pending_workloads": "gauge", "multikueue_wait_seconds": "histogram"}),
])
def test_the_source_parser_reads_each_format(fmt, text, names):
    # Lines shaped as each source writes them (the counters CSV, Triton's metrics guide, kube-state-metrics'
    # tables, NTH's Go tests), including what must not be taken: a header, a commented counter, a Go type.
    assert metric_sources.stated(text, fmt) == names


@pytest.mark.parametrize("key", ["dcgm-default", "dcgm-extra", "triton", "nth", "ksm-node", "ksm-pod", "kueue"])
def test_table_entries_are_what_their_source_states(key):
    stated = _stated(key)
    entries = {name: e["type"] for name, e in d.metric_table()["metrics"].items() if e["source"] == key}
    assert entries, key
    for name, kind in entries.items():
        assert name in stated, f"{name}: not in {key} ({d.metric_table()['sources'][key]['path']})"
        assert stated[name] in ("", kind), f"{name}: {key} states {stated[name]}, the table {kind}"


def test_extra_dcgm_counters_are_not_collected_by_default():
    collected = _stated("dcgm-default")
    assert not {field for field, _, _ in dcgm.EXTRA_COUNTERS} & set(collected)


def test_the_training_queue_dashboard_shows_what_the_alert_and_kueues_configuration_give():
    from decisions.observability import alert_rules
    from decisions.platform import kueue
    model = MODELS["training-queue.json"]
    [stat] = [p for p in model["panels"] if p["title"] == "Pending workloads" and p["type"] == "stat"]
    steps = stat["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[1]["value"] == alert_rules.QUEUE_DEEP_PENDING + 1        # orange where TrainingQueueDeep counts
    exprs = [expr for _, expr in d.expressions(model)]
    # A follower replica's copy would count the queue twice.
    assert all('replica_role!="follower"' in expr for expr in exprs)
    # The flavor panels read the resource metrics, which Kueue reports only when told to.
    assert any("kueue_cluster_queue_nominal_quota" in expr for expr in exprs)
    assert kueue.manager_configuration("ami")["metrics"]["enableClusterQueueResources"] is True
    # Every label a query filters or groups on, or a legend shows, is one the table records Kueue setting (le: the
    # histogram's buckets).
    used = {label for expr in exprs for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(", ")}
    used |= {label for expr in exprs for label in re.findall(r'(\w+)!?=~?"', expr)}
    used |= {label for p in model["panels"] for t in p.get("targets", ()) for label in
             re.findall(r"\{\{(\w+)\}\}", t["legendFormat"])}
    assert used - {"le"} <= set(d.metric_table()["sources"]["kueue"]["labels"])
