"""The GPU catalog: data loads, matches its public sources entry by entry, and answers questions."""
import pytest

from decisions.catalog.catalog import load_catalog

CATALOG = load_catalog()


def test_catalog_covers_the_families_gpu_cloud_supports():
    expected = {"g4dn.12xlarge", "g4dn.metal", "g5.12xlarge", "g5.48xlarge", "g6.12xlarge", "g6.48xlarge",
                "g6e.12xlarge", "g6e.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
                "p5en.48xlarge", "p6-b200.48xlarge",
                # the single-GPU sizes inference teams use most (issue #41)
                "g5.xlarge", "g5.2xlarge", "g6.xlarge", "g6.2xlarge", "g6e.xlarge", "g6e.2xlarge"}
    assert expected <= set(CATALOG.instance_types)


# Every catalog type, entry by entry, from EC2 DescribeInstanceTypes as generated into aws/karpenter-provider-aws
# pkg/providers/instancetype (2026-07/08), the source decisions/catalog/catalog.yaml names.
HARDWARE = [
    # type,              GPU,         GPUs, GPU MiB, vCPU, GiB,  Gbps, cards, EFA cards, NVMe GB
    ("g4dn.12xlarge",    "T4",        4, 16384,  48,  192,   50,  1,  1,   900),
    ("g4dn.metal",       "T4",        8, 16384,  96,  384,  100,  1,  1,  1800),
    ("g5.xlarge",        "A10G",      1, 22888,   4,   16,  2.5,  1,  0,   250),
    ("g5.2xlarge",       "A10G",      1, 22888,   8,   32,    5,  1,  0,   450),
    ("g5.12xlarge",      "A10G",      4, 22888,  48,  192,   40,  1,  1,  3800),
    ("g5.48xlarge",      "A10G",      8, 22888, 192,  768,  100,  1,  1,  7600),
    ("g6.xlarge",        "L4",        1, 22888,   4,   16,  2.5,  1,  0,   250),
    ("g6.2xlarge",       "L4",        1, 22888,   8,   32,    5,  1,  0,   450),
    ("g6.12xlarge",      "L4",        4, 22888,  48,  192,   40,  1,  1,  3760),
    ("g6.48xlarge",      "L4",        8, 22888, 192,  768,  100,  1,  1,  7520),
    ("g6e.xlarge",       "L40S",      1, 45776,   4,   32,  2.5,  1,  0,   250),
    ("g6e.2xlarge",      "L40S",      1, 45776,   8,   64,    5,  1,  0,   450),
    ("g6e.12xlarge",     "L40S",      4, 45776,  48,  384,  100,  1,  1,  3800),
    ("g6e.48xlarge",     "L40S",      8, 45776, 192, 1536,  400,  4,  4,  7600),
    ("p4d.24xlarge",     "A100 40GB", 8, 40960,  96, 1152,  400,  4,  4,  8000),
    ("p4de.24xlarge",    "A100 80GB", 8, 81920,  96, 1152,  400,  4,  4,  8000),
    ("p5.48xlarge",      "H100",      8, 81920, 192, 2048, 3200, 32, 32, 30400),
    ("p5e.48xlarge",     "H200",      8, 144384, 192, 2048, 3200, 32, 32, 30400),
    ("p5en.48xlarge",    "H200",      8, 144384, 192, 2048, 3200, 16, 16, 30400),
    ("p6-b200.48xlarge", "B200",      8, 183359, 192, 2048, 3200,  8,  8, 30400),
]


def test_the_hardware_table_covers_every_catalog_type():
    assert {row[0] for row in HARDWARE} == set(CATALOG.instance_types)


@pytest.mark.parametrize("name,model,gpus,gpu_mib,vcpu,memory_gib,gbps,cards,efa_cards,nvme_gb", HARDWARE)
def test_every_type_matches_the_reference(name, model, gpus, gpu_mib, vcpu, memory_gib, gbps, cards, efa_cards, nvme_gb):
    t = CATALOG.instance_types[name]
    assert (t.gpu.model, t.gpu.count, t.gpu.memory_mib) == (model, gpus, gpu_mib)
    assert (t.vcpu, t.memory_gib, t.network_gbps, t.network_cards, t.efa.cards) == (vcpu, memory_gib, gbps, cards, efa_cards)
    assert t.instance_store.disks * t.instance_store.disk_gb == nvme_gb


