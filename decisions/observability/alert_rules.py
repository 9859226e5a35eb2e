"""The GPU alert rules, as the `spec.groups` of a monitoring.coreos.com/v1 PrometheusRule. Pure: no Pulumi
(components/monitoring.py creates the object). `promtool_rule_file` renders the same groups for `promtool`.

Every threshold comes from the stack's `monitoring.alerts` (decisions.config.model.Alerts), pool minimums and instance
bandwidth from the resolved pools and the catalog. The rules only see their series when the monitoring stack and the
GPU operator are configured as decisions/observability/monitoring.py (KUBE_STATE_NODE_LABELS, NODE_LABEL_RELABELINGS),
NODE_EXPORTER_ARGS and TRITON_SERVER_ARGS below say, and the DCGM exporter exports decisions/observability/dcgm.py's
fields.

How series reach a node and a pool:
- DCGM exporter and node-exporter series carry `node` (the Kubernetes node name), copied at scrape time from
  `__meta_kubernetes_pod_node_name` (NODE_LABEL_RELABELINGS). Neither target has it otherwise: node-exporter's
  ServiceMonitor keeps `instance` as the pod address (kube-prometheus-stack 88.5.3 values.yaml,
  prometheus-node-exporter.prometheus.monitor.relabelings: []), so does the operator's DCGM ServiceMonitor
  (gpu-operator v26.7.0 values.yaml dcgmExporter.serviceMonitor.relabelings: []), and the exporter's own host label
  changed spelling between releases (NVIDIA/dcgm-exporter commit d5e5f510 "Rename Hostname label to hostname", after
  tag 4.5.3-4.8.2), so no rule joins on it.
- kube-state-metrics' `kube_node_labels{node}` gives the node's pool and instance type once its allowlist has
  KUBE_STATE_NODE_LABELS; kube-prometheus-stack scrapes it with honorLabels: true (values.yaml kube-state-metrics
  .prometheus.monitor.http.honorLabels, line 2702), so its `node`, `namespace` and `job_name` labels are the objects',
  not the target's. Every node-level alert is joined to it: it fires on GPU nodes only and carries `pool` and
  `instance_type` (Alertmanager groups by pool).
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from decisions.nodes.efa import ip_bandwidth_gbps
from decisions.nodes.faults import load_faults
from decisions.nodes.pools import offered_gpu_resources
from decisions.nodes.repair import INTERVAL_S as REPAIR_INTERVAL_S, REPAIR_TIMEOUT_S, STALE_CHECK_S
from decisions.observability.monitoring import CAPACITY_NODE_LABEL, INSTANCE_TYPE_NODE_LABEL, POOL_NODE_LABEL, \
    WORKLOAD_NODE_LABEL, ksm_label, ksm_sanitized
from decisions.platform import acceptance, kueue
from decisions.platform.tenancy import INFERENCE_NAMESPACE, TRAINING_NAMESPACE, TRITON_HTTP_PORT

# --- what the monitoring stack must configure ---------------------------------------------------------------------

# ENA's allowance counters, as the ENA driver names them in `ethtool -S` (Linux drivers/net/ethernet/amazon/ena/
# ena_ethtool.c, ena_stats_eni_strings) -> what each one means for the alert's description.
ENA_ALLOWANCES: Mapping[str, str] = {
    "pps_allowance_exceeded": "packets per second",
    "bw_in_allowance_exceeded": "inbound bandwidth",
    "bw_out_allowance_exceeded": "outbound bandwidth",
}
# node-exporter's ethtool collector is off by default (prometheus/node_exporter v1.12.1 collector/ethtool_linux.go:
# registerCollector("ethtool", defaultDisabled, ...)); on, it exports every driver statistic (ENA has several per
# queue, and a p5 has dozens of interfaces): keep only the ones the rules read.
NODE_EXPORTER_ARGS: Tuple[str, ...] = (
    "--collector.ethtool", "--collector.ethtool.metrics-include=^(" + "|".join(ENA_ALLOWANCES) + ")$")

# tritonserver arguments the p99 rule needs: summaries are off by default, and their default quantiles include 0.99
# (triton-inference-server/server v2.71.0 docs/user_guide/metrics.md, "Summaries"). Metrics are served on port 8002.
TRITON_SERVER_ARGS: Tuple[str, ...] = ("--metrics-config", "summary_latencies=true")
TRITON_P99_QUANTILE = "0.99"
# The Triton pod's sidecar that keeps the local copy of the models (decisions/serving/triton.py): its readiness is "a
# good sync within SYNC_STALE_S", read here through kube-state-metrics' kube_pod_container_status_ready (gauge, labels
# namespace, pod, container: kubernetes/kube-state-metrics docs/pod-metrics.md).
TRITON_SYNC_CONTAINER = "models-sync"
# Every model version in a Triton pod's repository index, 1 while READY, from the pod's model-ready exporter
# (jobs/triton_model_exporter.py; versions Triton unloaded on purpose are left out).
TRITON_MODEL_READY_METRIC = "gpu_cloud_triton_model_ready"
# How long a version may stay not READY before it pages: a model the sidecar has just synced waits for Triton's next
# repository poll (60 s) and then loads, which a pod is given 15 minutes for (its startup probe): 16 minutes
# (decisions/serving/triton.py REPOSITORY_POLL_S, STARTUP_PROBES; tests/test_alert_rules.py holds the sum).
TRITON_MODEL_NOT_READY_MINUTES = 16

# --- facts the rules encode ----------------------------------------------------------------------------------------
# XIDs as the fault table (decisions/nodes/faults.yaml) classes them by NVIDIA's XID catalog: those it recovers with a
# GPU reset or new hardware, and Blackwell's NVLink XIDs (144-150; the exporter's gauge carries no severity word, so all
# of them page, as XID 74 does on Hopper), page; those the catalog tells the application to restart after
# (RESTART_APP) warn its owner, since the node is fine. IGNORE and XID 45 (which follows other XIDs) say nothing.
FAULTS = load_faults()
FATAL_XIDS: Tuple[int, ...] = tuple(sorted(FAULTS.xids.of("xid-replace") + FAULTS.xids.of("xid-fatal")
                                           + FAULTS.xids.of("xid-nvlink")))
APPLICATION_XIDS: Tuple[int, ...] = FAULTS.xids.with_resolution("RESTART_APP")

# ENA interfaces as AL2023 names them (ens5, enp..., eth0 on older images, enX0 on Xen types); the VPC CNI's host
# veths are eni<hex> and never match.
ENA_DEVICES = "(eth|ens|enp|enX)[0-9].*"
# Below one operation a second a single slow I/O would set the average: such a device is not judged.
MIN_DISK_IOPS = 1
# A pool short of GPUs waits this long before paging: cluster-autoscaler counts a node that has not registered in
# 15 minutes as a failed scale-up (--max-node-provision-time default: kubernetes/autoscaler tag
# cluster-autoscaler-1.35.2 cluster-autoscaler/config/flags/flags.go line 127), and a booting GPU node runs the
# verification gate before its kubelet starts.
POOL_SHORT_FOR = "15m"

RATE_WINDOW = "5m"
# A run-time check older than the repair controller trusts (decisions/nodes/repair.py): five missed runs of the
# checker's 30 s timer.
HEALTH_CHECK_STALE_S = STALE_CHECK_S
# A failed run-time check pages after 2 minutes of failing: past the repair controller's confirmation (CONFIRM_S, two
# readings), so one odd reading pages nobody, and by then the node is out of service and its repair has begun.
HEALTH_CHECK_FAILED_FOR = "2m"
# Twenty missed passes of the repair controller's loop.
REPAIR_CONTROLLER_STALE_S = 20 * REPAIR_INTERVAL_S
GROUP_PREFIX = "gpu-cloud"
# The training queue is deep past the design requirements' 100 pending jobs (the depth at which they want 8-GPU
# nodes; docs/training.md says why node size follows each job instead). Pending means not admitted: every flavor the
# jobs fit has its quota (its pool at maxNodes) taken, and only finishing jobs drain it. For as long as Kueue's longest
# requeue backoff, so jobs bouncing through eviction and requeue do not fire it and a burst of short jobs drains
# first.
QUEUE_DEEP_PENDING = 100
QUEUE_DEEP_MINUTES = kueue.REQUEUE_BACKOFF_MAX_S // 60
# Kueue's series carry replica_role (leader, follower or standalone: kubernetes-sigs/kueue v0.19.2
# pkg/metrics/metrics.go lines 72 and 411-420); a follower's copy would count the queue twice.
KUEUE_REPLICAS = 'replica_role!="follower"'
# A job whose pods never all become ready (an image that cannot be pulled, a request no node of its pool can hold) is
# evicted at waitForPodsReady's timeout and requeued without end: the Kueue configuration sets no requeuing limit,
# so that spot reclaims never fail a job. Each round scales GPU nodes up for nothing. Kueue counts the evictions in
# kueue_evicted_workloads_total{reason="PodsReadyTimeout"} (kubernetes-sigs/kueue v0.19.2 pkg/metrics/metrics.go
# lines 630-648; the reason is WorkloadEvictedByPodsReadyTimeout, apis/kueue/v1beta2/workload_types.go line 1092),
# per ClusterQueue, not per workload. One spot reclaim evicts once; more than PODS_READY_EVICTIONS in
# PODS_READY_WINDOW is a loop. A stuck job comes back at the latest every PODS_READY_LOOP_S (the longer pods-ready
# timeout, with the driver installed at boot, plus Kueue's longest backoff), so the window holds one more round than
# the count. increase() extrapolates to the window's edges (3 evictions can read 3.02), so the rule compares with
# PODS_READY_EVICTIONS + 0.5; a series Kueue creates inside the window starts at 1, so its first eviction is not
# counted.
PODS_READY_EVICTIONS = 3
PODS_READY_LOOP_S = (max(kueue.pods_ready_timeout_s(source) for source in ("ami", "install"))
                     + kueue.REQUEUE_BACKOFF_MAX_S)
PODS_READY_WINDOW = f"{math.ceil((PODS_READY_EVICTIONS + 1) * PODS_READY_LOOP_S / 60)}m"
# A GPU of a reserved pool or a capacity block is billed whether it works or not: one that stays this idle this long
# is money spent on nothing (issue #39 item 8). The reservation's own utilisation notice comes from AWS Health only
# below 20 % over 24 hours (EC2 User Guide, "Utilization notifications"), too late for a block of days.
IDLE_GPU_PCT = 5
IDLE_FOR = "1h"
PAID_FOR_CAPACITY = ("reserved", "capacity-block")


def ksm_resource(resource: str) -> str:
    """kube_node_status_allocatable's `resource` for an extended resource: nvidia.com/gpu -> nvidia_com_gpu (same
    sanitizing; v2.20.0 internal/store/node_test.go shows resource="nvidia_com_gpu")."""
    return ksm_sanitized(resource)


POOL = ksm_label(POOL_NODE_LABEL)
INSTANCE_TYPE = ksm_label(INSTANCE_TYPE_NODE_LABEL)
# Serving nodes: where a GPU busy or full for minutes means its replicas need room. On a training or general pool a
# busy GPU with a full framebuffer is the job working (PyTorch's caching allocator keeps what it has used), so the
# load alerts leave those pools alone.
SERVING_NODES = f'{ksm_label(WORKLOAD_NODE_LABEL)}="inference"'
PAID_FOR_NODES = f'{ksm_label(CAPACITY_NODE_LABEL)}=~"{"|".join(PAID_FOR_CAPACITY)}"'
# A GPU's busy share in percent: the device's utilisation, or under MIG (where the exporter reports no
# DCGM_FI_DEV_GPU_UTIL) each GPU instance's graphics engine activity.
GPU_BUSY_PCT = 'DCGM_FI_DEV_GPU_UTIL or DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""} * 100'


def gpu_nodes(matchers: str = "") -> str:
    """One series per GPU node (a node with a pool label), value 1, labels node, pool and instance_type."""
    extra = f", {matchers}" if matchers else ""
    return (f'max by (node, pool, instance_type) (label_replace(label_replace(kube_node_labels{{{POOL}!=""{extra}}}, '
            f'"pool", "$1", "{POOL}", "(.+)"), "instance_type", "$1", "{INSTANCE_TYPE}", "(.+)"))')


def on_gpu_nodes(expr: str, matchers: str = "") -> str:
    """`expr` (series with a `node` label, already filtered) kept on GPU nodes only, with their pool and instance
    type added; values unchanged."""
    return f"({expr}) * on (node) group_left (pool, instance_type) {gpu_nodes(matchers)}"


def _number(value: float) -> str:
    """A threshold as PromQL reads it: 90, 0.05, 1000 (no trailing .0)."""
    return format(value, "g") if float(value) != int(value) else str(int(value))


def _rule(alert: str, expr: str, for_: str, severity: str, summary: str, description: str,
          labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    return {"alert": alert, "expr": expr, "for": for_, "labels": {"severity": severity, **(labels or {})},
            "annotations": {"summary": summary, "description": description}}


def _where() -> str:
    return "{{ $labels.node }} (pool {{ $labels.pool }}, {{ $labels.instance_type }})"


def _gpu() -> str:
    return "GPU {{ $labels.gpu }} on " + _where()


# --- the groups ----------------------------------------------------------------------------------------------------

def gpu_rules(alerts) -> List[Dict[str, Any]]:
    """Load, memory, temperature and hardware faults, per GPU, from the DCGM exporter."""
    util, mem, temp = alerts.gpu_util_high_pct, alerts.gpu_mem_high_pct, alerts.gpu_temp_c
    limits = FAULTS.limits
    used = "DCGM_FI_DEV_FB_USED"
    # The last XID stays until the driver reloads, but a later harmless one (XID 45 follows fatal ones as processes
    # are killed) replaces it: the exporter's per-XID count over its window (5 minutes) catches the fatal one too.
    xids = lambda codes: " or ".join([f"DCGM_FI_DEV_XID_ERRORS == {code}" for code in codes] + [  # noqa: E731
        f'DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{"|".join(map(str, codes))}"}} > 0'])
    return [
        # Under MIG the exporter reports no DCGM_FI_DEV_GPU_UTIL; each GPU instance (label GPU_I_ID) has the
        # profiling engine's share of time active instead. Serving nodes only (SERVING_NODES).
        _rule("GpuUtilizationHigh", on_gpu_nodes(f"({GPU_BUSY_PCT}) > {util}", SERVING_NODES),
              "5m", "warning", f"GPU utilisation above {util} %",
              f"{_gpu()} has been above {util} % utilisation for 5 minutes: its replicas need more room."),
        # Total as used + free: DCGM_FI_DEV_FB_TOTAL is not in the default CSV, and reserved memory is the driver's.
        _rule("GpuMemoryHigh", on_gpu_nodes(f"{used} / ({used} + DCGM_FI_DEV_FB_FREE) * 100 > {mem}", SERVING_NODES),
              "5m", "warning", f"GPU memory above {mem} % used",
              f"{_gpu()} has used more than {mem} % of its memory for 5 minutes."),
        # Above, as the design requirements put it ("> 85 C") and as the boot gate refuses a GPU
        # (userdata/gpu_verify.py).
        _rule("GpuTemperatureHigh", on_gpu_nodes(f"DCGM_FI_DEV_GPU_TEMP > {temp}"), "1m", "critical",
              f"GPU above {temp} C", f"{_gpu()} has been hotter than {temp} C for a minute."),
        # The field holds the last XID the GPU reported, until the driver reloads: it keeps firing until the node is
        # reset or replaced.
        _rule("GpuFatalXid", on_gpu_nodes(xids(FATAL_XIDS)), "0m", "critical", "GPU reported a fatal XID",
              f"{_gpu()} reported a fatal XID; drain the node and reset or replace it."),
        _rule("GpuApplicationXid", on_gpu_nodes(xids(APPLICATION_XIDS)), "0m", "warning",
              "GPU reported an XID the application restarts after",
              f"{_gpu()} reported XID {', '.join(map(str, APPLICATION_XIDS))}: NVIDIA's XID catalog says restart the "
              "application (RESTART_APP); the node is not at fault and is not repaired. Check the workload's logs."),
        # Volatile: counted since the driver loaded, so any uncorrectable error of this boot (uncorrected volatile > 0
        # resets the GPU in aws-samples/awsome-distributed-training 7217859f 4.validation_and_observability/
        # 2.gpu-cluster-healthcheck/checks/0-nvidia-smi-check.sh lines 365-369).
        _rule("GpuUncorrectableEccErrors", on_gpu_nodes("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0"), "0m", "critical",
              "GPU had uncorrectable ECC errors",
              f"{_gpu()} had uncorrectable ECC errors since its driver loaded; drain the node and reset the GPU."),
        _rule("GpuRowRemapFailure", on_gpu_nodes("DCGM_FI_DEV_ROW_REMAP_FAILURE > 0"), "0m", "critical",
              "GPU row remapping failed", f"{_gpu()} could not remap a memory row; replace the node."),
        _rule("GpuRowRemapPending", on_gpu_nodes("DCGM_FI_DEV_ROW_REMAP_PENDING > 0"), "0m", "warning",
              "GPU row remap waiting for a reset",
              f"{_gpu()} has a row remap that takes effect at the next GPU reset; drain and reboot the node."),
        _rule("GpuRowRemapLimit", on_gpu_nodes(
            f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS >= {limits.row_remap_uncorrectable_max}"), "0m", "critical",
              f"GPU has {limits.row_remap_uncorrectable_max} or more rows remapped for uncorrectable errors",
              f"{_gpu()} is past DCGM's limit of {limits.row_remap_uncorrectable_max} uncorrectable row remaps; "
              "replace the node."),
        # DCGM: CRC errors "only matter at rates of 100+ per second" (decisions/nodes/faults.yaml limits).
        _rule("GpuNvlinkCrcErrors", on_gpu_nodes(
            f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[{RATE_WINDOW}]) >= "
            f"{_number(limits.nvlink_crc_errors_per_second)}"), "5m", "warning",
              f"NVLink CRC errors at {_number(limits.nvlink_crc_errors_per_second)} a second or more",
              f"{_gpu()} has counted {_number(limits.nvlink_crc_errors_per_second)} or more NVLink CRC flit errors "
              "a second for 5 minutes."),
        # DCGM v4.6.0 fails a GPU on a single NVLink replay or recovery error in its window ("Replay and recovery
        # errors are failures, not warnings": modules/health/DcgmHealthWatch.cpp MonitorNVLink4Fields, at
        # DCGM_LIMIT_MAX_NVLINK_ERROR 1); the window here is 10 minutes, so one error pages and then clears.
        _rule("GpuNvlinkReplayErrors", on_gpu_nodes(
            "increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL[10m]) > 0"), "0m", "critical",
              "NVLink replay errors", f"{_gpu()} had to replay NVLink traffic in the last 10 minutes, which DCGM "
              "counts as a failed GPU; gpu-node-repair reboots the node (NVIDIA's NVLink workflow: reset, replace "
              "if it recurs): check its Events if the alert stays."),
        _rule("GpuNvlinkRecoveryErrors", on_gpu_nodes(
            "increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[10m]) > 0"), "0m", "critical",
              "NVLink link recovery", f"{_gpu()} had to recover an NVLink in the last 10 minutes, which DCGM counts "
              "as a failed GPU; gpu-node-repair reboots the node (NVIDIA's NVLink workflow: reset, replace if it "
              "recurs): check its Events if the alert stays."),
        # DCGM v4.6.0 warns when a GPU's PCIe replays in a minute pass what a bit error rate of 1e-12 allows its link
        # (MonitorPcie, GetExpectedPcieReplayRate); limits.pcieReplaysPerMinute says which figure. Held for 5
        # minutes: a burst is the link retraining, a rate that stays is a bad link.
        _rule("GpuPcieReplays", on_gpu_nodes(
            f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[{RATE_WINDOW}]) * 60 > {_number(limits.pcie_replays_per_minute)}"),
              "5m", "warning", f"PCIe replays above {_number(limits.pcie_replays_per_minute)} a minute",
              f"{_gpu()} has replayed more than {_number(limits.pcie_replays_per_minute)} PCIe transfers a minute "
              "for 5 minutes, more than DCGM allows a healthy link; if it stays, replace the node."),
        _rule("GpuThermalThrottling", on_gpu_nodes(f"rate(DCGM_FI_DEV_THERMAL_VIOLATION[{RATE_WINDOW}]) > 0"), "10m",
              "warning", "GPU throttled for heat", f"{_gpu()} has been throttled for thermal reasons for 10 minutes."),
        # The counter is nanoseconds spent at the power cap (DCGM v4.6.0 dcgm_fields.h): its rate / 1e9 is the share
        # of time capped. Healthy GPUs under training load touch the cap; one held there most of the time is slow.
        _rule("GpuPowerThrottling", on_gpu_nodes(
            f"rate(DCGM_FI_DEV_POWER_VIOLATION[10m]) / 1e9 > {_number(limits.power_violation_share)}"), "10m",
              "warning", f"GPU held at its power cap more than {_number(limits.power_violation_share * 100)} % of the "
              "time", f"{_gpu()} has spent more than {_number(limits.power_violation_share * 100)} % of the last 10 "
              "minutes held back by its power limit, for 10 minutes."),
    ]


def node_rules(pools, catalog) -> List[Dict[str, Any]]:
    """GPU nodes: the boot verifier's verdict, readiness, and each pool's schedulable GPUs against its minimum."""
    rules = [
        # The run-time checker (userdata/gpu_verify.py --mode runtime) writes one gpu_cloud_node_health_fault series
        # per fault class it found, labelled with the check status and the fault table's remediation.
        # Held for 2 minutes, the two readings the repair controller waits for before it trusts one
        # (decisions/nodes/repair.py CONFIRM_S): a single odd reading neither pages nor repairs.
        _rule("GpuNodeHealthCheckFailed", on_gpu_nodes('gpu_cloud_node_health_fault{status="fail"} == 1'),
              HEALTH_CHECK_FAILED_FOR,
              "critical", "GPU node health check failed",
              f"The run-time health check found {{{{ $labels.fault }}}} on {_where()}; the fault table's "
              "remediation is {{ $labels.remediation }} (docs/node-gate.md, the fault model)."),
        _rule("GpuNodeHealthWarning", on_gpu_nodes('gpu_cloud_node_health_fault{status="warn"} == 1'), "0m",
              "info", "GPU node health check warned",
              f"The run-time health check found {{{{ $labels.fault }}}} on {_where()}: a warning, nothing to repair."),
        # A node whose checker stopped reporting is not watched; the repair controller ignores faults this old too.
        _rule("GpuNodeHealthCheckStale", on_gpu_nodes(
            f"time() - gpu_cloud_node_health_timestamp_seconds > {HEALTH_CHECK_STALE_S}"), "5m", "warning",
              "GPU node health check not running",
              f"The run-time health check on {_where()} has not reported for more than {HEALTH_CHECK_STALE_S} s "
              "(gpu-cloud-health.timer on the node; journalctl -u gpu-cloud-health)."),
        # A rejected node never joins, so nothing of it is scraped: the gate publishes every verdict to S3, and the
        # repair controller (jobs/node_repair.py) serves the last hour's rejections, one series per instance.
        _rule("GpuNodeVerificationFailed", "max by (pool, instance_id, instance_type, mode, reason) "
              "(gpu_cloud_gate_rejection_timestamp_seconds) > 0", "0m", "warning",
              "GPU node rejected by its boot gate",
              "Instance {{ $labels.instance_id }} ({{ $labels.instance_type }}, pool {{ $labels.pool }}) failed its "
              "{{ $labels.mode }} gate: {{ $labels.reason }}. Its group replaces it; the report is in the artifact "
              "bucket under gate-reports/{{ $labels.pool }}/ (docs/node-gate.md)."),
        _rule("GpuNodeVerificationWarning", "max by (pool, instance_id, fault) "
              "(gpu_cloud_gate_warning_timestamp_seconds) > 0", "0m", "info",
              "GPU node joined with a warning",
              "Instance {{ $labels.instance_id }} (pool {{ $labels.pool }}) passed its gate with a warning: "
              "{{ $labels.fault }}."),
        _rule("GpuNodeNotReady", on_gpu_nodes('kube_node_status_condition{condition="Ready",status="true"} == 0'),
              "5m", "critical", "GPU node not Ready", f"{_where()} has not been Ready for 5 minutes."),
    ]
    if any(pool.spec.capacity in PAID_FOR_CAPACITY for pool in pools):
        # The node's GPUs together: a node half busy is a job placed on part of it, not money idle.
        rules.append(_rule(
            "ReservedGpusIdle", on_gpu_nodes(f"avg by (node) ({GPU_BUSY_PCT}) < {IDLE_GPU_PCT}", PAID_FOR_NODES),
            IDLE_FOR, "warning", f"Paid-for GPUs under {IDLE_GPU_PCT} % busy for an hour",
            f"The GPUs of {_where()}, a reserved or capacity-block pool billed whether it works or not, have been "
            f"under {IDLE_GPU_PCT} % busy on average for an hour: give the queue work for it (docs/training.md) or "
            "shrink the reservation."))
    for pool in pools:
        if pool.spec.min_nodes == 0:
            continue
        for resource, per_node in offered_gpu_resources(pool, catalog).items():
            need = pool.spec.min_nodes * per_node
            pool_nodes = f'max by (node) (kube_node_labels{{{POOL}="{pool.name}"}})'
            schedulable = (
                f'kube_node_status_allocatable{{resource="{ksm_resource(resource)}"}} * on (node) group_left () '
                f"{pool_nodes}"
                ' unless on (node) (kube_node_spec_unschedulable == 1)'
                ' unless on (node) (kube_node_status_condition{condition="Ready",status="true"} == 0)')
            # `or vector(0)`: a pool with no nodes at all has no series to sum. Silent while kube-state-metrics
            # is not scraped (the chart's own alerts cover that), rather than reporting an empty pool.
            expr = f"(sum({schedulable}) or vector(0)) < {need} unless on () absent(kube_node_labels)"
            rules.append(_rule(
                "GpuPoolBelowMinimum", expr, POOL_SHORT_FOR, "critical",
                f"Pool {pool.name} has fewer than {need} schedulable {resource}",
                f"Pool {pool.name} has had fewer than {need} {resource} on Ready, schedulable nodes (minNodes "
                f"{pool.spec.min_nodes} x {per_node}) for {POOL_SHORT_FOR}.", labels={"pool": pool.name}))
    return rules


def repair_rules() -> List[Dict[str, Any]]:
    """The repair controller (jobs/node_repair.py): a braked pool, a sick node it will not touch, a repair that does
    not finish, and the controller itself."""
    return [
        _rule("GpuPoolLaunchSuspended", "gpu_cloud_pool_launch_suspended == 1", "0m", "critical",
              "Pool {{ $labels.pool }} launches no nodes",
              "The Auto Scaling group of pool {{ $labels.pool }} has its Launch process suspended: the repair "
              "controller braked it after launches its gate rejected in a row (GpuNodeVerificationFailed says why), "
              "or a person did. Fix the cause, then: aws autoscaling resume-processes --auto-scaling-group-name "
              "<group> --scaling-processes Launch (docs/node-gate.md)."),
        # Pre-set to 0 for every pool, action and outcome, so the first refusal is an increase.
        _rule("GpuRepairRefused", 'increase(gpu_cloud_repair_decisions_total{outcome="refused"}[15m]) > 0', "0m",
              "warning", "A sick GPU node in pool {{ $labels.pool }} is not being repaired",
              "The repair controller refused to {{ $labels.action }} a node of pool {{ $labels.pool }} (budget, "
              "minimum healthy, one at a time, or too many faulty at once); kubectl get events -A "
              "--field-selector reason=GpuRepairRefused says which node and why."),
        _rule("GpuRepairStuck", "gpu_cloud_repairs_stuck > 0", "0m", "critical",
              "A GPU node repair in pool {{ $labels.pool }} has not finished",
              f"A repair in pool {{{{ $labels.pool }}}} is past its {REPAIR_TIMEOUT_S // 60} minutes; the pool "
              "starts no other repair until it ends (kubectl get events -A --field-selector reason=GpuRepairStuck)."),
        _rule("GpuRepairControllerDown",
              f"time() - gpu_cloud_repair_last_success_timestamp_seconds > {REPAIR_CONTROLLER_STALE_S} "
              "or absent(gpu_cloud_repair_last_success_timestamp_seconds)", "5m", "critical",
              "The GPU node repair controller is not working",
              f"No pass of gpu-node-repair has completed for more than {REPAIR_CONTROLLER_STALE_S // 60} minutes: "
              "sick nodes are not repaired, rejections not counted, looping pools not braked. "
              "gpu_cloud_repair_errors_total says what it fails to call; kubectl -n kube-system logs "
              "deploy/gpu-node-repair."),
    ]


def network_rules(alerts, pools) -> List[Dict[str, Any]]:
    """IP throughput against what the node's ENA interfaces can carry (decisions/nodes/efa.py ip_bandwidth_gbps: on EFA
    types most of networkGbps is EFA's, which the kernel never counts), and ENA's allowance counters."""
    pct = alerts.network_high_pct
    rules = []
    # Per pool and type: the same type may carry EFA in one pool and not in another.
    for pool in pools:
        for itype in pool.types:
            gbps = ip_bandwidth_gbps(itype, efa=pool.efa)
            for direction in ("receive", "transmit"):
                # EC2 bandwidth applies to each direction on its own (EC2 User Guide, "Amazon EC2 instance network
                # bandwidth": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html).
                share = (f'sum by (node) (rate(node_network_{direction}_bytes_total{{device=~"{ENA_DEVICES}"}}'
                         f"[{RATE_WINDOW}])) * 8 / ({_number(gbps)} * 1e9) * 100 > {pct}")
                rules.append(_rule(
                    "GpuNodeNetworkHigh", on_gpu_nodes(share, f'{POOL}="{pool.name}", {INSTANCE_TYPE}="{itype.name}"'),
                    "10m", "warning", f"Node network {direction} above {pct} % of {itype.name} IP bandwidth",
                    f"{_where()} has used more than {pct} % of its {_number(gbps)} Gbps of IP bandwidth to {direction} "
                    "for 10 minutes.", labels={"direction": direction, "pool": pool.name, "instance_type": itype.name}))
    for counter, what in ENA_ALLOWANCES.items():
        rules.append(_rule(
            "EnaAllowanceExceeded", on_gpu_nodes(f"rate(node_ethtool_{counter}[{RATE_WINDOW}]) > 0"), "10m",
            "warning", f"ENA {what} allowance exceeded",
            f"Interface {{{{ $labels.device }}}} on {_where()} has been dropping or queueing packets over its "
            f"{what} allowance for 10 minutes ({counter}).", labels={"allowance": counter}))
    return rules


def storage_rules(alerts) -> List[Dict[str, Any]]:
    """Average I/O latency per device on GPU nodes: time spent on completed I/Os / I/Os completed."""
    ms = alerts.storage_latency_ms
    rules = []
    for operation, time_metric, count_metric in (
            ("read", "node_disk_read_time_seconds_total", "node_disk_reads_completed_total"),
            ("write", "node_disk_write_time_seconds_total", "node_disk_writes_completed_total")):
        done = f"rate({count_metric}[{RATE_WINDOW}])"
        slow = (f"rate({time_metric}[{RATE_WINDOW}]) / {done} * 1000 > {_number(ms)}"
                f" and {done} >= {MIN_DISK_IOPS}")
        rules.append(_rule(
            "GpuNodeStorageLatencyHigh", on_gpu_nodes(slow), "10m", "warning",
            f"Disk {operation} latency above {_number(ms)} ms",
            f"Device {{{{ $labels.device }}}} on {_where()} has averaged more than {_number(ms)} ms per {operation} "
            "for 10 minutes.", labels={"operation": operation}))
    return rules


def _literal(name: str) -> str:
    """A Kubernetes object name inside a PromQL regex: its characters ([a-z0-9-]) are all literal there (a PromQL
    string would reject the backslashes re.escape adds before '-')."""
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"{name!r} is not a plain object name")
    return name


def nccl_acceptance_jobs(pools, catalog) -> List[Tuple[str, str, str]]:
    """(pool, scope, job_name regex) of every NCCL acceptance Job the stack can run in TRAINING_NAMESPACE: the MPIJob's
    launcher Job (the MPIJob's generated name + "-launcher", kubeflow/mpi-operator v0.8.0
    pkg/controller/mpi_job_controller.go launcherSuffix) on pools the test can run on, and the Jobs of the NVLink
    CronJob (its name + "-" + the scheduled Unix time in minutes, kubernetes/kubernetes
    pkg/controller/cronjob/cronjob_controllerv2.go getJobName)."""
    jobs = []
    for pool in pools:
        try:
            mpijob = acceptance.mpijob_manifest(pool, catalog, namespace=TRAINING_NAMESPACE, queue_name="-",
                                                judge_configmap="-", service_account="-")
        except ValueError:      # not an EFA pool, shared GPUs, or no across-nodes minimum: the test cannot run there
            continue
        # generateName: the API server appends 5 random lower-case letters and digits.
        jobs.append((pool.name, "across-nodes", _literal(mpijob["metadata"]["generateName"]) + "[a-z0-9]{5}-launcher"))
    for pool in acceptance.nvlink_check_pools(pools, catalog):
        cronjob = acceptance.nvlink_cronjob_manifest(pool, catalog, namespace=TRAINING_NAMESPACE, queue_name="-",
                                                     schedule=acceptance.DEFAULT_NVLINK_SCHEDULE, suspend=True,
                                                     judge_configmap="-", service_account="-")
        jobs.append((pool.name, "within-node", _literal(cronjob["metadata"]["name"]) + "-[0-9]+"))
    return jobs


def nccl_rules(pools, catalog) -> List[Dict[str, Any]]:
    """A failed NCCL acceptance Job: its judge (jobs/nccl_judge.py) exits 1 when the bus bandwidth is below the
    type's minimum or the run failed, and with backoffLimit 0 the Job then fails."""
    rules = []
    for pool, scope, job_name in nccl_acceptance_jobs(pools, catalog):
        failed = (f'kube_job_failed{{namespace="{TRAINING_NAMESPACE}",condition="true",'
                  f'job_name=~"{job_name}"}} == 1')
        if scope == "within-node":
            # A CronJob keeps its last failed Jobs; only the newest run decides, so a later pass resolves the alert.
            started = (f'kube_job_status_start_time{{namespace="{TRAINING_NAMESPACE}",job_name=~"{job_name}"}}')
            failed = f"{failed} and on (namespace, job_name) ({started} == on () group_left () max({started}))"
        rules.append(_rule(
            "NcclAcceptanceFailed", failed, "0m", "critical", f"NCCL acceptance failed on pool {pool}",
            f"NCCL {scope} acceptance Job {{{{ $labels.job_name }}}} failed on pool {pool}: bus bandwidth below the "
            f"minimum or the run failed. `kubectl -n {TRAINING_NAMESPACE} get events` shows the judge's verdict.",
            labels={"pool": pool, "scope": scope}))
    return rules


