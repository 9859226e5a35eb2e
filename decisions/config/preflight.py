"""What AWS would refuse on the first `pulumi up`, found before anything is registered. Pure: no Pulumi.

Limits the stack's config alone does not show:

- EC2 vCPU quotas. GPU instances draw on a per-region vCPU quota per family and purchase option
  (Service Quotas, service code `ec2`); `QUOTAS` lists the five GPU buckets. A bucket whose quota is below what the
  pools launch at desiredNodes is a config error (the first up's nodes would not launch); below maxNodes, a
  warning (scale-ups would stall). Quotas that cannot be read are a warning: the deploy does not need the read.
- Interface VPC endpoints. Each goes into every private subnet (components/network.py); a service not offered in
  one of the stack's zones would fail CreateVpcEndpoint halfway through the up.
- Auto Scaling tags. A group carries at most 50 tags; each GPU pool's group carries the stack's tags, its own and
  one cluster-autoscaler node-template tag per label, taint and extended resource (`asg_tags`, which
  components/nodes/nodepool.py tags the group with). Checked in decisions/config/validate.py, before the account is
  read.
- The IAM roles the stack names (`role_issues`): the admin and team roles each get an EKS access entry, the
  publisher roles are named in the model publisher role's trust policy. Both refuse a role that does not exist, ten
  minutes and more into the first up (after the cluster). components/account.py reads each role of this account
  with iam:GetRole.
- The hosted zone of the inference record (`hosted_zone_issues`): Route 53 must hold it and `dr.domain` must be a
  name the stack can give a CNAME in it. components/account.py reads it with route53:GetHostedZone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from decisions.config.errors import ConfigIssue, PathPart, key_path
from decisions.config.model import NAMESPACE
from decisions.nodes import autoscaling
from decisions.nodes import pools as pool_rules
from decisions.nodes.drain import NTH_MANAGED_TAG

QUOTA_SERVICE = "ec2"

# EC2 Auto Scaling: "The maximum number of tags per resource is 50" (Amazon EC2 Auto Scaling User Guide, Tag
# Auto Scaling groups and instances, "Tag naming and usage restrictions"; read 2026-12-04:
# docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-tagging.html).
ASG_TAGS_MAX = 50


@dataclass(frozen=True)
class Quota:
    code: str
    name: str
    default_vcpus: int      # AWS's default value in a new account


# The vCPU quotas GPU instances draw on, by quota group and purchase option. Codes, names and AWS's default values
# as the Service Quotas API lists them for service code ec2 (gruntwork-io/terraform-aws-utilities@04f58839
# docs/quotas.md, a table generated from ListAWSDefaultServiceQuotas: lines 1009, 1052, 1067 and 1104 with 0.0, and
# "All P5 Spot Instance Requests" L-C4BD4855 with 192.0). On-demand, one quota covers every P family and one the G
# and VT families; spot splits P into P2-P4 and P5 (p5, p5e, p5en), as the quota names say.
QUOTAS: Mapping[Tuple[str, str], Quota] = {
    ("p", "on-demand"): Quota("L-417A185B", "Running On-Demand P instances", 0),
    ("g", "on-demand"): Quota("L-DB2E81BA", "Running On-Demand G and VT instances", 0),
    ("p4", "spot"): Quota("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests", 0),
    ("p5", "spot"): Quota("L-C4BD4855", "All P5 Spot Instance Requests", 192),
    ("g", "spot"): Quota("L-3819A6DF", "All G and VT Spot Instance Requests", 0),
}
# The spot quota group of each P family. p6 (p6-b200) has none in that table: a spot pool of it is not checked, and
# says so (quota_issues).
SPOT_P_GROUPS = {"p2": "p4", "p3": "p4", "p4d": "p4", "p4de": "p4", "p5": "p5", "p5e": "p5", "p5en": "p5"}


def quota_group(instance_type: str, capacity: str) -> Optional[str]:
    family = instance_type.split(".", 1)[0]
    if capacity == "spot" and family.startswith("p"):
        return SPOT_P_GROUPS.get(family)
    return family[:1]


def quota_for(instance_type: str, capacity: str) -> Optional[Quota]:
    """The vCPU quota a pool's instances draw on. Reserved and capacity-block pools draw on none here: their
    instances run in a reservation that already holds the capacity (an On-Demand Capacity Reservation counts
    against the On-Demand limits when it is created, and its request fails on "instance limit constraints":
    Amazon EC2 User Guide, Work with Capacity Reservations, docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    capacity-reservations-using.html, read 2026-12-04)."""
    if capacity not in ("on-demand", "spot"):
        return None
    return QUOTAS.get((quota_group(instance_type, capacity), capacity))


def unchecked_pools(pools: Sequence) -> List[Tuple[int, str, str]]:
    """On-demand and spot pools whose type has no recorded quota: (index, pool, type)."""
    return [(i, pool.name, pool.primary_type.name) for i, pool in enumerate(pools)
            if pool.spec.capacity in ("on-demand", "spot") and quota_for(pool.primary_type.name, pool.spec.capacity) is None]


@dataclass(frozen=True)
class QuotaDemand:
    quota: Quota
    at_desired: int                       # vCPUs the pools launch at desiredNodes
    at_max: int                           # vCPUs at maxNodes
    pools: Tuple[Tuple[int, str, int], ...]   # (pool index, name, vCPUs at maxNodes)


def quota_demand(pools: Sequence) -> Dict[str, QuotaDemand]:
    """Per quota code, the vCPUs the stack's pools need (pools: decisions.config.stack.ResolvedPool, in config
    order). A pool's types share one shape (decisions/config/validate.py), so its vCPUs per node are its primary
    type's."""
    found: Dict[str, QuotaDemand] = {}
    for i, pool in enumerate(pools):
        quota = quota_for(pool.primary_type.name, pool.spec.capacity)
        if quota is None:
            continue
        vcpu = pool.primary_type.vcpu
        was = found.get(quota.code, QuotaDemand(quota, 0, 0, ()))
        found[quota.code] = QuotaDemand(quota, was.at_desired + pool.spec.desired_nodes * vcpu,
                                        was.at_max + pool.spec.max_nodes * vcpu,
                                        was.pools + ((i, pool.name, pool.spec.max_nodes * vcpu),))
    return found


