"""The GPU fault model: loads and checks decisions/nodes/faults.yaml once.

One table drives the boot gate and the run-time checker (userdata/gpu_verify.py reads `bundle_document()` from the
verifier bundle as faults.json), the alert rules (decisions/observability/alert_rules.py) and the repair controller, and
the docs show it (`markdown_table`). Pure: no Pulumi.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from pydantic import Field, model_validator

from decisions.catalog.data_files import DataModel, load_model

FAULTS_PATH = Path(__file__).with_name("faults.yaml")
BOOT_VERDICTS = ("fail", "warn", "none")
# In order of strength: a node with several faults gets the strongest one's remediation.
REMEDIATIONS = ("none", "reset", "reboot", "replace")
# The verifier checks a fault may name (userdata/gpu_verify.py, both modes), and the gate's own EFA step.
CHECKS = ("nvml_init", "driver_version", "gpu_count", "nvidia_smi", "xid_kernel_log", "xid_events", "sxid_kernel_log",
          "gpu_model", "gpu_memory", "ecc_mode", "ecc_uncorrected", "sram_ecc", "remapped_rows", "retired_pages",
          "recovery_action", "inforom", "repair_status", "nvlink", "fabric", "fabric_health", "pcie_width",
          "clock_events", "power_limit", "temperature", "persistence_mode", "mig_mode", "compute_processes", "efa")
# What any check reports when it could not finish (an NVML call hung, the budget ran out, an unexpected error).
CHECK_ERROR = "check-error"


class Fault(DataModel):
    id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    what: str
    checks: Tuple[str, ...]
    boot: str
    runtime: str
    alert: Optional[str]
    remediation: str
    source: str

    @model_validator(mode="after")
    def _known(self) -> "Fault":
        if self.boot not in BOOT_VERDICTS:
            raise ValueError(f"{self.id}: boot {self.boot!r} is not one of {', '.join(BOOT_VERDICTS)}")
        if self.remediation not in REMEDIATIONS:
            raise ValueError(f"{self.id}: remediation {self.remediation!r} is not one of {', '.join(REMEDIATIONS)}")
        unknown = [c for c in self.checks if c not in CHECKS]
        if unknown:
            raise ValueError(f"{self.id}: unknown checks {', '.join(unknown)}")
        if (self.boot == "none") != (not self.checks):
            raise ValueError(f"{self.id}: a class the gate judges names its checks, and only such a class")
        return self


# The lists the XID catalog records verdicts from (faults.yaml xids.sources): those that call an XID fatal, and the
# one that calls some the application's.
FATAL_LISTS = ("eks", "azure", "gpud")
APPLICATION_LISTS = ("devicePlugin",)
# The classes an XID may get, by NVIDIA's resolution bucket (xids.resolutions).
XID_CLASSES = ("xid-replace", "xid-fatal", "xid-nvlink", "xid-recovery-action", "xid-application")


class XidEntry(DataModel):
    xid: int = Field(gt=0)
    what: str
    resolution: str                                   # NVIDIA's bucket (immediate action)
    fatal_to: Tuple[str, ...] = Field(alias="fatalTo")
    application_to: Tuple[str, ...] = Field(default=(), alias="applicationTo")
    why: Optional[str] = None                         # why the verdict is not the one a list that disagrees gives

    @model_validator(mode="after")
    def _lists(self) -> "XidEntry":
        unknown = [n for n in self.fatal_to if n not in FATAL_LISTS] + [
            n for n in self.application_to if n not in APPLICATION_LISTS]
        if unknown:
            raise ValueError(f"XID {self.xid}: unknown lists {', '.join(unknown)}")
        return self


class Xids(DataModel):
    sources: Dict[str, str]
    resolutions: Dict[str, str]
    catalog: Tuple[XidEntry, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "Xids":
        missing = sorted(set(FATAL_LISTS + APPLICATION_LISTS + ("catalog",)) - set(self.sources))
        if missing:
            raise ValueError(f"xids.sources lacks {', '.join(missing)}")
        wrong = {b: c for b, c in self.resolutions.items() if c not in XID_CLASSES}
        if wrong:
            raise ValueError(f"xids.resolutions maps to classes that are not XID classes: {wrong}")
        xids = [e.xid for e in self.catalog]
        twice = sorted({x for x in xids if xids.count(x) > 1})
        if twice:
            raise ValueError(f"XIDs listed twice: {', '.join(map(str, twice))}")
        for entry in self.catalog:
            if entry.resolution not in self.resolutions:
                raise ValueError(f"XID {entry.xid}: resolution {entry.resolution!r} is not in xids.resolutions")
        if len(self.of("xid-recovery-action")) != 1:
            raise ValueError("exactly one XID names a recovery action (XID 154)")
        return self

    def fault_of(self, xid: int) -> Optional[str]:
        """The class an XID gets (None for one the table does not name: xid-unknown)."""
        for entry in self.catalog:
            if entry.xid == xid:
                return self.resolutions[entry.resolution]
        return None

    def of(self, fault_id: str) -> Tuple[int, ...]:
        """The XIDs that get `fault_id`, in order."""
        return tuple(sorted(e.xid for e in self.catalog if self.resolutions[e.resolution] == fault_id))

    def with_resolution(self, *buckets: str) -> Tuple[int, ...]:
        return tuple(sorted(e.xid for e in self.catalog if e.resolution in buckets))

    @property
    def recovery_action(self) -> int:
        return self.of("xid-recovery-action")[0]


class Sxids(DataModel):
    fatal_word: str = Field(alias="fatalWord")
    non_fatal_word: str = Field(alias="nonFatalWord")


class Limits(DataModel):
    retired_pages_max: int = Field(alias="retiredPagesMax", gt=0)
    row_remap_uncorrectable_max: int = Field(alias="rowRemapUncorrectableMax", gt=0)
    nvlink_crc_errors_per_second: float = Field(alias="nvlinkCrcErrorsPerSecond", gt=0)
    power_limit_fail_percent: int = Field(alias="powerLimitFailPercent", gt=0, le=100)
    memory_tolerance: float = Field(alias="memoryTolerance", gt=0, lt=1)
    power_violation_share: float = Field(alias="powerViolationShare", gt=0, le=1)
    pcie_replays_per_minute: float = Field(alias="pcieReplaysPerMinute", gt=0)


class FaultTable(DataModel):
    xids: Xids
    sxids: Sxids
    limits: Limits
    faults: Tuple[Fault, ...]

    @model_validator(mode="after")
    def _unique(self) -> "FaultTable":
        ids = [f.id for f in self.faults]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"fault ids listed twice: {', '.join(duplicates)}")
        if CHECK_ERROR not in ids:
            raise ValueError(f"the table needs the {CHECK_ERROR} class (what an unfinished check reports)")
        missing = sorted(set(CHECKS) - {c for f in self.faults for c in f.checks})
        if missing:
            raise ValueError(f"checks no fault class covers: {', '.join(missing)}")
        absent = sorted(set(self.xids.resolutions.values()) - set(ids))
        if absent:
            raise ValueError(f"xids.resolutions names fault classes the table lacks: {', '.join(absent)}")
        for entry in self.xids.catalog:
            fails = self.fault(self.xids.resolutions[entry.resolution]).boot == "fail"
            against = self.disagreeing(entry)
            if against and not entry.why:
                raise ValueError(f"XID {entry.xid}: {', '.join(against)} disagree with its verdict "
                                 f"({'fail' if fails else 'not fail'}, from {entry.resolution}); say why")
            if entry.why and not against:
                raise ValueError(f"XID {entry.xid}: a why, but no trusted list disagrees")
        return self

    def disagreeing(self, entry: XidEntry) -> Tuple[str, ...]:
        """The trusted lists whose word on `entry` is the opposite of the table's verdict. EKS and Azure list only
        what they call fatal (silence is no verdict); gpud types every XID Fatal or Warning; the device plugin lists
        the application's."""
        fails = self.fault(self.xids.resolutions[entry.resolution]).boot == "fail"
        if not fails:
            return tuple(entry.fatal_to)
        gpud_has_it = entry.resolution != "XID_154"   # gpud types every catalog XID but 154, an informational one
        return tuple(entry.application_to) + (("gpud",) if gpud_has_it and "gpud" not in entry.fatal_to else ())

    def fault(self, fault_id: str) -> Fault:
        for fault in self.faults:
            if fault.id == fault_id:
                return fault
        raise KeyError(f"no fault class {fault_id!r} in decisions/nodes/faults.yaml")

    @property
    def alerts(self) -> Tuple[str, ...]:
        return tuple(sorted({f.alert for f in self.faults if f.alert}))


