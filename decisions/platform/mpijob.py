"""MPIJobs over EFA as plain manifests (kubeflow.org/v2beta1, mpi-operator v0.8.0; no Pulumi): what every
multi-node job on an EFA pool needs, used by the training-job template (`python -m jobs mpijob`) and the NCCL
acceptance test (decisions/platform/acceptance.py).

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

Where the launcher runs
-----------------------
On the job's own pool, beside one of its workers (launcher_placement). It asks only CPU and memory, which the queue
does not cover, so Kueue assigns its pod set no flavor and adds no node selector (kubernetes-sigs/kueue v0.19.2
pkg/scheduler/flavorassigner/flavorassigner.go lines 803-812, quotaCheckStrategy IgnoreUndeclared). Left alone it
would fit no node: every GPU node carries the GPU taint, and the system nodes CriticalAddonsOnly, which a team pod
may not tolerate (decisions/nodes/pods.py SYSTEM_NODE_TAINT, decisions/platform/tenancy.py); their root volumes,
EKS's managed-node-group default (20 GiB: components/cluster.py sets no disk size), could not hold a training image
anyway. So the template gives it the pool's selector and tolerations itself, and a preferred affinity for a node
running one of the job's workers, where the image is already pulled. The operator hides that node's GPUs from the
launcher (NVIDIA_VISIBLE_DEVICES empty: kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go lines
1600-1606). `runLauncherAsWorker` (v0.8.0 pkg/apis/kubeflow/v2beta1/types.go lines 176-180) is the other way: the
launcher becomes the first host of the hostfile (mpi_job_controller.go lines 1319-1327) and Kueue counts whatever its
template requests (Kueue's pkg/controller/jobs/mpijob/mpijob_controller.go lines 113-133), so it would have to take a
whole node and run ranks itself, and the launcher's ssh wait would have to skip its own hostfile line. The side
launcher keeps the two roles apart and costs no node.
"""
from __future__ import annotations

import copy
import hashlib
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.pools import EFA_RESOURCE, GPU_RESOURCE, POOL_LABEL, QUEUE_LABEL, efa_devices, node_taints, \
    toleration
from decisions.platform import job_options, pod_security
from decisions.platform.job_options import DNS_LABEL_MAX

API_VERSION = "kubeflow.org/v2beta1"
MPIRUN = "/opt/amazon/openmpi/bin/mpirun"       # Open MPI as the EFA installer puts it in images
HOSTFILE = "/etc/mpi/hostfile"                  # where mpi-operator v0.8.0 mounts it (configMountPath)
# Labels mpi-operator v0.8.0 puts on an MPIJob's pods (pkg/apis/kubeflow/v2beta1/constants.go lines 42-45).
MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
SHM_SIZE_GIB = 16
SHM_SIZE = f"{SHM_SIZE_GIB}Gi"
SHM_VOLUME = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}
SHM_MOUNT = {"name": "shm", "mountPath": "/dev/shm"}
# GPUDirect RDMA over EFA (device RDMA) exists on p4d and later.
DEVICE_RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
# Worker pods are named <job>-worker-<i>, which must be a DNS-1035 label (at most DNS_LABEL_MAX characters).
GENERATED_SUFFIX = 5            # what the API server appends to a generateName
GENERATE_NAME_MAX = DNS_LABEL_MAX - len("-worker-9") - GENERATED_SUFFIX     # 49: fits jobs of up to 10 workers


def max_job_name(workers: int) -> int:
    """The longest MPIJob name whose last worker pod name is still a DNS-1035 label."""
    return DNS_LABEL_MAX - len(f"-worker-{workers - 1}")


# EC2's network topology, as EKS shows it on the nodes of types that report one (the p, trn and hpc families: every
# EFA training type here, no g type): the AWS cloud controller manager asks DescribeInstanceTopology when a node
# registers and labels it topology.k8s.aws/network-node-layer-<n> (kubernetes/cloud-provider-aws v1.35.2
# pkg/providers/v1/topology.go line 43, instances_v2.go lines 86-107); layer 3 is the switch nearest the instance.
NEAREST_SWITCH_LABEL = "topology.k8s.aws/network-node-layer-3"


ZONE_LABEL = "topology.kubernetes.io/zone"


