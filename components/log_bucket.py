"""The stack's S3 server access log bucket: where every other bucket of the stack logs its requests.

Server access logs can only be delivered to a bucket encrypted with SSE-S3 (not SSE-KMS), by the S3 logging
service, which the bucket policy admits for this account's buckets (ACLs are disabled). Logs expire after
the stack's log retention.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from components.buckets import abort_stale_uploads, private_bucket



@dataclass(frozen=True)
class LogBucketArgs:
    account_id: str
    retention_days: int               # how long access logs are kept (monitoring.retentionDays)
    force_destroy: bool = False


class LogBucket(pulumi.ComponentResource):
    bucket: aws.s3.Bucket
    bucket_name: pulumi.Output[str]

    def __init__(self, name: str, args: LogBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if args.retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, got {args.retention_days}")
        super().__init__("gpu-cloud:log_bucket:LogBucket", name, None, opts)
        self.bucket = private_bucket(name, parent=self, force_destroy=args.force_destroy, sse_algorithm="AES256",
                                     policy_statements=lambda arn: [{
                                         "Sid": "S3ServerAccessLogDelivery", "Effect": "Allow",
                                         "Principal": {"Service": "logging.s3.amazonaws.com"},
                                         "Action": "s3:PutObject", "Resource": pulumi.Output.concat(arn, "/*"),
                                         "Condition": {"StringEquals": {"aws:SourceAccount": args.account_id}}}])
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=self.bucket.id, rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-access-logs", status="Enabled", filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=args.retention_days),
                abort_incomplete_multipart_upload=abort_stale_uploads())],
            opts=pulumi.ResourceOptions(parent=self))
        self.bucket_name = self.bucket.bucket
        self.register_outputs({"bucketName": self.bucket_name})
