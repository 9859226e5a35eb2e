"""NVMe scratch: which pools meet the hot tier, what pods get, and the Lustre latency statement."""
from types import SimpleNamespace

import pytest
import yaml

from decisions.catalog.catalog import CATALOG_PATH, Catalog, load_catalog
from decisions.nodes import scratch

CATALOG = load_catalog()


def pool(name, *types):
    """Only what scratch_rows reads of a decisions.config.validate.ResolvedPool."""
    return SimpleNamespace(spec=SimpleNamespace(name=name, instance_types=tuple(types)))


def catalog_with(**stores) -> Catalog:
    """The real catalog with some types' instanceStore replaced (type name with '_' for '.' and '-')."""
    data = yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))
    names = {n.replace(".", "_").replace("-", "_"): n for n in data["instanceTypes"]}
    for key, store in stores.items():
        data["instanceTypes"][names[key]]["instanceStore"] = store
    return Catalog.model_validate(data)


def only_row(pools, catalog=CATALOG, nvme_scratch=True):
    rows = scratch.scratch_rows(pools, catalog, nvme_scratch)
    assert len(rows) == len(pools)
    return rows[0]


# --------------------------------------------------------------------------- the threshold


def test_the_hot_tier_design_targets():
    assert scratch.HOT_TIER_READ_IOPS == 500_000
    assert scratch.HOT_TIER_LATENCY_TARGET_US == 100


@pytest.mark.parametrize("read_iops,meets", [
    (500_001, True),        # more than the figure meets it
    (500_000, False),       # exactly the figure does not: the design target says "more than"
    (500_001, True),
    (312_500, False),
    (4_400_000, True),
    (None, None),           # unknown stays unknown, never False
])
def test_meets_hot_tier_at_the_boundary(read_iops, meets):
    assert scratch.meets_hot_tier(read_iops) is meets


@pytest.mark.parametrize("read_iops,meets", [(500_001, True), (500_000, False)])
def test_a_pool_at_the_boundary(read_iops, meets):
    catalog = catalog_with(g5_12xlarge={"disks": 1, "diskGB": 3800, "readIops": read_iops, "writeIops": 156_250})
    row = only_row([pool("edge", "g5.12xlarge")], catalog)
    assert (row["readIops"], row["meetsHotTier"]) == (read_iops, meets)


# --------------------------------------------------------------------------- rows from the real catalog


@pytest.mark.parametrize("instance_type,disks,disk_gb,read_iops,write_iops,meets", [
    ("p5.48xlarge",      8, 3800, 4_400_000, 2_200_000, True),
    ("p4d.24xlarge",     8, 1000, 2_000_000, 1_600_000, True),
    ("g6e.48xlarge",     4, 1900,   625_000,   312_500, True),
    ("g6.48xlarge",      8,  940,   625_000,   312_496, True),
    ("g4dn.metal",       2,  900,   500_000,   400_000, False),    # exactly 500,000: not more than it
    ("g6e.12xlarge",     2, 1900,   312_500,   125_000, False),
    ("g5.12xlarge",      1, 3800,   312_500,   156_250, False),
    ("g4dn.12xlarge",    1,  900,   250_000,   200_000, False),
])
def test_rows_with_raid0_on(instance_type, disks, disk_gb, read_iops, write_iops, meets):
    row = only_row([pool("p", instance_type)])
    assert row["pool"] == "p" and row["instanceTypes"] == [instance_type]
    assert (row["disks"], row["diskGB"], row["totalGB"]) == (disks, disk_gb, disks * disk_gb)
    assert (row["raid0"], row["readIops"], row["writeIops"], row["meetsHotTier"]) == (True, read_iops, write_iops, meets)
    assert row["podAccess"] == scratch.POD_ACCESS_RAID0


def test_nvme_scratch_off_offers_pods_nothing_even_on_p5():
    row = only_row([pool("train", "p5.48xlarge")], nvme_scratch=False)
    assert row["raid0"] is False and row["meetsHotTier"] is False
    assert (row["readIops"], row["writeIops"]) == (4_400_000, 2_200_000)       # what turning it on would give
    assert row["ephemeralStorageGiB"] is None and row["allocatableEphemeralStorageGiB"] is None
    assert row["podAccess"] == scratch.POD_ACCESS_OFF


def test_a_type_without_instance_store_has_no_iops_and_no_scratch():
    catalog = catalog_with(g5_12xlarge={"disks": 0, "diskGB": 0})
    row = only_row([pool("bare", "g5.12xlarge")], catalog)
    assert (row["disks"], row["totalGB"], row["raid0"]) == (0, 0, False)
    assert (row["readIops"], row["writeIops"], row["meetsHotTier"]) == (None, None, False)
    assert row["podAccess"] == scratch.POD_ACCESS_NO_DISKS


def test_unknown_iops_leave_the_hot_tier_unknown():
    catalog = catalog_with(g5_48xlarge={"disks": 2, "diskGB": 3800, "writeIops": 312_500})   # read figure missing
    row = only_row([pool("x", "g5.48xlarge")], catalog)
    assert (row["raid0"], row["readIops"], row["writeIops"], row["meetsHotTier"]) == (True, None, 312_500, None)


# --------------------------------------------------------------------------- pools of several types