def quota_issues(pools: Sequence, quotas: Mapping[str, Union[float, str]]
                 ) -> Tuple[List[ConfigIssue], List[str]]:
    """Errors (a bucket short at desiredNodes) and warnings (short at maxNodes, or not read) for the pools'
    vCPU quotas. `quotas`: quota code -> its value in this account and region, or why it could not be read."""
    issues: List[ConfigIssue] = []
    warnings: List[str] = []
    for code, need in quota_demand(pools).items():
        value = quotas.get(code, "not read")
        first = need.pools[0][0]
        launching = next((i for i, _, _ in need.pools if pools[i].spec.desired_nodes > 0), first)
        detail = ", ".join(f"{name} {vcpus}" for _, name, vcpus in need.pools)
        label = f"{code} ({need.quota.name})"
        if isinstance(value, str):
            warnings.append(f"{key_path(NAMESPACE, ('nodePools', first))}: the vCPU quota {label} could not be read "
                            f"({value}); the pools need {need.at_max} vCPUs of it at maxNodes ({detail}); check it "
                            "in Service Quotas before the first up")
        elif value < need.at_desired:
            issues.append(ConfigIssue(key_path(NAMESPACE, ("nodePools", launching, "desiredNodes")),
                                      f"the vCPU quota {label} is {value:g} in this region, but the pools launch "
                                      f"{need.at_desired} vCPUs at desiredNodes ({need.at_max} at maxNodes: {detail}); "
                                      f"request an increase of {code} to at least {need.at_max}, or lower desiredNodes"))
        elif value < need.at_max:
            warnings.append(f"{key_path(NAMESPACE, ('nodePools', first, 'maxNodes'))}: the vCPU quota {label} is "
                            f"{value:g}, below the {need.at_max} vCPUs the pools reach at maxNodes ({detail}); "
                            f"scale-ups past {value:g} vCPUs will fail until {code} is raised")
    for i, name, itype in unchecked_pools(pools):
        warnings.append(f"{key_path(NAMESPACE, ('nodePools', i))}: no vCPU quota is recorded for {itype} "
                        f"{pools[i].spec.capacity} instances (pool {name}); check its quota in Service Quotas "
                        "before the first up")
    return issues, warnings


