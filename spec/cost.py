"""Hourly cost of a stack's GPU pools, from the catalog's prices.

Rules (planning estimates, not quotes):
- on-demand and reserved: the on-demand rate (an On-Demand Capacity Reservation bills at that rate);
- capacity-block: the on-demand rate as the estimate (the block's price is fixed at purchase);
- spot: the on-demand rate less the catalog's default spot discount;
- a pool listing several types is priced at its most expensive type, so a budget check errs high.
A pool whose type has no price in the region has no cost (None), and the totals say so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from spec.catalog import Catalog


@dataclass(frozen=True)
class PoolCost:
    pool: str
    capacity: str
    node_hourly: Optional[float]
    hourly_at_desired: Optional[float]
    hourly_at_max: Optional[float]


@dataclass(frozen=True)
class CostEstimate:
    currency: str
    pools: Tuple[PoolCost, ...]

    @property
    def complete(self) -> bool:
        return all(p.node_hourly is not None for p in self.pools)

    @property
    def hourly_at_desired(self) -> float:
        return round(sum(p.hourly_at_desired or 0.0 for p in self.pools), 4)

    @property
    def hourly_at_max(self) -> float:
        return round(sum(p.hourly_at_max or 0.0 for p in self.pools), 4)


def node_hourly_usd(instance_type: str, capacity: str, catalog: Catalog, region: str) -> Optional[float]:
    offer = catalog.instance_types[instance_type].regions.get(region)
    if offer is None or offer.on_demand_usd is None:
        return None
    if capacity == "spot":
        return offer.on_demand_usd * (1 - catalog.default_spot_discount)
    return offer.on_demand_usd


def estimate(pools: Sequence, catalog: Catalog, region: str) -> CostEstimate:
    """Cost of ResolvedPools (spec.validate) at desired and at max nodes."""
    rows = []
    for pool in pools:
        prices = [node_hourly_usd(t.name, pool.spec.capacity, catalog, region) for t in pool.types]
        node = None if None in prices else max(prices)
        rows.append(PoolCost(
            pool=pool.name, capacity=pool.spec.capacity, node_hourly=_round(node),
            hourly_at_desired=_round(node * pool.spec.desired_nodes if node is not None else None),
            hourly_at_max=_round(node * pool.spec.max_nodes if node is not None else None),
        ))
    return CostEstimate(currency="USD", pools=tuple(rows))


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)
