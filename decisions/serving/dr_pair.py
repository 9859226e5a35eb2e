"""Two stacks of a DR pair checked as a pair, and how long recovery from the primary's loss takes. Pure: no Pulumi
(`python -m plan --dr-pair PRIMARY SECONDARY` prints it; decisions/config/validate.py runs what one stack can tell
alone).

A pair is a primary and a secondary that name each other in dr.peerStack, share one record (dr.domain,
dr.hostedZoneId, dr.routing: each owns its half, decisions/serving/failover.py) and both serve Triton. The secondary
must be able to take the primary's place:
- **the same models load on both.** A TensorRT plan is built for one GPU: "Without this mode [hardware
  compatibility], engines are not portable across different GPU architectures" (NVIDIA TensorRT support matrix,
  "Engine Portability", docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/support-matrix.html). The models
  bucket replicates the primary's repository as it is, so the two serve on one architecture unless both declare
  inference.triton.portableModels. A slot of the secondary holds at least the memory of one of the primary's.
- **enough capacity.** Slots as the plan counts them (decisions/nodes/pools.offered_gpu_resources), one per Triton
replica.
- **a recovery point as stated.** dr.rpoMinutes is held to S3 Replication Time Control
(decisions/storage/replication.py), which
  covers the models only when both serve from their own models bucket, the one that replicates.
- **clients that reach both.** An internal load balancer answers only networks routed to its VPC; after failover
  the clients in dr.clientCidrs call the peer's.
"""
from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from decisions.nodes import boot
from decisions.nodes.pools import mig_resource, offered_gpu_resources
from decisions.observability import monitoring
from decisions.platform import kueue
from decisions.serving import failover, triton as triton_rules
from decisions.storage import replication
from decisions.storage.lustre import mounts_lustre, protection_summary

if TYPE_CHECKING:
    from decisions.config.model import Dr, Network, Triton
    from decisions.config.validate import StackSpec

Parts = Tuple  # a key path below `gpu-cloud:`, as decisions.config.errors.key_path takes it

# After failover the secondary's autoscaler sees the new load through Triton's queue time: one scrape
# (decisions/observability/monitoring.py ServiceMonitor interval), the metric's rate window (decisions/serving/triton.py
# QUEUE_WINDOW), one HorizontalPodAutoscaler sync: "the default interval is 15 seconds" (kubernetes.io, Horizontal Pod
# Autoscaling, "How does a HorizontalPodAutoscaler work?"; also EKS's default, and components/cluster.py sets none).
HPA_SYNC_S = 15
# A pending pod reaches cluster-autoscaler at its next scan: --scan-interval, 10 s by default (kubernetes/autoscaler
# cluster-autoscaler FAQ, "What are the parameters to CA?"; components/nodes/autoscaler.py leaves it).
AUTOSCALER_SCAN_S = 10


# --- one stack's Triton in GPU slots --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Serving:
    """What Triton of one stack runs on: its pool's GPU slots (a GPU, a time-slice or a MIG instance), one per
    replica."""
    stack: str
    pool: str
    pool_index: int                 # in nodePools, to name its keys
    gpu_model: str
    architecture: str
    slot_memory_mib: int
    slots_per_node: int
    min_replicas: int
    max_replicas: int
    min_nodes: int
    max_nodes: int

    @property
    def floor(self) -> int:
        """Slots Triton always holds: the autoscaler never goes below minReplicas."""
        return self.min_replicas

    @property
    def ceiling(self) -> int:
        """Slots Triton can grow to: maxReplicas, or all the pool's at maxNodes."""
        return min(self.max_replicas, self.max_nodes * self.slots_per_node)

    @property
    def idle_slots(self) -> int:
        """Slots on the nodes an idle stack keeps: its minNodes, or as many as its floor needs."""
        return max(self.min_nodes, math.ceil(self.floor / self.slots_per_node)) * self.slots_per_node

    @property
    def ceiling_key(self) -> Parts:
        """The key that sets the ceiling."""
        if self.max_replicas <= self.max_nodes * self.slots_per_node:
            return ("inference", "triton", "maxReplicas")
        return ("nodePools", self.pool_index, "maxNodes")


