"""The training queue as plain values: Kueue's configuration and Helm values, one ResourceFlavor per capacity type
of the pools the queue uses, the `training` ClusterQueue that tries them in order, and its LocalQueue.
components/training.py turns these into resources. Pure: no Pulumi.

How a job reaches a GPU
-----------------------
A job in the `training` namespace labelled `kueue.x-k8s.io/queue-name: training` is created suspended. Kueue
admits it to the first flavor, in FLAVOR_ORDER, whose remaining quota covers its GPU (and EFA) requests and whose
node taints it tolerates, then adds that flavor's node selector and tolerations to its pods and unsuspends it.
The pods stay Pending until nodes exist; cluster-autoscaler sees them and grows the pool they fit, and its
priority expander (spec/pools.DEFAULT_PRIORITY) prefers the same capacity order. Quotas are what the flavor's
pools offer at maxNodes, so Kueue admits no more than the pools can ever hold.

- Paid-for capacity first (reserved, then capacity-block: both are billed whether used or not), then spot, then
  on-demand.
- Spot only for interruptible work: spot nodes carry spec/pools.INTERRUPTIBLE_TAINT and the spot flavor lists
  it as a node taint, which Kueue requires a workload to tolerate before it admits it there. A job that does not
  tolerate it goes from paid-for capacity straight to on-demand.
- Interrupted jobs come back: with waitForPodsReady, a running job whose pods stop being ready (a spot node
  reclaimed, a node drained) and are not all ready again within the recovery timeout is suspended and requeued
  with backoff, and admitted again wherever quota is free. Both timeouts cover a node booting from zero through
  the node gate (spec/boot) plus an image pull, so a job is not evicted while its nodes are still coming.

Queue depth
-----------
Scaling follows the queue through the requests of admitted jobs, not through a pending-count rule: each admitted
job's pods ask for whole nodes' worth of GPUs (8 per node on p4d/p5) or for slices (time-slicing, MIG), and the
autoscaler adds exactly the nodes those pods need in the pools they fit, up to each pool's maxNodes (= the
flavor's quota). A deep queue of 8-GPU jobs therefore brings 8-GPU nodes; a few small jobs fit on small or shared
GPUs and bring nothing larger. README "Training jobs" has the worked example.

Every Helm value set here exists in the pinned chart's values.yaml (KUEUE_VALUE_PATHS, held by
tests/test_kueue.py).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Sequence, Tuple

import yaml

from spec import boot
from spec.acceptance import JUDGE_IMAGE
from spec.pools import GPU_TAINT, INTERRUPTIBLE_TAINT, QUEUE_FLAVOR_LABEL, Taint, efa_devices, \
    offered_gpu_resources, queue_flavor, toleration
from spec.tenancy import TRAINING_NAMESPACE

if TYPE_CHECKING:
    from spec.catalog import Catalog
    from spec.validate import ResolvedPool

NAMESPACE = "kueue-system"                      # where the chart's README installs it
RELEASE_NAME = "kueue"
CLUSTER_QUEUE = "training"
LOCAL_QUEUE = "training"                        # in spec.tenancy.TRAINING_NAMESPACE
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"       # what a job sets to enter the queue
API_VERSION = "kueue.x-k8s.io/v1beta2"          # served and stored at v0.19.2 (config/components/crd/bases)
EFA_RESOURCE = "vpc.amazonaws.com/efa"
CAPACITY_ORDER = ("reserved", "capacity-block", "spot", "on-demand")
# Job kinds Kueue manages: plain Jobs (the NVLink check, single-node training) and MPIJobs. Frameworks whose
# operators the cluster lacks are left out (Kueue would wait for their CRDs).
INTEGRATIONS = ("batch/job", "kubeflow.org/mpijob")
# Time from admission for a job's pods to be ready, on top of a node's worst-case boot: a training image of
# tens of GB takes minutes to pull.
IMAGE_PULL_ALLOWANCE_S = 600
REQUEUE_BACKOFF_BASE_S = 60
REQUEUE_BACKOFF_MAX_S = 1800

# Kueue's webhooks answering, not only its pod Ready (jobs/kueue_webhook_probe.py says why): a Job the stack's
# flavors and queue wait for, which retries a dry-run ResourceFlavor create through the API server.
WEBHOOK_PROBE = "kueue-webhook-ready"           # the Job, its ServiceAccount, ClusterRole(Binding) and ConfigMap
WEBHOOK_PROBE_SCRIPT = Path(__file__).resolve().parent.parent / "jobs" / "kueue_webhook_probe.py"
WEBHOOK_PROBE_SCRIPT_KEY = "kueue_webhook_probe.py"
WEBHOOK_PROBE_IMAGE = JUDGE_IMAGE               # standard-library Python, as the NCCL judge
WEBHOOK_PROBE_DEADLINE_S = 300                  # 10 times the 10-30 s kueue issue 13036 reports
WEBHOOK_PROBE_INTERVAL_S = 5
WEBHOOK_PROBE_START_ALLOWANCE_S = 120           # pulling the python image and starting on a system node
# How long `pulumi up` waits for the Job to complete: past the Job's own deadline, so the Job's Failed condition
# (with the probe's log) is what a failed first up reports, not a Pulumi timeout.
WEBHOOK_PROBE_TIMEOUT_S = WEBHOOK_PROBE_DEADLINE_S + WEBHOOK_PROBE_START_ALLOWANCE_S + 180
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
    "managerConfig.controllerManagerConfigYaml": 119,
}


@dataclass(frozen=True)
class Flavor:
    name: str                        # spec.pools.queue_flavor of its pools: training-<capacity>
    capacity: str
    node_taints: Tuple[Taint, ...]   # what a workload must tolerate to be admitted here
    tolerations: Tuple[Taint, ...]   # what Kueue adds to admitted pods
    quotas: Mapping[str, int]        # resource -> what the flavor's pools offer at maxNodes
    pools: Tuple[str, ...]

    @property
    def node_labels(self) -> Dict[str, str]:
        return {QUEUE_FLAVOR_LABEL: self.name}


def flavors(pools: Sequence["ResolvedPool"], catalog: "Catalog") -> Tuple[Flavor, ...]:
    """One flavor per capacity type among the queue's pools (training and general), in CAPACITY_ORDER."""
    by_capacity: Dict[str, List["ResolvedPool"]] = {}
    for pool in pools:
        if queue_flavor(pool):
            by_capacity.setdefault(pool.spec.capacity, []).append(pool)
    result = []
    for capacity in CAPACITY_ORDER:
        members = by_capacity.get(capacity, [])
        if not members:
            continue
        quotas: Dict[str, int] = {}
        for pool in members:
            offered = dict(offered_gpu_resources(pool, catalog))
            if efa_devices(pool):
                offered[EFA_RESOURCE] = efa_devices(pool)
            for resource, per_node in offered.items():
                quotas[resource] = quotas.get(resource, 0) + per_node * pool.spec.max_nodes
        spot = capacity == "spot"
        result.append(Flavor(
            name=queue_flavor(members[0]), capacity=capacity,
            node_taints=(Taint(*INTERRUPTIBLE_TAINT),) if spot else (),
            tolerations=(Taint(*GPU_TAINT),), quotas=quotas, pools=tuple(p.spec.name for p in members)))
    return tuple(result)


