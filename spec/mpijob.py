"""MPIJobs over EFA as plain manifests (kubeflow.org/v2beta1, mpi-operator v0.8.0; no Pulumi): what every
multi-node job on an EFA pool needs, used by the training-job template (`python -m jobs mpijob`) and the NCCL
acceptance test (spec/acceptance.py).

What EFA jobs need, and where it is set
---------------------------------------
- Environment for every rank: `FI_PROVIDER=efa`, `FI_EFA_USE_DEVICE_RDMA=1` where the instance has GPUDirect RDMA
  over EFA, `NCCL_DEBUG`, `NCCL_SOCKET_IFNAME` (efa_env). Ranks start through sshd, which hands them none of the
  worker container's environment, so the launcher sets these and mpirun forwards each with `-x`.
- Workers request the pool's whole node: all its GPUs and EFA devices (`vpc.amazonaws.com/efa`), limits equal.
- Locked memory: EFA pins every buffer it registers. The AL2023 AMI leaves containers at the runtime default
  (nodeadm's containerd base-runtime-spec.json sets only RLIMIT_NOFILE; nothing under templates/al2023 sets
  memlock; awslabs/amazon-eks-ami v20260714), so workers get IPC_LOCK, which lifts the limit for pinning.
- A memory-backed /dev/shm far above the runtime's 64 MiB: NCCL's shared-memory transport needs it.
- Workers select the pool (and its Kueue flavor) and tolerate every taint the pool's nodes carry.
"""
from __future__ import annotations

import hashlib
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence

from spec.pools import GPU_RESOURCE, LABEL_PREFIX, QUEUE_FLAVOR_LABEL, efa_devices, node_labels, node_taints, \
    toleration

API_VERSION = "kubeflow.org/v2beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POOL_LABEL = f"{LABEL_PREFIX}pool"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
MPIRUN = "/opt/amazon/openmpi/bin/mpirun"       # Open MPI as the EFA installer puts it in images
HOSTFILE = "/etc/mpi/hostfile"                  # where mpi-operator v0.8.0 mounts it (configMountPath)
SHM_SIZE = "16Gi"
SHM_VOLUME = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}
SHM_MOUNT = {"name": "shm", "mountPath": "/dev/shm"}
# GPUDirect RDMA over EFA (device RDMA) exists on p4d and later.
DEVICE_RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
# Worker pods are named <job>-worker-<i>, which must be a DNS-1035 label (at most 63 characters).
DNS_LABEL_MAX = 63
GENERATED_SUFFIX = 5            # what the API server appends to a generateName
GENERATE_NAME_MAX = DNS_LABEL_MAX - len("-worker-9") - GENERATED_SUFFIX     # 49: fits jobs of up to 10 workers


def max_job_name(workers: int) -> int:
    """The longest MPIJob name whose last worker pod name is still a DNS-1035 label."""
    return DNS_LABEL_MAX - len(f"-worker-{workers - 1}")


def efa_env(pool) -> Dict[str, str]:
    """What NCCL over EFA needs in every rank's environment."""
    env = {"FI_PROVIDER": "efa"}
    if pool.primary_type.family in DEVICE_RDMA_FAMILIES:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    env.update({
        # The pods request no hugepages-2Mi, so libfabric must not try huge-page buffers.
        "FI_EFA_USE_HUGE_PAGE": "0",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",     # shows "Selected provider is efa" and the NICs
        # The VPC CNI gives a pod one interface, eth0: naming it fails loudly if it is missing, where an
        # exclusion list (^lo,docker) would silently take whatever else is there.
        "NCCL_SOCKET_IFNAME": "eth0",
    })
    return env


def bounded_name(prefix: str, pool_name: str, limit: int) -> str:
    """prefix + pool name within `limit` characters; a shortened name keeps a hash of the whole pool name."""
    name = prefix + pool_name
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(pool_name.encode()).hexdigest()[:6]
    return f"{prefix}{pool_name[:limit - len(prefix) - 7].rstrip('-')}-{digest}"


def tolerations(pool) -> List[dict]:
    return [toleration(taint) for taint in node_taints(pool)]


