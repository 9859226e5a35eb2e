"""jobs/block_expiry.py: the repair controller's part for capacity blocks, on a fake clock against a fake API server
and queue. The issue's timeline (#39 item 4): at the end less 60 minutes a job that fits is admitted and one longer
than the time left refused; at the end less 45 the block's nodes are cordoned and drained and its flavor admits
nothing; at the end less 30 the nodes are gone. EC2's expiry warning closes a block whose end the controller was told
wrong; an extended block opens again; dry run answers the queue and touches no node."""
from __future__ import annotations

import json
import urllib.parse
from typing import Any, Dict, List, Optional

import pytest

from decisions.nodes import capacity_blocks, repair
from decisions.nodes.capacity_blocks import ADMISSION_CHECK, CLOSING_ANNOTATION, Block
from jobs import block_expiry
from jobs.block_expiry import READY, REJECTED, verdict
from jobs.node_repair import Controller, HttpError, Metrics
from plan.stackfile import load_stack

END = capacity_blocks.unix_time("2027-01-18T11:30:00Z")      # a block's end, at 11:30 UTC as EC2 ends them
MINUTE = 60
BLOCK = Block(pool="train-h100", flavor="train-h100", reservation_id="cr-0aaaaaaaaaaaaaaaa", ends_at=END)
API = block_expiry.API


# --- the answer, as a table ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("minutes_before_end, declared_min, past_min, state", [
    (60, 10, 0, READY),            # ends 50 minutes before the end, 5 before the block closes
    (60, 15, 0, READY),            # ends exactly when it closes (45 minutes before the end)
    (60, 16, 0, REJECTED),         # a minute past the close: refused
    (60, 120, 0, REJECTED),        # a job longer than the time left
    (60, 120, 110, READY),         # Kueue counts its earlier admitted time: 10 minutes left
    (60, None, 0, READY),          # declares nothing: admitted while open, drained when it closes
    (45, 1, 0, REJECTED),          # closed: nothing more, however short
    (45, None, 0, REJECTED),
    (30, None, 0, REJECTED),
    (24 * 60 + 45, 24 * 60, 0, READY),   # a day's job a day and 45 minutes before the end
])
def test_the_check_answers_against_the_blocks_close(minutes_before_end, declared_min, past_min, state):
    now = END - minutes_before_end * MINUTE
    answer = verdict(now, BLOCK.pool, BLOCK.closes_at, END, None if declared_min is None else declared_min * MINUTE,
                     past_min * MINUTE)
    assert answer.state == state, answer.message
    assert "train-h100 closes at 2027-01-18T10:45:00Z, 45 minutes before it ends" in answer.message


def test_a_refusal_says_what_was_asked_and_what_is_left():
    answer = verdict(END - 60 * MINUTE, BLOCK.pool, BLOCK.closes_at, END, 7200)
    assert answer.state == REJECTED
    assert "declares a maximum run time of 7200 s (7200 s left), more than the 900 s until it closes" in answer.message
    assert "--max-run-time" in answer.message and "another pool" in answer.message


def test_the_block_closes_45_minutes_before_its_end_before_ec2s_warning_and_termination():
    assert BLOCK.closes_at == END - 45 * MINUTE
    assert capacity_blocks.CLOSE_BEFORE_END_S > capacity_blocks.EXPIRY_WARNING_LEAD_S > \
        capacity_blocks.EC2_TERMINATION_LEAD_S


# --- the expiry warning ---------------------------------------------------------------------------------------------

def warning(rid: str = BLOCK.reservation_id, end: str = "2027-01-18T11:30:00Z",
            detail_type: str = "Capacity Block Reservation Expiration Warning") -> str:
    """The event as EventBridge delivers it to SQS (EC2 User Guide, "Monitor Capacity Blocks using EventBridge")."""
    return json.dumps({"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type,
                       "source": "aws.ec2", "account": "123456789012", "time": "2027-01-18T10:50:00Z",
                       "region": "us-east-1", "resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/"
                                                            f"{rid}"],
                       "detail": {"capacity-reservation-id": rid, "end-date": end}})


