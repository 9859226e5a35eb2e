"""How long a GPU node repair takes: fault -> seen -> cordoned (out of service) -> repair started -> back in service
(a reboot) or old instance gone -> replacement launched -> gate passed -> Ready, for every pool of every shipped stack
and every fault class of decisions/nodes/faults.yaml by its remediation (none, reboot, replace), plus a reboot whose
gate fails, a NotReady node and a silent checker. Typical and worst case, and the ratio to issue #38's goals: out of
service within 2 minutes of the fault, repaired (back in service, or replaced and Ready) within 10 minutes plus one
boot of the pool's node. Where the worst case misses a goal, the row names the steps that make it miss, and why.

A plain model, not a measurement: pure functions over the figures in FIGURES (one place), each with its source. The
figures are read from the code's own constants (the checker's timer, the scrape interval, the controller's interval,
CONFIRM_S, its retries, the drain hook, the boot model) wherever the code has one, so the bench follows the code;
the few it has not (how long EC2 takes to stop or launch an instance, a typical boot) are marked "assumed".

    .venv/bin/python -m bench.repair_bench [--stack prod-us-east-1 ...] [--steps] [--without-fast-path]

Left out: a second fault in the same pool (one repair at a time per pool: it waits for the first), the pool's hourly
budget running out, the fleet-fault halt, calls that fail past their retries (the next pass makes them again, 30 s
later each), and spot capacity (a spot pool's replacement waits for capacity in its pools).
"""
from __future__ import annotations

import argparse
import configparser
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from decisions.nodes import boot, drain, faults, repair
from decisions.observability.monitoring import service_monitor_spec
from decisions.storage import lustre as lustre_rules
from jobs import aws_api
from plan.stackfile import known_stacks, load_stack

ROOT = Path(__file__).resolve().parent.parent
HEALTH_TIMER = ROOT / "userdata" / "units" / "gpu-cloud-health.timer"

GOAL_OUT_OF_SERVICE_S = 120          # issue #38: out of service within 2 minutes of the fault
GOAL_REPAIR_MARGIN_S = 600           # issue #38: replaced within 10 minutes plus one boot

# Milestones a step may end at, in order.
SEEN, OUT, STARTED, GONE, LAUNCHED, GATE, READY, BACK = (
    "seen", "out of service", "repair started", "old instance gone", "replacement launched", "gate passed", "Ready",
    "back in service")


def _systemd_seconds(text: str) -> int:
    """A systemd time span as the timer uses it ("1min", "5s", "90")."""
    units = {"min": 60, "s": 1, "sec": 1, "h": 3600, "": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)\s*([a-z]*)", text))


def _timer() -> Tuple[int, int]:
    """The run-time checker's period and systemd's accuracy window (the timer may elapse that much late)."""
    unit = configparser.ConfigParser(strict=False)
    unit.read_string(HEALTH_TIMER.read_text(encoding="utf-8"))
    return _systemd_seconds(unit["Timer"]["OnUnitActiveSec"]), _systemd_seconds(unit["Timer"].get("AccuracySec", "60s"))


def _retry_waits_s() -> float:
    """The longest a call that succeeds on its last attempt waits between attempts (jobs/aws_api.py, botocore's standard
    mode): throttled each time, full jitter drawn at its top, and a Retry-After header adding its most."""
    return sum(min(aws_api.THROTTLING_BASE_S * 2 ** (n - 1), aws_api.MAX_BACKOFF_S)
               + aws_api.RETRY_AFTER_MAX_ADDITIONAL_S
               for n in range(1, aws_api.MAX_ATTEMPTS))


def _up_to_pass(seconds: float) -> float:
    """A wait the controller notices on its next pass."""
    return math.ceil(seconds / repair.INTERVAL_S) * repair.INTERVAL_S


@dataclass(frozen=True)
class Figure:
    typical_s: float
    worst_s: float
    source: str


