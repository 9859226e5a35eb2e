"""Which zones the cluster uses and which zones each pool's nodes launch in: checked against what EKS supports,
what the account has, what each zone offers and what each reservation is. Pure: no Pulumi.

The stack declares its zones by ID (`network.zones`, in subnet order; decisions/network/network_plan.py). Nothing here
re-plans around what the provider reports: a declared zone that is not available, a pin outside the declared
zones, a type a pinned zone does not offer or a reservation that does not match its pool is a config error,
raised before any resource is registered. The only thing the account's answers move is which declared zones
a multi-zone pool launches in: the zones that offer all of its types (a warning names the rest).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from pydantic import Field

from decisions.catalog.catalog import PriceSource
from decisions.catalog.data_files import DataModel, load_model
from decisions.config.errors import ConfigError, ConfigIssue, key_path
from decisions.config.model import NAMESPACE, ZONE_ID
from decisions.network.network_plan import plan_subnets
from decisions.nodes import pods
from decisions.storage import lustre

ZONES_PATH = Path(__file__).with_name("zones.yaml")
ZONES_FILE = "decisions/network/zones.yaml"          # as messages name it: the file to edit
ADD_A_REGION_STEP = 'docs/how-to.md "Add a region", step 2'
# Addresses a private subnet keeps free beyond what the pools' nodes may take: control-plane and VPC
# endpoint interfaces, load balancers, and the CNI's spare addresses while nodes churn.
SUBNET_HEADROOM = 0.2


class RegionZones(DataModel):
    zone_id_prefix: str = Field(alias="zoneIdPrefix")
    eks_unsupported_zone_ids: Tuple[str, ...] = Field(alias="eksUnsupportedZoneIds")
    # Zone IDs where a catalog GPU type is offered (zones.yaml says from where); () where not recorded.
    gpu_zone_ids: Tuple[str, ...] = Field(default=(), alias="gpuZoneIds")


class ZoneFacts(DataModel):
    gpu_zone_ids_source: PriceSource = Field(alias="gpuZoneIdsSource")
    regions: Dict[str, RegionZones]


@lru_cache(maxsize=None)
def load_zone_facts(path: Path = ZONES_PATH) -> ZoneFacts:
    return load_model(path, ZoneFacts)


def is_zone_id(value: str) -> bool:
    return bool(ZONE_ID.match(value))


def recorded_gpu_zones() -> str:
    """What gpuZoneIds are and how old, as a message cites them."""
    return f"{ZONES_FILE} gpuZoneIds (EC2 offerings as of {load_zone_facts().gpu_zone_ids_source.as_of})"


def declarable_gpu_zones(region: Optional[str]) -> Tuple[str, ...]:
    """The region's zone IDs that offer a catalog GPU type and that EKS accepts: the ones to suggest."""
    facts = load_zone_facts().regions.get(region or "")
    return tuple(z for z in facts.gpu_zone_ids if z not in facts.eks_unsupported_zone_ids) if facts else ()


def region_issue(region: str) -> Optional[str]:
    """Why a region the catalog sells GPUs in cannot be checked (aws:region): zones.yaml has no entry for it, or no
    gpuZoneIds. One message for the region, in place of one per zone; the offline plan would have no zones to give."""
    facts = load_zone_facts().regions.get(region)
    if facts is None:
        return (f"{region} has no entry under `regions` of {ZONES_FILE}: add its zoneIdPrefix, eksUnsupportedZoneIds "
                f"and gpuZoneIds ({ADD_A_REGION_STEP})")
    if not facts.gpu_zone_ids:
        return (f"{ZONES_FILE} records no gpuZoneIds for {region}: add the zone IDs where a catalog GPU type is offered "
                f"there, with their source ({ADD_A_REGION_STEP})")
    return None


def static_issues(region: Optional[str], zones: Sequence[str], pins: Sequence[Tuple[int, str]]) -> List[Tuple[tuple, str]]:
    """What the config alone says is wrong with its zones: IDs of another region, zones EKS refuses, and
    pools pinned by ID to a zone the stack does not declare. Pins by name are checked at run time."""
    issues: List[Tuple[tuple, str]] = []
    facts = load_zone_facts().regions.get(region or "")
    foreign = [i for i, zone in enumerate(zones) if facts and not zone.startswith(facts.zone_id_prefix + "-")]
    if foreign:   # one cause (zones of another region, as after moving a stack): one mistake
        issues.append(_foreign_zones_issue(region, facts, zones, foreign))
    for i, zone in enumerate(zones):
        if i not in foreign and facts and zone in facts.eks_unsupported_zone_ids:
            issues.append((("network", "zones", i), f"{zone}: EKS does not accept cluster subnets in this zone ID "
                                                    f"({ZONES_FILE} eksUnsupportedZoneIds); declare another. "
                                                    f"{gpu_zones_hint(region)}"))
    for i, pin in pins:
        if is_zone_id(pin) and pin not in zones:
            issues.append((("nodePools", i, "availabilityZone"), f"{pin} is not one of network.zones "
                                                                 f"({', '.join(zones)}); add it there first"))
    return issues


