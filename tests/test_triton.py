"""decisions/serving/triton.py: the server's arguments, the models' copy (its script run with the real AWS CLI against
moto's S3), readiness (its commands run against a stand-in Triton), drain timings, a pod's share of its node, the
queue-time metric the autoscaler scales on, and config.pbtxt with dynamic batching, parsed by Triton's own model
configuration schema (model_config.proto, as generated in tritonclient of the same release as the server image)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from decisions.catalog import charts
from decisions.catalog.catalog import load_catalog
from decisions.nodes import drain
from decisions.serving import triton
from tests.chart_values import assert_values_confirmed
from tests.conftest import ROOT, missing, require_tool
from tests.drain_walk import FOREVER, Client, PodTimings, walk
from tests.loopback import LoopbackServer, QuietHandler, moto_server

CATALOG = load_catalog()


def model_config_schema():
    """inference.ModelConfig from tritonclient's generated model_config_pb2 (loaded on its own: the package's grpc
    module would need grpcio, which the tests do not)."""
    try:
        import tritonclient
    except ImportError:
        missing("tritonclient is not installed (requirements-dev.txt): Triton's model configuration schema")
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(text: str):
    from google.protobuf import text_format
    schema = model_config_schema()
    return text_format.Parse(text, schema.ModelConfig()), schema


# --- config.pbtxt ------------------------------------------------------------------------------------------------
def test_the_client_schema_is_the_servers_release():
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "requirements-dev.txt").read_text(), re.M))
    assert pins["tritonclient"] == triton.RELEASE
    # 26.07 is 2.71.0 (server build.py); the tag stays for readers, the digest is what is pulled
    # (decisions/platform/images.yaml)
    assert triton.IMAGE.startswith("nvcr.io/nvidia/tritonserver:26.07-py3@sha256:")


def test_a_dynamic_batching_config_parses_with_tritons_schema_and_keeps_every_value():
    text = triton.model_config_pbtxt(
        "resnet50", backend="onnxruntime", max_batch_size=32, preferred_batch_sizes=[16, 8, 16],
        max_queue_delay_us=500, instances_per_gpu=2, gpus=[0],
        inputs=[{"name": "input", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
        outputs=[{"name": "probs", "data_type": "TYPE_FP32", "dims": [1000]}])
    config, schema = parse(text)
    assert (config.name, config.backend, config.max_batch_size) == ("resnet50", "onnxruntime", 32)
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    (group,) = config.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (schema.ModelInstanceGroup.KIND_GPU, 2, [0])
    (tensor_in,), (tensor_out,) = config.input, config.output
    assert (tensor_in.name, tensor_in.data_type, list(tensor_in.dims)) == ("input", schema.TYPE_FP32, [3, 224, 224])
    assert (tensor_out.name, list(tensor_out.dims)) == ("probs", [1000])


def test_a_name_with_quotes_survives_the_text_format():
    config, _ = parse(triton.model_config_pbtxt('my "model"', backend="python", max_batch_size=1,
                                                preferred_batch_sizes=[1], max_queue_delay_us=0))
    assert config.name == 'my "model"'


@pytest.mark.parametrize("kwargs, words", [
    ({"max_batch_size": 0}, "max_batch_size must be at least 1"),
    ({"preferred_batch_sizes": [64]}, "between 1 and max_batch_size 32"),      # one above the maximum
    ({"preferred_batch_sizes": []}, "between 1 and max_batch_size"),
    ({"max_queue_delay_us": -1}, "max_queue_delay_us"),
    ({"instances_per_gpu": 0}, "instances_per_gpu"),
])
def test_configs_triton_would_refuse_are_refused_here(kwargs, words):
    args = {"backend": "onnxruntime", "max_batch_size": 32, "preferred_batch_sizes": [8], "max_queue_delay_us": 100,
            **kwargs}
    with pytest.raises(ValueError, match=words):
        triton.model_config_pbtxt("m", **args)


def test_a_preferred_size_at_the_maximum_is_accepted():
    config, _ = parse(triton.model_config_pbtxt("m", backend="onnxruntime", max_batch_size=32,
                                                preferred_batch_sizes=[32], max_queue_delay_us=100))
    assert list(config.dynamic_batching.preferred_batch_size) == [32]


# --- the server --------------------------------------------------------------------------------------------------
def test_the_server_serves_the_local_copy_polls_for_new_models_and_exposes_p99():
    args = triton.server_args()
    assert args[0] == f"--model-repository={triton.MODELS_MOUNT}/current"
    assert {"--model-control-mode=poll", "--repository-poll-secs=60"} <= set(args)
    # One model that fails to load must not take the server out of service (nor, replicated, the DR peer's).
    assert {"--strict-readiness=false", "--exit-on-error=false"} <= set(args)
    assert args[-2:] == ["--metrics-config", "summary_latencies=true"]       # the p99 alert reads the summary


def test_the_sync_containers_copy_an_s3_repository_only():
    assert triton.sync_env("s3://acme-models/triton", "eu-west-1")["MODEL_SOURCE"] == "s3://acme-models/triton"
    with pytest.raises(ValueError, match="not an s3://bucket/prefix URI"):
        triton.sync_env("/models", "eu-west-1")
    with pytest.raises(ValueError, match="allowed once, loop"):
        triton.sync_command("twice")


def test_an_outside_repository_names_its_bucket():
    assert triton.repository_bucket_arn("s3://acme-models/triton/v2", "aws") == "arn:aws:s3:::acme-models"
    with pytest.raises(ValueError):
        triton.repository_bucket_arn("s3:///triton", "aws")


@pytest.mark.parametrize("itype, offered, expected", [
    # a whole GPU of eight: three quarters of an eighth of the node
    ("p5.48xlarge", {"nvidia.com/gpu": 8}, {"nvidia.com/gpu": "1", "cpu": "18", "memory": "192Gi"}),
    # a time-slice: 4 GPUs x 2 replicas = 8 slots of 48 vCPU and 384 GiB
    ("g6e.12xlarge", {"nvidia.com/gpu": 8}, {"nvidia.com/gpu": "1", "cpu": "4", "memory": "36Gi"}),
    # a MIG slice asks for the slice's own resource
    ("p4de.24xlarge", {"nvidia.com/mig-1g.10gb": 56}, {"nvidia.com/mig-1g.10gb": "1", "cpu": "1", "memory": "15Gi"}),
])
def test_a_pod_takes_one_gpu_slot_and_its_share_of_the_node(itype, offered, expected):
    assert triton.pod_resources(CATALOG.instance_types[itype], offered) == expected


def test_a_pool_with_two_kinds_of_gpu_resource_is_refused():
    with pytest.raises(ValueError, match="one kind of GPU resource"):
        triton.pod_resources(CATALOG.instance_types["p5.48xlarge"], {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 7})


# --- the autoscaling metric ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ms, quantity", [(10, "10"), (2.5, "2500m"), (0.1, "100m"), (1000, "1000")])
def test_the_target_is_a_kubernetes_quantity_of_milliseconds(ms, quantity):
    assert triton.hpa_target(ms) == quantity


def test_a_target_of_zero_is_refused():
    with pytest.raises(ValueError):
        triton.hpa_target(0)


def _values():
    return triton.prometheus_adapter_values("http://kube-prometheus-stack-prometheus.monitoring.svc", 9090,
                                            {"gpu-cloud.io/node-role": "system"})


def test_every_adapter_value_is_in_the_pinned_chart():
    assert_values_confirmed(_values(), charts.chart(charts.PROMETHEUS_ADAPTER), triton.PROMETHEUS_ADAPTER_VALUE_PATHS)


def test_the_adapter_serves_only_the_metric_the_autoscaler_asks_for_per_pod():
    rules = _values()["rules"]
    assert rules["default"] is False
    (rule,) = rules["custom"]
    assert rule["name"]["as"] == triton.QUEUE_METRIC
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}


def test_the_queue_time_query_is_milliseconds_per_request(tmp_path):
    """The adapter's query with its template filled in for one pod, as a recording rule under promtool: 20,000 µs
    queued per second over 2 requests per second is 10 ms per request; no requests is 0, not a division by zero."""
    promtool = require_tool("promtool")
    query = (triton.queue_time_query().replace("<<.LabelMatchers>>", 'namespace="inference"')
             .replace("<<.GroupBy>>", "namespace,pod"))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [
        {"record": "queue_ms", "expr": query}]}]}))
    series = lambda metric, pod, values: {"series": f'{metric}{{namespace="inference",pod="{pod}"}}',  # noqa: E731
                                          "values": values}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [
            series("nv_inference_queue_duration_us", "triton-a", "0+1200000x10"),      # 20,000 µs/s
            series("nv_inference_request_success", "triton-a", "0+120x10"),            # 2 requests/s
            series("nv_inference_queue_duration_us", "triton-b", "0x10"),
            series("nv_inference_request_success", "triton-b", "0x10")],
            "promql_expr_test": [{"expr": "queue_ms", "eval_time": "5m", "exp_samples": [
                {"labels": 'queue_ms{namespace="inference",pod="triton-a"}', "value": 10},
                {"labels": 'queue_ms{namespace="inference",pod="triton-b"}', "value": 0}]}]}]}))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the models' copy ----------------------------------------------------------------------------------------------
# The script runs against the real AWS CLI (.venv/bin/aws, awscli 1.46.3: the same s3 sync code as the image's 2.36.7,
# awscli/customizations/s3/) and moto's S3 in server mode on 127.0.0.1, so what the CLI downloads, skips and deletes is
# the CLI's own decision. A test sets an object's LastModified as S3 would have stamped it at `when`.
BUCKET_PREFIX = "triton"


@pytest.fixture(scope="module")
def moto_s3():
    with moto_server() as endpoint:
        yield endpoint


class Volume:
    """The pod's models volume at `root`, the script run against it with the real CLI, and a bucket in moto."""

    def __init__(self, tmp_path: Path, endpoint: str):
        import boto3

        self.root, self.bucket = tmp_path / "models", f"models-{uuid.uuid4().hex[:12]}"
        self.root.mkdir()
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        self.s3.create_bucket(Bucket=self.bucket)
        self.env = {"PATH": f"{Path(require_tool('aws')).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
                    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint,
                    "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
                    **triton.sync_env(f"s3://{self.bucket}/{BUCKET_PREFIX}", "us-east-1")}
        self.script = triton.MODEL_SYNC_SCRIPT.replace(triton.MODELS_MOUNT, str(self.root))

    def publish(self, key: str, body: str, when: float) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        self.s3.put_object(Bucket=self.bucket, Key=f"{BUCKET_PREFIX}/{key}", Body=body.encode())
        stored = s3_backends[DEFAULT_ACCOUNT_ID]["global"].get_object(self.bucket, f"{BUCKET_PREFIX}/{key}")
        stored.last_modified = datetime.fromtimestamp(when, timezone.utc).replace(tzinfo=None)   # moto keeps UTC naive

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=f"{BUCKET_PREFIX}/{key}")

    def lose_the_bucket(self) -> None:
        """The repository becomes unreadable: the CLI's listing fails (NoSuchBucket) as it would on AccessDenied."""
        listed = self.s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        for item in listed:
            self.s3.delete_object(Bucket=self.bucket, Key=item["Key"])
        self.s3.delete_bucket(Bucket=self.bucket)

    def sync(self, mode: str = "once") -> subprocess.CompletedProcess:
        command = triton.sync_command(mode)
        command[2] = self.script
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)

    @property
    def served(self) -> Path:
        return self.root / os.readlink(self.root / "current")

    def generations(self):
        return sorted(p.name for p in self.root.glob("gen-*"))


@pytest.fixture
def volume(tmp_path, moto_s3):
    require_tool("bash")
    return Volume(tmp_path, moto_s3)


def test_the_first_copy_is_whole_and_stamped(volume):
    volume.publish("resnet50/config.pbtxt", "name: resnet50", 1000)
    volume.publish("resnet50/1/model.onnx", "weights-1", 1000)
    result = volume.sync()
    assert result.returncode == 0, result.stderr
    assert (volume.served / "resnet50" / "1" / "model.onnx").read_text() == "weights-1"
    assert abs(int((volume.root / ".synced-at").read_text()) - time.time()) < 60
    assert volume.generations() == [volume.served.name]


def test_an_empty_repository_gives_triton_an_empty_directory_to_start_on(volume):
    assert volume.sync().returncode == 0
    assert volume.served.is_dir() and list(volume.served.iterdir()) == []


def test_nothing_changed_means_nothing_swapped(volume):
    volume.publish("resnet50/config.pbtxt", "name: resnet50", 1000)
    volume.sync()
    served = volume.served
    assert volume.sync().returncode == 0
    assert volume.served == served and volume.generations() == [served.name]


def test_a_publish_swaps_in_a_whole_new_tree_and_leaves_the_served_one_as_it_was(volume):
    volume.publish("resnet50/config.pbtxt", "name: resnet50", 1000)
    volume.publish("resnet50/1/model.onnx", "weights-1", 1000)
    volume.publish("bert/config.pbtxt", "name: bert", 1000)
    volume.sync()
    before = volume.served
    bert_mtime = os.stat(before / "bert").st_mtime
    volume.publish("resnet50/1/model.onnx", "weights-2", 2000)
    assert volume.sync().returncode == 0
    after = volume.served
    assert after != before and volume.generations() == sorted([before.name, after.name])
    assert (after / "resnet50" / "1" / "model.onnx").read_text() == "weights-2"
    # The tree Triton was serving is untouched (it may still be loading from it) ...
    assert (before / "resnet50" / "1" / "model.onnx").read_text() == "weights-1"
    # ... an unchanged model costs no copy, and keeps its times, so Triton's poll does not reload it.
    assert os.stat(after / "bert" / "config.pbtxt").st_ino == os.stat(before / "bert" / "config.pbtxt").st_ino
    assert os.stat(after / "bert").st_mtime == bert_mtime
    # A third tree retires the first.
    volume.publish("bert/config.pbtxt", "name: bert\nmax_batch_size: 8", 3000)
    volume.sync()
    assert before.name not in volume.generations() and len(volume.generations()) == 2


