"""gpu-cloud: one regional GPU cluster per stack.

Reads the stack config once, validates all of it and checks it against the account (through the stack's
own AWS provider, the only thing registered first), then composes:
network -> EKS cluster -> buckets (logs, datasets, checkpoints, models, node artifacts; replicated to the DR peer
from a primary) -> spot/scale-in draining -> one GPU node pool per `nodePools` entry -> cluster-autoscaler ->
monitoring (Prometheus, alert rules, dashboards) -> GPU node repair -> GPU operator (and EFA device plugin) -> team
tenancy -> FSx for
Lustre -> training queue (Kueue, MPI Operator) -> Triton behind an NLB, scaled on its queue time -> its half of the
two regions' DNS record.
"""
from datetime import date

import pulumi
import pulumi_aws as aws

from components.account import read_account, read_deployer
from components.autoscaler import AutoscalerArgs, ClusterAutoscaler
from components.buckets import stack_buckets
from components.cluster import ClusterArgs, EksCluster
from components.data_access import DataAccess, DataAccessArgs, JobBucket
from components.gpu_operator import GpuOperator, GpuOperatorArgs
from components.failover import Failover, FailoverArgs
from components.inference import Inference, InferenceArgs, ModelRepository
from components.lustre import Lustre, LustreArgs
from components.monitoring import MonitoringArgs, MonitoringStack
from components.network import Network, NetworkArgs
from components.node_drain import NodeDrain, NodeDrainArgs
from components.node_repair import NodeRepair, NodeRepairArgs
from components.replication import ReplicatedBucket, Replication, ReplicationArgs
from components.tenancy import Tenancy, TenancyArgs
from components.lb_controller import LoadBalancerController, LoadBalancerControllerArgs
from components.training import TrainingOperators, TrainingOperatorsArgs, TrainingQueue, TrainingQueueArgs
from components.nodepool import ClusterConnection, GpuNodePool, NodePoolArgs, check_user_data_fits, read_ami_id
from spec import alert_rules, autoscaling, boot, buckets as bucket_rules, dashboards, failover, lb_controller, replication
from spec import kueue as kueue_rules, tenancy, triton as triton_rules
from spec import lustre as lustre_rules
from spec import preflight
from spec import pools as pool_rules
from spec.errors import ConfigError, ConfigIssue, key_path
from plan.stackfile import peer_cidr
from spec.deployer import AWS_PROVIDER_KEYS, aws_settings
from spec.model import SECRET_KEYS, SECTIONS
from spec.validate import NAMESPACE, budget_issues, load_stack_spec, stack_warnings
from spec.zones import reservation_table, resolve_layout, zone_table


def project_config() -> dict:
    """Each declared `gpu-cloud:` key that the stack sets, through the public Config API (objects parsed). Secret
    keys are read raw only to check their form (spec.validate.secret_issues); the program uses them as secrets."""
    config = pulumi.Config(NAMESPACE)
    values = {key: config.get(key) if key == "environment" else config.get_object(key) for key in SECTIONS}
    values.update({key: pulumi.runtime.get_config(f"{NAMESPACE}:{key}") for key in SECRET_KEYS})
    return {key: value for key, value in values.items() if value is not None}


def aws_config() -> dict:
    """The stack's `aws:` settings gpu-cloud passes to its AWS provider."""
    config = pulumi.Config("aws")
    values = {key: config.get_object(key) if key in ("assumeRoles", "allowedAccountIds") else config.get(key)
              for key in AWS_PROVIDER_KEYS}
    return {key: value for key, value in values.items() if value is not None}


