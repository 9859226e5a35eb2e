"""Run the real gpu-cloud program in-process under Pulumi mocks and record what it registers.

This is the one mock harness: the offline plan and every test use it. The mocks answer like AWS
would for the stack's region (real zone names, ids and ARNs in the right format, an EKS endpoint,
CA and OIDC issuer, the accelerated AMI from its SSM parameter, the peer stack's outputs), and the
recording monitor keeps each registration's parent, provider, dependencies and options, which the
SDK's own mock hooks do not expose.
"""
from __future__ import annotations

import base64
import contextlib
import gc
import hashlib
import json
import logging
import re
import runpy
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from plan.views import SECRET_SIG, SIG_KEY

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT_ID = "123456789012"
RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
REDACTED = "[secret]"

# Zones each region really has (EC2 DescribeAvailabilityZones, 2026); a region not listed gets a, b, c.
REGION_ZONES = {
    "us-east-1": ("a", "b", "c", "d", "e", "f"),
    "us-east-2": ("a", "b", "c"),
    "us-west-2": ("a", "b", "c", "d"),
    "eu-west-1": ("a", "b", "c"),
}


# The capacity block the offline plan assumes for a capacity-block pool, there being no account to read its term
# from: 14 days from 2027-01-04, at 11:30 UTC, when every block begins and ends (EC2 User Guide, "Find and purchase
# Capacity Blocks": durations of 1 to 14 days, then 7-day steps to 182). The plan says the term is assumed.
OFFLINE_BLOCK_START, OFFLINE_BLOCK_END = "2027-01-04T11:30:00Z", "2027-01-18T11:30:00Z"


class AccountReadError(Exception):
    """What AWS answers instead of the thing asked for ("NoSuchEntity: ..."): the provider function fails with it."""


@dataclass
class MockAccount:
    """The pretend AWS account the mocks answer for: what its zones are called, what they offer, which
    capacity reservations, roles and hosted zones it holds. Tests change it to see how the program reacts; a subclass
    may answer get_role and get_hosted_zone from elsewhere (tests/test_preflight.py: moto)."""
    zones: Dict[str, str]                          # available zone ID -> this account's name for it
    offerings: Dict[str, FrozenSet[str]]           # zone ID -> instance types offered there
    # id -> properties as EC2 reports them (InstanceCount: the size billed; StartDate/EndDate: a block's term)
    reservations: Dict[str, Dict[str, Any]]
    caller_arn: str = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/gpu-cloud-deployer/pulumi"   # who runs Pulumi
    role_paths: Dict[str, str] = field(default_factory=dict)   # role name -> IAM path, for session issuers
    transit_gateways: Tuple[str, ...] = ()                     # IDs the account can attach to
    quotas: Dict[str, float] = field(default_factory=dict)     # EC2 vCPU quota code -> value; one not here is unreadable
    # interface endpoint service (ecr.api, ...) -> zone IDs that offer it; None: every service in every zone
    endpoint_zones: Optional[Dict[str, FrozenSet[str]]] = None
    # IAM roles the account holds besides the caller's own: role name -> its path ("/" or "/a/b/")
    roles: Dict[str, str] = field(default_factory=dict)
    # Route 53 hosted zones: zone ID -> (its name, without the trailing dot; whether it is private)
    hosted_zones: Dict[str, Tuple[str, bool]] = field(default_factory=dict)
    # What the account was built from, which the program's refusals name (decisions.network.zones.AccountZones.source);
    # None: it stands for a real account (tests that change the offline account to play one set it so).
    source: Optional[str] = None

    @property
    def account_id(self) -> str:
        """The caller's account: the one the stack deploys to."""
        found = re.match(r"arn:aws[a-z-]*:(?:sts|iam)::(\d{12}):", self.caller_arn)
        return found.group(1) if found else ACCOUNT_ID

    def get_role(self, name: str) -> Dict[str, Any]:
        """IAM GetRole's Role (RoleName, Path, Arn, RoleId), or AccountReadError as IAM answers. The role the caller
        assumed exists too, with its path from role_paths."""
        caller = re.match(r"arn:aws[a-z-]*:sts::\d{12}:assumed-role/([^/]+)/", self.caller_arn)
        path = self.roles.get(name, self.role_paths.get(name, "/") if caller and caller.group(1) == name else None)
        if path is None:
            raise AccountReadError(f"NoSuchEntity: The role with name {name} cannot be found.")
        return {"RoleName": name, "Path": path, "Arn": f"arn:aws:iam::{self.account_id}:role{path}{name}",
                "RoleId": f"AROA{_hex(name, 17).upper()}"}

    def get_hosted_zone(self, zone_id: str) -> Dict[str, Any]:
        """Route 53 GetHostedZone's HostedZone (Id, Name with its trailing dot, Config.PrivateZone), or
        AccountReadError as Route 53 answers."""
        if zone_id not in self.hosted_zones:
            raise AccountReadError(f"NoSuchHostedZone: No hosted zone found with ID: {zone_id}")
        name, private = self.hosted_zones[zone_id]
        return {"Id": f"/hostedzone/{zone_id}", "Name": f"{name}.", "CallerReference": f"plan-{zone_id}",
                "Config": {"PrivateZone": private}, "ResourceRecordSetCount": 2}