def endpoint_issues(zones: Sequence[str], names_by_id: Mapping[str, str], region: str,
                    offered: Mapping[str, Union[FrozenSet[str], str]]) -> Tuple[List[ConfigIssue], List[str]]:
    """Each interface endpoint service against each of the stack's zones (IDs, in subnet order). `offered`:
    service (ecr.api, ...) -> the zone names it is offered in, or why that could not be read."""
    issues: List[ConfigIssue] = []
    warnings: List[str] = []
    for service, where in offered.items():
        if isinstance(where, str):
            warnings.append(f"{key_path(NAMESPACE, ('network', 'zones'))}: the zones of the interface endpoint "
                            f"service {service} could not be read ({where}); the stack puts it in every private subnet")
            continue
        for i, zone in enumerate(zones):
            if zone not in names_by_id:
                continue     # a zone the account does not have: resolve_layout refuses it, once
            name = names_by_id[zone]
            if name not in where:
                issues.append(ConfigIssue(key_path(NAMESPACE, ("network", "zones", i)),
                                          f"{zone} ({name}): the interface endpoint service {service} is not offered "
                                          f"there (it is in {', '.join(sorted(where)) or 'no zone'} of {region}); the "
                                          "stack puts it in every private subnet, so declare another zone"))
    return issues, warnings


def asg_tags(pool, cluster_name: str, resource_tags: Mapping[str, str], nvme_scratch: bool) -> Dict[str, str]:
    """Every tag a GPU pool's Auto Scaling group carries (components/nodes/nodepool.py tags it with exactly these): the
    stack's tags, its Name, the drain handler's and the cluster's tags, and cluster-autoscaler's discovery and
    node-template tags (one per label, taint and resource; `nvme_scratch`: storage.nvmeScratch, which sets the
    node's ephemeral storage)."""
    return {**resource_tags, "Name": pool_rules.asg_name(cluster_name, pool.name), NTH_MANAGED_TAG: "true",
            **pool_rules.cluster_ownership_tag(cluster_name),
            **autoscaling.node_group_tags(pool, cluster_name, nvme_scratch)}


def asg_tag_issues(pools: Sequence[Tuple[int, object]], cluster_name: str,
                   resource_tags: Mapping[str, str], nvme_scratch: bool) -> List[Tuple[tuple, str]]:
    """Pools whose group would carry more than ASG_TAGS_MAX tags (pools: (index, ResolvedPool))."""
    problems = []
    for i, pool in pools:
        tags = asg_tags(pool, cluster_name, resource_tags, nvme_scratch)
        if len(tags) > ASG_TAGS_MAX:
            own = len(pool.spec.labels) + len(pool.spec.taints)
            problems.append((("nodePools", i), f"its Auto Scaling group would carry {len(tags)} tags, over the "
                             f"{ASG_TAGS_MAX} AWS allows per group: {len(resource_tags)} stack tags, {own} from its "
                             f"labels and taints (one cluster-autoscaler node-template tag each) and "
                             f"{len(tags) - len(resource_tags) - own} of gpu-cloud's own; remove {len(tags) - ASG_TAGS_MAX} of "
                             "its labels, taints or the stack's tags"))
    return problems


# ----------------------------------------------------------------------------- the IAM roles the stack names