@lru_cache(maxsize=None)
def load_faults(path: Path = FAULTS_PATH) -> FaultTable:
    return load_model(path, FaultTable)


def strongest(remediations) -> str:
    """The strongest of several remediations ("none" for none)."""
    return max(remediations, key=REMEDIATIONS.index, default="none")


def bundle_document(table: Optional[FaultTable] = None) -> Dict[str, Any]:
    """The table as the verifier reads it from the bundle (faults.json): standard-library JSON, no sources."""
    table = table or load_faults()
    return {
        "xids": {"replace": list(table.xids.of("xid-replace")), "fatal": list(table.xids.of("xid-fatal")),
                 "nvlink": list(table.xids.of("xid-nvlink")), "application": list(table.xids.of("xid-application")),
                 "recoveryAction": table.xids.recovery_action},
        "sxids": {"fatalWord": table.sxids.fatal_word, "nonFatalWord": table.sxids.non_fatal_word},
        "limits": table.limits.model_dump(by_alias=True),
        "faults": {f.id: {"boot": f.boot, "remediation": f.remediation, "checks": list(f.checks)}
                   for f in table.faults},
    }


def markdown_table(table: Optional[FaultTable] = None) -> List[str]:
    """The fault model as docs/node-gate.md shows it."""
    table = table or load_faults()
    rows = ["| fault | what | gate | while running | alert | remediation |", "|---|---|---|---|---|---|"]
    for f in table.faults:
        checks = "any check" if f.id == CHECK_ERROR else ", ".join(f"`{c}`" for c in f.checks)
        gate = f"{f.boot} ({checks})" if f.checks else "not checked"
        rows.append(f"| `{f.id}` | {f.what} | {gate} | {f.runtime} | {f'`{f.alert}`' if f.alert else '-'} | "
                    f"{f.remediation} |")
    return rows


def xid_markdown_table(table: Optional[FaultTable] = None) -> List[str]:
    """Every XID the table names, as docs/node-gate.md shows it: NVIDIA's resolution, the class and remediation it
    gets, what the trusted lists say, and why where one of them says the opposite."""
    table = table or load_faults()
    rows = ["| XID | what | NVIDIA's resolution | class | remediation | fatal to | the application's to | why not "
            "as a list says |", "|---|---|---|---|---|---|---|---|"]
    for entry in sorted(table.xids.catalog, key=lambda e: e.xid):
        fault = table.fault(table.xids.resolutions[entry.resolution])
        rows.append(f"| {entry.xid} | {entry.what} | {entry.resolution} | `{fault.id}` | {fault.remediation} | "
                    f"{', '.join(entry.fatal_to) or '-'} | {', '.join(entry.application_to) or '-'} | "
                    f"{' '.join((entry.why or '-').split())} |")
    return rows
