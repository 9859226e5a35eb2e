"""Refresh the GPU on-demand prices of decisions/catalog/catalog.yaml from the AWS Price List Query API, and read the
Savings Plans discounts decisions/cost/prices.yaml's commitmentDiscount lacks from the Savings Plans API.

For users with AWS credentials (pricing:GetProducts; savingsplans:DescribeSavingsPlansOfferingRates); never run by
the tests, which check the parsing on saved responses. Usage: python scripts/refresh_prices.py [--write]
[--savings-plans] [--spot-days DAYS] [--fsx]. Without --write it prints what would change. --write writes every price
the API answered with its own source and date on its line (REFRESH_SOURCE, today); an offer the API did not answer keeps the price, source and
date it had (its region's priceSources entry, or its own). --savings-plans prints the commitmentDiscount entries
(fraction below on-demand per family, 1 and 3 years, no upfront) to paste into decisions/cost/prices.yaml, with their
source and date; it writes nothing. --fsx prints, the same way, the lustrePersistent2GbMonth entries (FSx for Lustre
PERSISTENT_2 SSD storage per GB-month, per throughput tier) of every catalog region.

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
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
CATALOG_PATH = ROOT / "decisions" / "catalog" / "catalog.yaml"

# One product per type and region: Linux, shared tenancy, no pre-installed software, the price of running
# instances (capacitystatus Used, not an unused reservation's), bought on demand: the price list also carries a
# Capacity Block product of the same type with every other attribute equal (marketoption CapacityBlock, operation
# RunInstances:CB; tests/upstream/aws-price-list-ec2-p4d-us-east-1.json records both).
FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
           "licenseModel": "No License required", "marketoption": "OnDemand"}


def filters(instance_type: str, region: str):
    """GetProducts Filters for one type in one region."""
    fields = {"instanceType": instance_type, "regionCode": region, **FILTERS}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in fields.items()]


def one_price(price_list: Iterable[str], matches, unit: str, subject: str, prices_named: str) -> Optional[float]:
    """The one positive on-demand USD price per `unit` among the products of a GetProducts PriceList that `matches`
    (a test on a product's attributes and family), or None when none does. Refuses an answer with more than one: the
    filters must single out one product."""
    prices = set()
    for item in price_list:
        product = json.loads(item)
        attributes = product["product"]["attributes"]
        if not matches(attributes, product["product"].get("productFamily", attributes.get("productFamily"))):
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term["priceDimensions"].values():
                if dimension["unit"] == unit and float(dimension["pricePerUnit"]["USD"]) > 0:
                    prices.add(float(dimension["pricePerUnit"]["USD"]))
    if len(prices) > 1:
        raise ValueError(f"{subject}: several {prices_named} {sorted(prices)}; narrow the filters")
    return prices.pop() if prices else None


def on_demand_usd(price_list: Iterable[str], instance_type: str, region: str) -> Optional[float]:
    """The hourly on-demand USD price of `instance_type` in `region` (FILTERS) in a GetProducts PriceList."""
    def matches(attributes, _family):
        return attributes.get("instanceType") == instance_type and attributes.get("regionCode") == region and \
            all(attributes.get(field) == value for field, value in FILTERS.items())
    return one_price(price_list, matches, "Hrs", f"{instance_type} in {region}", "on-demand prices")


def catalog_offers(text: str) -> Dict[Tuple[str, str], Optional[float]]:
    """(type, region) -> onDemandUsd as catalog.yaml has them."""
    import yaml
    data = yaml.safe_load(text)
    return {(name, region): offer.get("onDemandUsd")
            for name, spec in data["instanceTypes"].items() for region, offer in spec["regions"].items()}


# What a price read by this script cites (catalog.yaml: an offer's own source and asOf).
REFRESH_SOURCE = "AWS Price List Query API GetProducts (Linux, shared tenancy, on-demand)"


def update_catalog(text: str, prices: Mapping[Tuple[str, str], float], as_of: str,
                   source: str = REFRESH_SOURCE) -> str:
    """catalog.yaml with the given prices replaced in place, each dated with its own `source` and `as_of` (an offer
    not given keeps its price, source and date), comments and layout kept."""
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
            # repr, not :g, whose six significant digits would write 21.957642 as 21.9576
            lines[i] = (f"{offer[1]}{offer[2]}: {{onDemandUsd: {value!r}, source: {json.dumps(source)}, "
                        f"asOf: {json.dumps(as_of)}}}{offer[4]}\n")
    return "".join(lines)


# The Savings Plans API (DescribeSavingsPlansOfferingRates, shapes as in botocore's savingsplans service-2.json,
# botocore 1.44.8) answers {"searchResults": [{"savingsPlanOffering": {"planType": "Compute", "paymentOption":
# "No Upfront", "durationSeconds": 31536000, "currency": "USD", ...}, "rate": "<USD>", "unit": "Hrs", "usageType":
# "[<region prefix>-]BoxUsage:<type>", "operation": "RunInstances", "properties": [{"name": "region", "value": ...},
# {"name": "instanceType", ...}, {"name": "productDescription", ...}, {"name": "tenancy", ...}]}], "nextToken": ...}.
# decisions/cost/prices.yaml's "savings-plan" is a Compute Savings Plan; its terms and payments, as the API names them:
PLAN_TYPE = "Compute"
TERMS = {"1y": 365 * 24 * 3600, "3y": 3 * 365 * 24 * 3600}
PAYMENTS = {"no-upfront": "No Upfront", "partial-upfront": "Partial Upfront", "all-upfront": "All Upfront"}
# Linux on shared tenancy, as the catalog's on-demand prices are (FILTERS above).
RATE_PROPERTIES = {"productDescription": "Linux/UNIX", "tenancy": "shared"}


def savings_plan_request(instance_type: str, region: str, payment: str = "no-upfront") -> dict:
    """DescribeSavingsPlansOfferingRates arguments for one type's Compute Savings Plan rates in one region."""
    filters = {"region": region, "instanceType": instance_type, **RATE_PROPERTIES}
    return {"savingsPlanTypes": [PLAN_TYPE], "savingsPlanPaymentOptions": [PAYMENTS[payment]], "products": ["EC2"],
            "serviceCodes": ["AmazonEC2"], "operations": ["RunInstances"],
            "filters": [{"name": name, "values": [value]} for name, value in filters.items()]}


def savings_plan_rates(results: Iterable[Mapping], instance_type: str, region: str,
                       payment: str = "no-upfront") -> Dict[str, float]:
    """term ("1y", "3y") -> the hourly Compute Savings Plan rate of a running Linux, shared-tenancy instance in an
    answer's searchResults. Refuses an answer with two rates for one term: the filters must single out one."""
    usage = re.compile(r"(?:[A-Z0-9]+-)?BoxUsage:" + re.escape(instance_type))   # not HostBoxUsage, DedicatedUsage
    found: Dict[str, set] = {}
    for result in results:
        offering = result["savingsPlanOffering"]
        properties = {p["name"]: p["value"] for p in result.get("properties", [])}
        if (offering.get("planType") != PLAN_TYPE or offering.get("paymentOption") != PAYMENTS[payment]
                or offering.get("currency", "USD") != "USD" or result.get("unit") != "Hrs"
                or result.get("operation") != "RunInstances" or not usage.fullmatch(result.get("usageType", ""))
                or properties.get("region") != region or properties.get("instanceType") != instance_type
                or any(properties.get(k) != v for k, v in RATE_PROPERTIES.items())):
            continue
        term = next((t for t, seconds in TERMS.items() if seconds == offering.get("durationSeconds")), None)
        if term:
            found.setdefault(term, set()).add(float(result["rate"]))
    for term, rates in found.items():
        if len(rates) > 1:
            raise ValueError(f"{instance_type} in {region}: several {term} Savings Plan rates {sorted(rates)}; "
                             "narrow the filters")
    return {term: rates.pop() for term, rates in found.items()}


def family_discounts(rates: Mapping[str, Mapping[str, float]], on_demand: Mapping[str, float],
                     families: Mapping[str, str]) -> Dict[str, Dict[str, float]]:
    """family -> term -> the fraction below on-demand, from each type's Savings Plan rate against its on-demand
    price. Where a family's types differ, the smallest discount (the plan then errs high)."""
    out: Dict[str, Dict[str, float]] = {}
    for instance_type, by_term in rates.items():
        for term, rate in by_term.items():
            fraction = round(1 - rate / on_demand[instance_type], 4)
            family = out.setdefault(families[instance_type], {})
            family[term] = min(fraction, family.get(term, fraction))
    return out


def commitment_yaml(discounts: Mapping[str, Mapping[str, float]], region: str, as_of: str,
                    payment: str = "no-upfront") -> List[str]:
    """The commitmentDiscount lines of one region, for decisions/cost/prices.yaml, each with its source and date."""
    lines = ["    commitmentDiscount:"]
    for family in sorted(discounts):
        lines.append(f"      {family}:")
        for term in sorted(discounts[family]):
            lines += [f"        savings-plan/{term}/{payment}:",
                      f"          fraction: {discounts[family][term]}",
                      f'          source: "AWS Savings Plans API DescribeSavingsPlansOfferingRates, Compute Savings '
                      f'Plan, {PAYMENTS[payment]}, Linux/UNIX shared, {region}, against the Price List on-demand rate"',
                      f'          asOf: "{as_of}"']
    return lines


def fetch_savings_plan_rates(client, instance_type: str, region: str) -> Dict[str, float]:
    results, token = [], None
    while True:
        kwargs = savings_plan_request(instance_type, region)
        if token:
            kwargs["nextToken"] = token
        answer = client.describe_savings_plans_offering_rates(**kwargs)
        results += answer.get("searchResults", [])
        token = answer.get("nextToken")
        if not token:
            return savings_plan_rates(results, instance_type, region)


# EC2 DescribeSpotPriceHistory (botocore's ec2 service model): {"SpotPriceHistory": [{"AvailabilityZone",
# "AvailabilityZoneId", "InstanceType", "ProductDescription": "Linux/UNIX", "SpotPrice": "<USD>", "Timestamp"}],
# "NextToken"}. The published history, not the Spot Instance Advisor's savings bands.
SPOT_PRODUCT = "Linux/UNIX"


def spot_discount(history: Iterable[Mapping], instance_type: str, on_demand: float) -> Optional[float]:
    """The fraction below on-demand at the dearest spot price any zone paid in the history (so the plan errs high),
    or None when the history has no Linux price for the type. 0 or less where spot cost as much as on-demand or
    more: no discount (family_spot_discounts leaves such a family out)."""
    prices = [float(h["SpotPrice"]) for h in history
              if h.get("InstanceType") == instance_type and h.get("ProductDescription") == SPOT_PRODUCT]
    return round(1 - max(prices) / on_demand, 4) if prices else None


def family_spot_discounts(history: Iterable[Mapping],
                          on_demand: Mapping[str, float]) -> Tuple[Dict[str, float], List[str]]:
    """family -> its smallest spot discount over its types (so the plan errs high), and why a family was left out.
    prices.yaml's discounts are above 0: a family one of whose types had a spot price at or above on-demand has no
    discount to write, and falls back to the catalog's defaultSpotDiscount, marked assumed in the plan."""
    history = list(history)
    found: Dict[str, List[Tuple[str, float]]] = {}
    for name, price in sorted(on_demand.items()):
        fraction = spot_discount(history, name, price)
        if fraction is not None:
            found.setdefault(name.split(".")[0], []).append((name, fraction))
    discounts: Dict[str, float] = {}
    skipped: List[str] = []
    for family, fractions in sorted(found.items()):
        bad = [(name, fraction) for name, fraction in fractions if fraction <= 0]
        if bad:
            skipped.append(f"{family}: skipped, no discount: " + ", ".join(
                f"{name}'s dearest spot price is {-fraction:.2%} above on-demand" if fraction < 0 else
                f"{name}'s dearest spot price is its on-demand price" for name, fraction in bad)
                + " (the family falls back to the catalog's defaultSpotDiscount)")
            continue
        discounts[family] = min(fraction for _, fraction in fractions)
    return discounts, skipped


def spot_yaml(discounts: Mapping[str, float], region: str, days: int, as_of: str) -> List[str]:
    """The spotDiscount lines of one region, for decisions/cost/prices.yaml, each with its source and date."""
    lines = ["    spotDiscount:"]
    for family in sorted(discounts):
        lines += [f"      {family}:", f"        fraction: {discounts[family]}",
                  f'        source: "EC2 DescribeSpotPriceHistory, Linux/UNIX, {region}, dearest zone over the {days} '
                  f'days to {as_of}, against the Price List on-demand rate"',
                  f'        asOf: "{as_of}"']
    return lines


# FSx for Lustre PERSISTENT_2 SSD storage (GetProducts, ServiceCode "AmazonFSx"). The attribute names are the ones
# pricing tools filter AmazonFSx products on: productFamily "Storage" with deploymentOption, fileSystemType and
# storageType (infracost/infracost internal/resources/aws/fsx_openzfs_file_system.go), fileSystemType "Lustre" for FSx
# for Lustre (internal/resources/aws/backup_vault.go), and the offer's "Throughput capacity" column
# (Bjorn248/graphql_aws_pricing_api SCHEMATA.md, AmazonFSx: Deployment_option, File_system_type, Storage_type,
# Throughput_capacity), which the Query API names throughputCapacity as it names "Storage type" storageType. No source
# gives the deploymentOption value of a PERSISTENT_2 product, so it is not filtered on: the tier singles PERSISTENT_2
# out (PERSISTENT_1 SSD's tiers are 50, 100 and 200 MB/s/TiB, PERSISTENT_2's 125, 250, 500 and 1000: the FSx API's
# PerUnitStorageThroughput), and an answer with two prices for one tier is refused, not guessed between. A wrong
# attribute name matches no product: every tier then prints as a gap, never as another product's price.
LUSTRE_TIERS = (125, 250, 500, 1000)
LUSTRE_FILTERS = {"productFamily": "Storage", "fileSystemType": "Lustre", "storageType": "SSD"}
LUSTRE_SOURCE = "AWS Price List Query API GetProducts (AmazonFSx, Lustre, SSD storage, throughputCapacity {tier})"


def lustre_filters(tier: int, region: str):
    """GetProducts Filters for the storage of one PERSISTENT_2 SSD throughput tier in one region."""
    fields = {"regionCode": region, "throughputCapacity": str(tier), **LUSTRE_FILTERS}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in fields.items()]