def triton_rules(alerts, target_queue_ms: float) -> List[Dict[str, Any]]:
    """Triton per model (triton-inference-server/server v2.71.0 docs/user_guide/metrics.md names)."""
    by = "sum by (namespace, model, version)"
    success, failure = "nv_inference_request_success", "nv_inference_request_failure"
    rate = lambda metric: f"{by} (rate({metric}[{RATE_WINDOW}]))"     # noqa: E731
    model = "Model {{ $labels.model }} version {{ $labels.version }} in {{ $labels.namespace }}"
    failure_pct, p99 = alerts.triton_failure_pct, alerts.triton_p99_latency_ms
    return [
        # Queue time per successful request: cumulative queue microseconds / requests (the docs show
        # nv_inference_queue_duration_us matching the queue summary's _sum against nv_inference_request_success).
        _rule("TritonQueueTimeHigh",
              f"{rate('nv_inference_queue_duration_us')} / {rate(success)} / 1000 > {_number(target_queue_ms)}",
              "10m", "warning", f"Triton queue time above {_number(target_queue_ms)} ms",
              f"{model} has queued requests for more than {_number(target_queue_ms)} ms on average for 10 minutes."),
        _rule("TritonFailureRateHigh",
              f"{rate(failure)} / ({rate(success)} + {rate(failure)}) * 100 > {_number(failure_pct)}",
              "5m", "critical", f"Triton failing more than {_number(failure_pct)} % of requests",
              f"{model} has failed more than {_number(failure_pct)} % of its requests for 5 minutes."),
        # The sidecar is unready once its last good sync is SYNC_STALE_S old; the pod then leaves the load balancer.
        _rule("TritonModelSyncStale",
              f'max by (namespace, pod) (kube_pod_container_status_ready{{namespace="{INFERENCE_NAMESPACE}", '
              f'container="{TRITON_SYNC_CONTAINER}"}}) == 0',
              "5m", "critical", "Triton pod cannot sync its models",
              "Pod {{ $labels.pod }} in {{ $labels.namespace }} has not copied the model repository from S3 for more "
              "than ten minutes and is out of the load balancer (a region whose every pod is out fails over). "
              f"`kubectl -n {INFERENCE_NAMESPACE} logs {{{{ $labels.pod }}}} -c {TRITON_SYNC_CONTAINER}` says why: "
              "S3, KMS or the pod's Pod Identity role."),
        # Readiness asks for one model, so a model that does not load beside good ones (GPU memory, an engine built for
        # another architecture) would serve errors unseen; on a DR secondary it would be found at failover.
        _rule("TritonModelNotReady",
              f"max by (namespace, pod, model, version) ({TRITON_MODEL_READY_METRIC}) == 0",
              f"{TRITON_MODEL_NOT_READY_MINUTES}m", "critical", "A Triton model is not ready",
              f"{model} has not been ready in pod {{{{ $labels.pod }}}} for {TRITON_MODEL_NOT_READY_MINUTES} minutes: "
              "requests for it fail there. Triton's reason (the load's error: GPU memory, an engine built for another "
              f"GPU architecture, a bad config.pbtxt): `kubectl -n {INFERENCE_NAMESPACE} exec {{{{ $labels.pod }}}} "
              f"-c triton -- curl -s -X POST localhost:{TRITON_HTTP_PORT}/v2/repository/index`."),
        # Summary quantiles cannot be averaged across replicas: the slowest replica's p99 decides.
        _rule("TritonP99LatencyHigh",
              f'max by (namespace, model, version) (nv_inference_request_summary_us{{quantile="{TRITON_P99_QUANTILE}"}})'
              f" / 1000 > {_number(p99)}",
              "5m", "warning", f"Triton p99 latency above {_number(p99)} ms",
              f"{model} has had a p99 request latency above {_number(p99)} ms for 5 minutes."),
    ]


