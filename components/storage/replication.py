"""Cross-region replication from a primary stack's buckets to its DR peer's (rules in
decisions/storage/replication.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.iam import policy_document
from decisions.storage import replication
from decisions.storage.replication import ReplicaPair


@dataclass(frozen=True)
class ReplicatedBucket:
    purpose: str
    bucket_id: pulumi.Input[str]                 # the source bucket, in this stack
    bucket_arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    versioning: pulumi.Resource                  # replication needs versioning on the source first
    target_bucket_arn: pulumi.Input[str]         # the peer stack's bucket and key of the same purpose
    target_key_arn: pulumi.Input[str]


@dataclass(frozen=True)
class ReplicationArgs:
    buckets: Sequence[ReplicatedBucket]


class Replication(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReplicationArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if not args.buckets:
            raise ValueError("Replication needs at least one bucket")
        deletes = {b.purpose: replication.delete_marker_replication(b.purpose) for b in args.buckets}
        super().__init__("gpu-cloud:replication:Replication", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", description="S3 replication to the DR peer stack",
                                 assume_role_policy=json.dumps(replication.S3_TRUST_POLICY), opts=child)
        # The statements compute with the ARNs (a key's region), so they are resolved first.
        arns = pulumi.Output.all(*[pulumi.Output.all(b.bucket_arn, b.key_arn, b.target_bucket_arn, b.target_key_arn)
                                   for b in args.buckets])
        policy = arns.apply(lambda fours: policy_document(*replication.role_policy_statements(
            [ReplicaPair(b.purpose, *four) for four, b in zip(fours, args.buckets)])))
        role_policy = aws.iam.RolePolicy(f"{name}-policy", role=self.role.id, policy=policy, opts=child)
        minutes = replication.REPLICATION_TIME_MINUTES
        self.configs = {}
        for bucket in args.buckets:
            self.configs[bucket.purpose] = aws.s3.BucketReplicationConfig(
                f"{name}-{bucket.purpose}", bucket=bucket.bucket_id, role=self.role.arn,
                rules=[aws.s3.BucketReplicationConfigRuleArgs(
                    id=replication.RULE_ID, status="Enabled",
                    filter=aws.s3.BucketReplicationConfigRuleFilterArgs(prefix=""),
                    delete_marker_replication=aws.s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(
                        status=deletes[bucket.purpose]),
                    source_selection_criteria=aws.s3.BucketReplicationConfigRuleSourceSelectionCriteriaArgs(
                        sse_kms_encrypted_objects=aws.s3.BucketReplicationConfigRuleSourceSelectionCriteriaSseKmsEncryptedObjectsArgs(
                            status="Enabled")),
                    destination=aws.s3.BucketReplicationConfigRuleDestinationArgs(
                        bucket=bucket.target_bucket_arn,
                        encryption_configuration=aws.s3.BucketReplicationConfigRuleDestinationEncryptionConfigurationArgs(
                            replica_kms_key_id=bucket.target_key_arn),
                        replication_time=aws.s3.BucketReplicationConfigRuleDestinationReplicationTimeArgs(
                            status="Enabled",
                            time=aws.s3.BucketReplicationConfigRuleDestinationReplicationTimeTimeArgs(minutes=minutes)),
                        metrics=aws.s3.BucketReplicationConfigRuleDestinationMetricsArgs(
                            status="Enabled",
                            event_threshold=aws.s3.BucketReplicationConfigRuleDestinationMetricsEventThresholdArgs(
                                minutes=minutes))))],
                # S3 checks the role when the configuration is put: its policy must be there first.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[bucket.versioning, role_policy]))
        self.register_outputs({"roleArn": self.role.arn})
