"""What AWS would refuse on a first up, named before anything is created (decisions/config/preflight.py): EC2 vCPU
quotas, interface endpoint zones, Auto Scaling tag counts, the IAM roles the stack names and the inference record's
hosted zone; and the reads behind them (components/account.py) against mocked account answers: enough, short,
missing, and for the roles and the zone, moto's IAM and Route 53 in server mode (tests/loopback.py)."""
from __future__ import annotations

import pulumi
import pytest

from components.network import INTERFACE_ENDPOINTS
from decisions.catalog.catalog import load_catalog
from decisions.config import preflight
from decisions.config.errors import ConfigError, key_path
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
    # prod-us-east-1: two p4 spot pools of 96 vCPUs, 0/3 nodes each; g6e.12xlarge (48 vCPUs) on-demand 2/3;
    # the reserved p5 pool draws on its reservation
    demand = preflight.quota_demand(spec_of("prod-us-east-1").pools)
    assert {code: (d.at_desired, d.at_max) for code, d in demand.items()} == {
        "L-7212CCBC": (0, 576), "L-DB2E81BA": (96, 144)}
    assert [name for _, name, _ in demand["L-7212CCBC"].pools] == ["finetune-a100-80gb-spot", "finetune-a100-40gb-spot"]


# ----------------------------------------------------------------------------- quota verdicts at their boundaries

@pytest.fixture(scope="module")
def us_east():
    return spec_of("prod-us-east-1")


@pytest.mark.parametrize("value,error,warning", [
    (95, True, False),     # one vCPU short of the 96 launched at desiredNodes: the first up's nodes would not launch
    (96, False, True),     # enough to launch, short of 144 at maxNodes
    (143, False, True),
    (144, False, False),   # exactly enough
])
def test_a_quota_is_an_error_below_desired_and_a_warning_below_max(us_east, value, error, warning):
    issues, warnings = preflight.quota_issues(us_east.pools, {"L-DB2E81BA": value, "L-7212CCBC": 576})
    assert bool(issues) == error and bool(warnings) == warning
    if error:
        (issue,) = issues
        assert issue.path == "gpu-cloud:nodePools[3].desiredNodes"
        assert "L-DB2E81BA (Running On-Demand G and VT instances) is 95" in issue.message and "at least 144" in issue.message
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
        expected = preflight.asg_tags(pool, spec.cluster_name, spec.resource_tags, spec.storage.nvme_scratch)
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
    # train-h100 carries 22 tags; 28 labels make 50
    spec = spec_of("prod-us-east-1", with_labels(28))
    assert len(preflight.asg_tags(spec.pools[0], spec.cluster_name, spec.resource_tags, spec.storage.nvme_scratch)) == 50


def test_a_pool_with_29_labels_is_refused_before_anything_is_created():
    with pytest.raises(ConfigError) as raised:
        spec_of("prod-us-east-1", with_labels(29))
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[0]"
    assert "51 tags, over the 50 AWS allows per group" in issue.message and "remove 1 of its labels" in issue.message
    with pytest.raises(pulumi.RunError) as refused:         # the program: the same refusal, nothing registered
        run_stack("prod-us-east-1", with_labels(29))
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
        ("L-417A185B", 0, 384, 0), ("L-DB2E81BA", 96, 192, 0), ("L-3819A6DF", 0, 384, 0)]
    assert section["autoScalingTags"] == [{"pool": "train-a100", "tags": 21}, {"pool": "infer-a10g", "tags": 20},
                                          {"pool": "infer-a10g-spot", "tags": 21}]
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


# ----------------------------------------------------------------------------- the roles the stack names

HOME, OTHER = "123456789012", "111122223333"
ADMIN = f"arn:aws:iam::{HOME}:role/ml-platform-admin"


