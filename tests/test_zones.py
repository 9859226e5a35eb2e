"""Zones and subnets a real account can hold for good: decisions/network/zones.py, decisions/nodes/pods.py and the
program around them.

The program is run under the shared mocks with the account changed as AWS might change it between two
`pulumi up`s, to see that nothing already created moves, and with accounts that cannot take the stack, to see
each refused with its key before anything is registered.
"""
from __future__ import annotations

import copy
from datetime import date

import pulumi
import pytest
import yaml

from decisions.catalog.catalog import load_catalog
from decisions.catalog.eks import standard_support_end, version_warnings
from decisions.config.model import Cluster
from decisions.config.validate import load_stack_spec, stack_warnings, supported_kubernetes_versions
from decisions.network.zones import zone_demand
from decisions.nodes import pods
from plan.engine import offline_account
from tests.conftest import run_stack, stack_config
from tests.test_validate import load, valid_config

SUBNET = "aws:ec2/subnet:Subnet"
ASG = "aws:autoscaling/group:Group"
STACK = "prod-us-east-1"


def account(overrides=None, stack=STACK):
    config = stack_config(stack, overrides)
    return offline_account(config["aws:region"], config), config


def subnets(run):
    return {s.name: (s.inputs["cidrBlock"], s.inputs["availabilityZoneId"]) for s in run.of_type(SUBNET)}


def config_error(stack=STACK, overrides=None, mock=None):
    with pytest.raises(pulumi.RunError) as raised:
        run_stack(stack, overrides, account=mock)
    return str(raised.value)


# ----------------------------------------------------------------------------- a layout that stays put

@pytest.fixture(scope="module")
def first_up():
    return run_stack(STACK)


@pytest.mark.parametrize("change", ["undeclared zone impaired", "zones listed in another order", "new zone opens"])
def test_what_the_account_reports_never_moves_a_subnet(first_up, change):
    mock, _ = account()
    if change == "undeclared zone impaired":
        del mock.zones["use1-az3"], mock.zones["use1-az5"]
    elif change == "zones listed in another order":
        mock.zones = dict(reversed(list(mock.zones.items())))
        mock.offerings = dict(reversed(list(mock.offerings.items())))
    else:
        mock.zones["use1-az7"] = "us-east-1g"
        mock.offerings["use1-az7"] = mock.offerings["use1-az1"]
    assert subnets(run_stack(STACK, account=mock)) == subnets(first_up)


def test_a_new_pool_or_an_appended_zone_moves_no_existing_subnet(first_up):
    config = stack_config(STACK)
    pools = copy.deepcopy(config["gpu-cloud:nodePools"])
    pools.append({**pools[0], "name": "train-h100-b", "capacityReservationId": "cr-0b1b2c3d4e5f60718",
                  "availabilityZone": "use1-az2"})
    network = {**config["gpu-cloud:network"], "zones": [*config["gpu-cloud:network"]["zones"], "use1-az5"]}
    grown = subnets(run_stack(STACK, {"gpu-cloud:nodePools": pools, "gpu-cloud:network": network,
                                      "gpu-cloud:budget": {**config["gpu-cloud:budget"], "maxHourlyUsd": 700}}))
    before = subnets(first_up)
    assert {name: grown[name] for name in before} == before
    assert set(grown) - set(before) == {"network-private-use1-az5", "network-public-use1-az5"}


def test_subnets_are_named_and_placed_by_zone_id(first_up):
    assert subnets(first_up)["network-private-use1-az4"] == ("10.64.64.0/19", "use1-az4")
    assert subnets(first_up)["network-public-use1-az1"] == ("10.64.224.0/24", "use1-az1")


# ----------------------------------------------------------------------------- zones the account really has

def test_a_declared_zone_the_account_does_not_offer_is_refused_not_replanned():
    mock, _ = account()
    mock.source = None                   # a real account: it answered, so the refusal names it
    del mock.zones["use1-az4"]
    message = config_error(mock=mock)
    assert "gpu-cloud:network.zones[2]: use1-az4 is not an available zone of us-east-1 in this account" in message


# ----------------------------------------------------------------------------- adding a region: one error per cause

def mistakes(message: str) -> list:
    """The listed mistakes of a config error, one a line."""
    return [line[4:] for line in message.splitlines() if line.startswith("  - ")]