_CHECK_S, _CHECK_ACCURACY_S = _timer()
_SCRAPE_S = _systemd_seconds(service_monitor_spec("", {}, "")["endpoints"][0]["interval"])
_CALL_S = _retry_waits_s()
# Kubernetes' default terminationGracePeriodSeconds (core/v1 PodSpec): what a pod that exits on SIGTERM takes at most.
_POD_DEFAULT_GRACE_S = 30
_NODE_MONITOR_GRACE_S = 40           # kube-controller-manager --node-monitor-grace-period default (repair.py's note)
_NODE_MONITOR_PERIOD_S = 5           # kube-controller-manager --node-monitor-period default

# Every figure of the model, in one place: (typical, worst, source).
FIGURES: Dict[str, Figure] = {
    "check": Figure(_CHECK_S / 2, _CHECK_S + _CHECK_ACCURACY_S,
                    f"userdata/units/gpu-cloud-health.timer: every {_CHECK_S} s (OnUnitActiveSec), up to "
                    f"{_CHECK_ACCURACY_S} s late (AccuracySec); typical: half a period"),
    "scrape": Figure(_SCRAPE_S / 2, _SCRAPE_S,
                     f"node-exporter's textfile scraped every {_SCRAPE_S} s (kube-prometheus-stack's default, the "
                     "interval of decisions/observability/monitoring.service_monitor_spec)"),
    "pass": Figure(repair.INTERVAL_S / 2, repair.INTERVAL_S,
                   f"decisions/nodes/repair.py INTERVAL_S {repair.INTERVAL_S}: the controller's pass"),
    "call": Figure(0, _CALL_S,
                   f"jobs/aws_api.py: {aws_api.MAX_ATTEMPTS} attempts, full jitter up to "
                   f"{aws_api.THROTTLING_BASE_S:g} x 2^(n-1) s after throttling plus a Retry-After of up to "
                   f"{aws_api.RETRY_AFTER_MAX_ADDITIONAL_S:g} s: {_CALL_S:g} s of waits when the last attempt "
                   "succeeds"),
    "confirm": Figure(_up_to_pass(repair.CONFIRM_S), _up_to_pass(repair.CONFIRM_S),
                      f"decisions/nodes/repair.py CONFIRM_S {repair.CONFIRM_S}, counted from the pass that first "
                      "sees the fault, checked each pass"),
    "stale-cordon": Figure(repair.STALE_CHECK_S - _CHECK_S / 2 + repair.INTERVAL_S / 2,
                           repair.STALE_CHECK_S + repair.INTERVAL_S,
                           f"decisions/nodes/repair.py STALE_CHECK_S {repair.STALE_CHECK_S} after the last check "
                           "(the checker died up to a period after it), then a pass"),
    "stale-repair": Figure(_up_to_pass(repair.STALE_REPAIR_S - repair.STALE_CHECK_S),
                           _up_to_pass(repair.STALE_REPAIR_S - repair.STALE_CHECK_S),
                           f"decisions/nodes/repair.py STALE_REPAIR_S {repair.STALE_REPAIR_S} after the last check"),
    "not-ready-taint": Figure(_NODE_MONITOR_GRACE_S, _NODE_MONITOR_GRACE_S + _NODE_MONITOR_PERIOD_S,
                              "kube-controller-manager: NotReady and the unreachable NoSchedule taint after "
                              f"--node-monitor-grace-period {_NODE_MONITOR_GRACE_S} s, checked every "
                              f"--node-monitor-period {_NODE_MONITOR_PERIOD_S} s"),
    "not-ready-repair": Figure(_up_to_pass(repair.NOT_READY_S) - _NODE_MONITOR_GRACE_S,
                               repair.NOT_READY_S + repair.INTERVAL_S - _NODE_MONITOR_GRACE_S,
                               f"decisions/nodes/repair.py NOT_READY_S {repair.NOT_READY_S} from the Ready "
                               "condition's transition (as EKS node auto repair), then a pass"),
    "evict": Figure(_up_to_pass(_POD_DEFAULT_GRACE_S), _up_to_pass(repair.FAST_DRAIN_S),
                    f"the controller's drain before a reboot (or a replacement launched first): pods leave within "
                    f"their grace (Kubernetes' default {_POD_DEFAULT_GRACE_S} s), at most decisions/nodes/repair.py "
                    f"FAST_DRAIN_S {repair.FAST_DRAIN_S} (the spot notice), seen on a pass"),
    "reboot-down": Figure(60, 240,
                          "assumed typical: the OS shuts down in a minute; worst: EC2 hard-reboots an instance that "
                          "has not shut down within a few minutes (RebootInstances reference, four in its earlier "
                          "wording; repair.py REBOOT_RETRY_S)"),
    "ec2-terminate": Figure(60, 300, "assumed: EC2 documents no bound on shutting-down -> terminated"),
    "launch": Figure(10, 60, "assumed: the group's launch activity (terminate and launch at once: EC2 Auto Scaling "
                             "user guide, instance maintenance policy overview; spot and on-demand groups set no "
                             "policy)"),
    "launch-reserved": Figure(30, 120, "assumed: the group retries its launch, refused while the reservation "
                                       "is full, until the old instance's slot is free"),
    "dcgm-collect": Figure(15, 30, "dcgm-exporter's default collect interval, 30 s (--collect-interval 30000 ms)"),
    "dcgm-scrape": Figure(7.5, 15, "the DCGM exporter's ServiceMonitor, every 15 s (gpu-operator v26.7.0 values.yaml "
                                   "dcgmExporter.serviceMonitor.interval)"),
    "health-replace": Figure(10, 60, "assumed: the group acts on SetInstanceHealth Unhealthy (the gate's or the "
                                     "controller's)"),
}