def queue_rules(pools, catalog) -> List[Dict[str, Any]]:
    """The training queue's depth (kueue_pending_workloads: active and inadmissible workloads of the ClusterQueue),
    on stacks that have the queue."""
    if not kueue.flavors(pools, catalog):
        return []
    pending = (f'sum by (cluster_queue) (kueue_pending_workloads{{cluster_queue="{kueue.CLUSTER_QUEUE}", '
               f"{KUEUE_REPLICAS}}})")
    return [_rule(
        "TrainingQueueDeep", f"{pending} > {QUEUE_DEEP_PENDING}", f"{QUEUE_DEEP_MINUTES}m", "warning",
        f"More than {QUEUE_DEEP_PENDING} training jobs waiting",
        f"ClusterQueue {{{{ $labels.cluster_queue }}}} has held more than {QUEUE_DEEP_PENDING} pending workloads for "
        f"{QUEUE_DEEP_MINUTES} minutes: the flavors they fit have no quota left (their pools are at maxNodes), or "
        f"they fit none. `kubectl -n {TRAINING_NAMESPACE} get workloads` says which; raise a pool's maxNodes or add "
        "a pool."),
        _rule(
            "TrainingJobsEvictedNotReady",
            f'sum by (cluster_queue) (increase(kueue_evicted_workloads_total{{cluster_queue="{kueue.CLUSTER_QUEUE}", '
            f'reason="PodsReadyTimeout", {KUEUE_REPLICAS}}}[{PODS_READY_WINDOW}])) > {PODS_READY_EVICTIONS + 0.5}',
            "0m", "warning", "Training jobs evicted again and again before their pods were ready",
            f"ClusterQueue {{{{ $labels.cluster_queue }}}} has evicted more than {PODS_READY_EVICTIONS} workloads in "
            f"{PODS_READY_WINDOW} because their pods were not all ready in time; such a job is requeued without end "
            f"and scales GPU nodes up each time. `kubectl -n {TRAINING_NAMESPACE} get workloads` and the Evicted "
            "condition name it; fix its image or its request, or delete it.")]


