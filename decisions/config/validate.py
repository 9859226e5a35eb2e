"""Validate a stack's `gpu-cloud:` config once, reporting every mistake with its key path.

Each top-level key, and each node pool, is parsed on its own, so one broken section does not hide
the mistakes in another. Rules that need the catalog, the region or several sections run on the
parts that parsed. Only a config with no mistake at all becomes a StackSpec.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from datetime import date

from decisions.catalog import addons, charts
from decisions.catalog.catalog import (MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, Catalog, GpuModel, InstanceType,
                                       load_catalog, mig_compute_slices)
from decisions.catalog.eks import version_warnings
from decisions.config import preflight
from decisions.config.errors import YAML11_BOOLEANS, YAML11_SEXAGESIMAL, ConfigError, ConfigIssue, PathPart, key_path
from decisions.config.model import NAMESPACE, SECRET_KEYS, SECTIONS, Budget, Cluster, GpuSharing, Network, NodePool, \
    Tenancy
from decisions.config.stack import ResolvedPool, StackSpec, cluster_name, resource_tags
from decisions.cost import cost, transfer
from decisions.network import zones
from decisions.network.zones import is_zone_id
from decisions.network.public_access import private_access_problem, public_access_problem
from decisions.nodes.amis import image_warnings, install_refusal, resolve_node_image
from decisions.nodes import autoscaling
from decisions.nodes.pools import ASG_TAG_KEY_MAX, MPS_ARCHITECTURES, TEMPLATE_LABEL_PREFIX, TEMPLATE_TAINT_PREFIX, \
    offered_gpu_resources, slot_memory_mib
from decisions.observability import logs
from decisions.platform import kueue
from decisions.serving import dr_pair, lb_controller
from decisions.storage import lustre

REQUIRED_TAGS = ("team", "costCenter")
DOCKER_BRIDGE = ipaddress.IPv4Network("172.17.0.0/16")


# EKS CreateCluster: 1-100 characters. Everything named after the cluster (ASGs, tags such as
# k8s.io/cluster-autoscaler/<name>, at most 128 characters) fits when the cluster name does.
EKS_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")


# How to add a region, named wherever an unknown region is refused (docs/how-to.md walks through it).
ADD_A_REGION = ('To add one, follow docs/how-to.md "Add a region": list the region under `regions` of each type it '
                'offers in decisions/catalog/catalog.yaml, its zone IDs in decisions/network/zones.yaml '
                'and its fixed costs in decisions/cost/prices.yaml')


def load_stack_spec(config: Mapping[str, Any], *, stack: str, region: Optional[str],
                    project: str = "gpu-cloud", catalog: Optional[Catalog] = None,
                    peer_cidr: Optional[str] = None) -> StackSpec:
    """Turn the raw `gpu-cloud:` config (key -> parsed value) into a StackSpec or raise ConfigError.

    `peer_cidr` is the DR peer stack's VPC CIDR (from its stack file), which this VPC must not overlap."""
    catalog = catalog or load_catalog()
    issues: List[ConfigIssue] = []
    parsed: Dict[str, Any] = {}

    name = cluster_name(project, stack)
    if not EKS_CLUSTER_NAME.match(name):
        issues.append(ConfigIssue("stack", f"{stack!r} makes the EKS cluster name {name!r}, which EKS refuses: at most "
                                           "100 characters, letters, digits, '-' and '_', starting with a letter or "
                                           "digit; name the stack with those (prod-us-east-1)"))
    for key in sorted(set(config) - set(SECTIONS) - set(SECRET_KEYS)):
        issues.append(_issue((key,), f"unknown key{_did_you_mean(key, SECTIONS)}; allowed keys: "
                                     f"{', '.join((*SECTIONS, *SECRET_KEYS))}"))
    issues += [_issue((key,), problem) for key in SECRET_KEYS for problem in secret_issues(key, config.get(key))]
    for key, (type_, required) in SECTIONS.items():
        if key not in config and required:
            issues.append(_issue((key,), "is required"))
        elif key == "nodePools":
            parsed[key] = _parse_pools(config[key], issues)
        else:
            # An optional section left out is its defaults: {}.
            try:
                parsed[key] = strictly(type_, config.get(key, {}))
            except ValidationError as err:
                issues.extend(_pydantic_issues(err, (key,), type_))
    issues = _zone_names_issue(config.get("network"), region, issues)

    if not region:
        issues.append(ConfigIssue("aws:region", "is required (pulumi config set aws:region us-east-1)"))
    elif region not in catalog.regions:
        issues.append(ConfigIssue("aws:region", f"{region!r} has no GPU instance types in the catalog; "
                                                f"known regions: {', '.join(catalog.regions)}. {ADD_A_REGION}"))
    elif (missing_zones := zones.region_issue(region)) is not None:   # step 2 of "Add a region" left out
        issues.append(ConfigIssue("aws:region", missing_zones))

    issues.extend(_check_tags(parsed.get("tags")))
    if parsed.get("environment") is not None and parsed.get("monitoring") is not None:
        issues.extend(_issue(("monitoring", "logRetentionDays"), problem) for problem in
                      logs.log_retention_issues(parsed["environment"], parsed["monitoring"].log_retention_days))
    network = parsed.get("network")
    if network is not None and peer_cidr and _overlaps(network.cidr, peer_cidr):
        issues.append(_issue(("network", "cidr"), f"{network.cidr} overlaps the DR peer's VPC {peer_cidr}; replication "
                             "and failover route between the two, so pick a range that does not"))
    cluster_issues = _check_cluster(parsed.get("cluster"))
    issues.extend(cluster_issues)
    if network is not None and parsed.get("cluster") is not None:
        issues.extend(_issue(parts, message) for parts, message in deployer_path_issues(network, parsed["cluster"]))
    image = None
    if parsed.get("cluster") is not None and parsed.get("gpuDriver") is not None and not cluster_issues:
        image, image_issues = resolve_node_image(parsed["gpuDriver"], parsed["cluster"].kubernetes_version)
        issues.extend(_issue(parts, message) for parts, message in image_issues)
    branch = image.driver_branch if image else None
    pools = [(i, pool, _resolve_pool(i, pool, catalog, region, branch, issues))
             for i, pool in enumerate(parsed.get("nodePools") or []) if pool is not None]
    all_pools_parsed = None not in (parsed.get("nodePools") or [None])
    issues.extend(_check_pool_set(pools, parsed, all_pools_parsed, region, catalog))
    if image is not None and image.source == "install":
        issues.extend(_issue(("nodePools", i, "instanceTypes", j), refusal) for i, pool, _ in pools
                      for j, name in enumerate(pool.instance_types) if (refusal := install_refusal(name)))
    if None not in (parsed.get("tags"), parsed.get("environment"), parsed.get("storage")):   # Auto Scaling: <= 50 tags
        issues.extend(_issue(parts, message) for parts, message in preflight.asg_tag_issues(
            [(i, r) for i, _, r in pools if r is not None], name,
            resource_tags(parsed["tags"], parsed["environment"], stack), parsed["storage"].nvme_scratch))
    issues.extend(_check_tenancy(parsed.get("tenancy"), parsed.get("cluster")))
    dr = parsed.get("dr")
    if dr is not None and dr.peer_stack and dr.peer_stack.split("/")[1:] == [project, stack]:
        issues.append(_issue(("dr", "peerStack"), f"{dr.peer_stack} is this very stack; name the stack in the "
                             "other region that backs this one up"))
    if dr is not None and parsed.get("inference") is not None and network is not None:
        issues.extend(_issue(parts, message) for parts, message in
                      dr_pair.stack_issues(dr, parsed["inference"].triton, network, peer_cidr))
    resolved = tuple(r for _, _, r in pools if r is not None)
    lustre_config = parsed["storage"].lustre if parsed.get("storage") is not None else None
    if lustre_config is not None and all_pools_parsed and len(resolved) == len(pools):
        issues.extend(_issue(parts, message) for parts, message in lustre.lustre_issues(lustre_config, resolved))
    if not issues and parsed.get("budget") is not None and parsed["budget"].max_hourly_usd is not None:
        issues.extend(_check_budget(resolved, parsed["budget"], catalog, region))
    if issues:
        raise ConfigError(issues, pool_names=_pool_names(config.get("nodePools")))

    spec = StackSpec(
        project=project, stack=stack, region=region, environment=parsed["environment"], tags=parsed["tags"],
        network=parsed["network"], cluster=parsed["cluster"], node_image=image, pools=resolved,
        storage=parsed["storage"], inference=parsed["inference"], monitoring=parsed["monitoring"],
        dr=parsed["dr"], budget=parsed["budget"], tenancy=parsed["tenancy"],
        training=parsed["training"], repair=parsed["repair"], catalog=catalog,
    )
    issues = unpriced_issues(spec)
    if issues:
        raise ConfigError(issues, pool_names=_pool_names(config.get("nodePools")))
    return spec


