"""What AWS would refuse on a first up, named before anything is created (decisions/config/preflight.py): EC2 vCPU
quotas, interface endpoint zones, Auto Scaling tag counts; and the reads behind them (components/account.py) against
mocked account answers: enough, short, missing."""
from __future__ import annotations

import pulumi
import pytest

from components.network import INTERFACE_ENDPOINTS
from decisions.catalog.catalog import load_catalog
from decisions.config import preflight
from decisions.config.errors import ConfigError
from decisions.config.validate import load_stack_spec
from plan.document import _preflight_lines, preflight_section
from plan.engine import offline_account
from tests.conftest import STACKS, run_stack, stack_config

ASG = "aws:autoscaling/group:Group"
QUOTA_INVOKE = "aws:servicequotas/getServiceQuota:getServiceQuota"
ENDPOINT_INVOKE = "aws:ec2/getVpcEndpointService:getVpcEndpointService"


def spec_of(stack, overrides=None):
    config = stack_config(stack, overrides)
    keys = {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("gpu-cloud:")}
    return load_stack_spec(keys, stack=stack, region=config["aws:region"])


# ----------------------------------------------------------------------------- the quota table

@pytest.mark.parametrize("group,capacity,code,name,default", [
    ("p", "on-demand", "L-417A185B", "Running On-Demand P instances", 0),
    ("g", "on-demand", "L-DB2E81BA", "Running On-Demand G and VT instances", 0),
    ("p4", "spot", "L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests", 0),
    ("p5", "spot", "L-C4BD4855", "All P5 Spot Instance Requests", 192),
    ("g", "spot", "L-3819A6DF", "All G and VT Spot Instance Requests", 0),
])
def test_each_quota_bucket_has_its_service_quotas_code(group, capacity, code, name, default):
    assert preflight.QUOTAS[(group, capacity)] == preflight.Quota(code, name, default)


def test_the_table_holds_exactly_the_five_gpu_buckets():
    assert len(preflight.QUOTAS) == 5


# Which quota each catalog type draws on, type by type (the quota names say which families each covers).
SPOT_QUOTA = {"g4dn": "L-3819A6DF", "g5": "L-3819A6DF", "g6": "L-3819A6DF", "g6e": "L-3819A6DF",
              "p4d": "L-7212CCBC", "p4de": "L-7212CCBC", "p5": "L-C4BD4855", "p5e": "L-C4BD4855",
              "p5en": "L-C4BD4855", "p6-b200": None}


@pytest.mark.parametrize("name", sorted(load_catalog().instance_types))
def test_every_catalog_type_falls_in_its_familys_bucket_and_reservations_in_none(name):
    family = name.split(".")[0]
    assert preflight.quota_for(name, "on-demand").code == ("L-417A185B" if name.startswith("p") else "L-DB2E81BA")
    spot = preflight.quota_for(name, "spot")
    assert (spot.code if spot else None) == SPOT_QUOTA[family]
    assert preflight.quota_for(name, "reserved") is None and preflight.quota_for(name, "capacity-block") is None


def test_demand_sums_each_buckets_pools_at_desired_and_max():
    # prod-us-east-1: two p4 spot pools of 96 vCPUs, 0/3 nodes each; g6e.12xlarge (48 vCPUs) on-demand 2/8;
    # the reserved p5 pool draws on its reservation
    demand = preflight.quota_demand(spec_of("prod-us-east-1").pools)
    assert {code: (d.at_desired, d.at_max) for code, d in demand.items()} == {
        "L-7212CCBC": (0, 576), "L-DB2E81BA": (96, 384)}
    assert [name for _, name, _ in demand["L-7212CCBC"].pools] == ["finetune-a100-80gb-spot", "finetune-a100-40gb-spot"]


# ----------------------------------------------------------------------------- quota verdicts at their boundaries

@pytest.fixture(scope="module")
def us_east():
    return spec_of("prod-us-east-1")


@pytest.mark.parametrize("value,error,warning", [
    (95, True, False),     # one vCPU short of the 96 launched at desiredNodes: the first up's nodes would not launch
    (96, False, True),     # enough to launch, short of 384 at maxNodes
    (383, False, True),
    (384, False, False),   # exactly enough
])
def test_a_quota_is_an_error_below_desired_and_a_warning_below_max(us_east, value, error, warning):
    issues, warnings = preflight.quota_issues(us_east.pools, {"L-DB2E81BA": value, "L-7212CCBC": 576})
    assert bool(issues) == error and bool(warnings) == warning
    if error:
        (issue,) = issues
        assert issue.path == "gpu-cloud:nodePools[3].desiredNodes"
        assert "L-DB2E81BA (Running On-Demand G and VT instances) is 95" in issue.message and "at least 384" in issue.message
    if warning:
        (text,) = warnings
        assert text.startswith("gpu-cloud:nodePools[3].maxNodes: the vCPU quota L-DB2E81BA")


