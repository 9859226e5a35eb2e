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
# NVIDIA's XID catalog, column "Resolution Bucket (Immediate Action)" (docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html), as leptonai/gpud v0.12.24 components/accelerator/nvidia/xid/catalog_generated.go (blob
# 3952a5a0, generated 2025-10-29 from that page) holds it: written out here by hand, XID by XID, so that a change to the
# table's data shows up against the source.
NVIDIA_RESOLUTION = {
    13: "RESTART_APP", 31: "RESTART_APP", 43: "IGNORE", 45: "WORKFLOW_XID_45", 46: "RESET_GPU",
    48: "WORKFLOW_XID_48", 54: "CHECK_MECHANICALS", 56: "CONTACT_SUPPORT", 57: "CONTACT_SUPPORT",
    58: "CONTACT_SUPPORT", 62: "RESET_GPU", 63: "IGNORE", 64: "RESET_GPU", 65: "CONTACT_SUPPORT", 68: "RESTART_APP",
    69: "RESTART_APP", 73: "CONTACT_SUPPORT", 74: "WORKFLOW_NVLINK_ERR", 79: "RESTART_BM", 80: "RESTART_APP",
    81: "CONTACT_SUPPORT", 92: "IGNORE", 94: "RESTART_APP", 95: "RESET_GPU", 109: "RESET_GPU", 110: "RESET_GPU",
    119: "RESET_GPU", 120: "RESET_GPU", 136: "RESET_GPU", 140: "RESET_GPU", 142: "CONTACT_SUPPORT", 143: "RESET_GPU",
    **{x: "WORKFLOW_NVLINK5_ERR" for x in range(144, 151)}, 151: "RESTART_VM", 154: "XID_154", 155: "RESET_GPU",
    156: "RESET_GPU", 158: "RESET_GPU"}
# The issue's mapping of NVIDIA's buckets to what the controller does (issue 38, item 3), and the class for each.
BUCKET_REMEDIATION = {
    "RESTART_APP": "none", "IGNORE": "none", "WORKFLOW_XID_45": "none",
    "RESET_GPU": "reboot", "RESTART_VM": "reboot", "WORKFLOW_XID_48": "reboot", "WORKFLOW_NVLINK_ERR": "reboot",
    "WORKFLOW_NVLINK5_ERR": "reboot", "XID_154": "reboot",
    "RESTART_BM": "replace", "CHECK_MECHANICALS": "replace", "CONTACT_SUPPORT": "replace"}
# The trusted lists: EKS: aws/eks-node-monitoring-agent@3ca9902 monitors/nvidia/dcgm/dcgm_policies.go
# (WellKnownXidCodes); Azure: Azure/azurehpc-health-checks@0e0a1ac customTests/azure_gpu_xid.nhc (XID_EC); gpud:
# leptonai/gpud v0.12.24 components/accelerator/nvidia/xid/xid.go, the XIDs whose EventType is Fatal; the NVIDIA
# device plugin's application XIDs: NVIDIA/k8s-device-plugin internal/rm/health.go (13, 31, 43, 45, 68, 109).
EKS_WELL_KNOWN_XIDS = [46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151,
                       155, 156, 158]
AZURE_XID_EC = [48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120]
GPUD_FATAL = [46, 48, 62, 63, 64, 65, 68, 69, 74, 79, 81, 94, 95, 110, 119, 120, 140, 143]
DEVICE_PLUGIN_APPLICATION_XIDS = [13, 31, 43, 45, 68, 109]
ENTRIES = {e.xid: e for e in TABLE.xids.catalog}


def test_the_table_names_every_xid_a_trusted_list_names_and_no_other():
    named = set(EKS_WELL_KNOWN_XIDS) | set(AZURE_XID_EC) | set(DEVICE_PLUGIN_APPLICATION_XIDS) | set(range(144, 151))
    assert set(ENTRIES) == named | {94, 154} == set(NVIDIA_RESOLUTION)      # 94: contained ECC, common on H100


@pytest.mark.parametrize("xid", sorted(NVIDIA_RESOLUTION))
def test_each_xid_carries_nvidias_resolution_the_lists_verdicts_and_the_remediation_its_bucket_maps_to(xid):
    entry = ENTRIES[xid]
    assert entry.resolution == NVIDIA_RESOLUTION[xid]
    assert set(entry.fatal_to) == {name for name, listed in (
        ("eks", EKS_WELL_KNOWN_XIDS), ("azure", AZURE_XID_EC), ("gpud", GPUD_FATAL)) if xid in listed}
    assert set(entry.application_to) == ({"devicePlugin"} if xid in DEVICE_PLUGIN_APPLICATION_XIDS else set())
    fault = TABLE.fault(TABLE.xids.fault_of(xid))
    assert fault.remediation == BUCKET_REMEDIATION[entry.resolution]
    assert fault.boot == ("none" if fault.remediation == "none" else "fail")   # the application's: not judged


