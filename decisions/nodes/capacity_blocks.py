"""Capacity blocks end on a date: what the stack does before EC2 takes the instances back. Pure: no Pulumi.
components/nodes/capacity_blocks.py turns the expiry warning's rule and queue into resources, decisions/platform/
kueue.py puts the admission check on the blocks' flavors, and the repair controller (jobs/block_expiry.py) does the
rest on every pass.

EC2 starts terminating a block's instances 30 minutes before its end, and sends the EventBridge event "Capacity Block
Reservation Expiration Warning" 10 minutes before that, 40 minutes before the end (EC2 User Guide, "Monitor Capacity
Blocks using EventBridge", docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html; the page's
Markdown copy spells the same event "Capacity Block Expiration Warning", so the rule matches both spellings).

The timeline of a block, from its end date (the reservation's EndDate, read by `pulumi up`):
- until CLOSE_BEFORE_END_S before the end it is open: the training queue admits a job to its flavor only if the job
  declares a maximum run time (the label MAX_RUN_TIME_LABEL, `python -m jobs ... --max-run-time`) that ends by then.
  A job that declares none is admitted while the block is open and drained when it closes.
- at CLOSE_BEFORE_END_S before the end (45 minutes) it closes: its flavor admits nothing more and its nodes are
  cordoned and drained. That leaves the drain the termination hook's budget (decisions/nodes/drain.py
  LIFECYCLE_DRAIN_TIMEOUT_S, 900 s), which holds the workload contract's longest grace for a checkpoint (780 s) and
  its delivery, before EC2's 30-minute mark.
- the expiry warning (40 minutes before the end) is the backstop: the controller closes the block it names at once,
  from the end date the event carries, should the one it was given be wrong or its pass late.
- from 30 minutes before the end EC2 terminates the instances; the block's nodes go.

Why an admission check: the decision must hold when Kueue admits the job, not when it was written, and only Kueue's
admission checks are asked then. Kueue runs a check on the workloads whose quota it reserved on the flavors the
ClusterQueue names for it (kubernetes-sigs/kueue v0.19.2 pkg/workload/workload.go lines 1475-1508,
pkg/util/admissioncheck/admissioncheck.go lines 168-184), admits once every check is Ready, and deactivates a workload
whose check is Rejected (pkg/controller/core/workload_controller.go lines 967-990; apis/kueue/v1beta2/
admissioncheck_types.go lines 25-45). Kueue stops such a job after its declared run time of admitted time
(workload_controller.go lines 905-947, from the job's label: pkg/controller/jobframework/utils.go lines 184-205), so
a job admitted in time also ends in time (give or take the seconds between the controller's answer and Kueue's
admission, which the close's drain takes care of).

Nothing the controller does fights `pulumi up`. It writes the status of Workloads (Kueue's objects, not the stack's)
and of the AdmissionCheck, whose CRD has the status subresource (admissioncheck_types.go line 108): the API server
keeps status out of any write to the object itself (Kubernetes documentation, "Extend the Kubernetes API with
CustomResourceDefinitions", Status subresource), and the object's spec is all pulumi-kubernetes' server-side apply
sends. It cordons nodes, which the stack does not manage. The alternatives each touch a field the deployer owns: a
ResourceFlavor's nodeLabels and nodeTaints are atomic (resourceflavor_types.go lines 64 and 83), so a taint added to
close a flavor would take the whole list from the deployer and the next `up` would put it back. So would the flavor's
quota set to 0 in the ClusterQueue, and a stopPolicy would besides stop the whole queue.

Not a node affinity: Kueue weighs a pod's required node affinity against a flavor's nodeLabels when it picks a flavor
(pkg/scheduler/flavorassigner/flavorassigner.go lines 1224-1321), so a job could require a flavor label holding the
block's end to be past its own. But that compares with when the job was written, not admitted (a job that waited in
the queue would still get in), `python -m jobs` reads no cloud account to know the end, and every flavor label goes
into the admitted pods' node selector (resourceflavor_types.go lines 56-60), so every node would have to carry it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from decisions.nodes import drain

# EC2 User Guide, "Monitor Capacity Blocks using EventBridge": the warning 40 minutes before the end, termination
# from 10 minutes after it.
EC2_TERMINATION_LEAD_S = 30 * 60
EXPIRY_WARNING_LEAD_S = 40 * 60
DRAIN_BUDGET_S = drain.LIFECYCLE_DRAIN_TIMEOUT_S
CLOSE_BEFORE_END_S = EC2_TERMINATION_LEAD_S + DRAIN_BUDGET_S
EXPIRY_WARNING_DETAIL_TYPES = ("Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning")
EVENT_SOURCE = "aws.ec2"

# Kueue's names: the AdmissionCheck on the blocks' flavors and the controllerName the repair controller answers for.
ADMISSION_CHECK = "capacity-block-window"
CONTROLLER_NAME = "gpu-cloud.io/capacity-block-window"
# The label a job declares its maximum run time by, in seconds (kubernetes-sigs/kueue v0.19.2 pkg/controller/constants/
# constants.go line 59); Kueue's webhook refuses one that is not a whole number above 0 (pkg/controller/jobframework/
# validation.go lines 235-247) and it becomes the Workload's maximumExecutionTimeSeconds, an int32 (apis/kueue/
# v1beta2/workload_types.go lines 70-77).
MAX_RUN_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
MAX_RUN_TIME_S = 2**31 - 1
# On a node the controller cordoned because its block closes: when and why (it uncordons only nodes carrying it).
CLOSING_ANNOTATION = "gpu-cloud.io/capacity-block-closing"

# The warning's queue keeps a message past its block's end (the controller reads it again every pass until then and
# deletes it after, so a restart does not forget it).
QUEUE_RETENTION_S = 2 * EXPIRY_WARNING_LEAD_S


@dataclass(frozen=True)
class Block:
    """A capacity-block pool as the controller watches it."""
    pool: str
    flavor: str                # its Kueue ResourceFlavor (decisions.nodes.pools.queue_flavor); "" outside the queue
    reservation_id: str
    ends_at: float             # Unix time of the reservation's EndDate

    @property
    def closes_at(self) -> float:
        return self.ends_at - CLOSE_BEFORE_END_S


def unix_time(rfc3339: str) -> float:
    """An RFC 3339 time as EC2 writes it ("2027-01-18T11:30:00Z", or with an offset or fraction) in Unix seconds."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def blocks(pools: Sequence[Any], reservations: Mapping[str, Union[Any, str]]) -> Tuple[Block, ...]:
    """Every capacity-block pool with its reservation's end, as `pulumi up` read it (decisions.network.zones
    .Reservation; an unreadable one stopped the program earlier, in layers.prepare). A ValueError names a block whose
    end date EC2 did not give."""
    from decisions.nodes.pools import queue_flavor

    found = []
    for pool in pools:
        if pool.spec.capacity != "capacity-block":
            continue
        rid = pool.spec.capacity_reservation_id
        end = getattr(reservations.get(rid), "end_date", None)
        if not end:
            raise ValueError(f"pool {pool.name}: capacity block {rid} has no EndDate as EC2 describes it; the "
                             "controller cannot close it in time")
        found.append(Block(pool.name, queue_flavor(pool) or "", rid, unix_time(end)))
    return tuple(found)


