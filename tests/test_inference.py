"""components/inference.py under the mock engine, in the shipped prod stack (and variants of it).

What users rely on: Triton runs on its inference pool only, as a non-root user, reading the stack's models bucket
and nothing else; it takes traffic only when ready, through an NLB inside the VPC unless the stack says otherwise;
the autoscaler scales the Deployment between the configured bounds on the very metric prometheus-adapter serves;
Prometheus scrapes it; a second `pulumi up` leaves the replica count to the autoscaler; the load balancer controller
runs with a role limited to this stack's load balancers.
"""
from __future__ import annotations

import json

import pytest

from spec import lb_controller, monitoring, triton
from spec.pools import node_taints, toleration
from tests.conftest import run_stack, validate_kubernetes

STACK = "prod-us-east-1"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
RELEASE = "kubernetes:helm.sh/v3:Release"
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


@pytest.fixture(scope="module")
def run(stack_runs):
    return stack_runs[STACK]


def named(run, kind, name):
    return run.one(kind, name)


def pod_spec(run):
    return named(run, DEPLOYMENT, "inference-deployment").inputs["spec"]["template"]["spec"]


def test_triton_runs_on_its_pool_only_and_tolerates_exactly_its_taints(run):
    from plan.stackfile import load_stack
    _, spec = load_stack(STACK)
    pool = next(p for p in spec.pools if p.spec.name == spec.inference.triton.pool)
    pod = pod_spec(run)
    assert pod["nodeSelector"] == {"gpu-cloud.io/pool": pool.spec.name}
    assert pod["tolerations"] == [toleration(t) for t in node_taints(pool)]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": container["resources"]["requests"]["memory"]}


def test_triton_serves_the_stacks_models_bucket_as_a_non_root_user(run):
    (container,) = pod_spec(run)["containers"]
    models = run.outputs["buckets"]["models"]["name"]
    assert container["image"] == triton.IMAGE and container["command"] == ["tritonserver"]
    assert container["args"][0] == f"--model-repository=s3://{models}/triton"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert {e["name"]: e["value"] for e in container["env"]}["AWS_DEFAULT_REGION"] == "us-east-1"


def test_it_takes_traffic_only_when_ready_and_is_restarted_when_dead(run):
    (container,) = pod_spec(run)["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 900
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}


def test_the_replica_count_belongs_to_the_autoscaler_after_the_first_up(run):
    deployment = named(run, DEPLOYMENT, "inference-deployment")
    assert deployment.inputs["spec"]["replicas"] == 2                  # minReplicas of the stack
    assert "spec.replicas" in deployment.ignore_changes


