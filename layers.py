"""The stack's layers, each one function that registers its components (`__main__.py` calls them in order).

`prepare` reads the stack config once, validates it and checks it against the account, registering nothing but the
stack's AWS provider. Then, in order:
- `foundation`: network, EKS cluster, buckets (replicated to the DR peer from a primary);
- `compute`: spot/scale-in draining, one GPU node pool per `nodePools` entry, cluster-autoscaler;
- `observability`: Prometheus, alert rules, Alertmanager, Grafana. Before the platform: the GPU operator and the
  repair controller need its CRDs and its Prometheus;
- `platform`: GPU node repair, GPU operator, the controllers team objects depend on, team tenancy, the training
  jobs' data access, FSx for Lustre, the training queue;
- `serving`: Triton behind an NLB and this stack's half of the two regions' DNS record;
- `outputs`: the stack outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Dict, FrozenSet, List, Optional

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from components.account import read_account, read_deployer, read_named
from components.cluster import ClusterArgs, EksCluster
from components.monitoring import MonitoringArgs, MonitoringStack
from components.network import Network, NetworkArgs
from components.nodes.autoscaler import AutoscalerArgs, ClusterAutoscaler
from components.nodes.capacity_blocks import CapacityBlockExpiry, CapacityBlockExpiryArgs
from components.nodes.node_drain import NodeDrain, NodeDrainArgs
from components.nodes.node_repair import NodeRepair, NodeRepairArgs
from components.nodes.nodepool import ClusterConnection, GpuNodePool, NodePoolArgs, check_user_data_fits, read_ami_id
from components.platform.gpu_operator import GpuOperator, GpuOperatorArgs
from components.platform.tenancy import Tenancy, TenancyArgs
from components.platform.training import TrainingOperators, TrainingOperatorsArgs, TrainingQueue, TrainingQueueArgs
from components.serving.failover import Failover, FailoverArgs
from components.serving.inference import Inference, InferenceArgs, ModelRepository
from components.serving.lb_controller import LoadBalancerController, LoadBalancerControllerArgs
from components.storage.buckets import SecureBucket, stack_buckets
from components.storage.data_access import DataAccess, DataAccessArgs, JobBucket
from components.storage.lustre import Lustre, LustreArgs
from components.storage.replication import ReplicatedBucket, Replication, ReplicationArgs
from decisions.catalog import charts
from decisions.config import preflight
from decisions.config.deployer import AWS_PROVIDER_KEYS, AwsSettings, aws_settings
from decisions.config.errors import ConfigError, ConfigIssue, key_path
from decisions.config.model import NAMESPACE, SECRET_KEYS, SECTIONS
from decisions.config.validate import StackSpec, budget_issues, load_stack_spec, stack_warnings
from decisions.network.zones import AccountZones, ZoneLayout, reservation_table, resolve_layout, zone_table
from decisions.nodes import autoscaling, boot, capacity_blocks
from decisions.nodes import pools as pool_rules
from decisions.observability import alert_rules, dashboards, gpu_hours
from decisions.platform import kueue as kueue_rules, tenancy
from decisions.serving import failover, lb_controller
from decisions.serving import triton as triton_rules
from decisions.storage import buckets as bucket_rules
from decisions.storage import lustre as lustre_rules, replication
from plan.stackfile import read_peer_cidr


@dataclass(frozen=True)
class Stack:
    """What every layer reads: the validated spec, the account's answers, and the stack's AWS provider."""
    spec: StackSpec
    settings: AwsSettings
    webhook_url: Optional[str]
    aws_provider: aws.Provider
    account: AccountZones
    layout: ZoneLayout
    deployer_arn: str
    account_id: str
    partition: str
    dns_suffix: str                 # the partition's DNS suffix (service principals)
    reverse_dns_prefix: str         # the partition's reverse DNS prefix (interface endpoint service names)
    ami_id: str                     # the node image's AMI in the region (read_ami_id), read once in prepare

    @property
    def with_aws(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(providers={"aws": self.aws_provider})

    @property
    def launch_first(self) -> FrozenSet[str]:
        """The pools whose reservations, as read, have a spare slot: their replacements launch first."""
        return frozenset(p.name for p in self.spec.pools if pool_rules.launches_first(p, self.account.reservations))


@dataclass(frozen=True)
class Foundation:
    network: Network
    cluster: EksCluster
    buckets: Dict[str, SecureBucket]     # by purpose (decisions.storage.buckets.PURPOSES)
    with_cluster: pulumi.ResourceOptions


@dataclass(frozen=True)
class Platform:
    teams: Tenancy
    lb: Optional[LoadBalancerController]


def _project_config() -> dict:
    """Each declared `gpu-cloud:` key that the stack sets, through the public Config API (objects parsed). Secret
    keys are read raw only to check their form (decisions.config.validate.secret_issues); the program uses them as
    secrets."""
    config = pulumi.Config(NAMESPACE)
    values = {key: config.get(key) if key == "environment" else config.get_object(key) for key in SECTIONS}
    values.update({key: pulumi.runtime.get_config(f"{NAMESPACE}:{key}") for key in SECRET_KEYS})
    return {key: value for key, value in values.items() if value is not None}


def _aws_config() -> dict:
    """The stack's `aws:` settings gpu-cloud passes to its AWS provider."""
    config = pulumi.Config("aws")
    values = {key: config.get_object(key) if key in ("assumeRoles", "allowedAccountIds") else config.get(key)
              for key in AWS_PROVIDER_KEYS}
    return {key: value for key, value in values.items() if value is not None}


