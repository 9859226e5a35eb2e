"""Hourly cost of GPU pools from catalog prices."""
import pytest

from spec import cost
from spec.catalog import load_catalog
from tests.test_validate import load, valid_config

CATALOG = load_catalog()


def test_capacity_types_are_priced_by_their_rule():
    p5 = CATALOG.instance_types["p5.48xlarge"].regions["us-east-1"].on_demand_usd
    assert cost.node_hourly_usd("p5.48xlarge", "on-demand", CATALOG, "us-east-1") == p5
    assert cost.node_hourly_usd("p5.48xlarge", "reserved", CATALOG, "us-east-1") == p5   # ODCR bills at on-demand
    assert cost.node_hourly_usd("p5.48xlarge", "spot", CATALOG, "us-east-1") == pytest.approx(
        p5 * (1 - CATALOG.default_spot_discount))
    assert cost.node_hourly_usd("p5e.48xlarge", "on-demand", CATALOG, "us-east-1") is None  # no price found
    assert cost.node_hourly_usd("p5.48xlarge", "on-demand", CATALOG, "eu-west-1") is None   # not offered


@pytest.mark.parametrize("discount,expected", [(0.3, 55.04 * 0.7), (0.7, 55.04 * 0.3), (0.0, 55.04)])
def test_spot_is_the_on_demand_rate_less_the_discount_whatever_the_discount(discount, expected):
    # 0.5 alone cannot tell `price * (1 - d)` from `price * d`
    catalog = CATALOG.model_copy(update={"default_spot_discount": discount})
    assert cost.node_hourly_usd("p5.48xlarge", "spot", catalog, "us-east-1") == pytest.approx(expected)


def test_totals_at_desired_and_max():
    spec = load(valid_config())
    estimate = cost.estimate(spec.pools, CATALOG, "us-east-1")
    train, infer = estimate.pools
    assert train.hourly_at_desired == pytest.approx(2 * 55.04) and train.hourly_at_max == pytest.approx(2 * 55.04)
    # a mixed spot pool is priced at its dearest type (g6e.12xlarge), so budgets err high
    assert infer.node_hourly == pytest.approx(10.49264 * 0.5, abs=1e-3) and infer.hourly_at_desired == 0
    assert estimate.hourly_at_max == pytest.approx(2 * 55.04 + 4 * 10.49264 * 0.5, abs=1e-2)
    assert estimate.complete


def test_unpriced_pool_is_reported_not_hidden():
    config = valid_config()
    config["nodePools"][0].update(instanceTypes=["p5e.48xlarge"], capacity="capacity-block")
    spec = load(config)
    estimate = cost.estimate(spec.pools, CATALOG, "us-east-1")
    assert estimate.pools[0].hourly_at_max is None and not estimate.complete
