"""The GPU instance catalog: loads and validates decisions/catalog/catalog.yaml once.

The catalog is data (see catalog.yaml for sources and dates); this module only gives it types and
answers the questions the rest of the program asks of it.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Literal, Optional, Tuple

from pydantic import Field, model_validator

from decisions.catalog.data_files import DataModel, load_model

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
NcclScope = Literal["acrossNodes", "withinNode"]


# The slices of a MIG GPU (catalog.yaml says where from): every profile takes some of each.
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


def mig_compute_slices(profile: str) -> int:
    """'3g.40gb' -> 3: a MIG profile is named by its compute slices, then its memory."""
    return int(profile.split("g.", 1)[0])


# NVIDIA's GPU architectures in the catalog (catalog.yaml names the source). A compiled engine (a TensorRT plan) is
# built for one of them, so the DR pair check (decisions/serving/dr_pair.py) compares them: a misspelt one must not pass
# as another.
Architecture = Literal["turing", "ampere", "ada", "hopper", "blackwell"]


class GpuModel(DataModel):
    architecture: Architecture
    nvlink_links_per_gpu: int = Field(alias="nvlinkLinksPerGpu", ge=0)
    nvswitch: bool
    mig_profiles: Dict[str, int] = Field(alias="migProfiles")      # profile -> instances per GPU
    mig_memory_slices: Dict[str, int] = Field(default={}, alias="migMemorySlices")   # profile -> memory slices
    min_driver_branch: int = Field(alias="minDriverBranch")
    ecc_expected: bool = Field(alias="eccExpected")
    ecc_reserves_memory: bool = Field(alias="eccReservesMemory")   # GDDR: ECC on keeps 1/16 of the memory
    datacenter: bool

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)

    def mig_slices(self, layout: Dict[str, int]) -> Tuple[int, int]:
        """(compute, memory) slices that `layout` (profile -> instances) takes of one GPU."""
        return (sum(mig_compute_slices(p) * n for p, n in layout.items()),
                sum(self.mig_memory_slices[p] * n for p, n in layout.items()))

    @model_validator(mode="after")
    def _counts_are_what_the_slices_allow(self) -> "GpuModel":
        if set(self.mig_memory_slices) != set(self.mig_profiles):
            raise ValueError(f"migMemorySlices names {sorted(self.mig_memory_slices)}, migProfiles "
                             f"{sorted(self.mig_profiles)}: every MIG profile needs both")
        for profile, count in self.mig_profiles.items():
            fit = min(MIG_COMPUTE_SLICES // mig_compute_slices(profile),
                      MIG_MEMORY_SLICES // self.mig_memory_slices[profile])
            if count != fit:
                raise ValueError(f"migProfiles {profile}: {count}, but {fit} fit in {MIG_COMPUTE_SLICES} compute and "
                                 f"{MIG_MEMORY_SLICES} memory slices")
        return self


class GpuSpec(DataModel):
    model: str
    count: int = Field(gt=0)
    memory_mib: int = Field(alias="memoryMiB", gt=0)


class EfaSpec(DataModel):
    cards: int = Field(ge=0)
    ena_bandwidth_cards: Tuple[int, ...] = Field(default=(), alias="enaBandwidthCards")


class InstanceStore(DataModel):
    """NVMe instance store. `read_iops`/`write_iops`: AWS's published aggregate over all the volumes (4 KiB random,
    queue depth saturated; see catalog.yaml for the source), None where not recorded."""
    disks: int = Field(ge=0)
    disk_gb: int = Field(alias="diskGB", ge=0)
    read_iops: Optional[int] = Field(default=None, alias="readIops", gt=0)
    write_iops: Optional[int] = Field(default=None, alias="writeIops", gt=0)

    @property
    def total_gb(self) -> int:
        return self.disks * self.disk_gb

    @model_validator(mode="after")
    def _iops_need_disks(self) -> "InstanceStore":
        if (self.disks == 0) != (self.disk_gb == 0):
            raise ValueError(f"disks {self.disks} and diskGB {self.disk_gb}: both are 0 (no instance store) or neither")
        if self.disks == 0 and (self.read_iops is not None or self.write_iops is not None):
            raise ValueError("readIops/writeIops are set, but the type has no instance store (disks 0)")
        return self


class EniSpec(DataModel):
    """Network interfaces on the default network card and IPv4 addresses per interface (VPC CNI pod addresses)."""
    default_card_max: int = Field(alias="defaultCardMax", ge=1)
    ipv4_per_interface: int = Field(alias="ipv4PerInterface", ge=2)


class AcrossNodesFigure(DataModel):
    """AWS's published two-node all_reduce_perf result that the across-node minimum is a fraction of."""
    published_gbps: float = Field(alias="publishedGBps", gt=0)
    message_bytes: int = Field(alias="messageBytes", ge=8)           # the row the figure was read at
    measured_on: Optional[str] = Field(default=None, alias="measuredOn")   # another type with the same network
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _a_row_of_the_sweep(self) -> "AcrossNodesFigure":
        # The MPIJob sweeps from 8 bytes, doubling, up to this size: only a power of two is one of its rows.
        if self.message_bytes & (self.message_bytes - 1):
            raise ValueError(f"messageBytes {self.message_bytes} is not a power of two, so no row of all_reduce_perf's "
                             "doubling sweep from 8 bytes")
        return self