@pytest.mark.parametrize("order", [("p5e.48xlarge", "p5en.48xlarge"), ("p5en.48xlarge", "p5e.48xlarge")])
def test_a_mixed_pool_shows_what_every_node_is_sure_to_get(order):
    catalog = catalog_with(p5en_48xlarge={"disks": 4, "diskGB": 3800, "readIops": 450_000, "writeIops": 3_000_000})
    row = only_row([pool("h200", *order)], catalog)
    assert (row["disks"], row["diskGB"]) == (4, 3800)                 # the smaller store
    assert (row["readIops"], row["writeIops"]) == (450_000, 2_200_000)  # each the lowest of the two
    assert row["meetsHotTier"] is False


def test_a_mixed_pool_with_one_unknown_figure_is_unknown():
    catalog = catalog_with(p5en_48xlarge={"disks": 8, "diskGB": 3800})
    row = only_row([pool("h200", "p5e.48xlarge", "p5en.48xlarge")], catalog)
    assert (row["readIops"], row["writeIops"], row["meetsHotTier"]) == (None, None, None)


def test_raid0_follows_the_first_type_like_the_node_pool():
    catalog = catalog_with(g5_12xlarge={"disks": 0, "diskGB": 0})
    assert only_row([pool("a", "g5.12xlarge", "g5.48xlarge")], catalog)["raid0"] is False
    assert only_row([pool("b", "g5.48xlarge", "g5.12xlarge")], catalog)["raid0"] is True
    p5 = CATALOG.instance_types["p5.48xlarge"]
    assert scratch.raid0_instance_store(p5, True) and not scratch.raid0_instance_store(p5, False)


# --------------------------------------------------------------------------- the node's ephemeral-storage


@pytest.mark.parametrize("instance_type,capacity_gib,allocatable_gib", [
    ("p5.48xlarge", 28_312, 25_479),     # 30,400 GB = 28,312.5 GiB; x 0.9 = 25,480.8; less 1 GiB
    ("p4d.24xlarge", 7_450, 6_704),      # 8,000 GB = 7,450.6 GiB
    ("g4dn.12xlarge", 838, 753),         # 900 GB = 838.2 GiB
])
def test_ephemeral_storage_is_the_array_not_the_root_volume(instance_type, capacity_gib, allocatable_gib):
    row = only_row([pool("p", instance_type)])
    assert (row["ephemeralStorageGiB"], row["allocatableEphemeralStorageGiB"]) == (capacity_gib, allocatable_gib)
    assert scratch.node_ephemeral_storage_gib(CATALOG.instance_types[instance_type]) == capacity_gib
    assert scratch.allocatable_ephemeral_storage_gib(capacity_gib) == allocatable_gib


def test_allocatable_subtracts_the_eviction_share_and_the_reservation():
    assert scratch.allocatable_ephemeral_storage_gib(1000) == 899       # 1000 - 10% - 1
    assert scratch.allocatable_ephemeral_storage_gib(100) == 89


# --------------------------------------------------------------------------- how pods use it


def test_the_scratch_volume_is_an_emptydir_with_a_size_limit():
    assert scratch.scratch_volume("2Ti") == {"name": "scratch", "emptyDir": {"sizeLimit": "2Ti"}}
    assert scratch.scratch_volume("500Gi", name="stage") == {"name": "stage", "emptyDir": {"sizeLimit": "500Gi"}}
    assert "medium" not in scratch.scratch_volume("1Ti")["emptyDir"]     # Memory would put it in RAM, not on NVMe
    assert scratch.scratch_mount() == {"name": "scratch", "mountPath": "/scratch"}
    with pytest.raises(ValueError, match="sizeLimit"):
        scratch.scratch_volume("")


def test_the_documented_paths_are_nodeadms():
    assert scratch.RAID0_MOUNT_PATH == "/mnt/k8s-disks/0"
    assert "/var/lib/kubelet" in scratch.RAID0_BIND_MOUNTS and "/var/lib/containerd" in scratch.RAID0_BIND_MOUNTS
    assert scratch.RAID0_MOUNT_PATH in scratch.POD_ACCESS_RAID0 and scratch.SCRATCH_MOUNT_PATH in scratch.POD_ACCESS_RAID0


# --------------------------------------------------------------------------- Lustre


def test_lustre_is_stated_as_sub_millisecond_not_100_us():
    assert scratch.LUSTRE_LATENCY == "sub-millisecond"
    assert "sub-millisecond" in scratch.LUSTRE_LATENCY_NOTE and "100 µs" in scratch.LUSTRE_LATENCY_NOTE
    assert "not the hot tier's design target of 100 µs" in scratch.LUSTRE_LATENCY_NOTE
    assert "docs.aws.amazon.com/fsx/latest/LustreGuide/what-is.html" in scratch.LUSTRE_LATENCY_SOURCE
    assert '"It provides sub-millisecond latencies' in scratch.LUSTRE_LATENCY_SOURCE


# --------------------------------------------------------------------------- the shipped stacks


@pytest.mark.parametrize("stack,expected", [
    ("prod-us-east-1", {"train-h100": True, "finetune-a100-80gb-spot": True, "finetune-a100-40gb-spot": True,
                        "infer-l40s": False}),
    ("prod-eu-west-1", {"train-a100": True, "infer-a10g": False, "infer-a10g-spot": False}),
    ("dev", {"dev-gpu-spot": False}),
])
def test_which_shipped_pools_meet_the_hot_tier(stack, expected):
    from plan.stackfile import load_stack
    _, spec = load_stack(stack)
    rows = scratch.scratch_rows(spec.pools, spec.catalog, spec.storage.nvme_scratch)
    assert {r["pool"]: r["meetsHotTier"] for r in rows} == expected
    assert all(r["raid0"] for r in rows)          # nvmeScratch defaults on, and every catalog type has NVMe
