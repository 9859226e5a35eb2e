"""The whole bill of a stack before it ships: GPU pools and fixed costs, hourly, monthly and over a commitment's term.

Prices are data: GPU on-demand rates in catalog.yaml, everything else in prices.yaml, each with source and date.
Rules (planning estimates, not quotes):
- on-demand: the catalog rate per node running (desiredNodes, maxNodes);
- spot: the on-demand rate less the family's spot discount (prices.yaml); a family without one falls back to the
  catalog's defaultSpotDiscount, and the pool says it is assumed;
- reserved (an On-Demand Capacity Reservation): billed at the on-demand rate for its whole size whether nodes run
  or not. The offline plan's reservation holds maxNodes instances (plan/engine.py offline_account), so a reserved
  pool costs maxNodes nodes at desired and at max; the reservation alone gives no discount;
- capacity-block: the block's hourly rate (prices.yaml) for its whole size (maxNodes), paid upfront at purchase;
- a commitment (Savings Plan, Reserved Instances) discounts the pool's steady nodes (desiredNodes; a reservation's
  whole size) and makes them committed spend; nodes above that run at on-demand;
- a pool listing several types is priced at its dearest type, so a budget check errs high.
What has no price (a type without one, such as p5e, or a fixed cost without a sourced rate) is a gap: left out of
the totals and listed, never a guess. Usage-based charges (data processed, log ingestion) are named, not estimated.
Figures are kept unrounded; `per_hour` and `cents` round them only where they are written.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence, Tuple

import yaml
from pydantic import BaseModel, ConfigDict, Field

from spec import pods
from spec.catalog import Catalog
from spec.eks import standard_support_end

PRICES_PATH = Path(__file__).with_name("prices.yaml")
HOURS_PER_MONTH = 730            # the month of AWS's pricing pages
THREE_YEARS_MONTHS = 36

# What the components build, restated here because spec/ imports no Pulumi (tests/test_cost.py holds each to
# its component): the system node group's desired size (components/cluster.py ClusterArgs), the GPU nodes' root
# volume (components/nodepool.py launch template) and the interface endpoints (components/network.py).
SYSTEM_NODES_DESIRED = 2
ROOT_VOLUME_GIB, ROOT_VOLUME_IOPS, ROOT_VOLUME_MBPS = 500, 6000, 500
GP3_FREE_IOPS, GP3_FREE_MBPS = 3000, 125
INTERFACE_ENDPOINT_SERVICES = 9

# Charged by use, so no figure can come from config alone.
NOT_ESTIMATED = (
    "data processed by NAT gateways, interface endpoints and the load balancer (per GB, per capacity unit)",
    "VPC flow-log and control-plane log ingestion and storage in CloudWatch Logs (per GB)",
    "S3 storage, requests and replication; data transfer between zones and regions",
    "KMS requests, Route 53 queries and health checks, CloudWatch metrics and alarms",
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Rate(_Frozen):
    usd: float = Field(ge=0)
    source: str = Field(min_length=1)
    as_of: str = Field(alias="asOf", min_length=4)


class Discount(_Frozen):
    fraction: float = Field(gt=0, lt=1)
    source: str = Field(min_length=1)
    as_of: str = Field(alias="asOf", min_length=4)


class Gp3Rates(_Frozen):
    gb_month: Rate = Field(alias="gbMonth")
    iops_month: Rate = Field(alias="iopsMonth")                        # above the included 3,000 IOPS
    throughput_mbps_month: Rate = Field(alias="throughputMbpsMonth")   # above the included 125 MB/s


class RegionPrices(_Frozen):
    instance_hourly: Dict[str, Rate] = Field(default={}, alias="instanceHourly")
    nat_gateway_hourly: Optional[Rate] = Field(default=None, alias="natGatewayHourly")
    public_ipv4_hourly: Optional[Rate] = Field(default=None, alias="publicIpv4Hourly")
    interface_endpoint_hourly: Optional[Rate] = Field(default=None, alias="interfaceEndpointHourly")
    transit_gateway_attachment_hourly: Optional[Rate] = Field(default=None, alias="transitGatewayAttachmentHourly")
    network_load_balancer_hourly: Optional[Rate] = Field(default=None, alias="networkLoadBalancerHourly")
    gp3: Optional[Gp3Rates] = None
    lustre_persistent2_gb_month: Dict[int, Rate] = Field(default={}, alias="lustrePersistent2GbMonth")
    spot_discount: Dict[str, Discount] = Field(default={}, alias="spotDiscount")
    capacity_block_hourly: Dict[str, Rate] = Field(default={}, alias="capacityBlockHourly")
    commitment_discount: Dict[str, Dict[str, Discount]] = Field(default={}, alias="commitmentDiscount")


class Prices(_Frozen):
    eks_control_plane_hourly: Dict[Literal["standard", "extended"], Rate] = Field(alias="eksControlPlaneHourly")
    regions: Dict[str, RegionPrices]

    def region(self, region: str) -> RegionPrices:
        return self.regions.get(region, RegionPrices())


@lru_cache(maxsize=None)
def load_prices(path: Path = PRICES_PATH) -> Prices:
    with open(path, encoding="utf-8") as handle:
        return Prices.model_validate(yaml.safe_load(handle))


@dataclass(frozen=True)
class PoolCost:
    pool: str
    capacity: str
    instance_type: str                    # the type it is priced at (the dearest of the pool's)
    node_hourly: Optional[float]          # per node, at the pool's capacity type (before a commitment)
    on_demand_node_hourly: Optional[float]
    committed_node_hourly: Optional[float]  # per committed node, after the commitment's discount
    nodes_at_desired: int                 # nodes billed: a reservation or block bills its whole size
    nodes_at_max: int
    committed_nodes: int                  # billed whether they run or not, or under a commitment
    upfront: bool                         # paid at purchase (a capacity block)
    basis: str                            # how the node rate was reached, with source and date
    commitment: Optional[str]             # "savings-plan/3y/no-upfront"
    commitment_months: Optional[int]
    gap: Optional[str]                    # why there is no price

    def _hourly(self, nodes: int) -> Optional[float]:
        if self.gap:
            return None
        committed = min(self.committed_nodes, nodes)
        return committed * self.committed_node_hourly + (nodes - committed) * self.node_hourly

    @property
    def hourly_at_desired(self) -> Optional[float]:
        return self._hourly(self.nodes_at_desired)

    @property
    def hourly_at_max(self) -> Optional[float]:
        return self._hourly(self.nodes_at_max)

    @property
    def committed_hourly(self) -> Optional[float]:
        """The part billed whatever runs: the same at desired and at max."""
        return None if self.gap else self.committed_nodes * self.committed_node_hourly

    def on_demand_hourly(self, nodes: int) -> Optional[float]:
        """The same billed nodes at the on-demand rate: what the capacity choice and commitment save against."""
        return None if self.on_demand_node_hourly is None else nodes * self.on_demand_node_hourly


@dataclass(frozen=True)
class FixedCost:
    item: str
    quantity_at_desired: float
    quantity_at_max: float
    unit: str
    unit_hourly: Optional[float]
    source: Optional[str]
    as_of: Optional[str]
    gap: Optional[str] = None

    @property
    def hourly_at_desired(self) -> Optional[float]:
        return None if self.gap else self.quantity_at_desired * self.unit_hourly

    @property
    def hourly_at_max(self) -> Optional[float]:
        return None if self.gap else self.quantity_at_max * self.unit_hourly


@dataclass(frozen=True)
class CostEstimate:
    currency: str
    pools: Tuple[PoolCost, ...]
    fixed: Tuple[FixedCost, ...]

    @property
    def gaps(self) -> List[str]:
        return [f"{p.pool}: {p.gap}" for p in self.pools if p.gap] + [f"{f.item}: {f.gap}" for f in self.fixed if f.gap]

    @property
    def complete(self) -> bool:
        return not self.gaps

    @property
    def pools_hourly_at_desired(self) -> float:
        return _sum(p.hourly_at_desired for p in self.pools)

    @property
    def pools_hourly_at_max(self) -> float:
        return _sum(p.hourly_at_max for p in self.pools)

    @property
    def fixed_hourly_at_desired(self) -> float:
        return _sum(f.hourly_at_desired for f in self.fixed)

    @property
    def fixed_hourly_at_max(self) -> float:
        return _sum(f.hourly_at_max for f in self.fixed)

    @property
    def hourly_at_desired(self) -> float:
        return self.pools_hourly_at_desired + self.fixed_hourly_at_desired

    @property
    def hourly_at_max(self) -> float:
        return self.pools_hourly_at_max + self.fixed_hourly_at_max

    @property
    def committed_hourly(self) -> float:
        return _sum(p.committed_hourly for p in self.pools)

    @property
    def upfront_hourly(self) -> float:
        return _sum(p.committed_hourly for p in self.pools if p.upfront)

    def on_demand_pools_hourly(self, at: str) -> float:
        """Every priced pool's billed nodes at the on-demand rate (at 'desired' or 'max')."""
        return _sum(p.on_demand_hourly(p.nodes_at_desired if at == "desired" else p.nodes_at_max)
                    for p in self.pools if not p.gap)

    def saving_hourly(self, at: str) -> float:
        actual = self.pools_hourly_at_desired if at == "desired" else self.pools_hourly_at_max
        return self.on_demand_pools_hourly(at) - actual


