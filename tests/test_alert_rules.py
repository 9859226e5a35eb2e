"""The GPU alert rules (decisions/observability/alert_rules.py): valid for promtool on every shipped stack, and each
alert proven with `promtool test rules` to fire on series that should trigger it and to stay silent on series that
should not."""
import re
import subprocess

import pytest
import yaml

from decisions.catalog.catalog import load_catalog
from decisions.nodes.efa import ip_bandwidth_gbps
from decisions.nodes.pools import node_labels
from decisions.observability import alert_rules as ar, dashboards, dcgm, monitoring
from plan.stackfile import load_stack
from tests.conftest import STACKS, require_tool

NODE, OTHER = "ip-10-64-0-10.ec2.internal", "ip-10-64-0-11.ec2.internal"
SYSTEM = "ip-10-64-1-20.ec2.internal"        # a system node: no pool label
STACK = "prod-us-east-1"                     # train-h100 (p5.48xlarge, min 4), infer-l40s (time-sliced, min 2), ...


@pytest.fixture(scope="module")
def specs():
    return {stack: load_stack(stack)[1] for stack in STACKS}


@pytest.fixture(scope="module")
def spec(specs):
    return specs[STACK]


def triton_target(spec):
    triton = spec.inference.triton
    return triton.target_queue_ms if triton.enabled else None


def groups_of(spec, alerts=None, target="stack"):
    return ar.rule_groups(alerts or spec.monitoring.alerts, spec.pools, spec.catalog,
                          triton_target(spec) if target == "stack" else target)


def rules_of(groups):
    return [rule for group in groups for rule in group["rules"]]


# --- promtool ---------------------------------------------------------------------------------------------------

def promtool(tmp_path, *args):
    tool = require_tool("promtool")
    result = subprocess.run([tool, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def run_promtool_tests(tmp_path, groups, tests):
    (tmp_path / "rules.yaml").write_text(ar.promtool_rule_file(groups))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    promtool(tmp_path, "test", "rules", "tests.yaml")


# Every shipped pool by name, for the labels its nodes carry (prod-us-east-1's train-h100 is reserved capacity for
# training, infer-l40s on-demand for inference).
POOLS = {pool.name: pool for stack in STACKS for pool in load_stack(stack)[1].pools}


def node_info(node=NODE, pool="train-h100", itype="p5.48xlarge", minutes=60):
    """kube_node_labels of a node of `pool` (None: a node of no pool), with the labels its pool's nodes carry."""
    labels = {"node": node}
    if pool:
        labels[ar.POOL] = pool
        for key in (monitoring.CAPACITY_NODE_LABEL, monitoring.WORKLOAD_NODE_LABEL):
            labels[monitoring.ksm_label(key)] = node_labels(POOLS[pool])[key]
    labels[ar.INSTANCE_TYPE] = itype
    return series("kube_node_labels", labels, f"1x{minutes}")


SERVING = dict(node=OTHER, pool="infer-l40s", itype="g6e.12xlarge")     # node_info's and on_node's arguments


def series(name, labels, values):
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


TEMPLATE = re.compile(r"\{\{ \$labels\.(\w+) \}\}")


def expect(groups, alert, labels):
    """promtool's expectation for `alert` with `labels`: the rule is the one of that name whose own labels are all
    in `labels`; its annotations with the labels filled in."""
    [rule] = [r for r in rules_of(groups) if r.get("alert") == alert
              and all(labels.get(k) == v for k, v in r["labels"].items())]
    fill = lambda text: TEMPLATE.sub(lambda m: labels[m.group(1)], text)     # noqa: E731
    return {"exp_labels": dict(labels), "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()}}


def on_node(labels=None, node=NODE, pool="train-h100", itype="p5.48xlarge", severity="warning", **extra):
    """Labels an alert joined to a GPU node carries: the series' own, the node's pool and type, the rule's."""
    return {**(labels or {}), "node": node, "pool": pool, "instance_type": itype, "severity": severity, **extra}


def case(inputs, alert, at, expected, groups):
    return {"interval": "1m", "input_series": inputs,
            "alert_rule_test": [{"eval_time": at, "alertname": alert,
                                 "exp_alerts": [expect(groups, alert, labels) for labels in expected]}]}


# --- the rule file --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_promtool_accepts_every_stacks_rules(stack, specs, tmp_path):
    groups = groups_of(specs[stack])
    (tmp_path / "rules.yaml").write_text(ar.promtool_rule_file(groups))
    out = promtool(tmp_path, "check", "rules", "rules.yaml")
    assert f"SUCCESS: {len(rules_of(groups))} rules found" in out


def test_every_rule_has_a_severity_a_summary_and_a_description_that_promtool_tests_can_fill(specs):
    for stack in STACKS:
        for rule in rules_of(groups_of(specs[stack])):
            # info: the warnings of the run-time checker and of the gate, for receivers that want them (nothing to
            # repair)
            assert rule["labels"]["severity"] in ("warning", "critical") or (
                rule["alert"] in ("GpuNodeHealthWarning", "GpuNodeVerificationWarning")
                and rule["labels"]["severity"] == "info"), rule["alert"]
            assert set(rule["annotations"]) == {"summary", "description"}
            for text in rule["annotations"].values():
                # Only {{ $labels.x }}: anything else ($value, functions) would be left unchecked by these tests.
                assert "{{" not in TEMPLATE.sub("", text), text


def test_triton_rules_exist_only_when_triton_is_enabled(specs):
    names = lambda spec, target: {r["alert"] for r in rules_of(groups_of(spec, target=target))}  # noqa: E731
    triton = {"TritonQueueTimeHigh", "TritonFailureRateHigh", "TritonModelSyncStale", "TritonModelNotReady",
              "TritonP99LatencyHigh"}
    assert triton <= names(specs["prod-us-east-1"], "stack")
    assert not triton & names(specs["dev"], "stack")       # dev: inference.triton.enabled false
    assert not triton & names(specs["prod-us-east-1"], None)


# --- thresholds come from the stack ------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, alerts", [
    ("gpu_temp_c", 77, {"GpuTemperatureHigh"}),
    ("gpu_util_high_pct", 80, {"GpuUtilizationHigh"}),
    ("gpu_mem_high_pct", 75, {"GpuMemoryHigh"}),
    ("network_high_pct", 55, {"GpuNodeNetworkHigh"}),
    ("storage_latency_ms", 20, {"GpuNodeStorageLatencyHigh"}),
    ("triton_failure_pct", 2.5, {"TritonFailureRateHigh"}),
    ("triton_p99_latency_ms", 250, {"TritonP99LatencyHigh"}),
])
def test_each_threshold_changes_its_own_alerts_and_no_other(spec, field, value, alerts):
    before = rules_of(groups_of(spec))
    after = rules_of(groups_of(spec, spec.monitoring.alerts.model_copy(update={field: value})))
    changed = {b["alert"] for b, a in zip(before, after) if b["expr"] != a["expr"]}
    assert changed == alerts
    for b, a in zip(before, after):
        if b["alert"] in alerts:
            assert re.search(rf">=? {value}\b", a["expr"]), a["expr"]


def test_the_triton_queue_target_comes_from_the_stack(spec):
    queue = lambda target: next(r["expr"] for r in rules_of(groups_of(spec, target=target))   # noqa: E731
                                if r["alert"] == "TritonQueueTimeHigh")
    assert queue(10).endswith("> 10") and queue(2.5).endswith("> 2.5")


def test_a_changed_utilisation_threshold_fires_where_the_default_would_not(spec, tmp_path):
    groups = groups_of(spec, spec.monitoring.alerts.model_copy(update={"gpu_util_high_pct": 80}))
    gpu = {"node": OTHER, "gpu": "0", "UUID": "GPU-0"}
    run_promtool_tests(tmp_path, groups, [case([node_info(**SERVING), series("DCGM_FI_DEV_GPU_UTIL", gpu, "85x10")],
                                               "GpuUtilizationHigh", "6m", [on_node(gpu, **SERVING)], groups)])


# --- GPU load and temperature -----------------------------------------------------------------------------------

def test_gpu_utilisation_fires_after_5_minutes_above_the_threshold(spec, tmp_path):
    """On a serving node (infer-l40s): a GPU busy past the threshold means its replicas need room."""
    groups = groups_of(spec)                              # gpuUtilHighPct 90
    busy, almost = {"node": OTHER, "gpu": "0", "UUID": "GPU-0"}, {"node": OTHER, "gpu": "1", "UUID": "GPU-1"}
    inputs = [node_info(**SERVING), series("DCGM_FI_DEV_GPU_UTIL", busy, "91x10"),
              series("DCGM_FI_DEV_GPU_UTIL", almost, "89x10")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuUtilizationHigh", "4m", [], groups),                            # 91 % for 4 minutes: pending
        case(inputs, "GpuUtilizationHigh", "6m", [on_node(busy, **SERVING)], groups),    # 91 % for 6 minutes fires
        case(inputs, "GpuUtilizationHigh", "10m", [on_node(busy, **SERVING)], groups),   # 89 % for 10 minutes: silent
    ])


