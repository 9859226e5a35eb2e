"""The whole bill of a stack before it ships: GPU pools and fixed costs, hourly, monthly and over a commitment's term.

Prices are data: GPU on-demand rates in catalog.yaml, everything else in prices.yaml, each with source and date.
Rules (planning estimates, not quotes):
- on-demand: the catalog rate per node running (desiredNodes, maxNodes);
- spot: the on-demand rate less the family's spot discount (prices.yaml); a family without one falls back to the
  catalog's defaultSpotDiscount, and the pool says it is assumed;
- reserved (an On-Demand Capacity Reservation): billed at the on-demand rate for its whole size whether nodes run
  or not, so the pool is priced and budgeted at the reservation's InstanceCount as read from the account
  (components/account.py), also when that is more than maxNodes; the reservation alone gives no discount. Before
  the account is read (the config-time budget check), the size is taken to be maxNodes and the row says so;
- capacity-block: the block's rate (prices.yaml) x its InstanceCount x the hours from its StartDate to its EndDate
  (1 to 182 days), paid once, upfront, at purchase: outside the hourly, monthly and three-year run rate. Its hourly
  figure (rate x instances) still counts against the hourly budget while the block runs;
- a commitment (Savings Plan, Reserved Instances) discounts the pool's steady nodes (desiredNodes; a reservation's
  whole size) and makes them committed spend; nodes above that run at on-demand. `commitment_options` answers what a
  1- or 3-year commitment would save on every committable pool (on-demand and reserved);
- a pool listing several types is priced at its dearest type, so a budget check errs high;
- the budget (gpu-cloud:budget.maxHourlyUsd) is one rule, `over_budget`, that the config check
  (decisions/config/validate.py), the pack's hourly-cost-within-budget (policy/policies.py) and the plan's budget line
  all use: every priced GPU pool at maxNodes (`budget_hourly`; a reservation or block at its whole size), priced
  without any commitment's discount (`budget_pool_costs`), because a commitment is a billing agreement no resource
  carries and the pack sees only resources. It is compared in whole cents: over when the total rounded to the cent
  is above the budget rounded to the cent, so a budget written as the figure the plan shows passes.
What has no price (a type without one, such as p5e, or a fixed cost without a sourced rate) is a gap: left out of
the totals and listed, never a guess. A rate whose source dates its own end (`currentUntil`) is marked STALE from
that day. Usage-based charges (data processed, backups, log ingestion, KMS requests) are listed with their unit
prices (`usage_costs`), outside the totals. Figures are kept unrounded; `per_hour` and `cents` round them only where
they are written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from pydantic import Field

from decisions.catalog.catalog import Catalog
from decisions.catalog.data_files import DataModel, load_model
from decisions.catalog.eks import standard_support_end
from decisions.network.zones import Reservation
from decisions.nodes import pods
from decisions.nodes.scratch import ROOT_VOLUME_GIB

PRICES_PATH = Path(__file__).with_name("prices.yaml")
HOURS_PER_MONTH = 730            # the month of AWS's pricing pages
THREE_YEARS_MONTHS = 36
# A capacity block lasts 1 to 14 days in 1-day steps, then 7-day steps up to 182 days (EC2 User Guide, "Find and
# purchase Capacity Blocks"); a term read outside that range is not priced.
BLOCK_MIN_DAYS, BLOCK_MAX_DAYS = 1, 182
# What the commitment table compares: a Savings Plan (or Reserved Instances) of each term, paid monthly.
COMMITMENT_TERMS = (("1y", 12), ("3y", 36))

# What the components build, restated here because decisions/ imports no Pulumi (tests/test_cost.py holds each to
# its component): the system node group's desired size (components/cluster.py ClusterArgs), the GPU nodes' root
# volume's performance (components/nodes/nodepool.py launch template; its size is decisions/nodes/scratch.py's) and the
# interface endpoints (components/network.py).
SYSTEM_NODES_DESIRED = 2
ROOT_VOLUME_IOPS, ROOT_VOLUME_MBPS = 6000, 500
GP3_FREE_IOPS, GP3_FREE_MBPS = 3000, 125
INTERFACE_ENDPOINT_SERVICES = 9

# Charged by use, with no unit price in prices.yaml: named only (the priced ones are `usage_costs`).
NOT_ESTIMATED = (
    "the load balancer's capacity units (per NLCU-hour)",
    "VPC flow-log and control-plane log ingestion and storage in CloudWatch Logs (per GB)",
    "S3 requests, and the storage of datasets, checkpoints and models (their size is use)",
    "data transfer other than the Lustre reads and the DR replication listed with their volumes (clients, the "
    "internet, NCCL between nodes of one zone is free)",
    "Route 53 queries and health checks, CloudWatch metrics and alarms",
)


class Rate(DataModel):
    usd: float = Field(ge=0)
    source: str = Field(min_length=1)
    as_of: str = Field(alias="asOf", min_length=4)
    # prices.yaml's "weak": the figure rests on a single third-party page quoting AWS; confirm before relying on it.
    weak: bool = False
    # The day the source itself says the rate stops holding (a capacity block rate "current until" its update).
    current_until: Optional[date] = Field(default=None, alias="currentUntil")

    def stale(self, today: date) -> bool:
        return self.current_until is not None and today >= self.current_until


class Discount(DataModel):
    fraction: float = Field(gt=0, lt=1)
    source: str = Field(min_length=1)
    as_of: str = Field(alias="asOf", min_length=4)
    weak: bool = False


WEAK = " (weak source)"      # what a figure resting on a weak source says wherever its source is cited


def cite(source: str, as_of: str, weak: bool = False, note: str = "") -> str:
    """"(source, asOf[; note])", then " (weak source)" for a weak one: how a basis names where a figure came from."""
    return f"({source}, {as_of}{note})" + (WEAK if weak else "")


class Gp3Rates(DataModel):
    gb_month: Rate = Field(alias="gbMonth")
    iops_month: Rate = Field(alias="iopsMonth")                        # above the included 3,000 IOPS
    throughput_mbps_month: Rate = Field(alias="throughputMbpsMonth")   # above the included 125 MB/s


class RegionPrices(DataModel):
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
    # Charged by use (per GB, per GB-month): listed with their unit prices, outside the totals.
    nat_gateway_data_gb: Optional[Rate] = Field(default=None, alias="natGatewayDataGb")
    interface_endpoint_data_gb: Optional[Rate] = Field(default=None, alias="interfaceEndpointDataGb")
    transit_gateway_data_gb: Optional[Rate] = Field(default=None, alias="transitGatewayDataGb")
    # Data transfer the design causes (decisions/cost/transfer.py): between zones of the region, billed per GB on each
    # side (out of one zone and into the other); out of this region to each other region; S3 Replication Time
    # Control per GB replicated; S3 Standard storage per GB-month.
    inter_zone_transfer_gb: Optional[Rate] = Field(default=None, alias="interZoneTransferGb")
    inter_region_transfer_gb: Dict[str, Rate] = Field(default={}, alias="interRegionTransferGb")
    s3_replication_time_control_gb: Optional[Rate] = Field(default=None, alias="s3ReplicationTimeControlGb")
    s3_standard_gb_month: Optional[Rate] = Field(default=None, alias="s3StandardGbMonth")


class Prices(DataModel):
    eks_control_plane_hourly: Dict[Literal["standard", "extended"], Rate] = Field(alias="eksControlPlaneHourly")
    # KMS: one price in every commercial region (the KMS pricing page names none per region).
    kms_key_month: Optional[Rate] = Field(default=None, alias="kmsKeyMonth")
    kms_requests_10k: Optional[Rate] = Field(default=None, alias="kmsRequests10k")
    regions: Dict[str, RegionPrices]

    def region(self, region: str) -> RegionPrices:
        return self.regions.get(region, RegionPrices())


@lru_cache(maxsize=None)
def load_prices(path: Path = PRICES_PATH) -> Prices:
    return load_model(path, Prices)


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
    reservation_id: Optional[str] = None
    size_source: Optional[str] = None     # where a reservation's or block's billed size came from
    block_start: Optional[str] = None     # a capacity block's term, as read (RFC 3339)
    block_end: Optional[str] = None
    block_hours: Optional[float] = None
    stale: Optional[str] = None           # why the rate may no longer hold (its source's own end date)
    commitment_payment: Optional[str] = None

    @property
    def in_run_rate(self) -> bool:
        """A capacity block is paid once, upfront: it is not part of the hourly, monthly and three-year run rate."""
        return not self.upfront

    @property
    def upfront_total(self) -> Optional[float]:
        """A capacity block's price: its rate x its instances x its hours (None without a rate or a term)."""
        if not self.upfront or self.gap or self.block_hours is None:
            return None
        return self.committed_node_hourly * self.committed_nodes * self.block_hours

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
        """The part billed whatever runs: the same at desired and at max (a block's: while it lasts)."""
        return None if self.gap else self.committed_nodes * self.committed_node_hourly

    def on_demand_hourly(self, nodes: int) -> Optional[float]:
        """The same billed nodes at the on-demand rate: what the capacity choice and commitment save against."""
        return None if self.on_demand_node_hourly is None else nodes * self.on_demand_node_hourly