def prepare() -> Stack:
    """Read and validate the stack, then check it against the account; every mistake is one RunError listing them.

    The checks against the account run together and their mistakes are raised once: the transit gateway
    (read_account), the deployer's access entry, the roles and hosted zone the stack names (read_named), and the node
    image's AMI parameter need nothing from one another.
    What needs the account's answers waits for them: when read_account refuses (the transit gateway), the zones,
    quotas, endpoints, budget and Lustre checks do not run, and the Lustre zone is checked only once the zones
    resolved (resolve_layout). The config's own mistakes (load_stack_spec, the user-data size) come first, alone:
    nothing is read from the account for a config that does not parse."""
    try:
        # The kept release manifests are the files their pins name (decisions/catalog/charts.py read_manifest), or
        # nothing is registered: not a cluster whose operators fail halfway through the first `up`.
        for manifest in charts.load_charts().manifests:
            charts.manifest_objects(manifest)
    except charts.ManifestDigestError as error:
        raise pulumi.RunError(str(error)) from None
    try:
        keys = _project_config()
        settings = aws_settings(_aws_config())
        peer, peer_warning = read_peer_cidr(keys)
        spec = load_stack_spec(keys, stack=pulumi.get_stack(), region=settings.region,
                               project=pulumi.get_project(), peer_cidr=peer)
        check_user_data_fits(spec)
    except ConfigError as error:
        raise pulumi.RunError(str(error)) from None
    # One AWS provider for everything, reads included: it is the stack's `aws:` identity (an explicit provider
    # does not read `aws:` config itself), so ARNs name the right account and the deployer is who runs it.
    aws_provider = aws.Provider(
        "aws", region=spec.region, profile=settings.profile,
        assume_roles=[aws.ProviderAssumeRoleArgs(**settings.assume_role)] if settings.assume_role else None,
        allowed_account_ids=list(settings.allowed_account_ids) or None,
        default_tags=aws.ProviderDefaultTagsArgs(tags=spec.resource_tags))
    reads = pulumi.InvokeOptions(provider=aws_provider)
    # The account the stack deploys to and its partition: the named roles are checked against them.
    identity, partition = aws.get_caller_identity(opts=reads), aws.get_partition(opts=reads)
    pool_names = [pool.name for pool in spec.pools]   # errors name the pool beside its index
    issues: List[ConfigIssue] = []

    def gather(check):
        """The check's answer, or None with its mistakes added to the others."""
        try:
            return check()
        except ConfigError as error:
            issues.extend(error.issues)
            return None

    account = gather(lambda: read_account(spec, reads))   # raises only for the transit gateway
    layout, preflight_warnings = None, []
    if account is not None:
        layout = gather(lambda: resolve_layout(spec, account))   # zones, offerings, reservations, subnet room
        preflight_warnings = gather(lambda: preflight.check_account(spec, account)) or []  # quotas, endpoint zones
        issues.extend(budget_issues(spec, account.reservations))      # reservations at the size EC2 bills
        if layout is not None and spec.storage.lustre is not None:   # the file system's zone: the training pools'
            issues.extend(ConfigIssue(key_path(NAMESPACE, parts), message) for parts, message in
                          lustre_rules.zone_issues(spec.pools, layout.pool_zones, spec.storage.lustre.efa))
    deployer_arn = read_deployer(reads)
    # The deployer has its own admin entry; EKS allows one entry per role, so it cannot also be a team's.
    issues.extend(ConfigIssue(f"{NAMESPACE}:tenancy.teams.{team}.roleArns", f"{deployer_arn} runs Pulumi and so "
                              "has a cluster-admin access entry; give the team another role")
                  for team, access in spec.tenancy.teams if deployer_arn in access.role_arns)
    # Every admin, team and publisher role, and the inference record's hosted zone: EKS, IAM and Route 53 refuse
    # them only after the cluster exists.
    named_warnings = gather(lambda: read_named(spec, identity.account_id, partition.partition, reads)) or []
    # The nodes' AMI, read once for every pool: a release without its parameter in the region fails here, before the
    # VPC and the cluster are registered, not halfway through `pulumi up`.
    ami_id = gather(lambda: _read_ami(spec, reads))
    if issues:
        raise pulumi.RunError(str(ConfigError(issues, pool_names=pool_names)))
    for warning in ([peer_warning] if peer_warning else []) + stack_warnings(spec, date.today()) + \
            list(layout.warnings) + preflight_warnings + named_warnings:
        pulumi.log.warn(warning)
    return Stack(spec=spec, settings=settings, webhook_url=keys.get("alertWebhookUrl") or None,
                 aws_provider=aws_provider, account=account, layout=layout, deployer_arn=deployer_arn,
                 account_id=identity.account_id, partition=partition.partition,
                 dns_suffix=partition.dns_suffix, reverse_dns_prefix=partition.reverse_dns_prefix, ami_id=ami_id)


