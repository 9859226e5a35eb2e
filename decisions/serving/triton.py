"""Triton Inference Server as plain decisions: the server and its pod, how its models reach it, how it drains, the
queue-time metric it scales on, and a model's config.pbtxt with dynamic batching. Pure: no Pulumi
(components/serving/inference.py builds it).

Facts (triton-inference-server/server tag v2.71.0, 819ee3777, 2026-07-24):
- build.py DEFAULT_TRITON_VERSION_MAP: release 2.71.0 is NGC container 26.07, so the image is
  nvcr.io/nvidia/tritonserver:26.07-py3; build.py leaves the server's files owned by root and readable and
  executable by every user (lines 1309-1312; finalize_build's `chmod -R u+rwX,go+rX,go-w`, lines 2206-2208), so
  the pod runs it as nobody, not as the image's user triton-server (UID 1000), and installs curl (line 1354), which
  the readiness check uses.
- docs/user_guide/metrics.md: metrics on port 8002; nv_inference_queue_duration_us and nv_inference_request_success
  are cumulative counters per model; summaries (p99) need `--metrics-config summary_latencies=true`.
- docs/protocol (KServe v2): /v2/health/ready and /v2/health/live; /v2/models/<name>/ready per model.
- docs/customization_guide/deploy.md: `--strict-readiness` (default true) makes /v2/health/ready wait for every
  model; `--exit-on-error` (default true) exits when initialization (any model's load) fails.
- docs/user_guide/model_management.md: `--model-control-mode=poll` loads, reloads and unloads models as the
  repository changes, every `--repository-poll-secs` (line 102); a reload that fails leaves the loaded model serving
  (line 108); Triton may see a change half made (lines 117-119), which MODEL_SYNC_SCRIPT keeps from it.

**Why Triton does not read S3 itself.** Its S3 filesystem builds an `S3Client` on the AWS SDK for C++'s default
credential chain and fails with "Unable to create S3 filesystem client" when HeadBucket fails (triton-inference-server/
core r26.06, the newest branch stored here, src/filesystem/implementations/s3.h lines 288-330 and 342-351). The SDK is
the one triton-inference-server/third_party pins: CMakeLists.txt `GIT_TAG "1.11.60"` (r25.07 line 514; main at
6f855c0, 2025-07-15, line 519; unchanged since d9a74ab, 2023-05-31); the server's build takes third_party at branch
r<container version>, r26.07 for this image (server build.py lines 2727-2731, CMakeLists.txt lines 76 and 122-123),
a branch no stored snapshot holds, so 1.11.60 there is inferred from an unchanged pin, not read. EKS Pod Identity
needs the C++ SDK 1.11.263 or later (EKS User Guide, "Use pod identity with the AWS SDK",
docs.aws.amazon.com/eks/latest/userguide/pod-id-minimum-sdk.html): an older SDK's default chain sends only the
AWS_CONTAINER_AUTHORIZATION_TOKEN variable to the container endpoint, never the token file
(AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE) Pod Identity mounts (aws/aws-sdk-cpp
src/aws-cpp-sdk-core/source/auth/AWSCredentialsProviderChain.cpp as stored at 0e8e4f8cb, a version before that
support; the repository is too large to fetch here, so tag 1.11.60 itself was not read). So with Pod Identity,
Triton's own S3 reads fail.

The pod copies the repository instead: an init container syncs it once before Triton starts, a sidecar re-syncs it
every REPOSITORY_POLL_S, both with the AWS CLI (SYNC_IMAGE), and Triton serves the local copy. Chosen over IRSA for
Triton alone, which that chain does support (STSAssumeRoleWebIdentityCredentialsProvider): IRSA needs an IAM OIDC
provider for the cluster (one per issuer and account, outside the cluster component) and a trust policy per issuer,
the second identity mechanism in a project that chose Pod Identity everywhere (components/iam.py), and it would tie
serving to whatever SDK the next Triton image bundles. The copy also lets the pod keep serving what it has through a
short S3 or IAM outage (up to SYNC_STALE_S; longer, the pod can no longer follow a rollback and leaves the load
balancer, and TritonModelSyncStale says why), and each change replaces the served tree in one rename
(MODEL_SYNC_SCRIPT). Triton itself gets no AWS credentials at all (POD_IDENTITY_SKIP).

**Readiness means "serving this stack's models".** `--strict-readiness=false` stays: with it on, /v2/health/ready
(which the NLB checks) is false while any model is not ready (core r26.06 src/server.cc lines 416-462: strict, every
model READY; otherwise only the server's state), so one bad model would take every replica out. The pod's readiness
is stricter instead: at least one model READY in the repository index (MODEL_READY_COMMAND), and the sidecar's last
good sync no older than SYNC_STALE_S. An empty or unreadable repository keeps the pod out of the load balancer (the
controller registers ready endpoints only: aws-load-balancer-controller v3.5.0 pkg/backend/endpoint_resolver.go lines
171-197), so the NLB has no healthy target and Route 53 fails over; a broken model next to good ones does not.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from decisions.catalog.catalog import InstanceType
from decisions.nodes.pods import system_placement
from decisions.observability import alert_rules, monitoring
from decisions.platform import gpu_operator, pod_security, tenancy
from decisions.serving import failover

NAME = "triton"
SERVICE_ACCOUNT = "triton"
RELEASE = "2.71.0"                      # the server release of IMAGE; tests parse configs with its own schema
# nvcr.io/nvidia/tritonserver:26.07-py3 by digest (decisions/platform/images.yaml)
IMAGE = pod_security.image("triton")
# nobody (UID 65534, in the Ubuntu base's /etc/passwd): a UID above pod_security.MIN_UID that owns nothing in the image
RUN_AS_USER = pod_security.NOBODY
# Triton's writable paths, beside /dev/shm and the read-only models: /tmp, where the Python backend unpacks a
# model's EXECUTION_ENV_PATH archive (often GiBs) and PyTorch keeps its compile caches; HOME points there too, as the
# user nobody's home is /nonexistent.
TRITON_TMP_SIZE = "8Gi"
TRITON_ENV = {"HOME": "/tmp"}
PORTS: Mapping[str, int] = {"http": tenancy.TRITON_HTTP_PORT, "grpc": tenancy.TRITON_GRPC_PORT,
                            "metrics": tenancy.TRITON_METRICS_PORT}
HTTP_PORT = PORTS["http"]
READY_PATH = failover.HEALTH_PATH       # /v2/health/ready: what the NLB and Route 53 check too
LIVE_PATH = "/v2/health/live"
# Models load from local disk at start: up to 15 minutes (90 probes, 10 s apart) before liveness may restart the pod
# (decisions/serving/dr_pair.py counts that load time in the recovery time).
STARTUP_PROBES = 90
STARTUP_PROBE_PERIOD_S = 10
# New models in the repository are picked up within this many seconds (model_control_mode poll).
REPOSITORY_POLL_S = 60
SHM_SIZE = "1Gi"                        # /dev/shm: the Python backend's shared memory
ADAPTER_RELEASE_NAME = "prometheus-adapter"

# --- the models' copy -----------------------------------------------------------------------------------------------
# aws/aws-cli tag 2.36.7 (73fb33bb1, 2026-07-23): docker/Dockerfile builds it on amazonlinux:2023 with findutils;
# its botocore reads the Pod Identity token file (awscli/botocore/credentials.py lines 2062-2107, ContainerProvider)
# and allows the agent's address 169.254.170.23 (awscli/botocore/utils.py lines 2891-2894). Pod Identity needs CLI
# 2.15.0 or later (EKS User Guide, pod-id-minimum-sdk).
SYNC_IMAGE = pod_security.image("aws-cli")     # public.ecr.aws/aws-cli/aws-cli:2.36.7 (decisions/platform/images.yaml)
# The image runs as root (aws/aws-cli 2.36.7 docker/Dockerfile sets no USER); the sync containers run as nobody
# instead: they write only the models emptyDir (world-writable, as the kubelet creates it) and files there keep the
# umask's 0644, which Triton (also nobody) reads. Their /tmp is the CLI's HOME (~/.aws: its caches), a small emptyDir.
SYNC_RUN_AS = pod_security.NOBODY
SYNC_TMP_SIZE = "256Mi"
MODELS_MOUNT = "/models"                # an emptyDir shared by the sync containers and Triton (read-only there)
LOCAL_REPOSITORY = f"{MODELS_MOUNT}/current"
SYNC_STAMP = f"{MODELS_MOUNT}/.synced-at"
SYNC_CONTAINER = alert_rules.TRITON_SYNC_CONTAINER       # the sidecar; TritonModelSyncStale watches its readiness
FIRST_SYNC_CONTAINER = "models-first-sync"             # the init container: the copy Triton starts on
# The sidecar is unready once its last good sync is this old: the pod can no longer follow what is published (a
# rollback would not reach it). Ten polls, so a passing S3 error does not flap the load balancer.
SYNC_STALE_S = 10 * REPOSITORY_POLL_S
# The EKS Pod Identity webhook leaves the containers this pod annotation names without credentials
# (aws/amazon-eks-pod-identity-webhook v0.6.17 pkg/handler/handler.go lines 154-170 and 326-345: init containers and
# containers alike get them otherwise). Triton reads only local files.
POD_IDENTITY_SKIP = ("eks.amazonaws.com/skip-containers", NAME)

# One sync round, in bash (the CLI image's shell): the served tree is hard-linked into a new generation (no copy),
# `aws s3 sync --delete` brings that to what S3 holds, and only a generation that changed replaces the served one,
# by renaming a symlink, in one step. Facts it relies on (aws-cli 2.36.7): a download goes to a
# temporary file renamed into place (awscli/s3transfer/download.py lines 173 and 800), so a hard-linked file of the
# served tree is never written through; a downloaded file's mtime is the object's LastModified
# (awscli/customizations/s3/subscribers.py lines 206-219), so with --exact-timestamps an unchanged file (same size,
# same time) is not fetched again while a republished one is. Without that flag a download skips any file of the same
# size that is not older than the object (awscli/customizations/s3/syncstrategy/base.py compare_time, the download
# branch, and exacttimestamps.py, as in awscli 1.46.3, the tests' CLI): new weights of the same size, or a rollback
# copied over the same key, would never reach Triton. Zero-byte
# "directory" keys are not downloaded (awscli/customizations/s3/filegenerator.py line 367). `cp -a` keeps the
# directories' mtimes, from which Triton's poll decides what changed (core r26.06
# src/model_repository_manager/model_repository_manager.cc lines 330-358 and 441-446), so an unchanged model is not
# reloaded. The generation served before stays one more round: Triton may still be loading from it.
MODEL_SYNC_SCRIPT = r"""set -u
root=%(root)s
sync_round() {
  served=$(readlink "$root/current" || true)
  next="gen-$(date +%%s%%N)"
  if [ -n "$served" ]; then cp -al "$root/$served" "$root/$next" || return 1; else mkdir "$root/$next" || return 1; fi
  if ! changes=$(aws s3 sync "$MODEL_SOURCE" "$root/$next" --delete --exact-timestamps --no-progress); then
    rm -rf "${root:?}/$next"
    return 1
  fi
  find "$root/$next" -mindepth 1 -type d -empty -delete
  if [ -n "$served" ] && [ -z "$changes" ]; then
    rm -rf "${root:?}/$next"
  else
    ln -sfn "$next" "$root/current.new" && mv -T "$root/current.new" "$root/current" || return 1
    for old in "$root"/gen-*; do
      case "${old##*/}" in "$next" | "$served") ;; *) rm -rf "$old" ;; esac
    done
  fi
  date +%%s > "$root/.synced-at.new" && mv "$root/.synced-at.new" "$root/.synced-at"
}
case "$1" in
  once) sync_round ;;
  loop)
    trap 'exit 0' TERM
    while :; do
      sync_round || echo "model sync from $MODEL_SOURCE failed; Triton keeps the last good copy" >&2
      sleep %(poll)d & wait $!
    done ;;
  *) echo "usage: once | loop" >&2; exit 2 ;;