# The fast path for dead hardware (issue #38 item 5), where the code has it: the controller completes the termination
# hook itself (decisions/nodes/repair.py FAST_DRAIN_S, jobs/node_repair.py `leaving`).
FAST_DRAIN_S: Optional[int] = getattr(repair, "FAST_DRAIN_S", None)


def hook_figures(fast_drain_s: Optional[int] = FAST_DRAIN_S) -> Dict[str, Figure]:
    """The termination hook, from the instance entering Terminating:Wait to the lifecycle action completed: on a node
    whose kubelet runs, and on one whose kubelet is gone. Today's path: the termination handler (NTH v1.25.1)
    completes it only after a drain that succeeds (draincordon/handler.go), so pods that cannot terminate hold it to
    the heartbeat. The fast path: the controller sees the termination on a pass and completes the hook once nothing
    can checkpoint, at the latest FAST_DRAIN_S later (seen on a pass), or at once where the kubelet is gone."""
    today = Figure(_POD_DEFAULT_GRACE_S + drain.DRAIN_DELIVERY_MARGIN_S / 2, drain.LIFECYCLE_DRAIN_TIMEOUT_S,
                   f"NTH drains and completes the hook: delivery (half of drain.py DRAIN_DELIVERY_MARGIN_S "
                   f"{drain.DRAIN_DELIVERY_MARGIN_S}) and a pod's default grace; worst: pods that cannot terminate "
                   f"hold it to drain.py LIFECYCLE_DRAIN_TIMEOUT_S {drain.LIFECYCLE_DRAIN_TIMEOUT_S}")
    dead_today = Figure(drain.LIFECYCLE_DRAIN_TIMEOUT_S, drain.LIFECYCLE_DRAIN_TIMEOUT_S,
                        "NTH on a node whose kubelet is gone: its pods never finish terminating, so the drain never "
                        f"succeeds and the hook runs to LIFECYCLE_DRAIN_TIMEOUT_S {drain.LIFECYCLE_DRAIN_TIMEOUT_S} "
                        "every time")
    if fast_drain_s is None:
        return {"drain-hook": today, "drain-hook-dead-kubelet": dead_today}
    capped = repair.INTERVAL_S + _up_to_pass(fast_drain_s) + _CALL_S
    return {
        "drain-hook": Figure(min(today.typical_s, capped), min(today.worst_s, capped),
                             f"fast path: the controller sees Terminating:Wait on a pass ({repair.INTERVAL_S} s) and "
                             f"completes the hook once no pod can checkpoint, at most repair.py FAST_DRAIN_S "
                             f"{fast_drain_s} later, plus the call's retries; typical: NTH's drain that succeeds"),
        "drain-hook-dead-kubelet": Figure(repair.INTERVAL_S / 2, repair.INTERVAL_S + 2 * _CALL_S,
                                          "fast path, kubelet gone: on the pass that sees Terminating:Wait the "
                                          "controller deletes the pods with grace 0 and completes the hook (two "
                                          "calls' retries)"),
    }


