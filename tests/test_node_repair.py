"""jobs/node_repair.py: the repair controller's rules over a table of states, the steps of a repair, the brake,
whole passes of its loop against an in-memory API server, AWS and Prometheus, its API server client's retries, and
the loop through time: its own clients against fakes of the Kubernetes API, Auto Scaling and EC2 served over HTTP that
fail as the real ones do (the AWS client itself is tested against moto and botocore in tests/test_aws_api.py; its
config is decisions/nodes/repair.py's)."""
from __future__ import annotations

import datetime
import json
import math
import random
import subprocess
import urllib.parse
from typing import Any, Dict, List

import pytest

from decisions.nodes import repair as spec_repair
from jobs import aws_api
from jobs import node_repair as nr
from jobs.node_repair import NodeState, Report
from tests.conftest import require_tool
from tests.loopback import LoopbackServer, QuietHandler

NOW = 1_796_000_000.0          # 2026-11-28
POOLS = {"train": {"asg": "gpu-cloud-prod-train", "reserved": True, "maxPerHour": 2, "maxInFlight": 1},
         "infer": {"asg": "gpu-cloud-prod-infer", "reserved": False, "maxPerHour": 2, "maxInFlight": 1}}


def config(**overrides: Any) -> Dict[str, Any]:
    base = {"dryRun": False, "confirmSeconds": 120, "staleCheckSeconds": 300, "staleRepairSeconds": 600,
            "notReadySeconds": 1800, "rebootRetrySeconds": 360, "recurrenceSeconds": 86400,
            "fleetFaultShare": 0.5, "actions": spec_repair.ACTIONS,
            "pools": POOLS, "drainTimeoutSeconds": 900, "repairTimeoutSeconds": 4500, "brakeAfter": 3,
            "brakeWindowSeconds": 21600, "reportsBucket": "artifacts", "reportsPrefix": "gate-reports/",
            "namespace": "kube-system", "stateConfigMap": "gpu-node-repair-state", "poolLabel": "gpu-cloud.io/pool",
            "repairAnnotation": "gpu-cloud.io/repair", "intervalSeconds": 30}
    return {**base, **overrides}


def node(name: str, pool: str = "train", *, remediation: str = "none", faults=(), ready=True, unschedulable=False,
         ours=False, lifecycle="InService", checked=NOW - 30, boot="boot-1", ready_since=NOW - 86400,
         created=NOW - 86400, cordoned_at=0.0) -> NodeState:
    return NodeState(name, pool, f"i-{name}", ready, unschedulable, ours, lifecycle, remediation, tuple(faults),
                     checked, boot, ready_since, created, cordoned_at)


def sick(name: str, pool: str = "train", remediation: str = "replace", **kw: Any) -> NodeState:
    return node(name, pool, remediation=remediation, faults=("xid-fatal",), **kw)


def healthy(pool: str, count: int, start: int = 1) -> List[NodeState]:
    return [node(f"{pool}{i}", pool) for i in range(start, start + count)]


def repair(node_name: str, pool: str = "train", action: str = "replace", phase: str = "replacing",
           started: float = NOW - 600, **extra: Any) -> Dict[str, Any]:
    return {"node": node_name, "pool": pool, "instance": f"i-{node_name}", "action": action, "phase": phase,
            "startedAt": started, **extra}


CONFIRMED = {name: NOW - 300 for name in ("a", "b", "c", "d", "x")}


# ----------------------------------------------------------------------------- decide: the table of states

DECIDE_CASES = [
    # (case, nodes, repairs, config overrides, expected (node, action, outcome, reason part) ...)
    ("a confirmed fault in a full pool is repaired",
     [sick("a"), *healthy("train", 3)], [], {}, [("a", "replace", "repair", "xid-fatal: replace")]),
    ("reset and reboot are both carried out as a reboot",
     [sick("a", remediation="reset"), sick("b", "infer", remediation="reboot"), *healthy("train", 3),
      *healthy("infer", 3)], [], {},
     [("b", "reboot", "repair", ""), ("a", "reboot", "repair", "")]),
    ("a fault seen for less than the confirmation waits",
     [sick("x"), *healthy("train", 3)], [], {}, [("x", "replace", "waiting", "seen for 60 s of 120")]),
    ("a checker silent for 400 s: out of service, not yet repaired",
     [sick("a", checked=NOW - 400), *healthy("train", 3)], [], {},
     [("a", "reboot", "waiting", "last health check is 400 s old; repaired at 600 s")]),
    ("a checker silent for 900 s: rebooted, whatever its last check said",
     [sick("a", checked=NOW - 900), *healthy("train", 3)], [], {},
     [("a", "reboot", "repair", "checker-stale: reboot")]),
    ("a new node that has not checked yet is not stale",
     [node("a", checked=0.0, created=NOW - 200, ready_since=NOW - 100), *healthy("train", 3)], [], {}, []),
    ("a node back from NotReady counts its silence from then",
     [node("a", checked=NOW - 2000, ready_since=NOW - 200), *healthy("train", 3)], [], {}, []),
    ("NotReady for 30 minutes: replaced, as EKS node auto repair does",
     [node("a", ready=False, ready_since=NOW - 1800, checked=NOW - 1800), *healthy("train", 3)], [], {},
     [("a", "replace", "repair", "not-ready: replace")]),
    ("NotReady for 29 minutes: the not-ready taint keeps work off it; nothing yet",
     [node("a", ready=False, ready_since=NOW - 1740, checked=NOW - 1740), *healthy("train", 3)], [], {}, []),
    ("a NotReady node's fault on its last check is not what it asks for",
     [sick("a", ready=False, ready_since=NOW - 60, checked=NOW - 30), *healthy("train", 3)], [], {}, []),
    ("a node rebooted healthy within 24 hours that asks again is replaced",
     [sick("a", remediation="reboot"), *healthy("train", 3)],
     [repair("a", action="reboot", phase="done", started=NOW - 20000)], {},
     [("a", "replace", "repair", "xid-fatal again, 20000 s after the reboot that ended healthy")]),
    ("a reboot more than 24 hours ago is not a recurrence",
     [sick("a", remediation="reboot"), *healthy("train", 3)],
     [repair("a", action="reboot", phase="done", started=NOW - 90000)], {}, [("a", "reboot", "repair", "")]),
    ("a reboot of another instance under the same name is not a recurrence",
     [sick("a", remediation="reboot"), *healthy("train", 3)],
     [{**repair("a", action="reboot", phase="done", started=NOW - 2000), "instance": "i-old"}], {},
     [("a", "reboot", "repair", "")]),
    ("budget spent: two repairs this hour, both done",
     [sick("a"), *healthy("train", 3)],
     [repair("old1", phase="done", started=NOW - 3000), repair("old2", phase="done", started=NOW - 1200)], {},
     [("a", "replace", "refused", "budget spent: 2 repairs in pool train in the last hour (at most 2)")]),
    ("a repair older than an hour no longer counts",
     [sick("a"), *healthy("train", 3)], [repair("old1", phase="done", started=NOW - 3700),
                                         repair("old2", phase="done", started=NOW - 1200)], {},
     [("a", "replace", "repair", "")]),
    ("no floor: a pool with one node down still repairs the next (a sick node serves nothing)",
     [sick("a"), node("train1", ready=False, ready_since=NOW - 60), *healthy("train", 2, start=2)], [], {},
     [("a", "replace", "repair", "")]),
    ("a reserved node waits while another node of the reservation is in repair",
     [sick("a"), sick("b"), *healthy("train", 2)], [repair("b")], {},
     [("a", "replace", "refused", "replace of b in flight; one at a time in a reservation")]),
    ("an on-demand pool also repairs one at a time, said without the reservation",
     [sick("a", "infer"), sick("b", "infer"), *healthy("infer", 4)], [repair("b", pool="infer")], {},
     [("a", "replace", "refused", "replace of b in flight; one at a time")]),
    ("a second fault on a node in repair starts nothing: the repair goes on",
     [sick("a", remediation="replace", ours=True, unschedulable=True), *healthy("train", 3)],
     [repair("a", action="reboot", phase="rebooting")], {}, []),
    ("a node someone else is draining is left to them",
     [sick("a", unschedulable=True), *healthy("train", 3)], [], {},
     [("a", "replace", "refused", "already leaving (cordoned: True, group state: InService)")]),
    ("a node its group is terminating is left to it",
     [sick("a", lifecycle="Terminating:Wait"), *healthy("train", 3)], [], {},
     [("a", "replace", "refused", "group state: Terminating:Wait")]),
    ("more than half a pool asking at once halts the pool: a false alarm must not empty it",
     [sick("a"), sick("b"), sick("c"), node("train1")], [], {},
     [(n, "replace", "refused", "3 of 4 nodes of pool train ask for repair at once") for n in ("a", "b", "c")]),
    ("half a pool asking: the first is repaired, the second waits its turn",
     [sick("a", "infer"), sick("b", "infer"), *healthy("infer", 2)], [], {},
     [("a", "replace", "repair", ""), ("b", "replace", "refused", "replace of a in flight")]),
    ("a one-node pool may repair its node",
     [sick("a", "infer")], [], {}, [("a", "replace", "repair", "")]),
    ("dry run: decided and reported, nothing in flight, the budget still counts",
     [sick("a", "infer"), sick("b", "infer"), sick("c", "infer"), *healthy("infer", 4)], [], {"dryRun": True},
     [("a", "replace", "dry-run", ""), ("b", "replace", "dry-run", ""),
      ("c", "replace", "refused", "budget spent: 2 repairs")]),
    ("a dry-run decision of the last hour is not repeated for the same node",
     [sick("a", "infer"), *healthy("infer", 3)], [repair("a", pool="infer", phase="dry-run", started=NOW - 600)],
     {"dryRun": True}, []),
    ("warnings and healthy nodes ask for nothing",
     [node("a", remediation="none", faults=("power-below-default",)), *healthy("train", 3)], [], {}, []),
]