@dataclass(frozen=True)
class ControllerAdditions:
    """What the repair controller gets for the stack's blocks, beside its own (decisions/nodes/repair.py)."""
    config: Mapping[str, Any]                       # config.json keys (jobs/block_expiry.py reads exactly these)
    iam_statements: Tuple[Mapping[str, Any], ...]
    cluster_rules: Tuple[Mapping[str, Any], ...]


def controller_additions(found: Sequence[Block], *, cluster_name: str, region: str, partition: str, account_id: str,
                         dns_suffix: str) -> ControllerAdditions:
    """Nothing without a block; else its blocks, the warning queue to read and the rights to act on them."""
    if not found:
        return ControllerAdditions({}, (), ())
    name = queue_name(cluster_name)
    config = {"capacityBlocks": {b.pool: {"flavor": b.flavor, "reservationId": b.reservation_id, "endsAt": b.ends_at}
                                 for b in found},
              "capacityBlockCloseBeforeEndSeconds": CLOSE_BEFORE_END_S, "capacityBlockAdmissionCheck": ADMISSION_CHECK,
              "capacityBlockQueueUrl": queue_url(region, dns_suffix, account_id, name),
              "capacityBlockWarningTypes": list(EXPIRY_WARNING_DETAIL_TYPES),
              "capacityBlockClosingAnnotation": CLOSING_ANNOTATION}
    return ControllerAdditions(config, tuple(iam_statements(queue_arn(partition, region, account_id, name))),
                               CLUSTER_RULES)


def queue_name(cluster_name: str) -> str:
    """The warning queue's fixed name, so the controller's config and IAM policy name it before it exists."""
    return f"{cluster_name}-capacity-block-expiry"


def queue_arn(partition: str, region: str, account_id: str, name: str) -> str:
    return f"arn:{partition}:sqs:{region}:{account_id}:{name}"


def queue_url(region: str, dns_suffix: str, account_id: str, name: str) -> str:
    """SQS's queue URL (Amazon SQS Developer Guide, "Amazon SQS queue and message identifiers")."""
    return f"https://sqs.{region}.{dns_suffix}/{account_id}/{name}"


def expiry_warning_pattern(found: Sequence[Block]) -> Dict[str, Any]:
    """The EventBridge pattern of the expiry warning of this stack's blocks only (the event's detail names the
    reservation: capacity-reservation-id)."""
    if not found:
        raise ValueError("no capacity block: no expiry warning to match")
    return {"source": [EVENT_SOURCE], "detail-type": list(EXPIRY_WARNING_DETAIL_TYPES),
            "detail": {"capacity-reservation-id": sorted({b.reservation_id for b in found})}}


def iam_statements(queue: str) -> List[Dict[str, Any]]:
    """The controller reads the warnings and deletes each once its block has ended; nothing else of the queue."""
    return [{"Sid": "ReadCapacityBlockExpiryWarnings", "Effect": "Allow",
             "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"], "Resource": queue}]


# Kubernetes: the controller answers the admission check (its status) and the workloads' checks (their status), reads
# the workloads to see what each declares; it cordons and drains with the rights the repair controller already has.
CLUSTER_RULES: Tuple[Mapping[str, Any], ...] = (
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "admissionchecks"], "verbs": ["get", "list"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status", "admissionchecks/status"], "verbs": ["patch"]},
)
