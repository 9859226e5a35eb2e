"""A stand-in for the `pynvml` module (nvidia-ml-py), driven by device profiles, for gpu_verify tests.

`build_module(node)` returns a module object that looks like pynvml to the verifier: the real
module's constants, structures and NVMLError classes (so `except pynvml.NVMLError_NotSupported`
catches exactly what it would on real hardware) plus fake `nvml*` functions that answer from a
`NodeProfile`. Functions the fake does not implement are absent, as in an older binding.

The driver version decides which newer functions and fields exist: a function newer than the
node's driver raises FunctionNotFound, as the binding does when libnvidia-ml lacks the symbol
(FUNCTION_SINCE_BRANCH, FIELD_SINCE_BRANCH).

Faults: `GpuProfile.faults` / `NodeProfile.faults` map an NVML function name to
  "NotSupported", "FunctionNotFound", or any other NVMLError_<Suffix>  -> that NVMLError is raised
  "hang"                                                                -> the call blocks
  "raise:<text>"                                                        -> RuntimeError(text)
Hung calls block until `release_hangs()` (the tests' autouse fixture calls it) or HANG_MAX_S.
`FakeDriver.library_teardown` models the library's exit-time teardown, which waits for calls still
inside it; the subprocess stub registers it with atexit.

Also here: the healthy node profiles and their EXPECT documents, a fake `nvidia-smi` script
(`write_fake_nvidia_smi`) and a `pynvml.py` stub for running the verifier as a subprocess
(`write_pynvml_stub`).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import stat
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional


def _load_real_pynvml() -> types.ModuleType:
    # In a subprocess the stub named `pynvml` preloads the real module as `_real_pynvml`.
    preloaded = sys.modules.get("_real_pynvml")
    if preloaded is not None:
        return preloaded
    import pynvml
    return pynvml


real = _load_real_pynvml()

MIB = 1 << 20
NOT_SUPPORTED = "NotSupported"
FUNCTION_NOT_FOUND = "FunctionNotFound"
HANG = "hang"
RAISE_PREFIX = "raise:"
HANG_MAX_S = 60.0
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG
CLOCKS_IDLE = 0x1         # nvmlClocksEventReasonGpuIdle: normal on an idle node
# A healthy GPU's fabric health mask as the EKS node monitoring agent met it on real nodes (it
# used to count any non-zero mask as a fault): access_timeout_recovery false (2 << 6), every other
# sub-field not supported.
FABRIC_HEALTH_HEALTHY = 0x80

# The first driver branch whose NVML has each newer function or field: nvml.h of the CUDA 11.8,
# 12.0, 12.2, 12.4 and 12.8 toolkits (PyPI nvidia-nvml-dev-cu11 11.8.86, nvidia-nvml-dev-cu12
# 12.0.76, 12.2.140, 12.4.127, 12.8.90), whose drivers are R520, R525, R535, R550 and R570.
# nvmlDeviceGetCurrentClocksThrottleReasons is in all of them.
# nvmlDeviceGetRepairStatus: not in nvml.h of CUDA 12.9 (nvidia-nvml-dev-cu12 12.9.79, R575); first bound by
# nvidia-ml-py 13.580.65 (absent from 12.575.51), so R580.
FUNCTION_SINCE_BRANCH = {
    "nvmlDeviceGetGpuFabricInfo": 525,
    "nvmlDeviceGetCurrentClocksEventReasons": 535,
    "nvmlDeviceGetGpuFabricInfoV": 550,
    "nvmlDeviceGetSramEccErrorStatus": 550,
    "nvmlDeviceGetRepairStatus": 580,
}
FIELD_SINCE_BRANCH = {real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 570}


def driver_branch(version: str) -> int:
    return int(version.split(".")[0])

_hang_release = threading.Event()


def release_hangs() -> None:
    """Let every call blocked on a "hang" fault return (it then raises NVMLError_Unknown)."""
    _hang_release.set()


def reset_hangs() -> None:
    _hang_release.clear()


@dataclass
class GpuProfile:
    """One GPU as NVML would report it."""

    name: str
    memory_total_mib: int
    uuid: str = ""
    ecc_mode: List[int] = field(default_factory=lambda: [1, 1])            # current, pending
    ecc_uncorrected_volatile: int = 0
    remapped_rows: List[int] = field(default_factory=lambda: [0, 0, 0, 0])  # corr, unc, pending, failure
    retired_pages_pending: int = 0
    retired_pages: List[int] = field(default_factory=lambda: [0, 0])       # by cause: multiple SBE, DBE
    sram_threshold_exceeded: bool = False
    recovery_action: Optional[int] = 0        # NVML_GPU_RECOVERY_ACTION_*; None: GPU does not report it
    nvlink_active: List[bool] = field(default_factory=list)                 # one per link
    fabric_state: int = real.NVML_GPU_FABRIC_STATE_COMPLETED
    fabric_status: int = real.NVML_SUCCESS
    fabric_in_progress_polls: int = 0  # calls answering "in progress" before the state above
    fabric_health_mask: int = FABRIC_HEALTH_HEALTHY
    pcie_width: int = 16
    pcie_max_width: int = 16
    clock_event_reasons: int = CLOCKS_IDLE
    power_limit_mw: int = 700000          # enforced
    power_default_limit_mw: int = 700000
    temperature_c: int = 32
    persistence_mode: int = real.NVML_FEATURE_ENABLED
    mig_mode: List[int] = field(default_factory=lambda: [0, 0])            # current, pending
    processes: List[List[int]] = field(default_factory=list)               # [pid, used MiB]
    inforom_valid: bool = True
    repair_pending: List[int] = field(default_factory=lambda: [0, 0])      # channel, TPC
    faults: Dict[str, str] = field(default_factory=dict)


@dataclass
class NodeProfile:
    """A node: its GPUs, driver, kernel log, XID events and what nvidia-smi says."""

    instance_type: str
    gpus: List[GpuProfile]
    driver_version: str = "570.133.20"
    faults: Dict[str, str] = field(default_factory=dict)
    kernel_log: List[str] = field(default_factory=list)
    xid_events: List[List[int]] = field(default_factory=list)  # [gpu index, xid] during the run
    nvidia_smi_names: Optional[List[str]] = None               # None: the GPUs' names
    nvidia_smi_exit_code: int = 0
    nvidia_smi_hangs: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "NodeProfile":
        data = json.loads(text)
        data["gpus"] = [GpuProfile(**gpu) for gpu in data["gpus"]]
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# Healthy nodes (values as NVML reports them on the real types) and their EXPECT documents
# ---------------------------------------------------------------------------------------------

_BOOT_LOG = [
    "Aug 01 10:00:01 ip-10-0-0-1 kernel: nvidia: loading out-of-tree module taints kernel.",
    "Aug 01 10:00:02 ip-10-0-0-1 kernel: NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.133.20",
]


def _gpus(count: int, template: GpuProfile,
          faults_by_gpu: Optional[Dict[int, Dict[str, str]]] = None) -> List[GpuProfile]:
    gpus = []
    for index in range(count):
        gpu = copy.deepcopy(template)
        gpu.uuid = "GPU-%08x-0000-0000-0000-%012d" % (0x5EED0000 + index, index)
        gpu.faults.update((faults_by_gpu or {}).get(index, {}))
        gpus.append(gpu)
    return gpus


def p5_48xlarge() -> NodeProfile:
    h100 = GpuProfile("NVIDIA H100 80GB HBM3", 81559, nvlink_active=[True] * 18, temperature_c=31)
    return NodeProfile("p5.48xlarge", _gpus(8, h100), kernel_log=list(_BOOT_LOG))


# The GPU fabric query (nvmlDeviceGetGpuFabricInfo*) is for Hopper or newer (nvml.h).
PRE_HOPPER_FABRIC = {"nvmlDeviceGetGpuFabricInfoV": NOT_SUPPORTED,
                     "nvmlDeviceGetGpuFabricInfo": NOT_SUPPORTED}


def p4d_24xlarge() -> NodeProfile:
    # NVSwitch board, but an A100 reports no GPU fabric state.
    a100 = GpuProfile("NVIDIA A100-SXM4-40GB", 40960, nvlink_active=[True] * 12,
                      power_limit_mw=400000, power_default_limit_mw=400000,
                      faults=dict(PRE_HOPPER_FABRIC))
    return NodeProfile("p4d.24xlarge", _gpus(8, a100), kernel_log=list(_BOOT_LOG))


def g6e_48xlarge() -> NodeProfile:
    # PCIe cards: no NVLink, no fabric, no MIG. ECC is off by default (catalog: eccExpected false).
    l40s = GpuProfile("NVIDIA L40S", 46068, ecc_mode=[0, 0], temperature_c=29,
                      power_limit_mw=350000, power_default_limit_mw=350000,
                      faults=dict(PRE_HOPPER_FABRIC, nvmlDeviceGetNvLinkState=NOT_SUPPORTED,
                                  nvmlDeviceGetMigMode=NOT_SUPPORTED))
    return NodeProfile("g6e.48xlarge", _gpus(8, l40s), kernel_log=list(_BOOT_LOG))


def g4dn_12xlarge() -> NodeProfile:
    # Turing: no row remapping (page retirement instead), no NVLink, no fabric, no MIG, no SRAM
    # ECC status (Ampere or newer). Driver R535: no nvmlDeviceGetGpuFabricInfoV, no SRAM ECC
    # status call, no recovery action field (FUNCTION_SINCE_BRANCH, FIELD_SINCE_BRANCH).
    # With ECC on, NVML reports 15360 MiB (older drivers) or 15109 MiB (newer) of the 16 GiB.
    t4 = GpuProfile("Tesla T4", 15360, pcie_width=16, pcie_max_width=16, temperature_c=27,
                    power_limit_mw=70000, power_default_limit_mw=70000,
                    faults=dict(PRE_HOPPER_FABRIC, nvmlDeviceGetRemappedRows=NOT_SUPPORTED,
                                nvmlDeviceGetNvLinkState=NOT_SUPPORTED,
                                nvmlDeviceGetMigMode=NOT_SUPPORTED,
                                nvmlDeviceGetSramEccErrorStatus=NOT_SUPPORTED))
    # Some T4 boards answer NotSupported for every ECC query through the binding.
    ecc_unsupported = {"nvmlDeviceGetEccMode": NOT_SUPPORTED,
                       "nvmlDeviceGetTotalEccErrors": NOT_SUPPORTED,
                       "nvmlDeviceGetRetiredPagesPendingStatus": NOT_SUPPORTED,
                       "nvmlDeviceGetRetiredPages": NOT_SUPPORTED}
    gpus = _gpus(4, t4, {2: ecc_unsupported, 3: ecc_unsupported})
    gpus[1].memory_total_mib = 15109
    return NodeProfile("g4dn.12xlarge", gpus, driver_version="535.230.02",
                       kernel_log=list(_BOOT_LOG))


HEALTHY_NODES = {
    "p5.48xlarge": p5_48xlarge,
    "p4d.24xlarge": p4d_24xlarge,
    "g6e.48xlarge": g6e_48xlarge,
    "g4dn.12xlarge": g4dn_12xlarge,
}

# What the catalog (decisions/catalog/catalog.yaml) hands the verifier for each type.
EXPECTS: Dict[str, Dict[str, Any]] = {
    "p5.48xlarge": {"instanceType": "p5.48xlarge", "gpuModel": "H100", "gpuCount": 8,
                    "gpuMemoryMiB": 81920, "nvlinkLinksPerGpu": 18, "nvswitch": True,
                    "driverBranch": 525, "driverVersion": None, "maxTempC": 85,
                    "migMode": "disabled", "eccExpected": True,
                    "eccReservesMemory": False},
    "p4d.24xlarge": {"instanceType": "p4d.24xlarge", "gpuModel": "A100 40GB", "gpuCount": 8,
                     "gpuMemoryMiB": 40960, "nvlinkLinksPerGpu": 12, "nvswitch": True,
                     "driverBranch": "R450", "driverVersion": None, "maxTempC": 85,
                     "migMode": "disabled", "eccExpected": True,
                    "eccReservesMemory": False},
    "g6e.48xlarge": {"instanceType": "g6e.48xlarge", "gpuModel": "L40S", "gpuCount": 8,
                     "gpuMemoryMiB": 45776, "nvlinkLinksPerGpu": 0, "nvswitch": False,
                     "driverBranch": "525", "driverVersion": None, "maxTempC": 85,
                     "migMode": "disabled", "eccExpected": False, "eccReservesMemory": True},
    "g4dn.12xlarge": {"instanceType": "g4dn.12xlarge", "gpuModel": "T4", "gpuCount": 4,
                      "gpuMemoryMiB": 16384, "nvlinkLinksPerGpu": 0, "nvswitch": False,
                      "driverBranch": 450, "maxTempC": 85,
                      "migMode": "disabled", "eccExpected": False, "eccReservesMemory": True},
}


def healthy(instance_type: str) -> NodeProfile:
    return HEALTHY_NODES[instance_type]()


def expect_for(instance_type: str) -> Dict[str, Any]:
    return copy.deepcopy(EXPECTS[instance_type])


# ---------------------------------------------------------------------------------------------
# The fake driver
# ---------------------------------------------------------------------------------------------

class FakeHandle(object):
    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return "<FakeHandle gpu%d>" % self.index


class FakeEventSet(object):
    def __init__(self) -> None:
        self.registered: Dict[int, int] = {}  # gpu index -> event type mask
        self.delivered = 0
        self.freed = False


class FakeEvent(object):
    """Shaped like c_nvmlEventData_t."""

    def __init__(self, device: FakeHandle, event_type: int, data: int):
        self.device, self.eventType, self.eventData = device, event_type, data
        self.gpuInstanceId = self.computeInstanceId = NO_INSTANCE


def _nvml_error(suffix: str) -> BaseException:
    return getattr(real, "NVMLError_" + suffix)()


class FakeDriver(object):
    """Answers NVML calls from a NodeProfile; `calls` records (function, gpu index or None)."""

    def __init__(self, node: NodeProfile):
        self.node = node
        self.initialised = False
        self.handles = [FakeHandle(i) for i in range(len(node.gpus))]
        self.calls: List[tuple] = []
        self.lock = threading.Lock()
        self.inside = 0  # calls still inside the library (hung)
        self.inside_changed = threading.Condition(self.lock)

    # -- plumbing -------------------------------------------------------------------------------

    def _enter(self, function: str, handle: Optional[FakeHandle] = None) -> Optional[GpuProfile]:
        gpu = None
        with self.lock:
            self.calls.append((function, None if handle is None else handle.index))
        if function != "nvmlInit" and not self.initialised:
            raise _nvml_error("Uninitialized")
        if not self.has_function(function):
            raise _nvml_error(FUNCTION_NOT_FOUND)
        faults = self.node.faults
        if handle is not None:
            if not isinstance(handle, FakeHandle) or handle.index >= len(self.node.gpus):
                raise _nvml_error("InvalidArgument")
            gpu = self.node.gpus[handle.index]
            faults = gpu.faults
        fault = faults.get(function)
        if fault == HANG:
            with self.inside_changed:
                self.inside += 1
            try:
                _hang_release.wait(HANG_MAX_S)
            finally:
                with self.inside_changed:
                    self.inside -= 1
                    self.inside_changed.notify_all()
            raise _nvml_error("Unknown")
        if fault and fault.startswith(RAISE_PREFIX):
            raise RuntimeError(fault[len(RAISE_PREFIX):])
        if fault:
            raise _nvml_error(fault)
        return gpu

    def has_function(self, function: str) -> bool:
        """Whether the node's driver has `function` (FUNCTION_SINCE_BRANCH); the node's
        FunctionNotFound fault removes it too, for the whole library as a missing symbol does."""
        since = FUNCTION_SINCE_BRANCH.get(function, 0)
        return (driver_branch(self.node.driver_version) >= since
                and self.node.faults.get(function) != FUNCTION_NOT_FOUND)

    def library_teardown(self) -> None:
        """The library's exit-time teardown: it waits for calls still inside the library."""
        with self.inside_changed:
            self.inside_changed.wait_for(lambda: self.inside == 0, HANG_MAX_S)

    # -- system -----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.node.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.handles):
            self._enter("nvmlDeviceGetHandleByIndex")
            raise _nvml_error("InvalidArgument")
        self._enter("nvmlDeviceGetHandleByIndex", self.handles[index])
        return self.handles[index]

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.index

    # -- per device -------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        total = gpu.memory_total_mib * MIB
        used = sum(used_mib for _, used_mib in gpu.processes) * MIB
        return real.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetEccMode(self, handle: FakeHandle) -> List[int]:
        return list(self._enter("nvmlDeviceGetEccMode", handle).ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.ecc_mode[0] != real.NVML_FEATURE_ENABLED:
            raise _nvml_error("NotSupported")
        if (error_type, counter_type) == (real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, real.NVML_VOLATILE_ECC):
            return gpu.ecc_uncorrected_volatile
        return 0

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple:
        return tuple(self._enter("nvmlDeviceGetRemappedRows", handle).remapped_rows)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        return int(self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pages_pending)

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, source_filter: int) -> List[int]:
        """Addresses of the pages retired for one cause, pending ones included (NVML docs)."""
        gpu = self._enter("nvmlDeviceGetRetiredPages", handle)
        if not 0 <= source_filter < real.NVML_PAGE_RETIREMENT_CAUSE_COUNT:
            raise _nvml_error("InvalidArgument")
        return [0x100000 * (source_filter + 1) + page for page in range(gpu.retired_pages[source_filter])]

    def nvmlDeviceGetSramEccErrorStatus(self, handle: FakeHandle, status: Any) -> int:
        gpu = self._enter("nvmlDeviceGetSramEccErrorStatus", handle)
        if gpu.ecc_mode[0] != real.NVML_FEATURE_ENABLED:  # as the other ECC counters: none with ECC off
            raise _nvml_error("NotSupported")
        # Like the C library, through ctypes.pointer(struct) or ctypes.byref(struct).
        target = getattr(status, "contents", None) or getattr(status, "_obj", None) or status
        if getattr(target, "version", None) != real.nvmlEccSramErrorStatus_v1:
            raise _nvml_error("ArgumentVersionMismatch")
        target.bThresholdExceeded = int(gpu.sram_threshold_exceeded)
        return real.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: List[Any]) -> Any:
        """As the binding's wrapper: a c_nvmlFieldValue_t array with each field's own return code.
        How a driver that predates a field answers it is undocumented; modelled as NOT_SUPPORTED."""
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        branch = driver_branch(self.node.driver_version)
        for entry, field_id in zip(values, field_ids):
            entry.fieldId, entry.nvmlReturn = field_id, real.NVML_ERROR_NOT_SUPPORTED
            known = branch >= FIELD_SINCE_BRANCH.get(field_id, 0)
            if (field_id == real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and known
                    and gpu.recovery_action is not None):
                entry.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = gpu.recovery_action
                entry.nvmlReturn = real.NVML_SUCCESS
        return values

    def nvmlDeviceValidateInforom(self, handle: FakeHandle) -> None:
        if not self._enter("nvmlDeviceValidateInforom", handle).inforom_valid:
            raise _nvml_error("CorruptedInforom")

    def nvmlDeviceGetRepairStatus(self, handle: FakeHandle) -> List[int]:
        return list(self._enter("nvmlDeviceGetRepairStatus", handle).repair_pending)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_default_limit_mw

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        gpu = self._enter("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < len(gpu.nvlink_active):
            raise _nvml_error("InvalidArgument")
        return real.NVML_FEATURE_ENABLED if gpu.nvlink_active[link] else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, info: Any) -> int:
        gpu = self._enter("nvmlDeviceGetGpuFabricInfoV", handle)
        # Callers pass ctypes.pointer(struct) or ctypes.byref(struct), as with the C library.
        target = getattr(info, "contents", None) or getattr(info, "_obj", None) or info
        if getattr(target, "version", None) != real.nvmlGpuFabricInfo_v2:
            raise _nvml_error("ArgumentVersionMismatch")
        self._fill_fabric(gpu, target)
        target.healthMask = gpu.fabric_health_mask
        return real.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeHandle, info: Any) -> int:  # deprecated
        gpu = self._enter("nvmlDeviceGetGpuFabricInfo", handle)
        target = getattr(info, "contents", None) or getattr(info, "_obj", None) or info
        # The C call writes the unversioned layout; any other struct would be scribbled over.
        if not isinstance(target, real.c_nvmlGpuFabricInfo_t):
            raise _nvml_error("InvalidArgument")
        self._fill_fabric(gpu, target)
        return real.NVML_SUCCESS

    @staticmethod
    def _fill_fabric(gpu: GpuProfile, target: Any) -> None:
        if gpu.fabric_in_progress_polls > 0:
            gpu.fabric_in_progress_polls -= 1
            target.state, target.status = real.NVML_GPU_FABRIC_STATE_IN_PROGRESS, real.NVML_SUCCESS
        else:
            target.state, target.status = gpu.fabric_state, gpu.fabric_status

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_max_width

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:  # deprecated
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int,
                                  version: int = real.nvmlTemperature_v1) -> int:
        gpu = self._enter("nvmlDeviceGetTemperatureV", handle)
        if sensor != real.NVML_TEMPERATURE_GPU or version != real.nvmlTemperature_v1:
            raise _nvml_error("InvalidArgument")
        return gpu.temperature_c

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:  # deprecated
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise _nvml_error("InvalidArgument")
        return gpu.temperature_c

    def nvmlDeviceGetPersistenceMode(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetPersistenceMode", handle).persistence_mode

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> List[int]:
        return list(self._enter("nvmlDeviceGetMigMode", handle).mig_mode)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> List[Any]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used_mib * MIB,
                                         "gpuInstanceId": NO_INSTANCE,
                                         "computeInstanceId": NO_INSTANCE})
                for pid, used_mib in gpu.processes]

    # -- events -----------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        return FakeEventSet()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        event_set.registered[handle.index] = event_set.registered.get(handle.index, 0) | int(event_types)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> FakeEvent:
        self._enter("nvmlEventSetWait")
        xid_type = real.nvmlEventTypeXidCriticalError
        # Events are queued as soon as the GPU is registered, so this never needs to block.
        while event_set.delivered < len(self.node.xid_events):
            gpu_index, xid = self.node.xid_events[event_set.delivered]
            event_set.delivered += 1
            if event_set.registered.get(gpu_index, 0) & xid_type:
                return FakeEvent(self.handles[gpu_index], xid_type, xid)
        raise _nvml_error("Timeout")

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.freed = True