GPU_ZONES = "Zones of us-east-1 that offer a catalog GPU type, as decisions/network/zones.yaml gpuZoneIds (EC2 " \
            "offerings as of 2025-H1) records them: use1-az1, use1-az2, use1-az4, use1-az5, use1-az6"


def dev_network(*zones):
    return {"gpu-cloud:network": {**stack_config("dev")["gpu-cloud:network"], "zones": list(zones)}}


def dev_pool(**changes):
    (pool,) = stack_config("dev")["gpu-cloud:nodePools"]
    return {"gpu-cloud:nodePools": [{**pool, **changes}]}


# What the offline plan says when a declared zone is not among the region's recorded GPU zones, entry by entry:
# the zones declared, the pool's pin, and the mistakes, each (key, words the message holds). Pools that launch only
# in a zone already refused are not refused again, nor is that zone's want of interface endpoints.
OFFLINE_MISSING = [
    (("use1-az1", "use1-az7"), None,
     [("gpu-cloud:network.zones[1]", "use1-az7 is not among the zones of us-east-1 that offer a catalog GPU type")]),
    (("use1-az1", "use1-az7"), "use1-az7",
     [("gpu-cloud:network.zones[1]", "use1-az7 is not among the zones of us-east-1 that offer a catalog GPU type")]),
    (("use1-az7", "use1-az8"), None,
     [("gpu-cloud:network.zones[0]", "use1-az7 is not among"), ("gpu-cloud:network.zones[1]", "use1-az8 is not among")]),
]


@pytest.mark.parametrize("zones,pin,expected", OFFLINE_MISSING)
def test_the_offline_plan_refuses_a_zone_its_data_lacks_once_naming_the_data(zones, pin, expected):
    overrides = dev_network(*zones)
    if pin:
        overrides.update(dev_pool(availabilityZone=pin))
    found = mistakes(config_error("dev", overrides))
    assert [line.split(": ", 1)[0] for line in found] == [key for key, _ in expected]
    for line, (key, words) in zip(found, expected):
        assert words in line
        assert "this account" not in line
        assert ("as decisions/network/zones.yaml gpuZoneIds (EC2 offerings as of 2025-H1) records them (the offline "
                "plan reads no account); offered: use1-az1, use1-az2, use1-az4, use1-az5, use1-az6.") in line
        assert 'gpuZoneIds in decisions/network/zones.yaml with its source (docs/how-to.md "Add a region", step 2)' in line


def test_a_real_account_names_itself_and_hints_the_recorded_gpu_zones():
    mock, config = account(dev_network("use1-az1", "use1-az4"), stack="dev")
    mock.source = None
    del mock.zones["use1-az4"]
    (line,) = mistakes(config_error("dev", dev_network("use1-az1", "use1-az4"), mock=mock))
    assert line.startswith("gpu-cloud:network.zones[1]: use1-az4 is not an available zone of us-east-1 in this "
                           "account; available: use1-az1 (us-east-1a), use1-az2 (us-east-1b), use1-az3 (us-east-1c), ")
    assert line.endswith(GPU_ZONES)


def test_the_offline_account_says_what_it_was_built_from():
    assert offline_account("ap-northeast-1", {}).source == \
        "decisions/network/zones.yaml gpuZoneIds (EC2 offerings as of 2025-H1)"
    assert "records no gpuZoneIds for us-west-1" in offline_account("us-west-1", {}).source


# Each add-region mistake the config alone shows, entry by entry: region, zones, and the one mistake (key, words).
REGION_MISTAKES = [
    # zones of another region (a stack moved without its zones): one mistake for all, naming their region
    ("us-east-1", ["usw2-az1", "usw2-az2"],
     ("gpu-cloud:network.zones", f"usw2-az1, usw2-az2 (us-west-2) are not zone IDs of us-east-1, whose zone IDs start "
                                 f"use1-. {GPU_ZONES}")),
    ("us-east-1", ["use1-az1", "euw1-az3"],
     ("gpu-cloud:network.zones[1]", "euw1-az3 (eu-west-1) is not a zone ID of us-east-1")),
    # a zone EKS refuses: the zones to declare instead
    ("us-east-1", ["use1-az1", "use1-az3"],
     ("gpu-cloud:network.zones[1]", "use1-az3: EKS does not accept cluster subnets in this zone ID (decisions/network/"
                                    f"zones.yaml eksUnsupportedZoneIds); declare another. {GPU_ZONES}")),
    # a region the catalog does not sell GPUs in, whether zones.yaml knows it or not: the region alone
    ("us-west-1", ["use1-az1", "use1-az2"], ("aws:region", "'us-west-1' has no GPU instance types in the catalog")),
    ("ap-south-1", ["use1-az1", "use1-az2"], ("aws:region", "'ap-south-1' has no GPU instance types in the catalog")),
]