# How a named role is used: an EKS access entry (cluster.adminRoleArns and tenancy.teams.*.roleArns: STANDARD entries,
# components/cluster.py and components/platform/tenancy.py) or a principal of the model publisher role's trust policy
# (inference.triton.publisherRoleArns, decisions/storage/data_access.py publisher_trust_policy).
ACCESS_ENTRY, TRUSTED = "access entry", "trust policy"

# Every service-linked role lives under this path, and EKS takes none: "Access entries do not support service linked
# roles ... You can identify service linked roles by their ARN, which is in the format
# arn:aws:iam::*:role/aws-service-role/*" (Amazon EKS User Guide, Access entries, "Creating access entries",
# docs.aws.amazon.com/eks/latest/userguide/creating-access-entries.html).
SERVICE_LINKED_PATH = "/aws-service-role/"


@dataclass(frozen=True)
class RoleArn:
    partition: str
    account: str
    path: str       # "/" or "/a/b/": part of the ARN, not of the name GetRole takes
    name: str       # RoleName: unique in its account whatever the path


def parse_role_arn(arn: str) -> RoleArn:
    """`arn:aws:iam::111122223333:role/development/apps/my-role` -> aws, 111122223333, `/development/apps/`, `my-role`
    (an ARN decisions/config/model.py IAM_ROLE_ARN admits)."""
    _, partition, _, _, account, resource = arn.split(":", 5)
    parts = resource.split("/")[1:]
    return RoleArn(partition, account, "/" + "".join(f"{part}/" for part in parts[:-1]), parts[-1])


@dataclass(frozen=True)
class NamedRole:
    parts: Tuple[PathPart, ...]     # its key path below `gpu-cloud:`
    arn: str
    use: str                        # ACCESS_ENTRY or TRUSTED

    @property
    def role(self) -> RoleArn:
        return parse_role_arn(self.arn)


def named_roles(spec) -> List[NamedRole]:
    """Every role ARN the stack names, with its key path, in config order (spec: decisions.config.stack.StackSpec)."""
    roles = [NamedRole(("cluster", "adminRoleArns", i), arn, ACCESS_ENTRY)
             for i, arn in enumerate(spec.cluster.admin_role_arns)]
    roles += [NamedRole(("tenancy", "teams", team, "roleArns", i), arn, ACCESS_ENTRY)
              for team, access in spec.tenancy.teams for i, arn in enumerate(access.role_arns)]
    roles += [NamedRole(("inference", "triton", "publisherRoleArns", i), arn, TRUSTED)
              for i, arn in enumerate(spec.inference.triton.publisher_role_arns)]
    return roles


def roles_to_read(roles: Sequence[NamedRole], account_id: str, partition: str) -> List[str]:
    """The names to read with iam:GetRole, each once: the roles of this account. GetRole takes a name and answers from
    the caller's own account alone, so a role of another account cannot be read from here."""
    names: List[str] = []
    for named in roles:
        role = named.role
        if (role.partition, role.account) == (partition, account_id) and role.name not in names:
            names.append(role.name)
    return names


@dataclass(frozen=True)
class FoundRole:
    arn: str        # as IAM reports it, with the role's path


