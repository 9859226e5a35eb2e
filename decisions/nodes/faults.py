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


class Xids(DataModel):
    fatal: Tuple[int, ...]
    nvlink: Tuple[int, ...]
    disputed: Tuple[int, ...]
    application: Tuple[int, ...]
    recovery_action: int = Field(alias="recoveryAction")

    @model_validator(mode="after")
    def _disjoint(self) -> "Xids":
        groups = {"fatal": self.fatal, "nvlink": self.nvlink, "disputed": self.disputed,
                  "application": self.application, "recoveryAction": (self.recovery_action,)}
        seen: Dict[int, str] = {}
        for name, xids in groups.items():
            for xid in xids:
                if xid in seen:
                    raise ValueError(f"XID {xid} is in both {seen[xid]} and {name}")
                seen[xid] = name
        return self


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
        return self

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
        "xids": {"fatal": list(table.xids.fatal), "nvlink": list(table.xids.nvlink),
                 "disputed": list(table.xids.disputed), "application": list(table.xids.application),
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
