"""Refresh the GPU on-demand prices of spec/catalog.yaml from the AWS Price List Query API.

For users with AWS credentials (pricing:GetProducts); never run by the tests, which check the parsing on a saved
response. Usage: python scripts/refresh_prices.py [--write]. Without --write it prints what would change.

The API (AWS Price List Query API, GetProducts; endpoint in us-east-1) answers {"FormatVersion": "aws_v1",
"PriceList": [<one JSON string per product>], "NextToken": ...}. Each product string holds "product" (with
"attributes": instanceType, regionCode, operatingSystem, tenancy, preInstalledSw, capacitystatus, ...) and
"terms" -> "OnDemand" -> {offer term code: {"priceDimensions": {rate code: {"unit": "Hrs",
"pricePerUnit": {"USD": "55.0400000000"}}}}}.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import date
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
CATALOG_PATH = ROOT / "spec" / "catalog.yaml"

# One product per type and region: Linux, shared tenancy, no pre-installed software, the price of running
# instances (capacitystatus Used, not an unused reservation's).
FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
           "licenseModel": "No License required"}


def filters(instance_type: str, region: str):
    """GetProducts Filters for one type in one region."""
    fields = {"instanceType": instance_type, "regionCode": region, **FILTERS}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in fields.items()]


def on_demand_usd(price_list: Iterable[str], instance_type: str, region: str) -> Optional[float]:
    """The hourly on-demand USD price in a GetProducts PriceList, or None when no product matches.
    Refuses an answer with more than one price: the filters must single out one product."""
    prices = set()
    for item in price_list:
        product = json.loads(item)
        attributes = product["product"]["attributes"]
        if attributes.get("instanceType") != instance_type or attributes.get("regionCode") != region:
            continue
        if any(attributes.get(field) != value for field, value in FILTERS.items()):
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term["priceDimensions"].values():
                if dimension["unit"] == "Hrs" and float(dimension["pricePerUnit"]["USD"]) > 0:
                    prices.add(float(dimension["pricePerUnit"]["USD"]))
    if len(prices) > 1:
        raise ValueError(f"{instance_type} in {region}: several on-demand prices {sorted(prices)}; narrow the filters")
    return prices.pop() if prices else None


def catalog_offers(text: str) -> Dict[Tuple[str, str], Optional[float]]:
    """(type, region) -> onDemandUsd as catalog.yaml has them."""
    import yaml
    data = yaml.safe_load(text)
    return {(name, region): offer.get("onDemandUsd")
            for name, spec in data["instanceTypes"].items() for region, offer in spec["regions"].items()}


def update_catalog(text: str, prices: Mapping[Tuple[str, str], float], as_of: str) -> str:
    """catalog.yaml with the given prices and pricesAsOf replaced in place, comments and layout kept."""
    lines = text.splitlines(keepends=True)
    current_type = None
    for i, line in enumerate(lines):
        top = re.match(r"^  ([a-z0-9][a-z0-9.-]*):\s*$", line)
        if top:
            current_type = top[1]
            continue
        offer = re.match(r"^(\s+)([a-z]{2}-[a-z]+-\d): \{onDemandUsd: ([^}]*)\}(.*)$", line.rstrip("\n"))
        if offer and (current_type, offer[2]) in prices:
            value = prices[(current_type, offer[2])]
            lines[i] = f"{offer[1]}{offer[2]}: {{onDemandUsd: {value:g}}}{offer[4]}\n"
    out = "".join(lines)
    return re.sub(r'^pricesAsOf: "[^"]*"', f'pricesAsOf: "{as_of}"', out, count=1, flags=re.M)


def fetch(client, instance_type: str, region: str) -> Optional[float]:
    price_list, token = [], None
    while True:
        kwargs = {"ServiceCode": "AmazonEC2", "Filters": filters(instance_type, region), "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        answer = client.get_products(**kwargs)
        price_list += answer["PriceList"]
        token = answer.get("NextToken")
        if not token:
            return on_demand_usd(price_list, instance_type, region)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the new prices into spec/catalog.yaml")
    args = parser.parse_args(argv)
    import boto3
    client = boto3.client("pricing", region_name="us-east-1")   # the Price List API's endpoint region
    text = CATALOG_PATH.read_text(encoding="utf-8")
    found = {}
    for (instance_type, region), old in sorted(catalog_offers(text).items()):
        new = fetch(client, instance_type, region)
        if new is None:
            print(f"{instance_type} {region}: no on-demand price in the Price List API (kept {old})")
        elif new != old:
            print(f"{instance_type} {region}: {old} -> {new}")
            found[(instance_type, region)] = new
    if args.write:
        CATALOG_PATH.write_text(update_catalog(text, found, date.today().strftime("%Y-%m")), encoding="utf-8")
        print(f"wrote {CATALOG_PATH}; update priceSource's date there too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
