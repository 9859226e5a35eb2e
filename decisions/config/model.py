"""The stack config contract: typed, frozen models of every `gpu-cloud:` key.

Field names are snake_case in Python and camelCase in the stack file (the user-facing API).
Unknown keys are errors everywhere. Rules that need the catalog or the region live in
decisions/config/validate.py, which runs these models and collects every mistake at once.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Dict, List, Literal, Optional, Tuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel
from typing_extensions import Annotated

NAMESPACE = "gpu-cloud"          # the project's config namespace: every key path (gpu-cloud:network.cidr, ...)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
S3_URI = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")
IAM_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
MAX_NODES_PER_POOL = 64
TRANSIT_GATEWAY_ID = re.compile(r"^tgw-([0-9a-f]{8}|[0-9a-f]{17})$")
SECURITY_GROUP_ID = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})$")
RESERVATION_ID = re.compile(r"^cr-([0-9a-f]{8}|[0-9a-f]{17})$")
HOSTED_ZONE_ID = re.compile(r"^Z[A-Z0-9]{1,32}$")
# A model's directory in a Triton repository, which is its name there.
TRITON_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
PEER_STACK = re.compile(r"^[A-Za-z0-9_.-]+/gpu-cloud/[A-Za-z0-9_.-]+$")
DRIVER_BRANCH = re.compile(r"^\d{3}$")
ZONE_ID = re.compile(r"^[a-z]+\d-az\d+$")
ZONE = re.compile(r"^([a-z]{2}(-[a-z]+)+-\d+[a-z]|[a-z]+\d-az\d+)$")
PLACEMENT_GROUP = re.compile(r"^[A-Za-z0-9._+=,@-]{1,255}$")
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
AMI_RELEASE = re.compile(r"^v\d{8}$")
CRON_SCHEDULE = re.compile(r"^\S+( \S+){4}$")
DRIVER_VERSION = re.compile(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")
RESERVED_LABEL_PREFIX = "gpu-cloud.io/"
# cluster-autoscaler's AWS provider treats a node carrying this label as a GPU node while its device plugin
# starts (cluster-autoscaler/cloudprovider/aws/README.md); gpu-cloud sets it on every GPU node.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
# Labels in the kubernetes.io / k8s.io namespaces that a kubelet may set on itself with
# --node-labels (KEP "Bounding Self-Labeling Kubelets"); any other label in those namespaces
# makes the kubelet refuse to start.
KUBELET_ALLOWED_LABELS = frozenset(
    {
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "beta.kubernetes.io/os",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "kubernetes.io/arch",
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    }
)
KUBELET_ALLOWED_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _matches(pattern: re.Pattern, allowed: str):
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not {allowed}")
        return value

    return AfterValidator(check)


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not LABEL_PREFIX.match(prefix))) or not LABEL_NAME.match(name):
        raise ValueError(f"{key!r} is not a Kubernetes label key (optional DNS prefix/, then a name of at most 63 "
                         "characters: letters, digits, '-', '_', '.')")
    if key.startswith(RESERVED_LABEL_PREFIX):
        raise ValueError(f"{key!r} uses the prefix {RESERVED_LABEL_PREFIX} that gpu-cloud sets itself")
    if key == ACCELERATOR_LABEL:
        raise ValueError(f"{key!r} is set by gpu-cloud itself (the GPU model, for cluster-autoscaler)")
    if not kubelet_may_set_label(key):
        raise ValueError(f"{key!r} is in a kubernetes.io/k8s.io namespace a kubelet may not set on itself "
                         "(use node.kubernetes.io/ or your own prefix)")
    return key


def kubelet_may_set_label(key: str) -> bool:
    """Whether a kubelet may register with this label (see KUBELET_ALLOWED_LABELS)."""
    namespace = key.rpartition("/")[0]
    def within(namespaces):
        return any(namespace == ns or namespace.endswith("." + ns) for ns in namespaces)
    return not within(("kubernetes.io", "k8s.io")) or key in KUBELET_ALLOWED_LABELS or within(KUBELET_ALLOWED_NAMESPACES)


def _label_value(value: str) -> str:
    if not LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes label value (at most 63 characters: letters, digits, '-', "
                         "'_', '.', starting and ending with a letter or digit)")
    return value


def _ipv4_cidr(value: str) -> str:
    try:
        return str(ipaddress.IPv4Network(value, strict=True))
    except ValueError as err:
        raise ValueError(f"{value!r} is not an IPv4 CIDR ({err})") from None


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Cidr = Annotated[str, AfterValidator(_ipv4_cidr)]
S3Uri = Annotated[str, _matches(S3_URI, "an s3://bucket/prefix URI")]


class ConfigModel(BaseModel):
    """Frozen, camelCase in the stack file, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=False)


