"""decisions/nodes/faults.yaml, the one fault model: its data against its sources, and the parity corpus: every fault
class the verifier judges, injected once at boot and once at run time (tests/fake_nvml.py, a kernel log, the verifier
itself), gives the verdict, the class and the remediation the table says."""
from __future__ import annotations

import json
from typing import Any, Callable, Dict

import pytest

from decisions.nodes import faults as fault_model
from tests import fake_nvml as fk
from tests.conftest import ROOT
# The verifier harness (fixtures: the bundle's fault table, the in-process verifier against the fake NVML).
from tests.test_gpu_verify import (_release_hung_calls, _the_bundles_fault_table, faults_json, gv,  # noqa: F401
                                   verify, xid_154_line, xid_line)

TABLE = fault_model.load_faults()

# --- the data against its sources, entry by entry ---------------------------------------------------------------
# EKS: aws/eks-node-monitoring-agent@51af549 monitors/nvidia/dcgm/dcgm_policies.go (WellKnownXidCodes); Azure:
# Azure/azurehpc-health-checks@0e0a1ac customTests/azure_gpu_xid.nhc (XID_EC); the NVIDIA device plugin's
# application XIDs: NVIDIA/k8s-device-plugin internal/rm/health.go (13, 31, 43, 45, 68, 109).
EKS_WELL_KNOWN_XIDS = [46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151,
                       155, 156, 158]
AZURE_XID_EC = [48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120]
DEVICE_PLUGIN_APPLICATION_XIDS = [13, 31, 43, 45, 68, 109]


@pytest.mark.parametrize("xid", sorted(set(EKS_WELL_KNOWN_XIDS) | set(AZURE_XID_EC)))
def test_every_xid_a_trusted_list_calls_fatal_fails_unless_another_blames_the_application(xid):
    if xid in DEVICE_PLUGIN_APPLICATION_XIDS:
        assert xid in TABLE.xids.disputed and xid not in TABLE.xids.fatal
    else:
        assert xid in TABLE.xids.fatal


def test_the_xid_lists_are_exactly_their_sources():
    fatal_lists = set(EKS_WELL_KNOWN_XIDS) | set(AZURE_XID_EC)
    assert set(TABLE.xids.fatal) == fatal_lists - set(DEVICE_PLUGIN_APPLICATION_XIDS)
    assert set(TABLE.xids.disputed) == fatal_lists & set(DEVICE_PLUGIN_APPLICATION_XIDS) == {68, 109}
    assert set(TABLE.xids.application) == set(DEVICE_PLUGIN_APPLICATION_XIDS) - fatal_lists
    assert TABLE.xids.nvlink == (144, 145, 146, 147, 148, 149, 150)
    assert TABLE.xids.recovery_action == 154


def test_the_limits_are_dcgms_v4_6_0():
    """DCGM v4.6.0 common/DcgmGPUHardwareLimits.h: DCGM_LIMIT_MAX_RETIRED_PAGES 63 (line 21),
    DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100.0 (line 30), DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE 512 (line 39)."""
    limits = TABLE.limits
    assert (limits.retired_pages_max, limits.nvlink_crc_errors_per_second, limits.row_remap_uncorrectable_max) == \
        (63, 100, 512)


def test_a_table_with_a_mistake_is_refused(tmp_path):
    import yaml

    document = yaml.safe_load(fault_model.FAULTS_PATH.read_text())
    for change, message in (
            (lambda d: d["faults"][0].update(remediation="pray"), "remediation 'pray'"),
            (lambda d: d["faults"][0].update(checks=["no_such_check"]), "unknown checks no_such_check"),
            (lambda d: d["faults"].append(dict(d["faults"][0])), "listed twice: xid-fatal"),
            (lambda d: d["xids"]["disputed"].append(79), "XID 79 is in both fatal and disputed"),
            (lambda d: d["faults"][0].update(boot="none"), "names its checks")):
        broken = json.loads(json.dumps(document))
        change(broken)
        path = tmp_path / "faults.yaml"
        path.write_text(yaml.safe_dump(broken))
        with pytest.raises(ValueError, match=message):
            fault_model.load_faults.__wrapped__(path)


def test_remediations_order_replace_above_reboot_above_reset():
    assert fault_model.strongest(["reset", "none"]) == "reset"
    assert fault_model.strongest(["reboot", "reset"]) == "reboot"
    assert fault_model.strongest(["reset", "replace", "reboot"]) == "replace"
    assert fault_model.strongest([]) == "none"


def test_the_node_gate_page_shows_the_table():
    page = (ROOT / "docs/node-gate.md").read_text()
    assert "\n".join(fault_model.markdown_table()) in page