@pytest.mark.parametrize("region,zones,expected", REGION_MISTAKES)
def test_each_add_region_mistake_of_the_config_is_one_error(region, zones, expected):
    from decisions.config.errors import ConfigError
    config = valid_config()
    config["network"]["zones"] = zones
    config["nodePools"] = [config["nodePools"][1]]          # one unpinned pool: nothing else to refuse
    config["inference"] = {}
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(config, stack="test", region=region)
    (issue,) = [i for i in raised.value.issues if "budget" not in i.path]
    assert issue.path == expected[0] and expected[1] in issue.message


@pytest.mark.parametrize("facts_change,words", [
    (lambda regions: regions.pop("us-east-1"),
     "us-east-1 has no entry under `regions` of decisions/network/zones.yaml: add its zoneIdPrefix, "
     'eksUnsupportedZoneIds and gpuZoneIds (docs/how-to.md "Add a region", step 2)'),
    (lambda regions: regions.update({"us-east-1": regions["us-east-1"].model_copy(update={"gpu_zone_ids": ()})}),
     "decisions/network/zones.yaml records no gpuZoneIds for us-east-1: add the zone IDs where a catalog GPU type is "
     'offered there, with their source (docs/how-to.md "Add a region", step 2)'),
])
def test_a_catalog_region_without_its_zones_recorded_is_one_error_naming_the_file(monkeypatch, facts_change, words):
    """Step 2 of "Add a region" left out: the region is refused once, not each zone, and not by a guessed account."""
    from decisions.config.errors import ConfigError
    from decisions.network import zones as zone_rules
    facts = zone_rules.load_zone_facts()
    regions = dict(facts.regions)
    facts_change(regions)
    monkeypatch.setattr(zone_rules, "load_zone_facts", lambda: facts.model_copy(update={"regions": regions}))
    with pytest.raises(ConfigError) as raised:
        load(valid_config())
    (issue,) = [i for i in raised.value.issues if "budget" not in i.path]
    assert (issue.path, issue.message) == ("aws:region", words)


def test_adding_a_region_with_one_zone_missing_from_its_data_gives_one_error(tmp_path):
    """docs/how-to.md "Add a region" on a copy, as tests/test_walkthroughs.py does it, but with one of the stack's
    zones left out of gpuZoneIds: one mistake, naming the zone's key, the zones that are recorded and the file."""
    from tests.test_walkthroughs import REGION, REGION_STACK, REGION_ZONES, _add_region, _checkout_copy, _plan, \
        _write_stack
    copy = _checkout_copy(tmp_path)
    _add_region(copy)
    zones = copy / "decisions" / "network" / "zones.yaml"
    text = zones.read_text(encoding="utf-8")
    recorded = f"gpuZoneIds: [{', '.join(REGION_ZONES)}]"
    assert recorded in text
    zones.write_text(text.replace(recorded, f"gpuZoneIds: [{REGION_ZONES[0]}]"), encoding="utf-8")
    _write_stack(copy)
    # Without a budget: what a budget says of a region without prices is not what is tested here.
    stack_file = copy / "stacks" / f"Pulumi.{REGION_STACK}.yaml"
    stack = yaml.safe_load(stack_file.read_text(encoding="utf-8"))
    stack["config"].pop("gpu-cloud:budget", None)
    stack_file.write_text(yaml.safe_dump(stack, sort_keys=False), encoding="utf-8")
    result = _plan(copy)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    (line,) = mistakes(result.stderr)
    assert line.startswith(f"gpu-cloud:network.zones[1]: {REGION_ZONES[1]} is not among the zones of {REGION} ")
    assert f"offered: {REGION_ZONES[0]}." in line and "decisions/network/zones.yaml" in line
    assert 'docs/how-to.md "Add a region"' in line and "this account" not in result.stderr