@pytest.mark.parametrize("xid, fault_id, remediation", [
    (79, "xid-replace", "replace"),          # fallen off the bus: RESTART_BM
    (54, "xid-replace", "replace"),          # auxiliary power: CHECK_MECHANICALS
    (142, "xid-replace", "replace"),         # CONTACT_SUPPORT
    (69, "xid-application", "none"),         # RESTART_APP: one tenant's kernel does not fail the node
    (80, "xid-application", "none"),
    (92, "xid-application", "none"),         # IGNORE
    (109, "xid-fatal", "reboot"),            # RESET_GPU: no longer only a warning
    (48, "xid-fatal", "reboot"),             # WORKFLOW_XID_48
    (151, "xid-fatal", "reboot"),            # RESTART_VM: a reboot
    (149, "xid-nvlink", "reboot"),
    (154, "xid-recovery-action", "reboot"),
])
def test_the_xids_the_issue_names(xid, fault_id, remediation):
    assert TABLE.xids.fault_of(xid) == fault_id and TABLE.fault(fault_id).remediation == remediation


@pytest.mark.parametrize("xid", sorted(NVIDIA_RESOLUTION))
def test_an_entry_says_why_exactly_where_a_trusted_list_says_the_opposite_of_its_verdict(xid):
    entry = ENTRIES[xid]
    fails = TABLE.fault(TABLE.xids.fault_of(xid)).boot == "fail"
    # the opposite: fatal to a list while the table does not fail it; the application's to the device plugin, or
    # Warning to gpud (which types every XID but 154), while the table fails it
    against = (entry.fatal_to if not fails else
               [*entry.application_to, *(["gpud"] if xid != 154 and xid not in GPUD_FATAL else [])])
    assert bool(entry.why) == bool(against), (xid, against)


def test_an_xid_table_with_a_mistake_is_refused(tmp_path):
    import yaml

    document = yaml.safe_load(fault_model.FAULTS_PATH.read_text())
    at = {e["xid"]: i for i, e in enumerate(document["xids"]["catalog"])}
    for change, message in (
            (lambda d: d["xids"]["catalog"][at[69]].pop("why"), "XID 69: azure, gpud disagree"),
            (lambda d: d["xids"]["catalog"][at[46]].update(why="because"), "XID 46: a why, but no trusted list"),
            (lambda d: d["xids"]["catalog"][at[79]].update(resolution="PRAY"), "resolution 'PRAY' is not in"),
            (lambda d: d["xids"]["resolutions"].update(RESTART_BM="xid-fatl"), "not XID classes"),
            (lambda d: d["xids"]["catalog"].append(dict(d["xids"]["catalog"][0])), "XIDs listed twice: 13"),
            (lambda d: d["xids"]["catalog"][at[79]].update(fatalTo=["nhc"]), "unknown lists nhc"),
            (lambda d: d["xids"]["sources"].pop("gpud"), "xids.sources lacks gpud")):
        refused(tmp_path, document, change, message)


def refused(tmp_path, document, change, message):
    """`change` made to a copy of the fault table's document is refused by its loader with `message`."""
    import yaml

    broken = json.loads(json.dumps(document))
    change(broken)
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ValueError, match=message):
        fault_model.load_faults.__wrapped__(path)


def test_the_bundle_gives_the_verifier_each_class_its_xids():
    xids = fault_model.bundle_document()["xids"]
    assert xids["replace"] == [54, 56, 57, 58, 65, 73, 79, 81, 142]
    assert xids["fatal"] == [46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158]
    assert xids["nvlink"] == list(range(144, 151))
    assert xids["application"] == [13, 31, 43, 45, 63, 68, 69, 80, 92, 94]
    assert xids["recoveryAction"] == 154


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
            (lambda d: d["faults"].append(dict(d["faults"][0])), "listed twice: xid-replace"),
            (lambda d: d["faults"][0].update(boot="none"), "names its checks")):
        refused(tmp_path, document, change, message)


def test_remediations_order_replace_above_reboot_above_reset():
    assert fault_model.strongest(["reset", "none"]) == "reset"
    assert fault_model.strongest(["reboot", "reset"]) == "reboot"
    assert fault_model.strongest(["reset", "replace", "reboot"]) == "replace"
    assert fault_model.strongest([]) == "none"


def test_the_node_gate_page_shows_the_table_and_every_xid():
    page = (ROOT / "docs/node-gate.md").read_text()
    assert "\n".join(fault_model.markdown_table()) in page
    assert "\n".join(fault_model.xid_markdown_table()) in page


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
    "xid-replace": ("p5.48xlarge", log(xid_line(79))),
    "xid-fatal": ("p5.48xlarge", log(xid_line(109))),
    "xid-nvlink": ("p5.48xlarge", log(B200_XID % (149, "NETIR_LINK_EVT Fatal"))),
    "xid-nvlink-nonfatal": ("p5.48xlarge", log(B200_XID % (144, "SAW_MVB Nonfatal"))),
    "xid-unknown": ("p5.48xlarge", log(xid_line(2000))),
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
        # A failing class pages once held for 2 minutes (the controller's confirmation), a warning at once.
        cases.append(case([node_info(itype=instance_type), series("gpu_cloud_node_health_fault", labels, "1x5")],
                          alert, "3m", [on_node(labels, itype=instance_type, severity=severity)], groups))
    assert len(cases) >= 30
    run_promtool_tests(tmp_path, groups, cases)