esac
""" % {"root": MODELS_MOUNT, "poll": REPOSITORY_POLL_S}
# The sidecar's readiness: a good sync within SYNC_STALE_S.
SYNC_FRESH_COMMAND = ["bash", "-c", f'[ $(( $(date +%s) - $(cat {SYNC_STAMP}) )) -lt {SYNC_STALE_S} ]']
# Triton's readiness: at least one model READY. POST /v2/repository/index with {"ready": true} lists only ready
# models, as [] when there are none (server v2.71.0 src/http_server.cc lines 1436-1480; core r26.06
# src/tritonserver.cc TRITONSERVER_ServerModelIndex, entries {"name", "version", "state"}).
READY_CHECK_TIMEOUT_S = 4
MODEL_READY_COMMAND = ["sh", "-c", f"curl -sf -m {READY_CHECK_TIMEOUT_S} -X POST -d '{{\"ready\":true}}' "
                                   f"http://127.0.0.1:{HTTP_PORT}/v2/repository/index "
                                   "| grep -q '\"state\": *\"READY\"'"]

# --- every model accounted for -----------------------------------------------------------------------------------
# Readiness asks for one model READY, so a model that fails to load beside good ones (GPU memory under time-slicing,
# an engine built for another architecture) serves errors unseen. A native sidecar answers each scrape with every
# model version of Triton's repository index as alert_rules.TRITON_MODEL_READY_METRIC (jobs/triton_model_exporter.py,
# shipped in the pod spec itself, so a change to it rolls the pods), on the standard-library python image, as nobody;
# alert_rules' TritonModelNotReady fires on it.
EXPORTER_CONTAINER = "model-ready-exporter"
EXPORTER_IMAGE = pod_security.image("python")
EXPORTER_PROGRAM = Path(__file__).resolve().parents[2] / "jobs" / "triton_model_exporter.py"
EXPORTER_PORT_NAME = "model-ready"
EXPORTER_PORT = tenancy.WORKLOAD_METRICS_PORT          # the port the namespace's NetworkPolicy opens to Prometheus
EXPORTER_TIMEOUT_S = 5                                 # below Prometheus' default scrape timeout, 10 s

# --- drains: the serving contract -----------------------------------------------------------------------------------
# What a rollout, a scale-in or a node drain does to a pod, and why no request in flight is lost (tests/drain_walk.py
# walks it second by second; docs/inference.md states the contract for clients):
# - Triton's stop (server v2.71.0): on SIGTERM, main.cc (lines 559-575) stops HTTP, then gRPC, then the core, from one
#   --exit-timeout-secs budget. HTTP refuses new connections and waits, a second at a time, while ANY connection is
#   open, idle keep-alive ones included, spending the budget (http_server.cc lines 242-256, 293-294), then closes them
#   all; gRPC's GracefulStop gets what is left: Shutdown (GOAWAY) and a wait for its calls (grpc/grpc_server.cc lines
#   2584-2606, 2653-2662); the core waits for in-flight inferences with the rest (core r26.06 src/server.cc lines
#   300-378), then gRPC is stopped by force (main.cc line 575). One HTTP client that keeps a connection open takes the
#   whole budget, and gRPC's calls in flight are cut.
# - The NLB: after DeregisterTargets it may open new flows to the target for about two minutes, whatever the
#   deregistration delay: AWS documents no figure, users measured 120 s (kubernetes-sigs/aws-load-balancer-controller
#   #2366 and #3270, aws/containers-roadmap#470). It keeps established flows to a deregistered target; only with
#   deregistration_delay.connection_termination.enabled (NLB only, default false: ELB API Reference,
#   TargetGroupAttribute) does it close what is left when the deregistration delay ends. The controller deregisters a
#   pod as soon as it terminates (v3.5.0 pkg/backend/endpoint_resolver.go lines 194-195).
# So the contract: no request lasts longer than MAX_REQUEST_S, and no connection is used once MAX_CONNECTION_AGE_S
# old. Triton enforces it on gRPC (--grpc-max-connection-age: GOAWAY at that age, within gRPC core's +-10 % jitter,
# and the connection closed MAX_REQUEST_S later: grpc/grpc src/core/ext/filters/max_age/max_age_filter.cc
# MAX_CONNECTION_AGE_JITTER 0.1, and the same 0.1 in src/core/ext/filters/channel_idle/legacy_channel_idle_filter.cc
# of later releases; server v2.71.0 src/grpc/grpc_server.cc lines 2328-2337 pass the options through). Triton's HTTP
# server has no such setting: HTTP clients close their connections themselves. Every connection the NLB opens to a
# terminating pod is then closed within CONNECTION_LIFETIME_S, before the pod's SIGTERM, and the NLB closes any that a
# client outside the contract keeps; Triton's stop finds only the pod's own health checks.
NLB_DEREGISTRATION_S = 120              # new flows to a deregistered target, as measured
CONTROLLER_MARGIN_S = 10                # ours: the controller sees the endpoint change and calls DeregisterTargets
MAX_REQUEST_S = 30                      # the contract: a request (a unary call, a stream, an HTTP exchange) ends by then
MAX_CONNECTION_AGE_S = 30               # the contract: no new request on a connection this old
GRPC_AGE_JITTER = 0.1                   # gRPC core spreads each connection's age by +-10 %
CONNECTION_LIFETIME_S = math.ceil(MAX_CONNECTION_AGE_S * (1 + GRPC_AGE_JITTER)) + MAX_REQUEST_S
# The NLB's last new flow to the pod opens NLB_DEREGISTRATION_S after DeregisterTargets and closes within
# CONNECTION_LIFETIME_S; then the NLB closes what a client outside the contract left open (connection termination).
DEREGISTRATION_DELAY_S = NLB_DEREGISTRATION_S + CONNECTION_LIFETIME_S
# The pod serves on until then, DeregisterTargets itself coming up to CONTROLLER_MARGIN_S late.
PRESTOP_PAUSE_S = CONTROLLER_MARGIN_S + DEREGISTRATION_DELAY_S
# HTTP connections the pod's own checks may hold open at SIGTERM, each for at most its timeout: the NLB's target health
# check (the controller's default, v3.5.0 pkg/service/model_builder.go line 151), the readiness command, the kubelet's
# liveness probe (set on the probe) and the model-ready exporter's index request.
NLB_HEALTH_CHECK_TIMEOUT_S = 10
LIVENESS_TIMEOUT_S = 1
HEALTH_CHECK_TIMEOUTS_S: Mapping[str, int] = {"nlb": NLB_HEALTH_CHECK_TIMEOUT_S, "readiness": READY_CHECK_TIMEOUT_S,
                                              "liveness": LIVENESS_TIMEOUT_S, "model-ready": EXPORTER_TIMEOUT_S}
# Triton's HTTP stop waits them out, and a request still in flight on gRPC (only one the NLB opened past its measured
# two minutes could be) gets MAX_REQUEST_S after.
EXIT_TIMEOUT_S = max(HEALTH_CHECK_TIMEOUTS_S.values()) + MAX_REQUEST_S
SIDECAR_STOP_S = 10                     # the native sidecars stop after Triton has exited
TERMINATION_GRACE_S = PRESTOP_PAUSE_S + EXIT_TIMEOUT_S + SIDECAR_STOP_S

# The custom metric the autoscaler scales on: average queue time per successful request, in milliseconds, per pod.
QUEUE_METRIC = "triton_queue_ms_per_request"
QUEUE_WINDOW = "2m"

# Helm value paths set -> line in prometheus-adapter 5.3.0's values.yaml (prometheus-community/helm-charts tag
# prometheus-adapter-5.3.0, e6e041b67, charts/prometheus-adapter/values.yaml).
PROMETHEUS_ADAPTER_VALUE_PATHS: Mapping[str, int] = {
    "nodeSelector": 25,
    "tolerations": 257,
    "prometheus.url": 43,
    "prometheus.port": 44,
    "rules.default": 136,
    "rules.custom": 138,
}


def server_args() -> List[str]:
    """tritonserver's arguments (the container's command is `tritonserver`): the local copy of the repository.

    /v2/health/ready means the server is up, not that every model loaded (NVIDIA's defaults, strict readiness and
    exit on error, are made for one server with a fixed model set). Here the repository is polled and replicated to
    the DR peer: with the defaults, one model that fails to load would take every replica out of the load balancer,
    new pods would exit at start, and 15 minutes later the same model would do the same in the peer region. Instead
    the other models keep serving and the broken one answers as not ready (/v2/models/<name>/ready, and its reason
    in /v2/repository/index); the pod's own readiness asks for at least one ready model (MODEL_READY_COMMAND)."""
    return [f"--model-repository={LOCAL_REPOSITORY}", "--model-control-mode=poll",
            f"--repository-poll-secs={REPOSITORY_POLL_S}", "--strict-readiness=false", "--exit-on-error=false",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *grpc_connection_args(), *alert_rules.TRITON_SERVER_ARGS]


