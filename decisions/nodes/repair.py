"""GPU node repair, as plain decisions: what the repair controller (jobs/node_repair.py) is told, what it may do in
AWS and Kubernetes, and where the gate's verdicts are kept. components/nodes/node_repair.py turns these into resources.

The loop, with the fault table (decisions/nodes/faults.yaml) at both ends:
- every GPU node's run-time checker (userdata/health.sh, every minute) writes gpu_cloud_node_health_* with the
  remediation the table gives its faults; Prometheus scrapes it;
- the controller asks Prometheus every INTERVAL_S which nodes want a reboot or a replacement (and Kubernetes which are
  NotReady: replaced after NOT_READY_S; a checker silent for STALE_REPAIR_S gets its node rebooted), cordons each at
  once, and repairs a node once it has asked for CONFIRM_S, within the pool's budget: a reboot (evict,
  ec2:RebootInstances; the gate proves the node at boot, and a node that fails is replaced by its group; one that asks
  again within RECURRENCE_S is replaced) or a replacement (TerminateInstanceInAutoScalingGroup without decrementing:
  the termination hook and the drain handler drain it, the controller completes the hook once nothing on the node can
  still checkpoint and at the latest FAST_DRAIN_S later, the group launches another, into the reservation where the
  pool has one);
- every boot's verdict is published by the gate to GATE_REPORTS_PREFIX in the artifact bucket; the controller reads
  them, exposes them as metrics (the alerts GpuNodeVerificationFailed and ...Warning), and suspends a pool's Launch
  process after BRAKE_AFTER rejected launches in a row.

Out of service first (Controller.tick in jobs/node_repair.py): every node that asks is cordoned at once, whatever is
decided about repairing it. Safety governs the repairs only (decide(), tests/test_node_repair.py): per pool at most
`maxPerPoolPerHour` repairs in any hour, one at a time, never when more than FLEET_FAULT_SHARE of a pool asks at once
(a bad checker or image, not bad hardware), never on a node already draining. Dry-run decides and reports the same,
and changes nothing. Every decision is an Event on the node and a sample of gpu_cloud_repair_decisions_total.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from decisions.nodes import boot, drain, faults
from decisions.nodes import pools as pool_rules
from decisions.observability.monitoring import POOL_NODE_LABEL, PROMETHEUS_PORT, PROMETHEUS_URL
from decisions.platform.acceptance import JUDGE_IMAGE

NAME = "gpu-node-repair"
NAMESPACE = "kube-system"
IMAGE = JUDGE_IMAGE                      # standard-library Python: the controller signs its own AWS requests
JOBS = Path(__file__).resolve().parents[2] / "jobs"
PROGRAM_FILES = ("node_repair.py", "aws_api.py")     # shipped in the ConfigMap, run from its mount
CONFIG_KEY = "config.json"
METRICS_PORT = 8080
STATE_CONFIGMAP = f"{NAME}-state"        # repairs in flight and past, and each pool's last brake

GATE_REPORTS_PREFIX = "gate-reports/"
GATE_REPORT_RETENTION_DAYS = 90         # the artifact bucket's lifecycle expires them (decisions/storage/buckets.py)

INTERVAL_S = 30
# A run-time check older than this (five missed runs of the minutely timer) is not believed: the node is cordoned,
# nobody watches its GPUs.
STALE_CHECK_S = 300
# A checker silent this long gets its node rebooted (the checker restarts, the gate proves the node): when
# GpuNodeHealthCheckStale fires (STALE_CHECK_S, for 5 minutes).
STALE_REPAIR_S = 600
# A GPU node NotReady this long is replaced, as EKS node auto repair replaces one (EKS User Guide, "Automatically
# repair nodes in EKS clusters": condition Ready, repair after 30m, Replace). Until then the node lifecycle
# controller's not-ready taint keeps new work off it.
NOT_READY_S = 1800
# A fault must be reported this long (two run-time checks a minute apart, and a scrape) before a reboot or a
# replacement; the node is cordoned on the first report.
CONFIRM_S = 120
# A node still Ready on its old boot this long after RebootInstances was not rebooted: EC2 hard-reboots an instance
# that has not shut down within a few minutes (four, in the RebootInstances reference's earlier wording), and a
# stopped kubelet is NotReady 40 s later (node-monitor-grace-period). Reboot again.
REBOOT_RETRY_S = 360
# A node rebooted healthy that asks again within this window is replaced: the fault came back with the hardware.
RECURRENCE_S = 24 * 3600
# Three rejected launches in a row, with no pass between, brake the pool. Were even one launch in 20 rejected for its
# own hardware (far more than a healthy fleet sees), three in a row by chance would come once in 8,000 launches; a
# systematic failure (a bad pin, a bundle the nodes cannot read, a fabric manager that never starts) rejects every
# launch, and is stopped after three: up to 45 instance-minutes of p5 (8 to 15 each), plus whatever was launching
# alongside them.
BRAKE_AFTER = 3
BRAKE_WINDOW_S = 6 * 3600               # rejections older than this do not count towards a brake
# More than this share of a pool asking for repair at once (and more than one node) halts that pool's repairs.
FLEET_FAULT_SHARE = 0.5
# A repair is overdue (a reboot escalates to a replacement, a replacement is reported stuck) after the drain handler's
# own budget to evict, then the longest boot gate (the install path's hook timeout) and readiness: 75 minutes.
DRAIN_TIMEOUT_S = drain.LIFECYCLE_DRAIN_TIMEOUT_S
REPAIR_TIMEOUT_S = DRAIN_TIMEOUT_S + max(boot.VERIFY_HOOK_TIMEOUT_S.values()) + boot.node_ready_seconds()
# The fast path for dead hardware (issue #38 item 5). Every replacement this controller starts is for a fault that
# stays with the hardware (the table's replace, a node NotReady 30 minutes, a reboot-class fault that outlived its
# reboot). aws-node-termination-handler v1.25.1 completes the termination hook only after a drain that succeeded
# (pkg/monitor/sqsevent/asg-lifecycle-event.go: CompleteLifecycleAction is the PostDrainTask, which
# pkg/interruptionevent/draincordon/handler.go runs only when the drain returned no error), and its drain waits for
# every pod to be gone (k8s.io/kubectl drain.Helper with Timeout 840 s): a pod whose process hangs in the dead GPU's
# driver, or whose kubelet is gone, never goes, so the hook would hold the instance to its 900 s heartbeat. Instead,
# once the group holds the instance in Terminating:Wait, the controller completes the hook itself with CONTINUE as
# soon as nothing on the node can still checkpoint (no pod left, every pod past its grace, or a kubelet not Ready),
# and at the latest FAST_DRAIN_S after it saw the termination begin: the same notice a spot node gets, which the
# workload contract already holds every job to (decisions/nodes/drain.py, 90 s from SIGTERM). On a node whose kubelet
# is not Ready it first deletes the pods still there with grace 0, so that their owners start them elsewhere now.
FAST_DRAIN_S = drain.NODE_DRAIN_GRACE_S
DRAIN_HOOK = drain.DRAIN_HOOK_NAME
# Fault-table remediation -> what is done (the table's none asks for nothing); `reset` while the table still has it.
ACTIONS = {k: v for k, v in {"reset": "reboot", "reboot": "reboot", "replace": "replace"}.items()
           if k in faults.REMEDIATIONS}

# What the controller keeps on a node it repairs: the action and when it began.
REPAIR_ANNOTATION = "gpu-cloud.io/repair"


def gate_reports_prefix(pool: str) -> str:
    """Where the gate publishes a pool's verdicts (userdata/bootstrap.sh `publish`), one object per boot."""
    return f"{GATE_REPORTS_PREFIX}{pool}/"


