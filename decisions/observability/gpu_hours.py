"""The GPU-hour ledger at run time: recording rules that split each pool's paid GPUs into where they go, per pool and
per team namespace. Pure: no Pulumi (components/monitoring.py ships the group beside the alert rules).

Every evaluation records GPU counts; a window's GPU-hours are the count's average over the window times its hours
(`avg_over_time(gpu_cloud:pool_gpus:state[30d]) * 24 * 30`: docs/monitoring.md, "Where GPU-hours go"), so the
figures do not depend on the evaluation interval.

Paid GPUs (gpu_cloud:pool_gpus:paid, labels pool and capacity):
- a reserved or capacity-block pool: its reservation's instance count x GPUs per node, running or not (EC2 bills the
  whole reservation; the count is the one the bill uses, decisions/cost/cost.py reserved_size), or its registered
  nodes' GPUs where more have joined;
- an on-demand or spot pool: its registered nodes' GPUs. Instances that have not registered yet (booting, in the
  boot gate, rejected by it) are paid but have no series before their kubelet starts: these rules cannot see them.

Each paid GPU is in exactly one state (gpu_cloud:pool_gpus:state, label `state`), decided per node first:
- `repair`: the node is cordoned and carries the repair controller's annotation (jobs/node_repair.py patch_node;
  it blanks the annotation when it uncordons), NotReady or not;
- `booting_or_gated`: any other node that is not Ready, and a reservation's instances with no registered node;
- `draining`: Ready but cordoned by anyone else (the termination handler's spot drain, cluster-autoscaler's
  scale-down, a person);
- on the remaining Ready, schedulable nodes, per GPU: `busy` (allocated, and DCGM shows it at least
  BUSY_PCT % busy), `allocated_idle` (allocated to a pod, under BUSY_PCT %) and `unallocated`.

Series read, at the pinned versions:
- kube-state-metrics v2.20.0 (kube-prometheus-stack 88.5.3's kube-state-metrics 8.4.0): kube_node_labels,
  kube_node_status_condition, kube_node_spec_unschedulable, kube_node_annotations (docs/metrics/cluster/
  node-metrics.md; the annotation only with the chart's metricAnnotationsAllowList, decisions/observability/
  monitoring.py KUBE_STATE_NODE_ANNOTATIONS), kube_pod_container_resource_requests and kube_pod_status_phase
  (docs/metrics/workload/pod-metrics.md). Scraped with honorLabels, so `node` and `namespace` are the objects'.
- dcgm-exporter (the GPU operator v26.7.0's): DCGM_FI_DEV_GPU_UTIL, or under MIG DCGM_FI_PROF_GR_ENGINE_ACTIVE per GPU
  instance (alert_rules.GPU_BUSY_PCT). Its Kubernetes mapping labels a GPU with the pod using it as `pod` and
  `namespace` (NVIDIA/dcgm-exporter internal/pkg/transformation/const.go podAttribute, namespaceAttribute); the
  operator's ServiceMonitor keeps honorLabels false (gpu-operator v26.7.0 values.yaml dcgmExporter.serviceMonitor
  .honorLabels), so Prometheus renames them exported_pod and exported_namespace, and `node` comes from
  monitoring.NODE_LABEL_RELABELINGS.

A GPU is allocated in GPU-equivalents: requests of a pool's GPU resources by pods not yet finished, each unit weighted
by gpu_share (a time-sliced or MPS replica is 1/replicas of a GPU, a MIG instance its compute slices over the GPU's).
A namespace's busy GPUs are the GPUs DCGM attributes to its pods that are busy, at most what it is allocated on that
node; a busy GPU the exporter cannot attribute to a pod counts as allocated and idle.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from decisions.cost.cost import Reservations, reserved_size
from decisions.nodes.pools import mig_layout, offered_gpu_resources
from decisions.nodes.repair import REPAIR_ANNOTATION
from decisions.observability.alert_rules import (GPU_BUSY_PCT, GROUP_PREFIX, IDLE_GPU_PCT, INSTANCE_TYPE,
                                                 PAID_FOR_CAPACITY, POOL, gpu_nodes, ksm_resource)
from decisions.observability.monitoring import ksm_annotation

GROUP = f"{GROUP_PREFIX}.gpu-hours"
# The same line the ReservedGpusIdle alert draws: under it a GPU is idle.
BUSY_PCT = IDLE_GPU_PCT

NODE_GPUS = "gpu_cloud:node_gpus"
NODE_STATE = "gpu_cloud:node_gpus:state"
NAMESPACE_ALLOCATED = "gpu_cloud:namespace_gpus:allocated"
NAMESPACE_STATE = "gpu_cloud:namespace_gpus:state"
POOL_PAID = "gpu_cloud:pool_gpus:paid"
POOL_STATE = "gpu_cloud:pool_gpus:state"

# Where a pool's paid GPUs go, in the order the dashboard stacks them.
STATES = ("busy", "allocated_idle", "unallocated", "booting_or_gated", "draining", "repair")
# What a team namespace is charged with: the GPUs its pods hold.
NAMESPACE_STATES = ("busy", "allocated_idle")

READY = 'kube_node_status_condition{condition="Ready",status="true"} == 1'
CORDONED = "kube_node_spec_unschedulable == 1"
REPAIR_MARKED = f'kube_node_annotations{{{ksm_annotation(REPAIR_ANNOTATION)}!=""}}'
# A pod holds its requests from scheduling until it finishes (Succeeded or Failed).
UNFINISHED = 'unless on (namespace, pod) (kube_pod_status_phase{phase=~"Succeeded|Failed"} == 1)'


def _number(value: float) -> str:
    return format(value, ".12g")


def gpu_share(pool, catalog) -> Dict[str, float]:
    """GPU resource name -> the physical GPUs one unit of it is: 1 for a whole GPU, 1/replicas for a time-sliced or
    MPS replica, for a MIG instance its profile's compute slices (the `Ng` of `Ng.XXgb`) over the slices the pool's
    layout cuts each GPU into. One node's offer at these weights is its GPUs."""
    offered = offered_gpu_resources(pool, catalog)
    sharing = pool.spec.gpu_sharing
    if sharing.mode == "mig":
        layout = mig_layout(pool, catalog)
        slices = {profile: int(re.match(r"(\d+)g\.", profile)[1]) for profile in layout}
        per_gpu = sum(slices[profile] * count for profile, count in layout.items())
        return {resource: slices[profile] / per_gpu
                for resource, profile in zip(offered, layout)}
    return {resource: pool.gpus_per_node / units for resource, units in offered.items()}