@pytest.mark.parametrize("case,nodes,repairs,overrides,expected", DECIDE_CASES, ids=[c[0] for c in DECIDE_CASES])
def test_decide(case, nodes, repairs, overrides, expected):
    first_seen = {**CONFIRMED, "x": NOW - 60}
    decisions = nr.decide(NOW, config(**overrides), nodes, repairs, first_seen)
    assert [(d.node, d.action, d.outcome) for d in decisions] == [(n, a, o) for n, a, o, _ in expected], decisions
    for decision, (_, _, _, reason) in zip(decisions, expected):
        assert reason in decision.reason, decision


def test_pools_are_decided_on_their_own():
    nodes = [sick("a"), *healthy("train", 3), sick("b", "infer"), *healthy("infer", 3)]
    decisions = nr.decide(NOW, config(), nodes, [repair("z", pool="train")], CONFIRMED)
    assert {(d.pool, d.outcome) for d in decisions} == {("train", "refused"), ("infer", "repair")}


# ----------------------------------------------------------------------------- advance: the steps of a repair


def test_a_reboot_drains_then_reboots():
    cfg, started = config(), repair("a", action="reboot", phase="draining", started=NOW - 60)
    assert nr.advance(NOW, cfg, started, sick("a", ours=True), evictable=3) == ("draining", "evict", "3 pods to evict")
    assert nr.advance(NOW, cfg, started, sick("a", ours=True), evictable=0) == ("rebooting", "reboot", "drained")
    late = repair("a", action="reboot", phase="draining", started=NOW - 900)
    assert nr.advance(NOW, cfg, late, sick("a", ours=True), evictable=2).do == "reboot"   # the drain's budget is spent


def test_a_reboot_is_judged_only_on_a_new_boot_and_a_check_after_it():
    cfg = config()
    rebooting = repair("a", action="reboot", phase="rebooting", rebootedAt=NOW - 120, bootId="boot-1")
    # the OS has not gone down yet: the same boot, a check after the reboot call still shows the fault
    same_boot = sick("a", ours=True, unschedulable=True, checked=NOW - 10, boot="boot-1")
    assert nr.advance(NOW, cfg, rebooting, same_boot) == ("rebooting", "", "waiting for the node to pass its gate "
                                                                           "and a health check")
    back = node("a", remediation="none", ours=True, unschedulable=True, checked=NOW - 10, boot="boot-2")
    assert nr.advance(NOW, cfg, rebooting, back) == ("done", "", "healthy after its reboot")    # the pass uncordons
    still = sick("a", ours=True, unschedulable=True, checked=NOW - 10, boot="boot-2")
    assert nr.advance(NOW, cfg, rebooting, still)[:2] == ("replacing", "replace")
    not_ready = node("a", ready=False, ours=True, unschedulable=True, checked=NOW - 10, boot="boot-2")
    assert nr.advance(NOW, cfg, rebooting, not_ready).phase == "rebooting"


def test_a_reboot_that_never_comes_back_healthy_is_replaced():
    overdue = repair("a", action="reboot", phase="rebooting", started=NOW - 4500, rebootedAt=NOW - 3600,
                     bootId="boot-1")
    step = nr.advance(NOW, config(), overdue, sick("a", ours=True, unschedulable=True, boot="boot-1"))
    assert step[:2] == ("replacing", "replace") and "4500 s" in step.reason


def test_a_node_that_fails_its_gate_after_the_reboot_is_replaced_by_its_group():
    rebooting = repair("a", action="reboot", phase="rebooting", rebootedAt=NOW - 600, bootId="boot-1")
    assert nr.advance(NOW, config(), rebooting, None) == ("done", "", "the instance has left its group (replaced "
                                                                      "by it after failing its gate)")


def test_a_replacement_is_done_when_the_group_lets_the_instance_go_and_reported_when_overdue():
    replacing = repair("a", started=NOW - 600)
    terminating = sick("a", ours=True, unschedulable=True, lifecycle="Terminating:Wait")
    assert nr.advance(NOW, config(), replacing, terminating) == ("replacing", "", "")
    assert nr.advance(NOW, config(), replacing, sick("a", lifecycle="")).phase == "done"
    assert not nr.stuck(NOW, config(), replacing)
    assert nr.stuck(NOW, config(), repair("a", started=NOW - 4600))


def test_an_instance_still_in_service_is_terminated_again_and_one_already_terminating_is_left_to_its_group():
    replacing = repair("a", started=NOW - 60)
    for state in ("Terminating", "Terminating:Wait", "Terminating:Proceed", "Detaching"):
        assert nr.advance(NOW, config(), replacing, sick("a", lifecycle=state, unschedulable=True)).do == ""
    assert nr.advance(NOW, config(), replacing, sick("a", unschedulable=True)) == (
        "replacing", "replace", "still InService in its group: terminated again")