def slot_memory_mib(pool, resource: str) -> int:
    """GPU memory one slot may count on: a MIG instance its profile's (nominal GB in its name, 1g.10gb); a shared GPU
    its share (MPS enforces it; time-slices share the memory unguarded, so a model sized for one must fit its share);
    else the whole GPU's."""
    gpu_mib, replicas = pool.primary_type.gpu.memory_mib, pool.spec.gpu_sharing.replicas
    if resource.startswith(mig_resource("")):
        return int(re.search(r"\.(\d+)gb$", resource)[1]) * 1024
    return gpu_mib // replicas if replicas else gpu_mib


def serving(spec: "StackSpec") -> Serving:
    """A stack's Triton in slots; the stack has Triton enabled."""
    settings = spec.inference.triton
    index, pool = next((i, p) for i, p in enumerate(spec.pools) if p.name == settings.pool)
    resources = offered_gpu_resources(pool, spec.catalog)
    if len(resources) != 1:
        raise ValueError(f"Triton's pool {pool.name} offers {dict(resources)}; Triton takes one kind of GPU slot")
    (resource, slots), = resources.items()
    model = pool.primary_type.gpu.model
    return Serving(stack=spec.stack, pool=pool.name, pool_index=index, gpu_model=model,
                   architecture=spec.catalog.gpus[model].architecture, slot_memory_mib=slot_memory_mib(pool, resource),
                   slots_per_node=slots, min_replicas=settings.min_replicas, max_replicas=settings.max_replicas,
                   min_nodes=pool.spec.min_nodes, max_nodes=pool.spec.max_nodes)


# --- rules ----------------------------------------------------------------------------------------------------------
def lustre_protection(spec: "StackSpec", peer: Optional[str]) -> Optional[str]:
    """What keeps a stack's /data (FSx for Lustre), or None where it has none: its export to S3, and whether that
    bucket reaches `peer` (the stack a primary replicates to). The pair's recovery point covers the replicated
    buckets only."""
    lustre = spec.storage.lustre
    if lustre is None:
        return None
    return protection_summary(lustre.import_path, peer)


def client_route_issues(client_cidrs: Sequence[str], vpc_cidr: str, routes: Sequence[str],
                        peer_cidr: Optional[str]) -> List[Tuple[Parts, str]]:
    """Can every client network reach this stack's internal load balancer, and the peer's from inside this VPC?
    The load balancer answers through the VPC's route tables: a client outside the VPC needs a
    network.transitGateway.routes range holding it. Clients inside the VPC reach the peer's load balancer after
    failover only if the peer's VPC is routed. (How the client networks reach the two, and the transit gateways'
    own route tables and peering, are the network team's: nothing here sees them.)"""
    vpc = ipaddress.IPv4Network(vpc_cidr)
    routed = [ipaddress.IPv4Network(r) for r in routes]
    issues: List[Tuple[Parts, str]] = []
    for i, cidr in enumerate(client_cidrs):
        net = ipaddress.IPv4Network(cidr)
        if not net.subnet_of(vpc) and not any(net.subnet_of(r) for r in routed):
            issues.append((("dr", "clientCidrs", i), f"{cidr} is neither in the VPC ({vpc_cidr}) nor in a "
                           "network.transitGateway.routes range, so this region's internal load balancer cannot "
                           "answer it: route it through the transit gateway"))
    inside = [c for c in client_cidrs if ipaddress.IPv4Network(c).subnet_of(vpc)]
    if peer_cidr and inside and not any(ipaddress.IPv4Network(peer_cidr).subnet_of(r) for r in routed):
        issues.append((("network", "transitGateway", "routes"), f"dr.clientCidrs {', '.join(inside)} are in this "
                       f"VPC; after failover they call the peer's load balancer in {peer_cidr}, which no route "
                       "sends through the transit gateway: add it"))
    return issues