def test_the_autoscaler_scales_the_deployment_on_the_adapters_metric(run):
    hpa = named(run, HPA, "inference-autoscaler").inputs["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "triton"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    (metric,) = hpa["metrics"]
    assert metric["pods"]["metric"]["name"] == triton.QUEUE_METRIC
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "10"}
    adapter = named(run, RELEASE, "inference-prometheus-adapter")
    (rule,) = adapter.inputs["values"]["rules"]["custom"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    assert adapter.inputs["values"]["prometheus"]["url"] == monitoring.PROMETHEUS_URL
    assert adapter.urn in named(run, HPA, "inference-autoscaler").dependencies


def test_clients_reach_it_through_an_internal_nlb_checked_on_readiness(run):
    service = named(run, SERVICE, "inference-service")
    spec, annotations = service.inputs["spec"], service.inputs["metadata"]["annotations"]
    assert spec["type"] == "LoadBalancer" and spec["loadBalancerClass"] == lb_controller.LOAD_BALANCER_CLASS
    assert {p["port"] for p in spec["ports"]} == {8000, 8001}          # metrics stay inside the cluster
    assert annotations[lb_controller.SCHEME] == "internal"
    assert annotations[lb_controller.HEALTHCHECK_PATH] == "/v2/health/ready"
    assert named(run, RELEASE, "lb-controller-release").urn in service.dependencies
    assert run.outputs["inferenceEndpoint"].endswith(".elb.us-east-1.amazonaws.com")


def test_an_internet_facing_stack_gets_an_internet_facing_nlb():
    run = run_stack(STACK, {"gpu-cloud:inference": {"triton": {
        "enabled": True, "pool": "infer-l40s", "minReplicas": 2, "maxReplicas": 8, "scheme": "internet-facing"}}})
    annotations = run.one(SERVICE, "inference-service").inputs["metadata"]["annotations"]
    assert annotations[lb_controller.SCHEME] == "internet-facing"
    # Route 53 checks an internet-facing endpoint itself.
    check = run.one("aws:route53/healthCheck:HealthCheck")
    assert check.inputs["type"] == "HTTP" and check.inputs["resourcePath"] == "/v2/health/ready"
    assert run.of_type("aws:cloudwatch/metricAlarm:MetricAlarm") == []


def test_prometheus_scrapes_triton_metrics(run):
    monitor = named(run, SERVICE_MONITOR, "inference-service-monitor")
    metrics = named(run, SERVICE, "inference-metrics")
    assert monitor.inputs["metadata"]["labels"] == dict(monitoring.SELECTOR_LABELS)
    assert monitor.inputs["spec"]["selector"]["matchLabels"] == metrics.inputs["metadata"]["labels"]
    assert monitor.inputs["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}
    assert monitor.inputs["spec"]["endpoints"][0]["port"] == metrics.inputs["spec"]["ports"][0]["name"] == "metrics"
    # Triton serves /metrics on 8002 unless told otherwise (spec/triton.py: docs/user_guide/metrics.md at v2.71.0).
    assert monitor.inputs["spec"]["endpoints"][0]["path"] == "/metrics"
    (container,) = named(run, DEPLOYMENT, "inference-deployment").inputs["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 8002} in container["ports"]
    assert metrics.inputs["spec"]["ports"][0]["targetPort"] == "metrics"
    assert not [arg for arg in container["args"] if arg.startswith(("--metrics-port", "--allow-metrics"))]


def _policy(run, name):
    return json.loads(named(run, ROLE_POLICY, name).inputs["policy"])


def test_triton_reads_the_models_bucket_and_nothing_else(run):
    models = run.outputs["buckets"]["models"]
    statements = _policy(run, "inference-identity-policy")["Statement"]
    assert {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {
        "s3:ListBucket", "s3:GetObject", "kms:Decrypt"}
    resources = {json.dumps(s["Resource"]) for s in statements}
    assert resources == {json.dumps(models["arn"]), json.dumps(models["arn"] + "/*"), json.dumps(models["keyArn"])}


def test_the_load_balancer_controller_is_limited_to_this_stacks_resources(run):
    policy = _policy(run, "lb-controller-identity-policy")
    vpc = run.outputs["vpcId"]
    assert policy == lb_controller.scoped_iam_policy("aws", "us-east-1", "123456789012", vpc, "internal")
    values = named(run, RELEASE, "lb-controller-release").inputs["values"]
    assert values["vpcId"] == vpc and values["clusterName"] == "gpu-cloud-prod-us-east-1"


def test_every_service_the_controllers_webhook_covers_waits_for_the_controller(run):
    """The controller's Service webhook refuses creates (failurePolicy Fail) while no controller pod answers: a
    Service created in a covered namespace before the release is ready would fail the first `pulumi up`."""
    controller = next(r for r in run.of_type("kubernetes:helm.sh/v3:Release")
                      if r.inputs["chart"] == "aws-load-balancer-controller")
    (selector,) = controller.inputs["values"]["serviceMutatorWebhookConfig"]["namespaceSelectors"]
    covered = [r for r in run.of_type("kubernetes:core/v1:Service")
               if r.inputs["metadata"]["namespace"] in selector["values"]]
    assert {r.name for r in covered} >= {"inference-service", "inference-metrics"}
    assert all(controller.urn in r.dependencies for r in covered), [r.name for r in covered]


def test_every_object_inference_creates_directly_is_valid_kubernetes(run):
    from plan.engine import ProgramRun
    inference = [r for r in run.resources if "gpu-cloud:inference:Inference" in r.urn]
    subset = ProgramRun(run.project, run.stack, run.region, inference, {})
    # service account, Deployment, PodDisruptionBudget, two Services, HPA (the ServiceMonitor: tests/test_monitoring.py)
    assert validate_kubernetes(subset, "1.35") == 6


def test_an_empty_models_bucket_still_starts_triton(run):
    """Triton refuses a repository path that does not exist, and on S3 a prefix exists only while a key starts with
    it: the stack makes the prefix's marker before the Deployment."""
    marker = named(run, "aws:s3/bucketObjectv2:BucketObjectv2", "inference-repository")
    models = run.outputs["buckets"]["models"]["name"]
    assert (marker.inputs["bucket"], marker.inputs["key"], marker.inputs["content"]) == (models, "triton/", "")
    (container,) = pod_spec(run)["containers"]
    assert container["args"][0] == f"--model-repository=s3://{models}/{marker.inputs['key'].rstrip('/')}"
    assert marker.urn in named(run, DEPLOYMENT, "inference-deployment").dependencies


@pytest.mark.parametrize("source, timeout", [("ami", "40m"), ("install", "70m")])
def test_pulumi_waits_long_enough_for_the_first_pods(source, timeout):
    # The node's boot, gate and registration (1500 s or 3300 s, spec/boot.py) plus 15 minutes of model loading.
    assert triton.rollout_timeout(source) == timeout


def test_the_deployment_uses_the_rollout_timeout(run):
    deployment = named(run, DEPLOYMENT, "inference-deployment")
    assert deployment.custom_timeouts == {"create": "40m", "update": "40m"}