def test_new_weights_of_the_same_size_and_a_rollback_over_the_same_key_reach_triton(volume):
    """Retrained weights of one architecture, or an old version copied back over the key, keep the byte size: the
    CLI must still fetch them (it would not without --exact-timestamps: a same-size download is skipped unless the
    local copy is newer than the object)."""
    volume.publish("resnet50/1/model.onnx", "weights-1", 1000)
    volume.sync()
    volume.publish("resnet50/1/model.onnx", "weights-2", 2000)
    assert volume.sync().returncode == 0
    assert (volume.served / "resnet50" / "1" / "model.onnx").read_text() == "weights-2"
    volume.publish("resnet50/1/model.onnx", "weights-1", 3000)      # the rollback
    assert volume.sync().returncode == 0
    assert (volume.served / "resnet50" / "1" / "model.onnx").read_text() == "weights-1"


def test_a_deleted_model_leaves_no_empty_directory_behind(volume):
    volume.publish("resnet50/1/model.onnx", "weights-1", 1000)
    volume.publish("bert/config.pbtxt", "name: bert", 1000)
    volume.sync()
    volume.delete("resnet50/1/model.onnx")
    assert volume.sync().returncode == 0
    assert sorted(p.name for p in volume.served.iterdir()) == ["bert"]


def test_a_failed_sync_keeps_the_last_good_copy_and_its_stamp(volume):
    volume.publish("resnet50/config.pbtxt", "name: resnet50", 1000)
    volume.sync()
    served, stamp = volume.served, (volume.root / ".synced-at").read_text()
    volume.publish("resnet50/config.pbtxt", "name: changed", 2000)
    volume.lose_the_bucket()
    result = volume.sync()
    assert result.returncode != 0 and "NoSuchBucket" in result.stderr
    assert volume.served == served and volume.generations() == [served.name]
    assert (volume.root / ".synced-at").read_text() == stamp