def secret_issues(key: str, value: Any) -> List[str]:
    """What is wrong with a secret key's value, without ever repeating it. An encrypted value the offline plan
    cannot read ({secure: ...}) and an empty one (the default: not set) pass."""
    if value in (None, "") or (isinstance(value, dict) and set(value) == {"secure"}):
        return []
    if not isinstance(value, str) or not re.fullmatch(r"https://[^\s/]+(/\S*)?", value):
        return ["must be an https:// URL (its value is a secret and is not shown)"]
    return []


def strictly(type_: Any, value: Any) -> Any:
    """Validate a config value without coercion (`maxNodes: true` and `efa: "yes"` are errors, not 1 and True).
    Through JSON, because strict Python validation would also refuse the lists YAML gives for tuples."""
    return TypeAdapter(type_).validate_json(json.dumps(value, default=str), strict=True)


def _parse_pools(raw: Any, issues: List[ConfigIssue]) -> List[Optional[NodePool]]:
    if not isinstance(raw, list) or not raw:
        issues.append(_issue(("nodePools",), "must be a non-empty list of node pools"))
        return []
    pools: List[Optional[NodePool]] = []
    for i, item in enumerate(raw):
        try:
            pools.append(strictly(NodePool, item))
        except ValidationError as err:
            issues.extend(_pydantic_issues(err, ("nodePools", i), NodePool))
            pools.append(None)
    return pools


ADD_A_TYPE = 'docs/how-to.md "Add an instance type"'


