"""Subnet layout (pure), and the Network component under the shared mocks."""
from __future__ import annotations

import ipaddress
import itertools
import json
from typing import Dict

import pulumi
import pulumi_aws as aws
import pytest
from pulumi.runtime.sync_await import _sync_await

from components.network import INTERFACE_ENDPOINTS, Network, NetworkArgs
from decisions.network.network_plan import plan_subnets
from tests.conftest import run_component

# ----------------------------------------------------------------------------- plan_subnets

LETTERS = "abcdef"


@pytest.mark.parametrize("prefix", range(16, 21))
@pytest.mark.parametrize("n_zones", range(2, 7))
def test_plan_subnets_fits_and_never_overlaps(prefix, n_zones):
    vpc = ipaddress.IPv4Network(f"10.64.0.0/{prefix}")
    zones = [f"use1-az{i + 1}" for i in range(n_zones)]
    plan = plan_subnets(str(vpc), zones)

    assert list(plan.private) == zones and list(plan.public) == zones
    private = [ipaddress.IPv4Network(c) for c in plan.private.values()]
    public = [ipaddress.IPv4Network(c) for c in plan.public.values()]
    subnets = private + public
    assert all(s.subnet_of(vpc) for s in subnets), plan
    for a, b in itertools.combinations(subnets, 2):
        assert not a.overlaps(b), f"{a} overlaps {b}"
    # Each private subnet is an eighth of the VPC whatever the zone count: 512 addresses even in a /20.
    for s in private:
        assert s.num_addresses * 8 == vpc.num_addresses and s.num_addresses >= 512
    # Public subnets stay small but big enough for a load balancer (/27 minimum) and never beat private ones.
    for s in public:
        assert 24 <= s.prefixlen <= 27
        assert min(p.num_addresses for p in private) >= 4 * s.num_addresses


@pytest.mark.parametrize("prefix", range(16, 21))
def test_adding_a_zone_never_moves_a_subnet(prefix):
    """The layout the first `pulumi up` created stays: zone i keeps block i however many zones follow."""
    zones = [f"use1-az{i + 1}" for i in range(6)]
    first = plan_subnets(f"10.64.0.0/{prefix}", zones[:2])
    for n in range(3, 7):
        grown = plan_subnets(f"10.64.0.0/{prefix}", zones[:n])
        assert {z: grown.private[z] for z in first.private} == first.private
        assert {z: grown.public[z] for z in first.public} == first.public


def test_plan_subnets_documented_examples():
    """The layouts the docstring promises; changing them would replace every subnet of a live stack."""
    plan = plan_subnets("10.0.0.0/16", ["use1-az1", "use1-az2", "use1-az4"])
    assert plan.private == {"use1-az1": "10.0.0.0/19", "use1-az2": "10.0.32.0/19", "use1-az4": "10.0.64.0/19"}
    assert plan.public == {"use1-az1": "10.0.224.0/24", "use1-az2": "10.0.225.0/24", "use1-az4": "10.0.226.0/24"}
    assert plan.usable_private("use1-az1") == 8192 - 5

    plan = plan_subnets("10.0.0.0/20", list("abcdef"))
    assert list(plan.private.values()) == [f"10.0.{2 * i}.0/23" for i in range(6)]
    assert plan.public["a"] == "10.0.14.0/26" and plan.public["f"] == "10.0.15.64/26"


@pytest.mark.parametrize("cidr, zones, message", [
    ("10.0.0.0/24", list("ab"), "too small"),
    ("10.0.0.0/16", ["a", "a"], "repeat"),
    ("10.0.0.0/16", [], "1 to 6 zones"),
    ("10.0.0.0/16", list("abcdefg"), "1 to 6 zones"),
    ("10.0.0.1/16", ["a", "b"], "not an IPv4 network"),
])
def test_plan_subnets_rejects(cidr, zones, message):
    with pytest.raises(ValueError, match=message):
        plan_subnets(cidr, zones)


# ----------------------------------------------------------------------------- the component

NAME = "net"
CLUSTER = "gpu-prod"
CIDR = "10.80.0.0/16"
RETENTION = 90
COMPONENT = "gpu-cloud:network:Network"
SUBNET = "aws:ec2/subnet:Subnet"
NAT = "aws:ec2/natGateway:NatGateway"
ROUTE = "aws:ec2/route:Route"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
RTA = "aws:ec2/routeTableAssociation:RouteTableAssociation"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


ACCOUNT = "123456789012"
AWS_PARTITION = dict(partition="aws", dns_suffix="amazonaws.com", reverse_dns_prefix="com.amazonaws")