def test_a_reboot_that_did_not_happen_is_asked_for_again():
    cfg = config()
    rebooting = repair("a", action="reboot", phase="rebooting", started=NOW - 400, rebootedAt=NOW - 370,
                       bootId="boot-1")
    same = sick("a", remediation="reboot", ours=True, unschedulable=True, checked=NOW - 10, boot="boot-1")
    assert nr.advance(NOW, cfg, rebooting, same)[:2] == ("rebooting", "reboot")            # 370 s, Ready throughout
    assert nr.advance(NOW - 20, cfg, rebooting, same).do == ""                             # 350 s: not yet
    assert nr.advance(NOW - 360, cfg, rebooting, same, reboot_failed=True).do == "reboot"  # the call failed: at once
    went_down = same._replace(ready=False, ready_since=NOW - 300)
    assert nr.advance(NOW, cfg, rebooting, went_down).do == ""                              # it is rebooting
    booted = same._replace(boot_id="boot-2", ready_since=NOW - 30, checked_at=NOW - 400)
    assert nr.advance(NOW, cfg, rebooting, booted).do == ""                                 # back, not checked yet


def test_an_escalated_replacement_counts_its_own_time():
    escalated = repair("a", started=NOW - 4600, replacingSince=NOW - 60)
    assert not nr.stuck(NOW, config(), escalated)
    assert nr.stuck(NOW + 4440, config(), escalated)


# ----------------------------------------------------------------------------- the brake


def reports(*verdicts: str) -> List[Report]:
    """Reports a minute apart, oldest first: 'fail', 'pass', 'rfail' (a reboot's failure)."""
    out = []
    for i, verdict in enumerate(verdicts):
        mode = "reboot" if verdict.startswith("r") else "launch"
        stamp = f"20261204T1{i:03d}00Z"
        out.append(Report(f"gate-reports/train/{stamp}-i-{i}-{mode}.json", verdict.lstrip("r"), mode, f"i-{i}",
                          "p5.48xlarge", "efa: sysfs has 31 EFA devices, expected 32", ()))
    return out


@pytest.mark.parametrize("verdicts,after,expected", [
    (("pass", "fail", "fail", "fail"), "", 3),
    (("fail", "fail", "pass"), "", 0),
    (("fail", "pass", "fail", "fail"), "", 2),
    (("fail", "rfail", "fail", "rfail", "fail"), "", 3),     # a reboot's failure neither counts nor breaks the run
    (("fail", "fail", "fail", "fail"), 1, 2),                # after the report a previous brake counted last
    ((), "", 0),
])
def test_rejections_in_a_row(verdicts, after, expected):
    found = reports(*verdicts)
    after_key = found[after].key if after != "" else ""
    count, last = nr.consecutive_rejections(found, after_key)
    assert count == expected
    assert last == (next(r.key for r in reversed(found) if r.mode == "launch") if expected else "")


def test_a_report_is_read_as_the_gate_publishes_it():
    body = json.dumps({"verdict": "pass", "instanceId": "i-0abc", "checks": [
        {"name": "power_limit", "status": "warn", "fault": "power-below-default"},
        {"name": "gpu_count", "status": "pass", "fault": None}],
        "boot": {"mode": "reboot", "pool": "train", "instanceType": "p5.48xlarge", "reason": ""}}).encode()
    found = nr.parse_report("gate-reports/train/20261204T130000Z-i-0abc-reboot.json", body)
    assert found == Report("gate-reports/train/20261204T130000Z-i-0abc-reboot.json", "pass", "reboot", "i-0abc",
                           "p5.48xlarge", "", ("power-below-default",))
    assert nr.report_key_at("gate-reports/", "train", 1796389200.0) == "gate-reports/train/20261204T130000Z"


# ----------------------------------------------------------------------------- whole passes


class FakeKube:
    """The API server calls the controller makes, with their semantics: merge patches (null deletes), the Eviction
    API (429 while a PodDisruptionBudget forbids), a ConfigMap replace that needs the current resourceVersion."""

    def __init__(self) -> None:
        self.nodes: Dict[str, Dict[str, Any]] = {}
        self.pods: List[Dict[str, Any]] = []
        self.blocked: set = set()          # pods a PDB protects
        self.configmaps: Dict[str, Dict[str, Any]] = {}
        self.events: List[Dict[str, Any]] = []
        self.version = 0
        self.calls: List[str] = []

    def add_node(self, name: str, pool: str, boot: str = "boot-1") -> None:
        self.nodes[name] = {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"gpu-cloud.io/pool": pool},
                                         "annotations": {}},
                            "spec": {"providerID": f"aws:///us-east-1a/i-{name}"},
                            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                       "nodeInfo": {"bootID": boot}}}

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             retried: bool = True) -> Any:
        self.calls.append(f"{method} {path.split('?')[0]}")
        if path.startswith("/api/v1/nodes?"):
            return {"items": list(self.nodes.values())}
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            assert content_type == "application/merge-patch+json"
            found = self.nodes[path.rsplit("/", 1)[1]]
            found["spec"].update(body["spec"])
            for key, value in body["metadata"]["annotations"].items():
                if value is None:
                    found["metadata"]["annotations"].pop(key, None)
                else:
                    found["metadata"]["annotations"][key] = value
            return found
        if path.startswith("/api/v1/pods?"):
            name = path.split("spec.nodeName%3D", 1)[1]
            return {"items": [p for p in self.pods if p["spec"]["nodeName"] == name]}
        if path.endswith("/eviction"):
            pod = path.split("/pods/", 1)[1].rsplit("/", 1)[0]
            if pod in self.blocked:
                raise nr.HttpError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
            self.pods = [p for p in self.pods if p["metadata"]["name"] != pod]
            return {}
        if path == "/api/v1/namespaces/default/events":
            self.events.append(body)
            return body
        if "/configmaps" in path:
            name = path.rsplit("/", 1)[1]
            if method == "GET":
                if name not in self.configmaps:
                    raise nr.HttpError(404, "not found")
                return self.configmaps[name]
            if method == "PUT" and body["metadata"]["resourceVersion"] != self.configmaps[name]["metadata"]["resourceVersion"]:
                raise nr.HttpError(409, "the object has been modified")
            self.version += 1
            stored = json.loads(json.dumps(body))
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.configmaps[stored["metadata"]["name"]] = stored
            return stored
        raise AssertionError(f"unexpected call {method} {path}")

    def state(self) -> Dict[str, Any]:
        return json.loads(self.configmaps["gpu-node-repair-state"]["data"]["state.json"])

    def reasons(self, node: str) -> List[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == node]


class FakeAws:
    def __init__(self, groups: Dict[str, List[str]]) -> None:
        self.groups = {g: {"desired": len(ids), "suspended": [],
                           "instances": {i: {"lifecycle": "InService", "health": "Healthy"} for i in ids}}
                       for g, ids in groups.items()}
        self.objects: Dict[str, bytes] = {}
        self.calls: List[str] = []

    def describe_groups(self, names):
        return {n: json.loads(json.dumps(self.groups[n])) for n in names}

    def replace_instance(self, iid):
        self.calls.append(f"replace {iid}")
        for group in self.groups.values():
            if iid in group["instances"]:
                group["instances"][iid]["lifecycle"] = "Terminating:Wait"

    def reboot_instance(self, iid):
        self.calls.append(f"reboot {iid}")

    def suspend_launch(self, group):
        self.calls.append(f"suspend {group}")
        self.groups[group]["suspended"].append("Launch")

    def list_keys(self, bucket, prefix, start_after=""):
        return sorted(k for k in self.objects if k.startswith(prefix) and k > start_after)

    def get_object(self, bucket, key):
        return self.objects[key]


