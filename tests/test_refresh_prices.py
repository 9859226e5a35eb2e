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

from spec.catalog import CATALOG_PATH, Catalog  # noqa: E402


def product(instance_type, region, usd, **attributes):
    attrs = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
             "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
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
    assert catalog.prices_as_of == "2026-09"
    assert "eu-west-1: {onDemandUsd: 6.4}    # weak" in out          # the line's comment is kept
    assert len(out.splitlines()) == len(text.splitlines())
