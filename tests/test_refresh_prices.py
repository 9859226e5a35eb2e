"""scripts/refresh_prices.py: parsing a saved GetProducts answer and rewriting catalog.yaml in place.

The sample's shape follows the AWS Price List Query API reference (GetProducts: FormatVersion aws_v1, PriceList
of JSON strings with product.attributes and terms.OnDemand.<term>.priceDimensions.<rate>.pricePerUnit.USD)."""
import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import refresh_prices  # noqa: E402

from decisions.catalog.catalog import CATALOG_PATH, Catalog  # noqa: E402


def product(instance_type, region, usd, **attributes):
    attrs = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
             "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
             "marketoption": "OnDemand",
             "instanceFamily": "GPU instance", **attributes}
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": "SKU1"},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {"SKU1.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": "SKU1", "effectiveDate": "2026-08-01T00:00:00Z", "termAttributes": {},
            "priceDimensions": {"SKU1.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                "beginRange": "0", "endRange": "Inf", "appliesTo": [], "rateCode": "SKU1.JRTCKXETXF.6YS6EN2CT7",
                "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}},
        "version": "20260801000000", "publicationDate": "2026-08-01T00:00:00Z"})


SAMPLE = {"FormatVersion": "aws_v1", "PriceList": [
    product("p5.48xlarge", "us-east-1", 55.04),
    product("p5.48xlarge", "us-east-1", 0.0, capacitystatus="UnusedCapacityReservation"),
    product("p5.48xlarge", "us-east-1", 61.2, operatingSystem="RHEL"),
]}


def test_the_linux_shared_on_demand_price_is_read_from_a_get_products_answer():
    assert refresh_prices.on_demand_usd(SAMPLE["PriceList"], "p5.48xlarge", "us-east-1") == 55.04
    assert refresh_prices.on_demand_usd(SAMPLE["PriceList"], "p5e.48xlarge", "us-east-1") is None
    assert refresh_prices.on_demand_usd([], "p5.48xlarge", "us-east-1") is None


def test_two_prices_for_one_product_are_refused():
    answer = [product("p5.48xlarge", "us-east-1", 55.04), product("p5.48xlarge", "us-east-1", 98.32)]
    with pytest.raises(ValueError, match="several on-demand prices"):
        refresh_prices.on_demand_usd(answer, "p5.48xlarge", "us-east-1")


def test_filters_single_out_one_product():
    fields = {f["Field"]: f["Value"] for f in refresh_prices.filters("p5.48xlarge", "us-east-1")}
    assert fields["instanceType"] == "p5.48xlarge" and fields["regionCode"] == "us-east-1"
    assert fields["capacitystatus"] == "Used" and fields["operatingSystem"] == "Linux"


def test_the_catalog_is_rewritten_in_place_and_still_loads():
    text = CATALOG_PATH.read_text(encoding="utf-8")
    offers = refresh_prices.catalog_offers(text)
    assert offers[("p5.48xlarge", "us-east-1")] == 55.04 and offers[("p5e.48xlarge", "us-east-1")] is None
    out = refresh_prices.update_catalog(text, {("p5.48xlarge", "us-east-1"): 50.5, ("g5.12xlarge", "eu-west-1"): 6.4},
                                        "2026-09")
    catalog = Catalog.model_validate(yaml.safe_load(out))
    assert catalog.instance_types["p5.48xlarge"].regions["us-east-1"].on_demand_usd == 50.5
    assert catalog.instance_types["g5.12xlarge"].regions["eu-west-1"].on_demand_usd == 6.4
    assert catalog.instance_types["g5.12xlarge"].regions["us-east-1"].on_demand_usd == 5.672    # untouched
    # Only what was refreshed is dated: the new prices cite the API and the day; the rest keep their region's.
    refreshed = catalog.price_source("g5.12xlarge", "eu-west-1")
    assert (refreshed.source, refreshed.as_of) == (refresh_prices.REFRESH_SOURCE, "2026-09")
    assert catalog.price_source("p5.48xlarge", "us-east-1").as_of == "2026-09"
    assert catalog.price_source("g5.12xlarge", "us-east-1") == catalog.price_sources["us-east-1"]
    assert catalog.price_source("g4dn.12xlarge", "eu-west-1").as_of == "2025-H1"
    assert catalog.price_sources == Catalog.model_validate(yaml.safe_load(text)).price_sources
    assert (f'eu-west-1: {{onDemandUsd: 6.4, source: "{refresh_prices.REFRESH_SOURCE}", asOf: "2026-09"}}\n'
            in out)
    out = refresh_prices.update_catalog(text, {("p4d.24xlarge", "eu-west-1"): 23.5}, "2026-09")
    assert (f'eu-west-1: {{onDemandUsd: 23.5, source: "{refresh_prices.REFRESH_SOURCE}", asOf: "2026-09"}}    # '
            "offered (snapshot)") in out      # the line's comment is kept
    assert len(out.splitlines()) == len(text.splitlines())