def gpu_zones_hint(region: Optional[str]) -> str:
    """The zones to declare instead, from the data (a hint, not a rule: the account decides what is available)."""
    offered = declarable_gpu_zones(region)
    if not offered:
        return f"{ZONES_FILE} records no gpuZoneIds for {region} ({ADD_A_REGION_STEP})"
    return f"Zones of {region} that offer a catalog GPU type, as {recorded_gpu_zones()} records them: {', '.join(offered)}"


def _foreign_zones_issue(region: str, facts: RegionZones, zones: Sequence[str],
                         foreign: Sequence[int]) -> Tuple[tuple, str]:
    """Zone IDs of another region: one mistake naming each and its region, keyed by the zone if there is one."""
    owners = {f.zone_id_prefix: name for name, f in load_zone_facts().regions.items()}
    by_owner: Dict[Optional[str], List[str]] = {}     # the region each ID is of (None: no region recorded has it)
    for i in foreign:
        by_owner.setdefault(owners.get(zones[i].rsplit("-az", 1)[0]), []).append(zones[i])
    listed = ", ".join(", ".join(ids) + (f" ({owner})" if owner else "") for owner, ids in by_owner.items())
    at = ("network", "zones", foreign[0]) if len(foreign) == 1 else ("network", "zones")
    verb = "is not a zone ID" if len(foreign) == 1 else "are not zone IDs"
    return at, (f"{listed} {verb} of {region}, whose zone IDs start {facts.zone_id_prefix}-. "
                f"{gpu_zones_hint(region)}")


@dataclass(frozen=True)
class Reservation:
    """A capacity reservation or capacity block as EC2 describes it."""
    id: str
    zone_id: str
    instance_type: str
    instance_count: int                       # what EC2 bills, whether instances run or not
    placement_group: Optional[str] = None     # name of the cluster placement group it was created in
    # RFC 3339, as EC2 reports them (DescribeCapacityReservations StartDate/EndDate): a capacity block's term,
    # paid upfront for its whole length; an On-Demand Capacity Reservation has an end only when one was set.
    start_date: Optional[str] = None
    end_date: Optional[str] = None


def reservation_table(reservations: Mapping[str, Union["Reservation", str]]) -> Dict[str, object]:
    """Each reservation as read (the stack output `reservations`, which the plan's cost section prices), or why it
    could not be read."""
    return {rid: found if isinstance(found, str) else {
        "zoneId": found.zone_id, "instanceType": found.instance_type, "instanceCount": found.instance_count,
        "placementGroup": found.placement_group, "startDate": found.start_date, "endDate": found.end_date}
        for rid, found in sorted(reservations.items())}


def reservations_from_table(table: Mapping[str, object]) -> Dict[str, Union["Reservation", str]]:
    """reservation_table's inverse (the engine hands whole numbers back as floats)."""
    return {rid: row if isinstance(row, str) else Reservation(
        rid, row["zoneId"], row["instanceType"], int(row["instanceCount"]), row.get("placementGroup"),
        start_date=row.get("startDate"), end_date=row.get("endDate")) for rid, row in (table or {}).items()}


@dataclass(frozen=True)
class AccountZones:
    """What the account reports at run time (decisions/network/zones.py only checks against it)."""
    names_by_id: Mapping[str, str]                        # available zones: ID -> this account's name
    offerings: Mapping[str, FrozenSet[str]]               # zone ID -> instance types offered there
    reservations: Mapping[str, Union[Reservation, str]]   # reservation id -> what it is, or why it could not be read
    # decisions/config/preflight.py checks these: EC2 vCPU quota code -> its value, and interface endpoint service
    # (ecr.api, ...) -> the zone names it is offered in; either one's value is why it could not be read, if it could
    # not.
    quotas: Mapping[str, Union[float, str]] = field(default_factory=dict)
    endpoint_zones: Mapping[str, Union[FrozenSet[str], str]] = field(default_factory=dict)
    # None: an AWS account answered. Otherwise what the answers were built from, as messages name it (the offline
    # plan reads no account: plan/engine.py offline_account), so a refusal never blames "this account" for the data.
    source: Optional[str] = None

    def zone_id(self, name_or_id: str) -> Optional[str]:
        if is_zone_id(name_or_id):
            return name_or_id if name_or_id in self.names_by_id else None
        return next((zone for zone, name in self.names_by_id.items() if name == name_or_id), None)