def _build(region: str, zones, nat_gateways: str, built: dict, partition=None):
    def build():
        provider = aws.Provider("aws", region=region,
                                default_tags=aws.ProviderDefaultTagsArgs(tags={"team": "ml-platform"}))
        built["network"] = Network(NAME, NetworkArgs(cidr=CIDR, zones=tuple(zones), nat_gateways=nat_gateways,
                                                     cluster_name=CLUSTER, flow_log_retention_days=RETENTION,
                                                     region=region, account_id=ACCOUNT,
                                                     **(partition or AWS_PARTITION)),
                                   opts=pulumi.ResourceOptions(provider=provider))
    return build


US_ZONES = ("use1-az1", "use1-az2", "use1-az4")
EU_ZONES = ("euw1-az1", "euw1-az2", "euw1-az3")


@pytest.fixture(scope="module", params=["one-per-az", "single"])
def net(request):
    built: dict = {}
    run = run_component(_build("us-east-1", US_ZONES, request.param, built), region="us-east-1")
    return request.param, run, built["network"]


@pytest.fixture(scope="module")
def per_az():
    built: dict = {}
    return run_component(_build("us-east-1", US_ZONES, "one-per-az", built), region="us-east-1"), built["network"]


def _by_id(run, token) -> Dict[str, object]:
    return {r.state["id"]: r for r in run.of_type(token)}


def _subnets(run, role: str) -> Dict[str, object]:
    """zone -> subnet resource, for "private" or "public" subnets (told apart by their role tag)."""
    tag = {"private": "kubernetes.io/role/internal-elb", "public": "kubernetes.io/role/elb"}[role]
    found = [s for s in run.of_type(SUBNET) if s.inputs.get("tags", {}).get(tag) == "1"]
    by_zone = {s.inputs["availabilityZoneId"]: s for s in found}
    assert len(by_zone) == len(found), "two subnets of one role in a zone"
    return by_zone


def _route_table_of(run, subnet) -> object:
    tables = _by_id(run, ROUTE_TABLE)
    assocs = [a for a in run.of_type(RTA) if a.inputs["subnetId"] == subnet.state["id"]]
    assert len(assocs) == 1, f"{subnet.name} has {len(assocs)} route table associations"
    return tables[assocs[0].inputs["routeTableId"]]


def _default_route(run, table) -> object:
    routes = [r for r in run.of_type(ROUTE)
              if r.inputs["routeTableId"] == table.state["id"] and r.inputs.get("destinationCidrBlock") == "0.0.0.0/0"]
    assert len(routes) == 1, f"{table.name} has {len(routes)} default routes"
    return routes[0]


def _resolved(output):
    """The value of a component attribute after the run (the mocks resolved it)."""
    return _sync_await(output.future())


def test_one_private_and_one_public_subnet_per_zone(net):
    _, run, network = net
    plan = plan_subnets(CIDR, US_ZONES)
    private, public = _subnets(run, "private"), _subnets(run, "public")
    assert set(private) == set(public) == set(US_ZONES)
    assert len(run.of_type(SUBNET)) == 2 * len(US_ZONES)
    vpc = run.one("aws:ec2/vpc:Vpc")
    assert vpc.inputs["cidrBlock"] == CIDR
    assert vpc.inputs["enableDnsSupport"] is True and vpc.inputs["enableDnsHostnames"] is True
    for zone in US_ZONES:
        assert private[zone].inputs["cidrBlock"] == plan.private[zone]
        assert public[zone].inputs["cidrBlock"] == plan.public[zone]
        for subnet in (private[zone], public[zone]):
            assert subnet.inputs["vpcId"] == vpc.state["id"]
            assert subnet.inputs.get("mapPublicIpOnLaunch") is not True
    # The component's attributes map each zone to the subnet really created there.
    for attribute, created in ((network.private_subnet_ids, private), (network.public_subnet_ids, public)):
        assert {z: _resolved(i) for z, i in attribute.items()} == {z: s.state["id"] for z, s in created.items()}
    assert _resolved(network.vpc_id) == vpc.state["id"]