@dataclass(frozen=True)
class FixedCost:
    key: str                              # how gpu-cloud:budget.unpriced names it when it has no price
    item: str
    quantity_at_desired: float
    quantity_at_max: float
    unit: str
    unit_hourly: Optional[float]
    source: Optional[str]
    as_of: Optional[str]
    gap: Optional[str] = None
    weak: bool = False                    # its rate rests on a weak source (prices.yaml "weak")

    @property
    def hourly_at_desired(self) -> Optional[float]:
        return None if self.gap else self.quantity_at_desired * self.unit_hourly

    @property
    def hourly_at_max(self) -> Optional[float]:
        return None if self.gap else self.quantity_at_max * self.unit_hourly


@dataclass(frozen=True)
class UsageCost:
    """Charged by use: a unit price, and what it comes to when the stack fixes the quantity (a volume's size, the
    number of keys). Listed apart; never in the totals."""
    item: str
    unit: str
    unit_usd: Optional[float]
    source: Optional[str]
    as_of: Optional[str]
    quantity: Optional[float] = None      # known from the stack (GiB, keys), else None: depends on use
    gap: Optional[str] = None
    weak: bool = False                    # its rate rests on a weak source (prices.yaml "weak")

    @property
    def monthly(self) -> Optional[float]:
        return None if self.gap or self.quantity is None else self.quantity * self.unit_usd


