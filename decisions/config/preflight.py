"""What AWS would refuse on the first `pulumi up`, found before anything is registered. Pure: no Pulumi.

Three limits the stack's config alone does not show:

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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from decisions.config.errors import ConfigIssue, key_path
from decisions.config.model import NAMESPACE
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
    """Per quota code, the vCPUs the stack's pools need (pools: decisions.config.validate.ResolvedPool, in config
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
            name = names_by_id.get(zone, zone)
            if name not in where:
                issues.append(ConfigIssue(key_path(NAMESPACE, ("network", "zones", i)),
                                          f"{zone} ({name}): the interface endpoint service {service} is not offered "
                                          f"there (it is in {', '.join(sorted(where)) or 'no zone'} of {region}); the "
                                          "stack puts it in every private subnet, so declare another zone"))
    return issues, warnings


def asg_tags(pool, cluster_name: str, resource_tags: Mapping[str, str]) -> Dict[str, str]:
    """Every tag a GPU pool's Auto Scaling group carries (components/nodes/nodepool.py tags it with exactly these): the
    stack's tags, its Name, the drain handler's and the cluster's tags, and cluster-autoscaler's discovery and
    node-template tags (one per label, taint and extended resource)."""
    return {**resource_tags, "Name": pool_rules.asg_name(cluster_name, pool.name), NTH_MANAGED_TAG: "true",
            **pool_rules.cluster_ownership_tag(cluster_name), **pool_rules.autoscaler_tags(pool, cluster_name)}


def asg_tag_issues(pools: Sequence[Tuple[int, object]], cluster_name: str,
                   resource_tags: Mapping[str, str]) -> List[Tuple[tuple, str]]:
    """Pools whose group would carry more than ASG_TAGS_MAX tags (pools: (index, ResolvedPool))."""
    problems = []
    for i, pool in pools:
        tags = asg_tags(pool, cluster_name, resource_tags)
        if len(tags) > ASG_TAGS_MAX:
            own = len(pool.spec.labels) + len(pool.spec.taints)
            problems.append((("nodePools", i), f"its Auto Scaling group would carry {len(tags)} tags, over the "
                             f"{ASG_TAGS_MAX} AWS allows per group: {len(resource_tags)} stack tags, {own} from its "
                             f"labels and taints (one cluster-autoscaler node-template tag each) and "
                             f"{len(tags) - len(resource_tags) - own} of gpu-cloud's own; remove {len(tags) - ASG_TAGS_MAX} of "
                             "its labels, taints or the stack's tags"))
    return problems


def check_account(spec, account) -> List[str]:
    """The stack's quotas and endpoint zones against what the account reported (spec:
    decisions.config.validate.StackSpec, account: decisions.network.zones.AccountZones). Raises ConfigError with every
    refusal; returns the warnings."""
    from decisions.config.errors import ConfigError

    issues, warnings = quota_issues(spec.pools, account.quotas)
    endpoint_problems, endpoint_warnings = endpoint_issues(spec.network.zones, account.names_by_id, spec.region,
                                                           account.endpoint_zones)
    if issues or endpoint_problems:
        raise ConfigError(issues + endpoint_problems, pool_names=[pool.name for pool in spec.pools])
    return warnings + endpoint_warnings
