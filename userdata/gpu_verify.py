#!/usr/bin/env python3
"""gpu-cloud node verifier: checks a GPU node against what its instance type promises.

The bootstrap script runs this once at boot, before the kubelet starts, and admits the node only
when the verdict is "pass".

Usage:
    python3 gpu_verify.py --expect EXPECT.json --report REPORT.json [--textfile PATH]
                          [--kernel-log PATH] [--budget-s 60]

Exit status: 0 pass, 1 fail, 2 could not run (verdict "error": EXPECT missing or invalid, pynvml
not importable, NVML initialisation failed, report not writable). A report is written whenever the
arguments parse, including for "error".

EXPECT.json: {"instanceType", "gpuModel", "gpuCount", "gpuMemoryMiB", "nvlinkLinksPerGpu",
"nvswitch", "driverBranch", "driverVersion" (optional or null), "maxTempC",
"migMode": "disabled" | "enabled", "eccExpected"}. gpuModel is a catalog short name
(see GPU_MODEL_PATTERNS); driverBranch is 550, "550" or "R550".

REPORT.json (default /var/lib/gpu-cloud/verify.json): {"verdict": "pass" | "fail" | "error",
"instanceType", "instanceId", "durationS", "checks": [{"name", "status", "gpu", "value",
"threshold", "detail"}]}, status one of pass, fail, warn, skip; gpu is an index or null.

--textfile PATH writes a Prometheus node-exporter textfile atomically (temporary file + rename).
--kernel-log PATH reads XID lines from PATH instead of `journalctl -k -b` (falling back to `dmesg`).

Environment:
    GPU_CLOUD_INSTANCE_ID  copied into the report's instanceId (null when unset).
    GPU_VERIFY_NVIDIA_SMI  the nvidia-smi used for the `-L` cross-check, a path or a command name;
                           by default `nvidia-smi` is resolved from PATH.

Rules: an NVML call that raises NotSupported or FunctionNotFound makes its check "skip" (never pass,
never fail). Every NVML call runs in a daemon thread with a per-call timeout, and the whole run has a
budget (--budget-s): a hung call fails its check, and once the budget is spent the remaining checks
fail with "budget exhausted" so the verdict is always produced in time. An unexpected exception
fails its check with the error text; the verifier itself does not crash.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

# Fatal XIDs of the EKS node monitoring agent.
EKS_FATAL_XIDS = frozenset({46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142,
                            143, 151, 155, 156, 158})
# Azure NHC treats these as fatal too.
AZURE_EXTRA_FATAL_XIDS = frozenset({56, 57, 58, 65, 68, 69, 73, 80, 81, 92})
CRITICAL_XIDS = EKS_FATAL_XIDS | AZURE_EXTRA_FATAL_XIDS
# The NVIDIA device plugin ignores these as caused by applications, not by the GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# Critical for one trusted tool, application-caused for another: warn rather than fail.
DISPUTED_XIDS = CRITICAL_XIDS & APPLICATION_XIDS

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

MEMORY_TOLERANCE = 0.05
# The catalog gives T4 its raw 16384 MiB, but with ECC on NVML reports 15360 MiB (1/16 kept for
# ECC) or, on newer drivers, about 15109 MiB: 6-8 % below.
MEMORY_TOLERANCE_BY_MODEL = {"T4": 0.10}

# Clock event reasons that mean the hardware itself is holding the clocks down.
HW_CLOCK_EVENT_REASONS: Tuple[Tuple[int, str], ...] = (
    (0x8, "HW slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake slowdown"),
)

FABRIC_STATE_NAMES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}

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
XID_LINE = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<xid>\d+)")
SMI_GPU_LINE = re.compile(r"^GPU \d+:")
EXIT_CODES = {"pass": 0, "fail": 1, "error": 2}
MIB = 1 << 20

EXPECT_KEYS = ("instanceType", "gpuModel", "gpuCount", "gpuMemoryMiB", "nvlinkLinksPerGpu",
               "nvswitch", "driverBranch", "maxTempC", "migMode", "eccExpected")


# --------------------------------------------------------------------------------------------
# Outcomes and errors
# --------------------------------------------------------------------------------------------

class Outcome(object):
    """What one check found: status, the value seen, the threshold it was held to, and why."""

    __slots__ = ("status", "value", "threshold", "detail")

    def __init__(self, status: str, value: Any = None, threshold: Any = None, detail: str = ""):
        self.status, self.value, self.threshold, self.detail = status, value, threshold, detail


def passed(value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
    return Outcome("pass", value, threshold, detail)


def failed(value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
    return Outcome("fail", value, threshold, detail)


def warned(value: Any = None, threshold: Any = None, detail: str = "") -> Outcome:
    return Outcome("warn", value, threshold, detail)


def skipped(detail: str, threshold: Any = None) -> Outcome:
    return Outcome("skip", None, threshold, detail)


class CallTimedOut(Exception):
    def __init__(self, call: str, seconds: float):
        super(CallTimedOut, self).__init__("%s timed out after %.2gs" % (call, seconds))


class BudgetExhausted(Exception):
    pass


class ExpectError(ValueError):
    pass


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
    for key in ("nvswitch", "eccExpected"):
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


class Verifier(object):
    """Runs every check within the budget and collects the results."""

    def __init__(self, nvml: Any, expect: Dict[str, Any], budget_s: float,
                 kernel_log_path: Optional[str] = None, started: Optional[float] = None):
        self.nvml = nvml
        self.expect = expect
        self.kernel_log_path = kernel_log_path
        self.started = time.monotonic() if started is None else started
        # Keep a little of the budget back for writing the report.
        self.deadline = self.started + budget_s - min(1.0, 0.1 * budget_s)
        # One hung call must not eat the whole budget: the other GPUs still get checked.
        self.call_cap = min(CALL_TIMEOUT_S, max(0.5, budget_s / 4.0))
        self.checks: List[Dict[str, Any]] = []
        self.gpus: List[Gpu] = []
        self.wedged: set = set()
        self.nvml_count: Optional[int] = None
        self.not_supported = getattr(nvml, "NVMLError_NotSupported", _Never)
        self.function_not_found = getattr(nvml, "NVMLError_FunctionNotFound", _Never)
        # Unversioned wrappers (e.g. nvmlDeviceGetComputeRunningProcesses) turn FunctionNotFound
        # into NVMLLibraryMismatchError.
        self.skip_errors = (self.not_supported, self.function_not_found,
                            getattr(nvml, "NVMLLibraryMismatchError", _Never))
        self.nvml_error = getattr(nvml, "NVMLError", _Never)
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
            if gpu is not None:
                self.wedged.add(gpu)
            raise CallTimedOut(name, seconds)
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

    # -- recording ---------------------------------------------------------------------------

    def record(self, name: str, gpu: Optional[int], outcome: Outcome) -> Outcome:
        self.checks.append({"name": name, "status": outcome.status, "gpu": gpu,
                            "value": outcome.value, "threshold": outcome.threshold,
                            "detail": outcome.detail})
        return outcome

    def run_check(self, name: str, gpu: Optional[Gpu], check: Callable[..., Outcome],
                  *args: Any) -> Outcome:
        """Run one check and record its outcome; turns every exception into a status."""
        index = None if gpu is None else gpu.index
        if gpu is not None and gpu.index in self.wedged:
            outcome = failed(detail="not run: an earlier NVML call on GPU %d timed out" % gpu.index)
        elif gpu is not None and gpu.handle is None:
            outcome = failed(detail="no NVML handle for GPU %d: %s" % (gpu.index, gpu.handle_error))
        elif self.remaining() <= MIN_CALL_S:
            outcome = failed(detail="budget exhausted")
        else:
            try:
                outcome = check(*args)
            except CallTimedOut as err:
                outcome = failed(detail=str(err))
            except BudgetExhausted:
                outcome = failed(detail="budget exhausted")
            except subprocess.TimeoutExpired as err:
                outcome = failed(detail="%s timed out after %.2gs" % (err.cmd, err.timeout))
            except self.skip_errors as err:
                outcome = skipped("%s: %s" % (getattr(err, "nvml_call", "NVML"), err))
            except Exception as err:
                outcome = failed(detail="unexpected error in %s: %s: %s" % (
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
            self.run_check("xid_kernel_log", None, self.check_xid_kernel_log)
            self.open_gpus()
            self.start_xid_watch()
            for gpu in self.gpus:
                for name, check in GPU_CHECKS:
                    self.run_check(name, gpu, check, self, gpu)
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

    # -- node checks -------------------------------------------------------------------------

    def check_nvml_init(self) -> Outcome:
        try:
            self.call("nvmlInit")
        except self.skip_errors + (self.nvml_error,) as err:
            # Without NVML nothing else can be checked: "could not run", never "skip".
            return failed(detail="nvmlInit: %s: %s" % (type(err).__name__, err))
        return passed(detail="NVML initialised")

    def check_driver_version(self) -> Outcome:
        version = _text(self.call("nvmlSystemGetDriverVersion")).strip()
        branch = parse_driver_branch(self.expect["driverBranch"])
        pinned = self.expect.get("driverVersion")
        if pinned:
            threshold = "== %s" % pinned
            if version != pinned:
                return failed(version, threshold, "driver %s is not the pinned %s" % (version, pinned))
            return passed(version, threshold, "driver is the pinned version")
        threshold = ">= R%d" % branch
        match = re.match(r"^(\d+)", version)
        if not match:
            return failed(version, threshold, "cannot parse driver version %r" % version)
        if int(match.group(1)) < branch:
            return failed(version, threshold, "driver %s is older than branch R%d" % (version, branch))
        return passed(version, threshold, "driver branch R%s" % match.group(1))

    def check_gpu_count(self) -> Outcome:
        self.nvml_count = int(self.call("nvmlDeviceGetCount"))
        expected = self.expect["gpuCount"]
        if self.nvml_count != expected:
            return failed(self.nvml_count, expected,
                          "NVML sees %d GPUs, %s has %d" % (self.nvml_count,
                                                            self.expect["instanceType"], expected))
        return passed(self.nvml_count, expected)

    def check_nvidia_smi(self) -> Outcome:
        smi = resolve_nvidia_smi()
        threshold = "NVML count (%s)" % self.nvml_count
        if smi is None:
            wanted = os.environ.get(NVIDIA_SMI_ENV) or "nvidia-smi"
            return failed(None, threshold, "%s not found (PATH or $%s)" % (wanted, NVIDIA_SMI_ENV))
        result = self.run_command([smi, "-L"])
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            return failed(None, threshold, "%s -L exited %d: %s" % (smi, result.returncode, tail[0]))
        smi_count = sum(1 for line in result.stdout.splitlines() if SMI_GPU_LINE.match(line))
        if self.nvml_count is None:
            return failed(smi_count, threshold, "NVML GPU count unavailable to compare with")
        if smi_count != self.nvml_count:
            return failed(smi_count, self.nvml_count,
                          "nvidia-smi -L lists %d GPUs, NVML %d" % (smi_count, self.nvml_count))
        return passed(smi_count, self.nvml_count, "nvidia-smi -L agrees with NVML")

    def read_kernel_log(self) -> Tuple[Optional[str], str]:
        """(kernel log text or None, where it came from or why it is missing)."""
        if self.kernel_log_path:
            with open(self.kernel_log_path, "r", encoding="utf-8", errors="replace") as handle:
                return handle.read(), self.kernel_log_path
        problems = []
        for command in KERNEL_LOG_COMMANDS:
            executable = shutil.which(command[0])
            if executable is None:
                problems.append("%s not found" % command[0])
                continue
            result = self.run_command((executable,) + command[1:])
            if result.returncode != 0:
                problems.append("%s exited %d" % (command[0], result.returncode))
            elif not any(KERNEL_LOG_ENTRY.match(line) for line in result.stdout.splitlines()):
                # journalctl exits 0 with "-- No entries --" when journald kept nothing; a real
                # kernel log since boot is never empty, so try the next source.
                problems.append("%s returned no entries" % command[0])
            else:
                return result.stdout, " ".join(command)
        return None, "; ".join(problems)

    def check_xid_kernel_log(self) -> Outcome:
        try:
            text, source = self.read_kernel_log()
        except OSError as err:
            return failed(None, "no critical XID", "cannot read kernel log: %s" % err)
        if text is None:
            return warned(None, "no critical XID", "kernel log unavailable: %s" % source)
        sightings = [(int(m.group("xid")), m.group("where")) for m in XID_LINE.finditer(text)]
        return classify_xids(sightings, "in %s since boot" % source)

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
            return failed(None, "no critical XID", "no GPU registered for XID events")
        drain_until = time.monotonic() + min(XID_DRAIN_S, max(0.0, self.remaining()))
        timeout_error = getattr(self.nvml, "NVMLError_Timeout", _Never)
        sightings: List[Tuple[int, str]] = []
        while True:
            wait_s = max(0.0, min(drain_until - time.monotonic(), self.call_cap / 2.0))
            try:
                event = self.call("nvmlEventSetWait", self.xid_event_set, int(wait_s * 1000))
            except timeout_error:
                break  # nothing (more) queued
            if int(event.eventType) & int(self.nvml.nvmlEventTypeXidCriticalError):
                sightings.append((int(event.eventData), self.event_gpu(event)))
            if time.monotonic() >= drain_until:
                break
        where = "from NVML during the run (GPUs %s)" % ",".join(str(i) for i in self.xid_registered)
        return classify_xids(sightings, where)

    def event_gpu(self, event: Any) -> str:
        try:
            return "GPU %d" % int(self.call("nvmlDeviceGetIndex", event.device))
        except Exception:
            return "GPU ?"


def classify_xids(sightings: List[Tuple[int, str]], where: str) -> Outcome:
    """Fail on critical XIDs, warn on disputed ones, ignore the rest (listed in the detail)."""
    threshold = "no critical XID"
    fatal = sorted(set((x, w) for x, w in sightings if x in CRITICAL_XIDS and x not in DISPUTED_XIDS))
    disputed = sorted(set((x, w) for x, w in sightings if x in DISPUTED_XIDS))
    ignored = sorted(set(x for x, _ in sightings if x not in CRITICAL_XIDS))
    notes = []
    if ignored:
        notes.append("not counted: XID %s (application-caused or non-critical)"
                     % ", ".join(str(x) for x in ignored))
    if disputed:
        notes.append("XID %s on %s: fatal for the EKS node monitoring agent or Azure NHC but ignored "
                     "as application-caused by the NVIDIA device plugin; the lists disagree, so "
                     "this warns rather than fails"
                     % (", ".join(sorted(set(str(x) for x, _ in disputed))),
                        ", ".join(sorted(set(w for _, w in disputed)))))
    if fatal:
        seen = "; ".join("XID %d on %s" % (x, w) for x, w in fatal)
        return failed(sorted(set(x for x, _ in fatal)), threshold,
                      "; ".join(["critical %s %s" % (seen, where)] + notes))
    if disputed:
        return warned(sorted(set(x for x, _ in disputed)), threshold, "; ".join(notes))
    return passed([], threshold, "; ".join(["no critical XID %s" % where] + notes))


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
        return failed(name, expected, "%r is %s, not %s" % (name, model or "an unknown model", expected))
    return passed(name, expected, "%r is %s" % (name, model))


def check_gpu_memory(v: Verifier, gpu: Gpu) -> Outcome:
    total_mib = int(round(int(v.gpu_call(gpu, "nvmlDeviceGetMemoryInfo").total) / float(MIB)))
    expected = v.expect["gpuMemoryMiB"]
    tolerance = MEMORY_TOLERANCE_BY_MODEL.get(v.expect["gpuModel"], MEMORY_TOLERANCE)
    threshold = "%d MiB +/- %g%%" % (expected, tolerance * 100)
    deviation = abs(total_mib - expected) / float(expected)
    detail = "%d MiB is %.1f%% from %d MiB" % (total_mib, deviation * 100, expected)
    return (passed if deviation <= tolerance else failed)(total_mib, threshold, detail)


def check_ecc_mode(v: Verifier, gpu: Gpu) -> Outcome:
    if not v.expect["eccExpected"]:
        return skipped("ECC not expected on %s" % v.expect["gpuModel"])
    current, pending = v.gpu_call(gpu, "nvmlDeviceGetEccMode")
    enabled = v.nvml.NVML_FEATURE_ENABLED
    value = {"current": bool(current == enabled), "pending": bool(pending == enabled)}
    if current != enabled:
        return failed(value, "enabled", "ECC is disabled")
    if pending != enabled:
        return warned(value, "enabled", "ECC is on now but is set to turn off at the next reset")
    return passed(value, "enabled")


def check_ecc_uncorrected(v: Verifier, gpu: Gpu) -> Outcome:
    count = int(v.gpu_call(gpu, "nvmlDeviceGetTotalEccErrors",
                           v.nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, v.nvml.NVML_VOLATILE_ECC))
    if count > 0:
        return failed(count, 0, "%d uncorrected ECC errors since the last driver load" % count)
    return passed(count, 0)


def check_remapped_rows(v: Verifier, gpu: Gpu) -> Outcome:
    try:
        corrected, uncorrected, pending, failure = v.gpu_call(gpu, "nvmlDeviceGetRemappedRows")
    except v.skip_errors:
        gpu.notes["row_remapping"] = False  # pre-Ampere: retired pages instead
        raise
    gpu.notes["row_remapping"] = True
    value = {"corrected": int(corrected), "uncorrected": int(uncorrected),
             "pending": bool(pending), "failure": bool(failure)}
    threshold = "no pending remap, no remap failure"
    if failure:
        return failed(value, threshold, "row remapping failed: the GPU needs replacing")
    if pending:
        return failed(value, threshold, "row remap pending: the GPU needs a reset")
    return passed(value, threshold)


def check_retired_pages(v: Verifier, gpu: Gpu) -> Outcome:
    if gpu.notes.get("row_remapping"):
        return skipped("GPU remaps rows (Ampere or newer); page retirement does not apply")
    pending = v.gpu_call(gpu, "nvmlDeviceGetRetiredPagesPendingStatus")
    if pending == v.nvml.NVML_FEATURE_ENABLED:
        return failed(True, False, "page retirement pending: the GPU needs a reset")
    return passed(False, False)


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
        raise unsupported  # no NVLink at all on this GPU: skip
    active = links - len(inactive)
    if inactive:
        return failed(active, links, "links not active: %s" % ", ".join(inactive))
    return passed(active, links)


def check_fabric(v: Verifier, gpu: Gpu) -> Outcome:
    if not v.expect["nvswitch"]:
        return skipped("%s has no NVSwitch fabric" % v.expect["instanceType"])
    nvml = v.nvml
    threshold = "completed, success"
    info_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if info_type is None:
        raise v.missing_function("c_nvmlGpuFabricInfoV_t")
    settle_until = time.monotonic() + FABRIC_SETTLE_S
    while True:
        info = info_type()
        v.gpu_call(gpu, "nvmlDeviceGetGpuFabricInfoV", ctypes.pointer(info))
        state, status = int(info.state), int(info.status)
        still_starting = state in (nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
                                   nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
        if not (still_starting and time.monotonic() < settle_until
                and v.remaining() > FABRIC_POLL_S + MIN_CALL_S):
            break
        time.sleep(FABRIC_POLL_S)
    value = {"state": FABRIC_STATE_NAMES.get(state, str(state)), "status": status}
    if state == nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return skipped("fabric state: not supported on this GPU", threshold)
    if state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED and status == nvml.NVML_SUCCESS:
        return passed(value, threshold)
    return failed(value, threshold, "fabric registration %s with NVML status %d"
                  % (value["state"], status))


def check_pcie_width(v: Verifier, gpu: Gpu) -> Outcome:
    # Width, not generation: the generation drops whenever the GPU idles.
    current = int(v.gpu_call(gpu, "nvmlDeviceGetCurrPcieLinkWidth"))
    maximum = int(v.gpu_call(gpu, "nvmlDeviceGetMaxPcieLinkWidth"))
    if current != maximum:
        return failed(current, maximum, "PCIe link trained at x%d of x%d" % (current, maximum))
    return passed(current, maximum)


def check_clock_events(v: Verifier, gpu: Gpu) -> Outcome:
    reasons = int(v.gpu_call(gpu, "nvmlDeviceGetCurrentClocksEventReasons"))
    active = [label for bit, label in HW_CLOCK_EVENT_REASONS if reasons & bit]
    threshold = "none of %s" % ", ".join(label for _, label in HW_CLOCK_EVENT_REASONS)
    if active:
        return failed("0x%x" % reasons, threshold, "clocks held down by %s" % ", ".join(active))
    return passed("0x%x" % reasons, threshold)


def read_temperature(v: Verifier, gpu: Gpu) -> int:
    sensor = v.nvml.NVML_TEMPERATURE_GPU
    try:
        return int(v.gpu_call(gpu, "nvmlDeviceGetTemperatureV", sensor))
    except v.function_not_found:  # driver predates the V call; the old one is deprecated
        return int(v.gpu_call(gpu, "nvmlDeviceGetTemperature", sensor))


def check_temperature(v: Verifier, gpu: Gpu) -> Outcome:
    celsius = read_temperature(v, gpu)
    limit = v.expect["maxTempC"]
    if celsius >= limit:
        return failed(celsius, "< %s C" % limit, "GPU at %d C" % celsius)
    return passed(celsius, "< %s C" % limit)


def check_persistence_mode(v: Verifier, gpu: Gpu) -> Outcome:
    mode = v.gpu_call(gpu, "nvmlDeviceGetPersistenceMode")
    if mode != v.nvml.NVML_FEATURE_ENABLED:
        return failed("disabled", "enabled", "persistence mode is off")
    return passed("enabled", "enabled")


def check_mig_mode(v: Verifier, gpu: Gpu) -> Outcome:
    expected = v.expect["migMode"]
    try:
        current, pending = v.gpu_call(gpu, "nvmlDeviceGetMigMode")
    except v.skip_errors as err:
        if expected == "enabled":  # asked for MIG on a GPU without it: a real mismatch
            return failed(None, expected, "MIG expected enabled but %s: %s"
                          % (getattr(err, "nvml_call", "NVML"), err))
        raise
    names = {v.nvml.NVML_DEVICE_MIG_ENABLE: "enabled", v.nvml.NVML_DEVICE_MIG_DISABLE: "disabled"}
    value = {"current": names.get(current, str(current)), "pending": names.get(pending, str(pending))}
    wrong = [which for which in ("current", "pending") if value[which] != expected]
    if wrong:
        return failed(value, expected, "MIG %s mode is not %s" % (" and ".join(wrong), expected))
    return passed(value, expected)


def check_compute_processes(v: Verifier, gpu: Gpu) -> Outcome:
    processes = v.gpu_call(gpu, "nvmlDeviceGetComputeRunningProcesses") or []
    if processes:
        holders = []
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            holders.append("pid %s (%s)" % (process.pid, "unknown memory" if used is None
                                            else "%d MiB" % (int(used) // MIB)))
        return failed(sorted(int(p.pid) for p in processes), "none",
                      "compute processes hold GPU memory: %s" % ", ".join(holders))
    return passed([], "none")


# Order matters: check_retired_pages reads what check_remapped_rows learned.
GPU_CHECKS: Tuple[Tuple[str, Callable[[Verifier, Gpu], Outcome]], ...] = (
    ("gpu_model", check_gpu_model),
    ("gpu_memory", check_gpu_memory),
    ("ecc_mode", check_ecc_mode),
    ("ecc_uncorrected", check_ecc_uncorrected),
    ("remapped_rows", check_remapped_rows),
    ("retired_pages", check_retired_pages),
    ("nvlink", check_nvlink),
    ("fabric", check_fabric),
    ("pcie_width", check_pcie_width),
    ("clock_events", check_clock_events),
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


def render_textfile(report: Dict[str, Any], finished_at: float) -> str:
    """The report as Prometheus exposition text for node-exporter's textfile collector."""
    lines: List[str] = []

    def metric(name: str, help_text: str, samples: List[Tuple[str, Any]]) -> None:
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s gauge" % name)
        lines.extend("%s%s %s" % (name, labels, value) for labels, value in samples)

    metric("gpu_cloud_node_verify_pass",
           "1 when the last GPU node verification passed, 0 when it failed or could not run.",
           [("", 1 if report["verdict"] == "pass" else 0)])
    metric("gpu_cloud_node_verify_verdict", "Verdict of the last GPU node verification.",
           [('{verdict="%s"}' % _label(report["verdict"]), 1)])
    metric("gpu_cloud_node_verify_check_status",
           "Status of each check of the last GPU node verification (1 for the status it had).",
           [('{check="%s",gpu="%s",status="%s"}' % (_label(c["name"]), _label(c["gpu"]),
                                                    _label(c["status"])), 1)
            for c in report["checks"]])
    metric("gpu_cloud_node_verify_duration_seconds",
           "How long the last GPU node verification took.", [("", "%.3f" % report["durationS"])])
    metric("gpu_cloud_node_verify_timestamp_seconds",
           "Unix time the last GPU node verification finished.", [("", "%.3f" % finished_at)])
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
    parser.add_argument("--kernel-log", help="read XID lines from this file, not the kernel log")
    parser.add_argument("--budget-s", type=positive, default=DEFAULT_BUDGET_S,
                        help="total time budget in seconds (default %(default)s)")
    return parser.parse_args(argv)