@dataclass(frozen=True)
class CommitmentOption:
    """What a commitment of one term would bill on a pool's steady nodes, against the same nodes on-demand."""
    pool: str
    capacity: str
    instance_type: str
    family: str
    nodes: int                            # steady nodes: desiredNodes, or the reservation's whole size
    on_demand_hourly: float
    terms: Tuple[Tuple[str, str, Optional[float], Optional[str]], ...]   # (term, key, hourly or None, basis or gap)

    def hourly(self, term: str) -> Optional[float]:
        """The steady nodes' hourly bill under the term's commitment; "0y" (none) is on-demand."""
        if term == "0y":
            return self.on_demand_hourly
        return next((h for t, _, h, _ in self.terms if t == term), None)

    def saving_hourly(self, term: str) -> Optional[float]:
        hourly = self.hourly(term)
        return None if hourly is None else self.on_demand_hourly - hourly


@dataclass(frozen=True)
class Unpriced:
    """An item left out of every total for want of a price."""
    name: str       # how gpu-cloud:budget.unpriced acknowledges it: a pool's name, or a fixed cost's key
    item: str       # what it is
    why: str        # why it has no price, and which file would hold one


def unacknowledged(unpriced: Sequence[Unpriced], acknowledged: Sequence[str]) -> List[Unpriced]:
    """The budget's rule on holes, decided here only (the config check and the pack both ask it): with a budget set,
    every item left out of the totals must be named in gpu-cloud:budget.unpriced. A budget that silently skips a pool
    it cannot price is a budget that passes anything: a p5 pool in a region without a P-family price would cost
    nothing to it."""
    return [u for u in unpriced if u.name not in set(acknowledged)]


def incomplete_note(gaps: Sequence[str]) -> str:
    """What a total that leaves unpriced items out says wherever it is printed: " (incomplete: 3 items unpriced)",
    or "" when nothing is left out."""
    return f" (incomplete: {len(gaps)} item{'' if len(gaps) == 1 else 's'} unpriced)" if gaps else ""