def _read_ami(spec: StackSpec, reads: pulumi.InvokeOptions) -> str:
    """The node image's AMI in the stack's region (read_ami_id); a parameter SSM does not have is a config mistake."""
    try:
        return read_ami_id(spec.node_image, reads)
    except Exception as error:  # an invoke error: no such parameter in this region, or not allowed to read it
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError([ConfigIssue(f"{NAMESPACE}:gpuDriver", f"the AMI of release {spec.node_image.ami_name} "
                                       f"could not be read from SSM ({spec.node_image.ssm_parameter}) in "
                                       f"{spec.region}: {first_line}")]) from None


def foundation(stack: Stack) -> Foundation:
    """Network, EKS cluster and buckets; a DR primary replicates checkpoints and models to its peer."""
    spec, layout, retention = stack.spec, stack.layout, stack.spec.log_retention_days
    tgw = spec.network.transit_gateway
    network = Network("network", NetworkArgs(
        cidr=spec.network.cidr, zones=layout.zones, nat_gateways=spec.network.nat_gateways,
        cluster_name=spec.cluster_name, flow_log_retention_days=retention, region=spec.region,
        account_id=stack.account_id, partition=stack.partition, dns_suffix=stack.dns_suffix,
        reverse_dns_prefix=stack.reverse_dns_prefix, transit_gateway_id=tgw.id if tgw else None,
        transit_routes=tgw.routes if tgw else (),
        # Triton's repository outside the stack: read through the S3 endpoint, which refuses other accounts' buckets
        readable_bucket_arns=(triton_rules.repository_bucket_arn(spec.inference.triton.model_repository,
                                                                 stack.partition),)
        if spec.inference.triton.enabled and spec.inference.triton.model_repository else ()), opts=stack.with_aws)
    cluster = EksCluster("cluster", ClusterArgs(
        name=spec.cluster_name, kubernetes_version=spec.cluster.kubernetes_version,
        subnet_ids=list(network.private_subnet_ids.values()), public_access_cidrs=spec.cluster.public_access_cidrs,
        admin_role_arns=spec.cluster.admin_role_arns, log_retention_days=retention, deployer_arn=stack.deployer_arn,
        private_access_cidrs=spec.cluster.private_access_cidrs,
        private_access_security_group_ids=spec.cluster.private_access_security_group_ids,
        token_args=tuple(stack.settings.token_args()), deployer_network=network.transit_routes), opts=stack.with_aws)
    buckets = stack_buckets(project=spec.project, stack=spec.stack, account_id=stack.account_id,
                            partition=stack.partition, region=spec.region, log_retention_days=retention,
                            force_destroy=spec.environment == "dev", opts=stack.with_aws)
    # A primary replicates checkpoints and models into its DR peer's buckets, which the peer stack exports.
    if spec.dr.role == "primary":
        peer = pulumi.StackReference(replication.PEER_REFERENCE, stack_name=spec.dr.peer_stack)
        peer_buckets = {purpose: peer.get_output("buckets").apply(
            lambda exports, purpose=purpose: replication.peer_bucket(exports, spec.dr.peer_stack, purpose))
            for purpose in bucket_rules.REPLICATED}
        Replication("replication", ReplicationArgs(buckets=[
            ReplicatedBucket(purpose=purpose, bucket_id=buckets[purpose].bucket.id,
                             bucket_arn=buckets[purpose].bucket_arn, key_arn=buckets[purpose].key_arn,
                             versioning=buckets[purpose].versioning, target_bucket_arn=peer_buckets[purpose]["arn"],
                             target_key_arn=peer_buckets[purpose]["keyArn"])
            for purpose in bucket_rules.REPLICATED]), opts=stack.with_aws)
    with_cluster = pulumi.ResourceOptions(providers={"aws": stack.aws_provider, "kubernetes": cluster.kube_provider})
    return Foundation(network=network, cluster=cluster, buckets=buckets, with_cluster=with_cluster)