# Network interfaces on the default card and IPv4 addresses per interface (what the VPC CNI and nodeadm's max-pods read),
# every catalog type, from awslabs/amazon-eks-ami v20260724 nodeadm/internal/kubelet/instance-info.jsonl
# (defaultMaxENIs, ipv4AddressesPerInterface).
ENI = {
    "g4dn.12xlarge": (8, 30), "g4dn.metal": (15, 50),
    "g5.xlarge": (4, 15), "g5.2xlarge": (4, 15), "g5.12xlarge": (15, 50), "g5.48xlarge": (7, 50),
    "g6.xlarge": (4, 15), "g6.2xlarge": (4, 15), "g6.12xlarge": (8, 30), "g6.48xlarge": (15, 50),
    "g6e.xlarge": (4, 15), "g6e.2xlarge": (4, 15), "g6e.12xlarge": (10, 30), "g6e.48xlarge": (10, 50),
    "p4d.24xlarge": (15, 50), "p4de.24xlarge": (15, 50), "p5.48xlarge": (2, 50), "p5e.48xlarge": (2, 50),
    "p5en.48xlarge": (4, 50), "p6-b200.48xlarge": (4, 50),
}


@pytest.mark.parametrize("name", sorted(CATALOG.instance_types))
def test_every_types_interfaces_match_the_eks_ami(name):
    eni = CATALOG.instance_types[name].eni
    assert (eni.default_card_max, eni.ipv4_per_interface) == ENI[name]


# MIG instances per GPU, every profile of every MIG GPU: NVIDIA MIG User Guide, "Supported MIG Profiles",
# "Number of Instances Available" (A100-SXM4-40GB table; 80 GB, H100, H200, B200 tables).
MIG_INSTANCES = {
    "A100 40GB": {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    "A100 80GB": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H100": {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    "H200": {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
    "B200": {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1},
}


def test_mig_instance_counts_entry_by_entry():
    assert {model: dict(gpu.mig_profiles) for model, gpu in CATALOG.gpus.items() if gpu.supports_mig} == MIG_INSTANCES
    assert all(not gpu.mig_profiles for model, gpu in CATALOG.gpus.items() if model not in MIG_INSTANCES)


# Memory slices (of 8) per profile: the same tables' "Fraction of Memory" (1/8, 2/8, 4/8, Full).
MIG_MEMORY_SLICES = {
    "A100 40GB": {"1g.5gb": 1, "1g.10gb": 2, "2g.10gb": 2, "3g.20gb": 4, "4g.20gb": 4, "7g.40gb": 8},
    "A100 80GB": {"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8},
    "H100": {"1g.10gb": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8},
    "H200": {"1g.18gb": 1, "1g.35gb": 2, "2g.35gb": 2, "3g.71gb": 4, "4g.71gb": 4, "7g.141gb": 8},
    "B200": {"1g.23gb": 1, "1g.45gb": 2, "2g.45gb": 2, "3g.90gb": 4, "4g.90gb": 4, "7g.180gb": 8},
}


def test_mig_memory_slices_entry_by_entry_and_the_slices_a_layout_takes():
    assert {model: dict(gpu.mig_memory_slices) for model, gpu in CATALOG.gpus.items() if gpu.supports_mig} == MIG_MEMORY_SLICES
    assert all(not gpu.mig_memory_slices for model, gpu in CATALOG.gpus.items() if model not in MIG_MEMORY_SLICES)
    # compute slices from the name, memory from the table
    assert CATALOG.gpus["A100 80GB"].mig_slices({"1g.10gb": 2, "3g.40gb": 1, "1g.20gb": 1}) == (6, 8)
    assert CATALOG.gpus["A100 40GB"].mig_slices({"1g.10gb": 4}) == (4, 8)


@pytest.mark.parametrize("change,words", [
    ({"migMemorySlices": {"1g.10gb": 1}}, "every MIG profile needs both"),
    ({"migProfiles": {"1g.10gb": 8}, "migMemorySlices": {"1g.10gb": 1}}, "1g.10gb: 8, but 7 fit"),       # compute-bound
    ({"migProfiles": {"1g.20gb": 4}, "migMemorySlices": {"1g.20gb": 1}}, "1g.20gb: 4, but 7 fit"),       # memory wrong
    ({"migProfiles": {"4g.40gb": 2}, "migMemorySlices": {"4g.40gb": 4}}, "4g.40gb: 2, but 1 fit"),
])
def test_mig_counts_must_be_what_the_slices_allow(change, words):
    from decisions.catalog.catalog import GpuModel
    data = CATALOG.gpus["H100"].model_dump(by_alias=True)
    with pytest.raises(ValueError, match=words):
        GpuModel.model_validate({**data, **change})


# NVIDIA, "CUDA GPU Compute Capability" (developer.nvidia.com/cuda-gpus): the architecture of every catalog GPU. The DR
# pair check refuses two architectures for one replicated model repository (decisions/serving/dr_pair.py).
ARCHITECTURES = {"T4": "turing", "A10G": "ampere", "A100 40GB": "ampere", "A100 80GB": "ampere", "L4": "ada",
                 "L40S": "ada", "H100": "hopper", "H200": "hopper", "B200": "blackwell"}


def test_every_gpu_has_its_architecture():
    assert {model: gpu.architecture for model, gpu in CATALOG.gpus.items()} == ARCHITECTURES


def test_a_misspelt_architecture_is_refused():
    from decisions.catalog.catalog import GpuModel
    data = CATALOG.gpus["A10G"].model_dump(by_alias=True)
    with pytest.raises(ValueError, match="'turing', 'ampere', 'ada', 'hopper' or 'blackwell'"):
        GpuModel.model_validate({**data, "architecture": "ampre"})


@pytest.mark.parametrize("name,model,count,links,nvswitch", [
    ("p5.48xlarge", "H100", 8, 18, True), ("p4d.24xlarge", "A100 40GB", 8, 12, True),
    ("p6-b200.48xlarge", "B200", 8, 18, True), ("g6e.48xlarge", "L40S", 8, 0, False), ("g4dn.12xlarge", "T4", 4, 0, False),
])
def test_interconnect_facts(name, model, count, links, nvswitch):
    itype = CATALOG.instance_types[name]
    gpu = CATALOG.gpu_model(name)
    assert (itype.gpu.model, itype.gpu.count, gpu.nvlink_links_per_gpu, gpu.nvswitch) == (model, count, links, nvswitch)


def test_mig_only_on_datacenter_hopper_ampere_blackwell():
    mig = {name for name, gpu in CATALOG.gpus.items() if gpu.supports_mig}
    assert mig == {"A100 40GB", "A100 80GB", "H100", "H200", "B200"}


def test_driver_floors():
    assert CATALOG.gpus["B200"].min_driver_branch == 570
    assert CATALOG.gpus["H200"].min_driver_branch == 550
    assert CATALOG.gpus["H100"].min_driver_branch == 525


def test_region_offers_match_the_reference():
    eu = set(CATALOG.types_in_region("eu-west-1"))
    assert {"p4d.24xlarge", "g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge", "g4dn.12xlarge"} <= eu
    assert not eu & {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g6.12xlarge", "g6e.12xlarge",
                     "g6.xlarge", "g6.2xlarge", "g6e.xlarge", "g6e.2xlarge"}
    assert CATALOG.instance_types["p5.48xlarge"].regions["us-east-1"].on_demand_usd == 55.04


def _catalog_data() -> dict:
    import yaml
    from decisions.catalog.catalog import CATALOG_PATH
    return yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))


