"""The NCCL acceptance test as plain Kubernetes manifests (no Pulumi): what a pool's fabric must deliver.

- `mpijob_manifest`: nccl-tests all_reduce_perf over two nodes of an EFA pool (a kubeflow.org/v2beta1 MPIJob,
  mpi-operator v0.8.0), judged against the type's `acrossNodes` minimum (decisions/catalog/catalog.yaml). Rendered for
  an operator to start with `kubectl create -f` (generateName gives each run its own name).
- `across_node_cronjob_manifest`: that MPIJob on a schedule, on pools that keep two or more nodes: a CronJob whose
  Job creates it (jobs/nccl_submit.py), so a degraded EFA pair shows up between deployments.
- `nvlink_cronjob_manifest`: all_reduce_perf on one node over NVLink, judged against `withinNode`, as a
  periodic CronJob so a degraded node shows up between deployments.

Both run a `judge` container (jobs/nccl_judge.py, from a ConfigMap) beside the NCCL process. The NCCL side
writes its output and then a marker with its exit code to a shared emptyDir; the judge parses the output,
posts a Kubernetes Event on its pod (NcclBandwidthPassed / NcclBandwidthBelowMinimum / NcclTestFailed) and
exits with the verdict, so the Job's (and the MPIJob's) own status is the verdict too.
"""
from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from decisions.catalog.catalog import NcclScope
from decisions.nodes.pools import GPU_RESOURCE, POOL_LABEL, QUEUE_LABEL, queue_flavor
from decisions.platform import pod_security
from decisions.platform.jobset import IGNORE_DISRUPTIONS
from decisions.platform.mpijob import (GENERATE_NAME_MAX, LAUNCHER_RESOURCES, SHM_MOUNT, SHM_VOLUME, bounded_name,
                                       check_pool, efa_env, efa_mpijob, env_list, mpirun_command, node_selector,
                                       tolerations)