try:
    keys = project_config()
    settings = aws_settings(aws_config())
    spec = load_stack_spec(keys, stack=pulumi.get_stack(), region=settings.region,
                           project=pulumi.get_project(), peer_cidr=peer_cidr(keys))
    check_user_data_fits(spec)
    # One AWS provider for everything, reads included: it is the stack's `aws:` identity (an explicit provider
    # does not read `aws:` config itself), so ARNs name the right account and the deployer is who runs it.
    aws_provider = aws.Provider(
        "aws", region=spec.region, profile=settings.profile,
        assume_roles=[aws.ProviderAssumeRoleArgs(**settings.assume_role)] if settings.assume_role else None,
        allowed_account_ids=list(settings.allowed_account_ids) or None,
        default_tags=aws.ProviderDefaultTagsArgs(tags=spec.resource_tags))
    reads = pulumi.InvokeOptions(provider=aws_provider)
    pool_names = [pool.name for pool in spec.pools]   # errors name the pool beside its index
    account = read_account(spec, reads)
    layout = resolve_layout(spec, account)   # zones, offerings, reservations, subnet room
    preflight_warnings = preflight.check_account(spec, account)   # vCPU quotas, interface endpoint zones
    over_budget = budget_issues(spec, account.reservations)      # reservations at the size EC2 bills (spec/cost.py)
    if over_budget:
        raise ConfigError(over_budget, pool_names=pool_names)
    if spec.storage.lustre is not None:   # the file system's zone: where the training pools are
        zone_problems = lustre_rules.zone_issues(spec.pools, layout.pool_zones, spec.storage.lustre.efa)
        if zone_problems:
            raise ConfigError([ConfigIssue(key_path(NAMESPACE, parts), message) for parts, message in zone_problems],
                              pool_names=pool_names)
    deployer_arn = read_deployer(reads)
    # The deployer has its own admin entry; EKS allows one entry per role, so it cannot also be a team's.
    teams_with_deployer = [team for team, access in spec.tenancy.teams if deployer_arn in access.role_arns]
    if teams_with_deployer:
        raise ConfigError([ConfigIssue(f"{NAMESPACE}:tenancy.teams.{team}.roleArns", f"{deployer_arn} runs Pulumi "
                                       "and so has a cluster-admin access entry; give the team another role")
                           for team in teams_with_deployer])
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None
for warning in stack_warnings(spec, date.today()) + list(layout.warnings) + preflight_warnings:
    pulumi.log.warn(warning)

cluster_name = spec.cluster_name
with_aws = pulumi.ResourceOptions(providers={"aws": aws_provider})
log_retention = spec.log_retention_days    # every log group and the access logs (monitoring.logRetentionDays)
account_id = aws.get_caller_identity(opts=reads).account_id
partition = aws.get_partition(opts=reads).partition

tgw = spec.network.transit_gateway
network = Network("network", NetworkArgs(
    cidr=spec.network.cidr, zones=layout.zones, nat_gateways=spec.network.nat_gateways, cluster_name=cluster_name,
    flow_log_retention_days=log_retention, transit_gateway_id=tgw.id if tgw else None,
    transit_routes=tgw.routes if tgw else ()), opts=with_aws)

cluster = EksCluster("cluster", ClusterArgs(
    name=cluster_name, kubernetes_version=spec.cluster.kubernetes_version,
    subnet_ids=list(network.private_subnet_ids.values()), public_access_cidrs=spec.cluster.public_access_cidrs,
    admin_role_arns=spec.cluster.admin_role_arns, log_retention_days=log_retention, deployer_arn=deployer_arn,
    private_access_cidrs=spec.cluster.private_access_cidrs,
    private_access_security_group_ids=spec.cluster.private_access_security_group_ids,
    token_args=tuple(settings.token_args()), deployer_network=network.transit_routes), opts=with_aws)
with_cluster = pulumi.ResourceOptions(providers={"aws": aws_provider, "kubernetes": cluster.kube_provider})

buckets = stack_buckets(project=spec.project, stack=spec.stack, account_id=account_id, partition=partition,
                        region=spec.region, log_retention_days=log_retention,
                        force_destroy=spec.environment == "dev", opts=with_aws)
# A primary replicates checkpoints and models into its DR peer's buckets, which the peer stack exports.
if spec.dr.role == "primary":
    peer = pulumi.StackReference("dr-peer", stack_name=spec.dr.peer_stack)
    peer_buckets = {purpose: peer.get_output("buckets").apply(
        lambda exports, purpose=purpose: replication.peer_bucket(exports, spec.dr.peer_stack, purpose))
        for purpose in bucket_rules.REPLICATED}
    Replication("replication", ReplicationArgs(buckets=[
        ReplicatedBucket(purpose=purpose, bucket_id=buckets[purpose].bucket.id, bucket_arn=buckets[purpose].bucket_arn,
                         key_arn=buckets[purpose].key_arn, versioning=buckets[purpose].versioning,
                         target_bucket_arn=peer_buckets[purpose]["arn"], target_key_arn=peer_buckets[purpose]["keyArn"])
        for purpose in bucket_rules.REPLICATED]), opts=with_aws)