def stack_issues(dr: "Dr", settings: "Triton", network: "Network",
                 peer_cidr: Optional[str]) -> List[Tuple[Parts, str]]:
    """What one stack's dr.rpoMinutes and dr.clientCidrs can be judged on alone (`peer_cidr`: the peer's VPC, when its
    stack file is at hand)."""
    issues: List[Tuple[Parts, str]] = []
    if dr.role == "none":
        issues += [(("dr", key), "belongs to a DR pair: set dr.role (primary or secondary), or leave it out")
                   for key, set_ in (("rpoMinutes", dr.rpo_minutes is not None), ("clientCidrs", bool(dr.client_cidrs)))
                   if set_]
        return issues
    if dr.rpo_minutes is not None and dr.role == "secondary":
        issues.append((("dr", "rpoMinutes"), "is a primary's target: a secondary replicates nothing (what is written "
                       "there stays there); set it on the primary"))
    elif dr.rpo_minutes is not None and dr.rpo_minutes < replication.REPLICATION_TIME_MINUTES:
        issues.append((("dr", "rpoMinutes"), f"{dr.rpo_minutes} cannot be met: S3 Replication Time Control replicates "
                       f"99.99 % of objects within {replication.REPLICATION_TIME_MINUTES} minutes "
                       "(decisions/storage/replication.py)"
                       f", and that is its only setting; allowed: {replication.REPLICATION_TIME_MINUTES} or more"))
    # An internet-facing load balancer is reached over the internet, from anywhere: nothing to route.
    if dr.client_cidrs and settings.scheme == "internal":
        routes = network.transit_gateway.routes if network.transit_gateway else ()
        issues += client_route_issues(dr.client_cidrs, network.cidr, routes, peer_cidr)
    return issues


def pair_issues(primary: "StackSpec", secondary: "StackSpec") -> List[Tuple[str, Parts, str]]:
    """Every reason the two stacks do not hold together as primary and secondary: (stack, key path, message)."""
    issues: List[Tuple[str, Parts, str]] = []
    for spec, other, role in ((primary, secondary, "primary"), (secondary, primary, "secondary")):
        if spec.dr.role != role:
            issues.append((spec.stack, ("dr", "role"), f"is {spec.dr.role}; a pair is a primary, then a secondary"))
        elif spec.dr.peer_stack.rsplit("/", 1)[-1] != other.stack:
            issues.append((spec.stack, ("dr", "peerStack"), f"names {spec.dr.peer_stack}, not {other.stack}: the two "
                           "stacks of a pair name each other"))
    for key, attribute in (("routing", "routing"), ("domain", "domain"), ("hostedZoneId", "hosted_zone_id")):
        ours, theirs = getattr(primary.dr, attribute), getattr(secondary.dr, attribute)
        if "none" not in (primary.dr.role, secondary.dr.role) and ours != theirs:
            issues.append((secondary.stack, ("dr", key), f"is {theirs}, {primary.stack}'s is {ours}: the two halves of "
                           "one record set need the same"))
    for spec in (primary, secondary):
        if not spec.inference.triton.enabled:
            issues.append((spec.stack, ("inference", "triton", "enabled"), "is false: the record has nothing to send "
                           "clients to in this region"))
    if any(not spec.inference.triton.enabled for spec in (primary, secondary)):
        return issues
    p, s = serving(primary), serving(secondary)
    p_triton, s_triton = primary.inference.triton, secondary.inference.triton
    if p_triton.scheme != s_triton.scheme:
        issues.append((secondary.stack, ("inference", "triton", "scheme"), f"is {s_triton.scheme}, "
                       f"{primary.stack}'s is {p_triton.scheme}: clients of one could not reach the other"))
    if p.architecture != s.architecture:
        issues += [(spec.stack, ("inference", "triton", "portableModels"), f"is false, and {p.stack} serves on "
                    f"{p.gpu_model} ({p.architecture}), {s.stack} on {s.gpu_model} ({s.architecture}): a TensorRT "
                    "plan built for one architecture does not load on the other. Serve on one architecture, or "
                    "keep such plans out of the replicated repository and declare portableModels: true in both")
                   for spec in (primary, secondary) if not spec.inference.triton.portable_models]
    if s.slot_memory_mib < p.slot_memory_mib:
        issues.append((secondary.stack, ("inference", "triton", "pool"), f"{s.pool} gives a replica "
                       f"{s.slot_memory_mib:,} MiB of {s.gpu_model}, less than the {p.slot_memory_mib:,} MiB of "
                       f"{p.gpu_model} a replica has in {p.stack}: a model that fits there may not load here"))
    # The secondary must be able to grow to every slot the primary always runs (its minReplicas, sized for its
    # quietest load): below that, failover drops requests even then. Peak load is the recovery time's business, not a
    # refusal: `recovery` at the primary's maximum says how long the secondary takes to reach it, or that it cannot.
    if s.ceiling < p.floor:
        issues.append((secondary.stack, s.ceiling_key, f"lets Triton grow to {s.ceiling} GPU slots, fewer than the "
                       f"{p.floor} {p.stack} always runs (its minReplicas); the secondary must reach all of them"))
    if primary.dr.rpo_minutes is not None:
        issues += [(spec.stack, ("inference", "triton", "modelRepository"), f"{spec.inference.triton.model_repository} "
                    "is not the stack's models bucket, which is what replicates: the models have no recovery point, "
                    f"and {primary.stack}'s dr.rpoMinutes cannot hold for them")
                   for spec in (primary, secondary) if spec.inference.triton.model_repository]
    if p_triton.scheme == s_triton.scheme == "internal":
        issues += _client_issues(primary, secondary)
    return issues