def offline_account(region: str, stack_config: Mapping[str, Any]) -> MockAccount:
    """The account the offline plan assumes, built from data files (its `source` says which, and the program's
    refusals name it): the region's gpuZoneIds of decisions/network/zones.yaml available, named a, b, c... in that
    order; every catalog type of the region offered in every zone; and every reservation the stack names
    existing exactly as its pool describes it (maxNodes instances; a capacity block for OFFLINE_BLOCK_START to
    OFFLINE_BLOCK_END), and the stack's transit gateway too (there is no account to read
    them from; `pulumi preview` does). Pulumi runs as the stack's first admin role, as the README advises, in that
    role's account, which holds every role of it the stack names (admin, team and publisher roles) and the hosted zone
    dr.hostedZoneId, a public zone one label above dr.domain.
    Each EC2 vCPU quota the pools draw on is exactly what they need at maxNodes (AWS's default is 0: the plan's
    preflight section says what to request), and every interface endpoint service is offered in every zone."""
    from decisions.catalog.catalog import load_catalog
    from decisions.network.zones import ZONES_FILE, load_zone_facts, recorded_gpu_zones

    facts = load_zone_facts().regions.get(region)
    prefix = facts.zone_id_prefix if facts else region.replace("-", "")[:5]
    # The region's GPU zone IDs where decisions/network/zones.yaml records them (ap-northeast-1 has no apne1-az3 among
    # them); a region it records none for is refused before the account is read (aws:region), so a guess serves.
    recorded = bool(facts and facts.gpu_zone_ids)
    ids = facts.gpu_zone_ids if recorded else tuple(
        f"{prefix}-az{i + 1}" for i in range(len(REGION_ZONES.get(region, "abc"))))
    source = recorded_gpu_zones() if recorded else f"a guess ({ZONES_FILE} records no gpuZoneIds for {region})"
    zones = {zone_id: f"{region}{letter}" for zone_id, letter in zip(ids, "abcdef")}
    offered = frozenset(name for name, itype in load_catalog().instance_types.items() if region in itype.regions)
    reservations = {}
    for pool in stack_config.get("gpu-cloud:nodePools") or []:
        if isinstance(pool, dict) and pool.get("capacityReservationId"):
            pin = str(pool.get("availabilityZone", ""))
            zone_id = pin if pin in zones else next((z for z, name in zones.items() if name == pin), pin)
            group = pool.get("placementGroup")
            reservations[pool["capacityReservationId"]] = {
                "AvailabilityZoneId": zone_id, "AvailabilityZone": zones.get(zone_id, pin),
                "InstanceType": (pool.get("instanceTypes") or [""])[0], "InstanceCount": pool.get("maxNodes", 0),
                "PlacementGroupArn": f"arn:aws:ec2:{region}:{ACCOUNT_ID}:placement-group/{group}" if group else None,
                "ReservationType": "capacity-block" if pool.get("capacity") == "capacity-block" else "default",
                **({"StartDate": OFFLINE_BLOCK_START, "EndDate": OFFLINE_BLOCK_END}
                   if pool.get("capacity") == "capacity-block" else {})}
    network, cluster = stack_config.get("gpu-cloud:network") or {}, stack_config.get("gpu-cloud:cluster") or {}
    tgw = (network.get("transitGateway") or {}).get("id") if isinstance(network, dict) else None
    admins = (cluster.get("adminRoleArns") or []) if isinstance(cluster, dict) else []
    caller, paths, home = MockAccount.caller_arn, {}, ACCOUNT_ID
    found = _ROLE_ARN.match(str(admins[0])) if admins else None
    if found:
        home, path, role = found.groups()
        caller, paths = f"arn:aws:sts::{home}:assumed-role/{role}/pulumi", {role: path}
    roles = {}
    for arn in _named_role_arns(stack_config):
        named = _ROLE_ARN.match(arn)
        if named and named.group(1) == home:
            roles.setdefault(named.group(3), named.group(2))
    dr = stack_config.get("gpu-cloud:dr") or {}
    zone_id, domain = (dr.get("hostedZoneId"), str(dr.get("domain") or "")) if isinstance(dr, dict) else (None, "")
    hosted_zones = {zone_id: (domain.split(".", 1)[-1], False)} if zone_id and domain else {}
    return MockAccount(zones=zones, offerings={zone: offered for zone in zones}, reservations=reservations,
                       caller_arn=caller, role_paths=paths, transit_gateways=(tgw,) if tgw else (),
                       quotas=_quotas_needed(stack_config), roles=roles, hosted_zones=hosted_zones, source=source)


_ROLE_ARN = re.compile(r"arn:aws:iam::(\d{12}):role(/(?:.*/)?)([^/]+)$")     # account, path, name