# Before the pools, so that deleting a pool (or the stack) still has the drain handler for its last nodes.
asg_names = tuple(pool_rules.asg_name(cluster_name, pool.name) for pool in spec.pools)
asg_arn_patterns = tuple(pool_rules.asg_arn_pattern(partition, spec.region, account_id, asg) for asg in asg_names)
node_drain = NodeDrain("node-drain", NodeDrainArgs(
    cluster_name=cluster.cluster_name, region=spec.region, asg_names=asg_names, asg_arn_patterns=asg_arn_patterns),
    opts=with_cluster)

ami_id = read_ami_id(spec.node_image, reads)
node_pools = [GpuNodePool(pool.name, NodePoolArgs(
    pool=pool, cluster_name=cluster_name,
    cluster=ClusterConnection(name=cluster.cluster_name, endpoint=cluster.endpoint,
                              certificate_authority=cluster.certificate_authority,
                              service_cidr=cluster.service_cidr, security_group_id=cluster.cluster_security_group_id),
    region=spec.region, account_id=account_id, partition=partition,
    vpc_id=network.vpc_id, subnet_ids=network.private_subnet_ids, zones=layout.pool_zones[pool.name],
    image=spec.node_image, ami_id=ami_id,
    nvme_scratch=spec.storage.nvme_scratch, max_temp_c=spec.monitoring.alerts.gpu_temp_c, catalog=spec.catalog,
    artifact_bucket=buckets["artifacts"].bucket_name, artifact_key_arn=buckets["artifacts"].key_arn,
    lustre_client=lustre_rules.mounts_lustre(pool, spec.storage.lustre is not None),
    instance_tags=spec.resource_tags,
    depends_on=[cluster.addons["vpc-cni"], node_drain]), opts=with_aws) for pool in spec.pools]

priorities = {}
for pool, component in zip(spec.pools, node_pools):
    priorities.setdefault(pool_rules.autoscaler_priority(pool), []).append(component.asg_name)
ClusterAutoscaler("autoscaler", AutoscalerArgs(
    cluster_name=cluster.cluster_name, cluster_name_plain=cluster_name, region=spec.region,
    kubernetes_version=spec.cluster.kubernetes_version,
    priorities={weight: tuple(names) for weight, names in priorities.items()},
    max_node_provision_time=boot.max_node_provision_time(spec.node_image.source), asg_arn_patterns=asg_arn_patterns,
    nodegroup_arns=autoscaling.nodegroup_arn_pattern(partition, spec.region, account_id, cluster_name)),
    opts=with_cluster)

# Prometheus (scraping the DCGM exporter, node-exporter with the verifier's textfile, the termination handler),
# the GPU alert rules, Alertmanager to the stack's webhook, and Grafana with gpu-cloud's dashboards.
triton = spec.inference.triton
webhook_url = keys.get("alertWebhookUrl") or None
monitoring = MonitoringStack("monitoring", MonitoringArgs(
    settings=spec.monitoring, dashboards=dashboards.dashboards(), node_exporter_args=alert_rules.NODE_EXPORTER_ARGS,
    rule_groups=alert_rules.rule_groups(spec.monitoring.alerts, spec.pools, spec.catalog,
                                        triton.target_queue_ms if triton.enabled else None),
    webhook_url=pulumi.Output.secret(webhook_url) if webhook_url else None,
    depends_on=[cluster.addons["aws-ebs-csi-driver"]]), opts=with_cluster)