# A DescribeSavingsPlansOfferingRates answer, shaped as botocore's savingsplans service model (1.44.8) describes it.
def sp_rate(rate, instance_type="p5.48xlarge", region="us-east-1", years=1, usage_type=None, **overrides):
    offering = {"offeringId": "00000000-0000-0000-0000-000000000001", "paymentOption": "No Upfront",
                "planType": "Compute", "durationSeconds": years * 31536000, "currency": "USD",
                "planDescription": f"{years} year No Upfront Compute Savings Plan"}
    offering.update(overrides.pop("offering", {}))
    properties = {"region": region, "instanceType": instance_type, "productDescription": "Linux/UNIX",
                  "tenancy": "shared", **overrides.pop("properties", {})}
    return {"savingsPlanOffering": offering, "rate": f"{rate}", "unit": "Hrs", "productType": "EC2",
            "serviceCode": "AmazonEC2", "usageType": usage_type or f"BoxUsage:{instance_type}",
            "operation": "RunInstances", "properties": [{"name": k, "value": v} for k, v in properties.items()],
            **overrides}


SP_ANSWER = [
    sp_rate(40.0), sp_rate(30.0, years=3),
    sp_rate(99.0, usage_type="USE1-HostBoxUsage:p5.48xlarge"),              # a dedicated host, not a shared instance
    sp_rate(98.0, properties={"productDescription": "Windows"}),
    sp_rate(97.0, offering={"paymentOption": "All Upfront"}),
    sp_rate(96.0, offering={"planType": "EC2Instance"}),
    sp_rate(95.0, region="us-east-2"),
]


def test_the_compute_savings_plan_rates_are_read_per_term_from_a_saved_answer():
    assert refresh_prices.savings_plan_rates(SP_ANSWER, "p5.48xlarge", "us-east-1") == {"1y": 40.0, "3y": 30.0}
    euw1 = sp_rate(20.0, "g5.12xlarge", "eu-west-1", usage_type="EUW1-BoxUsage:g5.12xlarge")
    assert refresh_prices.savings_plan_rates([euw1], "g5.12xlarge", "eu-west-1") == {"1y": 20.0}
    assert refresh_prices.savings_plan_rates(SP_ANSWER, "p5e.48xlarge", "us-east-1") == {}
    with pytest.raises(ValueError, match="several 1y Savings Plan rates"):
        refresh_prices.savings_plan_rates([sp_rate(40.0), sp_rate(41.0)], "p5.48xlarge", "us-east-1")


def test_the_savings_plan_request_singles_out_linux_shared_running_instances():
    request = refresh_prices.savings_plan_request("p5.48xlarge", "us-east-1")
    filters = {f["name"]: f["values"] for f in request["filters"]}
    assert filters == {"region": ["us-east-1"], "instanceType": ["p5.48xlarge"], "productDescription": ["Linux/UNIX"],
                       "tenancy": ["shared"]}
    assert request["savingsPlanTypes"] == ["Compute"] and request["savingsPlanPaymentOptions"] == ["No Upfront"]


