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
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes import boot
from decisions.nodes.pools import offered_gpu_resources, slot_memory_mib
from decisions.observability import monitoring
from decisions.platform import kueue
from decisions.serving import failover, triton as triton_rules
from decisions.storage import replication
from decisions.storage.lustre import mounts_lustre, protection_summary

if TYPE_CHECKING:
    from decisions.config.model import Dr, Network, Triton
    from decisions.config.stack import StackSpec

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
def declared_models(*settings: "Triton") -> Dict[str, int]:
    """The models the given stacks declare (inference.triton.models), by name, each with the most GPU memory any of
    them declares for it."""
    models: Dict[str, int] = {}
    for each in settings:
        for model in each.models:
            models[model.name] = max(models.get(model.name, 0), model.gpu_memory_mib)
    return models


def models_fit_issue(models: Mapping[str, int], slot_mib: int, where: str) -> Optional[str]:
    """Whether the models fit one replica's GPU slot of `slot_mib` together: Triton loads every model of its
    repository (--model-control-mode=poll loads all it finds: server v2.71.0 docs/user_guide/model_management.md,
    "Model Control Mode POLL"), so one replica needs all of them; None when they fit, else why not."""
    total = sum(models.values())
    if total <= slot_mib:
        return None
    largest = sorted(models.items(), key=lambda item: (-item[1], item[0]))
    listed = ", ".join(f"{name} {mib:,} MiB" for name, mib in largest)
    return (f"{where} gives a replica {slot_mib:,} MiB of GPU memory, and every replica loads every model: "
            f"{total:,} MiB together ({listed}). A model that does not fit stays UNAVAILABLE (TritonModelNotReady)")


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
    # dr.clientCidrs also say who may reach an internal load balancer at all (its loadBalancerSourceRanges,
    # decisions/serving/lb_controller.py): a stack without a pair names its clients there too.
    if dr.role == "none" and dr.rpo_minutes is not None:
        issues.append((("dr", "rpoMinutes"), "belongs to a DR pair: set dr.role (primary or secondary), or leave it "
                       "out"))
    elif dr.rpo_minutes is not None and dr.role == "secondary":
        issues.append((("dr", "rpoMinutes"), "is a primary's target: a secondary replicates nothing (what is written "
                       "there stays there); set it on the primary"))
    elif dr.rpo_minutes is not None and dr.rpo_minutes < replication.REPLICATION_TIME_MINUTES:
        issues.append((("dr", "rpoMinutes"), f"{dr.rpo_minutes} cannot be met: S3 Replication Time Control is "
                       f"{replication.RTC_FIGURES} (decisions/storage/replication.py), and "
                       f"{replication.REPLICATION_TIME_MINUTES} minutes is its only setting; allowed: "
                       f"{replication.REPLICATION_TIME_MINUTES} or more"))
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
    # The secondary serves the primary's replicated repository and what is published in it: every model either stack
    # declares. Where the primary declares none, a secondary slot must be at least the size of the primary's.
    if p_triton.models:
        problem = models_fit_issue(declared_models(p_triton, s_triton), s.slot_memory_mib,
                                   f"{s.pool} ({s.gpu_model})")
        if problem:
            issues.append((secondary.stack, ("inference", "triton", "pool"), f"cannot hold every model of "
                           f"{p.stack} after failover: {problem}"))
    elif s.slot_memory_mib < p.slot_memory_mib:
        issues.append((secondary.stack, ("inference", "triton", "pool"), f"{s.pool} gives a replica "
                       f"{s.slot_memory_mib:,} MiB of {s.gpu_model}, less than the {p.slot_memory_mib:,} MiB of "
                       f"{p.gpu_model} a replica has in {p.stack}: a model that fits there may not load here. "
                       f"Declare {p.stack}'s models (inference.triton.models) to check what they need instead"))
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


# What detection's figure leaves out: it is the arithmetic of the checks and the alarm's window, not a bound. Route 53
# follows an alarm by its data stream, not its state (Route 53 Developer Guide, "How Amazon Route 53 determines whether
# a health check is healthy", health checks that monitor CloudWatch alarms), and neither the NLB's metrics reaching
# CloudWatch, Route 53 reading the data stream, nor Route 53's name servers taking up a health check's new status has
# a published bound.
DETECTION_NOT_COUNTED = {
    "internal": "in detection, the NLB's HealthyHostCount reaching CloudWatch, Route 53 reading the alarm's data stream "
                "and its name servers taking up the new status: no published bound for any of them",
    "internet-facing": "in detection, Route 53 gathering its checkers' results and its name servers taking up the new "
                       "status: no published bound",
}


