"""decisions/nodes/capacity_blocks.py and components/nodes/capacity_blocks.py: when a capacity block closes, which
blocks the controller watches and with what end, the expiry warning's rule and queue, and what a stack with a block
deploys (the stack files ship none, so a prod-us-east-1 whose reserved pool is a block stands in for one).

jobs/block_expiry.py, which acts on all of it, is tests/test_block_expiry.py's."""
from __future__ import annotations

import copy
import json

import pytest
from moto.events.models import EventPattern

from components.nodes.capacity_blocks import CapacityBlockExpiry, CapacityBlockExpiryArgs
from decisions.nodes import capacity_blocks, drain, repair
from decisions.nodes.capacity_blocks import Block
from decisions.network.zones import Reservation
from decisions.platform import kueue
from plan.engine import ACCOUNT_ID, OFFLINE_BLOCK_END
from plan.stackfile import load_stack
from tests.conftest import run_component, run_stack, stack_config
from tests.test_block_expiry import warning

RID, OTHER_RID = "cr-0a1b2c3d4e5f60718", "cr-0bbbbbbbbbbbbbbbb"
BLOCK = Block("train-h100", "train-h100", RID, capacity_blocks.unix_time("2027-01-18T11:30:00Z"))
QUEUE_TYPE, RULE_TYPE = "aws:sqs/queue:Queue", "aws:cloudwatch/eventRule:EventRule"
POLICY_TYPE, TARGET_TYPE = "aws:sqs/queuePolicy:QueuePolicy", "aws:cloudwatch/eventTarget:EventTarget"


# --- the timeline -----------------------------------------------------------------------------------------------------

def test_a_block_closes_45_minutes_before_its_end_with_room_for_the_longest_checkpoint():
    """EC2 terminates from 30 minutes before the end; the drain before that has the termination hook's 900 s, which
    holds the workload contract's longest grace (780 s) and its delivery, and the controller's pass that sees it."""
    assert capacity_blocks.CLOSE_BEFORE_END_S == 45 * 60
    room = capacity_blocks.CLOSE_BEFORE_END_S - capacity_blocks.EC2_TERMINATION_LEAD_S
    assert room >= repair.INTERVAL_S + drain.WORKLOAD_MAX_GRACE_S + drain.DRAIN_DELIVERY_MARGIN_S
    # It closes before EC2's warning (40 minutes before the end), which is the backstop, not the trigger.
    assert capacity_blocks.CLOSE_BEFORE_END_S > capacity_blocks.EXPIRY_WARNING_LEAD_S
    assert BLOCK.closes_at == capacity_blocks.unix_time("2027-01-18T10:45:00Z")


@pytest.mark.parametrize("text, seconds", [
    ("2027-01-18T11:30:00Z", 1800271800),
    ("2027-01-18T11:30:00.000Z", 1800271800),
    ("2027-01-18T12:30:00+01:00", 1800271800),
])
def test_an_end_date_as_ec2_writes_it(text, seconds):
    """The Unix time of 2027-01-18 11:30 UTC, as `date -u -d 2027-01-18T11:30:00Z +%s` gives it."""
    assert capacity_blocks.unix_time(text) == seconds


# --- which blocks -----------------------------------------------------------------------------------------------------

def _as_block(spec, pool_name="train-h100"):
    """prod-us-east-1's pools with `pool_name` a capacity block on RID."""
    pools = []
    for pool in spec.pools:
        if pool.name == pool_name:
            pool = type(pool)(spec=pool.spec.model_copy(update={"capacity": "capacity-block",
                                                                 "capacity_reservation_id": RID}),
                              types=pool.types, efa=pool.efa)
        pools.append(pool)
    return pools