def _client_issues(primary: "StackSpec", secondary: "StackSpec") -> List[Tuple[str, Parts, str]]:
    missing = [spec for spec in (primary, secondary) if not spec.dr.client_cidrs]
    issues = [(spec.stack, ("dr", "clientCidrs"), "is required with internal load balancers: name the networks "
               "clients call from, so that the pair can check both VPCs answer them") for spec in missing]
    if missing:
        return issues
    if sorted(primary.dr.client_cidrs) != sorted(secondary.dr.client_cidrs):
        issues.append((secondary.stack, ("dr", "clientCidrs"), f"lists {', '.join(secondary.dr.client_cidrs)}, "
                       f"{primary.stack} {', '.join(primary.dr.client_cidrs)}: one record, one set of clients"))
    for spec, other in ((primary, secondary), (secondary, primary)):
        tgw = spec.network.transit_gateway
        issues += [(spec.stack, parts, message) for parts, message in client_route_issues(
            spec.dr.client_cidrs, spec.network.cidr, tgw.routes if tgw else (), other.network.cidr)]
    return issues


# --- recovery time --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    name: str
    seconds: int
    why: str
    parts: Tuple["Term", ...] = ()


# What a scale-up's estimate leaves out, for want of a figure: each new replica's first copy of the model repository
# (components/serving/inference.py's init container models-first-sync) runs before Triton starts, so before the startup
# probe's budget, with no time limit of its own; it lasts as long as the repository's size takes at the node's S3
# throughput, which nothing here knows.
FIRST_COPY_NOT_COUNTED = ("each new replica's first copy of the model repository (init container "
                          f"{triton_rules.FIRST_SYNC_CONTAINER}, before Triton starts): no time limit; as long as the "
                          "repository's size takes to download")


@dataclass(frozen=True)
class Recovery:
    """From the primary failing to the secondary serving `load` replicas: detection, the record's TTL, the
    secondary's scale-up. `terms` is None when the secondary cannot reach `load`; `not_counted` names what takes
    time and has no term (FIRST_COPY_NOT_COUNTED when new replicas start)."""
    load: int
    terms: Optional[Tuple[Term, ...]]
    not_counted: Tuple[str, ...] = ()

    @property
    def seconds(self) -> Optional[int]:
        """The terms' sum; None when the secondary cannot reach `load` (no terms)."""
        return None if self.terms is None else sum(term.seconds for term in self.terms)


def _seconds(duration: str) -> int:
    """'30s' -> 30, '2m' -> 120."""
    match = re.fullmatch(r"(\d+)([sm])", duration)
    if not match:
        raise ValueError(f"{duration!r} is not a duration such as 30s or 2m")
    return int(match[1]) * (60 if match[2] == "m" else 1)