def roles_of(cluster=(ADMIN,), training=(), publishers=()):
    from types import SimpleNamespace
    return preflight.named_roles(SimpleNamespace(
        cluster=SimpleNamespace(admin_role_arns=tuple(cluster)),
        tenancy=SimpleNamespace(teams=[("training", SimpleNamespace(role_arns=tuple(training))),
                                       ("inference", SimpleNamespace(role_arns=()))]),
        inference=SimpleNamespace(triton=SimpleNamespace(publisher_role_arns=tuple(publishers)))))


def found_as_named(roles):
    return {named.role.name: preflight.FoundRole(named.arn) for named in roles}


def test_a_role_arn_parts_name_and_path_apart():
    assert preflight.parse_role_arn(f"arn:aws:iam::{OTHER}:role/development/apps/my-role") == \
        preflight.RoleArn("aws", OTHER, "/development/apps/", "my-role")
    assert preflight.parse_role_arn(ADMIN) == preflight.RoleArn("aws", HOME, "/", "ml-platform-admin")


def test_every_named_role_has_its_key_path_and_use():
    roles = roles_of(cluster=(ADMIN, f"arn:aws:iam::{HOME}:role/b"), training=(f"arn:aws:iam::{HOME}:role/t",),
                     publishers=(f"arn:aws:iam::{OTHER}:role/ci",))
    assert [(key_path("gpu-cloud", r.parts), r.use) for r in roles] == [
        ("gpu-cloud:cluster.adminRoleArns[0]", preflight.ACCESS_ENTRY),
        ("gpu-cloud:cluster.adminRoleArns[1]", preflight.ACCESS_ENTRY),
        ("gpu-cloud:tenancy.teams.training.roleArns[0]", preflight.ACCESS_ENTRY),
        ("gpu-cloud:inference.triton.publisherRoleArns[0]", preflight.TRUSTED)]


def test_roles_of_this_account_are_read_once_and_no_other_accounts():
    roles = roles_of(cluster=(ADMIN,), training=(f"arn:aws:iam::{HOME}:role/team/ml-platform-admin",
                                                  f"arn:aws:iam::{OTHER}:role/t"),
                     publishers=(f"arn:aws:iam::{OTHER}:role/ci", f"arn:aws-cn:iam::{HOME}:role/cn"))
    assert preflight.roles_to_read(roles, HOME, "aws") == ["ml-platform-admin"]


def test_an_admin_role_of_another_account_is_refused_naming_both_accounts():
    roles = roles_of(cluster=(ADMIN, f"arn:aws:iam::{OTHER}:role/ml-platform-admin"))
    (issue,) = preflight.role_issues(roles, HOME, "aws", found_as_named(roles[:1]))
    assert issue.path == "gpu-cloud:cluster.adminRoleArns[1]"
    assert issue.message.startswith(f"arn:aws:iam::{OTHER}:role/ml-platform-admin is a role of account {OTHER}, and "
                                    f"this stack deploys to account {HOME}")
    assert f"name a role of account {HOME}" in issue.message


def test_a_role_of_another_partition_says_so():
    roles = roles_of(cluster=(f"arn:aws-us-gov:iam::{HOME}:role/admin",))
    (issue,) = preflight.role_issues(roles, HOME, "aws", {})
    assert f"is a role of account {HOME} of partition aws-us-gov" in issue.message


def test_a_team_role_iam_does_not_hold_is_refused_with_iams_answer():
    team = f"arn:aws:iam::{HOME}:role/trainers"
    roles = roles_of(training=(team,))
    found = {"ml-platform-admin": preflight.FoundRole(ADMIN),
             "trainers": "NoSuchEntity: The role with name trainers cannot be found."}
    (issue,) = preflight.role_issues(roles, HOME, "aws", found)
    assert issue.path == "gpu-cloud:tenancy.teams.training.roleArns[0]"
    assert issue.message == (f"{team} could not be read in account {HOME} (NoSuchEntity: The role with name trainers "
                             "cannot be found.); EKS refuses the access entry of a role that does not exist, after "
                             "the cluster is created: create the role first or correct its name, and allow this "
                             "identity iam:GetRole on it")