class TransitGateway(ConfigModel):
    """An existing transit gateway the VPC attaches to, and the networks reached through it (for example the
    CI runners that run Pulumi). Its route tables and any cross-account acceptance are the network team's."""
    id: Annotated[str, _matches(TRANSIT_GATEWAY_ID, "a transit gateway ID such as tgw-0123456789abcdef0")]
    routes: Tuple[Cidr, ...] = Field(min_length=1)


class Network(ConfigModel):
    cidr: Cidr
    # Zone IDs (use1-az1), in subnet order: the i-th zone gets the i-th block of the VPC for good, so add
    # zones at the end (decisions/network/network_plan.py).
    zones: Tuple[Annotated[str, _matches(ZONE_ID, "an availability zone ID such as use1-az1")], ...] = Field(
        min_length=2, max_length=6)
    nat_gateways: Literal["one-per-az", "single"] = "one-per-az"
    transit_gateway: Optional["TransitGateway"] = None

    @model_validator(mode="after")
    def _layout(self) -> "Network":
        network = ipaddress.IPv4Network(self.cidr)
        if not 16 <= network.prefixlen <= 20:
            raise ValueError(f"cidr {self.cidr} has prefix /{network.prefixlen}; allowed /16 to /20")
        if not any(network.subnet_of(block) for block in PRIVATE_RANGES):
            raise ValueError(f"cidr {self.cidr} is not in a private (RFC 1918) range: "
                             f"{', '.join(map(str, PRIVATE_RANGES))}")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError(f"zones repeat: {', '.join(self.zones)}")
        for route in self.transit_gateway.routes if self.transit_gateway else ():
            if ipaddress.IPv4Network(route).overlaps(network):
                raise ValueError(f"transitGateway.routes: {route} overlaps the VPC {self.cidr}")
        return self


class Cluster(ConfigModel):
    # The newest minor with every pin (add-ons, autoscaler image, AMIs), in EKS standard support until
    # 2027-03-27 (decisions/catalog/eks.yaml); older minors cost six times as much once extended support starts.
    kubernetes_version: str = "1.35"
    public_access_cidrs: Tuple[Cidr, ...] = ()
    # Who may reach the private endpoint on 443 besides the nodes: networks (in the VPC or routed to it) and
    # security groups (in the VPC, or a peered one in the region).
    private_access_cidrs: Tuple[Cidr, ...] = ()
    private_access_security_group_ids: Tuple[Annotated[str, _matches(SECURITY_GROUP_ID, "a security group ID such as sg-0123456789abcdef0")], ...] = ()
    # How the machine running Pulumi reaches the API server (the Kubernetes provider and every Helm release
    # go that way): no default, because a wrong guess fails 25 minutes into the first `pulumi up`.
    deployer_access: Literal["public", "private"]
    # Required, at least one: the cluster creator gets no access (API authentication mode), so without an
    # admin role nobody, Pulumi included, could reach the Kubernetes API.
    admin_role_arns: Tuple[Annotated[str, _matches(IAM_ROLE_ARN, "an IAM role ARN (arn:aws:iam::123456789012:role/name)")], ...] = Field(min_length=1)


