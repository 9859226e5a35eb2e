"""The single-node job template (`python -m jobs job`): a batch/v1 Job in the training queue on ONE node of any pool
the queue places jobs on (training and general pools: spot, dev's, EFA or not, shared GPUs included). Pure: no Pulumi.

What it sets, and why
---------------------
- The queue label, the pool's node selector and a toleration of every taint its nodes carry (the interruptible one
  on spot pools), and on time-sliced and MPS pools the shared-GPU taint their Kueue flavor lists, which says the job
  takes a share (decisions/platform/kueue.py).
- GPUs, by the pool's sharing mode (decisions.nodes.pools.offered_gpu_resources names what the device plugin
advertises):
  - whole GPUs (`nvidia.com/gpu`): the whole node by default, or `gpus` of them (1 to the node's GPUs);
  - time-slicing and MPS: ONE `nvidia.com/gpu` (a share), the only request the device plugin grants there
    (failRequestsGreaterThanOne: decisions/platform/gpu_operator.device_plugin_configs);
  - MIG (`nvidia.com/mig-<profile>`): every instance of the node by default (the whole node), or `gpus` instances
    of one profile (the pool's only one, or `mig_profile`), up to what a node has of it.
- CPU and memory in proportion to the node's GPU slots it takes (`share`): a whole node asks what the multi-node
  templates' pods ask (16 CPUs and 64 GiB, limited to 90 % of the node's memory:
  decisions/platform/mpijob.whole_node_resources), a share of it that share. /scratch and /dev/shm likewise
  (decisions/platform/job_options.py mounts them, with /data and every
  --volume); on MPS pools no /dev/shm of its own: the device plugin mounts the MPS server's there
  (decisions/platform/gpu_operator.device_plugin_mounts_shm).
- A disrupted pod (drain, spot reclaim, node lost: the DisruptionTarget condition) is replaced without spending
  backoffLimit: the podFailurePolicy every single-node Job here carries (decisions/platform/jobset.IGNORE_DISRUPTIONS;
  it needs restartPolicy Never). The program's own failures count, up to `max_restarts`.
- The job's image as its own user, writable, no capability added (decisions/platform/pod_security.WAIVERS:
single-node-job);
  the service account `trainer` (the stack's data buckets through Pod Identity), no Kubernetes token.
"""
from __future__ import annotations

import copy
import math
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from decisions.config.model import REPLICATED_MODES
from decisions.nodes.pools import GPU_RESOURCE, POOL_LABEL, QUEUE_LABEL, mig_resource, offered_gpu_resources, \
    toleration
from decisions.platform import pod_security
from decisions.platform.gpu_operator import device_plugin_mounts_shm
from decisions.platform.job_options import DNS_LABEL_MAX, SHM_PATH, UserVolume, check_job, job_env, job_storage
from decisions.platform.jobset import DEFAULT_MAX_RESTARTS, IGNORE_DISRUPTIONS
from decisions.platform.kueue import SHARED_GPU_TAINT
# A whole node asks what the multi-node templates' pods ask (mpijob.whole_node_resources), /dev/shm at most theirs.
from decisions.platform.mpijob import (JOB_SERVICE_ACCOUNT, SHM_SIZE_GIB, TRAINING_TTL_S, WHOLE_NODE_CPU_REQUEST,
                                       WHOLE_NODE_MEMORY_REQUEST_GIB, env_list, node_selector, tolerations,
                                       whole_node_memory_limit_gib)

API_VERSION = "batch/v1"
CONTAINER = "job"
# A Job's name is part of its pods' names and their job-name label, so at most a DNS label's length; a DNS label is
# the form that also makes a valid pod hostname (Kubernetes documentation, "Jobs", Writing a Job spec).
NAME_MAX = DNS_LABEL_MAX


def gpu_request(pool, catalog, gpus: Optional[int] = None,
                mig_profile: Optional[str] = None) -> Tuple[Dict[str, int], float]:
    """(GPU resources the job's container requests and is limited to, its share of the node in (0, 1]) on `pool`;
    `gpus` None: the whole node (one share on time-sliced and MPS pools). A ValueError says what the pool allows."""
    offered = offered_gpu_resources(pool, catalog)
    total = sum(offered.values())
    mode = pool.spec.gpu_sharing.mode
    if mode in REPLICATED_MODES:
        if gpus not in (None, 1):
            raise ValueError(f"--gpus {gpus}: pool {pool.name} shares each GPU ({mode}, "
                             f"{pool.spec.gpu_sharing.replicas} per GPU) and the device plugin grants a pod one "
                             f"share, not more; use --gpus 1, or a pool of whole GPUs")
        return {GPU_RESOURCE: 1}, 1 / total
    if mig_profile is not None and mode != "mig":
        raise ValueError(f"--mig-profile {mig_profile}: pool {pool.name} does not use MIG")
    if mode == "mig":
        profiles = {resource.removeprefix(mig_resource("")): count for resource, count in offered.items()}
        if mig_profile is not None and mig_profile not in profiles:
            raise ValueError(f"--mig-profile {mig_profile}: pool {pool.name}'s nodes have "
                             f"{', '.join(sorted(profiles))}")
        if gpus is None and mig_profile is None:
            return dict(offered), 1.0
        if mig_profile is None:
            if len(profiles) > 1:
                raise ValueError(f"--gpus {gpus}: pool {pool.name} cuts its GPUs into several MIG profiles; name "
                                 f"one with --mig-profile ({', '.join(sorted(profiles))})")
            (mig_profile,) = profiles
        per_node = profiles[mig_profile]
        count = per_node if gpus is None else gpus
        if not 1 <= count <= per_node:
            raise ValueError(f"--gpus {gpus}: a node of pool {pool.name} has {per_node} {mig_profile} MIG "
                             f"instances; ask for 1 to {per_node}")
        return {mig_resource(mig_profile): count}, count / total
    count = total if gpus is None else gpus
    if not 1 <= count <= total:
        raise ValueError(f"--gpus {gpus}: a node of pool {pool.name} has {total} GPUs; ask for 1 to {total}")
    return {GPU_RESOURCE: count}, count / total


