"""The DCGM exporter's counter file: which GPU fields it exports. Pure: no Pulumi.

gpu-operator v26.7.0 runs dcgm-exporter 4.6.0-4.8.3 (values.yaml dcgmExporter.version) with
DCGM_EXPORTER_COLLECTORS=/etc/dcgm-exporter/dcp-metrics-included.csv (assets/state-dcgm-exporter/0800_daemonset.yaml),
and the exporter exports only the fields of that file. Some fields the alert rules and dashboards read are commented
out there, so gpu-cloud gives the operator its own file: a ConfigMap named by the chart value dcgmExporter.config.name
(templates/clusterpolicy.yaml lines 561-563; the operator mounts its key dcgm-metrics.csv and points
DCGM_EXPORTER_COLLECTORS at it, controllers/object_controls.go lines 1901-1921).
"""
from __future__ import annotations

from typing import Tuple

CONFIGMAP = "gpu-cloud-dcgm-metrics"
CSV_KEY = "dcgm-metrics.csv"         # the key the operator mounts (object_controls.go MetricsConfigFileName)

# NVIDIA/dcgm-exporter etc/default-counters.csv at tag 4.5.3-4.8.2 (the newest tag the stored snapshot holds; the
# file is unchanged on main after it, and dcp-metrics-included.csv lists the same fields): field, Prometheus type.
# The help texts are ours.
DEFAULT_COUNTERS: Tuple[Tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock (MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock (MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy used since boot (mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (%)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (%)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (%)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (%)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "The last XID error seen."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth counter over all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU license status."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable errors."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 when row remapping failed."),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver version."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Share of time the graphics engine was active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Share of cycles the tensor pipe was active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Share of cycles the memory interface was busy."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe transmit rate (bytes/s)."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe receive rate (bytes/s)."),
)

# Fields the alert rules (decisions/observability/alert_rules.py) and dashboards (decisions/observability/dashboards.py)
# read that the same file leaves commented out, with the types it gives them. Help texts hold no comma: the exporter
# reads the file as CSV.
EXTRA_COUNTERS: Tuple[Tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit ECC errors since the driver loaded."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit ECC errors since the driver loaded."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "NVLink flow-control CRC errors over all links."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "NVLink data CRC errors over all links."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink replays over all links."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "NVLink recoveries over all links."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Time held back by the power limit (ns)."),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "1 when a row remap waits for the next GPU reset."),
    # Computed by the exporter: how often each XID was reported in its window (--xid-count-window-size, 5 minutes;
    # internal/pkg/collector/xid_collector.go labels each series with `xid`).
    ("DCGM_EXP_XID_ERRORS_COUNT", "counter", "XIDs reported during the last window by xid."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Time held back by temperature (ns)."),
)


def metrics_csv() -> str:
    """The counter file: the defaults, then the extras (`field, type, help` per line; '#' starts a comment)."""
    lines = ["# gpu-cloud: dcgm-exporter's default counters, then the ones its alert rules and dashboards add"]
    lines += [f"{field}, {kind}, {help_text}" for field, kind, help_text in DEFAULT_COUNTERS + EXTRA_COUNTERS]
    return "\n".join(lines) + "\n"
