"""PyTorch training as a JobSet (jobset.x-k8s.io/v1alpha2, JobSet v0.12.0; no Pulumi): the torchrun template
(`python -m jobs pytorch-job`), and the pod failure policies every Job template here uses.

Sources are read at their pinned tags: kubernetes-sigs/jobset v0.12.0 ("jobset"), kubernetes-sigs/kueue v0.19.2
("kueue"), aws-samples/awsome-distributed-training v1.2.0 ("blueprints"); a bare path is the project named just before.

Why a JobSet and not an MPIJob
------------------------------
Kueue requeues a job whose pods stop being ready only if it can see that they did. For a JobSet it counts them: all
its child Jobs must have every pod ready or succeeded (kueue pkg/controller/jobs/jobset/jobset_controller.go lines
185-195, from the JobSet's replicatedJobsStatus, which jobset pkg/controllers/jobset_controller.go lines 484-492
computes from each Job's ready pods). An MPIJob's is a condition the MPI Operator never clears on node loss
(decisions/platform/mpijob.training_mpijob).

What happens when a node goes away
----------------------------------
1. The pod on it gets the DisruptionTarget condition: a drain or a spot warning through the Eviction API, the pod
   garbage collector when the node object is gone, the kubelet on node pressure or graceful shutdown (Kubernetes,
   "Pod disruption conditions"; pkg/kubelet/eviction/eviction_manager.go sets reason TerminationByKubelet).
2. Its Job fails at once with reason PodFailurePolicy (podFailurePolicy FailJob on that condition, backoffLimit 0).
3. The JobSet's rule for that reason restarts the whole set without counting the restart
   (RestartJobSetAndIgnoreMaxRestarts: jobset pkg/controllers/failure_policy.go lines 266-297; the rule is matched on
   the Job's failure reason, lines 140-164). BlockingRecreate deletes every old pod before it creates new ones
   (jobset_controller.go lines 918-925), so no rank of the old run reaches the new rendezvous. Any other failure (the
   program's own) takes the default RestartJobSet, which counts towards failurePolicy.maxRestarts (failure_policy.go
   lines 44-45 and 224-233); past it the JobSet fails for good. The Job that fails first decides: if the other
   nodes' processes fail on the lost peer before its pod is marked (a node gone without a drain), the restart counts.
4. The new pods wait for nodes. Kueue sees the set not ready (kueue pkg/controller/jobframework/reconciler.go lines
   1886-1896, WaitForRecovery); if it is not all ready again within waitForPodsReady's recoveryTimeout
   (pkg/controller/core/workload_controller.go lines 1676-1679), Kueue evicts it: the JobSet is suspended (its pods go,
   the quota is freed) and requeued with backoff, and admitted again when the pool has quota.
Each start runs the program from the beginning, so it resumes from its last checkpoint.

Rendezvous
----------
The pod with hostname `<job>-node-0-<i>` runs torchrun as node rank i (the Job's completion index, read from the
pod annotation as in jobset site/static/examples/pytorch/cnn-mnist/mnist.yaml lines 23-30). Node 0's torchrun hosts
torch's c10d TCPStore on port 29500 and the others connect to it by the name `<job>-node-0-0.<job>`, which the
JobSet's headless Service publishes before the pod is ready (jobset pkg/webhooks/jobset_webhook.go lines 130-139: DNS
hostnames on and publishNotReadyAddresses, subdomain = the JobSet's name). torchrun takes every option from a
PET_<OPTION> variable (torch/distributed/argparse_util.py `env`), so the program's command stays
`torchrun train.py ...`. It is torchrun's static rendezvous, whose store host is the node of rank 0
(torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py); the c10d rendezvous backend would guess its host by
matching the endpoint against the pod's hostname and addresses (c10d_rendezvous_backend.py `_create_tcp_store`), a
guess that misses when the endpoint is not the pod's own host name and its DNS record is not published yet. Nodes
arrive up to Kueue's pods-ready timeout apart (a node from zero through the boot gate, then the image), so the store
waits that long (its `timeout`; torchrun's default is 900 s: blueprints 3.test_cases/pytorch/ddp/slurm/README.md
line 49).

Across nodes: EFA, or TCP
-------------------------
On an EFA pool each pod takes the node's EFA devices and NCCL runs over libfabric's efa provider
(decisions/platform/mpijob.efa_env). On a pool without EFA (the spot A100 pools: several types, or no placement group)
NCCL runs over its own TCP sockets: NCCL_NET=Socket picks the network NCCL names "Socket" (NVIDIA/nccl v2.29.7-1
src/init.cc line 1857 reads NCCL_NET, src/plugin/net.cc line 307 keeps the network of that name,
src/transport/net_socket.cc line 725 names it), so an aws-ofi-nccl plugin in the image is not tried, and nothing asks
for EFA devices, libfabric or locked memory. Through the pod's one interface that is at most one network card's share
of the node's bandwidth (socket_bandwidth_warning), which `python -m jobs pytorch-job` prints.

Hang diagnosis: the flight recorder
-----------------------------------
Each rank keeps its last TORCH_NCCL_TRACE_BUFFER_SIZE collectives and, when one times out, writes them to the file
TORCH_NCCL_DEBUG_INFO_TEMP_FILE + its rank (PyTorch torch/csrc/distributed/c10d: DebugInfoWriter's file name is
prefix + rank; DebugInfoWriter::write opens it with std::ofstream and, when that fails, only logs "Error opening file
for writing ... debug info"). PyTorch creates no folder for that prefix (later releases create their own default
folder, $HOME/.cache/torch, and no other: DebugInfoWriter::getWriter in FlightRecorder.cpp), so the trainer's shell
creates it before torchrun starts (TRAINER_SCRIPT). PyTorch's reader, fr_trace, takes one folder with one file per
rank (torch/distributed/flight_recorder/components/config_manager.py, trace_dir), so the folder is one for the whole
job, per attempt: on a stack with Lustre the file system every node mounts, at job_options.TRACES_PATH, a directory
beside the one linked to the datasets bucket, so the dumps outlive the pods and are never exported (what is written
under /data is: decisions/storage/lustre.py); without Lustre, /scratch, which goes with the pod. Each JobSet restart
writes to its own folder, `attempt-<n>` (the restart count JobSet puts on every pod as the annotation
jobset.sigs.k8s.io/restart-attempt: jobset pkg/controllers/jobset_controller.go lines 1023, 1041 and 949-950), so no
rank's dump of an earlier attempt sits beside this attempt's, where fr_trace would match them.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

from decisions.nodes.efa import ip_bandwidth_gbps
from decisions.nodes.scratch import SCRATCH_MOUNT_PATH, allocatable_ephemeral_storage_gib, node_ephemeral_storage_gib, \
    raid0_instance_store
from decisions.nodes.pools import POOL_LABEL, QUEUE_LABEL
from decisions.platform import job_options, pod_security
from decisions.platform.job_options import DNS_LABEL_MAX
from decisions.platform.mpijob import JOB_SERVICE_ACCOUNT, NCCL_NETWORK_ENV, ROOT_VOLUME_SCRATCH, SHM_MOUNT, \
    SHM_VOLUME, TRAINING_TTL_S, check_whole_nodes, efa_env, env_list, close_ranks_preference, node_selector, \
    tolerations, whole_node_resources

API_VERSION = "jobset.x-k8s.io/v1alpha2"
NODE_JOB = "node"                     # the one replicated Job: one pod per node
RDZV_PORT = 29500                     # torchrun's --master-port default (torch/distributed/run.py)
NODE_RANK_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POD_NAME_SUFFIX = len("-abcde")       # what the Job controller appends; jobset_webhook.go lines 243-256 count it

# A pod that failed because it was disrupted (the DisruptionTarget condition), not because of what it ran.
DISRUPTED = {"type": "DisruptionTarget", "status": "True"}
# Single-node Jobs: a disrupted pod is replaced and counts against no backoffLimit (Ignore). Needs restartPolicy
# Never (kubernetes pkg/apis/batch/validation/validation.go: "only "Never" is supported when podFailurePolicy is
# specified").
IGNORE_DISRUPTIONS = {"rules": [{"action": "Ignore", "onPodConditions": [DISRUPTED]}]}
# A JobSet's nodes: one disrupted pod fails its Job with reason PodFailurePolicy, which the JobSet restarts on.
FAIL_ON_DISRUPTION = {"rules": [{"action": "FailJob", "onPodConditions": [DISRUPTED]}]}
NODE_LOST_RULE = "node_lost"          # rule names: ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ (jobset_webhook.go l. 418)
# Restarts for the program's own failures; node losses do not count.
DEFAULT_MAX_RESTARTS = 3

# The PyTorch side of the environment, as AWS's FSDP blueprint for EKS sets it (blueprints
# 3.test_cases/pytorch/FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml lines 75-104; its FI_PROVIDER,
# FI_EFA_USE_DEVICE_RDMA, NCCL_DEBUG and NCCL_SOCKET_IFNAME are mpijob.efa_env's, its FI_EFA_FORK_SAFE is
# EFA_TORCH_ENV, its trace file is set below). Left out: TORCH_DISTRIBUTED_DEBUG (DETAIL checks every collective; a
# debugging setting), HF_TOKEN (the program's own) and FI_EFA_ENABLE_SHM_TRANSFER=1 (libfabric's default already,
# "really a no-op": blueprints 1.architectures/efa-cheatsheet.md line 15).
TORCH_ENV = {
    "LOGLEVEL": "INFO",                                   # torchrun's own log
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",               # a failed or timed-out collective ends the process, and so
                                                          # the pod, instead of hanging the job
    "TORCH_NCCL_ENABLE_MONITORING": "1",                  # a watchdog that ends a process whose NCCL thread hangs
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",              # the flight recorder: the last collectives of each rank
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",                    # ... written to a file when a collective times out
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}
EFA_TORCH_ENV = {"FI_EFA_FORK_SAFE": "1"}                 # data-loader workers fork after libfabric registered memory
# Over TCP (pools without EFA): NCCL's own socket network, named (module docstring).
SOCKET_ENV = {"NCCL_NET": "Socket", **NCCL_NETWORK_ENV}

# The flight recorder's dumps (module docstring, "Hang diagnosis").
TRACE_FILE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
RESTART_ATTEMPT_ENV = "JOBSET_RESTART_ATTEMPT"
RESTART_ATTEMPT_ANNOTATION = "jobset.sigs.k8s.io/restart-attempt"
# The trainer's command, in bash: `bash -c TRAINER_SCRIPT torchrun PROGRAM...` runs torchrun with the program as its
# arguments, unquoted and unchanged. The folder comes from the variable itself, so a --env that moves the dumps moves
# the folder too; one that cannot be made costs the dumps, not the job.
TRAINER_SCRIPT = f"""traces=$(dirname -- "${TRACE_FILE_ENV}")
mkdir -p -- "$traces" || echo "cannot create $traces: the NCCL flight recorder's dumps will be lost" >&2
exec torchrun "$@"
"""


def max_job_name(nodes: int) -> int:
    """The longest JobSet name whose last pod name is still a DNS-1035 label (jobset_webhook.go lines 243-256)."""
    return DNS_LABEL_MAX - len(f"-{NODE_JOB}-0-{nodes - 1}") - POD_NAME_SUFFIX


def leader_address(name: str) -> str:
    """Node 0's pod as the JobSet's headless Service names it: <job>-<replicatedJob>-<job index>-<pod index> (jobset
    pkg/util/placement/placement.go lines 14-22) under the subdomain <job> (jobset_controller.go lines 1090-1100)."""
    return f"{name}-{NODE_JOB}-0-0.{name}"


def default_scratch(pool, nvme_scratch: bool) -> str:
    """Half of what a node offers pods as ephemeral storage when the pool has the RAID0 array (the rest for images,
    logs and other pods), else ROOT_VOLUME_SCRATCH."""
    itype = pool.primary_type
    if raid0_instance_store(itype, nvme_scratch):
        return f"{allocatable_ephemeral_storage_gib(node_ephemeral_storage_gib(itype)) // 2}Gi"
    return ROOT_VOLUME_SCRATCH


def trace_file_prefix(name: str, mounts_lustre: bool) -> str:
    """TORCH_NCCL_DEBUG_INFO_TEMP_FILE: <folder of the job>/attempt-<JobSet restart>/rank_ (module docstring, "Hang
    diagnosis"). The kubelet puts the restart count in: it expands $(VAR) with the container's variables listed before
    it (the EnvVar value field, Kubernetes API), and pytorch_jobset lists RESTART_ATTEMPT_ENV first."""
    root = job_options.TRACES_PATH if mounts_lustre else f"{SCRATCH_MOUNT_PATH}/nccl-traces"
    return f"{root}/{name}/attempt-$({RESTART_ATTEMPT_ENV})/rank_"


def socket_bandwidth_warning(pool) -> Optional[str]:
    """What a pytorch-job across nodes of `pool` gets over TCP, against EFA, in words; None on an EFA pool. A pod's one
    interface (eth0, on network card 0) carries it: one card's share of the type's bandwidth (decisions/nodes/efa.py
    ip_bandwidth_gbps), where EFA would use every card's."""
    if pool.efa:
        return None
    itype = pool.primary_type
    return (f"pool {pool.name} has no EFA: NCCL runs across nodes over TCP sockets, through each pod's one network "
            f"interface, at most {ip_bandwidth_gbps(itype, efa=False):g} Gbps a node ({itype.name}: network card 0 of "
            f"{itype.network_cards}), against {itype.network_gbps:g} Gbps over EFA on an EFA pool of {itype.name}, "
            "which also bypasses the kernel")


def torchrun_env(pool, name: str, nodes: int, rendezvous_timeout_s: int) -> List[dict]:
    """torchrun's options as PET_ variables (the module docstring says why each)."""
    env = env_list({
        "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(pool.gpus_per_node),
        "PET_MASTER_ADDR": leader_address(name), "PET_MASTER_PORT": str(RDZV_PORT),
        "PET_RDZV_CONF": f"timeout={int(rendezvous_timeout_s)}",
        # Restarts are the JobSet's: every node starts again together.
        "PET_MAX_RESTARTS": "0",
    })
    env.append({"name": "PET_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{NODE_RANK_ANNOTATION}']"}}})
    return env