def test_prices_carry_source_and_date():
    # Each region's prices name where they were read and when: us-east-1 the karpenter price list, the others the
    # SkyPilot snapshot (test_every_priced_offer_cites_its_regions_source holds every offer to it).
    for region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"):
        assert CATALOG.price_sources[region].as_of and "price list" in CATALOG.price_sources[region].source
    assert 0 < CATALOG.default_spot_discount < 1


@pytest.mark.parametrize("change,words", [
    # a price with no source: the catalog's own check names the type, the offer and the key to add
    (lambda d: d["priceSources"].pop("eu-west-1"),
     r"g4dn.12xlarge: regions.eu-west-1.onDemandUsd 4.362 has no source: give the offer its own source and asOf, or "
     r"add priceSources.eu-west-1"),
    (lambda d: d["priceSources"]["us-east-1"].pop("asOf"), r"priceSources.us-east-1.asOf\n  Field required"),
    (lambda d: d["instanceTypes"]["p5.48xlarge"]["regions"]["us-east-1"].update(source="AWS Price List Query API"),
     r"instanceTypes.`p5.48xlarge`.regions.us-east-1\n  Value error, source and asOf go together"),
    (lambda d: d.update(defaultSpotDiscount=1), r"defaultSpotDiscount\n  Input should be less than 1"),
], ids=["price-without-source", "source-without-date", "offer-source-without-asOf", "spot-default-not-a-share"])
def test_a_price_without_its_source_or_date_is_refused_by_key(change, words):
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    data = _catalog_data()
    change(data)
    with pytest.raises(ValidationError, match=words):
        Catalog.model_validate(data)


