"""FSx for Lustre (`storage.lustre`) as plain decisions: no Pulumi, tested without mocks.

components/storage/lustre.py turns these into resources. What the file system is, and why:

- **PERSISTENT_2, SSD, Lustre 2.15, LZ4, metadata configuration AUTOMATIC.** PERSISTENT_2 is the only deployment
  type with per-TiB throughput tiers 125/250/500/1000 and with EFA. 2.15 is the version FSx recommends for every
  new file system, and the only one PERSISTENT_2 takes with a metadata configuration (FSx API,
  CreateFileSystem.FileSystemTypeVersion: "2.12 is supported by all Lustre deployment types, except for
  PERSISTENT_2 with a metadata configuration mode"; "2.15 ... is recommended for all new file systems"). The
  metadata configuration is always set, EFA or not: EFA needs it (FSx User Guide, "Working with EFA-enabled file
  systems": "EFA is supported on Persistent 2 file systems with a metadata configuration specified"), and turning EFA
  on later is impossible anyway ("you cannot enable or disable EFA on an existing file system"), so one shape for
  every stack. AUTOMATIC scales metadata IOPS with capacity (SSD only).
- **Sizes** (CreateFileSystem.StorageCapacity, PERSISTENT_2 SSD): 1200 GiB, 2400 GiB and increments of 2400 GiB.
  **Tiers** (PerUnitStorageThroughput, PERSISTENT_2 SSD): 125, 250, 500, 1000 MB/s/TiB. Throughput capacity is
  capacity (TiB) x tier.
- **Encryption** with the stack's own customer-managed KMS key (rotation on, protected). **Logs**: data repository
  warnings and errors (WARN_ERROR) to a CloudWatch log group whose name starts with `/aws/fsx/` (provider docs,
  LustreFileSystem log_configuration.destination: "must begin with the /aws/fsx prefix").
- **Data**: one data repository association from `importPath` (default: the datasets bucket) to `/data`, importing
  and exporting NEW, CHANGED and DELETED automatically. PERSISTENT_2 links S3 only through associations: the file
  system's own `import_path`/`auto_import_policy` are PERSISTENT_1 only (provider docs).
- **Protection: the export, not backups** (`EXPORT_EVENTS`, `protection_problems`). FSx backs up no file system linked to S3, so a file
  system has one or the other, and this program links every one: what jobs write under /data is exported to the
  bucket, whose versioning keeps what is overwritten or deleted. No automatic backups, no final backup.
  **Maintenance**: Sundays 03:00 UTC.

EFA (`storage.lustre.efa`), from the FSx User Guide, "Working with EFA-enabled file systems" (prerequisites and
considerations), and "File system access control with Amazon VPC" (EFA-enabled security groups):
- file system: PERSISTENT_2 with a metadata configuration (always so here); SSD tiers are not restricted (only
  Intelligent-Tiering has a 4,000 MBps increment rule, not used here); the tier can never change afterwards, only the
  capacity; EFA cannot be switched on or off after creation;
- network: the file system in the same Availability Zone (and /16) as its EFA clients; its security group allows
  ALL traffic to and from itself and the clients' security groups, by group ID (CIDR rules do not count for EFA);
- clients: Nitro v4 or newer instance types that support EFA, trn2 excluded; AL2023, RHEL 9.5+ or Ubuntu 22+ with
  kernel 6.8+; EFA modules installed and the Lustre client configured for EFA (configure-efa-fsx-lustre-client);
  GPUDirect Storage only on P5, P5e, P5en and P6-B200.
"""
from __future__ import annotations


from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.pools import QUEUE_WORKLOADS
from decisions.storage import buckets

DEPLOYMENT_TYPE = "PERSISTENT_2"
STORAGE_TYPE = "SSD"
LUSTRE_VERSION = "2.15"
DATA_COMPRESSION = "LZ4"
METADATA_MODE = "AUTOMATIC"
LOG_LEVEL = "WARN_ERROR"
LOG_GROUP_PREFIX = "/aws/fsx/"

SIZE_STEP_GIB = 2400
SMALLEST_SIZE_GIB = 1200
THROUGHPUT_TIERS = (125, 250, 500, 1000)          # MB/s/TiB, PERSISTENT_2 SSD

