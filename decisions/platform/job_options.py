"""What every `python -m jobs` job template (`job`, `mpijob`, `pytorch-job`) mounts and sets by default, and what a
user adds with `--env` and `--volume`. Pure: no Pulumi.

Mounted by default, in the container that runs the program:
- `/data`: the claim `lustre-data` (FSx for Lustre, the stack's datasets: docs/storage.md), where the stack has
  `storage.lustre` and the pool's nodes mount it (decisions.storage.lustre.mounts_lustre: every pool the training queue
  uses); and beside it `/nccl-traces`, a directory of the same file system outside the link to the datasets bucket,
  where pytorch-job's flight recorder writes (TRACES_PATH);
- `/scratch`: an emptyDir on the node's NVMe RAID0 (the root volume where the pool has none), its size also the
  container's ephemeral-storage request and limit (decisions/nodes/scratch.py); checkpoints go first to CHECKPOINT_DIR
  under it;
- `/dev/shm`: memory-backed, for NCCL's shared-memory transport and data-loader workers (decisions/platform/mpijob.py);
  on MPS pools none of the template's own: the device plugin mounts the MPS server's shared memory there
  (decisions/platform/gpu_operator.device_plugin_mounts_shm), the node's one tmpfs that every MPS pod shares.

Checkpoints, one story for every template and the docs (docs/training.md, docs/storage.md): write them to
CHECKPOINT_DIR (`/scratch/checkpoints`: fast, lost with the pod), copy them to CHECKPOINT_URI (`--checkpoint-uri`,
`s3://<the stack's checkpoints bucket>/<job name>`: kept, replicated to a DR peer) and resume from there.

`--env KEY=VALUE`: KEY a POSIX environment variable name (letters, digits and `_`, not starting with a digit:
POSIX.1-2017 Base Definitions, 8.1 "Environment Variable Definition"), the only kind the MPI template can hand to its
ranks: they start through sshd with none of the container's environment, and `mpirun -x KEY` forwards each by
name. A KEY the template also sets replaces the template's value (NCCL_DEBUG=WARN quiets NCCL's log), except those
the template derives from its own options (RESERVED_ENV; for pytorch-job also PYTORCH_JOB_ENV_PREFIXES), which are
refused with the option to use instead.

`--volume CLAIM:/path[:ro]`: a PersistentVolumeClaim of the training namespace (where the jobs run), mounted at
/path, read-only with `:ro`.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.capacity_blocks import MAX_RUN_TIME_LABEL, MAX_RUN_TIME_S
from decisions.nodes.scratch import SCRATCH_MOUNT_PATH, scratch_mount, scratch_volume
from decisions.storage import lustre

CHECKPOINT_DIR_ENV, CHECKPOINT_URI_ENV = "CHECKPOINT_DIR", "CHECKPOINT_URI"
CHECKPOINT_DIR = f"{SCRATCH_MOUNT_PATH}/checkpoints"
DATA_VOLUME = "data"
SHM_PATH = "/dev/shm"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names every template sets from its own options: KEY -> what to use instead.
RESERVED_ENV: Mapping[str, str] = {CHECKPOINT_URI_ENV: "--checkpoint-uri"}
# Prefixes pytorch-job alone sets, refused only there (parse_env's reserved_prefixes): PET_* are torchrun's options,
# which it derives from --nodes, the pool and the job's name (decisions/platform/jobset.torchrun_env), and the JobSet's
# restart attempt names the flight recorder's folder (decisions/platform/jobset.trace_file_prefix). Nothing reads them
# in `job` or `mpijob`, which run no torchrun of theirs.
PYTORCH_JOB_ENV_PREFIXES: Mapping[str, str] = {
    "PET_": "pytorch-job's own options (--nodes; torchrun's PET_ settings)",
    "JOBSET_RESTART_ATTEMPT": "pytorch-job from the JobSet's restart count (it names the flight recorder's folder)"}
# A PersistentVolumeClaim's name: a DNS-1123 subdomain (Kubernetes, "Object Names and IDs").
CLAIM_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CLAIM_NAME_MAX = 253
USER_VOLUME_PREFIX = "volume-"


# A job's name is a DNS-1035 label; a size is a Kubernetes quantity (a plain number, or with a binary or decimal
# suffix).
JOB_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63          # a DNS label's length; each template's pod names, built from the job's name, are ones
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?")


def check_job(name: str, name_max: str, max_name_length: int, scratch: str, max_restarts: int,
              program: Sequence[str], program_hint: str) -> None:
    """What every job template refuses, with the fix: a name that is no DNS-1035 label of at most
    `max_name_length` characters (`name_max` says why that many), a scratch size that is no quantity, a negative
    restart count, no program (`program_hint`: what to give after --)."""
    if not JOB_NAME.fullmatch(name) or len(name) > max_name_length:
        too_long = " is too long" if JOB_NAME.fullmatch(name) else ""
        raise ValueError(f"job name {name!r}{too_long}: a DNS-1035 label (lower-case letters, digits, '-', starting "
                         f"with a letter) of at most {name_max}")
    if not QUANTITY.fullmatch(scratch):
        raise ValueError(f"scratch size {scratch!r} is not a Kubernetes quantity (such as 2Ti or 500Gi)")
    if max_restarts < 0:
        raise ValueError(f"max restarts {max_restarts}: must be 0 or more")
    if not program:
        raise ValueError(f"no program: give {program_hint} after --")


def parse_env(items: Sequence[str], reserved_prefixes: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """`--env KEY=VALUE` options as {KEY: VALUE}, in order; a ValueError naming the option for a bad one.
    `reserved_prefixes`: name prefixes the template sets itself (prefix -> what sets them), refused too."""
    env: Dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"--env {item!r}: give KEY=VALUE (an empty value is KEY=)")
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"--env {item!r}: {key!r} is not an environment variable name (letters, digits and _, "
                             "not starting with a digit)")
        if key in RESERVED_ENV:
            raise ValueError(f"--env {item!r}: the template sets {key} itself; use {RESERVED_ENV[key]}")
        for prefix, instead in (reserved_prefixes or {}).items():
            if key.startswith(prefix):
                raise ValueError(f"--env {item!r}: {prefix}* variables are set by {instead}")
        if key in env:
            raise ValueError(f"--env {item!r}: {key} is given twice")
        env[key] = value
    return env


@dataclass(frozen=True)
class UserVolume:
    claim: str
    path: str
    read_only: bool = False


def parse_volume(item: str) -> UserVolume:
    """`--volume CLAIM:/path[:ro]` as a UserVolume; a ValueError naming the option for a bad one."""
    parts = item.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"--volume {item!r}: give CLAIM:/path, or CLAIM:/path:ro for read-only")
    claim, path = parts[0], parts[1]
    if not CLAIM_NAME.fullmatch(claim) or len(claim) > CLAIM_NAME_MAX:
        raise ValueError(f"--volume {item!r}: {claim!r} is not a PersistentVolumeClaim name (lower-case letters, "
                         "digits, '-' and '.', starting and ending with a letter or digit)")
    if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
        raise ValueError(f"--volume {item!r}: the mount path {path!r} must be an absolute, normalised path below /")
    return UserVolume(claim, path, len(parts) == 3 and parts[2] == "ro")


def parse_volumes(items: Sequence[str]) -> Tuple[UserVolume, ...]:
    return tuple(parse_volume(item) for item in items)


def job_env(env: Mapping[str, str], checkpoint_uri: str, user_env: Mapping[str, str]) -> Dict[str, str]:
    """The template's `env`, the checkpoint locations, then the user's --env (which replaces a template default of
    the same name)."""
    return {**env, CHECKPOINT_DIR_ENV: CHECKPOINT_DIR,
            **({CHECKPOINT_URI_ENV: checkpoint_uri} if checkpoint_uri else {}), **user_env}


def job_storage(*, scratch: str, mounts_lustre: bool, lustre_configured: bool, user_volumes: Sequence[UserVolume],
                shm: Optional[Tuple[Mapping[str, Any], Mapping[str, Any]]]) -> Tuple[List[dict], List[dict]]:
    """(pod volumes, container volumeMounts): /dev/shm (`shm`: its volume and mount; None where the device plugin
    mounts the MPS server's there: decisions/platform/gpu_operator.device_plugin_mounts_shm), /scratch (an emptyDir of
    `scratch`), /data and TRACES_PATH where the pool mounts Lustre, then each --volume. Refuses a --volume on a path
    already mounted (the MPS shared memory included), and the claim lustre-data on a stack without Lustre
    (`lustre_configured`)."""
    volumes: List[dict] = [*([dict(shm[0])] if shm else []), scratch_volume(scratch)]
    mounts: List[dict] = [*([dict(shm[1])] if shm else []), scratch_mount()]
    if mounts_lustre:
        volumes.append({"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": lustre.PVC_NAME}})
        mounts.append({"name": DATA_VOLUME, "mountPath": lustre.FILE_SYSTEM_PATH, "subPath": lustre.MOUNT_SUBPATH})
        mounts.append({"name": DATA_VOLUME, "mountPath": TRACES_PATH, "subPath": TRACES_SUBPATH})
    for i, volume in enumerate(user_volumes, start=1):
        taken = {mount["mountPath"]: mount["name"] for mount in mounts}
        flag = f"--volume {volume.claim}:{volume.path}"
        if volume.path in taken:
            already = describe_mount(volumes, mounts, volume.path)
            raise ValueError(f"{flag}: {volume.path} is already mounted ({already})")
        if volume.path == SHM_PATH and not shm:
            raise ValueError(f"{flag}: {SHM_PATH} is the MPS server's shared memory on this pool, which the device "
                             "plugin mounts")
        if volume.claim == lustre.PVC_NAME and not lustre_configured:
            raise ValueError(f"{flag}: the stack has no storage.lustre, so there is no claim {lustre.PVC_NAME}")
        name = f"{USER_VOLUME_PREFIX}{i}"
        claim: Dict[str, Any] = {"claimName": volume.claim, **({"readOnly": True} if volume.read_only else {})}
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        # The Lustre claim, wherever it is mounted, shows the linked directory (decisions/storage/lustre.py
        # MOUNT_SUBPATH), as /data does.
        mounts.append({"name": name, "mountPath": volume.path, **({"readOnly": True} if volume.read_only else {}),
                       **({"subPath": lustre.MOUNT_SUBPATH} if volume.claim == lustre.PVC_NAME else {})})
    return volumes, mounts


def describe_mount(volumes: Sequence[Mapping[str, Any]], mounts: Sequence[Mapping[str, Any]], path: str) -> str:
    """What is mounted at `path`, in words: 'claim lustre-data', 'emptyDir 100Gi', 'emptyDir 16Gi in memory'."""
    (mount,) = [m for m in mounts if m["mountPath"] == path]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    read_only = ", read-only" if mount.get("readOnly") else ""
    if "persistentVolumeClaim" in volume:
        return f"claim {volume['persistentVolumeClaim']['claimName']}{read_only}"
    empty_dir = volume.get("emptyDir") or {}
    memory = " in memory" if empty_dir.get("medium") == "Memory" else ""
    return f"emptyDir {empty_dir.get('sizeLimit', 'unbounded')}{memory}{read_only}"


# pytorch-job's flight-recorder dumps on a stack with Lustre: a directory of the file system beside the one linked to
# the datasets bucket (lustre.MOUNT_SUBPATH), so kept but never exported (decisions/platform/jobset.py says why).
# Every template mounts it, so a `job` can read them (docs/training.md).
TRACES_PATH = "/nccl-traces"
TRACES_SUBPATH = TRACES_PATH.lstrip("/")

WHAT = {SHM_PATH: "shared memory", SCRATCH_MOUNT_PATH: "node-local, lost with the pod",
        lustre.FILE_SYSTEM_PATH: "FSx for Lustre, the stack's datasets",
        TRACES_PATH: "FSx for Lustre outside the datasets link: kept, not exported"}


def mounts_comment(what: str, pod: Mapping[str, Any], container: Mapping[str, Any],
                   env: Optional[Mapping[str, str]] = None) -> str:
    """YAML comment lines that open a rendered template: what it is and what its program finds mounted."""
    volumes, mounts = pod.get("volumes") or [], container.get("volumeMounts") or []
    width = max(len(path) for path in [SHM_PATH, *(m["mountPath"] for m in mounts)])
    lines = [f"# {what}", "# mounted in the container that runs the program:"]
    for mount in mounts:
        path = mount["mountPath"]
        note = f" ({WHAT[path]})" if path in WHAT and not mount["name"].startswith(USER_VOLUME_PREFIX) else ""
        lines.append(f"#   {path.ljust(width)}  {describe_mount(volumes, mounts, path)}{note}")
    if SHM_PATH not in {mount["mountPath"] for mount in mounts}:     # job_storage leaves it to the device plugin
        lines.append(f"#   {SHM_PATH.ljust(width)}  the MPS server's shared memory, mounted by the device plugin "
                     "(one tmpfs for every MPS pod of the node)")
    values = dict(env or {})
    if CHECKPOINT_DIR_ENV in values:
        lines.append(f"# checkpoints: {CHECKPOINT_DIR_ENV}={values[CHECKPOINT_DIR_ENV]}, "
                     f"{CHECKPOINT_URI_ENV}={values.get(CHECKPOINT_URI_ENV) or '(none: --checkpoint-uri)'}")
    return "\n".join(lines) + "\n"


# --max-run-time: the longest the job may run once admitted, declared on the job as Kueue's MAX_RUN_TIME_LABEL. Kueue
# stops the job when its admitted time reaches it, and a capacity block admits it only if it ends before the block
# closes (decisions/nodes/capacity_blocks.py). Days, hours, minutes and seconds in that order ("1d12h", "90m"), or
# plain seconds.
DURATION = re.compile(r"(?:(?P<d>[0-9]+)d)?(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?")
DURATION_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def max_run_time_seconds(text: str) -> int:
    """`--max-run-time` in seconds; a ValueError naming the option for anything else, or outside what Kueue takes."""
    found = DURATION.fullmatch(text)
    if text.isdigit():
        seconds = int(text)
    elif found and text:
        seconds = sum(int(found[unit]) * factor for unit, factor in DURATION_SECONDS.items() if found[unit])
    else:
        seconds = 0
    if not 0 < seconds <= MAX_RUN_TIME_S:
        raise ValueError(f"--max-run-time {text!r}: give a duration from 1s to {MAX_RUN_TIME_S}s, such as 90m, 6h, "
                         "1d12h or plain seconds")
    return seconds


def declare_max_run_time(manifest: Mapping[str, Any], text: Optional[str]) -> Dict[str, Any]:
    """The rendered job with its maximum run time (`--max-run-time`, None: the job as it is) on its labels."""
    if text is None:
        return dict(manifest)
    metadata = manifest["metadata"]
    return {**manifest, "metadata": {**metadata, "labels": {**(metadata.get("labels") or {}),
                                                            MAX_RUN_TIME_LABEL: str(max_run_time_seconds(text))}}}
