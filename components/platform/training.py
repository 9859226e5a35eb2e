"""Training on the cluster, in two parts the deploy order needs apart.

`TrainingOperators`: the MPI Operator, the JobSet controller and Kueue, and the Job that waits until Kueue's
webhooks answer. Created
before the team namespaces, which depend on them: a destroy then deletes the namespaces while Kueue still runs,
so the Workloads teams left behind lose their finalizers and the namespaces finish deleting (Kueue's CRDs go
with its chart).

`TrainingQueue`: one ResourceFlavor per pool of the queue, the AdmissionCheck on the capacity blocks' flavors where the
stack has a block, the `training` ClusterQueue over them, its LocalQueues
in the training namespace (`training`, and `default` for jobs without the label), the WorkloadPriorityClasses jobs
may pick, and the NCCL acceptance test's standing parts (the judge's ConfigMap and
service account, one NVLink-check CronJob per NVLink pool, and on EFA pools that keep two nodes a CronJob that starts
the across-node test, with the account that may start it).

What is queued where, and why, is in decisions/platform/kueue.py; this file only turns it into resources, in the order
the API server needs: the MPIJob and JobSet CRDs before Kueue starts (Kueue starts an integration's controller only once
it finds the CRD, polling with backoff until then: kubernetes-sigs/kueue v0.19.2 pkg/controller/jobframework/setup.go
lines 86-102 and 155-174), Kueue's CRDs and answering webhooks before its custom resources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import pulumi
import pulumi_kubernetes as kubernetes
from pulumi_kubernetes.helm.v3 import Release

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from components.platform.release_manifest import KubernetesObject, ReleaseManifest, ReleaseManifestArgs
from decisions.catalog import charts
from decisions.platform import acceptance, kueue
from decisions.platform.tenancy import TRAINING_NAMESPACE


@dataclass(frozen=True)
class TrainingQueueArgs:
    flavors: Tuple[kueue.Flavor, ...]          # decisions.platform.kueue.flavors(pools, catalog), in admission order
    operators: "TrainingOperators"             # Kueue, whose answering webhooks the flavors and queue wait for
    # decisions.platform.acceptance CronJob manifests, one per NVLink pool
    nvlink_checks: Tuple[Mapping[str, Any], ...] = ()
    # decisions.platform.acceptance CronJob manifests, one per EFA pool
    across_node_checks: Tuple[Mapping[str, Any], ...] = ()
    priority_classes: Tuple[kueue.PriorityClass, ...] = kueue.PRIORITY_CLASSES

    @classmethod
    def for_pools(cls, pools: Sequence, catalog, *, operators: "TrainingOperators", nvlink_schedule: Optional[str],
                  across_node_schedule: str) -> "TrainingQueueArgs":
        """From the stack's pools: the NVLink check on every queue pool it can run on, suspended where it does not
        run by itself (decisions.platform.acceptance.nvlink_check_schedule), and the across-node check on
        `across_node_schedule` on the pools that keep two nodes
        (decisions.platform.acceptance.across_node_check_pools)."""
        def check(pool) -> Mapping[str, Any]:
            schedule = acceptance.nvlink_check_schedule(pool, nvlink_schedule)
            return acceptance.nvlink_cronjob_manifest(
                pool, catalog, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
                schedule=schedule or acceptance.DEFAULT_NVLINK_SCHEDULE, suspend=schedule is None,
                judge_configmap=acceptance.JUDGE_CONFIGMAP, service_account=acceptance.SERVICE_ACCOUNT)

        checks = tuple(check(pool) for pool in acceptance.nvlink_check_pools(pools, catalog))
        across = tuple(acceptance.across_node_cronjob_manifest(
            pool, catalog, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, schedule=across_node_schedule,
            judge_configmap=acceptance.JUDGE_CONFIGMAP, service_account=acceptance.SERVICE_ACCOUNT,
            scheduler_account=acceptance.SCHEDULER_SERVICE_ACCOUNT)
            for pool in acceptance.across_node_check_pools(pools, catalog))
        return cls(flavors=kueue.flavors(pools, catalog), operators=operators, nvlink_checks=checks,
                   across_node_checks=across)


@dataclass(frozen=True)
class TrainingOperatorsArgs:
    driver_source: str                         # gpuDriver.source: sizes Kueue's pods-ready timeouts


class TrainingOperators(pulumi.ComponentResource):
    """The MPI Operator, the JobSet controller, Kueue, and the wait for Kueue's webhooks. The Kubernetes provider
    comes from the caller (`opts.providers["kubernetes"]`); children inherit it. The MPI Operator and the JobSet
    controller come from the repository's copies of their release manifests, object by object, their Deployments on
    the system nodes (components/platform/release_manifest.py)."""
    mpi_operator: ReleaseManifest
    jobset: ReleaseManifest
    release: Release
    webhooks_ready: kubernetes.batch.v1.Job

    def __init__(self, name: str, args: TrainingOperatorsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        values = kueue.kueue_values(SYSTEM_NODE_LABELS, args.driver_source)
        pin, mpi = charts.chart(charts.KUEUE), charts.manifest(charts.MPI_OPERATOR)
        jobset = charts.manifest(charts.JOBSET)
        manifests = {key: ReleaseManifestArgs(manifest=key, system_node_labels=SYSTEM_NODE_LABELS)
                     for key in (charts.MPI_OPERATOR, charts.JOBSET)}
        probe_job = kueue.webhook_probe_job(SYSTEM_NODE_LABELS, pin.app_version)
        probe_script = kueue.webhook_probe_configmap()

        super().__init__("gpu-cloud:training:TrainingOperators", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.mpi_operator = ReleaseManifest(f"{name}-mpi-operator", manifests[charts.MPI_OPERATOR], opts=child)
        self.jobset = ReleaseManifest(f"{name}-jobset", manifests[charts.JOBSET], opts=child)
        namespace = kubernetes.core.v1.Namespace(
            f"{name}-kueue-namespace", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=kueue.NAMESPACE), opts=child)
        # After both manifests, their controllers ready: Kueue finds the MPIJob and JobSet CRDs when it starts.
        self.release = pinned_release(
            f"{name}-kueue", pin, release_name=kueue.RELEASE_NAME, namespace=kueue.NAMESPACE, values=values,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[namespace, self.mpi_operator, self.jobset]))
        self.webhooks_ready = self._webhook_probe(name, namespace, probe_job, probe_script)

        self.register_outputs({"kueueChartVersion": pin.version, "mpiOperatorVersion": mpi.version,
                               "jobsetVersion": jobset.version, "webhookProbe": kueue.WEBHOOK_PROBE})

    def _webhook_probe(self, name: str, namespace: kubernetes.core.v1.Namespace, job: Mapping[str, Any],
                       script: Mapping[str, Any]) -> kubernetes.batch.v1.Job:
        """The probe's script, its account (may create ResourceFlavors: a dry run is authorized as a real create),
        and the Job, which pulumi waits for until it completes (pulumi-kubernetes' Job await: Complete)."""
        child = pulumi.ResourceOptions(parent=self)
        metadata = kubernetes.meta.v1.ObjectMetaArgs(name=kueue.WEBHOOK_PROBE, namespace=namespace.metadata.name)
        configmap = kubernetes.core.v1.ConfigMap(f"{name}-webhook-probe", metadata=metadata, data=script["data"],
                                                 opts=child)
        account = kubernetes.core.v1.ServiceAccount(f"{name}-webhook-probe", metadata=metadata, opts=child)
        role = kubernetes.rbac.v1.ClusterRole(
            f"{name}-webhook-probe", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=kueue.WEBHOOK_PROBE),
            rules=[kubernetes.rbac.v1.PolicyRuleArgs(api_groups=rule["apiGroups"], resources=rule["resources"],
                                                     verbs=rule["verbs"]) for rule in kueue.WEBHOOK_PROBE_RBAC_RULES],
            opts=child)
        binding = kubernetes.rbac.v1.ClusterRoleBinding(
            f"{name}-webhook-probe", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=kueue.WEBHOOK_PROBE),
            role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole",
                                                    name=role.metadata.name),
            subjects=[kubernetes.rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name,
                                                     namespace=kueue.NAMESPACE)], opts=child)
        timeout = f"{kueue.WEBHOOK_PROBE_TIMEOUT_S}s"
        return kubernetes.batch.v1.Job(
            f"{name}-webhook-ready",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=job["metadata"]["name"], namespace=namespace.metadata.name,
                                                       labels=job["metadata"]["labels"],
                                                       # replaceUnready: a failed probe is replaced on the next up
                                                       # (decisions/platform/kueue.py WEBHOOK_PROBE_ANNOTATIONS).
                                                       annotations=job["metadata"]["annotations"]),
            spec=job["spec"],
            # A new Kueue or probe replaces the Job under the same name, so the old one goes first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release, configmap, binding],
                                        delete_before_replace=True,
                                        custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout)))


