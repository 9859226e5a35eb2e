"""How every pod gpu-cloud itself creates is hardened, in one place: the security contexts, the images (pinned by
digest in decisions/platform/images.yaml), the writable paths, and the rules with their written exceptions. Pure: no
Pulumi.

Pods gpu-cloud creates: Triton (components/serving/inference.py), the repair controller
(components/nodes/node_repair.py), Kueue's webhook probe Job (decisions/platform/kueue.py), the NCCL CronJobs and the
MPIJob they start (decisions/platform/acceptance.py), and the `python -m jobs` templates (decisions/platform/mpijob.py,
decisions/platform/jobset.py, decisions/platform/single_job.py). Third-party Helm charts and operator manifests pin and
harden their own pods (tests/test_pod_security.py lists them).

The rules (check_pod_spec), each held unless WAIVERS gives the workload's reason:
- `non-root`: runAsNonRoot, with a runAsUser of at least MIN_UID (a UID no image's own accounts use);
- `seccomp`: the RuntimeDefault seccomp profile;
- `capabilities`: drop ALL, add nothing (IPC_LOCK where EFA pins memory: decisions/platform/mpijob.py), no privilege
escalation;
- `read-only-root`: a read-only root filesystem, each writable path an emptyDir whose reason is beside it;
- `service-account-token`: automountServiceAccountToken false and no projected token, unless the pod calls the
  Kubernetes API (API_CALLERS). EKS Pod Identity does not need the token mount: its webhook adds its own projected
  token volume (eks-pod-identity-token) whatever automountServiceAccountToken says (aws/amazon-eks-pod-identity-webhook
  v0.6.17 pkg/handler/handler.go lines 347-362 build it from the container-credentials config, lines 385-400 add it
  unless a volume of that name exists);
- `resources`: a memory limit and a CPU request on every container, init containers and sidecars included;
- `image-digest`: the image by digest (`repository:tag@sha256:...`), or an image decisions/platform/images.yaml lists as
not yet
  pinned, with its reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import yaml

IMAGES_PATH = Path(__file__).with_name("images.yaml")
RULES = ("non-root", "seccomp", "capabilities", "read-only-root", "service-account-token", "resources",
         "image-digest")
# UIDs below this are the images' own accounts (Debian and Amazon Linux give users 1000 and up); a pod's UID at or
# above it owns nothing in the image, so a container escape lands on a user with no files.
MIN_UID = 10000
NOBODY = 65534                   # the overflow user: no home, no files, in every base image's /etc/passwd
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
EFA_CAPABILITIES = ("IPC_LOCK",)  # EFA registers (pins) every buffer it sends from: decisions/platform/mpijob.py
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


# --- images ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Image:
    name: str
    repository: str
    tag: str
    digest: Optional[str]            # sha256:<64 hex>, or None: not yet pinned (reason)
    refresh: str                     # the command that prints the digest to record
    reason: str = ""

    @property
    def ref(self) -> str:
        """What a pod spec names: repository:tag@digest (the tag for readers), or repository:tag until pinned."""
        return f"{self.repository}:{self.tag}" + (f"@{self.digest}" if self.digest else "")


@lru_cache(maxsize=1)
def load_images() -> Dict[str, Image]:
    raw = yaml.safe_load(IMAGES_PATH.read_text(encoding="utf-8"))["images"]
    images = {}
    for name, entry in raw.items():
        digest = entry.get("digest")
        if digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise ValueError(f"decisions/platform/images.yaml {name}: digest {digest!r} is not sha256:<64 hex>")
        if digest is None and not entry.get("reason"):
            raise ValueError(f"decisions/platform/images.yaml {name}: no digest and no reason why not")
        if digest is not None and not entry.get("source"):
            raise ValueError(f"decisions/platform/images.yaml {name}: a digest needs the source it was copied from")
        reference = f"{entry['repository']}:{entry['tag']}"
        if not str(entry.get("refresh", "")).endswith(f" {reference}"):
            raise ValueError(f"decisions/platform/images.yaml {name}: refresh must be the command that prints the "
                             f"digest of {reference}, ending with it")
        images[name] = Image(name, entry["repository"], str(entry["tag"]), digest, entry["refresh"],
                             entry.get("reason", ""))
    return images


def image(name: str) -> str:
    """The pod-spec reference of image `name` (decisions/platform/images.yaml)."""
    return load_images()[name].ref


def unpinned() -> Dict[str, str]:
    """Images not pinned by digest yet: their reference -> the reason."""
    return {i.ref: i.reason for i in load_images().values() if i.digest is None}


# --- security contexts -----------------------------------------------------------------------------------------------
def pod_security_context(uid: int = NOBODY) -> Dict[str, Any]:
    """The pod-level context of a non-root pod: its user and group, and the RuntimeDefault seccomp profile."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "seccompProfile": dict(RUNTIME_DEFAULT)}