def test_an_unreadable_repository_fails_the_first_copy(volume):
    volume.lose_the_bucket()
    assert volume.sync().returncode != 0
    assert not (volume.root / "current").exists() and volume.generations() == []


def test_the_sidecar_syncs_at_once_and_stops_on_sigterm(volume):
    volume.publish("resnet50/config.pbtxt", "name: resnet50", 1000)
    command = triton.sync_command("loop")
    command[2] = volume.script
    sidecar = subprocess.Popen(command, env=volume.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while not (volume.root / ".synced-at").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (volume.root / "current").exists()
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(timeout=10) == 0          # not the kubelet's SIGKILL at the end of the grace
    finally:
        sidecar.kill()


def _run(command, **env):
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=30).returncode


@pytest.mark.parametrize("age_s, fresh", [(0, True), (triton.SYNC_STALE_S - 30, True),
                                          (triton.SYNC_STALE_S + 1, False)])
def test_the_sidecar_is_ready_while_its_last_good_sync_is_recent(tmp_path, age_s, fresh):
    require_tool("bash")
    stamp = tmp_path / ".synced-at"
    stamp.write_text(str(int(time.time()) - age_s))
    command = [part.replace(triton.SYNC_STAMP, str(stamp)) for part in triton.SYNC_FRESH_COMMAND]
    assert (_run(command) == 0) is fresh
    stamp.unlink()
    assert _run(command) != 0                          # never synced: not ready