def test_a_pin_by_name_resolves_per_account_and_must_be_declared():
    config = stack_config(STACK)
    pools = copy.deepcopy(config["gpu-cloud:nodePools"])
    pools[0]["availabilityZone"] = "us-east-1c"          # use1-az3 in the mock account: not declared
    mock, _ = account({"gpu-cloud:nodePools": pools})
    message = config_error(overrides={"gpu-cloud:nodePools": pools}, mock=mock)
    assert "gpu-cloud:nodePools[0].availabilityZone (pool train-h100): us-east-1c is not one of network.zones" in message


def test_a_pinned_pools_type_must_be_offered_in_its_zone():
    mock, _ = account()
    mock.offerings["use1-az1"] = mock.offerings["use1-az1"] - {"p5.48xlarge"}
    assert "gpu-cloud:nodePools[0].instanceTypes (pool train-h100): p5.48xlarge is not offered in use1-az1 (us-east-1a)" in config_error(mock=mock)


def test_a_multi_zone_pool_launches_only_where_its_type_is_offered_and_says_so():
    mock, _ = account()
    mock.offerings["use1-az2"] = mock.offerings["use1-az2"] - {"g6e.12xlarge"}
    run = run_stack(STACK, account=mock)
    infer = run.one(ASG, "infer-l40s-asg")
    subnet_zone = {s.state["id"]: s.inputs["availabilityZoneId"] for s in run.of_type(SUBNET)}
    assert sorted(subnet_zone[s] for s in infer.inputs["vpcZoneIdentifiers"]) == ["use1-az1", "use1-az4"]
    assert "gpu-cloud:nodePools[3]: infer-l40s launches only in use1-az1, use1-az4; use1-az2 do not offer g6e.12xlarge" \
        in run.warnings


def test_a_pool_no_declared_zone_offers_is_refused():
    mock, _ = account()
    for zone in mock.offerings:
        mock.offerings[zone] = mock.offerings[zone] - {"g6e.12xlarge"}
    assert "gpu-cloud:nodePools[3].instanceTypes (pool infer-l40s): g6e.12xlarge: no zone of network.zones offers it" in config_error(mock=mock)


# ----------------------------------------------------------------------------- reservations as they are

RESERVATION = "cr-0a1b2c3d4e5f60718"


@pytest.mark.parametrize("change,expected", [
    ({"AvailabilityZoneId": "use1-az2"}, "gpu-cloud:nodePools[0].availabilityZone (pool train-h100): the pool's zone is use1-az1, but "
                                         "cr-0a1b2c3d4e5f60718 is in use1-az2 (us-east-1b)"),
    ({"InstanceType": "p5e.48xlarge"}, "gpu-cloud:nodePools[0].instanceTypes (pool train-h100): cr-0a1b2c3d4e5f60718 reserves p5e.48xlarge"),
    ({"InstanceCount": 3}, "gpu-cloud:nodePools[0].maxNodes (pool train-h100): 4 is more than the 3 instances cr-0a1b2c3d4e5f60718 holds"),
    ({"PlacementGroupArn": "arn:aws:ec2:us-east-1:123456789012:placement-group/p5-spine"},
     "gpu-cloud:nodePools[0].placementGroup (pool train-h100): cr-0a1b2c3d4e5f60718 was made in placement group p5-spine: set "
     "placementGroup: p5-spine"),
])
def test_a_reservation_that_is_not_what_its_pool_says_is_refused(change, expected):
    mock, _ = account()
    mock.reservations[RESERVATION].update(change)
    assert expected in config_error(mock=mock)


def test_a_reservation_the_account_does_not_have_is_refused():
    mock, _ = account()
    del mock.reservations[RESERVATION]
    message = config_error(mock=mock)
    assert ("gpu-cloud:nodePools[0].capacityReservationId (pool train-h100): cr-0a1b2c3d4e5f60718 could not be read in this account "
            "and region:") in message
    assert "InvalidCapacityReservationId.NotFound" in message


