"""The whole bill (spec/cost.py): hand calculations from the catalog and spec/prices.yaml, entry by entry."""
import inspect
import re
from datetime import date
from pathlib import Path

import pytest
import yaml

from spec import cost, pods
from spec.catalog import load_catalog
from spec.errors import ConfigError
from spec.validate import load_stack_spec
from tests.test_validate import load, valid_config

CATALOG = load_catalog()
PRICES = cost.load_prices()
US = PRICES.regions["us-east-1"]
TODAY = date(2026, 12, 3)          # 1.35 in standard support (until 2027-03-27)
STACKS = Path(__file__).resolve().parent.parent / "stacks"


def approx(expected, abs=1e-4):
    """Hand calculations agree with the estimate to 1/100 of a cent per hour."""
    return pytest.approx(expected, abs=abs)


def od(instance_type, region="us-east-1"):
    return CATALOG.instance_types[instance_type].regions[region].on_demand_usd


def stack_spec(stack):
    raw = yaml.safe_load((STACKS / f"Pulumi.{stack}.yaml").read_text())["config"]
    config = {key.split(":", 1)[1]: value for key, value in raw.items() if key.startswith("gpu-cloud:")}
    return load_stack_spec(config, stack=stack, region=raw["aws:region"])


def fixed(estimate):
    return {f.item.split(" (")[0]: f for f in estimate.fixed}


# One root volume per GPU node: 500 GiB gp3 plus 3,000 IOPS and 375 MB/s above what gp3 includes, per hour.
ROOT = (500 * 0.08 + 3000 * 0.005 + 375 * 0.04) / 730
SYSTEM_NODE = 0.2016                     # m7i.xlarge, the dearer system node type


def test_dev_stack_matches_the_hand_calculation():
    e = cost.estimate(stack_spec("dev"), TODAY)
    (pool,) = e.pools
    g6 = 4.6016 * (1 - 0.5)              # g6.12xlarge spot: no sourced g6 discount, the catalog default (assumed)
    assert (pool.hourly_at_desired, pool.hourly_at_max) == approx((1 * g6, 3 * g6))
    assert "ASSUMED" in pool.basis
    items = fixed(e)
    expected = {                          # (at desired, at max)
        "EKS control plane": (0.10, 0.10),
        "system nodes": (2 * SYSTEM_NODE, 4 * SYSTEM_NODE),
        "GPU nodes' root volumes": (1 * ROOT, 3 * ROOT),
        "NAT gateways": (0.045, 0.045),                          # natGateways: single
        "NAT gateways' public IPv4 addresses": (0.005, 0.005),
        "interface endpoints": (9 * 2 * 0.01, 9 * 2 * 0.01),     # 9 services in each of 2 zones
        "transit gateway attachment": (0.05, 0.05),
    }
    assert set(items) == set(expected)
    for name, (desired, maximum) in expected.items():
        assert (items[name].hourly_at_desired, items[name].hourly_at_max) == approx((desired, maximum), abs=1e-4), name
    assert e.hourly_at_desired == approx(g6 + sum(d for d, _ in expected.values()), abs=1e-3)
    assert e.hourly_at_max == approx(3 * g6 + sum(m for _, m in expected.values()), abs=1e-3)
    assert e.complete and e.committed_hourly == 0
    assert e.saving_hourly("max") == approx(3 * 4.6016 * 0.5, abs=1e-3)


