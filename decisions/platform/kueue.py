"""The training queue as plain values: Kueue's configuration and Helm values, one ResourceFlavor per pool the
queue uses, the `training` ClusterQueue that tries them in order, its LocalQueues, and the priorities a job may
take. components/platform/training.py turns these into resources. Pure: no Pulumi.

Kueue's behaviour is read in kubernetes-sigs/kueue at tag v0.19.2; "file:N" below is a line there.

How a job reaches a GPU
-----------------------
Every Job, MPIJob, JobSet and bare pod in the `training` namespace goes through the queue, labelled or not:
- Kueue's webhooks give an object without `kueue.x-k8s.io/queue-name` the LocalQueue named `default` when the
  namespace has one (pkg/controller/jobframework/defaults.go:59-98, called by each webhook: job/job_webhook.go:107,
  mpijob/mpijob_webhook.go:96, jobset/jobset_webhook.go:80, pod/pod_webhook.go:151-158; no feature gate at this tag).
  DEFAULT_LOCAL_QUEUE is that queue, feeding the same ClusterQueue as LOCAL_QUEUE.
- manageJobsWithoutQueueName holds anything the defaulting missed (a job created while Kueue's queue cache does not
  know `default` yet): created suspended (pkg/controller/jobframework/utils.go:147-155), a bare pod gated
  (pod/pod_webhook.go:160-176), until it is given a queue (apis/config/v1beta2/configuration_types.go:46-53).
- The `pod` integration is what catches bare pods; pods of a Job, MPIJob or JobSet belong to their workload and are
  left alone (pod/pod_webhook.go:145-149, jobframework/reconciler.go:884-941).
Kueue admits a job to the first flavor, in the ClusterQueue's order, whose remaining quota covers its GPU (and EFA)
requests, whose node taints it tolerates and whose node labels its node selector allows, then adds that flavor's
node selector and tolerations to its pods and unsuspends it. The pods stay Pending until nodes exist;
cluster-autoscaler sees them and grows their pool. Quotas are what each pool offers at maxNodes, so Kueue admits no
more than the pools can ever hold.

- One flavor per pool, selecting its nodes by decisions.nodes.pools.POOL_LABEL. Kueue matches a pod's node selector
against
  a flavor on that flavor's own label keys only (pkg/scheduler/flavorassigner/flavorassigner.go:1224-1227,
  1278-1292), so two pools in one flavor share its quota: a job pinned to one pool is admitted on the other's
  capacity too, and waits on nodes its own pool cannot add. For the same reason each flavor also carries the node
  labels a job may select by instead of a pool (FLAVOR_LABEL_KEYS: capacity, GPU model and count, EFA): an 8-GPU
  pod that selects `gpu-count: "8"` is never admitted on a 4-GPU pool's quota, where no node could take it.
  Quota counts GPUs, not nodes: a pod that selects neither pool nor size may be.
- Flavors in the autoscaler's order: by the pool's priority-expander weight (decisions/nodes/pools.autoscaler_priority),
  then capacity type (paid-for reserved and capacity-block, then spot, then on-demand), then stack order. Kueue
  picks the pool, so the two must agree.
- Spot only for interruptible work: spot nodes carry decisions/nodes/pools.INTERRUPTIBLE_TAINT and their flavors list it
as
  a node taint, which Kueue requires a workload to tolerate before it admits it there (flavorassigner.go:1239-1244).
  A job that does not tolerate it goes from paid-for capacity straight to on-demand. So do a pool's own taints.
- A replicated GPU (time-slicing, MPS) is one share of one GPU, and the device plugin refuses a pod more than one
  (decisions/platform/gpu_operator.py). Quota cannot say "at most 1 per pod", so those flavors list SHARED_GPU_TAINT,
  which their nodes do not carry: only a job that tolerates it, saying it takes a share, is admitted there.
- A capacity block ends on a date: its flavor runs the admission check ADMISSION_CHECK (ClusterQueue
  admissionChecksStrategy, onFlavors), which the repair controller answers when Kueue has reserved a job's quota
  there: Ready if the job's declared maximum run time ends before the block closes, else Rejected and the job
  deactivated; once the block has closed, Rejected for all. decisions/nodes/capacity_blocks.py says why and when.
- Interrupted jobs come back: with waitForPodsReady, a running job whose pods stop being ready (a spot node
  reclaimed, a node drained) and are not all ready again within the recovery timeout is suspended and requeued
  with backoff, and admitted again wherever quota is free. Both timeouts cover a node booting from zero through
  the node gate (decisions/nodes/boot) plus an image pull, so a job is not evicted while its nodes are still coming.

Priorities
----------
A job picks its WorkloadPriorityClass with PRIORITY_LABEL; without it (and without a pod priorityClassName), Kueue
gives it the value of the cluster's globalDefault PriorityClass, or where there is none its default priority 0
(pkg/util/priority/priority.go:88-94 and 116-146, pkg/constants/constants.go:38-41). This program creates no
PriorityClass, so such a job runs at 0, which `experiment` names. A `production` job that finds no flavor free
preempts lower-priority jobs of the queue (preemption.withinClusterQueue: LowerPriority;
apis/kueue/v1beta2/clusterqueue_types.go:546-560, default Never), after trying every flavor without preempting
(flavorFungibility.whenCanPreempt defaults to TryNextFlavor, clusterqueue_types.go:468-479). There is one team queue,
so no cohort and no fair sharing: they divide quota between ClusterQueues.

Queue depth
-----------
Scaling follows the queue through the requests of admitted jobs, not through a pending-count rule: each admitted
job's pods ask for whole nodes' worth of GPUs (8 per node on p4d/p5) or for shares (time-slicing, MIG), and the
autoscaler adds exactly the nodes those pods need in the pools they fit, up to each pool's maxNodes (= its
flavor's quota). A deep queue of 8-GPU jobs (which select their pool or node size) therefore brings 8-GPU nodes; a
few small jobs fit on small or shared GPUs and bring nothing larger. docs/training.md has the worked example. What stays
pending is quota the pools do not have: decisions/observability/alert_rules.py warns when the queue stays deep
(QUEUE_DEEP_PENDING), and the training-queue dashboard (decisions/observability/dashboards.py) shows the depth and each
flavor's use.

Every Helm value set here exists in the pinned chart's values.yaml (KUEUE_VALUE_PATHS, held by
tests/test_kueue.py).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Sequence, Tuple

import yaml

from decisions.nodes import boot
from decisions.nodes.capacity_blocks import ADMISSION_CHECK, CONTROLLER_NAME
from decisions.nodes.pods import system_placement
from decisions.nodes.pools import EFA_RESOURCE, GPU_TAINT, INTERRUPTIBLE_TAINT, LABEL_PREFIX, POOL_LABEL, \
    QUEUE_WORKLOADS, REPLICATED_MODES, Taint, autoscaler_priority, efa_devices, node_labels, offered_gpu_resources, \
    queue_flavor, toleration
from decisions.platform import pod_security
from decisions.platform.acceptance import JUDGE_IMAGE
from decisions.platform.tenancy import TRAINING_NAMESPACE

if TYPE_CHECKING:
    from decisions.catalog.catalog import Catalog
    from decisions.config.model import NodePool
    from decisions.config.stack import ResolvedPool

NAMESPACE = "kueue-system"                      # where the chart's README installs it
RELEASE_NAME = "kueue"
CLUSTER_QUEUE = "training"
LOCAL_QUEUE = "training"                        # in decisions.platform.tenancy.TRAINING_NAMESPACE
# Kueue's DefaultLocalQueueName (pkg/controller/constants/constants.go:25-27): what a job without a queue gets.
DEFAULT_LOCAL_QUEUE = "default"
LOCAL_QUEUES = (LOCAL_QUEUE, DEFAULT_LOCAL_QUEUE)
# The label a job names its LocalQueue by (constants.go:23) is decisions/nodes/pools.QUEUE_LABEL, as EFA_RESOURCE:
# shared with the job templates.
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"   # constants.go:48: names a WorkloadPriorityClass
API_VERSION = "kueue.x-k8s.io/v1beta2"          # served and stored at v0.19.2 (config/components/crd/bases)
CAPACITY_ORDER = ("reserved", "capacity-block", "spot", "on-demand")
# The node labels a flavor carries: the pool, and what a job may select nodes by without naming a pool. Kueue
# weighs a pod's node selector only on these keys (module docstring); a ResourceFlavor holds at most 8
# (resourceflavor_types.go:62-66).
FLAVOR_LABEL_KEYS = (POOL_LABEL, f"{LABEL_PREFIX}capacity", f"{LABEL_PREFIX}gpu-model", f"{LABEL_PREFIX}gpu-count",
                     f"{LABEL_PREFIX}efa")
# Listed on the flavors of replicated-GPU pools and on no node (module docstring).
SHARED_GPU_TAINT = Taint(f"{LABEL_PREFIX}shared-gpu", "true", "NoSchedule")
# ResourceFlavor nodeTaints hold at most 8 (apis/kueue/v1beta2/resourceflavor_types.go:84); a resource group at
# most 64 flavors (clusterqueue_types.go:273-279).
FLAVOR_TAINTS_MAX = 8
FLAVORS_MAX = 64
# Job kinds Kueue manages (framework names: pkg/controller/jobs/job/job_controller.go:55, mpijob/
# mpijob_controller.go:42, jobset/jobset_controller.go:44, pod/pod_controller.go:68). An enabled framework whose CRD
# the cluster lacks gets its webhook at once and its controller only when the CRD appears
# (pkg/controller/jobframework/setup.go:86-102): TrainingOperators installs the MPI Operator and the JobSet
# controller before Kueue, so both are managed from Kueue's first start. Frameworks without an operator here are
# left out.
INTEGRATIONS = ("batch/job", "kubeflow.org/mpijob", "jobset.x-k8s.io/jobset", "pod")
# Time from admission for a job's pods to be ready, on top of a node's worst-case boot: a training image of
# tens of GB takes minutes to pull.
IMAGE_PULL_ALLOWANCE_S = 600
REQUEUE_BACKOFF_BASE_S = 60
REQUEUE_BACKOFF_MAX_S = 1800

# Kueue's webhooks answering, not only its pod Ready (jobs/kueue_webhook_probe.py says why): a Job the stack's
# flavors and queue wait for, which retries a dry-run ResourceFlavor create through the API server.
WEBHOOK_PROBE = "kueue-webhook-ready"           # the Job, its ServiceAccount, ClusterRole(Binding) and ConfigMap
WEBHOOK_PROBE_SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "kueue_webhook_probe.py"
WEBHOOK_PROBE_SCRIPT_KEY = "kueue_webhook_probe.py"
WEBHOOK_PROBE_IMAGE = JUDGE_IMAGE               # standard-library Python, as the NCCL judge
WEBHOOK_PROBE_DEADLINE_S = 300                  # 10 times the 10-30 s kueue issue 13036 reports
WEBHOOK_PROBE_INTERVAL_S = 5
WEBHOOK_PROBE_START_ALLOWANCE_S = 120           # pulling the python image and starting on a system node
# How long `pulumi up` waits for the Job to complete: past the Job's own deadline, so the Job's Failed condition
# (with the probe's log) is what a failed first up reports, not a Pulumi timeout.
WEBHOOK_PROBE_TIMEOUT_S = WEBHOOK_PROBE_DEADLINE_S + WEBHOOK_PROBE_START_ALLOWANCE_S + 180
# A probe that failed once would fail every later `pulumi up`: by default pulumi-kubernetes keeps waiting for a
# resource that did not become ready, and this annotation has the next update replace it instead, so the probe runs
# again (the Job's docstring: pulumi-kubernetes 4.34.2, as requirements.txt pins it, pulumi_kubernetes/batch/v1/Job.py
# lines 126-129). The provider replaces only a Job whose live status is not ready, and deletes the named Job before
# creating it again (pulumi/pulumi-kubernetes v4.32.0 provider/pkg/provider/provider.go lines 1622-1660): a probe that
# succeeded is left alone on every later `up`.
WEBHOOK_PROBE_ANNOTATIONS: Mapping[str, str] = {"pulumi.com/replaceUnready": "true"}
# A dry-run create needs the create permission itself (the API server authorizes it like a real one).
WEBHOOK_PROBE_RBAC_RULES = ({"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["create"]},)

# Kueue's metrics, scraped by a ServiceMonitor of the monitoring stack's (components/monitoring.py): the chart's own
# (enablePrometheus, values.yaml line 10) carries only the chart's labels, which that Prometheus does not select, and
# no value adds one (kubernetes-sigs/kueue tag v0.19.2 charts/kueue/templates/prometheus/monitor.yaml lines 19-37).
# Its Service (templates/manager/auth_proxy_service.yaml lines 17-33, always rendered) carries these labels
# (templates/_helpers.tpl lines 52-76) and serves port https (values.yaml metricsService.ports, lines 209-215) with
# authentication and authorization (cmd/kueue/main.go lines 188-192): the endpoint is the chart's own monitor's
# (monitor.yaml lines 32-37, tlsConfig from values.yaml lines 370-371), and the stack's Prometheus may GET /metrics
# (kube-prometheus-stack 88.5.3 templates/prometheus/clusterrole.yaml lines 30-31).
METRICS_SERVICE_SELECTOR: Mapping[str, str] = {"app.kubernetes.io/name": "kueue",
                                               "app.kubernetes.io/instance": RELEASE_NAME,
                                               "app.kubernetes.io/component": "metrics-service"}
METRICS_PORT_NAME = "https"
METRICS_ENDPOINT: Mapping[str, Any] = {"scheme": "https",
                                       "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                                       "tlsConfig": {"insecureSkipVerify": True}}

# Helm value paths this program sets -> line of that key in kubernetes-sigs/kueue tag v0.19.2
# charts/kueue/values.yaml. templates/manager/manager-config.yaml writes managerConfig.controllerManagerConfigYaml
# into the kueue-manager-config ConfigMap the manager reads; templates/manager/manager.yaml renders
# controllerManager.nodeSelector into the Deployment.
KUEUE_VALUE_PATHS: Mapping[str, int] = {
    "controllerManager.nodeSelector": 105,
    "controllerManager.tolerations": 107,
    "managerConfig.controllerManagerConfigYaml": 119,
}
# The chart default configuration's controller.groupKindConcurrency (values.yaml lines 132-139): concurrent
# reconciles per kind, restated in manager_configuration() because the chart's value is the whole file.
CHART_GROUP_KIND_CONCURRENCY: Mapping[str, int] = {
    "Job.batch": 5,
    "Pod": 5,
    "Workload.kueue.x-k8s.io": 10,
    "LocalQueue.kueue.x-k8s.io": 5,
    "ClusterQueue.kueue.x-k8s.io": 5,
    "ResourceFlavor.kueue.x-k8s.io": 1,
}


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    description: str


# One per kind of work. Names and values are what jobs refer to: changing a value changes no workload already
# created (apis/kueue/v1beta2/workloadpriorityclass_types.go:37-41).
PRIORITY_CLASSES: Tuple[PriorityClass, ...] = (
    PriorityClass("production", 1000, "Work the team has committed to: preempts lower-priority jobs of the queue "
                                      "when no flavor has room for it."),
    PriorityClass("experiment", 0, "Everything else, and what a job without the priority-class label runs as "
                                   "(Kueue's default priority 0): may be preempted by production jobs."),
)


@dataclass(frozen=True)
class Flavor:
    name: str                        # its pool's name (decisions.nodes.pools.queue_flavor)
    capacity: str
    node_labels: Mapping[str, str]   # FLAVOR_LABEL_KEYS of its pool's nodes
    node_taints: Tuple[Taint, ...]   # what a workload must tolerate to be admitted here
    tolerations: Tuple[Taint, ...]   # what Kueue adds to admitted pods
    quotas: Mapping[str, int]        # resource -> what the pool offers at maxNodes


def _admission_taints(spec: "NodePool") -> Tuple[Taint, ...]:
    """What a workload must tolerate to be admitted to the pool's flavor: the interruptible taint on spot, the
    shared-GPU one on replicated GPUs, and the pool's own taints that keep pods off (Kueue weighs only NoSchedule
    and NoExecute: flavorassigner.go:1239-1241). The GPU taint is tolerated by every admitted pod instead."""
    return ((Taint(*INTERRUPTIBLE_TAINT),) if spec.capacity == "spot" else ()) \
        + ((SHARED_GPU_TAINT,) if spec.gpu_sharing.mode in REPLICATED_MODES else ()) \
        + tuple(Taint(t.key, t.value, t.effect) for t in spec.taints if t.effect in ("NoSchedule", "NoExecute"))


def flavors(pools: Sequence["ResolvedPool"], catalog: "Catalog") -> Tuple[Flavor, ...]:
    """One flavor per pool the queue uses (training and general), in the order Kueue tries them: the autoscaler's
    priority, then CAPACITY_ORDER, then the stack's order."""
    members = sorted((pool for pool in pools if queue_flavor(pool)),
                     key=lambda pool: (-autoscaler_priority(pool), CAPACITY_ORDER.index(pool.spec.capacity)))
    result = []
    for pool in members:
        per_node = dict(offered_gpu_resources(pool, catalog))
        if efa_devices(pool):
            per_node[EFA_RESOURCE] = efa_devices(pool)
        labels = node_labels(pool)
        result.append(Flavor(
            name=queue_flavor(pool), capacity=pool.spec.capacity,
            node_labels={key: labels[key] for key in FLAVOR_LABEL_KEYS}, node_taints=_admission_taints(pool.spec),
            tolerations=(Taint(*GPU_TAINT),),
            quotas={resource: count * pool.spec.max_nodes for resource, count in per_node.items()}))
    return tuple(result)