def test_discounts_per_family_are_the_fraction_below_on_demand_and_load_into_prices_yaml():
    from decisions.cost.cost import RegionPrices
    rates = {"p5.48xlarge": {"1y": 40.0, "3y": 30.0}, "g6e.12xlarge": {"1y": 7.0}, "g6e.48xlarge": {"1y": 20.0}}
    on_demand = {"p5.48xlarge": 55.04, "g6e.12xlarge": 10.0, "g6e.48xlarge": 40.0}
    families = {name: name.split(".")[0] for name in rates}
    discounts = refresh_prices.family_discounts(rates, on_demand, families)
    # 1 - 40 / 55.04 and 1 - 30 / 55.04; g6e: the smaller of 30 % and 50 %
    assert discounts == {"p5": {"1y": 0.2733, "3y": 0.4549}, "g6e": {"1y": 0.3}}
    text = "\n".join(["region:"] + refresh_prices.commitment_yaml(discounts, "us-east-1", "2026-12-04"))
    region = RegionPrices.model_validate(yaml.safe_load(text)["region"])
    assert region.commitment_discount["p5"]["savings-plan/3y/no-upfront"].fraction == 0.4549
    assert region.commitment_discount["g6e"]["savings-plan/1y/no-upfront"].as_of == "2026-12-04"
    assert "DescribeSavingsPlansOfferingRates" in region.commitment_discount["p5"]["savings-plan/1y/no-upfront"].source


def spot(price, instance_type="p4d.24xlarge", zone="use1-az1", product="Linux/UNIX"):
    return {"AvailabilityZone": "us-east-1a", "AvailabilityZoneId": zone, "InstanceType": instance_type,
            "ProductDescription": product, "SpotPrice": f"{price:.6f}", "Timestamp": "2026-12-01T00:00:00Z"}


def test_the_spot_discount_is_taken_at_the_dearest_zone_of_the_history():
    history = [spot(8.0), spot(11.0, zone="use1-az2"), spot(15.0, product="Windows"), spot(19.0, "p4de.24xlarge")]
    # 1 - 11 / 21.957642: the dearest zone, not the cheapest (8) nor another product or type
    assert refresh_prices.spot_discount(history, "p4d.24xlarge", 21.957642) == 0.499
    assert refresh_prices.spot_discount(history, "g6e.12xlarge", 10.49264) is None
    text = "\n".join(["region:"] + refresh_prices.spot_yaml({"p4d": 0.499}, "us-east-1", 90, "2026-12-04"))
    from decisions.cost.cost import RegionPrices
    region = RegionPrices.model_validate(yaml.safe_load(text)["region"])
    assert region.spot_discount["p4d"].fraction == 0.499 and "DescribeSpotPriceHistory" in region.spot_discount["p4d"].source


def test_a_spot_price_at_or_above_on_demand_is_no_discount_and_its_family_is_skipped_with_the_reason():
    # p4de: a zone paid the on-demand price (0); g6e: a zone paid more than on-demand (a negative fraction). Neither
    # loads into prices.yaml (a Discount is above 0), so the family is left out, saying why; p4d keeps its 0.499.
    history = [spot(11.0), spot(27.44705, "p4de.24xlarge"), spot(5.0, "g6e.12xlarge"),
               spot(12.0, "g6e.48xlarge", zone="use1-az2"), spot(33.0, "g6e.48xlarge", zone="use1-az4")]
    on_demand = {"p4d.24xlarge": 21.957642, "p4de.24xlarge": 27.44705, "g6e.12xlarge": 10.49264,
                 "g6e.48xlarge": 30.13118}
    assert refresh_prices.spot_discount(history, "p4de.24xlarge", 27.44705) == 0
    assert refresh_prices.spot_discount(history, "g6e.48xlarge", 30.13118) < 0
    discounts, skipped = refresh_prices.family_spot_discounts(history, on_demand)
    assert discounts == {"p4d": 0.499}
    assert skipped == [
        "g6e: skipped, no discount: g6e.48xlarge's dearest spot price is 9.52% above on-demand (the family falls back "
        "to the catalog's defaultSpotDiscount)",
        "p4de: skipped, no discount: p4de.24xlarge's dearest spot price is its on-demand price (the family falls back "
        "to the catalog's defaultSpotDiscount)"]
    from decisions.cost.cost import RegionPrices
    text = "\n".join(["region:"] + [f"    # {r}" for r in skipped]
                     + refresh_prices.spot_yaml(discounts, "us-east-1", 90, "2026-12-04"))
    assert set(RegionPrices.model_validate(yaml.safe_load(text)["region"]).spot_discount) == {"p4d"}


