"""Draining GPU nodes before they go away: event patterns, timings, and aws-node-termination-handler values.

Pure: no Pulumi. components/nodes/node_drain.py turns these into an SQS queue, EventBridge rules and the NTH
Helm release (queue-processor mode); components/nodes/nodepool.py uses LIFECYCLE_DRAIN_TIMEOUT_S for the
Auto Scaling groups' termination lifecycle hook.

How a node leaves, and what drains it
-------------------------------------
EventBridge sends five kinds of events to one SQS queue; NTH (one Deployment) long-polls the queue
(20 s), cordons the node and evicts its pods through the Eviction API (PodDisruptionBudgets apply),
then, for Auto Scaling lifecycle events, completes the lifecycle action so the instance may go:

- Spot interruption warning: EC2 reclaims the instance 120 s after the warning (NODE_DRAIN_GRACE_S),
  whatever anyone does.
- Rebalance recommendation (spot at elevated risk): drained at once in queue mode; the ASG's capacity
  rebalancing then replaces the instance through the termination hook below.
- Instance state change to stopping / stopped / shutting-down / terminated.
- AWS Health scheduled change for EC2 (retirement, maintenance): drained NTH_NODE_TERMINATION_GRACE_S
  before the scheduled start.
- Auto Scaling termination lifecycle action (scale-in by cluster-autoscaler, capacity rebalancing,
  instance refresh, AZ rebalance), for this cluster's GPU pools only: the termination hook holds the
  instance for up to LIFECYCLE_DRAIN_TIMEOUT_S (900 s), then the ASG continues regardless.

NTH evicts with each pod's own terminationGracePeriodSeconds (podTerminationGracePeriod -1) and waits for
the drain up to NTH_NODE_TERMINATION_GRACE_S (840 s), which ends before the hook runs out, so it completes
the lifecycle action itself as soon as the pods are gone instead of idling a GPU node until expiry.
cluster-autoscaler drains with the same budget on scale-down (`max-graceful-termination-sec`).

The workload contract (for jobs on GPU pools)
---------------------------------------------
1. On SIGTERM, stop taking work, write a checkpoint to durable storage (FSx for Lustre, S3), exit 0.
   Anything that must happen before SIGTERM (leaving a rendezvous, draining a request queue) goes in a
   preStop hook; the kubelet runs preStop first and it counts against the same grace period.
2. Set terminationGracePeriodSeconds to what checkpointing needs, at most WORKLOAD_MAX_GRACE_S (780 s).
   On scale-in, rebalancing, instance refresh, termination through the Auto Scaling group and scheduled
   maintenance the pod gets all of it (a stop or terminate sent to the instance itself is best effort). Above 780 s the
   pod may be killed when the termination hook expires, 900 s after the termination began. Dead hardware is the
   exception: on a node the repair controller replaces, it completes the hook once no pod can still checkpoint, at
   the latest NODE_DRAIN_GRACE_S (120 s, the spot notice) after the termination began (decisions/nodes/repair.py
   FAST_DRAIN_S), and at once where the kubelet is gone; its own drain before a reboot, or while a replacement
   launches first, has the same cap.
3. Spot interruption: the instance disappears 120 s after the warning and SIGTERM arrives only after the
   event has travelled EventBridge -> SQS -> NTH, so plan on SPOT_CHECKPOINT_BUDGET_S (90 s) from SIGTERM.
   Jobs that cannot checkpoint in 90 s must checkpoint periodically and treat SIGTERM as best effort.
4. A PodDisruptionBudget cannot keep a node: a blocked eviction is retried until NTH's drain timeout,
   then the instance goes anyway. Local data (emptyDir, /dev/shm, NVMe scratch) is lost with the node.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from decisions.nodes.pods import system_placement

# --- timings (seconds) ---------------------------------------------------------------------------------
NODE_DRAIN_GRACE_S = 120            # spot: EC2's two-minute interruption notice; the hard limit on spot
SPOT_CHECKPOINT_BUDGET_S = 90       # what a pod can count on after SIGTERM on spot (delivery takes ~30 s)
LIFECYCLE_DRAIN_TIMEOUT_S = 900     # ASG termination hook heartbeat: room for a training checkpoint
# Deleting a pool (or the stack) with nodes running: the ASG waits for every node to drain through the
# termination hook, then for EC2 to stop it. The provider's default of 10 minutes would fail mid-drain.
ASG_DELETE_TIMEOUT_S = LIFECYCLE_DRAIN_TIMEOUT_S + 600
DRAIN_DELIVERY_MARGIN_S = 60        # EventBridge -> SQS -> NTH long poll (20 s) -> eviction, and back
NTH_NODE_TERMINATION_GRACE_S = LIFECYCLE_DRAIN_TIMEOUT_S - DRAIN_DELIVERY_MARGIN_S          # 840
WORKLOAD_MAX_GRACE_S = NTH_NODE_TERMINATION_GRACE_S - DRAIN_DELIVERY_MARGIN_S              # 780
QUEUE_RETENTION_S = 300             # an interruption notice older than 5 minutes is useless
QUEUE_LONG_POLL_S = 20              # NTH polls with WaitTimeSeconds=20

# --- names ---------------------------------------------------------------------------------------------
NAMESPACE = "kube-system"
NTH_SERVICE_ACCOUNT = "aws-node-termination-handler"
NTH_RELEASE_NAME = "aws-node-termination-handler"
# The termination lifecycle hook of every GPU pool's group (components/nodes/nodepool.py): NTH completes it after a
# drain; the repair controller completes it itself for a node whose hardware is dead (decisions/nodes/repair.py).
DRAIN_HOOK_NAME = "gpu-cloud-drain"

# NTH acts on these EC2 states (pkg/monitor/sqsevent/ec2-state-change-event.go); others are noise.
DRAIN_INSTANCE_STATES = ("stopping", "stopped", "shutting-down", "terminated")

SPOT_INTERRUPTION = "spot-interruption"
REBALANCE = "rebalance"
STATE_CHANGE = "state-change"
SCHEDULED_CHANGE = "scheduled-change"
ASG_TERMINATE = "asg-terminate"


# Instances carrying this tag are the ones the termination handler may drain (propagated by the pools' ASGs).
NTH_MANAGED_TAG = "aws-node-termination-handler/managed"

# NTH's Prometheus endpoint (chart 0.27.1: enablePrometheusServer makes templates/deployment.yaml set
# ENABLE_PROMETHEUS_SERVER and open container port http-metrics, and templates/service.yaml create a ClusterIP
# Service on it in queue mode). What it serves (app v1.25.1 pkg/observability/opentelemetry.go): actions_total
# {node_action, node_status}, actions_node_total (the same per node and event; deprecated there for its
# cardinality), events_error_total{event_error_where}, nth_tagged_nodes, nth_tagged_instances and Go runtime
# metrics. decisions/observability/dashboards.py reads them.
NTH_METRICS_PORT = 9092     # the chart's own default, named so the Service and a NetworkPolicy can agree
# The metrics Service (templates/service.yaml, queue mode) selects the Deployment's pods by these labels
# (templates/_helpers.tpl selectorLabelsDeployment: name, instance = release name, component deployment).
NTH_METRICS_PORT_NAME = "http-metrics"
NTH_SERVICE_SELECTOR: Mapping[str, str] = {"app.kubernetes.io/name": "aws-node-termination-handler",
                                           "app.kubernetes.io/instance": NTH_RELEASE_NAME,
                                           "app.kubernetes.io/component": "deployment"}

# Helm value paths nth_values sets -> line of that key in aws/aws-node-termination-handler v1.25.1
# config/helm/aws-node-termination-handler/values.yaml (chart 0.27.1).
NTH_VALUE_PATHS: Mapping[str, int] = {
    "serviceAccount.create": 17,
    "serviceAccount.name": 19,
    "enablePrometheusServer": 77,
    "prometheusServerPort": 78,
    "deleteLocalData": 97,
    "ignoreDaemonSets": 100,
    "podTerminationGracePeriod": 103,
    "nodeTerminationGracePeriod": 106,
    "emitKubernetesEvents": 109,
    "enableSqsTerminationDraining": 141,
    "awsRegion": 176,
    "queueURL": 179,
    "checkASGTagBeforeDraining": 185,
    "checkTagBeforeDraining": 188,
    "managedTag": 194,
    "deleteSqsMsgIfNodeNotFound": 289,
    "nodeSelector": 49,
    "tolerations": 53,
}

def spot_interruption_pattern() -> Dict[str, Any]:
    return {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}


def rebalance_pattern() -> Dict[str, Any]:
    return {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]}


def state_change_pattern() -> Dict[str, Any]:
    return {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"],
            "detail": {"state": list(DRAIN_INSTANCE_STATES)}}


def scheduled_change_pattern() -> Dict[str, Any]:
    return {"source": ["aws.health"], "detail-type": ["AWS Health Event"],
            "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]}}


def asg_terminate_pattern(asg_names: Sequence[str]) -> Dict[str, Any]:
    """Termination lifecycle actions of these Auto Scaling groups only (never another cluster's)."""
    names = _asg_names(asg_names)
    return {"source": ["aws.autoscaling"], "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
            "detail": {"AutoScalingGroupName": names}}


def event_patterns(asg_names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Rule key -> EventBridge event pattern, one rule per kind of event NTH drains on."""
    return {
        SPOT_INTERRUPTION: spot_interruption_pattern(),
        REBALANCE: rebalance_pattern(),
        STATE_CHANGE: state_change_pattern(),
        SCHEDULED_CHANGE: scheduled_change_pattern(),
        ASG_TERMINATE: asg_terminate_pattern(asg_names),
    }


def nth_values(queue_url: Any, region: str, service_account: str = NTH_SERVICE_ACCOUNT, *,
               node_termination_grace_s: int = NTH_NODE_TERMINATION_GRACE_S,
               pod_termination_grace_s: int = -1,
               managed_tag: Optional[str] = None) -> Dict[str, Any]:
    """Helm values for aws-node-termination-handler in queue-processor mode.

    `queue_url` may be an Output. `pod_termination_grace_s` -1 keeps each pod's own
    terminationGracePeriodSeconds (the workload contract). `node_termination_grace_s` is NTH's drain
    timeout and how early it drains before a scheduled event; it must end before the termination hook.
    `managed_tag`: act only on instances carrying this tag key; None acts on every node of the cluster
    (events for instances that are not nodes of this cluster are dropped: deleteSqsMsgIfNodeNotFound).
    NTH always serves its metrics on NTH_METRICS_PORT. The chart's own ServiceMonitor stays off: its template does
    not check for the CRD, and the handler is installed before the monitoring stack; components/monitoring.py
    creates one (NTH_SERVICE_SELECTOR) after it.
    """
    if not NODE_DRAIN_GRACE_S <= node_termination_grace_s < LIFECYCLE_DRAIN_TIMEOUT_S:
        raise ValueError(f"node_termination_grace_s {node_termination_grace_s} must be at least the spot notice "
                         f"({NODE_DRAIN_GRACE_S}) and end before the termination hook ({LIFECYCLE_DRAIN_TIMEOUT_S})")
    if pod_termination_grace_s != -1 and not 0 < pod_termination_grace_s <= node_termination_grace_s:
        raise ValueError(f"pod_termination_grace_s {pod_termination_grace_s} must be -1 (the pod's own) "
                         f"or within the node's {node_termination_grace_s}")
    if not service_account:
        raise ValueError("service_account must not be empty")
    check_tag = managed_tag is not None
    values: Dict[str, Any] = {
        "enableSqsTerminationDraining": True,
        "queueURL": queue_url,
        "awsRegion": region,
        "serviceAccount": {"create": True, "name": service_account},
        # Both spellings: the deprecated one defaults to true in the chart and would filter on its own tag.
        "checkTagBeforeDraining": check_tag,
        "checkASGTagBeforeDraining": check_tag,
        "deleteSqsMsgIfNodeNotFound": True,
        "nodeTerminationGracePeriod": node_termination_grace_s,
        "podTerminationGracePeriod": pod_termination_grace_s,
        "deleteLocalData": True,
        "ignoreDaemonSets": True,
        "emitKubernetesEvents": True,
        "enablePrometheusServer": True,
        "prometheusServerPort": NTH_METRICS_PORT,
        # The queue-processor Deployment runs on the system nodes, tolerating their taint (decisions/nodes/pods.py); the
        # chart's templates/deployment.yaml (v1.25.1 lines 206-218) adds these to its own kubernetes.io/os selector.
        **system_placement(),
    }
    if check_tag:
        values["managedTag"] = managed_tag
    return values


def queue_policy_statements(queue_arn: Any, rule_arns: Sequence[Any]) -> List[Dict[str, Any]]:
    """SQS queue policy: only these EventBridge rules may send; nothing without TLS."""
    if not rule_arns:
        raise ValueError("rule_arns must not be empty")
    return [
        {"Sid": "DrainRulesOnly", "Effect": "Allow",
         "Principal": {"Service": "events.amazonaws.com"},
         "Action": "sqs:SendMessage", "Resource": queue_arn,
         "Condition": {"ArnEquals": {"aws:SourceArn": list(rule_arns)}}},
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "sqs:*",
         "Resource": queue_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    ]


def nth_policy_statements(queue_arn: Any, asg_arns: Sequence[Any]) -> List[Dict[str, Any]]:
    """Least privilege for NTH in queue mode (the statements its README lists, scoped)."""
    if not asg_arns:
        raise ValueError("asg_arns must not be empty")
    return [
        {"Sid": "ConsumeDrainQueue", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"], "Resource": queue_arn},
        {"Sid": "CompleteDrainHook", "Effect": "Allow",
         "Action": "autoscaling:CompleteLifecycleAction", "Resource": list(asg_arns)},
        {"Sid": "ResolveInstances", "Effect": "Allow",
         "Action": ["autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeTags", "ec2:DescribeInstances"],
         "Resource": "*"},
    ]


def _asg_names(asg_names: Sequence[str]) -> List[str]:
    if isinstance(asg_names, str):
        raise TypeError("asg_names must be a sequence of names, not one string")
    names = sorted(set(asg_names))
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"asg_names must be non-empty names, got {list(asg_names)!r}")
    return names

