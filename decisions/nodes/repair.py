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
import re
from pathlib import Path
from typing import Any, Collection, Dict, List, Mapping, Sequence

from decisions.nodes import boot, drain, faults
from decisions.nodes import pools as pool_rules
from decisions.observability.monitoring import POOL_NODE_LABEL, PROMETHEUS_PORT, PROMETHEUS_URL
from decisions.platform import pod_security

NAME = "gpu-node-repair"
NAMESPACE = "kube-system"
IMAGE = pod_security.image("python")     # standard-library Python: the controller signs its own AWS requests
JOBS = Path(__file__).resolve().parents[2] / "jobs"
PROGRAM_FILES = ("node_repair.py", "aws_api.py", "block_expiry.py")     # shipped in the ConfigMap, run from its mount
CONFIG_KEY = "config.json"
METRICS_PORT = 8080
STATE_CONFIGMAP = f"{NAME}-state"        # repairs in flight and past, and each pool's last brake

GATE_REPORTS_PREFIX = "gate-reports/"
GATE_REPORT_RETENTION_DAYS = 90         # the artifact bucket's lifecycle expires them (decisions/storage/buckets.py)

INTERVAL_S = 30
# The run-time checker's period: userdata/units/gpu-cloud-health.timer OnUnitActiveSec (tests/test_repair.py holds them
# equal). A check takes about 0.3 s on an 8-GPU node (docs/node-gate.md), 1 % of a core at this period. With the 30 s
# scrape and this controller's 30 s pass, a fault is seen within 91 s and the node cordoned within 2 minutes.
CHECK_PERIOD_S = 30
# A run-time check older than this (five missed runs of the timer) is not believed: the node is cordoned, nobody
# watches its GPUs. Four would already count two failed scrapes in a row of a healthy node (its check is up to a
# period, a scrape and a missed scrape old: 91 s).
STALE_CHECK_S = 5 * CHECK_PERIOD_S
# A checker silent this long gets its node rebooted (the checker restarts, the gate proves the node): when
# GpuNodeHealthCheckStale fires (STALE_CHECK_S, for 5 minutes).
STALE_REPAIR_S = STALE_CHECK_S + 300
# A GPU node NotReady this long is replaced, as EKS node auto repair replaces one (EKS User Guide, "Automatically
# repair nodes in EKS clusters": condition Ready, repair after 30m, Replace). Until then the node lifecycle
# controller's not-ready taint keeps new work off it. It must outlast a node's own reboot through its gate (a kernel
# panic reboots it 10 s later, kernel.panic=10 on the AMI), or a node proving itself would be replaced mid-boot:
# tests/test_repair.py holds it above every pool's worst boot to Ready.
NOT_READY_S = 1800
# A fault must be reported this long (two run-time checks and the scrapes between them) before a reboot or a
# replacement; the node is cordoned on the first report.
CONFIRM_S = 2 * CHECK_PERIOD_S
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
# own budget to evict (the termination hook's heartbeat), then the longest boot gate (the install path's hook timeout)
# and readiness: 75 minutes.
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
# The controller's own drain, before a reboot or before a replacement that launches first, has the same cap: the fault
# stays until the node's reset, and every pod on it is stopped by that reset anyway (a drain of 900 s held every
# reboot 15 minutes, issue #38's bench).
FAST_DRAIN_S = drain.NODE_DRAIN_GRACE_S
DRAIN_HOOK = drain.DRAIN_HOOK_NAME
# Fault-table remediation -> what is done (the table's none asks for nothing); `reset` while the table still has it.
ACTIONS = {k: v for k, v in {"reset": "reboot", "reboot": "reboot", "replace": "replace"}.items()
           if k in faults.REMEDIATIONS}