# FSx recommends EFA above 10 GBps of throughput capacity ("Working with EFA-enabled file systems").
EFA_RECOMMENDED_ABOVE_MBPS = 10_000

# Weekly maintenance (UTC), FSx's d:HH:MM with d = 1 (Monday) to 7 (Sunday).
WEEKLY_MAINTENANCE_START = "7:03:00"

# The data repository association links this directory of the file system to S3, and pods mount the same directory
# (a volumeMount's subPath) at the same path: what a job writes under /data is inside the link and is exported. The
# claim's volume is the file system's root (the CSI driver mounts `mountname`), so a mount without the subPath would put
# the datasets at /data/data and leave what jobs write outside the link, never exported.
FILE_SYSTEM_PATH = "/data"
MOUNT_SUBPATH = FILE_SYSTEM_PATH.lstrip("/")
AUTO_EVENTS = ("NEW", "CHANGED", "DELETED")

# Lustre's ports (FSx User Guide, "File system access control with Amazon VPC"): TCP 988 and TCP 1018-1023, from the
# file system's own group (its servers talk to each other) and from the clients' groups.
LUSTRE_PORTS: Tuple[Tuple[int, int], ...] = ((988, 988), (1018, 1023))

# Kubernetes: a static PV for the FSx CSI driver (kubernetes-sigs/aws-fsx-csi-driver,
# examples/kubernetes/static_provisioning) and a claim bound to it by name.
CSI_DRIVER = "fsx.csi.aws.com"
PV_NAME = "lustre-data"
PVC_NAME = "lustre-data"
MOUNT_OPTIONS = ("flock",)
ACCESS_MODES = ("ReadWriteMany",)
RECLAIM_POLICY = "Retain"

# Nitro generation per instance family (AWS, Amazon EC2 Instance Types guide, "Specifications for Amazon EC2
# accelerated computing instances", Instance family summary, Hypervisor column). FSx serves EFA to Nitro v4+ only.
NITRO_GENERATION: Mapping[str, int] = {
    "g4dn": 3, "g5": 3, "g6": 4, "g6e": 4, "p4d": 3, "p4de": 3, "p5": 4, "p5e": 4, "p5en": 5, "p6-b200": 6,
}
EFA_CLIENT_MIN_NITRO = 4
EFA_CLIENT_EXCLUDED_FAMILIES = ("trn2",)          # "excluding the trn2 instance family"
GDS_CLIENT_FAMILIES = ("p5", "p5e", "p5en", "p6-b200")

Issue = Tuple[Tuple[object, ...], str]
AT = ("storage", "lustre")


def family(instance_type: str) -> str:
    """`p5en.48xlarge` -> `p5en`."""
    return instance_type.split(".", 1)[0]


def efa_client_problem(instance_type: str) -> Optional[str]:
    """Why FSx cannot serve EFA to `instance_type`, or None when it can."""
    fam = family(instance_type)
    if fam in EFA_CLIENT_EXCLUDED_FAMILIES:
        return f"{instance_type}: FSx for Lustre excludes the {fam} family from EFA"
    nitro = NITRO_GENERATION.get(fam)
    if nitro is None:
        return (f"{instance_type}: Nitro generation unknown "
                "(add its family to decisions/storage/lustre.py NITRO_GENERATION)")
    if nitro < EFA_CLIENT_MIN_NITRO:
        return f"{instance_type} is Nitro v{nitro}; FSx for Lustre serves EFA to Nitro v{EFA_CLIENT_MIN_NITRO} or newer"
    return None


def throughput_mbps(capacity_gib: int, per_tib: int) -> float:
    """The file system's throughput capacity, MB/s: capacity in TiB times the tier."""
    return capacity_gib / 1024 * per_tib