def close_ranks_preference(match_labels: Mapping[str, str], match_label_keys: Sequence[str] = ()) -> Dict[str, Any]:
    """A pod affinity that draws a multi-node job's ranks into one zone, and under one bottom-layer switch where there
    is room; it changes nothing where there is not (preferred; a node without the label matches no term).
    - One zone (weight 100): traffic between zones is billed on both sides, and an all-reduce moves the model's
      gradients every step (decisions/cost/transfer.py). EFA pools and pools that mount Lustre run in one zone
      anyway (decisions/storage/lustre.py in_file_system_zone); this holds the others' jobs together once nodes run
      in a zone. It cannot steer a scale-up from zero: cluster-autoscaler runs only the scheduler's filter plugins
      (kubernetes/autoscaler cluster-autoscaler-1.35.2 simulator/clustersnapshot/predicate/plugin_runner.go lines 105
      and 153, RunFilterPlugins), and a preferred term is a score, so the group still balances new nodes by zone.
    - One switch (weight 50): EC2's network topology labels, below. Kueue's topology-aware scheduling would place
      them by the same labels, but not here: at v0.19.2 a pod set without a topology request is never admitted to a
      TAS flavor, and one with a request never to another flavor (pkg/scheduler/flavorassigner/
      tas_flavorassigner.go lines 166-204), so a TAS flavor in the one shared queue would shut ordinary jobs out of
      its pool; and TAS places only on nodes that exist (pkg/cache/scheduler/tas_nodes_cache.go), which pools scaling
      from zero do not have. The EFA pools' cluster placement group already keeps their nodes close
      (components/nodes/nodepool.py)."""
    def term(topology_key: str) -> Dict[str, Any]:
        found: Dict[str, Any] = {"labelSelector": {"matchLabels": dict(match_labels)}, "topologyKey": topology_key}
        if match_label_keys:
            found["matchLabelKeys"] = list(match_label_keys)
        return found
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term(ZONE_LABEL)},
        {"weight": 50, "podAffinityTerm": term(NEAREST_SWITCH_LABEL)}]}}


def launcher_placement(pool) -> Dict[str, Any]:
    """Launcher pod-spec fields: the pool's nodes, preferring one that runs a worker of the same MPIJob. The
    operator labels workers job-role=worker and every pod job-name=<MPIJob> (mpi_job_controller.go lines 1482-1484,
    1564-1566, 1743-1749); matchLabelKeys takes the job name from the launcher's own label, so the rule needs no name
    and also fits generated ones (KEP-3633: on by default from Kubernetes 1.31, GA in 1.33). Preferred, not
    required: a launcher recreated while its workers wait for nodes still starts."""
    return {
        "nodeSelector": node_selector(pool), "tolerations": tolerations(pool),
        "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {MPI_JOB_ROLE_LABEL: "worker"}},
                "matchLabelKeys": [MPI_JOB_NAME_LABEL], "topologyKey": "kubernetes.io/hostname"}}]}},
    }


# What NCCL needs across nodes on every pool, EFA or not.
NCCL_NETWORK_ENV: Mapping[str, str] = {
    "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",     # shows the network chosen ("Selected provider is efa")
    # The VPC CNI gives a pod one interface, eth0: naming it fails loudly if it is missing, where an exclusion list
    # (^lo,docker) would silently take whatever else is there. NCCL bootstraps over it, and on pools without EFA
    # carries its traffic over it.
    "NCCL_SOCKET_IFNAME": "eth0",
}


def efa_env(pool) -> Dict[str, str]:
    """What NCCL over EFA needs in every rank's environment."""
    env = {"FI_PROVIDER": "efa"}
    if pool.primary_type.family in DEVICE_RDMA_FAMILIES:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    # The pods request no hugepages-2Mi, so libfabric must not try huge-page buffers.
    env["FI_EFA_USE_HUGE_PAGE"] = "0"
    env.update(NCCL_NETWORK_ENV)
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
    """The pool's nodes. The pool's Kueue flavor selects by the same label (decisions/platform/kueue.py), so Kueue
    admits the job only to this pool's flavor."""
    return {POOL_LABEL: pool.name}


def env_list(values: Mapping[str, str]) -> List[dict]:
    return [{"name": name, "value": value} for name, value in values.items()]