def rule_groups(alerts, pools, catalog, triton_target_queue_ms: Optional[float] = None) -> List[Dict[str, Any]]:
    """PrometheusRule spec.groups. alerts: decisions.config.model.Alerts; pools: the stack's ResolvedPools; catalog: the
    loaded decisions/catalog/catalog.yaml; triton_target_queue_ms: the Triton target when Triton is enabled (None: no
    Triton group)."""
    groups = [
        {"name": f"{GROUP_PREFIX}.gpu", "rules": gpu_rules(alerts)},
        {"name": f"{GROUP_PREFIX}.gpu-nodes", "rules": node_rules(pools, catalog)},
        {"name": f"{GROUP_PREFIX}.repair", "rules": repair_rules()},
        {"name": f"{GROUP_PREFIX}.network", "rules": network_rules(alerts, pools)},
        {"name": f"{GROUP_PREFIX}.storage", "rules": storage_rules(alerts)},
        {"name": f"{GROUP_PREFIX}.nccl", "rules": nccl_rules(pools, catalog)},
        {"name": f"{GROUP_PREFIX}.queue", "rules": queue_rules(pools, catalog)},
    ]
    if triton_target_queue_ms is not None:
        groups.append({"name": f"{GROUP_PREFIX}.triton", "rules": triton_rules(alerts, triton_target_queue_ms)})
    return [group for group in groups if group["rules"]]


def promtool_rule_file(groups: Sequence[Mapping[str, Any]]) -> str:
    """The groups as a Prometheus rule file (`groups:`), for `promtool check rules` / `promtool test rules`."""
    return yaml.safe_dump({"groups": [dict(group) for group in groups]}, sort_keys=False, width=1000)