def test_a_role_named_without_its_path_is_refused_with_the_arn_iam_holds():
    sso = f"arn:aws:iam::{HOME}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_1f9f"
    roles = roles_of(cluster=(f"arn:aws:iam::{HOME}:role/AWSReservedSSO_Admin_1f9f",))
    (issue,) = preflight.role_issues(roles, HOME, "aws", {"AWSReservedSSO_Admin_1f9f": preflight.FoundRole(sso)})
    assert issue.path == "gpu-cloud:cluster.adminRoleArns[0]" and issue.message.endswith(f"; write {sso}")


def test_a_service_linked_role_gets_no_access_entry():
    roles = roles_of(cluster=(f"arn:aws:iam::{HOME}:role/aws-service-role/eks.amazonaws.com/AWSServiceRoleForAmazonEKS",))
    (issue,) = preflight.role_issues(roles, HOME, "aws", found_as_named(roles))
    assert "is a service-linked role, which EKS gives no access entry" in issue.message


def test_a_publisher_may_be_another_accounts_but_not_another_partitions_and_must_exist_here():
    ci, cn, gone = (f"arn:aws:iam::{OTHER}:role/ci", f"arn:aws-cn:iam::{OTHER}:role/ci",
                    f"arn:aws:iam::{HOME}:role/release")
    roles = roles_of(publishers=(ci, cn, gone))
    found = {"ml-platform-admin": preflight.FoundRole(ADMIN), "release": "NoSuchEntity: Role release not found"}
    cross_partition, missing = preflight.role_issues(roles, HOME, "aws", found)     # the other account's: allowed
    assert cross_partition.path == "gpu-cloud:inference.triton.publisherRoleArns[1]"
    assert cross_partition.message.startswith(f"{cn} is a role of partition aws-cn, and this account is in aws")
    assert missing.path == "gpu-cloud:inference.triton.publisherRoleArns[2]"
    assert missing.message.startswith(f"{gone} could not be read in account {HOME} (NoSuchEntity: Role release not")
    assert "IAM refuses the model publisher role's trust policy if it names a role that does not exist" in \
        missing.message


def test_roles_that_exist_as_named_pass():
    roles = roles_of(cluster=(ADMIN,), training=(f"arn:aws:iam::{HOME}:role/ci/trainers",),
                     publishers=(f"arn:aws:iam::{OTHER}:role/ci",))
    assert preflight.role_issues(roles, HOME, "aws", found_as_named(roles[:2])) == []


# ----------------------------------------------------------------------------- the hosted zone

def dr(domain="infer.ml.example.com", zone="Z0123456789ABCDEFGHIJ"):
    from types import SimpleNamespace
    return SimpleNamespace(domain=domain, hosted_zone_id=zone)


@pytest.mark.parametrize("domain,zone,path,words", [
    ("infer.ml.example.com", "ml.example.com", None, None),
    ("a.b.ml.example.com", "ML.example.com", None, None),
    ("ml.example.com", "ml.example.com", "gpu-cloud:dr.domain", "is the apex of hosted zone Z0123456789ABCDEFGHIJ"),
    ("infer.ml.example.org", "ml.example.com", "gpu-cloud:dr.domain",
     "is not in hosted zone Z0123456789ABCDEFGHIJ (ml.example.com)"),
    ("infer.xml.example.com", "ml.example.com", "gpu-cloud:dr.domain", "is not in hosted zone"),   # a label, not text
])
def test_the_domain_must_be_a_name_below_the_zone(domain, zone, path, words):
    issues, warnings = preflight.hosted_zone_issues(dr(domain), "internal", preflight.FoundZone(zone, False))
    assert warnings == [] and [i.path for i in issues] == ([path] if path else [])
    if words:
        assert words in issues[0].message