def node_selector(pool) -> Dict[str, str]:
    """The pool's nodes, and its Kueue flavor where it has one: Kueue matches a job to a flavor only by the labels
    flavors define, so without it Kueue could admit the job to another flavor whose nodes are not this pool's."""
    labels = node_labels(pool)
    return {key: labels[key] for key in (POOL_LABEL, QUEUE_FLAVOR_LABEL) if key in labels}


def env_list(values: Mapping[str, str]) -> List[dict]:
    return [{"name": name, "value": value} for name, value in values.items()]


def mpirun_command(pool, workers: int, program: Sequence[str], forward: Sequence[str] = ()) -> List[str]:
    """mpirun of `program`, one rank per GPU on each worker, forwarding the EFA environment, PATH and
    LD_LIBRARY_PATH as the image sets them (Open MPI, libfabric, NCCL, aws-ofi-nccl), and `forward`."""
    gpus = pool.gpus_per_node
    forward = [arg for name in (*efa_env(pool), "PATH", "LD_LIBRARY_PATH", *forward) for arg in ("-x", name)]
    return [MPIRUN, "--allow-run-as-root", "-np", str(workers * gpus), "-N", str(gpus), "--bind-to", "none",
            *forward, *program]


def worker_container(pool, image: str) -> dict:
    gpus, efa = pool.gpus_per_node, efa_devices(pool)
    return {
        "name": "worker", "image": image, "command": ["/usr/sbin/sshd", "-De"],
        "resources": {"requests": {GPU_RESOURCE: gpus, EFA_RESOURCE: efa, "cpu": "16", "memory": "64Gi"},
                      "limits": {GPU_RESOURCE: gpus, EFA_RESOURCE: efa}},
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "volumeMounts": [SHM_MOUNT],
    }


def check_pool(pool, workers: int) -> None:
    """A pool a multi-node EFA job can run on, or a ValueError naming the pool and why not."""
    if not pool.efa:
        raise ValueError(f"pool {pool.name}: EFA is off; a multi-node MPI job needs an EFA pool")
    if workers < 1 or pool.spec.max_nodes < workers:
        raise ValueError(f"pool {pool.name}: {workers} worker(s) do not fit its maxNodes {pool.spec.max_nodes}")
    mode = pool.spec.gpu_sharing.mode
    if mode != "none":
        raise ValueError(f"pool {pool.name}: GPU sharing mode {mode!r}; an MPI job over EFA needs whole GPUs")


def efa_mpijob(pool, *, name: str, generated: bool, namespace: str, queue_name: str, image: str, workers: int,
               launcher: Mapping[str, Any], run_policy: Mapping[str, Any], restart_policy: str,
               labels: Mapping[str, str], launcher_pod: Mapping[str, Any] = (),
               worker_service_account: Optional[str] = None) -> dict:
    """An MPIJob on `pool` (a spec.validate.ResolvedPool) named `name` (a generateName prefix when `generated`):
    `workers` whole nodes running sshd, and a launcher
    pod whose first container is `launcher` (the operator adds the hostfile, ssh keys and MPI environment to the
    first container only). `launcher_pod`: more launcher pod-spec fields (containers after the first, volumes).
    `worker_service_account`: the workers' service account (the namespace's default without)."""
    check_pool(pool, workers)
    length = len(name) + (GENERATED_SUFFIX if generated else 0)
    if length > max_job_name(workers):
        raise ValueError(f"job name {name!r} is too long: with {workers} workers a name may have at most "
                         f"{max_job_name(workers) - (GENERATED_SUFFIX if generated else 0)} characters")
    pod = dict(launcher_pod)
    launcher_spec = {**pod, "containers": [dict(launcher), *pod.get("containers", [])]}
    return {
        "apiVersion": API_VERSION, "kind": "MPIJob",
        "metadata": {("generateName" if generated else "name"): name, "namespace": namespace,
                     "labels": {**labels, QUEUE_LABEL: queue_name}},
        "spec": {
            "slotsPerWorker": pool.gpus_per_node,
            # Start mpirun only once every worker runs sshd.
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": dict(run_policy),
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": restart_policy, "template": {
                    "metadata": {"labels": dict(labels)}, "spec": launcher_spec}},
                "Worker": {"replicas": workers, "restartPolicy": restart_policy, "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {**({"serviceAccountName": worker_service_account} if worker_service_account else {}),
                             "nodeSelector": node_selector(pool), "tolerations": tolerations(pool),
                             "automountServiceAccountToken": False, "containers": [worker_container(pool, image)],
                             "volumes": [SHM_VOLUME]}}},
            },
        },
    }


