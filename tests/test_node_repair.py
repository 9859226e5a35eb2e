"""jobs/node_repair.py: the repair controller's rules over a table of states, the steps of a repair, the brake, and
whole passes of its loop against an in-memory API server, AWS and Prometheus (the AWS client itself is tested
against moto in tests/test_aws_api.py; its config is decisions/nodes/repair.py's)."""
from __future__ import annotations

import datetime
import json
import subprocess
from typing import Any, Dict, List

import pytest

from decisions.nodes import repair as spec_repair
from jobs import node_repair as nr
from jobs.node_repair import NodeState, Report
from tests.conftest import require_tool

NOW = 1_796_000_000.0          # 2026-11-28
POOLS = {"train": {"asg": "gpu-cloud-prod-train", "reserved": True, "minHealthyPercent": 75, "maxPerHour": 2,
                   "maxInFlight": 1},
         "infer": {"asg": "gpu-cloud-prod-infer", "reserved": False, "minHealthyPercent": 90, "maxPerHour": 2,
                   "maxInFlight": 1}}


def config(**overrides: Any) -> Dict[str, Any]:
    base = {"dryRun": False, "confirmSeconds": 120, "staleCheckSeconds": 300, "fleetFaultShare": 0.5, "actions": spec_repair.ACTIONS,
            "pools": POOLS, "drainTimeoutSeconds": 900, "repairTimeoutSeconds": 4500, "brakeAfter": 3,
            "brakeWindowSeconds": 21600, "reportsBucket": "artifacts", "reportsPrefix": "gate-reports/",
            "namespace": "kube-system", "stateConfigMap": "gpu-node-repair-state", "poolLabel": "gpu-cloud.io/pool",
            "repairAnnotation": "gpu-cloud.io/repair", "intervalSeconds": 30}
    return {**base, **overrides}


def node(name: str, pool: str = "train", *, remediation: str = "none", faults=(), ready=True, unschedulable=False,
         ours=False, lifecycle="InService", checked=NOW - 30, boot="boot-1") -> NodeState:
    return NodeState(name, pool, f"i-{name}", ready, unschedulable, ours, lifecycle, remediation, tuple(faults),
                     checked, boot)


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
    ("a stale check is not acted on",
     [sick("a", checked=NOW - 900), *healthy("train", 3)], [], {},
     [("a", "replace", "waiting", "last health check is 900 s old")]),
    ("budget spent: two repairs this hour, both done",
     [sick("a"), *healthy("train", 3)],
     [repair("old1", phase="done", started=NOW - 3000), repair("old2", phase="done", started=NOW - 1200)], {},
     [("a", "replace", "refused", "budget spent: 2 repairs in pool train in the last hour (at most 2)")]),
    ("a repair older than an hour no longer counts",
     [sick("a"), *healthy("train", 3)], [repair("old1", phase="done", started=NOW - 3700),
                                         repair("old2", phase="done", started=NOW - 1200)], {},
     [("a", "replace", "repair", "")]),
    ("a pool at its minimum healthy: one of four already down",
     [sick("a"), node("train1", ready=False), *healthy("train", 2, start=2)], [], {},
     [("a", "replace", "refused", "would serve with 2 of 4 nodes, below its minimum healthy 3 (75 %)")]),
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
    assert nr.advance(NOW, cfg, rebooting, back) == ("done", "uncordon", "healthy after its reboot")
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
                                                                      "after failing its gate)")


def test_a_replacement_is_done_when_the_group_lets_the_instance_go_and_reported_when_overdue():
    replacing = repair("a", started=NOW - 600)
    terminating = sick("a", ours=True, unschedulable=True, lifecycle="Terminating:Wait")
    assert nr.advance(NOW, config(), replacing, terminating) == ("replacing", "", "")
    assert nr.advance(NOW, config(), replacing, sick("a", lifecycle="")).phase == "done"
    overdue = repair("a", started=NOW - 4600)
    assert nr.advance(NOW, config(), overdue, terminating)[:2] == ("replacing", "stuck")
    assert nr.advance(NOW, config(), {**overdue, "stuck": True}, terminating) == ("replacing", "", "")


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

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
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
    w.controller.tick()
    assert w.aws.calls == [] and w.kube.reasons("t2") == ["GpuRepairWaiting"]
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

    def conflicting(method, path, body=None, content_type="application/json"):
        if method == "PUT":
            raise nr.HttpError(409, "the object has been modified")
        return original(method, path, body, content_type)

    w.kube.call = conflicting
    with pytest.raises(nr.SourceError) as raised:
        w.controller.tick()
    assert raised.value.source == "kubernetes"
    assert w.aws.calls == [] and not w.kube.nodes["t2"]["spec"].get("unschedulable")


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
    assert not w.kube.nodes["t2"]["spec"].get("unschedulable")      # no repair on what it cannot see
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