def paid_instances(pool, reservations: Reservations) -> Optional[int]:
    """Instances billed whether they run or not: a reservation's or block's count; None for capacity billed by use."""
    if pool.spec.capacity not in PAID_FOR_CAPACITY:
        return None
    return reserved_size(pool.spec, reservations)[0]


def _record(record: str, expr: str, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    rule: Dict[str, Any] = {"record": record, "expr": expr}
    if labels:
        rule["labels"] = dict(labels)
    return rule


def _with_pool(expr: str, pool: str) -> str:
    return f'label_replace({expr}, "pool", "{pool}", "", "")'


def _of_type(pool: str, itype: str) -> str:
    return f'{POOL}="{pool}", {INSTANCE_TYPE}="{itype}"'


def node_rules(pools) -> List[Dict[str, Any]]:
    """Each GPU node's GPUs (from its instance type in the catalog), then in one node state each."""
    per_type = " or ".join(
        f"{gpu_nodes(_of_type(pool.name, itype.name))} * {itype.gpu.count}" for pool in pools for itype in pool.types)
    repair = f'{NODE_STATE}{{state="repair"}}'
    return [
        _record(NODE_GPUS, per_type),
        _record(NODE_STATE, f"{NODE_GPUS} and on (node) ({CORDONED}) and on (node) {REPAIR_MARKED}",
                {"state": "repair"}),
        _record(NODE_STATE, f"{NODE_GPUS} unless on (node) ({READY}) unless on (node) {repair}",
                {"state": "booting_or_gated"}),
        _record(NODE_STATE, f"{NODE_GPUS} and on (node) ({READY}) and on (node) ({CORDONED}) "
                            f"unless on (node) {repair}", {"state": "draining"}),
        _record(NODE_STATE, f"{NODE_GPUS} and on (node) ({READY}) unless on (node) ({CORDONED})",
                {"state": "in_service"}),
    ]


def namespace_rules(pools, catalog) -> List[Dict[str, Any]]:
    """Per node of a pool in service and namespace: GPU-equivalents allocated, and of them busy and idle."""
    in_service = f'{NODE_STATE}{{state="in_service"}}'
    terms = []
    for pool in pools:
        nodes = f'max by (node) ({NODE_GPUS}{{pool="{pool.name}"}})'
        for resource, share in gpu_share(pool, catalog).items():
            requests = f'kube_pod_container_resource_requests{{resource="{ksm_resource(resource)}"}}'
            terms.append(_with_pool(f"({requests} {UNFINISHED}) * {_number(share)} and on (node) {nodes}",
                                    pool.name))
    allocated = f"sum by (node, namespace, pool) ({' or '.join(terms)}) and on (node) {in_service}"
    # A physical GPU once per namespace, however many of its pods or MIG instances are busy.
    busy_gpus = (f'count by (node, namespace) (label_replace(max by (node, gpu, exported_namespace) '
                 f'(({GPU_BUSY_PCT}) >= {BUSY_PCT}), "namespace", "$1", "exported_namespace", "(.+)"))')
    busy_counted = (f"{busy_gpus} * on (node) group_left (pool) "
                    f"max by (node, pool) ({in_service} > bool 0)")
    allocated_now = NAMESPACE_ALLOCATED
    busy = f'{NAMESPACE_STATE}{{state="busy"}}'
    return [
        _record(NAMESPACE_ALLOCATED, allocated),
        # The smaller of busy and allocated: (busy <= allocated), else allocated where some are busy.
        _record(NAMESPACE_STATE, f"({busy_counted} <= {allocated_now}) or ({allocated_now} and {busy_counted})",
                {"state": "busy"}),
        _record(NAMESPACE_STATE, f"({allocated_now} - ignoring (state) {busy}) or {allocated_now}",
                {"state": "allocated_idle"}),
    ]


def pool_rules(pools, reservations: Reservations) -> List[Dict[str, Any]]:
    """Per pool: what is paid, and where it goes."""
    rules = []
    for pool in pools:
        of_pool = f'{{pool="{pool.name}"}}'
        registered = f"sum({NODE_GPUS}{of_pool})"
        not_ready = f'(sum({NODE_STATE}{{pool="{pool.name}", state="booting_or_gated"}}) or vector(0))'
        labels = {"pool": pool.name, "capacity": pool.spec.capacity}
        instances = paid_instances(pool, reservations)
        if instances is None:
            rules.append(_record(POOL_PAID, f"{registered} or vector(0)", labels))
            rules.append(_record(POOL_STATE, not_ready, {"pool": pool.name, "state": "booting_or_gated"}))
            continue
        reserved = instances * pool.gpus_per_node
        # More nodes than the reservation: those run, and bill, beyond it.
        rules.append(_record(POOL_PAID, f"({registered} > {reserved}) or vector({reserved})", labels))
        unlaunched = f"clamp_min(vector({reserved}) - ({registered} or vector(0)), 0)"
        rules.append(_record(POOL_STATE, f"{not_ready} + {unlaunched}",
                             {"pool": pool.name, "state": "booting_or_gated"}))
    in_service = f'sum by (pool) ({NODE_STATE}{{state="in_service"}})'
    allocated = f"sum by (pool) ({NAMESPACE_ALLOCATED})"
    for state in NAMESPACE_STATES:
        rules.append(_record(POOL_STATE, f'sum by (pool) ({NAMESPACE_STATE}{{state="{state}"}})', {"state": state}))
    rules.append(_record(POOL_STATE, f"({in_service} - {allocated}) or {in_service}", {"state": "unallocated"}))
    for state in ("draining", "repair"):
        rules.append(_record(POOL_STATE, f'sum by (pool) ({NODE_STATE}{{state="{state}"}})', {"state": state}))
    return rules


def ledger_group(pools, catalog, reservations: Reservations) -> Dict[str, Any]:
    """The recording rules as one PrometheusRule group. pools: the stack's ResolvedPools; reservations: what the
    account says of each pool's reservation (decisions.network.zones.AccountZones.reservations)."""
    return {"name": GROUP, "rules": node_rules(pools) + namespace_rules(pools, catalog)
            + pool_rules(pools, reservations)}


def records(group: Mapping[str, Any]) -> Sequence[str]:
    """The series the group records, each once."""
    return tuple(dict.fromkeys(rule["record"] for rule in group["rules"]))