def grpc_connection_args() -> List[str]:
    """The serving contract on gRPC, enforced by Triton: a connection gets GOAWAY at MAX_CONNECTION_AGE_S (clients
    reconnect, through the NLB to a registered target) and is closed MAX_REQUEST_S later (server v2.71.0
    src/command_line_parser.cc lines 622-630: both in milliseconds)."""
    return [f"--grpc-max-connection-age={MAX_CONNECTION_AGE_S * 1000}",
            f"--grpc-max-connection-age-grace={MAX_REQUEST_S * 1000}"]


def exporter_command() -> List[str]:
    """The model-ready exporter's command: its program, from jobs/, run by the image's python."""
    return ["python3", "-c", EXPORTER_PROGRAM.read_text(), "--triton", f"http://127.0.0.1:{HTTP_PORT}",
            "--port", str(EXPORTER_PORT), "--timeout", str(EXPORTER_TIMEOUT_S)]


def metrics_monitor_spec(namespace: str, service_labels: Mapping[str, str]) -> Dict[str, Any]:
    """The ServiceMonitor's spec for the pod's two metrics ports: Triton's own and the model-ready exporter's."""
    endpoints = [monitoring.service_monitor_spec(namespace, service_labels, port)["endpoints"][0]
                 for port in ("metrics", EXPORTER_PORT_NAME)]
    return {**monitoring.service_monitor_spec(namespace, service_labels, "metrics"), "endpoints": endpoints}


def repository_bucket_arn(model_repository: str, partition: str) -> str:
    """The bucket of an s3://bucket/prefix repository, as an ARN (for the read-only policy of the sync containers)."""
    if not model_repository.startswith("s3://") or not model_repository[5:].split("/", 1)[0]:
        raise ValueError(f"model repository {model_repository!r} is not an s3://bucket/prefix URI")
    return f"arn:{partition}:s3:::{model_repository[5:].split('/', 1)[0]}"


def sync_env(model_repository: str, region: str) -> Dict[str, str]:
    """The sync containers' environment: what to copy, and the region of the stack (credentials come from the pod's
    Pod Identity association; HOME is the containers' /tmp emptyDir, writable on a read-only root)."""
    repository_bucket_arn(model_repository, "aws")
    return {"MODEL_SOURCE": model_repository, "AWS_REGION": region, "AWS_DEFAULT_REGION": region, "HOME": "/tmp"}


def sync_command(mode: str) -> List[str]:
    """The sync containers' command: `once` (the init container: a failed first copy fails the pod) or `loop`."""
    if mode not in ("once", "loop"):
        raise ValueError(f"sync mode {mode!r}: allowed once, loop")
    return ["bash", "-c", MODEL_SYNC_SCRIPT, "model-sync", mode]