class FakeTriton:
    """Triton's repository index on loopback: POST /v2/repository/index answers with the ready models only when
    asked for {"ready": true}, in Triton's compact JSON."""

    def __init__(self, models):
        self.models, self.requests = models, []
        owner = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests.append((self.path, json.loads(body)))
                listed = [m for m in owner.models if m["state"] == "READY" or not json.loads(body).get("ready")]
                self.answer(200, json.dumps(listed, separators=(",", ":")).encode(), "application/json")

        self.server = LoopbackServer(Handler)


@pytest.mark.parametrize("models, ready", [
    ([{"name": "resnet50", "version": "1", "state": "READY"}], True),
    ([{"name": "bert", "version": "1", "state": "UNAVAILABLE", "reason": "load failed"},
      {"name": "resnet50", "version": "1", "state": "READY"}], True),       # one broken model takes nothing out
    ([{"name": "bert", "version": "1", "state": "UNAVAILABLE", "reason": "load failed"}], False),
    ([], False),                                                             # an empty repository
])
def test_triton_is_ready_while_at_least_one_model_is(models, ready):
    require_tool("curl")
    fake = FakeTriton(models)
    try:
        command = [part.replace(f":{triton.HTTP_PORT}/", f":{fake.server.port}/")
                   for part in triton.MODEL_READY_COMMAND]
        assert (_run(command) == 0) is ready
        assert fake.requests == [("/v2/repository/index", {"ready": True})]
    finally:
        fake.server.close()


def test_a_server_that_does_not_answer_is_not_ready():
    require_tool("curl")
    fake = FakeTriton([])
    port = fake.server.port
    fake.server.close()
    command = [part.replace(f":{triton.HTTP_PORT}/", f":{port}/") for part in triton.MODEL_READY_COMMAND]
    assert _run(command) != 0


# --- drains: a rollout and a node drain walked through Triton's stop order (tests/drain_walk.py) ---------------------
HEALTH_CHECKS_S = max(triton.HEALTH_CHECK_TIMEOUTS_S.values())
# Requests back to back, (length, first one after the connection opens): short ones; the longest the contract
# allows, one starting just inside gRPC's longest connection age (33 s) and one just inside an HTTP client's (30 s),
# so that each protocol's connection lives as long as it can.
REQUESTS = [(0.7, 0), (10.99, 0), (triton.MAX_REQUEST_S, 2.99), (triton.MAX_REQUEST_S, 29.99)]
# How a pod's end is bounded: its own grace on a rollout or scale-in; on a node drain the drainer's limit too (NTH
# evicts with each pod's grace and gives up at its node grace; cluster-autoscaler at max-graceful-termination-sec).
ENDS = {"rollout": triton.TERMINATION_GRACE_S,
        "node drain (termination handler)": min(triton.TERMINATION_GRACE_S, drain.NTH_NODE_TERMINATION_GRACE_S),
        "scale-down drain (cluster-autoscaler)": min(triton.TERMINATION_GRACE_S, drain.WORKLOAD_MAX_GRACE_S)}


def shipped(kill_s: float = triton.TERMINATION_GRACE_S) -> PodTimings:
    """The pod as decisions/serving/triton.py makes it (tests/test_inference.py holds the pod spec to these)."""
    return PodTimings(prestop_s=triton.PRESTOP_PAUSE_S, exit_timeout_s=triton.EXIT_TIMEOUT_S, kill_s=kill_s,
                      deregistration_delay_s=triton.DEREGISTRATION_DELAY_S, terminate_connections=True,
                      grpc_max_age_s=triton.MAX_CONNECTION_AGE_S, grpc_age_grace_s=triton.MAX_REQUEST_S,
                      health_check_s=HEALTH_CHECKS_S, grpc_age_jitter=triton.GRPC_AGE_JITTER)


def within_contract(request_s: float, first_after_s: float = 0):
    """A gRPC client (Triton ends its connections) and an HTTP client that closes its own at the contract's age."""
    return [Client("grpc", "grpc", request_s, first_after_s=first_after_s),
            Client("http", "http", request_s, triton.MAX_CONNECTION_AGE_S, first_after_s)]


def causes(result):
    return {(loss.client, loss.by) for loss in result.lost}


@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("request_s, first_after_s", REQUESTS)
@pytest.mark.parametrize("deregistered_s", [0, triton.CONTROLLER_MARGIN_S])
def test_a_rollout_or_a_node_drain_loses_no_request_of_clients_within_the_contract(end, request_s, first_after_s,
                                                                                   deregistered_s):
    result = walk(shipped(ENDS[end]), within_contract(request_s, first_after_s), deregistered_s=deregistered_s,
                  new_flows_s=triton.NLB_DEREGISTRATION_S)
    assert result.lost == []
    # Every client connection had closed by SIGTERM: only the pod's own checks held Triton's HTTP stop, and Triton
    # exited by itself, its sidecars after it, before anything was killed.
    assert result.http_closed_s == result.sigterm_s + HEALTH_CHECKS_S
    assert result.exited_s + triton.SIDECAR_STOP_S <= ENDS[end] <= drain.WORKLOAD_MAX_GRACE_S