def test_subnet_role_tags(net):
    _, run, _ = net
    cluster_tag = f"kubernetes.io/cluster/{CLUSTER}"
    for zone, subnet in _subnets(run, "private").items():
        tags = subnet.inputs["tags"]
        assert tags[cluster_tag] == "shared" and "kubernetes.io/role/elb" not in tags
        assert tags["Name"].startswith(NAME) and zone in tags["Name"]
    for subnet in _subnets(run, "public").values():
        tags = subnet.inputs["tags"]
        assert tags[cluster_tag] == "shared" and "kubernetes.io/role/internal-elb" not in tags
    # Stack tags come from the provider's default_tags, not repeated on each resource.
    assert all("team" not in r.inputs.get("tags", {}) for r in run.resources if r.custom)


def test_private_egress_goes_through_a_nat_in_its_zone(net):
    mode, run, _ = net
    nats = _by_id(run, NAT)
    public_by_id = {s.state["id"]: zone for zone, s in _subnets(run, "public").items()}
    nat_zone = {nid: public_by_id[n.inputs["subnetId"]] for nid, n in nats.items()}
    eips = _by_id(run, "aws:ec2/eip:Eip")
    assert len(nats) == (3 if mode == "one-per-az" else 1)
    assert sorted(n.inputs["allocationId"] for n in nats.values()) == sorted(eips)  # each NAT its own EIP
    for zone, subnet in _subnets(run, "private").items():
        table = _route_table_of(run, subnet)
        route = _default_route(run, table)
        assert "gatewayId" not in route.inputs
        expected = zone if mode == "one-per-az" else US_ZONES[0]
        assert nat_zone[route.inputs["natGatewayId"]] == expected
    # Each private subnet has a route table of its own.
    assert len({_route_table_of(run, s).urn for s in _subnets(run, "private").values()}) == len(US_ZONES)


def test_public_subnets_route_to_the_internet_gateway(net):
    _, run, _ = net
    igw = run.one("aws:ec2/internetGateway:InternetGateway")
    for subnet in _subnets(run, "public").values():
        assert _default_route(run, _route_table_of(run, subnet)).inputs["gatewayId"] == igw.state["id"]


def test_vpc_endpoints(per_az):
    run, network = per_az
    endpoints = run.of_type(ENDPOINT)
    interface = {e.inputs["serviceName"]: e for e in endpoints if e.inputs["vpcEndpointType"] == "Interface"}
    expected = {f"com.amazonaws.us-east-1.{s}" for s in
                ("ecr.api", "ecr.dkr", "ec2", "eks-auth", "autoscaling", "sqs", "ssm", "ssmmessages", "ec2messages")}
    assert set(interface) == expected
    private_ids = {s.state["id"] for s in _subnets(run, "private").values()}
    sg = run.one("aws:ec2/securityGroup:SecurityGroup")
    for endpoint in interface.values():
        assert endpoint.inputs["privateDnsEnabled"] is True
        assert set(endpoint.inputs["subnetIds"]) == private_ids
        assert endpoint.inputs["securityGroupIds"] == [sg.state["id"]]
    assert _resolved(network.endpoint_security_group.id) == sg.state["id"]

    rules = [r for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
             if r.inputs["securityGroupId"] == sg.state["id"]]
    assert [(r.inputs["ipProtocol"], r.inputs["fromPort"], r.inputs["toPort"], r.inputs["cidrIpv4"]) for r in rules] \
        == [("tcp", 443, 443, CIDR)]

    gateway = [e for e in endpoints if e.inputs["vpcEndpointType"] == "Gateway"]
    assert [e.inputs["serviceName"] for e in gateway] == ["com.amazonaws.us-east-1.s3"]
    private_tables = {_route_table_of(run, s).state["id"] for s in _subnets(run, "private").values()}
    assert set(gateway[0].inputs["routeTableIds"]) == private_tables


def test_endpoint_service_names_follow_the_region():
    run = run_component(_build("eu-west-1", EU_ZONES, "single", {}), region="eu-west-1")
    names = {e.inputs["serviceName"] for e in run.of_type(ENDPOINT)}
    assert len(names) == len(INTERFACE_ENDPOINTS) + 1
    assert all(n.startswith("com.amazonaws.eu-west-1.") for n in names), names
    assert {s.inputs["availabilityZoneId"] for s in run.of_type(SUBNET)} == set(EU_ZONES)