@dataclass(frozen=True)
class CostEstimate:
    currency: str
    pools: Tuple[PoolCost, ...]
    fixed: Tuple[FixedCost, ...]
    usage: Tuple[UsageCost, ...] = ()
    commitments: Tuple[CommitmentOption, ...] = ()

    @property
    def gaps(self) -> List[str]:
        return [f"{p.pool}: {p.gap}" for p in self.pools if p.gap] + [f"{f.item}: {f.gap}" for f in self.fixed if f.gap]

    @property
    def unpriced(self) -> List[Unpriced]:
        return ([Unpriced(p.pool, f"pool {p.pool}", p.gap) for p in self.pools if p.gap]
                + [Unpriced(f.key, f.item, f.gap) for f in self.fixed if f.gap])

    @property
    def stale(self) -> List[str]:
        return [f"{p.pool}: {p.stale}" for p in self.pools if p.stale]

    @property
    def complete(self) -> bool:
        return not self.gaps

    @property
    def run_rate_pools(self) -> Tuple[PoolCost, ...]:
        return tuple(p for p in self.pools if p.in_run_rate)

    @property
    def blocks(self) -> Tuple[PoolCost, ...]:
        return tuple(p for p in self.pools if p.upfront)

    @property
    def upfront_total(self) -> float:
        """Every capacity block's price, paid once at purchase (those with a rate and a term)."""
        return _sum(p.upfront_total for p in self.blocks)

    @property
    def pools_hourly_at_desired(self) -> float:
        return _sum(p.hourly_at_desired for p in self.run_rate_pools)

    @property
    def pools_hourly_at_max(self) -> float:
        return _sum(p.hourly_at_max for p in self.run_rate_pools)

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
        """Run-rate spend billed whatever runs: reservations and commitments (capacity blocks are paid upfront)."""
        return _sum(p.committed_hourly for p in self.run_rate_pools)

    @property
    def upfront_hourly(self) -> float:
        """The part of the committed run rate paid at purchase: commitments bought all-upfront."""
        return _sum(p.committed_hourly for p in self.run_rate_pools if p.commitment_payment == "all-upfront")

    def on_demand_pools_hourly(self, at: str) -> float:
        """Every priced run-rate pool's billed nodes at the on-demand rate (at 'desired' or 'max')."""
        return _sum(p.on_demand_hourly(p.nodes_at_desired if at == "desired" else p.nodes_at_max)
                    for p in self.run_rate_pools if not p.gap)

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
    """An hourly figure as written: to 1/100 of a cent. Only for showing: sums use the unrounded figures. Where
    rounding to 1/100 of a cent lands on half a cent ($325.744958 -> $325.7450), the figure stays on the side of the
    unrounded one ($325.7449), so that shown in cents it is the cent the budget check counts (`cents`), not the next."""
    if value is None:
        return None
    shown = round(value, 4)
    if cents(shown) != cents(value):
        shown = (math.floor if shown > value else math.ceil)(value * 10_000) / 10_000
    return shown + 0.0


def control_plane_tier(kubernetes_version: str, today: date) -> Optional[str]:
    """standard or extended support on `today`; None for a version decisions/catalog/eks.yaml does not date."""
    end = standard_support_end().get(kubernetes_version)
    if end is None:
        return None
    return "standard" if today < end else "extended"


Reservations = Mapping[str, Union[Reservation, str]]   # reservation id -> as read, or why it could not be read


# pool name -> the price the stack assumes where the data has none (decisions.config.model.AssumedPrice:
# usd_per_node_hour, source)
Assumed = Mapping[str, Any]


def pool_costs(pools: Sequence, catalog: Catalog, region: str, prices: Optional[Prices] = None,
               reservations: Optional[Reservations] = None, today: Optional[date] = None,
               commitments: bool = True, assumed: Optional[Assumed] = None) -> Tuple[PoolCost, ...]:
    """Cost rows of ResolvedPools (decisions.config.stack), the same numbers for the plan and the budget check.
    `reservations`: what the account says of each pool's reservation
    (decisions.network.zones.AccountZones.reservations); without it a reservation's size is taken to be maxNodes, and
    the row says so. `commitments=False` prices every pool as if it had none (what the budget is checked on).
    `assumed`: gpu-cloud:budget.assumed, which stands in, marked ASSUMED with its source, where the data has no
    rate for a pool's type (never over a rate the data has)."""
    prices = prices or load_prices()
    today = today or date.today()
    return tuple(_pool_cost(pool, catalog, region, prices.region(region), reservations or {}, today, commitments,
                            (assumed or {}).get(pool.spec.name))
                 for pool in pools)


def budget_pool_costs(pools: Sequence, catalog: Catalog, region: str, prices: Optional[Prices] = None,
                      reservations: Optional[Reservations] = None, today: Optional[date] = None,
                      assumed: Optional[Assumed] = None) -> Tuple[PoolCost, ...]:
    """The rows the budget is checked on: the pools priced without a commitment's discount. A commitment (Savings
    Plan, Reserved Instances) is a billing agreement that no resource carries, so the pack, which sees only
    resources, cannot apply it; leaving it out here too gives the program and the pack one figure (it errs high: at
    maxNodes a commitment bills no more than on-demand). `pools` need only `spec` (name, capacity, desired_nodes,
    max_nodes; capacity_reservation_id for a reservation or block) and `types` (catalog InstanceTypes)."""
    return pool_costs(pools, catalog, region, prices, reservations, today, commitments=False, assumed=assumed)