def test_prod_us_east_1_matches_the_hand_calculation():
    e = cost.estimate(stack_spec("prod-us-east-1"), TODAY)
    pools = {p.pool: p for p in e.pools}
    # train-h100: a reservation of 4 p5.48xlarge, billed whole at on-demand, at desired as at max
    assert pools["train-h100"].hourly_at_desired == pools["train-h100"].hourly_at_max == approx(4 * 55.04)
    assert pools["train-h100"].committed_hourly == approx(4 * 55.04)
    # spot A100 pools at desired 0, max 3, no sourced p4d/p4de discount: the catalog's 50 % (assumed)
    assert pools["finetune-a100-80gb-spot"].hourly_at_max == approx(3 * 27.44705 * 0.5)
    assert pools["finetune-a100-40gb-spot"].hourly_at_max == approx(3 * 21.957642 * 0.5)
    assert pools["infer-l40s"].hourly_at_desired == approx(2 * 10.49264)
    assert pools["infer-l40s"].hourly_at_max == approx(8 * 10.49264)
    gpu_desired, gpu_max = 4 + 0 + 0 + 2, 4 + 3 + 3 + 8
    items = fixed(e)
    expected = {
        "EKS control plane": (0.10, 0.10),
        "system nodes": (2 * SYSTEM_NODE, 4 * SYSTEM_NODE),
        "GPU nodes' root volumes": (gpu_desired * ROOT, gpu_max * ROOT),
        "NAT gateways": (3 * 0.045, 3 * 0.045),                  # one per zone, 3 zones
        "NAT gateways' public IPv4 addresses": (3 * 0.005, 3 * 0.005),
        "interface endpoints": (27 * 0.01, 27 * 0.01),
        "transit gateway attachment": (0.05, 0.05),
        "Triton Network Load Balancer": (0.0225, 0.0225),
    }
    for name, (desired, maximum) in expected.items():
        assert (items[name].hourly_at_desired, items[name].hourly_at_max) == approx((desired, maximum), abs=1e-4), name
    # FSx at 500 MB/s/TiB has no sourced rate: a gap, left out of the totals, not a guess
    assert items["FSx for Lustre PERSISTENT_2"].gap and not e.complete
    assert e.gaps == [f"{items['FSx for Lustre PERSISTENT_2'].item}: no sourced rate for this region in spec/prices.yaml"]
    pools_max = 4 * 55.04 + 3 * 27.44705 * 0.5 + 3 * 21.957642 * 0.5 + 8 * 10.49264
    assert e.pools_hourly_at_max == approx(pools_max, abs=1e-3)
    assert e.hourly_at_max == approx(pools_max + sum(m for _, m in expected.values()), abs=1e-3)
    assert e.hourly_at_desired == approx(4 * 55.04 + 2 * 10.49264 + sum(d for d, _ in expected.values()), abs=1e-3)
    # the reservation saves nothing by itself; spot saves half the A100s' on-demand price at max
    assert e.saving_hourly("desired") == 0
    assert e.saving_hourly("max") == approx(3 * 27.44705 * 0.5 + 3 * 21.957642 * 0.5, abs=1e-3)


def test_prod_eu_west_1_prices_its_pools_and_lists_every_unsourced_fixed_cost():
    e = cost.estimate(stack_spec("prod-eu-west-1"), TODAY)
    pools = {p.pool: p for p in e.pools}
    assert pools["train-a100"].hourly_at_desired == 0
    assert pools["train-a100"].hourly_at_max == approx(4 * 23.71569)
    assert pools["infer-a10g"].hourly_at_desired == approx(2 * 6.33167)
    assert pools["infer-a10g"].hourly_at_max == approx(8 * 6.33167)
    # the g5 spot discount in prices.yaml is a us-east-1 snapshot: eu-west-1 falls back to the assumed default
    assert pools["infer-a10g-spot"].hourly_at_max == approx(8 * 6.33167 * 0.5)
    items = fixed(e)
    assert items["EKS control plane"].hourly_at_max == approx(0.10)   # one rate in every commercial region
    gaps = {name for name, item in items.items() if item.gap}
    assert gaps == set(items) - {"EKS control plane"}
    assert e.hourly_at_max == approx(4 * 23.71569 + 8 * 6.33167 * 1.5 + 0.10, abs=1e-3)


def test_a_reserved_pool_at_desired_zero_still_pays_for_its_whole_reservation():
    config = valid_config()
    config["nodePools"][0].update(minNodes=0, desiredNodes=0, maxNodes=2)
    (train, _) = cost.pool_costs(load(config).pools, CATALOG, "us-east-1")
    assert train.hourly_at_desired == train.hourly_at_max == approx(2 * 55.04)
    assert train.nodes_at_desired == 2 and train.committed_hourly == approx(2 * 55.04)


def test_a_capacity_block_costs_its_purchase_rate_for_its_whole_size_paid_upfront():
    config = valid_config()
    config["nodePools"][0].update(capacity="capacity-block", minNodes=0, desiredNodes=0, maxNodes=2)
    spec = load(config)
    (block, _) = cost.pool_costs(spec.pools, CATALOG, "us-east-1")
    rate = US.capacity_block_hourly["p5.48xlarge"].usd
    assert block.hourly_at_desired == block.hourly_at_max == approx(2 * rate)
    assert block.upfront and block.committed_hourly == approx(2 * rate)
    assert cost.estimate(spec, TODAY).upfront_hourly == approx(2 * rate)
    assert block.on_demand_hourly(2) == approx(2 * 55.04)