class GpuDriver(ConfigModel):
    """Where the NVIDIA driver comes from (decisions/nodes/amis.py resolves this against decisions/nodes/amis.yaml).

    `ami`: the accelerated AMI of `amiRelease` carries it; `branch`/`version`, if given, must be that AMI's.
    `install`: the standard AMI of `amiRelease`, and the node gate installs `branch` (or exactly `version`).
    """
    source: Literal["ami", "install"] = "ami"
    ami_release: Optional[Annotated[str, _matches(AMI_RELEASE, "an EKS AMI release such as \"v20260714\"")]] = None
    branch: Optional[Annotated[str, _matches(DRIVER_BRANCH, "a driver branch such as \"580\"")]] = None
    version: Optional[Annotated[str, _matches(DRIVER_VERSION, "a driver version such as \"580.95.05\"")]] = None

    @model_validator(mode="after")
    def _version_on_branch(self) -> "GpuDriver":
        if self.version and self.branch and not self.version.startswith(self.branch + "."):
            raise ValueError(f"version {self.version} is not on branch {self.branch}")
        return self


# Sharing modes in which the device plugin advertises each GPU `replicas` times (decisions/platform/gpu_operator.py).
REPLICATED_MODES = ("time-slicing", "mps")


class GpuSharing(ConfigModel):
    mode: Literal["none", "time-slicing", "mps", "mig"] = "none"
    # 48: the most clients an MPS server takes on compute capability 7.5 and newer, every catalog GPU
    # (NVIDIA/k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/device.go lines 43-49); time-slicing has no limit
    # of its own and keeps the same one.
    replicas: Optional[int] = Field(default=None, ge=2, le=48)
    mig_profile: Optional[str] = None                        # every GPU cut into as many of it as fit
    mig_profiles: Optional[Dict[str, Annotated[int, Field(ge=1)]]] = None   # profile -> instances on every GPU

    @model_validator(mode="after")
    def _fields_for_mode(self) -> "GpuSharing":
        replicated = self.mode in REPLICATED_MODES
        if replicated and self.replicas is None:
            raise ValueError(f"mode {self.mode} needs replicas (2 to 48)")
        if not replicated and self.replicas is not None:
            raise ValueError(f"replicas is only allowed with mode time-slicing or mps, not {self.mode}")
        if self.mode == "mig" and (self.mig_profile is None) == (self.mig_profiles is None):
            raise ValueError("mode mig needs one of migProfile (one profile, as many as fit: 1g.10gb) or migProfiles "
                             "(instances of each profile on every GPU: {1g.10gb: 2, 3g.40gb: 1})")
        if self.mode != "mig" and (self.mig_profile is not None or self.mig_profiles is not None):
            raise ValueError(f"migProfile and migProfiles are only allowed with mode mig, not {self.mode}")
        if self.mig_profiles == {}:
            raise ValueError("migProfiles needs at least one profile")
        return self


class Taint(ConfigModel):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


Capacity = Literal["on-demand", "spot", "reserved", "capacity-block"]
RESERVED_CAPACITY: Tuple[str, ...] = ("reserved", "capacity-block")


class Commitment(ConfigModel):
    """A Savings Plan or Reserved Instances bought for the pool's steady nodes (desiredNodes): the plan prices them
    at the commitment's discount (decisions/cost/prices.yaml) and shows them as committed spend beside the term's
    total."""
    type: Literal["savings-plan", "reserved-instance"]
    term: Literal["1y", "3y"]
    payment: Literal["no-upfront", "partial-upfront", "all-upfront"] = "no-upfront"

    @property
    def key(self) -> str:
        """How decisions/cost/prices.yaml names this commitment's discount."""
        return f"{self.type}/{self.term}/{self.payment}"

    @property
    def months(self) -> int:
        return 12 if self.term == "1y" else 36