def budget_hourly(rows: Sequence[PoolCost]) -> float:
    """What gpu-cloud:budget.maxHourlyUsd covers: every priced pool at maxNodes (a reservation or block at its whole
    size, a capacity block while it runs), unrounded. A pool without a price is a gap, left out and listed."""
    return _sum(p.hourly_at_max for p in rows if not p.gap)


def over_budget(rows: Sequence[PoolCost], budget: float) -> Optional[float]:
    """The budget rule, decided here only: the total of `budget_hourly` when it is over `budget`, else None.
    Compared in whole cents, as every message shows the figures: over when the total rounded to the cent is above
    the budget rounded to the cent. So a budget written as the cost the plan shows ($7.29 for $7.2903...) passes, one
    cent less does not, and "$7.29 above the budget $7.29" is never said."""
    total = budget_hourly(rows)
    return total if cents(total) > cents(budget) else None


def reserved_size(spec, reservations: Reservations) -> Tuple[int, Optional[Reservation], str]:
    """The instances a reservation or block bills (EC2 bills them all, running or not), the reservation as read,
    and where the figure came from."""
    rid = getattr(spec, "capacity_reservation_id", None)
    found = reservations.get(rid) if rid else None
    if isinstance(found, Reservation):
        return (found.instance_count, found,
                f"{rid} holds {found.instance_count} instances, as the account reports it (InstanceCount)")
    why = f"{rid} not read from the account" if rid else "no reservation read"
    return spec.max_nodes, None, f"{why}: sized at maxNodes ({spec.max_nodes})"


def block_hours(start: Optional[str], end: Optional[str]) -> Tuple[Optional[float], Optional[str]]:
    """A capacity block's length in hours from its RFC 3339 StartDate and EndDate, or why it cannot be priced."""
    if not start or not end:
        return None, "the block's StartDate and EndDate were not read"
    try:
        hours = (_instant(end) - _instant(start)).total_seconds() / 3600
    except ValueError:
        return None, f"the block's term {start} to {end} is not a pair of RFC 3339 times"
    if not BLOCK_MIN_DAYS * 24 <= hours <= BLOCK_MAX_DAYS * 24:
        return None, (f"the block's term {start} to {end} is {hours:g} hours, not {BLOCK_MIN_DAYS} to "
                      f"{BLOCK_MAX_DAYS} days")
    return hours, None


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _assumed_rate(assumption) -> Optional[Rate]:
    """A stack's assumed price as a rate the bill cites: ASSUMED, with the stack's source."""
    if assumption is None:
        return None
    return Rate(usd=assumption.usd_per_node_hour, source=f"ASSUMED by gpu-cloud:budget.assumed: {assumption.source}",
                asOf="the stack file")