def test_an_unpriced_offer_needs_no_source_and_an_offer_may_cite_its_own():
    from decisions.catalog.catalog import Catalog
    data = _catalog_data()
    data["priceSources"].pop("ap-northeast-1")
    for spec in data["instanceTypes"].values():          # the region's prices gone: nothing left to cite
        if "ap-northeast-1" in spec["regions"]:
            spec["regions"]["ap-northeast-1"] = {"onDemandUsd": None}
    data["instanceTypes"]["g5.12xlarge"]["regions"]["ap-northeast-1"] = {
        "onDemandUsd": 8.2, "source": "AWS Price List Query API", "asOf": "2026-09-01"}
    catalog = Catalog.model_validate(data)
    assert catalog.price_source("g5.12xlarge", "ap-northeast-1").cited == "AWS Price List Query API, 2026-09-01"
    assert catalog.price_source("g4dn.12xlarge", "ap-northeast-1") is None
    assert catalog.price_source("g5.12xlarge", "us-east-1") == CATALOG.price_sources["us-east-1"]


@pytest.mark.parametrize("name,meant", [
    ("p5.48xlarg", "p5.48xlarge"),        # not a size EC2 has: a typo, one edit away
    ("g6e,12xlarge", "g6e.12xlarge"),
    ("p4d.24xlrge", "p4d.24xlarge"),
    ("g6e.24xlarge", None),               # shaped like an EC2 type, one keystroke from g6e.2xlarge: meant as written
    ("g6e.2xlarg", "g6e.2xlarge"),        # the single-GPU sizes are suggested like any catalog type
    ("g5xlarge", "g5.xlarge"),
    ("g5.24xlarge", None),
    ("g6e.4xlarge", None),
    ("p5.4xlarge", None),
    ("nonsense", None),
    ("g6.2xl", None),                     # 4 edits from g6.2xlarge: too far to be a typo
])
def test_did_you_mean_only_for_near_misspellings(name, meant):
    assert CATALOG.suggest(name) == meant


@pytest.mark.parametrize("a,b,distance", [("p5.48xlarg", "p5.48xlarge", 1), ("g6e.2xlarge", "g6e.12xlarge", 1),
                                          ("kitten", "sitting", 3), ("", "abc", 3), ("abc", "abc", 0)])
def test_edit_distance(a, b, distance):
    from decisions.catalog.catalog import edit_distance
    assert edit_distance(a, b) == distance == edit_distance(b, a)


def test_the_edit_limit_is_at_its_boundary():
    # one edit per 5 characters: 10 characters allow 2, 9 allow 1; both names below are 2 edits from p5.48xlarge
    assert CATALOG.suggest("p5.48xlarX") == "p5.48xlarge"
    assert CATALOG.suggest("p5.48xlar") is None
    assert CATALOG.suggest("p5.48xlarXYZ") is None              # 12 characters, but 3 edits: more than 2


def test_efa_cards_never_exceed_network_cards():
    # The catalog's validator refuses more EFA cards than network cards, naming the type and both keys (so every
    # loaded type has efa.cards <= networkCards).
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    data = _catalog_data()
    data["instanceTypes"]["p4d.24xlarge"]["efa"]["cards"] = 5
    with pytest.raises(ValidationError, match=r"p4d.24xlarge: efa.cards 5 > networkCards 4"):
        Catalog.model_validate(data)
    data["instanceTypes"]["p4d.24xlarge"]["efa"]["cards"] = 4          # as many as the cards: accepted
    assert Catalog.model_validate(data).instance_types["p4d.24xlarge"].efa.cards == 4