def lustre_gb_month_usd(price_list: Iterable[str], tier: int, region: str) -> Optional[float]:
    """The on-demand USD per GB-month of FSx for Lustre SSD storage at `tier` MB/s/TiB in a GetProducts PriceList, or
    None when no product matches. Backups (usagetype ...BackupUsage) are another product."""
    def matches(attributes, family):
        return (family == LUSTRE_FILTERS["productFamily"] and attributes.get("regionCode") == region
                and attributes.get("fileSystemType") == LUSTRE_FILTERS["fileSystemType"]
                and attributes.get("storageType") == LUSTRE_FILTERS["storageType"]
                and attributes.get("throughputCapacity") == str(tier)
                and "Backup" not in attributes.get("usagetype", ""))
    return one_price(price_list, matches, "GB-Mo", f"FSx for Lustre SSD at {tier} MB/s/TiB in {region}",
                     "GB-month prices")


def lustre_yaml(rates: Mapping[int, Optional[float]], region: str, as_of: str) -> List[str]:
    """The lustrePersistent2GbMonth lines of one region, for decisions/cost/prices.yaml, each with its source and date;
    a tier the API did not price is a comment (a gap), never a line; with none priced the mapping is empty, so the
    lines still load."""
    priced = any(usd is not None for usd in rates.values())
    lines = ["    lustrePersistent2GbMonth:" + ("" if priced else " {}")]
    for tier in sorted(rates):
        if rates[tier] is None:
            lines.append(f"      # {tier}: no price in the Price List API for {region} (left a gap)")
            continue
        lines += [f"      {tier}:", f"        usd: {rates[tier]!r}",
                  f'        source: "{LUSTRE_SOURCE.format(tier=tier)}, {region}"', f'        asOf: "{as_of}"']
    return lines


