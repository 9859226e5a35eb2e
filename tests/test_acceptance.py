"""NCCL acceptance: minimums, the judge (parser, verdict, Event, end to end) and the rendered MPIJob and CronJob."""
import ast
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.amis import load_amis
from decisions.nodes.pods import SYSTEM_NODE_TAINT, tolerates
from decisions.nodes.pools import node_taints
from decisions.platform import acceptance
from jobs import nccl_judge as judge
from tests.conftest import ROOT, require_tool, validate_kubernetes
from tests.crds import crd_schema, validate_against_crd
from tests.loopback import LoopbackServer, QuietHandler

CATALOG = load_catalog()
BATCH_TAINT = {"key": "example.com/batch", "value": "true", "effect": "NoSchedule"}
KWARGS = dict(namespace="training", queue_name="training-queue", judge_configmap="nccl-judge",
              service_account="nccl-judge")


def pool(instance_type, *, name="train", efa=True, max_nodes=2, taints=(), sharing=None, min_nodes=0,
         workload="training") -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": "on-demand", "minNodes": min_nodes,
        "desiredNodes": min_nodes, "maxNodes": max_nodes, "workload": workload,
        "gpuSharing": sharing or {"mode": "none"}, "taints": list(taints)})
    return ResolvedPool(spec=spec, types=(CATALOG.instance_types[instance_type],), efa=efa)


# --- minimums, entry by entry: 0.9 x AWS's published two-node figure; Azure's pass mark within a node ------------
# (tests/test_catalog.py holds each figure against its source.) None: no published figure, so the test is refused.
MINIMUMS = {"p4d.24xlarge": (0.9 * 78.33, 228), "p4de.24xlarge": (0.9 * 78.33, 228),
            "p5.48xlarge": (0.9 * 487.09, 460), "p5e.48xlarge": (0.9 * 487.09, 431), "p5en.48xlarge": (None, 431)}


@pytest.mark.parametrize("instance_type", sorted(CATALOG.instance_types))
def test_minimums_entry_by_entry(instance_type):
    p = pool(instance_type)
    for scope, expected in zip(("acrossNodes", "withinNode"), MINIMUMS.get(instance_type, (None, None))):
        if expected is None:
            with pytest.raises(ValueError, match=f"pool train: {re.escape(instance_type)} has no NCCL {scope} minimum"):
                acceptance.minimum_gbps(p, CATALOG, scope)
        else:
            assert acceptance.minimum_gbps(p, CATALOG, scope) == pytest.approx(expected)


def test_a_mixed_pool_is_held_to_its_lowest_minimum():
    spec = NodePool.model_validate({
        "name": "mixed", "instanceTypes": ["p5en.48xlarge", "p5.48xlarge"], "capacity": "on-demand", "minNodes": 0,
        "desiredNodes": 0, "maxNodes": 2, "workload": "training"})
    mixed = ResolvedPool(spec=spec, types=tuple(CATALOG.instance_types[t] for t in spec.instance_types), efa=False)
    assert acceptance.minimum_gbps(mixed, CATALOG, "withinNode") == 431


# --- nccl-tests output, built with the printf formats of nccl-tests v2.16.9 src/common.cu ------------------------
# (Python's % ignores C's length modifier, so the formats are used verbatim.)
def _time(usec):                                                             # common.cu:573-580
    return "%7.0f" % usec if usec >= 10000.0 else ("%7.1f" % usec if usec >= 100.0 else "%7.2f" % usec)


def _bench(usec, algbw, busbw, wrong):                                       # common.cu:581-585
    if wrong is None:
        return "  %7s  %6.2f  %6.2f  %5s" % (_time(usec), algbw, busbw, "N/A")
    return "  %7s  %6.2f  %6.2f  %5g" % (_time(usec), algbw, busbw, float(wrong))


