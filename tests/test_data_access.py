"""Training jobs reach the datasets, checkpoints and models buckets, and nothing else, as the `trainer` account."""
import json

import pytest

from spec.buckets import JOB_DATA, bucket_name
from tests.conftest import STACKS

ACCOUNT = "123456789012"


def role_policy(run):
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.startswith("training-data-")]
    return {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}


@pytest.mark.parametrize("stack", STACKS)
def test_the_trainer_account_reads_and_writes_exactly_the_job_buckets(stack_runs, stack):
    run = stack_runs[stack]
    arns = [f"arn:aws:s3:::{bucket_name('gpu-cloud', stack, ACCOUNT, p)}" for p in JOB_DATA]
    by_sid = role_policy(run)
    assert set(by_sid) == {"ListDataBuckets", "ReadWriteData", "UseDataKeysThroughS3"}
    assert by_sid["ListDataBuckets"]["Resource"] == arns
    assert by_sid["ReadWriteData"]["Resource"] == [arn + "/*" for arn in arns]
    assert by_sid["ReadWriteData"]["Action"] == ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                                 "s3:AbortMultipartUpload"]
    keys = {b: run.outputs["buckets"][b]["keyArn"] for b in JOB_DATA}
    assert by_sid["UseDataKeysThroughS3"]["Resource"] == [keys[p] for p in JOB_DATA]
    assert by_sid["UseDataKeysThroughS3"]["Condition"] == {
        "StringEquals": {"kms:ViaService": f"s3.{run.region}.amazonaws.com"}}


@pytest.mark.parametrize("stack", STACKS)
def test_the_role_is_bound_to_the_trainer_account_of_the_training_namespace(stack_runs, stack):
    run = stack_runs[stack]
    association = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "training-data-role-association")
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == ("training", "trainer")
    account = run.one("kubernetes:core/v1:ServiceAccount", "training-data-sa")
    assert account.inputs["metadata"] == {"name": "trainer", "namespace": "training"}