class WithinNodeMinimum(DataModel):
    """A production health check's pass mark for one node over NVLink, below what a healthy node shows."""
    minimum_gbps: float = Field(alias="minimumGBps", gt=0)
    source: str = Field(min_length=1)
    healthy_gbps: Optional[float] = Field(default=None, alias="healthyGBps", gt=0)
    healthy_source: Optional[str] = Field(default=None, alias="healthySource", min_length=1)

    @model_validator(mode="after")
    def _below_healthy(self) -> "WithinNodeMinimum":
        if (self.healthy_gbps is None) != (self.healthy_source is None):
            raise ValueError("healthyGBps and healthySource go together")
        if self.healthy_gbps is not None and self.minimum_gbps >= self.healthy_gbps:
            raise ValueError(f"minimumGBps {self.minimum_gbps:g} is not below what a healthy node shows "
                             f"({self.healthy_gbps:g} GB/s)")
        return self


class NcclBusBandwidth(DataModel):
    """What NCCL acceptance holds a type to, all_reduce_perf bus bandwidth in GB/s (catalog.yaml: the sources)."""
    across_nodes: Optional[AcrossNodesFigure] = Field(default=None, alias="acrossNodes")   # two nodes over EFA
    within_node: Optional[WithinNodeMinimum] = Field(default=None, alias="withinNode")     # one node over NVLink

    @model_validator(mode="after")
    def _not_empty(self) -> "NcclBusBandwidth":
        if self.across_nodes is None and self.within_node is None:
            raise ValueError("ncclBusBandwidthGBps needs acrossNodes or withinNode (leave it out when neither is known)")
        return self


class PriceSource(DataModel):
    """Where a figure (an on-demand price, the type list, the region offers) was read, and when (a day, a month, or
    the half-year a snapshot is dated to)."""
    source: str = Field(min_length=1)
    as_of: str = Field(alias="asOf", min_length=4)

    @property
    def cited(self) -> str:
        return f"{self.source}, {self.as_of}"


class RegionOffer(DataModel):
    """A type offered in a region: its on-demand USD an hour (None: offered, no sourced price, a gap the plan lists).
    `source` and `asOf` name where this one price was read when it is not the region's `priceSources` entry (what
    `scripts/refresh_prices.py --write` records for each price the Price List API answered)."""
    on_demand_usd: Optional[float] = Field(alias="onDemandUsd", ge=0)
    source: Optional[str] = Field(default=None, min_length=1)
    as_of: Optional[str] = Field(default=None, alias="asOf", min_length=4)

    @model_validator(mode="after")
    def _source_and_date_together(self) -> "RegionOffer":
        if (self.source is None) != (self.as_of is None):
            raise ValueError("source and asOf go together: an offer's own price names both where it was read and when")
        return self

    @property
    def own_source(self) -> Optional[PriceSource]:
        return None if self.source is None else PriceSource(source=self.source, asOf=self.as_of)