@dataclass(frozen=True)
class ZoneLayout:
    zones: Tuple[str, ...]                                # zone IDs, in subnet order
    names: Mapping[str, str]                              # zone ID -> name in this account
    pool_zones: Mapping[str, Tuple[str, ...]]             # pool -> zone IDs its nodes launch in
    warnings: Tuple[str, ...] = field(default=())


def resolve_layout(spec, account: AccountZones) -> ZoneLayout:
    """Check the stack's zones and pools against the account; return where everything goes, or raise
    ConfigError with every mistake (spec: a decisions.config.stack.StackSpec)."""
    zones = spec.network.zones
    issues: List[ConfigIssue] = []
    warnings: List[str] = []

    def issue(parts, message):
        issues.append(ConfigIssue(key_path(NAMESPACE, parts), message))

    # A declared zone the account lacks is one mistake: the pools, their pins and reservations are judged in the
    # zones it has, so nothing else is refused for that zone alone.
    available = [zone for zone in zones if zone in account.names_by_id]
    for i, zone in enumerate(zones):
        if zone not in account.names_by_id:
            issue(("network", "zones", i), _unavailable_zone(zone, spec.region, account))
    pool_zones: Dict[str, Tuple[str, ...]] = {}
    for i, pool in enumerate(spec.pools):
        types = [t.name for t in pool.types]
        pin = pool.spec.availability_zone
        if pin:
            zone = account.zone_id(pin)
            if zone is None and pin in zones:
                continue     # the pinned zone is declared but not available: refused above
            if zone is None or zone not in zones:
                declared = ", ".join(f"{z} ({account.names_by_id.get(z, '?')})" for z in zones)
                issue(("nodePools", i, "availabilityZone"), f"{pin} is not one of network.zones ({declared})")
                continue
            missing = [t for t in types if t not in account.offerings.get(zone, frozenset())]
            if missing:
                issue(("nodePools", i, "instanceTypes"), f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not offered in {zone} "
                                                         f"({account.names_by_id[zone]}), the pool's zone")
                continue
            pool_zones[pool.name] = (zone,)
        else:
            offered = tuple(z for z in available if all(t in account.offerings.get(z, frozenset()) for t in types))
            if not offered:
                if available:    # with none available, the zones are the mistake, refused above
                    issue(("nodePools", i, "instanceTypes"), f"{', '.join(types)}: no zone of network.zones offers "
                                                             f"{'them all' if len(types) > 1 else 'it'}")
                continue
            skipped = [z for z in available if z not in offered]
            if skipped:
                warnings.append(f"gpu-cloud:nodePools[{i}]: {pool.name} launches only in {', '.join(offered)}; "
                                f"{', '.join(skipped)} do not offer {', '.join(types)}")
            pool_zones[pool.name] = offered
        if pool.spec.reserved_capacity:
            issues.extend(_reservation_issues(i, pool, account, pool_zones[pool.name][0]))
        elif pool.spec.placement_group and not pool.efa:
            issue(("nodePools", i, "placementGroup"), "a placement group is only used by EFA pools")
    if not issues:
        pool_zones = lustre.in_file_system_zone(spec, pool_zones)
        issues.extend(_capacity_issues(spec, pool_zones))
    if issues:
        raise ConfigError(issues, pool_names=[pool.name for pool in spec.pools])
    return ZoneLayout(zones=tuple(zones), names={z: account.names_by_id[z] for z in zones},
                      pool_zones=pool_zones, warnings=tuple(warnings))