def mpirun_command(pool, workers: int, program: Sequence[str], forward: Sequence[str] = ()) -> List[str]:
    """mpirun of `program`, one rank per GPU on each worker, forwarding the EFA environment, PATH and
    LD_LIBRARY_PATH as the image sets them (Open MPI, libfabric, NCCL, aws-ofi-nccl), and `forward`."""
    gpus = pool.gpus_per_node
    names = dict.fromkeys((*efa_env(pool), "PATH", "LD_LIBRARY_PATH", *forward))    # each once, in order
    forward = [arg for name in names for arg in ("-x", name)]
    return [MPIRUN, "--allow-run-as-root", "-np", str(workers * gpus), "-N", str(gpus), "--bind-to", "none",
            *forward, *program]


WHOLE_NODE_CPU_REQUEST = 16
WHOLE_NODE_MEMORY_REQUEST_GIB = 64
WHOLE_NODE_MEMORY_SHARE = 0.9
LAUNCHER_MEMORY_LIMIT = "2Gi"       # mpirun and one ssh client per worker: tens of MiB, ample for hundreds of ranks
# Every MPIJob launcher here (the training template's, the NCCL test's): CPU and memory only, which the queue does
# not cover (module docstring).
LAUNCHER_RESOURCES: Mapping[str, Mapping[str, str]] = {"requests": {"cpu": "500m", "memory": "512Mi"},
                                                       "limits": {"memory": LAUNCHER_MEMORY_LIMIT}}


def whole_node_memory_limit_gib(pool) -> int:
    """A whole-node pod's memory limit: the node is the job's, so 90 % of its memory (never below the request). The
    rest stays for the kubelet, the system daemons and the node's DaemonSets, so a runaway rank is killed in its own
    cgroup before the kernel's OOM killer picks a system process."""
    return max(WHOLE_NODE_MEMORY_REQUEST_GIB, int(pool.primary_type.memory_gib * WHOLE_NODE_MEMORY_SHARE))


def whole_node_resources(pool) -> Dict[str, Dict[str, Any]]:
    """Every GPU and EFA device (none on a pool without EFA) of one node of the pool, requested and limited alike, and
    most of its memory (whole_node_memory_limit_gib)."""
    devices = {GPU_RESOURCE: pool.gpus_per_node, **({EFA_RESOURCE: efa_devices(pool)} if pool.efa else {})}
    return {"requests": {**devices, "cpu": str(WHOLE_NODE_CPU_REQUEST), "memory": f"{WHOLE_NODE_MEMORY_REQUEST_GIB}Gi"},
            "limits": {**devices, "memory": f"{whole_node_memory_limit_gib(pool)}Gi"}}


def worker_container(pool, image: str, mounts: Sequence[Mapping[str, Any]] = (SHM_MOUNT,),
                     ephemeral_storage: str = "") -> dict:
    """A worker: sshd on a whole node; `mounts` its volumeMounts, `ephemeral_storage` (its scratch) requested and
    limited as such when given."""
    resources = whole_node_resources(pool)
    if ephemeral_storage:
        resources["requests"]["ephemeral-storage"] = resources["limits"]["ephemeral-storage"] = ephemeral_storage
    return {
        "name": "worker", "image": image, "command": ["/usr/sbin/sshd", "-De"],
        "resources": resources,
        # Root, with a writable root, and sshd's capabilities beside IPC_LOCK: decisions/platform/pod_security.WAIVERS
        # says why.
        "securityContext": pod_security.container_security_context(
            None, read_only_root=False, add=(*pod_security.EFA_CAPABILITIES, *pod_security.SSHD_CAPABILITIES)),
        "volumeMounts": [dict(mount) for mount in mounts],
    }


def check_pool(pool, workers: int) -> None:
    """A pool a multi-node EFA job can run on, or a ValueError naming the pool and why not."""
    if not pool.efa:
        raise ValueError(f"pool {pool.name}: EFA is off; a multi-node job over EFA needs an EFA pool")
    check_whole_nodes(pool, workers)