def monthly(hourly: Optional[float]) -> Optional[float]:
    """To the cent, from the unrounded hourly figure (a rounded one is off by up to $0.04 a month, $1.31 in three
    years, per item)."""
    return cents(None if hourly is None else hourly * HOURS_PER_MONTH)


def three_years(hourly: Optional[float]) -> Optional[float]:
    return cents(None if hourly is None else hourly * HOURS_PER_MONTH * THREE_YEARS_MONTHS)


def cents(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 2) + 0.0      # + 0.0: never "-0.0"


def per_hour(value: Optional[float]) -> Optional[float]:
    """An hourly figure as written: to 1/100 of a cent. Only for showing: sums use the unrounded figures."""
    return None if value is None else round(value, 4) + 0.0


def control_plane_tier(kubernetes_version: str, today: date) -> Optional[str]:
    """standard or extended support on `today`; None for a version spec/eks.yaml does not date."""
    end = standard_support_end().get(kubernetes_version)
    if end is None:
        return None
    return "standard" if today < end else "extended"


def pool_costs(pools: Sequence, catalog: Catalog, region: str, prices: Optional[Prices] = None) -> Tuple[PoolCost, ...]:
    """Cost rows of ResolvedPools (spec.validate), the same numbers for the plan and the budget check."""
    prices = prices or load_prices()
    return tuple(_pool_cost(pool, catalog, region, prices.region(region)) for pool in pools)