def covered_resources(queue_flavors: Sequence[Flavor]) -> Tuple[str, ...]:
    return tuple(sorted({resource for flavor in queue_flavors for resource in flavor.quotas}))


def resource_flavor_spec(flavor: Flavor) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"nodeLabels": flavor.node_labels,
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
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}},
        # A large job waiting for its flavor does not hold back smaller ones that fit now.
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [{
            "coveredResources": list(covered),
            "flavors": [{"name": flavor.name,
                         "resources": [{"name": r, "nominalQuota": flavor.quotas.get(r, 0)} for r in covered]}
                        for flavor in queue_flavors],
        }],
    }


def local_queue_spec() -> Dict[str, Any]:
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
        # As in the chart's default (values.yaml lines 120-142): the ports its Services and probes expect.
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        # Jobs without the queue label are not Kueue's: the namespace's ResourceQuota still caps them.
        "manageJobsWithoutQueueName": False,
        # Only the training namespace (its one LocalQueue) is Kueue's. The chart copies this selector into its job
        # webhooks (templates/webhook/manifests.yaml), which refuse requests while Kueue is not answering: left
        # to the default (every namespace but kube-system and Kueue's own), a Job created elsewhere during
        # Kueue's first start, such as kube-prometheus-stack's install hook, would fail the release.
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
        # ResourceQuota). The QuotaCheckStrategy feature gate is beta and on in v0.19.
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
    }


def kueue_values(system_node_labels: Mapping[str, str], driver_source: str) -> Dict[str, Any]:
    """Helm values for the kueue chart: the manager on the system nodes, with manager_configuration()."""
    return {
        "controllerManager": {"nodeSelector": dict(system_node_labels)},
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
                     "labels": {"app.kubernetes.io/name": WEBHOOK_PROBE, "app.kubernetes.io/part-of": "gpu-cloud"}},
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
                    "nodeSelector": dict(system_node_labels),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "probe", "image": WEBHOOK_PROBE_IMAGE,
                        "command": ["python3", f"{mount}/{WEBHOOK_PROBE_SCRIPT_KEY}"],
                        "env": [{"name": "DEADLINE_SECONDS", "value": str(WEBHOOK_PROBE_DEADLINE_S)},
                                {"name": "INTERVAL_SECONDS", "value": str(WEBHOOK_PROBE_INTERVAL_S)},
                                {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "probe", "mountPath": mount, "readOnly": True}],
                    }],
                    "volumes": [{"name": "probe", "configMap": {"name": WEBHOOK_PROBE, "defaultMode": 0o444}}],
                },
            },
        },
    }
