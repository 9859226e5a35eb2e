"""Triton Inference Server as plain decisions: the server and its pod, the queue-time metric it scales on, and a
model's config.pbtxt with dynamic batching. Pure: no Pulumi (components/inference.py builds it).

Facts (triton-inference-server/server tag v2.71.0, 819ee3777, 2026-07-24):
- build.py DEFAULT_TRITON_VERSION_MAP: release 2.71.0 is NGC container 26.07, so the image is
  nvcr.io/nvidia/tritonserver:26.07-py3; build.py also creates the user triton-server with uid and gid 1000 in the
  image, which the pod runs as.
- docs/user_guide/model_repository.md: `--model-repository=s3://bucket/path`; the region from AWS_DEFAULT_REGION;
  models are copied to a temporary directory (TRITON_AWS_MOUNT_DIRECTORY, default under /tmp).
- docs/user_guide/metrics.md: metrics on port 8002; nv_inference_queue_duration_us and nv_inference_request_success
  are cumulative counters per model; summaries (p99) need `--metrics-config summary_latencies=true`.
- docs/protocol (KServe v2): /v2/health/ready and /v2/health/live; /v2/models/<name>/ready per model.
- docs/customization_guide/deploy.md: `--strict-readiness` (default true) makes /v2/health/ready wait for every
  model; `--exit-on-error` (default true) exits when initialization (any model's load) fails.
- docs/user_guide/model_management.md: `--model-control-mode=poll` loads, reloads and unloads models as the
  repository changes, every `--repository-poll-secs`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from spec import alert_rules, boot, failover, tenancy
from spec.catalog import InstanceType

NAME = "triton"
SERVICE_ACCOUNT = "triton"
RELEASE = "2.71.0"                      # the server release of IMAGE; tests parse configs with its own schema
IMAGE = "nvcr.io/nvidia/tritonserver:26.07-py3"
RUN_AS_USER = 1000                      # triton-server in the image (build.py)
PORTS: Mapping[str, int] = {"http": tenancy.TRITON_HTTP_PORT, "grpc": tenancy.TRITON_GRPC_PORT,
                            "metrics": tenancy.TRITON_METRICS_PORT}
HTTP_PORT = PORTS["http"]
READY_PATH = failover.HEALTH_PATH       # /v2/health/ready: what the NLB and Route 53 check too
LIVE_PATH = "/v2/health/live"
# Models come from S3 at start: up to 15 minutes (90 probes, 10 s apart) before liveness may restart the pod.
STARTUP_PROBES = 90
# New models in the repository are picked up within this many seconds (model_control_mode poll).
REPOSITORY_POLL_S = 60
# On SIGTERM Triton stops taking requests and waits for those in flight up to --exit-timeout-secs; the pod's grace
# covers that plus the NLB's deregistration.
EXIT_TIMEOUT_S = 30
TERMINATION_GRACE_S = 60
SHM_SIZE = "1Gi"                        # /dev/shm: the Python backend's shared memory
ADAPTER_RELEASE_NAME = "prometheus-adapter"

# The custom metric the autoscaler scales on: average queue time per successful request, in milliseconds, per pod.
QUEUE_METRIC = "triton_queue_ms_per_request"
QUEUE_WINDOW = "2m"

# Helm value paths set -> line in prometheus-adapter 5.3.0's values.yaml (prometheus-community/helm-charts tag
# prometheus-adapter-5.3.0, e6e041b67, charts/prometheus-adapter/values.yaml).
PROMETHEUS_ADAPTER_VALUE_PATHS: Mapping[str, int] = {
    "nodeSelector": 25,
    "prometheus.url": 43,
    "prometheus.port": 44,
    "rules.default": 136,
    "rules.custom": 138,
}


def server_args(model_repository: str) -> List[str]:
    """tritonserver's arguments (the container's command is `tritonserver`).

    Readiness means the server is up, not that every model loaded (NVIDIA's defaults, strict readiness and exit on
    error, are made for one server with a fixed model set). Here the repository is polled and replicated to the DR
    peer: with the defaults, one model that fails to load would take every replica out of the load balancer, new
    pods would exit at start, and 15 minutes later the same model would do the same in the peer region, so failover
    would land on a second outage. Instead the other models keep serving and the broken one answers as not ready
    (/v2/models/<name>/ready, and its reason in /v2/repository/index)."""
    if not model_repository.startswith("s3://"):
        raise ValueError(f"model repository {model_repository!r} is not an s3:// URI")
    return [f"--model-repository={model_repository}", "--model-control-mode=poll",
            f"--repository-poll-secs={REPOSITORY_POLL_S}", "--strict-readiness=false", "--exit-on-error=false",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *alert_rules.TRITON_SERVER_ARGS]


def repository_bucket_arn(model_repository: str, partition: str) -> str:
    """The bucket of an s3://bucket/prefix repository, as an ARN (for Triton's read-only policy)."""
    if not model_repository.startswith("s3://") or not model_repository[5:].split("/", 1)[0]:
        raise ValueError(f"model repository {model_repository!r} is not an s3://bucket/prefix URI")
    return f"arn:{partition}:s3:::{model_repository[5:].split('/', 1)[0]}"