# --- the parity corpus: every class the verifier judges, at boot and at run time -----------------------------------
def gpu0(**values: Any) -> Callable:
    def inject(node, expect):
        for key, value in values.items():
            setattr(node.gpus[0], key, value)
    return inject


def log(*lines: str) -> Callable:
    def inject(node, expect):
        node.kernel_log.extend(lines)
    return inject


def expecting(**values: Any) -> Callable:
    def inject(node, expect):
        expect.update(values)
    return inject


def driver(version: str, **gpu_values: Any) -> Callable:
    def inject(node, expect):
        node.driver_version = version
        for key, value in gpu_values.items():
            setattr(node.gpus[0], key, value)
    return inject


SXID = "[  812.1] nvidia-nvswitch2: SXid (PCI:0000:8b:00.0): %d, %s, Link 44 egress non-posted PRIV error (First)"
B200_XID = "[  912.3] NVRM: Xid (PCI:0000:1b:00): %d, %s XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000)"
# fault class -> (instance type, what to inject)
INJECTIONS: Dict[str, tuple] = {
    "xid-fatal": ("p5.48xlarge", log(xid_line(79))),
    "xid-nvlink": ("p5.48xlarge", log(B200_XID % (149, "NETIR_LINK_EVT Fatal"))),
    "xid-nvlink-nonfatal": ("p5.48xlarge", log(B200_XID % (144, "SAW_MVB Nonfatal"))),
    "xid-disputed": ("p5.48xlarge", log(xid_line(68))),
    "xid-unknown": ("p5.48xlarge", log(xid_line(94))),
    "xid-recovery-action": ("p5.48xlarge", log(xid_154_line(0x0, 0x2, "Node Reboot Required"))),
    "sxid-fatal": ("p5.48xlarge", log(SXID % (24007, "Fatal"))),
    "sxid-nonfatal": ("p5.48xlarge", log(SXID % (22013, "Non-fatal"))),
    "ecc-uncorrected": ("p5.48xlarge", gpu0(ecc_uncorrected_volatile=2)),
    "ecc-off": ("p5.48xlarge", gpu0(ecc_mode=[0, 0])),
    "ecc-off-pending": ("p5.48xlarge", gpu0(ecc_mode=[1, 0])),
    "sram-ecc": ("p5.48xlarge", gpu0(sram_threshold_exceeded=True)),
    "row-remap-pending": ("p5.48xlarge", gpu0(remapped_rows=[0, 2, 1, 0])),
    "row-remap-failure": ("p5.48xlarge", gpu0(remapped_rows=[0, 0, 0, 1])),
    "row-remap-limit": ("p5.48xlarge", gpu0(remapped_rows=[0, 512, 0, 0])),
    "retired-pages-pending": ("g4dn.12xlarge", gpu0(retired_pages_pending=1)),
    "retired-pages-limit": ("g4dn.12xlarge", gpu0(retired_pages=[40, 23])),
    "recovery-action": ("p5.48xlarge", gpu0(recovery_action=2)),
    "inforom": ("p5.48xlarge", gpu0(inforom_valid=False)),
    "repair-pending": ("p5.48xlarge", driver("580.159.04", repair_pending=[0, 1])),
    "nvlink-down": ("p5.48xlarge", gpu0(nvlink_active=[True] * 17 + [False])),
    "fabric": ("p5.48xlarge", gpu0(fabric_status=fk.real.NVML_ERROR_UNKNOWN)),
    "fabric-health": ("p5.48xlarge", gpu0(fabric_health_mask=fk.FABRIC_HEALTH_HEALTHY | 0x1)),
    "pcie-width": ("p5.48xlarge", gpu0(pcie_width=8)),
    "power-capped": ("p5.48xlarge", gpu0(power_limit_mw=500000)),
    "power-below-default": ("p5.48xlarge", gpu0(power_limit_mw=665000)),
    "thermal": ("p5.48xlarge", gpu0(temperature_c=91)),
    "clocks-hw-slowdown": ("p5.48xlarge", gpu0(clock_event_reasons=0x8)),
    "clocks-sw-thermal": ("p5.48xlarge", gpu0(clock_event_reasons=0x20)),
    "driver": ("p5.48xlarge", expecting(driverVersion="580.65.06")),
    "gpu-missing": ("p5.48xlarge", expecting(gpuCount=9)),
    "persistence-off": ("p5.48xlarge", gpu0(persistence_mode=0)),
    "mig-mode": ("p5.48xlarge", expecting(migMode="enabled")),
    "gpu-busy-at-boot": ("p5.48xlarge", gpu0(processes=[[4242, 1024]])),
    "check-error": ("p5.48xlarge", gpu0(faults={"nvmlDeviceGetCurrPcieLinkWidth": "raise:driver oops"})),
}
# Judged by the gate's shell steps (userdata/gate.sh), by a job, or by a metric only: held elsewhere.
NOT_THE_VERIFIERS = {"efa-devices"}


