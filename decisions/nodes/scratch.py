"""NVMe scratch: how pods use the RAID0 instance store, and which pools meet the hot tier's IOPS.

With `storage.nvmeScratch` on, every pool whose type has instance store boots with nodeadm
`spec.instance.localStorage.strategy: RAID0` (userdata/render.py). What nodeadm then does, read in
awslabs/amazon-eks-ami at tag v20260714 (the AMI release gpu-cloud pins):

- nodeadm/cmd/nodeadm/init/init.go:142-153: the `local-disk` aspect runs in the run phase, before the daemons
  (containerd, kubelet) are started. nodeadm/internal/system/local_disk.go:22-50 calls
  `setup-local-disks raid0`, adding `--dir <mountPath>` only when `mountPath` is set and one `--no-bind-*` flag
  per `disabledMounts` entry.
- templates/al2023/runtime/bin/setup-local-disks (the script on the AMI):
  - :289 finds the disks as /dev/disk/by-id/*NVMe_Instance_Storage_*; :291-294 exits 0 when there are none
    (a type without instance store boots normally);
  - :40-93 (`maybe_raid`) builds md array /dev/md/kubernetes (RAID0, no resync), formats it XFS (:72,
    `mkfs.xfs -K`) and mounts it at `${MNT_DIR}/0` (:45) with `defaults,noatime` (:88) through a systemd mount
    unit; MNT_DIR defaults to /mnt/k8s-disks (:220), so the array is at **/mnt/k8s-disks/0**;
  - :95-110 and :133-156 copy, then bind-mount onto the array: /var/lib/kubelet -> /mnt/k8s-disks/0/kubelet,
    /var/lib/containerd -> .../containerd, /var/lib/soci-snapshotter-grpc -> .../soci-snapshotter-grpc and
    /var/log/pods -> .../pods. All four are on by default (:221-224).
- nodeadm/api/v1alpha1/nodeconfig_types.go:115-156: `LocalStorageOptions` has `strategy` (RAID0 | RAID10 | Mount),
  `mountPath` (default /mnt/k8s-disks/; there is no `mountPoint`) and `disabledMounts`, whose enum is only
  Containerd, PodLogs and SOCI. There is no value for the kubelet: the script's `--no-bind-kubelet` is never
  passed by nodeadm, so under RAID0 /var/lib/kubelet is **always** on the array.

So every emptyDir without `medium: Memory` (/var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>),
every container's writable layer and the images (/var/lib/containerd) and the pod logs live on the RAID0.
`medium: Memory` emptyDirs (/dev/shm in decisions/platform/mpijob.py) are tmpfs, in RAM, not on it.

**Decision: a job uses scratch through an ordinary `emptyDir` volume** (this module's `scratch_volume`, mounted at
`SCRATCH_MOUNT_PATH`), with a `sizeLimit` and a matching `ephemeral-storage` request and limit on the container.
No hostPath, no local storage class: the emptyDir already is on the NVMe array, and the kubelet accounts for it
(a pod past its sizeLimit or its ephemeral-storage limit is evicted; the scheduler places pods by their requests),
cleans it up when the pod goes, and keeps one pod's scratch away from another's. A hostPath on /mnt/k8s-disks/0
would bypass all of that (no accounting, no cleanup, shared between pods, and refused by restricted Pod Security);
a local-volume storage class would need disks or directories that the kubelet does not already use, so its PVs
would count the same bytes twice, and its node-bound PVs pin pods to nodes that spot and the autoscaler remove.

**The node's ephemeral-storage.** The kubelet reports as `ephemeral-storage` capacity the filesystem holding
/var/lib/kubelet, so with RAID0 that is the array (disks x size, less XFS metadata), not the root EBS volume; the
images share it (containerd is on the same array). nodeadm's kubelet defaults (nodeadm/internal/kubelet/config.go
:110-114 `evictionHard` nodefs.available 10%, :283-287 kubeReserved ephemeral-storage 1Gi) make allocatable about
capacity x 0.9 - 1 GiB (`allocatable_ephemeral_storage_gib`). Without RAID0 (nvmeScratch off, or no instance store)
emptyDir is on the root EBS volume (`ROOT_VOLUME_GIB`, the launch template's). On a type without instance store in a
pool whose first type has some, the script finds no disks and the node keeps the root volume too
(`pool_allocatable_ephemeral_storage_gib` takes the least over a pool's types). Both sizes are the volumes' and
disks', not their filesystems': the XFS log and the array's superblocks take a fraction of a percent more, which no
figure here subtracts.

Everything on the array is lost when the instance stops or terminates (spot reclaim, scale-in, refresh): stage
inputs from S3 and copy checkpoints to S3 before the grace period ends (README, the workload contract).

**The hot tier.** The design target is more than 500K random read IOPS (`HOT_TIER_READ_IOPS`) at 100 µs. IOPS per type
are AWS's published aggregate for all of a type's volumes (decisions/catalog/catalog.yaml), which a RAID0 over all of
them is what can reach; a pool meets the tier when its pods get that array (RAID0 on) and the figure is more than
500,000. FSx for Lustre does not meet the latency: AWS states it as sub-millisecond (`LUSTRE_LATENCY_SOURCE`), not
100 µs. AWS publishes no latency for instance store either, so the 100 µs figure is unverified on every tier.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from decisions.catalog.catalog import Catalog, InstanceType

HOT_TIER_READ_IOPS = 500_000          # the hot tier's design target: MORE than this many random read IOPS (4 KiB)
HOT_TIER_LATENCY_TARGET_US = 100      # the hot tier's design latency target, in microseconds
LUSTRE_LATENCY = "sub-millisecond"
LUSTRE_LATENCY_SOURCE = ('Amazon FSx for Lustre User Guide, "What is Amazon FSx for Lustre?" '
                         '(https://docs.aws.amazon.com/fsx/latest/LustreGuide/what-is.html): "It provides sub-millisecond '
                         'latencies, up to multiple TBps of throughput and up to millions of IOPS"; the SSD storage class '
                         '"provides consistent sub-millisecond latency access to your full dataset"')
LUSTRE_LATENCY_NOTE = (f"FSx for Lustre latency is {LUSTRE_LATENCY} (AWS), not the hot tier's design target of "
                       f"{HOT_TIER_LATENCY_TARGET_US} µs; "
                       "AWS publishes no instance-store latency, so 100 µs is unverified on any tier")

# Every GPU node's root EBS volume (components/nodes/nodepool.py launch template): GPU container images (CUDA, NCCL,
# a framework) run to tens of GB each, and without RAID0 the pods' emptyDirs are on it too.
ROOT_VOLUME_GIB = 500
RAID0_MOUNT_PATH = "/mnt/k8s-disks/0"     # setup-local-disks: ${MNT_DIR}/0, MNT_DIR=/mnt/k8s-disks
RAID0_BIND_MOUNTS = ("/var/lib/kubelet", "/var/lib/containerd", "/var/lib/soci-snapshotter-grpc", "/var/log/pods")
SCRATCH_VOLUME_NAME = "scratch"
SCRATCH_MOUNT_PATH = "/scratch"           # where gpu-cloud's documentation and templates mount the scratch emptyDir
EVICTION_NODEFS_AVAILABLE_PCT = 10        # nodeadm kubelet default evictionHard nodefs.available: 10%
KUBE_RESERVED_EPHEMERAL_GIB = 1           # nodeadm kubelet default kubeReserved ephemeral-storage

POD_ACCESS_RAID0 = (f"emptyDir at {SCRATCH_MOUNT_PATH} (sizeLimit + ephemeral-storage request/limit); "
                    f"RAID0 at {RAID0_MOUNT_PATH} holds /var/lib/kubelet")
POD_ACCESS_OFF = "none: storage.nvmeScratch is off (emptyDir is on the root EBS volume)"
POD_ACCESS_NO_DISKS = "none: no instance store (emptyDir is on the root EBS volume)"


def raid0_instance_store(instance_type: InstanceType, nvme_scratch: bool) -> bool:
    """Whether nodes of this (primary) type boot with nodeadm's RAID0: the rule components/nodes/nodepool.py applies."""
    return nvme_scratch and instance_type.instance_store.disks > 0