class World:
    """Four nodes of a reserved pool and their group; the clock, Prometheus' answers and S3 under test control."""

    def __init__(self, **overrides: Any) -> None:
        self.now = NOW
        self.kube = FakeKube()
        for name in ("t1", "t2", "t3", "t4"):
            self.kube.add_node(name, "train")
        self.aws = FakeAws({"gpu-cloud-prod-train": [f"i-t{i}" for i in range(1, 5)], "gpu-cloud-prod-infer": []})
        self.health: Dict[str, Dict[str, Any]] = {}
        self.metrics = nr.Metrics()
        self.log: List[str] = []
        self.controller = nr.Controller(config(**overrides), self.kube, self.aws, self.metrics,
                                        lambda: self.health, clock=lambda: self.now, log=self.log.append)
        for name in ("t1", "t2", "t3", "t4"):
            self.check(name, "none")

    def check(self, name: str, remediation: str, faults=()) -> None:
        self.health[name] = {"remediation": remediation, "faults": list(faults), "checkedAt": self.now}

    def later(self, seconds: float) -> None:
        self.now += seconds
        for entry in self.health.values():
            entry["checkedAt"] = self.now - 20       # the checker keeps running

    def publish(self, verdict: str, mode: str = "launch", minute: int = 0) -> None:
        stamp = nr.report_key_at("gate-reports/", "train", self.now - 3000 + 60 * minute)
        key = f"{stamp}-i-n{minute}-{mode}.json"
        self.aws.objects[key] = json.dumps({"verdict": verdict, "instanceId": f"i-n{minute}", "checks": [],
                                            "boot": {"mode": mode, "instanceType": "p5.48xlarge",
                                                     "reason": "" if verdict == "pass" else "fabricmanager: not active"}
                                            }).encode()


def test_a_sick_node_is_replaced_after_confirmation_and_the_state_is_written_before_the_call():
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.controller.tick()         # out of service on the first report; repaired only once confirmed
    assert w.aws.calls == [] and w.kube.reasons("t2") == ["GpuNodeCordoned", "GpuRepairWaiting"]
    assert w.kube.nodes["t2"]["spec"]["unschedulable"] is True
    w.later(130)
    saved_before = []
    original = w.aws.replace_instance
    w.aws.replace_instance = lambda iid: (saved_before.append(w.kube.state()["repairs"]), original(iid))
    w.controller.tick()
    assert w.aws.calls == ["replace i-t2"]
    assert saved_before[0] and saved_before[0][0]["phase"] == "replacing"          # written ahead of the call
    found = w.kube.nodes["t2"]
    assert found["spec"]["unschedulable"] is True and "gpu-cloud.io/repair" in found["metadata"]["annotations"]
    assert w.kube.reasons("t2")[-1] == "GpuRepairStarted"
    text = w.metrics.render()
    assert 'gpu_cloud_repair_decisions_total{action="replace",outcome="repair",pool="train"} 1' in text
    assert 'gpu_cloud_repairs_in_flight{pool="train"} 1' in text
    assert 'gpu_cloud_repair_budget_remaining{pool="train"} 1' in text
    # the group lets it go, and the node object with it: done, and an Event says so
    del w.aws.groups["gpu-cloud-prod-train"]["instances"]["i-t2"]
    del w.kube.nodes["t2"], w.health["t2"]
    w.later(600)
    w.controller.tick()
    assert w.kube.state()["repairs"][0]["phase"] == "done" and w.kube.reasons("t2")[-1] == "GpuRepairDone"
    assert w.aws.calls == ["replace i-t2"]


def test_a_reboot_evicts_what_may_leave_reboots_and_uncordons_a_healthy_node():
    w = World()
    w.kube.pods = [
        {"metadata": {"name": "job-0", "namespace": "training"}, "spec": {"nodeName": "t3"}, "status": {}},
        {"metadata": {"name": "dcgm", "namespace": "gpu-operator", "ownerReferences": [{"kind": "DaemonSet"}]},
         "spec": {"nodeName": "t3"}, "status": {}},
        {"metadata": {"name": "triton-1", "namespace": "inference"}, "spec": {"nodeName": "t3"}, "status": {}}]
    w.kube.blocked = {"triton-1"}
    w.check("t3", "reboot", ["xid-fatal"])
    w.controller.tick()
    w.later(130)
    w.controller.tick()            # cordon, evict: job-0 leaves, triton-1's budget says not now, the DaemonSet stays
    assert [p["metadata"]["name"] for p in w.kube.pods] == ["dcgm", "triton-1"]
    assert w.aws.calls == []
    w.kube.blocked = set()
    w.later(30)
    w.controller.tick()            # triton-1 evicted
    w.later(30)
    w.controller.tick()            # nothing left to evict: reboot
    assert w.aws.calls == ["reboot i-t3"]
    rebooting = w.kube.state()["repairs"][0]
    assert rebooting["phase"] == "rebooting" and rebooting["bootId"] == "boot-1"
    w.later(30)
    w.controller.tick()            # the same boot still reports the fault: no escalation
    assert w.aws.calls == ["reboot i-t3"]
    w.kube.nodes["t3"]["status"]["nodeInfo"]["bootID"] = "boot-2"
    w.later(400)
    w.check("t3", "none")
    w.controller.tick()
    assert w.kube.state()["repairs"][0]["phase"] == "done"
    assert w.kube.nodes["t3"]["spec"]["unschedulable"] is False
    assert "gpu-cloud.io/repair" not in w.kube.nodes["t3"]["metadata"]["annotations"]


def test_a_single_odd_reading_costs_new_work_for_a_minute_not_a_repair():
    w = World()
    w.check("t2", "reboot", ["xid-13"])
    w.controller.tick()
    assert w.kube.nodes["t2"]["spec"]["unschedulable"] is True
    w.later(60)
    w.check("t2", "none")
    w.controller.tick()
    assert not w.kube.nodes["t2"]["spec"]["unschedulable"]
    assert "gpu-cloud.io/repair" not in w.kube.nodes["t2"]["metadata"]["annotations"]
    assert w.kube.reasons("t2")[-1] == "GpuNodeUncordoned" and w.aws.calls == []


def test_a_halted_pool_keeps_its_asking_nodes_out_of_service_and_repairs_none():
    w = World()
    for name in ("t1", "t2", "t3"):
        w.check(name, "replace", ["xid-79"])
    w.controller.tick()
    w.later(130)
    w.controller.tick()
    assert [n for n, found in sorted(w.kube.nodes.items()) if found["spec"].get("unschedulable")] == ["t1", "t2", "t3"]
    assert w.aws.calls == [] and w.kube.reasons("t1")[-1] == "GpuRepairRefused"


def test_a_node_an_operator_cordoned_is_neither_marked_nor_uncordoned():
    w = World()
    w.kube.nodes["t4"]["spec"]["unschedulable"] = True
    w.check("t4", "replace", ["xid-79"])
    w.controller.tick()
    w.later(60)
    w.check("t4", "none")
    w.controller.tick()
    assert w.kube.nodes["t4"]["spec"]["unschedulable"] is True
    assert "gpu-cloud.io/repair" not in w.kube.nodes["t4"]["metadata"]["annotations"]


def test_dry_run_changes_nothing_but_says_everything():
    w = World(dryRun=True)
    w.check("t1", "replace", ["row-remap-failure"])
    for minute in range(3):
        w.publish("fail", minute=minute)
    w.controller.tick()
    w.later(130)
    w.controller.tick()
    assert w.aws.calls == []
    assert all(not n["spec"].get("unschedulable") for n in w.kube.nodes.values())
    assert w.kube.reasons("t1")[-1] == "GpuRepairDryRun"
    text = w.metrics.render()
    assert 'gpu_cloud_repair_decisions_total{action="replace",outcome="dry-run",pool="train"} 1' in text
    assert 'gpu_cloud_pool_brakes_total{pool="train"} 1' in text and "gpu_cloud_repair_dry_run 1" in text