def test_gpu_memory_fires_above_the_share_of_total(spec, tmp_path):
    groups = groups_of(spec)                              # gpuMemHighPct 90; 45776 MiB L40S
    full, almost = {"node": OTHER, "gpu": "0", "UUID": "GPU-0"}, {"node": OTHER, "gpu": "1", "UUID": "GPU-1"}
    inputs = [node_info(**SERVING),                       # 91.0 % and 89.0 % used
              series("DCGM_FI_DEV_FB_USED", full, "41656x10"), series("DCGM_FI_DEV_FB_FREE", full, "4120x10"),
              series("DCGM_FI_DEV_FB_USED", almost, "40741x10"), series("DCGM_FI_DEV_FB_FREE", almost, "5035x10")]
    run_promtool_tests(tmp_path, groups, [case(inputs, "GpuMemoryHigh", "6m", [on_node(full, **SERVING)], groups)])


@pytest.mark.parametrize("pool, itype", [("train-h100", "p5.48xlarge"), ("finetune-a100-80gb-spot", "p4de.24xlarge")])
def test_a_busy_training_pool_with_full_gpus_raises_no_load_alert(spec, tmp_path, pool, itype):
    """A training GPU at 100 % with its framebuffer full is the job working: neither load alert fires there, on
    reserved or on spot capacity, while the same series on a serving node fire both."""
    groups = groups_of(spec)
    gpu = lambda node: {"node": node, "gpu": "0", "UUID": f"GPU-{node}"}     # noqa: E731
    inputs = [node_info(NODE, pool, itype, minutes=20), node_info(minutes=20, **SERVING)]
    for node in (NODE, OTHER):
        inputs += [series("DCGM_FI_DEV_GPU_UTIL", gpu(node), "100x20"),
                   series("DCGM_FI_DEV_FB_USED", gpu(node), "45000x20"),
                   series("DCGM_FI_DEV_FB_FREE", gpu(node), "1000x20")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, alert, "15m", [on_node(gpu(OTHER), **SERVING)], groups)
        for alert in ("GpuUtilizationHigh", "GpuMemoryHigh")])


def test_gpu_temperature_fires_above_the_threshold_as_the_boot_gate_refuses_it(spec, tmp_path):
    groups = groups_of(spec)                              # gpuTempC 85: "above 85 C", the gate fails a GPU at 86
    above, at = {"node": NODE, "gpu": "0", "UUID": "GPU-0"}, {"node": NODE, "gpu": "1", "UUID": "GPU-1"}
    inputs = [node_info(), series("DCGM_FI_DEV_GPU_TEMP", above, "86x5"), series("DCGM_FI_DEV_GPU_TEMP", at, "85x5")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuTemperatureHigh", "3m", [on_node(above, severity="critical")], groups)])


def test_gpu_alerts_carry_the_pool_and_ignore_nodes_outside_gpu_pools(spec, tmp_path):
    groups = groups_of(spec)
    l40s, unpooled = {"node": OTHER, "gpu": "0", "UUID": "GPU-A"}, {"node": SYSTEM, "gpu": "0", "UUID": "GPU-B"}
    inputs = [node_info(OTHER, "infer-l40s", "g6e.12xlarge"), node_info(SYSTEM, None, "m7i.xlarge"),
              series("DCGM_FI_DEV_GPU_TEMP", l40s, "95x5"), series("DCGM_FI_DEV_GPU_TEMP", unpooled, "95x5")]
    run_promtool_tests(tmp_path, groups, [case(inputs, "GpuTemperatureHigh", "3m", [
        on_node(l40s, node=OTHER, pool="infer-l40s", itype="g6e.12xlarge", severity="critical")], groups)])


# --- GPU faults ----------------------------------------------------------------------------------------------------

# What NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
# (Immediate Action)"; tests/test_faults.py holds every entry) recovers with new hardware (RESTART_BM,
# CHECK_MECHANICALS, CONTACT_SUPPORT), with a GPU reset (RESET_GPU, RESTART_VM, the XID 48 and NVLink workflows), and
# what it leaves to the application (RESTART_APP) or to nobody (IGNORE, XID 45's workflow).
CATALOG_REPLACE = {54, 56, 57, 58, 65, 73, 79, 81, 142}
CATALOG_RESET = {46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158}
BLACKWELL_NVLINK = set(range(144, 151))      # WORKFLOW_NVLINK5_ERR; their Hopper counterpart, XID 74, pages
CATALOG_RESTART_APP = {13, 31, 68, 69, 80, 94}
CATALOG_IGNORE = {43, 45, 63, 92}


def test_xid_alert_lists_are_nvidias_buckets():
    assert set(ar.FATAL_XIDS) == CATALOG_REPLACE | CATALOG_RESET | BLACKWELL_NVLINK
    assert set(ar.APPLICATION_XIDS) == CATALOG_RESTART_APP
    assert len(ar.FATAL_XIDS) == len(set(ar.FATAL_XIDS))


def test_each_fatal_xid_pages_each_application_one_warns_its_owner_and_others_stay_silent(spec, tmp_path):
    groups = groups_of(spec)
    harmless = (0, *sorted(CATALOG_IGNORE), 2000)        # 0: none yet; IGNORE; 2000: in no catalog entry
    fatal = sorted(CATALOG_REPLACE | CATALOG_RESET | BLACKWELL_NVLINK)     # the catalog's, not the module's
    application = sorted(CATALOG_RESTART_APP)
    codes = fatal + application + list(harmless)
    gpus = {code: {"node": NODE, "gpu": str(i), "UUID": f"GPU-{code}"} for i, code in enumerate(codes)}
    inputs = [node_info()] + [series("DCGM_FI_DEV_XID_ERRORS", gpus[code], f"{code}x3") for code in codes]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuFatalXid", "1m", [on_node(gpus[c], severity="critical") for c in fatal], groups),
        case(inputs, "GpuApplicationXid", "1m", [on_node(gpus[c]) for c in application], groups),
    ])


