"""Who may change Triton's models (decisions/storage/data_access.py), held against moto in server mode on 127.0.0.1 with
its authentication on, as tests/test_aws_api.py does: every request is signed, moto recomputes the signature and applies
the IAM policy of the IAM user holding exactly the trainer's or the publisher's statements, on the object's ARN
(moto/core/authorization.py _authenticate_and_authorize_s3_action). moto evaluates no condition of an identity
policy, so the KMS statements (conditioned on kms:ViaService) are not held here; the buckets are unencrypted.

What users rely on: a training job can read a published model and cannot replace or delete it; Triton's model sync
can list and read the repository and change nothing; the publisher can publish, delete and roll back a model in
Triton's repository, and cannot destroy its history or write elsewhere.
"""
from __future__ import annotations

import contextlib
import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import settings
from moto.core.authorization import ActionAuthenticatorMixin

from decisions.storage.data_access import DataBucket, publisher_statements, reader_statements, trainer_statements
from tests.loopback import moto_server

REGION, ACCOUNT = "us-east-1", "123456789012"
DATASETS, CHECKPOINTS, MODELS = (f"gpu-cloud-prod-{ACCOUNT}-{p}" for p in ("datasets", "checkpoints", "models"))
MODEL = "triton/resnet50/1/model.onnx"


def _arn(bucket: str) -> str:
    return f"arn:aws:s3:::{bucket}"


def _key(bucket: str) -> str:
    return f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{bucket}"


@pytest.fixture(scope="module")
def world():
    """The three job buckets (versioned, as the stack's are), a published model, and one IAM user per identity
    holding exactly its statements; then moto's authentication on."""
    server = contextlib.ExitStack()
    endpoint = server.enter_context(moto_server())
    common = dict(endpoint_url=endpoint, region_name=REGION, config=Config(s3={"addressing_style": "path"}))
    admin = {**common, "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    s3, iam = boto3.client("s3", **admin), boto3.client("iam", **admin)
    for bucket in (DATASETS, CHECKPOINTS, MODELS):
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=MODELS, Key=MODEL, Body=b"weights-1")
    s3.put_object(Bucket=MODELS, Key="triton/resnet50/config.pbtxt", Body=b'name: "resnet50"')
    policies = {
        "trainer": trainer_statements([DataBucket(_arn(DATASETS), _key(DATASETS)),
                                       DataBucket(_arn(CHECKPOINTS), _key(CHECKPOINTS)),
                                       DataBucket(_arn(MODELS), _key(MODELS), writable=False)], REGION),
        "publisher": publisher_statements(_arn(MODELS), "triton", _key(MODELS), REGION),
        "triton": reader_statements("Models", _arn(MODELS), _key(MODELS), REGION)}   # its model sync
    clients = {}
    for user, statements in policies.items():
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": statements}))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        clients[user] = boto3.client("s3", aws_access_key_id=key["AccessKeyId"],
                                     aws_secret_access_key=key["SecretAccessKey"], **common)
    clients["forged"] = boto3.client("s3", aws_access_key_id=key["AccessKeyId"],
                                     aws_secret_access_key="not-the-secret", **common)
    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0          # every request from here on is authenticated and authorized
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield clients
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before
        server.close()


def _denied(call, **kwargs) -> bool:
    try:
        call(**kwargs)
    except ClientError as error:
        assert error.response["Error"]["Code"] == "AccessDenied", error.response
        return True
    return False


def test_moto_checks_the_signature(world):
    with pytest.raises(ClientError) as raised:
        world["forged"].get_object(Bucket=MODELS, Key=MODEL)
    assert raised.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_a_training_job_reads_models_and_cannot_replace_or_delete_them(world):
    trainer = world["trainer"]
    assert trainer.get_object(Bucket=MODELS, Key=MODEL)["Body"].read() == b"weights-1"
    assert [o["Key"] for o in trainer.list_objects_v2(Bucket=MODELS, Prefix="triton/")["Contents"]] == [
        "triton/resnet50/1/model.onnx", "triton/resnet50/config.pbtxt"]
    assert _denied(trainer.put_object, Bucket=MODELS, Key=MODEL, Body=b"half-trained")
    assert _denied(trainer.put_object, Bucket=MODELS, Key="triton/new/config.pbtxt", Body=b"x")
    assert _denied(trainer.delete_object, Bucket=MODELS, Key=MODEL)
    assert _denied(trainer.create_multipart_upload, Bucket=MODELS, Key=MODEL)
    assert trainer.get_object(Bucket=MODELS, Key=MODEL)["Body"].read() == b"weights-1"