# Sick GPU nodes rebooted or replaced through their groups, within each pool's budget; the gate's verdicts as metrics;
# a pool whose launches keep failing the gate braked. After monitoring: it asks Prometheus what the nodes' checkers say.
NodeRepair("node-repair", NodeRepairArgs(
    cluster_name=cluster.cluster_name, cluster_name_plain=cluster_name, region=spec.region, partition=partition,
    account_id=account_id, pools=spec.pools, dry_run=spec.repair.dry_run,
    max_per_pool_per_hour=spec.repair.max_per_pool_per_hour, reports_bucket=buckets["artifacts"].bucket_name,
    reports_bucket_arn=buckets["artifacts"].bucket_arn, reports_key_arn=buckets["artifacts"].key_arn,
    monitoring=monitoring.release), opts=with_cluster)

# The GPU platform: NVIDIA GPU operator (device plugin with per-pool time-slicing, MIG manager, DCGM exporter,
# validator) and, when some pool has EFA, the EFA device plugin. After monitoring: the operator makes the DCGM
# exporter's ServiceMonitor only once that CRD exists.
GpuOperator("gpu-operator", GpuOperatorArgs.for_pools(spec.pools, after=[monitoring.release]), opts=with_cluster)

# The controllers whose finalizers the teams' objects carry: Kueue (and the MPI Operator) where the stack queues
# training, the AWS Load Balancer Controller where it serves. Before the team namespaces, which depend on them.
training_pools = kueue_rules.flavors(spec.pools, spec.catalog)   # none without a training or general pool
operators = TrainingOperators("training-operators", TrainingOperatorsArgs(driver_source=spec.node_image.source),
                              opts=with_cluster) if training_pools else None
lb = LoadBalancerController("lb-controller", LoadBalancerControllerArgs(
    cluster_name=cluster.cluster_name, cluster_name_plain=cluster_name, region=spec.region, partition=partition,
    account_id=account_id, vpc_id=network.vpc_id, scheme=triton.scheme), opts=with_cluster) if triton.enabled else None

# Team namespaces, GPU quotas, RBAC, network policies and the teams' access entries.
teams = Tenancy("tenancy", TenancyArgs(
    cluster_name=cluster.cluster_name, vpc_cidr=spec.network.cidr, gpu_quotas=tenancy.gpu_quotas(spec.pools),
    cpu_memory_quotas=tenancy.cpu_memory_quotas(spec.pools),
    container_defaults=tenancy.team_container_defaults(spec.pools),
    team_role_arns={team: access.role_arns for team, access in spec.tenancy.teams},
    admin_principal_arns=(*spec.cluster.admin_role_arns, deployer_arn),
    controllers=tuple(c.release for c in (operators, lb) if c is not None)), opts=with_cluster)

# Training jobs' own access to the data buckets (the models bucket read-only): the `trainer` service account
# and its Pod Identity role.
DataAccess("training-data", DataAccessArgs(
    cluster_name=cluster.cluster_name, namespace=teams.namespaces[tenancy.TRAINING_NAMESPACE].metadata.name,
    namespace_name=tenancy.TRAINING_NAMESPACE, region=spec.region,
    buckets=[JobBucket(arn=buckets[purpose].bucket_arn, key_arn=buckets[purpose].key_arn,
                       writable=purpose not in bucket_rules.JOB_READ_ONLY)
             for purpose in bucket_rules.JOB_DATA]), opts=with_cluster)

# Shared training data: FSx for Lustre in the training pools' zone, its S3 association, the CSI driver, and a
# claim in the training namespace.
if spec.storage.lustre is not None:
    lustre_zone = lustre_rules.lustre_zone(spec.pools, layout.pool_zones, layout.zones)
    fsx = Lustre("lustre", LustreArgs(
        cluster_name=cluster_name, environment=spec.environment, capacity_gib=spec.storage.lustre.capacity_gib,
        throughput_per_tib=spec.storage.lustre.throughput_per_tib, efa=spec.storage.lustre.efa,
        import_path=spec.storage.lustre.import_path, datasets_bucket=buckets[bucket_rules.DATASETS].bucket_name,
        vpc_id=network.vpc_id,
        subnet_id=network.private_subnet_ids[lustre_zone.zone_id],
        client_security_group_ids=[cluster.cluster_security_group_id], region=spec.region, account_id=account_id,
        partition=partition, log_retention_days=log_retention,
        namespace=teams.namespaces[tenancy.TRAINING_NAMESPACE].metadata.name), opts=with_cluster)
    pulumi.export("lustre", {"fileSystemId": fsx.file_system_id, "dnsName": fsx.dns_name, "mountName": fsx.mount_name,
                             "pvcName": fsx.pvc_name, "zoneId": lustre_zone.zone_id})