def test_the_timings_before_issue_40_lost_requests_in_flight_on_both_protocols():
    """A 130 s pause, a 30 s budget, a 160 s deregistration delay without connection termination, no connection age:
    an HTTP client's keep-alive connection holds Triton's HTTP stop for the whole budget, gRPC gets nothing left."""
    before = PodTimings(prestop_s=130, exit_timeout_s=30, kill_s=170, deregistration_delay_s=160,
                        terminate_connections=False, grpc_max_age_s=None, grpc_age_grace_s=FOREVER,
                        health_check_s=HEALTH_CHECKS_S)
    result = walk(before, [Client("grpc", "grpc", 6.5), Client("keep-alive", "http", 6.5)], deregistered_s=10,
                  new_flows_s=triton.NLB_DEREGISTRATION_S)
    assert result.http_closed_s == result.exited_s == result.sigterm_s + 30
    assert causes(result) == {("grpc", "Triton's exit"), ("keep-alive", "Triton's HTTP stop")}


def test_a_client_that_keeps_an_http_connection_open_loses_its_own_request_and_nobody_elses():
    """Outside the contract: the NLB closes the connection when the deregistration delay ends, with whatever is in
    flight on it, so it no longer holds Triton's stop and gRPC loses nothing."""
    result = walk(shipped(), [Client("grpc", "grpc", 10.99), Client("keep-alive", "http", 10.99)],
                  deregistered_s=triton.CONTROLLER_MARGIN_S, new_flows_s=triton.NLB_DEREGISTRATION_S)
    assert causes(result) == {("keep-alive", "the NLB's connection termination")}
    assert result.http_closed_s == result.sigterm_s + HEALTH_CHECKS_S


def test_the_contract_rests_on_the_nlbs_measured_two_minutes_of_new_flows():
    """The one figure AWS does not publish: a new flow one second later than measured outlives the deregistration
    delay and is closed with a request in flight."""
    clients = [Client("grpc", "grpc", triton.MAX_REQUEST_S, first_after_s=2.99)]
    kept = walk(shipped(), clients, deregistered_s=10, new_flows_s=triton.NLB_DEREGISTRATION_S)
    late = walk(shipped(), clients, deregistered_s=10, new_flows_s=triton.NLB_DEREGISTRATION_S + 1)
    assert kept.lost == [] and causes(late) == {("grpc", "the NLB's connection termination")}


def test_on_spot_the_node_goes_before_the_pause_ends_and_takes_what_is_in_flight():
    """EC2 takes a spot node 120 s after its warning and the pod learns of it about 30 s in (decisions/nodes/drain.py):
    the pod never gets SIGTERM. docs/inference.md says so."""
    result = walk(shipped(kill_s=drain.SPOT_CHECKPOINT_BUDGET_S), within_contract(6.5), deregistered_s=10,
                  new_flows_s=triton.NLB_DEREGISTRATION_S)
    assert result.sigterm_s is None and {by for _, by in causes(result)} == {"killed"}


def test_the_inference_page_states_the_timings_the_code_sets():
    page = " ".join((ROOT / "docs/inference.md").read_text().split())
    assert (f"the pod keeps serving for {triton.PRESTOP_PAUSE_S} s (a `preStop` sleep): "
            f"{triton.CONTROLLER_MARGIN_S} s for the controller, {triton.NLB_DEREGISTRATION_S} s of new flows, "
            f"{triton.CONNECTION_LIFETIME_S} s for the last of them to close") in page
    assert f"deregistration delay, {triton.DEREGISTRATION_DELAY_S} s, ends with it" in page
    assert f"Triton's {triton.EXIT_TIMEOUT_S} s budget covers them ({HEALTH_CHECKS_S} s" in page
    assert f"pod's grace, {triton.TERMINATION_GRACE_S} s" in page
    assert f"deregistration delay {triton.DEREGISTRATION_DELAY_S} s, after which it closes" in page
    assert (f"Triton ends each gRPC connection {triton.MAX_CONNECTION_AGE_S} s after it opens" in page
            and f"No request lasts longer than {triton.MAX_REQUEST_S} s" in page)