def test_a_training_job_still_writes_and_prunes_its_checkpoints_and_datasets(world):
    trainer = world["trainer"]
    for bucket in (CHECKPOINTS, DATASETS):
        trainer.put_object(Bucket=bucket, Key="job-1/step-100.pt", Body=b"state")
        trainer.delete_object(Bucket=bucket, Key="job-1/step-100.pt")


def test_tritons_model_sync_lists_and_reads_the_repository_and_changes_nothing(world):
    sync = world["triton"]
    assert [o["Key"] for o in sync.list_objects_v2(Bucket=MODELS, Prefix="triton/")["Contents"]] == [
        "triton/resnet50/1/model.onnx", "triton/resnet50/config.pbtxt"]
    assert sync.get_object(Bucket=MODELS, Key=MODEL)["Body"].read() == b"weights-1"
    assert _denied(sync.put_object, Bucket=MODELS, Key=MODEL, Body=b"x")
    assert _denied(sync.delete_object, Bucket=MODELS, Key=MODEL)
    assert _denied(sync.list_object_versions, Bucket=MODELS, Prefix="triton/")
    assert _denied(sync.get_object, Bucket=DATASETS, Key="anything")


def test_the_publisher_publishes_deletes_and_rolls_back_a_model(world):
    publisher = world["publisher"]
    publisher.put_object(Bucket=MODELS, Key=MODEL, Body=b"weights-2")         # a bad release
    publisher.delete_object(Bucket=MODELS, Key="triton/resnet50/config.pbtxt")  # and a slip
    with pytest.raises(ClientError, match="NoSuchKey"):
        publisher.get_object(Bucket=MODELS, Key="triton/resnet50/config.pbtxt")
    # Rolling back, as docs/inference.md shows it: find the versions, copy the good ones back over the current.
    versions = publisher.list_object_versions(Bucket=MODELS, Prefix="triton/resnet50/")
    model_versions = [v for v in versions["Versions"] if v["Key"] == MODEL]
    good = next(v for v in model_versions if not v["IsLatest"])
    assert publisher.get_object(Bucket=MODELS, Key=MODEL, VersionId=good["VersionId"])["Body"].read() == b"weights-1"
    publisher.copy_object(Bucket=MODELS, Key=MODEL, CopySource={"Bucket": MODELS, "Key": MODEL,
                                                                 "VersionId": good["VersionId"]})
    assert publisher.get_object(Bucket=MODELS, Key=MODEL)["Body"].read() == b"weights-1"
    config = next(v for v in versions["Versions"] if v["Key"] == "triton/resnet50/config.pbtxt")
    publisher.copy_object(Bucket=MODELS, Key=config["Key"], CopySource={"Bucket": MODELS, "Key": config["Key"],
                                                                         "VersionId": config["VersionId"]})
    assert publisher.get_object(Bucket=MODELS, Key=config["Key"])["Body"].read() == b'name: "resnet50"'


def test_the_publisher_cannot_destroy_history_or_write_outside_the_repository(world):
    publisher = world["publisher"]
    version = publisher.list_object_versions(Bucket=MODELS, Prefix=MODEL)["Versions"][-1]["VersionId"]
    assert _denied(publisher.delete_object, Bucket=MODELS, Key=MODEL, VersionId=version)
    assert _denied(publisher.put_object, Bucket=MODELS, Key="elsewhere/config.pbtxt", Body=b"x")
    assert _denied(publisher.put_object, Bucket=CHECKPOINTS, Key="triton/x", Body=b"x")
    assert _denied(publisher.get_object, Bucket=CHECKPOINTS, Key="job-1/step-100.pt")