def test_the_spot_printout_names_the_skipped_families_as_comments_that_paste(monkeypatch, capsys):
    import types

    class FakeEc2:
        def get_paginator(self, _):
            return types.SimpleNamespace(paginate=lambda **_: [{"SpotPriceHistory": [
                spot(11.0), spot(30.0, "p4de.24xlarge")]}])
    monkeypatch.setattr(refresh_prices, "_priced_types",
                        lambda: ({}, {"us-east-1": {"p4d.24xlarge": 21.957642, "p4de.24xlarge": 27.44705}}))
    assert refresh_prices.print_spot_discounts(types.SimpleNamespace(client=lambda *a, **k: FakeEc2()), 90) == 0
    printed = capsys.readouterr().out
    assert "    # p4de: skipped, no discount: p4de.24xlarge's dearest spot price is 9.30% above on-demand" in printed
    from decisions.cost.cost import RegionPrices
    region = RegionPrices.model_validate(yaml.safe_load(printed)["us-east-1"])
    assert set(region.spot_discount) == {"p4d"}


SIX_REGIONS = {"us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"}


class FakePricing:
    """A Price List client that answers GetProducts from a table, as the API does: one product per filter set."""

    def __init__(self, prices):
        self.prices, self.asked = prices, []

    def get_products(self, ServiceCode, Filters, MaxResults, NextToken=None):
        fields = {f["Field"]: f["Value"] for f in Filters}
        key = (fields["instanceType"], fields["regionCode"])
        self.asked.append(key)
        found = self.prices.get(key)
        return {"FormatVersion": "aws_v1", "PriceList": [product(*key, found)] if found else []}


def test_a_refresh_reads_every_offer_of_every_region_and_writes_the_new_ones(tmp_path, monkeypatch, capsys):
    import types
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    offers = refresh_prices.catalog_offers(catalog.read_text(encoding="utf-8"))
    assert {region for _, region in offers} == SIX_REGIONS
    # a new region's unpriced type gets its price; a known one keeps it; one the API does not price stays null
    client = FakePricing({("p5.48xlarge", "ap-northeast-1"): 71.5, ("g6e.12xlarge", "eu-central-1"): 13.12002})
    monkeypatch.setattr(refresh_prices, "CATALOG_PATH", catalog)
    monkeypatch.setitem(sys.modules, "boto3", types.SimpleNamespace(client=lambda *a, **k: client))
    assert refresh_prices.main(["--write"]) == 0
    assert sorted(client.asked) == sorted(offers)                 # every (type, region) the catalog lists, once
    written = Catalog.model_validate(yaml.safe_load(catalog.read_text(encoding="utf-8")))
    assert written.instance_types["p5.48xlarge"].regions["ap-northeast-1"].on_demand_usd == 71.5
    assert written.instance_types["g6e.12xlarge"].regions["eu-central-1"].on_demand_usd == 13.12002
    assert written.instance_types["p5en.48xlarge"].regions["us-west-2"].on_demand_usd is None
    # Only what the API answered is dated (today, its source); what it did not answer keeps its region's source.
    from datetime import date
    for key in (("p5.48xlarge", "ap-northeast-1"), ("g6e.12xlarge", "eu-central-1")):
        cited = written.price_source(*key)
        assert (cited.source, cited.as_of) == (refresh_prices.REFRESH_SOURCE, date.today().isoformat()), key
    for key in (("g6e.12xlarge", "us-east-1"), ("g5.12xlarge", "eu-west-1")):
        assert written.price_source(*key) == written.price_sources[key[1]], key
    assert written.price_sources == Catalog.model_validate(yaml.safe_load(CATALOG_PATH.read_text())).price_sources
    printed = capsys.readouterr().out
    assert "p5.48xlarge ap-northeast-1: None -> 71.5" in printed
    assert "p5en.48xlarge us-west-2: no on-demand price in the Price List API (kept None)" in printed
    assert "p5.48xlarge us-east-1: no on-demand price in the Price List API (kept 55.04, its source and date)" in printed


def test_the_filters_name_each_new_region_by_its_code():
    for region in SIX_REGIONS:
        fields = {f["Field"]: f["Value"] for f in refresh_prices.filters("g6e.12xlarge", region)}
        assert fields["regionCode"] == region