def resources(pool, gpu: Mapping[str, int], share: float, scratch: str) -> Dict[str, Dict[str, Any]]:
    """The container's requests and limits: its GPUs, `share` of a whole-node pod's CPU and memory, and its scratch
    as ephemeral storage."""
    cpu = max(1, math.floor(WHOLE_NODE_CPU_REQUEST * share))
    memory = max(1, math.floor(WHOLE_NODE_MEMORY_REQUEST_GIB * share))
    limit = max(memory, math.floor(whole_node_memory_limit_gib(pool) * share))
    return {"requests": {**gpu, "cpu": str(cpu), "memory": f"{memory}Gi", "ephemeral-storage": scratch},
            "limits": {**gpu, "memory": f"{limit}Gi", "ephemeral-storage": scratch}}


def default_scratch(whole_node_scratch: str, share: float) -> str:
    """`share` of what a whole-node job gets at /scratch (decisions/platform/jobset.default_scratch), in whole GiB, at
    least 1."""
    match = re.fullmatch(r"([0-9]+)Gi", whole_node_scratch)
    if not match:
        raise ValueError(f"a whole node's scratch {whole_node_scratch!r} is not in Gi")
    return f"{max(1, math.floor(int(match.group(1)) * share))}Gi"


def shm_size_gib(memory_limit_gib: int) -> int:
    """/dev/shm counts against the container's memory: at most half its limit, at most what a whole node's pod of
    the multi-node templates gets (mpijob.SHM_SIZE_GIB)."""
    return max(1, min(SHM_SIZE_GIB, memory_limit_gib // 2))


def single_node_job(pool, catalog, *, name: str, namespace: str, queue_name: str, image: str,
                    program: Sequence[str], scratch: str, mounts_lustre: bool, lustre_configured: bool,
                    gpus: Optional[int] = None, mig_profile: Optional[str] = None, checkpoint_uri: str = "",
                    env: Mapping[str, str] = (), volumes: Sequence[UserVolume] = (),
                    max_restarts: int = DEFAULT_MAX_RESTARTS) -> dict:
    """`program` on one node of `pool` (a decisions.config.stack.ResolvedPool) as a Job in `queue_name`. `scratch`:
    the /scratch emptyDir's size (a Kubernetes quantity; single_job.default_scratch scales a whole node's);
    `mounts_lustre`: mount the claim lustre-data at /data; `env`, `volumes`: the user's --env and --volume."""
    check_job(name, f"{NAME_MAX} characters", NAME_MAX, scratch, max_restarts, program,
              "the command and its arguments")
    gpu, share = gpu_request(pool, catalog, gpus, mig_profile)
    container_resources = resources(pool, gpu, share, scratch)
    limit_gib = int(container_resources["limits"]["memory"].removesuffix("Gi"))
    shm = ({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_size_gib(limit_gib)}Gi"}},
           {"name": "shm", "mountPath": SHM_PATH})
    pod_volumes, mounts = job_storage(
        scratch=scratch, mounts_lustre=mounts_lustre, lustre_configured=lustre_configured, user_volumes=volumes,
        shm=None if device_plugin_mounts_shm(pool) else shm)
    shared = pool.spec.gpu_sharing.mode in REPLICATED_MODES
    labels = {"app.kubernetes.io/name": name, POOL_LABEL: pool.name}
    container = {
        "name": CONTAINER, "image": image, "command": list(program),
        "env": env_list(job_env({}, checkpoint_uri, dict(env))),
        "resources": container_resources,
        # The job's image as its user, writable, nothing added (decisions/platform/pod_security.WAIVERS,
        # single-node-job).
        "securityContext": pod_security.container_security_context(None, read_only_root=False),
        "volumeMounts": mounts,
    }
    pod = {"restartPolicy": "Never", "serviceAccountName": JOB_SERVICE_ACCOUNT, "automountServiceAccountToken": False,
           "nodeSelector": node_selector(pool),
           "tolerations": tolerations(pool) + ([toleration(SHARED_GPU_TAINT)] if shared else []),
           "containers": [container], "volumes": pod_volumes}
    return {
        "apiVersion": API_VERSION, "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, QUEUE_LABEL: queue_name}},
        "spec": {"backoffLimit": max_restarts, "podFailurePolicy": copy.deepcopy(IGNORE_DISRUPTIONS),
                 "ttlSecondsAfterFinished": TRAINING_TTL_S,
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }

