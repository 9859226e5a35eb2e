"""userdata/gpu_verify.py, the node verifier, against a fake pynvml (tests/fake_nvml.py).

Most tests import the verifier and hand it the fake module; the CLI tests run it as a subprocess
with a `pynvml.py` stub first on PYTHONPATH and a fake `nvidia-smi` first on PATH.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from decisions.nodes.faults import bundle_document
from tests import fake_nvml as fk
from tests.conftest import ROOT, require_tool

VERIFIER = ROOT / "userdata" / "gpu_verify.py"
_spec = importlib.util.spec_from_file_location("gpu_verify", VERIFIER)
gv = importlib.util.module_from_spec(_spec)
sys.modules["gpu_verify"] = gv
_spec.loader.exec_module(gv)

NODE_CHECKS = ("nvml_init", "driver_version", "gpu_count", "nvidia_smi", "xid_kernel_log",
               "sxid_kernel_log", "xid_events")
TABLE = bundle_document()
XIDS = {group: set(TABLE["xids"][group]) for group in ("replace", "fatal", "nvlink", "application")}
GPU_CHECK_NAMES = tuple(name for name, _ in gv.GPU_CHECKS)
XID_79_LINE = ("Aug 01 10:05:00 ip-10-0-0-1 kernel: NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', "
               "name=<unknown>, GPU has fallen off the bus.")


def xid_154_line(old: int, new: int, label: str, pci: str = "0000:53:00") -> str:
    """XID 154 as the driver logs it, e.g. "... changed from 0x0 (None) to 0x2 (Node Reboot Required)"."""
    return ("Aug 01 10:05:01 ip-10-0-0-1 kernel: NVRM: Xid (PCI:%s): 154, GPU recovery action changed "
            "from 0x%x (None) to 0x%x (%s)" % (pci, old, new, label))


def xid_line(xid: int, pci: str = "0000:53:00") -> str:
    return "[  912.345678] NVRM: Xid (PCI:%s): %d, pid=4242, name=python3, Ch 00000008" % (pci, xid)


@dataclass
class Run:
    report: Dict[str, Any]
    exit_code: int
    wall_s: float
    driver: Optional[fk.FakeDriver] = None

    def find(self, name: str, gpu: Optional[int] = None) -> Dict[str, Any]:
        matches = [c for c in self.report["checks"] if c["name"] == name and c["gpu"] == gpu]
        assert len(matches) == 1, (name, gpu, self.report["checks"])
        return matches[0]

    def with_status(self, status: str) -> set:
        return {(c["name"], c["gpu"]) for c in self.report["checks"] if c["status"] == status}

    def failing_names(self) -> set:
        return {name for name, _ in self.with_status("fail")}


@pytest.fixture(scope="session")
def faults_json(tmp_path_factory) -> Path:
    """The fault table as the bundle ships it (decisions/nodes/faults.py bundle_document)."""
    path = tmp_path_factory.mktemp("faults") / "faults.json"
    path.write_text(json.dumps(bundle_document()))
    return path


@pytest.fixture(autouse=True)
def _the_bundles_fault_table(faults_json, monkeypatch):
    # The verifier reads faults.json beside itself, as in the bundle; here it is the rendered table.
    monkeypatch.setattr(gv, "DEFAULT_FAULTS_NAME", str(faults_json))


@pytest.fixture(autouse=True)
def _release_hung_calls():
    fk.reset_hangs()
    yield
    fk.release_hangs()


@pytest.fixture
def verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """Run the verifier in-process against `node`; returns the report it wrote."""
    monkeypatch.delenv("GPU_CLOUD_INSTANCE_ID", raising=False)

    def run(node: fk.NodeProfile, expect: Optional[Dict[str, Any]] = None, budget_s: float = 20.0,
            module: Any = None, kernel_log_file: bool = True) -> Run:
        expect_path = tmp_path / "expect.json"
        expect_path.write_text(json.dumps(expect if expect is not None
                                          else fk.expect_for(node.instance_type)))
        kernel_log = tmp_path / "kern.log"
        kernel_log.write_text("\n".join(node.kernel_log) + "\n")
        monkeypatch.setenv(gv.NVIDIA_SMI_ENV, str(fk.write_fake_nvidia_smi(tmp_path / "bin", node)))
        module = module if module is not None else fk.build_module(node)
        report_path = tmp_path / "out" / "verify.json"
        started = time.monotonic()
        argv = ["--expect", str(expect_path), "--report", str(report_path),
                "--budget-s", str(budget_s)]
        if kernel_log_file:
            argv += ["--kernel-log", str(kernel_log)]
        code = gv.main(argv, nvml=module)
        wall_s = time.monotonic() - started
        return Run(json.loads(report_path.read_text()), code, wall_s,
                   getattr(module, "fake_driver", None))

    return run


# ---------------------------------------------------------------------------------------------
# Healthy nodes
# ---------------------------------------------------------------------------------------------

# Checks a healthy node of each type skips: name (every GPU) or (name, gpu) -> why (in the detail).
NOT_SUPPORTED = "Not Supported"
FUNCTION_NOT_FOUND = "Function Not Found"
HEALTHY_SKIPS: Dict[str, Dict[str, Any]] = {
    # Drivers before R580 have no repair status call (every healthy profile here: R570 and R535).
    "p5.48xlarge": {"retired_pages": "remaps rows", "repair_status": FUNCTION_NOT_FOUND},
    "p4d.24xlarge": {"retired_pages": "remaps rows", "fabric": NOT_SUPPORTED,
                     "fabric_health": "see the fabric check", "repair_status": FUNCTION_NOT_FOUND},
    "g6e.48xlarge": {"retired_pages": "remaps rows", "ecc_mode": "not expected",
                     "ecc_uncorrected": NOT_SUPPORTED, "sram_ecc": NOT_SUPPORTED,
                     "nvlink": "no NVLink expected", "fabric": "no NVSwitch",
                     "fabric_health": "no NVSwitch", "mig_mode": NOT_SUPPORTED,
                     "repair_status": FUNCTION_NOT_FOUND, ("sxid_kernel_log", None): "no NVSwitch"},
    # Driver R535: no SRAM ECC status call, no recovery action field yet.
    "g4dn.12xlarge": {"remapped_rows": NOT_SUPPORTED, "ecc_mode": "not expected",
                      ("ecc_uncorrected", 2): NOT_SUPPORTED, ("ecc_uncorrected", 3): NOT_SUPPORTED,
                      ("retired_pages", 2): NOT_SUPPORTED, ("retired_pages", 3): NOT_SUPPORTED,
                      "sram_ecc": FUNCTION_NOT_FOUND, "recovery_action": NOT_SUPPORTED,
                      "nvlink": "no NVLink expected", "fabric": "no NVSwitch",
                      "fabric_health": "no NVSwitch", "mig_mode": NOT_SUPPORTED,
                      "repair_status": FUNCTION_NOT_FOUND, ("sxid_kernel_log", None): "no NVSwitch"},
}


def _expand(skips: Dict[Any, str], gpu_count: int) -> Dict[tuple, str]:
    expanded = {}
    for key, why in skips.items():
        for gpu in ([key[1]] if isinstance(key, tuple) else range(gpu_count)):
            expanded[(key if isinstance(key, str) else key[0], gpu)] = why
    return expanded


@pytest.mark.parametrize("instance_type", sorted(fk.HEALTHY_NODES))
def test_healthy_node_passes_with_unsupported_features_skipped(verify, instance_type):
    node = fk.healthy(instance_type)
    run = verify(node)

    assert run.exit_code == 0 and run.report["verdict"] == "pass", run.with_status("fail")
    assert run.with_status("fail") == set() and run.with_status("warn") == set()
    gpus = range(len(node.gpus))
    every_check = {(n, None) for n in NODE_CHECKS} | {(n, g) for n in GPU_CHECK_NAMES for g in gpus}
    assert {(c["name"], c["gpu"]) for c in run.report["checks"]} == every_check
    assert len(run.report["checks"]) == len(every_check)  # each check reported once
    expected_skips = _expand(HEALTHY_SKIPS[instance_type], len(node.gpus))
    assert run.with_status("skip") == set(expected_skips)
    for (name, gpu), why in expected_skips.items():
        assert why in run.find(name, gpu)["detail"]


def test_healthy_report_has_the_contract_shape(verify, monkeypatch):
    monkeypatch.setenv("GPU_CLOUD_INSTANCE_ID", "i-0abc1234def567890")
    run = verify(fk.healthy("p5.48xlarge"))
    report = run.report
    assert set(report) == {"verdict", "mode", "instanceType", "instanceId", "durationS", "faults",
                           "remediation", "remediations", "checks"}
    assert (report["instanceType"], report["instanceId"]) == ("p5.48xlarge", "i-0abc1234def567890")
    assert (report["mode"], report["faults"], report["remediation"]) == ("boot", [], "none")
    assert 0 <= report["durationS"] < 5
    for check in report["checks"]:
        assert set(check) == {"name", "status", "gpu", "value", "threshold", "detail", "fault"}
        assert check["status"] in ("pass", "fail", "warn", "skip") and check["fault"] is None
    assert run.find("gpu_memory", 0)["value"] == 81559
    assert run.find("nvlink", 3)["value"] == 18
    assert run.find("driver_version")["value"] == "570.133.20"


def test_uses_current_nvml_calls_not_deprecated_ones(verify):
    run = verify(fk.healthy("p5.48xlarge"))
    called = {function for function, _ in run.driver.calls}
    assert {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetSramEccErrorStatus"} <= called
    assert not called & {"nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetTemperature",
                         "nvmlDeviceGetCurrentClocksThrottleReasons"}
    assert run.driver.calls[0] == ("nvmlInit", None) and ("nvmlShutdown", None) in run.driver.calls


# ---------------------------------------------------------------------------------------------
# Injected faults: each must fail exactly the named check
# ---------------------------------------------------------------------------------------------

def gpu_set(index: int, **values: Any) -> Callable:
    def mutate(node, expect):
        for key, value in values.items():
            setattr(node.gpus[index], key, value)
    return mutate


def node_set(**values: Any) -> Callable:
    def mutate(node, expect):
        for key, value in values.items():
            setattr(node, key, value)
    return mutate


def expect_set(**values: Any) -> Callable:
    def mutate(node, expect):
        expect.update(values)
    return mutate


def drop_last_gpu(node, expect):
    node.gpus.pop()


def link_down(gpu: int, link: int) -> Callable:
    def mutate(node, expect):
        node.gpus[gpu].nvlink_active[link] = False
    return mutate


def smi_lists_one_fewer(node, expect):
    node.nvidia_smi_names = [g.name for g in node.gpus][:-1]


def gpu_faults(index: int, **faults: str) -> Callable:
    def mutate(node, expect):
        node.gpus[index].faults.update(faults)
    return mutate


FABRIC_NOT_SUPPORTED = {"nvmlDeviceGetGpuFabricInfoV": fk.NOT_SUPPORTED,
                        "nvmlDeviceGetGpuFabricInfo": fk.NOT_SUPPORTED}


FAULTS = [
    # (fault, node type, mutation, failing check, failing GPU or None for node-level/all GPUs)
    ("missing GPU", "p5.48xlarge", drop_last_gpu, "gpu_count", None),
    ("wrong model", "p5.48xlarge", gpu_set(3, name="NVIDIA A100-SXM4-80GB"), "gpu_model", 3),
    ("memory far from catalog", "p5.48xlarge", gpu_set(1, memory_total_mib=40960), "gpu_memory", 1),
    ("driver older than the branch", "p5.48xlarge", expect_set(driverBranch="R580"), "driver_version",
     None),
    ("driver not the pinned version", "p5.48xlarge", expect_set(driverVersion="570.124.06"),
     "driver_version", None),
    ("ECC disabled", "p4d.24xlarge", gpu_set(0, ecc_mode=[0, 0]), "ecc_mode", 0),
    ("uncorrected ECC", "p5.48xlarge", gpu_set(2, ecc_uncorrected_volatile=3), "ecc_uncorrected", 2),
    ("pending row remap", "p4d.24xlarge", gpu_set(1, remapped_rows=[0, 2, 1, 0]), "remapped_rows", 1),
    ("row remap failure", "p5.48xlarge", gpu_set(6, remapped_rows=[0, 0, 0, 1]), "remapped_rows", 6),
    ("pending retired pages (T4)", "g4dn.12xlarge", gpu_set(0, retired_pages_pending=1),
     "retired_pages", 0),
    ("retired-page table full (T4)", "g4dn.12xlarge", gpu_set(1, retired_pages=[40, 24]),
     "retired_pages", 1),
    ("SRAM ECC threshold exceeded", "p4d.24xlarge", gpu_set(6, sram_threshold_exceeded=True),
     "sram_ecc", 6),
    ("recovery action: GPU reset", "p5.48xlarge", gpu_set(3, recovery_action=1), "recovery_action", 3),
    ("recovery action: node reboot", "p4d.24xlarge", gpu_set(0, recovery_action=2),
     "recovery_action", 0),
    ("XID 154 to node reboot in kernel log", "p5.48xlarge",
     node_set(kernel_log=[xid_154_line(0x0, 0x2, "Node Reboot Required")]), "xid_kernel_log", None),
    ("fatal XID in kernel log", "p5.48xlarge", node_set(kernel_log=[XID_79_LINE]),
     "xid_kernel_log", None),
    ("XID event during the run", "p5.48xlarge", node_set(xid_events=[[5, 79]]), "xid_events", None),
    ("NVLink down", "p5.48xlarge", link_down(4, 7), "nvlink", 4),
    ("fabric failure", "p5.48xlarge", gpu_set(0, fabric_status=fk.real.NVML_ERROR_UNKNOWN),
     "fabric", 0),
    ("fabric state not reported by an H100", "p5.48xlarge", gpu_faults(4, **FABRIC_NOT_SUPPORTED),
     "fabric", 4),
    ("fabric route unhealthy", "p5.48xlarge", gpu_set(5, fabric_health_mask=0x10), "fabric_health", 5),
    ("fabric incorrectly configured", "p5.48xlarge",
     gpu_set(1, fabric_health_mask=fk.FABRIC_HEALTH_HEALTHY | 5 << 8), "fabric_health", 1),
    ("NVLink state not reported by an H100", "p5.48xlarge",
     gpu_faults(2, nvmlDeviceGetNvLinkState=fk.NOT_SUPPORTED), "nvlink", 2),
    ("PCIe x8 on x16", "g6e.48xlarge", gpu_set(5, pcie_width=8), "pcie_width", 5),
    ("HW slowdown", "p5.48xlarge", gpu_set(2, clock_event_reasons=0x8 | 0x1), "clock_events", 2),
    ("HW thermal slowdown", "p5.48xlarge", gpu_set(2, clock_event_reasons=0x40), "clock_events", 2),
    ("HW power brake", "p4d.24xlarge", gpu_set(2, clock_event_reasons=0x80), "clock_events", 2),
    ("power capped below 90 % of default", "p5.48xlarge", gpu_set(2, power_limit_mw=500000),
     "power_limit", 2),
    ("over temperature", "p5.48xlarge", gpu_set(7, temperature_c=91), "temperature", 7),
    ("persistence off", "p5.48xlarge", gpu_set(0, persistence_mode=0), "persistence_mode", 0),
    ("MIG mismatch (pending differs)", "p5.48xlarge", gpu_set(3, mig_mode=[0, 1]), "mig_mode", 3),
    ("MIG expected on GPUs without MIG", "g6e.48xlarge", expect_set(migMode="enabled"),
     "mig_mode", None),
    ("stray compute process", "p4d.24xlarge", gpu_set(2, processes=[[4242, 1024]]),
     "compute_processes", 2),
    ("nvidia-smi disagrees with NVML", "p5.48xlarge", smi_lists_one_fewer, "nvidia_smi", None),
    ("nvidia-smi fails", "p5.48xlarge", node_set(nvidia_smi_exit_code=9), "nvidia_smi", None),
]


@pytest.mark.parametrize("instance_type, mutate, check, gpu",
                         [pytest.param(*row[1:], id=row[0]) for row in FAULTS])
def test_fault_fails_the_right_check(verify, instance_type, mutate, check, gpu):
    node, expect = fk.healthy(instance_type), fk.expect_for(instance_type)
    mutate(node, expect)
    run = verify(node, expect)

    assert run.exit_code == 1 and run.report["verdict"] == "fail"
    assert run.failing_names() == {check}
    if gpu is not None:
        assert run.with_status("fail") == {(check, gpu)}
    for name, index in run.with_status("fail"):
        assert run.find(name, index)["detail"], "a failure must say why"


def test_sram_ecc_status_refused_to_a_non_root_run_fails_saying_so(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[0].faults["nvmlDeviceGetSramEccErrorStatus"] = "NoPermission"
    run = verify(node)
    assert run.with_status("fail") == {("sram_ecc", 0)}
    assert "nvmlDeviceGetSramEccErrorStatus needs root" in run.find("sram_ecc", 0)["detail"]


def test_fabric_still_training_at_boot_is_waited_for(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[0].fabric_in_progress_polls = 2
    run = verify(node)
    assert run.report["verdict"] == "pass"
    assert run.find("fabric", 0)["value"] == {"state": "completed", "status": 0}


def test_fabric_that_never_completes_fails(verify, monkeypatch):
    monkeypatch.setattr(gv, "FABRIC_SETTLE_S", 0.3)
    node = fk.healthy("p5.48xlarge")
    node.gpus[2].fabric_state = fk.real.NVML_GPU_FABRIC_STATE_NOT_STARTED
    run = verify(node)
    assert run.with_status("fail") == {("fabric", 2)}
    assert "not started" in run.find("fabric", 2)["detail"]


def test_fabric_settle_wait_is_one_deadline_for_all_gpus(verify, monkeypatch):
    # Eight GPUs whose fabric never leaves "in progress": one settle period in all, not eight.
    settle_s = 1.0
    monkeypatch.setattr(gv, "FABRIC_SETTLE_S", settle_s)
    node = fk.healthy("p5.48xlarge")
    for gpu in node.gpus:
        gpu.fabric_state = fk.real.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    run = verify(node, budget_s=30.0)
    assert run.with_status("fail") == {("fabric", g) for g in range(8)}
    assert all("in progress" in run.find("fabric", g)["detail"] for g in range(8))
    assert run.wall_s < 2 * settle_s


def test_gpus_still_training_are_polled_together_until_each_completes(verify):
    node = fk.healthy("p5.48xlarge")
    for index, gpu in enumerate(node.gpus):
        gpu.fabric_in_progress_polls = index % 3 + 1
    run = verify(node)
    assert run.report["verdict"] == "pass"
    polls = [gpu for name, gpu in run.driver.calls if name == "nvmlDeviceGetGpuFabricInfoV"]
    # Every GPU is read once per round until it completes: rounds of 8, 8, 5 and 2 GPUs.
    assert polls == list(range(8)) * 2 + [1, 2, 4, 5, 7] + [2, 5]


# ---------------------------------------------------------------------------------------------
# XIDs
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("xids, status, counted, fault", [
    ([79], "fail", [79], "xid-replace"),           # fallen off the bus: RESTART_BM
    ([54], "fail", [54], "xid-replace"),           # auxiliary power: CHECK_MECHANICALS
    ([142], "fail", [142], "xid-replace"),         # CONTACT_SUPPORT
    ([48], "fail", [48], "xid-fatal"),             # double-bit ECC: reset, then the SRAM threshold decides
    ([109], "fail", [109], "xid-fatal"),           # RESET_GPU, though the device plugin blames the application
    ([69], "pass", [], None),                      # RESTART_APP, though Azure calls it fatal
    ([80], "pass", [], None),                      # RESTART_APP
    ([92], "pass", [], None),                      # IGNORE, though Azure calls it fatal
    ([68], "pass", [], None),                      # RESTART_APP
    ([13, 31, 43, 45], "pass", [], None),          # the application's: not counted
    ([2000], "warn", [2000], "xid-unknown"),       # in no catalog entry
    ([13, 94, 2000], "warn", [2000], "xid-unknown"),
    ([13, 68, 79, 79], "fail", [79], "xid-replace"),
    ([48, 79], "fail", [48, 79], "xid-replace"),   # the strongest class names the outcome: replace over reboot
    ([94, 109], "fail", [109], "xid-fatal"),
])
def test_kernel_log_xids_are_classified_by_nvidias_catalog(verify, xids, status, counted, fault):
    node = fk.healthy("p4d.24xlarge")
    node.kernel_log += [xid_line(x) for x in xids]
    run = verify(node)
    check = run.find("xid_kernel_log")
    assert (check["status"], check["value"], check["fault"]) == (status, counted, fault)
    assert run.report["verdict"] == ("fail" if status == "fail" else "pass")
    if fault:
        assert run.report["remediations"][fault] == TABLE["faults"][fault]["remediation"]
    for unknown in set(xids) - set().union(*XIDS.values()):
        assert "XID %d on PCI:0000:53:00" % unknown in check["detail"]
        assert "not in the fault table's XID catalog" in check["detail"]
    if set(xids) & XIDS["application"]:
        assert "not counted: XID" in check["detail"] and "the application's" in check["detail"]


@pytest.mark.parametrize("lines, status, detail", [
    pytest.param([xid_154_line(0x0, 0x2, "Node Reboot Required")], "fail", "node reboot (2)",
                 id="to node reboot"),
    pytest.param([xid_154_line(0x0, 0x1, "GPU Reset Required")], "fail", "GPU reset (1)",
                 id="to GPU reset"),
    pytest.param([xid_154_line(0x0, 0x2, "OS Reboot")], "fail", "node reboot (2)",
                 id="label varies by driver, the number decides"),
    pytest.param([xid_154_line(0x1, 0x0, "None")], "pass", "back to none", id="back to none"),
    pytest.param(["NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed"], "fail",
                 "unreadable", id="new action unreadable"),
])
def test_xid_154_fails_unless_the_new_recovery_action_is_none(verify, lines, status, detail):
    node = fk.healthy("p5.48xlarge")
    node.kernel_log += lines
    run = verify(node)
    check = run.find("xid_kernel_log")
    assert check["status"] == status and detail in check["detail"], check
    assert check["value"] == ([154] if status == "fail" else [])
    assert run.failing_names() == ({"xid_kernel_log"} if status == "fail" else set())


@pytest.mark.parametrize("action_now, status", [(2, "fail"), (0, "pass")])
def test_xid_154_event_during_the_run_reads_the_recovery_action(verify, action_now, status):
    node = fk.healthy("p5.48xlarge")
    node.xid_events = [[3, 154]]
    node.gpus[3].recovery_action = action_now
    run = verify(node)
    assert run.find("xid_events")["status"] == status
    assert run.find("recovery_action", 3)["status"] == status
    if status == "fail":
        assert "node reboot (2) on GPU 3" in run.find("xid_events")["detail"]


def test_unknown_xid_event_during_the_run_warns_with_its_number(verify):
    node = fk.healthy("p5.48xlarge")
    node.xid_events = [[6, 2000]]
    run = verify(node)
    check = run.find("xid_events")
    assert (check["status"], check["value"]) == ("warn", [2000]) and "XID 2000 on GPU 6" in check["detail"]
    assert run.report["verdict"] == "pass"


def test_xid_events_during_the_run_follow_nvidias_resolution(verify):
    """XID 109 (RESET_GPU) fails the node for a reboot; 68 (RESTART_APP) is only named, the application's."""
    node = fk.healthy("p5.48xlarge")
    node.xid_events = [[2, 68], [3, 13], [5, 109]]
    run = verify(node)
    check = run.find("xid_events")
    assert (check["status"], check["value"], check["fault"]) == ("fail", [109], "xid-fatal")
    assert run.report["remediation"] == "reboot" and "GPU 5" in check["detail"]
    assert "not counted: XID 13, 68" in check["detail"]
    node.xid_events = [[2, 68]]
    check = verify(node).find("xid_events")
    assert (check["status"], check["value"]) == ("pass", [])