def compute(stack: Stack, base: Foundation) -> List[GpuNodePool]:
    """The drain handler, then one GPU node pool per `nodePools` entry, then cluster-autoscaler over them."""
    spec, cluster, name = stack.spec, base.cluster, stack.spec.cluster_name
    # Before the pools, so that deleting a pool (or the stack) still has the drain handler for its last nodes.
    asg_names = tuple(pool_rules.asg_name(name, pool.name) for pool in spec.pools)
    asg_arn_patterns = tuple(pool_rules.asg_arn_pattern(stack.partition, spec.region, stack.account_id, asg)
                             for asg in asg_names)
    node_drain = NodeDrain("node-drain", NodeDrainArgs(
        cluster_name=cluster.cluster_name, region=spec.region, asg_names=asg_names, asg_arn_patterns=asg_arn_patterns),
        opts=base.with_cluster)
    connection = ClusterConnection(
        name=cluster.cluster_name, endpoint=cluster.endpoint, certificate_authority=cluster.certificate_authority,
        service_cidr=cluster.service_cidr, security_group_id=cluster.cluster_security_group_id)
    artifacts = base.buckets["artifacts"]
    node_pools = [GpuNodePool(pool.name, NodePoolArgs(
        pool=pool, cluster_name=name, cluster=connection, region=spec.region, account_id=stack.account_id,
        partition=stack.partition, dns_suffix=stack.dns_suffix, vpc_id=base.network.vpc_id,
        subnet_ids=base.network.private_subnet_ids, zones=stack.layout.pool_zones[pool.name], image=spec.node_image, ami_id=stack.ami_id,
        nvme_scratch=spec.storage.nvme_scratch, max_temp_c=spec.monitoring.alerts.gpu_temp_c, catalog=spec.catalog,
        artifact_bucket=artifacts.bucket_name, artifact_key_arn=artifacts.key_arn,
        lustre_client=lustre_rules.mounts_lustre(pool, spec.storage.lustre is not None),
        instance_tags=spec.resource_tags, launch_first=pool.name in stack.launch_first,
        depends_on=[cluster.addons["vpc-cni"], node_drain]), opts=stack.with_aws)
        for pool in spec.pools]
    priorities: Dict[int, list] = {}
    for pool, component in zip(spec.pools, node_pools):
        priorities.setdefault(pool_rules.autoscaler_priority(pool), []).append(component.asg_name)
    ClusterAutoscaler("autoscaler", AutoscalerArgs(
        cluster_name=cluster.cluster_name, cluster_name_plain=name, region=spec.region,
        kubernetes_version=spec.cluster.kubernetes_version,
        priorities={weight: tuple(names) for weight, names in priorities.items()},
        max_node_provision_time=boot.max_node_provision_time(spec.node_image.source),
        asg_arn_patterns=asg_arn_patterns,
        nodegroup_arns=autoscaling.nodegroup_arn_pattern(stack.partition, spec.region, stack.account_id, name)),
        opts=base.with_cluster)
    return node_pools