def size_issues(capacity_gib: int, per_tib: int) -> List[Issue]:
    """A PERSISTENT_2 SSD size and tier, or why not (key paths under `gpu-cloud:`)."""
    issues: List[Issue] = []
    if capacity_gib != SMALLEST_SIZE_GIB and (capacity_gib < SIZE_STEP_GIB or capacity_gib % SIZE_STEP_GIB):
        issues.append((AT + ("capacityGiB",), f"{capacity_gib} is not a PERSISTENT_2 SSD size: use "
                                              f"{SMALLEST_SIZE_GIB} or a multiple of {SIZE_STEP_GIB}"))
    if per_tib not in THROUGHPUT_TIERS:
        issues.append((AT + ("throughputPerTiB",), f"{per_tib} MB/s/TiB is not a PERSISTENT_2 SSD tier: use "
                                                   f"{', '.join(map(str, THROUGHPUT_TIERS))}"))
    return issues


def lustre_issues(lustre, pools: Sequence) -> List[Issue]:
    """Every reason FSx would refuse `lustre` (a decisions.config.model.Lustre) for this stack, as (key path under
    `gpu-cloud:`, message). `pools`: the stack's decisions.config.stack.ResolvedPool values (only `spec`, `types` and
    `efa` are read)."""
    issues = size_issues(lustre.capacity_gib, lustre.throughput_per_tib)
    if lustre.efa:
        efa_pools = [p for p in pools if p.efa]
        able = [p for p in efa_pools if efa_client_problem(p.types[0].name) is None]
        if not efa_pools:
            issues.append((AT + ("efa",), "no node pool has EFA, so nothing could reach an EFA-enabled file system "
                                          "over EFA (and EFA cannot be switched off later); set efa: false"))
        elif not able:
            reasons = "; ".join(f"{p.name}: {efa_client_problem(p.types[0].name)}" for p in efa_pools)
            issues.append((AT + ("efa",), f"FSx for Lustre serves EFA only to Nitro v{EFA_CLIENT_MIN_NITRO}+ EFA "
                                          f"instances (not trn2), and no EFA pool qualifies ({reasons}); "
                                          "set efa: false"))
    return issues


def lustre_warnings(lustre, pools: Sequence) -> List[str]:
    """What a valid `storage.lustre` should still change."""
    warnings: List[str] = []
    mbps = throughput_mbps(lustre.capacity_gib, lustre.throughput_per_tib)
    if not lustre.efa and mbps > EFA_RECOMMENDED_ABOVE_MBPS and any(p.efa for p in pools):
        warnings.append(f"gpu-cloud:storage.lustre.efa: {mbps:,.0f} MB/s of throughput; FSx recommends EFA above "
                        f"{EFA_RECOMMENDED_ABOVE_MBPS:,} MB/s (it can only be chosen when the file system is created)")
    if lustre.efa:
        for p in pools:
            problem = efa_client_problem(p.types[0].name) if p.efa else None
            if problem:
                warnings.append(f"gpu-cloud:storage.lustre.efa: pool {p.name} mounts over TCP, not EFA ({problem})")
    return warnings


# --- the zone ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LustreZone:
    zone_id: str
    reason: str


def _training(pools: Sequence) -> list:
    return [p for p in pools if p.spec.workload == "training"]


def zone_issues(pools: Sequence, pool_zones: Mapping[str, Tuple[str, ...]], efa: bool) -> List[Issue]:
    """An EFA-enabled file system serves EFA clients of its own zone only, so with `efa` the EFA training pools
    (each pinned to one zone) must agree on a zone. Without it, pools in other zones mount over TCP, across zones."""
    zones = _efa_training_zones(pools, pool_zones)
    if efa and len(set(zones.values())) > 1:
        listed = ", ".join(f"{name} in {zone}" for name, zone in zones.items())
        return [(AT, f"a file system lives in one zone, but the EFA training pools are in different zones ({listed}); "
                     "pin them to one availabilityZone")]
    return []


def _efa_training_zones(pools: Sequence, pool_zones: Mapping[str, Tuple[str, ...]]) -> Dict[str, str]:
    return {p.name: pool_zones[p.name][0] for p in _training(pools) if p.efa and pool_zones.get(p.name)}