FIGURES.update(hook_figures())

# A typical boot, step by step (decisions/nodes/boot.py gives only the worst cases, which the hooks are sized for).
# Assumed, not measured: no boot of a real instance has been timed for this project. A step not named here is taken
# at its worst case.
TYPICAL_BOOT_S: Dict[str, float] = {
    "before-gate": 150, "kmod-load": 60, "fabric-manager-start": 90, "lustre-client": 20, "checks": 20,
    "verifier": 30, "report": 5, "packages": 200, "driver-dkms-build": 400, "fabric-manager-install": 60,
}
TYPICAL_READY_S = 60 + 120           # assumed: registration, then NFD, the validator and the device plugin


@dataclass(frozen=True)
class Step:
    name: str
    typical_s: float
    worst_s: float
    source: str
    reaches: str = ""                # the milestone reached when the step ends
    why: str = ""                    # set on a step that can make a goal miss: why it takes that long


def step(name: str, figure: str, reaches: str = "", why: str = "", factor: float = 1.0) -> Step:
    f = FIGURES[figure]
    return Step(name, f.typical_s * factor, f.worst_s * factor, f.source, reaches, why)


@dataclass(frozen=True)
class PoolShape:
    stack: str
    pool: str
    capacity: str
    reserved: bool
    source: str
    boot_steps: Dict[str, int]
    launch_first: bool = False       # its reservation has a spare slot (decisions/nodes/pools.py launches_first)

    @property
    def label(self) -> str:
        return f"{self.pool} (spare slot)" if self.launch_first else self.pool

    @property
    def boot_worst_s(self) -> int:
        return sum(self.boot_steps.values())

    @property
    def boot_typical_s(self) -> float:
        return sum(TYPICAL_BOOT_S.get(name, worst) for name, worst in self.boot_steps.items())

    @property
    def one_boot_worst_s(self) -> int:
        """One node boot, as the goal counts it: launch to the gate's CONTINUE, then Ready (the rollout bench's
        per-node figure)."""
        return self.boot_worst_s + boot.node_ready_seconds()

    @property
    def one_boot_typical_s(self) -> float:
        return self.boot_typical_s + TYPICAL_READY_S


@dataclass(frozen=True)
class Timeline:
    pool: PoolShape
    fault: str                       # the class of the row
    classes: Tuple[str, ...]         # fault-table classes it stands for
    steps: Tuple[Step, ...]
    ends_at: str                     # READY (replaced) or BACK (rebooted back), or "" (nothing is done)
    notes: Tuple[str, ...] = ()

    def at(self, milestone: str, case: str) -> Optional[float]:
        """Seconds from the fault to `milestone` ("typical" or "worst"), None if the timeline never reaches it."""
        total = 0.0
        for s in self.steps:
            total += s.typical_s if case == "typical" else s.worst_s
            if s.reaches == milestone:
                return total
        return None

    def total(self, case: str) -> float:
        return sum(s.typical_s if case == "typical" else s.worst_s for s in self.steps)

    def goal_repaired_s(self) -> float:
        """10 minutes plus one boot of the pool's node, its worst case (the same goal for both cases)."""
        return GOAL_REPAIR_MARGIN_S + self.pool.one_boot_worst_s

    def out_ratio(self, case: str) -> Optional[float]:
        out = self.at(OUT, case)
        return None if out is None else out / GOAL_OUT_OF_SERVICE_S

    def repaired_ratio(self, case: str) -> Optional[float]:
        return None if not self.ends_at else self.at(self.ends_at, case) / self.goal_repaired_s()

    def misses(self) -> List[str]:
        """What makes the worst case miss a goal. Out of service: every step before it that carries a reason. Repaired:
        the steps after it that carry a reason, longest first, as many as it takes to cover the overshoot (without
        them the goal is met), or the longest step when none carries one."""
        found = []
        for goal, ratio, upto in (("out of service", self.out_ratio("worst"), OUT),
                                  ("repaired", self.repaired_ratio("worst"), self.ends_at)):
            if ratio is None or ratio <= 1:
                continue
            before, after, reached = [], [], False
            for s in self.steps:
                (after if reached else before).append(s)
                reached = reached or s.reaches == OUT
                if s.reaches == upto:
                    break
            # Steps that share a reason count together (the reservation's three steps, say).
            groups: Dict[str, List[Step]] = {}
            for s in (before if goal == "out of service" else after):
                if s.why:
                    groups.setdefault(s.why, []).append(s)
            ranked = sorted(groups.items(), key=lambda g: -sum(s.worst_s for s in g[1]))
            if goal == "repaired":
                over, covered, kept = self.at(upto, "worst") - self.goal_repaired_s(), 0.0, []
                for why, group in ranked:
                    if covered >= over:
                        break
                    kept.append((why, group))
                    covered += sum(s.worst_s for s in group)
                ranked = kept
            if not ranked:
                longest = max(before if goal == "out of service" else after, key=lambda s: s.worst_s)
                ranked = [("its worst case", [longest])]
            found.append(f"{goal} x{ratio:.2f}: " + "; ".join(
                f"{' + '.join(s.name for s in group)} {sum(s.worst_s for s in group):.0f} s: {why}"
                for why, group in ranked))
        return found