def test_the_offline_plan_reads_reservations_through_the_providers_own_functions(first_up):
    tokens = [token for token, args in first_up.invokes if args.get("identifier") == RESERVATION or args.get("id") == RESERVATION]
    assert tokens == ["aws:cloudcontrol/getResource:getResource"]
    config = stack_config(STACK)
    pools = copy.deepcopy(config["gpu-cloud:nodePools"])
    pools[0]["capacity"] = "capacity-block"
    run = run_stack(STACK, {"gpu-cloud:nodePools": pools})
    assert [t for t, a in run.invokes if a.get("id") == RESERVATION] == [
        "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation"]


def test_a_reservation_larger_than_max_nodes_is_read_billed_in_full_and_budgeted():
    from plan.document import RESERVATION_SOURCE, cost_section
    from plan.stackfile import load_stack

    mock, _ = account()
    mock.reservations[RESERVATION]["InstanceCount"] = 8      # maxNodes is 4
    # prod's budget is $450/hour: the 8 reserved p5 ($440.32) and the other pools at maxNodes come to $545.90
    assert ("gpu-cloud:budget.maxHourlyUsd: GPU pools at maxNodes cost $545.90/hour, above the budget $450.00/hour"
            in config_error(mock=mock))
    run = run_stack(STACK, {"gpu-cloud:budget": {**stack_config(STACK)["gpu-cloud:budget"], "maxHourlyUsd": 600}},
                    account=mock)
    assert run.outputs["reservations"][RESERVATION]["instanceCount"] == 8
    section = cost_section(load_stack(STACK)[1], run)
    (train, *_) = section["pools"]
    assert (train["billedNodesAtDesired"], train["billedNodesAtMax"], train["hourlyAtMax"]) == (8, 8, 440.32)
    assert section["committed"]["hourly"] == 440.32
    assert section["reservations"] == [{"pool": "train-h100", "capacity": "reserved", "reservationId": RESERVATION,
                                        "billedInstances": 8, "sizeSource": f"{RESERVATION} holds 8 instances, as "
                                                                            "the account reports it (InstanceCount)"}]
    assert section["reservationSource"] == RESERVATION_SOURCE and "offline_account" in RESERVATION_SOURCE


def test_the_offline_plan_prices_a_capacity_block_upfront_for_the_term_it_read():
    from decisions.config.validate import load_stack_spec
    from plan.document import _cost_table, cost_section
    from plan.engine import OFFLINE_BLOCK_END, OFFLINE_BLOCK_START

    config = stack_config(STACK)
    pools = copy.deepcopy(config["gpu-cloud:nodePools"])
    pools[0]["capacity"] = "capacity-block"
    run = run_stack(STACK, {"gpu-cloud:nodePools": pools})
    read = run.outputs["reservations"][RESERVATION]
    assert (read["startDate"], read["endDate"], read["instanceCount"]) == (OFFLINE_BLOCK_START, OFFLINE_BLOCK_END, 4)
    keys = {key.split(":", 1)[1]: value for key, value in stack_config(STACK, {"gpu-cloud:nodePools": pools}).items()
            if key.startswith("gpu-cloud:")}
    section = cost_section(load_stack_spec(keys, stack=STACK, region="us-east-1"), run)
    (block,) = section["upfront"]["blocks"]
    # 14 days: $39.33 x 4 instances x 336 hours, once; the run rate keeps only the other pools and fixed costs
    assert (block["hours"], block["total"], section["upfront"]["total"]) == (336, 52859.52, 52859.52)
    assert section["committed"]["hourly"] == 0 and section["gpuPools"]["hourlyAtMax"] == round(
        3 * 27.44705 * 0.5 + 3 * 21.957642 * 0.5 + 3 * 10.49264, 4)
    assert "was current until 2025-01-01" in section["stale"][0]
    lines = _cost_table(section)
    assert any(line.split()[:3] == ["train-h100", "capacity-block", "(upfront)"] and line.split()[-3:] == ["upfront"] * 3
               for line in lines)
    # the budget line counts the block at its hourly rate while it runs, as the budget check does
    assert f"  budget: $450.00/hour for GPU pools at maxNodes (now ${4 * 39.33 + 105.58:,.2f})" in lines
    assert f"  train-h100  p5.48xlarge    4          $39.33     {OFFLINE_BLOCK_START}  {OFFLINE_BLOCK_END}  336    " \
           "$52,859.52" in lines
    assert "  upfront total: $52,859.52" in lines