# NCCL acceptance, entry by entry, from the published figures themselves (read at the cited tag and line).
# Across two nodes: AWS's two-node all_reduce_perf results, aws-samples/awsome-distributed-training v1.2.0
# micro-benchmarks/nccl-tests/README.md (2 x p4de: 78.33 GB/s at 2 GiB, line 187; 2 x p5: 487.09 GB/s at 16 GiB,
# line 225). Within a node: Azure/azurehpc-health-checks v0.4.5 check_nccl_allreduce pass marks (nd96asr_v4 228 at
# 8G, nd96amsr_a100_v4 228 at 16G, nd96isr_h100_v5 460, nd96isr_h200_v5 431) below what healthy nodes show (NVIDIA/nccl
# issue 527: 230.77 on a p4d; NVIDIA/nccl-tests issues 212: ~480 on H100, 272: 475 on H200). No figure, no minimum:
# p5en across nodes, p6-b200 and the g families.
FRACTION = 0.9      # the share of AWS's two-node figure a pair must show
GIB = 1 << 30
AWS_README = "aws-samples/awsome-distributed-training v1.2.0 micro-benchmarks/nccl-tests/README.md line"
ACROSS_NODES = {
    # type:              (published GB/s, at bytes, measured on,     source cites)
    "p4d.24xlarge":      (78.33, 2 * GIB, "p4de.24xlarge", f"{AWS_README} 187"),
    "p4de.24xlarge":     (78.33, 2 * GIB, None, f"{AWS_README} 187"),
    "p5.48xlarge":       (487.09, 16 * GIB, None, f"{AWS_README} 225"),
    "p5e.48xlarge":      (487.09, 16 * GIB, "p5.48xlarge", f"{AWS_README} 225"),
}
AZURE = "Azure/azurehpc-health-checks v0.4.5 conf/"
WITHIN_NODE = {
    # type:              (minimum, source cites,                        healthy, healthy source cites)
    "p4d.24xlarge":      (228, f"{AZURE}nd96asr_v4.conf line 57", 230.77, "NVIDIA/nccl issue 527"),
    "p4de.24xlarge":     (228, f"{AZURE}nd96amsr_a100_v4.conf line 57", None, None),
    "p5.48xlarge":       (460, f"{AZURE}nd96isr_h100_v5.conf line 52", 480, "NVIDIA/nccl-tests issue 212"),
    "p5e.48xlarge":      (431, f"{AZURE}nd96isr_h200_v5.conf line 53", 475, "NVIDIA/nccl-tests issue 272"),
    "p5en.48xlarge":     (431, f"{AZURE}nd96isr_h200_v5.conf line 53", 475, "NVIDIA/nccl-tests issue 272"),
}


def test_the_across_node_fraction_is_stored_once():
    assert CATALOG.nccl_across_nodes_fraction == FRACTION


@pytest.mark.parametrize("scope, field, table", [("acrossNodes", "across_nodes", ACROSS_NODES),
                                                 ("withinNode", "within_node", WITHIN_NODE)])
def test_a_type_without_a_published_figure_has_no_minimum(scope, field, table):
    for name in (row[0] for row in HARDWARE if row[0] not in table):
        nccl = CATALOG.instance_types[name].nccl_bus_bandwidth_gbps
        assert (getattr(nccl, field) if nccl else None) is None, name
        assert CATALOG.nccl_minimum_gbps(name, scope) is None, name


@pytest.mark.parametrize("name", sorted(ACROSS_NODES))
def test_across_node_figures_entry_by_entry(name):
    from decisions.catalog.catalog import across_nodes_ceiling_gbps
    figure = CATALOG.instance_types[name].nccl_bus_bandwidth_gbps.across_nodes
    published, size, measured_on, cites = ACROSS_NODES[name]
    assert (figure.published_gbps, figure.message_bytes, figure.measured_on) == (published, size, measured_on)
    assert figure.source.startswith(cites + ":") and f"{published:g} GB/s" in figure.source
    minimum = CATALOG.nccl_minimum_gbps(name, "acrossNodes")
    assert minimum == pytest.approx(FRACTION * published)
    itype = CATALOG.instance_types[name]
    assert minimum < published <= across_nodes_ceiling_gbps(itype.network_gbps, itype.gpu.count)


@pytest.mark.parametrize("name", sorted(WITHIN_NODE))
def test_within_node_minimums_entry_by_entry(name):
    within = CATALOG.instance_types[name].nccl_bus_bandwidth_gbps.within_node
    minimum, cites, healthy, healthy_cites = WITHIN_NODE[name]
    assert (within.minimum_gbps, within.healthy_gbps) == (minimum, healthy)
    assert within.source.startswith(cites + ":") and f"check_nccl_allreduce {minimum:.1f} 1 " in within.source
    assert CATALOG.nccl_minimum_gbps(name, "withinNode") == minimum
    if healthy is None:
        assert within.healthy_source is None
    else:
        assert within.healthy_source.startswith(healthy_cites) and f"{healthy:g} GB/s" in within.healthy_source
        assert minimum < healthy


@pytest.mark.parametrize("network_gbps, gpus, ceiling", [(400, 8, 93.75), (3200, 8, 750.0), (400, 4, 87.5)])
def test_the_across_node_ceiling_is_the_network_times_the_bus_factor(network_gbps, gpus, ceiling):
    from decisions.catalog.catalog import across_nodes_ceiling_gbps
    assert across_nodes_ceiling_gbps(network_gbps, gpus) == ceiling


P5_WITHIN = {"minimumGBps": 460, "source": "s"}