def container_security_context(uid: Optional[int] = NOBODY, *, read_only_root: bool = True,
                               add: Sequence[str] = ()) -> Dict[str, Any]:
    """A container's context: every capability dropped but `add`, no privilege escalation, RuntimeDefault seccomp,
    a read-only root unless told otherwise; `uid` None runs as the image's user (root: see WAIVERS)."""
    context: Dict[str, Any] = {}
    if uid is not None:
        context.update(runAsNonRoot=True, runAsUser=uid, runAsGroup=uid)
    context.update(readOnlyRootFilesystem=read_only_root, allowPrivilegeEscalation=False,
                   capabilities={"drop": ["ALL"], **({"add": list(add)} if add else {})},
                   seccompProfile=dict(RUNTIME_DEFAULT))
    return context


# Writable paths, each an emptyDir. /tmp: where the programs here put temporary files (Open MPI's session directory,
# TMPDIR's default; the AWS CLI's HOME, see decisions/serving/triton.sync_env; Triton's Python backend stubs and PyTorch
# caches).
TMP_VOLUME_NAME = "tmp"
TMP_MOUNT = {"name": TMP_VOLUME_NAME, "mountPath": "/tmp"}


def tmp_volume(size: str = "1Gi") -> Dict[str, Any]:
    """A /tmp emptyDir bounded at `size` (a runaway writer is evicted, not the node's disk filled)."""
    return {"name": TMP_VOLUME_NAME, "emptyDir": {"sizeLimit": size}}


# --- the rules and their exceptions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Waiver:
    reason: str
    capabilities: Tuple[str, ...] = ()     # for the `capabilities` rule: what may be added back


_MPI_ROOT = ("mpi-operator v0.8.0 mounts the job's SSH keys at sshAuthMountPath, /root/.ssh by default "
             "(pkg/apis/kubeflow/v2beta1/default.go lines 65-66), and the workers run sshd, which as root reads its "
             "host keys and separates privileges; a non-root MPI job needs an image built with its own user and sshd "
             "configuration (the operator's examples/v2beta1/pi/pi-intel.yaml: runAsUser 1000, "
             "sshAuthMountPath /home/mpiuser/.ssh, sshd -f ~/.sshd_config). The nccl-tests image has no such user "
             "(aws-samples/awsome-distributed-training v1.2.0 micro-benchmarks/nccl-tests/nccl-tests.Dockerfile sets "
             "no USER)")
SSHD_CAPABILITIES = ("SETUID", "SETGID", "SYS_CHROOT", "NET_BIND_SERVICE", "AUDIT_WRITE")
_SSHD_CAPS_REASON = ("sshd as root: SETUID, SETGID and SYS_CHROOT for its privilege-separated child, "
                     "NET_BIND_SERVICE for port 22, AUDIT_WRITE for the login record; IPC_LOCK for EFA")
_SSHD_WRITES = ("sshd writes its pid file under /run and login records under /var/log in the image; a read-only "
                "root is not tested with the images these jobs run")
_USER_IMAGE = ("the job's own image, named on `python -m jobs` (--image): its user and what it writes are the "
               "image's; a training image commonly runs as root and writes caches under $HOME and /tmp")
_USER_IMAGE_PIN = "the job's own image, named on `python -m jobs` (--image): pinning it is the job author's"

# workload -> container ("*" for every container) -> rule -> Waiver
WAIVERS: Mapping[str, Mapping[str, Mapping[str, Waiver]]] = {
    "nccl-efa-launcher": {"launcher": {"non-root": Waiver(_MPI_ROOT)}},
    "nccl-efa-worker": {"worker": {
        "non-root": Waiver(_MPI_ROOT),
        "capabilities": Waiver(_SSHD_CAPS_REASON, capabilities=(*EFA_CAPABILITIES, *SSHD_CAPABILITIES)),
        "read-only-root": Waiver(_SSHD_WRITES)}},
    "training-mpijob-launcher": {"launcher": {
        "non-root": Waiver(_MPI_ROOT), "read-only-root": Waiver(_USER_IMAGE), "image-digest": Waiver(_USER_IMAGE_PIN)}},
    "training-mpijob-worker": {"worker": {
        "non-root": Waiver(_MPI_ROOT),
        "capabilities": Waiver(_SSHD_CAPS_REASON, capabilities=(*EFA_CAPABILITIES, *SSHD_CAPABILITIES)),
        "read-only-root": Waiver(_SSHD_WRITES + "; " + _USER_IMAGE), "image-digest": Waiver(_USER_IMAGE_PIN)}},
    "pytorch-jobset": {"trainer": {
        "non-root": Waiver(_USER_IMAGE), "read-only-root": Waiver(_USER_IMAGE),
        "capabilities": Waiver("IPC_LOCK: EFA pins the buffers it registers (decisions/platform/mpijob.py)",
                               capabilities=EFA_CAPABILITIES),
        "image-digest": Waiver(_USER_IMAGE_PIN)}},
    "single-node-job": {"job": {
        "non-root": Waiver(_USER_IMAGE), "read-only-root": Waiver(_USER_IMAGE),
        "image-digest": Waiver(_USER_IMAGE_PIN)}},
}
# Pods that call the Kubernetes API, so keep a service-account token: workload -> why.
API_CALLERS: Mapping[str, str] = {
    "node-repair": "cordons and evicts nodes' pods, posts Events, keeps its state in a ConfigMap "
                   "(decisions/nodes/repair.py)",
    "kueue-webhook-probe": "dry-run creates a ResourceFlavor through the API server (jobs/kueue_webhook_probe.py)",
    "nccl-efa-start": "lists the pool's MPIJobs and creates the next run (jobs/nccl_submit.py)",
    "nccl-nvlink": "the judge container alone posts its verdict as an Event, through a token only it mounts "
                   "(decisions/platform/acceptance.py _judge_volumes); the pod mounts none",
    "nccl-efa-launcher": "the judge container alone posts its verdict as an Event, through a token only it mounts",
}