def _pool_cost(pool, catalog: Catalog, region: str, rates: RegionPrices, reservations: Reservations,
               today: date, commitments: bool = True, assumption=None) -> PoolCost:
    spec = pool.spec
    offers = {t.name: catalog.instance_types[t.name].regions.get(region) for t in pool.types}
    on_demand = {name: (o.on_demand_usd if o else None) for name, o in offers.items()}
    assumed = _assumed_rate(assumption)
    # where the data has no price, the stack's assumption stands in, cited as such
    sources = {name: (_on_demand_source(catalog, name, region) if usd is not None or assumed is None
                      else cite(assumed.source, assumed.as_of)) for name, usd in on_demand.items()}
    if assumed is not None:
        on_demand = {name: (assumed.usd if usd is None else usd) for name, usd in on_demand.items()}
    whole_size = spec.capacity in ("reserved", "capacity-block")
    size, found, size_source = reserved_size(spec, reservations) if whole_size else (None, None, None)
    commitment = spec.commitment if commitments else None
    steady = size if whole_size else spec.desired_nodes
    committed_nodes = steady if (whole_size or commitment) else 0
    row = dict(pool=spec.name, capacity=spec.capacity, nodes_at_desired=steady,
               nodes_at_max=size if whole_size else spec.max_nodes,
               committed_nodes=committed_nodes, upfront=spec.capacity == "capacity-block",
               commitment=commitment.key if commitment else None,
               commitment_months=commitment.months if commitment else None,
               commitment_payment=commitment.payment if commitment else None,
               reservation_id=getattr(spec, "capacity_reservation_id", None) if whole_size else None,
               size_source=size_source)

    if spec.capacity == "capacity-block":
        name = pool.types[0].name
        block = rates.capacity_block_hourly.get(name) or assumed
        start, end = (found.start_date, found.end_date) if found else (None, None)
        hours, no_term = block_hours(start, end) if found else (None, size_source)
        row.update(block_start=start, block_end=end, block_hours=hours)
        if block is None:
            return PoolCost(**row, instance_type=name, node_hourly=None, on_demand_node_hourly=on_demand[name],
                            committed_node_hourly=None, basis="capacity block",
                            gap=f"no capacity block rate for {name} in {region} (decisions/cost/prices.yaml)")
        stale = (f"the capacity block rate for {name} (${block.usd}/hour) was current until {block.current_until} "
                 f"by its source ({block.source}); a block costs the rate of the day it is bought"
                 if block.stale(today) else None)
        term = (f"{hours:g} hours from {start} to {end}" if hours is not None else f"upfront total unknown: {no_term}")
        return PoolCost(**row, instance_type=name, node_hourly=block.usd, on_demand_node_hourly=on_demand[name],
                        committed_node_hourly=block.usd, gap=None, stale=stale,
                        basis=(f"capacity block ${block.usd}/hour per instance x {size} instances x {term}, paid "
                               f"upfront {cite(block.source, block.as_of, block.weak, '; STALE' if stale else '')}; "
                               f"{size_source}"))

    unpriced = [name for name, usd in on_demand.items() if usd is None]
    if unpriced:
        return PoolCost(**row, instance_type=unpriced[0], node_hourly=None, on_demand_node_hourly=None,
                        committed_node_hourly=None, basis="on-demand",
                        gap=f"no on-demand price for {', '.join(unpriced)} in {region} "
                            "(decisions/catalog/catalog.yaml)")

    if spec.capacity == "spot":
        priced = {name: _spot(catalog.instance_types[name].family, usd, sources[name], catalog, rates)
                  for name, usd in on_demand.items()}
        name = max(priced, key=lambda n: priced[n][0])
        node, basis = priced[name]
    else:
        name = max(on_demand, key=on_demand.get)
        node = on_demand[name]
        source = sources[name]
        basis = (f"on-demand ${node}/hour {source}" if spec.capacity == "on-demand" else
                 f"capacity reservation billed for all {size} instances at on-demand ${node}/hour "
                 f"{source}; {size_source}")
    committed_node = node
    if commitment:
        family = catalog.instance_types[name].family
        discount = rates.commitment_discount.get(family, {}).get(commitment.key)
        if discount is None:
            basis += (f"; no {commitment.key} discount for {family} in decisions/cost/prices.yaml: "
                      "committed nodes at on-demand")
        else:
            committed_node = node * (1 - discount.fraction)
            basis += (f"; {commitment.key} {discount.fraction:.1%} off for {committed_nodes} committed nodes "
                      f"{cite(discount.source, discount.as_of, discount.weak)}")
    return PoolCost(**row, instance_type=name, node_hourly=node, on_demand_node_hourly=on_demand[name],
                    committed_node_hourly=committed_node, basis=basis, gap=None)


def _on_demand_source(catalog: Catalog, name: str, region: str) -> str:
    """Where the catalog's on-demand price of `name` in `region` was read, and when, as a basis cites it."""
    found = catalog.price_source(name, region)
    return cite(found.source, found.as_of) if found else "(no source recorded in decisions/catalog/catalog.yaml)"


