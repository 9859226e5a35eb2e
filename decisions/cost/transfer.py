"""Data transfer the design causes, priced per GB from the volumes a stack states (gpu-cloud:budget.usage).

Two flows cost money by design:
- reads of the FSx for Lustre file system from another zone. A file system lives in one zone; EC2 bills data between
  zones of a region on both sides, out of one zone and into the other (prices.yaml interZoneTransferGb, per side). So
  training and general pools without EFA that mount it launch in its zone by default (decisions/network/zones.py
  resolve_layout); a pool with spreadAcrossZones runs in up to every declared zone, and the Auto Scaling group
  balances its nodes across them, so (N-1)/N of its reads cross a zone. The read rate is budget.usage.lustreReadMBps,
  else the file system's whole throughput (the most it can serve).
- a DR primary's replication of checkpoints and models to its peer's region: inter-region transfer out of this
  region (prices.yaml interRegionTransferGb, by destination) plus S3 Replication Time Control on every replicated GB
  (s3ReplicationTimeControlGb; decisions/storage/replication.py turns RTC on for the 15-minute RPO). The volume is
  checkpointGiB x checkpointsPerHour x 730 hours + modelGiBPerMonth.
Listed with the usage-based charges (decisions/cost/cost.py usage_costs), outside the hourly totals: their size is
use, not resources. The hourly figure in the warning is the same arithmetic over one hour.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from decisions.cost.cost import HOURS_PER_MONTH, Rate, RegionPrices, UsageCost, usage_item
from decisions.storage import lustre as lustre_rules

GB_PER_GIB = 1.073741824            # AWS bills transfer per GB (10^9 bytes); stack files state GiB
MB_PER_GB = 1000


def crossing_share(zones: int) -> float:
    """The share of a pool's reads that cross a zone when its nodes are spread evenly over `zones` zones and the file
    system is in one of them."""
    return (zones - 1) / zones if zones > 0 else 0.0


def lustre_read_gb_per_hour(read_mbps: float, share: float) -> float:
    """GB an hour read across zones at `read_mbps` (MB/s) when `share` of the reads cross."""
    return read_mbps * 3600 / MB_PER_GB * share


def replicated_gb_per_month(usage) -> Optional[float]:
    """GB a month a DR primary replicates (checkpoints and models), or None when the stack states no checkpoint
    volume. `usage`: decisions.config.model.Usage."""
    if usage.checkpoint_gib is None:
        return None
    gib = usage.checkpoint_gib * usage.checkpoints_per_hour * HOURS_PER_MONTH + (usage.model_gib_per_month or 0)
    return gib * GB_PER_GIB


def inter_zone_both_sides(rates: RegionPrices) -> Optional[Rate]:
    """What one GB between two zones costs in all: the per-side rate, billed out of one zone and into the other."""
    rate = rates.inter_zone_transfer_gb
    return None if rate is None else rate.model_copy(update={"usd": rate.usd * 2})


def spread_pools(spec) -> List:
    """Pools that mount the stack's Lustre without EFA and spread over more than one zone (spreadAcrossZones)."""
    configured = spec.storage.lustre is not None
    return [p for p in spec.pools if lustre_rules.mounts_lustre(p, configured) and not p.efa
            and p.spec.spread_across_zones and not p.spec.availability_zone and len(spec.network.zones) > 1]


def lustre_read_mbps(spec) -> float:
    """The read rate the bill assumes: the stack's statement, else the file system's whole throughput."""
    stated = spec.budget.usage.lustre_read_mbps
    lustre = spec.storage.lustre
    return stated if stated is not None else lustre_rules.throughput_mbps(lustre.capacity_gib, lustre.throughput_per_tib)


def transfer_costs(spec, rates: RegionPrices, peer_region: Optional[str]) -> Tuple[UsageCost, ...]:
    """The transfer rows of a StackSpec's usage table: Lustre reads across zones (where it has a file system) and a
    DR primary's replication (`peer_region`: the peer stack's region, None when its stack file was not read)."""
    items: List[UsageCost] = []
    if spec.storage.lustre is not None:
        spread = spread_pools(spec)
        zones = len(spec.network.zones)
        if spread:
            mbps = lustre_read_mbps(spec)
            gb_month = lustre_read_gb_per_hour(mbps, crossing_share(zones)) * HOURS_PER_MONTH
            label = (f"Lustre reads from other zones ({', '.join(p.name for p in spread)} over {zones} zones: "
                     f"{crossing_share(zones):.0%} of {mbps:,.0f} MB/s, billed on both sides)")
        else:
            gb_month = 0.0
            label = "Lustre reads from other zones (none: every pool that mounts it runs in its zone)"
        items.append(usage_item(label, "GB", inter_zone_both_sides(rates), quantity=gb_month))
    if spec.dr.role == "primary":
        volume = replicated_gb_per_month(spec.budget.usage)
        to = peer_region or "the peer's region"
        transfer = rates.inter_region_transfer_gb.get(peer_region) if peer_region else None
        stated = ("" if volume is None else
                  f": {spec.budget.usage.checkpoint_gib:g} GiB x {spec.budget.usage.checkpoints_per_hour:g}/h"
                  f" + {spec.budget.usage.model_gib_per_month or 0:g} GiB of models a month")
        items.append(usage_item(f"replication of checkpoints and models to {to}: transfer out{stated}", "GB",
                                transfer, quantity=volume,
                                gap=None if peer_region else "the peer stack's region was not read"))
        items.append(usage_item(f"replication of checkpoints and models: S3 Replication Time Control{stated}", "GB",
                                rates.s3_replication_time_control_gb, quantity=volume))
    return tuple(items)


def spread_warnings(spec, rates: RegionPrices) -> List[str]:
    """What a pool that reads Lustre across zones costs an hour, at the rate the bill assumes."""
    if spec.storage.lustre is None:
        return []
    rate = inter_zone_both_sides(rates)
    index = {pool.name: i for i, pool in enumerate(spec.pools)}
    warnings = []
    zones = len(spec.network.zones)
    for pool in spread_pools(spec):
        gb_hour = lustre_read_gb_per_hour(lustre_read_mbps(spec), crossing_share(zones))
        cost = f"${gb_hour * rate.usd:,.2f}/hour" if rate else "an unpriced amount (no interZoneTransferGb rate)"
        warnings.append(
            f"gpu-cloud:nodePools[{index[pool.name]}].spreadAcrossZones: pool {pool.name} reads FSx for Lustre from "
            f"up to {zones} zones, and reads from a zone other than the file system's are billed on both sides: "
            f"{gb_hour:,.0f} GB/hour across zones ({crossing_share(zones):.0%} of {lustre_read_mbps(spec):,.0f} "
            f"MB/s) cost {cost}; leave spreadAcrossZones out to launch it in the file system's zone")
    return warnings