def _reservation_issues(i: int, pool, account: AccountZones, zone: str) -> List[ConfigIssue]:
    at = ("nodePools", i)
    rid = pool.spec.capacity_reservation_id
    found = account.reservations.get(rid, "not read")
    if isinstance(found, str):
        return [ConfigIssue(key_path(NAMESPACE, at + ("capacityReservationId",)),
                            f"{rid} could not be read in this account and region: {found}")]
    problems = []
    if found.zone_id != zone:
        problems.append((at + ("availabilityZone",), f"the pool's zone is {zone}, but {rid} is in {found.zone_id} "
                                                     f"({account.names_by_id.get(found.zone_id, '?')})"))
    if found.instance_type != pool.primary_type.name:
        problems.append((at + ("instanceTypes",), f"{rid} reserves {found.instance_type}, not {pool.primary_type.name}"))
    if pool.spec.max_nodes > found.instance_count:
        problems.append((at + ("maxNodes",), f"{pool.spec.max_nodes} is more than the {found.instance_count} instances "
                                             f"{rid} holds"))
    if found.placement_group != pool.spec.placement_group:
        problems.append((at + ("placementGroup",), f"{rid} was made in placement group {found.placement_group}: set "
                                                   f"placementGroup: {found.placement_group}" if found.placement_group
                         else f"{rid} is in no placement group; leave placementGroup out"))
    return [ConfigIssue(key_path(NAMESPACE, parts), message) for parts, message in problems]


def zone_demand(spec, pool_zones: Mapping[str, Tuple[str, ...]]) -> Dict[str, Dict[str, int]]:
    """Addresses each pool's nodes may take in each zone, at maxNodes all in that zone (an ASG may put them
    all in one zone when the others have no capacity). The system node group counts in every zone."""
    demand: Dict[str, Dict[str, int]] = {zone: {} for zone in spec.network.zones}
    for pool in spec.pools:
        per_node = pods.pool_addresses_per_node(pool.types, efa=pool.efa)
        for zone in pool_zones.get(pool.name, ()):
            demand[zone][pool.name] = pool.spec.max_nodes * per_node
    for zone in demand:
        demand[zone]["system nodes"] = pods.SYSTEM_NODES_MAX * pods.system_addresses_per_node()
    return demand


def zone_table(spec, layout: ZoneLayout) -> List[Dict[str, object]]:
    """Per declared zone, in subnet order: its name in this account, its subnets, the pools that launch there
    and the addresses they may take at maxNodes (the stack output `zones`, and the plan's network table)."""
    plan = plan_subnets(spec.network.cidr, layout.zones)
    demand = zone_demand(spec, layout.pool_zones)
    return [{"zoneId": zone, "zoneName": layout.names.get(zone), "privateSubnet": plan.private[zone],
             "publicSubnet": plan.public[zone], "usableAddresses": plan.usable_private(zone),
             "pools": [name for name in demand[zone] if name in layout.pool_zones],
             "addressesAtMax": sum(demand[zone].values())} for zone in layout.zones]


def _capacity_issues(spec, pool_zones) -> List[ConfigIssue]:
    plan = plan_subnets(spec.network.cidr, spec.network.zones)
    issues = []
    for zone, needs in zone_demand(spec, pool_zones).items():
        total, usable = sum(needs.values()), plan.usable_private(zone)
        if total * (1 + SUBNET_HEADROOM) > usable:
            detail = ", ".join(f"{name} {n}" for name, n in sorted(needs.items(), key=lambda kv: -kv[1]))
            issues.append(ConfigIssue(key_path(NAMESPACE, ("network", "cidr")),
                                      f"the private subnet of {zone} ({plan.private[zone]}, {usable} usable addresses) "
                                      f"cannot hold {total} addresses plus {SUBNET_HEADROOM:.0%} headroom at maxNodes "
                                      f"({detail}); use a larger cidr or lower maxNodes"))
    return issues


def _unavailable_zone(zone: str, region: str, account: AccountZones) -> str:
    """Why a declared zone is refused, worded by who answered: an account names its zones; the offline plan's
    account is the data, so the data is what to fix (or the zone to change)."""
    if account.source is None:
        return (f"{zone} is not an available zone of {region} in this account; available: "
                f"{_describe(account.names_by_id)}. {gpu_zones_hint(region)}")
    offered = [z for z in declarable_gpu_zones(region) if z in account.names_by_id] or sorted(account.names_by_id)
    return (f"{zone} is not among the zones of {region} that offer a catalog GPU type, as {account.source} records "
            f"them (the offline plan reads no account); offered: {', '.join(offered) or 'none'}. Declare one of those, "
            f"or, if EC2 offers a catalog type in {zone} now (aws ec2 describe-instance-type-offerings --location-type "
            f"availability-zone-id --region {region}), add {zone} to gpuZoneIds in {ZONES_FILE} with its source "
            f"({ADD_A_REGION_STEP})")


def _describe(names_by_id: Mapping[str, str]) -> str:
    return ", ".join(f"{zone} ({name})" for zone, name in sorted(names_by_id.items())) or "none"
