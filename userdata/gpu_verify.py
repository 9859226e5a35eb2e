#!/usr/bin/env python3
"""gpu-cloud node verifier: checks a GPU node against what its instance type promises.

The gate runs it at every boot, before the kubelet starts, and admits the node only when the verdict is
"pass" (--mode boot). A timer runs it again every 30 seconds while the node works (--mode runtime), with
the checks a running workload does not disturb. Both read the kernel log of the current boot, so a
fatal XID or SXid stays a fault until the node reboots (as DCGM's last-XID field does until the driver
reloads): a reboot or a replacement is what clears it.

Every verdict comes from the fault table (decisions/nodes/faults.yaml, shipped beside this script as faults.json):
a check names the fault class it found, the table says whether that fails or warns at boot and what
repairs it, and the report carries both.

Usage:
    python3 gpu_verify.py --expect EXPECT.json --report REPORT.json [--textfile PATH]
                          [--kernel-log PATH] [--budget-s 60] [--faults faults.json]
                          [--mode boot|runtime]

Exit status: 0 pass, 1 fail, 2 could not run (verdict "error": EXPECT missing or invalid, pynvml
not importable, NVML initialisation failed, report not writable). A report is written whenever the
arguments parse, including for "error". Once the report and textfile are written the process ends
at once (os._exit), without waiting for worker threads still stuck in a hung NVML call.

EXPECT.json: {"instanceType", "gpuModel", "gpuCount", "gpuMemoryMiB", "nvlinkLinksPerGpu",
"nvswitch", "driverBranch", "driverVersion" (optional or null), "maxTempC",
"migMode": "disabled" | "enabled", "eccExpected", "eccReservesMemory"}. gpuModel is a catalog short
name (see GPU_MODEL_PATTERNS); driverBranch is 550, "550" or "R550".

REPORT.json (default /var/lib/gpu-cloud/verify.json): {"verdict": "pass" | "fail" | "error",
"mode", "instanceType", "instanceId", "durationS", "faults": [fault ids that failed or warned],
"remediation": "none" | "reset" | "reboot" | "replace" (the strongest of the failed ones),
"checks": [{"name", "status", "gpu", "value", "threshold", "detail", "fault"}]}, status one of pass,
fail, warn, skip; gpu is an index or null; fault the class a fail or warn found, else null.

--textfile PATH writes a Prometheus node-exporter textfile atomically (temporary file + rename);
the verdict and every check's status are state sets (one sample per state, 1 for the one it had).
--kernel-log PATH reads XID and SXid lines from PATH instead of `journalctl -k -b` (falling back to
`dmesg`; each source gets its own bounded attempt). Every line in PATH counts: a file that spans several
boots (/var/log/messages, a saved journal) brings the XIDs of earlier boots with it.

Environment:
    GPU_CLOUD_INSTANCE_ID  copied into the report's instanceId (null when unset).
    GPU_VERIFY_NVIDIA_SMI  the nvidia-smi used for the `-L` cross-check, a path or a command name;
                           by default `nvidia-smi` is resolved from PATH.

Rules: an NVML call that raises NotSupported or FunctionNotFound makes its check "skip" (never pass,
never fail), after the older name of the call was tried where the driver may predate the newer one;
but a feature the catalog promises (NVLink links, the GPU fabric of an NVSwitch board) that NVML
does not report fails. Every NVML call runs in a daemon thread with a per-call timeout, and the
whole run has a budget (--budget-s): a hung call fails its check, and once the budget is spent the
remaining checks fail with "budget exhausted" so the verdict is always produced in time. An
unexpected exception fails its check with the error text; the verifier itself does not crash.

Standard library plus pynvml (the nvidia-ml-py package) only; Python 3.9 or newer.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

# XID lists, SXid severities and every limit come from the fault table (faults.json, load_faults).
# The driver changed a GPU's recovery action; the XID 154 line names the new one, e.g.
# "154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
RECOVERY_ACTION_CHANGE = re.compile(r"recovery action changed .*?\bto 0x(?P<action>[0-9a-fA-F]+)")

# nvmlDeviceGpuRecoveryAction_t (nvml.h), what NVML_FI_DEV_GET_GPU_RECOVERY_ACTION reports.
RECOVERY_ACTION_NONE = 0
RECOVERY_ACTION_NAMES = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain P2P",
    4: "drain P2P and reset GPU",
    5: "recover IMEX domain",
    6: "PCIe bus reset",
    7: "system reboot",
}

# nvmlValueType_t -> the member of the nvmlValue_t union that holds a field value of that type.
FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                       6: "usVal"}

# Catalog short name -> pattern over the NVML device name. First match wins, so the more specific
# A100 variants come before anything looser. \b keeps "L4" from matching "L40S" and "H200" from
# matching "GH200".
GPU_MODEL_PATTERNS: Tuple[Tuple[str, str], ...] = (
    ("A100 80GB", r"\bA100\b.*\b80\s*GB\b"),
    ("A100 40GB", r"\bA100\b.*\b40\s*GB\b"),
    ("H100", r"\bH100\b"),
    ("H200", r"\bH200\b"),
    ("B200", r"\bB200\b"),
    ("L40S", r"\bL40S\b"),
    ("L4", r"\bL4\b"),
    ("A10G", r"\bA10G\b"),
    ("T4", r"\bT4\b"),
)

# GDDR boards (T4, A10G, L4, L40S) keep 1/16 of their memory for ECC while it is on: T4's 16384 MiB is
# 15360 with ECC on. The catalog's figure may be either, so each is accepted as the ECC mode allows.
ECC_RESERVED_SHARE = 1.0 / 16

# Catalog models on NVSwitch boards whose GPUs report a fabric state: NVML's GPU fabric query is
# for Hopper or newer, so an A100 board has NVSwitches but answers NotSupported.
GPU_FABRIC_MODELS = frozenset({"H100", "H200", "B200"})

# Clock event reasons that mean the hardware itself is holding the clocks down (fail), and the
# driver's own thermal slowdown (warn). Same bits under the older "throttle reasons" names.
HW_CLOCK_EVENT_REASONS: Tuple[Tuple[int, str], ...] = (
    (0x8, "HW slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake slowdown"),
)
SW_THERMAL_SLOWDOWN = 0x20

FABRIC_STATE_NAMES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
# Sub-fields of the GPU fabric health mask judged as the EKS node monitoring agent judges them:
# (name, shift, width mask, values that are unhealthy). The four flags read 0 not supported,
# 1 true (the fault), 2 false; incorrect configuration reads 0 not supported, 1 none, 2 and up a
# wrong configuration. A non-zero mask is therefore no fault by itself. Partition assignment
# (shift 12) is informational and not judged.
FABRIC_HEALTH_FIELDS: Tuple[Tuple[str, int, int, FrozenSet[int]], ...] = (
    ("degraded_bw", 0, 0x3, frozenset({1})),
    ("route_recovery", 2, 0x3, frozenset({1})),
    ("route_unhealthy", 4, 0x3, frozenset({1})),
    ("access_timeout_recovery", 6, 0x3, frozenset({1})),
    ("incorrect_configuration", 8, 0xF, frozenset(range(2, 16))),
)

DEFAULT_REPORT_PATH = "/var/lib/gpu-cloud/verify.json"
DEFAULT_BUDGET_S = 60.0
CALL_TIMEOUT_S = 10.0       # one NVML call or helper command, at most
MIN_CALL_S = 0.05           # less budget than this left: don't start another call
XID_DRAIN_S = 1.0           # final wait for NVML XID events queued during the run
FABRIC_SETTLE_S = 15.0      # fabric manager may still be training NVLinks right after boot
FABRIC_POLL_S = 0.2
NVIDIA_SMI_ENV = "GPU_VERIFY_NVIDIA_SMI"
INSTANCE_ID_ENV = "GPU_CLOUD_INSTANCE_ID"
KERNEL_LOG_COMMANDS: Tuple[Tuple[str, ...], ...] = (("journalctl", "-k", "-b", "--no-pager"),
                                                     ("dmesg",))
KERNEL_LOG_ENTRY = re.compile(r"^(?!-- |No journal files)\s*\S")  # not journalctl's notices
XID_LINE = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<xid>\d+)(?P<message>[^\n]*)")
SXID_LINE = re.compile(r"SXid \((?P<where>[^)]*)\): (?P<sxid>\d+), (?P<rest>[^\n]*)")
NONFATAL_WORD = re.compile(r"\bNon-?fatal\b", re.IGNORECASE)
DEFAULT_FAULTS_NAME = "faults.json"    # beside this script in the bundle
MODES = ("boot", "runtime")
# Checks a running workload changes, so the run-time checker leaves them to the DCGM exporter's
# series: a GPU under load is hot and may brake its clocks for a moment, and it runs processes.
RUNTIME_SKIPPED = frozenset({"compute_processes", "temperature", "clock_events", "xid_events"})
SMI_GPU_LINE = re.compile(r"^GPU \d+:")
EXIT_CODES = {"pass": 0, "fail": 1, "error": 2}
CHECK_ERROR = "check-error"             # the class of a check that could not finish
REMEDIATIONS = ("none", "reset", "reboot", "replace")
CHECK_STATUSES = ("pass", "fail", "warn", "skip")
MIB = 1 << 20

EXPECT_KEYS = ("instanceType", "gpuModel", "gpuCount", "gpuMemoryMiB", "nvlinkLinksPerGpu",
               "nvswitch", "driverBranch", "maxTempC", "migMode", "eccExpected", "eccReservesMemory")


# --------------------------------------------------------------------------------------------
# Outcomes and errors
# --------------------------------------------------------------------------------------------

class Outcome(object):
    """What one check found: status, the value seen, the threshold it was held to, why, and the fault
    class behind a fail or warn."""

    __slots__ = ("status", "value", "threshold", "detail", "fault")

    def __init__(self, status: str, value: Any = None, threshold: Any = None, detail: str = "",
                 fault: Optional[str] = None):
        self.status, self.value, self.threshold, self.detail = status, value, threshold, detail
        self.fault = fault


def passed(value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
    return Outcome("pass", value, threshold, detail)


def skipped(detail: str, threshold: Any = None) -> Outcome:
    return Outcome("skip", None, threshold, detail)


class FaultTable(object):
    """faults.json: the fault classes (verdict at boot, remediation), the XID lists and the limits."""

    def __init__(self, document: Dict[str, Any]):
        try:
            self.faults: Dict[str, Dict[str, Any]] = dict(document["faults"])
            xids = document["xids"]
            self.replace_xids = frozenset(int(x) for x in xids["replace"])
            self.fatal_xids = frozenset(int(x) for x in xids["fatal"])
            self.nvlink_xids = frozenset(int(x) for x in xids["nvlink"])
            self.application_xids = frozenset(int(x) for x in xids["application"])
            self.recovery_action_xid = int(xids["recoveryAction"])
            self.sxid_fatal_word = str(document["sxids"]["fatalWord"])
            self.limits: Dict[str, Any] = dict(document["limits"])
            for key in ("retiredPagesMax", "rowRemapUncorrectableMax", "powerLimitFailPercent",
                        "memoryTolerance"):
                float(self.limits[key])
            for fault in self.faults.values():
                if fault["boot"] not in ("fail", "warn", "none"):
                    raise ValueError("boot verdict %r" % fault["boot"])
        except (KeyError, TypeError, ValueError) as err:
            raise FaultsError("faults.json is not a fault table: %s: %s" % (type(err).__name__, err))
        if CHECK_ERROR not in self.faults:
            raise FaultsError("faults.json has no %s class" % CHECK_ERROR)

    def outcome(self, fault: str, value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
        """What finding `fault` means: the table's boot verdict (a run-time check judges the same way)."""
        entry = self.faults.get(fault)
        if entry is None:  # a verifier bug: never pass because the table lacks a class
            return Outcome("fail", value, threshold, "%s (unknown fault class %r)" % (detail, fault),
                           CHECK_ERROR)
        status = {"fail": "fail", "warn": "warn", "none": "warn"}[entry["boot"]]
        return Outcome(status, value, threshold, detail, fault)

    def remediation(self, fault: Optional[str]) -> str:
        return self.faults.get(fault or CHECK_ERROR, self.faults[CHECK_ERROR])["remediation"]


def load_faults(path: str) -> FaultTable:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return FaultTable(json.load(handle))
    except (OSError, ValueError) as err:
        raise FaultsError("cannot read fault table %s: %s" % (path, err))


class CallTimedOut(Exception):
    def __init__(self, call: str, seconds: float):
        super(CallTimedOut, self).__init__("%s timed out after %.2gs" % (call, seconds))


class BudgetExhausted(Exception):
    pass


class ExpectError(ValueError):
    pass


class FaultsError(ValueError):
    pass


class FabricMissing(Exception):
    """A GPU the catalog gives a fabric state (GPU_FABRIC_MODELS on NVSwitch) reports none."""


class _Never(Exception):
    """Stands in for an exception class the binding lacks, so `except` clauses stay valid."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def classify_gpu_name(nvml_name: str) -> Optional[str]:
    """Catalog short name for an NVML device name, or None when the name is not recognised."""
    for short_name, pattern in GPU_MODEL_PATTERNS:
        if re.search(pattern, nvml_name, re.IGNORECASE):
            return short_name
    return None


def parse_driver_branch(branch: Any) -> int:
    if isinstance(branch, bool):
        raise ExpectError("driverBranch must be a number like 550 or a string like \"R550\"")
    if isinstance(branch, int):
        return branch
    match = re.match(r"^\s*[Rr]?(\d+)", str(branch))
    if not match:
        raise ExpectError("driverBranch %r is not like 550 or \"R550\"" % (branch,))
    return int(match.group(1))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_expect(path: str) -> Dict[str, Any]:
    """EXPECT.json, validated; raises ExpectError saying what is wrong."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            expect = json.load(handle)
    except (OSError, ValueError) as err:
        raise ExpectError("cannot read %s: %s" % (path, err))
    if not isinstance(expect, dict):
        raise ExpectError("%s: top level must be a JSON object" % path)
    missing = [key for key in EXPECT_KEYS if key not in expect]
    if missing:
        raise ExpectError("%s: missing %s" % (path, ", ".join(missing)))
    problems = []
    if not isinstance(expect["instanceType"], str) or not expect["instanceType"]:
        problems.append("instanceType must be a non-empty string")
    known_models = [name for name, _ in GPU_MODEL_PATTERNS]
    if expect["gpuModel"] not in known_models:
        problems.append("gpuModel %r is not one of %s" % (expect["gpuModel"], ", ".join(known_models)))
    for key, minimum in (("gpuCount", 1), ("gpuMemoryMiB", 1), ("nvlinkLinksPerGpu", 0)):
        if not _is_int(expect[key]) or expect[key] < minimum:
            problems.append("%s must be an integer >= %d" % (key, minimum))
    for key in ("nvswitch", "eccExpected", "eccReservesMemory"):
        if not isinstance(expect[key], bool):
            problems.append("%s must be true or false" % key)
    if isinstance(expect["maxTempC"], bool) or not isinstance(expect["maxTempC"], (int, float)):
        problems.append("maxTempC must be a number")
    if expect["migMode"] not in ("disabled", "enabled"):
        problems.append("migMode must be \"disabled\" or \"enabled\"")
    try:
        parse_driver_branch(expect["driverBranch"])
    except ExpectError as err:
        problems.append(str(err))
    version = expect.get("driverVersion")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        problems.append("driverVersion must be a version string or null")
    if problems:
        raise ExpectError("%s: %s" % (path, "; ".join(problems)))
    return expect


def resolve_nvidia_smi() -> Optional[str]:
    """The nvidia-smi to run: $GPU_VERIFY_NVIDIA_SMI (path or name) or `nvidia-smi` from PATH."""
    configured = os.environ.get(NVIDIA_SMI_ENV) or "nvidia-smi"
    return shutil.which(configured)


# --------------------------------------------------------------------------------------------
# The verifier
# --------------------------------------------------------------------------------------------

class Gpu(object):
    """One GPU as NVML enumerated it, plus what earlier checks learned about it."""

    def __init__(self, index: int):
        self.index = index
        self.handle: Any = None
        self.handle_error = ""
        self.notes: Dict[str, Any] = {}


class FabricReading(object):
    """One answer of the GPU fabric query; health_mask is None from the older call, which has none."""

    __slots__ = ("call", "state", "status", "health_mask")

    def __init__(self, call: str, state: int, status: int, health_mask: Optional[int]):
        self.call, self.state, self.status, self.health_mask = call, state, status, health_mask


class BootLog(object):
    """The kernel log since boot (text), where it came from, or why there is none.

    named_file: the operator named the file with --kernel-log, so failing to read it is an error of
    the run, not a node without a kernel log."""

    __slots__ = ("text", "source", "problem", "named_file")

    def __init__(self, text: Optional[str], source: str, problem: str = "", named_file: bool = False):
        self.text, self.source, self.problem, self.named_file = text, source, problem, named_file