def pytorch_jobset(pool, *, name: str, namespace: str, queue_name: str, image: str, nodes: int,
                   program: Sequence[str], rendezvous_timeout_s: int, scratch: str, mounts_lustre: bool,
                   checkpoint_uri: str = "", max_restarts: int = DEFAULT_MAX_RESTARTS,
                   lustre_configured: Optional[bool] = None, env: Mapping[str, str] = (),
                   volumes: Sequence[job_options.UserVolume] = ()) -> dict:
    """`torchrun PROGRAM` on `nodes` whole nodes of a pool of whole GPUs (a decisions.config.stack.ResolvedPool),
    over EFA where the pool has it and over TCP where it has not, as a JobSet in the queue `queue_name`. `scratch`: the
    NVMe scratch emptyDir's size (a Kubernetes quantity), also the pod's ephemeral-storage request and limit.
    `mounts_lustre`: mount the claim lustre-data at /data and job_options.TRACES_PATH
    (decisions.storage.lustre.mounts_lustre). `max_restarts`: restarts after the program's own failures. `env`,
    `volumes`: the user's --env and --volume (decisions/platform/job_options.py); `lustre_configured`: the stack has
    storage.lustre (default: `mounts_lustre`)."""
    check_whole_nodes(pool, nodes)
    job_options.check_job(name, f"{max_job_name(nodes)} characters with {nodes} node(s)", max_job_name(nodes),
                          scratch, max_restarts, program, "the training script and its arguments")
    labels = {"app.kubernetes.io/name": name, POOL_LABEL: pool.name}
    pod_volumes, mounts = job_options.job_storage(
        scratch=scratch, mounts_lustre=mounts_lustre,
        lustre_configured=mounts_lustre if lustre_configured is None else lustre_configured,
        user_volumes=volumes, shm=(SHM_VOLUME, SHM_MOUNT))
    network_env = {**efa_env(pool), **EFA_TORCH_ENV} if pool.efa else SOCKET_ENV
    values = job_options.job_env({**network_env, **TORCH_ENV, TRACE_FILE_ENV: trace_file_prefix(name, mounts_lustre)},
                                 checkpoint_uri, dict(env))
    resources = whole_node_resources(pool)
    resources["requests"]["ephemeral-storage"] = resources["limits"]["ephemeral-storage"] = scratch
    restart_attempt = {"name": RESTART_ATTEMPT_ENV, "valueFrom": {
        "fieldRef": {"fieldPath": f"metadata.annotations['{RESTART_ATTEMPT_ANNOTATION}']"}}}
    trainer = {
        "name": "trainer", "image": image, "command": ["bash", "-c", TRAINER_SCRIPT, "torchrun", *program],
        "env": [restart_attempt, *env_list(values), *torchrun_env(pool, name, nodes, rendezvous_timeout_s)],
        "resources": resources,
        # The job's image as its user, writable (decisions/platform/pod_security.WAIVERS); IPC_LOCK where EFA pins its
        # buffers.
        "securityContext": pod_security.container_security_context(
            None, read_only_root=False, add=pod_security.EFA_CAPABILITIES if pool.efa else ()),
        "volumeMounts": mounts,
    }
    pod = {"restartPolicy": "Never", "serviceAccountName": JOB_SERVICE_ACCOUNT, "automountServiceAccountToken": False,
           "nodeSelector": node_selector(pool), "tolerations": tolerations(pool),
           "affinity": close_ranks_preference(labels), "containers": [trainer], "volumes": pod_volumes}
    return {
        "apiVersion": API_VERSION, "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, QUEUE_LABEL: queue_name}},
        "spec": {
            # The defaults (jobset_webhook.go lines 130-139), stated: the rendezvous needs both.
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate", "rules": [
                {"name": NODE_LOST_RULE, "action": "RestartJobSetAndIgnoreMaxRestarts",
                 "onJobFailureReasons": ["PodFailurePolicy"]}]},
            "ttlSecondsAfterFinished": TRAINING_TTL_S,
            "replicatedJobs": [{"name": NODE_JOB, "replicas": 1, "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
                         "backoffLimit": 0, "podFailurePolicy": FAIL_ON_DISRUPTION,
                         "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}}}],
        },
    }
