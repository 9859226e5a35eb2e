"""components/serving/inference.py under the mock engine, in the shipped prod stack (and variants of it).

What users rely on: Triton runs on its inference pool only, as a non-root user, serving a copy of the stack's models
bucket that containers with a Pod Identity-capable CLI keep; it takes traffic only while it serves a model, through
an NLB inside the VPC unless the stack says otherwise, and drains without dropping what the NLB still sends; only the
publisher the stack names may change its models; the autoscaler scales the Deployment between the configured bounds
on the very metric prometheus-adapter serves; Prometheus scrapes it; a second `pulumi up` leaves the replica count
to the autoscaler; the load balancer controller runs with a role limited to this stack's load balancers.
"""
from __future__ import annotations

import json

import pytest

from decisions.nodes import drain
from decisions.nodes.pools import node_taints, toleration
from decisions.observability import monitoring
from decisions.platform import tenancy
from decisions.serving import lb_controller, triton
from decisions.storage import data_access
from tests.conftest import run_stack, stack_config, validate_kubernetes

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


def test_triton_serves_a_copy_of_the_stacks_models_bucket_kept_by_a_pod_identity_capable_cli(run):
    pod = pod_spec(run)
    (container,) = pod["containers"]
    first, sidecar, _ = pod["initContainers"]          # the third: the model-ready exporter (its own test below)
    models = run.outputs["buckets"]["models"]["name"]
    assert container["image"] == triton.IMAGE and container["command"] == ["tritonserver"]
    assert container["args"][0] == "--model-repository=/models/current"
    # The copy is made before Triton starts, then followed: a native sidecar (an init container that keeps running).
    assert (first["name"], first.get("restartPolicy"), first["command"][-1]) == ("models-first-sync", None, "once")
    assert (sidecar["name"], sidecar["restartPolicy"], sidecar["command"][-1]) == ("models-sync", "Always", "loop")
    for sync in (first, sidecar):
        assert sync["image"] == "public.ecr.aws/aws-cli/aws-cli:2.36.7"    # CLI 2.15.0 or later reads Pod Identity
        env = {e["name"]: e["value"] for e in sync["env"]}
        assert env["MODEL_SOURCE"] == f"s3://{models}/triton" and env["AWS_REGION"] == "us-east-1"
        assert sync["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": False},
                                        {"name": "sync-tmp", "mountPath": "/tmp"}]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert {"name": "models", "emptyDir": {}} in pod["volumes"]
    # Triton's bundled SDK cannot use Pod Identity, and reads only local files: it gets no credentials at all.
    assert container["env"] == [{"name": "HOME", "value": "/tmp"}]
    # Writable paths are bounded emptyDirs; the pod mounts no Kubernetes token (Pod Identity brings its own).
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}} in pod["volumes"]
    assert {"name": "sync-tmp", "emptyDir": {"sizeLimit": "256Mi"}} in pod["volumes"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["automountServiceAccountToken"] is False
    annotations = named(run, DEPLOYMENT, "inference-deployment").inputs["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"eks.amazonaws.com/skip-containers": "triton"}
    # Triton and the sync containers as nobody, pod and containers alike (a UID of 10000 or above owns nothing in the
    # image); read-only roots, nothing kept.
    assert pod["securityContext"]["runAsUser"] == 65534
    for each in (container, first, sidecar):
        security = each["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 65534
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True and security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_it_takes_traffic_only_while_it_serves_a_model_it_keeps_following_and_is_restarted_when_dead(run):
    pod = pod_spec(run)
    (container,) = pod["containers"]
    sidecar = pod["initContainers"][1]
    # Readiness: a model READY (an empty or unreadable repository has none; one broken model beside good ones
    # leaves the pod in); and a sync no older than ten polls.
    assert container["readinessProbe"]["exec"]["command"] == triton.MODEL_READY_COMMAND
    assert sidecar["readinessProbe"]["exec"]["command"] == triton.SYNC_FRESH_COMMAND
    assert "--strict-readiness=false" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] == 900
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}


def test_a_drain_runs_on_the_serving_contracts_timings(run):
    """The pod carries the timings tests/test_triton.py walks a drain through: the pause, Triton's exit budget and
    gRPC connection age, the liveness timeout counted in that budget, the grace, and an NLB that closes a
    deregistered pod's flows when its deregistration delay is up."""
    pod = pod_spec(run)
    (container,) = pod["containers"]
    args = dict(a.split("=", 1) for a in container["args"] if "=" in a)
    assert int(args["--exit-timeout-secs"]) == triton.EXIT_TIMEOUT_S
    assert int(args["--grpc-max-connection-age"]) == triton.MAX_CONNECTION_AGE_S * 1000
    assert int(args["--grpc-max-connection-age-grace"]) == triton.MAX_REQUEST_S * 1000
    assert int(container["lifecycle"]["preStop"]["sleep"]["seconds"]) == triton.PRESTOP_PAUSE_S
    assert container["livenessProbe"]["timeoutSeconds"] == triton.HEALTH_CHECK_TIMEOUTS_S["liveness"]
    assert pod["terminationGracePeriodSeconds"] == triton.TERMINATION_GRACE_S <= drain.WORKLOAD_MAX_GRACE_S
    annotations = named(run, SERVICE, "inference-service").inputs["metadata"]["annotations"]
    attributes = annotations["service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"]
    assert attributes == (f"deregistration_delay.timeout_seconds={triton.DEREGISTRATION_DELAY_S},"
                          "deregistration_delay.connection_termination.enabled=true,"
                          "preserve_client_ip.enabled=false")


def test_drains_take_one_ready_replica_at_a_time_and_never_wait_on_one_not_ready(run):
    budget = named(run, "kubernetes:policy/v1:PodDisruptionBudget", "inference-disruption-budget").inputs["spec"]
    assert budget["maxUnavailable"] == 1
    # Replicas that run but are not ready (nothing published yet, a DR secondary awaiting replication) can still be
    # evicted: under the default policy, IfHealthyBudget, no eviction is allowed while none is ready, and every drain
    # of their nodes would wait for its lifecycle hook to time out.
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_pods_are_created_after_their_service_so_each_gets_the_load_balancers_readiness_gate(run):
    """The controller's webhook adds the readiness gate to a pod only when it is created and a TargetGroupBinding for
    its Service exists; the Service's waitFor holds until the controller has made the NLB and the binding."""
    deployment = named(run, DEPLOYMENT, "inference-deployment")
    service = named(run, SERVICE, "inference-service")
    assert service.urn in deployment.dependencies
    assert service.inputs["metadata"]["annotations"]["pulumi.com/waitFor"].endswith(".hostname}")
    # and still after its credentials (Pod Identity serves only pods admitted after the association) and its account
    assert {named(run, "aws:eks/podIdentityAssociation:PodIdentityAssociation", "inference-identity-association").urn,
            named(run, "kubernetes:core/v1:ServiceAccount", "inference-service-account").urn} <= set(
        deployment.dependencies)


def test_pulumi_waits_for_the_load_balancer_not_for_published_models(run):
    """Pods are ready only once a model is published, which `pulumi up` does not do: a new stack, or a DR secondary
    whose models come from its primary later, must still deploy. The DNS record needs the NLB's name."""
    deployment = named(run, DEPLOYMENT, "inference-deployment")
    assert deployment.inputs["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    assert deployment.custom_timeouts == {}
    service = named(run, SERVICE, "inference-service").inputs["metadata"]["annotations"]
    assert service["pulumi.com/waitFor"] == "jsonpath={.status.loadBalancer.ingress[0].hostname}"


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


def test_on_an_mps_pool_triton_leaves_dev_shm_to_the_device_plugin(run):
    """On MPS the device plugin mounts the MPS server's shared memory at /dev/shm (k8s-device-plugin v0.20.0
    internal/plugin/mps.go lines 74-90); a volume of the pod's own there would be mounted over it and Triton's CUDA
    could not reach the server (NVIDIA/k8s-device-plugin#805). The shipped pool (time-sliced) keeps its own."""
    config = stack_config(STACK)
    pools = [{**p, "gpuSharing": {"mode": "mps", "replicas": 2}} if p["name"] == "infer-l40s" else p
             for p in config["gpu-cloud:nodePools"]]
    on_mps = pod_spec(run_stack(STACK, {"gpu-cloud:nodePools": pools}))
    assert not [v for v in on_mps["volumes"] if (v.get("emptyDir") or {}).get("medium") == "Memory"]
    every = [*on_mps["containers"], *on_mps["initContainers"]]
    assert "/dev/shm" not in {m["mountPath"] for c in every for m in c.get("volumeMounts") or []}
    shipped = pod_spec(run)
    [shm] = [v for v in shipped["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": triton.SHM_SIZE}
    assert {"name": "shm", "mountPath": "/dev/shm"} in shipped["containers"][0]["volumeMounts"]


def test_prometheus_scrapes_triton_metrics(run):
    monitor = named(run, SERVICE_MONITOR, "inference-service-monitor")
    metrics = named(run, SERVICE, "inference-metrics")
    assert monitor.inputs["metadata"]["labels"] == dict(monitoring.SELECTOR_LABELS)
    assert monitor.inputs["spec"]["selector"]["matchLabels"] == metrics.inputs["metadata"]["labels"]
    assert monitor.inputs["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}
    assert monitor.inputs["spec"]["endpoints"][0]["port"] == metrics.inputs["spec"]["ports"][0]["name"] == "metrics"
    # Triton serves /metrics on 8002 unless told otherwise (decisions/serving/triton.py: docs/user_guide/metrics.md at
    # v2.71.0).
    assert monitor.inputs["spec"]["endpoints"][0]["path"] == "/metrics"
    (container,) = named(run, DEPLOYMENT, "inference-deployment").inputs["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 8002} in container["ports"]
    assert metrics.inputs["spec"]["ports"][0]["targetPort"] == "metrics"
    assert not [arg for arg in container["args"] if arg.startswith(("--metrics-port", "--allow-metrics"))]


def test_every_model_versions_state_is_scraped_from_a_sidecar_beside_triton(run):
    """The model-ready exporter runs from before Triton starts until after it stops, as nobody on a read-only root,
    asks Triton on loopback, and Prometheus scrapes it through the metrics Service on the port the namespace's
    NetworkPolicy opens to Prometheus."""
    pod = pod_spec(run)
    exporter = pod["initContainers"][-1]
    assert (exporter["name"], exporter["restartPolicy"]) == (triton.EXPORTER_CONTAINER, "Always")
    assert exporter["image"] == triton.EXPORTER_IMAGE and "@sha256:" in exporter["image"]
    assert exporter["command"][:3] == ["python3", "-c", triton.EXPORTER_PROGRAM.read_text()]
    assert exporter["command"][3:5] == ["--triton", "http://127.0.0.1:8000"]
    assert exporter["ports"] == [{"name": "model-ready", "containerPort": 9090}]
    assert 9090 in tenancy.SCRAPE_PORTS["inference"]
    security = exporter["securityContext"]
    assert security["runAsUser"] == 65534 and security["readOnlyRootFilesystem"] is True
    metrics = named(run, SERVICE, "inference-metrics")
    assert {"name": "model-ready", "port": 9090, "targetPort": "model-ready", "protocol": "TCP"} in \
        metrics.inputs["spec"]["ports"]
    monitor = named(run, SERVICE_MONITOR, "inference-service-monitor")
    assert [e["port"] for e in monitor.inputs["spec"]["endpoints"]] == ["metrics", "model-ready"]
    assert {e["path"] for e in monitor.inputs["spec"]["endpoints"]} == {"/metrics"}


def _policy(run, name):
    return json.loads(named(run, ROLE_POLICY, name).inputs["policy"])


def test_triton_reads_the_models_bucket_and_nothing_else(run):
    models = run.outputs["buckets"]["models"]
    statements = _policy(run, "inference-identity-policy")["Statement"]
    assert {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {
        "s3:ListBucket", "s3:GetObject", "kms:Decrypt"}
    resources = {json.dumps(s["Resource"]) for s in statements}
    assert resources == {json.dumps(models["arn"]), json.dumps(models["arn"] + "/*"), json.dumps(models["keyArn"])}
    (decrypt,) = [s for s in statements if s["Action"] == "kms:Decrypt"]
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    # the reader's statements the trainer's reads are made of too (decisions/storage/data_access.py)
    assert statements == data_access.reader_statements("Models", models["arn"], models["keyArn"], "us-east-1")


def test_a_repository_outside_the_stack_is_read_without_a_grant_on_any_key():
    dr = {k: v for k, v in stack_config(STACK)["gpu-cloud:dr"].items() if k != "rpoMinutes"}   # models: no RPO
    run = run_stack(STACK, {"gpu-cloud:inference": {"triton": {
        "enabled": True, "pool": "infer-l40s", "minReplicas": 2, "maxReplicas": 8,
        "modelRepository": "s3://acme-models/triton"}}, "gpu-cloud:dr": dr})
    policy = json.loads(run.one(ROLE_POLICY, "inference-identity-policy").inputs["policy"])
    assert policy == {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListModels", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::acme-models"},
        {"Sid": "ReadModels", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::acme-models/*"}]}


def test_the_load_balancer_controller_is_limited_to_this_stacks_resources(run):
    policy = _policy(run, "lb-controller-identity-policy")
    vpc = run.outputs["vpcId"]
    assert policy == lb_controller.scoped_iam_policy("aws", "us-east-1", "123456789012", vpc, "internal",
                                                     "gpu-cloud-prod-us-east-1")
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


PUBLISHERS = ["arn:aws:iam::123456789012:role/ci-release", "arn:aws:iam::123456789012:role/oncall"]


@pytest.fixture(scope="module")
def published():
    return run_stack(STACK, {"gpu-cloud:inference": {"triton": {
        "enabled": True, "pool": "infer-l40s", "minReplicas": 2, "maxReplicas": 8, "publisherRoleArns": PUBLISHERS}}})


def test_the_named_roles_and_only_they_may_assume_the_model_publisher(published):
    role = published.one("aws:iam/role:Role", "inference-publisher")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust == data_access.publisher_trust_policy(PUBLISHERS)
    assert published.outputs["modelPublisherRoleArn"] == role.state["arn"]


def test_the_publisher_writes_the_stacks_repository_prefix_and_deletes_no_version(published):
    models = published.outputs["buckets"]["models"]
    policy = json.loads(published.one("aws:iam/rolePolicy:RolePolicy", "inference-publisher-policy").inputs["policy"])
    assert policy["Statement"] == data_access.publisher_statements(models["arn"], "triton", models["keyArn"],
                                                                   "us-east-1")


def test_without_named_publishers_there_is_no_publisher_role(run):
    assert [r for r in run.of_type("aws:iam/role:Role") if r.name == "inference-publisher"] == []
    assert "modelPublisherRoleArn" not in run.outputs


def _config_issues(triton_settings):
    from decisions.config.errors import ConfigError
    from decisions.config.validate import load_stack_spec
    from tests.conftest import stack_config
    config = stack_config(STACK)
    keys = {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("gpu-cloud:")}
    keys["inference"] = {"triton": triton_settings}
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(keys, stack=STACK, region=config["aws:region"])
    return {issue.path: issue.message for issue in raised.value.issues}


@pytest.mark.parametrize("settings, words", [
    ({"enabled": True, "pool": "infer-l40s", "publisherRoleArns": ["arn:aws:iam::123456789012:user/ci"]},
     "is not an IAM role ARN"),
    ({"enabled": False, "publisherRoleArns": PUBLISHERS}, "set enabled"),
    ({"enabled": True, "pool": "infer-l40s", "modelRepository": "s3://acme-models/triton",
      "publisherRoleArns": PUBLISHERS},
     "publishes only into its own models bucket, and modelRepository names s3://acme-models/triton"),
    ({"enabled": True, "pool": "infer-l40s", "publisherRoleArns": PUBLISHERS[:1] * 2}, "listed twice"),
])
def test_a_publisher_the_stack_cannot_have_is_a_config_error_at_its_key(settings, words):
    issues = _config_issues(settings)
    (path,) = [p for p in issues if p.startswith("gpu-cloud:inference.triton.publisherRoleArns")]
    assert words in issues[path]


@pytest.mark.parametrize("seconds, allowed", [(0, True), (3600, True), (-1, False), (3601, False)])
def test_the_deregistration_delay_is_one_the_target_group_takes(seconds, allowed):
    if allowed:
        assert lb_controller.deregistration_delay_annotation(seconds, terminate_connections=False) == {
            lb_controller.TARGET_GROUP_ATTRIBUTES: f"deregistration_delay.timeout_seconds={seconds},"
                                                   "deregistration_delay.connection_termination.enabled=false,"
                                                   "preserve_client_ip.enabled=false"}
    else:
        with pytest.raises(ValueError, match="deregistration delay"):
            lb_controller.deregistration_delay_annotation(seconds, terminate_connections=True)