def row(size, oop_busbw, ip_busbw, oop_wrong=0, ip_wrong=0, usec=12345.0):   # common.cu:625-629 (root -1: all_reduce)
    line = "%12li  %12li  %8s  %6s  %6s" % (size, size // 4, "float", "sum", "%6i" % -1)
    out_of_place = _bench(usec, oop_busbw / 1.875, oop_busbw, oop_wrong)
    in_place = _bench(usec * 1.01, ip_busbw / 1.875, ip_busbw, ip_wrong)
    return line + out_of_place + in_place + "\n"


def output(*rows, avg=100.0):
    head = ["# Collective test starting: all_reduce_perf\n",                                   # common.cu:1010
            "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d "
            "validation: %d graph: %d\n" % (1, 1, 8, 17179869184, 2, "factor", 1, 100, 1, 1, 0),  # common.cu:1011
            "#\n", "# Using devices\n",
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n"                 # common.cu:1031
            % (0, 0, 41, "nccl-efa-train-abcde-worker-0", 0, 0, 0x53, 0, "NVIDIA H100 80GB HBM3"),
            "#\n# Reducing maxBytes to %ld due to memory limitation\n" % 12683575296,                 # common.cu:1058
            "nccl-efa-train-abcde-worker-0:41:41 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct\n",
            "#\n",                                                                                  # common.cu:1165-1170
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n"
            % ("", "", "", "", ""),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n"
            % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n"
            % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")]
    tail = ["# Out of bounds values : %d %s\n" % (0, "OK"),                                        # common.cu:1265-1268
            "# Avg bus bandwidth    : %g %s\n" % (avg, ""), "#\n",
            "# Collective test concluded: %s\n" % "all_reduce_perf", "\n"]
    return "".join(head + list(rows) + tail)


GOOD = output(row(8, 0.00, 0.00, usec=30.5), row(1048576, 120.51, 121.02, usec=150.2),
              row(8589934592, 801.25, 800.00), row(17179869184, 812.34, 810.11))


def test_parser_reads_every_row_with_both_places():
    rows = judge.parse_all_reduce(GOOD)
    assert [r.size for r in rows] == [8, 1048576, 8589934592, 17179869184]
    assert rows[-1] == judge.Row(17179869184, 812.34, 810.11, 0.0)
    assert rows[1].out_of_place_busbw == 120.51 and rows[1].in_place_busbw == 121.02


def test_parser_skips_comments_logs_and_non_numbers():
    text = output(row(1024, 1.5, 1.5)) + "     2048   512  float  sum  -1  inf  inf  inf  0  inf  inf  inf  0\n"
    rows = judge.parse_all_reduce(text)
    assert [r.size for r in rows] == [1024]                     # the '#' lines, the NCCL INFO line, "inf" all skipped
    assert judge.parse_all_reduce("") == []


def test_parser_reads_na_and_large_wrong_counts():
    rows = judge.parse_all_reduce(output(row(64, 1.0, 1.0, None, None), row(128, 1.0, 1.0, 1234567, 0)))
    assert rows[0].wrong is None                                # -c 0 prints N/A
    assert rows[1].wrong == 1234570.0                           # %5g prints "1.23457e+06"


# --- verdict --------------------------------------------------------------------------------------------------
def rows_at(oop, ip, **kwargs):
    return judge.parse_all_reduce(output(row(1048576, 10.0, 10.0), row(17179869184, oop, ip, **kwargs)))


def test_exactly_the_minimum_passes():
    result = judge.verdict(rows_at(800.00, 800.00), 800)
    assert result.passed and result.reason == "NcclBandwidthPassed" and result.measured_gbps == 800.0
    assert result.size == 17179869184


@pytest.mark.parametrize("oop,ip", [(799.99, 900.0), (900.0, 799.99)])
def test_one_hundredth_below_in_either_place_fails(oop, ip):
    result = judge.verdict(rows_at(oop, ip), 800)
    assert not result.passed and result.reason == "NcclBandwidthBelowMinimum" and result.measured_gbps == 799.99
    assert "799.99 GB/s < minimum 800 GB/s" in result.message


def test_small_sizes_do_not_count():
    assert judge.verdict(rows_at(850.0, 851.0), 800).passed     # the 1 MiB row at 10 GB/s is latency, not judged


@pytest.mark.parametrize("kwargs,exit_code,expect", [
    ({"ip_wrong": 3}, 0, "3 wrong elements at 17179869184 B"),
    ({"oop_wrong": None, "ip_wrong": None}, 0, "data not checked"),
    ({}, 1, "all_reduce_perf exited with 1"),
])
def test_failures_are_test_failures(kwargs, exit_code, expect):
    result = judge.verdict(rows_at(900.0, 900.0, **kwargs), 800, exit_code)
    assert not result.passed and result.reason == "NcclTestFailed" and expect in result.message


def test_no_rows_fails():
    result = judge.verdict([], 800)
    assert (result.passed, result.reason) == (False, "NcclTestFailed")


# --- the Event, against a local API server ----------------------------------------------------------------------
class FakeApi:
    def __init__(self, status=201):
        self.requests, outer = [], self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.json_body()
                outer.requests.append({"method": self.command, "path": self.path,
                                       "authorization": self.headers["Authorization"], "body": body})
                self.answer(status, {**body, "metadata": {"name": "x.1"}})

        self.server = LoopbackServer(Handler)
        self.url = self.server.url

    def close(self):
        self.server.close()


@pytest.fixture
def api():
    server = FakeApi()
    yield server
    server.close()


def test_post_event_creates_a_pod_event(api):
    created = judge.post_event(namespace="training", pod_name="nccl-efa-train-x-launcher-abcde", pod_uid="uid-1",
                               reason="NcclBandwidthBelowMinimum", event_type="Warning", message="790 < 800",
                               base_url=api.url, token="secret-token", ca_file=None)
    assert created["metadata"]["name"] == "x.1"
    [request] = api.requests
    assert (request["method"], request["path"]) == ("POST", "/api/v1/namespaces/training/events")
    assert request["authorization"] == "Bearer secret-token"
    body = request["body"]
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "nccl-efa-train-x-launcher-abcde",
                                      "namespace": "training", "uid": "uid-1"}
    assert (body["reason"], body["type"], body["message"]) == ("NcclBandwidthBelowMinimum", "Warning", "790 < 800")
    assert body["metadata"] == {"generateName": "nccl-efa-train-x-launcher-abcde.", "namespace": "training"}
    assert body["apiVersion"] == "v1" and body["kind"] == "Event" and body["count"] == 1


def test_production_api_address_comes_from_the_service_environment(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "172.20.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert judge._api_base() == "https://172.20.0.1:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert judge._api_base() == "https://[fd00::1]:443"


def test_the_judge_imports_only_the_standard_library():
    tree = ast.parse(Path(judge.__file__).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


# --- the judge script end to end: output file + marker -> exit code, summary line, Event ------------------------
def run_judge(tmp_path, text, marker, api_url, minimum="800", wait="0"):
    (tmp_path / "sa").mkdir(exist_ok=True)
    (tmp_path / "sa" / "token").write_text("tok\n")
    (tmp_path / "out.txt").write_text(text)
    if marker is not None:
        (tmp_path / "exit_code").write_text(marker)
    env = {"PATH": os.environ["PATH"], "RESULT_FILE": str(tmp_path / "out.txt"), "MARKER_FILE": str(tmp_path / "exit_code"),
           "MIN_BUS_GBPS": minimum, "POOL": "train", "INSTANCE_TYPE": "p5.48xlarge", "SCOPE": "across-nodes",
           "WAIT_SECONDS": wait, "POLL_SECONDS": "0.05", "POD_NAME": "launcher-pod", "POD_NAMESPACE": "training",
           "POD_UID": "uid-9", "KUBE_API_URL": api_url, "SERVICEACCOUNT_DIR": str(tmp_path / "sa")}
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "nccl_judge.py")], env=env, capture_output=True,
                          text=True, timeout=60)
    [summary] = [line for line in done.stdout.splitlines() if line.startswith("NCCL_ACCEPTANCE ")]
    return done, json.loads(summary.split(" ", 1)[1])