def _across(published=487.09, size=16 * GIB, **more):
    return {"publishedGBps": published, "messageBytes": size, "source": "s", **more}


def test_a_figure_two_nodes_cannot_reach_is_refused_and_the_ceiling_itself_is_not():
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    assert Catalog.model_validate(_catalog_with("p5.48xlarge", {"acrossNodes": _across(750), "withinNode": P5_WITHIN}))
    with pytest.raises(ValidationError, match="publishedGBps 751 GB/s is more than two nodes with 3200 Gbps can reach"):
        Catalog.model_validate(_catalog_with("p5.48xlarge", {"acrossNodes": _across(751), "withinNode": P5_WITHIN}))


def _catalog_with(instance_type: str, nccl, **top) -> dict:
    import yaml
    from decisions.catalog.catalog import CATALOG_PATH
    data = yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))
    data["instanceTypes"][instance_type]["ncclBusBandwidthGBps"] = nccl
    return {**data, **top}


@pytest.mark.parametrize("instance_type,nccl,message", [
    ("p5.48xlarge", {}, "needs acrossNodes or withinNode"),
    ("p5.48xlarge", {"acrossNodes": _across(0)}, "greater than 0"),
    ("p5.48xlarge", {"acrossNodes": _across(), "withinNodes": P5_WITHIN}, "withinNodes"),       # misspelt key
    ("p5.48xlarge", {"acrossNodes": {k: v for k, v in _across().items() if k != "source"}}, "source"),
    ("p5.48xlarge", {"acrossNodes": _across(size=12 * GIB)}, "messageBytes 12884901888 is not a power of two"),
    ("p5.48xlarge", {"acrossNodes": _across(measuredOn="p5.4xlarge")}, "measuredOn 'p5.4xlarge' is not a catalog type"),
    ("p5en.48xlarge", {"acrossNodes": _across(measuredOn="p5.48xlarge")},
     r"measuredOn p5.48xlarge has another network \(Gbps, EFA cards, GPUs: \(3200, 32, 8\) vs \(3200, 16, 8\)\)"),
    ("p5.48xlarge", {"withinNode": {"minimumGBps": 460}}, "source"),
    ("p5.48xlarge", {"withinNode": {**P5_WITHIN, "healthyGBps": 480}}, "healthyGBps and healthySource go together"),
    ("p5.48xlarge", {"withinNode": {"minimumGBps": 500, "source": "s", "healthyGBps": 480, "healthySource": "s"}},
     "minimumGBps 500 is not below what a healthy node shows"),
    ("p5.48xlarge", {"withinNode": {"minimumGBps": 480, "source": "s", "healthyGBps": 480, "healthySource": "s"}},
     r"minimumGBps 480 is not below what a healthy node shows \(480 GB/s\)"),
    ("g6e.48xlarge", {"withinNode": {"minimumGBps": 100, "source": "s"}},
     "g6e.48xlarge: ncclBusBandwidthGBps.withinNode is an NVLink minimum"),
])
def test_nccl_figures_are_validated_strictly(instance_type, nccl, message):
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    with pytest.raises(ValidationError, match=message):
        Catalog.model_validate(_catalog_with(instance_type, nccl))


@pytest.mark.parametrize("fraction", [0, 1, 1.1])
def test_the_fraction_is_a_share_below_the_whole(fraction):
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    with pytest.raises(ValidationError, match="ncclAcrossNodesFraction"):
        Catalog.model_validate(_catalog_with("p5.48xlarge", {"withinNode": P5_WITHIN},
                                             ncclAcrossNodesFraction=fraction))