def test_three_rejected_launches_brake_the_pool_once_and_again_only_after_three_more():
    w = World()
    w.publish("pass", minute=0)
    for minute in (1, 2):
        w.publish("fail", minute=minute)
    w.controller.tick()
    assert w.aws.calls == []
    w.publish("fail", minute=3)
    w.controller.tick()
    assert w.aws.calls == ["suspend gpu-cloud-prod-train"]
    assert w.kube.state()["brakes"]["train"].endswith("-i-n3-launch.json")
    text = w.metrics.render()
    assert 'gpu_cloud_pool_launch_suspended{pool="train"} 1' in text
    assert 'gpu_cloud_gate_consecutive_rejections{pool="train"} 3' in text
    assert 'gpu_cloud_gate_verdicts{pool="train",verdict="fail"} 3' in text
    assert text.count("gpu_cloud_gate_rejection_timestamp_seconds{") == 3
    # a person resumes Launch; the same three rejections do not brake it again
    w.aws.groups["gpu-cloud-prod-train"]["suspended"] = []
    w.later(60)
    w.controller.tick()
    assert w.aws.calls == ["suspend gpu-cloud-prod-train"]
    for minute in (4, 5, 6):
        w.publish("fail", minute=minute)
    w.controller.tick()
    assert w.aws.calls == ["suspend gpu-cloud-prod-train"] * 2


def test_a_pass_whose_state_write_is_refused_does_nothing():
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.controller.tick()
    w.later(130)
    original = w.kube.call

    def conflicting(method, path, body=None, content_type="application/json", retried=True):
        if method == "PUT":
            raise nr.HttpError(409, "the object has been modified")
        return original(method, path, body, content_type, retried)

    w.kube.call = conflicting
    with pytest.raises(nr.SourceError) as raised:
        w.controller.tick()
    assert raised.value.source == "kubernetes"
    assert w.aws.calls == [] and w.kube.state()["repairs"] == []