def node_ephemeral_storage_gib(instance_type: InstanceType) -> int:
    """The RAID0 array's size in GiB (whole), which the kubelet reports as ephemeral-storage capacity. AWS sizes
    disks in GB (10^9 bytes); XFS metadata makes the filesystem slightly smaller still."""
    return instance_type.instance_store.total_gb * 10**9 // 2**30


def allocatable_ephemeral_storage_gib(capacity_gib: int) -> int:
    """Allocatable ephemeral-storage under nodeadm's kubelet defaults: capacity less the 10% hard-eviction
    threshold and the 1 GiB kube-reserved."""
    return capacity_gib * (100 - EVICTION_NODEFS_AVAILABLE_PCT) // 100 - KUBE_RESERVED_EPHEMERAL_GIB


def pool_allocatable_ephemeral_storage_gib(pool, nvme_scratch: bool) -> int:
    """What every node of `pool` (a decisions.config.stack.ResolvedPool) offers pods as allocatable
    ephemeral-storage, in GiB: the RAID0 array on a type with instance store when its first type boots with RAID0
    (the user-data's rule), else the root volume; the least over its types."""
    raid0 = raid0_instance_store(pool.primary_type, nvme_scratch)
    return min(allocatable_ephemeral_storage_gib(node_ephemeral_storage_gib(itype)
                                                 if raid0 and itype.instance_store.disks else ROOT_VOLUME_GIB)
               for itype in pool.types)