def _named_role_arns(stack_config: Mapping[str, Any]) -> List[str]:
    """The role ARNs a stack names (decisions.config.preflight.named_roles), read from the raw config, which the
    program has not checked yet: anything not shaped as expected names nothing."""
    def listed(value, *keys) -> List[str]:
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return [str(arn) for arn in value] if isinstance(value, list) else []

    tenancy = stack_config.get("gpu-cloud:tenancy")
    teams = tenancy.get("teams") if isinstance(tenancy, dict) else None
    return (listed(stack_config, "gpu-cloud:cluster", "adminRoleArns")
            + [arn for access in (teams.values() if isinstance(teams, dict) else ()) for arn in listed(access, "roleArns")]
            + listed(stack_config, "gpu-cloud:inference", "triton", "publisherRoleArns"))


def _quotas_needed(stack_config: Mapping[str, Any]) -> Dict[str, float]:
    """The vCPUs each EC2 quota must hold for the stack's pools at maxNodes (decisions/config/preflight.py), read from
    the raw config; a pool the program will refuse anyway counts for nothing."""
    from decisions.catalog.catalog import load_catalog
    from decisions.config.preflight import quota_for

    types, needed = load_catalog().instance_types, {}
    for pool in stack_config.get("gpu-cloud:nodePools") or []:
        try:
            itype = types[pool["instanceTypes"][0]]
            quota = quota_for(itype.name, pool["capacity"])
            if quota is not None:
                needed[quota.code] = needed.get(quota.code, 0.0) + float(int(pool["maxNodes"]) * itype.vcpu)
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return needed


@dataclass(frozen=True)
class RegisteredResource:
    urn: str
    type: str
    name: str
    custom: bool
    parent: Optional[str]
    provider: Optional[str]
    inputs: Dict[str, Any]          # as the engine sees them: camelCase, secrets redacted
    dependencies: Tuple[str, ...]
    protect: bool
    retain_on_delete: bool
    state: Dict[str, Any] = field(repr=False)   # what the mocks answered (ids, ARNs, ...)
    # The options that keep a running pool or stored data in place (the engine honours them; mocks do not).
    ignore_changes: Tuple[str, ...] = ()
    replace_on_changes: Tuple[str, ...] = ()
    delete_before_replace: bool = False
    custom_timeouts: Dict[str, str] = field(default_factory=dict)   # create / update / delete, when set
    aliases: Tuple[str, ...] = ()                                   # earlier URNs or names it answers to
    deleted_with: Optional[str] = None                              # URN whose deletion takes this one along
    id: str = ""                                                    # the ID the mocks gave it
    # input key -> URNs its value came from (what the engine gives a stack policy as propertyDependencies)
    property_dependencies: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # A component its provider builds (a yaml/v2 ConfigFile, a Helm v4 Chart): the engine hands it to the provider's
    # Construct, which registers its children at `pulumi up`; the mocks answer it as one resource, with none.
    remote: bool = False

    @property
    def delete_timeout(self) -> str:
        return self.custom_timeouts.get("delete", "")