def lustre_zone(pools: Sequence, pool_zones: Mapping[str, Tuple[str, ...]], zones: Sequence[str]) -> LustreZone:
    """Where the file system goes (a zone ID of `zones`, the stack's declared zones in subnet order): the zone of the
    first EFA training pool (with an EFA-enabled file system they must all agree: zone_issues), else of the first
    training pool pinned to a zone (availabilityZone), else the first declared zone. `pool_zones`:
    decisions.network.zones.ZoneLayout.pool_zones (pool -> zone IDs, resolved from names). Only stack-file choices
    count, never what the account offers, so the zone (and the file system, which a zone change replaces) stays put
    until the stack file moves it."""
    efa = _efa_training_zones(pools, pool_zones)
    if efa:
        zone = next(iter(efa.values()))   # the first EFA training pool's; zone_issues refused disagreement with EFA
        same = [name for name, pool_zone in efa.items() if pool_zone == zone]
        return LustreZone(zone, f"the zone of the EFA training pools ({', '.join(same)})")
    for p in _training(pools):
        if p.spec.availability_zone and pool_zones.get(p.name):
            return LustreZone(pool_zones[p.name][0], f"the zone of training pool {p.name} (availabilityZone)")
    if not zones:
        raise ValueError("the stack declares no zones")
    return LustreZone(zones[0], "the first declared zone (no training pool is pinned to a zone)")


def in_file_system_zone(spec, pool_zones: Mapping[str, Tuple[str, ...]]) -> Dict[str, Tuple[str, ...]]:
    """`pool_zones` (pool -> zone IDs) with each pool that mounts the file system without EFA, is pinned to no zone and
    does not set spreadAcrossZones, launched in the file system's zone alone where that zone offers its types: EC2
    bills reads from another zone on both sides (decisions/cost/transfer.py; 2.4 GB/s read across zones comes to about
    $170 an hour). EFA pools are pinned already; the file system's zone is chosen from pinned pools only (lustre_zone),
    so moving these pools cannot move it."""
    moved = dict(pool_zones)
    if spec.storage.lustre is None:
        return moved
    zone = lustre_zone(spec.pools, pool_zones, spec.network.zones).zone_id
    for pool in spec.pools:
        if (mounts_lustre(pool, True) and not pool.efa and not pool.spec.availability_zone
                and not pool.spec.spread_across_zones and zone in moved.get(pool.name, ())):
            moved[pool.name] = (zone,)
    return moved


# --- the rest of the file system's settings ----------------------------------------------------------------

# --- what protects the data: an export to S3 or FSx backups, never both ---------------------------------------
# FSx gives a file system one or the other. "File system backups aren't supported on file systems that are linked to
# an Amazon S3 data repository" (FSx for Lustre User Guide, "Using data repositories with Amazon FSx for Lustre");
# automatic and user-initiated backups are for "persistent file systems that are not linked to an Amazon S3 durable
# data repository" (the same guide, "Working with backups"); CreateBackup takes a Lustre file system only when it has
# "a Persistent deployment type" and is "not linked to a data repository" (FSx API Reference, CreateBackup).
#
# This program links every file system (importPath, else the stack's datasets bucket: the datasets live in S3 and
# /data is their working copy), so the link is its protection: automatic export writes each new and changed file
# back ("As you create, modify, or delete files, Amazon FSx for Lustre automatically exports the defined changes
# asynchronously once your application finishes modifying the file", FSx API Reference, AutoExportPolicy), and the
# bucket's versioning keeps what is overwritten or deleted (decisions/storage/buckets.py). Exports are asynchronous:
# what a job wrote in its last moments may still be on its way when the file system goes.
EXPORT_PROTECTS = ("NEW", "CHANGED")     # what an export must carry for the bucket to hold every file written

# The file system this program builds, which components/storage/lustre.py sets exactly so and protection_problems
# holds (tests/test_lustre.py), as the pack holds any file system (fsx-backups-or-export): linked, exporting every
# change, no automatic backups (0 switches them off, provider docs) and no final backup.
EXPORT_EVENTS = AUTO_EVENTS
BACKUP_RETENTION_DAYS = 0
FINAL_BACKUP = False
PROTECTION = "export to S3"


