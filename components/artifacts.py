"""The stack's artifact bucket: node verifier bundles (and later other boot-time artifacts).

Nodes download from here at boot and check each object against a SHA-256 baked into their user-data,
so the bucket is private, versioned, encrypted and reachable only over TLS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from components.buckets import abort_stale_uploads, private_bucket

# Bundles a pool no longer uses become noncurrent when Pulumi deletes them; nodes read them only at boot.
NONCURRENT_VERSION_DAYS = 30


@dataclass(frozen=True)
class ArtifactBucketArgs:
    log_bucket: pulumi.Input[str]   # where S3 server access logs go (components/log_bucket.py)
    force_destroy: bool = False     # dev stacks may opt in; objects are rebuilt by the program


class ArtifactBucket(pulumi.ComponentResource):
    bucket: aws.s3.Bucket

    def __init__(self, name: str, args: ArtifactBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:artifacts:ArtifactBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = private_bucket(name, parent=self, force_destroy=args.force_destroy, sse_algorithm="aws:kms")
        aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"), opts=child)
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=self.bucket.id, rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="old-bundles-and-stale-uploads", status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=NONCURRENT_VERSION_DAYS),
                abort_incomplete_multipart_upload=abort_stale_uploads())],
            opts=child)
        aws.s3.BucketLogging(f"{name}-access-logs", bucket=self.bucket.id, target_bucket=args.log_bucket,
                             target_prefix=f"{name}/", opts=child)
        self.bucket_name = self.bucket.bucket
        self.bucket_arn = self.bucket.arn
        self.register_outputs({"bucketName": self.bucket_name, "bucketArn": self.bucket_arn})