@pytest.mark.parametrize("body, expected", [
    (warning(), (BLOCK.reservation_id, END)),
    (warning(detail_type="Capacity Block Expiration Warning"), (BLOCK.reservation_id, END)),   # the .md spelling
    (warning(detail_type="Capacity Block Reservation Delivered"), None),
    (warning(end="not a date"), None),
    ("not json", None),
])
def test_a_warning_gives_its_reservation_and_end(body, expected):
    assert block_expiry.warned_end(body, capacity_blocks.EXPIRY_WARNING_DETAIL_TYPES) == expected


# --- a fake cluster: nodes, pods, Kueue's workloads and admission check -----------------------------------------------

def workload(name: str, flavor: str, declared_s: Optional[int], check: Optional[str] = "Pending",
             past_s: int = 0) -> Dict[str, Any]:
    """A Workload as Kueue leaves it once it has reserved quota on `flavor`: its check Pending (None: no check, as
    on a flavor the check does not run on)."""
    status: Dict[str, Any] = {"admission": {"clusterQueue": "training", "podSetAssignments": [
        {"name": "main", "flavors": {"nvidia.com/gpu": flavor, "vpc.amazonaws.com/efa": flavor}, "count": 2}]},
        "conditions": [{"type": "QuotaReserved", "status": "True"}]}
    if check:
        status["admissionChecks"] = [{"name": ADMISSION_CHECK, "state": check, "message": "",
                                      "lastTransitionTime": "2027-01-18T09:00:00Z"}]
    if past_s:
        status["accumulatedPastExecutionTimeSeconds"] = past_s
    spec = {"queueName": "training", "podSets": []}
    if declared_s is not None:
        spec["maximumExecutionTimeSeconds"] = declared_s
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "training"}, "spec": spec, "status": status}


class FakeCluster:
    """The API server paths the controller calls, with server-side apply of a Workload's admission checks merged by
    name as their listType=map says (kueue v0.19.2 apis/kueue/v1beta2/workload_types.go lines 655-662)."""

    def __init__(self, nodes: Dict[str, str], pods: Dict[str, List[str]]):
        self.nodes = {name: {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"gpu-cloud.io/pool": pool},
                                          "annotations": {}}, "spec": {}} for name, pool in nodes.items()}
        self.pods = {node: [{"metadata": {"name": p, "namespace": "training"}, "status": {"phase": "Running"}}
                            for p in names] for node, names in pods.items()}
        self.workloads: Dict[str, Dict[str, Any]] = {}
        self.check: Dict[str, Any] = {"metadata": {"name": ADMISSION_CHECK},
                                      "spec": {"controllerName": capacity_blocks.CONTROLLER_NAME}}
        self.evicted: List[str] = []
        self.events: List[Dict[str, Any]] = []
        self.applies: List[str] = []

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             retried: bool = True) -> Any:
        base, _, query = path.partition("?")
        params = dict(urllib.parse.parse_qsl(query))
        if content_type == block_expiry.APPLY:
            assert params == {"fieldManager": "gpu-node-repair", "force": "true"} and base.endswith("/status")
            self.applies.append(base)
        if base == f"{API}/admissionchecks/{ADMISSION_CHECK}" and method == "GET":
            return self.check
        if base == f"{API}/admissionchecks/{ADMISSION_CHECK}/status" and method == "PATCH":
            self.check["status"] = body["status"]
            return self.check
        if base == f"{API}/workloads" and method == "GET":
            return {"items": list(self.workloads.values())}
        if base.startswith(f"{API}/namespaces/training/workloads/") and method == "PATCH":
            found = self.workloads[base.split("/")[-2]]
            checks = {c["name"]: c for c in found["status"].get("admissionChecks", [])}
            checks.update({c["name"]: c for c in body["status"]["admissionChecks"]})
            found["status"]["admissionChecks"] = list(checks.values())
            return found
        if base == "/api/v1/nodes" and method == "GET":
            key, _, values = params["labelSelector"].partition(" in ")
            wanted = set(values.strip("()").split(","))
            return {"items": [n for n in self.nodes.values() if n["metadata"]["labels"].get(key) in wanted]}
        if base.startswith("/api/v1/nodes/") and method == "PATCH":
            assert content_type == block_expiry.MERGE
            node = self.nodes[base.rsplit("/", 1)[-1]]
            node["spec"]["unschedulable"] = body["spec"]["unschedulable"]
            for key, value in body["metadata"]["annotations"].items():
                if value is None:
                    node["metadata"]["annotations"].pop(key, None)
                else:
                    node["metadata"]["annotations"][key] = value
            return node
        if base == "/api/v1/pods" and method == "GET":
            return {"items": self.pods.get(params["fieldSelector"].split("=", 1)[1], [])}
        if base.endswith("/eviction") and method == "POST":
            name = base.split("/")[-2]
            self.evicted.append(name)
            for pods in self.pods.values():
                for pod in pods:
                    if pod["metadata"]["name"] == name:
                        pod["metadata"]["deletionTimestamp"] = "2027-01-18T10:45:00Z"
            return {}
        if base == "/api/v1/namespaces/default/events" and method == "POST":
            self.events.append(body)
            return body
        raise HttpError(404, f"{method} {path}: not served by this fake")

    def state(self, name: str) -> Optional[str]:
        return block_expiry.check_state(self.workloads[name], ADMISSION_CHECK)

    def cordoned(self) -> Dict[str, bool]:
        return {name: bool(n["spec"].get("unschedulable")) and CLOSING_ANNOTATION in n["metadata"]["annotations"]
                for name, n in self.nodes.items()}

    def reasons(self) -> List[str]:
        return [e["reason"] for e in self.events]