# The training queue: flavors per capacity type (paid-for, spot, on-demand) and the queues, once Kueue answers.
if operators is not None:   # none without a training or general pool (a warning says so)
    TrainingQueue("training", TrainingQueueArgs.for_pools(
        spec.pools, spec.catalog, operators=operators, nvlink_schedule=spec.training.nvlink_check_schedule,
        across_node_schedule=spec.training.across_node_check_schedule,
        training_namespace=teams.namespaces[tenancy.TRAINING_NAMESPACE].metadata.name), opts=with_cluster)

# Inference: Triton on its pool, from the stack's models bucket unless the stack names another repository.
if triton.enabled:
    models = buckets[bucket_rules.MODELS]
    repository = (ModelRepository(uri=triton.model_repository, key_arn=None,
                                  bucket_arn=triton_rules.repository_bucket_arn(triton.model_repository, partition))
                  if triton.model_repository else
                  ModelRepository(uri=pulumi.Output.concat("s3://", models.bucket_name, "/", triton_rules.NAME),
                                  bucket_arn=models.bucket_arn, key_arn=models.key_arn,
                                  own_prefix=triton_rules.NAME))
    inference = Inference("inference", InferenceArgs(
        cluster_name=cluster.cluster_name, region=spec.region,
        namespace=teams.namespaces[tenancy.INFERENCE_NAMESPACE].metadata.name,
        namespace_name=tenancy.INFERENCE_NAMESPACE, pool=next(p for p in spec.pools if p.spec.name == triton.pool),
        catalog=spec.catalog, settings=triton, repository=repository, load_balancer_tags=spec.resource_tags,
        monitoring=monitoring, lb_controller=lb.release), opts=with_cluster)
    pulumi.export("inferenceEndpoint", inference.endpoint)
    if inference.publisher is not None:
        pulumi.export("modelPublisherRoleArn", inference.publisher.arn)
    # This stack's half of the two regions' record for dr.domain, with a health check on Triton's readiness.
    if spec.dr.role in ("primary", "secondary"):
        dns = Failover("inference-dns", FailoverArgs(
            domain=spec.dr.domain, hosted_zone_id=spec.dr.hosted_zone_id, stack=spec.stack, region=spec.region,
            policy=failover.record_policy(spec.dr.role, spec.dr.routing, spec.region), scheme=triton.scheme,
            endpoint=inference.endpoint, load_balancer_tags=lb_controller.controller_load_balancer_tags(
                cluster_name, tenancy.INFERENCE_NAMESPACE, triton_rules.NAME)), opts=with_aws)
        pulumi.export("inferenceDns", {"fqdn": dns.record.fqdn, "routing": spec.dr.routing})

pulumi.export("region", spec.region)
pulumi.export("clusterName", cluster.cluster_name)
pulumi.export("clusterEndpoint", cluster.endpoint)
# For operators: `pulumi stack output kubeconfig > kubeconfig.json`. It holds no credential (it runs `aws eks get-token`
# as the caller), so it is exported in the clear.
pulumi.export("kubeconfig", pulumi.Output.unsecret(cluster.kubeconfig))
pulumi.export("vpcId", network.vpc_id)
pulumi.export("zones", zone_table(spec, layout))
# Each reservation and capacity block as the account reports it: the size and term the plan's cost section bills.
pulumi.export("reservations", reservation_table(account.reservations))
pulumi.export("nodePools", {p.asg_name: p.asg.arn for p in node_pools})
pulumi.export("artifactBucket", buckets["artifacts"].bucket_name)
# What a DR primary reads from this stack (and what jobs and Triton use): every bucket with its key.
pulumi.export("buckets", {purpose: {"name": b.bucket_name, "arn": b.bucket_arn, "keyArn": b.key_arn}
                          for purpose, b in buckets.items()})
