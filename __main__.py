"""gpu-cloud: one regional GPU cluster per stack.

Reads the stack config once, validates all of it before registering anything, then composes:
network -> EKS cluster -> artifact bucket -> one GPU node pool per `nodePools` entry ->
spot/scale-in draining -> cluster-autoscaler.
"""
import json
from datetime import date

import pulumi
import pulumi_aws as aws

from components.account import read_account
from components.artifacts import ArtifactBucket, ArtifactBucketArgs
from components.autoscaler import AutoscalerArgs, ClusterAutoscaler
from components.cluster import ClusterArgs, EksCluster
from components.network import Network, NetworkArgs
from components.node_drain import NodeDrain, NodeDrainArgs
from components.nodepool import ClusterConnection, GpuNodePool, NodePoolArgs, check_user_data_fits
from spec import boot
from spec import pools as pool_rules
from spec.errors import ConfigError
from spec.logs import cloudwatch_retention_days
from plan.stackfile import peer_cidr
from spec.validate import NAMESPACE, load_stack_spec, stack_warnings
from spec.zones import resolve_layout, zone_table


def project_config() -> dict:
    """Every `gpu-cloud:` key the engine passed, objects parsed from their JSON form."""
    keys = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())
    config = pulumi.Config(NAMESPACE)
    values = {}
    for key in sorted(k.split(":", 1)[1] for k in keys if k.startswith(f"{NAMESPACE}:")):
        raw = config.get(key)
        try:
            values[key] = json.loads(raw) if raw and raw.lstrip()[:1] in "{[" else raw
        except json.JSONDecodeError:
            values[key] = raw
    return values


try:
    keys = project_config()
    spec = load_stack_spec(keys, stack=pulumi.get_stack(), region=pulumi.Config("aws").get("region"),
                           project=pulumi.get_project(), peer_cidr=peer_cidr(keys))
    check_user_data_fits(spec)
    layout = resolve_layout(spec, read_account(spec))     # zones, offerings, reservations, subnet room
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None
for warning in stack_warnings(spec, date.today()) + list(layout.warnings):
    pulumi.log.warn(warning)

cluster_name = spec.cluster_name
aws_provider = aws.Provider("aws", region=spec.region,
                            default_tags=aws.ProviderDefaultTagsArgs(tags=spec.resource_tags))
with_aws = pulumi.ResourceOptions(providers={"aws": aws_provider})
log_retention = cloudwatch_retention_days(spec.monitoring.retention_days)
account_id = aws.get_caller_identity().account_id
partition = aws.get_partition().partition

network = Network("network", NetworkArgs(
    cidr=spec.network.cidr, zones=layout.zones, nat_gateways=spec.network.nat_gateways, cluster_name=cluster_name,
    flow_log_retention_days=log_retention), opts=with_aws)

cluster = EksCluster("cluster", ClusterArgs(
    name=cluster_name, kubernetes_version=spec.cluster.kubernetes_version,
    subnet_ids=list(network.private_subnet_ids.values()), public_access_cidrs=spec.cluster.public_access_cidrs,
    admin_role_arns=spec.cluster.admin_role_arns, log_retention_days=log_retention), opts=with_aws)
with_cluster = pulumi.ResourceOptions(providers={"aws": aws_provider, "kubernetes": cluster.kube_provider})

artifacts = ArtifactBucket("artifacts", ArtifactBucketArgs(force_destroy=spec.environment == "dev"), opts=with_aws)

node_pools = [GpuNodePool(pool.name, NodePoolArgs(
    pool=pool, cluster_name=cluster_name,
    cluster=ClusterConnection(endpoint=cluster.endpoint, certificate_authority=cluster.certificate_authority,
                              service_cidr=cluster.service_cidr, security_group_id=cluster.cluster_security_group_id),
    region=spec.region, account_id=account_id, partition=partition,
    vpc_id=network.vpc_id, subnet_ids=network.private_subnet_ids, zones=layout.pool_zones[pool.name],
    image=spec.node_image,
    nvme_scratch=spec.storage.nvme_scratch, max_temp_c=spec.monitoring.alerts.gpu_temp_c, catalog=spec.catalog,
    artifact_bucket=artifacts.bucket_name, instance_tags=spec.resource_tags,
    depends_on=[cluster.addons["vpc-cni"]]), opts=with_aws) for pool in spec.pools]

NodeDrain("node-drain", NodeDrainArgs(
    cluster_name=cluster.cluster_name, region=spec.region, asg_names=tuple(p.asg_name for p in node_pools),
    asg_arns=[p.asg.arn for p in node_pools]), opts=with_cluster)

priorities = {}
for pool, component in zip(spec.pools, node_pools):
    priorities.setdefault(pool_rules.autoscaler_priority(pool), []).append(component.asg_name)
ClusterAutoscaler("autoscaler", AutoscalerArgs(
    cluster_name=cluster.cluster_name, cluster_name_plain=cluster_name, region=spec.region,
    kubernetes_version=spec.cluster.kubernetes_version,
    priorities={weight: tuple(names) for weight, names in priorities.items()},
    max_node_provision_time=boot.max_node_provision_time(spec.node_image.source)), opts=with_cluster)

pulumi.export("region", spec.region)
pulumi.export("clusterName", cluster.cluster_name)
pulumi.export("clusterEndpoint", cluster.endpoint)
pulumi.export("vpcId", network.vpc_id)
pulumi.export("zones", zone_table(spec, layout))
pulumi.export("nodePools", {p.asg_name: p.asg.arn for p in node_pools})
pulumi.export("artifactBucket", artifacts.bucket_name)