def dns_suffix(partition: str) -> str:
    """The AWS service domain of a partition (aws-cn's endpoints are under amazonaws.com.cn)."""
    return "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"


def pool_policies(pools: Sequence[Any], cluster_name: str, max_per_hour: int) -> Dict[str, Dict[str, Any]]:
    """Per pool: its group, whether its capacity is reserved, and its budget. One repair at a time in every pool: a
    reservation has no spare capacity to replace into until the old instance is gone, and elsewhere one at a time
    keeps a false alarm slow. No floor of serving nodes: a node is out of service before it is repaired, so a repair
    takes nothing that serves, and a floor could only strand sick nodes (two faults in a 4-node reservation would
    each wait for the other)."""
    return {pool.name: {"asg": pool_rules.asg_name(cluster_name, pool.name),
                        "reserved": bool(pool.spec.reserved_capacity),
                        "maxPerHour": max_per_hour, "maxInFlight": 1}
            for pool in pools}


def controller_config(*, cluster_name: str, region: str, partition: str, pools: Sequence[Any], dry_run: bool,
                      max_per_hour: int, reports_bucket: str) -> Dict[str, Any]:
    """The controller's config.json (jobs/node_repair.py load_config reads exactly these keys)."""
    return {
        "region": region, "dnsSuffix": dns_suffix(partition), "dryRun": dry_run,
        "namespace": NAMESPACE, "stateConfigMap": STATE_CONFIGMAP,
        "prometheusUrl": f"{PROMETHEUS_URL}:{PROMETHEUS_PORT}",
        "reportsBucket": reports_bucket, "reportsPrefix": GATE_REPORTS_PREFIX,
        "intervalSeconds": INTERVAL_S, "confirmSeconds": CONFIRM_S, "staleCheckSeconds": STALE_CHECK_S,
        "staleRepairSeconds": STALE_REPAIR_S, "notReadySeconds": NOT_READY_S, "rebootRetrySeconds": REBOOT_RETRY_S,
        "recurrenceSeconds": RECURRENCE_S, "fleetFaultShare": FLEET_FAULT_SHARE,
        "brakeAfter": BRAKE_AFTER, "brakeWindowSeconds": BRAKE_WINDOW_S,
        "drainTimeoutSeconds": DRAIN_TIMEOUT_S, "repairTimeoutSeconds": REPAIR_TIMEOUT_S,
        "fastDrainSeconds": FAST_DRAIN_S, "drainHook": DRAIN_HOOK,
        "metricsPort": METRICS_PORT,
        "poolLabel": POOL_NODE_LABEL, "repairAnnotation": REPAIR_ANNOTATION, "actions": ACTIONS,
        "pools": pool_policies(pools, cluster_name, max_per_hour),
    }


