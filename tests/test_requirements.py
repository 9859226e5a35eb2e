"""The requirements ledger (decisions/requirements.yaml): the page is its rendering, its figures are the code's, every
test and path it names exists, and its status rules hold."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import List, Optional

import pytest
import yaml
from pydantic import Field, ValidationError

from decisions import requirements as ledger
from decisions.nodes.pods import SYSTEM_NODE_LABELS
from decisions.nodes.pools import GPU_TAINT, Taint
from decisions.platform.gpu_operator import operator_values

ROOT = Path(__file__).resolve().parent.parent
ROWS = ledger.load_requirements()


def _page_problem(text: str) -> Optional[str]:
    if text != ledger.render(ROWS):
        return (f"{ledger.PAGE_PATH.relative_to(ROOT)} is not the rendering of decisions/requirements.yaml: "
                f"run `{ledger.WRITE_COMMAND}`")
    return None


def _hold_mismatches() -> List[str]:
    return [f"{row.id}: {hold.ref} is {ledger.plain(ledger.resolve(hold.ref))!r}, the row says {hold.value!r}"
            for row in ROWS for hold in row.holds if ledger.plain(ledger.resolve(hold.ref)) != ledger.plain(hold.value)]


@lru_cache(maxsize=None)
def _test_functions(path: str) -> frozenset:
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def test_the_page_is_the_rendering_of_the_data():
    assert _page_problem(ledger.PAGE_PATH.read_text()) is None, _page_problem(ledger.PAGE_PATH.read_text())


def test_a_page_edited_by_hand_fails():
    page = ledger.PAGE_PATH.read_text()
    edited = page.replace("above 85 °C", "above 80 °C", 1)
    assert edited != page
    assert ledger.WRITE_COMMAND in _page_problem(edited)


def test_every_figure_the_ledger_holds_is_the_codes():
    assert _hold_mismatches() == []


@pytest.mark.parametrize("module, name, moved, row", [
    ("decisions.nodes.scratch", "HOT_TIER_READ_IOPS", 400_000, "hot-tier-500k-iops"),
    ("decisions.observability.alert_rules", "QUEUE_DEEP_PENDING", 50, "queue-depth-node-size"),
    ("decisions.nodes.drain", "NODE_DRAIN_GRACE_S", 90, "spot-with-recovery"),
    ("decisions.nodes.drain", "QUEUE_LONG_POLL_S", 10, "spot-with-recovery"),
    ("decisions.storage.lustre", "SIZE_STEP_GIB", 1200, "warm-tier-over-100tb"),
    ("decisions.platform.mpijob", "SHM_SIZE", "64Mi", "tmpfs-checkpoints"),
    ("decisions.nodes.amis", "INSTALL_REFUSED_FAMILIES", ["g5g"], "inference-on-t4-a10"),
])
def test_a_figure_moved_in_the_code_without_its_row_fails(monkeypatch, module, name, moved, row):
    monkeypatch.setattr(f"{module}.{name}", moved)
    (mismatch,) = _hold_mismatches()
    assert mismatch.startswith(f"{row}: {module}:{name} is {moved!r}")


@pytest.mark.parametrize("module, name, moved, row", [
    # Held through what the code renders (decisions.requirements.rank_env, device_rdma_types), not the constant.
    ("decisions.platform.mpijob", "DEVICE_RDMA_FAMILIES", frozenset({"p5"}), "gpudirect-rdma"),
    ("decisions.platform.mpijob", "NCCL_NETWORK_ENV", {"NCCL_SOCKET_IFNAME": "^lo"}, "nccl-environment"),
])
def test_a_rank_environment_changed_in_the_code_without_its_row_fails(monkeypatch, module, name, moved, row):
    monkeypatch.setattr(f"{module}.{name}", moved)
    assert [m.split(":", 1)[0] for m in _hold_mismatches()] == [row]


def test_a_moved_alert_default_fails_its_row(monkeypatch):
    from decisions.config import model

    class Cooler(model.Alerts):
        gpu_temp_c: int = Field(alias="gpuTempC", default=80)
    monkeypatch.setattr(model, "Alerts", Cooler)
    assert [m.split(":", 1)[0] for m in _hold_mismatches()] == ["gpu-temperature-85c"]


def test_a_routing_the_config_stops_accepting_fails_its_row(monkeypatch):
    """The accepted dr.routing values are held from the Literal validation uses, not from a list kept beside it."""
    from typing import Literal

    from decisions.config import model

    class NoLatency(model.Dr):
        routing: Literal["failover", "weighted"] = "failover"
    monkeypatch.setattr(model, "Dr", NoLatency)
    (mismatch,) = _hold_mismatches()
    assert mismatch.startswith("dns-round-robin-failover: decisions.requirements:choices('decisions.config.model:Dr', "
                               "'routing') is ['failover', 'weighted']")


def test_no_hold_points_at_a_figure_that_drives_nothing():
    """Constants that only a docstring, a note or a test read: a hold on them would pass while the behaviour moves."""
    stated = {"decisions.nodes.drain:SPOT_CHECKPOINT_BUDGET_S", "decisions.platform.acceptance:NCCL_TESTS_MIN_DRIVER_BRANCH",
              "decisions.nodes.scratch:HOT_TIER_LATENCY_TARGET_US", "decisions.serving.failover:ROUTINGS"}
    assert [hold.ref for row in ROWS for hold in row.holds if hold.ref in stated] == []


def test_every_row_that_is_a_figure_of_the_code_holds_one():
    # Rows whose figure is a setting the program holds; the others (a rule, or a figure AWS or the operator owns)
    # are listed here so that a new row has to choose.
    without = {"driver-checked-by-nvidia-smi", "exporter-port-9400", "iommu-dma", "aes-256-gcm-training-data",
               "keep-drivers-current", "triton-dynamic-batching", "single-pulumi-up"}
    assert {r.id for r in ROWS if not r.holds} == without


def test_every_named_test_exists():
    missing = [f"{row.id}: {test}" for row in ROWS for test in row.test
               if test.split("::")[1] not in _test_functions(test.split("::")[0])]
    assert missing == []


def test_every_where_path_exists():
    assert [f"{row.id}: {path}" for row in ROWS for path in row.where if not (ROOT / path).exists()] == []


def test_the_summary_counts_each_status():
    assert ledger.summary(ROWS) == (f"{len(ROWS)} requirements: {sum(r.status == 'met' for r in ROWS)} met, "
                                    f"{sum(r.status == 'departed' for r in ROWS)} departed, "
                                    f"{sum(r.status == 'not-applicable' for r in ROWS)} not applicable")
    assert f"{ledger.summary(ROWS)}." in ledger.PAGE_PATH.read_text()


def test_each_design_bullet_has_its_rows():
    ids = {r.id for r in ROWS}
    assert len(ids) == len(ROWS) == 48
    assert {"driver-branch-535", "exporter-port-9400", "gpu-temperature-85c", "dns-round-robin-failover",
            "iommu-dma", "singularity-for-hpc", "two-node-pilot"} <= ids


# Issue #41 item 8: the requirements the ledger missed, and the two rows that claimed too much, with the status each
# has on AWS as built. The memory-matching scheduler was already there (gpu-memory-from-the-model).
ISSUE_41_ROWS = [
    ("inference-on-t4-a10", "met"),
    ("driver-install-on-ubuntu", "departed"),
    ("container-toolkit-smoke-test", "met"),
    ("gpudirect-rdma", "met"),
    ("hdr-infiniband", "not-applicable"),
    ("grafana-dashboards", "met"),
    ("horovod-megatron-training", "met"),
    ("triton-dynamic-batching", "departed"),
    ("inference-scales-20-to-50-at-500-users", "departed"),
    ("gpu-memory-from-the-model", "departed"),
    ("tmpfs-checkpoints", "departed"),
    ("warm-tier-over-100tb", "departed"),
    ("versioned-model-store", "met"),
    ("eight-node-64-gpu-cluster", "departed"),
    ("nccl-environment", "met"),
    ("single-pulumi-up", "departed"),
    ("pulumi-random", "departed"),
    ("aes-256-gcm-training-data", "departed"),
    ("periodic-benchmarks", "departed"),
]


@pytest.mark.parametrize("row_id, status", ISSUE_41_ROWS)
def test_each_requirement_the_issue_found_has_its_row_and_status(row_id, status):
    (row,) = [r for r in ROWS if r.id == row_id]
    assert row.status == status


def test_the_training_data_row_names_each_tier_with_its_cipher():
    # GCM is S3's alone: a "met" here would claim it for FSx, the NVMe and EBS, which use XTS.
    (row,) = [r for r in ROWS if r.id == "aes-256-gcm-training-data"]
    sentences = " ".join(row.why.split()).split(". ")
    for tier, cipher in [("S3,", "256-bit AES-GCM"), ("FSx for Lustre", "XTS-AES-256"),
                         ("Instance-store NVMe", "XTS-AES-256"), ("EBS,", "AES-256-XTS")]:
        (sentence,) = [s for s in sentences if s.startswith(tier)]
        assert cipher in sentence, (tier, cipher)


def test_the_page_states_what_the_ledger_leaves_out():
    page = " ".join(ledger.PAGE_PATH.read_text().split())
    rule = " ".join(" ".join(ledger.LEAVES_OUT).split())
    assert "mixed precision" in rule and "gradient accumulation" in rule
    assert rule in page


def test_a_lustre_file_system_past_100_tib_is_a_size_the_stack_accepts():
    from decisions.config.model import Lustre
    from decisions.storage import lustre

    size = 43 * lustre.SIZE_STEP_GIB                  # 103,200 GiB, the first step past 100 TiB (102,400 GiB)
    assert size > 100 * 1024 and size - lustre.SIZE_STEP_GIB < 100 * 1024
    assert Lustre.model_validate({"capacityGiB": size}).capacity_gib == size
    assert lustre.size_issues(size, 125) == []


def test_the_program_depends_on_no_pulumi_random():
    pinned = [line.split("==")[0].strip().lower() for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert "pulumi" in pinned and "pulumi-random" not in pinned
    sources = [p for d in ("decisions", "components", "plan", "policy") for p in (ROOT / d).rglob("*.py")]
    assert [str(p) for p in [ROOT / "__main__.py", ROOT / "layers.py", *sources]
            if "pulumi_random" in p.read_text()] == []


GOOD = {"id": "x", "requirement": "A figure.", "status": "met", "where": ["decisions/config/model.py"],
        "test": ["tests/test_requirements.py::test_every_named_test_exists"]}


@pytest.mark.parametrize("change, words", [
    ({"status": "done"}, "status"),
    ({"status": "departed"}, "needs `why`"),
    ({"status": "not-applicable", "why": "  "}, "needs `why`"),
    ({"test": []}, "needs `test`"),
    ({"test": ["tests/test_requirements.py"]}, "not tests/test_x.py::test_name"),
    ({"test": ["decisions/config/model.py::test_x"]}, "not tests/test_x.py::test_name"),
    ({"where": []}, "where"),
    ({"id": "Not An Id"}, "id"),
    ({"holds": [{"ref": "no colon", "value": 1}]}, "ref"),
    ({"figure": 3}, "figure"),
])
def test_a_bad_row_is_refused(tmp_path, change, words):
    path = tmp_path / "requirements.yaml"
    path.write_text(yaml.safe_dump({"requirements": [{**GOOD, **change}]}))
    with pytest.raises(ValidationError, match=words):
        ledger.load_requirements(path)


def test_a_good_row_loads_and_an_id_listed_twice_is_refused(tmp_path):
    path = tmp_path / "requirements.yaml"
    path.write_text(yaml.safe_dump({"requirements": [GOOD]}))
    assert [r.id for r in ledger.load_requirements(path)] == ["x"]
    path.write_text(yaml.safe_dump({"requirements": [GOOD, GOOD]}))
    with pytest.raises(ValueError, match="ids listed twice: x"):
        ledger.load_requirements(path)


@pytest.mark.parametrize("ref", ["decisions.nodes.scratch:__import__('os')",
                                 "decisions.nodes.scratch:HOT_TIER_READ_IOPS + 1",
                                 "decisions.requirements:stack_setting(key='aws:region')"])
def test_a_ref_that_is_more_than_a_lookup_is_refused(ref):
    with pytest.raises(ValueError, match="only names, attributes"):
        ledger.resolve(ref)


def test_the_dcgm_exporter_keeps_the_operators_port():
    # The operator serves the exporter on 9400 (NVIDIA/gpu-operator v26.7.0 assets/state-dcgm-exporter/
    # 0400_service.yaml lines 15-16, 0800_daemonset.yaml lines 43-44: DCGM_EXPORTER_LISTEN ":9400"); the chart's values
    # have no port key (values.yaml dcgmExporter.service: internalTrafficPolicy only). Nothing gpu-cloud sets moves it.
    dcgm = operator_values((Taint(*GPU_TAINT),), SYSTEM_NODE_LABELS)["dcgmExporter"]

    def keys(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield str(k)
                yield from keys(v)
        elif isinstance(value, list):
            for v in value:
                yield from keys(v)
                if isinstance(v, dict) and "name" in v:
                    yield str(v["name"])
    assert not [k for k in keys(dcgm) if "port" in k.lower() or "listen" in k.lower() or k == "service"]
    assert "9400" in (ROOT / "docs" / "monitoring.md").read_text()