class TrainingQueue(pulumi.ComponentResource):
    """Kueue's custom resources and the NCCL acceptance test's standing parts, registered in two steps that the team
    namespaces go between (layers.platform):

    1. the constructor: the flavors, the priority classes and the ClusterQueue, all cluster-scoped; the team
       namespaces then depend on `cluster_queue` (a Tenancy controller);
    2. `serve(training_namespace)`: what the training namespace holds, its LocalQueues and the acceptance CronJobs
       and accounts; then the outputs.

    So a destroy deletes the training namespace, and with it every Workload that reserves quota, before the
    ClusterQueue. Kueue keeps its finalizer kueue.x-k8s.io/resource-in-use on a ClusterQueue being deleted until no
    workload reserves its quota (kubernetes-sigs/kueue v0.19.2 pkg/controller/core/clusterqueue_controller.go lines
    193-205), so a ClusterQueue deleted first would hold the destroy, while jobs run, for the provider's delete
    timeout and then fail it. A ResourceFlavor is held likewise while a ClusterQueue uses it
    (resourceflavor_controller.go lines 107-117), which the ClusterQueue's dependency on its flavors orders.
    The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    flavors: Dict[str, kubernetes.apiextensions.CustomResource]
    admission_check: Optional[kubernetes.apiextensions.CustomResource]
    cluster_queue: kubernetes.apiextensions.CustomResource
    local_queues: Dict[str, kubernetes.apiextensions.CustomResource]
    priority_classes: Dict[str, KubernetesObject]
    nvlink_checks: Dict[str, kubernetes.batch.v1.CronJob]
    across_node_checks: Dict[str, kubernetes.batch.v1.CronJob]

    def __init__(self, name: str, args: TrainingQueueArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        queue_spec = kueue.cluster_queue_spec(args.flavors)

        super().__init__("gpu-cloud:training:TrainingQueue", name, None, opts)
        self._name, self._args, self._served = name, args, False

        # Created once Kueue's webhooks answer: a create they refuse is not retried.
        after_kueue = pulumi.ResourceOptions(parent=self, depends_on=[args.operators.webhooks_ready])
        self.flavors = {flavor.name: self._custom(f"{name}-flavor-{flavor.name}", "ResourceFlavor", flavor.name,
                                                  kueue.resource_flavor_spec(flavor), after_kueue)
                        for flavor in args.flavors}
        # A WorkloadPriorityClass carries its fields beside metadata, not under spec (components/platform/
        # release_manifest.py KubernetesObject says why that needs its own class).
        self.priority_classes = {priority.name: KubernetesObject(f"{name}-priority-{priority.name}", {
            "apiVersion": kueue.API_VERSION, "kind": "WorkloadPriorityClass",
            "metadata": kubernetes.meta.v1.ObjectMetaArgs(name=priority.name), "value": priority.value,
            "description": priority.description}, after_kueue) for priority in args.priority_classes}
        # The capacity blocks' check (decisions/nodes/capacity_blocks.py), before the ClusterQueue that names it.
        self.admission_check = self._custom(
            f"{name}-admission-check", "AdmissionCheck", kueue.ADMISSION_CHECK, kueue.admission_check_spec(),
            after_kueue) if kueue.block_flavors(args.flavors) else None
        self.cluster_queue = self._custom(
            f"{name}-cluster-queue", "ClusterQueue", kueue.CLUSTER_QUEUE, queue_spec,
            pulumi.ResourceOptions(parent=self, depends_on=[args.operators.webhooks_ready, *self.flavors.values(),
                                                            *([self.admission_check] if self.admission_check else [])]))

    def serve(self, training_namespace: pulumi.Input[str]) -> None:
        """The training namespace's half (`training_namespace`: the Namespace resource's name output, so each object
        waits for it), then the component's outputs. Called once."""
        if self._served:
            raise ValueError(f"TrainingQueue {self._name} already serves its namespace")
        self._served = True
        name, args = self._name, self._args
        # The priority classes first: a job naming one that does not exist yet gets no Workload. The `training`
        # queue was "<name>-local-queue" while it was the only one: the alias keeps it rather than create it anew
        # beside itself.
        self.local_queues = {queue: self._custom(
            f"{name}-local-queue-{queue}", "LocalQueue", queue, kueue.local_queue_spec(), pulumi.ResourceOptions(
                parent=self, depends_on=[self.cluster_queue, *self.priority_classes.values()],
                aliases=[pulumi.Alias(name=f"{name}-local-queue")] if queue == kueue.LOCAL_QUEUE else None),
            namespace=training_namespace) for queue in kueue.LOCAL_QUEUES}

        self.nvlink_checks, self.across_node_checks = self._acceptance(name, args, training_namespace,
                                                                       after=tuple(self.local_queues.values()))

        self.register_outputs({
            "flavors": list(self.flavors),
            "admissionChecks": [kueue.ADMISSION_CHECK] if self.admission_check else [],
            "clusterQueue": kueue.CLUSTER_QUEUE,
            "localQueues": list(self.local_queues),
            "priorityClasses": list(self.priority_classes),
            "nvlinkChecks": [check["metadata"]["name"] for check in args.nvlink_checks],
            "acrossNodeChecks": [check["metadata"]["name"] for check in args.across_node_checks],
        })

    def _acceptance(self, name: str, args: TrainingQueueArgs, namespace: pulumi.Input[str],
                    after: Iterable[pulumi.Resource]
                    ) -> Tuple[Dict[str, kubernetes.batch.v1.CronJob], Dict[str, kubernetes.batch.v1.CronJob]]:
        """The judge script, its service account (allowed to post Events, nothing else), the NVLink checks, and the
        across-node checks with their own account (allowed to list and create MPIJobs, nothing else)."""
        judge = acceptance.judge_configmap_manifest(acceptance.JUDGE_CONFIGMAP, TRAINING_NAMESPACE)
        configmap = kubernetes.core.v1.ConfigMap(
            f"{name}-nccl-judge", metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name=acceptance.JUDGE_CONFIGMAP, namespace=namespace),
            data=judge["data"], opts=pulumi.ResourceOptions(parent=self))
        binding = self._account(name, "nccl-acceptance", acceptance.SERVICE_ACCOUNT, acceptance.JUDGE_RBAC_RULES,
                                namespace, automount=False)
        nvlink = self._cronjobs(name, args.nvlink_checks, namespace,
                                pulumi.ResourceOptions(parent=self, depends_on=[configmap, binding, *after]))
        if not args.across_node_checks:     # the account exists only where a check uses it
            return nvlink, {}
        scheduler = self._account(name, "nccl-scheduler", acceptance.SCHEDULER_SERVICE_ACCOUNT,
                                  acceptance.SCHEDULER_RBAC_RULES, namespace, automount=True)
        # The MPIJobs they create run the judge as the judge's account, so they wait for both.
        across = self._cronjobs(name, args.across_node_checks, namespace, pulumi.ResourceOptions(
            parent=self, depends_on=[configmap, binding, scheduler, *after]))
        return nvlink, across

    def _account(self, name: str, resource_name: str, account_name: str, rules: Sequence[Mapping[str, Any]],
                 namespace: pulumi.Input[str], automount: bool) -> kubernetes.rbac.v1.RoleBinding:
        """A service account in the training namespace bound to a Role of exactly `rules`; returns the binding."""
        child = pulumi.ResourceOptions(parent=self)
        metadata = kubernetes.meta.v1.ObjectMetaArgs(name=account_name, namespace=namespace)
        account = kubernetes.core.v1.ServiceAccount(f"{name}-{resource_name}", metadata=metadata,
                                                    automount_service_account_token=automount, opts=child)
        role = kubernetes.rbac.v1.Role(
            f"{name}-{resource_name}-role", metadata=metadata,
            rules=[kubernetes.rbac.v1.PolicyRuleArgs(api_groups=rule["apiGroups"], resources=rule["resources"],
                                                     verbs=rule["verbs"]) for rule in rules], opts=child)
        return kubernetes.rbac.v1.RoleBinding(
            f"{name}-{resource_name}-binding", metadata=metadata,
            role_ref=kubernetes.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role",
                                                    name=role.metadata.name),
            subjects=[kubernetes.rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name,
                                                     namespace=namespace)], opts=child)

    @staticmethod
    def _cronjobs(name: str, checks: Sequence[Mapping[str, Any]], namespace: pulumi.Input[str],
                  opts: pulumi.ResourceOptions) -> Dict[str, kubernetes.batch.v1.CronJob]:
        # The CronJob spec is decisions/platform/acceptance.py's manifest as is, the same one `python -m jobs` prints,
        # so the two cannot drift; tests validate it strictly against Kubernetes' schema (unknown fields fail).
        return {check["metadata"]["name"]: kubernetes.batch.v1.CronJob(
            f"{name}-{check['metadata']['name']}",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=check["metadata"]["name"], namespace=namespace,
                                                       labels=check["metadata"]["labels"]),
            spec=check["spec"], opts=opts) for check in checks}

    @staticmethod
    def _custom(resource_name: str, kind: str, object_name: str, spec: dict, opts: pulumi.ResourceOptions,
                namespace: Optional[pulumi.Input[str]] = None) -> kubernetes.apiextensions.CustomResource:
        return kubernetes.apiextensions.CustomResource(
            resource_name, api_version=kueue.API_VERSION, kind=kind,
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace), spec=spec, opts=opts)
