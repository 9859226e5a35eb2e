"""Training jobs reach the datasets, checkpoints and models buckets, and nothing else, as the `trainer` account; they
write the first two only (what the statements allow against IAM itself: tests/test_model_access.py)."""
import json

import pytest

from decisions.storage import data_access
from decisions.storage.buckets import JOB_DATA, JOB_READ_ONLY, bucket_name
from decisions.storage.data_access import DataBucket
from tests.conftest import STACKS

ACCOUNT = "123456789012"


def role_policy(run):
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.startswith("training-data-")]
    return {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}


@pytest.mark.parametrize("stack", STACKS)
def test_the_trainer_account_reads_the_job_buckets_and_writes_all_but_the_models(stack_runs, stack):
    run = stack_runs[stack]
    arns = {p: f"arn:aws:s3:::{bucket_name('gpu-cloud', stack, ACCOUNT, p)}" for p in JOB_DATA}
    keys = {p: run.outputs["buckets"][p]["keyArn"] for p in JOB_DATA}
    writable = [p for p in JOB_DATA if p not in JOB_READ_ONLY]
    assert JOB_READ_ONLY == ("models",) and writable == ["datasets", "checkpoints"]
    by_sid = role_policy(run)
    assert set(by_sid) == {"ListDataBuckets", "ReadData", "DecryptDataThroughS3", "WriteData", "EncryptDataThroughS3"}
    assert by_sid["ListDataBuckets"]["Resource"] == [arns[p] for p in JOB_DATA]
    assert (by_sid["ReadData"]["Action"], by_sid["ReadData"]["Resource"]) == (
        "s3:GetObject", [arns[p] + "/*" for p in JOB_DATA])
    assert by_sid["WriteData"]["Resource"] == [arns[p] + "/*" for p in writable]
    assert by_sid["WriteData"]["Action"] == ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    assert by_sid["DecryptDataThroughS3"]["Resource"] == [keys[p] for p in JOB_DATA]
    assert by_sid["EncryptDataThroughS3"]["Resource"] == [keys[p] for p in writable]
    for sid in ("DecryptDataThroughS3", "EncryptDataThroughS3"):
        assert by_sid[sid]["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{run.region}.amazonaws.com"}}


@pytest.mark.parametrize("stack", STACKS)
def test_the_role_is_bound_to_the_trainer_account_of_the_training_namespace(stack_runs, stack):
    run = stack_runs[stack]
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "training-data-role-association")
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == ("training", "trainer")
    account = run.one("kubernetes:core/v1:ServiceAccount", "training-data-sa")
    assert account.inputs["metadata"] == {"name": "trainer", "namespace": "training"}


# --- the reader's statements (decisions/storage/data_access.reader_statements), shared by the trainer and Triton
# -----------------------------------------------------------------------------------------------------------------
BUCKET, KEY = "arn:aws:s3:::gpu-cloud-prod-123456789012-models", "arn:aws:kms:us-east-1:123456789012:key/models"


def test_one_bucket_is_named_as_a_string_with_its_key_used_through_s3_only():
    assert data_access.reader_statements("Models", BUCKET, KEY, "us-east-1") == [
        {"Sid": "ListModels", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET},
        {"Sid": "ReadModels", "Effect": "Allow", "Action": "s3:GetObject", "Resource": BUCKET + "/*"},
        {"Sid": "DecryptModelsThroughS3", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": KEY,
         "Condition": {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}}]


def test_several_buckets_are_listed_and_a_repository_without_the_stacks_key_gets_no_kms_grant():
    other = "arn:aws:s3:::acme-models"
    statements = data_access.reader_statements("Data", [BUCKET, other], None, "eu-west-1", list_sid="ListDataBuckets")
    assert statements == [
        {"Sid": "ListDataBuckets", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": [BUCKET, other]},
        {"Sid": "ReadData", "Effect": "Allow", "Action": "s3:GetObject", "Resource": [BUCKET + "/*", other + "/*"]}]


def test_the_trainers_reads_are_the_readers():
    buckets = [DataBucket(BUCKET, KEY, writable=False), DataBucket(BUCKET + "-2", KEY + "-2")]
    reads = data_access.reader_statements("Data", [BUCKET, BUCKET + "-2"], [KEY, KEY + "-2"], "us-east-1",
                                          list_sid="ListDataBuckets")
    assert data_access.trainer_statements(buckets, "us-east-1")[:3] == reads


@pytest.mark.parametrize("buckets, keys", [([], None), ("", None), ([BUCKET], [])])
def test_a_reader_of_nothing_is_refused(buckets, keys):
    with pytest.raises(ValueError, match="a reader needs at least one bucket"):
        data_access.reader_statements("Models", buckets, keys, "us-east-1")