def _resolve_pool(i: int, pool: NodePool, catalog: Catalog, region: Optional[str],
                  driver_branch: Optional[str], issues: List[ConfigIssue]) -> Optional[ResolvedPool]:
    at = ("nodePools", i)
    before = len(issues)
    types: List[InstanceType] = []
    for j, name in enumerate(pool.instance_types):
        itype = catalog.instance_types.get(name)
        if itype is None:
            hint = catalog.suggest(name)
            issues.append(_issue(at + ("instanceTypes", j), f"{name!r} is not in the catalog "
                                 f"({catalog.types_source.cited}): to add it, see {ADD_A_TYPE}"
                                 + (f"; did you mean {hint}?" if hint else "")))
            continue
        if region and region in catalog.regions and region not in itype.regions:
            issues.append(_issue(at + ("instanceTypes", j), f"{name} is not offered in {region} as of the catalog's "
                                 f"snapshot ({catalog.offers_source.cited}); types offered there: "
                                 f"{', '.join(catalog.types_in_region(region))}. If AWS offers it there now, see "
                                 f"{ADD_A_TYPE}"))
        gpu = catalog.gpus[itype.gpu.model]
        if driver_branch and int(driver_branch) < gpu.min_driver_branch:
            issues.append(_issue(at + ("instanceTypes", j), f"{name} ({itype.gpu.model}) needs NVIDIA driver branch "
                                 f">= {gpu.min_driver_branch}; the stack's driver is on branch {driver_branch}"))
        types.append(itype)

    s = pool
    if not s.min_nodes <= s.desired_nodes <= s.max_nodes:
        issues.append(_issue(at, f"needs minNodes <= desiredNodes <= maxNodes; got {s.min_nodes}, {s.desired_nodes}, {s.max_nodes}"))
    if s.reserved_capacity and not s.capacity_reservation_id:
        issues.append(_issue(at + ("capacityReservationId",), f"is required for a {s.capacity} pool: the ID of "
                             "the reservation its nodes launch into (cr-...)"))
    if not s.reserved_capacity and s.capacity_reservation_id:
        issues.append(_issue(at + ("capacityReservationId",), f"is only allowed for reserved and capacity-block "
                             f"pools, not for a {s.capacity} pool"))
    if len(set(s.instance_types)) != len(s.instance_types):
        issues.append(_issue(at + ("instanceTypes",), "lists a type twice"))
    if s.reserved_capacity and len(s.instance_types) > 1:
        issues.append(_issue(at + ("instanceTypes",), f"a {s.capacity} pool has exactly one type: the reservation's"))
    if len({_node_shape(t) for t in types}) > 1:
        shapes = "; ".join(f"{t.name} has {_describe_shape(t)}" for t in types)
        issues.append(_issue(at + ("instanceTypes",), "types in one pool need one node shape (cluster-autoscaler builds "
                             "one node template per Auto Scaling group, and the pool's nodes share one set of labels): "
                             f"the same GPU model, GPU count, GPU memory, vCPUs and memory; {shapes}; split them into "
                             "one pool per shape"))
    issues.extend(_check_template_tag_keys(at, pool))

    efa = s.efa if s.efa is not None else bool(types) and all(t.supports_efa for t in types)
    if s.efa and types:
        for j, t in enumerate(types):
            if not t.supports_efa:
                issues.append(_issue(at + ("efa",), f"{t.name} does not support EFA"))
    if efa and len(s.instance_types) != 1:
        issues.append(_issue(at + ("instanceTypes",), "an EFA pool has exactly one instance type (one placement group, "
                             "one interface layout); set efa: false to mix types"))
    if (efa or s.reserved_capacity) and not s.availability_zone:
        why = "EFA pools" if efa else f"{s.capacity} pools"
        issues.append(_issue(at + ("availabilityZone",), f"is required for {why} (placement groups and reservations are zonal)"))
    if (s.availability_zone and region and not is_zone_id(s.availability_zone)
            and not re.fullmatch(re.escape(region) + r"[a-z]", s.availability_zone)):
        issues.append(_issue(at + ("availabilityZone",), f"{s.availability_zone!r} is not a zone of {region} "
                             f"(expected a zone ID of network.zones, or {region}a, {region}b, ...)"))
    if s.capacity == "capacity-block" and s.placement_group:
        issues.append(_issue(at + ("placementGroup",), "capacity blocks need no placement group; leave it out"))

    for t in types[:1]:
        issues.extend(_check_gpu_sharing(at + ("gpuSharing",), s.gpu_sharing, t, catalog.gpus[t.gpu.model]))
    if len(issues) > before or len(types) != len(s.instance_types):
        return None
    return ResolvedPool(spec=pool, types=tuple(types), efa=efa)


# Architectures whose MIG mode takes a GPU reset to change: "Setting MIG mode on the A100/A30 requires a GPU reset"
# (NVIDIA MIG User Guide, Deployment Considerations). nvmlDeviceSetMigMode: "On certain platforms like pass-through
# virtualization, where reset functionality may not be exposed directly, VM reboot is required. activationStatus would
# return NVML_ERROR_RESET_REQUIRED for such cases" (NVML API reference); EC2 passes its GPUs through, and the mode stays
# pending (NVIDIA/gpu-operator issue 1606). The gate turns MIG on and requires it current, so an A100 MIG pool would
# reject every instance until its brake stops it. Refused until the gate records the pending mode and reboots once
# (Ampere keeps the mode across reboots, the same guide).
MIG_NEEDS_GPU_RESET = ("ampere",)


