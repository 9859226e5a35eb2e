"""The plan document (`--json`) and its human rendering.

Document fields are a contract (version 1): version, project, stack, region, resources, outputs,
capacity, cost, warnings, policy. Fields may be added, never renamed.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Sequence

from decisions import requirements
from decisions.catalog import charts
from decisions.config import preflight
from decisions.config.validate import StackSpec
from decisions.cost import cost, transfer
from decisions.network.zones import reservations_from_table
from decisions.nodes import capacity_blocks, pods, scratch
from decisions.nodes import pools as pool_rules
from decisions.nodes.pools import efa_devices, offered_gpu_resources
from decisions.observability import alert_rules, dashboards, monitoring
from decisions.platform import acceptance, kueue
from decisions.serving import triton
from decisions.storage import lustre as lustre_rules
from decisions.storage import buckets, replication
from plan.engine import ACCOUNT_ID, ProgramRun
from plan.stackfile import peer_region
from plan.views import VIEW_NAMES, VIEWS, ViewFacts, computed_outputs

DOCUMENT_VERSION = 1
REQUIRED_FIELDS = {"version": int, "project": str, "stack": str, "region": str, "resources": list,
                   "outputs": dict, "capacity": list, "cost": dict, "policy": dict}
VIOLATION_FIELDS = ("policyName", "enforcementLevel", "message", "urn")   # as CrossGuard names them
VIOLATION_LEVELS = ("advisory", "mandatory")     # what a CrossGuard diagnostic carries (remediate reports mandatory)
RESOURCE_FIELDS = {"urn": str, "type": str, "name": str, "custom": bool, "inputs": dict, "dependencies": list,
                   "protect": bool, "retainOnDelete": bool}


def capacity_rows(spec: StackSpec) -> List[Dict[str, Any]]:
    rows = []
    for pool in spec.pools:
        s = pool.spec
        rows.append({
            "pool": s.name, "instanceTypes": list(s.instance_types),
            "gpuModel": " | ".join(dict.fromkeys(t.gpu.model for t in pool.types)),
            "gpusPerNode": pool.gpus_per_node, "capacity": s.capacity, "minNodes": s.min_nodes,
            "desiredNodes": s.desired_nodes, "maxNodes": s.max_nodes, "workload": s.workload, "efa": pool.efa,
            "availabilityZone": s.availability_zone, "gpusAtDesired": pool.gpus_per_node * s.desired_nodes,
            "gpusAtMax": pool.gpus_per_node * s.max_nodes, "maxPodsPerNode": pods.max_pods(pool.types, efa=pool.efa),
        })
    return rows


# Where the plan's reservation sizes and block terms come from (the program's `reservations` output).
RESERVATION_SOURCE = ("read from the account by the program (EC2 DescribeCapacityReservations through the stack's "
                      "provider, components/account.py); in this offline plan the mock account (plan/engine.py "
                      "offline_account) answers each reservation with its pool's maxNodes and a block with an "
                      "assumed 14-day term: `pulumi preview` shows the real ones")
KMS_KEY_TYPE = "aws:kms/key:Key"


def cost_section(spec: StackSpec, run: ProgramRun = None) -> Dict[str, Any]:
    """The whole bill (decisions/cost/cost.py): GPU pools and fixed costs, hourly and monthly, at desired and at max,
    with committed spend apart from pay-as-you-go and what has no price listed as a gap; reservations at the size the
    program read (`run`'s `reservations` output), capacity blocks paid upfront outside the run rate, what a
    commitment would save, and what is charged by use with its unit price."""
    read = run.outputs.get("reservations") if run is not None else None
    reservations = reservations_from_table(read) if read is not None else None
    kms_keys = len(run.of_type(KMS_KEY_TYPE)) if run is not None else None
    transfer_rows = transfer.transfer_costs(spec, cost.load_prices().region(spec.region), peer_region(spec.dr.peer_stack))
    estimate = cost.estimate(spec, reservations=reservations, kms_keys=kms_keys, transfer=transfer_rows)
    committed = estimate.committed_hourly
    # What the budget is checked on, by the rule the config check and the pack use (decisions/cost/cost.py over_budget).
    budget_rows = cost.budget_pool_costs(spec.pools, spec.catalog, spec.region, reservations=reservations,
                                         assumed=spec.budget.assumed)
    gpu_sources = gpu_price_sources(spec)

    def both(hourly_desired, hourly_max):
        return {"hourlyAtDesired": cost.per_hour(hourly_desired), "hourlyAtMax": cost.per_hour(hourly_max),
                "monthlyAtDesired": cost.monthly(hourly_desired), "monthlyAtMax": cost.monthly(hourly_max)}

    return {
        "currency": estimate.currency,
        **both(estimate.hourly_at_desired, estimate.hourly_at_max),
        "threeYearsAtDesired": cost.three_years(estimate.hourly_at_desired),
        "hoursPerMonth": cost.HOURS_PER_MONTH,
        "complete": estimate.complete,
        "gaps": estimate.gaps,
        # the same gaps by the names gpu-cloud:budget.unpriced acknowledges them by (decisions/cost/cost.py
        # unacknowledged: with a budget, a valid stack has acknowledged every one)
        "unpriced": [{"name": u.name, "item": u.item, "why": u.why,
                      "acknowledged": u.name in (spec.budget.unpriced if spec.budget else ())}
                     for u in estimate.unpriced],
        # The dates of the GPU on-demand prices the pools are priced at (each pool's basis cites its own).
        "pricesAsOf": ", ".join(dict.fromkeys(s.as_of for s in gpu_sources)) or "no GPU price recorded",
        "source": f"GPU on-demand prices: {'; '.join(s.cited for s in gpu_sources) or 'none recorded'} "
                  "(decisions/catalog/catalog.yaml); "
                  "fixed costs, spot and commitment discounts, capacity blocks and usage rates: "
                  "decisions/cost/prices.yaml (each item names its source and date; `weak` marks a single "
                  "third-party quote)",
        "scope": "GPU pools and fixed costs (control plane, system nodes, root volumes, NAT, endpoints, transit "
                 "gateway, FSx, load balancer); capacity blocks paid upfront and charges by use listed apart",
        "notEstimated": list(cost.NOT_ESTIMATED),
        "stale": estimate.stale,
        "reservationSource": RESERVATION_SOURCE if read is not None else "not read: each reservation sized at maxNodes",
        "reservations": [{"pool": p.pool, "capacity": p.capacity, "reservationId": p.reservation_id,
                          "billedInstances": p.nodes_at_max, "sizeSource": p.size_source}
                         for p in estimate.pools if p.reservation_id],
        "upfront": {
            "total": cost.cents(estimate.upfront_total),
            "blocks": [{"pool": p.pool, "instanceType": p.instance_type, "instances": p.committed_nodes,
                        "rateHourly": p.node_hourly, "start": p.block_start, "end": p.block_end, "hours": p.block_hours,
                        "total": cost.cents(p.upfront_total), "stale": p.stale, "gap": p.gap}
                       for p in estimate.blocks]},
        "commitmentOptions": [{
            "pool": o.pool, "capacity": o.capacity, "instanceType": o.instance_type, "family": o.family,
            "steadyNodes": o.nodes, "onDemandHourly": cost.per_hour(o.on_demand_hourly),
            "onDemandMonthly": cost.monthly(o.on_demand_hourly),
            "terms": [{"term": term, "commitment": key, "hourly": cost.per_hour(hourly), "monthly": cost.monthly(hourly),
                       "savingMonthly": cost.monthly(o.saving_hourly(term)),
                       "savingOverTerm": (cost.cents(o.saving_hourly(term) * cost.HOURS_PER_MONTH * months)
                                          if hourly is not None else None),
                       "basis": basis if hourly is not None else None, "gap": None if hourly is not None else basis}
                      for (term, key, hourly, basis), (_, months) in zip(o.terms, cost.COMMITMENT_TERMS)],
        } for o in estimate.commitments],
        "usageBased": [{"item": u.item, "unit": u.unit, "unitUsd": u.unit_usd, "quantity": u.quantity,
                        "monthly": cost.cents(u.monthly), "source": u.source, "asOf": u.as_of, "weak": u.weak,
                        "gap": u.gap}
                       for u in estimate.usage],
        "budgetMaxHourlyUsd": spec.budget.max_hourly_usd if spec.budget else None,
        "budgetCovers": "GPU pools at maxNodes",
        "budgetUnpriced": list(spec.budget.unpriced) if spec.budget else [],
        "budgetAssumed": {name: a.model_dump(by_alias=True) for name, a in spec.budget.assumed.items()},
        # what the budget check sums (decisions/cost/cost.py budget_hourly, as decisions/config/validate.py and the
        # pack): every priced pool at max, a capacity block while it runs, no commitment's discount
        "budgetHourlyAtMax": cost.per_hour(cost.budget_hourly(budget_rows)),
        # the budget rule's verdict on that figure (decisions/cost/cost.py over_budget); None without a budget
        "withinBudget": (cost.over_budget(budget_rows, spec.budget.max_hourly_usd) is None
                         if spec.budget.max_hourly_usd is not None else None),
        "gpuPools": both(estimate.pools_hourly_at_desired, estimate.pools_hourly_at_max),
        "fixedCosts": both(estimate.fixed_hourly_at_desired, estimate.fixed_hourly_at_max),
        "committed": {"hourly": cost.per_hour(committed), "monthly": cost.monthly(committed),
                      "upfrontHourly": cost.per_hour(estimate.upfront_hourly), "threeYears": cost.three_years(committed)},
        "payAsYouGo": both(estimate.hourly_at_desired - committed, estimate.hourly_at_max - committed),
        "savingVsOnDemand": both(estimate.saving_hourly("desired"), estimate.saving_hourly("max")),
        "pools": [{
            "pool": p.pool, "capacity": p.capacity, "instanceType": p.instance_type,
            "nodeHourly": cost.per_hour(p.node_hourly), "onDemandNodeHourly": p.on_demand_node_hourly,
            "committedNodeHourly": cost.per_hour(p.committed_node_hourly),
            "billedNodesAtDesired": p.nodes_at_desired, "billedNodesAtMax": p.nodes_at_max,
            "committedNodes": p.committed_nodes, "upfront": p.upfront, "commitment": p.commitment,
            "committedHourly": cost.per_hour(p.committed_hourly),
            "commitmentTermTotal": (cost.cents(p.committed_hourly * cost.HOURS_PER_MONTH * p.commitment_months)
                                    if p.commitment and p.committed_hourly is not None else None),
            **both(p.hourly_at_desired, p.hourly_at_max),
            "onDemandHourlyAtDesired": cost.per_hour(p.on_demand_hourly(p.nodes_at_desired)),
            "onDemandHourlyAtMax": cost.per_hour(p.on_demand_hourly(p.nodes_at_max)),
            "basis": p.basis, "gap": p.gap, "inRunRate": p.in_run_rate, "reservationId": p.reservation_id,
        } for p in estimate.pools],
        "fixed": [{
            "item": f.item, "unit": f.unit, "quantityAtDesired": f.quantity_at_desired, "quantityAtMax": f.quantity_at_max,
            "unitHourly": None if f.unit_hourly is None else round(f.unit_hourly, 6),
            **both(f.hourly_at_desired, f.hourly_at_max), "source": f.source, "asOf": f.as_of, "weak": f.weak,
            "gap": f.gap,
        } for f in estimate.fixed],
    }


def repair_section(spec: StackSpec, run: ProgramRun) -> Dict[str, Any]:
    """How each pool's sick nodes are replaced (docs/repair.md): launch first where a reservation has a spare slot, as
    the program read it (decisions/nodes/pools.py launches_first), terminate first in a reservation without one, and
    terminate and launch at once elsewhere."""
    read = reservations_from_table(run.outputs.get("reservations") or {})
    rows = []
    for pool in spec.pools:
        rid = pool.spec.capacity_reservation_id
        found = read.get(rid or "")
        held = getattr(found, "instance_count", None)
        if pool_rules.launches_first(pool, read):
            how, why = "launch first", f"{rid} holds {held} instances for maxNodes {pool.spec.max_nodes}: a spare slot"
        elif pool.spec.reserved_capacity:
            how, why = "terminate first", (f"{rid} holds {held if held is not None else 'an unread number of'} "
                                           f"instances for maxNodes {pool.spec.max_nodes}: no spare slot")
        else:
            how, why = "terminate and launch at once", f"{pool.spec.capacity}: the group launches without waiting"
        rows.append({"pool": pool.name, "replacement": how, "why": why})
    return {"pools": rows, "reservationSource": RESERVATION_SOURCE}


def gpu_price_sources(spec: StackSpec) -> List[Any]:
    """Where the on-demand prices of the stack's pools were read, and when (decisions/catalog/catalog.yaml
    priceSources, or an offer's own): each once, in pool order; the region's entry when no pool has a price."""
    found = [spec.catalog.price_source(t.name, spec.region) for pool in spec.pools for t in pool.types
             if t.regions.get(spec.region) is not None and t.regions[spec.region].on_demand_usd is not None]
    found = list(dict.fromkeys(s for s in found if s is not None))
    region = spec.catalog.price_sources.get(spec.region)
    return found or ([region] if region else [])


def build_document(spec: StackSpec, run: ProgramRun, policy: Mapping[str, Any],
                   warnings: Sequence[str] = (), views: Mapping[str, ViewFacts] = ()) -> Dict[str, Any]:
    """The plan document. `views`: the preview views' facts (plan/views.py), recorded so that the pack can judge
    the document as any of them would see it."""
    return _whole_numbers_as_integers({
        "version": DOCUMENT_VERSION,
        "project": run.project,
        "stack": run.stack,
        "region": run.region,
        "resources": [{
            "urn": r.urn, "type": r.type, "name": r.name, "custom": r.custom, "parent": r.parent,
            "provider": r.provider.rsplit("::", 1)[0] if r.provider else None,
            "inputs": r.inputs, "dependencies": list(r.dependencies), "protect": r.protect,
            "retainOnDelete": r.retain_on_delete, "ignoreChanges": list(r.ignore_changes),
            "replaceOnChanges": list(r.replace_on_changes), "deleteBeforeReplace": r.delete_before_replace,
            "customTimeouts": dict(r.custom_timeouts), "aliases": list(r.aliases), "deletedWith": r.deleted_with,
            # what the provider adds to the inputs (IDs, ARNs, endpoints): the outputs stack policies see
            "computedOutputs": computed_outputs(r.inputs, r.state),
            "propertyDependencies": {key: list(urns) for key, urns in r.property_dependencies.items()},
        } for r in sorted(run.resources, key=lambda r: r.urn)],   # sorted: registration order varies run to run
        "outputs": run.outputs,
        "capacity": capacity_rows(spec),
        "cost": cost_section(spec, run),
        "repair": repair_section(spec, run),
        "nodeImage": node_image_section(spec),
        "platform": platform_section(spec),
        "storage": storage_section(spec),
        "monitoring": monitoring_section(spec, run),
        "inference": inference_section(spec, run),
        "preflight": preflight_section(spec),
        "warnings": list(warnings),
        "policyViews": {view: facts.to_document() for view, facts in dict(views).items()},
        "policy": dict(policy),
    })


def at_initial_sizes(document: Mapping[str, Any], spec: StackSpec, run: ProgramRun,
                     sizes: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The document with its capacity and cost figures at the initial size each pool's group has after the change
    (`sizes`: plan/diff.py initial_sizes), where that is not its desiredNodes: what --against compares. The figures
    are the plan's own (capacity_rows, cost_section), so everything desiredNodes drives moves with it: GPUs, the
    pool's rate, its nodes' root volumes, a commitment's steady nodes."""
    kept = {pool: size["applied"] for pool, size in sizes.items() if size["applied"] != size["new"]}
    if not kept:
        return document
    at = replace(spec, pools=tuple(
        replace(p, spec=p.spec.model_copy(update={"desired_nodes": kept[p.name]})) if p.name in kept else p
        for p in spec.pools))
    return {**document, **_whole_numbers_as_integers({"capacity": capacity_rows(at), "cost": cost_section(at, run)})}


def _whole_numbers_as_integers(value: Any) -> Any:
    """30, not 30.0: the engine's wire and the config model carry every number as a double, but a reader (and
    `pulumi stack export`) sees the integer the stack file gave."""
    if isinstance(value, dict):
        return {key: _whole_numbers_as_integers(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_whole_numbers_as_integers(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def monitoring_section(spec: StackSpec, run: ProgramRun) -> Dict[str, Any]:
    """Where metrics are kept, where alerts go (whether a webhook is set, never its URL), the alert rules with their
    thresholds as rendered, and the dashboards."""
    settings, triton = spec.monitoring, spec.inference.triton
    groups = alert_rules.rule_groups(settings.alerts, spec.pools, spec.catalog,
                                     triton.target_queue_ms if triton.enabled else None)
    webhook = any(r.type == "kubernetes:core/v1:Secret" and r.inputs.get("metadata", {}).get("name") ==
                  monitoring.WEBHOOK_SECRET for r in run.resources)
    return {
        "chart": f"{charts.KUBE_PROMETHEUS_STACK} {charts.chart(charts.KUBE_PROMETHEUS_STACK).version}",
        "retentionDays": settings.retention_days, "volumeGiB": settings.prometheus_volume_gib,
        "retentionSize": monitoring.retention_size(settings.prometheus_volume_gib),
        "webhook": webhook,
        "alerts": [{"group": g["name"], "alert": r["alert"], "for": r["for"], "severity": r["labels"]["severity"],
                    "pool": r["labels"].get("pool")} for g in groups for r in g["rules"]],
        "dashboards": sorted(model["title"] for model in dashboards.dashboards().values()),
    }


def inference_section(spec: StackSpec, run: ProgramRun) -> Dict[str, Any]:
    """Triton when the stack runs it: where it runs, how it scales, where clients reach it."""
    settings, dr = spec.inference.triton, spec.dr
    if not settings.enabled:
        return {"triton": None}
    models = run.outputs.get("buckets", {}).get(buckets.MODELS, {}).get("name")
    return {"triton": {
        "image": triton.IMAGE, "pool": settings.pool, "minReplicas": settings.min_replicas,
        "maxReplicas": settings.max_replicas, "targetQueueMs": settings.target_queue_ms, "scheme": settings.scheme,
        "modelRepository": settings.model_repository or f"s3://{models}/{triton.NAME}",
        "endpoint": run.outputs.get("inferenceEndpoint"),
        "dns": ({"domain": dr.domain, "routing": dr.routing, "role": dr.role}
                if dr.role in ("primary", "secondary") else None)}}


def preflight_section(spec: StackSpec) -> Dict[str, Any]:
    """What the first `pulumi up` reads or counts before creating anything (decisions/config/preflight.py): the vCPU
    quotas the pools draw on, the zones every interface endpoint service must be offered in, and each pool's ASG tag
    count."""
    from components.network import INTERFACE_ENDPOINTS

    return {
        "quotas": [{"quotaCode": code, "quotaName": need.quota.name, "pools": [name for _, name, _ in need.pools],
                    "vcpusAtDesired": need.at_desired, "vcpusAtMax": need.at_max,
                    "awsDefaultVcpus": need.quota.default_vcpus}
                   for code, need in preflight.quota_demand(spec.pools).items()],
        "interfaceEndpoints": {"services": list(INTERFACE_ENDPOINTS.values()), "zones": list(spec.network.zones)},
        "autoScalingTags": [{"pool": pool.name, "tags": len(preflight.asg_tags(pool, spec.cluster_name,
                                                                               spec.resource_tags,
                                                                               spec.storage.nvme_scratch))}
                            for pool in spec.pools],
        "autoScalingTagsMax": preflight.ASG_TAGS_MAX,
    }


def node_image_section(spec: StackSpec) -> Dict[str, Any]:
    image = spec.node_image
    return {"release": image.release, "amiName": image.ami_name, "ssmParameter": image.ssm_parameter,
            "driverSource": image.source, "driverBranch": image.driver_branch, "driverVersion": image.driver_version}


def platform_section(spec: StackSpec) -> Dict[str, Any]:
    """What each pool's nodes offer to pods, and the training queue's flavors in admission order."""
    efa_pools = [pool.spec.name for pool in spec.pools if pool.efa]
    flavors = kueue.flavors(spec.pools, spec.catalog)
    blocks = kueue.block_flavors(flavors)
    return {
        "gpuOperator": charts.chart(charts.GPU_OPERATOR).version,
        "efaDevicePlugin": charts.chart(charts.EFA_DEVICE_PLUGIN).version if efa_pools else None,
        "kueue": charts.chart(charts.KUEUE).version,
        "mpiOperator": charts.manifest(charts.MPI_OPERATOR).version,
        "jobset": charts.manifest(charts.JOBSET).version,
        "pools": [{"pool": pool.spec.name, "sharing": pool.spec.gpu_sharing.mode,
                   "offersPerNode": {**offered_gpu_resources(pool, spec.catalog),
                                     **({kueue.EFA_RESOURCE: efa_devices(pool)} if pool.efa else {})}}
                  for pool in spec.pools],
        "trainingQueue": {
            "clusterQueue": kueue.CLUSTER_QUEUE, "localQueues": list(kueue.LOCAL_QUEUES),
            # The flavors and queue wait for Kueue's webhooks to answer, not only for its pods
            # (decisions/platform/kueue.py).
            "webhookWait": {"job": f"{kueue.NAMESPACE}/{kueue.WEBHOOK_PROBE}", "probeSeconds": kueue.WEBHOOK_PROBE_DEADLINE_S,
                            "timeoutSeconds": kueue.WEBHOOK_PROBE_TIMEOUT_S},
            # One per pool, named as the pool; a job is admitted only where it tolerates every taint listed.
            # A capacity block's flavor also runs the admission check of decisions/nodes/capacity_blocks.py.
            "flavors": [{"name": f.name, "capacity": f.capacity, "quotas": dict(f.quotas),
                         "mustTolerate": [f"{t.key}={t.value}:{t.effect}" for t in f.node_taints],
                         "admissionChecks": [kueue.ADMISSION_CHECK] if f.name in blocks else []}
                        for f in flavors],
            "priorityClasses": [{"name": p.name, "value": p.value} for p in kueue.PRIORITY_CLASSES],
            # Suspended without gpu-cloud:training.nvlinkCheckSchedule: run by hand (README: NCCL acceptance).
            "nvlinkChecks": [{"pool": pool.spec.name,
                              "schedule": acceptance.nvlink_check_schedule(pool, spec.training.nvlink_check_schedule)}
                             for pool in acceptance.nvlink_check_pools(spec.pools, spec.catalog)],
            # On EFA pools that keep two nodes, on gpu-cloud:training.acrossNodeCheckSchedule (weekly by default).
            "acrossNodeChecks": [{"pool": pool.spec.name, "schedule": spec.training.across_node_check_schedule}
                                 for pool in acceptance.across_node_check_pools(spec.pools, spec.catalog)],
        },
    }


def storage_section(spec: StackSpec, account_id: str = ACCOUNT_ID) -> Dict[str, Any]:
    """The buckets (and what replicates where), NVMe scratch per pool against the hot tier, and the Lustre file
    system when the stack has one. Bucket names carry the account: the offline plan's unless told otherwise."""
    lustre = spec.storage.lustre
    names = {purpose: buckets.bucket_name(spec.project, spec.stack, account_id, purpose) for purpose in buckets.PURPOSES}
    # the peer a primary replicates to, by stack name (dr.peerStack is org/gpu-cloud/<stack>); a secondary replicates
    # nothing outward
    peer = spec.dr.peer_stack.rsplit("/", 1)[-1] if spec.dr.role == "primary" and spec.dr.peer_stack else None
    return {"buckets": [bucket_row(spec, purpose, names[purpose]) for purpose in buckets.PURPOSES],
            "nvmeScratch": spec.storage.nvme_scratch, "hotTierReadIops": scratch.HOT_TIER_READ_IOPS,
            "scratch": scratch.scratch_rows(spec.pools, spec.catalog, spec.storage.nvme_scratch),
            "lustre": None if lustre is None else {
                "capacityGiB": lustre.capacity_gib, "throughputPerTiB": lustre.throughput_per_tib,
                "efa": lustre.efa, "importPath": lustre.import_path or f"s3://{names[buckets.DATASETS]}/",
                # null: no final backup to wait for, the provider's own 30 minutes
                "deleteTimeout": None,
                # what keeps the data: the export to S3 (FSx backs up no linked file system)
                "protection": {"kind": lustre_rules.PROTECTION, "exportEvents": list(lustre_rules.EXPORT_EVENTS),
                               "backupRetentionDays": lustre_rules.BACKUP_RETENTION_DAYS,
                               "finalBackup": lustre_rules.FINAL_BACKUP,
                               "summary": lustre_rules.protection_summary(lustre.import_path, peer)}},
            "lustreLatency": scratch.LUSTRE_LATENCY, "lustreLatencyNote": scratch.LUSTRE_LATENCY_NOTE}


def bucket_row(spec: StackSpec, purpose: str, name: str) -> Dict[str, Any]:
    life = buckets.lifecycle(purpose, spec.log_retention_days)
    replicated = purpose in buckets.REPLICATED and spec.dr.role != "none"
    return {"purpose": purpose, "name": name, "noncurrentDays": life.noncurrent_days,
            "abortUploadDays": life.abort_upload_days, "expireDays": life.expire_days,
            "transition": {"days": life.transition[0], "storageClass": life.transition[1]} if life.transition else None,
            # a primary replicates to the peer; a secondary's bucket is where the primary's replicas land
            "replication": None if not replicated else {
                "role": spec.dr.role, "peerStack": spec.dr.peer_stack,
                "recoveryPointMinutes": replication.REPLICATION_TIME_MINUTES}}


def document_problems(document: Any) -> List[str]:
    """What is wrong with a plan document (empty when it is a valid version-1 document)."""
    if not isinstance(document, dict):
        return ["the document is not a JSON object"]
    problems = [f"field {key!r} is missing or not a {kind.__name__}" for key, kind in REQUIRED_FIELDS.items()
                if not isinstance(document.get(key), kind)]
    if document.get("version") not in (None, DOCUMENT_VERSION) and isinstance(document.get("version"), int):
        problems.append(f"version {document['version']} is not supported (expected {DOCUMENT_VERSION})")
    for i, resource in enumerate(document.get("resources") or []):
        if not isinstance(resource, dict):
            problems.append(f"resources[{i}] is not an object")
            continue
        problems += [f"resources[{i}].{key} is missing or not a {kind.__name__}"
                     for key, kind in RESOURCE_FIELDS.items() if not isinstance(resource.get(key), kind)]
    violations = (document.get("policy") or {}).get("violations") if isinstance(document.get("policy"), dict) else None
    if not isinstance(violations, list):
        problems.append("policy.violations is missing or not a list")
    for i, violation in enumerate(violations or []):
        # CrossGuard's diagnostic fields; a level outside what a diagnostic carries could hide a mandatory one.
        if not isinstance(violation, dict):
            problems.append(f"policy.violations[{i}] is not an object")
            continue
        problems += [f"policy.violations[{i}].{key} is missing or not a str" for key in VIOLATION_FIELDS
                     if not isinstance(violation.get(key), str)]
        if isinstance(violation.get("enforcementLevel"), str) and violation["enforcementLevel"] not in VIOLATION_LEVELS:
            problems.append(f"policy.violations[{i}].enforcementLevel {violation['enforcementLevel']!r} is not one of "
                            f"{', '.join(VIOLATION_LEVELS)}")
    return problems


def render_text(document: Mapping[str, Any], summary_only: bool = False) -> str:
    """The report: the summary (`summary_lines`), then each section; `summary_only` (--quiet): the summary alone."""
    lines = summary_lines(document)
    if summary_only:
        return "\n".join(lines)
    lines += [""] + _resource_tree(document) + [""]
    lines += _capacity_table(document["capacity"]) + [""]
    lines += _network_table(document["outputs"].get("zones") or []) + [""]
    if document.get("preflight"):
        lines += _preflight_lines(document["preflight"]) + [""]
    lines += _cost_table(document["cost"]) + [""]
    if document.get("repair"):
        lines += _repair_lines(document["repair"]) + [""]
    lines += _node_image_lines(document["nodeImage"]) + [""]
    lines += _platform_lines(document["platform"]) + [""]
    lines += _storage_lines(document["storage"]) + [""]
    lines += _monitoring_lines(document["monitoring"]) + [""]
    lines += _inference_lines(document["inference"]) + [""]
    if document.get("warnings"):
        lines += ["Warnings:"] + [f"  - {w}" for w in document["warnings"]] + [""]
    lines += _policy_lines(document["policy"])
    lines += ["", f"Design ledger: {requirements.summary(requirements.load_requirements())} (docs/requirements.md)"]
    return "\n".join(lines)


def summary_lines(document: Mapping[str, Any]) -> List[str]:
    """The verdict in at most ten lines, before any detail (issue 41): the stack, its GPUs, its bill against its
    budget, what has no price, the pack's verdict in each engine view and how many warnings. Every figure is the
    document's own; the details below say where each comes from."""
    capacity, section, policy = document["capacity"], document["cost"], document["policy"]
    gaps, warnings = section.get("gaps", []), document.get("warnings", [])
    budget = section.get("budgetMaxHourlyUsd")
    verdict = ("no budget (gpu-cloud:budget.maxHourlyUsd)" if budget is None else
               f"{'within' if section['withinBudget'] else 'OVER'} budget {_usd(budget)}/h "
               f"({section['budgetCovers']} {_usd(section['budgetHourlyAtMax'])}/h)")
    if policy.get("skipped"):
        views = f"not run ({policy['skipped']})"
    else:
        judged = {policy["view"]: (len(policy["violations"]),
                                   sum(v["enforcementLevel"] == "mandatory" for v in policy["violations"]))}
        judged.update({view: (counts["violations"], counts["mandatory"])
                       for view, counts in (policy.get("otherViews") or {}).items()})
        views = "; ".join(f"{view}: {_counted(*judged[view])}" for view in VIEWS if view in judged)
    return [
        f"gpu-cloud plan: stack {document['stack']} (project {document['project']}, region {document['region']})",
        f"  GPUs      {sum(r['gpusAtDesired'] for r in capacity)} now (desired), "
        f"{sum(r['gpusAtMax'] for r in capacity)} at max, in {len(capacity)} pool{'' if len(capacity) == 1 else 's'}",
        f"  cost      {_usd(section['hourlyAtDesired'])}/h now, {_usd(section['hourlyAtMax'])}/h at max; {verdict}",
        "  unpriced  " + _unpriced_summary(section.get("unpriced", []), len(gaps), section.get("budgetAssumed") or {}),
        f"  policy    {views}",
        "  warnings  " + (f"{len(warnings)} (listed under Warnings)" if warnings else "none"),
    ]


def _unpriced_summary(unpriced: Sequence[Mapping[str, Any]], gaps: int, assumed: Mapping[str, Any]) -> str:
    """"none", or how many items the totals leave out and which of them the stack acknowledged by name; then the
    pools priced by the stack's own assumption, which the totals count."""
    told = _gaps_summary(unpriced, gaps)
    if assumed:
        told += f"; {len(assumed)} priced by the stack's assumption ({', '.join(assumed)}: gpu-cloud:budget.assumed)"
    return told


def _gaps_summary(unpriced: Sequence[Mapping[str, Any]], gaps: int) -> str:
    if not gaps:
        return "none"
    acknowledged = [u["name"] for u in unpriced if u["acknowledged"]]
    # With a budget every gap is acknowledged (or the stack is refused); without one, none can be.
    told = (f"{len(acknowledged)} acknowledged unpriced ({', '.join(acknowledged)})" if acknowledged else
            f"{gaps} item{'' if gaps == 1 else 's'}")
    return f"{told}, left out of every total (listed under Hourly cost)"


# The architecture's layers in the order a reader meets them (the tree and the picture both follow it);
# a component type not listed is "platform".
LAYERS = {
    "gpu-cloud:network:Network": "network",
    "gpu-cloud:cluster:EksCluster": "cluster",
    "gpu-cloud:nodepool:GpuNodePool": "GPU node pools",
    "gpu-cloud:buckets:SecureBucket": "storage",
    "gpu-cloud:lustre:Lustre": "storage",
    "gpu-cloud:replication:Replication": "storage",
}
LAYER_ORDER = ("network", "cluster", "GPU node pools", "storage", "platform")
POOL_TYPE = "gpu-cloud:nodepool:GpuNodePool"


def layer(type_token: str) -> str:
    return LAYERS.get(type_token, "platform")


def reading_order(document: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], tuple]:
    """Sort key for components: by layer, GPU pools in the stack file's order, the rest by name (registration
    order varies run to run, so it cannot be the order)."""
    pools = [row["pool"] for row in document.get("capacity") or []]

    def key(resource: Mapping[str, Any]) -> tuple:
        name = resource["name"]
        position = pools.index(name) if resource["type"] == POOL_TYPE and name in pools else len(pools)
        return LAYER_ORDER.index(layer(resource["type"])), position, name
    return key


def top_level(resource: Mapping[str, Any], by_urn: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The resource's outermost ancestor below the stack (itself when it has none)."""
    while resource.get("parent") in by_urn:
        resource = by_urn[resource["parent"]]
    return resource


def resources_in_reading_order(document: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """Every resource, grouped under its top-level component in reading order (stack-level ones last), by URN within
    a component: the order in which a report about resources (the policy verdict) names them."""
    by_urn = {r["urn"]: r for r in document["resources"]}
    order = reading_order(document)

    def key(resource: Mapping[str, Any]) -> tuple:
        root = top_level(resource, by_urn)
        return (root["custom"], order(root) if not root["custom"] else (), resource["urn"])
    return sorted(document["resources"], key=key)


def _resource_tree(document: Mapping[str, Any]) -> List[str]:
    """Each top-level component, its resources counted by type, then its child components the same way, indented;
    a component's figure counts everything beneath it."""
    resources = document["resources"]
    children: Dict[Any, List[Mapping[str, Any]]] = {}
    urns = {r["urn"] for r in resources}
    for r in resources:
        children.setdefault(r["parent"] if r.get("parent") in urns else None, []).append(r)
    order = reading_order(document)

    def size(urn: str) -> int:
        return sum(1 + size(child["urn"]) for child in children.get(urn, []))

    def is_branch(r: Mapping[str, Any]) -> bool:   # a provider's own component (yaml/v2 ConfigFile) is a leaf here
        return not r["custom"] and (r["urn"] in children or r["type"].startswith("gpu-cloud:"))

    def branch(members: List[Mapping[str, Any]], depth: int) -> List[str]:
        indent = "  " * depth
        counts = Counter(r["type"] for r in members if not is_branch(r))
        lines = [f"{indent}{count:>3} x {kind}" for kind, count in sorted(counts.items())]
        for component in sorted(filter(is_branch, members), key=order):
            lines.append(f"{indent}{component['name']} ({component['type']}): {size(component['urn'])}")
            lines += branch(children.get(component["urn"], []), depth + 1)
        return lines

    top = children.get(None, [])
    lines = [f"Resources: {len(resources)} ({sum(1 for r in resources if r['custom'])} cloud resources), per component "
             "(its figure counts all beneath it):"]
    lines += branch(list(filter(is_branch, top)), 1)
    stack_level = [r for r in top if not is_branch(r)]
    if stack_level:
        lines.append(f"  (stack level): {len(stack_level)}")
        lines += branch(stack_level, 2)
    return lines


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*map(str, row)) for row in rows]
    return [("  " + line).rstrip() for line in lines]


def _capacity_table(rows: List[Mapping[str, Any]]) -> List[str]:
    body = [[r["pool"], ",".join(r["instanceTypes"]), r["gpuModel"], r["gpusPerNode"], r["maxPodsPerNode"], r["capacity"],
             f"{r['minNodes']}/{r['desiredNodes']}/{r['maxNodes']}", r["gpusAtDesired"], r["gpusAtMax"]] for r in rows]
    total = ["total", "", "", "", "", "", "", sum(r["gpusAtDesired"] for r in rows), sum(r["gpusAtMax"] for r in rows)]
    return ["GPU capacity:"] + _table(
        ["pool", "instance types", "GPU", "GPUs/node", "pods/node", "capacity", "min/desired/max", "GPUs@desired",
         "GPUs@max"],
        body + [total])


def _preflight_lines(section: Mapping[str, Any]) -> List[str]:
    rows = [[q["quotaCode"], q["quotaName"], q["vcpusAtDesired"], q["vcpusAtMax"],
             f"{q['awsDefaultVcpus']}: request {q['vcpusAtMax']}" if q["awsDefaultVcpus"] < q["vcpusAtMax"] else
             q["awsDefaultVcpus"], ", ".join(q["pools"])] for q in section["quotas"]]
    endpoints = section["interfaceEndpoints"]
    tags = ", ".join(f"{t['pool']} {t['tags']}" for t in section["autoScalingTags"])
    return (["Preflight (what AWS would refuse; `pulumi preview` reads the account, this plan assumes it holds what "
             "the stack needs):"]
            + (_table(["vCPU quota", "name", "vCPUs@desired", "vCPUs@max", "AWS default", "pools"], rows) if rows
               else ["  no pool draws on an EC2 vCPU quota (reserved and capacity-block pools use their reservation)"])
            + [f"  interface endpoints: {len(endpoints['services'])} services, each must be offered in "
               f"{', '.join(endpoints['zones'])}",
               f"  Auto Scaling tags per group (at most {section['autoScalingTagsMax']}): {tags}"])


def _network_table(zones: List[Mapping[str, Any]]) -> List[str]:
    body = [[z["zoneId"], z["zoneName"], z["privateSubnet"], z["publicSubnet"],
             f"{z['addressesAtMax']} of {z['usableAddresses']}", ", ".join(z["pools"]) or "-"] for z in zones]
    return ["Network (zones in subnet order; addresses the system nodes and pools may take at maxNodes):"] + _table(
        ["zone ID", "name", "private subnet", "public subnet", "addresses", "GPU pools"], body)


def _usd(value) -> str:
    return "no price" if value is None else f"${value:,.2f}"


def _cost_table(section: Mapping[str, Any]) -> List[str]:
    hours = section.get("hoursPerMonth", 730)

    def run_rate(p, key):   # a capacity block is paid upfront: its row shows no run rate
        return _usd(p[key]) if p.get("inRunRate", True) else "upfront"
    body = [[p["pool"], p["capacity"] + (" (upfront)" if p.get("upfront") else ""), _usd(p["nodeHourly"]),
             f"{p.get('billedNodesAtDesired', '')}/{p.get('billedNodesAtMax', '')}", run_rate(p, "hourlyAtDesired"),
             run_rate(p, "hourlyAtMax"), run_rate(p, "monthlyAtMax")] for p in section["pools"]]
    body += [[f["item"], "fixed", _usd(f["unitHourly"]), f"{f['quantityAtDesired']:g}/{f['quantityAtMax']:g}",
              _usd(f["hourlyAtDesired"]), _usd(f["hourlyAtMax"]), _usd(f.get("monthlyAtMax"))]
             for f in section.get("fixed", [])]
    # A total that leaves a gap out says so on its own line, not only in the gaps list below.
    incomplete = cost.incomplete_note(section.get("gaps", []))
    body.append(["total" + incomplete, "", "", "", _usd(section["hourlyAtDesired"]), _usd(section["hourlyAtMax"]),
                 _usd(section.get("monthlyAtMax"))])
    lines = [f"Hourly cost ({section['currency']}, prices as of {section['pricesAsOf']}; {section['scope']}; "
             f"a month is {hours} hours):"]
    lines += _table(["item", "capacity", "per unit/hour", "billed desired/max", "at desired", "at max", "monthly at max"],
                    body)
    if "committed" in section:
        committed, payg, saving = section["committed"], section["payAsYouGo"], section["savingVsOnDemand"]
        lines.append(f"  committed (billed whatever runs): {_usd(committed['hourly'])}/hour, {_usd(committed['monthly'])}"
                     f"/month, {_usd(committed['threeYears'])} over three years; of it paid upfront: "
                     f"{_usd(committed['upfrontHourly'])}/hour")
        lines.append(f"  pay-as-you-go: {_usd(payg['hourlyAtDesired'])}/hour at desired, {_usd(payg['hourlyAtMax'])}"
                     "/hour at max")
        lines.append(f"  three years at desired: {_usd(section['threeYearsAtDesired'])}{incomplete}; saving against "
                     "the same GPUs "
                     f"all on-demand: {_usd(saving['hourlyAtDesired'])}/hour at desired "
                     f"({_usd(saving['monthlyAtDesired'])}/month), {_usd(saving['hourlyAtMax'])}/hour at max")
        for p in section["pools"]:
            if p.get("commitment"):
                lines.append(f"  {p['pool']}: {p['commitment']}, {_usd(p['committedHourly'])}/hour committed, "
                             f"{_usd(p['commitmentTermTotal'])} over the term")
    if section.get("budgetMaxHourlyUsd") is not None:
        covered = section.get("budgetHourlyAtMax", section.get("gpuPools", {}).get("hourlyAtMax"))
        lines.append(f"  budget: {_usd(section['budgetMaxHourlyUsd'])}/hour for "
                     f"{section.get('budgetCovers', 'pools at max')}" + (f" (now {_usd(covered)}"
                     f"{cost.incomplete_note([p['pool'] for p in section['pools'] if p.get('gap')])})"
                     if covered is not None else ""))
    for p in section["pools"]:
        if p.get("basis") and "ASSUMED" in p["basis"]:
            lines.append(f"  assumed: {p['pool']}: {p['basis']}")
    for r in section.get("reservations", []):
        lines.append(f"  billed size: {r['pool']}: {r['sizeSource']}")
    if section.get("reservations"):
        lines.append(f"    (sizes {section['reservationSource']})")
    lines += [f"  STALE: {line}" for line in section.get("stale", [])]
    if not section.get("complete", True):
        lines.append("  gaps (no price, left out of the totals):")
        lines += [f"    - {gap}" for gap in section.get("gaps", [])] or \
                 ["    - some pools have no price in the catalog for this region"]
    if section.get("notEstimated"):
        lines.append("  not estimated (charged by use): " + "; ".join(section["notEstimated"]))
    lines += _upfront_lines(section.get("upfront"))
    lines += _commitment_lines(section.get("commitmentOptions"))
    lines += _usage_lines(section.get("usageBased"))
    return lines


def _repair_lines(section: Mapping[str, Any]) -> List[str]:
    return (["Replacing a sick node (docs/repair.md):"]
            + [f"  {r['pool']}: {r['replacement']} ({r['why']})" for r in section["pools"]]
            + [f"    (reservation sizes {section['reservationSource']})"])


def _upfront_lines(upfront) -> List[str]:
    if not upfront or not upfront["blocks"]:
        return []
    body = [[b["pool"], b["instanceType"], b["instances"], _usd(b["rateHourly"]), b["start"] or "not read",
             b["end"] or "not read", "-" if b["hours"] is None else f"{b['hours']:g}",
             _usd(b["total"]) if b["gap"] is None else "no price"] for b in upfront["blocks"]]
    lines = ["", "Paid upfront (capacity blocks: rate x instances x hours, once, at purchase; outside the run rate):"]
    lines += _table(["pool", "instance type", "instances", "rate/hour", "start", "end", "hours", "upfront"], body)
    unpriced = [b["pool"] for b in upfront["blocks"] if b["gap"] is not None]
    lines.append(f"  upfront total: {_usd(upfront['total'])}{cost.incomplete_note(unpriced)}")
    return lines


def _commitment_lines(options) -> List[str]:
    if options is None:
        return []
    if not options:
        return ["", "Commitments: no on-demand or reserved pool to commit (spot and capacity blocks take none)"]
    terms = [t["term"] for t in options[0]["terms"]]
    kinds = ", ".join(dict.fromkeys(t["commitment"] for o in options for t in o["terms"]))
    body = []
    for o in options:
        row = [o["pool"], o["instanceType"], o["steadyNodes"], _usd(o["onDemandMonthly"])]
        for t in o["terms"]:
            row.append("no sourced rate" if t["gap"] else f"{_usd(t['monthly'])} (saves {_usd(t['savingMonthly'])})")
        body.append(row)
    lines = ["", f"Commitments: what 1 or 3 years would bill on the steady nodes ({kinds}), a month against on-demand:"]
    lines += _table(["pool", "instance type", "steady nodes", "on-demand"] + terms, body)
    missing: Dict[str, List[str]] = {}
    for o in options:
        for t in o["terms"]:
            if t["gap"] and o["family"] not in missing.setdefault(t["commitment"], []):
                missing[t["commitment"]].append(o["family"])
    lines += [f"  no sourced {key} discount for {', '.join(families)} (decisions/cost/prices.yaml): "
              "no figure, never a guess"
              for key, families in missing.items()]
    return lines


def _usage_lines(usage) -> List[str]:
    if not usage:
        return []
    body = [[u["item"], u["unit"], "no price" if u["unitUsd"] is None else f"${u['unitUsd']:g}",
             "-" if u["monthly"] is None else _usd(u["monthly"]),
             (u["asOf"] + (cost.WEAK if u.get("weak") else "")) if u["asOf"] else u["gap"]] for u in usage]
    lines = ["", "Charged by use (not in the totals; a month at the stack's quantity where it fixes one; sources in "
                 "decisions/cost/prices.yaml and the plan document):"]
    return lines + _table(["item", "per", "unit price", "a month", "rate as of"], body)


def _node_image_lines(image: Mapping[str, Any]) -> List[str]:
    driver = image["driverVersion"] or f"latest on branch {image['driverBranch']}"
    how = "carried by the AMI, verified at boot" if image["driverSource"] == "ami" else "installed at boot, then verified"
    return [f"GPU node image: {image['amiName']} (release {image['release']}); NVIDIA driver {driver}, {how}"]


def _resources(amounts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in amounts.items())


def _platform_lines(platform: Mapping[str, Any]) -> List[str]:
    efa = f", EFA device plugin {platform['efaDevicePlugin']}" if platform["efaDevicePlugin"] else ""
    lines = [f"GPU platform: gpu-operator {platform['gpuOperator']}{efa}, Kueue {platform['kueue']}, "
             f"MPI Operator {platform['mpiOperator']}, JobSet {platform['jobset']}"]
    lines += _table(["pool", "sharing", "each node offers pods"],
                    [[p["pool"], p["sharing"], _resources(p["offersPerNode"])] for p in platform["pools"]])
    queue = platform["trainingQueue"]
    if not queue["flavors"]:
        return lines + ["", "Training queue: none (no training or general pool)"]
    lines += ["", f"Training queue (LocalQueues {' and '.join(queue['localQueues'])} in namespace training -> "
              f"ClusterQueue {queue['clusterQueue']}), one flavor per pool, in admission order:"]
    lines += _table(["flavor (pool)", "capacity", "quota at maxNodes", "admits"],
                    [[f["name"], f["capacity"], _resources(f["quotas"]),
                      ("jobs tolerating " + " and ".join(t.split("=")[0] for t in f["mustTolerate"])
                       if f["mustTolerate"] else "any job")
                      + (f"; if it ends {capacity_blocks.CLOSE_BEFORE_END_S // 60} min before the block does"
                         if f["admissionChecks"] else "")] for f in queue["flavors"]])
    lines.append(f"  priorities (label {kueue.PRIORITY_LABEL}; higher preempts lower): " + ", ".join(
        f"{p['name']} {p['value']}" for p in queue["priorityClasses"]) + "; no label runs at 0")
    wait = queue["webhookWait"]
    lines.append(f"  created once Kueue's webhooks answer: Job {wait['job']} retries a dry-run ResourceFlavor for up "
                 f"to {wait['probeSeconds']} s; pulumi up waits for it up to {wait['timeoutSeconds']} s")
    checks = [f"{c['pool']} ({c['schedule'] + ' UTC' if c['schedule'] else 'suspended: run by hand'})"
              for c in queue["nvlinkChecks"]]
    lines.append("  NVLink bandwidth check: " + (", ".join(checks) or "none (no NVLink pool with a minimum)"))
    across = [f"{c['pool']} ({c['schedule']} UTC)" for c in queue["acrossNodeChecks"]]
    lines.append("  EFA bandwidth check across two nodes: " + (", ".join(across) or
                                                               "none (no EFA pool with a minimum keeps two nodes)"))
    return lines


def _monitoring_lines(section: Mapping[str, Any]) -> List[str]:
    where = ("to the stack's webhook (gpu-cloud:alertWebhookUrl, a secret)" if section["webhook"] else
             "stay in Alertmanager (no gpu-cloud:alertWebhookUrl)")
    lines = [f"Monitoring ({section['chart']}): Prometheus keeps {section['retentionDays']} d on an encrypted "
             f"{section['volumeGiB']} GiB gp3 volume (at most {section['retentionSize']}); alerts {where}",
             f"  dashboards: {', '.join(section['dashboards'])}",
             f"  {len(section['alerts'])} alert rules:"]
    counts = Counter((a["group"], a["alert"], a["for"], a["severity"]) for a in section["alerts"])
    lines += _table(["group", "alert", "for", "severity", "rules"],
                    [[group, alert, wait, severity, str(n)] for (group, alert, wait, severity), n in counts.items()])
    return lines


def _inference_lines(section: Mapping[str, Any]) -> List[str]:
    t = section["triton"]
    if t is None:
        return ["Inference: no Triton (inference.triton.enabled is false)"]
    dns = (f"; DNS {t['dns']['domain']} ({t['dns']['routing']}, this stack {t['dns']['role']})" if t["dns"] else
           "; no DNS record (dr.role none)")
    return [f"Inference: Triton ({t['image']}) on pool {t['pool']}, {t['minReplicas']} to {t['maxReplicas']} replicas "
            f"holding {t['targetQueueMs']:g} ms of queue time per request; models from {t['modelRepository']}",
            f"  {t['scheme']} NLB {t['endpoint']} (HTTP 8000, gRPC 8001){dns}"]


def _iops(value) -> str:
    return "unknown" if value is None else f"{value:,}"


def _storage_lines(storage: Mapping[str, Any]) -> List[str]:
    hot = {True: "yes", False: "no", None: "unknown"}
    body = [[r["pool"], f"{r['disks']} x {r['diskGB']:,} GB" if r["disks"] else "none",
             (f"{r['totalGB']:,} GB " + ("RAID0" if r["raid0"] else "unused")) if r["disks"] else "-",
             _iops(r["readIops"]), _iops(r["writeIops"]), hot[r["meetsHotTier"]]] for r in storage["scratch"]]
    lines = ["Buckets (SSE-KMS with one key each, the log bucket SSE-S3; versioned, private, TLS only, access-logged, "
             "protected):"]
    lines += _table(["purpose", "name", "old versions", "tiering", "replication"],
                    [[b["purpose"], b["name"], f"{b['noncurrentDays']} d" + (f", logs {b['expireDays']} d"
                                                                              if b["expireDays"] else ""),
                      f"{b['transition']['storageClass']} from day {b['transition']['days']}" if b["transition"] else "-",
                      _replication(b["replication"])] for b in storage["buckets"]])
    lines += ["", f"NVMe scratch (hot tier > {storage['hotTierReadIops'] // 1000}K read IOPS; pods use an emptyDir at "
              f"{scratch.SCRATCH_MOUNT_PATH}, on the RAID0 at {scratch.RAID0_MOUNT_PATH}):"]
    lines += _table(["pool", "disks", "size", "read IOPS", "write IOPS", "hot tier"], body)
    lustre = storage["lustre"]
    if lustre:
        lines.append(f"  FSx for Lustre: PERSISTENT_2, {lustre['capacityGiB']:,} GiB at {lustre['throughputPerTiB']} "
                     f"MB/s/TiB, EFA {'on' if lustre['efa'] else 'off'}, /data <- {lustre['importPath']}; "
                     f"claim lustre-data in namespace training; protection: "
                     f"{lustre['protection']['summary']}")
    lines.append(f"  {storage['lustreLatencyNote']}")
    return lines


def _replication(entry) -> str:
    if entry is None:
        return "-"
    if entry["role"] == "primary":
        return f"to {entry['peerStack']} (RTC: {entry['recoveryPointMinutes']} min recovery point)"
    return f"receives {entry['peerStack']}'s replicas"


def _policy_lines(policy: Mapping[str, Any]) -> List[str]:
    if policy.get("skipped"):
        return [f"Policy: not run ({policy['skipped']})"]
    violations = policy.get("violations", [])
    pack = f" (pack {policy['pack']} v{policy['version']})" if policy.get("pack") else ""
    view = f", as {VIEW_NAMES[policy['view']]} shows it" if policy.get("view") in VIEW_NAMES else ""
    lines = [f"Policy{pack}{view}: " + _counted(len(violations),
                                                 sum(v['enforcementLevel'] == 'mandatory' for v in violations))]
    for v in violations:
        # CrossGuard's message is the policy's description, a newline, then what it found.
        found = v["message"].split("\n", 1)[-1].replace("\n", " ")
        lines.append(f"  [{v['enforcementLevel']}] {v['policyName']}: {found}" + (f" ({v['urn']})" if v["urn"] else ""))
    lines += [f"  not applicable: {n['policyName']} ({n['reason']})" for n in policy.get("notApplicable", [])]
    others = policy.get("otherViews") or {}
    if others:
        lines.append("  other views: " + "; ".join(
            f"{view}: {_counted(counts['violations'], counts['mandatory'])}" for view, counts in others.items())
            + " (--policy-view VIEW lists them)" * any(c["violations"] for c in others.values()))
    return lines


def _counted(violations: int, mandatory: int) -> str:
    return f"{violations} violation(s), {mandatory} mandatory" if violations else "no violations"