# nccl-tests image, maintained by AWS (aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/
# nccl-tests.Dockerfile, whose build args match the tag): CUDA 12.8.1, EFA installer 1.43.2 (libfabric under
# /opt/amazon/efa, Open MPI under /opt/amazon/openmpi), aws-ofi-nccl 1.16.3, NCCL 2.27.7, nccl-tests 2.16.9 built
# with MPI under /opt/nccl-tests/build. CUDA 12.8 needs driver branch >= 570 and the image purges cuda-compat;
# every AMI release in decisions/nodes/amis.yaml carries 570.195 or a 580 driver (tests/test_acceptance.py checks it).
# A stack on `gpuDriver.source: install` with branch 535 cannot run this image.
# Pinned in decisions/platform/images.yaml (not yet by digest: its reason is there).
NCCL_TESTS_IMAGE = pod_security.image("nccl-tests")
NCCL_TESTS_MIN_DRIVER_BRANCH = 570
# the judge is standard-library Python; by digest (decisions/platform/images.yaml)
JUDGE_IMAGE = pod_security.image("python")
JUDGE_SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "nccl_judge.py"
JUDGE_SCRIPT_KEY = "nccl_judge.py"
JUDGE_CONFIGMAP = "nccl-judge"
SERVICE_ACCOUNT = "nccl-acceptance"
SUBMIT_SCRIPT = JUDGE_SCRIPT.with_name("nccl_submit.py")       # shipped in the judge's ConfigMap beside it
SUBMIT_SCRIPT_KEY = "nccl_submit.py"
SCHEDULER_SERVICE_ACCOUNT = "nccl-scheduler"
# When a pool's NVLink check runs unless gpu-cloud:training.nvlinkCheckSchedule says otherwise: the CronJob is
# then created suspended, with this schedule for when it is resumed by hand.
DEFAULT_NVLINK_SCHEDULE = "0 4 * * 0"        # Sundays 04:00 UTC
# What the judge's service account needs: posting an Event in its own namespace.
JUDGE_RBAC_RULES = ({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},)
# What the scheduled across-node check's account needs: its pool's unfinished runs, and starting one.
SCHEDULER_RBAC_RULES = ({"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["list", "create"]},)
SUBMIT_DEADLINE_S = 300     # listing and creating take seconds; a Job still running after this is stuck
# The starter runs on the pool it tests; should every node there be full, its pending pod must not make
# cluster-autoscaler add a GPU node for it. The autoscaler ignores an unschedulable pod younger than this annotation
# (kubernetes/autoscaler cluster-autoscaler-1.35.2 cluster-autoscaler/core/static_autoscaler.go:985-1014,
# utils/annotations/annotations.go:24; the same in 1.32.7, core/static_autoscaler.go:76, 933-962): twice the Job's
# deadline, so the Job fails (and its pod goes) before the autoscaler would ever count it.
SCALE_UP_DELAY_ANNOTATION = "cluster-autoscaler.kubernetes.io/pod-scale-up-delay"
STARTER_SCALE_UP_DELAY_S = 2 * SUBMIT_DEADLINE_S

ALL_REDUCE_PERF = "/opt/nccl-tests/build/all_reduce_perf"

RESULTS_DIR = "/results"
RESULT_FILE = f"{RESULTS_DIR}/all_reduce_perf.txt"
MARKER_FILE = f"{RESULTS_DIR}/exit_code"
JUDGE_DIR = "/opt/judge"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEADLINE_S = 3600       # activeDeadlineSeconds of a run (the MPIJob's counts from the launcher, after the workers)
# A scheduled run still unfinished this long after its creation is stuck (jobs/nccl_submit.py): the pool keeps two
# nodes, so a run waits only for the queue and then takes DEADLINE_S; a day covers a busy queue many times over.
RUN_STALE_S = 24 * 3600
JUDGE_WAIT_S = 3300     # the judge gives up first, so a silent NCCL side still ends with an Event
TTL_S = 86400           # finished MPIJobs stay a day for `kubectl logs`
# From 8 B, doubling: the small sizes show latency when diagnosing, the large ones the bus-bandwidth plateau the
# verdict reads at the largest size. -c 1 checks the data (a #wrong column, never N/A); -n 100 iterations per size
# steady the figure. The NVLink check goes to 16 GiB, the size Azure's health checks judge H100, H200 and A100 80GB
# at (nccl-tests lowers -e to what fits in GPU memory: on A100 40GB its last row is 8 GiB, Azure's size there). The
# across-node test goes to the size of the AWS figure its minimum is a fraction of (decisions/catalog/catalog.yaml
# messageBytes), so the verdict reads that very row.
NVLINK_MAX_BYTES = "16G"


def all_reduce_args(max_bytes: str) -> Tuple[str, ...]:
    return ("-b", "8", "-e", max_bytes, "-f", "2", "-c", "1", "-n", "100")


def minimum_gbps(pool, catalog, scope: NcclScope) -> float:
    """The pool's bus-bandwidth minimum for scope 'acrossNodes' or 'withinNode': the lowest over its types."""
    values = {}
    for itype in pool.types:
        minimum = catalog.nccl_minimum_gbps(itype.name, scope)
        if minimum is None:
            raise ValueError(f"pool {pool.name}: {itype.name} has no NCCL {scope} minimum in "
                             "decisions/catalog/catalog.yaml "
                             f"(a type has one only from a published figure)")
        values[itype.name] = minimum
    return min(values.values())


def _labels(pool, scope: str) -> Dict[str, str]:
    return {"app.kubernetes.io/name": "nccl-acceptance", "app.kubernetes.io/component": scope, POOL_LABEL: pool.name}


def _run_script(command: List[str]) -> str:
    """Run `command`, keep its output in the log and in RESULT_FILE, then write the exit code as the marker
    (renamed into place, so the judge never reads half a marker) and exit with it."""
    marker = shlex.quote(MARKER_FILE)
    return "\n".join([
        f"{shlex.join(command)} 2>&1 | tee {shlex.quote(RESULT_FILE)}",
        "rc=${PIPESTATUS[0]}",
        f"printf '%s\\n' \"$rc\" > {marker}.tmp",
        f"mv {marker}.tmp {marker}",
        'exit "$rc"',
        ""])


def _judge_container(pool, scope: str, minimum: float) -> dict:
    env = env_list({"RESULT_FILE": RESULT_FILE, "MARKER_FILE": MARKER_FILE, "MIN_BUS_GBPS": f"{minimum:g}",
                "POOL": pool.name, "INSTANCE_TYPE": ",".join(t.name for t in pool.types), "SCOPE": scope,
                "WAIT_SECONDS": str(JUDGE_WAIT_S), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"})
    # The Event's involvedObject, from the downward API (the launcher's HOSTNAME is not its pod name).
    downward = (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"), ("POD_UID", "metadata.uid"))
    env += [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in downward]
    return {
        "name": "judge", "image": JUDGE_IMAGE, "command": ["python3", f"{JUDGE_DIR}/{JUDGE_SCRIPT_KEY}"], "env": env,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": pod_security.container_security_context(),
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR, "readOnly": True},
                         {"name": "judge", "mountPath": JUDGE_DIR, "readOnly": True},
                         {"name": "judge-token", "mountPath": SA_DIR, "readOnly": True}],
    }


def _judge_volumes(judge_configmap: str) -> List[dict]:
    # The pod mounts no token (automountServiceAccountToken: false): only the judge gets one, the same projected
    # token, CA and namespace the kubelet would mount, so the NCCL side and its ssh keys run without API access.
    token = {"projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}
    return [{"name": "results", "emptyDir": {}},
            {"name": "judge", "configMap": {"name": judge_configmap, "defaultMode": 0o444}},
            {"name": "judge-token", **token}]


def mpijob_manifest(pool, catalog, *, namespace: str, queue_name: str, image: str = NCCL_TESTS_IMAGE,
                    judge_configmap: str, service_account: str) -> dict:
    """all_reduce_perf over two nodes of an EFA pool (pool: a decisions.config.stack.ResolvedPool), as an MPIJob."""
    check_pool(pool, workers=2)
    minimum = minimum_gbps(pool, catalog, "acrossNodes")
    # An EFA pool has one instance type (decisions/config/validate.py), so one published figure and its message size.
    max_bytes = pool.primary_type.nccl_bus_bandwidth_gbps.across_nodes.message_bytes
    mpirun = mpirun_command(pool, 2, [ALL_REDUCE_PERF, *all_reduce_args(str(max_bytes)), "-g", "1"])
    launcher = {
        "name": "launcher", "image": image, "command": ["bash", "-c", _run_script(mpirun)],
        "env": env_list(efa_env(pool)),
        # As the training template's launcher: mpirun and one ssh client per worker, with room for a slow collective's
        # logs.
        "resources": copy.deepcopy(LAUNCHER_RESOURCES),
        # Root: the operator's SSH keys are under /root/.ssh (decisions/platform/pod_security.WAIVERS). /tmp: Open MPI's
        # session directory; /results: the output the judge reads.
        "securityContext": pod_security.container_security_context(None),
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR}, pod_security.TMP_MOUNT],
    }
    return efa_mpijob(
        pool, name=bounded_name("nccl-efa-", pool.name, GENERATE_NAME_MAX - 1) + "-", generated=True,
        namespace=namespace, queue_name=queue_name, image=image, workers=2, launcher=launcher,
        labels=_labels(pool, "across-nodes"),
        # No retries: an acceptance test must not retry into a pass. Running: stop the workers' sshd (and free the
        # GPUs) when the launcher ends, keep the launcher pod for its logs until the TTL.
        run_policy={"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": TTL_S,
                    "activeDeadlineSeconds": DEADLINE_S},
        restart_policy="Never",
        launcher_pod={"serviceAccountName": service_account, "automountServiceAccountToken": False,
                      "containers": [_judge_container(pool, "across-nodes", minimum)],
                      "volumes": [*_judge_volumes(judge_configmap), pod_security.tmp_volume()]})


def nvlink_check_refusal(pool, catalog) -> Optional[str]:
    """Why the NVLink check cannot run on `pool`, or None when it can."""
    if not catalog.gpu_model(pool.primary_type.name).nvlink_links_per_gpu:
        return f"pool {pool.name}: {pool.primary_type.gpu.model} GPUs have no NVLink"
    if pool.spec.max_nodes < 1:
        return f"pool {pool.name}: maxNodes 0; the NVLink test needs a node"
    if pool.spec.gpu_sharing.mode != "none":
        return f"pool {pool.name}: GPU sharing mode {pool.spec.gpu_sharing.mode!r}; the NCCL test needs whole GPUs"
    unsourced = [t.name for t in pool.types if catalog.nccl_minimum_gbps(t.name, "withinNode") is None]
    if unsourced:
        return f"pool {pool.name}: {unsourced[0]} has no NCCL withinNode minimum in decisions/catalog/catalog.yaml"
    return None


def nvlink_check_pools(pools, catalog) -> tuple:
    """The training queue's pools the NVLink check can run on (inference pools are not the queue's to use)."""
    return tuple(pool for pool in pools if queue_flavor(pool) and nvlink_check_refusal(pool, catalog) is None)


def nvlink_check_schedule(pool, configured: Optional[str]) -> Optional[str]:
    """When the pool's NVLink check runs by itself: the stack's schedule, on pools that keep nodes (minNodes > 0).
    None: suspended, run by hand. The check never scales a pool up from zero just to test it."""
    return configured if pool.spec.min_nodes > 0 else None


def nvlink_cronjob_manifest(pool, catalog, *, namespace: str, queue_name: str, schedule: str, suspend: bool,
                            image: str = NCCL_TESTS_IMAGE, judge_configmap: str, service_account: str) -> dict:
    """all_reduce_perf over NVLink on one node of the pool, periodically, as a CronJob."""
    refusal = nvlink_check_refusal(pool, catalog)
    if refusal:
        raise ValueError(refusal)
    minimum = minimum_gbps(pool, catalog, "withinNode")
    gpus = pool.gpus_per_node
    # One process drives every GPU (-g): NCCL connects them over NVLink/NVSwitch by itself; no network is involved.
    command = [ALL_REDUCE_PERF, *all_reduce_args(NVLINK_MAX_BYTES), "-g", str(gpus)]
    nccl = {
        "name": "nccl", "image": image, "command": ["bash", "-c", _run_script(command)],
        # HOME on /tmp: CUDA keeps its JIT cache under $HOME/.nv; the image's HOME (/root) is neither ours nor
        # writable.
        "env": env_list({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "HOME": "/tmp"}),
        # The limit equals the request: one process with a CUDA context per GPU and host staging buffers, far below
        # 32 GiB; a leak is killed in its own cgroup instead of pressing the node.
        "resources": {"requests": {GPU_RESOURCE: gpus, "cpu": "8", "memory": "32Gi"},
                      "limits": {GPU_RESOURCE: gpus, "memory": "32Gi"}},
        # Not root: one process over NVLink needs no privilege (the GPUs' device nodes are the runtime's).
        "securityContext": pod_security.container_security_context(),
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR}, SHM_MOUNT, pod_security.TMP_MOUNT],
    }
    labels = _labels(pool, "within-node")
    return {
        "apiVersion": "batch/v1", "kind": "CronJob",
        # Job names add 11 characters to the CronJob's, so a CronJob name has at most 52.
        "metadata": {"name": bounded_name("nccl-nvlink-", pool.name, 52), "namespace": namespace, "labels": labels},
        "spec": {
            "schedule": schedule, "timeZone": "Etc/UTC", "suspend": suspend, "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": {**labels, QUEUE_LABEL: queue_name}},     # Kueue admits the Job by this label
                # A run cut short by a drain or a spot reclaim starts again on another node instead of failing the
                # check: it measured nothing, so it passes or fails nothing (backoffLimit 0 is for real failures).
                "spec": {"backoffLimit": 0, "activeDeadlineSeconds": DEADLINE_S,
                         "podFailurePolicy": IGNORE_DISRUPTIONS, "template": {
                    "metadata": {"labels": labels},
                    "spec": {"restartPolicy": "Never", "nodeSelector": node_selector(pool),
                             "tolerations": tolerations(pool), "serviceAccountName": service_account,
                             "automountServiceAccountToken": False,
                             "containers": [nccl, _judge_container(pool, "within-node", minimum)],
                             "securityContext": pod_security.pod_security_context(),
                             "volumes": [*_judge_volumes(judge_configmap), SHM_VOLUME,
                                         pod_security.tmp_volume()]}}}},
        },
    }