def rollout_timeout(driver_source: str) -> str:
    """How long `pulumi up` waits for the Deployment's pods to be ready: the pool's nodes may have to boot, pass the
    gate and register (spec/boot.py, 25 minutes with the AMI's driver, 55 installing it), then load their models
    (the startup probe's 15 minutes): more than the Kubernetes provider's 10-minute default."""
    seconds = boot.max_node_provision_seconds(driver_source) + STARTUP_PROBES * 10
    return f"{math.ceil(seconds / 60)}m"


def server_env(region: str) -> Dict[str, str]:
    """The S3 repository's region; credentials come from the pod's Pod Identity association."""
    return {"AWS_DEFAULT_REGION": region, "AWS_REGION": region}


def pod_resources(itype: InstanceType, gpu_resources: Mapping[str, int]) -> Dict[str, str]:
    """One GPU slot of the pool (a whole GPU, a time-slice or a MIG slice: spec.pools.offered_gpu_resources) and that
    slot's share of the node's CPU and memory, three quarters of it (the rest is the node's and its daemons')."""
    if len(gpu_resources) != 1:
        raise ValueError(f"Triton needs a pool with one kind of GPU resource, got {dict(gpu_resources)}")
    (resource, slots), = gpu_resources.items()
    if slots < 1:
        raise ValueError(f"{itype.name} offers no {resource}")
    cpu = max(1, math.floor(itype.vcpu * 3 / 4 / slots))
    memory = max(4, math.floor(itype.memory_gib * 3 / 4 / slots))
    return {resource: "1", "cpu": str(cpu), "memory": f"{memory}Gi"}


def queue_time_query() -> str:
    """prometheus-adapter's metricsQuery: microseconds queued per second / requests served per second / 1000. With
    no requests the queue time is 0 (the divisor never falls below one request per 1000 s)."""
    def rate(metric: str) -> str:
        return f"sum(rate({metric}{{<<.LabelMatchers>>}}[{QUEUE_WINDOW}])) by (<<.GroupBy>>)"
    return (f"{rate('nv_inference_queue_duration_us')} / clamp_min({rate('nv_inference_request_success')}, 0.001)"
            " / 1000")


def prometheus_adapter_values(prometheus_url: str, port: int, node_selector: Mapping[str, str]) -> Dict[str, Any]:
    """Helm values for prometheus-adapter: only the Triton queue-time metric (the chart's default rules would serve
    every pod and container metric as a custom metric, which the autoscaler does not need)."""
    return {
        "prometheus": {"url": prometheus_url, "port": port},
        "nodeSelector": dict(node_selector),
        "rules": {"default": False, "custom": [{
            "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": "^nv_inference_queue_duration_us$", "as": QUEUE_METRIC},
            "metricsQuery": queue_time_query(),
        }]},
    }


def hpa_target(target_queue_ms: float) -> str:
    """The autoscaler's averageValue as a Kubernetes quantity: whole milliseconds as is, fractions in milli-units."""
    if target_queue_ms <= 0:
        raise ValueError(f"targetQueueMs must be above 0, got {target_queue_ms}")
    milli = round(target_queue_ms * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


# --- a model's config.pbtxt ------------------------------------------------------------------------------------
def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def model_config_pbtxt(name: str, *, backend: str, max_batch_size: int, preferred_batch_sizes: Sequence[int],
                       max_queue_delay_us: int, instances_per_gpu: int = 1, gpus: Optional[Sequence[int]] = None,
                       inputs: Sequence[Mapping[str, Any]] = (), outputs: Sequence[Mapping[str, Any]] = ()) -> str:
    """A model's config.pbtxt (protobuf text format of inference.ModelConfig, model_config.proto) with dynamic
    batching: Triton gathers requests into batches of a preferred size, waiting at most max_queue_delay_us for one,
    and runs instances_per_gpu copies of the model on each GPU (all of the pod's, or `gpus`).

    inputs/outputs: {"name", "data_type" (e.g. TYPE_FP32), "dims" (without the batch dimension)}; leave them out
    for backends that read them from the model (ONNX, TensorRT, ...)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1 for dynamic batching, got {max_batch_size}")
    if not preferred_batch_sizes or any(not 1 <= size <= max_batch_size for size in preferred_batch_sizes):
        raise ValueError(f"preferred batch sizes {list(preferred_batch_sizes)} must be between 1 and max_batch_size "
                         f"{max_batch_size}")
    if max_queue_delay_us < 0 or instances_per_gpu < 1:
        raise ValueError("max_queue_delay_us must be at least 0 and instances_per_gpu at least 1")
    lines = [f"name: {_quoted(name)}", f"backend: {_quoted(backend)}", f"max_batch_size: {max_batch_size}"]
    for field, tensors in (("input", inputs), ("output", outputs)):
        for tensor in tensors:
            dims = ", ".join(str(d) for d in tensor["dims"])
            lines.append(f"{field} [ {{ name: {_quoted(tensor['name'])} data_type: {tensor['data_type']} "
                         f"dims: [ {dims} ] }} ]")
    sizes = ", ".join(str(size) for size in sorted(set(preferred_batch_sizes)))
    lines.append(f"dynamic_batching {{ preferred_batch_size: [ {sizes} ] "
                 f"max_queue_delay_microseconds: {max_queue_delay_us} }}")
    gpu_list = f" gpus: [ {', '.join(str(g) for g in gpus)} ]" if gpus else ""
    lines.append(f"instance_group [ {{ kind: KIND_GPU count: {instances_per_gpu}{gpu_list} }} ]")
    return "\n".join(lines) + "\n"