def test_the_budget_message_says_a_capacity_block_is_not_lowered_by_max_nodes():
    config = valid_config()
    config["nodePools"][0].update(capacity="capacity-block", minNodes=0, desiredNodes=0, maxNodes=2)
    config["budget"] = {"maxHourlyUsd": 50}
    with pytest.raises(ConfigError) as raised:
        load(config)
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:budget.maxHourlyUsd"
    block = 2 * US.capacity_block_hourly["p5.48xlarge"].usd
    assert f"GPU pools at maxNodes cost ${block + 4 * 10.49264 * 0.5:,.2f}/hour" in issue.message
    assert f"Capacity blocks train (${block:,.2f}/hour) are paid upfront" in issue.message
    assert "no change to maxNodes lowers them" in issue.message


def test_the_budget_message_says_a_reservation_bills_its_whole_size():
    config = valid_config()
    config["budget"] = {"maxHourlyUsd": 50}
    with pytest.raises(ConfigError) as raised:
        load(config)
    assert "Reservations of train are billed for their whole size" in raised.value.issues[0].message
    assert "Capacity blocks" not in raised.value.issues[0].message


def test_a_type_without_a_price_is_a_gap_not_a_budget_failure():
    config = valid_config()
    config["nodePools"][0].update(instanceTypes=["p5e.48xlarge"], capacity="capacity-block")
    config["budget"] = {"maxHourlyUsd": 1}   # only the spot pool is priced: 4 x 5.25 = 20.99 > 1
    with pytest.raises(ConfigError) as raised:
        load(config)
    assert "cost $20.99/hour" in raised.value.issues[0].message     # checked on what has a price
    config["budget"] = {"maxHourlyUsd": 25}
    spec = load(config)
    e = cost.estimate(spec, TODAY)
    assert e.pools[0].hourly_at_max is None and not e.complete
    assert e.gaps[0] == "train: no capacity block rate for p5e.48xlarge in us-east-1 (spec/prices.yaml)"
    config["nodePools"][0].update(capacity="reserved")
    (train, _) = cost.pool_costs(load(config).pools, CATALOG, "us-east-1")
    assert train.gap == "no on-demand price for p5e.48xlarge in us-east-1 (spec/catalog.yaml)"


def test_spot_uses_the_family_discount_with_its_source():
    discount = US.spot_discount["p5"]
    config = valid_config()
    config["nodePools"][0].update(capacity="spot", capacityReservationId=None, minNodes=0, desiredNodes=1, maxNodes=2)
    del config["nodePools"][0]["capacityReservationId"]
    (train, infer) = cost.pool_costs(load(config).pools, CATALOG, "us-east-1")
    assert train.hourly_at_max == approx(2 * 55.04 * (1 - discount.fraction))
    assert discount.source in train.basis and discount.as_of in train.basis
    assert infer.node_hourly == approx(10.49264 * (1 - CATALOG.default_spot_discount))
    assert "ASSUMED" in infer.basis


@pytest.mark.parametrize("fraction", [0.3, 0.7])
def test_spot_is_the_on_demand_rate_less_the_discount_whatever_the_discount(fraction):
    # 0.5 alone cannot tell `price * (1 - d)` from `price * d`
    catalog = CATALOG.model_copy(update={"default_spot_discount": fraction})
    (_, infer) = cost.pool_costs(load(valid_config()).pools, catalog, "us-east-1")
    assert infer.node_hourly == approx(10.49264 * (1 - fraction))


def _with_commitment_discount(fraction):
    discount = cost.Discount(fraction=fraction, source="test quote", asOf="2026-08")
    region = US.model_copy(update={"commitment_discount": {"p5": {"savings-plan/3y/no-upfront": discount},
                                                           "g6e": {"savings-plan/3y/no-upfront": discount}}})
    return PRICES.model_copy(update={"regions": {**PRICES.regions, "us-east-1": region}})


def test_a_commitment_discounts_the_steady_nodes_and_shows_its_term():
    config = valid_config()
    config["nodePools"][1].update(capacity="on-demand", minNodes=1, desiredNodes=2, maxNodes=4,
                                  commitment={"type": "savings-plan", "term": "3y"})
    config["nodePools"][0]["commitment"] = {"type": "savings-plan", "term": "3y"}
    spec = load(config)
    train, infer = cost.pool_costs(spec.pools, CATALOG, "us-east-1", _with_commitment_discount(0.4))
    # 2 committed g6e nodes at 60 % of on-demand; the 2 above desired at on-demand
    assert infer.hourly_at_desired == approx(2 * 10.49264 * 0.6)
    assert infer.hourly_at_max == approx(2 * 10.49264 * 0.6 + 2 * 10.49264)
    assert infer.committed_hourly == approx(2 * 10.49264 * 0.6) and infer.commitment == "savings-plan/3y/no-upfront"
    # a reservation under a Savings Plan: the whole reservation at the discounted rate
    assert train.hourly_at_desired == approx(2 * 55.04 * 0.6)
    e = cost.estimate(spec, TODAY, _with_commitment_discount(0.4))
    assert e.saving_hourly("desired") == approx((2 * 55.04 + 2 * 10.49264) * 0.4, abs=1e-3)
    # the hourly figure is rounded to 1/100 cent: at most $1.31 over 26,280 hours
    assert cost.three_years(infer.committed_hourly) == approx(2 * 10.49264 * 0.6 * 730 * 36, abs=1.32)