def test_flow_logs_to_an_encrypted_log_group(per_az):
    run, _ = per_az
    flow = run.one("aws:ec2/flowLog:FlowLog")
    group = run.one("aws:cloudwatch/logGroup:LogGroup")
    key = run.one("aws:kms/key:Key")
    role = run.one("aws:iam/role:Role")
    assert flow.inputs["vpcId"] == run.one("aws:ec2/vpc:Vpc").state["id"]
    assert flow.inputs["trafficType"] == "ALL"
    assert flow.inputs["logDestinationType"] == "cloud-watch-logs"
    assert flow.inputs["logDestination"] == group.state["arn"]
    assert flow.inputs["iamRoleArn"] == role.state["arn"]
    assert group.inputs["kmsKeyId"] == key.state["arn"]
    assert group.inputs["retentionInDays"] == RETENTION

    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "vpc-flow-logs.amazonaws.com"}]
    policy = run.one("aws:iam/rolePolicy:RolePolicy")
    assert policy.inputs["role"] == role.state["id"]
    writes = [s for s in json.loads(policy.inputs["policy"])["Statement"] if "logs:PutLogEvents" in s["Action"]]
    assert writes and all(r.startswith(group.state["arn"]) for s in writes for r in s["Resource"])
    # The flow log waits for its permissions.
    assert policy.urn in flow.dependencies


def test_kms_key_rotates_is_protected_and_lets_logs_use_it(per_az):
    run, _ = per_az
    key = run.one("aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    assert key.protect is True
    assert 7 <= key.inputs["deletionWindowInDays"] <= 30
    statements = json.loads(key.inputs["policy"])["Statement"]
    principals = {json.dumps(s["Principal"], sort_keys=True): s for s in statements}
    assert json.dumps({"AWS": "arn:aws:iam::123456789012:root"}) in principals
    logs = principals[json.dumps({"Service": "logs.us-east-1.amazonaws.com"})]
    # Its own log group only (CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs using AWS KMS"):
    # never a pattern another group of the region could match.
    group = run.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/vpc/{CLUSTER}/flow-logs"
    assert logs["Condition"] == {"ArnEquals": {
        "kms:EncryptionContext:aws:logs:arn": f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/vpc/{CLUSTER}/flow-logs"}}
    assert "kms:*" not in logs["Action"]


def test_the_default_security_group_is_adopted_and_admits_nothing(net):
    _, net, _ = net
    default = net.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert default.inputs["vpcId"] == net.one("aws:ec2/vpc:Vpc").state["id"]
    assert default.inputs.get("ingress", []) == [] and default.inputs.get("egress", []) == []


def test_children_are_parented_named_and_use_the_callers_provider(net):
    _, run, _ = net
    component = run.one(COMPONENT, NAME)
    provider = run.one("pulumi:providers:aws")
    children = [r for r in run.resources if r.urn not in (component.urn, provider.urn)]
    assert len(children) >= 40
    for r in children:
        assert r.parent == component.urn, r.name
        assert r.name.startswith(f"{NAME}-"), r.name
        assert r.provider and r.provider.startswith(provider.urn), r.name
    assert len({(r.type, r.name) for r in children}) == len(children)
    # Only the key is protected; nothing else blocks a teardown.
    assert [r.type for r in children if r.protect] == ["aws:kms/key:Key"]


@pytest.mark.parametrize("change, message", [
    ({"nat_gateways": "per-zone"}, "nat_gateways"),
    ({"flow_log_retention_days": 10}, "retention"),
    ({"zones": ()}, "at least one zone"),
])
def test_bad_args_are_refused(change, message):
    args = dict(cidr=CIDR, zones=US_ZONES, nat_gateways="single", cluster_name=CLUSTER, flow_log_retention_days=7,
                region="us-east-1", account_id=ACCOUNT, **AWS_PARTITION)
    args.update(change)

    def build():
        Network(NAME, NetworkArgs(**args))

    with pytest.raises(Exception, match=message):
        run_component(build)


def test_the_network_takes_region_account_and_partition_from_its_args_and_reads_nothing():
    """The stack's region, account and partition come from prepare (layers.Stack), read once: the component
    invokes nothing itself, and what it builds follows the partition it is given."""
    china = dict(partition="aws-cn", dns_suffix="amazonaws.com.cn", reverse_dns_prefix="cn.com.amazonaws")
    run = run_component(_build("cn-north-1", ("cnn1-az1", "cnn1-az2"), "single", {}, partition=china),
                        region="cn-north-1")
    assert run.invokes == []
    names = {e.inputs["serviceName"] for e in run.of_type(ENDPOINT)}
    assert "cn.com.amazonaws.cn-north-1.s3" in names and all(n.startswith("cn.com.amazonaws.cn-north-1.") for n in names)
    key_policy = run.one("aws:kms/key:Key").inputs["policy"]
    assert "logs.cn-north-1.amazonaws.com.cn" in key_policy and f"arn:aws-cn:iam::{ACCOUNT}:root" in key_policy