def test_a_fatal_xid_followed_by_a_harmless_one_still_pages(spec, tmp_path):
    """The last-XID gauge moves on to 45 (processes killed after the fault); the exporter's per-XID count keeps 79."""
    groups = groups_of(spec)
    gpu = {"node": NODE, "gpu": "0", "UUID": "GPU-0"}
    inputs = [node_info(), series("DCGM_FI_DEV_XID_ERRORS", gpu, "45x5"),
              series("DCGM_EXP_XID_ERRORS_COUNT", {**gpu, "xid": "79"}, "1x5"),
              series("DCGM_EXP_XID_ERRORS_COUNT", {**gpu, "xid": "45"}, "3x5")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuFatalXid", "2m", [on_node({**gpu, "xid": "79"}, severity="critical")], groups),
        case(inputs, "GpuApplicationXid", "2m", [], groups)])


@pytest.mark.parametrize("alert, metric, bad, good, severity", [
    ("GpuUncorrectableEccErrors", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "1x5", "0x5", "critical"),
    ("GpuRowRemapFailure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1x5", "0x5", "critical"),
    ("GpuRowRemapPending", "DCGM_FI_DEV_ROW_REMAP_PENDING", "1x5", "0x5", "warning"),
    ("GpuRowRemapLimit", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "512x5", "511x5", "critical"),
    # DCGM v4.6.0 fails a GPU on one NVLink replay or recovery error (DcgmHealthWatch.cpp MonitorNVLink4Fields)
    ("GpuNvlinkRecoveryErrors", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "0 0 1 1 1", "2x5", "critical"),
    ("GpuNvlinkReplayErrors", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "0 0 1 1 1", "2x5", "critical"),
])
def test_gpu_fault_counters(spec, tmp_path, alert, metric, bad, good, severity):
    """Fires on the faulty GPU; a clean one (or an old, flat NVLink count) stays silent."""
    groups = groups_of(spec)
    faulty, clean = {"node": NODE, "gpu": "0", "UUID": "GPU-0"}, {"node": NODE, "gpu": "1", "UUID": "GPU-1"}
    inputs = [node_info(), series(metric, faulty, bad), series(metric, clean, good)]
    run_promtool_tests(tmp_path, groups, [case(inputs, alert, "4m", [on_node(faulty, severity=severity)], groups)])


@pytest.mark.parametrize("alert, metric, throttled_values, fine_values, pending_at, firing_at", [
    # any time held back by heat, for 10 minutes (rate needs two samples: violations count from 1m)
    ("GpuThermalThrottling", "DCGM_FI_DEV_THERMAL_VIOLATION", "0+1000000x30", "5000x30", "9m", "12m"),
    # nanoseconds at the power cap: 36e9 a minute is 60 % of the time, 24e9 is 40 % (under the 50 %); the share is
    # taken over 10 minutes, then held for 10 more
    ("GpuPowerThrottling", "DCGM_FI_DEV_POWER_VIOLATION", "0+36000000000x40", "0+24000000000x40", "15m", "25m"),
])
def test_throttling_fires_after_10_minutes_and_power_only_when_capped_most_of_the_time(
        spec, tmp_path, alert, metric, throttled_values, fine_values, pending_at, firing_at):
    groups = groups_of(spec)
    throttled, fine = {"node": NODE, "gpu": "0", "UUID": "GPU-0"}, {"node": NODE, "gpu": "1", "UUID": "GPU-1"}
    inputs = [node_info(), series(metric, throttled, throttled_values), series(metric, fine, fine_values)]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, alert, pending_at, [], groups),
        case(inputs, alert, firing_at, [on_node(throttled)], groups),
    ])