def meets_hot_tier(read_iops: Optional[int]) -> Optional[bool]:
    """True above HOT_TIER_READ_IOPS (the design target says "more than"), None when the figure is unknown."""
    return None if read_iops is None else read_iops > HOT_TIER_READ_IOPS


def scratch_volume(size_limit: str, name: str = SCRATCH_VOLUME_NAME) -> Dict[str, Any]:
    """The pod volume a job stages data and writes local checkpoints to (on the RAID0 where the pool has it).
    Give the container an `ephemeral-storage` request and limit of at least `size_limit`."""
    if not size_limit:
        raise ValueError("a scratch emptyDir needs a sizeLimit (a Kubernetes quantity such as 2Ti)")
    return {"name": name, "emptyDir": {"sizeLimit": size_limit}}


def scratch_mount(name: str = SCRATCH_VOLUME_NAME) -> Dict[str, Any]:
    return {"name": name, "mountPath": SCRATCH_MOUNT_PATH}


def _lowest(values: Iterable[Optional[int]]) -> Optional[int]:
    values = list(values)
    return None if any(v is None for v in values) else min(values)


def scratch_rows(pools: Iterable[Any], catalog: Catalog, nvme_scratch: bool) -> List[Dict[str, Any]]:
    """One row per pool (pool: decisions.config.stack.ResolvedPool, or anything with .spec.name and
    .spec.instance_types).

    A pool of several types shows what every node is sure to get: the type with the least instance store for
    disks and size, and the lowest IOPS (None when any type's figure is unknown). RAID0 follows the pool's first
    type, as components/nodes/nodepool.py does."""
    rows = []
    for pool in pools:
        types = [catalog.instance_types[name] for name in pool.spec.instance_types]
        smallest = min(types, key=lambda t: t.instance_store.total_gb)
        store = smallest.instance_store
        raid0 = raid0_instance_store(types[0], nvme_scratch)
        read_iops = _lowest(t.instance_store.read_iops for t in types) if store.disks else None
        write_iops = _lowest(t.instance_store.write_iops for t in types) if store.disks else None
        capacity = node_ephemeral_storage_gib(smallest) if raid0 else None
        rows.append({
            "pool": pool.spec.name,
            "instanceTypes": [t.name for t in types],
            "disks": store.disks,
            "diskGB": store.disk_gb,
            "totalGB": store.total_gb,
            "raid0": raid0,
            "readIops": read_iops,
            "writeIops": write_iops,
            # pods get the array only with RAID0; without it nothing on the NVMe is offered to them
            "meetsHotTier": meets_hot_tier(read_iops) if raid0 else False,
            "ephemeralStorageGiB": capacity,
            "allocatableEphemeralStorageGiB": allocatable_ephemeral_storage_gib(capacity) if raid0 else None,
            "podAccess": POD_ACCESS_RAID0 if raid0 else (POD_ACCESS_OFF if store.disks else POD_ACCESS_NO_DISKS),
        })
    return rows