def pool_issues(pools: Sequence[Tuple[int, "NodePool"]]) -> List[Tuple[Tuple[Any, ...], str]]:
    """(key path, message) for each queue pool Kueue's API limits refuse: a flavor per pool, at most FLAVORS_MAX,
    each with at most FLAVOR_TAINTS_MAX node taints."""
    issues = []
    queue_pools = [(i, pool) for i, pool in pools if pool.workload in QUEUE_WORKLOADS]
    if len(queue_pools) > FLAVORS_MAX:
        issues.append((("nodePools",), f"has {len(queue_pools)} training and general pools; the training queue "
                                        f"takes at most {FLAVORS_MAX} (one Kueue ResourceFlavor each)"))
    for i, pool in queue_pools:
        taints = _admission_taints(pool)
        hard = [t for t in pool.taints if t.effect in ("NoSchedule", "NoExecute")]
        if len(taints) > FLAVOR_TAINTS_MAX:
            issues.append((("nodePools", i, "taints"), f"has {len(hard)} NoSchedule or NoExecute taints; the pool's "
                           f"Kueue ResourceFlavor lists them and {len(taints) - len(hard)} of its own, at most "
                           f"{FLAVOR_TAINTS_MAX} in all"))
    return issues


def covered_resources(queue_flavors: Sequence[Flavor]) -> Tuple[str, ...]:
    return tuple(sorted({resource for flavor in queue_flavors for resource in flavor.quotas}))