def test_nvlink_crc_errors_fire_at_dcgms_100_a_second_not_on_a_single_flit(spec, tmp_path):
    groups = groups_of(spec)
    fast, slow = {"node": NODE, "gpu": "0", "UUID": "GPU-0"}, {"node": NODE, "gpu": "1", "UUID": "GPU-1"}
    metric = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    # 6000 a minute is 100 a second; 5940 a minute is 99. A single flit error (the old rule's trigger) is nothing.
    inputs = [node_info(), series(metric, fast, "0+6000x20"), series(metric, slow, "0+5940x20"),
              series(metric, {"node": NODE, "gpu": "2", "UUID": "GPU-2"}, "0 1x19")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNvlinkCrcErrors", "12m", [on_node(fast)], groups)])


def test_mig_gpu_instances_alert_on_their_engine_activity(spec, tmp_path):
    """Under MIG the exporter has no DCGM_FI_DEV_GPU_UTIL; each GPU instance reports its engine's share active.
    (The node is a serving one for the rule's join; the rule reads the instance's series whatever its GPU.)"""
    groups = groups_of(spec)
    busy = {"node": OTHER, "gpu": "0", "UUID": "GPU-0", "GPU_I_ID": "1", "GPU_I_PROFILE": "1g.10gb"}
    idle = {"node": OTHER, "gpu": "0", "UUID": "GPU-0", "GPU_I_ID": "2", "GPU_I_PROFILE": "1g.10gb"}
    inputs = [node_info(**SERVING), series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", busy, "0.95x10"),
              series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", idle, "0.2x10")]
    run_promtool_tests(tmp_path, groups, [case(inputs, "GpuUtilizationHigh", "7m", [on_node(busy, **SERVING)],
                                               groups)])


# --- paid-for GPUs left idle -----------------------------------------------------------------------------------------

def idle_inputs(values, pool="train-h100", itype="p5.48xlarge", node=NODE, gpus=8, mig=False):
    """A node of `pool` whose GPUs are all at `values` (promtool notation, one sample a minute; MIG: each GPU's
    instance, as a share of time active)."""
    metric = "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if mig else "DCGM_FI_DEV_GPU_UTIL"
    extra = {"GPU_I_ID": "1", "GPU_I_PROFILE": "1g.10gb"} if mig else {}
    return [node_info(node, pool, itype, minutes=150)] + [
        series(metric, {"node": node, "gpu": str(i), "UUID": f"GPU-{i}", **extra}, values) for i in range(gpus)]


def test_reserved_gpus_under_5_percent_for_an_hour_warn(spec, tmp_path):
    groups = groups_of(spec)
    idle = on_node({})                                     # one alert per node: node, pool, instance type
    below, at, blip = idle_inputs("4x130"), idle_inputs("5x130"), idle_inputs("0x40 60 0x80")
    run_promtool_tests(tmp_path, groups, [
        case(below, "ReservedGpusIdle", "59m", [], groups),           # 4 %: pending for the hour
        case(below, "ReservedGpusIdle", "61m", [idle], groups),       # 4 % for an hour
        case(at, "ReservedGpusIdle", "61m", [], groups),              # 5 % is not under 5 %
        # a busy minute (minute 41) starts the hour again: idle from minute 42, firing at 102
        case(blip, "ReservedGpusIdle", "100m", [], groups),
        case(blip, "ReservedGpusIdle", "102m", [idle], groups),
    ])


def test_the_idle_alert_averages_the_node_and_spares_capacity_billed_by_use(spec, tmp_path):
    """Two GPUs of eight at 30 % make a node 7.5 % busy: a job on part of it, not idle. Spot and on-demand nodes
    cost nothing idle that scaling in would not save: no alert there. MIG instances count by their engine."""
    groups = groups_of(spec)
    partly = [node_info(minutes=90)] + [
        series("DCGM_FI_DEV_GPU_UTIL", {"node": NODE, "gpu": str(i), "UUID": f"GPU-{i}"},
               "30x90" if i < 2 else "0x90") for i in range(8)]
    spot = idle_inputs("0x90", pool="finetune-a100-80gb-spot", itype="p4de.24xlarge")
    run_promtool_tests(tmp_path, groups, [
        case(partly, "ReservedGpusIdle", "70m", [], groups),
        case(spot, "ReservedGpusIdle", "70m", [], groups),
        case(idle_inputs("0x90", **SERVING, gpus=4), "ReservedGpusIdle", "70m", [], groups),
        case(idle_inputs("0.02x90", mig=True), "ReservedGpusIdle", "70m", [on_node({})], groups),
    ])


def test_the_idle_alert_exists_only_where_a_pool_is_paid_for_whether_it_works_or_not(specs):
    for stack in STACKS:
        paid = any(p.spec.capacity in ("reserved", "capacity-block") for p in specs[stack].pools)
        assert ("ReservedGpusIdle" in {r["alert"] for r in rules_of(groups_of(specs[stack]))}) == paid, stack
    assert any(p.spec.capacity == "reserved" for p in specs["prod-us-east-1"].pools)


# --- GPU nodes -------------------------------------------------------------------------------------------------------

def test_a_node_its_gate_rejected_alerts_and_one_that_warned_informs(spec, tmp_path):
    """The series the repair controller serves from the gate's published verdicts (a rejected node is never
    scraped itself): one per rejection of the last hour."""
    groups = groups_of(spec)
    rejected = {"job": "gpu-node-repair", "pool": "train-h100", "instance_id": "i-0abc", "instance_type": "p5.48xlarge",
                "mode": "launch", "reason": "efa: sysfs has 31 EFA devices, expected 32"}
    warned = {"job": "gpu-node-repair", "pool": "train-h100", "instance_id": "i-0def", "fault": "power-below-default"}
    inputs = [series("gpu_cloud_gate_rejection_timestamp_seconds", rejected, "1796389200x3"),
              series("gpu_cloud_gate_warning_timestamp_seconds", warned, "1796389300x3")]
    drop = lambda labels: {k: v for k, v in labels.items() if k != "job"}     # noqa: E731  (max by drops it)
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNodeVerificationFailed", "1m", [{**drop(rejected), "severity": "warning"}], groups),
        case(inputs, "GpuNodeVerificationWarning", "1m", [{**drop(warned), "severity": "info"}], groups),
        case([], "GpuNodeVerificationFailed", "1m", [], groups)])


def test_a_health_check_that_stops_reporting_alerts_after_five_minutes_more(spec, tmp_path):
    groups = groups_of(spec)
    fresh = {"node": OTHER, "job": "node-exporter"}
    stale = {"node": NODE, "job": "node-exporter"}
    # one node's checker stops at minute 0 (its last timestamp stays 0); the other's keeps writing the time
    inputs = [node_info(minutes=20), node_info(OTHER, minutes=20),
              series("gpu_cloud_node_health_timestamp_seconds", stale, "0x20"),
              series("gpu_cloud_node_health_timestamp_seconds", fresh, "0+60x20")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNodeHealthCheckStale", "7m", [], groups),     # 150 s old at 3m, pending until 8m
        case(inputs, "GpuNodeHealthCheckStale", "8m", [on_node(stale)], groups)])


# --- the repair controller -------------------------------------------------------------------------------------------

def test_a_braked_pool_pages(spec, tmp_path):
    groups = groups_of(spec)
    braked = {"job": "gpu-node-repair", "pool": "train-h100"}
    inputs = [series("gpu_cloud_pool_launch_suspended", braked, "0 1 1"),
              series("gpu_cloud_pool_launch_suspended", {"job": "gpu-node-repair", "pool": "infer-l40s"}, "0 0 0")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuPoolLaunchSuspended", "0m", [], groups),
        case(inputs, "GpuPoolLaunchSuspended", "1m", [{**braked, "severity": "critical"}], groups)])


def test_a_refused_repair_warns_from_the_first_refusal_and_stops_after_15_minutes(spec, tmp_path):
    groups = groups_of(spec)
    refused = {"job": "gpu-node-repair", "pool": "train-h100", "action": "replace", "outcome": "refused"}
    done = {**refused, "outcome": "repair"}
    # the controller serves every counter from 0: the first refusal, at minute 2, is an increase
    inputs = [series("gpu_cloud_repair_decisions_total", refused, "0 0 1 1 1x20"),
              series("gpu_cloud_repair_decisions_total", done, "0 1 1 1 1x20")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuRepairRefused", "1m", [], groups),
        case(inputs, "GpuRepairRefused", "3m", [{**refused, "severity": "warning"}], groups),
        case(inputs, "GpuRepairRefused", "20m", [], groups)])


def test_a_stuck_repair_pages(spec, tmp_path):
    groups = groups_of(spec)
    stuck = {"job": "gpu-node-repair", "pool": "train-h100"}
    inputs = [series("gpu_cloud_repairs_stuck", stuck, "0 1"),
              series("gpu_cloud_repairs_stuck", {**stuck, "pool": "infer-l40s"}, "0 0")]
    run_promtool_tests(tmp_path, groups, [case(inputs, "GpuRepairStuck", "1m", [{**stuck, "severity": "critical"}],
                                               groups)])


def test_the_repair_controller_is_watched(spec, tmp_path):
    groups = groups_of(spec)
    last = {"job": "gpu-node-repair"}
    # it completes a pass every minute until minute 5, then none: 600 s later, and 5 minutes on, it pages
    working_then_stuck = series("gpu_cloud_repair_last_success_timestamp_seconds", last, "0+60x5 300x30")
    run_promtool_tests(tmp_path, groups, [
        case([working_then_stuck], "GpuRepairControllerDown", "19m", [], groups),
        case([working_then_stuck], "GpuRepairControllerDown", "21m", [{**last, "severity": "critical"}], groups),
        case([], "GpuRepairControllerDown", "6m", [{"severity": "critical"}], groups)])