def _reaction() -> Term:
    scrape = _seconds(monitoring.service_monitor_spec("inference", {}, "metrics")["endpoints"][0]["interval"])
    window = _seconds(triton_rules.QUEUE_WINDOW)
    return Term("autoscaler reaction", scrape + window + HPA_SYNC_S,
                f"a {scrape} s scrape, the {window} s queue-time window, a {HPA_SYNC_S} s HPA sync")


def recovery(primary: "StackSpec", secondary: "StackSpec", load: int) -> Recovery:
    """Worst case, each term its sourced figure: the primary's health check turns unhealthy
    (decisions/serving/failover.py), resolvers drop the old answer, then the secondary scales to `load` replicas. Both
    stacks serve Triton. New replicas' first copy of the models has no figure and is not counted (`not_counted`)."""
    scale_up = _scale_up(secondary, serving(secondary), load)
    if scale_up is None:
        return Recovery(load, None)
    scheme = primary.inference.triton.scheme
    detection = Term("detection", failover.detection_seconds(scheme), (
        f"Route 53 checks {failover.HEALTH_PATH} every {failover.REQUEST_INTERVAL_S} s, unhealthy after "
        f"{failover.FAILURE_THRESHOLD} failures" if scheme == "internet-facing" else
        f"{failover.TARGET_UNHEALTHY_THRESHOLD} failed NLB checks {failover.TARGET_CHECK_INTERVAL_S} s apart, then "
        f"{failover.ALARM_DATAPOINTS_TO_ALARM} of {failover.ALARM_EVALUATION_PERIODS} alarm periods of "
        f"{failover.ALARM_PERIOD_S} s with no healthy target"))
    ttl = Term("DNS TTL", failover.RECORD_TTL_S, "resolvers keep the old answer this long")
    return Recovery(load, (detection, ttl, scale_up), (FIRST_COPY_NOT_COUNTED,) if scale_up.parts else ())


def _scale_up(spec: "StackSpec", s: Serving, load: int) -> Optional[Term]:
    if load <= s.floor:
        return Term("scale-up", 0, f"{s.stack} runs {s.floor} replica{'s' * (s.floor != 1)} already")
    if load > s.ceiling:
        return None
    parts = [_reaction()]
    new_nodes = max(0, math.ceil((load - s.idle_slots) / s.slots_per_node))
    if new_nodes:
        pool = spec.pool(s.pool)
        steps = boot.worst_case(spec.node_image.source, nvswitch=spec.catalog.gpus[s.gpu_model].nvswitch,
                                efa=pool.efa, lustre=mounts_lustre(pool, spec.storage.lustre is not None))
        booted, ready = sum(steps.values()), boot.node_ready_seconds()
        parts.append(Term(f"{new_nodes} new node{'s' * (new_nodes > 1)}", AUTOSCALER_SCAN_S + booted + ready,
                          f"autoscaler scan {AUTOSCALER_SCAN_S} s, boot and gate {booted} s, registered with GPUs "
                          f"{ready} s (decisions/nodes/boot.py)"))
    # A node that already runs a replica has Triton's image; a new node, or an idle one without a replica, pulls it.
    if new_nodes or s.idle_slots // s.slots_per_node > s.floor:
        parts.append(Term("image pull", kueue.IMAGE_PULL_ALLOWANCE_S, "Triton's image on a node without it "
                          "(decisions/platform/kueue.py's allowance)"))
    # From Triton's start only: the first copy before it is FIRST_COPY_NOT_COUNTED.
    parts.append(Term("models load", triton_rules.STARTUP_PROBES * triton_rules.STARTUP_PROBE_PERIOD_S, f"the startup probe's "
                      f"budget ({triton_rules.STARTUP_PROBES} probes {triton_rules.STARTUP_PROBE_PERIOD_S} s apart)"))
    return Term("scale-up", sum(p.seconds for p in parts), f"{s.stack} from {s.floor} to {load} replicas",
                tuple(parts))