@dataclass(frozen=True)
class Recovery:
    """From the primary failing to the secondary serving `load` replicas, an estimate: detection, the record's TTL,
    the secondary's scale-up. `terms` is None when the secondary cannot reach `load`; `not_counted` names what takes
    time and has no term (DETECTION_NOT_COUNTED always, FIRST_COPY_NOT_COUNTED when new replicas start); `assumes`
    what the terms take for granted (capacity for new nodes)."""
    load: int
    terms: Optional[Tuple[Term, ...]]
    not_counted: Tuple[str, ...] = ()
    assumes: Tuple[str, ...] = ()

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
    """An estimate, each term its sourced figure: the primary's health check turns unhealthy
    (decisions/serving/failover.py), resolvers drop the old answer, then the secondary scales to `load` replicas. Both
    stacks serve Triton. What has no figure is named, not counted (`not_counted`); what the scale-up takes for granted
    is named too (`assumes`)."""
    s = serving(secondary)
    scale_up = _scale_up(secondary, s, load)
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
    not_counted = (DETECTION_NOT_COUNTED[scheme], *((FIRST_COPY_NOT_COUNTED,) if scale_up.parts else ()))
    return Recovery(load, (detection, ttl, scale_up), not_counted, _capacity_assumed(secondary, s, load))


def new_nodes(s: Serving, load: int) -> int:
    """The nodes the secondary adds to serve `load` replicas, beyond those it keeps idle."""
    return max(0, math.ceil((load - s.idle_slots) / s.slots_per_node))


def _capacity_assumed(spec: "StackSpec", s: Serving, load: int) -> Tuple[str, ...]:
    """What the new nodes' term takes for granted: EC2 has the instances when the autoscaler asks. Nothing holds
    on-demand or spot capacity for a region that idles (an InsufficientInstanceCapacity leaves the scale-up without
    an end); an On-Demand Capacity Reservation for them does, billed whether used or not."""
    count = new_nodes(s, load)
    if not count:
        return ()
    pool, itype = spec.pool(s.pool), spec.pool(s.pool).primary_type.name
    if pool.spec.reserved_capacity:
        return (f"the pool's {pool.spec.capacity} capacity has {count} x {itype} unused when the autoscaler asks",)
    # A reserved pool launches into its reservation only (docs/gpu-pools.md), so the reservation holds the nodes the
    # pool keeps idle as well as those it adds.
    floor = s.idle_slots // s.slots_per_node + count
    return (f"EC2 has {count} x {itype} {pool.spec.capacity} in {spec.region} when the autoscaler asks; nothing "
            f"reserves {'them' if count > 1 else 'it'}. To hold this figure, run pool {s.pool} on an On-Demand Capacity Reservation of {floor} x "
            f"{itype} (capacity: reserved, with capacityReservationId and availabilityZone), billed whether used or "
            "not",)


def _scale_up(spec: "StackSpec", s: Serving, load: int) -> Optional[Term]:
    if load <= s.floor:
        return Term("scale-up", 0, f"{s.stack} runs {s.floor} replica{'s' * (s.floor != 1)} already")
    if load > s.ceiling:
        return None
    parts = [_reaction()]
    added = new_nodes(s, load)
    if added:
        pool = spec.pool(s.pool)
        steps = boot.worst_case(spec.node_image.source, nvswitch=spec.catalog.gpus[s.gpu_model].nvswitch,
                                efa=pool.efa, lustre=mounts_lustre(pool, spec.storage.lustre is not None))
        booted, ready = sum(steps.values()), boot.node_ready_seconds()
        parts.append(Term(f"{added} new node{'s' * (added > 1)}", AUTOSCALER_SCAN_S + booted + ready,
                          f"autoscaler scan {AUTOSCALER_SCAN_S} s, boot and gate {booted} s, registered with GPUs "
                          f"{ready} s (decisions/nodes/boot.py)"))
    # A node that already runs a replica has Triton's image; a new node, or an idle one without a replica, pulls it.
    if added or s.idle_slots // s.slots_per_node > s.floor:
        parts.append(Term("image pull", kueue.IMAGE_PULL_ALLOWANCE_S, "Triton's image on a node without it "
                          "(decisions/platform/kueue.py's allowance)"))
    # From Triton's start only: the first copy before it is FIRST_COPY_NOT_COUNTED.
    parts.append(Term("models load", triton_rules.STARTUP_PROBES * triton_rules.STARTUP_PROBE_PERIOD_S, f"the startup probe's "
                      f"budget ({triton_rules.STARTUP_PROBES} probes {triton_rules.STARTUP_PROBE_PERIOD_S} s apart)"))
    return Term("scale-up", sum(p.seconds for p in parts), f"{s.stack} from {s.floor} to {load} replicas",
                tuple(parts))