def test_the_blocks_are_the_capacity_block_pools_with_their_reservations_end():
    spec = load_stack("prod-us-east-1")[1]
    read = {RID: Reservation(RID, "use1-az4", "p5.48xlarge", 4, None, "2027-01-04T11:30:00Z", "2027-01-18T11:30:00Z")}
    assert capacity_blocks.blocks(_as_block(spec), read) == (BLOCK,)
    assert capacity_blocks.blocks(spec.pools, read) == ()          # reserved is no block
    with pytest.raises(ValueError, match="pool train-h100: capacity block cr-0a1b2c3d4e5f60718 has no EndDate"):
        capacity_blocks.blocks(_as_block(spec), {RID: Reservation(RID, "use1-az4", "p5.48xlarge", 4)})


def test_what_the_controller_gets_for_a_block_and_nothing_without_one():
    none = capacity_blocks.controller_additions((), cluster_name="gpu-cloud-prod", region="us-east-1",
                                                partition="aws", account_id="123456789012", dns_suffix="amazonaws.com")
    assert (none.config, none.iam_statements, none.cluster_rules) == ({}, (), ())
    found = capacity_blocks.controller_additions((BLOCK,), cluster_name="gpu-cloud-prod", region="cn-north-1",
                                                 partition="aws-cn", account_id="123456789012",
                                                 dns_suffix="amazonaws.com.cn")
    assert found.config["capacityBlocks"] == {"train-h100": {"flavor": "train-h100", "reservationId": RID,
                                                             "endsAt": BLOCK.ends_at}}
    assert found.config["capacityBlockCloseBeforeEndSeconds"] == 2700
    assert found.config["capacityBlockQueueUrl"] == \
        "https://sqs.cn-north-1.amazonaws.com.cn/123456789012/gpu-cloud-prod-capacity-block-expiry"
    # Only the warnings' queue, only to read and delete.
    assert found.iam_statements == ({"Sid": "ReadCapacityBlockExpiryWarnings", "Effect": "Allow",
                                     "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                                     "Resource": "arn:aws-cn:sqs:cn-north-1:123456789012:"
                                                 "gpu-cloud-prod-capacity-block-expiry"},)
    # Workloads read, their and the check's status written; nothing else of Kueue's.
    assert {(group, resource, verb) for rule in found.cluster_rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]} == {
        ("kueue.x-k8s.io", "workloads", "get"), ("kueue.x-k8s.io", "workloads", "list"),
        ("kueue.x-k8s.io", "admissionchecks", "get"), ("kueue.x-k8s.io", "admissionchecks", "list"),
        ("kueue.x-k8s.io", "workloads/status", "patch"), ("kueue.x-k8s.io", "admissionchecks/status", "patch")}


# --- the expiry warning's rule ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("event, matched", [
    (warning(RID), True),
    (warning(RID, detail_type="Capacity Block Expiration Warning"), True),     # the guide's other spelling
    (warning(OTHER_RID), False),                                               # another stack's block
    (warning(RID, detail_type="Capacity Block Reservation Delivered"), False),
    (warning(RID, detail_type="EC2 Capacity Reservation Instance Interruption Warning"), False),
])
def test_the_rule_matches_the_expiry_warning_of_this_stacks_blocks_only(event, matched):
    """Held against moto's EventBridge pattern matcher (moto.events.models.EventPattern)."""
    pattern = EventPattern.load(json.dumps(capacity_blocks.expiry_warning_pattern((BLOCK,))))
    assert pattern.matches_event(json.loads(event)) == matched


def test_no_block_no_rule():
    with pytest.raises(ValueError, match="no capacity block"):
        capacity_blocks.expiry_warning_pattern(())


@pytest.fixture(scope="module")
def expiry():
    def build():
        CapacityBlockExpiry("capacity-block-expiry", CapacityBlockExpiryArgs(cluster_name_plain="gpu-cloud-prod",
                                                                              blocks=(BLOCK,)))
    return run_component(build)


