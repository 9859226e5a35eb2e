"""One secure S3 bucket, the only kind the stack makes: datasets, checkpoints, models, node artifacts, logs.

Each bucket has its own customer-managed KMS key (rotation on, bucket keys on so S3 calls KMS once per bucket key
rather than per object), versioning, every public access blocked, ACLs disabled, a policy that refuses plain
HTTP, server access logging to the stack's log bucket, lifecycle rules (decisions/storage/buckets.py), and protection on
both bucket and key. The log bucket itself (no `log_bucket`) admits the S3 logging service for its source buckets
instead of logging to itself, which would loop, and is SSE-S3 with no key of its own: server access logging
supports no other default encryption on its target (decisions/storage/buckets.py log_delivery_statements).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.iam import policy_document
from decisions.storage import buckets
from decisions.storage.buckets import Lifecycle

KEY_DELETION_WINDOW_DAYS = 30      # the longest KMS allows: a key deleted by mistake can be restored for a month


@dataclass(frozen=True)
class SecureBucketArgs:
    # decisions.storage.buckets.bucket_name: global, so stack and account are in it
    bucket_name: str
    lifecycle: Lifecycle
    account_id: str
    partition: str
    log_bucket: Optional[pulumi.Input[str]]     # where access logs go; None: this IS the log bucket
    log_sources: Sequence[str] = ()             # the log bucket only: the buckets (names) that log into it
    key_statements: Sequence[Mapping[str, Any]] = ()   # services that use the key besides S3 for this account
    force_destroy: bool = False                 # dev only: let `pulumi destroy` empty the bucket


class SecureBucket(pulumi.ComponentResource):
    bucket: aws.s3.Bucket
    versioning: aws.s3.BucketVersioning
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    key_arn: Optional[pulumi.Output[str]]      # None for the log bucket (SSE-S3)

    def __init__(self, name: str, args: SecureBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:buckets:SecureBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Protected: losing either loses the data (a key deleted makes every object unreadable).
        protected = pulumi.ResourceOptions(parent=self, protect=True)
        receives_logs = args.log_bucket is None
        if receives_logs and args.key_statements:
            raise ValueError(f"{args.bucket_name}: the log bucket is SSE-S3 and has no key to grant")
        self.key: Optional[aws.kms.Key] = None
        if not receives_logs:
            account_root = f"arn:{args.partition}:iam::{args.account_id}:root"
            key_statements = [
                # IAM policies in this account decide who uses the key (the account's default key policy).
                {"Sid": "AccountAdministersThroughIam", "Effect": "Allow", "Principal": {"AWS": account_root},
                 "Action": "kms:*", "Resource": "*"},
                *args.key_statements]
            self.key = aws.kms.Key(f"{name}-key", description=f"S3 bucket {args.bucket_name}",
                                   enable_key_rotation=True, deletion_window_in_days=KEY_DELETION_WINDOW_DAYS,
                                   policy=policy_document(*key_statements), opts=protected)
            aws.kms.Alias(f"{name}-key-alias", name=buckets.key_alias(args.bucket_name),
                          target_key_id=self.key.key_id, opts=child)

        self.bucket = aws.s3.Bucket(f"{name}-bucket", bucket=args.bucket_name, force_destroy=args.force_destroy,
                                    opts=protected)
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"), opts=child)
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        default_encryption = aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
            apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                sse_algorithm=buckets.LOG_BUCKET_SSE)) if self.key is None else \
            aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=self.key.arn),
                bucket_key_enabled=True)
        aws.s3.BucketServerSideEncryptionConfiguration(f"{name}-encryption", bucket=self.bucket.id,
                                                       rules=[default_encryption], opts=child)
        self.versioning = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"), opts=child)
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=self.bucket.id, rules=_lifecycle_rules(args.lifecycle),
            # Lifecycle rules about noncurrent versions need versioning on first (provider docs).
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.versioning]))
        bucket_objects = pulumi.Output.concat(self.bucket.arn, "/*")
        log_delivery = buckets.log_delivery_statements(args.partition, args.account_id, args.bucket_name,
                                                       args.log_sources) if receives_logs else []
        aws.s3.BucketPolicy(f"{name}-policy", bucket=self.bucket.id, policy=policy_document(
            {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [self.bucket.arn, bucket_objects], "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
            *log_delivery),
            # S3 refuses concurrent changes to a bucket's access settings (409 OperationAborted).
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access]))
        if not receives_logs:
            aws.s3.BucketLogging(f"{name}-access-logs", bucket=self.bucket.id, target_bucket=args.log_bucket,
                                 target_prefix=buckets.log_prefix(args.bucket_name), opts=child)

        self.bucket_name = self.bucket.bucket
        self.bucket_arn = self.bucket.arn
        self.key_arn = self.key.arn if self.key is not None else None
        self.register_outputs({"bucketName": self.bucket_name, "bucketArn": self.bucket_arn, "keyArn": self.key_arn})


def _lifecycle_rules(lifecycle: Lifecycle) -> list:
    """One rule for the whole bucket, one for a prefix that expires; a bucket whose objects expire also clears the
    delete markers the expiry leaves."""
    rule = aws.s3.BucketLifecycleConfigurationRuleArgs(
        id="versions-uploads-and-tiering", status="Enabled",
        filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
        noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
            noncurrent_days=lifecycle.noncurrent_days),
        abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
            days_after_initiation=lifecycle.abort_upload_days),
        transitions=[aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(
            days=lifecycle.transition[0], storage_class=lifecycle.transition[1])] if lifecycle.transition else None,
        expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=lifecycle.expire_days)
        if lifecycle.expire_days else None)
    rules = [rule]
    if lifecycle.expire_prefix:
        prefix, days = lifecycle.expire_prefix
        rules.append(aws.s3.BucketLifecycleConfigurationRuleArgs(
            id=f"expire-{prefix.strip('/')}", status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=prefix),
            expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=days)))
    if not (lifecycle.expire_days or lifecycle.expire_prefix):
        return rules
    # In a versioned bucket an expiry leaves a delete marker; once its noncurrent version is gone it is clutter.
    # (S3 does not allow expired_object_delete_marker beside `days` in one rule.)
    return [*rules, aws.s3.BucketLifecycleConfigurationRuleArgs(
        id="expired-delete-markers", status="Enabled", filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
        expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(expired_object_delete_marker=True))]


def stack_buckets(*, project: str, stack: str, account_id: str, partition: str, region: str, log_retention_days: int,
                  force_destroy: bool, opts: pulumi.ResourceOptions) -> Dict[str, SecureBucket]:
    """Every bucket of the stack by purpose (decisions.storage.buckets.PURPOSES): the log bucket first, as the others
    log to it."""
    def name(purpose: str) -> str:
        return buckets.bucket_name(project, stack, account_id, purpose)

    def make(purpose: str, log_bucket: Optional[pulumi.Input[str]], key_statements: Sequence[Mapping[str, Any]] = (),
             log_sources: Sequence[str] = ()):
        return SecureBucket(purpose, SecureBucketArgs(
            bucket_name=name(purpose), lifecycle=buckets.lifecycle(purpose, log_retention_days), account_id=account_id,
            partition=partition, log_bucket=log_bucket, log_sources=log_sources, key_statements=key_statements,
            force_destroy=force_destroy), opts=opts)

    # The log bucket admits exactly the stack's other buckets, whose names are known before they exist.
    logs = make(buckets.LOGS, None, log_sources=[name(p) for p in buckets.PURPOSES if p != buckets.LOGS])
    made = {buckets.LOGS: logs}
    for purpose in buckets.PURPOSES:
        if purpose != buckets.LOGS:
            # FSx for Lustre imports from and exports to the datasets bucket with its own service-linked role.
            grants = [buckets.fsx_data_repository_key_statement(partition, account_id, region)] \
                if purpose == buckets.DATASETS else []
            made[purpose] = make(purpose, logs.bucket_name, grants)
    return made