class NodePool(ConfigModel):
    name: Annotated[str, _matches(DNS_LABEL, "a DNS-1123 label (lowercase letters, digits and '-', at most 63)")]
    instance_types: Tuple[str, ...] = Field(min_length=1)
    capacity: Capacity
    capacity_reservation_id: Optional[Annotated[str, _matches(RESERVATION_ID, "a capacity reservation id (cr- and 8 or 17 hex digits)")]] = None
    min_nodes: int = Field(ge=0)
    desired_nodes: int = Field(ge=0)
    # One pool is one launch template and one instance refresh: past 64 nodes (512 GPUs) a slip of the
    # keyboard or one bad template costs too much at once. Larger fleets are several pools.
    max_nodes: int = Field(ge=0, le=MAX_NODES_PER_POOL)
    efa: Optional[bool] = None  # None: on where the instance type supports EFA (resolved by decisions.config.validate)
    # A zone name (us-east-1a) or ID (use1-az1) of network.zones; names are resolved per account at run time.
    availability_zone: Optional[Annotated[str, _matches(ZONE, "an availability zone name (us-east-1a) or ID (use1-az1)")]] = None
    # An existing cluster placement group to launch into (the one a capacity reservation was created in).
    placement_group: Optional[Annotated[str, _matches(PLACEMENT_GROUP, "a placement group name")]] = None
    # A training or general pool without EFA that mounts the stack's Lustre launches in the file system's zone, since
    # reads from another zone are billed on both sides (decisions/network/zones.py resolve_layout); true spreads it
    # over every declared zone that offers its types (more spot capacity), and the plan warns with what reads cost.
    spread_across_zones: bool = False
    workload: Literal["training", "inference", "general"]
    gpu_sharing: GpuSharing = GpuSharing()
    labels: Dict[LabelKey, LabelValue] = {}
    taints: Tuple[Taint, ...] = ()
    # Cluster-autoscaler priority-expander weight; default comes from the capacity type.
    autoscaler_priority: Optional[int] = Field(default=None, ge=1, le=100)
    # Savings Plans and Reserved Instances discount on-demand and reserved (ODCR) usage; spot is not covered, and a
    # capacity block is already bought upfront at its own price.
    commitment: Optional[Commitment] = None

    @field_validator("commitment")
    @classmethod
    def _commitment_fits_capacity(cls, commitment: Optional[Commitment], info: ValidationInfo) -> Optional[Commitment]:
        capacity = info.data.get("capacity")
        if commitment is not None and capacity in ("spot", "capacity-block"):
            raise ValueError(f"a {commitment.type} does not apply to capacity {capacity}; only on-demand and "
                             "reserved pools take a commitment")
        return commitment

    @property
    def reserved_capacity(self) -> bool:
        return self.capacity in RESERVED_CAPACITY


class Lustre(ConfigModel):
    capacity_gib: int = Field(alias="capacityGiB", gt=0)
    throughput_per_tib: Literal[125, 250, 500, 1000] = Field(alias="throughputPerTiB", default=250)
    import_path: Optional[S3Uri] = None
    efa: bool = False

    @model_validator(mode="after")
    def _persistent2_size(self) -> "Lustre":
        if self.capacity_gib != 1200 and self.capacity_gib % 2400:
            raise ValueError(f"capacityGiB {self.capacity_gib} is not a PERSISTENT_2 size: use 1200 or a multiple of 2400")
        return self


class Storage(ConfigModel):
    lustre: Optional[Lustre] = None
    nvme_scratch: bool = True


class TritonModel(ConfigModel):
    """A model the stack's repository serves, and the GPU memory it takes in one replica once loaded (all its instances
    on the replica's GPU slot together), as measured where it runs. A declaration: nothing inspects the models."""
    name: Annotated[str, _matches(TRITON_MODEL_NAME, "a Triton model name (its directory in the repository: letters, "
                                                     "digits, '_', '.' and '-', at most 128)")]
    gpu_memory_mib: int = Field(alias="gpuMemoryMiB", gt=0)