def test_the_corpus_covers_every_class_the_verifier_judges():
    judged = {f.id for f in TABLE.faults if f.boot != "none"} - NOT_THE_VERIFIERS
    assert set(INJECTIONS) == judged


@pytest.mark.parametrize("mode", ["boot", "runtime"])
@pytest.mark.parametrize("fault", sorted(INJECTIONS))
def test_each_fault_gets_the_tables_verdict_class_and_remediation(verify, monkeypatch, fault, mode):
    fault_class = TABLE.fault(fault)
    instance_type, inject = INJECTIONS[fault]
    node, expect = fk.healthy(instance_type), fk.expect_for(instance_type)
    inject(node, expect)
    if mode == "runtime":
        monkeypatch.setattr(gv, "parse_args", _with(gv.parse_args, ["--mode", "runtime"]))
    run = verify(node, expect)
    checks = [c for c in run.report["checks"] if c["fault"] == fault]
    skipped_at_runtime = set(fault_class.checks) <= gv.RUNTIME_SKIPPED
    if mode == "runtime" and skipped_at_runtime:
        assert not checks and fault not in run.report["faults"]   # left to the DCGM exporter's series
        return
    assert checks, run.report["checks"]
    assert {c["name"] for c in checks} <= set(fault_class.checks)
    assert {c["status"] for c in checks} == {"fail" if fault_class.boot == "fail" else "warn"}
    assert fault in run.report["faults"] and run.report["remediations"][fault] == fault_class.remediation
    if fault_class.boot == "fail":
        assert run.report["verdict"] == "fail" and run.exit_code == 1
        assert run.report["remediation"] == fault_class.remediation
    else:
        assert run.report["verdict"] == "pass" and run.report["remediation"] == "none"


def _with(parse_args, extra):
    return lambda argv: parse_args(list(argv) + extra)


def test_each_fault_found_at_run_time_raises_the_alert_the_table_implies_through_promtool(verify, monkeypatch,
                                                                                         tmp_path):
    """The run-time half of the corpus, to the alert: each class the checker still judges while the node runs,
    injected on the fakes, gives a textfile whose gpu_cloud_node_health_fault series (as node-exporter serves it,
    with the node label its ServiceMonitor adds) makes promtool fire GpuNodeHealthCheckFailed (a class that fails
    the gate) or GpuNodeHealthWarning (one that warns), labelled with the class and the table's remediation."""
    import re

    from plan.stackfile import load_stack
    from tests.test_alert_rules import NODE, case, groups_of, node_info, on_node, run_promtool_tests, series

    groups = groups_of(load_stack("prod-us-east-1")[1])
    textfile = tmp_path / "health.prom"
    monkeypatch.setattr(gv, "parse_args", _with(gv.parse_args, ["--mode", "runtime", "--textfile", str(textfile)]))
    cases = []
    for fault in sorted(INJECTIONS):
        fault_class = TABLE.fault(fault)
        if set(fault_class.checks) <= gv.RUNTIME_SKIPPED:
            continue
        instance_type, inject = INJECTIONS[fault]
        node, expect = fk.healthy(instance_type), fk.expect_for(instance_type)
        inject(node, expect)
        verify(node, expect)
        found = [dict(re.findall(r'(\w+)="([^"]*)"', labels)) for labels, value in re.findall(
            r"^gpu_cloud_node_health_fault\{([^}]*)\} (\S+)$", textfile.read_text(), re.M) if value == "1"]
        mine = [labels for labels in found if labels["fault"] == fault]
        assert mine == [{"fault": fault, "status": "fail" if fault_class.boot == "fail" else "warn",
                         "remediation": fault_class.remediation}], (fault, found)
        labels = {**mine[0], "node": NODE, "job": "node-exporter"}
        alert = "GpuNodeHealthCheckFailed" if fault_class.boot == "fail" else "GpuNodeHealthWarning"
        severity = "critical" if fault_class.boot == "fail" else "info"
        cases.append(case([node_info(itype=instance_type), series("gpu_cloud_node_health_fault", labels, "1x3")],
                          alert, "1m", [on_node(labels, itype=instance_type, severity=severity)], groups))
    assert len(cases) >= 30
    run_promtool_tests(tmp_path, groups, cases)
