"""Inference: Triton Inference Server on the stack's inference pool, behind an NLB from the AWS Load Balancer
Controller (components/serving/lb_controller.py), scaled on its own queue time through prometheus-adapter.

Decisions come from decisions/serving/triton.py (server, pod, the models' copy, drains, autoscaling metric),
decisions/serving/lb_controller.py (controller values, IAM, Service annotations) and decisions/storage/data_access.py
(the model publisher); this file only turns them into resources.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from components.monitoring import service_monitor
from components.platform.pod_security import empty_dir, pod_security_context, security_context
from decisions.catalog import charts
from decisions.catalog.catalog import Catalog
from decisions.config.model import Triton
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import POOL_LABEL, node_labels, node_taints, offered_gpu_resources, toleration
from decisions.observability import monitoring
from decisions.platform import pod_security
from decisions.serving import failover, lb_controller, triton
from decisions.storage import data_access

APP_LABELS = {"app.kubernetes.io/name": "triton", "app.kubernetes.io/part-of": "gpu-cloud"}


@dataclass(frozen=True)
class ModelRepository:
    uri: pulumi.Input[str]                    # s3://bucket/prefix
    bucket_arn: pulumi.Input[str]
    key_arn: Optional[pulumi.Input[str]]      # the stack's models key; None for a repository outside the stack
    # The stack's own repository's key prefix, where its publisher writes (None for a repository outside the stack).
    own_prefix: Optional[str] = None


@dataclass(frozen=True)
class InferenceArgs:
    cluster_name: pulumi.Input[str]
    region: str
    namespace: pulumi.Input[str]              # the inference namespace (Tenancy), so objects wait for it
    namespace_name: str
    pool: ResolvedPool                        # the inference pool Triton runs on
    catalog: Catalog
    settings: Triton
    repository: ModelRepository
    load_balancer_tags: Mapping[str, str]     # the stack's tags, for the NLB the controller creates
    # who may connect to the NLB (decisions/serving/lb_controller.py load_balancer_source_ranges)
    load_balancer_source_ranges: Sequence[str]
    monitoring: pulumi.Resource               # the monitoring stack: Prometheus and the ServiceMonitor CRD
    # the AWS Load Balancer Controller's release (components/serving/lb_controller.py)
    lb_controller: pulumi.Resource


class Inference(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    service: kubernetes.core.v1.Service
    endpoint: pulumi.Output[str]
    publisher: Optional[aws.iam.Role]         # the model publisher role, when the stack names who may assume it

    def __init__(self, name: str, args: InferenceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        settings, pool = args.settings, args.pool
        pod_resources = triton.pod_resources(pool.primary_type, offered_gpu_resources(pool, args.catalog))
        shm_size = triton.shm_size(pool)
        adapter_pin = charts.chart(charts.PROMETHEUS_ADAPTER)
        annotations = {
            **lb_controller.nlb_service_annotations(
                settings.scheme, health_path=failover.HEALTH_PATH, health_port=triton.HTTP_PORT,
                interval_s=failover.TARGET_CHECK_INTERVAL_S, unhealthy_threshold=failover.TARGET_UNHEALTHY_THRESHOLD,
                extra_tags=args.load_balancer_tags),
            **lb_controller.deregistration_delay_annotation(triton.DEREGISTRATION_DELAY_S, terminate_connections=True),
            # Pulumi waits for the load balancer's name, which the DNS record needs, and not for ready pods: they are
            # ready only once a model is published (decisions/serving/triton.py), which `pulumi up` does not do. Its own
            # Service await would (pulumi-kubernetes v4.32.0 provider/pkg/await/service.go lines 411-418), and a custom
            # condition replaces it (provider/pkg/metadata/overrides.go lines 81-112, await/await.go lines 321-333).
            "pulumi.com/waitFor": "jsonpath={.status.loadBalancer.ingress[0].hostname}"}

        super().__init__("gpu-cloud:inference:Inference", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # The sync containers read the model repository and nothing else; Triton itself gets no credentials.
        repository_arns = pulumi.Output.all(args.repository.bucket_arn, args.repository.key_arn)
        reader_policy = repository_arns.apply(lambda arns: policy_document(*data_access.reader_statements(
            "Models", arns[0], arns[1], args.region)))
        service_account = kubernetes.core.v1.ServiceAccount(
            f"{name}-service-account", metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name=triton.SERVICE_ACCOUNT, namespace=args.namespace, labels=APP_LABELS), opts=child)
        identity = ServiceAccountRole(f"{name}-identity", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=args.namespace_name, service_account=triton.SERVICE_ACCOUNT,
            policy=reader_policy), opts=child)

        # The one writer of the repository: a role the stack's named principals assume
        # (decisions/storage/data_access.py). Only with the stack's own repository (decisions/config/model.py refuses
        # publisherRoleArns with modelRepository).
        self.publisher = None
        if settings.publisher_role_arns:
            self.publisher = aws.iam.Role(
                f"{name}-publisher", description="Publishes Triton's models (inference.triton.publisherRoleArns)",
                assume_role_policy=json.dumps(data_access.publisher_trust_policy(settings.publisher_role_arns)),
                opts=child)
            aws.iam.RolePolicy(f"{name}-publisher-policy", role=self.publisher.id, policy=repository_arns.apply(
                lambda arns: policy_document(*data_access.publisher_statements(
                    arns[0], args.repository.own_prefix, arns[1], args.region))), opts=child)

        in_namespace = lambda object_name, labels=APP_LABELS: kubernetes.meta.v1.ObjectMetaArgs(  # noqa: E731
            name=object_name, namespace=args.namespace, labels=dict(labels))
        selector = kubernetes.meta.v1.LabelSelectorArgs(match_labels=APP_LABELS)
        probe = lambda path, **timing: kubernetes.core.v1.ProbeArgs(  # noqa: E731
            http_get=kubernetes.core.v1.HTTPGetActionArgs(path=path, port="http"), **timing)
        # Hardened as decisions/platform/pod_security.py says: Triton as its image's user (1000), the sync containers as
        # nobody, read-only roots with /tmp as an emptyDir each, every capability dropped.
        run_as_triton = security_context(pod_security.container_security_context(triton.RUN_AS_USER))
        run_as_sync = security_context(pod_security.container_security_context(triton.SYNC_RUN_AS))
        tmp_mount = lambda volume: kubernetes.core.v1.VolumeMountArgs(name=volume, mount_path="/tmp")  # noqa: E731
        models_mount = lambda read_only: kubernetes.core.v1.VolumeMountArgs(  # noqa: E731
            name="models", mount_path=triton.MODELS_MOUNT, read_only=read_only)
        sync_env = pulumi.Output.from_input(args.repository.uri).apply(
            lambda uri: [kubernetes.core.v1.EnvVarArgs(name=key, value=value)
                         for key, value in sorted(triton.sync_env(uri, args.region).items())])
        sync_resources = kubernetes.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "250m", "memory": "256Mi"}, limits={"memory": "1Gi"})
        # The first copy before Triton starts (a repository it cannot read fails the pod here, in its logs), then
        # a sidecar (an init container that keeps running) that follows the repository.
        first_sync = kubernetes.core.v1.ContainerArgs(
            name=triton.FIRST_SYNC_CONTAINER, image=triton.SYNC_IMAGE, command=triton.sync_command("once"),
            env=sync_env, resources=sync_resources, security_context=run_as_sync,
            volume_mounts=[models_mount(False), tmp_mount("sync-tmp")])
        sync = kubernetes.core.v1.ContainerArgs(
            name=triton.SYNC_CONTAINER, image=triton.SYNC_IMAGE, command=triton.sync_command("loop"), env=sync_env,
            restart_policy="Always", resources=sync_resources, security_context=run_as_sync,
            readiness_probe=kubernetes.core.v1.ProbeArgs(
                exec_=kubernetes.core.v1.ExecActionArgs(command=triton.SYNC_FRESH_COMMAND), period_seconds=30),
            volume_mounts=[models_mount(False), tmp_mount("sync-tmp")])
        # Every model version's state for Prometheus (TritonModelNotReady): a native sidecar too, so it runs from
        # before Triton starts until after it has stopped.
        exporter = kubernetes.core.v1.ContainerArgs(
            name=triton.EXPORTER_CONTAINER, image=triton.EXPORTER_IMAGE, command=triton.exporter_command(),
            restart_policy="Always", security_context=run_as_sync,
            ports=[kubernetes.core.v1.ContainerPortArgs(name=triton.EXPORTER_PORT_NAME,
                                                        container_port=triton.EXPORTER_PORT)],
            resources=kubernetes.core.v1.ResourceRequirementsArgs(
                requests={"cpu": "50m", "memory": "64Mi"}, limits={"memory": "128Mi"}))
        container = kubernetes.core.v1.ContainerArgs(
            name=triton.NAME, image=triton.IMAGE,
            command=["tritonserver"], args=triton.server_args(),
            env=[kubernetes.core.v1.EnvVarArgs(name=key, value=value) for key, value in triton.TRITON_ENV.items()],
            ports=[kubernetes.core.v1.ContainerPortArgs(name=port_name, container_port=port)
                   for port_name, port in triton.PORTS.items()],
            # Loading the models can take minutes: the startup probe waits for the server, then readiness asks for a
            # model that serves.
            startup_probe=probe(triton.READY_PATH, period_seconds=triton.STARTUP_PROBE_PERIOD_S,
                                failure_threshold=triton.STARTUP_PROBES),
            readiness_probe=kubernetes.core.v1.ProbeArgs(
                exec_=kubernetes.core.v1.ExecActionArgs(command=triton.MODEL_READY_COMMAND), period_seconds=5,
                timeout_seconds=5, failure_threshold=3),
            liveness_probe=probe(triton.LIVE_PATH, period_seconds=10, failure_threshold=3,
                                 timeout_seconds=triton.LIVENESS_TIMEOUT_S),
            # Serve on until every connection the NLB may still open has closed (the serving contract); SIGTERM
            # comes after.
            lifecycle=kubernetes.core.v1.LifecycleArgs(pre_stop=kubernetes.core.v1.LifecycleHandlerArgs(
                sleep=kubernetes.core.v1.SleepActionArgs(seconds=triton.PRESTOP_PAUSE_S))),
            resources=kubernetes.core.v1.ResourceRequirementsArgs(
                requests=pod_resources, limits={k: v for k, v in pod_resources.items() if k != "cpu"}),
            security_context=run_as_triton,
            volume_mounts=[*([kubernetes.core.v1.VolumeMountArgs(name="shm", mount_path="/dev/shm")] if shm_size
                             else []), models_mount(True), tmp_mount("tmp")])

        # Clients: HTTP and gRPC through the NLB. After the controller: its webhook and its cleanup of the NLB on
        # delete both need it running.
        self.service = kubernetes.core.v1.Service(
            f"{name}-service", metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name=triton.NAME, namespace=args.namespace, labels=APP_LABELS, annotations=annotations),
            spec=kubernetes.core.v1.ServiceSpecArgs(
                type="LoadBalancer", load_balancer_class=lb_controller.LOAD_BALANCER_CLASS, selector=APP_LABELS,
                load_balancer_source_ranges=list(args.load_balancer_source_ranges),
                ports=[kubernetes.core.v1.ServicePortArgs(name=port_name, port=triton.PORTS[port_name],
                                                          target_port=port_name, protocol="TCP")
                       for port_name in ("http", "grpc")]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.lb_controller]))
        self.endpoint = self.service.status.load_balancer.ingress[0].hostname

        self.deployment = kubernetes.apps.v1.Deployment(
            f"{name}-deployment",
            # Ready pods need published models, which `pulumi up` does not put there (see the Service's waitFor).
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=triton.NAME, namespace=args.namespace, labels=APP_LABELS,
                                                       annotations={"pulumi.com/skipAwait": "true"}),
            spec=kubernetes.apps.v1.DeploymentSpecArgs(
                replicas=settings.min_replicas, selector=selector,
                template=kubernetes.core.v1.PodTemplateSpecArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(labels=APP_LABELS,
                                                               annotations=dict([triton.POD_IDENTITY_SKIP])),
                    spec=kubernetes.core.v1.PodSpecArgs(
                        service_account_name=triton.SERVICE_ACCOUNT, init_containers=[first_sync, sync, exporter],
                        # Nothing here calls the Kubernetes API; the sync containers' AWS credentials come through
                        # Pod Identity's own token volume (decisions/platform/pod_security.py).
                        automount_service_account_token=False,
                        security_context=pod_security_context(pod_security.pod_security_context(triton.RUN_AS_USER)),
                        containers=[container],
                        node_selector={POOL_LABEL: node_labels(pool)[POOL_LABEL]},
                        tolerations=[kubernetes.core.v1.TolerationArgs(**toleration(t)) for t in node_taints(pool)],
                        # Spread replicas over nodes so one node's loss takes one replica.
                        topology_spread_constraints=[kubernetes.core.v1.TopologySpreadConstraintArgs(
                            max_skew=1, topology_key="kubernetes.io/hostname", when_unsatisfiable="ScheduleAnyway",
                            label_selector=selector)],
                        termination_grace_period_seconds=triton.TERMINATION_GRACE_S,
                        # /dev/shm of its own, except on MPS pools, where the device plugin mounts the MPS server's.
                        volumes=[*([kubernetes.core.v1.VolumeArgs(name="shm", empty_dir=kubernetes.core.v1.EmptyDirVolumeSourceArgs(
                                     medium="Memory", size_limit=shm_size))] if shm_size else []),
                                 kubernetes.core.v1.VolumeArgs(name="models", empty_dir=kubernetes.core.v1.EmptyDirVolumeSourceArgs()),
                                 empty_dir("tmp", triton.TRITON_TMP_SIZE),
                                 empty_dir("sync-tmp", triton.SYNC_TMP_SIZE)]))),
            # The autoscaler owns the replica count once it runs (a second `pulumi up` must not reset it).
            # After the Service: the controller's webhook gives a pod its readiness gate only when the pod is created
            # and a TargetGroupBinding for its Service exists (v3.5.0 docs/deploy/pod_readiness_gate.md lines 39-48).
            # The Service's waitFor ends once the controller reports the NLB, which it does after deploying the binding
            # (controllers/service/service_controller.go lines 188, 213; pkg/deploy/stack_deployer.go line 151).
            opts=pulumi.ResourceOptions(parent=self, depends_on=[identity, service_account, self.service],
                                        ignore_changes=["spec.replicas"]))
        # Drains (scale-in, spot, refresh) take one ready replica at a time. Running replicas that are not ready (no
        # model published yet, a DR secondary awaiting replication, a stale sync) may always be evicted: with the
        # default policy (IfHealthyBudget) the eviction API refuses every eviction while none is ready, and drains
        # stall until their lifecycle hook times out (kubernetes.io, "Specifying a Disruption Budget for your
        # Application", "Unhealthy Pod Eviction Policy"; policy/v1, GA in 1.31). So it never blocks a drain outright.
        kubernetes.policy.v1.PodDisruptionBudget(
            f"{name}-disruption-budget", metadata=in_namespace(triton.NAME),
            spec=kubernetes.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=selector, unhealthy_pod_eviction_policy="AlwaysAllow"), opts=child)

        # Metrics stay inside the cluster: their own Service, scraped by the stack's Prometheus. After the
        # controller too: its Service webhook covers this namespace and refuses creates while it is not answering.
        metrics_labels = {**APP_LABELS, "app.kubernetes.io/component": "metrics"}
        metrics_service = kubernetes.core.v1.Service(
            f"{name}-metrics", metadata=in_namespace(f"{triton.NAME}-metrics", metrics_labels),
            spec=kubernetes.core.v1.ServiceSpecArgs(
                selector=APP_LABELS, ports=[kubernetes.core.v1.ServicePortArgs(
                    name=port_name, port=port, target_port=port_name, protocol="TCP")
                    for port_name, port in (("metrics", triton.PORTS["metrics"]),
                                            (triton.EXPORTER_PORT_NAME, triton.EXPORTER_PORT))]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.lb_controller]))
        service_monitor(f"{name}-service-monitor", triton.NAME, args.namespace,
                        triton.metrics_monitor_spec(args.namespace_name, metrics_labels),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[args.monitoring, metrics_service]))

        # Queue time per request as a custom metric, and the autoscaler on it.
        adapter = pinned_release(
            f"{name}-prometheus-adapter", adapter_pin, release_name=triton.ADAPTER_RELEASE_NAME,
            namespace=monitoring.NAMESPACE,
            values=triton.prometheus_adapter_values(monitoring.PROMETHEUS_URL, monitoring.PROMETHEUS_PORT,
                                                    SYSTEM_NODE_LABELS),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.monitoring]))
        self.autoscaler = kubernetes.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-autoscaler", metadata=in_namespace(triton.NAME),
            spec=kubernetes.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                scale_target_ref=kubernetes.autoscaling.v2.CrossVersionObjectReferenceArgs(
                    api_version="apps/v1", kind="Deployment", name=self.deployment.metadata.name),
                min_replicas=settings.min_replicas, max_replicas=settings.max_replicas,
                metrics=[kubernetes.autoscaling.v2.MetricSpecArgs(
                    type="Pods", pods=kubernetes.autoscaling.v2.PodsMetricSourceArgs(
                        metric=kubernetes.autoscaling.v2.MetricIdentifierArgs(name=triton.QUEUE_METRIC),
                        target=kubernetes.autoscaling.v2.MetricTargetArgs(
                            type="AverageValue", average_value=triton.hpa_target(settings.target_queue_ms))))]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[adapter]))

        self.register_outputs({"endpoint": self.endpoint, "image": triton.IMAGE,
                               "replicas": {"min": settings.min_replicas, "max": settings.max_replicas},
                               "publisherRoleArn": self.publisher.arn if self.publisher else None})