def test_a_gpu_node_not_ready_for_5_minutes_pages_and_system_nodes_do_not(spec, tmp_path):
    groups = groups_of(spec)
    ready = lambda node, status: {"node": node, "condition": "Ready", "status": status}       # noqa: E731
    inputs = [node_info(), node_info(OTHER), node_info(SYSTEM, None, "m7i.xlarge"),
              series("kube_node_status_condition", ready(NODE, "true"), "0x10"),
              series("kube_node_status_condition", ready(NODE, "unknown"), "1x10"),
              series("kube_node_status_condition", ready(OTHER, "true"), "1x10"),
              series("kube_node_status_condition", ready(SYSTEM, "true"), "0x10")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNodeNotReady", "4m", [], groups),
        case(inputs, "GpuNodeNotReady", "6m", [on_node(ready(NODE, "true"), severity="critical")], groups),
    ])


def pool_nodes(spec, counts, cordoned=(), not_ready=()):
    """kube-state-metrics series for `counts` nodes per pool, each offering what the pool's nodes offer."""
    from decisions.nodes.pools import offered_gpu_resources
    inputs = []
    for pool in spec.pools:
        for i in range(counts.get(pool.name, 0)):
            node = f"{pool.name}-{i}"
            inputs.append(node_info(node, pool.name, pool.primary_type.name))
            for resource, count in offered_gpu_resources(pool, spec.catalog).items():
                inputs.append(series("kube_node_status_allocatable",
                                     {"node": node, "resource": ar.ksm_resource(resource), "unit": "integer"},
                                     f"{count}x60"))
            inputs.append(series("kube_node_spec_unschedulable", {"node": node}, f"{int(node in cordoned)}x60"))
            inputs.append(series("kube_node_status_condition", {"node": node, "condition": "Ready", "status": "true"},
                                 f"{int(node not in not_ready)}x60"))
    return inputs


def pool_short(groups, *pools):
    return [{"pool": pool, "severity": "critical"} for pool in pools]


def test_pools_at_their_minimum_are_quiet_and_short_ones_page_after_15_minutes(spec, tmp_path):
    groups = groups_of(spec)   # train-h100: 4 x 8 GPUs; infer-l40s: 2 x 4 GPUs x 2 time-slicing replicas = 16
    at_minimum = pool_nodes(spec, {"train-h100": 4, "infer-l40s": 2})
    one_short = pool_nodes(spec, {"train-h100": 3, "infer-l40s": 2})
    cordoned = pool_nodes(spec, {"train-h100": 4, "infer-l40s": 2}, cordoned={"train-h100-0"})
    not_ready = pool_nodes(spec, {"train-h100": 4, "infer-l40s": 2}, not_ready={"infer-l40s-1"})
    empty = [series("kube_node_labels", {"node": SYSTEM, ar.INSTANCE_TYPE: "m7i.xlarge"}, "1x60")]
    run_promtool_tests(tmp_path, groups, [
        case(at_minimum, "GpuPoolBelowMinimum", "20m", [], groups),
        case(one_short, "GpuPoolBelowMinimum", "14m", [], groups),
        case(one_short, "GpuPoolBelowMinimum", "16m", pool_short(groups, "train-h100"), groups),
        case(cordoned, "GpuPoolBelowMinimum", "16m", pool_short(groups, "train-h100"), groups),
        case(not_ready, "GpuPoolBelowMinimum", "16m", pool_short(groups, "infer-l40s"), groups),
        case(empty, "GpuPoolBelowMinimum", "16m", pool_short(groups, "train-h100", "infer-l40s"), groups),
        case([], "GpuPoolBelowMinimum", "16m", [], groups),      # kube-state-metrics not scraped: no guess
    ])


def test_pool_minimum_rules_follow_the_pools(specs):
    for stack in STACKS:
        spec = specs[stack]
        rules = [r for r in rules_of(groups_of(spec)) if r["alert"] == "GpuPoolBelowMinimum"]
        assert {r["labels"]["pool"] for r in rules} == {p.name for p in spec.pools if p.spec.min_nodes > 0}
    train = next(r for r in rules_of(groups_of(specs[STACK])) if r["labels"].get("pool") == "train-h100")
    assert train["expr"].startswith('(sum(kube_node_status_allocatable{resource="nvidia_com_gpu"}')
    assert "< 32 " in train["expr"]


# --- network and storage -------------------------------------------------------------------------------------------

def bytes_per_minute(gbps, pct):
    return gbps * 1e9 / 8 * pct / 100 * 60


def test_network_fires_at_71_not_69_percent_of_a_p5_ip_bandwidth(spec, tmp_path):
    # networkHighPct 70. A p5.48xlarge has 3200 Gbps over 32 cards, and one ENA interface (card 0): 100 Gbps of IP,
    # the rest is EFA's, which the kernel never counts (EC2 User Guide, efa-acc-inst-types: the P5 layout).
    groups = groups_of(spec)
    rx = lambda node, device: {"node": node, "device": device}                                   # noqa: E731
    above, below = bytes_per_minute(100, 71), bytes_per_minute(100, 69)
    inputs = [node_info(), node_info(OTHER),
              series("node_network_receive_bytes_total", rx(NODE, "ens5"), f"0+{above / 2:.0f}x20"),
              series("node_network_receive_bytes_total", rx(NODE, "enp71s0"), f"0+{above / 2:.0f}x20"),
              series("node_network_receive_bytes_total", rx(OTHER, "ens5"), f"0+{below:.0f}x20"),
              # pods' traffic on the VPC CNI's host veths is already counted on the ENA device
              series("node_network_receive_bytes_total", rx(OTHER, "eni0a1b2c3d4e5"), f"0+{above:.0f}x20"),
              series("node_network_transmit_bytes_total", rx(OTHER, "ens5"), f"0+{above:.0f}x20")]
    run_promtool_tests(tmp_path, groups, [
        # The 5-minute rate of counters that start at 0m reaches the traffic's level at 5m: pending until 15m.
        case(inputs, "GpuNodeNetworkHigh", "14m", [], groups),
        case(inputs, "GpuNodeNetworkHigh", "16m", [
            on_node({}, direction="receive"), on_node({}, node=OTHER, direction="transmit")], groups),
    ])


def test_network_bandwidth_is_each_types_own(spec, tmp_path):
    groups = groups_of(spec)
    l40s = spec.catalog.instance_types["g6e.12xlarge"].network_gbps
    inputs = [node_info(OTHER, "infer-l40s", "g6e.12xlarge"),
              series("node_network_transmit_bytes_total", {"node": OTHER, "device": "ens5"},
                     f"0+{bytes_per_minute(l40s, 71):.0f}x20")]
    run_promtool_tests(tmp_path, groups, [case(inputs, "GpuNodeNetworkHigh", "16m", [
        on_node({}, node=OTHER, pool="infer-l40s", itype="g6e.12xlarge", direction="transmit")], groups)])


def test_network_rules_cover_every_pool_instance_type_with_its_catalog_bandwidth(specs):
    for stack in STACKS:
        spec = specs[stack]
        rules = [r for r in rules_of(groups_of(spec)) if r["alert"] == "GpuNodeNetworkHigh"]
        assert len(rules) == 2 * sum(len(p.types) for p in spec.pools)
        for pool in spec.pools:
            for itype in pool.types:
                (receive, transmit) = [r for r in rules if f'{ar.POOL}="{pool.name}", {ar.INSTANCE_TYPE}="{itype.name}"'
                                       in r["expr"]]
                gbps = ip_bandwidth_gbps(itype, efa=pool.efa)
                assert f"/ ({ar._number(gbps)} * 1e9)" in receive["expr"] and "receive" in receive["expr"]
                assert f"/ ({ar._number(gbps)} * 1e9)" in transmit["expr"] and "transmit" in transmit["expr"]


