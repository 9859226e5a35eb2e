"""Pool decisions: labels, taints, autoscaler tags, priorities, refresh pacing, verifier expectations."""
import itertools

from decisions.catalog.catalog import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, load_catalog
from decisions.config.model import LABEL_VALUE
from decisions.nodes import autoscaling, pools
from tests.test_validate import load, valid_config


def pools_of(mutate=None):
    config = valid_config()
    if mutate:
        mutate(config)
    return load(config).pools


def test_every_gpu_pool_is_tainted_and_labelled():
    train, infer = pools_of()
    for pool in (train, infer):
        assert pools.Taint("nvidia.com/gpu", "true", "NoSchedule") in pools.node_taints(pool)
        labels = pools.node_labels(pool)
        assert labels["gpu-cloud.io/pool"] == pool.name and labels["gpu-cloud.io/capacity"] == pool.spec.capacity
    assert pools.node_labels(train)["gpu-cloud.io/gpu-model"] == "H100"
    assert pools.node_labels(train)["gpu-cloud.io/efa"] == "true"


def test_user_labels_and_taints_are_carried():
    def extra(c):
        c["nodePools"][1].update(labels={"team": "search"}, taints=[{"key": "dedicated", "value": "search", "effect": "NoExecute"}])
    _, infer = pools_of(extra)
    assert pools.node_labels(infer)["team"] == "search"
    assert pools.Taint("dedicated", "search", "NoExecute") in pools.node_taints(infer)


def test_autoscaler_tags_describe_the_node_for_scale_from_zero():
    train, infer = pools_of()
    tags = autoscaling.node_group_tags(train, "gpu-cloud-test", nvme_scratch=True)
    assert tags["k8s.io/cluster-autoscaler/gpu-cloud-test/gpu-pool"] == "owned"
    assert "k8s.io/cluster-autoscaler/enabled" not in tags        # EKS puts that on the system node group's group too
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "8"
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "32"
    assert tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
    for key, value in pools.node_labels(train).items():
        assert tags[f"k8s.io/cluster-autoscaler/node-template/label/{key}"] == value
    assert "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa" not in \
        autoscaling.node_group_tags(infer, "c", nvme_scratch=True)


def test_shared_gpus_advertise_their_slices():
    # 16 slots a node: Triton's 8 replicas reach 2 nodes (decisions/nodes/autoscaling.reachable_nodes)
    _, infer = pools_of(lambda c: c["nodePools"][1].update(gpuSharing={"mode": "time-slicing", "replicas": 4},
                                                           maxNodes=2))
    template = "k8s.io/cluster-autoscaler/node-template/resources/"
    assert autoscaling.node_group_tags(infer, "c", nvme_scratch=True)[template + "nvidia.com/gpu"] == str(4 * 4)
    assert pools.node_labels(infer)["nvidia.com/device-plugin.config"] == "time-slicing-4"
    # MIG, mixed strategy: slices are nvidia.com/mig-<profile> (no nvidia.com/gpu), 4 of 1g.20gb per H100
    train, _ = pools_of(lambda c: c["nodePools"][0].update(gpuSharing={"mode": "mig", "migProfile": "1g.20gb"}))
    tags = autoscaling.node_group_tags(train, "c", nvme_scratch=True)
    assert tags[template + "nvidia.com/mig-1g.20gb"] == str(8 * 4) and tags[template + "nvidia.com/gpu"] == "0"
    assert pools.node_labels(train)["nvidia.com/mig.config"] == "1g.20gbx4"      # the layout it is cut into


TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"


def _template(pool) -> dict:
    tags = autoscaling.node_group_tags(pool, "c", nvme_scratch=True)
    return {k[len(TEMPLATE):]: v for k, v in tags.items() if k.startswith(TEMPLATE)}


def _sharing_labels(labels) -> dict:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}


def test_an_mps_pool_advertises_replicas_of_each_gpu_in_its_template():
    # 8 clients of each p4de A100 80GB (the design's 8 x 10 GB): 64 nvidia.com/gpu a node, the config by label.
    def mps(c):
        c["nodePools"][1].update(instanceTypes=["p4de.24xlarge"], gpuSharing={"mode": "mps", "replicas": 8},
                                 maxNodes=2)                   # all Triton's 8 replicas reach in 64 slots a node
    _, infer = pools_of(mps)
    template = _template(infer)
    assert {k: v for k, v in template.items() if not k.startswith("label/gpu-cloud.io/")} == {
        "label/k8s.amazonaws.com/accelerator": "nvidia-a100-80gb",
        "label/nvidia.com/device-plugin.config": "mps-8",
        "taint/nvidia.com/gpu": "true:NoSchedule",
        "taint/gpu-cloud.io/interruptible": "true:NoSchedule",
        "resources/nvidia.com/gpu": "64",
        "resources/pods": "110",
        "resources/ephemeral-storage": "6704Gi",          # 8 x 1,000 GB of NVMe in RAID0, less 10 % and 1 GiB
    }
    assert _sharing_labels(pools.node_labels(infer)) == {"nvidia.com/device-plugin.config": "mps-8"}
    assert pools.verify_expectations(infer, load(valid_config()).node_image, 85, load_catalog())[
        "p4de.24xlarge"]["migMode"] == "disabled"                          # MPS needs MIG off (the gate checks it)


