"""What the AWS account reports before anything is registered: the stack's zones, their instance offerings,
the pools' capacity reservations, the transit gateway, and who is running Pulumi. Provider reads (invokes)
through the stack's own AWS provider, no resources; decisions/ checks the stack against the answers.

The identity running Pulumi needs ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings,
ec2:DescribeCapacityReservations, ec2:DescribeTransitGateways, iam:GetRole (the session context) and, for
On-Demand Capacity Reservations (read through Cloud Control), cloudformation:GetResource; for the preflight
(decisions/config/preflight.py), servicequotas:GetServiceQuota and ec2:DescribeVpcEndpointServices, iam:GetRole on
every role of this account the stack names (read_named), and, where the stack writes its inference record,
route53:GetHostedZone and route53:ListTagsForResource on dr.hostedZoneId (the provider's zone read makes both, and
for a private zone route53:ListResourceRecordSets too: terraform-provider-aws
internal/service/route53/zone_data_source.go).
"""
from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Dict, FrozenSet, List, Optional, Union

import pulumi
import pulumi_aws as aws

from components.network import INTERFACE_ENDPOINTS
from decisions.config.deployer import deployer_principal
from decisions.config.errors import ConfigError, ConfigIssue
from decisions.config import preflight
from decisions.config.preflight import QUOTA_SERVICE, quota_demand
from decisions.network.zones import AccountZones, Reservation

ODCR_TYPE = "AWS::EC2::CapacityReservation"
# What answers the reads when no AWS account does: the offline plan (plan/engine.py run_program) sets it to the data
# its mock account is built from, which AccountZones.source carries into the messages. None: an account answers.
ANSWERED_FROM: ContextVar[Optional[str]] = ContextVar("answered_from", default=None)


def read_account(spec, opts: pulumi.InvokeOptions) -> AccountZones:
    """Available zones (ID -> name), which of the pools' types each declared zone offers, and each pool's
    reservation (spec: a decisions.config.validate.StackSpec). Raises ConfigError if the transit gateway is not
    there."""
    available = aws.get_availability_zones(state="available", opts=opts)
    types = sorted({t.name for pool in spec.pools for t in pool.types})
    offered = aws.ec2.get_instance_type_offerings(location_type="availability-zone-id", filters=[
        aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=types),
        aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="location", values=list(spec.network.zones))], opts=opts)
    offerings: Dict[str, set] = {}
    for itype, zone in zip(offered.instance_types, offered.locations):
        offerings.setdefault(zone, set()).add(itype)
    reservations = {pool.spec.capacity_reservation_id: _reservation(pool.spec.capacity_reservation_id,
                                                                    pool.spec.capacity, opts)
                    for pool in spec.pools if pool.spec.reserved_capacity}
    tgw = spec.network.transit_gateway
    if tgw:
        try:
            aws.ec2transitgateway.get_transit_gateway(id=tgw.id, opts=opts)
        except Exception as error:  # an invoke error: not found, not shared with this account, or not allowed
            raise ConfigError([ConfigIssue("gpu-cloud:network.transitGateway.id",
                                           f"{tgw.id} could not be read in this account and region: {_first_line(error)}")])
    # The preflight: the vCPU quotas the pools draw on, and where each interface endpoint service is offered.
    quotas = {code: _quota(code, opts) for code in quota_demand(spec.pools)}
    prefix = aws.get_partition(opts=opts).reverse_dns_prefix
    endpoint_zones = {service: _endpoint_zones(f"{prefix}.{spec.region}.{service}", opts)
                      for service in INTERFACE_ENDPOINTS.values()}
    return AccountZones(names_by_id=dict(zip(available.zone_ids, available.names)),
                        offerings={zone: frozenset(found) for zone, found in offerings.items()},
                        reservations=reservations, quotas=quotas, endpoint_zones=endpoint_zones,
                        source=ANSWERED_FROM.get())


def read_deployer(opts: pulumi.InvokeOptions) -> str:
    """The IAM principal Pulumi runs as (an assumed role's role, with its path), for its access entry."""
    caller = aws.get_caller_identity(opts=opts).arn
    issuer = aws.iam.get_session_context(arn=caller, opts=opts).issuer_arn if ":assumed-role/" in caller else None
    return deployer_principal(caller, issuer)