def _check_gpu_sharing(at: Tuple[PathPart, ...], sharing: GpuSharing, itype: InstanceType,
                       gpu: GpuModel) -> List[ConfigIssue]:
    """The pool's sharing against its GPU: MPS on a GPU the device plugin's MPS server takes 48 clients on; MIG on
    a MIG GPU, with its profiles, and a mix (migProfiles) within the GPU's slices."""
    model = f"{itype.gpu.model} ({itype.name})"
    if sharing.mode == "mps" and gpu.architecture not in MPS_ARCHITECTURES:
        return [_issue(at + ("mode",), f"mps needs a GPU of compute capability 7.5 or newer "
                                       f"({', '.join(MPS_ARCHITECTURES)}); {model} is {gpu.architecture}")]
    if sharing.mode != "mig":
        return []
    if not gpu.supports_mig:
        return [_issue(at + ("mode",), f"mig is not supported on {model}; MIG GPUs: A100, H100, H200, B200")]
    if gpu.architecture in MIG_NEEDS_GPU_RESET:
        return [_issue(at + ("mode",), f"mig is refused on {model}: turning MIG mode on on an "
                                       f"{gpu.architecture.title()} GPU takes a GPU reset, which EC2's pass-through "
                                       "GPUs do not expose (NVML's nvmlDeviceSetMigMode leaves the mode pending with "
                                       "NVML_ERROR_RESET_REQUIRED until a VM reboot), and the node gate does not "
                                       "reboot for it: every new node would be rejected. Allowed here: none, "
                                       "time-slicing or mps; mig on H100, H200 or B200")]
    allowed = f"allowed: {', '.join(gpu.mig_profiles)}"
    if sharing.mig_profile is not None:
        return [] if sharing.mig_profile in gpu.mig_profiles else [_issue(
            at + ("migProfile",), f"{sharing.mig_profile!r} is not a MIG profile of {itype.gpu.model}; {allowed}")]
    unknown = [_issue(at + ("migProfiles", profile), f"is not a MIG profile of {itype.gpu.model}; {allowed}")
               for profile in sharing.mig_profiles if profile not in gpu.mig_profiles]
    if unknown:
        return unknown
    compute, memory = gpu.mig_slices(sharing.mig_profiles)
    if compute <= MIG_COMPUTE_SLICES and memory <= MIG_MEMORY_SLICES:
        return []
    takes = "; ".join(f"{count} x {profile}: {mig_compute_slices(profile) * count} and "
                      f"{gpu.mig_memory_slices[profile] * count}" for profile, count in sharing.mig_profiles.items())
    return [_issue(at + ("migProfiles",), f"needs {compute} compute and {memory} memory slices of each GPU ({takes}), "
                                          f"over the budget of one {itype.gpu.model}: {MIG_COMPUTE_SLICES} compute and "
                                          f"{MIG_MEMORY_SLICES} memory slices")]


def _node_shape(itype: InstanceType) -> Tuple:
    return itype.gpu.model, itype.gpu.count, itype.gpu.memory_mib, itype.vcpu, itype.memory_gib


def _describe_shape(itype: InstanceType) -> str:
    return (f"{itype.gpu.count} x {itype.gpu.model} ({itype.gpu.memory_mib} MiB), {itype.vcpu} vCPUs, "
            f"{itype.memory_gib} GiB")


def _check_template_tag_keys(at: Tuple[PathPart, ...], pool: NodePool) -> List[ConfigIssue]:
    """Labels and taints reach cluster-autoscaler as ASG tags under a 46-character prefix; an ASG tag key
    has at most 128 characters, so a longer key would fail CreateAutoScalingGroup halfway through `pulumi up`."""
    keys = [(at + ("labels", key), TEMPLATE_LABEL_PREFIX, key) for key in pool.labels]
    keys += [(at + ("taints", j, "key"), TEMPLATE_TAINT_PREFIX, taint.key) for j, taint in enumerate(pool.taints)]
    return [_issue(path, f"{key!r} has {len(key)} characters; the autoscaler tag {prefix}<key> would have "
                         f"{len(prefix) + len(key)}, over the {ASG_TAG_KEY_MAX}-character limit of ASG tag keys "
                         f"(keys of up to {ASG_TAG_KEY_MAX - len(prefix)} characters fit)")
            for path, prefix, key in keys if len(prefix) + len(key) > ASG_TAG_KEY_MAX]


def stack_warnings(spec: StackSpec, today: date) -> List[str]:
    """What a valid stack should still change (the plan prints these; `pulumi up` logs them)."""
    warnings = image_warnings(spec.node_image, today) + version_warnings(spec.cluster.kubernetes_version, today)
    if ipaddress.IPv4Network(spec.network.cidr).overlaps(DOCKER_BRIDGE):
        warnings.append(f"gpu-cloud:network.cidr: {spec.network.cidr} overlaps {DOCKER_BRIDGE}, the default bridge "
                        "network of Docker and of many container build tools; pods there may not reach such hosts")
    if spec.environment == "prod" and spec.budget.max_hourly_usd is None:
        warnings.append("gpu-cloud:budget.maxHourlyUsd: not set on a prod stack, so nothing stops a maxNodes typo "
                        "from multiplying the bill; set the most the pools may cost per hour")
    if spec.storage.lustre is not None:
        warnings += lustre.lustre_warnings(spec.storage.lustre, spec.pools)
        warnings += transfer.spread_warnings(spec, cost.load_prices().region(spec.region))
    if not kueue.flavors(spec.pools, spec.catalog):
        warnings.append("gpu-cloud:nodePools: no training or general pool, so no training queue (Kueue, MPI "
                        "Operator) is installed")
    return warnings