# Faults no run-time check sees, which DCGM judges on one GPU counter (the table's `runtime` is that one series): the
# NVLink replay and recovery errors, which DCGM v4.6.0 fails a GPU on at a single error (faults.yaml). The controller
# asks Prometheus whether the counter grew on a node in the last COUNTER_WINDOW_S, and treats the node as asking for
# the fault's remediation, as a checker's fault: confirmed over CONFIRM_S, escalated on recurrence. The window holds
# four of the DCGM exporter's collections (dcgm-exporter's default collect interval, 30 s; scraped every 15 s,
# gpu-operator v26.7.0 values.yaml dcgmExporter.serviceMonitor.interval) and is shorter than any reboot, so a counter
# that grew before a reboot is not read as the fault again after it (the driver reload resets the counters anyway).
COUNTER_WINDOW_S = 120
COUNTER_FAULTS = {f.id: {"series": f.runtime, "remediation": f.remediation} for f in faults.load_faults().faults
                  if not f.checks and f.remediation in ACTIONS and re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", f.runtime)}

# What the controller keeps on a node it repairs: the action and when it began.
REPAIR_ANNOTATION = "gpu-cloud.io/repair"


def gate_reports_prefix(pool: str) -> str:
    """Where the gate publishes a pool's verdicts (userdata/bootstrap.sh `publish`), one object per boot."""
    return f"{GATE_REPORTS_PREFIX}{pool}/"


def dns_suffix(partition: str) -> str:
    """The AWS service domain of a partition (aws-cn's endpoints are under amazonaws.com.cn)."""
    return "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"


def pool_policies(pools: Sequence[Any], cluster_name: str, max_per_hour: int,
                  launch_first: Collection[str] = ()) -> Dict[str, Dict[str, Any]]:
    """Per pool: its group, whether its capacity is reserved, whether its replacements launch first (`launch_first`,
    the pools decisions.nodes.pools.launches_first holds), and its budget. One repair at a time in every pool: a
    reservation has no spare capacity (or one slot) to replace into, and elsewhere one at a time keeps a false alarm
    slow. No floor of serving nodes: a node is out of service before it is repaired, so a repair takes nothing that
    serves, and a floor could only strand sick nodes (two faults in a 4-node reservation would each wait for the
    other)."""
    return {pool.name: {"asg": pool_rules.asg_name(cluster_name, pool.name),
                        "reserved": bool(pool.spec.reserved_capacity), "launchFirst": pool.name in launch_first,
                        "maxPerHour": max_per_hour, "maxInFlight": 1}
            for pool in pools}


def controller_config(*, cluster_name: str, region: str, partition: str, pools: Sequence[Any], dry_run: bool,
                      max_per_hour: int, reports_bucket: str, launch_first: Collection[str] = ()) -> Dict[str, Any]:
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
        "repairTimeoutSeconds": REPAIR_TIMEOUT_S,
        "fastDrainSeconds": FAST_DRAIN_S, "drainHook": DRAIN_HOOK,
        "metricsPort": METRICS_PORT, "counterFaults": COUNTER_FAULTS, "counterWindowSeconds": COUNTER_WINDOW_S,
        "poolLabel": POOL_NODE_LABEL, "repairAnnotation": REPAIR_ANNOTATION, "actions": ACTIONS,
        "pools": pool_policies(pools, cluster_name, max_per_hour, launch_first),
    }


def config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def program_files() -> Dict[str, str]:
    """The controller's program, by file name, for its ConfigMap."""
    return {name: (JOBS / name).read_text(encoding="utf-8") for name in PROGRAM_FILES}


def iam_statements(*, partition: str, region: str, account_id: str, asg_names: Sequence[str],
                   reports_bucket_arn: str, reports_key_arn: str) -> List[Dict[str, Any]]:
    """Least privilege: replace, brake and describe only this cluster's pools' groups (Auto Scaling authorizes
    TerminateInstanceInAutoScalingGroup, SetInstanceHealth and SuspendProcesses on the group: Service Authorization
    Reference, Amazon
    EC2 Auto Scaling), reboot only instances those groups launched (the group tags its instances
    aws:autoscaling:groupName), complete only those groups' lifecycle actions (the fast path's CONTINUE), read only the
    gate's reports. Describe calls take no resource."""
    groups = [pool_rules.asg_arn_pattern(partition, region, account_id, name) for name in asg_names]
    return [
        {"Sid": "DescribeGroups", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingGroups", "Resource": "*"},
        {"Sid": "ReplaceAndBrakeOwnPools", "Effect": "Allow",
         "Action": ["autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:SetInstanceHealth",
                    "autoscaling:SuspendProcesses"],
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