def _spot(family: str, on_demand: float, on_demand_source: str, catalog: Catalog,
          rates: RegionPrices) -> Tuple[float, str]:
    discount = rates.spot_discount.get(family)
    if discount is None:
        fraction = catalog.default_spot_discount
        return (on_demand * (1 - fraction),
                f"spot: on-demand ${on_demand} {on_demand_source} less {fraction:.0%}, ASSUMED (catalog "
                f"defaultSpotDiscount: no sourced spot discount for {family} in decisions/cost/prices.yaml)")
    return (on_demand * (1 - discount.fraction),
            f"spot: on-demand ${on_demand} {on_demand_source} less {discount.fraction:.1%} "
            f"{cite(discount.source, discount.as_of, discount.weak)}")


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
        items.append(_fixed("eks-control-plane", f"EKS control plane ({spec.cluster.kubernetes_version})", 1, 1,
                            "cluster", None,
                            gap="the version's support dates are not in decisions/catalog/eks.yaml"))
    else:
        end = standard_support_end()[spec.cluster.kubernetes_version]
        label = f"standard support until {end}" if tier == "standard" else f"extended support since {end}"
        items.append(_fixed("eks-control-plane", f"EKS control plane ({spec.cluster.kubernetes_version}, {label})",
                            1, 1, "cluster",
                            prices.eks_control_plane_hourly[tier]))

    system = [rates.instance_hourly.get(t) for t in pods.SYSTEM_NODE_TYPES]
    system_item = f"system nodes ({' | '.join(pods.SYSTEM_NODE_TYPES)}, on-demand)"
    items.append(_fixed("system-nodes", system_item, SYSTEM_NODES_DESIRED, pods.SYSTEM_NODES_MAX, "node",
                        max(system, key=lambda r: r.usd) if None not in system else None))

    items.append(_root_volumes(gpu_desired, gpu_max, rates.gp3))
    items.append(_fixed("nat-gateways", "NAT gateways", nat, nat, "gateway", rates.nat_gateway_hourly))
    items.append(_fixed("nat-public-ipv4", "NAT gateways' public IPv4 addresses", nat, nat, "address", rates.public_ipv4_hourly))
    endpoints = INTERFACE_ENDPOINT_SERVICES * zones
    items.append(_fixed("interface-endpoints", f"interface endpoints ({INTERFACE_ENDPOINT_SERVICES} services x {zones} zones)",
                        endpoints, endpoints, "endpoint-zone", rates.interface_endpoint_hourly))
    if spec.network.transit_gateway is not None:
        items.append(_fixed("transit-gateway", "transit gateway attachment", 1, 1, "attachment", rates.transit_gateway_attachment_hourly))
    lustre = spec.storage.lustre
    if lustre is not None:
        rate = rates.lustre_persistent2_gb_month.get(lustre.throughput_per_tib)
        item = f"FSx for Lustre PERSISTENT_2 ({lustre.capacity_gib} GiB at {lustre.throughput_per_tib} MB/s/TiB)"
        items.append(_fixed(LUSTRE, item, lustre.capacity_gib, lustre.capacity_gib, "GB", _per_hour(rate)))
    triton = spec.inference.triton
    if triton is not None and triton.enabled:
        items.append(_fixed("triton-load-balancer", "Triton Network Load Balancer", 1, 1, "load balancer", rates.network_load_balancer_hourly))
    return tuple(items)


ROOT_VOLUMES = "root-volumes"
LUSTRE = "fsx-lustre"       # the pack names it too, from the file system it sees (policy/policies.py)


def _root_volumes(desired: int, maximum: int, gp3: Optional[Gp3Rates]) -> FixedCost:
    item = f"GPU nodes' root volumes (gp3 {ROOT_VOLUME_GIB} GiB, {ROOT_VOLUME_IOPS} IOPS, {ROOT_VOLUME_MBPS} MB/s)"
    if gp3 is None:
        return _fixed(ROOT_VOLUMES, item, desired, maximum, "volume", None)
    per_month = (ROOT_VOLUME_GIB * gp3.gb_month.usd + (ROOT_VOLUME_IOPS - GP3_FREE_IOPS) * gp3.iops_month.usd
                 + (ROOT_VOLUME_MBPS - GP3_FREE_MBPS) * gp3.throughput_mbps_month.usd)
    parts = (gp3.gb_month, gp3.iops_month, gp3.throughput_mbps_month)
    return FixedCost(key=ROOT_VOLUMES, item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit="volume",
                     unit_hourly=per_month / HOURS_PER_MONTH, source=gp3.gb_month.source, as_of=gp3.gb_month.as_of,
                     weak=any(r.weak for r in parts))


def _per_hour(rate: Optional[Rate]) -> Optional[Rate]:
    """A per-month rate as a per-hour one (over 730 hours)."""
    return None if rate is None else rate.model_copy(update={"usd": rate.usd / HOURS_PER_MONTH})


def _fixed(key: str, item: str, desired: float, maximum: float, unit: str, rate: Optional[Rate],
           gap: Optional[str] = None) -> FixedCost:
    if rate is None:
        return FixedCost(key=key, item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit=unit,
                         unit_hourly=None, source=None, as_of=None,
                         gap=gap or "no sourced rate for this region in decisions/cost/prices.yaml")
    return FixedCost(key=key, item=item, quantity_at_desired=desired, quantity_at_max=maximum, unit=unit,
                     unit_hourly=rate.usd, source=rate.source, as_of=rate.as_of, weak=rate.weak)