def unpriced_issues(spec: StackSpec, today: Optional[date] = None) -> List[ConfigIssue]:
    """With a budget, every item the bill cannot price (a pool whose type has no price in the region, a fixed cost
    without a sourced rate) refuses the stack unless gpu-cloud:budget.unpriced names it or, for a pool,
    gpu-cloud:budget.assumed prices it (decisions/cost/cost.py unacknowledged, which the pack asks too). An
    acknowledgement that names nothing unpriced, and an assumption over a sourced price, are refused as well, so
    neither outlives the gap it was for. Without a budget nothing is checked, and the plan lists the gaps."""
    if spec.budget.max_hourly_usd is None:
        return []
    unpriced = cost.estimate(spec, today=today).unpriced
    index = {pool.name: i for i, pool in enumerate(spec.pools)}
    return (_hole_refusals(spec, cost.unacknowledged(unpriced, spec.budget.unpriced), index)
            + [_issue(("budget", "unpriced", i), f"{name!r} is not an unpriced item of this stack (unpriced: "
                                                 f"{', '.join(u.name for u in unpriced) or 'none'}); remove it")
               for i, name in enumerate(spec.budget.unpriced) if name not in {u.name for u in unpriced}]
            + _misplaced_assumptions(spec, index, today))


def _hole_refusals(spec: StackSpec, holes: Sequence[cost.Unpriced], index: Mapping[str, int]) -> List[ConfigIssue]:
    """One error per unpriced pool, named after its index; one per data file for the fixed costs it lacks rates of."""
    issues, by_file = [], {}
    for item in holes:
        if item.name in index:
            issues.append(_issue(("nodePools", index[item.name]),
                                 f"{item.why}, so gpu-cloud:budget.maxHourlyUsd cannot cover it. {PRICE_FIX}, "
                                 f"state its price and source in gpu-cloud:budget.assumed.{item.name}, or "
                                 f"acknowledge the gap: add {item.name} to gpu-cloud:budget.unpriced"))
        else:
            by_file.setdefault(_price_file(item.why), []).append(item)
    for data_file, items in by_file.items():
        listed = "; ".join(f"{i.name} ({i.item})" for i in items)
        issues.append(_issue(("budget", "unpriced"), f"{data_file} lacks what prices these in {spec.region}: "
                                                     f"{listed}; so the bill leaves them out. Add sourced rates "
                                                     f"there, or acknowledge the gaps: add "
                                                     f"{', '.join(i.name for i in items)} to gpu-cloud:budget.unpriced"))
    return issues


def _misplaced_assumptions(spec: StackSpec, index: Mapping[str, int], today: Optional[date]) -> List[ConfigIssue]:
    """An assumption stands in only where the data has no price: one for no pool, or over a sourced price, is refused."""
    data_gaps = {row.pool for row in cost.pool_costs(spec.pools, spec.catalog, spec.region, today=today) if row.gap}
    issues = []
    for name in spec.budget.assumed:
        if name not in index:
            issues.append(_issue(("budget", "assumed", name), f"is not a pool of this stack (pools: "
                                                              f"{', '.join(index)})"))
        elif name not in data_gaps:
            issues.append(_issue(("budget", "assumed", name), f"pool {name} has a sourced price "
                                                              "(decisions/catalog/catalog.yaml); remove its assumption"))
    return issues


def _price_file(why: str) -> str:
    """The data file a gap's reason names (every gap says where its price would live)."""
    found = re.search(r"decisions/\S+\.yaml", why)
    return found[0] if found else "decisions/cost/prices.yaml"


# How to give a type a price (scripts/refresh_prices.py reads on-demand prices from the AWS Price List API).
PRICE_FIX = ("To price it, run `python scripts/refresh_prices.py --write` with AWS credentials (it fills onDemandUsd "
             "in decisions/catalog/catalog.yaml from the AWS Price List API), or give the pool only types "
             "that have a price")


def _check_pool_set(pools: Sequence[Tuple[int, NodePool, Optional[ResolvedPool]]],
                    parsed: Mapping[str, Any], all_pools_parsed: bool, region: Optional[str],
                    catalog: Catalog) -> List[ConfigIssue]:
    issues: List[ConfigIssue] = []
    seen: Dict[str, int] = {}
    for i, pool, _ in pools:
        if pool.name in seen:
            issues.append(_issue(("nodePools", i, "name"), f"{pool.name!r} is already used by nodePools[{seen[pool.name]}]"))
        seen.setdefault(pool.name, i)
    issues.extend(_issue(parts, message) for parts, message in kueue.pool_issues([(i, p) for i, p, _ in pools]))
    network = parsed.get("network")
    if network is not None:
        pins = [(i, p.availability_zone) for i, p, _ in pools if p.availability_zone]
        # Zones are judged against a region the catalog sells GPUs in: in another, the region is the one mistake.
        judged = region if region in catalog.regions else None
        issues.extend(_issue(parts, message) for parts, message in zones.static_issues(judged, network.zones, pins))
    triton = parsed["inference"].triton if parsed.get("inference") else None
    # Only with every pool parsed: a pool with a typo elsewhere would read as "no such pool".
    if triton is not None and triton.enabled and triton.pool and all_pools_parsed:
        target = next((p for _, p, _ in pools if p.name == triton.pool), None)
        inference_pools = [p.name for _, p, _ in pools if p.workload == "inference"]
        if target is None or target.workload != "inference":
            issues.append(_issue(("inference", "triton", "pool"), f"{triton.pool!r} is not an inference pool of this "
                                 f"stack; inference pools: {', '.join(inference_pools) or 'none'}"))
        elif len(target.gpu_sharing.mig_profiles or {}) > 1:
            issues.append(_issue(("inference", "triton", "pool"), f"{triton.pool!r} cuts its GPUs into several MIG "
                                 "profiles, and each Triton pod asks for one GPU of one kind; give it one profile"))
        else:
            issues.extend(_triton_pool_size_issues(pools, triton, catalog))
            issues.extend(_triton_model_issues(pools, triton, catalog))
        # The stack's tags go onto the NLB through an annotation of the Service: what it cannot carry is refused here.
        tags = parsed.get("tags") or {}
        issues += [_issue(("tags", key), f"cannot be tagged on Triton's load balancer: {problem}")
                   for key, problem in ((k, lb_controller.tag_problem(k, v)) for k, v in tags.items()) if problem]
    return issues


