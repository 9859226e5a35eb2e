"""The artifact bucket and the access log bucket: what keeps node bundles and logs private and bounded."""
import json

import pytest

from components.artifacts import ArtifactBucket, ArtifactBucketArgs
from components.log_bucket import LogBucket, LogBucketArgs
from tests.conftest import run_component

BUCKET = "aws:s3/bucket:Bucket"


@pytest.fixture(scope="module")
def run():
    def build():
        logs = LogBucket("access-logs", LogBucketArgs(account_id="123456789012", retention_days=30))
        ArtifactBucket("artifacts", ArtifactBucketArgs(log_bucket=logs.bucket_name))
    return run_component(build)


def of(run, component, type_):
    return [r for r in run.of_type(type_) if r.name.startswith(component)]


@pytest.mark.parametrize("component", ["artifacts", "access-logs"])
def test_both_buckets_are_private_protected_and_tls_only(run, component):
    (bucket,) = of(run, component, BUCKET)
    assert bucket.protect and not bucket.inputs.get("forceDestroy")
    (block,) = of(run, component, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block.inputs[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                   "restrictPublicBuckets"))
    (ownership,) = of(run, component, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")
    assert ownership.inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"       # no ACLs at all
    (policy,) = of(run, component, "aws:s3/bucketPolicy:BucketPolicy")
    deny = [s for s in json.loads(policy.inputs["policy"])["Statement"] if s["Effect"] == "Deny"]
    assert deny == [{"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                     "Resource": [bucket.state["arn"], bucket.state["arn"] + "/*"],
                     "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]


def test_artifacts_are_versioned_kms_encrypted_and_old_versions_expire(run):
    (versioning,) = of(run, "artifacts", "aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"]["status"] == "Enabled"
    (encryption,) = of(run, "artifacts", "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert encryption.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    (lifecycle,) = of(run, "artifacts", "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    (rule,) = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled" and rule["noncurrentVersionExpiration"]["noncurrentDays"] == 30
    assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 1


def test_artifact_requests_are_logged_to_the_log_bucket(run):
    (logging,) = of(run, "artifacts", "aws:s3/bucketLogging:BucketLogging")
    (log_bucket,) = of(run, "access-logs", BUCKET)
    assert logging.inputs["targetBucket"] == log_bucket.state["bucket"] and logging.inputs["targetPrefix"] == "artifacts/"


def test_the_log_bucket_takes_logs_only_from_this_account_with_sse_s3_and_expires_them(run):
    (encryption,) = of(run, "access-logs", "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    # S3 server access logging cannot deliver to an SSE-KMS bucket
    assert encryption.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    (policy,) = of(run, "access-logs", "aws:s3/bucketPolicy:BucketPolicy")
    (allow,) = [s for s in json.loads(policy.inputs["policy"])["Statement"] if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "logging.s3.amazonaws.com"} and allow["Action"] == "s3:PutObject"
    assert allow["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
    (lifecycle,) = of(run, "access-logs", "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert lifecycle.inputs["rules"][0]["expiration"]["days"] == 30


def test_a_log_retention_below_one_day_is_refused_before_anything_is_registered():
    with pytest.raises(ValueError, match="retention_days must be at least 1"):
        run_component(lambda: LogBucket("logs", LogBucketArgs(account_id="123456789012", retention_days=0)))