def role_issues(roles: Sequence[NamedRole], account_id: str, partition: str,
                found: Mapping[str, Union[FoundRole, str]]) -> List[ConfigIssue]:
    """Each named role against this account (`found`: role name -> the role IAM holds, or why it could not be read).

    - An access entry's role must be a role of this account, not a service-linked one, and exist with the path the ARN
      gives. EKS itself takes a STANDARD entry for another account's principal ("the ARN can be in the same, or
      different, AWS account", Amazon EKS User Guide, "Creating access entries"), but refuses one that does not exist
      ("An access entry includes the Amazon Resource Name (ARN) of one, and only one, existing IAM principal", same
      page; the refusal is
      InvalidParameterException "The specified principalArn is invalid: invalid principal", as in
      terraform-aws-modules/terraform-aws-eks issue 2969, an SSO role named without its path). That refusal comes
      after the cluster, about ten minutes into the first up, and another account's role cannot be read before it:
      gpu-cloud takes this account's roles only, which another account's principals may assume.
    - A publisher role may be another account's (a CI account's role assuming the publisher role is what cross-account
      trust is for), but it must be of this account's partition: a trust policy cannot name a principal of another
      partition: "You can't create a role to delegate access between an AWS GovCloud (US) account and a standard
      AWS account" (AWS re:Post Knowledge Center, the IAM trust policy error "Invalid principal in policy",
      repost.aws/knowledge-center/iam-trust-policy-error). One of this account must exist: "When you save the policy,
      AWS transforms the ARN to a unique principal ID" (IAM User Guide, IAM JSON policy elements: Principal), and a
      principal that was deleted is the same article's first cause of the refusal."""
    issues: List[ConfigIssue] = []
    for named in roles:
        role, at = named.role, key_path(NAMESPACE, named.parts)
        home = (role.partition, role.account) == (partition, account_id)
        where = f"account {role.account}" + (f" of partition {role.partition}" if role.partition != partition else "")
        if named.use == ACCESS_ENTRY and not home:
            issues.append(ConfigIssue(at, f"{named.arn} is a role of {where}, and this stack deploys to account "
                                          f"{account_id}: an access entry's role must be one gpu-cloud can read before "
                                          "the cluster exists, and iam:GetRole reads this account's roles only; name a "
                                          f"role of account {account_id} (principals of {role.account} may assume it)"))
            continue
        if named.use == ACCESS_ENTRY and role.path.startswith(SERVICE_LINKED_PATH):
            issues.append(ConfigIssue(at, f"{named.arn} is a service-linked role, which EKS gives no access entry; "
                                          "name a role of your own"))
            continue
        if named.use == TRUSTED and role.partition != partition:
            issues.append(ConfigIssue(at, f"{named.arn} is a role of partition {role.partition}, and this account is "
                                          f"in {partition}: a trust policy names principals of its own partition only; "
                                          f"name a role of partition {partition}"))
            continue
        if not home:
            continue            # another account's publisher: not readable from here, and allowed
        answer = found.get(role.name, "not read")
        refusal = ("EKS refuses the access entry of a role that does not exist, after the cluster is created"
                   if named.use == ACCESS_ENTRY else
                   "IAM refuses the model publisher role's trust policy if it names a role that does not exist")
        if isinstance(answer, str):
            issues.append(ConfigIssue(at, f"{named.arn} could not be read in account {account_id} ({answer}); "
                                          f"{refusal}: create the role first or correct its name, and allow this "
                                          "identity iam:GetRole on it"))
        elif parse_role_arn(answer.arn).path != role.path:
            issues.append(ConfigIssue(at, f"{named.arn}: IAM holds the role {role.name} as {answer.arn}, and an ARN "
                                          f"with another path names no role ({refusal}); write {answer.arn}"))
    return issues


# ----------------------------------------------------------------------------- the inference record's hosted zone

@dataclass(frozen=True)
class FoundZone:
    name: str           # the zone's name, without the trailing dot (as the provider gives it)
    private: bool


def record_zone(spec) -> Optional[str]:
    """The hosted zone the stack writes its half of the inference record to: dr.hostedZoneId, when the stack has a DR
    role and serves Triton (layers.serving makes the record only then); None when it writes none."""
    if spec.dr.role in ("primary", "secondary") and spec.inference.triton.enabled:
        return spec.dr.hosted_zone_id
    return None