def _triton_pool_size_issues(pools: Sequence[Tuple[int, NodePool, Optional[ResolvedPool]]], triton,
                             catalog: Catalog) -> List[ConfigIssue]:
    """Triton's pool may be no larger than Triton can ever make it (decisions/nodes/autoscaling.reachable_nodes)."""
    i, pool, resolved = next((i, p, r) for i, p, r in pools if p.name == triton.pool)
    if resolved is None or triton.max_replicas < triton.min_replicas:
        return []
    (slots,) = offered_gpu_resources(resolved, catalog).values()
    reachable = autoscaling.reachable_nodes(pool.min_nodes, triton.max_replicas, slots)
    if pool.max_nodes <= reachable:
        return []
    pods = autoscaling.rollout_pods(triton.max_replicas)
    serving = math.ceil(pods / slots)
    floor = f", and minNodes is {pool.min_nodes}" if pool.min_nodes > serving + 1 else ""
    return [_issue(("nodePools", i, "maxNodes"), f"{pool.max_nodes} is more than Triton's pool can ever grow to, "
                   f"{reachable}: the stack grows it for Triton's pods alone, and inference.triton.maxReplicas "
                   f"{triton.max_replicas} ({pods} pods during a rollout), one GPU slot each of the {slots} a node "
                   f"has, fill {serving} node(s), one more while a node drains{floor}. Set maxNodes to {reachable}, or "
                   "raise maxReplicas: the budget, the inference namespace's quota and the plan count every node up to "
                   "maxNodes")]


def _triton_model_issues(pools: Sequence[Tuple[int, NodePool, Optional[ResolvedPool]]], triton,
                         catalog: Catalog) -> List[ConfigIssue]:
    """The models the stack declares must fit one replica's GPU slot of Triton's pool together."""
    resolved = next(r for _, p, r in pools if p.name == triton.pool)
    if resolved is None or not triton.models:
        return []
    (resource,) = offered_gpu_resources(resolved, catalog)
    problem = dr_pair.models_fit_issue(dr_pair.declared_models(triton), slot_memory_mib(resolved, resource),
                                       f"{triton.pool} ({resolved.primary_type.gpu.model})")
    return [_issue(("inference", "triton", "models"), problem)] if problem else []


def _check_tenancy(tenancy: Optional[Tenancy], cluster: Optional[Cluster]) -> List[ConfigIssue]:
    """EKS allows one access entry per role and cluster: an admin role has one already (cluster admin), and a
    role listed twice for a team would be that entry twice. A role in both teams is fine: one entry, two groups."""
    if tenancy is None:
        return []
    admins = set(cluster.admin_role_arns) if cluster else set()
    issues: List[ConfigIssue] = []
    for team, access in tenancy.teams:
        for i, arn in enumerate(access.role_arns):
            at = ("tenancy", "teams", team, "roleArns", i)
            if arn in admins:
                issues.append(_issue(at, f"{arn} is in cluster.adminRoleArns, whose access entry makes it cluster "
                                         "admin (EKS allows one entry per role); give the team its own role"))
            elif arn in access.role_arns[:i]:
                issues.append(_issue(at, f"{arn} is listed twice"))
    return issues


def _check_tags(tags: Optional[Mapping[str, str]]) -> List[ConfigIssue]:
    if tags is None:
        return []
    issues = [_issue(("tags", key), "must be set (every resource carries it for cost allocation)")
              for key in REQUIRED_TAGS if not tags.get(key)]
    issues += [_issue(("tags", key), "keys starting with aws: are reserved by AWS")
               for key in tags if key.lower().startswith("aws:")]
    issues += [_issue(("tags", key), "is set by gpu-cloud itself") for key in ("environment", "stack", "managed-by") if key in tags]
    return issues


def supported_kubernetes_versions() -> Tuple[str, ...]:
    """Versions with pinned add-ons (decisions/catalog/addons.yaml) and a pinned cluster-autoscaler image
    (decisions/catalog/charts.yaml)."""
    return tuple(v for v in addons.supported_kubernetes_versions() if v in charts.autoscaler_minors())


def _check_cluster(cluster: Optional[Cluster]) -> List[ConfigIssue]:
    supported = supported_kubernetes_versions()
    if cluster is None or cluster.kubernetes_version in supported:
        return []
    return [_issue(("cluster", "kubernetesVersion"), f"{cluster.kubernetes_version!r} is not a supported EKS version; "
                   f"allowed: {', '.join(supported)}")]