WaiverTable = Mapping[str, Mapping[str, Mapping[str, Waiver]]]


def _waiver(workload: str, container: str, rule: str, waivers: Optional[WaiverTable] = None) -> Optional[Waiver]:
    by_container = (WAIVERS if waivers is None else waivers).get(workload, {})
    return by_container.get(container, {}).get(rule) or by_container.get("*", {}).get(rule)


def _effective(pod: Mapping[str, Any], container: Mapping[str, Any], key: str) -> Any:
    own = (container.get("securityContext") or {}).get(key)
    return own if own is not None else (pod.get("securityContext") or {}).get(key)


def containers_of(pod: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def check_pod_spec(workload: str, pod: Mapping[str, Any], waivers: Optional[WaiverTable] = None) -> List[str]:
    """Every rule `pod` (a pod spec as the API takes it, camelCase) breaks without a waiver, as 'rule: what'.
    `waivers`: the waivers to apply, WAIVERS unless given."""
    found: List[str] = []

    def waiver(container: str, rule: str) -> Optional[Waiver]:
        return _waiver(workload, container, rule, waivers)

    def broken(rule: str, container: str, what: str) -> None:
        if waiver(container, rule) is None:
            found.append(f"{rule}: {workload}/{container}: {what}")

    projected_token = any(source.get("serviceAccountToken") for volume in pod.get("volumes") or []
                          for source in (volume.get("projected") or {}).get("sources") or [])
    if workload not in API_CALLERS and (pod.get("automountServiceAccountToken") is not False or projected_token):
        found.append(f"service-account-token: {workload}: the pod calls no API yet gets a token")
    for container in containers_of(pod):
        name, context = container["name"], container.get("securityContext") or {}
        uid = _effective(pod, container, "runAsUser")
        if (_effective(pod, container, "runAsNonRoot") is not True or isinstance(uid, bool)
                or not isinstance(uid, (int, float)) or uid < MIN_UID):
            broken("non-root", name, f"runAsNonRoot {_effective(pod, container, 'runAsNonRoot')}, runAsUser {uid}")
        if (_effective(pod, container, "seccompProfile") or {}).get("type") != "RuntimeDefault":
            broken("seccomp", name, "no RuntimeDefault seccomp profile")
        # A waiver names capabilities that may be added back; ALL is dropped and escalation off for every container.
        capabilities = context.get("capabilities") or {}
        allowed = set(getattr(waiver(name, "capabilities"), "capabilities", ()))
        extra = sorted(set(capabilities.get("add") or ()) - allowed)
        escalates = context.get("allowPrivilegeEscalation") is not False
        if "ALL" not in (capabilities.get("drop") or ()) or extra or escalates:
            found.append(f"capabilities: {workload}/{name}: drop {capabilities.get('drop')}, add "
                         f"{capabilities.get('add')} (allowed {sorted(allowed)}), allowPrivilegeEscalation "
                         f"{context.get('allowPrivilegeEscalation')}")
        if context.get("readOnlyRootFilesystem") is not True:
            broken("read-only-root", name, "writable root filesystem")
        resources = container.get("resources") or {}
        if not (resources.get("limits") or {}).get("memory") or not (resources.get("requests") or {}).get("cpu"):
            broken("resources", name, f"no memory limit or CPU request: {resources}")
        ref = str(container.get("image", ""))
        if not _DIGEST.search(ref) and ref not in unpinned():
            broken("image-digest", name,
                   f"image {ref!r} is not pinned by digest nor listed in decisions/platform/images.yaml")
    return found


def waivers_in_use(workload: str, pod: Mapping[str, Any]) -> Iterable[Tuple[str, str, str]]:
    """(workload, container, rule) of each waiver `pod` needs: without that one waiver, check_pod_spec reports a
    problem of its rule for its container (for any container, if the waiver's container is "*") that it does not
    report with every waiver. A waiver whose container merely exists is not thereby used."""
    declared = WAIVERS.get(workload, {})
    with_all = set(check_pod_spec(workload, pod))
    for container, rules in declared.items():
        for rule in rules:
            fewer = {name: {r: w for r, w in by_rule.items() if (name, r) != (container, rule)}
                     for name, by_rule in declared.items()}
            new = set(check_pod_spec(workload, pod, {**WAIVERS, workload: fewer})) - with_all
            prefix = f"{rule}: {workload}/" + ("" if container == "*" else f"{container}:")
            if any(problem.startswith(prefix) for problem in new):
                yield workload, container, rule