def pool_shapes(stack: str) -> List[PoolShape]:
    """Every pool of a shipped stack with its boot's worst steps (the shape components/nodes/nodepool.py renders),
    and each reserved pool again as if its reservation had a spare slot (launch first): the offline account models a
    reservation at the pool's maxNodes, so no shipped pool launches first until its account says otherwise."""
    _, spec = load_stack(stack)
    source = spec.node_image.source
    shapes = [PoolShape(stack=stack, pool=p.name, capacity=p.spec.capacity, reserved=bool(p.spec.reserved_capacity),
                        source=source,
                        boot_steps=boot.worst_case(source, nvswitch=spec.catalog.gpu_model(p.primary_type.name).nvswitch,
                                                   efa=p.efa, lustre=lustre_rules.mounts_lustre(
                                                       p, spec.storage.lustre is not None)))
              for p in spec.pools]
    return [variant for shape in shapes
            for variant in ((shape, replace(shape, launch_first=True)) if shape.reserved else (shape,))]


def fault_classes() -> Dict[str, Tuple[str, ...]]:
    """The fault table's classes by what the controller does for them (repair.ACTIONS; the table's none: nothing).
    The controller reads the run-time checker's series and the DCGM counters of repair.COUNTER_FAULTS
    (jobs/node_repair.py node_health); a class neither sees (the NCCL acceptance verdict, a job's, which names no
    node) is nothing to it, whatever its remediation: its alert pages a person."""
    by: Dict[str, List[str]] = {"none": [], "reboot": [], "replace": [], "dcgm": []}
    for f in faults.load_faults().faults:
        if f.id in repair.COUNTER_FAULTS:
            if repair.ACTIONS[f.remediation] != "reboot":
                raise ValueError(f"{f.id}: the bench models a DCGM counter fault as a reboot only")
            by["dcgm"].append(f.id)
        else:
            by[repair.ACTIONS.get(f.remediation, "none") if f.checks else "none"].append(f.id)
    return {k: tuple(v) for k, v in by.items()}


FAULTS = ("none", "reboot", "reboot, DCGM counter", "reboot, gate fails", "replace", "NotReady", "stale checker")

_NO_SLOT = "no spare slot in the reservation: the replacement launches only once the old instance is gone"
_HEARTBEAT = (f"NTH completes the hook only after a drain that succeeds: pods that cannot terminate hold it to the "
              f"{drain.LIFECYCLE_DRAIN_TIMEOUT_S} s heartbeat")
_CHECK_LATE = f"the checker's {_CHECK_S} s timer may elapse {_CHECK_ACCURACY_S} s late (AccuracySec)"
_THROTTLED = "a throttled call's retry waits"