def observability(stack: Stack, base: Foundation) -> MonitoringStack:
    """Prometheus (scraping the DCGM exporter, node-exporter with the verifier's textfile, the termination handler),
    the GPU alert rules, Alertmanager to the stack's webhook, and Grafana with gpu-cloud's dashboards."""
    spec, triton = stack.spec, stack.spec.inference.triton
    return MonitoringStack("monitoring", MonitoringArgs(
        settings=spec.monitoring, dashboards=dashboards.dashboards(), node_exporter_args=alert_rules.NODE_EXPORTER_ARGS,
        rule_groups=alert_rules.rule_groups(spec.monitoring.alerts, spec.pools, spec.catalog,
                                            triton.target_queue_ms if triton.enabled else None)
        + [gpu_hours.ledger_group(spec.pools, spec.catalog, stack.account.reservations)],
        webhook_url=pulumi.Output.secret(stack.webhook_url) if stack.webhook_url else None,
        depends_on=[base.cluster.addons["aws-ebs-csi-driver"]]), opts=base.with_cluster)


def platform(stack: Stack, base: Foundation, monitoring: MonitoringStack) -> Platform:
    """GPU node repair, the GPU operator, the controllers team objects carry finalizers of, team tenancy, the
    training jobs' bucket access, FSx for Lustre and the training queue."""
    spec, cluster, buckets, opts = stack.spec, base.cluster, base.buckets, base.with_cluster
    artifacts, triton = buckets["artifacts"], spec.inference.triton
    # Capacity blocks close before EC2 takes them back: the repair controller does it, EC2's warning its backstop.
    blocks = capacity_blocks.blocks(spec.pools, stack.account.reservations)
    if blocks:
        CapacityBlockExpiry("capacity-block-expiry", CapacityBlockExpiryArgs(
            cluster_name_plain=spec.cluster_name, blocks=blocks), opts=opts)
    # Sick GPU nodes rebooted or replaced through their groups, within each pool's budget; a pool whose launches
    # keep failing the gate braked. After monitoring: it asks Prometheus what the nodes' checkers say.
    NodeRepair("node-repair", NodeRepairArgs(
        cluster_name=cluster.cluster_name, cluster_name_plain=spec.cluster_name, region=spec.region,
        partition=stack.partition, account_id=stack.account_id, pools=spec.pools, dry_run=spec.repair.dry_run,
        max_per_pool_per_hour=spec.repair.max_per_pool_per_hour, reports_bucket=artifacts.bucket_name,
        reports_bucket_arn=artifacts.bucket_arn, reports_key_arn=artifacts.key_arn, monitoring=monitoring.release,
        launch_first=stack.launch_first, capacity_blocks=blocks), opts=opts)
    # After monitoring: the operator makes the DCGM exporter's ServiceMonitor only once that CRD exists.
    GpuOperator("gpu-operator", GpuOperatorArgs.for_pools(spec.pools, after=[monitoring.release]), opts=opts)
    # Kueue (and the MPI Operator) where the stack queues training, the load balancer controller where it serves:
    # before the team namespaces, whose objects carry their finalizers.
    queued = kueue_rules.flavors(spec.pools, spec.catalog)   # none without a training or general pool
    operators = TrainingOperators("training-operators", TrainingOperatorsArgs(driver_source=spec.node_image.source),
                                  opts=opts) if queued else None
    # Kueue's flavors and ClusterQueue, once Kueue answers, before the team namespaces: a destroy deletes the training
    # namespace's Workloads before the ClusterQueue they hold (components/platform/training.py TrainingQueue).
    queue = TrainingQueue("training", TrainingQueueArgs.for_pools(
        spec.pools, spec.catalog, operators=operators, nvlink_schedule=spec.training.nvlink_check_schedule,
        across_node_schedule=spec.training.across_node_check_schedule), opts=opts) if operators else None
    lb = LoadBalancerController("lb-controller", LoadBalancerControllerArgs(
        cluster_name=cluster.cluster_name, cluster_name_plain=spec.cluster_name, region=spec.region,
        partition=stack.partition, account_id=stack.account_id, vpc_id=base.network.vpc_id, scheme=triton.scheme),
        opts=opts) if triton.enabled else None
    teams = Tenancy("tenancy", TenancyArgs(
        cluster_name=cluster.cluster_name, vpc_cidr=spec.network.cidr, gpu_quotas=tenancy.gpu_quotas(spec.pools),
        cpu_memory_quotas=tenancy.cpu_memory_quotas(spec.pools),
        container_defaults=tenancy.team_container_defaults(spec.pools),
        team_role_arns={team: access.role_arns for team, access in spec.tenancy.teams},
        admin_principal_arns=(*spec.cluster.admin_role_arns, stack.deployer_arn),
        controllers=(*((operators.release, queue.cluster_queue) if queue else ()), *((lb.release,) if lb else ()))),
        opts=opts)
    training_namespace = teams.namespaces[tenancy.TRAINING_NAMESPACE].metadata.name
    # The `trainer` service account's Pod Identity role: the data buckets, models read-only.
    DataAccess("training-data", DataAccessArgs(
        cluster_name=cluster.cluster_name, namespace=training_namespace, namespace_name=tenancy.TRAINING_NAMESPACE,
        region=spec.region, buckets=[JobBucket(arn=buckets[purpose].bucket_arn, key_arn=buckets[purpose].key_arn,
                                               writable=purpose not in bucket_rules.JOB_READ_ONLY)
                                     for purpose in bucket_rules.JOB_DATA]), opts=opts)
    if spec.storage.lustre is not None:
        _lustre(stack, base, teams.namespaces[tenancy.TRAINING_NAMESPACE])
    if queue is not None:       # the training namespace's LocalQueues and NCCL acceptance checks
        queue.serve(training_namespace)
    return Platform(teams=teams, lb=lb)


