"""The stack's buckets: names that never collide, lifecycle per purpose, and every bucket private, encrypted with
its own key (the log bucket SSE-S3, the only default encryption access logging delivers to), versioned, TLS-only,
logged and protected."""
import json

import pytest

from components.storage.buckets import stack_buckets
from decisions.storage import buckets
from tests.conftest import STACKS, run_component

ACCOUNT = "123456789012"
BUCKET = "aws:s3/bucket:Bucket"
KEY = "aws:kms/key:Key"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
KEYED = [p for p in buckets.PURPOSES if p != "logs"]


# --- names --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("purpose, name", [
    ("datasets", "gpu-cloud-prod-us-east-1-123456789012-datasets"),
    ("checkpoints", "gpu-cloud-prod-us-east-1-123456789012-checkpoints"),
    ("models", "gpu-cloud-prod-us-east-1-123456789012-models"),
    ("artifacts", "gpu-cloud-prod-us-east-1-123456789012-artifacts"),
    ("logs", "gpu-cloud-prod-us-east-1-123456789012-logs"),
])
def test_names_carry_project_stack_account_and_purpose(purpose, name):
    assert buckets.bucket_name("gpu-cloud", "prod-us-east-1", ACCOUNT, purpose) == name


def test_two_regions_or_two_accounts_never_share_a_name():
    names = {buckets.bucket_name("gpu-cloud", stack, account, purpose)
             for stack in STACKS for account in (ACCOUNT, "210987654321") for purpose in buckets.PURPOSES}
    assert len(names) == len(STACKS) * 2 * len(buckets.PURPOSES)


def test_a_name_at_the_limit_is_kept_and_one_over_is_shortened_with_a_stable_hash():
    suffix = f"-{ACCOUNT}-checkpoints"
    fits = "s" * (buckets.BUCKET_NAME_MAX - len(suffix) - len("gpu-cloud-"))
    assert buckets.bucket_name("gpu-cloud", fits, ACCOUNT, "checkpoints") == f"gpu-cloud-{fits}{suffix}"
    long = buckets.bucket_name("gpu-cloud", fits + "s", ACCOUNT, "checkpoints")
    assert len(long) == buckets.BUCKET_NAME_MAX and long.endswith(suffix)
    assert long == buckets.bucket_name("gpu-cloud", fits + "s", ACCOUNT, "checkpoints")   # stable
    assert long != buckets.bucket_name("gpu-cloud", fits + "t", ACCOUNT, "checkpoints")   # still unique


def test_upper_case_and_odd_characters_become_a_valid_name():
    assert buckets.bucket_name("GPU_Cloud", "Dev.Stack", ACCOUNT, "logs") == "gpu-cloud-dev-stack-123456789012-logs"


@pytest.mark.parametrize("account, purpose, message", [
    ("12345", "logs", "12 digits"), (ACCOUNT, "scratch", "unknown bucket purpose 'scratch'")])
def test_bad_account_or_purpose_is_refused(account, purpose, message):
    with pytest.raises(ValueError, match=message):
        buckets.bucket_name("gpu-cloud", "dev", account, purpose)


# --- lifecycle ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("purpose, noncurrent, abort, transition, expire, expire_prefix", [
    ("datasets", 30, 7, (0, "INTELLIGENT_TIERING"), None, None),
    ("checkpoints", 7, 1, (7, "INTELLIGENT_TIERING"), None, None),
    ("models", 30, 1, None, None, None),
    ("artifacts", 30, 1, None, None, ("gate-reports/", 90)),
    ("logs", 1, 1, None, 30, None),
])
def test_lifecycle_per_purpose(purpose, noncurrent, abort, transition, expire, expire_prefix):
    assert buckets.lifecycle(purpose, 30) == buckets.Lifecycle(noncurrent, abort, transition, expire, expire_prefix)


def test_logs_expire_after_the_stacks_retention_and_not_below_a_day():
    assert buckets.lifecycle("logs", 1).expire_days == 1
    with pytest.raises(ValueError, match="at least 1 day"):
        buckets.lifecycle("logs", 0)


# --- the component, for every bucket of a stack ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def run():
    import pulumi
    return run_component(lambda: stack_buckets(
        project="gpu-cloud", stack="test", account_id=ACCOUNT, partition="aws", region="us-east-1",
        log_retention_days=30, force_destroy=False, opts=pulumi.ResourceOptions()))


def parts(run, purpose, type_):
    return [r for r in run.of_type(type_) if r.name.startswith(f"{purpose}-")]


def one(run, purpose, type_):
    (found,) = parts(run, purpose, type_)
    return found


