"""GPU node repair: the controller that reboots or replaces sick GPU nodes within a budget, publishes the gate's
verdicts as metrics and brakes a pool that keeps rejecting its launches.

Every decision (config, IAM, RBAC, the program) comes from decisions/nodes/repair.py; the program is jobs/node_repair.py
and jobs/aws_api.py, shipped in a ConfigMap and run on the standard-library python image. This file only turns them into
resources.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import FrozenSet, Optional, Sequence, Tuple

import pulumi
import pulumi_kubernetes as kubernetes

from components.cluster import SYSTEM_NODE_LABELS
from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from components.monitoring import service_monitor
from components.platform.pod_security import pod_security_context, security_context
from decisions.config.validate import ResolvedPool
from decisions.nodes import capacity_blocks, repair
from decisions.nodes import pools as pool_rules
from decisions.nodes.pods import system_tolerations
from decisions.observability import monitoring
from decisions.platform import pod_security

APP_LABELS = {"app.kubernetes.io/name": repair.NAME, "app.kubernetes.io/part-of": "gpu-cloud"}
MOUNT = f"/opt/{repair.NAME}"
RUN_AS = pod_security.NOBODY     # nobody: the program needs no user of its own


@dataclass(frozen=True)
class NodeRepairArgs:
    cluster_name: pulumi.Input[str]
    cluster_name_plain: str                   # to name the pools' groups (decisions.nodes.pools.asg_name)
    region: str
    partition: str
    account_id: str
    pools: Sequence[ResolvedPool]
    dry_run: bool
    max_per_pool_per_hour: int
    reports_bucket: pulumi.Input[str]         # the artifact bucket, where the gate publishes its verdicts
    reports_bucket_arn: pulumi.Input[str]
    reports_key_arn: pulumi.Input[str]
    monitoring: pulumi.Resource               # the monitoring release: Prometheus and the ServiceMonitor CRD
    launch_first: FrozenSet[str] = frozenset()  # pools whose replacements launch first (pools.launches_first)
    # The capacity-block pools with their end (decisions.nodes.capacity_blocks.blocks): closed before they end.
    capacity_blocks: Tuple[capacity_blocks.Block, ...] = ()


class NodeRepair(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    deployment: kubernetes.apps.v1.Deployment

    def __init__(self, name: str, args: NodeRepairArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        asg_names = [pool_rules.asg_name(args.cluster_name_plain, pool.name) for pool in args.pools]
        blocks = capacity_blocks.controller_additions(
            args.capacity_blocks, cluster_name=args.cluster_name_plain, region=args.region, partition=args.partition,
            account_id=args.account_id, dns_suffix=repair.dns_suffix(args.partition))
        config = pulumi.Output.from_input(args.reports_bucket).apply(lambda bucket: repair.config_json({
            **repair.controller_config(cluster_name=args.cluster_name_plain, region=args.region,
                                       partition=args.partition, pools=args.pools, dry_run=args.dry_run,
                                       max_per_hour=args.max_per_pool_per_hour, reports_bucket=bucket,
                                       launch_first=args.launch_first), **blocks.config}))
        policy = pulumi.Output.all(args.reports_bucket_arn, args.reports_key_arn).apply(
            lambda arns: policy_document(*repair.iam_statements(
                partition=args.partition, region=args.region, account_id=args.account_id, asg_names=asg_names,
                reports_bucket_arn=arns[0], reports_key_arn=arns[1]), *blocks.iam_statements))

        super().__init__("gpu-cloud:node_repair:NodeRepair", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def metadata(object_name: str, namespace: Optional[str] = repair.NAMESPACE):
            return kubernetes.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=APP_LABELS)

        identity = ServiceAccountRole(f"{name}-identity", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=repair.NAMESPACE, service_account=repair.NAME, policy=policy),
            opts=child)
        account = kubernetes.core.v1.ServiceAccount(f"{name}-account", metadata=metadata(repair.NAME), opts=child)
        cluster_role = kubernetes.rbac.v1.ClusterRole(
            f"{name}-cluster-role", metadata=metadata(repair.NAME, None),
            rules=[kubernetes.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"],
                                                     verbs=r["verbs"])
                   for r in (*repair.CLUSTER_RULES, *blocks.cluster_rules)], opts=child)
        role = kubernetes.rbac.v1.Role(
            f"{name}-role", metadata=metadata(repair.NAME),
            rules=[kubernetes.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"],
                                                     resource_names=r.get("resourceNames"), verbs=r["verbs"])
                   for r in repair.NAMESPACE_RULES], opts=child)
        subject = kubernetes.rbac.v1.SubjectArgs(kind="ServiceAccount", name=repair.NAME, namespace=repair.NAMESPACE)
        bindings = [
            kubernetes.rbac.v1.ClusterRoleBinding(
                f"{name}-cluster-binding", metadata=metadata(repair.NAME, None), subjects=[subject],
                role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                                                        name=cluster_role.metadata.name), opts=child),
            kubernetes.rbac.v1.RoleBinding(
                f"{name}-binding", metadata=metadata(repair.NAME), subjects=[subject],
                role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role",
                                                        name=role.metadata.name), opts=child)]
        program = kubernetes.core.v1.ConfigMap(
            f"{name}-program", metadata=metadata(repair.NAME),
            data=config.apply(lambda text: {**repair.program_files(), repair.CONFIG_KEY: text}), opts=child)

        http = kubernetes.core.v1.HTTPGetActionArgs(path="/healthz", port="metrics")
        # Ready while its loop works: a pass that read the nodes' health began within a few intervals
        # (jobs/node_repair.py READY_INTERVALS), so `kubectl get pods` and `pulumi up` see a controller that cannot act.
        ready = kubernetes.core.v1.HTTPGetActionArgs(path="/readyz", port="metrics")
        container = kubernetes.core.v1.ContainerArgs(
            name="controller", image=repair.IMAGE, command=["python3", f"{MOUNT}/node_repair.py"],
            env=[kubernetes.core.v1.EnvVarArgs(name="CONFIG", value=f"{MOUNT}/{repair.CONFIG_KEY}"),
                 kubernetes.core.v1.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1")],
            ports=[kubernetes.core.v1.ContainerPortArgs(name="metrics", container_port=repair.METRICS_PORT)],
            liveness_probe=kubernetes.core.v1.ProbeArgs(http_get=http, period_seconds=30, failure_threshold=3),
            readiness_probe=kubernetes.core.v1.ProbeArgs(http_get=ready, period_seconds=10),
            resources=kubernetes.core.v1.ResourceRequirementsArgs(requests={"cpu": "50m", "memory": "96Mi"},
                                                                   limits={"memory": "256Mi"}),
            # It keeps its service-account token: it calls the API (decisions/platform/pod_security.API_CALLERS).
            security_context=security_context(pod_security.container_security_context(RUN_AS)),
            volume_mounts=[kubernetes.core.v1.VolumeMountArgs(name="program", mount_path=MOUNT, read_only=True)])
        self.deployment = kubernetes.apps.v1.Deployment(
            f"{name}-deployment", metadata=metadata(repair.NAME),
            spec=kubernetes.apps.v1.DeploymentSpecArgs(
                # One writer of the state ConfigMap: the old pod goes before the new one starts.
                replicas=1, strategy=kubernetes.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=kubernetes.meta.v1.LabelSelectorArgs(match_labels=APP_LABELS),
                template=kubernetes.core.v1.PodTemplateSpecArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(
                        labels=APP_LABELS,
                        # a new program or config restarts the pod
                        annotations={"gpu-cloud.io/program": program.data.apply(_digest)}),
                    spec=kubernetes.core.v1.PodSpecArgs(
                        service_account_name=repair.NAME, containers=[container], node_selector=SYSTEM_NODE_LABELS,
                        security_context=pod_security_context(pod_security.pod_security_context(RUN_AS)),
                        # the system nodes' taint (decisions/nodes/pods.py)
                        tolerations=[kubernetes.core.v1.TolerationArgs(**t) for t in system_tolerations()],
                        volumes=[kubernetes.core.v1.VolumeArgs(
                            name="program", config_map=kubernetes.core.v1.ConfigMapVolumeSourceArgs(
                                name=program.metadata.name, default_mode=0o444))]))),
            # Pod Identity hands out credentials only to pods admitted after the association exists. After Prometheus:
            # the pod is ready only once a pass has read it, and `pulumi up` waits for a ready pod.
            opts=pulumi.ResourceOptions(parent=self,
                                        depends_on=[identity, account, program, *bindings, args.monitoring]))

        metrics = kubernetes.core.v1.Service(
            f"{name}-metrics", metadata=metadata(repair.NAME),
            # An unready controller is scraped still: its errors and GpuRepairControllerDown are what explain it.
            spec=kubernetes.core.v1.ServiceSpecArgs(
                selector=APP_LABELS, publish_not_ready_addresses=True, ports=[kubernetes.core.v1.ServicePortArgs(
                    name="metrics", port=repair.METRICS_PORT, target_port="metrics", protocol="TCP")]), opts=child)
        service_monitor(f"{name}-service-monitor", repair.NAME, repair.NAMESPACE,
                        monitoring.service_monitor_spec(repair.NAMESPACE, APP_LABELS, "metrics"),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=[args.monitoring, metrics]))

        self.register_outputs({"dryRun": args.dry_run, "maxPerPoolPerHour": args.max_per_pool_per_hour,
                               "pools": sorted(p.name for p in args.pools)})


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
