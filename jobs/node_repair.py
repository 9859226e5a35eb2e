#!/usr/bin/env python3
"""GPU node repair controller: acts on the fault table's remediations, within a budget, and brakes looping pools.

Runs as the Deployment kube-system/gpu-node-repair (one replica, Recreate). Every `intervalSeconds` it:
1. reads the GPU nodes (label `poolLabel`), what their run-time checker last said through Prometheus
   (gpu_cloud_node_health_remediation, _fault, _timestamp_seconds: userdata/gpu_verify.py render_textfile), and
   their Auto Scaling groups;
2. moves the repairs in flight on (`advance`), each step derived again from what it observes: a reboot evicts the
   node's pods, reboots it (again, if the node never went down), and is done when the node's checker passes after
   the reboot, or escalates to a replacement with its own start; a replacement terminates the instance (again, while
   its group keeps it InService) and is done when the group no longer has it. Once the group holds the instance in
   Terminating:Wait (a replacement, or a node that failed its gate after a reboot), the fast path for dead hardware
   (`leaving`) completes its termination hook with CONTINUE as soon as nothing on it can still checkpoint, at the
   latest `fastDrainSeconds` after, deleting first with grace 0 the pods of a node whose kubelet is not Ready;
3. decides what to start (`decide`) for every node that asks (`ask`: a fault, NotReady for 30 minutes, a silent
   checker): the safety rules are there, and every decision, taken or refused, is an Event on the node and a sample
   of gpu_cloud_repair_decisions_total; a node rebooted healthy in the last 24 hours that asks again is replaced;
4. cordons every node that asks and every node in repair, whatever was decided, and uncordons a node it cordoned
   once a check says it is healthy;
5. reads the gate's verdicts from S3 (`reportsPrefix`), exposes them as metrics, and suspends a pool's Launch process
   after `brakeAfter` rejected launches in a row (`brake`).
What it has started is written to its state ConfigMap before it acts (optimistic concurrency on resourceVersion),
so a restart neither forgets a repair nor spends the budget twice. Metrics on :metricsPort/metrics.

Every Kubernetes and AWS call is retried as botocore's standard mode retries (aws_api.Retry). When one still fails,
who sees it: it counts in gpu_cloud_repair_errors_total{source} and is logged, the pass goes on with its other calls,
and the next pass derives it again from what it observes; the loop's last success is
gpu_cloud_repair_last_success_timestamp_seconds, and GpuRepairControllerDown fires when it stops. A pass that cannot
read or write its state does nothing.

Standard library only (plain python image); AWS calls through aws_api.py beside it. CONFIG (default
/etc/gpu-node-repair/config.json) is decisions/nodes/repair.py's controller_config.
"""
from __future__ import annotations

import datetime
import http.server
import json
import math
import os
import ssl
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

if __package__:                 # imported as jobs.node_repair (the tests)
    from . import aws_api, block_expiry
else:                           # run as /opt/gpu-node-repair/node_repair.py: aws_api.py is beside it in the ConfigMap
    import aws_api
    import block_expiry