def deployer_path_issues(network: Network, cluster: Cluster) -> List[Tuple[tuple, str]]:
    """Is there a way from the machine running Pulumi to the API server? Checked from config alone, so a
    stack without one fails now rather than when the first Helm release times out."""
    issues: List[Tuple[tuple, str]] = []
    for key, cidrs, problem in (("publicAccessCidrs", cluster.public_access_cidrs, public_access_problem),
                                ("privateAccessCidrs", cluster.private_access_cidrs, private_access_problem)):
        for i, cidr in enumerate(cidrs):
            why = problem(cidr)
            if why:
                issues.append((("cluster", key, i), why))
    vpc = ipaddress.IPv4Network(network.cidr)
    routed = [ipaddress.IPv4Network(c) for c in (network.transit_gateway.routes if network.transit_gateway else ())]
    for i, cidr in enumerate(cluster.private_access_cidrs):
        net = ipaddress.IPv4Network(cidr)
        if not net.subnet_of(vpc) and not any(net.subnet_of(r) for r in routed):
            issues.append((("cluster", "privateAccessCidrs", i), f"{cidr} is neither in the VPC ({network.cidr}) nor "
                           "in a network.transitGateway.routes range, so the endpoint's answers cannot reach it"))
    if cluster.deployer_access == "public" and not cluster.public_access_cidrs:
        issues.append((("cluster", "publicAccessCidrs"), "is empty, but deployerAccess is public: list the egress "
                       "range of the machines that run Pulumi, or use deployerAccess: private"))
    if cluster.deployer_access == "private" and not (cluster.private_access_cidrs or cluster.private_access_security_group_ids):
        issues.append((("cluster", "privateAccessCidrs"), "is empty (and so is privateAccessSecurityGroupIds), but "
                       "deployerAccess is private: nothing outside the nodes may reach the private endpoint; list "
                       "the runners' network (routed through network.transitGateway) or their security group"))
    return issues


def budget_issues(spec: StackSpec, reservations) -> List[ConfigIssue]:
    """The budget check again once the account is read: each reservation and block at the size EC2 bills
    (decisions.network.zones.AccountZones.reservations), which may be more than maxNodes (decisions/cost/cost.py)."""
    if spec.budget.max_hourly_usd is None:
        return []
    return _check_budget(spec.pools, spec.budget, spec.catalog, spec.region, reservations)


def _check_budget(pools: Sequence[ResolvedPool], budget: Budget, catalog: Catalog, region: str,
                  reservations=None) -> List[ConfigIssue]:
    """The GPU pools at maxNodes against the budget, by the one rule the pack and the plan use too
    (decisions/cost/cost.py over_budget: priced pools without a commitment's discount, compared in whole cents). A
    pool without a price is a gap the plan reports, not a reason to refuse the stack. Without `reservations` (config
    alone) a reservation counts maxNodes instances; layers.prepare checks again with the account's answer."""
    rows = [p for p in cost.budget_pool_costs(pools, catalog, region, reservations=reservations,
                                              assumed=budget.assumed) if not p.gap]
    total = cost.over_budget(rows, budget.max_hourly_usd)
    if total is None:
        return []
    message = (f"GPU pools at maxNodes cost ${total:,.2f}/hour, above the budget ${budget.max_hourly_usd:,.2f}/hour; "
               "lower maxNodes or raise the budget")
    blocks = [p for p in rows if p.capacity == "capacity-block"]
    if blocks:
        message += (f". Capacity blocks {', '.join(p.pool for p in blocks)} "
                    f"(${sum(p.hourly_at_max for p in blocks):,.2f}/hour) are paid upfront at their purchase price: "
                    "no change to maxNodes lowers them")
    reserved = [p for p in rows if p.capacity == "reserved"]
    if reserved:
        message += (f". Reservations of {', '.join(p.pool for p in reserved)} are billed for their whole size "
                    "whether nodes run or not: only a smaller reservation lowers them")
    return [_issue(("budget", "maxHourlyUsd"), message)]


def _overlaps(cidr: str, other: str) -> bool:
    try:
        return ipaddress.IPv4Network(cidr).overlaps(ipaddress.IPv4Network(other, strict=False))
    except ValueError:     # the peer's own validation names a malformed CIDR
        return False


def _issue(parts: Sequence[PathPart], message: str) -> ConfigIssue:
    return ConfigIssue(key_path(NAMESPACE, parts), message)


def _did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _pool_names(raw: Any) -> List[Optional[str]]:
    """The `name` of each raw nodePools entry (None where it has none), to name pools in errors."""
    items = raw if isinstance(raw, list) else []
    return [item["name"] if isinstance(item, dict) and isinstance(item.get("name"), str) else None for item in items]


# A zone name (us-east-1a), where network.zones takes zone IDs (use1-az1).
ZONE_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+[a-z]$")


