"""The stack's artifact bucket: node verifier bundles (and later other boot-time artifacts).

Nodes download from here at boot and check each object against a SHA-256 baked into their user-data,
so the bucket is private, versioned, encrypted and reachable only over TLS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from components.iam import policy_document


@dataclass(frozen=True)
class ArtifactBucketArgs:
    force_destroy: bool = False   # dev stacks may opt in; objects are rebuilt by the program


class ArtifactBucket(pulumi.ComponentResource):
    bucket: aws.s3.Bucket

    def __init__(self, name: str, args: ArtifactBucketArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:artifacts:ArtifactBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Protected: the bucket holds the exact bundles running nodes were verified against.
        self.bucket = aws.s3.Bucket(f"{name}-bucket", force_destroy=args.force_destroy,
                                    opts=pulumi.ResourceOptions(parent=self, protect=True))
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"), opts=child)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=self.bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"), opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=self.bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms"),
                bucket_key_enabled=True)],
            opts=child)
        aws.s3.BucketPolicy(f"{name}-tls-only", bucket=self.bucket.id, policy=policy_document({
            "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [self.bucket.arn, pulumi.Output.concat(self.bucket.arn, "/*")],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }), opts=child)
        self.bucket_name = self.bucket.bucket
        self.bucket_arn = self.bucket.arn
        self.register_outputs({"bucketName": self.bucket_name, "bucketArn": self.bucket_arn})