def get_products(client, service_code: str, filters_: List[dict]) -> List[str]:
    """Every PriceList entry GetProducts answers for `filters_`, page by page (NextToken)."""
    price_list, token = [], None
    while True:
        kwargs = {"ServiceCode": service_code, "Filters": filters_, "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        answer = client.get_products(**kwargs)
        price_list += answer["PriceList"]
        token = answer.get("NextToken")
        if not token:
            return price_list


def fetch_lustre(client, tier: int, region: str) -> Optional[float]:
    return lustre_gb_month_usd(get_products(client, "AmazonFSx", lustre_filters(tier, region)), tier, region)


def print_lustre_rates(client) -> int:
    """Every catalog region's PERSISTENT_2 SSD storage rates, per tier, as prices.yaml lines."""
    regions = sorted({region for _, region in catalog_offers(CATALOG_PATH.read_text(encoding="utf-8"))})
    for region in regions:
        rates = {tier: fetch_lustre(client, tier, region) for tier in LUSTRE_TIERS}
        print(f"  {region}:")
        print("\n".join(lustre_yaml(rates, region, date.today().isoformat())))
    return 0


def fetch(client, instance_type: str, region: str) -> Optional[float]:
    return on_demand_usd(get_products(client, "AmazonEC2", filters(instance_type, region)), instance_type, region)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the new prices into decisions/catalog/catalog.yaml")
    parser.add_argument("--savings-plans", action="store_true",
                        help="print decisions/cost/prices.yaml commitmentDiscount entries from the Savings Plans API")
    parser.add_argument("--spot-days", type=int, metavar="DAYS",
                        help="print decisions/cost/prices.yaml spotDiscount entries from the last DAYS "
                             "of spot price history")
    parser.add_argument("--fsx", action="store_true",
                        help="print decisions/cost/prices.yaml lustrePersistent2GbMonth entries (FSx for Lustre "
                             "PERSISTENT_2 SSD, per throughput tier) from the Price List API")
    args = parser.parse_args(argv)
    import boto3
    if args.savings_plans:
        return print_savings_plans(boto3.client("savingsplans", region_name="us-east-1"))
    if args.spot_days:
        return print_spot_discounts(boto3, args.spot_days)
    if args.fsx:
        return print_lustre_rates(boto3.client("pricing", region_name="us-east-1"))
    client = boto3.client("pricing", region_name="us-east-1")   # the Price List API's endpoint region
    text = CATALOG_PATH.read_text(encoding="utf-8")
    answered = {}
    for (instance_type, region), old in sorted(catalog_offers(text).items()):
        new = fetch(client, instance_type, region)
        if new is None:
            kept = "None" if old is None else f"{old}, its source and date"
            print(f"{instance_type} {region}: no on-demand price in the Price List API (kept {kept})")
            continue
        if new != old:
            print(f"{instance_type} {region}: {old} -> {new}")
        answered[(instance_type, region)] = new
    if args.write:
        today = date.today().isoformat()
        CATALOG_PATH.write_text(update_catalog(text, answered, today), encoding="utf-8")
        print(f"wrote {CATALOG_PATH}: {len(answered)} prices the API answered, each dated {today} with its source "
              f"({REFRESH_SOURCE}); the others keep theirs")
    return 0


def _priced_types() -> Tuple[Dict[str, Any], Dict[str, Dict[str, float]]]:
    """The catalog, and its on-demand prices per region: region -> type -> USD an hour."""
    import yaml
    data = yaml.safe_load(CATALOG_PATH.read_text(encoding="utf-8"))
    by_region: Dict[str, Dict[str, float]] = {}
    for name, spec in data["instanceTypes"].items():
        for region, offer in spec["regions"].items():
            if offer.get("onDemandUsd"):
                by_region.setdefault(region, {})[name] = offer["onDemandUsd"]
    return data, by_region


def print_savings_plans(client) -> int:
    """The catalog's priced types, per region: their Compute Savings Plan discounts as prices.yaml lines."""
    data, by_region = _priced_types()
    families = {name: name.split(".")[0] for name in data["instanceTypes"]}
    for region, on_demand in sorted(by_region.items()):
        rates = {name: fetch_savings_plan_rates(client, name, region) for name in sorted(on_demand)}
        print(f"  {region}:")
        print("\n".join(commitment_yaml(family_discounts(rates, on_demand, families), region,
                                         date.today().isoformat())))
    return 0


def print_spot_discounts(boto3, days: int) -> int:
    """The catalog's priced types, per region: each family's smallest spot discount as prices.yaml lines."""
    from datetime import datetime, timedelta, timezone
    _, by_region = _priced_types()
    start = datetime.now(timezone.utc) - timedelta(days=days)
    for region, on_demand in sorted(by_region.items()):
        pages = boto3.client("ec2", region_name=region).get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=sorted(on_demand), ProductDescriptions=[SPOT_PRODUCT], StartTime=start)
        history = [h for page in pages for h in page["SpotPriceHistory"]]
        discounts, skipped = family_spot_discounts(history, on_demand)
        print(f"  {region}:")
        for reason in skipped:
            print(f"    # {reason}")           # a YAML comment: the printed lines still paste into prices.yaml
        print("\n".join(spot_yaml(discounts, region, days, date.today().isoformat())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