def _zone_names_issue(network: Any, region: Optional[str], issues: List[ConfigIssue]) -> List[ConfigIssue]:
    """Zone names in network.zones: one mistake that says how to find the IDs, in place of one per zone."""
    zones = network.get("zones") if isinstance(network, dict) else None
    named = [i for i, zone in enumerate(zones or []) if isinstance(zone, str) and ZONE_NAME.match(zone)]
    if not isinstance(zones, list) or not named:
        return issues
    per_zone = {key_path(NAMESPACE, ("network", "zones", i)) for i in named}
    listed = ", ".join(zones[i] for i in named)
    return [i for i in issues if i.path not in per_zone] + [_issue(("network", "zones"), (
        f"{listed} {'is a zone name' if len(named) == 1 else 'are zone names'}; zones takes zone IDs (use1-az1), which "
        "name the same zone in every account, where names differ. Your account's names and IDs: aws ec2 "
        f"describe-availability-zones --region {region or '<region>'} --query 'AvailabilityZones[].[ZoneName,ZoneId]' "
        "--output text"))]


def _type_fix(e: Mapping[str, Any], key: str) -> Optional[str]:
    """A wrong-type message that says the fix: quote a number where a string belongs, drop the quotes of a number
    or a boolean written as a string. YAML 1.1 words (yes/no/on/off) and base-60 numbers (1:30) are strings to the
    Pulumi CLI (plan/stackfile.py), so their message says what to write instead. None: not a type mistake."""
    kind, value = e["type"], e["input"]
    wanted = {"string_type": "a string", "int_type": "a whole number", "int_parsing": "a whole number",
              "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
              "bool_type": "true or false", "bool_parsing": "true or false"}.get(kind)
    if wanted is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        shown, what = json.dumps(value), "a boolean"
    elif isinstance(value, (int, float)):
        shown, what = json.dumps(value), "a number"
    else:
        shown, what = repr(value), "a string"
    said = f"{shown} is {what} where {wanted} belongs"
    if kind == "string_type" and isinstance(value, float):
        # YAML has already dropped what the number lost: the digits must come from the file, not from here.
        return (f"{said}: quote it ({key}: \"{shown}\"), as the file writes it: unquoted, YAML reads a number and "
                "drops its trailing zeros (1.30 arrives as 1.3)")
    if kind == "string_type":
        return f"{said}: quote it ({key}: \"{shown}\")"
    if not isinstance(value, str):
        return said
    number = value.strip()
    if kind.startswith("bool"):
        if number in ("true", "True", "TRUE", "false", "False", "FALSE"):
            return f"{said}: remove the quotes ({key}: {number.lower()})"
        if number in YAML11_BOOLEANS:
            word = "true" if number.lower() in ("yes", "y", "on") else "false"
            return (f"{said}: the Pulumi CLI reads stack files as YAML 1.2, where {number} is a string and only "
                    f"true and false are booleans; write {key}: {word}")
        return said
    if YAML11_SEXAGESIMAL.fullmatch(number):
        return (f"{said}: the Pulumi CLI reads stack files as YAML 1.2, which has no base-60 numbers ({number} is a "
                "string there); write the number itself")
    try:
        parsed = int(number) if kind.startswith("int") else float(number)
    except ValueError:
        return said
    return f"{said}: remove the quotes ({key}: {number})" if parsed is not None else said


def _pydantic_issues(err: ValidationError, prefix: Tuple[PathPart, ...], root_type: Any) -> List[ConfigIssue]:
    issues = []
    for e in err.errors(include_url=False):
        # "List should have at least 2 items after validation, not 0" for a list of 2 whose items each failed: the
        # items' own mistakes say it all.
        if e["type"] == "too_short" and isinstance(e["input"], (list, tuple)) \
                and len(e["input"]) >= (e.get("ctx") or {}).get("min_length", 0):
            continue
        loc = tuple(part for part in e["loc"] if not (isinstance(part, str) and part.startswith(("function-", "literal["))))
        loc = tuple(p for p in loc if p != "[key]")  # pydantic marks a failing dict key with "[key]"
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            message = "is required"
        elif e["type"] == "extra_forbidden":
            allowed = _allowed_keys(root_type, loc[:-1])
            message = f"unknown key{_did_you_mean(str(loc[-1]), allowed)}; allowed keys: {', '.join(allowed)}"
        elif _type_fix(e, str(loc[-1]) if loc else str(prefix[-1])) is not None:
            message = _type_fix(e, str(loc[-1]) if loc else str(prefix[-1]))
        elif e["type"] not in ("value_error", "assertion_error"):
            message = f"{e['input']!r}: {message}" if not isinstance(e["input"], (dict, list)) else message
        issues.append(_issue(prefix + loc, message))
    return issues


def _allowed_keys(type_: Any, loc: Sequence[PathPart]) -> List[str]:
    """The camelCase keys allowed at `loc` inside `type_` (for unknown-key messages)."""
    for part in loc:
        type_ = _unwrap(type_)
        if isinstance(part, int):
            continue
        if isinstance(type_, type) and issubclass(type_, BaseModel):
            match = next((f for f in type_.model_fields.values() if f.alias == part), None)
            if match is None:
                return []
            type_ = match.annotation
    type_ = _unwrap(type_)
    if isinstance(type_, type) and issubclass(type_, BaseModel):
        return [f.alias for f in type_.model_fields.values()]
    return []


def _unwrap(type_: Any) -> Any:
    """Optional[X] / List[X] / Tuple[X, ...] -> X, so a path can walk through containers."""
    while get_origin(type_) is not None:
        args = [a for a in get_args(type_) if a is not type(None) and a is not Ellipsis]
        if not args:
            break
        type_ = args[-1] if get_origin(type_) is dict else args[0]
    return type_