def _pool_cost(pool, catalog: Catalog, region: str, rates: RegionPrices) -> PoolCost:
    spec = pool.spec
    offers = {t.name: catalog.instance_types[t.name].regions.get(region) for t in pool.types}
    on_demand = {name: (o.on_demand_usd if o else None) for name, o in offers.items()}
    whole_size = spec.capacity in ("reserved", "capacity-block")
    nodes_desired = spec.max_nodes if whole_size else spec.desired_nodes
    commitment = spec.commitment
    steady = spec.max_nodes if whole_size else spec.desired_nodes
    committed_nodes = steady if (whole_size or commitment) else 0
    row = dict(pool=spec.name, capacity=spec.capacity, nodes_at_desired=nodes_desired, nodes_at_max=spec.max_nodes,
               committed_nodes=committed_nodes, upfront=spec.capacity == "capacity-block",
               commitment=commitment.key if commitment else None,
               commitment_months=commitment.months if commitment else None)

    if spec.capacity == "capacity-block":
        name = pool.types[0].name
        block = rates.capacity_block_hourly.get(name)
        if block is None:
            return PoolCost(**row, instance_type=name, node_hourly=None, on_demand_node_hourly=on_demand[name],
                            committed_node_hourly=None, basis="capacity block",
                            gap=f"no capacity block rate for {name} in {region} (spec/prices.yaml)")
        return PoolCost(**row, instance_type=name, node_hourly=block.usd, on_demand_node_hourly=on_demand[name],
                        committed_node_hourly=block.usd, gap=None,
                        basis=f"capacity block ${block.usd}/hour per node, paid upfront ({block.source}, {block.as_of})")

    unpriced = [name for name, usd in on_demand.items() if usd is None]
    if unpriced:
        return PoolCost(**row, instance_type=unpriced[0], node_hourly=None, on_demand_node_hourly=None,
                        committed_node_hourly=None, basis="on-demand",
                        gap=f"no on-demand price for {', '.join(unpriced)} in {region} (spec/catalog.yaml)")

    if spec.capacity == "spot":
        priced = {name: _spot(catalog.instance_types[name].family, usd, catalog, rates)
                  for name, usd in on_demand.items()}
        name = max(priced, key=lambda n: priced[n][0])
        node, basis = priced[name]
    else:
        name = max(on_demand, key=on_demand.get)
        node = on_demand[name]
        basis = (f"on-demand ${node}/hour ({catalog.price_source})" if spec.capacity == "on-demand" else
                 f"capacity reservation billed for all {spec.max_nodes} nodes at on-demand ${node}/hour "
                 f"({catalog.price_source})")
    committed_node = node
    if commitment:
        family = catalog.instance_types[name].family
        discount = rates.commitment_discount.get(family, {}).get(commitment.key)
        if discount is None:
            basis += f"; no {commitment.key} discount for {family} in spec/prices.yaml: committed nodes at on-demand"
        else:
            committed_node = node * (1 - discount.fraction)
            basis += (f"; {commitment.key} {discount.fraction:.1%} off for {committed_nodes} committed nodes "
                      f"({discount.source}, {discount.as_of})")
    return PoolCost(**row, instance_type=name, node_hourly=node, on_demand_node_hourly=on_demand[name],
                    committed_node_hourly=committed_node, basis=basis, gap=None)