class InstanceType(DataModel):
    name: str
    gpu: GpuSpec
    vcpu: int
    memory_gib: int = Field(alias="memoryGiB")
    network_gbps: float = Field(alias="networkGbps", gt=0)   # baseline: small sizes burst above it
    network_cards: int = Field(alias="networkCards", ge=1)
    efa: EfaSpec
    instance_store: InstanceStore = Field(alias="instanceStore")
    eni: EniSpec
    regions: Dict[str, RegionOffer]
    # None where no figure is published: the acceptance test refuses such types instead of inventing one.
    nccl_bus_bandwidth_gbps: Optional[NcclBusBandwidth] = Field(default=None, alias="ncclBusBandwidthGBps")

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def supports_efa(self) -> bool:
        return self.efa.cards > 0

    @model_validator(mode="after")
    def _efa_fits_network_cards(self) -> "InstanceType":
        if self.efa.cards > self.network_cards:
            raise ValueError(f"{self.name}: efa.cards {self.efa.cards} > networkCards {self.network_cards}")
        bad = [c for c in self.efa.ena_bandwidth_cards if not 0 < c < self.network_cards]
        if bad:
            raise ValueError(f"{self.name}: enaBandwidthCards {bad} are not secondary network cards")
        return self


# EC2 instance type names: family, a dot, then a size (AWS, Amazon EC2 Instance Types guide, "Amazon EC2 instance type
# naming conventions", docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html: sizes nano to 48xlarge,
# metal, and metal-<n>xl).
EC2_TYPE_NAME = re.compile(r"^[a-z][a-z0-9-]*[0-9][a-z0-9-]*\.(nano|micro|small|medium|large|[0-9]*xlarge|metal(-[0-9]+xl)?)$")
# A near spelling: at most 2 edits, and one per 5 characters ("p5.48xlarg", 10 characters, 1 edit: a typo).
TYPO_EDITS = 2
TYPO_CHARS_PER_EDIT = 5


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions that turn `a` into `b`."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def across_nodes_ceiling_gbps(network_gbps: float, gpus_per_node: int) -> float:
    """The most all_reduce bus bandwidth (GB/s) two nodes with `network_gbps` each can show: every element's partial
    sum crosses between them once, so algbw <= the network's GB/s, and busbw = algbw x 2(n-1)/n with n ranks (15/8
    of it with 8 GPUs a node)."""
    ranks = 2 * gpus_per_node
    return network_gbps / 8 * 2 * (ranks - 1) / ranks


