"""Capacity blocks before EC2 takes them back: the repair controller's part for them, run once a pass
(jobs/node_repair.py Controller.tick calls BlockExpiry.run). Standard library only; shipped beside node_repair.py.

decisions/nodes/capacity_blocks.py says why each step and when (a block closes CLOSE_BEFORE_END_S, 45 minutes, before
its end). Each pass:
1. the expiry warnings (the backstop): every warning in the queue names a block and its end date; the block ends no
   later than that, whatever the controller was told. A warning stays in the queue until its block has ended, so a
   restarted controller reads it again;
2. the admission check Active: Kueue holds the whole ClusterQueue while a check it names is not (kubernetes-sigs/kueue
   v0.19.2 pkg/cache/scheduler/clusterqueue.go lines 250-262 and 420-465);
3. every Workload whose quota Kueue reserved on a block's flavor and whose check is Pending gets its answer
   (`verdict`): Ready, or Rejected with why, which Kueue turns into a deactivation;
4. the nodes of a closed block are cordoned and their pods evicted, pass after pass until they are gone; a node this
   part cordoned whose block is open again (an extended block, then `pulumi up`) is uncordoned.
Each step on its own: one that fails is counted and logged as the repair loop's errors are, and the others go on.
Dry run answers the admission check as ever (Kueue would otherwise hold the block's jobs), and only reports the
cordons and drains.
"""
from __future__ import annotations

import datetime
import json
import urllib.parse
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

API = "/apis/kueue.x-k8s.io/v1beta2"
FIELD_MANAGER = "gpu-node-repair"
APPLY = "application/apply-patch+yaml"      # JSON is YAML: a server-side apply of exactly the fields sent
MERGE = "application/merge-patch+json"
# One long poll of a second asks every SQS server, where a short poll samples some (Amazon SQS Developer Guide,
# "Amazon SQS short and long polling"); the warnings stay visible to the next pass: the queue holds them until their
# block has ended.
RECEIVE_WAIT_S = 1
RECEIVE_VISIBILITY_S = 0
RECEIVE_MAX = 10                            # SQS ReceiveMessage's MaxNumberOfMessages limit
READY, REJECTED, PENDING = "Ready", "Rejected", "Pending"
ADMISSIONS_HELP = "Workloads on a capacity block's flavor answered by its admission check, by pool and verdict."


class Verdict(NamedTuple):
    state: str                 # Ready | Rejected
    message: str


def stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def verdict(now: float, pool: str, closes_at: float, ends_at: float, declared_s: Optional[int],
            past_s: int = 0) -> Verdict:
    """The admission check's answer for a workload that holds quota on block `pool`'s flavor at `now`. `declared_s`:
    its maximum run time (Workload spec.maximumExecutionTimeSeconds; None if it declares none); `past_s`: the admitted
    time it has already spent (status.accumulatedPastExecutionTimeSeconds), which Kueue counts against it."""
    closing = f"capacity block {pool} closes at {stamp(closes_at)}, {_minutes(ends_at - closes_at)} before it ends"
    if now >= closes_at:
        return Verdict(REJECTED, f"{closing}: it is closed and admits nothing more; submit the job to another pool")
    if declared_s is None:
        return Verdict(READY, f"no maximum run time declared: admitted while it is open; {closing}, when the job is "
                              "drained (SIGTERM, then its grace to checkpoint)")
    left = max(declared_s - past_s, 0)
    if now + left <= closes_at:
        return Verdict(READY, f"runs at most {left} s, to {stamp(now + left)}; {closing}")
    return Verdict(REJECTED, f"declares a maximum run time of {declared_s} s ({left} s left), more than the "
                             f"{int(closes_at - now)} s until it closes ({closing}): it cannot finish there; declare "
                             "less (--max-run-time) or submit it to another pool")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} minutes"


def warned_end(body: str, event_types: Sequence[str]) -> Optional[Tuple[str, float]]:
    """(reservation id, end) from an expiry warning as EventBridge delivers it (detail: capacity-reservation-id and
    end-date, EC2 User Guide "Monitor Capacity Blocks using EventBridge"); None for anything else."""
    try:
        event = json.loads(body)
        detail = event["detail"]
        if event.get("detail-type") not in event_types:
            return None
        end = datetime.datetime.fromisoformat(str(detail["end-date"]).replace("Z", "+00:00")).timestamp()
        return str(detail["capacity-reservation-id"]), end
    except (ValueError, KeyError, TypeError):
        return None