class FakeQueue:
    """SQS as jobs/aws_api.py's receive_messages and delete_message see it; AWS for the repair loop's other calls
    fails, so a pass's repairs stop where the blocks' part must not."""

    def __init__(self, bodies: List[str] = ()):
        self.messages = {f"receipt-{i}": body for i, body in enumerate(bodies)}
        self.deleted: List[str] = []

    def receive_messages(self, url: str, max_messages: int, wait_s: int, visibility_s: int) -> List[Dict[str, str]]:
        assert url == "https://sqs.us-east-1.amazonaws.com/123456789012/gpu-cloud-test-capacity-block-expiry"
        assert (max_messages, wait_s, visibility_s) == (10, 1, 0)
        return [{"body": body, "receipt": receipt} for receipt, body in self.messages.items()]

    def delete_message(self, url: str, receipt: str) -> None:
        self.deleted.append(receipt)
        del self.messages[receipt]

    def describe_groups(self, names):
        raise OSError("Auto Scaling unreachable in this test")


@pytest.fixture(scope="module")
def pools():
    return load_stack("prod-us-east-1")[1].pools


def controller(pools, cluster: FakeCluster, queue: FakeQueue, clock: List[float], block: Block = BLOCK,
               dry_run: bool = False) -> Controller:
    """The real repair controller with the capacity-block keys `pulumi up` gives it for `block`."""
    config = {**repair.controller_config(cluster_name="gpu-cloud-test", region="us-east-1", partition="aws",
                                         pools=pools, dry_run=dry_run, max_per_hour=2, reports_bucket="artifacts"),
              **capacity_blocks.controller_additions([block], cluster_name="gpu-cloud-test", region="us-east-1",
                                                     partition="aws", account_id="123456789012",
                                                     dns_suffix="amazonaws.com").config}
    return Controller(config, cluster, queue, Metrics(), prometheus=lambda: {}, clock=lambda: clock[0],
                      log=lambda line: None)


def block_cluster() -> FakeCluster:
    return FakeCluster(nodes={"p5-a": "train-h100", "p5-b": "train-h100", "a100-spot": "finetune-a100-80gb-spot"},
                       pods={"p5-a": ["trainer-0"], "p5-b": ["trainer-1"], "a100-spot": ["other-0"]})


# --- the timeline ----------------------------------------------------------------------------------------------------