def test_a_zone_that_cannot_be_read_is_an_error_on_its_id():
    (issue,), _ = preflight.hosted_zone_issues(dr(), "internal", "NoSuchHostedZone: No hosted zone found with ID: Z1")
    assert issue.path == "gpu-cloud:dr.hostedZoneId"
    assert issue.message.startswith("Z0123456789ABCDEFGHIJ could not be read (NoSuchHostedZone: No hosted zone found")


@pytest.mark.parametrize("scheme,words", [
    ("internal", "resolves only in the VPCs associated with it"),
    ("internet-facing", "is private, and Triton's load balancer is internet-facing"),
])
def test_a_private_zone_is_a_warning_saying_who_resolves_the_name(scheme, words):
    issues, (warning,) = preflight.hosted_zone_issues(dr(), scheme, preflight.FoundZone("ml.example.com", True))
    assert issues == [] and warning.startswith("gpu-cloud:dr.hostedZoneId: hosted zone Z0123456789ABCDEFGHIJ") \
        and words in warning


def test_only_a_stack_that_writes_the_record_reads_its_zone():
    assert preflight.record_zone(spec_of("prod-us-east-1")) == "Z0123456789ABCDEFGHIJ"
    assert preflight.record_zone(spec_of("dev")) is None
    no_triton = spec_of("prod-eu-west-1", {"gpu-cloud:inference": {"triton": {"enabled": False}}})
    assert preflight.record_zone(no_triton) is None


# ----------------------------------------------------------------------------- through the program, offline account

ROLE_INVOKE, ZONE_INVOKE = "aws:iam/getRole:getRole", "aws:route53/getZone:getZone"


@pytest.mark.parametrize("stack", STACKS)
def test_the_offline_account_holds_what_each_shipped_stack_names(stack_runs, stack):
    run = stack_runs[stack]
    spec = spec_of(stack)
    assert [a["name"] for t, a in run.invokes if t == ROLE_INVOKE] == \
        [preflight.parse_role_arn(arn).name for arn in spec.cluster.admin_role_arns]
    zones = [a["zoneId"] for t, a in run.invokes if t == ZONE_INVOKE]
    assert zones == ([spec.dr.hosted_zone_id] if stack != "dev" else [])
    providers = {p for t, p in run.invoke_providers if t in (ROLE_INVOKE, ZONE_INVOKE)}
    assert all("pulumi:providers:aws::aws::" in p for p in providers)


def test_roles_and_a_zone_the_account_lacks_are_one_error_with_the_other_account_problems():
    mock = account("prod-us-east-1")
    team = f"arn:aws:iam::{HOME}:role/trainers"
    mock.hosted_zones.clear()
    mock.transit_gateways = ()
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("prod-us-east-1", {"gpu-cloud:tenancy": {"teams": {"training": {"roleArns": [team]}}}}, account=mock)
    message = str(raised.value)
    assert "(3 mistakes)" in message
    assert "gpu-cloud:network.transitGateway.id: tgw-" in message
    assert f"gpu-cloud:tenancy.teams.training.roleArns[0]: {team} could not be read in account {HOME} (" in message
    assert "NoSuchEntity: The role with name trainers cannot be found." in message
    assert "gpu-cloud:dr.hostedZoneId: Z0123456789ABCDEFGHIJ could not be read (" in message
    assert "NoSuchHostedZone: No hosted zone found with ID: Z0123456789ABCDEFGHIJ" in message


def test_the_offline_account_is_the_first_admin_roles():
    config = stack_config("dev", {"gpu-cloud:cluster": {**stack_config("dev")["gpu-cloud:cluster"], "adminRoleArns": [
        f"arn:aws:iam::{OTHER}:role/platform/admin", f"arn:aws:iam::{HOME}:role/elsewhere"]}})
    mock = offline_account("us-east-1", config)
    assert mock.account_id == OTHER and mock.roles == {"admin": "/platform/"}
    assert mock.get_role("admin")["Arn"] == f"arn:aws:iam::{OTHER}:role/platform/admin"