def block_flavors(workload: Mapping[str, Any]) -> set:
    """The flavors Kueue reserved the workload's quota on (status.admission.podSetAssignments[].flavors)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return {flavor for assignment in admission.get("podSetAssignments") or []
            for flavor in (assignment.get("flavors") or {}).values()}


def check_state(workload: Mapping[str, Any], check: str) -> Optional[str]:
    for state in (workload.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return state.get("state")
    return None


class BlockExpiry:
    """Holds the controller it acts through (its config, Kubernetes and AWS clients, metrics, Events, evictions) and
    the warnings read so far."""

    def __init__(self, controller: Any):
        self.controller = controller
        self.warned: Dict[str, float] = {}         # reservation id -> end date of its expiry warning
        self.told: Dict[str, str] = {}             # node -> the last closing step told: no repeated Events

    @property
    def config(self) -> Mapping[str, Any]:
        return self.controller.config

    def blocks(self) -> Mapping[str, Mapping[str, Any]]:
        return self.config.get("capacityBlocks") or {}

    def run(self, now: float) -> None:
        if not self.blocks():
            return
        # A block outside the training queue (an inference pool) has no flavor: only its nodes to close.
        queued = any(block["flavor"] for block in self.blocks().values())
        steps = (("aws", self.read_warnings),) + ((("kubernetes", self.activate), ("kubernetes", self.answer))
                                                  if queued else ()) + (("kubernetes", self.close),)
        for source, step in steps:
            try:
                step(now)
            except Exception as error:  # noqa: BLE001  (reported like the repair loop's errors; the others go on)
                self.controller.error(source, f"capacity blocks: {step.__name__}: {type(error).__name__}: {error}")

    def ends(self) -> Dict[str, float]:
        """Pool -> when its block ends: the configured end, or an earlier one a warning gave."""
        return {pool: min(block["endsAt"], self.warned.get(block["reservationId"], block["endsAt"]))
                for pool, block in self.blocks().items()}

    def closes(self) -> Dict[str, float]:
        lead = self.config["capacityBlockCloseBeforeEndSeconds"]
        return {pool: end - lead for pool, end in self.ends().items()}

    # --- 1. the backstop
    def read_warnings(self, now: float) -> None:
        url = self.config.get("capacityBlockQueueUrl")
        if not url:
            return
        ours = {block["reservationId"] for block in self.blocks().values()}
        types = self.config["capacityBlockWarningTypes"]
        for message in self.controller.aws.receive_messages(url, RECEIVE_MAX, RECEIVE_WAIT_S, RECEIVE_VISIBILITY_S):
            found = warned_end(message["body"], types)
            if found is None or found[0] not in ours or found[1] <= now:
                # Not a warning of ours, or its block has ended: nothing more to learn from it.
                self.controller.aws.delete_message(url, message["receipt"])
                continue
            rid, end = found
            if self.warned.get(rid) != end:
                self.controller.log(f"capacity blocks: EC2 warns that {rid} ends at {stamp(end)}")
            self.warned[rid] = end

    # --- 2. the admission check, Active
    def activate(self, now: float) -> None:
        name = self.config["capacityBlockAdmissionCheck"]
        found = self.controller.kube.call("GET", f"{API}/admissionchecks/{name}")
        if any(c.get("type") == "Active" and c.get("status") == "True"
               for c in (found.get("status") or {}).get("conditions") or []):
            return
        self.apply_status(f"{API}/admissionchecks/{name}", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Active", "status": "True", "reason": "ControllerRunning",
                                       "message": "the GPU node repair controller answers it every pass",
                                       "lastTransitionTime": stamp(now)}]}})

    # --- 3. each pending workload
    def answer(self, now: float) -> None:
        check, closes, ends = self.config["capacityBlockAdmissionCheck"], self.closes(), self.ends()
        by_flavor = {block["flavor"]: pool for pool, block in self.blocks().items() if block["flavor"]}
        for workload in self.controller.kube.call("GET", f"{API}/workloads").get("items", []):
            pools = [by_flavor[f] for f in block_flavors(workload) if f in by_flavor]
            if not pools or check_state(workload, check) != PENDING:
                continue
            pool = min(pools, key=lambda p: closes[p])          # several blocks: the first to close decides
            spec, status = workload.get("spec") or {}, workload.get("status") or {}
            answer = verdict(now, pool, closes[pool], ends[pool], spec.get("maximumExecutionTimeSeconds"),
                             status.get("accumulatedPastExecutionTimeSeconds") or 0)
            meta = workload["metadata"]
            self.apply_status(f"{API}/namespaces/{meta['namespace']}/workloads/{meta['name']}", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": {"admissionChecks": [{"name": check, "state": answer.state, "message": answer.message,
                                                "lastTransitionTime": stamp(now)}]}})
            self.controller.metrics.count("gpu_cloud_capacity_block_admissions_total", ADMISSIONS_HELP, pool=pool,
                                          verdict=answer.state)
            self.controller.log(f"capacity blocks: workload {meta['namespace']}/{meta['name']} on {pool}: "
                                f"{answer.state}: {answer.message}")

    def apply_status(self, path: str, body: Mapping[str, Any]) -> None:
        """A server-side apply of the status fields in `body` as this controller: Kueue's own fields stay Kueue's
        (the Workload's admissionChecks are a list keyed by name: workload_types.go lines 655-662), and Kueue, which
        applies its own status with force (pkg/workload/patching/patching.go lines 238-266), still resets the check
        to Pending when it requeues the workload."""
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        self.controller.kube.call("PATCH", f"{path}/status?{query}", body, APPLY)

    # --- 4. the nodes of a closed block
    def close(self, now: float) -> None:
        label, mark, repair_mark = (self.config["poolLabel"], self.config["capacityBlockClosingAnnotation"],
                                    self.config["repairAnnotation"])
        closes, ends = self.closes(), self.ends()
        selector = f"{label} in ({','.join(sorted(closes))})"
        found = self.controller.kube.call("GET", "/api/v1/nodes?" + urllib.parse.urlencode({"labelSelector": selector}))
        dry_run = self.config["dryRun"]
        for node in found.get("items", []):
            meta, spec = node["metadata"], node.get("spec") or {}
            name, pool = meta["name"], (meta.get("labels") or {}).get(label, "")
            annotations = meta.get("annotations") or {}
            if now >= closes[pool]:
                why = (f"capacity block {pool} closed at {stamp(closes[pool])}; it ends at {stamp(ends[pool])} and EC2 "
                       "terminates its instances from 30 minutes before")
                if dry_run:
                    self.tell(name, "CapacityBlockClosingDryRun", f"{why}: dry run, not cordoned or drained")
                    continue
                if mark not in annotations or not spec.get("unschedulable"):
                    self.patch(name, True, json.dumps({"since": now, "closesAt": closes[pool],
                                                       "endsAt": ends[pool]}))
                self.tell(name, "CapacityBlockClosing", f"{why}: cordoned, its pods evicted")
                self.controller.evict(self.controller.pods_on(name))
            elif mark in annotations and not dry_run:
                # Open again (its end moved later): uncordoned, unless a repair holds it.
                self.patch(name, bool(spec.get("unschedulable")) and repair_mark in annotations, None)
                self.tell(name, "CapacityBlockOpen", f"capacity block {pool} is open until {stamp(closes[pool])}: "
                                                     "uncordoned", warning=False)

    def patch(self, node: str, unschedulable: bool, annotation: Optional[str]) -> None:
        self.controller.kube.call("PATCH", f"/api/v1/nodes/{node}", {
            "spec": {"unschedulable": unschedulable},
            "metadata": {"annotations": {self.config["capacityBlockClosingAnnotation"]: annotation}}}, MERGE)

    def tell(self, node: str, reason: str, message: str, warning: bool = True) -> None:
        if self.told.get(node) == reason:
            return
        self.told[node] = reason
        self.controller.event(node, reason, message, warning=warning)
        self.controller.log(f"capacity blocks: {node}: {message}")