# ----------------------------------------------------------------------------- pods and addresses

# Per EFA layout, entry by entry: interfaces on card 0 left to the CNI, maxPods, subnet addresses per node.
POD_TABLE = [
    ("p5.48xlarge", True, 1, 51, 50), ("p5.48xlarge", False, 2, 100, 100),
    ("p5e.48xlarge", True, 1, 51, 50), ("p5en.48xlarge", True, 3, 110, 116),
    ("p6-b200.48xlarge", True, 3, 110, 116), ("p4d.24xlarge", True, 14, 110, 116),
    ("p4de.24xlarge", True, 14, 110, 116), ("g6e.48xlarge", True, 9, 110, 116),
    ("g5.48xlarge", True, 6, 110, 116), ("g6e.12xlarge", True, 9, 110, 117),
    ("g6.12xlarge", False, 8, 110, 117), ("g4dn.12xlarge", True, 7, 110, 117),
]


@pytest.mark.parametrize("itype,efa,interfaces,max_pods,addresses", POD_TABLE)
def test_pods_per_node_match_what_the_cni_can_address(itype, efa, interfaces, max_pods, addresses):
    t = load_catalog().instance_types[itype]
    assert pods.pod_interfaces(t, efa=efa) == interfaces
    assert pods.max_pods([t], efa=efa) == max_pods
    assert pods.pool_addresses_per_node([t], efa=efa) == addresses


def test_cni_formula_and_its_warm_addresses():
    assert pods.cni_max_pods(1, 50) == 51 and pods.cni_max_pods(2, 50) == 100     # nodeadm's p5 default: 100
    assert pods.addresses_per_node(1, 50, 51) == 50          # every address of the one interface
    assert pods.addresses_per_node(14, 50, 110) == 113 + 3   # 108 pods + 5 warm, on 3 interfaces
    assert pods.addresses_per_node(4, 15, 3) == 10 + 1       # the minimum of 10 on one interface
    assert pods.system_addresses_per_node() == 60


def test_a_pool_of_two_types_gets_the_tighter_limit():
    catalog = load_catalog().instance_types
    both = [catalog["p5en.48xlarge"], catalog["p5e.48xlarge"]]
    assert pods.max_pods(both, efa=False) == 100


def test_subnet_capacity_is_checked_with_headroom_at_the_boundary():
    # 10.0.0.0/20: private /23, 507 usable. Spot g6e.12xlarge: 117 addresses a node; system nodes 240.
    def spec_with(max_nodes):
        config = valid_config()
        config["network"] = {"cidr": "10.0.0.0/20", "zones": ["use1-az1", "use1-az2"]}
        config["nodePools"] = [config["nodePools"][1] | {"maxNodes": max_nodes}]
        config["inference"] = {}
        return load(config)

    mock = offline_account("us-east-1", {})
    from decisions.network.zones import AccountZones, resolve_layout
    zones = AccountZones(names_by_id=mock.zones, offerings=mock.offerings, reservations={})
    fits = spec_with(1)                          # (117 + 240) x 1.2 = 428.4 <= 507
    assert zone_demand(fits, {"infer": ("use1-az1",)})["use1-az1"] == {"infer": 117, "system nodes": 240}
    resolve_layout(fits, zones)
    from decisions.config.errors import ConfigError
    with pytest.raises(ConfigError) as raised:   # (234 + 240) x 1.2 = 568.8 > 507
        resolve_layout(spec_with(2), zones)
    (issue, *_) = [i for i in raised.value.issues if i.path == "gpu-cloud:network.cidr"]
    assert "use1-az1 (10.0.0.0/23, 507 usable addresses) cannot hold 474 addresses" in issue.message
    assert "(system nodes 240, infer 234)" in issue.message


# ----------------------------------------------------------------------------- versions and ranges

def test_the_default_kubernetes_version_is_pinned_everywhere_and_in_standard_support():
    default = Cluster.model_fields["kubernetes_version"].default
    assert default in supported_kubernetes_versions()
    assert standard_support_end()[default] > date(2026, 12, 2)
    # every other supported minor had left standard support by the day this default was chosen
    assert all(end <= date(2026, 12, 2) for minor, end in standard_support_end().items() if minor != default)