# ----------------------------------------------------------------------------- against moto's IAM and Route 53

def moto_account(url, stack, zone_ids):
    """The offline account of `stack`, whose roles and hosted zones are moto's: get_role and get_hosted_zone ask moto
    through boto3, so what exists and what a missing one answers are moto's model of IAM and Route 53. moto's zone
    IDs do not start with Z as Route 53's do (and gpu-cloud:dr.hostedZoneId requires), so `zone_ids` maps the stack's
    ID to the zone the test created."""
    import boto3
    from botocore.exceptions import ClientError
    from plan.engine import AccountReadError, MockAccount

    clients = {name: boto3.client(name, endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                                  aws_secret_access_key="testing") for name in ("iam", "route53")}

    def refused(error):
        return AccountReadError(f"{error.response['Error']['Code']}: {error.response['Error']['Message']}")

    class MotoAccount(MockAccount):
        def get_role(self, name):
            try:
                return clients["iam"].get_role(RoleName=name)["Role"]
            except ClientError as error:
                raise refused(error) from None

        def get_hosted_zone(self, zone_id):
            try:
                return clients["route53"].get_hosted_zone(Id=zone_ids.get(zone_id, zone_id))["HostedZone"]
            except ClientError as error:
                raise refused(error) from None

    config = stack_config(stack)
    return MotoAccount(**vars(offline_account(config["aws:region"], config))), clients


def refused_before_anything(stack, overrides, mock):
    """The program's refusal, and what it had registered by then."""
    from plan.engine import RecordingMonitor, run_program
    monitors = []

    def recording(mocks):
        monitors.append(RecordingMonitor(mocks))
        return monitors[-1]

    with pytest.raises(pulumi.RunError) as raised:
        run_program(stack_config(stack, overrides), stack=stack, account=mock, monitor=recording)
    return str(raised.value), [r.type for r in monitors[0].registrations]


@pytest.fixture(scope="module")
def moto():
    """moto with this account's admin role, its training team's role (under a path) and a public zone for
    infer.ml.example.com."""
    import json
    from tests.loopback import moto_server

    with moto_server() as url:
        mock, clients = moto_account(url, "prod-us-east-1", {})
        trust = json.dumps({"Version": "2012-10-17", "Statement": []})
        clients["iam"].create_role(RoleName="ml-platform-admin", AssumeRolePolicyDocument=trust)
        clients["iam"].create_role(RoleName="trainers", Path="/teams/", AssumeRolePolicyDocument=trust)
        zone = clients["route53"].create_hosted_zone(Name="ml.example.com", CallerReference="gpu-cloud-test")
        yield url, zone["HostedZone"]["Id"].rsplit("/", 1)[-1], clients


TEAM = {"gpu-cloud:tenancy": {"teams": {"training": {"roleArns": [f"arn:aws:iam::{HOME}:role/teams/trainers"]}}}}


def with_admins(*arns):
    return {"gpu-cloud:cluster": {**stack_config("prod-us-east-1")["gpu-cloud:cluster"], "adminRoleArns": list(arns)}}


def test_moto_a_role_of_another_account_is_named_before_anything_but_the_provider(moto):
    url, zone, _ = moto
    mock, _ = moto_account(url, "prod-us-east-1", {"Z0123456789ABCDEFGHIJ": zone})
    message, registered = refused_before_anything(
        "prod-us-east-1", with_admins(ADMIN, f"arn:aws:iam::{OTHER}:role/ml-platform-admin"), mock)
    assert registered == ["pulumi:providers:aws"]
    assert "(1 mistake)" in message
    assert (f"gpu-cloud:cluster.adminRoleArns[1]: arn:aws:iam::{OTHER}:role/ml-platform-admin is a role of account "
            f"{OTHER}, and this stack deploys to account {HOME}") in message