class Verifier(object):
    """Runs every check within the budget and collects the results."""

    def __init__(self, nvml: Any, expect: Dict[str, Any], budget_s: float, faults: FaultTable,
                 kernel_log_path: Optional[str] = None, started: Optional[float] = None,
                 mode: str = "boot"):
        self.nvml = nvml
        self.expect = expect
        self.faults = faults
        self.mode = mode
        self.kernel_log_path = kernel_log_path
        self.started = time.monotonic() if started is None else started
        # Keep a little of the budget back for writing the report.
        self.deadline = self.started + budget_s - min(1.0, 0.1 * budget_s)
        # One hung call must not eat the whole budget: the other GPUs still get checked.
        self.call_cap = min(CALL_TIMEOUT_S, max(0.5, budget_s / 4.0))
        self.checks: List[Dict[str, Any]] = []
        self.gpus: List[Gpu] = []
        self.wedged: Dict[int, str] = {}  # GPU index -> the call that hung on it
        self.nvml_count: Optional[int] = None
        self.not_supported = getattr(nvml, "NVMLError_NotSupported", _Never)
        self.function_not_found = getattr(nvml, "NVMLError_FunctionNotFound", _Never)
        # Unversioned wrappers (e.g. nvmlDeviceGetComputeRunningProcesses) turn FunctionNotFound
        # into NVMLLibraryMismatchError.
        self.skip_errors = (self.not_supported, self.function_not_found,
                            getattr(nvml, "NVMLLibraryMismatchError", _Never))
        self.nvml_error = getattr(nvml, "NVMLError", _Never)
        self.fabric_call = "nvmlDeviceGetGpuFabricInfoV"  # the older name once the driver lacks it
        self.xid_event_set: Any = None
        self.xid_registered: List[int] = []
        self.xid_setup_error: Optional[BaseException] = None

    # -- time and calls ----------------------------------------------------------------------

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self) -> float:
        remaining = self.remaining()
        if remaining <= MIN_CALL_S:
            raise BudgetExhausted()
        return min(self.call_cap, remaining)

    def missing_function(self, name: str) -> BaseException:
        """The error an older driver gives for a function it lacks; used for older bindings too."""
        error = self.nvml.NVMLError(self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        error.nvml_call = name
        return error

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call NVML function `name` in a daemon thread, bounded by the per-call timeout.

        `gpu=` names the GPU the call is about: a hang marks it wedged so its remaining checks
        fail at once instead of hanging one after another.
        """
        gpu = kwargs.pop("gpu", None)
        function = getattr(self.nvml, name, None)
        if function is None:  # an older binding: same meaning as an older driver
            raise self.missing_function(name)
        seconds = self.timeout()
        box: Dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = function(*args)
            except BaseException as err:  # handed to the caller's thread below
                box["error"] = err

        worker = threading.Thread(target=work, name="nvml-%s" % name, daemon=True)
        worker.start()
        worker.join(seconds)
        if worker.is_alive():
            timed_out = CallTimedOut(name, seconds)
            if gpu is not None:
                self.wedged[gpu] = str(timed_out)
            raise timed_out
        if "error" in box:
            error = box["error"]
            try:
                error.nvml_call = name
            except Exception:
                pass
            raise error
        return box.get("value")

    def gpu_call(self, gpu: Gpu, name: str, *args: Any) -> Any:
        return self.call(name, gpu.handle, *args, gpu=gpu.index)

    def run_command(self, argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
        """Run a helper command within the per-call timeout.

        Not subprocess.run: after killing a timed-out child it waits without limit, and a tool
        stuck in the driver (uninterruptible sleep) never dies. Such a child is left behind.
        """
        seconds = self.timeout()
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, universal_newlines=True,
                                   errors="replace")
        try:
            stdout, stderr = process.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.communicate(timeout=max(0.1, min(1.0, self.remaining())))
            except subprocess.TimeoutExpired:
                pass
            raise subprocess.TimeoutExpired(os.path.basename(argv[0]), seconds)
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    # -- NVML readings shared by several checks ----------------------------------------------

    def read_recovery_action(self, handle: Any, gpu: Optional[int]) -> int:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION of one GPU. The field's own return code decides:
        a driver that does not report it answers NotSupported for that field."""
        field = self.nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        entry = self.call("nvmlDeviceGetFieldValues", handle, [field], gpu=gpu)[0]
        if int(entry.nvmlReturn) != self.nvml.NVML_SUCCESS:
            error = self.nvml.NVMLError(int(entry.nvmlReturn))
            error.nvml_call = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"
            raise error
        return int(getattr(entry.value, FIELD_VALUE_MEMBERS[int(entry.valueType)]))

    def read_fabric(self, gpu: Gpu) -> FabricReading:
        """The GPU fabric state: nvmlDeviceGetGpuFabricInfoV, which adds the health mask, or on a
        driver that predates it nvmlDeviceGetGpuFabricInfo (same state and status)."""
        nvml = self.nvml
        if self.fabric_call == "nvmlDeviceGetGpuFabricInfoV":
            info = nvml.c_nvmlGpuFabricInfoV_t()
            try:
                self.gpu_call(gpu, "nvmlDeviceGetGpuFabricInfoV", ctypes.pointer(info))
                return FabricReading(self.fabric_call, int(info.state), int(info.status),
                                     int(info.healthMask))
            except self.function_not_found:
                self.fabric_call = "nvmlDeviceGetGpuFabricInfo"
        legacy = nvml.c_nvmlGpuFabricInfo_t()
        self.gpu_call(gpu, "nvmlDeviceGetGpuFabricInfo", ctypes.pointer(legacy))
        return FabricReading(self.fabric_call, int(legacy.state), int(legacy.status), None)

    # -- recording ---------------------------------------------------------------------------

    def fault(self, fault: str, value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
        return self.faults.outcome(fault, value, threshold, detail)

    def error(self, detail: str) -> Outcome:
        """A check that could not finish: the check-error class."""
        return self.faults.outcome(CHECK_ERROR, None, None, detail)

    def record(self, name: str, gpu: Optional[int], outcome: Outcome) -> Outcome:
        self.checks.append({"name": name, "status": outcome.status, "gpu": gpu,
                            "value": outcome.value, "threshold": outcome.threshold,
                            "detail": outcome.detail,
                            "fault": outcome.fault if outcome.status in ("fail", "warn") else None})
        return outcome

    def run_check(self, name: str, gpu: Optional[Gpu], check: Callable[..., Outcome],
                  *args: Any) -> Outcome:
        """Run one check and record its outcome; turns every exception into a status."""
        index = None if gpu is None else gpu.index
        if self.mode == "runtime" and name in RUNTIME_SKIPPED:
            outcome = skipped("not checked at run time: a running workload changes it (the DCGM "
                              "exporter's series show it)")
        elif gpu is not None and gpu.index in self.wedged:
            outcome = self.error("not run: an earlier NVML call on GPU %d timed out (%s)"
                                 % (gpu.index, self.wedged[gpu.index]))
        elif gpu is not None and gpu.handle is None:
            outcome = self.error("no NVML handle for GPU %d: %s" % (gpu.index, gpu.handle_error))
        elif self.remaining() <= MIN_CALL_S:
            outcome = self.error("budget exhausted")
        else:
            try:
                outcome = check(*args)
            except CallTimedOut as err:
                outcome = self.error(str(err))
            except BudgetExhausted:
                outcome = self.error("budget exhausted")
            except subprocess.TimeoutExpired as err:
                outcome = self.error("%s timed out after %.2gs" % (err.cmd, err.timeout))
            except self.skip_errors as err:
                outcome = skipped("%s: %s" % (getattr(err, "nvml_call", "NVML"), err))
            except Exception as err:
                outcome = self.error("unexpected error in %s: %s: %s" % (
                    getattr(err, "nvml_call", name), type(err).__name__, err))
        return self.record(name, index, outcome)

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> str:
        """Run all checks; returns the verdict."""
        if self.run_check("nvml_init", None, self.check_nvml_init).status != "pass":
            return "error"  # nothing else can be checked without NVML
        try:
            self.run_check("driver_version", None, self.check_driver_version)
            self.run_check("gpu_count", None, self.check_gpu_count)
            self.run_check("nvidia_smi", None, self.check_nvidia_smi)
            # Read now, judged after the GPU checks: with no kernel log, whether the recovery
            # action vouches for every GPU decides between warn and fail.
            boot_log = self.read_boot_log()
            self.open_gpus()
            if self.mode == "boot":  # at run time the kernel log of this boot covers XIDs
                self.start_xid_watch()
            self.poll_fabric()
            for gpu in self.gpus:
                for name, check in GPU_CHECKS:
                    self.run_check(name, gpu, check, self, gpu)
            self.run_check("xid_kernel_log", None, self.check_xid_kernel_log, boot_log)
            self.run_check("sxid_kernel_log", None, self.check_sxid_kernel_log, boot_log)
            self.run_check("xid_events", None, self.check_xid_events)
        finally:
            self.shutdown()
        return "fail" if any(c["status"] == "fail" for c in self.checks) else "pass"

    def shutdown(self) -> None:
        # Best effort and bounded like every call: a wedged NVML may never return.
        calls: List[Tuple[str, Tuple[Any, ...]]] = [("nvmlShutdown", ())]
        if self.xid_event_set is not None:
            calls.insert(0, ("nvmlEventSetFree", (self.xid_event_set,)))
        for name, args in calls:
            try:
                self.call(name, *args)
            except Exception:
                pass

    def poll_fabric(self) -> None:
        """Read every GPU's fabric state into gpu.notes["fabric"] (a FabricReading, or the error
        for the fabric checks to report), polling the GPUs whose fabric manager is still training
        together until one shared deadline: eight GPUs settle in the time of one."""
        if not self.expect["nvswitch"]:
            return
        nvml = self.nvml
        training = (nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
        waiting = [gpu for gpu in self.gpus if gpu.handle is not None and gpu.index not in self.wedged]
        settle_until = time.monotonic() + FABRIC_SETTLE_S
        while waiting:
            still_training = []
            for gpu in waiting:
                try:
                    gpu.notes["fabric"] = reading = self.read_fabric(gpu)
                except Exception as err:  # reported by the fabric checks of this GPU
                    gpu.notes["fabric"] = err
                    continue
                if reading.state in training:
                    still_training.append(gpu)
            waiting = still_training
            if (not waiting or time.monotonic() >= settle_until
                    or self.remaining() <= FABRIC_POLL_S + MIN_CALL_S):
                break
            time.sleep(FABRIC_POLL_S)

    # -- node checks -------------------------------------------------------------------------

    def check_nvml_init(self) -> Outcome:
        try:
            self.call("nvmlInit")
        except self.skip_errors + (self.nvml_error,) as err:
            # Without NVML nothing else can be checked: "could not run", never "skip".
            return self.fault("driver", detail="nvmlInit: %s: %s" % (type(err).__name__, err))
        return passed(detail="NVML initialised")

    def check_driver_version(self) -> Outcome:
        version = _text(self.call("nvmlSystemGetDriverVersion")).strip()
        branch = parse_driver_branch(self.expect["driverBranch"])
        pinned = self.expect.get("driverVersion")
        if pinned:
            threshold = "== %s" % pinned
            if version != pinned:
                return self.fault("driver", version, threshold,
                                  "driver %s is not the pinned %s" % (version, pinned))
            return passed(version, threshold, "driver is the pinned version")
        threshold = ">= R%d" % branch
        match = re.match(r"^(\d+)", version)
        if not match:
            return self.fault("driver", version, threshold, "cannot parse driver version %r" % version)
        if int(match.group(1)) < branch:
            return self.fault("driver", version, threshold,
                              "driver %s is older than branch R%d" % (version, branch))
        return passed(version, threshold, "driver branch R%s" % match.group(1))

    def check_gpu_count(self) -> Outcome:
        self.nvml_count = int(self.call("nvmlDeviceGetCount"))
        expected = self.expect["gpuCount"]
        if self.nvml_count != expected:
            return self.fault("gpu-missing", self.nvml_count, expected,
                              "NVML sees %d GPUs, %s has %d" % (self.nvml_count,
                                                                self.expect["instanceType"], expected))
        return passed(self.nvml_count, expected)

    def check_nvidia_smi(self) -> Outcome:
        smi = resolve_nvidia_smi()
        threshold = "NVML count (%s)" % self.nvml_count
        if smi is None:
            wanted = os.environ.get(NVIDIA_SMI_ENV) or "nvidia-smi"
            return self.fault("driver", None, threshold,
                              "%s not found (PATH or $%s)" % (wanted, NVIDIA_SMI_ENV))
        result = self.run_command([smi, "-L"])
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            return self.fault("driver", None, threshold,
                              "%s -L exited %d: %s" % (smi, result.returncode, tail[0]))
        smi_count = sum(1 for line in result.stdout.splitlines() if SMI_GPU_LINE.match(line))
        if self.nvml_count is None:
            return self.error("NVML GPU count unavailable to compare with nvidia-smi's %d" % smi_count)
        if smi_count != self.nvml_count:
            return self.fault("driver", smi_count, self.nvml_count,
                              "nvidia-smi -L lists %d GPUs, NVML %d" % (smi_count, self.nvml_count))
        return passed(smi_count, self.nvml_count, "nvidia-smi -L agrees with NVML")

    def read_boot_log(self) -> BootLog:
        """The kernel log since boot. Each source gets its own bounded attempt: a journalctl that
        hangs or fails hands over to dmesg instead of failing the node."""
        if self.kernel_log_path:
            try:
                with open(self.kernel_log_path, "r", encoding="utf-8", errors="replace") as handle:
                    return BootLog(handle.read(), self.kernel_log_path, named_file=True)
            except OSError as err:
                return BootLog(None, self.kernel_log_path, "cannot read kernel log: %s" % err,
                               named_file=True)
        problems = []
        for command in KERNEL_LOG_COMMANDS:
            executable = shutil.which(command[0])
            if executable is None:
                problems.append("%s not found" % command[0])
                continue
            try:
                result = self.run_command((executable,) + command[1:])
            except subprocess.TimeoutExpired as err:
                problems.append("%s timed out after %.2gs" % (command[0], err.timeout))
                continue
            except BudgetExhausted:
                problems.append("budget exhausted before %s" % command[0])
                break
            if result.returncode != 0:
                problems.append("%s exited %d" % (command[0], result.returncode))
            elif not any(KERNEL_LOG_ENTRY.match(line) for line in result.stdout.splitlines()):
                # journalctl exits 0 with "-- No entries --" when journald kept nothing; a real
                # kernel log since boot is never empty, so try the next source.
                problems.append("%s returned no entries" % command[0])
            else:
                return BootLog(result.stdout, " ".join(command), "; ".join(problems))
        return BootLog(None, "", "; ".join(problems))

    def log_where(self, boot_log: BootLog) -> str:
        where = "in %s since boot" % boot_log.source
        return where + (" (%s)" % boot_log.problem if boot_log.problem else "")

    def check_xid_kernel_log(self, boot_log: BootLog) -> Outcome:
        if boot_log.text is None:
            if boot_log.named_file:
                return self.error(boot_log.problem)
            return self.judge_missing_kernel_log(boot_log.problem)
        sightings = []
        for match in XID_LINE.finditer(boot_log.text):
            xid, message, action = int(match.group("xid")), match.group("message"), None
            if xid == self.faults.recovery_action_xid:
                change = RECOVERY_ACTION_CHANGE.search(message)
                action = int(change.group("action"), 16) if change else None
            sightings.append(Sighting(xid, match.group("where"), action,
                                      bool(NONFATAL_WORD.search(message))))
        return classify_xids(self.faults, sightings, self.log_where(boot_log))

    def check_sxid_kernel_log(self, boot_log: BootLog) -> Outcome:
        """NVSwitch SXids: the driver prints each event's severity on its first line ("12028, Fatal,
        ..." or "22013, Non-fatal, ..."), then "Severity" and "Data" lines of the same event."""
        threshold = "no fatal SXid"
        if not self.expect["nvswitch"]:
            return skipped("%s has no NVSwitch" % self.expect["instanceType"], threshold)
        if boot_log.text is None:
            return skipped("no kernel log to read SXids from (the xid_kernel_log check says why)",
                           threshold)
        events: Dict[Tuple[str, int], str] = {}      # (where, sxid) -> fatal | non-fatal | unknown
        for match in SXID_LINE.finditer(boot_log.text):
            key, rest = (match.group("where"), int(match.group("sxid"))), match.group("rest")
            word = rest.split(",", 1)[0].strip()
            severity = ("fatal" if word == self.faults.sxid_fatal_word else
                        "non-fatal" if NONFATAL_WORD.fullmatch(word) else "unknown")
            known = events.get(key, "unknown")
            events[key] = severity if known == "unknown" else ("fatal" if "fatal" in (known, severity)
                                                                else known)
        where = self.log_where(boot_log)
        fatal = sorted("SXid %d on %s" % (sxid, at) for (at, sxid), sev in events.items() if sev == "fatal")
        other = sorted("SXid %d on %s (%s)" % (sxid, at, sev) for (at, sxid), sev in events.items()
                       if sev != "fatal")
        value = sorted(set(sxid for _, sxid in events))
        if fatal:
            return self.fault("sxid-fatal", value, threshold, "fatal %s %s%s" % (
                "; ".join(fatal), where, "; also " + "; ".join(other) if other else ""))
        if other:
            return self.fault("sxid-nonfatal", value, threshold, "%s %s" % ("; ".join(other), where))
        return passed([], threshold, "no SXid %s" % where)

    def judge_missing_kernel_log(self, problem: str) -> Outcome:
        """No kernel log: XIDs raised since boot are invisible. Only NVML's recovery action, none
        on every GPU, covers for them (warn); otherwise the XID check fails."""
        threshold = "no critical XID"
        detail = "no kernel log (%s): XIDs raised since boot cannot be seen" % problem
        recovery = {c["gpu"]: c["status"] for c in self.checks if c["name"] == "recovery_action"}
        unvouched = ["GPU %d (%s)" % (gpu.index, recovery.get(gpu.index, "not run"))
                     for gpu in self.gpus if recovery.get(gpu.index) != "pass"]
        if self.gpus and not unvouched:
            return Outcome("warn", None, threshold, detail + "; the recovery_action check passed on "
                           "every GPU (NVML recovery action none), so this warns", "xid-unknown")
        return self.error(detail + "; the recovery_action check did not pass on %s, so nothing "
                          "vouches for those GPUs" % (", ".join(unvouched) or "any GPU"))

    def open_gpus(self) -> None:
        for index in range(self.nvml_count or 0):
            gpu = Gpu(index)
            self.gpus.append(gpu)
            if self.remaining() <= MIN_CALL_S:
                gpu.handle_error = "budget exhausted"
                continue
            try:
                gpu.handle = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            except Exception as err:
                gpu.handle_error = "%s: %s" % (type(err).__name__, err)

    def start_xid_watch(self) -> None:
        """Register for XID events now so the final drain sees any raised during the run."""
        try:
            self.xid_event_set = self.call("nvmlEventSetCreate")
            event_type = self.nvml.nvmlEventTypeXidCriticalError
            for gpu in self.gpus:
                if gpu.handle is None or gpu.index in self.wedged:
                    continue
                try:
                    self.call("nvmlDeviceRegisterEvents", gpu.handle, event_type,
                              self.xid_event_set, gpu=gpu.index)
                    self.xid_registered.append(gpu.index)
                except Exception as err:  # watch the other GPUs; the detail lists who is watched
                    self.xid_setup_error = err
        except Exception as err:
            self.xid_setup_error = err

    def check_xid_events(self) -> Outcome:
        if not self.xid_registered:
            if self.xid_setup_error is not None:
                raise self.xid_setup_error
            return self.error("no GPU registered for XID events")
        drain_until = time.monotonic() + min(XID_DRAIN_S, max(0.0, self.remaining()))
        timeout_error = getattr(self.nvml, "NVMLError_Timeout", _Never)
        sightings: List[Tuple[int, str, Optional[int]]] = []
        while True:
            wait_s = max(0.0, min(drain_until - time.monotonic(), self.call_cap / 2.0))
            try:
                event = self.call("nvmlEventSetWait", self.xid_event_set, int(wait_s * 1000))
            except timeout_error:
                break  # nothing (more) queued
            if int(event.eventType) & int(self.nvml.nvmlEventTypeXidCriticalError):
                xid = int(event.eventData)
                action = (self.recovery_action_after_event(event)
                          if xid == self.faults.recovery_action_xid else None)
                sightings.append(Sighting(xid, self.event_gpu(event), action, False))
            if time.monotonic() >= drain_until:
                break
        where = "from NVML during the run (GPUs %s)" % ",".join(str(i) for i in self.xid_registered)
        return classify_xids(self.faults, sightings, where)

    def recovery_action_after_event(self, event: Any) -> Optional[int]:
        """An XID 154 event carries no action: read the GPU's recovery action now (None when it
        cannot be read, which classify_xids treats as not none)."""
        try:
            return self.read_recovery_action(event.device, None)
        except Exception:
            return None

    def event_gpu(self, event: Any) -> str:
        try:
            return "GPU %d" % int(self.call("nvmlDeviceGetIndex", event.device))
        except Exception:
            return "GPU ?"


def recovery_action_name(action: Optional[int]) -> str:
    if action is None:
        return "unreadable"
    return "%s (%d)" % (RECOVERY_ACTION_NAMES.get(action, "unknown"), action)


class Sighting(object):
    """One XID seen: its number, where (PCI address or GPU), the new recovery action of an XID 154,
    and whether the driver called the event non-fatal (NVML events carry no text: never)."""

    __slots__ = ("xid", "where", "action", "nonfatal")

    def __init__(self, xid: int, where: str, action: Optional[int], nonfatal: bool):
        self.xid, self.where, self.action, self.nonfatal = xid, where, action, nonfatal


def classify_xids(table: FaultTable, sightings: List[Sighting], where: str) -> Outcome:
    """Judge XIDs by the fault table, which follows NVIDIA's XID catalog: those it recovers only with new
    hardware (replace) or a GPU reset (reboot), Blackwell NVLink ones the driver did not call non-fatal, and
    an XID 154 naming a recovery action fail; non-fatal NVLink and unknown ones warn; the application's
    (RESTART_APP, IGNORE) are only listed in the detail."""
    threshold = "no critical XID"
    recovery = table.recovery_action_xid
    changes = sorted(set((s.where, s.action) for s in sightings if s.xid == recovery), key=str)
    needs_recovery = [(w, a) for w, a in changes if a != RECOVERY_ACTION_NONE]

    def seen(test: Callable[[Sighting], bool]) -> List[Tuple[int, str]]:
        return sorted(set((s.xid, s.where) for s in sightings if test(s)))

    replace = seen(lambda s: s.xid in table.replace_xids)
    fatal = seen(lambda s: s.xid in table.fatal_xids)
    nvlink = seen(lambda s: s.xid in table.nvlink_xids and not s.nonfatal)
    nvlink_nonfatal = seen(lambda s: s.xid in table.nvlink_xids and s.nonfatal)
    known = (table.replace_xids | table.fatal_xids | table.nvlink_xids | table.application_xids | {recovery})
    unknown = seen(lambda s: s.xid not in known)
    ignored = sorted(set(s.xid for s in sightings if s.xid in table.application_xids))

    def listed(found: List[Tuple[int, str]]) -> str:
        return "; ".join("XID %d on %s" % (x, w) for x, w in found)

    # (fault class, the XIDs it counts, what) in order of strength
    found: List[Tuple[str, List[int], str]] = []
    if replace:
        found.append(("xid-replace", [x for x, _ in replace], "critical %s %s: NVIDIA's catalog knows no "
                      "recovery short of other hardware" % (listed(replace), where)))
    if fatal:
        found.append(("xid-fatal", [x for x, _ in fatal], "critical %s %s" % (listed(fatal), where)))
    if nvlink:
        found.append(("xid-nvlink", [x for x, _ in nvlink],
                      "NVLink %s %s (not marked non-fatal)" % (listed(nvlink), where)))
    if needs_recovery:
        found.append(("xid-recovery-action", [recovery], "XID %d %s: recovery action changed to %s" % (
            recovery, where, "; ".join("%s on %s" % (recovery_action_name(a), w)
                                       for w, a in needs_recovery))))
    if nvlink_nonfatal:
        found.append(("xid-nvlink-nonfatal", [x for x, _ in nvlink_nonfatal],
                      "NVLink %s %s, marked non-fatal by the driver" % (listed(nvlink_nonfatal), where)))
    if unknown:
        found.append(("xid-unknown", [x for x, _ in unknown], "%s %s: not in the fault table's XID "
                      "catalog; like the EKS node monitoring agent with unknown XIDs, this warns"
                      % (listed(unknown), where)))
    notes = []
    if changes and not needs_recovery:
        notes.append("XID %d: recovery action back to none on %s" % (recovery, ", ".join(w for w, _ in changes)))
    if ignored:
        notes.append("not counted: XID %s (the application's: NVIDIA's catalog says restart it, or ignore)"
                     % ", ".join(str(x) for x in ignored))
    if not found:
        return passed([], threshold, "; ".join(["no critical XID %s" % where] + notes))
    # The strongest class names the outcome (a failing one before a warning one, in the order above);
    # the value is the XIDs of the classes with that outcome.
    failing = [entry for entry in found if table.faults[entry[0]]["boot"] == "fail"]
    judged = failing or found
    value = sorted(set(x for _, xids, _ in judged for x in xids))
    return table.outcome(judged[0][0], value, threshold, "; ".join([what for _, _, what in found] + notes))


# --------------------------------------------------------------------------------------------
# Per-GPU checks: each takes (verifier, gpu) and returns an Outcome; NVML errors propagate to
# Verifier.run_check, which maps them to skip or fail.
# --------------------------------------------------------------------------------------------

def check_gpu_model(v: Verifier, gpu: Gpu) -> Outcome:
    name = _text(v.gpu_call(gpu, "nvmlDeviceGetName")).strip()
    gpu.notes["name"] = name
    expected = v.expect["gpuModel"]
    model = classify_gpu_name(name)
    if model != expected:
        return v.fault("gpu-missing", name, expected,
                       "%r is %s, not %s" % (name, model or "an unknown model", expected))
    return passed(name, expected, "%r is %s" % (name, model))


def ecc_memory_sizes(v: Verifier, gpu: Gpu, expected: int) -> Tuple[List[float], str]:
    """The memory sizes this GPU may report: the catalog's, and on a GDDR board the same board with or
    without the 1/16 ECC keeps, as far as the ECC mode it reports allows."""
    if not v.expect["eccReservesMemory"]:
        return [float(expected)], ""
    try:
        current, _ = v.gpu_call(gpu, "nvmlDeviceGetEccMode")
        on: Optional[bool] = current == v.nvml.NVML_FEATURE_ENABLED
    except v.skip_errors:
        on = None
    with_ecc, without_ecc = expected * (1 - ECC_RESERVED_SHARE), expected / (1 - ECC_RESERVED_SHARE)
    sizes = {True: [expected, with_ecc], False: [expected, without_ecc],
             None: [expected, with_ecc, without_ecc]}[on]
    return [float(size) for size in sizes], {True: "ECC on", False: "ECC off", None: "ECC mode unknown"}[on]


def check_gpu_memory(v: Verifier, gpu: Gpu) -> Outcome:
    total_mib = int(round(int(v.gpu_call(gpu, "nvmlDeviceGetMemoryInfo").total) / float(MIB)))
    expected = v.expect["gpuMemoryMiB"]
    tolerance = float(v.faults.limits["memoryTolerance"])
    sizes, ecc = ecc_memory_sizes(v, gpu, expected)
    nearest = min(sizes, key=lambda size: abs(total_mib - size))
    threshold = " or ".join("%d MiB" % round(size) for size in sizes) + " +/- %g%%" % (tolerance * 100)
    deviation = abs(total_mib - nearest) / nearest
    detail = "%d MiB is %.1f%% from %d MiB%s" % (total_mib, deviation * 100, round(nearest),
                                                   " (%s)" % ecc if ecc else "")
    if deviation <= tolerance:
        return passed(total_mib, threshold, detail)
    return v.fault("gpu-missing", total_mib, threshold, detail)


def check_ecc_mode(v: Verifier, gpu: Gpu) -> Outcome:
    if not v.expect["eccExpected"]:
        return skipped("ECC not expected on %s" % v.expect["gpuModel"])
    current, pending = v.gpu_call(gpu, "nvmlDeviceGetEccMode")
    enabled = v.nvml.NVML_FEATURE_ENABLED
    value = {"current": bool(current == enabled), "pending": bool(pending == enabled)}
    if current != enabled:
        return v.fault("ecc-off", value, "enabled", "ECC is disabled")
    if pending != enabled:
        return v.fault("ecc-off-pending", value, "enabled",
                       "ECC is on now but is set to turn off at the next reset")
    return passed(value, "enabled")


def check_ecc_uncorrected(v: Verifier, gpu: Gpu) -> Outcome:
    count = int(v.gpu_call(gpu, "nvmlDeviceGetTotalEccErrors",
                           v.nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, v.nvml.NVML_VOLATILE_ECC))
    if count > 0:
        return v.fault("ecc-uncorrected", count, 0,
                       "%d uncorrected ECC errors since the last driver load" % count)
    return passed(count, 0)


def check_sram_ecc(v: Verifier, gpu: Gpu) -> Outcome:
    threshold = "SRAM ECC error threshold not exceeded"
    status = v.nvml.c_nvmlEccSramErrorStatus_v1_t()
    try:
        v.gpu_call(gpu, "nvmlDeviceGetSramEccErrorStatus", ctypes.pointer(status))
    except v.nvml.NVMLError_NoPermission as err:  # NVML answers it to root only; the gate is root
        return v.error("nvmlDeviceGetSramEccErrorStatus needs root: %s" % err)
    value = {"thresholdExceeded": bool(status.bThresholdExceeded),
             "volatileUncorrected": int(status.volatileUncParity + status.volatileUncSecDed),
             "aggregateUncorrected": int(status.aggregateUncParity + status.aggregateUncSecDed),
             "aggregateCorrected": int(status.aggregateCor)}
    if status.bThresholdExceeded:
        return v.fault("sram-ecc", value, threshold, "the driver reports the SRAM ECC error threshold "
                       "exceeded: the GPU needs field diagnostics")
    return passed(value, threshold)


def check_remapped_rows(v: Verifier, gpu: Gpu) -> Outcome:
    try:
        corrected, uncorrected, pending, failure = v.gpu_call(gpu, "nvmlDeviceGetRemappedRows")
    except v.skip_errors:
        gpu.notes["row_remapping"] = False  # pre-Ampere: retired pages instead
        raise
    gpu.notes["row_remapping"] = True
    value = {"corrected": int(corrected), "uncorrected": int(uncorrected),
             "pending": bool(pending), "failure": bool(failure)}
    limit = int(v.faults.limits["rowRemapUncorrectableMax"])
    threshold = "no pending remap, no remap failure, fewer than %d uncorrectable remaps" % limit
    if failure:
        return v.fault("row-remap-failure", value, threshold, "row remapping failed: the GPU needs "
                       "replacing")
    if uncorrected >= limit:
        return v.fault("row-remap-limit", value, threshold, "%d rows remapped for uncorrectable errors "
                       "(DCGM fails at %d): the GPU is in a bad state" % (uncorrected, limit))
    if pending:
        return v.fault("row-remap-pending", value, threshold, "row remap pending: the GPU needs a reset")
    return passed(value, threshold)


def check_retired_pages(v: Verifier, gpu: Gpu) -> Outcome:
    if gpu.notes.get("row_remapping"):
        return skipped("GPU remaps rows (Ampere or newer); page retirement does not apply")
    nvml = v.nvml
    pending = v.gpu_call(gpu, "nvmlDeviceGetRetiredPagesPendingStatus") == nvml.NVML_FEATURE_ENABLED
    # Both causes, pending retirements included: the table holds them all.
    retired = sum(len(v.gpu_call(gpu, "nvmlDeviceGetRetiredPages", cause)) for cause in (
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
    value = {"pending": pending, "retired": retired}
    limit = int(v.faults.limits["retiredPagesMax"])
    threshold = "no pending retirement, fewer than %d retired pages" % limit
    if retired >= limit:
        return v.fault("retired-pages-limit", value, threshold, "%d retired pages (DCGM fails at %d): "
                       "the retired-page table is nearly full" % (retired, limit))
    if pending:
        return v.fault("retired-pages-pending", value, threshold, "page retirement pending: the GPU "
                       "needs a reset")
    return passed(value, threshold)


def check_recovery_action(v: Verifier, gpu: Gpu) -> Outcome:
    action = v.read_recovery_action(gpu.handle, gpu.index)
    name = recovery_action_name(action)
    if action != RECOVERY_ACTION_NONE:
        return v.fault("recovery-action", name, recovery_action_name(RECOVERY_ACTION_NONE),
                       "the driver asks for recovery before the GPU is used again: %s" % name)
    return passed(name, name)


def check_inforom(v: Verifier, gpu: Gpu) -> Outcome:
    """NVML validates the InfoROM's checksums; a corrupt one answers NVML_ERROR_CORRUPTED_INFOROM."""
    try:
        v.gpu_call(gpu, "nvmlDeviceValidateInforom")
    except getattr(v.nvml, "NVMLError_CorruptedInforom", _Never) as err:
        return v.fault("inforom", "corrupt", "valid", "the InfoROM is corrupt: %s" % err)
    return passed("valid", "valid")


def check_repair_status(v: Verifier, gpu: Gpu) -> Outcome:
    """A channel or TPC repair the driver will apply at the next reset (NVML from R580)."""
    channel, tpc = v.gpu_call(gpu, "nvmlDeviceGetRepairStatus")
    value = {"channelRepairPending": bool(channel), "tpcRepairPending": bool(tpc)}
    if channel or tpc:
        pending = [what for what, flag in (("channel", channel), ("TPC", tpc)) if flag]
        return v.fault("repair-pending", value, "no repair pending",
                       "%s repair pending: applied at the next GPU reset" % " and ".join(pending))
    return passed(value, "no repair pending")


def check_nvlink(v: Verifier, gpu: Gpu) -> Outcome:
    links = v.expect["nvlinkLinksPerGpu"]
    if links == 0:
        return skipped("no NVLink expected on %s" % v.expect["instanceType"])
    inactive: List[str] = []
    unsupported: Optional[BaseException] = None
    for link in range(links):
        try:
            state = v.gpu_call(gpu, "nvmlDeviceGetNvLinkState", link)
        except v.skip_errors as err:
            unsupported, state = err, "not supported"
        except v.nvml_error as err:  # e.g. InvalidArgument: the GPU has fewer links
            state = str(err)
        if state != v.nvml.NVML_FEATURE_ENABLED:
            inactive.append("%d (%s)" % (link, "inactive" if state == 0 else state))
    if unsupported is not None and len(inactive) == links:
        return v.fault("nvlink-down", 0, links, "the catalog gives %s %d NVLinks per GPU, but NVML "
                       "reports none (%s: %s)" % (v.expect["gpuModel"], links,
                                                  getattr(unsupported, "nvml_call", "NVML"), unsupported))
    active = links - len(inactive)
    if inactive:
        return v.fault("nvlink-down", active, links, "links not active: %s" % ", ".join(inactive))
    return passed(active, links)


def fabric_reading(v: Verifier, gpu: Gpu) -> Tuple[Optional[FabricReading], str]:
    """What poll_fabric read for this GPU, or (None, why) when the GPU reports no fabric state:
    fine for a model outside GPU_FABRIC_MODELS, FabricMissing for one in it. Raises the error the
    query raised otherwise."""
    reading = gpu.notes["fabric"]
    if isinstance(reading, v.skip_errors):
        why = "%s: %s" % (getattr(reading, "nvml_call", "NVML"), reading)
    elif isinstance(reading, BaseException):
        raise reading
    elif reading.state == v.nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        why = "%s: state not supported" % reading.call
    else:
        return reading, ""
    model = v.expect["gpuModel"]
    if model in GPU_FABRIC_MODELS:
        raise FabricMissing("%s on an NVSwitch board reports its GPU fabric state, but this GPU "
                            "does not (%s)" % (model, why))
    return None, why


def check_fabric(v: Verifier, gpu: Gpu) -> Outcome:
    if not v.expect["nvswitch"]:
        return skipped("%s has no NVSwitch fabric" % v.expect["instanceType"])
    nvml = v.nvml
    threshold = "completed, success"
    try:
        reading, why = fabric_reading(v, gpu)
    except FabricMissing as err:
        return v.fault("fabric", None, threshold, str(err))
    if reading is None:
        return skipped("%s reports no GPU fabric state (NVML: Hopper and newer): %s"
                       % (v.expect["gpuModel"], why), threshold)
    value = {"state": FABRIC_STATE_NAMES.get(reading.state, str(reading.state)),
             "status": reading.status}
    if reading.state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED and reading.status == nvml.NVML_SUCCESS:
        return passed(value, threshold, "from %s" % reading.call)
    return v.fault("fabric", value, threshold, "fabric registration %s with NVML status %d (%s)"
                   % (value["state"], reading.status, reading.call))


def decode_fabric_health(mask: int) -> Dict[str, int]:
    return {name: (mask >> shift) & width for name, shift, width, _ in FABRIC_HEALTH_FIELDS}


def check_fabric_health(v: Verifier, gpu: Gpu) -> Outcome:
    if not v.expect["nvswitch"]:
        return skipped("%s has no NVSwitch fabric" % v.expect["instanceType"])
    try:
        reading, _ = fabric_reading(v, gpu)
    except FabricMissing:  # the fabric check fails it
        reading = None
    if reading is None:
        return skipped("no GPU fabric state to judge (see the fabric check)")
    if reading.health_mask is None:
        return skipped("%s (a driver before nvmlDeviceGetGpuFabricInfoV) reports no health mask"
                       % reading.call)
    decoded = decode_fabric_health(reading.health_mask)
    unhealthy = ["%s=%d" % (name, decoded[name]) for name, _, _, bad in FABRIC_HEALTH_FIELDS
                 if decoded[name] in bad]
    value = dict(decoded, mask="0x%x" % reading.health_mask)
    threshold = "no fault in %s" % ", ".join(name for name, _, _, _ in FABRIC_HEALTH_FIELDS)
    if unhealthy:
        return v.fault("fabric-health", value, threshold, "fabric health mask 0x%x: %s"
                       % (reading.health_mask, ", ".join(unhealthy)))
    return passed(value, threshold)


def check_pcie_width(v: Verifier, gpu: Gpu) -> Outcome:
    # Width, not generation: the generation drops whenever the GPU idles.
    current = int(v.gpu_call(gpu, "nvmlDeviceGetCurrPcieLinkWidth"))
    maximum = int(v.gpu_call(gpu, "nvmlDeviceGetMaxPcieLinkWidth"))
    if current != maximum:
        return v.fault("pcie-width", current, maximum, "PCIe link trained at x%d of x%d" % (current, maximum))
    return passed(current, maximum)


def read_clock_event_reasons(v: Verifier, gpu: Gpu) -> int:
    try:
        return int(v.gpu_call(gpu, "nvmlDeviceGetCurrentClocksEventReasons"))
    except v.function_not_found:  # drivers before R535 know it by its older name, same bits
        return int(v.gpu_call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons"))


def check_clock_events(v: Verifier, gpu: Gpu) -> Outcome:
    reasons = read_clock_event_reasons(v, gpu)
    active = [label for bit, label in HW_CLOCK_EVENT_REASONS if reasons & bit]
    threshold = "none of %s" % ", ".join(label for _, label in HW_CLOCK_EVENT_REASONS)
    if active:
        return v.fault("clocks-hw-slowdown", "0x%x" % reasons, threshold,
                       "clocks held down by %s" % ", ".join(active))
    if reasons & SW_THERMAL_SLOWDOWN:
        return v.fault("clocks-sw-thermal", "0x%x" % reasons, threshold, "the driver is slowing the "
                       "clocks to cool the GPU (SW thermal slowdown)")
    return passed("0x%x" % reasons, threshold)


def check_power_limit(v: Verifier, gpu: Gpu) -> Outcome:
    enforced_mw = int(v.gpu_call(gpu, "nvmlDeviceGetEnforcedPowerLimit"))
    default_mw = int(v.gpu_call(gpu, "nvmlDeviceGetPowerManagementDefaultLimit"))
    value = {"enforcedW": enforced_mw / 1000.0, "defaultW": default_mw / 1000.0}
    fail_percent = int(v.faults.limits["powerLimitFailPercent"])
    threshold = ">= default %g W (fails below %d%%)" % (default_mw / 1000.0, fail_percent)
    if enforced_mw >= default_mw:
        return passed(value, threshold)
    detail = "power capped at %g W of the default %g W" % (enforced_mw / 1000.0, default_mw / 1000.0)
    if enforced_mw * 100 < default_mw * fail_percent:
        return v.fault("power-capped", value, threshold, detail)
    return v.fault("power-below-default", value, threshold, detail)


def read_temperature(v: Verifier, gpu: Gpu) -> int:
    sensor = v.nvml.NVML_TEMPERATURE_GPU
    try:
        return int(v.gpu_call(gpu, "nvmlDeviceGetTemperatureV", sensor))
    except v.function_not_found:  # driver predates the V call; the old one is deprecated
        return int(v.gpu_call(gpu, "nvmlDeviceGetTemperature", sensor))


def check_temperature(v: Verifier, gpu: Gpu) -> Outcome:
    celsius = read_temperature(v, gpu)
    limit = v.expect["maxTempC"]
    if celsius > limit:      # "above 85 C" (the design requirements; the alert GpuTemperatureHigh agrees)
        return v.fault("thermal", celsius, "<= %s C" % limit, "GPU at %d C" % celsius)
    return passed(celsius, "<= %s C" % limit)


def check_persistence_mode(v: Verifier, gpu: Gpu) -> Outcome:
    mode = v.gpu_call(gpu, "nvmlDeviceGetPersistenceMode")
    if mode != v.nvml.NVML_FEATURE_ENABLED:
        return v.fault("persistence-off", "disabled", "enabled", "persistence mode is off")
    return passed("enabled", "enabled")


def check_mig_mode(v: Verifier, gpu: Gpu) -> Outcome:
    expected = v.expect["migMode"]
    try:
        current, pending = v.gpu_call(gpu, "nvmlDeviceGetMigMode")
    except v.skip_errors as err:
        if expected == "enabled":  # asked for MIG on a GPU without it: a real mismatch
            return v.fault("mig-mode", None, expected, "MIG expected enabled but %s: %s"
                           % (getattr(err, "nvml_call", "NVML"), err))
        raise
    names = {v.nvml.NVML_DEVICE_MIG_ENABLE: "enabled", v.nvml.NVML_DEVICE_MIG_DISABLE: "disabled"}
    value = {"current": names.get(current, str(current)), "pending": names.get(pending, str(pending))}
    wrong = [which for which in ("current", "pending") if value[which] != expected]
    if wrong:
        return v.fault("mig-mode", value, expected, "MIG %s mode is not %s" % (" and ".join(wrong), expected))
    return passed(value, expected)


def check_compute_processes(v: Verifier, gpu: Gpu) -> Outcome:
    processes = v.gpu_call(gpu, "nvmlDeviceGetComputeRunningProcesses") or []
    if processes:
        holders = []
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            holders.append("pid %s (%s)" % (process.pid, "unknown memory" if used is None
                                            else "%d MiB" % (int(used) // MIB)))
        return v.fault("gpu-busy-at-boot", sorted(int(p.pid) for p in processes), "none",
                       "compute processes hold GPU memory: %s" % ", ".join(holders))
    return passed([], "none")


# Order matters: check_retired_pages reads what check_remapped_rows learned.
GPU_CHECKS: Tuple[Tuple[str, Callable[[Verifier, Gpu], Outcome]], ...] = (
    ("gpu_model", check_gpu_model),
    ("gpu_memory", check_gpu_memory),
    ("ecc_mode", check_ecc_mode),
    ("ecc_uncorrected", check_ecc_uncorrected),
    ("sram_ecc", check_sram_ecc),
    ("remapped_rows", check_remapped_rows),
    ("retired_pages", check_retired_pages),
    ("recovery_action", check_recovery_action),
    ("inforom", check_inforom),
    ("repair_status", check_repair_status),
    ("nvlink", check_nvlink),
    ("fabric", check_fabric),
    ("fabric_health", check_fabric_health),
    ("pcie_width", check_pcie_width),
    ("clock_events", check_clock_events),
    ("power_limit", check_power_limit),
    ("temperature", check_temperature),
    ("persistence_mode", check_persistence_mode),
    ("mig_mode", check_mig_mode),
    ("compute_processes", check_compute_processes),
)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # node-exporter and operators read it without root
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _label(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


TEXTFILE_PREFIXES = {"boot": "gpu_cloud_node_verify", "runtime": "gpu_cloud_node_health"}


def render_textfile(report: Dict[str, Any], finished_at: float) -> str:
    """The report as Prometheus exposition text for node-exporter's textfile collector: the boot
    gate's as gpu_cloud_node_verify_*, the run-time checker's as gpu_cloud_node_health_*."""
    lines: List[str] = []
    prefix = TEXTFILE_PREFIXES[report.get("mode") or "boot"]
    what = {"boot": "GPU node verification", "runtime": "GPU node health check"}[report.get("mode") or "boot"]

    def metric(name: str, help_text: str, samples: List[Tuple[str, Any]]) -> None:
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s gauge" % name)
        lines.extend("%s%s %s" % (name, labels, value) for labels, value in samples)

    metric(prefix + "_pass", "1 when the last %s passed, 0 when it failed or could not run." % what,
           [("", 1 if report["verdict"] == "pass" else 0)])
    # State sets: every state has a sample, 1 for the one it had, so a change of state is a
    # change of value rather than a series that appears and another that goes stale.
    metric(prefix + "_verdict", "Verdict of the last %s, a state set: 1 for the verdict it had." % what,
           [('{verdict="%s"}' % verdict, int(report["verdict"] == verdict)) for verdict in EXIT_CODES])
    metric(prefix + "_check_status",
           "Status of each check of the last %s, a state set: 1 for the status it had." % what,
           [('{check="%s",gpu="%s",status="%s"}' % (_label(c["name"]), _label(c["gpu"]), status),
             int(c["status"] == status))
            for c in report["checks"] for status in CHECK_STATUSES])
    # One series per fault class the last run found (failed or warned), valued 1, labelled with the
    # table's remediation; the alert rules and the repair path read these.
    found: Dict[Tuple[str, str], str] = {}
    for c in report["checks"]:
        if c.get("fault") and c["status"] in ("fail", "warn"):
            key = (c["fault"], c["status"])
            found.setdefault(key, report.get("remediations", {}).get(c["fault"], "none"))
    metric(prefix + "_fault", "Fault classes the last %s found (decisions/nodes/faults.yaml), with the check "
           "status and the remediation the table gives." % what,
           [('{fault="%s",status="%s",remediation="%s"}' % (_label(f), _label(st), _label(r)), 1)
            for (f, st), r in sorted(found.items())])
    metric(prefix + "_remediation", "The remediation the last %s asks for, a state set: 1 for the "
           "strongest of its failed fault classes." % what,
           [('{remediation="%s"}' % r, int(report.get("remediation", "none") == r)) for r in REMEDIATIONS])
    metric(prefix + "_duration_seconds", "How long the last %s took." % what,
           [("", "%.3f" % report["durationS"])])
    metric(prefix + "_timestamp_seconds", "Unix time the last %s finished." % what,
           [("", "%.3f" % finished_at)])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    def positive(text: str) -> float:
        value = float(text)
        if not value > 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return value

    parser = argparse.ArgumentParser(description="Verify this node's GPUs against EXPECT.json.")
    parser.add_argument("--expect", required=True, help="EXPECT.json for this instance type")
    parser.add_argument("--report", default=DEFAULT_REPORT_PATH, help="where to write REPORT.json")
    parser.add_argument("--textfile", help="node-exporter textfile to write")
    parser.add_argument("--kernel-log", help="read XID lines from this file, not the kernel log "
                        "(every boot the file holds counts)")
    parser.add_argument("--budget-s", type=positive, default=DEFAULT_BUDGET_S,
                        help="total time budget in seconds (default %(default)s)")
    parser.add_argument("--faults", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         DEFAULT_FAULTS_NAME),
                        help="the fault table (default: faults.json beside this script)")
    parser.add_argument("--mode", choices=MODES, default="boot",
                        help="boot: every check, before the kubelet; runtime: what a workload "
                        "does not disturb, while the node works")
    return parser.parse_args(argv)


def verify(args: argparse.Namespace, nvml: Any = None) -> Dict[str, Any]:
    """Run the verification described by `args`; returns the report. Never raises."""
    started = time.monotonic()
    report: Dict[str, Any] = {"verdict": "error", "mode": args.mode, "instanceType": None,
                              "instanceId": os.environ.get(INSTANCE_ID_ENV) or None,
                              "durationS": 0.0, "faults": [], "remediation": "none", "checks": []}
    checks: List[Dict[str, Any]] = report["checks"]

    def could_not_run(name: str, detail: str) -> None:
        checks.append({"name": name, "status": "fail", "gpu": None, "value": None,
                       "threshold": None, "detail": detail, "fault": CHECK_ERROR})

    table = None
    try:
        table = load_faults(args.faults)
        expect = load_expect(args.expect)
        report["instanceType"] = expect["instanceType"]
        if nvml is None:
            import pynvml as nvml  # noqa: F811  (only here, so a missing module is a verdict)
        verifier = Verifier(nvml, expect, args.budget_s, table, args.kernel_log, started,
                            mode=args.mode)
        try:
            report["verdict"] = verifier.run()
        finally:
            checks.extend(verifier.checks)
    except FaultsError as err:
        could_not_run("faults", str(err))
    except ExpectError as err:
        could_not_run("expect", str(err))
    except ImportError as err:
        could_not_run("pynvml_import", "cannot import pynvml (nvidia-ml-py): %s" % err)
    except Exception as err:  # a bug here must still produce a verdict
        report["verdict"] = "error"
        could_not_run("verifier", "verifier error: %s: %s" % (type(err).__name__, err))
    found = [c["fault"] for c in checks if c.get("fault") and c["status"] in ("fail", "warn")]
    report["faults"] = sorted(set(found))
    failing = [c["fault"] for c in checks if c["status"] == "fail"]
    if table is not None:
        report["remediations"] = {fault: table.remediation(fault) for fault in report["faults"]}
        report["remediation"] = max((table.remediation(f) for f in failing), key=REMEDIATIONS.index,
                                    default="none")
    elif failing:  # no table to ask: what a check that could not finish gets
        report["remediation"] = "reboot"
    report["durationS"] = round(time.monotonic() - started, 3)
    return report


def main(argv: Optional[Sequence[str]] = None, nvml: Any = None) -> int:
    args = parse_args(argv)
    report = verify(args, nvml)
    verdict = report["verdict"]
    exit_code = EXIT_CODES.get(verdict, 2)
    try:
        _atomic_write(args.report, json.dumps(report, indent=2, default=str) + "\n")
    except Exception as err:
        print("gpu_verify: cannot write report %s: %s" % (args.report, err), file=sys.stderr)
        print(json.dumps(report, default=str))
        exit_code = 2
    if args.textfile:
        try:
            _atomic_write(args.textfile, render_textfile(report, time.time()))
        except Exception as err:  # monitoring only: the verdict stands
            print("gpu_verify: cannot write textfile %s: %s" % (args.textfile, err), file=sys.stderr)
    for check in report["checks"]:
        if check["status"] in ("fail", "warn"):
            gpu = "" if check["gpu"] is None else " gpu%s" % check["gpu"]
            print("gpu_verify: %s %s%s: %s" % (check["status"], check["name"], gpu, check["detail"]))
    print("gpu_verify: verdict %s in %.1fs (%d checks)"
          % (verdict, report["durationS"], len(report["checks"])))
    return exit_code


if __name__ == "__main__":
    exit_code = main()
    # The report and textfile are written. A worker thread may still be stuck inside the NVML
    # library; a normal exit would run the library's teardown, which can wait on that very call,
    # so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