def pod_resources(itype: InstanceType, gpu_resources: Mapping[str, int]) -> Dict[str, str]:
    """One GPU slot of the pool (a whole GPU, a time-slice or a MIG slice: decisions.nodes.pools.offered_gpu_resources)
    and that slot's share of the node's CPU and memory, three quarters of it (the rest is the node's and its
    daemons')."""
    if len(gpu_resources) != 1:
        raise ValueError(f"Triton needs a pool with one kind of GPU resource, got {dict(gpu_resources)}")
    (resource, slots), = gpu_resources.items()
    if slots < 1:
        raise ValueError(f"{itype.name} offers no {resource}")
    cpu = max(1, math.floor(itype.vcpu * 3 / 4 / slots))
    memory = max(4, math.floor(itype.memory_gib * 3 / 4 / slots))
    return {resource: "1", "cpu": str(cpu), "memory": f"{memory}Gi"}


def shm_size(pool) -> Optional[str]:
    """The size of the pod's own /dev/shm (the Python backend's shared memory), or None on MPS pools: there the device
    plugin mounts the MPS server's shared memory at /dev/shm
    (decisions/platform/gpu_operator.device_plugin_mounts_shm), which a pod volume would hide, and the Python backend
    uses that node-wide tmpfs. Replicas on one node do not collide in it: the backend names its regions with a UUID
    from release 24.04 on (triton-inference-server/python_backend r26.07 README.md lines 1182-1186)."""
    return None if gpu_operator.device_plugin_mounts_shm(pool) else SHM_SIZE


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
        # nodeSelector, and tolerations of the system nodes' taint: the chart tolerates nothing by default (values.yaml
        # line 257).
        **system_placement(node_selector),
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
# Tensor data types: model_config.proto's DataType at the server's release (TYPE_INVALID left out), as tritonclient
# 2.71.0 generates it (tests/test_triton.py compares the two).
DATA_TYPES = ("TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
              "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16")