SA_DIR = Path(os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
COMPONENT = "gpu-node-repair"
HOUR = 3600.0
IN_FLIGHT = ("draining", "rebooting", "replacing")
# /readyz answers 200 while a pass that read the nodes' health began within this many intervals: a failed pass or two
# (a passing API error) keep it ready, a loop that keeps failing or hangs does not. 503 before the first such pass.
READY_INTERVALS = 4
DRY_RUN = "dry-run"


# --------------------------------------------------------------------------------------------------------------------
# What the controller sees and decides: plain values, so the rules can be tested over a table of states
# --------------------------------------------------------------------------------------------------------------------

class NodeState(NamedTuple):
    name: str
    pool: str
    instance_id: str
    ready: bool
    unschedulable: bool
    ours: bool                   # cordoned by this controller (its annotation is on the node)
    lifecycle: str               # the instance's state in its group ("InService", "Terminating:Wait", ...; "" if absent)
    remediation: str             # what the last run-time check asks for: none, reboot, replace ("" if unknown)
    faults: Tuple[str, ...]
    checked_at: float            # when that check ran (0 if never)
    boot_id: str = ""            # the kubelet's status.nodeInfo.bootID: a new one proves a reboot happened
    ready_since: float = 0.0     # the Ready condition's lastTransitionTime: since when it is (not) Ready
    created: float = 0.0         # metadata.creationTimestamp
    cordoned_at: float = 0.0     # when this controller cordoned it (its annotation's "since"; 0 if not ours)
    cordoned_boot: str = ""      # the boot it was cordoned on (its annotation's "bootId")
    health: str = ""             # the instance's health in its group: Healthy, Unhealthy ("" if absent)


class Ask(NamedTuple):
    """What a node asks for, and why: its checker's fault (kind "check"), a checker gone quiet ("stale") or a kubelet
    gone quiet ("not-ready")."""
    action: str                  # reboot | replace
    kind: str                    # check | stale | not-ready
    faults: Tuple[str, ...]
    since: float                 # stale, not-ready: when it began, as observed (check: 0, see first_seen)


class Decision(NamedTuple):
    node: str
    pool: str
    action: str                  # reboot | replace
    outcome: str                 # repair | dry-run | refused | waiting
    reason: str


def wanted_action(node: NodeState, actions: Mapping[str, str]) -> Optional[str]:
    return actions.get(node.remediation)


def ask(node: NodeState, now: float, config: Mapping[str, Any]) -> Optional[Ask]:
    """What the node asks for now, from what is observed of it, or None. Any answer takes it out of service at once.

    - NotReady for `notReadySeconds` (30 minutes: EKS node auto repair replaces a node NotReady that long, EKS User
      Guide, "Automatically repair nodes in EKS clusters", its table's Ready row): a replacement. Until then the node
      lifecycle controller's not-ready/unreachable taints keep new work off it, and a kubelet that comes back in time
      (a network blip, a slow boot) costs nothing.
    - A fresh check (at most `staleCheckSeconds` old) whose remediation is reboot or replace: that action.
    - A Ready node whose check is older than `staleCheckSeconds` (five missed runs of the minutely timer): nobody
      watches its GPUs, so it takes no new work, and at `staleRepairSeconds` (when GpuNodeHealthCheckStale fires) it is
      rebooted, which restarts the checker and makes the gate prove the node again; a node whose checker stays silent
      after that is replaced by the reboot's own rules."""
    if not node.ready:
        since = node.ready_since or node.created
        if since and now - since >= config["notReadySeconds"]:
            return Ask("replace", "not-ready", ("not-ready",), since)
        return None
    if now - node.checked_at <= config["staleCheckSeconds"]:
        action = wanted_action(node, config["actions"])
        return Ask(action, "check", node.faults or (node.remediation,), 0.0) if action else None
    # The last sign of its checker: a check, else the node's return to Ready or its creation (a new node has not run
    # its first check yet).
    since = max(node.checked_at, node.ready_since, node.created)
    if now - since > config["staleCheckSeconds"]:
        return Ask("reboot", "stale", ("checker-stale",), since)
    return None


def active_for(repairs: Sequence[Mapping[str, Any]], node: str, now: float) -> Optional[Mapping[str, Any]]:
    """The node's repair in flight, or its dry-run decision of the last hour."""
    for repair in repairs:
        if repair["node"] == node and (repair["phase"] in IN_FLIGHT or
                                       (repair["phase"] == DRY_RUN and now - repair["startedAt"] < HOUR)):
            return repair
    return None


def rebooted_recently(repairs: Sequence[Mapping[str, Any]], node: NodeState, now: float,
                      window: float) -> Optional[Mapping[str, Any]]:
    """A reboot of this very instance that ended healthy within `window`: a node that asks again is replaced (NVIDIA's
    RESET_GPU guidance, and the EKS node monitoring agent, replace when an error persists after a reboot)."""
    for repair in repairs:
        # A reboot that escalated is a replacement (tick sets its action), and one whose node left its group left
        # with its instance: a reboot done on this instance ended healthy.
        if (repair["node"] == node.name and repair["instance"] == node.instance_id and repair["phase"] == "done"
                and repair["action"] == "reboot" and now - repair["startedAt"] < window):
            return repair
    return None


def decide(now: float, config: Mapping[str, Any], nodes: Sequence[NodeState], repairs: Sequence[Mapping[str, Any]],
           first_seen: Mapping[str, float]) -> List[Decision]:
    """Whether to reboot or replace every node that asks (`ask`), pool by pool. This governs repairs only: a node that
    asks is out of service already (Controller.tick cordons it whatever is decided here).

    A checker's fault waits until the node has asked for `confirmSeconds` (first_seen: when this controller first saw
    it ask, without a break); a stale checker until `staleRepairSeconds`. Then, in this order, a pool refuses: when
    more than `fleetFaultShare` of its nodes ask at once (and more than one: a checker, image or control-plane fault,
    not hardware); a node already leaving (cordoned by someone else, or not InService in its group); a repair already
    in flight in the pool (`maxInFlight`: one; in a reservation the replacement has no capacity until the old instance
    is gone); and a spent budget (`maxPerHour` repairs started in the last hour, dry-run decisions included).
    Otherwise: repair, or dry-run; a reboot of a node rebooted healthy within `recurrenceSeconds` is a replacement."""
    decisions: List[Decision] = []
    for pool, policy in sorted(config["pools"].items()):
        members = [n for n in nodes if n.pool == pool]
        asks = {n.name: a for n in members for a in [ask(n, now, config)] if a}
        asking = sorted((n for n in members if n.name in asks), key=lambda n: (first_seen.get(n.name, now), n.name))
        if not asking:
            continue
        in_flight = [(r["action"], r["node"]) for r in repairs if r["pool"] == pool and r["phase"] in IN_FLIGHT]
        started = sum(1 for r in repairs if r["pool"] == pool and now - r["startedAt"] < HOUR)
        halted = len(asking) > max(1, math.floor(config["fleetFaultShare"] * len(members)))
        for node in asking:
            wanted = asks[node.name]
            action, what = wanted.action, ", ".join(wanted.faults)
            if active_for(repairs, node.name, now):
                continue                                    # a second fault during its repair: the repair goes on
            earlier = rebooted_recently(repairs, node, now, config["recurrenceSeconds"]) if action == "reboot" else None
            if earlier:
                action = "replace"
                what += (f" again, {int(now - earlier['startedAt'])} s after the reboot that ended healthy "
                         f"(at most {config['recurrenceSeconds']} s)")
            seen_for = now - first_seen.get(node.name, now)
            if wanted.kind == "check" and seen_for < config["confirmSeconds"]:
                outcome, reason = "waiting", f"{what} seen for {int(seen_for)} s of {config['confirmSeconds']}"
            elif wanted.kind == "stale" and now - wanted.since < config["staleRepairSeconds"]:
                outcome, reason = "waiting", (f"its last health check is {int(now - wanted.since)} s old; repaired at "
                                              f"{config['staleRepairSeconds']} s")
            elif halted:
                outcome, reason = "refused", (f"{len(asking)} of {len(members)} nodes of pool {pool} ask for repair at "
                                              "once: more than the checker, the image or the control plane should be "
                                              "trusted with; a person must look")
            elif (node.unschedulable and not node.ours) or node.lifecycle != "InService":
                outcome, reason = "refused", (f"already leaving (cordoned: {node.unschedulable}, group state: "
                                              f"{node.lifecycle or 'not in its group'})")
            elif len(in_flight) >= policy["maxInFlight"]:
                outcome, reason = "refused", (f"{in_flight[0][0]} of {in_flight[0][1]} in flight; one at a time"
                                              + (" in a reservation" if policy["reserved"] else ""))
            elif started >= policy["maxPerHour"]:
                outcome, reason = "refused", (f"budget spent: {started} repairs in pool {pool} in the last hour "
                                              f"(at most {policy['maxPerHour']})")
            else:
                outcome = DRY_RUN if config["dryRun"] else "repair"
                reason = f"{what}: {action}"
                started += 1
                if not config["dryRun"]:
                    in_flight.append((action, node.name))
            decisions.append(Decision(node.name, pool, action, outcome, reason))
    return decisions


class Step(NamedTuple):
    phase: str                   # the repair's phase from now on
    do: str                      # what to do now: "" | evict | reboot | replace
    reason: str


def can_checkpoint(pod: Mapping[str, Any], now: float) -> bool:
    """Whether a pod on a node whose kubelet is Ready may still be writing its checkpoint: not yet asked to leave, or
    within its grace (a deleted pod's deletionTimestamp is when its grace ends: past it, the kubelet has killed it, and
    what is left is a process the dead GPU's driver holds)."""
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return not deleting or _time(deleting) > now


def leaving(now: float, config: Mapping[str, Any], repair: Mapping[str, Any], node: NodeState,
            pods: Sequence[Mapping[str, Any]]) -> Step:
    """The fast path for dead hardware, once the group holds the instance in Terminating:Wait (a replacement this
    controller started, or the group replacing a node that failed its gate after a reboot): CONTINUE its termination
    hook as soon as nothing on the node can still checkpoint, and at the latest `fastDrainSeconds` after the
    termination was first seen; the drain handler alone would hold it to the hook's heartbeat while a pod cannot
    terminate (decisions/nodes/repair.py FAST_DRAIN_S). A node whose kubelet is not Ready runs nothing: its pods are
    deleted with grace 0 (Controller.carry_out) and the hook completed at once."""
    since = repair.get("terminatingSince", now)
    cap = config["fastDrainSeconds"]
    if not node.ready:
        return Step("replacing", "complete", "its group terminates it and its kubelet is not Ready: nothing on it "
                    f"can checkpoint ({len(pods)} pods deleted with grace 0); termination hook completed")
    live = [p for p in pods if can_checkpoint(p, now)]
    if not live:
        return Step("replacing", "complete", f"its group terminates it and none of its {len(pods)} pods can still "
                    "checkpoint; termination hook completed")
    if now - since >= cap:
        return Step("replacing", "complete", f"{len(live)} pods still there {int(now - since)} s after its termination "
                    f"began (at most {cap} s for dead hardware); termination hook completed")
    return Step("replacing", "", f"its group terminates it: {len(live)} pods may checkpoint for up to {cap} s")


def advance(now: float, config: Mapping[str, Any], repair: Mapping[str, Any], node: Optional[NodeState],
            evictable: int = 0, reboot_failed: bool = False, pods: Sequence[Mapping[str, Any]] = ()) -> Step:
    """The next step of a repair in flight, from what is observed now, so that a call that failed (or was never made)
    is made again: `node` is None once the node is gone; `evictable` counts the pods still to leave it (draining);
    `reboot_failed` says the last pass's reboot call failed; `pods` are the pods still on it while its group holds it
    in Terminating:Wait (`leaving`)."""
    phase, timeout = repair["phase"], config["repairTimeoutSeconds"]
    gone = node is None or node.lifecycle in ("", "Terminated")
    if gone:
        return Step("done", "", "the instance has left its group" + (" (replaced by it after failing its gate)"
                                                                     if phase != "replacing" else ""))
    if node.lifecycle == "Terminating:Wait":
        return leaving(now, config, repair, node, pods)
    if phase == "draining":
        # Before a reboot, or while a replacement launches first (reported Unhealthy when the repair began): the pods
        # leave as from a spot node, within `fastDrainSeconds` (decisions/nodes/repair.py FAST_DRAIN_S); the fault
        # stays until the reset either way.
        then = ("rebooting", "reboot") if repair["action"] == "reboot" else ("replacing", "")
        if evictable == 0:
            return Step(*then, "drained")
        if not node.ready:
            return Step(*then, f"its kubelet is not Ready: none of its {evictable} pods can leave")
        if now - repair["startedAt"] >= config["fastDrainSeconds"]:
            return Step(*then, f"{evictable} pods still there after {config['fastDrainSeconds']} s")
        return Step("draining", "evict", f"{evictable} pods to evict")
    if phase == "rebooting":
        rebooted_at = repair.get("rebootedAt", math.inf)
        # A new boot, Ready: its kubelet runs only once the gate proved every GPU of this boot (the kubelet drop-in
        # requires the gate's verified file, userdata/units/kubelet-gpu-cloud-gate.conf). A check since the reboot
        # that still asks (RebootInstances only asks the OS; a check may run before it goes down) escalates.
        new_boot = node.boot_id != repair.get("bootId")
        if new_boot and node.checked_at > rebooted_at and wanted_action(node, config["actions"]):
            return Step("replacing", "replace", f"still faulty after its reboot ({', '.join(node.faults)})")
        if new_boot and node.ready:
            return Step("done", "", "back after its reboot: its gate proved it")
        if now - repair["startedAt"] >= timeout:
            return Step("replacing", "replace", f"not healthy {timeout} s after the repair began")
        # Still the same boot and Ready throughout: the reboot never happened. EC2 hard-reboots an instance that has
        # not shut down "within a few minutes" (EC2 API Reference, RebootInstances; four minutes in its earlier
        # wording), and a stopped kubelet shows as not Ready after kube-controller-manager's node-monitor-grace-period
        # (40 s by default): `rebootRetrySeconds` covers both, and a pass.
        went_down = node.boot_id != repair.get("bootId") or not node.ready or node.ready_since > rebooted_at
        if not went_down and (reboot_failed or now - rebooted_at >= config["rebootRetrySeconds"]):
            return Step("rebooting", "reboot", "the reboot call failed" if reboot_failed else
                        f"still the same boot and Ready {int(now - rebooted_at)} s after its reboot: rebooted again")
        return Step("rebooting", "", "waiting for the node to come back through its gate")
    if phase == "replacing" and node.lifecycle == "InService":
        if config["pools"][repair["pool"]].get("launchFirst"):
            # The group keeps an Unhealthy instance InService until its replacement is InService (launch first).
            if node.health == "Unhealthy":
                return Step("replacing", "", "its group launches the replacement first")
            return Step("replacing", "replace", "still Healthy in its group: reported Unhealthy again")
        # The group still serves it: the terminate call failed or was never made. Anything else (Terminating:Wait,
        # Terminating:Proceed, Detaching) is the group and the drain handler at work.
        return Step("replacing", "replace", "still InService in its group: terminated again")
    return Step(phase, "", "")


def watchless_pools(nodes: Sequence[NodeState], asks: Mapping[str, Optional[Ask]], share: float) -> Set[str]:
    """The pools where more than `share` of the nodes (and more than one) have a silent checker at once: what is
    silent is the path to them (node-exporter, the scrape, a Prometheus that restarted and lost its recent samples),
    not every node's checker. Their silent nodes are not cordoned for it: that would take a whole pool out of service
    for a monitoring fault."""
    members: Dict[str, int] = {}
    silent: Dict[str, int] = {}
    for node in nodes:
        members[node.pool] = members.get(node.pool, 0) + 1
        found = asks.get(node.name)
        if found and found.kind == "stale":
            silent[node.pool] = silent.get(node.pool, 0) + 1
    return {pool for pool, count in silent.items() if count > max(1, math.floor(share * members[pool]))}


def proven_since_cordon(node: NodeState) -> bool:
    """Whether a node this controller cordoned has shown itself healthy since: a check with no fault after the cordon,
    or a boot after it (its kubelet runs only once its gate proved every GPU of that boot; a check since that still
    asks is `ask`'s, and keeps it cordoned)."""
    checked = node.remediation == "none" and node.checked_at > node.cordoned_at
    return checked or bool(node.cordoned_boot and node.boot_id and node.boot_id != node.cordoned_boot)


def stuck(now: float, config: Mapping[str, Any], repair: Mapping[str, Any]) -> bool:
    """A replacement past the repair timeout, counted from when it became a replacement (an escalated reboot's
    replacement has its own start, or GpuRepairStuck would fire as soon as it began)."""
    return (repair["phase"] == "replacing"
            and now - repair.get("replacingSince", repair["startedAt"]) >= config["repairTimeoutSeconds"])


class Report(NamedTuple):
    key: str
    verdict: str
    mode: str                    # launch | reboot
    instance_id: str
    instance_type: str
    reason: str
    warnings: Tuple[str, ...]    # fault classes that warned


def consecutive_rejections(reports: Sequence[Report], after_key: str = "") -> Tuple[int, str]:
    """Rejected launches at the end of `reports` (oldest first), after the last pass and after `after_key` (the
    report a previous brake counted last): (how many, the last one's key)."""
    count, last = 0, ""
    for report in reversed(reports):
        if report.key <= after_key or report.verdict == "pass":
            break
        if report.mode == "launch":
            count += 1
            last = last or report.key
    return count, last


def parse_report(key: str, body: bytes) -> Report:
    found = json.loads(body)
    boot = found.get("boot") or {}
    warnings = tuple(sorted({c.get("fault") for c in found.get("checks") or []
                             if c.get("status") == "warn" and c.get("fault")}))
    return Report(key, str(found.get("verdict", "error")), str(boot.get("mode", "launch")),
                  str(found.get("instanceId") or ""), str(boot.get("instanceType") or found.get("instanceType") or ""),
                  str(boot.get("reason") or ""), warnings)


def report_key_at(prefix: str, pool: str, when: float) -> str:
    """The key a report published at `when` sorts after (userdata/bootstrap.sh: <prefix><pool>/<UTC stamp>-...)."""
    return f"{prefix}{pool}/{datetime.datetime.fromtimestamp(when, datetime.timezone.utc):%Y%m%dT%H%M%SZ}"


# --------------------------------------------------------------------------------------------------------------------
# Kubernetes and Prometheus, through the standard library
# --------------------------------------------------------------------------------------------------------------------

class HttpError(Exception):
    def __init__(self, status: int, text: str, retry_after: Optional[str] = None):
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status, self.retry_after = status, retry_after


def kube_retry_kind(error: BaseException) -> Tuple[Optional[str], Optional[float]]:
    """The API server's answers, judged by botocore's standard rules (aws_api.Retry): 429 (API Priority and Fairness,
    or the server's max-in-flight limit, with Retry-After in seconds) is throttling; 500, 502, 503, 504 and a lost
    connection are transient. A 409 is not retried: it says the object changed, and the next pass reads it again."""
    if isinstance(error, HttpError):
        retry_after = None
        if error.retry_after is not None:
            try:
                retry_after = max(0.0, float(error.retry_after))
            except ValueError:
                retry_after = None
        if error.status in aws_api.THROTTLING_STATUS:
            return aws_api.THROTTLING, retry_after
        return (aws_api.TRANSIENT if error.status in aws_api.TRANSIENT_STATUS else None), retry_after
    if isinstance(error, aws_api.CONNECTION_ERRORS):
        return aws_api.TRANSIENT, None
    return None, None


class Kube:
    """The API server, with the pod's service-account token and CA; every call retried as aws_api.Retry does."""

    def __init__(self, base: Optional[str] = None, sa_dir: Path = SA_DIR, retry: Optional[Any] = None):
        if base is None:
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
            base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.base, self.sa_dir = base, sa_dir
        self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt")) if base.startswith("https") else None
        self.retry = retry or aws_api.Retry(kube_retry_kind)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             retried: bool = True) -> Any:
        """`retried`=False for an answer that is itself the news (an eviction's 429: a PodDisruptionBudget says not
        now; the next pass asks again)."""
        def once() -> Any:
            token = (self.sa_dir / "token").read_text(encoding="utf-8").strip()   # projected: re-read, it rotates
            request = urllib.request.Request(self.base + path, method=method,
                                             data=None if body is None else json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                                      "Content-Type": content_type})
            try:
                with urllib.request.urlopen(request, timeout=20, context=self.context) as answer:
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as error:
                raise HttpError(error.code, error.read().decode("utf-8", "replace"),
                                error.headers.get("Retry-After") if error.headers else None) from None
        return self.retry.call(once) if retried else once()