@pytest.mark.parametrize("version,today,warns", [("1.33", date(2026, 7, 28), False), ("1.33", date(2026, 7, 29), True),
                                                 ("1.35", date(2026, 12, 2), False)])
def test_extended_support_warns_from_its_first_day(version, today, warns):
    found = version_warnings(version, today)
    assert bool(found) is warns
    if warns:
        assert found[0].startswith("gpu-cloud:cluster.kubernetesVersion: 1.33 left EKS standard support on 2026-07-29")


def test_peer_vpcs_may_not_overlap():
    from decisions.config.errors import ConfigError
    config = valid_config()
    config["dr"] = {"role": "primary", "peerStack": "acme/gpu-cloud/peer", "domain": "a.example.com",
                    "hostedZoneId": "Z123"}
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(config, stack="test", region="us-east-1", peer_cidr="10.0.128.0/17")
    assert any(i.path == "gpu-cloud:network.cidr" and "overlaps the DR peer's VPC 10.0.128.0/17" in i.message
               for i in raised.value.issues)
    assert load_stack_spec(config, stack="test", region="us-east-1", peer_cidr="10.1.0.0/16")


def test_shipped_peers_read_each_others_stack_files():
    from plan.stackfile import peer_cidr, project_keys
    assert peer_cidr(project_keys(stack_config("prod-us-east-1"))) == "10.80.0.0/16"
    assert peer_cidr(project_keys(stack_config("prod-eu-west-1"))) == "10.64.0.0/16"
    assert peer_cidr(project_keys(stack_config("dev"))) is None


def test_a_range_over_dockers_bridge_warns():
    config = valid_config()
    config["network"]["cidr"] = "172.16.0.0/16"
    assert not [w for w in stack_warnings(load(config), date(2026, 12, 2)) if "172.17.0.0/16" in w]
    config["network"]["cidr"] = "172.17.0.0/16"
    (warning,) = [w for w in stack_warnings(load(config), date(2026, 12, 2)) if "172.17.0.0/16" in w]
    assert warning.startswith("gpu-cloud:network.cidr: 172.17.0.0/16 overlaps 172.17.0.0/16")


# --- Regions: zone IDs per region, against the source rows ---------------------------------------------------------
def test_each_gpu_region_records_the_zone_ids_its_gpu_types_are_offered_in():
    from decisions.catalog.catalog import load_catalog
    from decisions.network.zones import load_zone_facts
    from tests.test_catalog import REGIONS, snapshot_rows
    catalog, facts = load_catalog(), load_zone_facts().regions
    for region in REGIONS:
        seen = {row["AvailabilityZone"] for row in snapshot_rows()
                if row["Region"] == region and row["InstanceType"] in catalog.instance_types}
        assert set(facts[region].gpu_zone_ids) == seen, region
        assert all(z.startswith(facts[region].zone_id_prefix + "-") for z in seen), region
    assert facts["ap-northeast-1"].zone_id_prefix == "apne1" and facts["eu-central-1"].zone_id_prefix == "euc1"


def test_the_offline_account_offers_a_regions_recorded_zone_ids():
    from plan.engine import offline_account
    account = offline_account("ap-northeast-1", {})
    assert sorted(account.zones) == ["apne1-az1", "apne1-az2", "apne1-az4"]     # no apne1-az3 in the region's list


def test_refused_zone_ids_are_recorded_only_for_regions_a_stack_can_use():
    """A refused zone ID of a region the catalog does not sell GPUs in could only add a second message to a stack
    already refused for its region (aws:region): unverified entries there would be noise, so there are none."""
    from decisions.catalog.catalog import load_catalog
    from decisions.network.zones import load_zone_facts
    regions = set(load_catalog().regions)
    refusing = {region for region, facts in load_zone_facts().regions.items() if facts.eks_unsupported_zone_ids}
    assert refusing and refusing <= regions, refusing - regions


def test_the_config_patterns_and_namespace_are_defined_once():
    from decisions.config import model, preflight
    from decisions.network import zones
    from decisions.nodes import amis
    assert zones.ZONE_ID is model.ZONE_ID and zones.NAMESPACE is preflight.NAMESPACE is model.NAMESPACE
    assert amis.AMI_RELEASE is model.AMI_RELEASE and amis.DRIVER_VERSION is model.DRIVER_VERSION
    assert not hasattr(amis, "RELEASE")