def parse_tensor(option: str, text: str) -> Dict[str, Any]:
    """`NAME:TYPE:DIMS` (`input0:TYPE_FP32:3,224,224`; -1 for a variable dimension) as model_config_pbtxt takes a
    tensor; a ValueError naming `option` for a bad one."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"{option} {text!r}: give NAME:TYPE:DIMS, e.g. input0:TYPE_FP32:3,224,224")
    name, data_type, dims_text = parts
    if data_type not in DATA_TYPES:
        raise ValueError(f"{option} {text!r}: data type {data_type!r} is not one of {', '.join(DATA_TYPES)}")
    try:
        dims = [int(d) for d in dims_text.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 and d != -1 for d in dims):
        raise ValueError(f"{option} {text!r}: DIMS are sizes of at least 1 (or -1, variable) separated by commas")
    return {"name": name, "data_type": data_type, "dims": dims}


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
            if tensor["data_type"] not in DATA_TYPES:
                raise ValueError(f"{field} {tensor['name']}: data type {tensor['data_type']!r} is not one of "
                                 f"{', '.join(DATA_TYPES)}")
            dims = ", ".join(str(d) for d in tensor["dims"])
            lines.append(f"{field} [ {{ name: {_quoted(tensor['name'])} data_type: {tensor['data_type']} "
                         f"dims: [ {dims} ] }} ]")
    sizes = ", ".join(str(size) for size in sorted(set(preferred_batch_sizes)))
    lines.append(f"dynamic_batching {{ preferred_batch_size: [ {sizes} ] "
                 f"max_queue_delay_microseconds: {max_queue_delay_us} }}")
    gpu_list = f" gpus: [ {', '.join(str(g) for g in gpus)} ]" if gpus else ""
    lines.append(f"instance_group [ {{ kind: KIND_GPU count: {instances_per_gpu}{gpu_list} }} ]")
    return "\n".join(lines) + "\n"