@dataclass
class ProgramRun:
    project: str
    stack: str
    region: str
    resources: List[RegisteredResource]
    outputs: Dict[str, Any]
    invokes: List[Tuple[str, Dict[str, Any]]] = field(default_factory=list)   # provider functions called: (token, args)
    invoke_providers: List[Tuple[str, str]] = field(default_factory=list)    # (token, provider reference) per call
    warnings: List[str] = field(default_factory=list)                         # what the program logged as warnings

    def of_type(self, type_token: str) -> List[RegisteredResource]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str, name: Optional[str] = None) -> RegisteredResource:
        found = [r for r in self.of_type(type_token) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {type_token} {name or ''}, found {[r.name for r in found]}")
        return found[0]

    def children_of(self, urn: str) -> List[RegisteredResource]:
        return [r for r in self.resources if r.parent == urn]

    def unexpanded(self) -> List[RegisteredResource]:
        """Remote components with no children here: what their provider registers at `pulumi up` (every object of
        a manifest, every template of a chart) is in neither this run, the plan, nor what the pack is shown."""
        parents = {r.parent for r in self.resources}
        return [r for r in self.resources if r.remote and r.urn not in parents]


def _hex(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


class GpuCloudMocks(pulumi.runtime.Mocks):
    """Answers resource registrations and provider calls the way AWS would, deterministically."""

    def __init__(self, region: str, peer_outputs: Callable[[str], Mapping[str, Any]], account: MockAccount):
        self.region = region
        self.peer_outputs = peer_outputs
        self.account = account
        self.invokes: List[Tuple[str, Dict[str, Any]]] = []
        self.invoke_providers: List[Tuple[str, str]] = []

    # --- resources -------------------------------------------------------------------------
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> Tuple[Optional[str], dict]:
        seed = f"{args.typ}::{args.name}"
        state = dict(args.inputs)
        if args.typ == "pulumi:pulumi:StackReference":
            return args.name, {"name": args.inputs.get("name", args.name),
                               "outputs": dict(self.peer_outputs(args.inputs.get("name", args.name))),
                               "secretOutputNames": []}
        if args.typ.startswith("pulumi:providers:"):
            return f"provider-{_hex(seed, 8)}", state
        if args.typ.startswith("kubernetes:"):
            return self._kubernetes(args, state)
        return self._aws(args, state, seed)

    def _aws(self, args, state: dict, seed: str) -> Tuple[str, dict]:
        r, acct = self.region, ACCOUNT_ID
        service, kind = _service_and_kind(args.typ)
        physical = state.get("name") or f"{args.name}-{_hex(seed, 7)}"
        if "name" in state or kind in _AUTONAMED:
            state.setdefault("name", physical)
        rid = f"{_ID_PREFIX.get(kind, kind.lower())}-{_hex(seed, 17)}"
        arn = f"arn:aws:{service}:{r}:{acct}:{kind.lower()}/{physical}"
        if kind == "Cluster" and service == "eks":
            issuer_id = _hex(seed, 32).upper()
            state.update(
                endpoint=f"https://{issuer_id}.gr7.{r}.eks.amazonaws.com",
                certificateAuthority={"data": base64.b64encode(
                    b"-----BEGIN CERTIFICATE-----\nMIIC/mock/" + issuer_id.encode() + b"\n-----END CERTIFICATE-----\n").decode()},
                identities=[{"oidcs": [{"issuer": f"https://oidc.eks.{r}.amazonaws.com/id/{issuer_id}"}]}],
                kubernetesNetworkConfig={"serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4",
                                         **(state.get("kubernetesNetworkConfig") or {})},
                status="ACTIVE", platformVersion="eks.1", clusterId=str(uuid.UUID(_hex(seed, 32))),
                vpcConfig={**(state.get("vpcConfig") or {}), "clusterSecurityGroupId": f"sg-{_hex(seed + 'cluster', 17)}",
                           "vpcId": f"vpc-{_hex(seed + 'vpc', 17)}"},
            )
            arn = f"arn:aws:eks:{r}:{acct}:cluster/{physical}"
            rid = physical
        elif service == "iam":
            arn = f"arn:aws:iam::{acct}:{_IAM_KIND.get(kind, kind.lower())}/{physical}"
            rid = physical
            if kind == "OpenIdConnectProvider":
                host = state.get("url", "").removeprefix("https://")
                arn, rid = f"arn:aws:iam::{acct}:oidc-provider/{host}", f"arn:aws:iam::{acct}:oidc-provider/{host}"
            state.setdefault("uniqueId", f"AROA{_hex(seed, 17).upper()}")
        elif service == "kms" and kind == "Key":
            key_id = str(uuid.UUID(_hex(seed, 32)))
            rid, arn = key_id, f"arn:aws:kms:{r}:{acct}:key/{key_id}"
            state["keyId"] = key_id
        elif service == "kms" and kind == "Alias":
            rid, arn = state.get("name", physical), f"arn:aws:kms:{r}:{acct}:{state.get('name', physical)}"
        elif service == "s3":
            bucket = state.get("bucket") or f"{args.name}-{_hex(seed, 7)}"
            state.setdefault("bucket", bucket)
            rid, arn = bucket, f"arn:aws:s3:::{bucket}"
            state.setdefault("bucketRegionalDomainName", f"{bucket}.s3.{r}.amazonaws.com")
            if kind == "BucketObjectv2":
                rid = state.get("key", physical)
                state.setdefault("versionId", _hex(seed + "v", 32))
                state.setdefault("etag", _hex(seed + "e", 32))
        elif service == "sqs":
            rid = f"https://sqs.{r}.amazonaws.com/{acct}/{physical}"
            arn = f"arn:aws:sqs:{r}:{acct}:{physical}"
            state["url"] = rid
        elif service == "cloudwatch" and kind == "EventRule":
            arn, rid = f"arn:aws:events:{r}:{acct}:rule/{physical}", physical
        elif service == "cloudwatch" and kind == "LogGroup":
            arn, rid = f"arn:aws:logs:{r}:{acct}:log-group:{physical}", physical
        elif service == "autoscaling" and kind == "Group":
            rid = physical
            arn = f"arn:aws:autoscaling:{r}:{acct}:autoScalingGroup:{uuid.UUID(_hex(seed, 32))}:autoScalingGroupName/{physical}"
        elif service == "ec2" and kind == "LaunchTemplate":
            state.update(latestVersion=1, defaultVersion=1)
        elif service == "ec2" and kind == "PlacementGroup":
            rid = physical
            state["placementGroupId"] = f"pg-{_hex(seed, 17)}"
        elif service == "ec2" and kind == "Eip":
            state.update(allocationId=rid, publicIp=f"52.{int(_hex(seed, 2), 16)}.{int(_hex(seed + 'x', 2), 16)}.10")
        elif service == "fsx" and kind == "LustreFileSystem":
            state.update(dnsName=f"{rid}.fsx.{r}.amazonaws.com", mountName=_hex(seed, 8))
        elif service == "eks" and kind in ("Addon", "AccessEntry", "PodIdentityAssociation", "AccessPolicyAssociation"):
            rid = f"{state.get('clusterName', 'cluster')}:{physical}"
        state.setdefault("arn", arn)
        state.setdefault("id", rid)
        state.setdefault("ownerId", acct)
        if "tags" in state:
            state.setdefault("tagsAll", state["tags"])
        return rid, state

    def _kubernetes(self, args, state: dict) -> Tuple[str, dict]:
        metadata = dict(state.get("metadata") or {})
        name = metadata.get("name") or f"{args.name}-{_hex(args.name, 8)}"
        namespace = metadata.get("namespace")
        if args.typ == "kubernetes:helm.sh/v3:Release":
            name = state.get("name") or name
            state["status"] = {"name": name, "namespace": state.get("namespace", "default"), "status": "deployed",
                               "chart": state.get("chart"), "version": state.get("version"), "revision": 1}
            return f"{state.get('namespace', 'default')}/{name}", state
        metadata.setdefault("name", name)
        state["metadata"] = metadata
        if args.typ == "kubernetes:core/v1:Service" and (state.get("spec") or {}).get("type") == "LoadBalancer":
            # The AWS Load Balancer Controller's NLB: `k8s-<ns>-<name>-<hash>`, as in its DNS name.
            lb = f"k8s-{(namespace or 'default')[:8]}-{name[:8]}-{_hex(args.name, 10)}"
            state["status"] = {"loadBalancer": {"ingress": [{"hostname": f"{lb}-{_hex(args.name + 'id', 16)}.elb.{self.region}.amazonaws.com"}]}}
        return f"{namespace}/{name}" if namespace else name, state

    # --- provider functions -----------------------------------------------------------------
    def call(self, args: pulumi.runtime.MockCallArgs):
        token, inputs, r = args.token, args.args, self.region
        self.invokes.append((token, dict(inputs)))
        self.invoke_providers.append((token, args.provider or ""))
        if token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = sorted(self.account.zones.items(), key=lambda kv: kv[1])      # EC2 lists them by name
            return {"names": [name for _, name in zones], "zoneIds": [zone for zone, _ in zones],
                    "id": r, "groupNames": [r], "state": "available"}
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            wanted = {f["name"]: set(f["values"]) for f in inputs.get("filters") or []}
            found = [(itype, zone) for zone, types in sorted(self.account.offerings.items()) for itype in sorted(types)
                     if itype in wanted.get("instance-type", {itype}) and zone in wanted.get("location", {zone})]
            return {"instanceTypes": [i for i, _ in found], "locations": [z for _, z in found],
                    "locationTypes": ["availability-zone-id"] * len(found), "id": r}
        if token in ("aws:cloudcontrol/getResource:getResource",
                     "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation"):
            rid = inputs.get("identifier") or inputs.get("id")
            found = self.account.reservations.get(rid)
            block = token.startswith("aws:ec2/")
            if found is None or (found["ReservationType"] == "capacity-block") != block:
                # what the engine hands back when the provider's read fails: the invoke raises with the reason
                return {}, [("id", f"InvalidCapacityReservationId.NotFound: The capacity reservation ID '{rid}' "
                                   "does not exist")]
            if not block:
                return {"id": rid, "identifier": rid, "typeName": inputs.get("typeName"),
                        "properties": json.dumps({k: v for k, v in found.items() if k != "ReservationType" and v is not None})}
            return {"id": rid, "availabilityZone": found["AvailabilityZone"], "availabilityZoneId": found["AvailabilityZoneId"],
                    "instanceType": found["InstanceType"], "instanceCount": found["InstanceCount"],
                    "placementGroupArn": found["PlacementGroupArn"], "reservationType": "capacity-block",
                    "startDate": found.get("StartDate"), "endDate": found.get("EndDate")}
        if token == "aws:ssm/getParameter:getParameter":
            name = inputs["name"]
            return {"name": name, "value": f"ami-{_hex(name + r, 17)}", "type": "String",
                    "arn": f"arn:aws:ssm:{r}::parameter{name}", "version": 1, "insecureValue": None, "id": name}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            account = self.account.account_id
            return {"accountId": account, "arn": self.account.caller_arn, "userId": "AROAPLAN:pulumi", "id": account}
        if token == "aws:iam/getSessionContext:getSessionContext":
            arn = inputs["arn"]
            if ":assumed-role/" not in arn:     # IAM's answer for a user or a role: it is its own issuer
                return {"arn": arn, "issuerArn": arn, "issuerId": "", "issuerName": "", "sessionName": "", "id": arn}
            account, role, session = re.match(r"arn:aws:sts::(\d{12}):assumed-role/([^/]+)/(.+)", arn).groups()
            path = self.account.role_paths.get(role, "/")
            return {"arn": arn, "issuerArn": f"arn:aws:iam::{account}:role{path}{role}", "issuerId": "AROAPLAN",
                    "issuerName": role, "sessionName": session, "id": arn}
        if token == "aws:iam/getRole:getRole":
            # The provider's outputs from GetRole's Role (terraform-provider-aws internal/service/iam/role_data_source.go).
            try:
                role = self.account.get_role(inputs["name"])
            except AccountReadError as error:
                return {}, [("name", str(error))]
            return {"id": role["RoleName"], "name": role["RoleName"], "arn": role["Arn"], "path": role["Path"],
                    "uniqueId": role["RoleId"], "description": role.get("Description", ""),
                    "maxSessionDuration": role.get("MaxSessionDuration", 3600), "permissionsBoundary": "",
                    "tags": dict(inputs.get("tags") or {})}
        if token == "aws:route53/getZone:getZone":
            # The provider's outputs from GetHostedZone (terraform-provider-aws internal/service/route53/
            # zone_data_source.go): the ID without "/hostedzone/", the name without its trailing dot, and no VPCs.
            try:
                zone = self.account.get_hosted_zone(inputs["zoneId"])
            except AccountReadError as error:
                return {}, [("zoneId", str(error))]
            zone_id = zone["Id"].rsplit("/", 1)[-1]
            return {"id": zone_id, "zoneId": zone_id, "name": zone["Name"].rstrip("."),
                    "privateZone": bool(zone["Config"]["PrivateZone"]), "callerReference": zone["CallerReference"],
                    "comment": zone["Config"].get("Comment", ""), "arn": f"arn:aws:route53:::hostedzone/{zone_id}",
                    "resourceRecordSetCount": zone.get("ResourceRecordSetCount", 2), "tags": {},
                    "nameServers": [f"ns-{i}.awsdns-{i:02d}.org" for i in (1, 2)],
                    "primaryNameServer": "ns-1.awsdns-01.org"}
        if token == "aws:ec2transitgateway/getTransitGateway:getTransitGateway":
            tgw = inputs.get("id")
            if tgw not in self.account.transit_gateways:
                return {}, [("id", f"InvalidTransitGatewayID.NotFound: Transit Gateway {tgw} was deleted or does not exist.")]
            return {"id": tgw, "arn": f"arn:aws:ec2:{r}:{ACCOUNT_ID}:transit-gateway/{tgw}", "ownerId": ACCOUNT_ID,
                    "defaultRouteTableAssociation": "enable", "defaultRouteTablePropagation": "enable",
                    "autoAcceptSharedAttachments": "disable"}
        if token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            code = inputs.get("quotaCode")
            if code not in self.account.quotas:
                return {}, [("quotaCode", f"AccessDeniedException: not authorized to perform servicequotas:GetServiceQuota "
                                          f"on ec2/{code}")]
            return {"id": f"ec2/{code}", "quotaCode": code, "serviceCode": inputs.get("serviceCode"), "region": r,
                    "arn": f"arn:aws:servicequotas:{r}:{ACCOUNT_ID}:ec2/{code}", "value": self.account.quotas[code],
                    "defaultValue": 0.0, "adjustable": True, "globalQuota": False,
                    "serviceName": "Amazon Elastic Compute Cloud (Amazon EC2)", "usageMetrics": []}
        if token == "aws:ec2/getVpcEndpointService:getVpcEndpointService":
            name = inputs.get("serviceName", "")
            service = name.removeprefix(f"com.amazonaws.{r}.")
            offering = self.account.endpoint_zones
            zones = set(self.account.zones) if offering is None else offering.get(service)
            if zones is None:
                return {}, [("serviceName", f"InvalidServiceName: The Vpc Endpoint Service '{name}' does not exist")]
            return {"id": r, "serviceName": name, "service": service, "serviceType": "Interface", "owner": "amazon",
                    "serviceId": f"vpce-svc-{_hex(name, 17)}", "acceptanceRequired": False,
                    "availabilityZones": sorted(self.account.zones[z] for z in zones if z in self.account.zones),
                    "privateDnsName": f"{service}.{r}.amazonaws.com", "vpcEndpointPolicySupported": True,
                    "managesVpcEndpoints": False, "supportedIpAddressTypes": ["ipv4"]}
        if token == "aws:index/getRegion:getRegion":
            return {"name": r, "region": r, "id": r, "endpoint": f"ec2.{r}.amazonaws.com", "description": r}
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws", "id": "aws"}
        if token == "aws:lb/getLoadBalancer:getLoadBalancer":
            # The load balancer a Service got from the AWS Load Balancer Controller, found by its tags.
            stack = (inputs.get("tags") or {}).get("service.k8s.aws/stack", "default/service")
            lb = f"k8s-{_hex(stack, 8)}"
            arn = f"arn:aws:elasticloadbalancing:{r}:{ACCOUNT_ID}:loadbalancer/net/{lb}/{_hex(stack + 'id', 16)}"
            return {"arn": arn, "arnSuffix": arn.split("loadbalancer/", 1)[1], "name": lb, "id": arn,
                    "loadBalancerType": "network", "tags": dict(inputs.get("tags") or {})}
        if token == "aws:lb/getListener:getListener":
            lb_arn, port = inputs["loadBalancerArn"], int(inputs["port"])
            tg = f"arn:aws:elasticloadbalancing:{r}:{ACCOUNT_ID}:targetgroup/k8s-{_hex(lb_arn, 8)}/{_hex(f'{lb_arn}{port}', 16)}"
            return {"arn": f"{lb_arn.replace(':loadbalancer/', ':listener/')}/{_hex(str(port), 16)}", "id": lb_arn,
                    "loadBalancerArn": lb_arn, "port": port, "protocol": "TCP",
                    "defaultActions": [{"type": "forward", "targetGroupArn": tg, "order": 1}]}
        raise NotImplementedError(f"the plan's mocks have no answer for provider function {token}; add one in plan/engine.py")


_AUTONAMED = {"Role", "Policy", "InstanceProfile", "Group", "LaunchTemplate", "PlacementGroup", "Queue", "LogGroup",
              "EventRule", "SecurityGroup", "Cluster", "LustreFileSystem"}
_ID_PREFIX = {"Vpc": "vpc", "Subnet": "subnet", "SecurityGroup": "sg", "InternetGateway": "igw", "NatGateway": "nat",
              "Eip": "eipalloc", "RouteTable": "rtb", "Route": "r", "RouteTableAssociation": "rtbassoc",
              "VpcEndpoint": "vpce", "LaunchTemplate": "lt", "FlowLog": "fl", "LustreFileSystem": "fs",
              "SecurityGroupRule": "sgr", "VpcSecurityGroupIngressRule": "sgr", "VpcSecurityGroupEgressRule": "sgr",
              "Instance": "i", "NetworkInterface": "eni"}
_IAM_KIND = {"Role": "role", "Policy": "policy", "InstanceProfile": "instance-profile", "RolePolicy": "role",
             "RolePolicyAttachment": "role"}


def _service_and_kind(type_token: str) -> Tuple[str, str]:
    """`aws:ec2/vpc:Vpc` -> ("ec2", "Vpc")."""
    _, module, kind = type_token.split(":", 2)
    return module.split("/", 1)[0], kind


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """MockMonitor that also keeps each registration's parent, provider, dependencies and options."""

    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.registrations: List[RegisteredResource] = []

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # Like the engine: a child's type is qualified by its parent's, except under the root stack.
        if parent:
            parent_type = parent.split("::")[2]
            if parent_type != "pulumi:pulumi:Stack":
                type_ = f"{parent_type}${type_}"
        return "urn:pulumi:" + "::".join([pulumi.get_stack(), pulumi.get_project(), type_, name])

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            state = self.resources[response.urn].state
            inputs = _redact(json_format.MessageToDict(request.object, preserving_proto_field_name=True))
            self.registrations.append(RegisteredResource(
                urn=response.urn, type=request.type, name=request.name, custom=bool(request.custom),
                parent=request.parent or None, provider=request.provider or None, inputs=inputs,
                dependencies=tuple(sorted(request.dependencies)), protect=bool(request.protect),   # a set to the engine
                retain_on_delete=bool(request.retainOnDelete), state=dict(state),
                ignore_changes=tuple(request.ignoreChanges), replace_on_changes=tuple(request.replaceOnChanges),
                delete_before_replace=bool(request.deleteBeforeReplace),
                custom_timeouts={k: v for k, v in (("create", request.customTimeouts.create),
                                                   ("update", request.customTimeouts.update),
                                                   ("delete", request.customTimeouts.delete)) if v},
                aliases=tuple(request.aliasURNs) + tuple(_alias(a) for a in request.aliases),
                deleted_with=request.deletedWith or None, id=response.id,
                property_dependencies=property_dependencies(request), remote=bool(request.remote)))
        return response

    def ReadResource(self, request):
        # Reads (a StackReference, an existing resource looked up by id) are part of what the program touches.
        response = super().ReadResource(request)
        self.registrations.append(RegisteredResource(
            urn=response.urn, type=request.type, name=request.name, custom=True, parent=request.parent or None,
            provider=request.provider or None,
            inputs=_redact(json_format.MessageToDict(request.properties, preserving_proto_field_name=True)),
            dependencies=tuple(sorted(request.dependencies)), protect=False, retain_on_delete=False,
            state=dict(self.resources[response.urn].state), ignore_changes=(), replace_on_changes=(),
            delete_before_replace=False, custom_timeouts={}, aliases=(), id=request.id))
        return response


def property_dependencies(request) -> Dict[str, Tuple[str, ...]]:
    return {key: tuple(sorted(deps.urns)) for key, deps in sorted(request.propertyDependencies.items()) if deps.urns}


def _alias(alias) -> str:
    """An alias as one string: its URN, or the parts of its spec that are set (type=..., name=...)."""
    if alias.urn:
        return alias.urn
    fields = json_format.MessageToDict(alias.spec, preserving_proto_field_name=True)
    return ", ".join(f"{key}={value}" for key, value in sorted(fields.items()) if value)


def _redact(value: Any) -> Any:
    """Engine-view inputs: secrets become "[secret]", resource references their URN."""
    if isinstance(value, dict):
        sig = value.get(SIG_KEY)
        if sig == SECRET_SIG:
            return REDACTED
        if sig == RESOURCE_SIG:
            return value.get("urn")
        return {k: _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def peer_stack_outputs(reference: str) -> Dict[str, Any]:
    """What a peer gpu-cloud stack (`org/gpu-cloud/<stack>`) exports, as its own stack file implies.

    The peer is not run: its region comes from its stack file, its names from the program's naming
    rules, its ids in the same formats the mocks use. An unknown peer stack exports nothing.
    """
    from decisions.config.validate import cluster_name
    from decisions.storage.buckets import LOGS, PURPOSES, bucket_name
    from plan.stackfile import StackFileError, load_stack_config

    project, stack = reference.split("/")[-2:]
    try:
        region = str(load_stack_config(stack).get("aws:region", ""))
    except StackFileError:
        return {}
    seed = f"peer::{stack}"

    def bucket(purpose: str) -> Dict[str, Optional[str]]:
        name = bucket_name(project, stack, ACCOUNT_ID, purpose)
        if purpose == LOGS:      # SSE-S3: the log bucket has no key (decisions/storage/buckets.py LOG_BUCKET_SSE)
            return {"name": name, "arn": f"arn:aws:s3:::{name}", "keyArn": None}
        # the key id the mocks give the peer's own key (components/storage/buckets.py names it `<purpose>-key`)
        key_id = str(uuid.UUID(_hex(f"aws:kms/key:Key::{purpose}-key", 32)))
        return {"name": name, "arn": f"arn:aws:s3:::{name}", "keyArn": f"arn:aws:kms:{region}:{ACCOUNT_ID}:key/{key_id}"}

    return {
        "region": region,
        "clusterName": cluster_name(project, stack),
        "clusterEndpoint": f"https://{_hex(seed, 32).upper()}.gr7.{region}.eks.amazonaws.com",
        "vpcId": f"vpc-{_hex(seed, 17)}",
        "artifactBucket": bucket_name(project, stack, ACCOUNT_ID, "artifacts"),
        "buckets": {purpose: bucket(purpose) for purpose in PURPOSES},
    }


def config_for_engine(stack_config: Mapping[str, Any]) -> Dict[str, str]:
    """Stack-file config values as the engine hands them to a program: strings, objects as JSON."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in stack_config.items()}


def run_program(stack_config: Mapping[str, Any], *, stack: str, project: str = "gpu-cloud",
                program: Union[Path, Callable[[], None]] = ROOT / "__main__.py",
                peer_outputs: Optional[Callable[[str], Mapping[str, Any]]] = None,
                account: Optional[MockAccount] = None,
                monitor: Callable[[pulumi.runtime.Mocks], "RecordingMonitor"] = None,
                preview: bool = False) -> ProgramRun:
    """Run `program` for one stack's (fully defaulted) config under fresh mocks; return what it registered.

    `program` is the program file, or a function (tests use one to build a single component).
    StackReferences answer with `peer_outputs(name)`, by default what the named stack file implies.
    Provider reads about the account answer from `account`, by default `offline_account`.

    `stack_config` uses the stack file's keys (`gpu-cloud:network`, `aws:region`, ...). Raises whatever
    the program raises (a config error surfaces as pulumi.RunError).

    `preview=True` runs it as `pulumi preview` does (unknown values stay unknown, applies on them do not run), with
    `monitor` answering registrations as the engine would in that preview (plan/views.py).
    """
    from components.account import ANSWERED_FROM

    region = str(stack_config.get("aws:region", ""))
    mocks = GpuCloudMocks(region, peer_outputs or peer_stack_outputs, account or offline_account(region, stack_config))
    monitor = (monitor or RecordingMonitor)(mocks)
    warnings = _WarningLog()
    pulumi_settings.ROOT.set(None)  # a fresh root stack resource per run
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=preview, monitor=monitor,
                             logger=warnings.logger)
    pulumi.runtime.set_all_config(config_for_engine(stack_config))
    if callable(program):
        body = program
    else:
        if str(program.parent) not in sys.path:
            sys.path.insert(0, str(program.parent))
        body = lambda: runpy.run_path(str(program), run_name="__main__")  # noqa: E731
    # The program's account reads say what answered them (components/account.py ANSWERED_FROM).
    answered_from = ANSWERED_FROM.set(mocks.account.source)
    try:
        with _collector_paused():
            _sync_await(run_pulumi_func(body))
    finally:
        ANSWERED_FROM.reset(answered_from)
    root = pulumi_settings.get_root_resource()
    outputs = {key: _resolve_redacted(value) for key, value in root.outputs.items()}
    run = ProgramRun(project=project, stack=stack, region=region, resources=list(monitor.registrations),
                     outputs=outputs, invokes=list(mocks.invokes), invoke_providers=list(mocks.invoke_providers),
                     warnings=list(warnings.messages))
    run.warnings += [f"{r.name} ({r.type}) is built by its provider at `pulumi up`: the objects it registers then are "
                     "not in this plan, and the policy pack's verdict here does not cover them" for r in run.unexpanded()]
    return run


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector waits while the program runs. A run allocates about half a million objects, so the
    collector would run hundreds of times, and each full pass walks every object of the provider SDKs too (about
    400,000; 0.25 s a pass): a quarter of a plan's time (bench/RESULTS.md). The run's garbage is collected after it,
    at the collector's next turn."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _WarningLog(logging.Handler):
    """Keeps what the program logs as warnings (`pulumi.log.warn`), which the engine would print."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: List[str] = []
        self.logger = logging.Logger("gpu-cloud.program")   # not registered globally: one per run
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _resolve_redacted(value: Any) -> Any:
    output = pulumi.Output.from_input(value)
    return REDACTED if _sync_await(output.is_secret()) else _sync_await(output.future())