def test_judge_passes_and_posts_a_normal_event(tmp_path, api):
    done, summary = run_judge(tmp_path, GOOD, "0\n", api.url)
    assert done.returncode == 0, done.stderr
    assert summary == {"result": "pass", "reason": "NcclBandwidthPassed", "pool": "train", "instanceType": "p5.48xlarge",
                       "scope": "across-nodes", "busBandwidthGBps": 810.11, "minimumGBps": 800.0,
                       "sizeBytes": 17179869184, "exitCode": 0}
    [request] = api.requests
    assert request["authorization"] == "Bearer tok"
    assert (request["body"]["type"], request["body"]["involvedObject"]["uid"]) == ("Normal", "uid-9")
    assert "pool train (p5.48xlarge)" in request["body"]["message"] and "810.11" in request["body"]["message"]


def test_judge_fails_below_the_minimum(tmp_path, api):
    done, summary = run_judge(tmp_path, GOOD, "0\n", api.url, minimum="811")
    assert done.returncode == 1 and summary["reason"] == "NcclBandwidthBelowMinimum"
    assert api.requests[0]["body"]["type"] == "Warning"


def test_judge_fails_when_the_launcher_failed(tmp_path, api):
    done, summary = run_judge(tmp_path, GOOD, "137\n", api.url)
    assert done.returncode == 1 and summary["reason"] == "NcclTestFailed" and summary["exitCode"] == 137


def test_judge_gives_up_without_a_marker(tmp_path, api):
    done, summary = run_judge(tmp_path, GOOD, None, api.url, wait="0.2")
    assert done.returncode == 1 and summary["reason"] == "NcclTestFailed"
    assert "no result from the NCCL container" in api.requests[0]["body"]["message"]


def test_judge_keeps_its_verdict_when_the_event_cannot_be_posted(tmp_path):
    refusing = FakeApi(status=403)
    try:
        done, summary = run_judge(tmp_path, GOOD, "0\n", refusing.url)
    finally:
        refusing.close()
    assert done.returncode == 0 and summary["result"] == "pass"
    assert "could not post the Event" in done.stderr and "403" in done.stderr


# --- the MPIJob -----------------------------------------------------------------------------------------------
def launcher_pod(job):
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]


def worker_pod(job):
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("instance_type,gpus,efa,max_bytes", [
    ("p4d.24xlarge", 8, 4, 2147483648), ("p4de.24xlarge", 8, 4, 2147483648), ("p5.48xlarge", 8, 32, 17179869184),
    ("p5e.48xlarge", 8, 32, 17179869184)])
