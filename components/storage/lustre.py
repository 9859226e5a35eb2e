"""FSx for Lustre for training data: the file system, its key, logs, security group and S3 association, and the
static PersistentVolume and claim that training pods mount.

Every setting comes from decisions/storage/lustre.py (which says what and why); this file only turns them into
resources.

Network. One security group for the file system. Lustre needs TCP 988 and 1018-1023 between the file servers and
from every client (FSx User Guide, "File system access control with Amazon VPC"), so the group admits exactly
those, from itself and from each client group, and sends exactly those to the same groups (a group Pulumi creates
has no egress rule at all). The client groups get the mirror image: those ports in from, and out to, the file
system's group (the same guide, "Lustre client VPC security group rules"). GPU nodes' egress is open already (the
EKS cluster security group, on every node interface, allows all outbound; the pools' EFA group only adds traffic to
itself), so the client egress rules state the requirement rather than open anything. With EFA, FSx also requires ALL
traffic between the file system's group, itself and the client groups, by group ID both ways ("EFA-enabled security
groups"): those rules are added only then.

Kubernetes. A static PV for the FSx CSI driver (volumeHandle = the file system id, dnsname and mountname from the
file system), reserved for its claim by claimRef, Retain (deleting the PV or claim never touches the data),
storageClassName "" (no dynamic provisioning), and the claim in the training namespace bound to it by volumeName.
The Lustre kernel client is not on the node image: the CSI driver's node container brings AL2023's lustre-client and
loads the module (kubernetes-sigs/aws-fsx-csi-driver Dockerfile). The driver is the pinned Helm chart
(decisions/catalog/charts.yaml), installed here because only a stack with Lustre needs it.

Destroy. While a pod mounts the claim, Kubernetes keeps it, and the PV bound to it (kubernetes.io, Persistent Volumes,
"Storage Object in Use Protection": a claim in use by a pod is removed only once no pod uses it, a PV bound to a claim
only once it is no longer bound), and pulumi-kubernetes waits up to 10 minutes for a deletion to finish, then fails
(provider/pkg/await/await.go, Deletion). Team pods are no resources of this program: only the namespace's own deletion
removes them. So neither object is deleted by the engine on a destroy: the claim goes with its namespace (deletedWith:
the engine skips the delete of a resource whose deletedWith target is deleted too, pulumi/pulumi
pkg/resource/deploy/step.go), which removes the pods first; the cluster-scoped PV goes with the cluster, and its
claimRef names the namespace as a plain string, so it does not wait for the namespace either. The claim is protected
like the file system: a destroy that stops at the protected namespace would otherwise drop the claim from the state
while the namespace keeps it (the engine counts a deletedWith resource gone once its target is marked for deletion,
refused or not), and the next `pulumi up` would find it there already. Removing storage.lustre from a stack deletes
both for real, and the claim's delete waits for the pods that mount it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from components.iam import log_group_key_policy
from decisions.catalog import charts
from decisions.storage import lustre

KMS_DELETION_WINDOW_DAYS = 30      # the maximum: a scheduled deletion of the key can still be cancelled
DATA_REPOSITORY_TIMEOUT = "30m"    # an S3 association takes up to 20 minutes (awslabs/ai-on-eks fsx-for-lustre.tf)


@dataclass(frozen=True)
class LustreArgs:
    cluster_name: str                                   # names (log group, alias, tags)
    capacity_gib: int
    throughput_per_tib: int
    efa: bool
    vpc_id: pulumi.Input[str]
    # the private subnet of decisions.storage.lustre.lustre_zone(...)
    subnet_id: pulumi.Input[str]
    client_security_group_ids: Sequence[pulumi.Input[str]]   # the nodes' groups (the EKS cluster security group)
    region: str
    account_id: str
    partition: str
    dns_suffix: str                                     # the partition's (logs.<region>.<suffix>)
    # a CloudWatch Logs value (decisions.observability.logs.cloudwatch_retention_days)
    log_retention_days: int
    namespace: kubernetes.core.v1.Namespace             # the training namespace: the claim lives in it and goes with it
    namespace_name: str                                 # its name, plain: the PV's claimRef, which must not wait for it
    cluster: pulumi.Resource                            # the EKS cluster: the PV, cluster-scoped, goes with it
    import_path: Optional[str] = None                   # s3://bucket/prefix; None: the datasets bucket
    datasets_bucket: Optional[pulumi.Input[str]] = None  # bucket name, linked as s3://<bucket>/ without import_path


def _check(args: LustreArgs) -> None:
    problems = [message for _, message in lustre.size_issues(args.capacity_gib, args.throughput_per_tib)]
    if args.import_path is None and args.datasets_bucket is None:
        problems.append("neither import_path nor datasets_bucket: the file system needs an S3 data repository")
    if not args.client_security_group_ids:
        problems.append("client_security_group_ids is empty: no node could mount the file system")
    try:
        if args.import_path is not None:
            lustre.s3_prefix(args.import_path)
    except ValueError as error:
        problems.append(str(error))
    if problems:
        raise ValueError("invalid LustreArgs: " + "; ".join(problems))


class Lustre(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    kms_key: aws.kms.Key
    log_group: aws.cloudwatch.LogGroup
    security_group: aws.ec2.SecurityGroup
    file_system: aws.fsx.LustreFileSystem
    association: aws.fsx.DataRepositoryAssociation
    pv: kubernetes.core.v1.PersistentVolume
    pvc: kubernetes.core.v1.PersistentVolumeClaim

    def __init__(self, name: str, args: LustreArgs, opts: Optional[pulumi.ResourceOptions] = None):
        _check(args)                                   # before anything is registered
        log_group_name = lustre.log_group_name(args.cluster_name)
        repository = (lustre.s3_prefix(args.import_path) if args.import_path is not None
                      else pulumi.Output.concat("s3://", args.datasets_bucket, "/"))

        super().__init__("gpu-cloud:lustre:Lustre", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # --- KMS: the file system's data and its log group ---------------------------------------------
        # The account root keeps full control, so IAM policies can grant use (FSx creates its grants through the
        # caller's) and the key never becomes unmanageable; CloudWatch Logs may use it for this log group only.
        # Retained on delete: a destroy, even after `pulumi state unprotect --all`, leaves the key (the engine's delete
        # is a no-op, pulumi/pulumi pkg/resource/deploy/step.go), so nothing it encrypted is made unreadable by a
        # destroy; deleting it is a deliberate step (docs/deploying.md, Destroying a stack).
        self.kms_key = aws.kms.Key(
            f"{name}-kms", description=f"FSx for Lustre of {args.cluster_name}: data at rest and its log group",
            enable_key_rotation=True, deletion_window_in_days=KMS_DELETION_WINDOW_DAYS,
            policy=log_group_key_policy(args.partition, args.dns_suffix, args.region, args.account_id, log_group_name),
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True))
        aws.kms.Alias(f"{name}-kms-alias", name=f"alias/fsx/{args.cluster_name}-lustre",
                      target_key_id=self.kms_key.key_id, opts=child)

        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=log_group_name, retention_in_days=args.log_retention_days,
            kms_key_id=self.kms_key.arn, opts=child)

        # --- network --------------------------------------------------------------------------------------
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg", vpc_id=args.vpc_id, description=f"FSx for Lustre of {args.cluster_name}",
            tags={"Name": f"{args.cluster_name}-lustre"}, opts=child)
        fs_sg = self.security_group.id
        peers = [("self", fs_sg)] + [(f"client-{i}", sg) for i, sg in enumerate(args.client_security_group_ids)]
        # What FSx checks when it creates the file system: Lustre traffic within its own group (port 988), and for
        # EFA all traffic with the clients' groups too. Waiting for more would make it wait for the EKS cluster (the
        # clients' group is the cluster's), about 12 minutes, for nothing.
        checked_at_create: List[pulumi.Resource] = []
        for low, high in lustre.LUSTRE_PORTS:
            ports = f"{low}-{high}" if low != high else str(low)
            for label, peer in peers:
                pair = [aws.vpc.SecurityGroupIngressRule(
                    f"{name}-in-{ports}-{label}", security_group_id=fs_sg, referenced_security_group_id=peer,
                    ip_protocol="tcp", from_port=low, to_port=high, description=f"Lustre TCP {ports} from {label}",
                    opts=child),
                    aws.vpc.SecurityGroupEgressRule(
                    f"{name}-out-{ports}-{label}", security_group_id=fs_sg, referenced_security_group_id=peer,
                    ip_protocol="tcp", from_port=low, to_port=high, description=f"Lustre TCP {ports} to {label}",
                    opts=child)]
                if label == "self" or args.efa:
                    checked_at_create += pair
            for label, client in peers[1:]:
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-{label}-in-{ports}", security_group_id=client, referenced_security_group_id=fs_sg,
                    ip_protocol="tcp", from_port=low, to_port=high, description=f"Lustre TCP {ports} from FSx",
                    opts=child)
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-{label}-out-{ports}", security_group_id=client, referenced_security_group_id=fs_sg,
                    ip_protocol="tcp", from_port=low, to_port=high, description=f"Lustre TCP {ports} to FSx",
                    opts=child)
        if args.efa:
            # FSx refuses an EFA-enabled file system unless its group allows all traffic to and from itself and the
            # clients' groups, by ID ("Insufficient security group permissions to create an EFA-enabled file system").
            for label, peer in peers:
                checked_at_create.append(aws.vpc.SecurityGroupIngressRule(
                    f"{name}-efa-in-{label}", security_group_id=fs_sg, referenced_security_group_id=peer,
                    ip_protocol="-1", description=f"EFA from {label}", opts=child))
                checked_at_create.append(aws.vpc.SecurityGroupEgressRule(
                    f"{name}-efa-out-{label}", security_group_id=fs_sg, referenced_security_group_id=peer,
                    ip_protocol="-1", description=f"EFA to {label}", opts=child))
            for label, client in peers[1:]:
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-{label}-efa-in", security_group_id=client, referenced_security_group_id=fs_sg,
                    ip_protocol="-1", description="EFA from FSx for Lustre", opts=child)
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-{label}-efa-out", security_group_id=client, referenced_security_group_id=fs_sg,
                    ip_protocol="-1", description="EFA to FSx for Lustre", opts=child)

        # --- the file system ------------------------------------------------------------------------------
        # Protected: it holds the training data and checkpoints written to it. No backups, automatic or final: FSx
        # backs up no file system linked to S3, and the export to S3 protects it (decisions/storage/lustre.py).
        self.file_system = aws.fsx.LustreFileSystem(
            f"{name}-fs",
            deployment_type=lustre.DEPLOYMENT_TYPE,
            storage_type=lustre.STORAGE_TYPE,
            storage_capacity=args.capacity_gib,
            per_unit_storage_throughput=args.throughput_per_tib,
            file_system_type_version=lustre.LUSTRE_VERSION,
            data_compression_type=lustre.DATA_COMPRESSION,
            metadata_configuration=aws.fsx.LustreFileSystemMetadataConfigurationArgs(mode=lustre.METADATA_MODE),
            efa_enabled=args.efa,
            subnet_ids=args.subnet_id,
            security_group_ids=[fs_sg],
            kms_key_id=self.kms_key.arn,
            log_configuration=aws.fsx.LustreFileSystemLogConfigurationArgs(
                level=lustre.LOG_LEVEL, destination=self.log_group.arn),
            # 0 switches automatic backups off; the provider's own skip_final_backup default (true) is set anyway.
            automatic_backup_retention_days=lustre.BACKUP_RETENTION_DAYS,
            # Kept although nothing is backed up: the provider replaces a file system whose copy_tags_to_backups
            # changes (ForceNew, terraform-provider-aws internal/service/fsx/lustre_file_system.go), and stacks
            # deployed before carry true.
            copy_tags_to_backups=True,
            weekly_maintenance_start_time=lustre.WEEKLY_MAINTENANCE_START,
            skip_final_backup=not lustre.FINAL_BACKUP,
            tags={"Name": f"{args.cluster_name}-lustre"},
            # FSx checks the group's rules when it creates the file system (port 988, and all traffic for EFA). With
            # no final backup to wait for, a delete takes the provider's own 30 minutes at most.
            opts=pulumi.ResourceOptions(parent=self, protect=True, depends_on=checked_at_create))

        self.association = aws.fsx.DataRepositoryAssociation(
            f"{name}-data",
            file_system_id=self.file_system.id,
            data_repository_path=repository,
            file_system_path=lustre.FILE_SYSTEM_PATH,
            batch_import_meta_data_on_create=True,     # what the bucket already holds shows up in /data at once
            delete_data_in_filesystem=False,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(
                    events=list(lustre.AUTO_EVENTS)),
                # What jobs write under /data reaches the bucket: the file system's protection.
                auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(
                    events=list(lustre.EXPORT_EVENTS))),
            opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(
                create=DATA_REPOSITORY_TIMEOUT, update=DATA_REPOSITORY_TIMEOUT, delete=DATA_REPOSITORY_TIMEOUT)))

        # --- Kubernetes: the CSI driver, the static volume and its claim ------------------------------------
        self.csi_driver = pinned_release(
            f"{name}-csi-driver", charts.chart(charts.FSX_CSI_DRIVER), release_name=lustre.CSI_RELEASE_NAME,
            namespace=lustre.CSI_NAMESPACE, values=lustre.csi_values(SYSTEM_NODE_LABELS), opts=child)
        size = lustre.storage_quantity(args.capacity_gib)
        self.pv = kubernetes.core.v1.PersistentVolume(
            f"{name}-pv",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=lustre.PV_NAME),
            spec=kubernetes.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": size},
                volume_mode="Filesystem",
                access_modes=list(lustre.ACCESS_MODES),
                mount_options=list(lustre.MOUNT_OPTIONS),
                persistent_volume_reclaim_policy=lustre.RECLAIM_POLICY,
                storage_class_name="",
                claim_ref=kubernetes.core.v1.ObjectReferenceArgs(namespace=args.namespace_name, name=lustre.PVC_NAME),
                csi=kubernetes.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=lustre.CSI_DRIVER, volume_handle=self.file_system.id,
                    volume_attributes={"dnsname": self.file_system.dns_name,
                                       "mountname": self.file_system.mount_name})),
            opts=pulumi.ResourceOptions(parent=self, deleted_with=args.cluster))
        self.pvc = kubernetes.core.v1.PersistentVolumeClaim(
            f"{name}-pvc",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=lustre.PVC_NAME, namespace=args.namespace.metadata.name),
            spec=kubernetes.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=list(lustre.ACCESS_MODES),
                storage_class_name="",
                volume_name=self.pv.metadata.name,
                resources=kubernetes.core.v1.VolumeResourceRequirementsArgs(requests={"storage": size})),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.csi_driver], deleted_with=args.namespace,
                                        protect=True))

        self.file_system_id = self.file_system.id
        self.dns_name = self.file_system.dns_name
        self.mount_name = self.file_system.mount_name
        self.security_group_id = self.security_group.id
        self.pvc_name = self.pvc.metadata.name
        self.register_outputs({
            "fileSystemId": self.file_system_id,
            "dnsName": self.dns_name,
            "mountName": self.mount_name,
            "securityGroupId": self.security_group_id,
            "pvcName": self.pvc_name,
        })