def config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def program_files() -> Dict[str, str]:
    """The controller's program, by file name, for its ConfigMap."""
    return {name: (JOBS / name).read_text(encoding="utf-8") for name in PROGRAM_FILES}


def iam_statements(*, partition: str, region: str, account_id: str, asg_names: Sequence[str],
                   reports_bucket_arn: str, reports_key_arn: str) -> List[Dict[str, Any]]:
    """Least privilege: replace, brake and describe only this cluster's pools' groups (Auto Scaling authorizes
    TerminateInstanceInAutoScalingGroup and SuspendProcesses on the group: Service Authorization Reference, Amazon
    EC2 Auto Scaling), reboot only instances those groups launched (the group tags its instances
    aws:autoscaling:groupName), complete only those groups' lifecycle actions (the fast path's CONTINUE), read only the
    gate's reports. Describe calls take no resource."""
    groups = [pool_rules.asg_arn_pattern(partition, region, account_id, name) for name in asg_names]
    return [
        {"Sid": "DescribeGroups", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingGroups", "Resource": "*"},
        {"Sid": "ReplaceAndBrakeOwnPools", "Effect": "Allow",
         "Action": ["autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:SuspendProcesses"],
         "Resource": groups},
        # The fast path: CONTINUE the termination hook of an instance with dead hardware once nothing on it can
        # still checkpoint (Auto Scaling authorizes CompleteLifecycleAction on the group, as the drain handler's).
        {"Sid": "CompleteOwnPoolsTerminationHook", "Effect": "Allow", "Action": "autoscaling:CompleteLifecycleAction",
         "Resource": groups},
        {"Sid": "RebootOwnPoolInstances", "Effect": "Allow", "Action": "ec2:RebootInstances",
         "Resource": f"arn:{partition}:ec2:{region}:{account_id}:instance/*",
         "Condition": {"StringEquals": {"ec2:ResourceTag/aws:autoscaling:groupName": list(asg_names)}}},
        {"Sid": "ListGateReports", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": reports_bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{GATE_REPORTS_PREFIX}*"]}}},
        {"Sid": "ReadGateReports", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"{reports_bucket_arn}/{GATE_REPORTS_PREFIX}*"},
        {"Sid": "DecryptGateReports", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": reports_key_arn,
         "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.{dns_suffix(partition)}"}}},
    ]


# Kubernetes: read nodes and the pods on them, cordon and annotate a node, evict its pods (the Eviction API honours
# PodDisruptionBudgets), delete with grace 0 the pods left on a node being terminated whose kubelet is gone (the fast
# path: nothing runs them, and their owners start them elsewhere only once they are gone), record Events; keep its own state in one ConfigMap of its namespace.
CLUSTER_RULES = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
NAMESPACE_RULES = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [STATE_CONFIGMAP], "verbs": ["get", "update"]},
)