def resource_flavor_spec(flavor: Flavor) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"nodeLabels": dict(flavor.node_labels),
                            "tolerations": [toleration(t) for t in flavor.tolerations]}
    if flavor.node_taints:
        spec["nodeTaints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in flavor.node_taints]
    return spec


def cluster_queue_spec(queue_flavors: Sequence[Flavor]) -> Dict[str, Any]:
    """One resource group over every GPU resource the flavors offer; Kueue requires each flavor to list every
    covered resource, in the same order, so a flavor without one lists it at 0."""
    if not queue_flavors:
        raise ValueError("the training queue has no flavors: no training or general pool")
    covered = covered_resources(queue_flavors)
    blocks = block_flavors(queue_flavors)
    return {
        **({"admissionChecksStrategy": {"admissionChecks": [{"name": ADMISSION_CHECK, "onFlavors": list(blocks)}]}}
           if blocks else {}),
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}},
        # A large job waiting for its flavor does not hold back smaller ones that fit now.
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{
            "coveredResources": list(covered),
            "flavors": [{"name": flavor.name,
                         "resources": [{"name": r, "nominalQuota": flavor.quotas.get(r, 0)} for r in covered]}
                        for flavor in queue_flavors],
        }],
    }


def block_flavors(queue_flavors: Sequence[Flavor]) -> Tuple[str, ...]:
    """The flavors of capacity-block pools: those ADMISSION_CHECK runs on."""
    return tuple(flavor.name for flavor in queue_flavors if flavor.capacity == "capacity-block")