def _detect(dcgm: bool = False) -> List[Step]:
    first = ([step("DCGM exporter's next collection", "dcgm-collect"), step("scrape", "dcgm-scrape")] if dcgm else
             [step("checker's next run", "check", why=_CHECK_LATE), step("scrape", "scrape")])
    return first + [step("controller's pass", "pass", SEEN), step("cordon call", "call", OUT, why=_THROTTLED)]


def _boot(pool: PoolShape, first: str, last: str) -> List[Step]:
    return [Step(f"boot to the gate's CONTINUE ({', '.join(pool.boot_steps)})", pool.boot_typical_s,
                 pool.boot_worst_s, f"decisions/nodes/boot.py worst_case({pool.source!r}); typical assumed "
                                    "(TYPICAL_BOOT_S)", first),
            Step("registration and GPUs advertised", TYPICAL_READY_S, boot.node_ready_seconds(),
                 "decisions/nodes/boot.py node_ready_seconds (NODE_REGISTRATION_S + GPU_ADVERTISE_S); typical "
                 "assumed", last)]


def _replacement(pool: PoolShape, hook: str, via: str = "terminate") -> Tuple[List[Step], List[str]]:
    """From the terminate call (or the group's health replacement) to a Ready replacement. A reserved pool without a
    spare slot launches only when the old instance is gone; one with a spare slot launches first (the controller
    reports the instance Unhealthy), and any other launches at once; the old instance drains beside the new boot."""
    if pool.launch_first and via == "terminate":
        via = "unhealthy"
    first = {"terminate": step("TerminateInstanceInAutoScalingGroup", "call"),
             "unhealthy": step("SetInstanceHealth Unhealthy", "call"),
             "health": step("the group replaces the Unhealthy instance", "health-replace")}[via]
    heartbeat = FIGURES[hook].worst_s >= drain.LIFECYCLE_DRAIN_TIMEOUT_S
    if pool.launch_first:
        steps = [first, step("the group launches the replacement into the spare slot", "health-replace", LAUNCHED)]
        notes = [f"off the path: the controller drains the node meanwhile (at most FAST_DRAIN_S {repair.FAST_DRAIN_S} "
                 "s); the old instance is terminated once the replacement is InService (the group's instance "
                 "maintenance policy, min 100 %)"]
    elif pool.reserved:
        steps = [first, step("termination hook", hook, why=_HEARTBEAT if heartbeat else _NO_SLOT),
                 step("EC2 terminates the instance", "ec2-terminate", GONE, why=_NO_SLOT),
                 step("launch into the freed slot", "launch-reserved", LAUNCHED, why=_NO_SLOT)]
        notes = []
    else:
        steps = [first, step("the group launches the replacement at once", "launch", LAUNCHED)]
        f = FIGURES[hook]
        notes = [f"off the path: the old instance's termination hook runs beside the new boot ({f.typical_s:.0f} s "
                 f"typical, {f.worst_s:.0f} s worst)"]
    if pool.capacity == "spot":
        notes.append("spot: the launch waits for spot capacity, not modelled")
    return steps + _boot(pool, GATE, READY), notes


def _evict() -> Step:
    return step("controller evicts the pods", "evict",
                why=f"pods that do not leave get the spot notice, repair.py FAST_DRAIN_S {repair.FAST_DRAIN_S} s")


def _reboot(pool: PoolShape) -> List[Step]:
    return [_evict(), step("RebootInstances", "call"),
            step("the instance goes down", "reboot-down",
                 why="EC2 hard-reboots an instance that has not shut down only after a few minutes")]


def _back_after_reboot() -> List[Step]:
    """Ready on a new boot is proof: the kubelet runs only once the gate passed (jobs/node_repair.py
    proven_since_cordon); the first check after it confirms, or escalates."""
    return [step("controller's pass sees the new boot Ready", "pass"), step("uncordon call", "call", BACK)]


def _less_call(s: Step, reaches: str) -> Step:
    """A wait counted from the pass that saw the node, so less the cordon call made on that pass."""
    return Step(s.name, s.typical_s - FIGURES["call"].typical_s, s.worst_s - FIGURES["call"].worst_s, s.source,
                reaches, s.why)