def usage_costs(spec, prices: Optional[Prices] = None, kms_keys: Optional[int] = None) -> Tuple[UsageCost, ...]:
    """What the stack is charged by use, with unit prices (spec: a StackSpec). `kms_keys`: how many customer managed
    keys the stack creates (the plan counts them in the program's run)."""
    prices = prices or load_prices()
    rates = prices.region(spec.region)
    items = [usage_item("NAT gateway data processed", "GB", rates.nat_gateway_data_gb),
             usage_item("interface endpoint data processed", "GB", rates.interface_endpoint_data_gb)]
    if spec.network.transit_gateway is not None:
        items.append(usage_item("transit gateway data processed (from the VPC)", "GB", rates.transit_gateway_data_gb))
    if spec.storage.lustre is not None:
        # What the file system's protection is billed as: the bucket's storage of what /data exports (objects are
        # written as S3 Standard: FSx for Lustre User Guide, Exporting changes to the data repository), never FSx
        # backups, which FSx does not take of a linked file system (decisions/storage/lustre.py).
        items.append(usage_item("S3 storage of what /data exports (FSx for Lustre's protection, not FSx backups)",
                                "GB-month", rates.s3_standard_gb_month))
    volume = spec.monitoring.prometheus_volume_gib
    items.append(usage_item(f"Prometheus volume (gp3, {volume} GiB)", "GB-month",
                        rates.gp3.gb_month if rates.gp3 else None, quantity=volume))
    if kms_keys is not None:
        items.append(usage_item(f"KMS customer managed keys ({kms_keys})", "key-month", prices.kms_key_month,
                            quantity=kms_keys))
    items.append(usage_item("KMS requests (above 20,000 free a month)", "10,000 requests", prices.kms_requests_10k))
    return tuple(items)


def usage_item(item: str, unit: str, rate: Optional[Rate], quantity: Optional[float] = None,
               gap: Optional[str] = None) -> UsageCost:
    """A usage row: its rate with source and date, or the gap (`gap`, else no rate in prices.yaml)."""
    if rate is None or gap:
        return UsageCost(item=item, unit=unit, unit_usd=None, source=None, as_of=None, quantity=quantity,
                         gap=gap or "no sourced rate for this region in decisions/cost/prices.yaml")
    return UsageCost(item=item, unit=unit, unit_usd=rate.usd, source=rate.source, as_of=rate.as_of, quantity=quantity,
                     weak=rate.weak)


def commitment_options(pools: Sequence[PoolCost], catalog: Catalog, region: str, prices: Optional[Prices] = None,
                       kind: str = "savings-plan", payment: str = "no-upfront") -> Tuple[CommitmentOption, ...]:
    """What a 1- or 3-year commitment would bill on each committable pool's steady nodes (on-demand: desiredNodes;
    reserved: the reservation's size), against the same nodes on-demand. Spot and capacity blocks take no
    commitment (decisions/config/model.py). A term without a sourced discount for the family is a gap, not a guess."""
    rates = (prices or load_prices()).region(region)
    options = []
    for p in pools:
        if p.capacity not in ("on-demand", "reserved") or p.gap or p.on_demand_node_hourly is None:
            continue
        family = catalog.instance_types[p.instance_type].family
        nodes = p.nodes_at_desired
        on_demand = nodes * p.on_demand_node_hourly
        terms = []
        for term, _ in COMMITMENT_TERMS:
            key = f"{kind}/{term}/{payment}"
            discount = rates.commitment_discount.get(family, {}).get(key)
            if discount is None:
                terms.append((term, key, None,
                              f"no sourced {key} discount for {family} in {region} (decisions/cost/prices.yaml)"))
            else:
                terms.append((term, key, on_demand * (1 - discount.fraction),
                              f"{discount.fraction:.1%} off {cite(discount.source, discount.as_of, discount.weak)}"))
        options.append(CommitmentOption(pool=p.pool, capacity=p.capacity, instance_type=p.instance_type, family=family,
                                        nodes=nodes, on_demand_hourly=on_demand, terms=tuple(terms)))
    return tuple(options)


def estimate(spec, today: Optional[date] = None, prices: Optional[Prices] = None,
             reservations: Optional[Reservations] = None, kms_keys: Optional[int] = None,
             transfer: Sequence[UsageCost] = ()) -> CostEstimate:
    """The whole bill of a StackSpec (decisions.config.stack) on `today` (the control plane's support tier depends on
    it; the plan prices the stack as of the day it runs). `reservations`: the account's answers for the pools'
    reservations (the plan passes what the program read). `transfer`: the data transfer rows
    (decisions/cost/transfer.py transfer_costs), listed with the usage-based charges."""
    prices = prices or load_prices()
    today = today or date.today()
    pools = pool_costs(spec.pools, spec.catalog, spec.region, prices, reservations, today, assumed=spec.budget.assumed)
    return CostEstimate(currency="USD", pools=pools, fixed=fixed_costs(spec, today, prices),
                        usage=usage_costs(spec, prices, kms_keys) + tuple(transfer),
                        commitments=commitment_options(pools, spec.catalog, spec.region, prices))


def _sum(values) -> float:
    return sum(v for v in values if v is not None)