# A training job retries mpirun this often (the launcher Job's backoffLimit) before it fails for good.
TRAINING_BACKOFF_LIMIT = 6
TRAINING_TTL_S = 7 * 86400      # a finished job stays a week for its logs and status
CHECKPOINT_ENV = "CHECKPOINT_URI"
# Training pods run as this service account, whose Pod Identity role reads and writes the stack's datasets,
# checkpoints and models buckets (components/data_access.py).
JOB_SERVICE_ACCOUNT = "trainer"
# What the Pod Identity webhook sets in a pod for AWS SDKs and the CLI. Ranks start through sshd and inherit no
# environment, so mpirun forwards these from the launcher (the same values hold on every worker: the agent's
# link-local address and the token path the webhook mounts in every pod of the service account).
POD_IDENTITY_ENV = ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")


def wait_for_workers_script(wait_s: int) -> str:
    """Bash that waits until every worker in the hostfile answers ssh, for at most `wait_s` seconds. After an
    interruption the operator recreates lost workers, which may wait for a new node; mpirun would fail at once and
    spend the job's retries, so the launcher waits instead (Kueue requeues the job if they do not come back)."""
    return "\n".join([
        f"deadline=$((SECONDS + {int(wait_s)}))",
        # -n: ssh must not read the hostfile the loop is reading.
        "while read -r host _; do",
        '  until ssh -n -o BatchMode=yes -o StrictHostKeyChecking=no -o ConnectTimeout=5 "$host" true; do',
        '    if [ "$SECONDS" -ge "$deadline" ]; then',
        f'      echo "worker $host did not answer ssh within {int(wait_s)}s" >&2',
        "      exit 1",
        "    fi",
        "    sleep 10",
        "  done",
        f"done < {HOSTFILE}",
        ""])


def training_mpijob(pool, *, name: str, namespace: str, queue_name: str, image: str, workers: int,
                    program: Sequence[str], worker_wait_s: int, checkpoint_uri: str = "") -> dict:
    """The training-job template: `program` under mpirun on `workers` whole nodes of an EFA pool.

    Interruptions: a worker lost to a spot reclaim or a drain is recreated by the operator; the launcher restarts
    (restartPolicy OnFailure, up to TRAINING_BACKOFF_LIMIT times), waits for every worker and runs `program` again,
    which resumes from its last checkpoint under CHECKPOINT_URI. If the workers stay away past Kueue's recovery
    timeout, Kueue suspends and requeues the whole job instead.
    """
    env = efa_env(pool)
    forward = (*POD_IDENTITY_ENV, *((CHECKPOINT_ENV,) if checkpoint_uri else ()))
    if checkpoint_uri:
        env[CHECKPOINT_ENV] = checkpoint_uri
    mpirun = mpirun_command(pool, workers, program, forward)
    launcher = {
        "name": "launcher", "image": image,
        "command": ["bash", "-c", wait_for_workers_script(worker_wait_s) + f"exec {shlex.join(mpirun)}\n"],
        "env": env_list(env), "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    }
    labels = {"app.kubernetes.io/name": name, POOL_LABEL: pool.name}
    return efa_mpijob(
        pool, name=name, generated=False, namespace=namespace, queue_name=queue_name, image=image, workers=workers,
        launcher=launcher, labels=labels, restart_policy="OnFailure",
        launcher_pod={"serviceAccountName": JOB_SERVICE_ACCOUNT}, worker_service_account=JOB_SERVICE_ACCOUNT,
        # Running: when the launcher ends, stop the workers (and free their GPUs).
        run_policy={"cleanPodPolicy": "Running", "backoffLimit": TRAINING_BACKOFF_LIMIT,
                    "ttlSecondsAfterFinished": TRAINING_TTL_S})