def _spot(family: str, on_demand: float, catalog: Catalog, rates: RegionPrices) -> Tuple[float, str]:
    discount = rates.spot_discount.get(family)
    if discount is None:
        fraction = catalog.default_spot_discount
        return (on_demand * (1 - fraction),
                f"spot: on-demand ${on_demand} less {fraction:.0%}, ASSUMED (catalog defaultSpotDiscount: no sourced "
                f"spot discount for {family} in spec/prices.yaml)")
    return (on_demand * (1 - discount.fraction),
            f"spot: on-demand ${on_demand} less {discount.fraction:.1%} ({discount.source}, {discount.as_of})")


def fixed_costs(spec, today: date, prices: Optional[Prices] = None) -> Tuple[FixedCost, ...]:
    """What a StackSpec costs besides its GPU pools, at desired and at max."""
    prices = prices or load_prices()
    rates = prices.region(spec.region)
    zones = len(spec.network.zones)
    nat = zones if spec.network.nat_gateways == "one-per-az" else 1
    gpu_desired = sum(p.spec.desired_nodes for p in spec.pools)
    gpu_max = sum(p.spec.max_nodes for p in spec.pools)
    items: List[FixedCost] = []

    tier = control_plane_tier(spec.cluster.kubernetes_version, today)
    if tier is None:
        items.append(_fixed(f"EKS control plane ({spec.cluster.kubernetes_version})", 1, 1, "cluster", None,
                            gap="the version's support dates are not in spec/eks.yaml"))
    else:
        end = standard_support_end()[spec.cluster.kubernetes_version]
        label = f"standard support until {end}" if tier == "standard" else f"extended support since {end}"
        items.append(_fixed(f"EKS control plane ({spec.cluster.kubernetes_version}, {label})", 1, 1, "cluster",
                            prices.eks_control_plane_hourly[tier]))

    system = [rates.instance_hourly.get(t) for t in pods.SYSTEM_NODE_TYPES]
    system_item = f"system nodes ({' | '.join(pods.SYSTEM_NODE_TYPES)}, on-demand)"
    items.append(_fixed(system_item, SYSTEM_NODES_DESIRED, pods.SYSTEM_NODES_MAX, "node",
                        max(system, key=lambda r: r.usd) if None not in system else None))

    items.append(_root_volumes(gpu_desired, gpu_max, rates.gp3))
    items.append(_fixed("NAT gateways", nat, nat, "gateway", rates.nat_gateway_hourly))
    items.append(_fixed("NAT gateways' public IPv4 addresses", nat, nat, "address", rates.public_ipv4_hourly))
    endpoints = INTERFACE_ENDPOINT_SERVICES * zones
    items.append(_fixed(f"interface endpoints ({INTERFACE_ENDPOINT_SERVICES} services x {zones} zones)",
                        endpoints, endpoints, "endpoint-zone", rates.interface_endpoint_hourly))
    if spec.network.transit_gateway is not None:
        items.append(_fixed("transit gateway attachment", 1, 1, "attachment", rates.transit_gateway_attachment_hourly))
    lustre = spec.storage.lustre
    if lustre is not None:
        rate = rates.lustre_persistent2_gb_month.get(lustre.throughput_per_tib)
        item = f"FSx for Lustre PERSISTENT_2 ({lustre.capacity_gib} GiB at {lustre.throughput_per_tib} MB/s/TiB)"
        items.append(_fixed(item, lustre.capacity_gib, lustre.capacity_gib, "GB", _per_hour(rate)))
    triton = spec.inference.triton
    if triton is not None and triton.enabled:
        items.append(_fixed("Triton Network Load Balancer", 1, 1, "load balancer", rates.network_load_balancer_hourly))
    return tuple(items)