@pytest.mark.parametrize("itype, efa, gbps", [
    ("p5.48xlarge", True, 100), ("p5.48xlarge", False, 100),      # 3200 Gbps over 32 cards, one ENA interface
    ("p4d.24xlarge", True, 100), ("p4de.24xlarge", False, 100),   # 400 over 4
    ("g6e.12xlarge", False, 100), ("g6.12xlarge", False, 40),     # one card: all of it
])
def test_ip_bandwidth_is_the_share_of_the_cards_ena_interfaces_sit_on(itype, efa, gbps):
    assert ip_bandwidth_gbps(load_catalog().instance_types[itype], efa=efa) == gbps


@pytest.mark.parametrize("counter", list(ar.ENA_ALLOWANCES))
def test_ena_allowance_counters_fire_while_increasing_for_10_minutes(spec, tmp_path, counter):
    groups = groups_of(spec)
    metric = f"node_ethtool_{counter}"
    rising, flat = {"node": NODE, "device": "ens5"}, {"node": NODE, "device": "ens6"}
    inputs = [node_info(), series(metric, rising, "0+40x20"), series(metric, flat, "1234x20")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "EnaAllowanceExceeded", "10m", [], groups),
        case(inputs, "EnaAllowanceExceeded", "12m", [on_node(rising, allowance=counter)], groups),
    ])


def test_node_exporter_keeps_exactly_the_ena_counters_the_rules_read(spec):
    [include] = [arg for arg in ar.NODE_EXPORTER_ARGS if arg.startswith("--collector.ethtool.metrics-include=")]
    pattern = re.compile(include.split("=", 1)[1])
    read = {m for r in rules_of(groups_of(spec)) for m in re.findall(r"node_ethtool_(\w+)", r["expr"])}
    assert read == set(ar.ENA_ALLOWANCES)
    assert all(pattern.fullmatch(name) for name in read)
    assert not pattern.fullmatch("queue_0_tx_cnt")
    assert "--collector.ethtool" in ar.NODE_EXPORTER_ARGS              # off by default in node-exporter


@pytest.mark.parametrize("operation", ["read", "write"])
def test_storage_latency_fires_above_the_threshold(spec, tmp_path, operation):
    groups = groups_of(spec)                               # storageLatencyMs 50
    plural = {"read": "reads", "write": "writes"}[operation]
    time_metric, done_metric = f"node_disk_{operation}_time_seconds_total", f"node_disk_{plural}_completed_total"
    disk = lambda device: {"node": NODE, "device": device}          # noqa: E731
    inputs = [node_info()]
    for device, ios_per_min, ms in (("nvme1n1", 600, 51), ("nvme2n1", 600, 49), ("nvme3n1", 30, 400)):
        inputs += [series(done_metric, disk(device), f"0+{ios_per_min}x20"),
                   series(time_metric, disk(device), f"0+{ios_per_min * ms / 1000}x20")]
    # nvme1n1 51 ms fires, nvme2n1 49 ms does not, nvme3n1 (half an I/O a second) is not judged
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNodeStorageLatencyHigh", "12m", [on_node(disk("nvme1n1"), operation=operation)], groups)])


# --- NCCL acceptance ---------------------------------------------------------------------------------------------------

def test_nccl_jobs_are_the_ones_the_stack_runs(spec):
    from decisions.platform import acceptance
    jobs = {(pool, scope): pattern for pool, scope, pattern in ar.nccl_acceptance_jobs(spec.pools, spec.catalog)}
    assert set(jobs) == {("train-h100", "across-nodes"), ("train-h100", "within-node"),
                         ("finetune-a100-80gb-spot", "within-node"), ("finetune-a100-40gb-spot", "within-node")}
    assert re.fullmatch(jobs["train-h100", "across-nodes"], "nccl-efa-train-h100-x7k2q-launcher")
    assert not re.fullmatch(jobs["train-h100", "across-nodes"], "nccl-efa-train-h100-x7k2q-worker-0")
    assert re.fullmatch(jobs["train-h100", "within-node"], "nccl-nvlink-train-h100-29581440")
    assert {p.name for p in acceptance.nvlink_check_pools(spec.pools, spec.catalog)} == {
        pool for pool, scope in jobs if scope == "within-node"}


def job(name, start, failed, minutes=10):
    labels = {"namespace": "training", "job_name": name}
    return [series("kube_job_failed", {**labels, "condition": "true"}, f"{int(failed)}x{minutes}"),
            series("kube_job_failed", {**labels, "condition": "false"}, f"{int(not failed)}x{minutes}"),
            series("kube_job_status_start_time", labels, f"{start}x{minutes}")]


def nccl_failed(name, pool, scope):
    return {"namespace": "training", "job_name": name, "condition": "true", "pool": pool, "scope": scope,
            "severity": "critical"}


def test_a_failed_nccl_acceptance_job_pages(spec, tmp_path):
    groups = groups_of(spec)
    mpijob_failed, mpijob_passed = "nccl-efa-train-h100-abcde-launcher", "nccl-efa-train-h100-vwxyz-launcher"
    inputs = (job(mpijob_failed, 1000, True) + job(mpijob_passed, 2000, False)
              + job("nccl-efa-train-h100-abcde-worker", 1000, True)           # not a launcher Job
              + job("someone-elses-job", 1000, True))
    run_promtool_tests(tmp_path, groups, [case(inputs, "NcclAcceptanceFailed", "1m", [
        nccl_failed(mpijob_failed, "train-h100", "across-nodes")], groups)])


def test_only_the_newest_nvlink_run_decides(spec, tmp_path):
    groups = groups_of(spec)
    old, new = "nccl-nvlink-train-h100-29000000", "nccl-nvlink-train-h100-29010080"
    run_promtool_tests(tmp_path, groups, [
        case(job(old, 1000, True) + job(new, 2000, False), "NcclAcceptanceFailed", "1m", [], groups),
        case(job(old, 1000, False) + job(new, 2000, True), "NcclAcceptanceFailed", "1m",
             [nccl_failed(new, "train-h100", "within-node")], groups),
    ])


# --- the training queue ------------------------------------------------------------------------------------------------

def pending(status, role, values):
    return series("kueue_pending_workloads", {"cluster_queue": "training", "status": status, "replica_role": role},
                  values)


def test_a_queue_deep_past_100_for_30_minutes_warns(spec, tmp_path):
    groups = groups_of(spec)
    deep = {"cluster_queue": "training", "severity": "warning"}
    # 60 waiting their turn + 41 tried and not fitting = 101, the design requirements' "more than 100".
    over = [pending("active", "leader", "60x40"), pending("inadmissible", "leader", "41x40")]
    at_limit = [pending("active", "leader", "60x40"), pending("inadmissible", "leader", "40x40")]
    # A follower replica reporting the same queue does not count it twice.
    doubled = [pending("active", "leader", "60x40"), pending("active", "follower", "60x40")]
    run_promtool_tests(tmp_path, groups, [
        case(over, "TrainingQueueDeep", "29m", [], groups),             # deep, but not for 30 minutes yet
        case(over, "TrainingQueueDeep", "31m", [deep], groups),
        case(at_limit, "TrainingQueueDeep", "40m", [], groups),
        case(doubled, "TrainingQueueDeep", "40m", [], groups),
    ])