def _lustre(stack: Stack, base: Foundation, training_namespace: kubernetes.core.v1.Namespace) -> None:
    """FSx for Lustre in the training pools' zone, its S3 association, the CSI driver, and a claim in the training
    namespace (which a destroy deletes with the namespace, and the volume with the cluster)."""
    spec, lustre = stack.spec, stack.spec.storage.lustre
    zone = lustre_rules.lustre_zone(spec.pools, stack.layout.pool_zones, stack.layout.zones)
    fsx = Lustre("lustre", LustreArgs(
        cluster_name=spec.cluster_name, capacity_gib=lustre.capacity_gib,
        throughput_per_tib=lustre.throughput_per_tib, efa=lustre.efa, import_path=lustre.import_path,
        datasets_bucket=base.buckets[bucket_rules.DATASETS].bucket_name, vpc_id=base.network.vpc_id,
        subnet_id=base.network.private_subnet_ids[zone.zone_id],
        client_security_group_ids=[base.cluster.cluster_security_group_id], region=spec.region,
        account_id=stack.account_id, partition=stack.partition, dns_suffix=stack.dns_suffix,
        log_retention_days=spec.log_retention_days, namespace=training_namespace,
        namespace_name=tenancy.TRAINING_NAMESPACE, cluster=base.cluster.cluster), opts=base.with_cluster)
    pulumi.export("lustre", {"fileSystemId": fsx.file_system_id, "dnsName": fsx.dns_name, "mountName": fsx.mount_name,
                             "pvcName": fsx.pvc_name, "zoneId": zone.zone_id})