class Triton(ConfigModel):
    enabled: bool = False
    pool: Optional[str] = None
    # Left out: s3://<the stack's models bucket>/triton, which a DR primary replicates to its peer's models bucket.
    model_repository: Optional[S3Uri] = None
    # At least 1: the autoscaler scales on Triton's own queue metrics, which no pod reports at zero replicas.
    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=4, ge=1)
    target_queue_ms: float = Field(default=10, gt=0)
    # The load balancer in front of Triton: inside the VPC unless the stack says otherwise.
    scheme: Literal["internal", "internet-facing"] = "internal"
    # The repository holds no engine built for one GPU architecture (no TensorRT plan): its models load on any GPU, so
    # a DR pair may serve on two architectures (decisions/serving/dr_pair.py). A declaration: nothing inspects the
    # models.
    portable_models: bool = False
    # The roles (a CI or release job's) that may assume the stack's model publisher role, the one writer of Triton's
    # repository in the stack's models bucket (decisions/storage/data_access.py). Empty: no publisher role.
    publisher_role_arns: Tuple[Annotated[str, _matches(IAM_ROLE_ARN, "an IAM role ARN (arn:aws:iam::123456789012:role/name)")], ...] = ()
    # The models the repository serves, each with the GPU memory a replica needs for it: every replica loads them all,
    # so they must fit one GPU slot of the pool together (decisions/serving/dr_pair.py: here and in a DR secondary).
    models: Tuple[TritonModel, ...] = ()

    @field_validator("models")
    @classmethod
    def _models_once_each(cls, models: Tuple[TritonModel, ...], info: ValidationInfo) -> Tuple[TritonModel, ...]:
        if models and not info.data.get("enabled"):
            raise ValueError("declares what Triton serves: set enabled, or leave models out")
        names = [model.name for model in models]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} declared twice; declare each model once")
        return models

    @field_validator("publisher_role_arns")
    @classmethod
    def _publishers_need_the_stacks_repository(cls, arns: Tuple[str, ...], info: ValidationInfo) -> Tuple[str, ...]:
        if arns and not info.data.get("enabled"):
            raise ValueError("publishers publish into Triton's repository: set enabled, or leave publisherRoleArns out")
        if arns and info.data.get("model_repository"):
            raise ValueError(f"the stack publishes only into its own models bucket, and modelRepository names "
                             f"{info.data['model_repository']}: grant publishing where that bucket is managed")
        repeated = sorted({arn for arn in arns if arns.count(arn) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} listed twice")
        return arns

    @model_validator(mode="after")
    def _enabled_needs(self) -> "Triton":
        if self.enabled and not self.pool:
            raise ValueError("an enabled triton needs pool (an inference pool of this stack)")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas {self.min_replicas} > maxReplicas {self.max_replicas}")
        return self


class Inference(ConfigModel):
    triton: Triton = Triton()


class Alerts(ConfigModel):
    """Alert thresholds (decisions/observability/alert_rules.py). Defaults are the design requirements' figures where
    they give one."""
    gpu_temp_c: int = Field(alias="gpuTempC", default=85, ge=40, le=110)
    gpu_util_high_pct: int = Field(default=90, ge=1, le=100)
    gpu_mem_high_pct: int = Field(default=90, ge=1, le=100)
    # Of the node's IP bandwidth (decisions/nodes/efa.py ip_bandwidth_gbps: its ENA interfaces' share of networkGbps),
    # for 10 min.
    network_high_pct: int = Field(default=70, ge=1, le=100)
    storage_latency_ms: float = Field(default=50, gt=0)
    # Triton: the design requirements give no figures; one failed request in a hundred, and one second at p99.
    triton_failure_pct: float = Field(default=1, gt=0, le=100)
    triton_p99_latency_ms: float = Field(alias="tritonP99LatencyMs", default=1000, gt=0)


class Alertmanager(ConfigModel):
    # Where alerts go: a webhook receiver. Its URL is a secret, set apart from this object with
    # `pulumi config set --secret gpu-cloud:alertWebhookUrl https://...`; without it alerts stay in Alertmanager.
    group_wait_s: int = Field(default=30, ge=0, le=3600)
    repeat_interval_h: int = Field(default=4, ge=1, le=168)


class Monitoring(ConfigModel):
    retention_days: int = Field(default=15, ge=1, le=3650)
    # How long every log the stack writes is kept: its CloudWatch log groups (control plane, VPC flow logs, FSx) and
    # the S3 access logs (decisions/observability/logs.py). Left out: 365 in prod, 30 elsewhere; prod may not set less
    # than 365.
    log_retention_days: Optional[int] = Field(default=None, ge=1, le=3653)
    # Prometheus' volume (encrypted gp3); retention also stops at 90 % of it so a full disk never stops scraping.
    prometheus_volume_gib: int = Field(alias="prometheusVolumeGiB", default=200, ge=20, le=16384)
    alerts: Alerts = Alerts()
    alertmanager: Alertmanager = Alertmanager()


class Dr(ConfigModel):
    role: Literal["primary", "secondary", "none"] = "none"
    peer_stack: Optional[Annotated[str, _matches(PEER_STACK, "a stack reference of the form org/gpu-cloud/<stack>")]] = None
    domain: Optional[Annotated[str, _matches(DOMAIN, "a DNS domain name such as infer.example.com")]] = None
    hosted_zone_id: Optional[Annotated[str, _matches(HOSTED_ZONE_ID, "a Route 53 hosted zone id such as Z0123456789ABC")]] = None
    # How the two regions share `domain` (decisions/serving/failover.py): failover (active-passive), weighted or latency
    # (active-active). Both stacks of a pair must say the same.
    routing: Literal["failover", "weighted", "latency"] = "failover"
    # A primary's target recovery point, in minutes, for what it replicates to the peer (decisions/serving/dr_pair.py
    # holds it to S3 Replication Time Control's 15). Left out: no target.
    rpo_minutes: Optional[int] = Field(default=None, ge=1)
    # Where inference clients call from, with an internal load balancer: the load balancer admits these and the VPC
    # only (decisions/serving/lb_controller.py load_balancer_source_ranges), with or without a DR pair; each must
    # reach this VPC and the peer's (decisions/serving/dr_pair.py client_route_issues).
    client_cidrs: Tuple[Cidr, ...] = ()

    @model_validator(mode="after")
    def _peer_fields(self) -> "Dr":
        missing = [name for name, value in (("peerStack", self.peer_stack), ("domain", self.domain),
                                            ("hostedZoneId", self.hosted_zone_id)) if not value]
        if self.role != "none" and missing:
            raise ValueError(f"role {self.role} needs {', '.join(missing)}")
        return self


class Usage(ConfigModel):
    """What the bill assumes of use where the design moves data it charges for (decisions/cost/transfer.py): the
    checkpoint and model writes a DR primary replicates, and reads of the Lustre file system from other zones.
    Left out, the plan lists the unit prices only."""
    checkpoint_gib: Optional[float] = Field(default=None, alias="checkpointGiB", gt=0)
    checkpoints_per_hour: Optional[float] = Field(default=None, gt=0)
    model_gib_per_month: Optional[float] = Field(default=None, alias="modelGiBPerMonth", ge=0)
    # Left out: the file system's whole throughput, the most pools in other zones can read.
    lustre_read_mbps: Optional[float] = Field(default=None, alias="lustreReadMBps", gt=0)

    @model_validator(mode="after")
    def _checkpoints_need_both(self):
        if (self.checkpoint_gib is None) != (self.checkpoints_per_hour is None):
            raise ValueError("checkpointGiB and checkpointsPerHour go together: the volume is their product")
        return self


class AssumedPrice(ConfigModel):
    """A price the stack states for a pool the catalog cannot price (gpu-cloud:budget.assumed): the on-demand rate per
    node-hour of its types (a capacity block's rate for a block), before any spot discount, with where it was read.
    The bill counts it, marked ASSUMED with this source, and so does the budget."""
    usd_per_node_hour: float = Field(gt=0)
    source: str = Field(min_length=10)


class Budget(ConfigModel):
    # Left out: no check (prod stacks get a warning, decisions.config.validate.stack_warnings).
    max_hourly_usd: Optional[float] = Field(default=None, gt=0)
    # Items the stack knows have no price (a pool's name, or a fixed cost's key such as fsx-lustre), left out of the
    # budget on purpose. With a budget, any other unpriced item refuses the stack (decisions/cost/cost.py
    # unacknowledged).
    unpriced: Tuple[Annotated[str, Field(min_length=1)], ...] = ()
    # Pools the catalog has no price for, priced by the stack instead: pool name -> its assumed rate and source.
    assumed: Dict[str, AssumedPrice] = {}
    usage: Usage = Usage()

    @model_validator(mode="after")
    def _unpriced_needs_a_budget(self):
        if self.unpriced and self.max_hourly_usd is None:
            raise ValueError("unpriced acknowledges items a budget leaves out; set maxHourlyUsd, or remove unpriced")
        both = sorted(set(self.unpriced) & set(self.assumed))
        if both:
            raise ValueError(f"{', '.join(both)}: in both unpriced and assumed; an assumed price prices it, so name it "
                             "in one")
        if len(set(self.unpriced)) != len(self.unpriced):
            raise ValueError("unpriced names an item twice")
        return self


class TeamAccess(ConfigModel):
    # IAM roles whose sessions join the team's Kubernetes group gpu-cloud:<namespace>: one EKS access entry each,
    # with no access policy (components/platform/tenancy.py; RBAC on the group decides what the team may do).
    role_arns: Tuple[Annotated[str, _matches(IAM_ROLE_ARN, "an IAM role ARN (arn:aws:iam::123456789012:role/name)")], ...] = ()


class Teams(ConfigModel):
    # One field per team namespace, named as decisions.platform.tenancy.TEAM_NAMESPACES (tests/test_validate.py keeps
    # them equal): a misspelt team is an unknown key with a "did you mean".
    training: TeamAccess = TeamAccess()
    inference: TeamAccess = TeamAccess()


class Tenancy(ConfigModel):
    teams: Teams = Teams()


class Training(ConfigModel):
    # When the single-node NVLink bandwidth check runs on each NVLink training pool (cron, in the cluster's
    # time zone, UTC on EKS). Left out: its CronJob exists but is suspended, and runs when started by hand.
    nvlink_check_schedule: Optional[Annotated[str, _matches(
        CRON_SCHEDULE, "a five-field cron schedule such as '0 4 * * 0'")]] = None
    # When the two-node EFA bandwidth check runs on each EFA training pool that keeps two or more nodes. By default
    # weekly, two hours after the NVLink check's suggested Sunday 04:00 and so after that run's one-hour deadline.
    across_node_check_schedule: Annotated[str, _matches(
        CRON_SCHEDULE, "a five-field cron schedule such as '0 6 * * 0'")] = "0 6 * * 0"


class Repair(ConfigModel):
    """The GPU node repair controller (decisions/nodes/repair.py, jobs/node_repair.py)."""
    # Decide and report every repair (Events, metrics, alerts) but carry out none: for a first rollout, or while a
    # fault class is in doubt.
    dry_run: bool = False
    # At most this many nodes of one pool rebooted or replaced in any hour, whatever the faults.
    max_per_pool_per_hour: int = Field(default=2, ge=1, le=20)


Environment = Literal["prod", "staging", "dev"]
Tags = Dict[Annotated[str, Field(min_length=1, max_length=128)], Annotated[str, Field(max_length=256)]]

# `gpu-cloud:` keys that hold secrets: set with `pulumi config set --secret`, read by the program with get_secret,
# never part of the StackSpec (so never in the plan). load_stack_spec only checks their form.
SECRET_KEYS = ("alertWebhookUrl",)

# The `gpu-cloud:` keys, their types and whether a stack must set them. Defaults for optional
# top-level keys are declared in Pulumi.yaml (the CLI applies them; so does the offline plan).
SECTIONS = {
    "environment": (Environment, True),
    "tags": (Tags, True),
    "network": (Network, True),
    "cluster": (Cluster, False),
    "gpuDriver": (GpuDriver, False),
    "nodePools": (List[NodePool], True),
    "storage": (Storage, False),
    "inference": (Inference, False),
    "monitoring": (Monitoring, False),
    "dr": (Dr, False),
    "repair": (Repair, False),
    "budget": (Budget, False),
    "tenancy": (Tenancy, False),
    "training": (Training, False),
}