# Instance store IOPS, entry by entry: AWS, EC2 Instance Types guide, accelerated computing, "Instance store
# specifications" (ac.html#ac_instance-store): volumes as "N x GB" and "100% random read IOPS / Write IOPS"
# (4,096-byte blocks, all volumes, queue depth saturation). The layout column is checked too, so a row copied for
# the wrong type shows. Every catalog type has instance store; a figure not re-found is None, never guessed.
INSTANCE_STORE_IOPS = [
    # type,              AWS volumes,    read IOPS, write IOPS
    ("g4dn.12xlarge",    "1 x 900 GB",     250_000,   200_000),
    ("g4dn.metal",       "2 x 900 GB",     500_000,   400_000),
    ("g5.xlarge",        "1 x 250 GB",      40_625,    20_313),
    ("g5.2xlarge",       "1 x 450 GB",      40_625,    20_313),
    ("g5.12xlarge",      "1 x 3800 GB",    312_500,   156_250),
    ("g5.48xlarge",      "2 x 3800 GB",    625_000,   312_500),
    ("g6.xlarge",        "1 x 250 GB",      40_625,    20_000),
    ("g6.2xlarge",       "1 x 450 GB",        None,      None),     # not recorded when it was added
    ("g6.12xlarge",      "4 x 940 GB",     312_500,   125_000),
    ("g6.48xlarge",      "8 x 940 GB",     625_000,   312_496),
    # G6e's small sizes: karpenter's total as one volume (AWS's layout not re-found); IOPS only in a third party's copy
    ("g6e.xlarge",       "1 x 250 GB",        None,      None),
    ("g6e.2xlarge",      "1 x 450 GB",        None,      None),
    ("g6e.12xlarge",     "2 x 1900 GB",    312_500,   125_000),
    ("g6e.48xlarge",     "4 x 1900 GB",    625_000,   312_500),
    ("p4d.24xlarge",     "8 x 1000 GB",  2_000_000, 1_600_000),
    ("p4de.24xlarge",    "8 x 1000 GB",  2_000_000, 1_600_000),
    ("p5.48xlarge",      "8 x 3800 GB",  4_400_000, 2_200_000),
    ("p5e.48xlarge",     "8 x 3800 GB",  4_400_000, 2_200_000),
    ("p5en.48xlarge",    "8 x 3800 GB",  4_400_000, 2_200_000),
    ("p6-b200.48xlarge", "8 x 3800 GB",  4_400_000, 2_200_000),
]


def test_the_iops_table_covers_every_catalog_type():
    assert [row[0] for row in INSTANCE_STORE_IOPS] == [row[0] for row in HARDWARE]


@pytest.mark.parametrize("name,volumes,read_iops,write_iops", INSTANCE_STORE_IOPS)
def test_instance_store_iops_entry_by_entry(name, volumes, read_iops, write_iops):
    store = CATALOG.instance_types[name].instance_store
    assert f"{store.disks} x {store.disk_gb} GB" == volumes
    assert (store.read_iops, store.write_iops) == (read_iops, write_iops)


def _catalog_with_store(instance_type: str, store) -> dict:
    import yaml
    from decisions.catalog.catalog import CATALOG_PATH
    data = yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))
    data["instanceTypes"][instance_type]["instanceStore"] = store
    return data


def test_a_type_without_instance_store_has_no_iops():
    from decisions.catalog.catalog import Catalog
    catalog = Catalog.model_validate(_catalog_with_store("g5.12xlarge", {"disks": 0, "diskGB": 0}))
    store = catalog.instance_types["g5.12xlarge"].instance_store
    assert (store.total_gb, store.read_iops, store.write_iops) == (0, None, None)


@pytest.mark.parametrize("store,message", [
    ({"disks": 0, "diskGB": 0, "readIops": 250000}, "no instance store"),
    ({"disks": 0, "diskGB": 0, "writeIops": 1}, "no instance store"),
    ({"disks": 0, "diskGB": 900}, "both are 0"),
    ({"disks": 1, "diskGB": 900, "readIops": 0}, "greater than 0"),
    ({"disks": 1, "diskGB": 900, "writeIops": -5}, "greater than 0"),
    ({"disks": 1, "diskGB": 900, "readIOPS": 250000}, "readIOPS"),                  # misspelt key
])
def test_instance_store_is_validated_strictly(store, message):
    from pydantic import ValidationError
    from decisions.catalog.catalog import Catalog
    with pytest.raises(ValidationError, match=message):
        Catalog.model_validate(_catalog_with_store("g4dn.12xlarge", store))


# --- Regions: every (type, region) offer, entry by entry, against the source rows --------------------------------
# tests/upstream/skypilot-catalog-aws-vms.csv: rows of skypilot-org/skypilot-catalog@27f67dd4 catalogs/v7/aws/vms.csv
# (its header says which columns, which offsets and why its P-family prices are not used).
import csv  # noqa: E402
from pathlib import Path  # noqa: E402

SNAPSHOT = Path(__file__).with_name("upstream") / "skypilot-catalog-aws-vms.csv"
REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1")
# Prices of the mid-2025 P4/P5 cut, from aws/karpenter-provider-aws (us-east-1 only, the region's priceSources entry),
# whose file this repository does not record: each is held to the recorded snapshot where it has the offer (a cut
# price is below the snapshot's pre-cut one) and to its cited source. No other post-cut P price is recorded anywhere
# in the repository, so every other P offer is null (p4d.24xlarge in eu-west-1 too: its 23.71569 had no source).
AFTER_THE_CUT = {("p4d.24xlarge", "us-east-1"): 21.957642, ("p4de.24xlarge", "us-east-1"): 27.44705,
                 ("p5.48xlarge", "us-east-1"): 55.04, ("p5en.48xlarge", "us-east-1"): 63.296,
                 ("p6-b200.48xlarge", "us-east-1"): 113.9328, ("p5e.48xlarge", "us-east-1"): None}