def test_moto_a_missing_role_is_named_with_iams_answer(moto):
    url, zone, _ = moto
    mock, _ = moto_account(url, "prod-us-east-1", {"Z0123456789ABCDEFGHIJ": zone})
    team = {"gpu-cloud:tenancy": {"teams": {"inference": {"roleArns": [f"arn:aws:iam::{HOME}:role/servers"]}}}}
    message, registered = refused_before_anything("prod-us-east-1", team, mock)
    assert registered == ["pulumi:providers:aws"]
    assert (f"gpu-cloud:tenancy.teams.inference.roleArns[0]: arn:aws:iam::{HOME}:role/servers could not be read in "
            f"account {HOME} (") in message
    assert "NoSuchEntity: Role servers not found" in message        # moto's words (IAM's: "The role with name ...")


def test_moto_a_missing_hosted_zone_is_named_with_route53s_answer(moto):
    url, _, _ = moto
    mock, _ = moto_account(url, "prod-us-east-1", {})
    message, registered = refused_before_anything("prod-us-east-1", {}, mock)
    assert registered == ["pulumi:providers:aws"]
    assert "gpu-cloud:dr.hostedZoneId: Z0123456789ABCDEFGHIJ could not be read (" in message
    assert "NoSuchHostedZone: No hosted zone found with ID: Z0123456789ABCDEFGHIJ" in message


def test_moto_every_problem_is_in_the_one_error(moto):
    url, _, _ = moto
    mock, _ = moto_account(url, "prod-us-east-1", {})
    overrides = {**with_admins(ADMIN, f"arn:aws:iam::{OTHER}:role/ml-platform-admin"),
                 "gpu-cloud:tenancy": {"teams": {"training": {"roleArns": [f"arn:aws:iam::{HOME}:role/trainers"]}}}}
    message, registered = refused_before_anything("prod-us-east-1", overrides, mock)
    assert registered == ["pulumi:providers:aws"]
    assert "(3 mistakes)" in message
    assert [line.split(":")[1].split(" ")[0] for line in message.splitlines()[1:]] == [
        "cluster.adminRoleArns[1]", "tenancy.teams.training.roleArns[0]", "dr.hostedZoneId"]
    # trainers exists, under /teams/: the ARN without its path names no role
    assert f"IAM holds the role trainers as arn:aws:iam::{HOME}:role/teams/trainers" in message


def test_moto_roles_and_a_zone_that_exist_as_named_let_the_stack_through(moto):
    url, zone, clients = moto
    private = clients["route53"].create_hosted_zone(
        Name="ml.example.com", CallerReference="gpu-cloud-test-private", HostedZoneConfig={"PrivateZone": True},
        VPC={"VPCRegion": "us-east-1", "VPCId": "vpc-0123456789abcdef0"})["HostedZone"]["Id"].rsplit("/", 1)[-1]
    mock, _ = moto_account(url, "prod-us-east-1", {"Z0123456789ABCDEFGHIJ": private})
    run = run_stack("prod-us-east-1", TEAM, account=mock)
    entries = {e.inputs["principalArn"] for e in run.of_type("aws:eks/accessEntry:AccessEntry")}
    assert {ADMIN, f"arn:aws:iam::{HOME}:role/teams/trainers"} <= entries
    (warning,) = [w for w in run.warnings if w.startswith("gpu-cloud:dr.hostedZoneId")]
    assert "is private: infer.ml.example.com resolves only in the VPCs associated with it" in warning


def test_a_private_zone_warning_says_peering_does_not_carry_it_and_a_public_zone_is_expected():
    _, (warning,) = preflight.hosted_zone_issues(dr(), "internal", preflight.FoundZone("ml.example.com", True))
    assert "in both regions: transit gateway peering does not carry a private zone" in warning
    assert 'gpu-cloud expects a public zone (docs/network.md, "The hosted zone is public")' in warning
    assert preflight.hosted_zone_issues(dr(), "internal", preflight.FoundZone("ml.example.com", False)) == ([], [])