class Catalog(DataModel):
    # Where the list of types and their hardware was read, and when: a type not listed is unknown to that source's
    # date, not nonexistent, and the refusal says so.
    types_source: PriceSource = Field(alias="typesSource")
    # Where which type is offered in which region was read, and when (a snapshot: AWS adds offers after it).
    offers_source: PriceSource = Field(alias="offersSource")
    # region -> where its onDemandUsd figures were read and when; an offer with its own source and asOf overrides it.
    price_sources: Dict[str, PriceSource] = Field(alias="priceSources")
    default_spot_discount: float = Field(alias="defaultSpotDiscount", ge=0, lt=1)
    # The across-node minimum as a share of AWS's published two-node figure (catalog.yaml says why this share).
    nccl_across_nodes_fraction: float = Field(alias="ncclAcrossNodesFraction", gt=0, lt=1)
    gpus: Dict[str, GpuModel]
    instance_types: Dict[str, InstanceType] = Field(alias="instanceTypes")

    @model_validator(mode="before")
    @classmethod
    def _name_instance_types(cls, data):
        types = data.get("instanceTypes") or {}
        data["instanceTypes"] = {name: {**spec, "name": name} for name, spec in types.items()}
        return data

    @model_validator(mode="after")
    def _gpu_models_known(self) -> "Catalog":
        for itype in self.instance_types.values():
            if itype.gpu.model not in self.gpus:
                raise ValueError(f"{itype.name}: GPU model {itype.gpu.model!r} is not under gpus")
            nccl = itype.nccl_bus_bandwidth_gbps
            if nccl and nccl.within_node and not self.gpus[itype.gpu.model].nvlink_links_per_gpu:
                raise ValueError(f"{itype.name}: ncclBusBandwidthGBps.withinNode is an NVLink minimum, "
                                 f"but {itype.gpu.model} has no NVLink")
            if nccl and nccl.across_nodes:
                self._check_across_nodes(itype, nccl.across_nodes)
        self._check_price_sources()
        return self

    def _check_price_sources(self) -> None:
        """Every price names its source and date: its own, or its region's priceSources entry. A null price needs
        none (it is a gap, not a figure)."""
        for itype in self.instance_types.values():
            for region, offer in itype.regions.items():
                if offer.on_demand_usd is not None and offer.source is None and region not in self.price_sources:
                    raise ValueError(f"{itype.name}: regions.{region}.onDemandUsd {offer.on_demand_usd:g} has no "
                                     f"source: give the offer its own source and asOf, or add priceSources.{region} "
                                     "(where the region's prices were read, and when)")

    def _check_across_nodes(self, itype: InstanceType, figure: AcrossNodesFigure) -> None:
        ceiling = across_nodes_ceiling_gbps(itype.network_gbps, itype.gpu.count)
        if figure.published_gbps > ceiling:
            raise ValueError(f"{itype.name}: ncclBusBandwidthGBps.acrossNodes.publishedGBps {figure.published_gbps:g} "
                             f"GB/s is more than two nodes with {itype.network_gbps:g} Gbps can reach ({ceiling:g} GB/s "
                             "of bus bandwidth)")
        if figure.measured_on is None:
            return
        # Another type's figure holds only for the same network and ranks: the test is bound by EFA, not the GPU.
        other = self.instance_types.get(figure.measured_on)
        if other is None:
            raise ValueError(f"{itype.name}: ncclBusBandwidthGBps.acrossNodes.measuredOn {figure.measured_on!r} is "
                             "not a catalog type")
        shape = lambda t: f"({t.network_gbps:g}, {t.efa.cards}, {t.gpu.count})"     # noqa: E731
        if shape(other) != shape(itype):
            raise ValueError(f"{itype.name}: ncclBusBandwidthGBps.acrossNodes.measuredOn {other.name} has another "
                             f"network (Gbps, EFA cards, GPUs: {shape(other)} vs {shape(itype)})")

    def nccl_minimum_gbps(self, instance_type: str, scope: NcclScope) -> Optional[float]:
        """The type's bus-bandwidth minimum: across nodes the fraction of AWS's published two-node figure, within a
        node the health check's pass mark; None when no figure is published."""
        nccl = self.instance_types[instance_type].nccl_bus_bandwidth_gbps
        if scope == "acrossNodes":
            figure = nccl.across_nodes if nccl else None
            return figure.published_gbps * self.nccl_across_nodes_fraction if figure else None
        within = nccl.within_node if nccl else None
        return within.minimum_gbps if within else None

    def price_source(self, instance_type: str, region: str) -> Optional[PriceSource]:
        """Where the type's on-demand price in the region was read, and when: the offer's own source, else the
        region's priceSources entry (None where neither is recorded: only a type with no price there)."""
        offer = self.instance_types[instance_type].regions.get(region)
        own = offer.own_source if offer is not None else None
        return own or self.price_sources.get(region)

    def gpu_model(self, instance_type: str) -> GpuModel:
        return self.gpus[self.instance_types[instance_type].gpu.model]

    def suggest(self, name: str) -> Optional[str]:
        """The catalog type `name` is a misspelling of, or None. A name shaped like an EC2 type (family.size) is
        taken as meant, since EC2's own types sit one keystroke apart (g6e.2xlarge, g6e.12xlarge); otherwise the
        nearest type within TYPO_EDITS edits, and not more than one edit per TYPO_CHARS_PER_EDIT characters."""
        if EC2_TYPE_NAME.match(name):
            return None
        limit = min(TYPO_EDITS, len(name) // TYPO_CHARS_PER_EDIT)
        distance, closest = min((edit_distance(name, known), known) for known in self.instance_types)
        return closest if distance <= limit else None

    def types_in_region(self, region: str) -> List[str]:
        return sorted(n for n, t in self.instance_types.items() if region in t.regions)

    @property
    def regions(self) -> List[str]:
        return sorted({r for t in self.instance_types.values() for r in t.regions})


@lru_cache(maxsize=None)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    return load_model(path, Catalog)