def test_admitted_at_60_closed_and_draining_at_45_gone_at_30(pools):
    cluster, queue, clock = block_cluster(), FakeQueue(), [END - 60 * MINUTE]
    control = controller(pools, cluster, queue, clock)
    cluster.workloads = {"short": workload("short", "train-h100", 10 * MINUTE),
                         "long": workload("long", "train-h100", 2 * 3600),
                         "on-spot": workload("on-spot", "finetune-a100-80gb-spot", 2 * 3600, check=None)}

    control.run_once()                                         # end - 60 minutes
    assert cluster.check["status"]["conditions"][0]["type"] == "Active"
    assert cluster.state("short") == READY                     # admitted
    assert cluster.state("long") == REJECTED                   # longer than the time left: refused
    assert cluster.state("on-spot") is None                    # another flavor: the check is not its
    counted = control.metrics.render()
    for verdict_ in (READY, REJECTED):
        assert f'gpu_cloud_capacity_block_admissions_total{{pool="train-h100",verdict="{verdict_}"}} 1' in counted
    assert cluster.cordoned() == {"p5-a": False, "p5-b": False, "a100-spot": False} and cluster.evicted == []

    clock[0] = END - 45 * MINUTE                               # end - 45 minutes: closed
    cluster.workloads["late"] = workload("late", "train-h100", 60)
    control.run_once()
    assert cluster.state("late") == REJECTED                   # the flavor admits nothing more
    assert cluster.cordoned() == {"p5-a": True, "p5-b": True, "a100-spot": False}
    assert sorted(cluster.evicted) == ["trainer-0", "trainer-1"]
    assert cluster.reasons().count("CapacityBlockClosing") == 2
    mark = json.loads(cluster.nodes["p5-a"]["metadata"]["annotations"][CLOSING_ANNOTATION])
    assert (mark["closesAt"], mark["endsAt"]) == (END - 45 * MINUTE, END)

    clock[0] = END - 30 * MINUTE                               # end - 30 minutes: EC2 has the instances
    del cluster.nodes["p5-a"], cluster.nodes["p5-b"]
    cluster.workloads["after"] = workload("after", "train-h100", None)
    errors_before = control.metrics.render()
    control.run_once()
    assert cluster.state("after") == REJECTED
    assert set(cluster.nodes) == {"a100-spot"} and cluster.cordoned() == {"a100-spot": False}
    assert _errors(control, "kubernetes") == _errors_in(errors_before, "kubernetes")


def test_the_answer_is_given_when_kueue_reserves_the_quota_not_when_the_job_was_written(pools):
    """A 30-minute job waits in the queue: reserved 75 minutes before the end it fits (it ends as the block closes);
    the same job reserved a minute later does not."""
    for minutes_before, state in ((75, READY), (74, REJECTED)):
        cluster, clock = block_cluster(), [END - minutes_before * MINUTE]
        cluster.workloads = {"waited": workload("waited", "train-h100", 30 * MINUTE)}
        controller(pools, cluster, FakeQueue(), clock).run_once()
        assert cluster.state("waited") == state, minutes_before


def test_an_answered_check_is_left_alone(pools):
    cluster, clock = block_cluster(), [END - 60 * MINUTE]
    cluster.workloads = {"running": workload("running", "train-h100", 2 * 3600, check="Ready")}
    controller(pools, cluster, FakeQueue(), clock).run_once()
    assert cluster.state("running") == READY
    assert not [path for path in cluster.applies if "/workloads/" in path]