def test_the_queue_alert_waits_as_long_as_kueues_longest_requeue_backoff(specs):
    from decisions.platform import kueue
    for stack in STACKS:
        [rule] = [r for r in rules_of(groups_of(specs[stack])) if r["alert"] == "TrainingQueueDeep"]
        assert rule["for"] == f"{kueue.REQUEUE_BACKOFF_MAX_S // 60}m" == "30m"
    # No queue, no alert: a stack of inference pools only has no Kueue.
    spec = specs[STACK]
    inference = [p for p in spec.pools if p.spec.workload == "inference"]
    assert not [r for r in rules_of(ar.rule_groups(spec.monitoring.alerts, inference, spec.catalog))
                if r["alert"] == "TrainingQueueDeep"]


def evicted(reason, role, values):
    return series("kueue_evicted_workloads_total", {"cluster_queue": "training", "reason": reason,
                                                    "underlying_cause": "", "priority_class": "", "replica_role": role},
                  values)


def test_jobs_evicted_again_and_again_before_their_pods_were_ready_warn(spec, tmp_path):
    groups = groups_of(spec)
    looping = {"cluster_queue": "training", "severity": "warning"}
    # The slowest loop: an eviction every 95 minutes (a 65-minute pods-ready timeout with the driver installed at
    # boot, then Kueue's 30-minute longest backoff).
    assert ar.PODS_READY_LOOP_S == 95 * 60 and ar.PODS_READY_WINDOW == "380m"
    # Samples every 2 minutes, rules evaluated on the odd minutes between them, as scrapes and evaluations rarely
    # align: increase() then extrapolates to the window's edges. Each count holds 48 samples (96 minutes).
    rounds = lambda *counts: " ".join(f"{n}+0x47" for n in counts)          # noqa: E731
    stuck = rounds(0, 1, 2, 3, 4, 5)
    three_reclaims = "5+0x99 " + rounds(6, 7, 8, 8)       # three evictions in the window read 3.016, not 3

    def at_485m(values, reason="PodsReadyTimeout", role="leader", expected=()):
        return {"interval": "2m", "input_series": [evicted(reason, role, values)],
                "alert_rule_test": [{"eval_time": "485m", "alertname": "TrainingJobsEvictedNotReady",
                                     "exp_alerts": [expect(groups, "TrainingJobsEvictedNotReady", labels)
                                                    for labels in expected]}]}

    run_promtool_tests(tmp_path, groups, [
        at_485m(stuck, expected=[looping]),
        at_485m(three_reclaims),
        # Preemption is the queue working as asked; a follower replica's copy is not a second count.
        at_485m(stuck, reason="Preempted"),
        at_485m(stuck, role="follower"),
    ])


# --- Triton ------------------------------------------------------------------------------------------------------------

def model(name):
    return {"namespace": "inference", "model": name, "version": "1"}


def test_triton_queue_time_per_request_above_target_for_10_minutes(spec, tmp_path):
    groups = groups_of(spec)                               # target 10 ms
    inputs = []
    for name, ms in (("slow", 11), ("ok", 9)):
        inputs += [series("nv_inference_request_success", model(name), "0+600x30"),
                   series("nv_inference_queue_duration_us", model(name), f"0+{600 * ms * 1000}x30")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "TritonQueueTimeHigh", "10m", [], groups),
        case(inputs, "TritonQueueTimeHigh", "12m", [{**model("slow"), "severity": "warning"}], groups),
    ])


def test_triton_failure_ratio(spec, tmp_path):
    groups = groups_of(spec)                               # tritonFailurePct 1
    inputs = []
    for name, failed_per_1000 in (("failing", 11), ("ok", 9)):
        inputs += [series("nv_inference_request_success", model(name), f"0+{1000 - failed_per_1000}x20"),
                   series("nv_inference_request_failure", {**model(name), "reason": "BACKEND"},
                          f"0+{failed_per_1000}x20")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "TritonFailureRateHigh", "8m", [{**model("failing"), "severity": "critical"}], groups)])


def test_triton_p99_latency_takes_the_slowest_replica(spec, tmp_path):
    groups = groups_of(spec)                               # tritonP99LatencyMs 1000
    p99 = lambda name, pod: {**model(name), "pod": pod, "quantile": "0.99"}                      # noqa: E731
    inputs = [series("nv_inference_request_summary_us", p99("slow", "a"), "1001000x10"),
              series("nv_inference_request_summary_us", p99("slow", "b"), "200000x10"),
              series("nv_inference_request_summary_us", p99("ok", "a"), "1000000x10"),
              series("nv_inference_request_summary_us", {**model("ok"), "pod": "a", "quantile": "0.5"}, "2e6x10")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "TritonP99LatencyHigh", "7m", [{**model("slow"), "severity": "warning"}], groups)])


def sync_ready(pod, container, values):
    return series("kube_pod_container_status_ready", {"namespace": "inference", "pod": pod, "uid": f"uid-{pod}",
                                                      "container": container}, values)


def test_a_triton_pod_that_cannot_sync_its_models_pages_after_5_minutes(spec, tmp_path):
    groups = groups_of(spec)
    inputs = [sync_ready("triton-a", "models-sync", "0x20"), sync_ready("triton-b", "models-sync", "1x20"),
              sync_ready("triton-c", "triton", "0x20")]            # Triton loading its models is not a sync failure
    stale = {"namespace": "inference", "pod": "triton-a", "severity": "critical"}
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "TritonModelSyncStale", "4m", [], groups),
        case(inputs, "TritonModelSyncStale", "6m", [stale], groups),
    ])


def test_the_sync_alert_watches_the_sidecar_the_pod_runs():
    from decisions.serving import triton
    assert triton.SYNC_CONTAINER == ar.TRITON_SYNC_CONTAINER == "models-sync"


def model_ready(pod, name, version, values):
    """The model-ready exporter's gauge as Prometheus stores it: the target's labels beside the exporter's own."""
    return series(ar.TRITON_MODEL_READY_METRIC, {"namespace": "inference", "pod": pod, "service": "triton-metrics",
                                                 "endpoint": "model-ready", "model": name, "version": version}, values)


def test_a_model_version_not_ready_in_a_pod_pages_after_16_minutes(spec, tmp_path):
    groups = groups_of(spec)
    # A sample a minute: bert version 2 never loads in triton-a; resnet50 there is ready at the 16th minute, the
    # latest a pod may take to find and load it; in triton-b bert loads.
    inputs = [model_ready("triton-a", "bert", "2", "0x30"), model_ready("triton-a", "resnet50", "1", "0x15 1x15"),
              model_ready("triton-b", "bert", "2", "1x30")]
    not_ready = {"namespace": "inference", "pod": "triton-a", "model": "bert", "version": "2", "severity": "critical"}
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "TritonModelNotReady", "15m", [], groups),
        case(inputs, "TritonModelNotReady", "16m", [not_ready], groups),
        case(inputs, "TritonModelNotReady", "25m", [not_ready], groups),
    ])


