"""Private S3 buckets: the settings every bucket of the stack shares, in one place."""
from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import pulumi
import pulumi_aws as aws

from components.iam import policy_document

ABORT_INCOMPLETE_UPLOADS_DAYS = 1   # a multipart upload left this long is abandoned: its parts would be billed forever


def abort_stale_uploads() -> aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs:
    """The lifecycle setting every bucket's rule carries."""
    return aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
        days_after_initiation=ABORT_INCOMPLETE_UPLOADS_DAYS)


def private_bucket(name: str, *, parent: pulumi.Resource, force_destroy: bool, sse_algorithm: str,
                   policy_statements: Callable[[pulumi.Output], Sequence[Dict[str, Any]]] = lambda arn: ()
                   ) -> aws.s3.Bucket:
    """A protected bucket with ACLs disabled, every public access blocked, default encryption, and a policy
    that refuses plain HTTP (plus `policy_statements(bucket ARN)`)."""
    child = pulumi.ResourceOptions(parent=parent)
    # Protected: every bucket here holds what running nodes or an audit depend on.
    bucket = aws.s3.Bucket(f"{name}-bucket", force_destroy=force_destroy,
                           opts=pulumi.ResourceOptions(parent=parent, protect=True))
    aws.s3.BucketOwnershipControls(
        f"{name}-ownership", bucket=bucket.id,
        rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"), opts=child)
    aws.s3.BucketPublicAccessBlock(
        f"{name}-public-access", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
        ignore_public_acls=True, restrict_public_buckets=True, opts=child)
    aws.s3.BucketServerSideEncryptionConfiguration(
        f"{name}-encryption", bucket=bucket.id,
        rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
            apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                sse_algorithm=sse_algorithm),
            bucket_key_enabled=sse_algorithm == "aws:kms")],
        opts=child)
    aws.s3.BucketPolicy(f"{name}-policy", bucket=bucket.id, policy=policy_document(
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
         "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        *policy_statements(bucket.arn)), opts=child)
    return bucket
