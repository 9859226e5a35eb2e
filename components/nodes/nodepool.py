"""One GPU node pool: a self-managed Auto Scaling group of EKS-optimized accelerated nodes.

Self-managed ASGs rather than EKS managed node groups, because the node-verification launch hook must
exist before the first instance launches (`initial_lifecycle_hooks`) and spot pools need a
mixed-instances policy. The provider replaces a group when its initial hooks change, so they only seed
the group at creation (changes ignored); separate LifecycleHook resources own the hooks from then on, and
changing a timeout updates them in place. Every decision (interfaces, labels, taints, tags, pacing, expectations) comes
from decisions/; this file only turns those values into resources.
"""
from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

import pulumi
import pulumi_aws as aws

from components.iam import policy_document
from decisions.catalog.catalog import Catalog
from decisions.config import preflight
from decisions.config.errors import ConfigError, ConfigIssue, key_path
from decisions.config.model import NAMESPACE
from decisions.config.validate import ResolvedPool, StackSpec
from decisions.nodes import boot, pods, repair
from decisions.nodes import pools as pool_rules
from decisions.nodes.amis import NodeImage
from decisions.nodes.drain import ASG_DELETE_TIMEOUT_S, DRAIN_HOOK_NAME, LIFECYCLE_DRAIN_TIMEOUT_S, NTH_MANAGED_TAG
from decisions.nodes.efa import interface_layout
from decisions.nodes.scratch import ROOT_VOLUME_GIB
from decisions.storage import lustre as lustre_rules
from userdata.render import NodeBootstrap, Taint, build_verifier_artifact, render_user_data

NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",   # operators reach nodes without SSH keys
)


def node_bootstrap(pool: ResolvedPool, *, catalog: Catalog, cluster_name: str, region: str, image: NodeImage,
                   nvme_scratch: bool, endpoint: str, certificate_authority: str, service_cidr: str,
                   artifact_uri: str, artifact_sha256: str, lustre_client: bool) -> NodeBootstrap:
    """Everything a node of `pool` boots with (rendered into its user-data)."""
    return NodeBootstrap(
        cluster_name=cluster_name, api_server_endpoint=endpoint, certificate_authority=certificate_authority,
        service_cidr=service_cidr, labels=pool_rules.node_labels(pool),
        taints=tuple(Taint(t.key, t.value, t.effect) for t in pool_rules.node_taints(pool)),
        max_pods=pods.max_pods(pool.types, efa=pool.efa),
        raid0_instance_store=nvme_scratch and pool.primary_type.instance_store.disks > 0,
        region=region, asg_name=pool_rules.asg_name(cluster_name, pool.name),
        lifecycle_hook_name=boot.VERIFY_HOOK_NAME, pool_name=pool.name, artifact_uri=artifact_uri,
        artifact_sha256=artifact_sha256, driver_source=image.source, ami_name=image.ami_name,
        driver_branch=image.driver_branch, driver_version=image.driver_version,
        nvswitch=catalog.gpu_model(pool.primary_type.name).nvswitch, efa_count=pool_rules.efa_devices(pool),
        kmod_wait_s=boot.KMOD_LOAD_WAIT_S, fabric_manager_wait_s=boot.FABRIC_MANAGER_WAIT_S,
        verify_budget_s=boot.VERIFY_BUDGET_S, verify_kill_grace_s=boot.VERIFY_KILL_GRACE_S, mig=pool.spec.gpu_sharing.mode == "mig",
        lustre_client=lustre_client)


def check_user_data_fits(spec: StackSpec) -> None:
    """Render every pool's user-data with the largest cluster values EKS produces; a pool whose
    user-data would pass EC2's 16 KB limit (too many labels or taints) is a config error, found
    before any resource is registered rather than halfway through `pulumi up`."""
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n" + b"A" * 1500 + b"\n-----END CERTIFICATE-----\n").decode()
    issues = []
    for i, pool in enumerate(spec.pools):
        try:
            render_user_data(node_bootstrap(
                pool, catalog=spec.catalog, cluster_name=spec.cluster_name, region=spec.region,
                image=spec.node_image, nvme_scratch=spec.storage.nvme_scratch,
                endpoint=f"https://{'F' * 32}.gr7.{spec.region}.eks.amazonaws.com", certificate_authority=ca,
                service_cidr="172.20.0.0/16", artifact_uri=f"s3://{'b' * 63}/verifier/{pool.name}/{'0' * 64}.tar",
                artifact_sha256="0" * 64,
                lustre_client=lustre_rules.mounts_lustre(pool, spec.storage.lustre is not None)))
        except ValueError as error:
            issues.append(ConfigIssue(key_path(NAMESPACE, ("nodePools", i)), str(error)))
    if issues:
        raise ConfigError(issues, pool_names=[pool.name for pool in spec.pools])