def test_a_quota_that_cannot_be_read_is_a_warning_naming_it(us_east):
    issues, warnings = preflight.quota_issues(us_east.pools, {"L-DB2E81BA": 384, "L-7212CCBC": "AccessDenied"})
    assert issues == []
    (text,) = warnings
    assert text.startswith("gpu-cloud:nodePools[1]: the vCPU quota L-7212CCBC") and "AccessDenied" in text
    assert "576 vCPUs" in text


# ----------------------------------------------------------------------------- endpoint zones

ZONES = ("use1-az1", "use1-az2", "use1-az4")
NAMES = {"use1-az1": "us-east-1a", "use1-az2": "us-east-1b", "use1-az4": "us-east-1d"}


def test_an_endpoint_service_missing_from_one_zone_names_that_zone():
    offered = {"ecr.api": frozenset(NAMES.values()), "eks-auth": frozenset({"us-east-1a", "us-east-1b"})}
    issues, warnings = preflight.endpoint_issues(ZONES, NAMES, "us-east-1", offered)
    assert warnings == []
    (issue,) = issues
    assert issue.path == "gpu-cloud:network.zones[2]"
    assert issue.message.startswith("use1-az4 (us-east-1d): the interface endpoint service eks-auth is not offered")


def test_endpoint_services_offered_everywhere_pass_and_unreadable_ones_warn():
    offered = {"ecr.api": frozenset(NAMES.values()), "sqs": "InvalidServiceName: no such service"}
    issues, warnings = preflight.endpoint_issues(ZONES, NAMES, "us-east-1", offered)
    assert issues == [] and len(warnings) == 1 and "sqs could not be read" in warnings[0]


# ----------------------------------------------------------------------------- Auto Scaling tags

@pytest.mark.parametrize("stack", STACKS)
def test_the_counted_tags_are_the_tags_each_rendered_group_carries(stack_runs, stack):
    run, spec = stack_runs[stack], spec_of(stack)
    groups = {g.inputs["name"]: {t["key"]: t["value"] for t in g.inputs["tags"]} for g in run.of_type(ASG)}
    for pool in spec.pools:
        expected = preflight.asg_tags(pool, spec.cluster_name, spec.resource_tags)
        assert groups[f"{spec.cluster_name}-{pool.name}"] == expected
        assert len(expected) <= preflight.ASG_TAGS_MAX


def labels(count):
    return {f"example.com/label-{i}": "x" for i in range(count)}


def with_labels(count):
    config = stack_config("prod-us-east-1")
    pools = [dict(p) for p in config["gpu-cloud:nodePools"]]
    pools[0]["labels"] = {**pools[0].get("labels", {}), **labels(count)}
    return {"gpu-cloud:nodePools": pools}


def test_a_pool_at_fifty_tags_is_accepted():
    # train-h100 carries 21 tags; 29 labels make 50
    spec = spec_of("prod-us-east-1", with_labels(29))
    assert len(preflight.asg_tags(spec.pools[0], spec.cluster_name, spec.resource_tags)) == 50


def test_a_pool_with_30_labels_is_refused_before_anything_is_created():
    with pytest.raises(ConfigError) as raised:
        spec_of("prod-us-east-1", with_labels(30))
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[0]"
    assert "51 tags, over the 50 AWS allows per group" in issue.message and "remove 1 of its labels" in issue.message
    with pytest.raises(pulumi.RunError) as refused:         # the program: the same refusal, nothing registered
        run_stack("prod-us-east-1", with_labels(30))
    assert "gpu-cloud:nodePools[0]" in str(refused.value) and "would carry 51 tags" in str(refused.value)


# ----------------------------------------------------------------------------- through the program and its mocks

def account(stack="dev"):
    config = stack_config(stack)
    return offline_account(config["aws:region"], config)


def test_enough_the_offline_account_reads_each_quota_and_endpoint_through_the_stacks_provider():
    run = run_stack("dev")
    quotas = [args for token, args in run.invokes if token == QUOTA_INVOKE]
    assert quotas == [{"quotaCode": "L-3819A6DF", "serviceCode": "ec2"}]    # dev: one g6 spot pool
    endpoints = sorted(args["serviceName"] for token, args in run.invokes if token == ENDPOINT_INVOKE)
    assert endpoints == sorted(f"com.amazonaws.us-east-1.{s}" for s in INTERFACE_ENDPOINTS.values())
    providers = {provider for token, provider in run.invoke_providers if token in (QUOTA_INVOKE, ENDPOINT_INVOKE)}
    assert len(providers) == 1 and "pulumi:providers:aws::aws::" in providers.pop()
    assert not [w for w in run.warnings if "quota" in w or "endpoint" in w]