def test_a_commitment_without_a_sourced_discount_is_priced_at_on_demand_and_says_so():
    config = valid_config()
    config["nodePools"][0]["commitment"] = {"type": "reserved-instance", "term": "1y", "payment": "all-upfront"}
    (train, _) = cost.pool_costs(load(config).pools, CATALOG, "us-east-1")
    assert train.hourly_at_max == approx(2 * 55.04)
    assert "no reserved-instance/1y/all-upfront discount for p5" in train.basis


def test_a_commitment_on_spot_or_a_capacity_block_is_refused_by_key():
    config = valid_config()
    config["nodePools"][1]["commitment"] = {"type": "savings-plan", "term": "1y"}
    with pytest.raises(ConfigError) as raised:
        load(config)
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[1].commitment" and "does not apply to capacity spot" in issue.message


def test_the_control_plane_is_billed_at_the_extended_rate_after_standard_support():
    spec = stack_spec("dev")
    assert fixed(cost.estimate(spec, date(2027, 3, 26)))["EKS control plane"].hourly_at_max == approx(0.10)
    after = fixed(cost.estimate(spec, date(2027, 3, 27)))["EKS control plane"]
    assert after.hourly_at_max == approx(0.60) and "extended support since 2027-03-27" in after.item


def test_monthly_and_three_year_figures_use_730_hour_months():
    assert cost.monthly(1.0) == 730 and cost.three_years(1.0) == 730 * 36


def test_monthly_figures_come_from_the_unrounded_hourly_price():
    # 18 root volumes at $70.00 a month each (500 GiB x $0.08 + 3,000 IOPS x $0.005 + 375 MB/s x $0.04) are
    # $1,260.00 a month; from the hourly figure rounded first ($1.7260) they would be $1,259.98.
    item = fixed(cost.estimate(stack_spec("prod-us-east-1"), TODAY))["GPU nodes' root volumes"]
    assert item.quantity_at_max == 18
    assert cost.monthly(item.hourly_at_max) == 1260.00
    assert cost.per_hour(item.hourly_at_max) == 1.726
    assert cost.three_years(item.hourly_at_max) == 45360.00          # 36 x $1,260
    assert cost.cents(-0.001) == 0.0 and str(cost.cents(-0.001)) == "0.0"   # never "-0.0"


def test_every_rate_names_its_source_and_date():
    rates = list(PRICES.eks_control_plane_hourly.values())
    for region in PRICES.regions.values():
        rates += list(region.instance_hourly.values()) + list(region.capacity_block_hourly.values())
        rates += list(region.spot_discount.values()) + list(region.lustre_persistent2_gb_month.values())
        rates += [r for r in (region.nat_gateway_hourly, region.public_ipv4_hourly, region.interface_endpoint_hourly,
                              region.transit_gateway_attachment_hourly, region.network_load_balancer_hourly) if r]
    assert rates and all(r.source and re.match(r"^\d{4}", r.as_of) for r in rates)
    assert set(US.instance_hourly) >= set(pods.SYSTEM_NODE_TYPES)


def test_what_cost_restates_matches_the_components_that_build_it():
    from components import cluster, network, nodepool
    assert cost.SYSTEM_NODES_DESIRED == inspect.signature(cluster.ClusterArgs).parameters["system_desired_nodes"].default
    assert cost.INTERFACE_ENDPOINT_SERVICES == len(network.INTERFACE_ENDPOINTS)
    assert cost.ROOT_VOLUME_GIB == nodepool.ROOT_VOLUME_GIB
    volume = re.search(r'volume_size=ROOT_VOLUME_GIB, volume_type="gp3", iops=(\d+), throughput=(\d+)',
                       inspect.getsource(nodepool))
    assert volume and (int(volume[1]), int(volume[2])) == (cost.ROOT_VOLUME_IOPS, cost.ROOT_VOLUME_MBPS)