# --- FSx for Lustre PERSISTENT_2 SSD storage (GetProducts, ServiceCode AmazonFSx) ------------------------------------
def fsx_product(usd, region="us-east-1", tier="500", family="Storage", unit="GB-Mo", sku="FSX1", **attributes):
    """One AmazonFSx product string in the GetProducts shape the EC2 sample above follows. The attribute names are the
    ones scripts/refresh_prices.py cites: productFamily, deploymentOption, fileSystemType and storageType as
    infracost/infracost internal/resources/aws/fsx_openzfs_file_system.go and backup_vault.go filter AmazonFSx on, and
    throughputCapacity, the offer's "Throughput capacity" column (Bjorn248/graphql_aws_pricing_api SCHEMATA.md). The
    prices are made up: what is tested is which product is read, not what AWS charges."""
    attrs = {"regionCode": region, "fileSystemType": "Lustre", "storageType": "SSD", "throughputCapacity": tier,
             "deploymentOption": "Single-AZ", "usagetype": f"Storage.SSD.{tier}", "operation": "CreateFileSystem:Lustre",
             **attributes}
    return json.dumps({
        "product": {"productFamily": family, "attributes": attrs, "sku": sku},
        "serviceCode": "AmazonFSx",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {"priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
            "unit": unit, "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}}})


FSX_ANSWER = [
    fsx_product(1.5),                                                     # the one: Lustre SSD 500 in us-east-1
    fsx_product(9.1, tier="200", usagetype="Storage.SSD.200"),            # a PERSISTENT_1 tier
    fsx_product(9.2, storageType="HDD"),
    fsx_product(9.3, fileSystemType="OpenZFS"),
    fsx_product(9.4, region="eu-west-1"),
    fsx_product(9.5, usagetype="BackupUsage"),                            # a backup, not storage
    fsx_product(9.6, family="Provisioned Throughput", unit="MiBps-Mo"),
]


def test_the_lustre_storage_rate_of_one_tier_is_read_from_a_saved_answer():
    assert refresh_prices.lustre_gb_month_usd(FSX_ANSWER, 500, "us-east-1") == 1.5
    assert refresh_prices.lustre_gb_month_usd(FSX_ANSWER, 1000, "us-east-1") is None
    assert refresh_prices.lustre_gb_month_usd(FSX_ANSWER, 500, "eu-west-1") == 9.4
    assert refresh_prices.lustre_gb_month_usd([], 125, "us-east-1") is None
    with pytest.raises(ValueError, match="several GB-month prices"):
        refresh_prices.lustre_gb_month_usd([fsx_product(1.5), fsx_product(1.7, sku="FSX2")], 500, "us-east-1")


def test_the_lustre_filters_name_the_tier_region_and_ssd_lustre_storage():
    for tier in (125, 250, 500, 1000):
        fields = {f["Field"]: f["Value"] for f in refresh_prices.lustre_filters(tier, "eu-west-1")}
        assert fields == {"regionCode": "eu-west-1", "throughputCapacity": str(tier), "productFamily": "Storage",
                          "fileSystemType": "Lustre", "storageType": "SSD"}
    assert refresh_prices.LUSTRE_TIERS == (125, 250, 500, 1000)


def test_the_lustre_lines_load_into_prices_yaml_and_leave_an_unpriced_tier_a_gap():
    from decisions.cost.cost import RegionPrices
    text = "\n".join(["region:"] + refresh_prices.lustre_yaml({125: 1.25, 250: None, 500: 1.5}, "us-east-1", "2026-12-06"))
    region = RegionPrices.model_validate(yaml.safe_load(text)["region"])
    assert set(region.lustre_persistent2_gb_month) == {125, 500}
    rate = region.lustre_persistent2_gb_month[500]
    assert (rate.usd, rate.as_of) == (1.5, "2026-12-06") and "AmazonFSx" in rate.source and "us-east-1" in rate.source
    assert "# 250: no price in the Price List API for us-east-1 (left a gap)" in text


def test_the_fsx_printout_asks_every_tier_of_every_catalog_region(monkeypatch, capsys):
    import types

    class FakeFsxPricing:
        def __init__(self):
            self.asked = []

        def get_products(self, ServiceCode, Filters, MaxResults, NextToken=None):
            fields = {f["Field"]: f["Value"] for f in Filters}
            assert ServiceCode == "AmazonFSx"
            self.asked.append((int(fields["throughputCapacity"]), fields["regionCode"]))
            known = {("500", "us-east-1"): 1.5, ("250", "eu-west-1"): 1.0}
            usd = known.get((fields["throughputCapacity"], fields["regionCode"]))
            return {"FormatVersion": "aws_v1", "PriceList": [
                fsx_product(usd, fields["regionCode"], fields["throughputCapacity"])] if usd else []}

    client = FakeFsxPricing()
    monkeypatch.setitem(sys.modules, "boto3", types.SimpleNamespace(client=lambda *a, **k: client))
    assert refresh_prices.main(["--fsx"]) == 0
    assert sorted(client.asked) == sorted((t, r) for t in (125, 250, 500, 1000) for r in SIX_REGIONS)
    from decisions.cost.cost import RegionPrices
    printed = yaml.safe_load(capsys.readouterr().out)
    assert set(printed) == SIX_REGIONS
    us = RegionPrices.model_validate(printed["us-east-1"]).lustre_persistent2_gb_month
    eu = RegionPrices.model_validate(printed["eu-west-1"]).lustre_persistent2_gb_month
    assert {t: r.usd for t, r in us.items()} == {500: 1.5} and {t: r.usd for t, r in eu.items()} == {250: 1.0}
    # nothing priced: an empty mapping and a comment per tier, which still loads
    assert RegionPrices.model_validate(printed["ap-northeast-1"]).lustre_persistent2_gb_month == {}


def test_every_page_of_a_get_products_answer_is_read():
    """GetProducts pages with NextToken (up to MaxResults 100 a page): a price on the second page still counts."""
    pages = {None: {"PriceList": [product("p5.48xlarge", "us-east-1", 0.0, capacitystatus="UnusedCapacityReservation")],
                    "NextToken": "page-2"},
             "page-2": {"PriceList": [product("p5.48xlarge", "us-east-1", 55.04)]}}
    calls = []

    class Client:
        def get_products(self, **kwargs):
            calls.append(kwargs)
            return pages[kwargs.get("NextToken")]

    assert refresh_prices.fetch(Client(), "p5.48xlarge", "us-east-1") == 55.04
    assert [c.get("NextToken") for c in calls] == [None, "page-2"]
    assert {c["ServiceCode"] for c in calls} == {"AmazonEC2"} and calls[0]["MaxResults"] == 100


RECORDED = Path(__file__).resolve().parent / "upstream" / "aws-price-list-ec2-p4d-us-east-1.json"


def recorded_answer(offer):
    """A GetProducts answer made of a recorded offer file's products: each PriceList entry is one product with its
    own terms, as the Price List Query API reference shows (product, serviceCode, terms, version, publicationDate).
    An offer file keys its terms by SKU, then term code; a GetProducts entry, being one SKU, by term code alone."""
    return {"FormatVersion": "aws_v1", "PriceList": [json.dumps({
        "product": product, "serviceCode": offer["offerCode"],
        "terms": {"OnDemand": offer["terms"]["OnDemand"][sku]},
        "version": offer["version"], "publicationDate": offer["publicationDate"]})
        for sku, product in offer["products"].items()]}


def test_the_on_demand_price_is_read_from_aws_s_own_price_list_and_not_the_capacity_block_product():
    """AWS's price list (2024-05) lists p4d.24xlarge in us-east-1 twice, alike in every attribute the filters name
    but marketoption (OnDemand, CapacityBlock) and operation: the on-demand product's $32.7726 is the price."""
    offer = json.loads(RECORDED.read_text())["offer"]
    answer = recorded_answer(offer)
    assert len(answer["PriceList"]) == 2
    assert refresh_prices.on_demand_usd(answer["PriceList"], "p4d.24xlarge", "us-east-1") == 32.7726
    # were the Capacity Block product ever priced, the filters still single out the on-demand one
    block = offer["terms"]["OnDemand"]["YSXJGN78QTXNVGDQ"]["YSXJGN78QTXNVGDQ.JRTCKXETXF"]
    block["priceDimensions"]["YSXJGN78QTXNVGDQ.JRTCKXETXF.6YS6EN2CT7"]["pricePerUnit"]["USD"] = "31.4640000000"
    assert refresh_prices.on_demand_usd(recorded_answer(offer)["PriceList"], "p4d.24xlarge", "us-east-1") == 32.7726
    assert {f["Field"]: f["Value"] for f in refresh_prices.filters("p4d.24xlarge", "us-east-1")}["marketoption"] \
        == "OnDemand"