def test_short_a_quota_below_desired_stops_the_up_naming_key_and_code():
    mock = account()
    mock.quotas["L-3819A6DF"] = 47.0            # dev launches one g6.12xlarge (48 vCPUs)
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", account=mock)
    assert "gpu-cloud:nodePools[0].desiredNodes (pool dev-gpu-spot): the vCPU quota L-3819A6DF" in str(raised.value)


def test_short_below_max_plans_with_a_warning():
    mock = account()
    mock.quotas["L-3819A6DF"] = 143.0           # 3 nodes at max need 144
    run = run_stack("dev", account=mock)
    (warning,) = [w for w in run.warnings if "L-3819A6DF" in w]
    assert warning.startswith("gpu-cloud:nodePools[0].maxNodes: the vCPU quota L-3819A6DF (All G and VT Spot "
                              "Instance Requests) is 143, below the 144 vCPUs")


def test_missing_a_quota_that_cannot_be_read_plans_with_a_warning():
    mock = account()
    del mock.quotas["L-3819A6DF"]
    run = run_stack("dev", account=mock)
    (warning,) = [w for w in run.warnings if "L-3819A6DF" in w]
    assert "could not be read (" in warning and "AccessDeniedException" in warning


def test_an_endpoint_service_not_offered_in_a_used_zone_stops_the_up():
    mock = account()
    mock.endpoint_zones = {service: frozenset(mock.zones) for service in INTERFACE_ENDPOINTS.values()}
    mock.endpoint_zones["eks-auth"] = frozenset(mock.zones) - {"use1-az2"}
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", account=mock)
    assert "gpu-cloud:network.zones[1]: use1-az2 (us-east-1b): the interface endpoint service eks-auth" in str(raised.value)


def test_an_endpoint_service_that_cannot_be_read_plans_with_a_warning():
    mock = account()
    mock.endpoint_zones = {service: frozenset(mock.zones) for service in INTERFACE_ENDPOINTS.values() if service != "sqs"}
    run = run_stack("dev", account=mock)
    assert any("interface endpoint service sqs could not be read" in w for w in run.warnings)


# ----------------------------------------------------------------------------- the plan's preflight section

def test_the_plan_lists_what_to_request_against_awss_default():
    section = preflight_section(spec_of("prod-eu-west-1"))
    assert [(q["quotaCode"], q["vcpusAtDesired"], q["vcpusAtMax"], q["awsDefaultVcpus"]) for q in section["quotas"]] == [
        ("L-417A185B", 0, 384, 0), ("L-DB2E81BA", 96, 384, 0), ("L-3819A6DF", 0, 384, 0)]
    assert section["autoScalingTags"] == [{"pool": "train-a100", "tags": 20}, {"pool": "infer-a10g", "tags": 19},
                                          {"pool": "infer-a10g-spot", "tags": 20}]
    text = "\n".join(_preflight_lines(section))
    assert "L-417A185B  Running On-Demand P instances         0              384        0: request 384" in text
    assert "interface endpoints: 9 services, each must be offered in euw1-az1, euw1-az2, euw1-az3" in text


def test_a_quota_short_at_desired_names_a_pool_that_launches_at_desired(us_east):
    # the P spot bucket: both pools start at 0 nodes; make the second one launch two (192 vCPUs)
    pools = list(us_east.pools)
    pools[2] = type(pools[2])(spec=pools[2].spec.model_copy(update={"desired_nodes": 2}), types=pools[2].types,
                              efa=pools[2].efa)
    issues, _ = preflight.quota_issues(pools, {"L-7212CCBC": 191, "L-DB2E81BA": 384})
    assert [issue.path for issue in issues] == ["gpu-cloud:nodePools[2].desiredNodes"]


def test_a_spot_pool_of_a_type_without_a_recorded_quota_is_a_warning_not_silence():
    from types import SimpleNamespace
    itype = load_catalog().instance_types["p6-b200.48xlarge"]
    pool = SimpleNamespace(name="b200-spot", primary_type=itype,
                           spec=SimpleNamespace(capacity="spot", desired_nodes=0, max_nodes=2))
    issues, warnings = preflight.quota_issues([pool], {})
    assert issues == []
    assert warnings == ["gpu-cloud:nodePools[0]: no vCPU quota is recorded for p6-b200.48xlarge spot instances "
                        "(pool b200-spot); check its quota in Service Quotas before the first up"]
    on_demand = SimpleNamespace(**{**vars(pool), "spec": SimpleNamespace(capacity="on-demand", desired_nodes=0,
                                                                          max_nodes=2)})
    assert preflight.unchecked_pools([on_demand]) == []
