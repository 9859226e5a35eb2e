"""What the AWS account reports about the stack's zones, their instance offerings and the pools' capacity
reservations: provider reads (invokes), no resources. spec/zones.py checks the stack against the answer
before anything is registered.

The identity running Pulumi needs ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings,
ec2:DescribeCapacityReservations and, for On-Demand Capacity Reservations (read through Cloud Control),
cloudformation:GetResource.
"""
from __future__ import annotations

import json
from typing import Dict, Union

import pulumi_aws as aws

from spec.zones import AccountZones, Reservation

ODCR_TYPE = "AWS::EC2::CapacityReservation"


def read_account(spec) -> AccountZones:
    """Available zones (ID -> name), which of the pools' types each declared zone offers, and each pool's
    reservation (spec: a spec.validate.StackSpec)."""
    available = aws.get_availability_zones(state="available")
    types = sorted({t.name for pool in spec.pools for t in pool.types})
    offered = aws.ec2.get_instance_type_offerings(location_type="availability-zone-id", filters=[
        aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=types),
        aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="location", values=list(spec.network.zones))])
    offerings: Dict[str, set] = {}
    for itype, zone in zip(offered.instance_types, offered.locations):
        offerings.setdefault(zone, set()).add(itype)
    reservations = {pool.spec.capacity_reservation_id: _reservation(pool.spec.capacity_reservation_id,
                                                                    pool.spec.capacity)
                    for pool in spec.pools if pool.spec.reserved_capacity}
    return AccountZones(names_by_id=dict(zip(available.zone_ids, available.names)),
                        offerings={zone: frozenset(found) for zone, found in offerings.items()},
                        reservations=reservations)


def _reservation(reservation_id: str, capacity: str) -> Union[Reservation, str]:
    """The reservation as EC2 describes it, or why it could not be read."""
    try:
        if capacity == "capacity-block":
            block = aws.ec2.get_capacity_block_reservation(id=reservation_id)
            return Reservation(reservation_id, block.availability_zone_id, block.instance_type, block.instance_count,
                               _group_name(block.placement_group_arn))
        found = json.loads(aws.cloudcontrol.get_resource(type_name=ODCR_TYPE, identifier=reservation_id).properties)
        return Reservation(reservation_id, found["AvailabilityZoneId"], found["InstanceType"],
                           int(found["InstanceCount"]), _group_name(found.get("PlacementGroupArn")))
    except Exception as error:  # an invoke error: not found, or not allowed to read it
        return str(error).splitlines()[0] if str(error) else type(error).__name__


def _group_name(arn) -> str | None:
    """arn:aws:ec2:<region>:<account>:placement-group/<name> -> <name>."""
    return arn.rsplit("/", 1)[-1] if arn else None