def hosted_zone_issues(dr, scheme: str, zone: Union[FoundZone, str]) -> Tuple[List[ConfigIssue], List[str]]:
    """dr.hostedZoneId and dr.domain against the zone Route 53 holds (or why it could not be read), for the record
    components/serving/failover.py makes: a CNAME named dr.domain to Triton's load balancer (scheme: internal or
    internet-facing).

    - The zone must be readable: the record is written into it with the stack's identity.
    - dr.domain must be below the zone's name: Route 53 takes a record only for the zone's name or a name under it
      (ChangeResourceRecordSets answers InvalidChangeBatch "RRSet with DNS name ... is not permitted in zone ...").
    - dr.domain may not be the zone's name: "A CNAME record is not allowed to coexist with any other data" (RFC 1912
      section 2.4), and a zone's apex holds its SOA and NS records (Route 53: "RRSet of type CNAME with DNS name ... is
      not permitted at apex in zone ...").
    - A private zone answers "within one or more VPCs" associated with it (Amazon Route 53 Developer Guide, "Working
      with private hosted zones", docs.aws.amazon.com/Route53/latest/DeveloperGuide/hosted-zones-private.html). Which
      VPCs resolve the name cannot be judged here: the stack's own VPC does not exist before the first up, the clients
      are named by network (dr.clientCidrs), not by VPC, and the provider's zone read returns no associations
      (terraform-provider-aws internal/service/route53/zone_data_source.go sets no VPC from GetHostedZone). So a
      private zone is a warning saying who can resolve the name, not an error."""
    at_zone, at_domain = key_path(NAMESPACE, ("dr", "hostedZoneId")), key_path(NAMESPACE, ("dr", "domain"))
    if isinstance(zone, str):
        return [ConfigIssue(at_zone, f"{dr.hosted_zone_id} could not be read ({zone}); the stack writes its half of "
                                     f"the {dr.domain} record into it with this stack's AWS identity: name a hosted "
                                     "zone of this account, and allow this identity route53:GetHostedZone on it")], []
    domain, name = dr.domain.lower().rstrip("."), zone.name.lower().rstrip(".")
    issues: List[ConfigIssue] = []
    if domain == name:
        issues.append(ConfigIssue(at_domain, f"{dr.domain} is the apex of hosted zone {dr.hosted_zone_id}, and the "
                                             "stack's record is a CNAME to its load balancer, which DNS allows at no "
                                             "apex (RFC 1912 2.4: the apex holds the zone's SOA and NS); use a name "
                                             f"below it, such as infer.{name}"))
    elif not domain.endswith("." + name):
        issues.append(ConfigIssue(at_domain, f"{dr.domain} is not in hosted zone {dr.hosted_zone_id} ({name}), and "
                                             "Route 53 takes records for the zone's own names only; use a name ending "
                                             f"in .{name}, or the zone that holds {dr.domain}"))
    warnings: List[str] = []
    if zone.private and scheme == "internet-facing":
        warnings.append(f"{at_zone}: hosted zone {dr.hosted_zone_id} ({name}) is private, and Triton's load balancer "
                        f"is internet-facing: {dr.domain} resolves only in the VPCs associated with the zone, so "
                        "clients elsewhere reach the load balancer but cannot resolve its name; use a public zone, or "
                        "check that every client resolves through one of those VPCs")
    elif zone.private:
        warnings.append(f"{at_zone}: hosted zone {dr.hosted_zone_id} ({name}) is private: {dr.domain} resolves only "
                        "in the VPCs associated with it (and through Route 53 Resolver endpoints in them); gpu-cloud "
                        "associates none, so check that the inference clients (dr.clientCidrs) resolve through one, "
                        "in both regions: transit gateway peering does not carry a private zone. gpu-cloud expects a "
                        "public zone (docs/network.md, \"The hosted zone is public\")")
    return issues, warnings


def check_account(spec, account) -> List[str]:
    """The stack's quotas and endpoint zones against what the account reported (spec:
    decisions.config.stack.StackSpec, account: decisions.network.zones.AccountZones). Raises ConfigError with every
    refusal; returns the warnings."""
    from decisions.config.errors import ConfigError

    issues, warnings = quota_issues(spec.pools, account.quotas)
    endpoint_problems, endpoint_warnings = endpoint_issues(spec.network.zones, account.names_by_id, spec.region,
                                                           account.endpoint_zones)
    if issues or endpoint_problems:
        raise ConfigError(issues + endpoint_problems, pool_names=[pool.name for pool in spec.pools])
    return warnings + endpoint_warnings