def timeline(pool: PoolShape, fault: str, classes: Optional[Dict[str, Tuple[str, ...]]] = None) -> Timeline:
    classes = classes if classes is not None else fault_classes()
    confirm = _less_call(step(f"confirmation (CONFIRM_S {repair.CONFIRM_S} from the pass that saw it)", "confirm"),
                         STARTED)
    if fault == "none":
        return Timeline(pool, fault, classes["none"], (), "",
                        ("the application's fault (or a warning): the node keeps serving, its alert is the tenant's",))
    if fault in ("reboot", "reboot, DCGM counter"):
        dcgm = fault != "reboot"
        steps = _detect(dcgm) + [confirm] + _reboot(pool) + _boot(pool, GATE, READY) + _back_after_reboot()
        return Timeline(pool, fault, classes["dcgm" if dcgm else "reboot"], tuple(steps), BACK)
    if fault == "reboot, gate fails":
        gate = [Step(f"boot to the gate's verdict ({', '.join(pool.boot_steps)})", pool.boot_typical_s,
                     pool.boot_worst_s, f"decisions/nodes/boot.py worst_case({pool.source!r})",
                     why="two boots: the reboot's own, which the gate rejects, comes before the replacement's")]
        # The rebooted node's kubelet never ran: with the fast path the controller completes its hook at once.
        rest, notes = _replacement(pool, "drain-hook" if FAST_DRAIN_S is None else "drain-hook-dead-kubelet",
                                   via="health")
        steps = _detect() + [confirm] + _reboot(pool) + gate + rest
        return Timeline(pool, fault, classes["reboot"], tuple(steps), READY,
                        tuple(notes) + ("the gate rejects the rebooted node (its kubelet never runs) and reports it "
                                        "Unhealthy; its group replaces it",))
    if fault == "replace":
        rest, notes = _replacement(pool, "drain-hook")
        return Timeline(pool, fault, classes["replace"], tuple(_detect() + [confirm] + rest), READY, tuple(notes))
    if fault == "NotReady":
        steps = [step("NotReady and tainted", "not-ready-taint", OUT),
                 step(f"NotReady for NOT_READY_S {repair.NOT_READY_S}", "not-ready-repair", STARTED,
                      why=f"repair.py NOT_READY_S {repair.NOT_READY_S}: replaced after 30 minutes NotReady, as EKS "
                          "node auto repair does, and longer than a node's own reboot through its gate (a panic "
                          "reboots it; replacing it mid-boot would throw a healthy node away)")]
        rest, notes = _replacement(pool, "drain-hook-dead-kubelet")
        return Timeline(pool, fault, ("not-ready",), tuple(steps + rest), READY, tuple(notes))
    if fault == "stale checker":
        steps = [step(f"no check for STALE_CHECK_S {repair.STALE_CHECK_S}", "stale-cordon", SEEN,
                      why=f"repair.py STALE_CHECK_S {repair.STALE_CHECK_S}: five missed checks before a silent node "
                          "is cordoned; four would cordon a healthy node on two failed scrapes"),
                 step("cordon call", "call", OUT, why=_THROTTLED),
                 _less_call(step(f"silent for STALE_REPAIR_S {repair.STALE_REPAIR_S}", "stale-repair",
                                 why=f"repair.py STALE_REPAIR_S {repair.STALE_REPAIR_S}: rebooted when "
                                     "GpuNodeHealthCheckStale fires; a silent checker is not a GPU fault, and the "
                                     "reboot kills the jobs still running there"), STARTED)]
        steps += _reboot(pool) + _boot(pool, GATE, READY) + _back_after_reboot()
        return Timeline(pool, fault, ("checker-stale",), tuple(steps), BACK)
    raise ValueError(f"unknown fault {fault!r}")


def stack_timelines(stack: str) -> List[Timeline]:
    classes = fault_classes()
    return [timeline(pool, fault, classes) for pool in pool_shapes(stack) for fault in FAULTS]


def fast_path() -> str:
    """What of item 5's fast path the model carries."""
    if FAST_DRAIN_S is None:
        return ("not modelled: item 5's fast path (stuck pods deleted after a short cap, the lifecycle completed "
                "early, "
                "replace-before-terminate where a reservation has room) is not in the code; this is today's path")
    return (f"modelled: the controller completes the termination hook of a node it replaces at most FAST_DRAIN_S "
            f"{FAST_DRAIN_S} s after the termination began, at once where the kubelet is gone (pods deleted with "
            "grace 0); a reserved pool whose reservation has a spare slot (rows '(spare slot)') launches the "
            "replacement first")