def snapshot_rows():
    with open(SNAPSHOT, encoding="utf-8") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def snapshot_offers():
    """(type, region) -> the on-demand price the snapshot lists (None where it lists none), catalog types only."""
    offers = {}
    for row in snapshot_rows():
        if row["InstanceType"] in CATALOG.instance_types:
            offers[(row["InstanceType"], row["Region"])] = float(row["Price"]) if row["Price"] else None
    return offers


def test_the_catalog_covers_the_six_gpu_regions():
    assert set(CATALOG.regions) == set(REGIONS)
    for region in REGIONS:
        assert CATALOG.types_in_region(region), region


def test_the_zone_rows_of_one_offer_agree_on_its_price():
    # The on-demand price is the region's, so every zone row of a (type, region) repeats it: a row that does not was
    # copied wrong, and snapshot_offers(), which keeps one row per offer, would not notice.
    prices = {}
    for row in snapshot_rows():
        prices.setdefault((row["InstanceType"], row["Region"]), set()).add(row["Price"])
    assert {offer: sorted(seen) for offer, seen in prices.items() if len(seen) > 1} == {}


def test_every_offer_is_the_snapshots_entry_by_entry():
    source = snapshot_offers()
    catalog = {(name, region): offer.on_demand_usd
               for name, itype in CATALOG.instance_types.items() for region, offer in itype.regions.items()}
    # what the snapshot lists is offered in the catalog, and nothing else but the post-cut us-east-1 rows it lacks
    assert set(source) <= set(catalog)
    assert set(catalog) - set(source) == {("p5e.48xlarge", "us-east-1"), ("p6-b200.48xlarge", "us-east-1")}
    for key, price in sorted(catalog.items()):
        if key in AFTER_THE_CUT:
            assert price == AFTER_THE_CUT[key], key
            if price is not None:
                assert "aws/karpenter-provider-aws" in CATALOG.price_source(*key).source, key
            if price is not None and source.get(key) is not None:
                assert price < source[key], f"{key}: {price} is not below the snapshot's pre-cut {source[key]}"
        elif key[0].startswith("p"):
            assert price is None, f"{key}: the snapshot's {source[key]} predates the P4/P5 price cut"
        else:
            assert price == source[key], key


def test_every_priced_offer_cites_its_regions_source():
    """What the plan cites for a pool's on-demand price (decisions/cost/cost.py basis): us-east-1's from karpenter,
    every other region's from the 2025-H1 snapshot, never the catalog's one date for all."""
    for name, itype in CATALOG.instance_types.items():
        for region, offer in itype.regions.items():
            if offer.on_demand_usd is None:
                continue
            cited = CATALOG.price_source(name, region)
            if region == "us-east-1":
                assert "aws/karpenter-provider-aws" in cited.source and cited.as_of == "2026-07-06", name
            else:
                assert "skypilot-catalog@27f67dd4" in cited.source and cited.as_of == "2025-H1", (name, region)


def test_a_region_lists_exactly_the_types_the_snapshot_offers_there():
    source = snapshot_offers()
    for region in REGIONS:
        offered = {name for (name, r) in source if r == region}
        expected = offered | ({"p5e.48xlarge", "p6-b200.48xlarge"} if region == "us-east-1" else set())
        assert set(CATALOG.types_in_region(region)) == expected, region


def test_an_unknown_region_is_refused_with_how_to_add_one():
    from decisions.config.errors import ConfigError
    from tests.test_validate import load, valid_config
    with pytest.raises(ConfigError) as raised:
        load(valid_config(), region="ap-south-1")
    (issue,) = [i for i in raised.value.issues if i.path == "aws:region"]
    assert "known regions: ap-northeast-1, eu-central-1, eu-west-1, us-east-1, us-east-2, us-west-2" in issue.message
    for words in ('docs/how-to.md "Add a region"', "decisions/catalog/catalog.yaml", "decisions/network/zones.yaml",
                  "decisions/cost/prices.yaml"):
        assert words in issue.message
    how_to = (Path(__file__).resolve().parent.parent / "docs" / "how-to.md").read_text(encoding="utf-8")
    assert "**Add a region.**" in how_to