@dataclass(frozen=True)
class ClusterConnection:
    """What a node needs from the control plane. `name` is the cluster's own output: what calls the EKS API
    about the cluster (the access entry) must wait for it to exist."""
    name: pulumi.Input[str]
    endpoint: pulumi.Input[str]
    certificate_authority: pulumi.Input[str]
    service_cidr: pulumi.Input[str]
    security_group_id: pulumi.Input[str]


@dataclass(frozen=True)
class NodePoolArgs:
    pool: ResolvedPool
    cluster_name: str                                  # for names, tags and user-data (the cluster's fixed name)
    cluster: ClusterConnection
    region: str
    account_id: str
    partition: str                                     # "aws", "aws-cn", "aws-us-gov": part of every ARN
    dns_suffix: str                                    # the partition's ("amazonaws.com", "amazonaws.com.cn"): kms:ViaService
    vpc_id: pulumi.Input[str]
    subnet_ids: Mapping[str, pulumi.Input[str]]       # zone ID -> private subnet
    # zone IDs the pool's nodes launch in (decisions.network.zones.ZoneLayout)
    zones: Sequence[str]
    image: NodeImage                                   # the AMI release every node boots, and its driver
    ami_id: pulumi.Input[str]                          # that release's AMI in the region (read_ami_id, once a stack)
    nvme_scratch: bool
    max_temp_c: int
    catalog: Catalog
    artifact_bucket: pulumi.Input[str]
    artifact_key_arn: pulumi.Input[str]                # the bucket's KMS key: reading a bundle decrypts it
    # its pods mount FSx for Lustre (decisions.storage.lustre.mounts_lustre)
    lustre_client: bool
    instance_tags: Mapping[str, str]                   # the stack's tags, for instances, volumes and the ASG
    # its replacements launch before the instance they replace terminates (decisions.nodes.pools.launches_first)
    launch_first: bool = False
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class GpuNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodePoolArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:nodepool:GpuNodePool", name, None, opts)
        pool = args.pool
        child = pulumi.ResourceOptions(parent=self)
        self.asg_name = pool_rules.asg_name(args.cluster_name, pool.name)
        asg_arn_pattern = pool_rules.asg_arn_pattern(args.partition, args.region, args.account_id, self.asg_name)

        artifact = build_verifier_artifact(
            pool_rules.verify_expectations(pool, args.image, args.max_temp_c, args.catalog))
        artifact_sha256 = hashlib.sha256(artifact).hexdigest()
        artifact_key = f"verifier/{pool.name}/{artifact_sha256}.tar"
        self.artifact = aws.s3.BucketObjectv2(
            f"{name}-verifier", bucket=args.artifact_bucket, key=artifact_key,
            content_base64=base64.b64encode(artifact).decode(), content_type="application/x-tar", opts=child)

        self.role, grants = self._node_role(name, args, asg_arn_pattern, artifact_key)
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=self.role.name, opts=child)
        self.access_entry = aws.eks.AccessEntry(
            f"{name}-access", cluster_name=args.cluster.name, principal_arn=self.role.arn, type="EC2_LINUX", opts=child)

        security_groups = [args.cluster.security_group_id]
        self.placement_group = None
        placement_group_name: Optional[pulumi.Input[str]] = pool.spec.placement_group
        if pool.efa:
            efa_sg = self._efa_security_group(name, args.vpc_id)
            security_groups.append(efa_sg.id)
        if pool.efa and not placement_group_name and not pool.spec.reserved_capacity:
            # Cluster placement: EFA traffic between nodes in one spine keeps NCCL latency low. Reserved capacity
            # gets no new group: a reservation made in a placement group names it (placementGroup) and launches
            # there; one made outside any group (or a capacity block, which AWS places) would fail to launch part
            # of its instances under a group it was not made in (eksctl #7949, terraform-aws-eks #3730).
            self.placement_group = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster", opts=child)
            placement_group_name = self.placement_group.name

        user_data = pulumi.Output.all(args.cluster.endpoint, args.cluster.certificate_authority,
                                      args.cluster.service_cidr, args.artifact_bucket).apply(
            lambda values: base64.b64encode(render_user_data(node_bootstrap(
                pool, catalog=args.catalog, cluster_name=args.cluster_name, region=args.region, image=args.image,
                nvme_scratch=args.nvme_scratch, endpoint=values[0], certificate_authority=values[1],
                service_cidr=values[2], artifact_uri=f"s3://{values[3]}/{artifact_key}",
                artifact_sha256=artifact_sha256, lustre_client=args.lustre_client)).encode()).decode())

        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"gpu-cloud {args.cluster_name} pool {pool.name}",
            image_id=args.ami_id,
            instance_type=pool.primary_type.name if len(pool.types) == 1 else None,
            user_data=user_data,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            # IMDSv2 only, hop limit 1: processes in pod network namespaces cannot reach the node's
            # credentials. Nothing on a GPU node needs more: add-ons get AWS access via Pod Identity.
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1,
                instance_metadata_tags="disabled"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=ROOT_VOLUME_GIB, volume_type="gp3", iops=6000, throughput=500,
                    encrypted="true", delete_on_termination="true"))],
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=nic.network_card_index, device_index=nic.device_index,
                    interface_type=nic.interface_type if nic.is_efa else None,
                    security_groups=security_groups, delete_on_termination="true",
                    associate_public_ip_address="false" if nic.primary else None)
                for nic in interface_layout(pool.primary_type, efa=pool.efa)],
            placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=placement_group_name) if placement_group_name else None,
            capacity_reservation_specification=self._reservation(pool),
            instance_market_options=aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
            if pool.spec.capacity == "capacity-block" else None,
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(
                resource_type=kind, tags={**args.instance_tags, "Name": self.asg_name, "gpu-cloud:pool": pool.name,
                                          # the EKS guide for self-managed nodes tags the instances themselves
                                          **(pool_rules.cluster_ownership_tag(args.cluster_name) if kind == "instance" else {})})
                for kind in ("instance", "volume", "network-interface")],
            update_default_version=True,
            # A node started from this template fetches its bundle and uses its role's grants at once.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.artifact, *grants]))

        # Spot pools, and pools of several types, need a mixed-instances policy; the others use the template.
        mixed = pool.spec.capacity == "spot" or len(pool.types) > 1
        refresh = pool_rules.refresh_preferences(pool)
        policy = pool_rules.launch_first_policy(pool)
        hook_timeout = boot.verify_hook_timeout(args.image.source)
        # Warmup and grace start at InService, after the gate's CONTINUE: they cover registration to GPUs, not the gate.
        ready = boot.node_ready_seconds()
        hooks = {boot.VERIFY_HOOK_NAME: ("autoscaling:EC2_INSTANCE_LAUNCHING", "ABANDON", hook_timeout),
                 DRAIN_HOOK_NAME: ("autoscaling:EC2_INSTANCE_TERMINATING", "CONTINUE", LIFECYCLE_DRAIN_TIMEOUT_S)}
        # at most 50 (decisions/config/validate.py)
        tags = preflight.asg_tags(pool, args.cluster_name, args.instance_tags, args.nvme_scratch)
        self.asg = aws.autoscaling.Group(
            f"{name}-asg",
            name=self.asg_name,
            min_size=pool.spec.min_nodes, max_size=pool.spec.max_nodes, desired_capacity=pool.spec.desired_nodes,
            vpc_zone_identifiers=[args.subnet_ids[z] for z in args.zones],
            launch_template=None if mixed else aws.autoscaling.GroupLaunchTemplateArgs(
                id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
            mixed_instances_policy=self._mixed_policy(pool) if mixed else None,
            capacity_rebalance=pool.spec.capacity == "spot",
            # The first nodes must already be held by the hooks: seeded here, owned by the resources below.
            initial_lifecycle_hooks=[
                aws.autoscaling.GroupInitialLifecycleHookArgs(
                    name=hook, lifecycle_transition=transition, default_result=result, heartbeat_timeout=timeout)
                for hook, (transition, result, timeout) in hooks.items()],
            instance_refresh=aws.autoscaling.GroupInstanceRefreshArgs(
                strategy="Rolling",
                preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
                    min_healthy_percentage=refresh.min_healthy_percentage,
                    max_healthy_percentage=refresh.max_healthy_percentage,
                    skip_matching=True, instance_warmup=str(ready))),
            # A replacement launches into the reservation's spare slot first; the group's default otherwise.
            instance_maintenance_policy=aws.autoscaling.GroupInstanceMaintenancePolicyArgs(
                min_healthy_percentage=policy[0], max_healthy_percentage=policy[1]) if args.launch_first else None,
            health_check_type="EC2",
            health_check_grace_period=ready,
            # Nodes pass the verification hook on their own schedule (up to the hook timeout, longer for a
            # capacity block that has not started): do not hold `pulumi up` for capacity.
            wait_for_capacity_timeout="0",
            # Only the drain handler's tag propagates: instances get the rest from the launch template.
            tags=[aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=k == NTH_MANAGED_TAG)
                  for k, v in sorted(tags.items())],
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.access_entry, *args.depends_on],
                # cluster-autoscaler owns the desired size once the pool exists; the hooks resources own the hooks;
                # the repair controller's brake suspends Launch and only a person resumes it (`pulumi up --refresh`
                # would read the suspension and, the program setting none, resume it: decisions/nodes/repair.py).
                ignore_changes=["desiredCapacity", "initialLifecycleHooks", "suspendedProcesses"],
                # Deleting a pool with nodes drains each through the termination hook first.
                custom_timeouts=pulumi.CustomTimeouts(delete=f"{ASG_DELETE_TIMEOUT_S // 60}m")))
        # The hooks go with the group: deleted on their own, before it (they depend on it), the termination hook
        # would be gone while the group's delete terminates its nodes, and none of them would be drained.
        self.lifecycle_hooks = [aws.autoscaling.LifecycleHook(
            f"{name}-hook-{hook}", name=hook, autoscaling_group_name=self.asg.name, lifecycle_transition=transition,
            default_result=result, heartbeat_timeout=timeout,
            opts=pulumi.ResourceOptions(parent=self, deleted_with=self.asg))
            for hook, (transition, result, timeout) in hooks.items()]

        self.register_outputs({"asgName": self.asg.name, "asgArn": self.asg.arn, "launchTemplateId": self.launch_template.id,
                               "nodeRoleArn": self.role.arn, "artifactKey": artifact_key})

    def _node_role(self, name: str, args: NodePoolArgs, asg_arn_pattern: str,
                   artifact_key: str) -> Tuple[aws.iam.Role, List[pulumi.Resource]]:
        """The nodes' role and its grants (managed policies and the gate's own)."""
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(f"{name}-node-role", description=f"GPU nodes of pool {args.pool.name}",
                            assume_role_policy=policy_document({
                                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                "Action": "sts:AssumeRole"}),
                            opts=child)
        grants: List[pulumi.Resource] = [
            aws.iam.RolePolicyAttachment(f"{name}-node-policy-{i}", role=role.name,
                                         policy_arn=f"arn:{args.partition}:iam::aws:policy/{policy}", opts=child)
            for i, policy in enumerate(NODE_MANAGED_POLICIES)]
        # The bootstrap gate: complete this ASG's lifecycle action (first boot) or report an instance of it
        # unhealthy (a later boot that fails), tag only the instance itself with the verdict keys, read this pool's
        # verifier bundle and publish its verdicts under this pool's report prefix. Nothing else. Auto Scaling
        # authorizes both actions on the group, not the instance, so a node may act on its pool's peers too.
        reports = pulumi.Output.concat(f"arn:{args.partition}:s3:::", args.artifact_bucket, "/",
                                       repair.gate_reports_prefix(args.pool.name), "*")
        grants.append(aws.iam.RolePolicy(f"{name}-node-gate", role=role.id, policy=policy_document(
            {"Sid": "CompleteOwnLifecycleAction", "Effect": "Allow", "Action": "autoscaling:CompleteLifecycleAction",
             "Resource": asg_arn_pattern},
            {"Sid": "ReportOwnGroupInstanceUnhealthy", "Effect": "Allow", "Action": "autoscaling:SetInstanceHealth",
             "Resource": asg_arn_pattern},
            {"Sid": "PublishGateReport", "Effect": "Allow", "Action": "s3:PutObject", "Resource": reports},
            {"Sid": "EncryptGateReport", "Effect": "Allow", "Action": "kms:GenerateDataKey",
             "Resource": args.artifact_key_arn,
             "Condition": {"StringEquals": {"kms:ViaService": f"s3.{args.region}.{args.dns_suffix}"}}},
            # Only the calling instance: the instance tagged (ec2:InstanceID, a condition key of CreateTags on an
            # instance in the Service Authorization Reference) is the one the request comes from
            # (ec2:SourceInstanceARN, a policy variable in the IAM User Guide), as AWS's managed policy
            # AWSEC2VssSnapshotPolicy matches them; only the two verdict keys.
            {"Sid": "TagSelfWithVerdict", "Effect": "Allow", "Action": "ec2:CreateTags",
             "Resource": f"arn:{args.partition}:ec2:{args.region}:{args.account_id}:instance/*",
             "Condition": {"ArnEquals": {"ec2:SourceInstanceARN": f"arn:{args.partition}:ec2:{args.region}:"
                                                                  f"{args.account_id}:instance/${{ec2:InstanceID}}"},
                           "ForAllValues:StringEquals": {"aws:TagKeys": ["gpu-cloud:verify", "gpu-cloud:verify-reason"]}}},
            {"Sid": "ReadVerifierBundle", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": pulumi.Output.concat(f"arn:{args.partition}:s3:::", args.artifact_bucket, "/", artifact_key)},
            {"Sid": "DecryptVerifierBundle", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": args.artifact_key_arn,
             "Condition": {"StringEquals": {"kms:ViaService": f"s3.{args.region}.{args.dns_suffix}"}}},
        ), opts=child))
        return role, grants

    def _efa_security_group(self, name: str, vpc_id: pulumi.Input[str]) -> aws.ec2.SecurityGroup:
        """EFA's OS-bypass traffic needs all protocols to and from the group itself, both ways."""
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(f"{name}-efa-sg", vpc_id=vpc_id, description="EFA: all traffic within the group",
                                      opts=child)
        aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in", security_group_id=group.id, ip_protocol="-1",
                                         referenced_security_group_id=group.id, description="EFA from peers", opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out", security_group_id=group.id, ip_protocol="-1",
                                        referenced_security_group_id=group.id, description="EFA to peers", opts=child)
        return group

    @staticmethod
    def _reservation(pool: ResolvedPool) -> Optional[aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs]:
        """Reserved and capacity-block pools launch only into their reservation, never elsewhere."""
        if not pool.spec.reserved_capacity:
            return None
        return aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_preference="capacity-reservations-only",
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=pool.spec.capacity_reservation_id))

    def _mixed_policy(self, pool: ResolvedPool) -> aws.autoscaling.GroupMixedInstancesPolicyArgs:
        spot = pool.spec.capacity == "spot"
        return aws.autoscaling.GroupMixedInstancesPolicyArgs(
            instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=0, on_demand_percentage_above_base_capacity=0 if spot else 100,
                spot_allocation_strategy="price-capacity-optimized" if spot else None,
                on_demand_allocation_strategy=None if spot else "prioritized"),
            launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                    launch_template_id=self.launch_template.id, version=self.launch_template.latest_version.apply(str)),
                overrides=[aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=t.name)
                           for t in pool.types]))


def read_ami_id(image: NodeImage, opts: pulumi.InvokeOptions) -> str:
    """The AMI of the image's release in the stack's region: its own SSM parameter, not `recommended`, so the same
    AMI on every run until decisions/nodes/amis.yaml or the stack file moves the release. Read once for every pool."""
    return aws.ssm.get_parameter(name=image.ssm_parameter, opts=opts).value