def test_a_mixed_mig_pool_advertises_each_profile_in_its_template():
    def mixed(c):
        c["nodePools"][0].update(gpuSharing={"mode": "mig", "migProfiles": {"3g.40gb": 1, "1g.10gb": 2, "1g.20gb": 1}})
    train, _ = pools_of(mixed)
    template = _template(train)
    assert {k: v for k, v in template.items() if k.startswith("resources/")} == {
        "resources/nvidia.com/mig-1g.10gb": str(8 * 2), "resources/nvidia.com/mig-1g.20gb": str(8 * 1),
        "resources/nvidia.com/mig-3g.40gb": str(8 * 1), "resources/vpc.amazonaws.com/efa": "32",
        "resources/nvidia.com/gpu": "0", "resources/pods": "51", "resources/ephemeral-storage": "25479Gi"}
    assert template["label/nvidia.com/mig.config"] == "1g.10gbx2-1g.20gbx1-3g.40gbx1"
    assert _sharing_labels(pools.node_labels(train)) == {"nvidia.com/mig.config": "1g.10gbx2-1g.20gbx1-3g.40gbx1"}
    assert pools.mig_layout(train, load_catalog()) == {"3g.40gb": 1, "1g.10gb": 2, "1g.20gb": 1}


def test_a_single_profile_mig_pool_is_cut_into_as_many_as_fit():
    train, _ = pools_of(lambda c: c["nodePools"][0].update(gpuSharing={"mode": "mig", "migProfile": "1g.10gb"}))
    assert pools.mig_layout(train, load_catalog()) == {"1g.10gb": 7}
    assert pools.mig_config_name({"1g.10gb": 7}) == "1g.10gbx7"


def test_every_layout_within_a_gpus_slices_names_a_valid_label_value():
    # The config name is the node's nvidia.com/mig.config label: at most 63 characters of [-A-Za-z0-9_.].
    catalog, longest = load_catalog(), ""
    for gpu in (g for g in catalog.gpus.values() if g.supports_mig):
        profiles = sorted(gpu.mig_profiles)
        for counts in itertools.product(*(range(gpu.mig_profiles[p] + 1) for p in profiles)):
            layout = {p: n for p, n in zip(profiles, counts) if n}
            if layout and all(a <= b for a, b in zip(gpu.mig_slices(layout), (MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES))):
                name = pools.mig_config_name(layout)
                assert LABEL_VALUE.match(name), name
                longest = max(longest, name, key=len)
    assert len(longest) <= 63, longest


def test_priorities_prefer_paid_for_capacity_then_spot_then_on_demand():
    train, infer = pools_of()
    assert pools.autoscaler_priority(train) > pools.autoscaler_priority(infer)
    _, od = pools_of(lambda c: c["nodePools"][1].update(capacity="on-demand"))
    assert pools.autoscaler_priority(infer) > pools.autoscaler_priority(od)
    _, pinned = pools_of(lambda c: c["nodePools"][1].update(autoscalerPriority=99))
    assert pools.autoscaler_priority(pinned) == 99


def test_reserved_capacity_is_never_replaced_faster_than_it_refills():
    train, infer = pools_of()
    reserved = pools.refresh_preferences(train)
    assert reserved.max_healthy_percentage == 100           # no surge: the reservation has no spare slot
    assert reserved.min_healthy_percentage == 50            # 2 nodes: one at a time
    surge = pools.refresh_preferences(infer)
    assert surge.max_healthy_percentage > 100 and surge.min_healthy_percentage >= 90


def test_verifier_expectations_per_instance_type():
    spec = load(valid_config())
    train = spec.pools[0]
    expect = pools.verify_expectations(train, spec.node_image, 85, spec.catalog)["p5.48xlarge"]
    assert expect == {"instanceType": "p5.48xlarge", "gpuModel": "H100", "gpuCount": 8, "gpuMemoryMiB": 81920,
                      "nvlinkLinksPerGpu": 18, "nvswitch": True, "driverBranch": "580", "driverVersion": "580.159.03",
                      "maxTempC": 85, "migMode": "disabled", "eccExpected": True, "eccReservesMemory": False}
    config = valid_config()
    config["nodePools"][1].update(instanceTypes=["p5en.48xlarge", "p5e.48xlarge"], maxNodes=3)   # 8 GPUs: Triton's 3
    config["gpuDriver"] = {"source": "install", "branch": "580"}
    spec = load(config)
    both = pools.verify_expectations(spec.pools[1], spec.node_image, 85, spec.catalog)
    assert set(both) == {"p5en.48xlarge", "p5e.48xlarge"} and both["p5e.48xlarge"]["gpuModel"] == "H200"
    assert both["p5e.48xlarge"]["driverVersion"] is None and both["p5e.48xlarge"]["driverBranch"] == "580"


def test_gpu_nodes_carry_the_autoscaler_accelerator_label_on_the_node_and_in_its_template():
    train, infer = pools_of()
    assert pools.node_labels(train)["k8s.amazonaws.com/accelerator"] == "nvidia-h100"
    assert pools.node_labels(infer)["k8s.amazonaws.com/accelerator"] == "nvidia-l40s"
    assert pools.accelerator_label("A100 40GB") == "nvidia-a100-40gb"
    tags = autoscaling.node_group_tags(train, "c", nvme_scratch=True)
    assert tags["k8s.io/cluster-autoscaler/node-template/label/k8s.amazonaws.com/accelerator"] == "nvidia-h100"


def test_template_tag_prefixes_leave_82_characters_for_keys():
    # ASG tag keys hold at most 128 characters and the node-template prefixes take 46 of them;
    # decisions/config/validate.py refuses longer label and taint keys
    assert len(pools.TEMPLATE_LABEL_PREFIX) == len(pools.TEMPLATE_TAINT_PREFIX) == 46
    assert pools.ASG_TAG_KEY_MAX - len(pools.TEMPLATE_LABEL_PREFIX) == 82