def check_whole_nodes(pool, nodes: int) -> None:
    """A pool a job of `nodes` whole nodes can run on (EFA or not), or a ValueError naming the pool and why not."""
    if nodes < 1 or pool.spec.max_nodes < nodes:
        raise ValueError(f"pool {pool.name}: {nodes} worker(s) do not fit its maxNodes {pool.spec.max_nodes}")
    mode = pool.spec.gpu_sharing.mode
    if mode != "none":
        raise ValueError(f"pool {pool.name}: GPU sharing mode {mode!r}; a multi-node job needs whole GPUs")


def efa_mpijob(pool, *, name: str, generated: bool, namespace: str, queue_name: str, image: str, workers: int,
               launcher: Mapping[str, Any], run_policy: Mapping[str, Any], restart_policy: str,
               labels: Mapping[str, str], launcher_pod: Mapping[str, Any] = (),
               worker_service_account: Optional[str] = None,
               worker_storage: Optional[Tuple[Sequence[dict], Sequence[dict], str]] = None) -> dict:
    """An MPIJob on `pool` (a decisions.config.stack.ResolvedPool) named `name` (a generateName prefix when
    `generated`): `workers` whole nodes running sshd, and a launcher
    pod whose first container is `launcher` (the operator adds the hostfile, ssh keys and MPI environment to the
    first container only), placed on the pool beside a worker (launcher_placement). `launcher_pod`: more launcher
    pod-spec fields (containers after the first, volumes). `worker_service_account`: the workers' service account
    (the namespace's default without). `worker_storage`: the workers' (volumes, volumeMounts, scratch size) instead
    of /dev/shm alone (decisions/platform/job_options.job_storage)."""
    check_pool(pool, workers)
    length = len(name) + (GENERATED_SUFFIX if generated else 0)
    if length > max_job_name(workers):
        raise ValueError(f"job name {name!r} is too long: with {workers} workers a name may have at most "
                         f"{max_job_name(workers) - (GENERATED_SUFFIX if generated else 0)} characters")
    pod = dict(launcher_pod)
    worker_volumes, worker_mounts, scratch = worker_storage or ([SHM_VOLUME], [SHM_MOUNT], "")
    launcher_spec = {**pod, **launcher_placement(pool), "containers": [dict(launcher), *pod.get("containers", [])]}
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
                             "affinity": close_ranks_preference({MPI_JOB_ROLE_LABEL: "worker"},
                                                                   (MPI_JOB_NAME_LABEL,)),
                             "automountServiceAccountToken": False,
                             "containers": [worker_container(pool, image, worker_mounts, scratch)],
                             "volumes": [dict(volume) for volume in worker_volumes]}}},
            },
        },
    }


# A training job retries mpirun this often by default (`--max-restarts`: the MPIJob's runPolicy.backoffLimit, which
# mpi-operator v0.8.0 copies to the launcher Job's backoffLimit: pkg/controller/mpi_job_controller.go line 1543)
# before it fails for good. Every retry counts, a lost worker's too (training_mpijob says why): more than
# jobset.DEFAULT_MAX_RESTARTS, where node losses do not count.
TRAINING_BACKOFF_LIMIT = 6
TRAINING_TTL_S = 7 * 86400      # a finished job stays a week for its logs and status
# Without the RAID0 array a pod's scratch is on the node's root volume (500 GiB, components/nodes/nodepool.py
# ROOT_VOLUME_GIB), which also holds the images.
ROOT_VOLUME_SCRATCH = "100Gi"
# Training pods run as this service account, whose Pod Identity role reads and writes the stack's datasets and
# checkpoints buckets and reads its models bucket (components/storage/data_access.py, decisions/storage/data_access.py).
JOB_SERVICE_ACCOUNT = "trainer"
# What the Pod Identity webhook sets in a pod for AWS SDKs and the CLI. Ranks start through sshd and inherit no
# environment, so mpirun forwards these from the launcher (the same values hold on every worker: the agent's
# link-local address and the token path the webhook mounts in every pod of the service account).
POD_IDENTITY_ENV = ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")