def read_named(spec, account_id: str, partition: str, opts: pulumi.InvokeOptions) -> List[str]:
    """Every IAM role the stack names, read where it can be (this account's: iam:GetRole), and the hosted zone of its
    inference record (route53:GetHostedZone), checked by decisions/config/preflight.py against the account the stack
    deploys to (`account_id`, `partition`: the stack's caller identity). Raises ConfigError with every problem; returns
    the warnings."""
    roles = preflight.named_roles(spec)
    found = {name: _role(name, opts) for name in preflight.roles_to_read(roles, account_id, partition)}
    issues = preflight.role_issues(roles, account_id, partition, found)
    warnings: List[str] = []
    zone_id = preflight.record_zone(spec)
    if zone_id:
        zone_issues, warnings = preflight.hosted_zone_issues(spec.dr, spec.inference.triton.scheme,
                                                             _hosted_zone(zone_id, opts))
        issues += zone_issues
    if issues:
        raise ConfigError(issues)
    return warnings


def _role(name: str, opts: pulumi.InvokeOptions) -> Union[preflight.FoundRole, str]:
    """The role as IAM holds it (its ARN carries its path), or why it could not be read. GetRole takes the name alone:
    a path is not part of it."""
    try:
        return preflight.FoundRole(arn=aws.iam.get_role(name=name, opts=opts).arn)
    except Exception as error:  # an invoke error: NoSuchEntity, or not allowed (iam:GetRole)
        return _first_line(error)


def _hosted_zone(zone_id: str, opts: pulumi.InvokeOptions) -> Union[preflight.FoundZone, str]:
    """The hosted zone's name and whether it is private, or why it could not be read."""
    try:
        zone = aws.route53.get_zone(zone_id=zone_id, opts=opts)
        return preflight.FoundZone(name=zone.name, private=bool(zone.private_zone))
    except Exception as error:  # an invoke error: NoSuchHostedZone (another account's included), or not allowed
        return _first_line(error)


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _reservation(reservation_id: str, capacity: str, opts: pulumi.InvokeOptions) -> Union[Reservation, str]:
    """The reservation as EC2 describes it, or why it could not be read."""
    try:
        if capacity == "capacity-block":
            block = aws.ec2.get_capacity_block_reservation(id=reservation_id, opts=opts)
            # start_date/end_date: the block's term (RFC 3339), which its upfront price covers (decisions/cost/cost.py)
            return Reservation(reservation_id, block.availability_zone_id, block.instance_type, block.instance_count,
                               _group_name(block.placement_group_arn), start_date=block.start_date,
                               end_date=block.end_date)
        found = json.loads(aws.cloudcontrol.get_resource(type_name=ODCR_TYPE, identifier=reservation_id,
                                                         opts=opts).properties)
        # InstanceCount: the size EC2 bills whether instances run or not (decisions/cost/cost.py prices the pool at it);
        # EndDate only when the reservation was given one (EndDateType limited).
        return Reservation(reservation_id, found["AvailabilityZoneId"], found["InstanceType"],
                           int(found["InstanceCount"]), _group_name(found.get("PlacementGroupArn")),
                           start_date=found.get("StartDate"), end_date=found.get("EndDate"))
    except Exception as error:  # an invoke error: not found, or not allowed to read it
        return _first_line(error)


def _quota(code: str, opts: pulumi.InvokeOptions) -> Union[float, str]:
    """The quota's current value in this account and region (the provider's `value`), or why it could not be read."""
    try:
        return float(aws.servicequotas.get_service_quota(service_code=QUOTA_SERVICE, quota_code=code, opts=opts).value)
    except Exception as error:  # an invoke error: not allowed (servicequotas:GetServiceQuota), or no such quota
        return _first_line(error)


def _endpoint_zones(service_name: str, opts: pulumi.InvokeOptions) -> Union[FrozenSet[str], str]:
    """The zone names an interface endpoint service is offered in, or why that could not be read."""
    try:
        found = aws.ec2.get_vpc_endpoint_service(service_name=service_name, service_type="Interface", opts=opts)
        return frozenset(found.availability_zones)
    except Exception as error:  # an invoke error: not offered in this region, or not allowed
        return _first_line(error)


def _group_name(arn) -> str | None:
    """arn:aws:ec2:<region>:<account>:placement-group/<name> -> <name>."""
    return arn.rsplit("/", 1)[-1] if arn else None