def admission_check_spec() -> Dict[str, Any]:
    """The AdmissionCheck on the capacity blocks' flavors, answered by the repair controller (jobs/block_expiry.py)."""
    return {"controllerName": CONTROLLER_NAME}


def local_queue_spec() -> Dict[str, Any]:
    """Every LocalQueue of LOCAL_QUEUES feeds the one ClusterQueue."""
    return {"clusterQueue": CLUSTER_QUEUE}


def pods_ready_timeout_s(driver_source: str) -> int:
    """How long an admitted job's pods may take to become ready (and to recover): a node's worst-case boot from
    zero through the gate plus an image pull."""
    return boot.max_node_provision_seconds(driver_source) + IMAGE_PULL_ALLOWANCE_S


def manager_configuration(driver_source: str) -> Dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2/configuration_types.go at
    v0.19.2). The chart's value is the whole file, so the chart default's settings are restated here."""
    timeout = boot.go_duration(pods_ready_timeout_s(driver_source))
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        # As in the chart's default (charts/kueue/values.yaml lines 120-142): the ports its Services and probes expect,
        # its leader election, controller concurrency and client rate limits.
        "health": {"healthProbeBindAddress": ":8081"},
        # Per flavor and resource: quota, reserved and admitted use (configuration_types.go:182-185; reported at
        # pkg/cache/scheduler/clusterqueue.go:562-579), for the training-queue dashboard.
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        # values.yaml lines 132-139, as the chart sets them.
        "controller": {"groupKindConcurrency": dict(CHART_GROUP_KIND_CONCURRENCY)},
        "clientConnection": {"qps": 300, "burst": 500},
        # Nothing in the training namespace bypasses the queue (module docstring): DEFAULT_LOCAL_QUEUE takes jobs
        # without the label, and this holds any the defaulting missed.
        "manageJobsWithoutQueueName": True,
        # Only the training namespace (its LocalQueues) is Kueue's. The chart copies this selector into its job and
        # pod webhooks (templates/webhook/manifests.yaml; the pod webhook's failurePolicy is Fail once `pod` is
        # enabled, lines 314-319), which refuse requests while Kueue is not answering: left to the default (every
        # namespace but kube-system and Kueue's own), a Job created elsewhere during Kueue's first start, such as
        # kube-prometheus-stack's install hook, would fail the release. The pod integration requires a selector
        # (pkg/config/validation.go:368-382).
        "managedJobsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}},
        "waitForPodsReady": {
            "timeout": timeout,
            "recoveryTimeout": timeout,
            "blockAdmission": False,
            # Requeued from the eviction, without limit: a job interrupted again and again keeps coming back.
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": REQUEUE_BACKOFF_BASE_S,
                                  "backoffMaxSeconds": REQUEUE_BACKOFF_MAX_S},
        },
        "integrations": {"frameworks": list(INTEGRATIONS)},
        # Quota covers GPU and EFA requests only; CPU and memory are left to the scheduler (and the namespace's
        # ResourceQuota). The QuotaCheckStrategy feature gate is beta and on in v0.19. A job that asks for no GPU
        # (the across-node check's starter) needs no flavor and is admitted at once (flavorassigner.go:802-812,
        # 386-389).
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
    }


def kueue_values(system_node_labels: Mapping[str, str], driver_source: str) -> Dict[str, Any]:
    """Helm values for the kueue chart: the manager on the system nodes, with manager_configuration()."""
    return {
        # On the system nodes, tolerating their taint (decisions/nodes/pods.py); the chart tolerates nothing by default.
        "controllerManager": system_placement(system_node_labels),
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_configuration(driver_source),
                                                                         sort_keys=False)},
    }


def webhook_probe_configmap(namespace: str = NAMESPACE) -> Dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": WEBHOOK_PROBE, "namespace": namespace},
            "data": {WEBHOOK_PROBE_SCRIPT_KEY: WEBHOOK_PROBE_SCRIPT.read_text(encoding="utf-8")}}


def webhook_probe_job(system_node_labels: Mapping[str, str], kueue_version: str,
                      namespace: str = NAMESPACE) -> Dict[str, Any]:
    """The Job that completes once Kueue's webhooks answer. Its pod template names the Kueue version and the
    script's hash: a new Kueue or a changed probe replaces the Job (a Job's template is immutable), so an upgrade is
    probed again before the stack's flavors change."""
    script = WEBHOOK_PROBE_SCRIPT.read_text(encoding="utf-8")
    mount = "/opt/gpu-cloud"
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": WEBHOOK_PROBE, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": WEBHOOK_PROBE, "app.kubernetes.io/part-of": "gpu-cloud"},
                     "annotations": dict(WEBHOOK_PROBE_ANNOTATIONS)},
        "spec": {
            # The probe retries by itself until its deadline; a second pod only for a lost node or an eviction.
            "backoffLimit": 1,
            "activeDeadlineSeconds": WEBHOOK_PROBE_DEADLINE_S + WEBHOOK_PROBE_START_ALLOWANCE_S,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": WEBHOOK_PROBE, "kueue-version": kueue_version},
                             "annotations": {"gpu-cloud.io/probe-sha256":
                                             hashlib.sha256(script.encode()).hexdigest()}},
                "spec": {
                    "serviceAccountName": WEBHOOK_PROBE, "restartPolicy": "Never",
                    **system_placement(system_node_labels),
                    "securityContext": pod_security.pod_security_context(),
                    "containers": [{
                        "name": "probe", "image": WEBHOOK_PROBE_IMAGE,
                        "command": ["python3", f"{mount}/{WEBHOOK_PROBE_SCRIPT_KEY}"],
                        "env": [{"name": "DEADLINE_SECONDS", "value": str(WEBHOOK_PROBE_DEADLINE_S)},
                                {"name": "INTERVAL_SECONDS", "value": str(WEBHOOK_PROBE_INTERVAL_S)},
                                {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                        "securityContext": pod_security.container_security_context(),
                        "volumeMounts": [{"name": "probe", "mountPath": mount, "readOnly": True}],
                    }],
                    "volumes": [{"name": "probe", "configMap": {"name": WEBHOOK_PROBE, "defaultMode": 0o444}}],
                },
            },
        },
    }