def build_module(node: NodeProfile) -> types.ModuleType:
    """A module object usable in place of pynvml, answering from `node`."""
    module = types.ModuleType("pynvml", "fake pynvml for tests (see tests/fake_nvml.py)")
    for key, value in vars(real).items():
        # Keep constants, structures and error classes; drop the real nvml* wrappers (C calls).
        if key.startswith("__") or (inspect.isfunction(value) and key.startswith("nvml")):
            continue
        setattr(module, key, value)
    driver = FakeDriver(node)
    for key in dir(FakeDriver):
        if key.startswith("nvml"):
            setattr(module, key, getattr(driver, key))
    module.fake_driver = driver  # type: ignore[attr-defined]
    return module


# ---------------------------------------------------------------------------------------------
# Files for the verifier's other inputs
# ---------------------------------------------------------------------------------------------

def smi_listing(node: NodeProfile) -> str:
    names = node.nvidia_smi_names if node.nvidia_smi_names is not None else [g.name for g in node.gpus]
    return "".join("GPU %d: %s (UUID: GPU-%08x-1111-2222-3333-%012d)\n" % (i, name, 0x5EED0000 + i, i)
                   for i, name in enumerate(names))


def write_fake_nvidia_smi(directory: Path, node: NodeProfile) -> Path:
    """An executable `nvidia-smi` in `directory` that answers `-L` like the real one would."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    if node.nvidia_smi_hangs:
        body = "exec sleep 60\n"
    elif node.nvidia_smi_exit_code:
        body = ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
                "exit %d\n" % node.nvidia_smi_exit_code)
    else:
        body = "cat <<'EOF'\n%sEOF\n" % smi_listing(node)
    path.write_text("#!/bin/sh\n"
                    "[ \"$1\" = \"-L\" ] || { echo \"fake nvidia-smi: only -L\" >&2; exit 2; }\n"
                    + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


_STUB = '''"""pynvml stand-in for a gpu_verify subprocess test: the fake answering from profile.json."""
import atexit
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("_real_pynvml", {real_file!r})
_real = importlib.util.module_from_spec(_spec)
sys.modules["_real_pynvml"] = _real
_spec.loader.exec_module(_real)
sys.path.insert(0, {repo_root!r})
from tests import fake_nvml  # noqa: E402

with open({profile!r}) as _handle:
    _node = fake_nvml.NodeProfile.from_json(_handle.read())
_module = fake_nvml.build_module(_node)
atexit.register(_module.fake_driver.library_teardown)  # as libnvidia-ml's own teardown at exit
sys.modules[__name__] = _module  # `import pynvml` returns this
'''


def write_pynvml_stub(directory: Path, node: NodeProfile) -> Path:
    """Write `pynvml.py` (+ profile.json) into `directory`; put it first on PYTHONPATH."""
    directory.mkdir(parents=True, exist_ok=True)
    profile = directory / "profile.json"
    profile.write_text(node.to_json())
    stub = directory / "pynvml.py"
    stub.write_text(_STUB.format(real_file=os.path.abspath(real.__file__),
                                 repo_root=str(Path(__file__).resolve().parent.parent),
                                 profile=str(profile)))
    return stub


__all__ = ["GpuProfile", "NodeProfile", "FakeDriver", "build_module", "healthy", "expect_for",
           "release_hangs", "reset_hangs", "write_fake_nvidia_smi", "write_pynvml_stub",
           "NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "HANG", "RAISE_PREFIX", "HEALTHY_NODES",
           "FABRIC_HEALTH_HEALTHY", "FUNCTION_SINCE_BRANCH", "FIELD_SINCE_BRANCH"]