def test_mpijob_asks_for_the_pools_gpus_and_efa_devices(instance_type, gpus, efa, max_bytes):
    job = acceptance.mpijob_manifest(pool(instance_type), CATALOG, **KWARGS)
    [worker] = worker_pod(job)["containers"]
    expected = {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": efa}
    assert {k: worker["resources"]["limits"][k] for k in expected} == expected
    assert {k: worker["resources"]["requests"][k] for k in expected} == expected
    assert job["spec"]["slotsPerWorker"] == gpus and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    script = launcher_pod(job)["containers"][0]["command"][2]
    assert f"-np {2 * gpus} -N {gpus}" in script
    # Up to the size of AWS's published figure, so the verdict reads that very row.
    assert f"/opt/nccl-tests/build/all_reduce_perf -b 8 -e {max_bytes} -f 2 -c 1 -n 100 -g 1" in script
    env = env_of(launcher_pod(job)["containers"][0])
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"               # every type with a minimum is p4d or later


def test_mpijob_carries_what_efa_needs():
    p = pool("p5.48xlarge", taints=[BATCH_TAINT])
    job = acceptance.mpijob_manifest(p, CATALOG, **KWARGS)
    launcher, judge_container = launcher_pod(job)["containers"]
    assert launcher["name"] == "launcher"                      # the operator sets up MPI in the first container only
    env = env_of(launcher)
    assert {k: env[k] for k in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "NCCL_SOCKET_IFNAME")} == \
        {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_SOCKET_IFNAME": "eth0"}
    assert env["NCCL_DEBUG"] == "INFO"
    script = launcher["command"][2]
    for name in (*env, "PATH", "LD_LIBRARY_PATH"):             # ranks start through sshd: each must be forwarded
        assert f"-x {name} " in script
    workers = worker_pod(job)
    # The pool, by the label its Kueue flavor selects (so Kueue admits the job only where this pool's nodes are).
    assert workers["nodeSelector"] == {"gpu-cloud.io/pool": "train"}
    tolerations = {(t["key"], t["value"], t["effect"]) for t in workers["tolerations"]}
    assert {(t.key, t.value, t.effect) for t in node_taints(p)} <= tolerations
    assert {("example.com/batch", "true", "NoSchedule"), ("nvidia.com/gpu", "true", "NoSchedule")} <= tolerations
    [worker] = workers["containers"]
    assert "IPC_LOCK" in worker["securityContext"]["capabilities"]["add"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in workers["volumes"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training-queue"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 0
    run_policy = job["spec"]["runPolicy"]
    assert run_policy["cleanPodPolicy"] == "Running" and run_policy["ttlSecondsAfterFinished"] > 0
    assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert judge_container["name"] == "judge" and env_of(judge_container)["MIN_BUS_GBPS"] == "438.381"   # 0.9 x 487.09


def test_judge_container_is_locked_down_and_knows_its_pod():
    job = acceptance.mpijob_manifest(pool("p5.48xlarge"), CATALOG, **KWARGS)
    spec = launcher_pod(job)
    judge_container = spec["containers"][1]
    security = judge_container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0 and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    env = env_of(judge_container)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert judge_container["image"] == acceptance.JUDGE_IMAGE
    # Only the judge holds an API token; the NCCL side runs without one.
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "nccl-judge"
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["results", "tmp"]     # tmp: Open MPI's
    assert {"name": "judge-token", "mountPath": acceptance.SA_DIR, "readOnly": True} in judge_container["volumeMounts"]
    assert {"name": "judge", "configMap": {"name": "nccl-judge", "defaultMode": 0o444}} in spec["volumes"]


@pytest.mark.parametrize("p,message", [
    (pool("p5.48xlarge", efa=False), "pool train: EFA is off"),
    (pool("p5.48xlarge", max_nodes=1), "pool train: 2 worker(s) do not fit its maxNodes 1"),
    (pool("p5en.48xlarge"), "pool train: p5en.48xlarge has no NCCL acrossNodes minimum"),
    (pool("p6-b200.48xlarge"), "pool train: p6-b200.48xlarge has no NCCL acrossNodes minimum"),
    (pool("g6e.48xlarge"), "pool train: g6e.48xlarge has no NCCL acrossNodes minimum"),
    (pool("p5.48xlarge", sharing={"mode": "mig", "migProfile": "1g.10gb"}), "pool train: GPU sharing mode 'mig'"),
])
def test_mpijob_refusals(p, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        acceptance.mpijob_manifest(p, CATALOG, **KWARGS)


def mpi_operator_rules(job, generated="abcde"):
    """What mpi-operator v0.8.0 validates after defaulting (pkg/apis/kubeflow/validation/validation.go)."""
    spec, name = job["spec"], job["metadata"]["generateName"] + generated
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", f"{name}-worker-{workers - 1}")     # DNS-1035 label
    assert spec["runPolicy"]["cleanPodPolicy"] in {"None", "Running", "All"}
    for replica in spec["mpiReplicaSpecs"].values():
        assert replica["restartPolicy"] in {"Never", "OnFailure"} and replica["replicas"] >= 1
        assert replica["template"]["spec"]["containers"]
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1


@pytest.mark.parametrize("name", ["train", "a" * 63, "p5-" + "x" * 55 + "-pool"])
def test_mpijob_passes_the_operators_own_checks_for_any_pool_name(name):
    job = acceptance.mpijob_manifest(pool("p5.48xlarge", name=name), CATALOG, **KWARGS)
    mpi_operator_rules(job)


def test_long_pool_names_stay_distinct():
    a = acceptance.mpijob_manifest(pool("p5.48xlarge", name="x" * 60 + "-a"), CATALOG, **KWARGS)
    b = acceptance.mpijob_manifest(pool("p5.48xlarge", name="x" * 60 + "-b"), CATALOG, **KWARGS)
    assert a["metadata"]["generateName"] != b["metadata"]["generateName"]


def test_mpijob_matches_the_mpi_operator_crd():
    schema = crd_schema("kubeflow.org/mpijobs")
    job = acceptance.mpijob_manifest(pool("p5.48xlarge", taints=[BATCH_TAINT]), CATALOG, **KWARGS)
    validate_against_crd(job, schema)
    misspelt = {**job, "spec": {**job["spec"], "slotPerWorker": 8}}
    with pytest.raises(AssertionError, match="'slotPerWorker' was unexpected"):
        validate_against_crd(misspelt, schema)


def as_run(*objects):
    """Objects in the shape tests.conftest.validate_kubernetes reads from a ProgramRun."""
    def token(o):
        api = o["apiVersion"] if "/" in o["apiVersion"] else f"core/{o['apiVersion']}"
        return f"kubernetes:{api}:{o['kind']}"
    return SimpleNamespace(resources=[SimpleNamespace(type=token(o), inputs=o) for o in objects])


def as_pod(template, name):
    metadata = {"name": name, "namespace": "training", **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def test_mpijob_pod_templates_are_valid_pods():
    job = acceptance.mpijob_manifest(pool("p5.48xlarge", taints=[BATCH_TAINT]), CATALOG, **KWARGS)
    replicas = job["spec"]["mpiReplicaSpecs"]
    pods = [as_pod(replicas[kind]["template"], kind.lower()) for kind in ("Launcher", "Worker")]
    configmap = acceptance.judge_configmap_manifest("nccl-judge", "training")
    assert validate_kubernetes(as_run(*pods, configmap), "1.35") == 3


# --- the NVLink CronJob ---------------------------------------------------------------------------------------
def cronjob(p, **kwargs):
    return acceptance.nvlink_cronjob_manifest(p, CATALOG, **{**KWARGS, "schedule": "0 3 * * 0", "suspend": False, **kwargs})


@pytest.mark.parametrize("instance_type,minimum", [("p4d.24xlarge", "228"), ("p4de.24xlarge", "228"),
                                                    ("p5.48xlarge", "460"), ("p5e.48xlarge", "431"),
                                                    ("p5en.48xlarge", "431")])
def test_cronjob_runs_one_node_against_the_within_node_minimum(instance_type, minimum):
    p = pool(instance_type, efa=False, max_nodes=1, taints=[BATCH_TAINT])
    job = cronjob(p)
    spec = job["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["schedule"] == "0 3 * * 0" and spec["suspend"] is False
    assert spec["jobTemplate"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training-queue"
    job_spec = spec["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 0 and "parallelism" not in job_spec      # one pod, no retries
    pod = job_spec["template"]["spec"]
    nccl, judge_container = pod["containers"]
    assert nccl["resources"]["limits"] == {"nvidia.com/gpu": 8, "memory": "32Gi"}  # every GPU, no EFA
    assert "/opt/nccl-tests/build/all_reduce_perf -b 8 -e 16G -f 2 -c 1 -n 100 -g 8" in nccl["command"][2]
    assert "mpirun" not in nccl["command"][2]
    assert env_of(judge_container)["MIN_BUS_GBPS"] == minimum and env_of(judge_container)["SCOPE"] == "within-node"
    assert pod["nodeSelector"]["gpu-cloud.io/pool"] == "train"
    tolerations = {(t["key"], t["value"], t["effect"]) for t in pod["tolerations"]}
    assert {(t.key, t.value, t.effect) for t in node_taints(p)} <= tolerations
    assert {"name": "shm", "mountPath": "/dev/shm"} in nccl["volumeMounts"]
    security = judge_container["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]


@pytest.mark.parametrize("p,message", [
    (pool("g6e.48xlarge"), "pool train: L40S GPUs have no NVLink"),
    (pool("p6-b200.48xlarge"), "pool train: p6-b200.48xlarge has no NCCL withinNode minimum"),
    (pool("p5.48xlarge", sharing={"mode": "time-slicing", "replicas": 2}), "GPU sharing mode 'time-slicing'"),
    (pool("p5.48xlarge", max_nodes=0), "maxNodes 0"),
])
def test_cronjob_refusals(p, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cronjob(p)


@pytest.mark.parametrize("name", ["train", "a" * 63])
def test_cronjob_is_a_valid_kubernetes_object(name):
    job = cronjob(pool("p5.48xlarge", name=name, taints=[BATCH_TAINT]), suspend=True)
    assert len(job["metadata"]["name"]) <= 52                                    # Job names add 11 characters
    assert validate_kubernetes(as_run(job), "1.35") == 1


# --- the across-node test on a schedule ---------------------------------------------------------------------------
def across_cronjob(p, **kwargs):
    return acceptance.across_node_cronjob_manifest(p, CATALOG, **{
        **KWARGS, "schedule": "0 6 * * 0", "scheduler_account": "nccl-scheduler", **kwargs})


@pytest.mark.parametrize("p,scheduled", [
    (pool("p5.48xlarge", min_nodes=1), False),                       # keeps one node: a run would scale it up
    (pool("p5.48xlarge", min_nodes=2), True),
    (pool("p5.48xlarge", min_nodes=4, max_nodes=4), True),
    (pool("p4d.24xlarge", min_nodes=2), True),
    (pool("p5.48xlarge", min_nodes=2, efa=False), False),            # no EFA: nothing across nodes to test
    (pool("p5en.48xlarge", min_nodes=2), False),                      # no published two-node figure
    (pool("p5.48xlarge", min_nodes=2, sharing={"mode": "mig", "migProfile": "1g.10gb"}), False),
    (pool("p5.48xlarge", min_nodes=2, workload="inference"), False),  # not the training queue's pool
])
def test_the_across_node_check_runs_on_queue_pools_that_keep_two_nodes(p, scheduled):
    assert acceptance.across_node_check_pools([p], CATALOG) == ((p,) if scheduled else ())


def test_the_across_node_cronjob_starts_the_mpijob_python_m_jobs_prints():
    p = pool("p5.48xlarge", min_nodes=2, taints=[BATCH_TAINT])
    cron = across_cronjob(p)
    spec = cron["spec"]
    assert (spec["schedule"], spec["timeZone"], spec["concurrencyPolicy"]) == ("0 6 * * 0", "Etc/UTC", "Forbid")
    assert "suspend" not in spec                                     # only pools that keep two nodes get one
    job = spec["jobTemplate"]
    # Kueue leaves the starter alone (no queue label); the MPIJob it creates carries the label and waits for quota.
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert job["spec"]["backoffLimit"] == 1 and job["spec"]["activeDeadlineSeconds"] == acceptance.SUBMIT_DEADLINE_S
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nccl-scheduler"
    # On a node of the pool it tests, as the MPIJob's workers: never on the system nodes, whose taint a pod in a team
    # namespace may not tolerate (decisions/platform/tenancy.py).
    assert pod["nodeSelector"] == {"gpu-cloud.io/pool": "train"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "example.com/batch", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert not tolerates(pod["tolerations"], SYSTEM_NODE_TAINT)
    assert "affinity" not in pod
    # Never a GPU node for it: cluster-autoscaler ignores its pod for 600 s, past the Job's 300 s deadline.
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/pod-scale-up-delay": "600s"}
    assert acceptance.SUBMIT_DEADLINE_S == 300
    [start] = pod["containers"]
    # Small: it fits beside a worker (16 CPUs, 64 GiB) on a node the pool keeps; no GPU, so Kueue gives it no flavor.
    assert start["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
    assert start["image"] == acceptance.JUDGE_IMAGE
    assert start["command"] == ["python3", "/opt/judge/nccl_submit.py"]
    assert {"name": "judge", "configMap": {"name": "nccl-judge", "defaultMode": 0o444}} in pod["volumes"]
    mpijob = json.loads(env_of(start)["MPIJOB"])
    assert mpijob == acceptance.mpijob_manifest(p, CATALOG, **KWARGS)
    workers = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert (pod["nodeSelector"], pod["tolerations"]) == (workers["nodeSelector"], workers["tolerations"])
    assert mpijob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training-queue"
    security = start["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"] and security["capabilities"] == {"drop": ["ALL"]}
    # The pod as a whole too (Checkov's CKV_K8S_29 and CKV_K8S_31 read the pod's context): nobody, RuntimeDefault.
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                      "seccompProfile": {"type": "RuntimeDefault"}}


def test_the_across_node_cronjob_refuses_what_the_mpijob_refuses():
    with pytest.raises(ValueError, match="pool train: p5en.48xlarge has no NCCL acrossNodes minimum"):
        across_cronjob(pool("p5en.48xlarge", min_nodes=2))


@pytest.mark.parametrize("name", ["train", "a" * 63])
def test_the_across_node_cronjob_is_a_valid_kubernetes_object(name):
    cron = across_cronjob(pool("p5.48xlarge", name=name, min_nodes=2))
    assert len(cron["metadata"]["name"]) <= 52 and cron["metadata"]["name"].startswith("nccl-efa-start-")
    assert validate_kubernetes(as_run(cron), "1.35") == 1


# --- jobs/nccl_submit.py end to end, against a stand-in for the API server's MPIJob endpoints ----------------------
MPIJOBS = "/apis/kubeflow.org/v2beta1/namespaces/training/mpijobs"


def mpijob_status(name, *conditions, created="2026-12-04T10:00:00Z"):
    return {"metadata": {"name": name, "creationTimestamp": created},
            "status": {"conditions": [{"type": c, "status": s} for c, s in conditions]}}


class FakeMpiJobApi:
    """Lists `existing` for GET and creates for POST, as the API server answers with a token; `refuse`: every
    request gets that HTTP status with a Status message."""

    def __init__(self, existing=(), refuse=None):
        self.requests, outer = [], self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.requests.append(("GET", self.path, self.headers["Authorization"], None))
                if refuse:
                    return self.answer(refuse, {"kind": "Status", "message": 'mpijobs.kubeflow.org is forbidden'})
                self.answer(200, {"kind": "MPIJobList", "items": list(existing)})

            def do_POST(self):  # noqa: N802
                body = self.json_body()
                outer.requests.append(("POST", self.path, self.headers["Authorization"], body))
                self.answer(201, {**body, "metadata": {**body["metadata"], "name": "nccl-efa-train-x7k2q"}})

        self.server = LoopbackServer(Handler)
        self.url = self.server.url

    def close(self):
        self.server.close()


def run_submit(tmp_path, api_url, mpijob, **env):
    (tmp_path / "sa").mkdir(exist_ok=True)
    (tmp_path / "sa" / "token").write_text("tok\n")
    env = {"PATH": os.environ["PATH"], "MPIJOB": json.dumps(mpijob), "KUBE_API_URL": api_url,
           "SERVICEACCOUNT_DIR": str(tmp_path / "sa"), **env}
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "nccl_submit.py")], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("existing,creates", [
    ((), True),
    ((mpijob_status("nccl-efa-train-aaaaa", ("Created", "True"), ("Succeeded", "True")),
      mpijob_status("nccl-efa-train-bbbbb", ("Failed", "True"))), True),
    ((mpijob_status("nccl-efa-train-aaaaa", ("Created", "True"), ("Succeeded", "True")),
      mpijob_status("nccl-efa-train-ccccc", ("Created", "True"), ("Suspended", "True"))), False),   # still queued
    ((mpijob_status("nccl-efa-train-ddddd", ("Running", "True"), ("Succeeded", "False")),), False),
])
def test_submit_starts_a_run_unless_the_pools_last_one_is_unfinished(tmp_path, existing, creates):
    mpijob = acceptance.mpijob_manifest(pool("p5.48xlarge", min_nodes=2), CATALOG, **KWARGS)
    api = FakeMpiJobApi(existing)
    try:
        done = run_submit(tmp_path, api.url, mpijob)
    finally:
        api.close()
    assert done.returncode == 0, done.stderr
    listing = api.requests[0]
    assert listing[:3] == ("GET", MPIJOBS + "?labelSelector=app.kubernetes.io%2Fcomponent%3Dacross-nodes%2C"
                           "app.kubernetes.io%2Fname%3Dnccl-acceptance%2Cgpu-cloud.io%2Fpool%3Dtrain%2C"
                           "kueue.x-k8s.io%2Fqueue-name%3Dtraining-queue", "Bearer tok")
    posts = [r for r in api.requests if r[0] == "POST"]
    if creates:
        assert [(path, body) for _, path, _, body in posts] == [(MPIJOBS, mpijob)]
        assert "nccl-submit: created MPIJob training/nccl-efa-train-x7k2q" in done.stdout
    else:
        assert posts == [] and "nccl-submit: skipped: nccl-efa-train-" in done.stdout


def _ago(seconds):
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("age_s, stuck", [(acceptance.RUN_STALE_S - 600, False), (acceptance.RUN_STALE_S + 600, True)])
def test_a_run_unfinished_for_a_day_fails_the_starter_so_that_someone_sees_it(tmp_path, age_s, stuck):
    """A run that never got its workers never times out (its deadline counts from the launcher) and would skip every
    later slot in silence: past RUN_STALE_S the starter's Job fails instead, naming the run."""
    mpijob = acceptance.mpijob_manifest(pool("p5.48xlarge", min_nodes=2), CATALOG, **KWARGS)
    api = FakeMpiJobApi([mpijob_status("nccl-efa-train-eeeee", ("Created", "True"), ("Suspended", "True"),
                                       created=_ago(age_s))])
    try:
        done = run_submit(tmp_path, api.url, mpijob, STALE_AFTER_S=str(acceptance.RUN_STALE_S))
    finally:
        api.close()
    assert [r for r in api.requests if r[0] == "POST"] == []
    if stuck:
        assert done.returncode == 1
        assert ("nccl-submit: nccl-efa-train-eeeee unfinished for more than 24 h blocks every later run; see why with "
                "`kubectl -n training describe mpijob nccl-efa-train-eeeee`, then delete it") in done.stderr
    else:
        assert done.returncode == 0 and "skipped: nccl-efa-train-eeeee has not finished" in done.stdout


def test_the_starter_is_told_when_a_run_is_stuck():
    cron = across_cronjob(pool("p5.48xlarge", min_nodes=2))
    [start] = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert env_of(start)["STALE_AFTER_S"] == "86400"


def test_submit_fails_with_the_api_servers_reason(tmp_path):
    api = FakeMpiJobApi(refuse=403)
    try:
        done = run_submit(tmp_path, api.url, acceptance.mpijob_manifest(pool("p5.48xlarge"), CATALOG, **KWARGS))
    finally:
        api.close()
    assert done.returncode == 1 and "nccl-submit: HTTP 403: mpijobs.kubeflow.org is forbidden" in done.stderr


def test_submit_fails_when_the_api_server_does_not_answer(tmp_path):
    done = run_submit(tmp_path, "http://127.0.0.1:9", acceptance.mpijob_manifest(pool("p5.48xlarge"), CATALOG, **KWARGS))
    assert done.returncode == 1 and "nccl-submit: no answer from the API server" in done.stderr


def test_submit_imports_only_the_standard_library():
    tree = ast.parse(acceptance.SUBMIT_SCRIPT.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


# --- embedded shell and the image's driver floor ----------------------------------------------------------------
def test_embedded_scripts_pass_shellcheck(tmp_path):
    shellcheck = require_tool("shellcheck")
    job = acceptance.mpijob_manifest(pool("p5.48xlarge"), CATALOG, **KWARGS)
    nvlink = cronjob(pool("p5.48xlarge"))["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    scripts = {"launcher": launcher_pod(job)["containers"][0]["command"], "nvlink": nvlink["containers"][0]["command"]}
    for name, command in scripts.items():
        assert command[:2] == ["bash", "-c"]
        path = tmp_path / f"{name}.sh"
        path.write_text("#!/bin/bash\n" + command[2])
        checked = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout


def test_the_script_writes_the_marker_with_the_exit_code(tmp_path):
    script = acceptance._run_script(["sh", "-c", "echo '# row'; exit 3"])
    script = script.replace(acceptance.RESULTS_DIR, str(tmp_path))
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.returncode == 3 and "# row" in done.stdout
    assert (tmp_path / "exit_code").read_text() == "3\n" and (tmp_path / "all_reduce_perf.txt").read_text() == "# row\n"


def test_every_pinned_ami_driver_runs_the_cuda_12_8_image():
    amis = load_amis()
    drivers = {image.nvidia_driver for release in amis.releases.values() for image in release.values()}
    assert drivers and all(int(d.split(".")[0]) >= acceptance.NCCL_TESTS_MIN_DRIVER_BRANCH for d in drivers)


def test_judge_configmap_carries_the_scripts():
    configmap = acceptance.judge_configmap_manifest("nccl-judge", "training")
    assert configmap["data"] == {name: (ROOT / "jobs" / name).read_text(encoding="utf-8")
                                 for name in ("nccl_judge.py", "nccl_submit.py")}


# --- tests/crds.py itself: a CRD directory, Helm lines, the schema keywords, and the skip ------------------------
HELM_CRD = """{{- /*
Licensed under the Apache License
*/ -}}

apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  labels:
  {{- include "kueue.labels" . | nindent 4 }}
  name: widgets.example.com
spec:
  conversion:
    webhook:
      clientConfig:
        service:
          name: '{{ include "kueue.fullname" . }}-webhook-service'
  group: example.com
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
          size:
            x-kubernetes-int-or-string: true
          note:
            type: string
            nullable: true
"""


def test_crd_loader_and_validator(tmp_path, monkeypatch):
    from tests import crds
    (tmp_path / "widgets.yaml").write_text(HELM_CRD)
    monkeypatch.setenv("GPU_CLOUD_CRD_DIR", str(tmp_path))
    schema = crds.crd_schema("example.com/widgets")
    validate_against_crd({"spec": {"anything": [1]}, "size": "10Gi", "note": None}, schema)
    validate_against_crd({"size": 3}, schema)
    for bad, error in (({"sise": 1}, "'sise' was unexpected"), ({"size": 1.5}, "size: 1.5 is not valid")):
        with pytest.raises(AssertionError, match=re.escape(error)):
            validate_against_crd(bad, schema)
    assert schema.origin == "dir"
    # Without the directory or a mirror (as on CI): a pinned CRD comes from the record, any other is missing.
    monkeypatch.setenv("GPU_CLOUD_CRD_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(crds.upstream_records, "MIRROR", tmp_path / "no-mirror")
    recorded = crds.crd_schema("kubeflow.org/mpijobs")
    assert (recorded.origin, recorded.crd, recorded.version) == ("record", "mpijobs.kubeflow.org", "v2beta1")
    with pytest.raises(AssertionError, match="'slotPerWorker' was unexpected(.|\n)*upstream_records.py"):
        validate_against_crd({"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                              "spec": {"slotPerWorker": 8, "mpiReplicaSpecs": {}}}, recorded)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="GPU_CLOUD_CRD_DIR"):
        crds.crd_schema("example.com/gadgets")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="not in tests/upstream/crd-schemas.json"):
        crds.crd_schema("example.com/gadgets")