def test_a_model_pages_only_once_a_pod_had_its_time_to_find_and_load_it():
    """Triton finds a synced model at its next poll, then loads it in at most the pod's startup probe budget."""
    from decisions.serving import triton
    load_s = triton.REPOSITORY_POLL_S + triton.STARTUP_PROBES * triton.STARTUP_PROBE_PERIOD_S
    assert ar.TRITON_MODEL_NOT_READY_MINUTES * 60 == load_s == 960
    assert triton.NAME == "triton" and triton.HTTP_PORT == 8000         # the description's kubectl command


def test_triton_needs_summary_latencies_for_its_p99():
    assert ar.TRITON_SERVER_ARGS == ("--metrics-config", "summary_latencies=true")


# --- what the monitoring stack must configure ------------------------------------------------------------------------

def test_every_dcgm_field_a_rule_reads_is_exported(specs):
    default = {field for field, _, _ in dcgm.DEFAULT_COUNTERS}
    extra = {field for field, _, _ in dcgm.EXTRA_COUNTERS}
    assert not default & extra
    read = {f for stack in STACKS for r in rules_of(groups_of(specs[stack])) for f in re.findall(r"DCGM_(?:FI|EXP)_\w+", r["expr"])}
    assert read <= default | extra
    shown = {f for _, expr in (e for model in dashboards.dashboards().values() for e in dashboards.expressions(model))
             for f in re.findall(r"DCGM_FI_\w+", expr)}
    assert extra <= read | shown                           # nothing exported that no rule or dashboard reads
    # fields the default CSV of dcgm-exporter 4.5.3-4.8.2 leaves commented out
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"} <= extra


def test_dcgm_csv_lists_defaults_then_extras_in_the_exporters_format():
    rows = [line.split(", ", 2) for line in dcgm.metrics_csv().splitlines() if line and not line.startswith("#")]
    assert [tuple(r) for r in rows] == list(dcgm.DEFAULT_COUNTERS + dcgm.EXTRA_COUNTERS)
    assert all(kind in ("gauge", "counter", "label") for _, kind, _ in rows)
    assert all("," not in help_text for _, _, help_text in rows)


def test_the_node_labels_rules_join_on_are_allowlisted_and_set_on_every_pool(specs):
    read = {label for stack in STACKS for r in rules_of(groups_of(specs[stack]))
            for label in re.findall(r"\blabel_(?!replace\b)\w+", r["expr"])}
    assert read <= {monitoring.ksm_label(label) for label in monitoring.KUBE_STATE_NODE_LABELS}
    assert monitoring.ksm_label("gpu-cloud.io/pool") == "label_gpu_cloud_io_pool"
    assert monitoring.ksm_label("node.kubernetes.io/instance-type") == "label_node_kubernetes_io_instance_type"
    for pool in specs[STACK].pools:
        assert node_labels(pool)["gpu-cloud.io/pool"] == pool.name


def test_node_level_series_get_the_node_name_at_scrape_time():
    [relabel] = monitoring.NODE_LABEL_RELABELINGS
    assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                       "action": "replace"}


# --- the run-time checker's fault classes --------------------------------------------------------------------------

def test_a_fault_the_runtime_checker_finds_pages_with_its_remediation_and_a_warning_informs(spec, tmp_path):
    """A failed check pages once it has held for 2 minutes, the 120 s the repair controller waits before it trusts
    one (decisions/nodes/repair.py CONFIRM_S); a single reading that clears pages nothing. A warning informs at
    once."""
    groups = groups_of(spec)
    failing = {"node": NODE, "job": "node-exporter", "fault": "row-remap-failure", "status": "fail",
               "remediation": "replace"}
    blip = {"node": OTHER, "job": "node-exporter", "fault": "pcie-width", "status": "fail", "remediation": "replace"}
    warning = {"node": NODE, "job": "node-exporter", "fault": "sxid-nonfatal", "status": "warn", "remediation": "none"}
    inputs = [node_info(), node_info(OTHER), series("gpu_cloud_node_health_fault", failing, "1x6"),
              series("gpu_cloud_node_health_fault", blip, "1 1 0 0 0 0"),
              series("gpu_cloud_node_health_fault", warning, "1x3")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuNodeHealthCheckFailed", "1m", [], groups),        # pending, not yet paging
        case(inputs, "GpuNodeHealthCheckFailed", "2m", [on_node(failing, severity="critical")], groups),
        case(inputs, "GpuNodeHealthCheckFailed", "4m", [on_node(failing, severity="critical")], groups),
        case(inputs, "GpuNodeHealthWarning", "0m", [on_node(warning, severity="info")], groups)])


def test_a_failed_check_pages_after_two_minutes_once_the_repair_controller_has_acted():
    from decisions.nodes.repair import CONFIRM_S
    [rule] = [r for r in ar.node_rules([], None) if r["alert"] == "GpuNodeHealthCheckFailed"]
    assert rule["for"] == "2m" and CONFIRM_S < 120


def test_pcie_replays_warn_above_dcgms_allowance_for_a_gen4_x16_link_held_5_minutes(spec, tmp_path):
    """DCGM v4.6.0 (DcgmHealthWatch.cpp GetExpectedPcieReplayRate): 0.96 replays a minute per Gen4 lane, 16 on x16.
    17 a minute for 10 minutes warns; 16 a minute does not; a burst of 500 once does not either."""
    groups = groups_of(spec)
    bad, fine, burst = ({"node": NODE, "gpu": str(i), "UUID": f"GPU-{i}"} for i in range(3))
    metric = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    inputs = [node_info(), series(metric, bad, "0+17x20"), series(metric, fine, "0+16x20"),
              series(metric, burst, "0x5 500x15")]
    run_promtool_tests(tmp_path, groups, [
        case(inputs, "GpuPcieReplays", "8m", [], groups),                  # above since 5m, pending
        case(inputs, "GpuPcieReplays", "12m", [on_node(bad)], groups)])
    assert ar.FAULTS.limits.pcie_replays_per_minute == 16


def test_every_alert_the_fault_table_names_is_a_rule_of_every_stack(specs):
    from decisions.nodes.faults import load_faults
    named = set(load_faults().alerts) - {"NcclAcceptanceFailed"}     # only stacks with an NCCL pool have it
    for stack_spec in specs.values():
        assert named <= {r["alert"] for r in rules_of(groups_of(stack_spec)) if "alert" in r}


def test_the_monitoring_page_lists_every_alert_of_every_stack(specs):
    """docs/monitoring.md's table names every rule (the fault table's alerts among them), so a new alert is
    documented where people look when it fires."""
    from tests.conftest import ROOT
    rows = [line for line in (ROOT / "docs" / "monitoring.md").read_text().splitlines() if line.startswith("| ")]
    named = {name.strip() for row in rows for name in re.split(r"[/,]", row.split("|")[1])}
    alerts = {r["alert"] for stack in STACKS for r in rules_of(groups_of(specs[stack])) if "alert" in r}
    assert alerts <= named, sorted(alerts - named)