def _m(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _r(ratio: Optional[float]) -> str:
    return "-" if ratio is None else (f"**{ratio:.2f}**" if ratio > 1 else f"{ratio:.2f}")


def table(rows: Sequence[Timeline]) -> str:
    lines = ["| stack | pool | capacity | fault | out of service min (typ / worst) | out / 2 min (worst) "
             "| repaired min (typ / worst) | goal min (worst) | repaired / goal (typ / worst) | what misses |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in rows:
        lines.append(
            f"| {t.pool.stack} | {t.pool.label} | {t.pool.capacity} | {t.fault} | "
            f"{_m(t.at(OUT, 'typical'))} / {_m(t.at(OUT, 'worst'))} | {_r(t.out_ratio('worst'))} | "
            + (f"{_m(t.at(t.ends_at, 'typical'))} / {_m(t.at(t.ends_at, 'worst'))} | {_m(t.goal_repaired_s())} | "
               f"{_r(t.repaired_ratio('typical'))} / {_r(t.repaired_ratio('worst'))} | "
               if t.ends_at else "not repaired | - | - | ")
            + ("<br>".join(t.misses()) or "-") + " |")
    return "\n".join(lines)


def summary(rows: Sequence[Timeline]) -> str:
    """One row per pool: the worst case of each fault class, out of service / repaired in minutes, with the ratio to
    its goal (in bold where it misses)."""
    kinds = [f for f in FAULTS if f != "none"]
    lines = ["| stack | pool | capacity | goal min | " + " | ".join(kinds) + " |",
             "|---|---|---|---|" + "---|" * len(kinds)]
    pools: Dict[Tuple[str, str], Dict[str, Timeline]] = {}
    for t in rows:
        pools.setdefault((t.pool.stack, t.pool.label), {})[t.fault] = t
    for (stack, pool), by in pools.items():
        any_row = next(iter(by.values()))
        cells = [f"{_m(by[k].at(OUT, 'worst'))} ({_r(by[k].out_ratio('worst'))}) / "
                 f"{_m(by[k].at(by[k].ends_at, 'worst'))} ({_r(by[k].repaired_ratio('worst'))})" for k in kinds]
        lines.append(f"| {stack} | {pool} | {any_row.pool.capacity} | 2 / {_m(any_row.goal_repaired_s())} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def steps_table(t: Timeline) -> str:
    lines = [f"{t.pool.stack} {t.pool.label} ({t.pool.capacity}), {t.fault}:",
             "| step | typical s | worst s | worst at | reaches | source |", "|---|---|---|---|---|---|"]
    at = 0.0
    for s in t.steps:
        at += s.worst_s
        lines.append(f"| {s.name} | {s.typical_s:.0f} | {s.worst_s:.0f} | {_m(at)} min | {s.reaches or '-'} | "
                     f"{s.source} |")
    return "\n".join(lines + [f"- {n}" for n in t.notes])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", action="append", choices=known_stacks(), help="a stack (default: all three)")
    parser.add_argument("--steps", action="store_true", help="each timeline's steps with their sources")
    parser.add_argument("--summary", action="store_true", help="one row per pool, worst cases only")
    parser.add_argument("--without-fast-path", action="store_true",
                        help="model the path before item 5: NTH alone completes the termination hook")
    args = parser.parse_args()
    if args.without_fast_path:
        global FAST_DRAIN_S
        FAST_DRAIN_S = None
        FIGURES.update(hook_figures(None))
    rows = [t for stack in args.stack or known_stacks() for t in stack_timelines(stack)]
    classes = fault_classes()
    print(f"Fast path: {fast_path()}.")
    print("Fault classes: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in classes.items()) + ".\n")
    print(summary(rows) if args.summary else table(rows))
    if args.steps:
        for t in rows:
            if t.steps:
                print("\n" + steps_table(t))


if __name__ == "__main__":
    main()