def test_the_metrics_pass_promtool(tmp_path):
    promtool = require_tool("promtool")
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.publish("fail", minute=1)
    w.controller.tick()
    w.later(130)
    w.controller.tick()
    w.controller.error("aws", "a failed call")
    checked = subprocess.run([promtool, "check", "metrics"], input=w.metrics.render(), capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_spec_config_is_what_the_controller_reads():
    """decisions/nodes/repair.py's config has every key the controller and its rules read, and nothing else."""
    cfg = spec_repair.controller_config(cluster_name="gpu-cloud-prod", region="us-east-1", partition="aws", pools=(),
                                        dry_run=False, max_per_hour=2, reports_bucket="b")
    read = set(config()) | {"region", "dnsSuffix", "prometheusUrl", "metricsPort"}
    assert set(cfg) == read
    source = (spec_repair.JOBS / "node_repair.py").read_text()
    for key in cfg:
        assert f'"{key}"' in source or f"'{key}'" in source, key


def test_every_series_the_alert_rules_read_of_the_controller_is_one_it_serves():
    """The rules (decisions/observability/alert_rules.py) and the controller name the same series: a rename on one side
    alone would leave an alert that can never fire."""
    import re

    from decisions.observability import alert_rules
    read = set()
    for rule in alert_rules.repair_rules() + [r for r in alert_rules.node_rules((), None)
                                              if "gpu_cloud_gate" in r["expr"]]:
        read |= set(re.findall(r"gpu_cloud_(?:repair|gate|pool)\w*", rule["expr"]))
    assert {"gpu_cloud_gate_rejection_timestamp_seconds", "gpu_cloud_pool_launch_suspended",
            "gpu_cloud_repair_decisions_total", "gpu_cloud_repairs_stuck"} <= read
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.publish("fail", minute=1)
    w.aws.objects[next(iter(w.aws.objects))] = json.dumps({
        "verdict": "fail", "instanceId": "i-n1", "checks": [{"name": "power_limit", "status": "warn",
                                                             "fault": "power-below-default"}],
        "boot": {"mode": "launch", "instanceType": "p5.48xlarge", "reason": "x"}}).encode()
    w.controller.tick()
    served = {line.split("{")[0].split(" ")[0] for line in w.metrics.render().splitlines() if not line.startswith("#")}
    assert read <= served, read - served


def test_the_dashboards_metric_table_says_what_the_controller_serves():
    """decisions/observability/dashboards/metrics.yaml documents the controller's metrics the dashboards read: same
    names, same types."""
    import re

    from decisions.observability import dashboards
    table = dashboards.metric_table()
    documented = {name: e["type"] for name, e in table["metrics"].items() if e["source"] == "repair-controller"}
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.publish("fail", minute=1)
    w.controller.tick()
    text = w.metrics.render()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert documented and all(served.get(name) == kind for name, kind in documented.items()), (documented, served)
    labels = set(re.findall(r"[{,](\w+)=", text))
    assert set(table["sources"]["repair-controller"]["labels"]) <= labels


def test_without_prometheus_nothing_is_judged_but_the_brake_and_the_repairs_in_flight_go_on():
    w = World()
    w.check("t2", "replace", ["xid-fatal"])
    w.controller.tick()
    w.later(130)
    for minute in (1, 2, 3):
        w.publish("fail", minute=minute)

    def down():
        raise OSError("connection refused")

    w.controller.prometheus = down
    w.controller.tick()
    assert w.aws.calls == ["suspend gpu-cloud-prod-train"]          # the brake reads S3, not Prometheus
    assert w.kube.state()["repairs"] == []                           # no repair on what it cannot see
    text = w.metrics.render()
    assert 'gpu_cloud_repair_errors_total{source="prometheus"} 1' in text
    assert f"\ngpu_cloud_repair_last_success_timestamp_seconds {int(NOW)}\n" in text   # the pass before this one


def test_times_are_served_to_the_second():
    w = World()
    w.publish("fail", minute=1)
    w.controller.tick()
    text = w.metrics.render()
    [line] = [row for row in text.splitlines() if row.startswith("gpu_cloud_gate_rejection_timestamp_seconds{")]
    stamp = next(iter(w.aws.objects)).split("/")[-1][:16]       # when that boot began, to the second
    began = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    assert line.endswith(f" {int(began.timestamp())}")


# ----------------------------------------------------------------------------- the API server's client


class FlakyApiServer:
    """Answers each request with the next of `answers` ((status, headers)), then 200 {}."""

    def __init__(self, answers):
        self.answers, self.requests = list(answers), []
        owner = self

        class Handler(QuietHandler):
            def serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.requests.append(self.command)
                status, headers = owner.answers.pop(0) if owner.answers else (200, {})
                self.answer(status, json.dumps({"kind": "Status", "code": status}).encode(), headers=headers)

            do_GET = do_PATCH = do_POST = do_PUT = serve   # noqa: N815

        self.server = LoopbackServer(Handler)


@pytest.mark.parametrize("answers,attempts,raised,slept", [
    ([(429, {"Retry-After": "2"})], 2, None, [2.0]),       # API Priority and Fairness: wait what it says (at most +5 s)
    ([(503, {}), (500, {})], 3, None, [0.025, 0.05]),      # transient: 50 ms base, doubled, times the draw
    ([(504, {})] * 3, 3, 504, [0.025, 0.05]),              # three attempts, then the pass counts the failure
    ([(409, {})], 1, 409, []),                             # a conflict is news, not a failure: never retried
    ([(403, {})], 1, 403, []),
])
def test_the_api_server_client_retries_as_botocore_standard_mode(tmp_path, answers, attempts, raised, slept):
    (tmp_path / "token").write_text("t")
    flaky = FlakyApiServer(answers)
    waited: List[float] = []
    try:
        kube = nr.Kube(flaky.server.url, tmp_path, retry=aws_api.Retry(nr.kube_retry_kind, sleep=waited.append,
                                                                        rand=lambda: 0.5))
        if raised:
            with pytest.raises(nr.HttpError) as error:
                kube.call("PATCH", "/api/v1/nodes/n1", {}, "application/merge-patch+json")
            assert error.value.status == raised
        else:
            kube.call("PATCH", "/api/v1/nodes/n1", {}, "application/merge-patch+json")
        assert len(flaky.requests) == attempts and waited == pytest.approx(slept)
    finally:
        flaky.server.close()


def test_an_eviction_refused_by_a_disruption_budget_is_not_retried_within_the_pass(tmp_path):
    (tmp_path / "token").write_text("t")
    flaky = FlakyApiServer([(429, {})])
    try:
        kube = nr.Kube(flaky.server.url, tmp_path, retry=aws_api.Retry(nr.kube_retry_kind, sleep=lambda s: None))
        with pytest.raises(nr.HttpError):
            kube.call("POST", "/api/v1/namespaces/t/pods/p/eviction", {}, retried=False)
        assert flaky.requests == ["POST"]
    finally:
        flaky.server.close()


# ----------------------------------------------------------------------------- the loop through time
#
# The controller's own clients (nr.Kube, aws_api.Aws) against fakes of the Kubernetes API and of Auto Scaling and EC2
# served over HTTP (tests/loopback.py), which answer and fail as the real services do; the modelled time moves on by
# the controller's passes and by every backoff its retries sleep.

START = (NOW // 60) * 60 + 1     # just after a check ran: a fault waits the longest for the next
SCRAPE_S = 30                    # a check is seen by Prometheus up to one scrape later (the ServiceMonitor's 30s)
DRAIN_S = 900                    # the drain handler completes the termination hook: at worst its heartbeat, when a
                                 # pod cannot terminate (decisions/nodes/drain.py LIFECYCLE_DRAIN_TIMEOUT_S)
BOOT_S = 1800                    # launch to a Ready node through its gate: a p5 from the AMI, about 30 minutes
                                 # (docs/repair.md, bench/RESULTS.md)
REBOOT_S = 900                   # RebootInstances to Ready again through the gate (docs/repair.md: 10 to 20 minutes)
SHUTDOWN_S, GRACE_S = 60, 40     # the OS going down; node-monitor-grace-period until a silent kubelet is not Ready
OUT_OF_SERVICE_S = 120 + 10      # the goal, 2 minutes from the fault, plus the backoff the scenario's retries sleep
AS_NS, EC2_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/", "http://ec2.amazonaws.com/doc/2016-11-15/"


def _iso(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Static:
    def __init__(self, credentials):
        self.credentials = credentials

    def get(self):
        return self.credentials


class Instance:
    def __init__(self, iid: str, node: str, up_at: float):
        self.id, self.node, self.lifecycle = iid, node, "InService"
        self.boot, self.boots = f"{iid}-boot-1", 1
        self.up_at = up_at                  # when its kubelet runs (Ready) from; inf while down
        self.down_at = math.inf             # when its kubelet stopped
        self.reboot_at = math.inf
        self.terminated_at = math.inf
        self.fault: Any = None              # (remediation, faults, since)
        self.sticky = False                 # the fault survives a reboot
        self.never_back = self.ignore_reboot = self.checker_dead = False
        self.last_check, self.reported = 0.0, ("none", [])


class Fleet:
    """A 4-node reserved pool: its instances in one Auto Scaling group, the nodes they register, their checkers."""

    def __init__(self, tmp_path, **overrides: Any) -> None:
        self.now = float(START)
        self.rng = random.Random(38)
        self.kube = FakeKube()
        self.instances: Dict[str, Instance] = {}
        self.count = 0
        self.failures: List[List[Any]] = []            # [service, match, times left, status, code, headers]
        self.aws_calls: List[str] = []
        self.out_of_service: Dict[str, float] = {}     # node -> when first seen unschedulable
        for _ in range(4):
            self.launch(ready_at=NOW - 86400)
        self.kube_server = LoopbackServer(self.kube_handler())
        self.aws_server = LoopbackServer(self.aws_handler())
        (tmp_path / "token").write_text("token")
        sleep_retry = lambda kind: aws_api.Retry(kind, sleep=self.sleep, rand=self.rng.random)  # noqa: E731
        kube = nr.Kube(self.kube_server.url, tmp_path, retry=sleep_retry(nr.kube_retry_kind))
        aws = aws_api.Aws("us-east-1", "amazonaws.com", Static(aws_api.Credentials("AKID", "secret", None, math.inf)),
                          endpoint=self.aws_server.url, retry=sleep_retry(aws_api.aws_retry_kind),
                          now=lambda: datetime.datetime.fromtimestamp(self.now, datetime.timezone.utc))
        self.metrics = nr.Metrics()
        self.log: List[str] = []
        self.controller = nr.Controller(config(**overrides), kube, aws, self.metrics, self.health,
                                        clock=lambda: self.now, log=self.log.append)

    def close(self) -> None:
        self.kube_server.close()
        self.aws_server.close()

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    # --- the world
    def launch(self, ready_at: float) -> Instance:
        self.count += 1
        inst = Instance(f"i-{self.count}", f"n{self.count}", ready_at)
        inst.lifecycle = "InService" if ready_at <= self.now else "Pending:Wait"   # the launch hook holds it
        self.instances[inst.id] = inst
        return inst

    def node_of(self, name: str) -> Instance:
        return next(i for i in self.instances.values() if i.node == name)

    def fault(self, name: str, remediation: str, sticky: bool = True, fault: str = "xid-79") -> None:
        inst = self.node_of(name)
        inst.fault, inst.sticky = (remediation, [fault], self.now), sticky

    def step(self) -> None:
        for inst in list(self.instances.values()):
            if inst.lifecycle.startswith("Terminating") and self.now >= inst.terminated_at + DRAIN_S:
                del self.instances[inst.id]                   # the hook completes; the reservation's slot frees
                self.kube.nodes.pop(inst.node, None)
                self.launch(ready_at=self.now + BOOT_S)
                continue
            if inst.lifecycle == "Pending:Wait" and self.now >= inst.up_at:
                inst.lifecycle = "InService"
            if self.now >= inst.reboot_at + SHUTDOWN_S and inst.up_at <= inst.reboot_at:
                inst.down_at, inst.up_at = inst.reboot_at + SHUTDOWN_S, math.inf
            if self.now >= inst.reboot_at + REBOOT_S and not inst.never_back:
                inst.boots += 1
                inst.boot, inst.up_at, inst.reboot_at = f"{inst.id}-boot-{inst.boots}", inst.reboot_at + REBOOT_S, math.inf
                inst.last_check, inst.reported = 0.0, ("none", [])
                if not inst.sticky:
                    inst.fault = None
            running = inst.up_at <= self.now
            if running and inst.node not in self.kube.nodes and inst.lifecycle == "InService":
                self.kube.add_node(inst.node, "train", boot=inst.boot)
                self.kube.nodes[inst.node]["spec"]["providerID"] = f"aws:///us-east-1a/{inst.id}"
                self.kube.nodes[inst.node]["metadata"]["creationTimestamp"] = _iso(inst.up_at)
            found = self.kube.nodes.get(inst.node)
            if found is None:
                continue
            ready = running or self.now < inst.down_at + GRACE_S
            condition = found["status"]["conditions"][0]
            if condition["status"] != ("True" if ready else "Unknown") or "lastTransitionTime" not in condition:
                condition.update(status="True" if ready else "Unknown",
                                 lastTransitionTime=_iso(inst.up_at if ready else inst.down_at + GRACE_S))
            found["status"]["nodeInfo"]["bootID"] = inst.boot if running else found["status"]["nodeInfo"]["bootID"]
            minute = (self.now - SCRAPE_S) // 60 * 60          # the last check Prometheus has scraped
            if running and not inst.checker_dead and minute > inst.last_check and minute >= inst.up_at:
                inst.last_check = minute
                sick = inst.fault and inst.fault[2] <= minute
                inst.reported = (inst.fault[0], inst.fault[1]) if sick else ("none", [])

    def health(self) -> Dict[str, Dict[str, Any]]:
        out = {}
        for inst in self.instances.values():
            if inst.last_check:
                fresh = self.now - inst.last_check <= 300        # an instant query loses a series after 5 minutes
                out[inst.node] = {"remediation": inst.reported[0] if fresh else "",
                                  "faults": inst.reported[1] if fresh else [], "checkedAt": inst.last_check}
        return out

    def fail(self, service: str, match: str, times: int, status: int, code: str = "", headers=None) -> None:
        self.failures.append([service, match, times, status, code, headers or {}])

    def injected(self, service: str, what: str):
        for failure in self.failures:
            if failure[0] == service and what.startswith(failure[1]) and failure[2] > 0:
                failure[2] -= 1
                return failure
        return None

    # --- the fakes on the wire
    def kube_handler(self):
        fleet = self

        class Handler(QuietHandler):
            def serve(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                path = urllib.parse.unquote(self.path)
                failure = fleet.injected("kube", f"{method} {path}")
                if failure:
                    return self.reply(failure[3], {"kind": "Status", "code": failure[3]}, failure[5])
                if method == "PUT" and "/configmaps/" in path and fleet.injected("kube", "conflict"):
                    fleet.kube.configmaps[path.rsplit("/", 1)[1]]["metadata"]["resourceVersion"] = "other-writer"
                try:
                    self.reply(200, fleet.kube.call(method, self.path, body, self.headers.get("Content-Type")))
                except nr.HttpError as error:
                    self.reply(error.status, {"kind": "Status", "code": error.status, "message": str(error)})

            def reply(self, code, body, headers=None):
                data = json.dumps(body).encode()
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = lambda self: self.serve("GET")          # noqa: E731,N815
            do_POST = lambda self: self.serve("POST")        # noqa: E731,N815
            do_PUT = lambda self: self.serve("PUT")          # noqa: E731,N815
            do_PATCH = lambda self: self.serve("PATCH")      # noqa: E731,N815

        return Handler

    def aws_handler(self):
        fleet = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802  S3 ListObjectsV2: no gate reports in these scenarios
                self.answer(200, b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                                 b'<IsTruncated>false</IsTruncated></ListBucketResult>', "application/xml")

            def do_POST(self):  # noqa: N802  the Query protocol: a form, an XML answer
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
                action = form["Action"]
                fleet.aws_calls.append(f"{action} {form.get('InstanceId', form.get('InstanceId.1', ''))}".strip())
                failure = fleet.injected("aws", action)
                if failure:
                    return self.fail(failure[3], failure[4], action, failure[5])
                if action == "DescribeAutoScalingGroups":
                    members = "".join(
                        f"<member><InstanceId>{i.id}</InstanceId><LifecycleState>{i.lifecycle}</LifecycleState>"
                        f"<HealthStatus>Healthy</HealthStatus></member>" for i in fleet.instances.values())
                    groups = "".join(
                        f"<member><AutoScalingGroupName>{name}</AutoScalingGroupName><DesiredCapacity>"
                        f"{4 if name.endswith('train') else 0}</DesiredCapacity><SuspendedProcesses/><Instances>"
                        f"{members if name.endswith('train') else ''}</Instances></member>"
                        for key, name in form.items() if key.startswith("AutoScalingGroupNames.member."))
                    return self.xml(f'<DescribeAutoScalingGroupsResponse xmlns="{AS_NS}"><DescribeAutoScalingGroups'
                                    f'Result><AutoScalingGroups>{groups}</AutoScalingGroups></DescribeAutoScalingGroups'
                                    f'Result></DescribeAutoScalingGroupsResponse>')
                if action == "TerminateInstanceInAutoScalingGroup":
                    inst = fleet.instances.get(form["InstanceId"])
                    if inst is None or inst.lifecycle not in ("InService", "Standby"):
                        # AWS answers ValidationError for an instance no longer in the group (yaybu/touchdown#51);
                        # the controller never reads it: it acts on the group's lifecycle state.
                        return self.fail(400, "ValidationError", action, {}, "Instance Id not found - No managed "
                                         f"instance found for instance ID: {form['InstanceId']}")
                    inst.lifecycle, inst.terminated_at = "Terminating:Wait", fleet.now
                    inst.up_at = min(inst.up_at, fleet.now)
                    return self.xml(f'<TerminateInstanceInAutoScalingGroupResponse xmlns="{AS_NS}"><TerminateInstance'
                                    f'InAutoScalingGroupResult><Activity><StatusCode>InProgress</StatusCode></Activity>'
                                    f'</TerminateInstanceInAutoScalingGroupResult>'
                                    f'</TerminateInstanceInAutoScalingGroupResponse>')
                if action == "RebootInstances":
                    inst = fleet.instances[form["InstanceId.1"]]
                    if inst.ignore_reboot:                     # accepted, and the OS never went down
                        inst.ignore_reboot = False
                    elif inst.reboot_at == math.inf:
                        inst.reboot_at = fleet.now
                    return self.xml(f'<RebootInstancesResponse xmlns="{EC2_NS}"><requestId>r</requestId><return>true'
                                    f'</return></RebootInstancesResponse>')
                if action == "SuspendProcesses":
                    return self.xml(f'<SuspendProcessesResponse xmlns="{AS_NS}"/>')
                self.answer(400, b"unexpected")

            def xml(self, text):
                self.answer(200, text.encode(), "text/xml")

            def fail(self, status, code, action, headers, message="injected"):
                if not code:                                   # a load balancer's page: no XML, no code
                    body = b"<html><body>503 Service Temporarily Unavailable</body></html>"
                elif action == "RebootInstances":              # EC2's error document
                    body = (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
                            f"</Errors><RequestID>r</RequestID></Response>").encode()
                else:                                          # the Query protocol's
                    body = (f'<ErrorResponse xmlns="{AS_NS}"><Error><Type>Sender</Type><Code>{code}</Code><Message>'
                            f'{message}</Message></Error><RequestId>r</RequestId></ErrorResponse>').encode()
                self.answer(status, body, headers=headers)

        return Handler

    # --- running and judging
    def run(self, seconds: float) -> None:
        until = self.now + seconds
        while self.now < until:
            self.step()
            self.controller.run_once()
            for name, found in self.kube.nodes.items():
                if found["spec"].get("unschedulable"):
                    self.out_of_service.setdefault(name, self.now)
                else:
                    self.out_of_service.pop(name, None)
            self.now += 30

    def repairs(self) -> List[Dict[str, Any]]:
        return self.kube.state()["repairs"] if self.kube.configmaps else []

    def gauge(self, name: str) -> float:
        """The series' sum over its pools."""
        return sum(float(x.rsplit(" ", 1)[1]) for x in self.metrics.render().splitlines()
                   if x.startswith(name + "{") or x.startswith(name + " "))

    def assert_settled(self) -> None:
        """Nothing stranded: no repair in flight, four healthy nodes InService and schedulable, none marked by the
        controller, no stuck repair, no bug in the loop."""
        assert [r for r in self.repairs() if r["phase"] in nr.IN_FLIGHT] == [], self.repairs()
        assert sorted(i.lifecycle for i in self.instances.values()) == ["InService"] * 4
        assert len(self.kube.nodes) == 4
        for name, found in self.kube.nodes.items():
            assert not found["spec"].get("unschedulable"), name
            assert "gpu-cloud.io/repair" not in found["metadata"]["annotations"], name
            assert found["status"]["conditions"][0]["status"] == "True", name
            assert self.node_of(name).fault is None, name
        assert self.gauge("gpu_cloud_repairs_stuck") == 0 and self.gauge("gpu_cloud_repairs_in_flight") == 0
        assert 'gpu_cloud_repair_errors_total{source="controller"} 0' in self.metrics.render(), self.log


@pytest.fixture
def fleet(tmp_path):
    made = Fleet(tmp_path)
    yield made
    made.close()


def test_loop_a_replacement_through_throttling_5xx_and_a_lost_terminate(fleet):
    """XID 79 (replace) on n2. The cordon is throttled once (429, Retry-After) and retried within the call; the
    group's Describe answers a load balancer's 503 once; TerminateInstanceInAutoScalingGroup is throttled four times
    in a row, more than one call's three attempts: that pass fails it, and the next terminates again."""
    fleet.run(60)
    fleet.fault("n2", "replace")
    fault_at = fleet.now
    fleet.fail("kube", "PATCH /api/v1/nodes/n2", 1, 429, headers={"Retry-After": "1"})
    fleet.fail("aws", "DescribeAutoScalingGroups", 1, 503)
    fleet.fail("aws", "TerminateInstanceInAutoScalingGroup", 4, 400, "Throttling")
    fleet.run(300)
    assert fleet.out_of_service["n2"] - fault_at <= OUT_OF_SERVICE_S
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-2") == 5     # 3 + 2: a pass failed, the next
    assert fleet.instances["i-2"].lifecycle == "Terminating:Wait"
    fleet.run(DRAIN_S + BOOT_S + 120)
    assert "i-2" not in fleet.instances and "n5" in fleet.kube.nodes
    fleet.assert_settled()
    assert 'gpu_cloud_repair_errors_total{source="aws"} 1' in fleet.metrics.render()


def test_loop_a_conflicting_state_write_starts_the_repair_once(fleet):
    """A second writer changes the state ConfigMap between the pass's read and its write (409): that pass does
    nothing, and the next starts the repair, once."""
    fleet.fault("n3", "replace")
    fleet.run(120)                              # first report, cordon; confirmation running
    assert fleet.kube.nodes["n3"]["spec"]["unschedulable"] is True and not fleet.repairs()
    fleet.fail("kube", "conflict", 1, 409)
    fleet.run(60)
    fleet.run(DRAIN_S + BOOT_S + 120)
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-3") == 1
    assert [r["node"] for r in fleet.repairs()] == ["n3"]
    fleet.assert_settled()
    assert 'gpu_cloud_repair_errors_total{source="kubernetes"} 1' in fleet.metrics.render()


def test_loop_a_node_that_never_comes_back_from_its_reboot_is_replaced_and_counts_its_own_time(fleet):
    """XID 48 (reboot) on n1; the instance never comes back from its reboot. At the repair timeout the reboot becomes
    a replacement, with its own start: GpuRepairStuck does not fire while that replacement runs."""
    fleet.fault("n1", "reboot")
    fleet.node_of("n1").never_back = True
    timeout = config()["repairTimeoutSeconds"]
    fleet.run(300 + timeout)
    [repair] = fleet.repairs()
    assert repair["phase"] == "replacing" and repair["escalatedFrom"] == "reboot"
    assert fleet.gauge("gpu_cloud_repairs_stuck") == 0
    fleet.run(DRAIN_S + BOOT_S + 120)
    fleet.assert_settled()


def test_loop_a_second_fault_during_a_repair_is_out_of_service_at_once_and_repaired_next(fleet):
    """n1 is being replaced when n3 faults: n3 is cordoned within the goal though its repair is refused (one at a
    time in a reservation), then replaced once n1's replacement is done."""
    fleet.fault("n1", "replace")
    fleet.run(300)
    assert fleet.instances["i-1"].lifecycle == "Terminating:Wait"
    fleet.fault("n3", "replace")
    fault_at = fleet.now
    fleet.run(300)
    assert fleet.out_of_service["n3"] - fault_at <= OUT_OF_SERVICE_S
    assert "GpuRepairRefused" in fleet.kube.reasons("n3")
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-3") == 0
    fleet.run(2 * (DRAIN_S + BOOT_S) + 300)
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-3") == 1
    fleet.assert_settled()


def test_loop_a_recurring_fault_is_rebooted_once_then_replaced(fleet):
    """XID 48 (reboot) on n2: the first reboot call fails (EC2 RequestLimitExceeded, three times) and the next pass
    asks again; the second is accepted and the OS ignores it, so six minutes later it is asked for a third time.
    The node comes back healthy, but its uncordon fails twice over: the next pass uncordons. Two hours later the
    fault is back: the node is replaced, not rebooted."""
    fleet.kube.pods = [{"metadata": {"name": "job-0", "namespace": "training"}, "spec": {"nodeName": "n2"},
                        "status": {}}]
    fleet.fault("n2", "reboot", sticky=False)
    fleet.node_of("n2").ignore_reboot = True
    fleet.fail("aws", "RebootInstances", 3, 503, "RequestLimitExceeded")
    fleet.run(330)
    assert fleet.aws_calls.count("RebootInstances i-2") == 4 and fleet.kube.pods == []
    fleet.run(360)
    assert fleet.aws_calls.count("RebootInstances i-2") == 5
    fleet.fail("kube", "PATCH /api/v1/nodes/n2", 3, 500)
    fleet.run(REBOOT_S + 180)
    [rebooted] = fleet.repairs()
    assert rebooted["phase"] == "done" and rebooted["action"] == "reboot"
    fleet.assert_settled()
    fleet.run(2 * 3600)
    fleet.fault("n2", "reboot")
    fault_at = fleet.now
    fleet.run(300)
    assert fleet.out_of_service["n2"] - fault_at <= OUT_OF_SERVICE_S
    assert fleet.aws_calls.count("RebootInstances i-2") == 5
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-2") == 1
    fleet.run(DRAIN_S + BOOT_S + 120)
    fleet.assert_settled()


def test_loop_a_silent_kubelet_and_a_silent_checker_are_repaired_after_their_stated_times(fleet):
    """n4's kubelet stops (NotReady): replaced at 30 minutes, as EKS node auto repair does. n1's checker stops while
    the node stays Ready: cordoned at 5 minutes, rebooted at 10; it comes back checking and is uncordoned."""
    fleet.run(90)
    inst = fleet.node_of("n4")
    inst.down_at, inst.up_at = fleet.now, math.inf
    down_at = fleet.now
    fleet.node_of("n1").checker_dead = True
    silent_from = fleet.node_of("n1").last_check
    fleet.run(330)
    assert fleet.out_of_service["n1"] - silent_from <= 300 + SCRAPE_S + 30 + 10
    assert not fleet.aws_calls.count("RebootInstances i-1")
    fleet.run(330)
    assert fleet.aws_calls.count("RebootInstances i-1") == 1
    fleet.node_of("n1").checker_dead = False                    # the reboot restarted it
    fleet.run(1800 - 660 + GRACE_S + 60)
    assert fleet.aws_calls.count("TerminateInstanceInAutoScalingGroup i-4") == 1
    assert [r for r in fleet.repairs() if r["node"] == "n4"][0]["startedAt"] - down_at <= 1800 + GRACE_S + 30 + 10
    fleet.run(DRAIN_S + BOOT_S + 120)
    fleet.assert_settled()
