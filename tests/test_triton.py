"""spec/triton.py: the server's arguments, a pod's share of its node, the queue-time metric the autoscaler scales
on, and config.pbtxt with dynamic batching, parsed by Triton's own model configuration schema (model_config.proto,
as generated in tritonclient of the same release as the server image)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from spec import charts, triton
from spec.catalog import load_catalog
from tests.chart_values import assert_values_confirmed
from tests.conftest import ROOT, missing, require_tool

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
    assert triton.IMAGE == "nvcr.io/nvidia/tritonserver:26.07-py3"    # 26.07 is 2.71.0 (server build.py)


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
def test_the_server_reads_s3_polls_for_new_models_and_exposes_p99():
    args = triton.server_args("s3://gpu-cloud-prod-123456789012-models/triton")
    assert args[0] == "--model-repository=s3://gpu-cloud-prod-123456789012-models/triton"
    assert {"--model-control-mode=poll", "--repository-poll-secs=60"} <= set(args)
    # One model that fails to load must not take the server out of service (nor, replicated, the DR peer's).
    assert {"--strict-readiness=false", "--exit-on-error=false"} <= set(args)
    assert args[-2:] == ["--metrics-config", "summary_latencies=true"]       # the p99 alert reads the summary
    with pytest.raises(ValueError, match="not an s3:// URI"):
        triton.server_args("/models")


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