def _root_volumes(desired: int, maximum: int, gp3: Optional[Gp3Rates]) -> FixedCost:
    item = f"GPU nodes' root volumes (gp3 {ROOT_VOLUME_GIB} GiB, {ROOT_VOLUME_IOPS} IOPS, {ROOT_VOLUME_MBPS} MB/s)"
    if gp3 is None:
        return _fixed(item, desired, maximum, "volume", None)
    per_month = (ROOT_VOLUME_GIB * gp3.gb_month.usd + (ROOT_VOLUME_IOPS - GP3_FREE_IOPS) * gp3.iops_month.usd
                 + (ROOT_VOLUME_MBPS - GP3_FREE_MBPS) * gp3.throughput_mbps_month.usd)
    return FixedCost(item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit="volume",
                     unit_hourly=per_month / HOURS_PER_MONTH, source=gp3.gb_month.source, as_of=gp3.gb_month.as_of)


def _per_hour(rate: Optional[Rate]) -> Optional[Rate]:
    """A per-month rate as a per-hour one (over 730 hours)."""
    return None if rate is None else rate.model_copy(update={"usd": rate.usd / HOURS_PER_MONTH})


def _fixed(item: str, desired: float, maximum: float, unit: str, rate: Optional[Rate], gap: Optional[str] = None) -> FixedCost:
    if rate is None:
        return FixedCost(item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit=unit, unit_hourly=None,
                         source=None, as_of=None, gap=gap or "no sourced rate for this region in spec/prices.yaml")
    return FixedCost(item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit=unit,
                     unit_hourly=rate.usd, source=rate.source, as_of=rate.as_of)


def estimate(spec, today: Optional[date] = None, prices: Optional[Prices] = None) -> CostEstimate:
    """The whole bill of a StackSpec (spec.validate) on `today` (the control plane's support tier depends on it;
    the plan prices the stack as of the day it runs)."""
    prices = prices or load_prices()
    return CostEstimate(currency="USD", pools=pool_costs(spec.pools, spec.catalog, spec.region, prices),
                        fixed=fixed_costs(spec, today or date.today(), prices))


def _sum(values) -> float:
    return sum(v for v in values if v is not None)