def protection_summary(import_path: Optional[str], peer_stack: Optional[str] = None) -> str:
    """What protects the file system's data, in a line (the plan and `--dr-pair` print it). `import_path`: the
    stack's storage.lustre.importPath (None: its datasets bucket); `peer_stack`: the DR peer a primary replicates to."""
    events = ", ".join(EXPORT_EVENTS)
    if import_path is not None:
        where = (f"exported to {s3_prefix(import_path)} ({events}; importPath): its versioning and replication are "
                 "that bucket's")
    else:
        noncurrent = buckets.LIFECYCLE[buckets.DATASETS].noncurrent_days
        replicated = buckets.DATASETS in buckets.REPLICATED and peer_stack is not None
        where = (f"exported to the stack's datasets bucket ({events}): versioned, old versions kept {noncurrent} days, "
                 + (f"replicated to {peer_stack}" if replicated else
                    "not replicated" + (f" to {peer_stack}" if peer_stack else "")))
    return f"{where}; no FSx backups (FSx backs up no file system linked to S3)"


def protection_problems(linked: bool, export_events: Sequence[str], backup_retention_days: int, final_backup: bool,
                        prod: bool) -> List[str]:
    """Why a file system's protection is one FSx refuses (backups asked of a linked file system, anywhere) or, in
    prod, none at all (linked without exporting what jobs write, or not linked and not backed up). The pack's
    fsx-backups-or-export rule uses it, and tests/test_lustre.py holds the program's own settings to it."""
    problems: List[str] = []
    if linked and backup_retention_days > 0:
        problems.append(f"asks for automatic backups ({backup_retention_days} days) of a file system linked to S3, "
                        "which FSx does not back up (FSx for Lustre User Guide, Using data repositories): set "
                        "automatic_backup_retention_days=0; the export to S3 protects it")
    if linked and final_backup:
        problems.append("asks for a final backup of a file system linked to S3, which FSx does not back up (FSx for "
                        "Lustre User Guide, Using data repositories): set skip_final_backup=True")
    missing = [event for event in EXPORT_PROTECTS if event not in export_events]
    if prod and linked and missing:
        problems.append(f"is linked to S3 but does not export {' and '.join(missing)} files, and FSx backs up no "
                        "linked file system, so what jobs write exists nowhere else: export "
                        f"{', '.join(EXPORT_PROTECTS)} (the association's auto_export_policy)")
    if prod and not linked and backup_retention_days < 1:
        problems.append("is neither linked to S3 with automatic export nor backed up: set "
                        "automatic_backup_retention_days (1 to 90), or link it to S3 and export")
    if prod and not linked and not final_backup:
        problems.append("is not linked to S3 and skips its final backup on delete: set skip_final_backup=False")
    return problems


def s3_prefix(uri: str) -> str:
    """An s3:// URI as a data repository path: a prefix ending in `/` (`s3://b/datasets` would also match
    `s3://b/datasets-old/...`)."""
    if not uri.startswith("s3://") or len(uri) <= len("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    return uri if uri.endswith("/") else uri + "/"


def log_group_name(cluster_name: str) -> str:
    """The file system's log group; FSx takes only names under /aws/fsx/."""
    return f"{LOG_GROUP_PREFIX}{cluster_name}/lustre"


def storage_quantity(capacity_gib: int) -> str:
    """A PV/PVC capacity: the file system's size in Gi."""
    return f"{capacity_gib}Gi"


CSI_NAMESPACE = "kube-system"
CSI_RELEASE_NAME = "aws-fsx-csi-driver"
# Helm value paths this program sets -> line in kubernetes-sigs/aws-fsx-csi-driver tag
# helm-chart-aws-fsx-csi-driver-1.17.0 charts/aws-fsx-csi-driver/values.yaml.
CSI_VALUE_PATHS = {"controller.nodeSelector": 77}


def csi_values(system_node_labels) -> dict:
    """The CSI driver's controller on the system nodes. It needs no AWS permissions for static volumes (its
    create/delete calls are for dynamic provisioning), so it gets no role."""
    return {"controller": {"nodeSelector": dict(system_node_labels)}}


def mounts_lustre(pool, lustre_configured: bool) -> bool:
    """Whether `pool`'s nodes mount the file system: the claim lives in the training namespace, whose jobs Kueue
    places on training and general pools. Those nodes get the Lustre client and the gate checks its module."""
    return lustre_configured and pool.spec.workload in QUEUE_WORKLOADS