def test_expiry_warning_closes_a_block_whose_end_was_given_wrong_and_leaves_when_the_block_has(pools):
    told_late = Block(BLOCK.pool, BLOCK.flavor, BLOCK.reservation_id, END + 86400)     # a day too late
    cluster, clock = block_cluster(), [END - 40 * MINUTE]
    queue = FakeQueue([warning(), warning(rid="cr-0bbbbbbbbbbbbbbbb"), "not an event"])
    control = controller(pools, cluster, queue, clock, block=told_late)
    control.run_once()
    assert cluster.cordoned()["p5-a"] and cluster.cordoned()["p5-b"]
    # Another stack's block and what is no warning go; this block's warning stays for a restarted controller.
    assert list(queue.messages) == ["receipt-0"]
    restarted = controller(pools, cluster, queue, clock, block=told_late)
    cluster.workloads = {"short": workload("short", "train-h100", 60)}
    restarted.run_once()
    assert cluster.state("short") == REJECTED
    clock[0] = END                                             # the block has ended: the warning is done
    restarted.run_once()
    assert queue.messages == {}


def test_a_block_extended_after_it_closed_opens_again_and_a_repair_keeps_its_node(pools):
    cluster, clock = block_cluster(), [END - 45 * MINUTE]
    controller(pools, cluster, FakeQueue(), clock).run_once()
    cluster.nodes["p5-b"]["metadata"]["annotations"][repair.REPAIR_ANNOTATION] = '{"action": "reboot"}'
    extended = Block(BLOCK.pool, BLOCK.flavor, BLOCK.reservation_id, END + 7 * 86400)   # `pulumi up` after extending
    controller(pools, cluster, FakeQueue(), clock, block=extended).run_once()
    assert cluster.cordoned() == {"p5-a": False, "p5-b": False, "a100-spot": False}
    assert cluster.nodes["p5-a"]["spec"]["unschedulable"] is False
    assert cluster.nodes["p5-b"]["spec"]["unschedulable"] is True                  # its repair's cordon stays
    assert "CapacityBlockOpen" in cluster.reasons()


def test_dry_run_answers_the_queue_and_cordons_nothing(pools):
    cluster, clock = block_cluster(), [END - 45 * MINUTE]
    cluster.workloads = {"late": workload("late", "train-h100", 60)}
    controller(pools, cluster, FakeQueue(), clock, dry_run=True).run_once()
    assert cluster.state("late") == REJECTED
    assert cluster.cordoned() == {"p5-a": False, "p5-b": False, "a100-spot": False} and cluster.evicted == []
    assert cluster.reasons().count("CapacityBlockClosingDryRun") == 2


def test_a_stack_without_a_block_calls_nothing(pools):
    cluster = block_cluster()
    config = repair.controller_config(cluster_name="gpu-cloud-test", region="us-east-1", partition="aws", pools=pools,
                                      dry_run=False, max_per_hour=2, reports_bucket="artifacts")
    block_expiry.BlockExpiry(Controller(config, cluster, FakeQueue(), Metrics(), prometheus=lambda: {},
                                        log=lambda line: None)).run(END)
    assert cluster.applies == [] and cluster.events == [] and "status" not in cluster.check


def test_a_failing_step_is_counted_and_the_others_go_on(pools):
    class NoQueue(FakeQueue):
        def receive_messages(self, *args):
            raise OSError("SQS unreachable")

    cluster, clock = block_cluster(), [END - 45 * MINUTE]
    control = controller(pools, cluster, NoQueue(), clock)
    control.run_once()
    assert _errors(control, "aws") >= 1
    assert cluster.cordoned()["p5-a"]


def _errors_in(text: str, source: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'gpu_cloud_repair_errors_total{{source="{source}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _errors(control: Controller, source: str) -> float:
    return _errors_in(control.metrics.render(), source)


def test_a_block_outside_the_queue_is_closed_and_no_check_is_asked_for(pools):
    """An inference pool on a block has no flavor: its nodes close, and no admission check is read or answered (the
    stack has none to read)."""
    serving = Block("infer-l40s", "", "cr-0cccccccccccccccc", END)
    cluster = FakeCluster(nodes={"l40s-a": "infer-l40s"}, pods={"l40s-a": ["triton-0"]})
    cluster.check = None                                       # GET would fail the step
    control = controller(pools, cluster, FakeQueue(), [END - 45 * MINUTE], block=serving)
    control.run_once()
    assert cluster.cordoned() == {"l40s-a": True} and cluster.evicted == ["triton-0"]
    assert _errors(control, "kubernetes") == 0