def verify(args: argparse.Namespace, nvml: Any = None) -> Dict[str, Any]:
    """Run the verification described by `args`; returns the report. Never raises."""
    started = time.monotonic()
    report: Dict[str, Any] = {"verdict": "error", "instanceType": None,
                              "instanceId": os.environ.get(INSTANCE_ID_ENV) or None,
                              "durationS": 0.0, "checks": []}
    checks: List[Dict[str, Any]] = report["checks"]

    def could_not_run(name: str, detail: str) -> None:
        checks.append({"name": name, "status": "fail", "gpu": None, "value": None,
                       "threshold": None, "detail": detail})

    try:
        expect = load_expect(args.expect)
        report["instanceType"] = expect["instanceType"]
        if nvml is None:
            import pynvml as nvml  # noqa: F811  (only here, so a missing module is a verdict)
        verifier = Verifier(nvml, expect, args.budget_s, args.kernel_log, started)
        try:
            report["verdict"] = verifier.run()
        finally:
            checks.extend(verifier.checks)
    except ExpectError as err:
        could_not_run("expect", str(err))
    except ImportError as err:
        could_not_run("pynvml_import", "cannot import pynvml (nvidia-ml-py): %s" % err)
    except Exception as err:  # a bug here must still produce a verdict
        report["verdict"] = "error"
        could_not_run("verifier", "verifier error: %s: %s" % (type(err).__name__, err))
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
    sys.exit(main())