def serving(stack: Stack, base: Foundation, team_platform: Platform, monitoring: MonitoringStack) -> None:
    """Triton on its pool, from the stack's models bucket unless the stack names another repository, and this
    stack's half of the two regions' record for dr.domain, with a health check on Triton's readiness."""
    spec, triton = stack.spec, stack.spec.inference.triton
    if not triton.enabled:
        return
    models = base.buckets[bucket_rules.MODELS]
    repository = (ModelRepository(uri=triton.model_repository, key_arn=None,
                                  bucket_arn=triton_rules.repository_bucket_arn(triton.model_repository,
                                                                                stack.partition))
                  if triton.model_repository else
                  ModelRepository(uri=pulumi.Output.concat("s3://", models.bucket_name, "/", triton_rules.NAME),
                                  bucket_arn=models.bucket_arn, key_arn=models.key_arn, own_prefix=triton_rules.NAME))
    inference = Inference("inference", InferenceArgs(
        cluster_name=base.cluster.cluster_name, region=spec.region,
        namespace=team_platform.teams.namespaces[tenancy.INFERENCE_NAMESPACE].metadata.name,
        namespace_name=tenancy.INFERENCE_NAMESPACE, pool=next(p for p in spec.pools if p.spec.name == triton.pool),
        catalog=spec.catalog, settings=triton, repository=repository, load_balancer_tags=spec.resource_tags,
        load_balancer_source_ranges=lb_controller.load_balancer_source_ranges(triton.scheme, spec.network.cidr,
                                                                              spec.dr.client_cidrs),
        monitoring=monitoring, lb_controller=team_platform.lb.release), opts=base.with_cluster)
    pulumi.export("inferenceEndpoint", inference.endpoint)
    if inference.publisher is not None:
        pulumi.export("modelPublisherRoleArn", inference.publisher.arn)
    if spec.dr.role in ("primary", "secondary"):
        dns = Failover("inference-dns", FailoverArgs(
            domain=spec.dr.domain, hosted_zone_id=spec.dr.hosted_zone_id, stack=spec.stack, region=spec.region,
            policy=failover.record_policy(spec.dr.role, spec.dr.routing, spec.region), scheme=triton.scheme,
            endpoint=inference.endpoint, load_balancer_tags=lb_controller.controller_load_balancer_tags(
                spec.cluster_name, tenancy.INFERENCE_NAMESPACE, triton_rules.NAME)), opts=stack.with_aws)
        pulumi.export("inferenceDns", {"fqdn": dns.record.fqdn, "routing": spec.dr.routing})


def outputs(stack: Stack, base: Foundation, node_pools: List[GpuNodePool]) -> None:
    """The stack outputs operators and the DR peer read."""
    spec, cluster, buckets = stack.spec, base.cluster, base.buckets
    pulumi.export("region", spec.region)
    pulumi.export("clusterName", cluster.cluster_name)
    pulumi.export("clusterEndpoint", cluster.endpoint)
    # For operators: `pulumi stack output kubeconfig > kubeconfig.json`. It holds no credential (it runs
    # `aws eks get-token` as the caller), so it is exported in the clear.
    pulumi.export("kubeconfig", pulumi.Output.unsecret(cluster.kubeconfig))
    pulumi.export("vpcId", base.network.vpc_id)
    pulumi.export("zones", zone_table(spec, stack.layout))
    # Each reservation and capacity block as the account reports it: the size and term the cost section bills.
    pulumi.export("reservations", reservation_table(stack.account.reservations))
    pulumi.export("nodePools", {p.asg_name: p.asg.arn for p in node_pools})
    pulumi.export("artifactBucket", buckets["artifacts"].bucket_name)
    # What a DR primary reads from this stack (and what jobs and Triton use): every bucket with its key.
    pulumi.export("buckets", {purpose: {"name": b.bucket_name, "arn": b.bucket_arn, "keyArn": b.key_arn}
                              for purpose, b in buckets.items()})