def test_the_queue_keeps_a_warning_past_its_blocks_end_and_only_the_rule_writes_to_it(expiry):
    queue, rule = expiry.one(QUEUE_TYPE), expiry.one(RULE_TYPE)
    assert queue.inputs["name"] == "gpu-cloud-prod-capacity-block-expiry"
    assert queue.inputs["messageRetentionSeconds"] >= capacity_blocks.EXPIRY_WARNING_LEAD_S
    assert queue.inputs["sqsManagedSseEnabled"] is True
    assert json.loads(rule.inputs["eventPattern"]) == capacity_blocks.expiry_warning_pattern((BLOCK,))
    policy = json.loads(expiry.one(POLICY_TYPE).inputs["policy"])
    allow, deny = policy["Statement"]
    assert allow["Principal"] == {"Service": "events.amazonaws.com"} and allow["Action"] == "sqs:SendMessage"
    assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": [rule.state["arn"]]}}
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    target = expiry.one(TARGET_TYPE)
    assert target.inputs["arn"] == queue.state["arn"]
    assert expiry.one(POLICY_TYPE).urn in target.dependencies


def test_every_child_is_parented_under_the_component_with_its_prefix(expiry):
    component = expiry.one("gpu-cloud:capacity_blocks:CapacityBlockExpiry")
    children = expiry.children_of(component.urn)
    assert sorted(c.type for c in children) == sorted([QUEUE_TYPE, RULE_TYPE, POLICY_TYPE, TARGET_TYPE])
    assert all(c.name.startswith("capacity-block-expiry-") for c in children)


# --- a stack with a block ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def block_stack():
    pools = copy.deepcopy(stack_config("prod-us-east-1")["gpu-cloud:nodePools"])
    pools[0]["capacity"] = "capacity-block"               # train-h100, on the offline account's block
    return run_stack("prod-us-east-1", {"gpu-cloud:nodePools": pools})


def test_a_stack_with_a_block_deploys_its_warning_its_check_and_the_controllers_part(block_stack):
    rule = block_stack.one(RULE_TYPE, "capacity-block-expiry-rule")
    assert json.loads(rule.inputs["eventPattern"])["detail"] == {"capacity-reservation-id": [RID]}
    configmap = next(c for c in block_stack.of_type("kubernetes:core/v1:ConfigMap")
                     if c.inputs["metadata"]["name"] == repair.NAME)
    assert configmap.inputs["data"]["block_expiry.py"] == repair.program_files()["block_expiry.py"]
    config = json.loads(configmap.inputs["data"][repair.CONFIG_KEY])
    # The end as the offline account's block gives it, through the program's own read.
    assert config["capacityBlocks"] == {"train-h100": {"flavor": "train-h100", "reservationId": RID,
                                                       "endsAt": capacity_blocks.unix_time(OFFLINE_BLOCK_END)}}
    queue_name = block_stack.one(QUEUE_TYPE, "capacity-block-expiry-queue").inputs["name"]
    # The URL the controller reads is the queue the stack made (the mock account's id).
    assert config["capacityBlockQueueUrl"] == f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT_ID}/{queue_name}"
    role_policies = [json.loads(p.inputs["policy"]) for p in block_stack.of_type("aws:iam/rolePolicy:RolePolicy")]
    assert any(s.get("Sid") == "ReadCapacityBlockExpiryWarnings" for p in role_policies for s in p["Statement"])
    check = block_stack.one("kubernetes:kueue.x-k8s.io/v1beta2:AdmissionCheck")
    assert check.inputs["spec"] == {"controllerName": capacity_blocks.CONTROLLER_NAME}
    queue = block_stack.one("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
    assert queue.inputs["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": kueue.ADMISSION_CHECK, "onFlavors": ["train-h100"]}]}


def test_the_shipped_stacks_have_no_block_and_deploy_none_of_it(stack_runs):
    for stack, run in stack_runs.items():
        assert not run.of_type("gpu-cloud:capacity_blocks:CapacityBlockExpiry"), stack
        assert not run.of_type("kubernetes:kueue.x-k8s.io/v1beta2:AdmissionCheck"), stack