def prometheus_vector(base: str, query: str, opener: Callable[..., Any] = urllib.request.urlopen) -> List[Dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with opener(url, timeout=20) as answer:
        found = json.loads(answer.read())
    if found.get("status") != "success":
        raise HttpError(200, f"prometheus: {found.get('error', found)}")
    return found["data"]["result"]


# How much each remediation asks: a node asks for the most any of its faults asks.
_WEIGHT = {"": 0, "none": 0, "reboot": 1, "replace": 2}


def node_health(base: str, opener: Callable[..., Any] = urllib.request.urlopen,
                counter_faults: Optional[Mapping[str, Mapping[str, str]]] = None,
                window_s: int = 120) -> Dict[str, Dict[str, Any]]:
    """{node: {"remediation", "faults", "checkedAt"}} from the run-time checker's series, and from the counters of
    the faults only DCGM sees (`counter_faults`, {fault: {"series", "remediation"}}: decisions/nodes/repair.py
    COUNTER_FAULTS): a node whose counter grew in the last `window_s` has that fault too, and asks for the most any of
    its faults asks."""
    health: Dict[str, Dict[str, Any]] = {}

    def entry(sample: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        node = sample["metric"].get("node")
        return None if not node else health.setdefault(node, {"remediation": "", "faults": [], "checkedAt": 0.0})

    # The last check of the last hour, not the instant value: a node whose scrape fails drops out of an instant query
    # after Prometheus' 5-minute lookback, and its staleness must still count from its last check.
    for sample in prometheus_vector(base, "max_over_time(gpu_cloud_node_health_timestamp_seconds[1h])", opener):
        found = entry(sample)
        if found is not None:
            found["checkedAt"] = max(found["checkedAt"], float(sample["value"][1]))
    for sample in prometheus_vector(base, "gpu_cloud_node_health_remediation == 1", opener):
        found = entry(sample)
        if found is not None:
            found["remediation"] = sample["metric"].get("remediation", "")
    for sample in prometheus_vector(base, 'gpu_cloud_node_health_fault{status="fail"} == 1', opener):
        found = entry(sample)
        if found is not None:
            found["faults"] = sorted(set(found["faults"]) | {sample["metric"].get("fault", "")})
    for fault, counter in sorted((counter_faults or {}).items()):
        query = f'max by (node) (increase({counter["series"]}[{window_s}s])) > 0'
        for sample in prometheus_vector(base, query, opener):
            found = entry(sample)
            if found is not None:
                found["faults"] = sorted(set(found["faults"]) | {fault})
                if _WEIGHT[counter["remediation"]] > _WEIGHT.get(found["remediation"], 0):
                    found["remediation"] = counter["remediation"]
    return health


def _time(stamp: Optional[str]) -> float:
    """A Kubernetes timestamp (RFC 3339, "2026-11-28T10:00:00Z") as Unix time; 0 if absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() if stamp else 0.0
    except ValueError:
        return 0.0


def _cordon_mark(mark: Optional[str]) -> Tuple[float, str]:
    """When this controller cordoned the node and on which boot, from its annotation ({"action", "since", "bootId"};
    older ones: "startedAt", no boot)."""
    try:
        found = json.loads(mark) if mark else {}
        if not isinstance(found, dict):
            return 0.0, ""
        return float(found.get("since", found.get("startedAt", 0.0))), str(found.get("bootId", ""))
    except (ValueError, TypeError):
        return 0.0, ""


def instance_id(provider_id: str) -> str:
    """aws:///us-east-1a/i-0123456789abcdef0 -> i-0123456789abcdef0."""
    return provider_id.rsplit("/", 1)[-1] if provider_id.startswith("aws://") else ""


def evictable_pods(pods: Iterable[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The pods a drain evicts: not a DaemonSet's (it would come straight back), not a static pod's mirror, not
    already finished. One being deleted still counts until it is gone."""
    left = []
    for pod in pods:
        meta = pod.get("metadata", {})
        if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            continue
        if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        left.append(pod)
    return left


# --------------------------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------------------------

class Metrics:
    """Prometheus text exposition of the controller's gauges and counters (replaced whole after every tick)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
        self.gauges: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
        self.help: Dict[str, Tuple[str, str]] = {}

    def count(self, name: str, help_text: str, by: float = 1, **labels: str) -> None:
        with self.lock:
            key = (name, tuple(sorted(labels.items())))
            self.counters[key] = self.counters.get(key, 0) + by
            self.help[name] = ("counter", help_text)

    def set_gauges(self, samples: Iterable[Tuple[str, str, Mapping[str, str], float]]) -> None:
        gauges, helps = {}, {}
        for name, help_text, labels, value in samples:
            gauges[(name, tuple(sorted(labels.items())))] = value
            helps[name] = ("gauge", help_text)
        with self.lock:
            self.gauges = gauges
            self.help = {**{k: v for k, v in self.help.items() if v[0] == "counter"}, **helps}

    def render(self) -> str:
        with self.lock:
            series = {**self.counters, **self.gauges}
            lines: List[str] = []
            for name in sorted(self.help):
                kind, text = self.help[name]
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                for (metric, labels), value in sorted(series.items()):
                    if metric == name:
                        rendered = ",".join('%s="%s"' % (k, str(v).replace("\\", "\\\\").replace('"', '\\"')
                                                         .replace("\n", " ")) for k, v in labels)
                        lines.append(f"{name}{{{rendered}}} {_number(value)}" if rendered else
                                     f"{name} {_number(value)}")
            return "\n".join(lines) + "\n"


class SourceError(Exception):
    """A call that failed, named by what was called (kubernetes, prometheus, aws, s3)."""

    def __init__(self, source: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.source = source


def calling(source: str, call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except (HttpError, OSError, ValueError, KeyError) as error:
        raise SourceError(source, error) from error
    except Exception as error:  # noqa: BLE001  (aws_api.AwsError and anything unforeseen: named by its source)
        raise SourceError(source, error) from error


DECISIONS_HELP = "Repair decisions, by pool, action and outcome (repair, dry-run, refused)."
ERRORS_HELP = "Calls of the repair controller that failed, by what it called."
BRAKES_HELP = "Times a pool's Launch was suspended (dry run: would have been) after rejected launches in a row."


class Controller:
    def __init__(self, config: Mapping[str, Any], kube: Kube, aws: Any, metrics: Metrics,
                 prometheus: Callable[[], Dict[str, Dict[str, Any]]], clock: Callable[[], float] = time.time,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)):
        self.config, self.kube, self.aws, self.metrics, self.prometheus = config, kube, aws, metrics, prometheus
        self.clock, self.log = clock, log
        self.first_seen: Dict[str, float] = {}
        self.said: Dict[str, Tuple[str, str]] = {}        # node -> the last (outcome, reason) told: no repeated Events
        self.reports: Dict[str, Report] = {}              # S3 key -> parsed report, for the keys still in the window
        self.node_uids: Dict[str, str] = {}
        self.failed: set = set()                          # (node or pool, call) that failed in the last pass
        self.failed_brakes: set = set()
        self.told: Dict[str, Tuple[str, str, str]] = {}   # node -> the last repair step told: no repeated Events
        self.health_seen, self.last_success = False, 0.0
        self.blocks = block_expiry.BlockExpiry(self)      # capacity blocks before they end (jobs/block_expiry.py)
        # Every counter from 0, so that its first event is an increase (increase() needs two samples).
        for pool in config["pools"]:
            metrics.count("gpu_cloud_pool_brakes_total", BRAKES_HELP, by=0, pool=pool)
            for action in sorted(set(config["actions"].values())):
                for outcome in ("repair", DRY_RUN, "refused"):
                    metrics.count("gpu_cloud_repair_decisions_total", DECISIONS_HELP, by=0, pool=pool, action=action,
                                  outcome=outcome)
        for source in ("kubernetes", "prometheus", "aws", "s3", "controller"):
            metrics.count("gpu_cloud_repair_errors_total", ERRORS_HELP, by=0, source=source)

    # --- state -----------------------------------------------------------------------------------------------------
    def state_path(self) -> str:
        return f"/api/v1/namespaces/{self.config['namespace']}/configmaps/{self.config['stateConfigMap']}"

    def load_state(self) -> Tuple[Dict[str, Any], Optional[str]]:
        try:
            found = self.kube.call("GET", self.state_path())
        except HttpError as error:
            if error.status != 404:
                raise
            return {"repairs": [], "brakes": {}}, None
        state = json.loads((found.get("data") or {}).get("state.json") or '{"repairs": [], "brakes": {}}')
        return state, found["metadata"]["resourceVersion"]

    def save_state(self, state: Mapping[str, Any], version: Optional[str]) -> str:
        """Create or replace the state ConfigMap; a replace carries the version read, so a second writer gets 409."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.config["stateConfigMap"], "namespace": self.config["namespace"],
                             **({"resourceVersion": version} if version else {})},
                "data": {"state.json": json.dumps(state, sort_keys=True)}}
        if version is None:
            saved = self.kube.call("POST", self.state_path().rsplit("/", 1)[0], body)
        else:
            saved = self.kube.call("PUT", self.state_path(), body)
        return saved["metadata"]["resourceVersion"]

    # --- observing ---------------------------------------------------------------------------------------------------
    def observe(self, now: float) -> Tuple[List[NodeState], Dict[str, Dict[str, Any]]]:
        label = self.config["poolLabel"]
        found = calling("kubernetes", self.kube.call, "GET",
                        "/api/v1/nodes?" + urllib.parse.urlencode({"labelSelector": label}))
        groups = calling("aws", self.aws.describe_groups, sorted(p["asg"] for p in self.config["pools"].values()))
        try:
            health: Optional[Dict[str, Dict[str, Any]]] = calling("prometheus", self.prometheus)
        except SourceError as error:     # nothing is judged unseen; the repairs in flight and the brake go on
            self.error(error.source, str(error))
            health = None
        self.health_seen = health is not None
        health = health or {}
        lifecycle = {iid: i["lifecycle"] for g in groups.values() for iid, i in g["instances"].items()}
        health_in_group = {iid: i.get("health", "") for g in groups.values() for iid, i in g["instances"].items()}
        nodes = []
        for item in found.get("items", []):
            meta, spec, status = item["metadata"], item.get("spec", {}), item.get("status", {})
            pool = (meta.get("labels") or {}).get(label, "")
            if pool not in self.config["pools"]:
                continue
            self.node_uids[meta["name"]] = meta.get("uid", "")
            iid = instance_id(spec.get("providerID", ""))
            condition = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
            checked = health.get(meta["name"], {})
            mark = (meta.get("annotations") or {}).get(self.config["repairAnnotation"])
            nodes.append(NodeState(meta["name"], pool, iid, condition.get("status") == "True",
                                   bool(spec.get("unschedulable")), mark is not None,
                                   lifecycle.get(iid, ""), checked.get("remediation", ""),
                                   tuple(checked.get("faults", ())), float(checked.get("checkedAt", 0.0)),
                                   (status.get("nodeInfo") or {}).get("bootID", ""),
                                   _time(condition.get("lastTransitionTime")), _time(meta.get("creationTimestamp")),
                                   *_cordon_mark(mark), health_in_group.get(iid, "")))
        for node in nodes if self.health_seen else ():   # the confirmation clock: any fresh answer but a repair resets it
            if node.ready and wanted_action(node, self.config["actions"]) and \
                    now - node.checked_at <= self.config["staleCheckSeconds"]:
                self.first_seen.setdefault(node.name, now)
            else:
                self.first_seen.pop(node.name, None)
        return nodes, groups

    def pool_reports(self, pool: str, now: float) -> List[Report]:
        """The pool's gate reports of the brake's window, oldest first (each object fetched once)."""
        bucket, prefix = self.config["reportsBucket"], f"{self.config['reportsPrefix']}{pool}/"
        since = report_key_at(self.config["reportsPrefix"], pool, now - max(self.config["brakeWindowSeconds"], HOUR))
        keys = calling("s3", self.aws.list_keys, bucket, prefix, since)
        for key in keys:
            if key not in self.reports:
                body = calling("s3", self.aws.get_object, bucket, key)
                try:
                    self.reports[key] = parse_report(key, body)
                except (ValueError, KeyError, TypeError) as error:
                    self.error("s3", f"{key}: not a gate report: {error}")
        for key in [k for k in self.reports if k.startswith(prefix) and k not in set(keys)]:
            del self.reports[key]
        return [self.reports[k] for k in keys if k in self.reports]

    # --- acting ------------------------------------------------------------------------------------------------------
    def error(self, source: str, message: str) -> None:
        self.metrics.count("gpu_cloud_repair_errors_total", ERRORS_HELP, source=source)
        self.log(f"{COMPONENT}: {source}: {message}")

    def event(self, node: str, reason: str, message: str, warning: bool = True) -> None:
        stamp = datetime.datetime.fromtimestamp(self.clock(), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{node}.", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node,
                                   "uid": self.node_uids.get(node, node)},
                "reason": reason, "message": message[:1000], "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": os.environ.get("HOSTNAME", COMPONENT), "firstTimestamp": stamp,
                "lastTimestamp": stamp, "count": 1}
        try:
            self.kube.call("POST", "/api/v1/namespaces/default/events", body)
        except (HttpError, OSError) as error:              # an Event is a report, never a reason to stop
            self.error("kubernetes", f"event on {node}: {error}")

    def patch_node(self, node: str, unschedulable: bool, annotation: Optional[str]) -> None:
        calling("kubernetes", self.kube.call, "PATCH", f"/api/v1/nodes/{node}",
                {"spec": {"unschedulable": unschedulable},
                 "metadata": {"annotations": {self.config["repairAnnotation"]: annotation}}},
                "application/merge-patch+json")

    def pods_on(self, node: str) -> List[Mapping[str, Any]]:
        found = calling("kubernetes", self.kube.call, "GET",
                        "/api/v1/pods?" + urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"}))
        return evictable_pods(found.get("items", []))

    def evict(self, pods: Sequence[Mapping[str, Any]]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            try:
                self.kube.call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction",
                               {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}, retried=False)
            except HttpError as error:      # 429: a PodDisruptionBudget says not now; the next pass tries again
                if error.status not in (404, 429):
                    raise SourceError("kubernetes", error) from error
            except OSError as error:
                raise SourceError("kubernetes", error) from error

    def force_delete(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Delete pods with grace 0 (the fast path, on a node being terminated whose kubelet is gone: nothing runs
        them, and a StatefulSet or a Job starts them elsewhere only once they are gone). A pod already gone is fine."""
        for pod in pods:
            meta = pod["metadata"]
            try:
                self.kube.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                               {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
            except HttpError as error:
                if error.status != 404:
                    raise SourceError("kubernetes", error) from error
            except OSError as error:
                raise SourceError("kubernetes", error) from error

    def carry_out(self, node: str, instance: str, do: str, mark: str = "") -> None:
        if do == "complete":
            found = json.loads(mark)
            if found["force"]:
                self.force_delete(self.pods_on(node))
            try:
                calling("aws", self.aws.continue_termination, found["asg"], self.config["drainHook"], instance)
            except SourceError as error:
                # The drain handler (or the heartbeat) completed it between this pass's Describe and the call: what
                # was wanted is done (Auto Scaling answers ValidationError "No active Lifecycle Action found").
                cause = error.__cause__
                if not (isinstance(cause, aws_api.AwsError) and cause.code == "ValidationError"
                        and "No active Lifecycle Action" in cause.message):
                    raise
        elif do == "cordon":
            self.patch_node(node, True, mark)
        elif do == "evict":
            self.evict(self.pods_on(node))
        elif do == "reboot":
            calling("aws", self.aws.reboot_instance, instance)
        elif do == "replace":
            calling("aws", self.aws.replace_instance, instance)
        elif do == "unhealthy":
            calling("aws", self.aws.mark_unhealthy, instance)
        elif do == "uncordon":
            self.patch_node(node, False, None)

    def call_for(self, do: str, pool: str) -> str:
        """A replacement terminates through the group, or, in a pool whose reservation has a spare slot, reports the
        instance Unhealthy so that the group launches the replacement first (decisions/nodes/pools.py
        launches_first)."""
        return "unhealthy" if do == "replace" and self.config["pools"][pool].get("launchFirst") else do

    def tell(self, decision: Decision) -> None:
        if self.said.get(decision.node) == (decision.outcome, decision.reason):
            return
        self.said[decision.node] = (decision.outcome, decision.reason)
        if decision.outcome != "waiting":
            self.metrics.count("gpu_cloud_repair_decisions_total", DECISIONS_HELP, pool=decision.pool,
                               action=decision.action, outcome=decision.outcome)
        reason = {"repair": "GpuRepairStarted", DRY_RUN: "GpuRepairDryRun", "refused": "GpuRepairRefused",
                  "waiting": "GpuRepairWaiting"}[decision.outcome]
        self.event(decision.node, reason, f"{decision.action}: {decision.reason}", warning=decision.outcome != "waiting")
        self.log(f"{COMPONENT}: {decision.node} (pool {decision.pool}): {decision.outcome}: {decision.reason}")

    # --- one pass ---------------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Observe, decide, write the repairs to the state ConfigMap, then act. Every action is derived again on every
        pass from what is observed (a schedulable node that should not be, an instance still InService, a reboot that
        never happened, a healthy node still cordoned), so a call that fails after its retries is made again by the
        next pass. A pass that cannot read or write the state does nothing."""
        now = self.clock()
        self.blocks.run(now)                              # on its own: whatever the repairs' state, blocks close
        state, version = calling("kubernetes", self.load_state)
        nodes, groups = self.observe(now)
        by_name = {n.name: n for n in nodes}
        work: List[Tuple[str, str, str, str]] = []          # (node, instance, what to do, the annotation of a cordon)
        steps: List[Tuple[Mapping[str, Any], str]] = []      # (repair, why it moved), for its Event
        failed, self.failed = self.failed, set()
        self.failed_brakes = {key for key in failed if key[1] == "brake"}

        for repair in state["repairs"]:
            if repair["phase"] not in IN_FLIGHT:
                continue
            node = by_name.get(repair["node"])
            if node is not None and node.instance_id != repair["instance"]:
                node = None                                   # the name came back on another instance
            pods: List[Mapping[str, Any]] = []
            leaving_now = node is not None and node.lifecycle == "Terminating:Wait"
            if node is not None and node.lifecycle.startswith("Terminating"):
                repair.setdefault("terminatingSince", now)    # the fast path's cap counts from here
            if (repair["phase"] == "draining" or leaving_now) and node is not None:
                try:
                    pods = list(self.pods_on(repair["node"]))
                except SourceError as error:                  # the drain waits a pass: nothing is judged unseen
                    self.error(error.source, str(error))
                    continue
            step = advance(now, self.config, repair, node, len(pods), (repair["node"], "reboot") in failed, pods)
            if step.do == "reboot":
                repair.update(rebootedAt=now, bootId=node.boot_id if node else "",
                              reboots=repair.get("reboots", 0) + 1)
            if step.phase == "replacing" and repair["action"] != "replace":
                # An escalated reboot (or one whose gate failed, which its group replaces): a replacement from now,
                # with its own start (GpuRepairStuck counts from it).
                repair.update(action="replace", escalatedFrom=repair["action"], replacingSince=now)
            if step.do == "complete":
                work.append((repair["node"], repair["instance"], step.do, json.dumps(
                    {"asg": self.config["pools"][repair["pool"]]["asg"], "force": not node.ready})))
            elif step.do:
                work.append((repair["node"], repair["instance"], self.call_for(step.do, repair["pool"]), ""))
            if step.reason and (step.phase != repair["phase"] or step.do):
                steps.append((repair, step.reason))
            repair["phase"] = step.phase
            was_stuck, repair["stuck"] = repair.get("stuck", False), stuck(now, self.config, repair)
            if repair["stuck"] and not was_stuck:
                steps.append((repair, f"still in its group {self.config['repairTimeoutSeconds']} s after the "
                                      "replacement began"))

        decisions = decide(now, self.config, nodes, state["repairs"], self.first_seen) if self.health_seen else []
        for decision in decisions:
            if decision.outcome in ("repair", DRY_RUN):
                node = by_name[decision.node]
                # A reboot, and a replacement launched first, drain the node first; a replacement that terminates
                # first leaves the drain to the termination hook.
                drains = decision.action == "reboot" or self.config["pools"][node.pool].get("launchFirst", False)
                repair = {"node": node.name, "pool": node.pool, "instance": node.instance_id,
                          "action": decision.action, "startedAt": now,
                          "phase": DRY_RUN if decision.outcome == DRY_RUN else ("draining" if drains else "replacing")}
                if decision.action == "replace":
                    repair["replacingSince"] = now
                state["repairs"].append(repair)
                if decision.outcome == "repair":
                    if decision.action == "replace":       # terminate, or report Unhealthy to launch first
                        work.append((node.name, node.instance_id, self.call_for("replace", node.pool), ""))
                    if drains:
                        work.append((node.name, node.instance_id, "evict", ""))
        keep = max(24 * HOUR, self.config["recurrenceSeconds"])
        state["repairs"] = [r for r in state["repairs"] if r["phase"] in IN_FLIGHT or now - r["startedAt"] < keep]

        # Out of service first: every node that asks, and every node in repair, is cordoned whatever was decided; a
        # node this controller cordoned that no longer asks, is Ready and has passed a check since, is uncordoned.
        cordons, uncordons = [], []
        if not self.config["dryRun"] and self.health_seen:
            in_repair = {r["node"]: r for r in state["repairs"] if r["phase"] in IN_FLIGHT}
            asks = {node.name: ask(node, now, self.config) for node in nodes}
            unwatched = watchless_pools(nodes, asks, self.config["fleetFaultShare"])
            for pool in unwatched:
                self.log(f"{COMPONENT}: the checkers of most of pool {pool} are silent at once: the scrape or "
                         "Prometheus, not the nodes; none of them is cordoned for it (GpuNodeHealthCheckStale pages)")
            for node in nodes:
                wanted = asks[node.name]
                if wanted and wanted.kind == "stale" and node.pool in unwatched:
                    wanted = None
                repair = in_repair.get(node.name)
                if repair is not None and repair["instance"] != node.instance_id:
                    repair = None
                if (wanted or repair) and not node.unschedulable:
                    why = (f"{repair['action']} in flight" if repair else
                           f"{', '.join(wanted.faults)}: {wanted.action} asked for")
                    cordons.append((node.name, node.instance_id, "cordon", json.dumps(
                        {"action": repair["action"] if repair else wanted.action, "since": now, "reason": why,
                         "bootId": node.boot_id})))
                elif node.ours and not wanted and not repair and node.ready and node.lifecycle == "InService" \
                        and node.health != "Unhealthy" and proven_since_cordon(node):
                    uncordons.append((node.name, node.instance_id, "uncordon", ""))

        brakes, gate_samples, consecutive = self.gate(now, state, groups)
        # The fast path for a node whose gate rejected a reboot this controller did not ask for (a panic, an operator,
        # EC2 maintenance): the gate reported it Unhealthy and its group terminates it, while its kubelet never ran
        # this boot (the gate holds it, and a rejection sticks): nothing on it can checkpoint.
        gate_failed = set()
        if not self.config["dryRun"]:
            repaired = {r["instance"] for r in state["repairs"] if r["phase"] in IN_FLIGHT}
            rejected = {r.instance_id for r in self.reports.values() if r.mode == "reboot" and r.verdict != "pass"}
            for node in nodes:
                if node.lifecycle == "Terminating:Wait" and not node.ready and node.instance_id in rejected \
                        and node.instance_id not in repaired:
                    gate_failed.add(node.name)
                    work.append((node.name, node.instance_id, "complete", json.dumps(
                        {"asg": self.config["pools"][node.pool]["asg"], "force": True})))
        calling("kubernetes", self.save_state, state, version)
        # Each call on its own: one that fails (after its retries) is counted and logged, and the rest go on.
        for node_name, instance, do, mark in cordons + work + uncordons:
            try:
                self.carry_out(node_name, instance, do, mark)
            except SourceError as error:
                self.failed.add((node_name, do))
                self.error(error.source, f"{do} {node_name}: {error}")
                continue
            if do == "complete" and node_name in gate_failed:
                self.event(node_name, "GpuRepairReplacing", "its gate rejected its reboot and its group terminates it: "
                           "its kubelet never ran, its pods were deleted with grace 0 and its termination hook completed")
            if do == "cordon" and not any(r["node"] == node_name for r, _ in steps):
                self.event(node_name, "GpuNodeCordoned", json.loads(mark)["reason"])
            elif do == "uncordon":
                self.event(node_name, "GpuNodeUncordoned", "healthy: no fault on its last check", warning=False)
        for repair, why in steps:
            key = (repair["node"], repair["phase"], why)
            if self.told.get(repair["node"]) != key:
                self.told[repair["node"]] = key
                self.event(repair["node"], f"GpuRepair{repair['phase'].capitalize()}", f"{repair['action']}: {why}",
                           warning=repair["phase"] != "done")
        for pool, message in brakes:
            if not self.config["dryRun"]:
                group = self.config["pools"][pool]["asg"]
                try:
                    calling("aws", self.aws.suspend_launch, group)
                except SourceError as error:
                    self.failed.add((pool, "brake"))
                    self.error(error.source, f"suspend Launch on {group}: {error}")
                    continue
                groups.setdefault(group, {}).setdefault("suspended", []).append("Launch")
            self.log(f"{COMPONENT}: {message}")
        for decision in decisions:
            self.tell(decision)
        # A pass that could not read the nodes' health is not a success: GpuRepairControllerDown keeps counting.
        if self.health_seen:
            self.last_success = now
        self.metrics.set_gauges(self.gauges(now, state, groups, gate_samples, consecutive))

    def gate(self, now: float, state: Dict[str, Any], groups: Mapping[str, Any]):
        """The gate's reports: the brakes to apply (recorded in `state`), the gate's metrics, and each pool's
        rejections in a row."""
        brakes, samples, consecutive = [], [], {}
        for pool, policy in sorted(self.config["pools"].items()):
            try:
                reports = self.pool_reports(pool, now)
            except SourceError as error:      # the brake waits a pass; the repairs do not
                self.error(error.source, str(error))
                continue
            count, last = consecutive_rejections(reports, state["brakes"].get(pool, ""))
            consecutive[pool] = count
            suspended = "Launch" in groups.get(policy["asg"], {}).get("suspended", [])
            if (pool, "brake") in self.failed_brakes and not suspended:
                # The last pass's SuspendProcesses failed after the brake was saved: suspend again.
                brakes.append((pool, f"pool {pool}: suspending Launch on {policy['asg']} again (the last call failed)"))
            elif count >= self.config["brakeAfter"] and not suspended:
                state["brakes"][pool] = last
                brakes.append((pool, f"pool {pool}: {count} launches rejected by the gate in a row (last {last}); " + (
                    "dry run: Launch left on" if self.config["dryRun"] else
                    f"Launch suspended on {policy['asg']} until a person resumes it: aws autoscaling resume-processes "
                    f"--auto-scaling-group-name {policy['asg']} --scaling-processes Launch")))
                self.metrics.count("gpu_cloud_pool_brakes_total", BRAKES_HELP, pool=pool)
            hour_ago = report_key_at(self.config["reportsPrefix"], pool, now - HOUR)
            recent = [r for r in reports if r.key > hour_ago]
            for report in recent:
                if report.verdict != "pass":
                    samples.append(("gpu_cloud_gate_rejection_timestamp_seconds", "Gate rejections of the last hour "
                                    "(userdata/bootstrap.sh publishes every verdict), by instance; the value is when "
                                    "its boot began.", {"pool": pool, "instance_id": report.instance_id,
                                                        "instance_type": report.instance_type, "mode": report.mode,
                                                        "reason": report.reason[:120]}, _stamp(report.key)))
                for fault in report.warnings:
                    samples.append(("gpu_cloud_gate_warning_timestamp_seconds", "Fault classes that warned at a gate "
                                    "of the last hour, by instance.", {"pool": pool, "instance_id": report.instance_id,
                                                                       "fault": fault}, _stamp(report.key)))
            for verdict in ("pass", "fail"):
                samples.append(("gpu_cloud_gate_verdicts", "Gate verdicts of the last hour, by pool and verdict.",
                                {"pool": pool, "verdict": verdict},
                                sum(1 for r in recent if (r.verdict == "pass") == (verdict == "pass"))))
        return brakes, samples, consecutive

    def gauges(self, now: float, state: Mapping[str, Any], groups: Mapping[str, Any], gate_samples, consecutive):
        out = list(gate_samples)
        for pool, policy in sorted(self.config["pools"].items()):
            mine = [r for r in state["repairs"] if r["pool"] == pool]
            out += [
                ("gpu_cloud_repairs_in_flight", "Repairs in flight, by pool.", {"pool": pool},
                 sum(1 for r in mine if r["phase"] in IN_FLIGHT)),
                ("gpu_cloud_repairs_stuck", "Repairs in flight past the repair timeout, by pool.", {"pool": pool},
                 sum(1 for r in mine if r.get("stuck") and r["phase"] in IN_FLIGHT)),
                ("gpu_cloud_repair_budget_remaining", "Repairs the pool may still start this hour.", {"pool": pool},
                 max(0, policy["maxPerHour"] - sum(1 for r in mine if now - r["startedAt"] < HOUR))),
                ("gpu_cloud_gate_consecutive_rejections", "Launches the gate rejected in a row, by pool (a pool is "
                 "braked at brakeAfter).", {"pool": pool}, consecutive.get(pool, 0)),
                ("gpu_cloud_pool_launch_suspended", "1 when the pool's Auto Scaling group has its Launch process "
                 "suspended.", {"pool": pool}, int("Launch" in groups.get(policy["asg"], {}).get("suspended", []))),
            ]
        out += [("gpu_cloud_repair_dry_run", "1 when the controller only reports.", {}, int(self.config["dryRun"])),
                ("gpu_cloud_repair_last_success_timestamp_seconds", "When the last pass of the loop that read the "
                 "nodes' health completed (0: none yet).", {}, self.last_success)]
        return out

    def run_once(self) -> None:
        """One pass of the loop: a pass that fails is counted and logged, and the next starts again."""
        try:
            self.tick()
        except SourceError as error:
            self.error(error.source, str(error))
        except Exception as error:  # noqa: BLE001  (a bug: reported, nothing more done this pass)
            self.error("controller", f"{error}\n{traceback.format_exc()}")

    def ready(self) -> bool:
        """/readyz: whether a pass that read the nodes' health began within READY_INTERVALS intervals."""
        return self.last_success > 0 and \
            self.clock() - self.last_success <= READY_INTERVALS * self.config["intervalSeconds"]

    def run_forever(self) -> None:
        while True:
            self.run_once()
            time.sleep(self.config["intervalSeconds"])


def _number(value: float) -> str:
    """A sample value in full: 1796389200, not 1.79639e+09 (Unix times must keep every second)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _stamp(key: str) -> float:
    stamp = key.rsplit("/", 1)[-1][:16]
    return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def serve_metrics(metrics: Metrics, port: int, ready: Callable[[], bool]) -> http.server.ThreadingHTTPServer:
    """/metrics, /healthz (the process answers) and /readyz (`ready()`: its loop works) on `port`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                status, body = 200, metrics.render().encode()
            elif self.path == "/readyz" and not ready():
                status, body = 503, b"no pass has read the nodes' health recently\n"
            else:
                status, body = (200, b"ok\n") if self.path in ("/healthz", "/readyz") else (404, b"not found\n")
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    config = json.loads(Path(os.environ.get("CONFIG", "/etc/gpu-node-repair/config.json")).read_text())
    metrics = Metrics()
    aws = aws_api.Aws(config["region"], config["dnsSuffix"], aws_api.PodIdentityCredentials())
    controller = Controller(config, Kube(), aws, metrics, lambda: node_health(
        config["prometheusUrl"], counter_faults=config["counterFaults"], window_s=config["counterWindowSeconds"]))
    serve_metrics(metrics, config["metricsPort"], controller.ready)
    controller.log(f"{COMPONENT}: {len(config['pools'])} pools, dry run {config['dryRun']}")
    controller.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