def test_unreadable_kernel_log_file_fails(tmp_path):
    node = fk.healthy("p5.48xlarge")
    module = fk.build_module(node)
    (tmp_path / "expect.json").write_text(json.dumps(fk.expect_for("p5.48xlarge")))
    args = gv.parse_args(["--expect", str(tmp_path / "expect.json"), "--report",
                          str(tmp_path / "r.json"), "--kernel-log", str(tmp_path / "missing.log")])
    report = gv.verify(args, module)
    check = [c for c in report["checks"] if c["name"] == "xid_kernel_log"][0]
    assert check["status"] == "fail" and "missing.log" in check["detail"]


def fake_commands(directory: Path, scripts: Dict[str, str]) -> str:
    """Write executable shell scripts into `directory`; returns a PATH that finds them first."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (directory / name).write_text("#!/bin/sh\n" + body)
        (directory / name).chmod(0o755)
    return os.pathsep.join([str(directory), "/usr/bin", "/bin"])


def prints(text: str, exit_code: int = 0) -> str:
    return "cat <<'EOF'\n%s\nEOF\nexit %d\n" % (text, exit_code)


NO_JOURNAL = prints("No journal files were found.\n-- No entries --")  # and exit 0


@pytest.mark.parametrize("scripts, status, source", [
    pytest.param({"journalctl": prints(XID_79_LINE), "dmesg": prints("", 1)}, "fail",
                 "journalctl", id="journalctl has the XID"),
    pytest.param({"journalctl": NO_JOURNAL, "dmesg": prints(xid_line(79))}, "fail", "dmesg",
                 id="empty journal falls back to dmesg"),
    pytest.param({"journalctl": prints("", 1), "dmesg": prints("[    0.000000] Linux version 6.1")},
                 "pass", "dmesg", id="journalctl fails, dmesg clean"),
])
def test_default_kernel_log_sources(verify, tmp_path, monkeypatch, scripts, status, source):
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "kernel-log-bin", scripts))
    run = verify(fk.healthy("p5.48xlarge"), kernel_log_file=False)
    check = run.find("xid_kernel_log")
    assert check["status"] == status and source in check["detail"]


@pytest.mark.parametrize("dmesg, status", [
    pytest.param(prints(xid_line(79)), "fail", id="dmesg has the XID"),
    pytest.param(prints("[    0.000000] Linux version 6.1"), "pass", id="dmesg clean"),
])
def test_hung_journalctl_hands_over_to_dmesg(verify, tmp_path, monkeypatch, dmesg, status):
    budget_s = 4.0
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "kernel-log-bin",
                                             {"journalctl": "exec sleep 30\n", "dmesg": dmesg}))
    run = verify(fk.healthy("p5.48xlarge"), kernel_log_file=False, budget_s=budget_s)
    check = run.find("xid_kernel_log")
    assert check["status"] == status, check
    assert "in dmesg since boot (journalctl timed out after" in check["detail"]
    assert run.failing_names() == ({"xid_kernel_log"} if status == "fail" else set())
    assert run.wall_s < budget_s


NO_KERNEL_LOG = {"journalctl": NO_JOURNAL, "dmesg": prints("dmesg: read kernel buffer failed", 1)}


def recovery_not_reported_by(*gpus: int) -> Callable:
    def mutate(node):
        for index in gpus:
            node.gpus[index].recovery_action = None
    return mutate


@pytest.mark.parametrize("instance_type, mutate, status, detail", [
    pytest.param("p5.48xlarge", None, "warn", "passed on every GPU", id="recovery action vouches"),
    pytest.param("p5.48xlarge", recovery_not_reported_by(5), "fail", "did not pass on GPU 5 (skip)",
                 id="one GPU does not report its recovery action"),
    pytest.param("p5.48xlarge", lambda node: setattr(node.gpus[1], "recovery_action", 1), "fail",
                 "did not pass on GPU 1 (fail)", id="one GPU needs a reset"),
    pytest.param("g4dn.12xlarge", None, "fail", "GPU 0 (skip), GPU 1 (skip)",
                 id="driver without the recovery action"),
])
def test_no_kernel_log_fails_unless_the_recovery_action_vouches(verify, tmp_path, monkeypatch,
                                                                instance_type, mutate, status, detail):
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "kernel-log-bin", NO_KERNEL_LOG))
    node = fk.healthy(instance_type)
    if mutate:
        mutate(node)
    run = verify(node, kernel_log_file=False)
    check = run.find("xid_kernel_log")
    assert check["status"] == status and detail in check["detail"], check
    assert "journalctl returned no entries; dmesg exited 1" in check["detail"]
    assert "XIDs raised since boot cannot be seen" in check["detail"]


# ---------------------------------------------------------------------------------------------
# NotSupported / FunctionNotFound: always skip
# ---------------------------------------------------------------------------------------------

def _drop_binding_functions(*names: str) -> Callable:
    def alter(module):
        for name in names:
            delattr(module, name)
    return alter


def _on_every_gpu(**values: Any) -> Callable:
    def mutate(node):
        for gpu in node.gpus:
            for key, value in values.items():
                setattr(gpu, key, value)
    return mutate


def _faults_on_every_gpu(**faults: str) -> Callable:
    def mutate(node):
        for gpu in node.gpus:
            gpu.faults.update(faults)
    return mutate


@pytest.mark.parametrize("mutate, alter_module, check, why", [
    pytest.param(_faults_on_every_gpu(nvmlDeviceGetTemperatureV=fk.NOT_SUPPORTED), None,
                 "temperature", NOT_SUPPORTED, id="temperature not supported"),
    pytest.param(None, _drop_binding_functions("nvmlDeviceGetCurrentClocksEventReasons",
                                               "nvmlDeviceGetCurrentClocksThrottleReasons"),
                 "clock_events", FUNCTION_NOT_FOUND, id="neither clock reasons name in the binding"),
    pytest.param(_faults_on_every_gpu(nvmlDeviceGetComputeRunningProcesses=fk.FUNCTION_NOT_FOUND),
                 None, "compute_processes", FUNCTION_NOT_FOUND, id="process list not found"),
    pytest.param(_faults_on_every_gpu(nvmlDeviceGetSramEccErrorStatus=fk.NOT_SUPPORTED), None,
                 "sram_ecc", NOT_SUPPORTED, id="SRAM ECC status not supported"),
    pytest.param(_on_every_gpu(recovery_action=None), None, "recovery_action",
                 "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): " + NOT_SUPPORTED,
                 id="recovery action field not supported"),
    pytest.param(_faults_on_every_gpu(nvmlDeviceGetEnforcedPowerLimit=fk.NOT_SUPPORTED), None,
                 "power_limit", NOT_SUPPORTED, id="power limit not supported"),
])
def test_unsupported_call_skips_never_passes_or_fails(verify, mutate, alter_module, check, why):
    node = fk.healthy("p5.48xlarge")
    if mutate:
        mutate(node)
    module = fk.build_module(node)
    if alter_module:
        alter_module(module)
    run = verify(node, module=module)
    for gpu in range(len(node.gpus)):
        result = run.find(check, gpu)
        assert result["status"] == "skip" and why in result["detail"] and result["value"] is None
    assert run.report["verdict"] == "pass"


@pytest.mark.parametrize("instance_type, expect_changes, mutate, check, why", [
    pytest.param("p5.48xlarge", {}, _faults_on_every_gpu(nvmlDeviceGetNvLinkState=fk.NOT_SUPPORTED),
                 "nvlink", "H100 18 NVLinks per GPU, but NVML reports none", id="NVLink on an H100"),
    pytest.param("g6e.48xlarge", {"nvlinkLinksPerGpu": 18}, None, "nvlink", "reports none",
                 id="NVLink promised, PCIe card answers NotSupported"),
    pytest.param("p5.48xlarge", {}, _faults_on_every_gpu(**FABRIC_NOT_SUPPORTED), "fabric",
                 "H100 on an NVSwitch board reports its GPU fabric state, but this GPU does not",
                 id="fabric on an H100, both calls"),
    pytest.param("p5.48xlarge", {},
                 _on_every_gpu(fabric_state=fk.real.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED), "fabric",
                 "nvmlDeviceGetGpuFabricInfoV: state not supported", id="fabric state not supported"),
])
def test_feature_the_catalog_promises_fails_when_nvml_does_not_report_it(
        verify, instance_type, expect_changes, mutate, check, why):
    node, expect = fk.healthy(instance_type), fk.expect_for(instance_type)
    expect.update(expect_changes)
    if mutate:
        mutate(node)
    run = verify(node, expect)
    assert run.failing_names() == {check}
    for gpu in range(len(node.gpus)):
        assert why in run.find(check, gpu)["detail"]
        if check == "fabric":  # nothing to judge the health of: said once, by the fabric check
            assert run.find("fabric_health", gpu)["status"] == "skip"


def test_fabric_missing_from_both_names_of_the_driver_fails_an_h100(verify):
    node = fk.healthy("p5.48xlarge")
    node.faults.update({"nvmlDeviceGetGpuFabricInfoV": fk.FUNCTION_NOT_FOUND,
                        "nvmlDeviceGetGpuFabricInfo": fk.FUNCTION_NOT_FOUND})
    run = verify(node)
    assert run.with_status("fail") == {("fabric", g) for g in range(8)}
    assert FUNCTION_NOT_FOUND in run.find("fabric", 0)["detail"]


# ---------------------------------------------------------------------------------------------
# Older drivers: the older name of a call before any skip
# ---------------------------------------------------------------------------------------------

R525 = "525.147.05"  # an H100 driver before nvmlDeviceGetGpuFabricInfoV and ClocksEventReasons


def test_older_driver_is_checked_through_the_older_names(verify):
    node = fk.healthy("p5.48xlarge")
    node.driver_version = R525
    run = verify(node)
    assert run.report["verdict"] == "pass" and run.with_status("fail") == set()
    called = [name for name, _ in run.driver.calls]
    # The V call is tried once; the driver lacks it, so every GPU is read by the older name.
    assert called.count("nvmlDeviceGetGpuFabricInfoV") == 1
    assert called.count("nvmlDeviceGetGpuFabricInfo") == 8
    assert called.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 8
    for gpu in range(8):
        assert run.find("fabric", gpu)["status"] == "pass"
        assert "from nvmlDeviceGetGpuFabricInfo" in run.find("fabric", gpu)["detail"]
        assert run.find("clock_events", gpu)["status"] == "pass"
        assert "reports no health mask" in run.find("fabric_health", gpu)["detail"]
        assert FUNCTION_NOT_FOUND in run.find("sram_ecc", gpu)["detail"]
        assert NOT_SUPPORTED in run.find("recovery_action", gpu)["detail"]
        for name in ("fabric_health", "sram_ecc", "recovery_action"):
            assert run.find(name, gpu)["status"] == "skip"


@pytest.mark.parametrize("mutate, check", [
    pytest.param(gpu_set(3, clock_event_reasons=0x40), "clock_events", id="HW thermal, older name"),
    pytest.param(gpu_set(4, fabric_state=fk.real.NVML_GPU_FABRIC_STATE_NOT_STARTED), "fabric",
                 id="fabric not started, older name"),
])
def test_older_names_carry_the_same_faults(verify, monkeypatch, mutate, check):
    monkeypatch.setattr(gv, "FABRIC_SETTLE_S", 0.3)
    node, expect = fk.healthy("p5.48xlarge"), fk.expect_for("p5.48xlarge")
    node.driver_version = R525
    mutate(node, expect)
    run = verify(node, expect)
    assert run.failing_names() == {check}


def test_binding_without_the_new_clock_reasons_name_uses_the_older_one(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[6].clock_event_reasons = 0x8
    module = fk.build_module(node)
    _drop_binding_functions("nvmlDeviceGetCurrentClocksEventReasons")(module)
    run = verify(node, module=module)
    assert run.with_status("fail") == {("clock_events", 6)}
    assert run.find("clock_events", 0)["status"] == "pass"


def test_temperature_falls_back_only_when_v_call_is_missing(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[1].faults["nvmlDeviceGetTemperatureV"] = fk.FUNCTION_NOT_FOUND
    node.gpus[1].temperature_c = 90
    run = verify(node)
    assert run.with_status("fail") == {("temperature", 1)}
    assert run.find("temperature", 1)["value"] == 90
    legacy_calls = [gpu for name, gpu in run.driver.calls if name == "nvmlDeviceGetTemperature"]
    assert legacy_calls == [1]


# ---------------------------------------------------------------------------------------------
# Hangs, budget, unexpected errors, could-not-run
# ---------------------------------------------------------------------------------------------

def test_one_hung_call_fails_that_gpu_and_the_rest_is_still_checked(verify):
    budget_s = 3.0
    node = fk.healthy("p5.48xlarge")
    node.gpus[4].faults["nvmlDeviceGetCurrPcieLinkWidth"] = fk.HANG
    run = verify(node, budget_s=budget_s)

    assert run.exit_code == 1 and run.report["verdict"] == "fail"
    assert "timed out after" in run.find("pcie_width", 4)["detail"]
    later = GPU_CHECK_NAMES[GPU_CHECK_NAMES.index("pcie_width") + 1:]
    assert run.with_status("fail") == {("pcie_width", 4)} | {(n, 4) for n in later}
    assert all("not run" in run.find(n, 4)["detail"] for n in later)
    assert run.find("xid_events")["status"] == "pass"
    assert run.wall_s < budget_s + 1.0


def test_hangs_everywhere_still_give_a_verdict_within_the_budget(verify):
    budget_s = 3.0
    node = fk.healthy("p5.48xlarge")
    for gpu in node.gpus:
        gpu.faults["nvmlDeviceGetPersistenceMode"] = fk.HANG
    run = verify(node, budget_s=budget_s)

    assert run.exit_code == 1 and run.report["verdict"] == "fail"
    assert run.wall_s < budget_s + 1.0
    details = [c["detail"] for c in run.report["checks"] if c["status"] == "fail"]
    assert any("timed out after" in d for d in details)
    assert any(d == "budget exhausted" for d in details)
    assert run.find("xid_events")["detail"] == "budget exhausted"


def test_hung_nvidia_smi_fails_its_check_within_the_budget(verify):
    budget_s = 3.0
    node = fk.healthy("p5.48xlarge")
    node.nvidia_smi_hangs = True
    run = verify(node, budget_s=budget_s)
    assert run.with_status("fail") == {("nvidia_smi", None)}
    assert "nvidia-smi timed out after" in run.find("nvidia_smi")["detail"]
    assert run.wall_s < budget_s


def test_unexpected_exception_fails_the_check_with_its_text(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[1].faults["nvmlDeviceGetPersistenceMode"] = fk.RAISE_PREFIX + "driver returned garbage"
    run = verify(node)
    assert run.exit_code == 1 and run.with_status("fail") == {("persistence_mode", 1)}
    assert "driver returned garbage" in run.find("persistence_mode", 1)["detail"]


def test_nvml_init_failure_is_an_error_with_a_report(verify):
    node = fk.healthy("p5.48xlarge")
    node.faults["nvmlInit"] = "DriverNotLoaded"
    run = verify(node)
    assert run.exit_code == 2 and run.report["verdict"] == "error"
    assert run.find("nvml_init")["status"] == "fail"
    assert "Driver Not Loaded" in run.find("nvml_init")["detail"]


def test_missing_pynvml_is_an_error_with_a_report(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    (tmp_path / "expect.json").write_text(json.dumps(fk.expect_for("p5.48xlarge")))
    report_path = tmp_path / "verify.json"
    code = gv.main(["--expect", str(tmp_path / "expect.json"), "--report", str(report_path)])
    report = json.loads(report_path.read_text())
    assert code == 2 and report["verdict"] == "error"
    assert [c["name"] for c in report["checks"]] == ["pynvml_import"]


def _without(key: str) -> Dict[str, Any]:
    expect = fk.expect_for("p5.48xlarge")
    del expect[key]
    return expect


@pytest.mark.parametrize("content, complaint", [
    pytest.param(None, "cannot read", id="missing file"),
    pytest.param("{not json", "cannot read", id="not JSON"),
    pytest.param(json.dumps(_without("gpuCount")), "missing gpuCount", id="missing key"),
    pytest.param(json.dumps(dict(fk.expect_for("p5.48xlarge"), gpuModel="H100 SXM")), "gpuModel",
                 id="unknown model"),
    pytest.param(json.dumps(dict(fk.expect_for("p5.48xlarge"), migMode="on")), "migMode",
                 id="bad migMode"),
    pytest.param(json.dumps(dict(fk.expect_for("p5.48xlarge"), gpuCount="8")), "gpuCount",
                 id="count as string"),
    pytest.param(json.dumps(dict(fk.expect_for("p5.48xlarge"), driverBranch="latest")),
                 "driverBranch", id="bad driver branch"),
])
def test_bad_expect_is_an_error(tmp_path, content, complaint):
    expect_path = tmp_path / "expect.json"
    if content is not None:
        expect_path.write_text(content)
    report_path = tmp_path / "verify.json"
    module = fk.build_module(fk.healthy("p5.48xlarge"))
    code = gv.main(["--expect", str(expect_path), "--report", str(report_path)], nvml=module)
    report = json.loads(report_path.read_text())
    assert code == 2 and report["verdict"] == "error"
    assert report["checks"][0]["name"] == "expect" and complaint in report["checks"][0]["detail"]
    assert module.fake_driver.calls == []  # nothing touched NVML


# ---------------------------------------------------------------------------------------------
# Small pieces
# ---------------------------------------------------------------------------------------------

# nvmlDeviceGpuRecoveryAction_t in nvml.h: the binding's constant name -> the verifier's name.
RECOVERY_ACTIONS = [("NVML_GPU_RECOVERY_ACTION_NONE", "none"),
                    ("NVML_GPU_RECOVERY_ACTION_GPU_RESET", "GPU reset"),
                    ("NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", "node reboot"),
                    ("NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", "drain P2P"),
                    ("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", "drain P2P and reset GPU"),
                    ("NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN", "recover IMEX domain"),
                    ("NVML_GPU_RECOVERY_ACTION_BUS_RESET", "PCIe bus reset"),
                    ("NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", "system reboot")]


@pytest.mark.parametrize("constant, name", RECOVERY_ACTIONS)
def test_recovery_action_names_follow_nvml(constant, name):
    assert gv.RECOVERY_ACTION_NAMES[getattr(fk.real, constant)] == name


def test_recovery_action_table_is_complete_and_none_is_zero():
    binding = {getattr(fk.real, key) for key in vars(fk.real) if key.startswith("NVML_GPU_RECOVERY_ACTION_")}
    assert set(gv.RECOVERY_ACTION_NAMES) == binding == set(range(len(RECOVERY_ACTIONS)))
    assert gv.RECOVERY_ACTION_NONE == fk.real.NVML_GPU_RECOVERY_ACTION_NONE


@pytest.mark.parametrize("action", range(len(RECOVERY_ACTIONS)))
def test_recovery_action_other_than_none_fails_at_the_boundary(verify, action):
    node = fk.healthy("p5.48xlarge")
    node.gpus[2].recovery_action = action
    run = verify(node)
    check = run.find("recovery_action", 2)
    assert check["status"] == ("pass" if action == 0 else "fail")
    assert check["value"] == "%s (%d)" % (gv.RECOVERY_ACTION_NAMES[action], action)


# (EKS agent name, NVML sub-field, shift, width, unhealthy values)
FABRIC_HEALTH = [
    ("degraded_bw", "DEGRADED_BW", 0, 0x3, {1}),
    ("route_recovery", "ROUTE_RECOVERY", 2, 0x3, {1}),
    ("route_unhealthy", "ROUTE_UNHEALTHY", 4, 0x3, {1}),
    ("access_timeout_recovery", "ACCESS_TIMEOUT_RECOVERY", 6, 0x3, {1}),
    ("incorrect_configuration", "INCORRECT_CONFIGURATION", 8, 0xF, set(range(2, 16))),
]


@pytest.mark.parametrize("name, nvml_name, shift, width, unhealthy", FABRIC_HEALTH)
def test_fabric_health_fields_follow_the_eks_agent_and_nvml(name, nvml_name, shift, width, unhealthy):
    table = {entry[0]: entry[1:] for entry in gv.FABRIC_HEALTH_FIELDS}
    assert table[name] == (shift, width, frozenset(unhealthy))
    assert getattr(fk.real, "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_" + nvml_name) == shift
    assert getattr(fk.real, "NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_" + nvml_name) == width
    if nvml_name == "INCORRECT_CONFIGURATION":  # 1 is "none"; every value above names a fault
        assert fk.real.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE == 1
        assert min(unhealthy) == fk.real.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INCORRECT_SYSGUID
    else:  # only TRUE is the fault; NOT_SUPPORTED and FALSE are healthy
        assert unhealthy == {getattr(fk.real, "NVML_GPU_FABRIC_HEALTH_MASK_%s_TRUE" % nvml_name)}
        assert getattr(fk.real, "NVML_GPU_FABRIC_HEALTH_MASK_%s_FALSE" % nvml_name) not in unhealthy


def test_fabric_health_judges_only_the_agents_sub_fields():
    assert [entry[0] for entry in gv.FABRIC_HEALTH_FIELDS] == [entry[0] for entry in FABRIC_HEALTH]


@pytest.mark.parametrize("mask, unhealthy", [
    (0x0, []),                                   # EKS agent: zero is healthy
    (0x80, []),                                  # EKS agent: access_timeout_recovery false, healthy
    (0x10, ["route_unhealthy=1"]),               # EKS agent test vector
    (0x11, ["degraded_bw=1", "route_unhealthy=1"]),
    (0x2 | 0x2 << 2 | 0x2 << 4 | 0x2 << 6 | 0x1 << 8, []),  # every flag false, configuration none
    (0x3, []),                                   # a value NVML does not define is no fault
    (0x1 << 2, ["route_recovery=1"]),
    (0x1 << 6, ["access_timeout_recovery=1"]),
    (0x1 << 8, []),                              # incorrect configuration: none
    (0x2 << 8, ["incorrect_configuration=2"]),   # the lowest incorrect configuration
    (0xF << 8, ["incorrect_configuration=15"]),
    (0x1 << 12 | 0x2 << 14, []),                 # partition assigned, GFM state: not judged
])
def test_fabric_health_mask_decodes_at_the_boundaries(verify, mask, unhealthy):
    node = fk.healthy("p5.48xlarge")
    node.gpus[7].fabric_health_mask = mask
    run = verify(node)
    check = run.find("fabric_health", 7)
    assert check["status"] == ("fail" if unhealthy else "pass"), check
    assert check["value"]["mask"] == "0x%x" % mask
    for fault in unhealthy:
        assert fault in check["detail"]


@pytest.mark.parametrize("bit, event_name, throttle_name", [
    (0x8, "HwSlowdown", "HwSlowdown"),
    (0x40, "HwThermalSlowdown", "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown", "HwPowerBrakeSlowdown"),
])
def test_hardware_clock_reasons_are_the_same_bits_under_both_names(bit, event_name, throttle_name):
    assert bit in dict(gv.HW_CLOCK_EVENT_REASONS)
    assert getattr(fk.real, "nvmlClocksEventReason" + event_name) == bit
    assert getattr(fk.real, "nvmlClocksThrottleReason" + throttle_name) == bit


def test_software_thermal_slowdown_bit_under_both_names():
    assert gv.SW_THERMAL_SLOWDOWN == fk.real.nvmlClocksEventReasonSwThermalSlowdown
    assert gv.SW_THERMAL_SLOWDOWN == fk.real.nvmlClocksThrottleReasonSwThermalSlowdown


def test_software_thermal_slowdown_warns(verify):
    node = fk.healthy("p5.48xlarge")
    node.gpus[2].clock_event_reasons = 0x20 | 0x1
    run = verify(node)
    assert run.with_status("warn") == {("clock_events", 2)} and run.report["verdict"] == "pass"
    assert "SW thermal slowdown" in run.find("clock_events", 2)["detail"]


@pytest.mark.parametrize("value_type, member", [
    ("DOUBLE", "dVal"), ("UNSIGNED_INT", "uiVal"), ("UNSIGNED_LONG", "ulVal"),
    ("UNSIGNED_LONG_LONG", "ullVal"), ("SIGNED_LONG_LONG", "sllVal"), ("SIGNED_INT", "siVal"),
    ("UNSIGNED_SHORT", "usVal"),
])
def test_field_value_members_follow_nvml(value_type, member):
    value_type_id = getattr(fk.real, "NVML_VALUE_TYPE_" + value_type)
    assert gv.FIELD_VALUE_MEMBERS[value_type_id] == member
    assert member in dict(fk.real.c_nvmlValue_t._fields_)


def test_gpu_fabric_models_are_the_catalogs_hopper_and_later_nvswitch_gpus():
    import yaml

    gpus = yaml.safe_load((ROOT / "decisions" / "catalog" / "catalog.yaml").read_text())["gpus"]
    assert gv.GPU_FABRIC_MODELS == {model for model, gpu in gpus.items()
                                    if gpu["nvswitch"] and gpu["architecture"] in ("hopper", "blackwell")}


@pytest.mark.parametrize("enforced_mw, status", [
    (750000, "pass"),      # above the default
    (700000, "pass"),      # at the default
    (699999, "warn"),      # just below it
    (630000, "warn"),      # exactly 90 % of the default: still only a warning
    (629999, "fail"),      # below 90 %
])
def test_power_limit_boundaries(verify, enforced_mw, status):
    node = fk.healthy("p5.48xlarge")
    node.gpus[0].power_limit_mw = enforced_mw
    run = verify(node)
    check = run.find("power_limit", 0)
    assert check["status"] == status, check
    assert check["value"] == {"enforcedW": enforced_mw / 1000.0, "defaultW": 700.0}
    assert run.report["verdict"] == ("fail" if status == "fail" else "pass")


@pytest.mark.parametrize("retired, status", [([0, 0], "pass"), ([62, 0], "pass"), ([31, 31], "pass"),
                                             ([63, 0], "fail"), ([0, 63], "fail"), ([40, 23], "fail")])
def test_retired_pages_fail_at_dcgms_63(verify, retired, status):
    node = fk.healthy("g4dn.12xlarge")
    node.gpus[0].retired_pages = retired
    run = verify(node)
    check = run.find("retired_pages", 0)
    assert check["status"] == status and check["value"] == {"pending": False, "retired": sum(retired)}
    assert check["fault"] == (None if status == "pass" else "retired-pages-limit")



@pytest.mark.parametrize("nvml_name, short_name", [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA A10", None),
])
def test_gpu_names_map_to_catalog_models(nvml_name, short_name):
    assert gv.classify_gpu_name(nvml_name) == short_name


@pytest.mark.parametrize("branch, number", [(550, 550), ("550", 550), ("R550", 550), ("r525", 525)])
def test_driver_branch_forms(branch, number):
    assert gv.parse_driver_branch(branch) == number


def test_verifier_runs_on_python_39_with_stdlib_and_pynvml_only():
    # AL2023 nodes run python3.9: no newer syntax, no third-party imports beyond pynvml.
    tree = ast.parse(VERIFIER.read_text(), feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"pynvml"}


# ---------------------------------------------------------------------------------------------
# The CLI, as the bootstrap script runs it
# ---------------------------------------------------------------------------------------------

def run_cli(tmp_path: Path, node: fk.NodeProfile, expect: Any, textfile: bool = True,
            budget_s: float = 20.0, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    fk.write_pynvml_stub(tmp_path / "stub", node)
    bin_dir = tmp_path / "bin"
    fk.write_fake_nvidia_smi(bin_dir, node)
    expect_path = tmp_path / "expect.json"
    expect_path.write_text(expect if isinstance(expect, str) else json.dumps(expect))
    (tmp_path / "kern.log").write_text("\n".join(node.kernel_log) + "\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "stub"),
               PATH="%s%s%s" % (bin_dir, os.pathsep, os.environ.get("PATH", "")),
               GPU_CLOUD_INSTANCE_ID="i-0123456789abcdef0")
    env.pop(gv.NVIDIA_SMI_ENV, None)  # resolve nvidia-smi from PATH, as on a node
    argv = [sys.executable, str(VERIFIER), "--expect", str(expect_path),
            "--report", str(tmp_path / "var" / "lib" / "gpu-cloud" / "verify.json"),
            "--kernel-log", str(tmp_path / "kern.log"), "--budget-s", str(budget_s),
            "--faults", gv.DEFAULT_FAULTS_NAME]
    if textfile:
        argv += ["--textfile", str(tmp_path / "textfile" / "gpu_cloud_verify.prom")]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? '
                    r'(\S+)$')


def parse_exposition(text: str) -> Dict[str, List[tuple]]:
    """A strict little parser for the text format: HELP and TYPE before samples, no duplicates."""
    helped, typed, samples, seen = set(), set(), {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in ("gauge", "counter", "untyped"), line
            typed.add(name)
        else:
            match = SAMPLE.match(line)
            assert match, "not a sample line: %r" % line
            name, labels, value = match.group(1), match.group(2) or "", match.group(3)
            assert name in helped and name in typed, "sample before HELP/TYPE: %r" % line
            assert (name, labels) not in seen, "duplicate series: %r" % line
            seen.add((name, labels))
            samples.setdefault(name, []).append((labels, float(value)))
    return samples


def test_cli_healthy_node_writes_report_and_textfile(tmp_path):
    result = run_cli(tmp_path, fk.healthy("p5.48xlarge"), fk.expect_for("p5.48xlarge"))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "var" / "lib" / "gpu-cloud" / "verify.json").read_text())
    assert report["verdict"] == "pass" and report["instanceId"] == "i-0123456789abcdef0"
    assert report["instanceType"] == "p5.48xlarge"
    assert [c for c in report["checks"] if c["name"] == "nvidia_smi"][0]["value"] == 8

    prom = tmp_path / "textfile" / "gpu_cloud_verify.prom"
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    assert not [p for p in prom.parent.iterdir() if p != prom]  # no temp file left behind
    samples = parse_exposition(prom.read_text())
    assert samples["gpu_cloud_node_verify_pass"] == [("", 1.0)]
    assert abs(samples["gpu_cloud_node_verify_timestamp_seconds"][0][1] - time.time()) < 60
    assert samples["gpu_cloud_node_verify_verdict"] == [
        ('{verdict="pass"}', 1.0), ('{verdict="fail"}', 0.0), ('{verdict="error"}', 0.0)]
    statuses = dict(samples["gpu_cloud_node_verify_check_status"])
    assert len(statuses) == 4 * len(report["checks"])
    for check in report["checks"]:  # a state set: every status present, exactly one of them 1
        states = {status: statuses['{check="%s",gpu="%s",status="%s"}' % (
            check["name"], "" if check["gpu"] is None else check["gpu"], status)]
            for status in ("pass", "fail", "warn", "skip")}
        assert states == {status: float(status == check["status"]) for status in states}
    assert statuses['{check="nvlink",gpu="7",status="pass"}'] == 1.0
    assert statuses['{check="nvlink",gpu="7",status="fail"}'] == 0.0


def test_cli_failure_exits_1_and_textfile_names_the_check(tmp_path):
    node = fk.healthy("p5.48xlarge")
    node.gpus[4].nvlink_active[0] = False
    result = run_cli(tmp_path, node, fk.expect_for("p5.48xlarge"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fail nvlink gpu4" in result.stdout
    samples = parse_exposition((tmp_path / "textfile" / "gpu_cloud_verify.prom").read_text())
    assert samples["gpu_cloud_node_verify_pass"] == [("", 0.0)]
    statuses = dict(samples["gpu_cloud_node_verify_check_status"])
    assert statuses['{check="nvlink",gpu="4",status="fail"}'] == 1.0
    assert statuses['{check="nvlink",gpu="4",status="pass"}'] == 0.0
    assert samples["gpu_cloud_node_verify_verdict"] == [
        ('{verdict="pass"}', 0.0), ('{verdict="fail"}', 1.0), ('{verdict="error"}', 0.0)]


def test_cli_bad_expect_exits_2_with_error_report(tmp_path):
    result = run_cli(tmp_path, fk.healthy("p5.48xlarge"), "[]")
    assert result.returncode == 2, result.stdout + result.stderr
    report = json.loads((tmp_path / "var" / "lib" / "gpu-cloud" / "verify.json").read_text())
    assert report["verdict"] == "error" and report["instanceType"] is None
    samples = parse_exposition((tmp_path / "textfile" / "gpu_cloud_verify.prom").read_text())
    assert samples["gpu_cloud_node_verify_verdict"] == [
        ('{verdict="pass"}', 0.0), ('{verdict="fail"}', 0.0), ('{verdict="error"}', 1.0)]


def test_cli_exits_once_written_though_a_worker_is_stuck_in_nvml(tmp_path):
    # The hung call never returns (HANG_MAX_S) and the library's teardown at exit waits for it:
    # the verifier must leave without that teardown once its report and textfile are written.
    budget_s = 3.0
    node = fk.healthy("p5.48xlarge")
    node.gpus[4].faults["nvmlDeviceGetCurrPcieLinkWidth"] = fk.HANG
    started = time.monotonic()
    result = run_cli(tmp_path, node, fk.expect_for("p5.48xlarge"), budget_s=budget_s,
                     timeout_s=fk.HANG_MAX_S / 2)
    assert time.monotonic() - started < budget_s + 5
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fail pcie_width gpu4: nvmlDeviceGetCurrPcieLinkWidth timed out" in result.stdout
    assert "verdict fail" in result.stdout  # printed output is flushed before leaving
    report = json.loads((tmp_path / "var" / "lib" / "gpu-cloud" / "verify.json").read_text())
    assert report["verdict"] == "fail"
    samples = parse_exposition((tmp_path / "textfile" / "gpu_cloud_verify.prom").read_text())
    assert samples["gpu_cloud_node_verify_pass"] == [("", 0.0)]


def test_unwritable_report_exits_2_and_prints_the_report(tmp_path, capsys):
    (tmp_path / "expect.json").write_text(json.dumps(fk.expect_for("p5.48xlarge")))
    (tmp_path / "kern.log").write_text("")
    (tmp_path / "a-file").write_text("")  # the report's parent is a file: cannot be created
    code = gv.main(["--expect", str(tmp_path / "expect.json"), "--kernel-log", str(tmp_path / "kern.log"),
                    "--report", str(tmp_path / "a-file" / "verify.json")],
                   nvml=fk.build_module(fk.healthy("p5.48xlarge")))
    assert code == 2
    assert '"verdict"' in capsys.readouterr().out


def test_textfile_passes_promtool(tmp_path, monkeypatch):
    promtool = require_tool("promtool")
    node = fk.healthy("g4dn.12xlarge")
    node.kernel_log.append(xid_line(2000))             # unknown: warns
    (tmp_path / "expect.json").write_text(json.dumps(fk.expect_for("g4dn.12xlarge")))
    (tmp_path / "kern.log").write_text("\n".join(node.kernel_log))
    args = gv.parse_args(["--expect", str(tmp_path / "expect.json"), "--report",
                          str(tmp_path / "r.json"), "--kernel-log", str(tmp_path / "kern.log")])
    monkeypatch.setenv(gv.NVIDIA_SMI_ENV, str(fk.write_fake_nvidia_smi(tmp_path / "bin", node)))
    report = gv.verify(args, fk.build_module(node))
    text = gv.render_textfile(report, time.time())
    assert '{check="xid_kernel_log",gpu="",status="warn"} 1' in text
    assert '{check="xid_kernel_log",gpu="",status="pass"} 0' in text
    assert 'gpu_cloud_node_verify_verdict{verdict="error"} 0' in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.parametrize("celsius,status", [(84, "pass"), (85, "pass"), (86, "fail")])
def test_temperature_fails_above_the_limit(verify, celsius, status):
    # the expectation's maxTempC is 85 (monitoring.alerts.gpuTempC): "above 85 C", as the design requirements say
    node = fk.healthy("p5.48xlarge")
    node.gpus[2].temperature_c = celsius
    run = verify(node)
    assert run.find("temperature", 2)["status"] == status