def wait_for_workers_script(wait_s: int) -> str:
    """Bash that waits until every worker in the hostfile answers ssh, for at most `wait_s` seconds. After an
    interruption the operator recreates lost workers, which may wait for a new node; mpirun would fail at once and
    spend the job's retries, so the launcher waits instead. Nothing requeues an MPIJob whose workers do not come
    back (training_mpijob says why): after `wait_s` the attempt fails and spends one retry."""
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
                    program: Sequence[str], worker_wait_s: int, checkpoint_uri: str = "", scratch: str = "",
                    mounts_lustre: bool = False, lustre_configured: bool = False, env: Mapping[str, str] = (),
                    volumes: Sequence["job_options.UserVolume"] = (),
                    max_restarts: int = TRAINING_BACKOFF_LIMIT) -> dict:
    """The training-job template: `program` under mpirun on `workers` whole nodes of an EFA pool. Every worker
    mounts what decisions/platform/job_options.py says (/data where `mounts_lustre`, /scratch of `scratch`,
    ROOT_VOLUME_SCRATCH when empty, /dev/shm, each of `volumes`); `env` (the user's --env) reaches every rank with the
    template's own settings and the checkpoint locations. `max_restarts`: the times mpirun runs again after a
    failure, a lost worker's included.

    Interruptions, as kubeflow/mpi-operator v0.8.0 pkg/controller/mpi_job_controller.go handles them:
    - a worker pod deleted (a drain's eviction, a node gone) is created again (lines 1010-1017); the launcher's
      mpirun fails, the launcher restarts (restartPolicy OnFailure, up to `max_restarts` times), waits for
      every worker and runs `program` again, which resumes from its last checkpoint under CHECKPOINT_URI;
    - a worker the kubelet evicts (phase Failed, reason Evicted) fails the whole MPIJob (lines 1139-1158);
    - nothing requeues it: Kueue's pods-ready for an MPIJob is its Running condition (kubernetes-sigs/kueue v0.19.2
      pkg/controller/jobs/mpijob/mpijob_controller.go lines 204-211), which the operator sets false only on suspend
      (lines 1160-1167), so waitForPodsReady's recovery timeout never starts. Workers that stay away make each
      retry wait `worker_wait_s` and fail, until the backoff limit fails the job.
    The JobSet template (decisions/platform/jobset.py) is the one Kueue requeues.
    """
    check_pool(pool, workers)
    scratch = scratch or ROOT_VOLUME_SCRATCH
    # What the other templates refuse (job_options.check_job).
    job_options.check_job(name, f"{max_job_name(workers)} characters with {workers} worker(s)", max_job_name(workers),
                          scratch, max_restarts, program, "the command mpirun runs and its arguments")
    env = job_options.job_env(efa_env(pool), checkpoint_uri, dict(env))
    forward = (*POD_IDENTITY_ENV, *env)
    mpirun = mpirun_command(pool, workers, program, forward)
    worker_volumes, worker_mounts = job_options.job_storage(
        scratch=scratch, mounts_lustre=mounts_lustre, lustre_configured=lustre_configured, user_volumes=volumes,
        shm=(SHM_VOLUME, SHM_MOUNT))
    launcher = {
        "name": "launcher", "image": image,
        "command": ["bash", "-c", wait_for_workers_script(worker_wait_s) + f"exec {shlex.join(mpirun)}\n"],
        "env": env_list(env),
        "resources": copy.deepcopy(LAUNCHER_RESOURCES),
        # The job's image as its user (root: the operator's SSH keys are under /root/.ssh), writable:
        # decisions/platform/pod_security.
        "securityContext": pod_security.container_security_context(None, read_only_root=False),
    }
    labels = {"app.kubernetes.io/name": name, POOL_LABEL: pool.name}
    return efa_mpijob(
        pool, name=name, generated=False, namespace=namespace, queue_name=queue_name, image=image, workers=workers,
        launcher=launcher, labels=labels, restart_policy="OnFailure",
        worker_storage=(worker_volumes, worker_mounts, scratch),
        # No Kubernetes token: mpirun reaches the workers over ssh, and Pod Identity mounts its own token.
        launcher_pod={"serviceAccountName": JOB_SERVICE_ACCOUNT, "automountServiceAccountToken": False},
        worker_service_account=JOB_SERVICE_ACCOUNT,
        # Running: when the launcher ends, stop the workers (and free their GPUs).
        run_policy={"cleanPodPolicy": "Running", "backoffLimit": max_restarts,
                    "ttlSecondsAfterFinished": TRAINING_TTL_S})
