"""decisions/cost/transfer.py: the data transfer the design causes, priced from the volumes a stack states.

What users rely on: the Lustre reads and the DR replication appear on the bill with their volumes and unit prices;
a pool that reads the file system from other zones is warned about with what it costs an hour; the figures are the
arithmetic a reader can redo (issue 41: 2.4 GB/s across zones is about $170 an hour; a 1 TB checkpoint an hour
replicated with RTC is about $25k a month).
"""
from dataclasses import replace

import pytest

from decisions.config.model import Usage
from decisions.cost import cost, transfer
from decisions.cost.cost import Rate, RegionPrices
from plan.stackfile import load_stack

RATE = dict(source="test rate", asOf="2026-12")
RATES = RegionPrices(interZoneTransferGb=Rate(usd=0.01, **RATE),
                     interRegionTransferGb={"eu-west-1": Rate(usd=0.02, **RATE)},
                     s3ReplicationTimeControlGb=Rate(usd=0.015, **RATE))


def spec_of(stack="prod-us-east-1"):
    return load_stack(stack)[1]


def with_pool_spread(spec, name, spread=True):
    pools = tuple(replace(p, spec=p.spec.model_copy(update={"spread_across_zones": spread})) if p.name == name else p
                  for p in spec.pools)
    return replace(spec, pools=pools)


def with_usage(spec, **usage):
    return replace(spec, budget=spec.budget.model_copy(update={"usage": Usage(**usage)}))


@pytest.mark.parametrize("zones,share", [(1, 0.0), (2, 0.5), (3, 2 / 3), (4, 0.75)])
def test_the_share_of_reads_that_cross_a_zone(zones, share):
    assert transfer.crossing_share(zones) == pytest.approx(share)


def test_the_issues_figure_2_4_gb_a_second_across_zones_is_about_170_dollars_an_hour():
    # prod-us-east-1's file system: 4,800 GiB at 500 MB/s/TiB = 2,343.75 MB/s; all of it across a zone
    gb_hour = transfer.lustre_read_gb_per_hour(2343.75, 1.0)
    assert gb_hour == pytest.approx(8437.5)
    assert gb_hour * transfer.inter_zone_both_sides(RATES).usd == pytest.approx(168.75)


def test_a_replicated_terabyte_checkpoint_an_hour_is_about_25_thousand_dollars_a_month():
    gb = transfer.replicated_gb_per_month(Usage(checkpointGiB=1000, checkpointsPerHour=1, modelGiBPerMonth=500))
    assert gb == pytest.approx((1000 * 730 + 500) * 1.073741824)           # GiB stated, GB billed
    assert gb * (0.02 + 0.015) == pytest.approx(27452.89, abs=0.01)
    assert transfer.replicated_gb_per_month(Usage()) is None                 # no volume stated: unit prices only
    with pytest.raises(ValueError, match="checkpointGiB and checkpointsPerHour go together"):
        Usage(checkpointGiB=1000)


def test_a_dr_primary_bills_its_replication_with_the_volume_it_states():
    spec = spec_of()
    rows = {r.item.split(":")[0]: r for r in transfer.transfer_costs(spec, RATES, "eu-west-1")}
    out = rows["replication of checkpoints and models to eu-west-1"]
    rtc = rows["replication of checkpoints and models"]
    usage = spec.budget.usage
    gb = (usage.checkpoint_gib * usage.checkpoints_per_hour * 730 + usage.model_gib_per_month) * 1.073741824
    assert (out.quantity, out.unit_usd, out.monthly) == (pytest.approx(gb), 0.02, pytest.approx(gb * 0.02))
    assert (rtc.quantity, rtc.unit_usd, rtc.monthly) == (pytest.approx(gb), 0.015, pytest.approx(gb * 0.015))
    # the peer's region unknown: a gap, not another region's rate
    (gap,) = [r for r in transfer.transfer_costs(spec, RATES, None) if "transfer out" in r.item]
    assert gap.gap == "the peer stack's region was not read" and gap.monthly is None
    # a secondary replicates nothing
    assert not [r for r in transfer.transfer_costs(spec_of("prod-eu-west-1"), RATES, "us-east-1")
                if "replication" in r.item]


def test_lustre_reads_cost_nothing_across_zones_until_a_pool_spreads():
    spec = spec_of()
    (row,) = [r for r in transfer.transfer_costs(spec, RATES, "eu-west-1") if r.item.startswith("Lustre reads")]
    assert row.quantity == 0 and row.monthly == 0 and "every pool that mounts it runs in its zone" in row.item
    assert transfer.spread_warnings(spec, RATES) == []

    spread = with_pool_spread(spec, "finetune-a100-80gb-spot")
    (row,) = [r for r in transfer.transfer_costs(spread, RATES, "eu-west-1") if r.item.startswith("Lustre reads")]
    assert row.unit_usd == 0.02                                              # out of one zone and into the other
    assert row.quantity == pytest.approx(2343.75 * 3.6 * 2 / 3 * 730)       # 3 zones: 2/3 of the reads cross
    (warning,) = transfer.spread_warnings(spread, RATES)
    assert warning.startswith("gpu-cloud:nodePools[1].spreadAcrossZones: pool finetune-a100-80gb-spot reads FSx for "
                              "Lustre from up to 3 zones")
    assert "5,625 GB/hour across zones (67% of 2,344 MB/s) cost $112.50/hour" in warning
    # a stated read rate replaces the file system's whole throughput
    (warning,) = transfer.spread_warnings(with_usage(spread, lustreReadMBps=500), RATES)
    assert "1,200 GB/hour across zones (67% of 500 MB/s) cost $24.00/hour" in warning


def test_an_efa_or_pinned_pool_never_spreads():
    spec = with_pool_spread(spec_of(), "train-h100")           # EFA and pinned: one zone whatever it says
    assert transfer.spread_pools(spec) == []


def test_the_plan_lists_the_transfer_rows_with_the_shipped_rates():
    """prices.yaml's own rates, where it has them, reach the usage table; a missing one is a gap."""
    spec = spec_of()
    rates = cost.load_prices().region("us-east-1")
    rows = transfer.transfer_costs(spec, rates, "eu-west-1")
    estimate = cost.estimate(spec, transfer=rows)
    assert [u for u in estimate.usage if u in rows] == list(rows)
    lustre, out, rtc = rows
    assert lustre.unit_usd == 2 * rates.inter_zone_transfer_gb.usd == 0.02          # $0.01 out and $0.01 in
    assert out.unit_usd == rates.inter_region_transfer_gb["eu-west-1"].usd == 0.02
    assert rtc.unit_usd == rates.s3_replication_time_control_gb.usd == 0.015
    assert out.source == rates.inter_region_transfer_gb["eu-west-1"].source and out.gap is None
