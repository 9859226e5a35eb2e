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
- **Backups**: daily at 01:00 UTC, kept BACKUP_RETENTION_DAYS by environment; a final backup when the file system
  is deleted (the provider's `skip_final_backup` defaults to true, so it is set false explicitly). **Maintenance**:
  Sundays 03:00 UTC, two hours after the backup starts.
- **Data**: one data repository association from `importPath` (default: the datasets bucket) to `/data`, importing
  and exporting NEW, CHANGED and DELETED automatically. PERSISTENT_2 links S3 only through associations: the file
  system's own `import_path`/`auto_import_policy` are PERSISTENT_1 only (provider docs).

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

import math

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.pools import QUEUE_WORKLOADS

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

# Daily backup and weekly maintenance (UTC). FSx formats: HH:MM and d:HH:MM with d = 1 (Monday) to 7 (Sunday).
DAILY_BACKUP_START = "01:00"
WEEKLY_MAINTENANCE_START = "7:03:00"
# Days an automatic backup is kept. prod: 14 (two weekly cycles: a bad delete found after a long weekend or a week's
# holiday can still be undone); staging: 7. dev: 1: its data is a cache of S3 plus scratch, and one day undoes
# yesterday's mistake at the cost of one incremental backup. 0 would switch automatic backups off.
BACKUP_RETENTION_DAYS: Mapping[str, int] = {"prod": 14, "staging": 7, "dev": 1}
PROD_MIN_BACKUP_RETENTION_DAYS = 7

# Deleting the file system takes its final backup first (skip_final_backup is false), and the provider's default
# delete timeout is 30 minutes for both (terraform-provider-aws internal/service/fsx/lustre_file_system.go,
# Timeouts.Delete). A backup copies the blocks changed since the last backup, "independent of the storage capacity"
# (FSx for Lustre User Guide, Working with backups: TBs changed take hours). The worst case is every block changed
# since the last daily backup, read at the file system's own baseline throughput: one TiB per TiB of capacity at
# per_tib MB/s, so the time depends on the throughput tier only. Plus the deletion itself, the provider's 30 min.
DELETE_WITHOUT_BACKUP_MIN = 30
TIB_BYTES = 2 ** 40

FILE_SYSTEM_PATH = "/data"
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
    `gpu-cloud:`, message). `pools`: the stack's decisions.config.validate.ResolvedPool values (only `spec`, `types` and
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


# --- the rest of the file system's settings ----------------------------------------------------------------

def backup_retention_days(environment: str) -> int:
    """Days an automatic daily backup is kept (see BACKUP_RETENTION_DAYS)."""
    try:
        return BACKUP_RETENTION_DAYS[environment]
    except KeyError:
        raise ValueError(f"{environment!r} is not an environment: {', '.join(BACKUP_RETENTION_DAYS)}") from None


def final_backup_minutes(per_tib: int) -> int:
    """Worst-case minutes of the final backup: every block changed, read at the tier's baseline throughput."""
    return math.ceil(TIB_BYTES / (per_tib * 1_000_000) / 60)


def delete_timeout(per_tib: int) -> str:
    """How long a delete may take (final backup, then the deletion), as a Pulumi custom timeout: whole hours."""
    minutes = final_backup_minutes(per_tib) + DELETE_WITHOUT_BACKUP_MIN
    return f"{math.ceil(minutes / 60)}h"


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