def _can_run_across_nodes(pool, catalog) -> bool:
    try:
        check_pool(pool, workers=2)
        minimum_gbps(pool, catalog, "acrossNodes")
    except ValueError:      # not an EFA pool, shared GPUs, fewer than 2 nodes, or no published figure
        return False
    return True


def across_node_check_pools(pools, catalog) -> tuple:
    """The training queue's pools whose across-node test runs on a schedule: those that keep two or more nodes
    (minNodes >= 2) and that the test can run on. The check never scales a pool up just to test it; on other pools it
    runs by hand (`python -m jobs nccl-acceptance`)."""
    return tuple(pool for pool in pools
                 if queue_flavor(pool) and pool.spec.min_nodes >= 2 and _can_run_across_nodes(pool, catalog))


def across_node_cronjob_manifest(pool, catalog, *, namespace: str, queue_name: str, schedule: str,
                                 image: str = NCCL_TESTS_IMAGE, judge_configmap: str, service_account: str,
                                 scheduler_account: str) -> dict:
    """The across-node test on `schedule`, as a CronJob whose Job creates `mpijob_manifest`'s MPIJob (a CronJob can
    only create Jobs) unless the pool's last run has not finished (jobs/nccl_submit.py).

    The starter runs on a node of the pool it tests, as the MPIJob's workers do (their nodeSelector and tolerations),
    not on the system nodes: it lives in a team namespace, where the tenant admission policy refuses the system
    taint's toleration (decisions/platform/tenancy.host_isolation_validations). The pool keeps two or more nodes
    (across_node_check_pools), and a 10m/32Mi pod fits beside whatever runs there (a worker asks 16 CPUs and 64 GiB
    of a node). It asks no GPU, so Kueue (quotaCheckStrategy IgnoreUndeclared, decisions/platform/kueue.py) admits its
    Job with no flavor and injects no node selector that could contradict the pool's (kubernetes-sigs/kueue v0.19.2
    pkg/scheduler/flavorassigner/flavorassigner.go:802-812 skips a resource the ClusterQueue does not declare,
    :836-851 return the assignment with no flavor and no failure, whose mode is Fit at :386-389 and which
    resolveNoFitReason leaves alone at :943-946; pkg/podset/podset.go:78-91 adds only the assigned flavors' node
    labels and tolerations, and :126-131 merges them into the pod's own)."""
    mpijob = mpijob_manifest(pool, catalog, namespace=namespace, queue_name=queue_name, image=image,
                             judge_configmap=judge_configmap, service_account=service_account)
    labels = _labels(pool, "across-nodes-start")
    start = {
        "name": "start", "image": JUDGE_IMAGE, "command": ["python3", f"{JUDGE_DIR}/{SUBMIT_SCRIPT_KEY}"],
        "env": env_list({"MPIJOB": json.dumps(mpijob, sort_keys=True), "STALE_AFTER_S": str(RUN_STALE_S),
                         "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}),
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": pod_security.container_security_context(),
        "volumeMounts": [{"name": "judge", "mountPath": JUDGE_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "CronJob",
        # Job names add 11 characters to the CronJob's, so a CronJob name has at most 52.
        "metadata": {"name": bounded_name("nccl-efa-start-", pool.name, 52), "namespace": namespace,
                     "labels": labels},
        "spec": {
            "schedule": schedule, "timeZone": "Etc/UTC", "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
            # No queue label: the training namespace's `default` LocalQueue takes it, and a Job that asks for no
            # GPU is admitted at once (decisions/platform/kueue.py); the MPIJob it creates carries the label.
            "jobTemplate": {
                "metadata": {"labels": labels},
                # One retry (a lost node, an API server that did not answer); a retry after a create that went
                # through finds that run unfinished and skips.
                "spec": {"backoffLimit": 1, "activeDeadlineSeconds": SUBMIT_DEADLINE_S, "template": {
                    "metadata": {"labels": labels,
                                 "annotations": {SCALE_UP_DELAY_ANNOTATION: f"{STARTER_SCALE_UP_DELAY_S}s"}},
                    "spec": {"restartPolicy": "Never", "nodeSelector": node_selector(pool),
                             "tolerations": tolerations(pool),      # as the MPIJob's workers: see the docstring
                             "serviceAccountName": scheduler_account, "containers": [start],
                             "securityContext": pod_security.pod_security_context(),
                             "volumes": [{"name": "judge",
                                          "configMap": {"name": judge_configmap, "defaultMode": 0o444}}]}}}},
        },
    }


def judge_configmap_manifest(name: str, namespace: str) -> dict:
    """The ConfigMap the jobs mount their scripts from: the judge, and what starts a scheduled across-node run."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": {JUDGE_SCRIPT_KEY: JUDGE_SCRIPT.read_text(encoding="utf-8"),
                     SUBMIT_SCRIPT_KEY: SUBMIT_SCRIPT.read_text(encoding="utf-8")}}