@pytest.mark.parametrize("purpose", KEYED)
def test_every_bucket_and_its_key_are_protected_and_named_for_the_stack(run, purpose):
    bucket, key = one(run, purpose, BUCKET), one(run, purpose, KEY)
    assert bucket.protect and key.protect and not bucket.inputs.get("forceDestroy")
    assert bucket.inputs["bucket"] == f"gpu-cloud-test-{ACCOUNT}-{purpose}"
    assert key.inputs["enableKeyRotation"] is True and key.inputs["deletionWindowInDays"] == 30
    alias = one(run, purpose, "aws:kms/alias:Alias")
    assert alias.inputs["name"] == f"alias/s3/gpu-cloud-test-{ACCOUNT}-{purpose}"


@pytest.mark.parametrize("purpose", buckets.PURPOSES)
def test_every_bucket_is_encrypted_with_its_own_key_versioned_and_private(run, purpose):
    (rule,) = one(run, purpose, SSE).inputs["rules"]
    if purpose == "logs":
        # S3 User Guide, Enabling Amazon S3 server access logging: SSE-S3 only on the target ("Default server-side
        # encryption with AWS Key Management Service (AWS KMS) keys (SSE-KMS) is not supported").
        assert rule == {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}
        assert parts(run, purpose, KEY) == [] and parts(run, purpose, "aws:kms/alias:Alias") == []
    else:
        assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "aws:kms",
                                                              "kmsMasterKeyId": one(run, purpose, KEY).state["arn"]}
        assert rule["bucketKeyEnabled"] is True
    assert one(run, purpose, BUCKET).protect
    assert one(run, purpose, "aws:s3/bucketVersioning:BucketVersioning").inputs["versioningConfiguration"] == {
        "status": "Enabled"}
    block = one(run, purpose, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(block.inputs[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                                   "restrictPublicBuckets"))
    ownership = one(run, purpose, "aws:s3/bucketOwnershipControls:BucketOwnershipControls")
    assert ownership.inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"


@pytest.mark.parametrize("purpose", buckets.PURPOSES)
def test_every_bucket_refuses_plain_http(run, purpose):
    bucket = one(run, purpose, BUCKET)
    policy = json.loads(one(run, purpose, "aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny == [{"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                     "Resource": [bucket.state["arn"], bucket.state["arn"] + "/*"],
                     "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]


@pytest.mark.parametrize("purpose", [p for p in buckets.PURPOSES if p != "logs"])
def test_every_bucket_but_the_log_bucket_logs_to_it_under_its_own_prefix(run, purpose):
    logging = one(run, purpose, "aws:s3/bucketLogging:BucketLogging")
    assert logging.inputs["targetBucket"] == one(run, "logs", BUCKET).state["bucket"]
    assert logging.inputs["targetPrefix"] == f"gpu-cloud-test-{ACCOUNT}-{purpose}/"


def test_the_log_bucket_does_not_log_to_itself_and_admits_each_source_bucket_under_its_own_prefix(run):
    assert parts(run, "logs", "aws:s3/bucketLogging:BucketLogging") == []
    policy = json.loads(one(run, "logs", "aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    allows = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    log_bucket = f"gpu-cloud-test-{ACCOUNT}-logs"
    # As the S3 User Guide's example: the logging service principal, s3:PutObject under the prefix, for the source
    # bucket (aws:SourceArn) of the source account (aws:SourceAccount). One statement per bucket that logs here.
    assert sorted((s["Resource"], s["Condition"]["ArnLike"]["aws:SourceArn"]) for s in allows) == sorted(
        (f"arn:aws:s3:::{log_bucket}/gpu-cloud-test-{ACCOUNT}-{p}/*", f"arn:aws:s3:::gpu-cloud-test-{ACCOUNT}-{p}")
        for p in KEYED)
    for allow in allows:
        assert allow["Principal"] == {"Service": "logging.s3.amazonaws.com"} and allow["Action"] == "s3:PutObject"
        assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": ACCOUNT}
        assert set(allow["Condition"]) == {"ArnLike", "StringEquals"}


def test_each_source_bucket_logs_exactly_where_the_log_bucket_admits_it(run):
    allowed = {s["Condition"]["ArnLike"]["aws:SourceArn"].rsplit(":", 1)[1]: s["Resource"] for s in json.loads(
        one(run, "logs", "aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])["Statement"] if s["Effect"] == "Allow"}
    log_bucket = one(run, "logs", BUCKET).state["bucket"]
    for purpose in KEYED:
        logging = one(run, purpose, "aws:s3/bucketLogging:BucketLogging")
        source = one(run, purpose, BUCKET).state["bucket"]
        assert allowed[source] == f"arn:aws:s3:::{log_bucket}/{logging.inputs['targetPrefix']}*"


def test_log_delivery_needs_a_source_and_the_log_bucket_takes_no_key_grant():
    with pytest.raises(ValueError, match="no source bucket"):
        buckets.log_delivery_statements("aws", ACCOUNT, "logs", [])
    from components.storage.buckets import SecureBucket, SecureBucketArgs

    def build():
        SecureBucket("logs", SecureBucketArgs(
            bucket_name="b", lifecycle=buckets.lifecycle("logs", 30), account_id=ACCOUNT, partition="aws",
            log_bucket=None, log_sources=["a"], key_statements=[{"Sid": "X"}]))
    with pytest.raises(Exception, match="SSE-S3 and has no key"):
        run_component(build)


@pytest.mark.parametrize("purpose", KEYED)
def test_only_the_log_bucket_admits_the_logging_service(run, purpose):
    statements = json.loads(one(run, purpose, "aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])["Statement"]
    assert [s["Effect"] for s in statements] == ["Deny"]
    key_policy = json.loads(one(run, purpose, KEY).inputs["policy"])
    assert "logging.s3.amazonaws.com" not in json.dumps(key_policy)


@pytest.mark.parametrize("purpose", buckets.PURPOSES)
def test_lifecycle_rules_are_the_purposes(run, purpose):
    life = buckets.lifecycle(purpose, 30)
    config = one(run, purpose, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    main = config.inputs["rules"][0]
    assert main["status"] == "Enabled" and main["filter"] == {"prefix": ""}
    assert main["noncurrentVersionExpiration"]["noncurrentDays"] == life.noncurrent_days
    assert main["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == life.abort_upload_days
    assert main.get("transitions") == ([{"days": life.transition[0], "storageClass": life.transition[1]}]
                                       if life.transition else None)
    assert (main.get("expiration") or {}).get("days") == life.expire_days
    # noncurrent-version rules need versioning on first
    assert one(run, purpose, "aws:s3/bucketVersioning:BucketVersioning").urn in config.dependencies


def test_the_gates_verdicts_expire_after_a_quarter_and_the_bundles_never(run):
    rules = one(run, "artifacts", "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    assert [r["id"] for r in rules] == ["versions-uploads-and-tiering", "expire-gate-reports", "expired-delete-markers"]
    assert rules[1]["filter"] == {"prefix": "gate-reports/"} and rules[1]["expiration"] == {"days": 90}
    assert rules[2]["expiration"] == {"expiredObjectDeleteMarker": True}


def test_the_log_bucket_clears_the_delete_markers_its_expiry_leaves(run):
    rules = one(run, "logs", "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    assert [r["id"] for r in rules] == ["versions-uploads-and-tiering", "expired-delete-markers"]
    assert rules[1]["expiration"] == {"expiredObjectDeleteMarker": True}


def test_only_the_datasets_key_lets_fsx_use_it_through_s3_in_this_region(run):
    statement = buckets.fsx_data_repository_key_statement("aws", ACCOUNT, "us-east-1")
    assert statement["Condition"] == {
        "ArnLike": {"aws:PrincipalArn": "arn:aws:iam::123456789012:role/aws-service-role/"
                                        "s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"},
        "StringEquals": {"kms:CallerAccount": ACCOUNT, "kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    for purpose in KEYED:
        has = statement in json.loads(one(run, purpose, KEY).inputs["policy"])["Statement"]
        assert has == (purpose == "datasets"), purpose


@pytest.mark.parametrize("purpose", KEYED)
def test_each_key_is_administered_through_this_accounts_iam(run, purpose):
    first = json.loads(one(run, purpose, KEY).inputs["policy"])["Statement"][0]
    assert first["Principal"] == {"AWS": f"arn:aws:iam::{ACCOUNT}:root"} and first["Action"] == "kms:*"


def test_the_bucket_policy_waits_for_the_public_access_block(run):
    # S3 answers 409 OperationAborted to concurrent changes of a bucket's access settings
    for purpose in buckets.PURPOSES:
        block = one(run, purpose, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
        assert block.urn in one(run, purpose, "aws:s3/bucketPolicy:BucketPolicy").dependencies


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_makes_all_five_buckets_and_exports_them(stack_runs, stack):
    run = stack_runs[stack]
    names = sorted(r.inputs["bucket"] for r in run.of_type(BUCKET))
    assert names == sorted(buckets.bucket_name("gpu-cloud", stack, ACCOUNT, p) for p in buckets.PURPOSES)
    exported = run.outputs["buckets"]
    assert set(exported) == set(buckets.PURPOSES)
    assert exported["models"]["arn"] == f"arn:aws:s3:::{buckets.bucket_name('gpu-cloud', stack, ACCOUNT, 'models')}"
    assert all(b["keyArn"].startswith(f"arn:aws:kms:{run.region}:{ACCOUNT}:key/")
               for p, b in exported.items() if p != "logs")
    assert exported["logs"]["keyArn"] is None                  # SSE-S3: no key to give a reader


@pytest.mark.parametrize("stack", STACKS)
def test_every_stacks_log_bucket_is_sse_s3_and_admits_exactly_its_other_buckets(stack_runs, stack):
    run = stack_runs[stack]
    (rule,) = run.one(SSE, "logs-encryption").inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "AES256"}
    statements = json.loads(run.one("aws:s3/bucketPolicy:BucketPolicy", "logs-policy").inputs["policy"])["Statement"]
    sources = {s["Condition"]["ArnLike"]["aws:SourceArn"] for s in statements if s["Effect"] == "Allow"}
    targets = {l.inputs["bucket"] for l in run.of_type("aws:s3/bucketLogging:BucketLogging")}
    assert sources == {f"arn:aws:s3:::{b}" for b in targets} and len(targets) == 4
    others = [r for r in run.of_type(SSE) if r.name != "logs-encryption"]
    assert all(r.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms" for r in others)


def test_dev_may_empty_its_buckets_on_destroy_and_prod_may_not(stack_runs):
    assert all(r.inputs.get("forceDestroy") for r in stack_runs["dev"].of_type(BUCKET))
    assert not any(r.inputs.get("forceDestroy") for r in stack_runs["prod-us-east-1"].of_type(BUCKET))


def test_lustre_links_the_datasets_bucket_when_no_import_path_is_set(stack_runs):
    (association,) = stack_runs["prod-us-east-1"].of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert association.inputs["dataRepositoryPath"] == \
        f"s3://{buckets.bucket_name('gpu-cloud', 'prod-us-east-1', ACCOUNT, 'datasets')}/"
    assert association.inputs["fileSystemPath"] == "/data"


@pytest.mark.parametrize("stack, replication", [
    ("prod-us-east-1", "to acme/gpu-cloud/prod-eu-west-1 (RTC: 15 min recovery point)"),
    ("prod-eu-west-1", "receives acme/gpu-cloud/prod-us-east-1's replicas"),
    ("dev", "-"),
])
def test_the_plan_shows_each_stacks_buckets_and_what_replicates(stack, replication):
    from plan.document import _storage_lines, storage_section
    from plan.stackfile import load_stack
    _, spec = load_stack(stack)
    rows = {row["purpose"]: row for row in storage_section(spec)["buckets"]}
    assert [rows[p]["name"] for p in buckets.PURPOSES] == [buckets.bucket_name("gpu-cloud", stack, ACCOUNT, p)
                                                            for p in buckets.PURPOSES]
    replicated = {p for p, row in rows.items() if row["replication"]}
    assert replicated == (set() if stack == "dev" else {"checkpoints", "models"})
    (line,) = [line for line in _storage_lines(storage_section(spec)) if "-checkpoints " in line]
    assert line.rstrip().endswith(replication)


def test_the_documented_way_to_empty_a_prod_bucket_removes_every_version_and_delete_marker(tmp_path):
    """docs/deploying.md "Destroying a stack": its loop, run as written with the AWS CLI against S3 in moto's
    server mode, empties a versioned bucket of more than one page of versions and delete markers, after which S3
    deletes the bucket (which it refuses while any version is left)."""
    import os
    import re
    import subprocess
    from pathlib import Path

    import boto3

    from tests.conftest import ROOT, require_tool
    from tests.loopback import moto_server

    aws = require_tool("aws")
    page = (ROOT / "docs/deploying.md").read_text()
    block = next(b for b in re.findall(r"```sh cluster\n(.*?)```", page, re.S) if "list-object-versions" in b)
    block = re.sub(r"^\s*bucket=\S+\n", "", block.replace("\n   ", "\n"), flags=re.M)

    with moto_server() as endpoint:
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "PATH": f"{Path(aws).parent}{os.pathsep}{os.environ['PATH']}", "bucket": "ckpt"}
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        s3.create_bucket(Bucket="ckpt")
        s3.put_bucket_versioning(Bucket="ckpt", VersioningConfiguration={"Status": "Enabled"})
        for i in range(1100):                       # 1,100 current versions
            s3.put_object(Bucket="ckpt", Key=f"step-{i:05d}/model.pt", Body=b"x")
        for i in range(50):                         # 50 noncurrent versions and 50 delete markers
            s3.put_object(Bucket="ckpt", Key=f"step-{i:05d}/model.pt", Body=b"y")
            s3.delete_object(Bucket="ckpt", Key=f"step-{i:05d}/model.pt")
        with pytest.raises(s3.exceptions.ClientError, match="BucketNotEmpty"):
            s3.delete_bucket(Bucket="ckpt")
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr
        listing = s3.list_object_versions(Bucket="ckpt")
        assert not listing.get("Versions") and not listing.get("DeleteMarkers")
        s3.delete_bucket(Bucket="ckpt")
