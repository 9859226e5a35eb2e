"""Cross-region replication: a primary replicates checkpoints and models into the peer stack's buckets, with the
peer's keys, checkpoints' deletes (not models') and a stated 15-minute recovery point; a secondary replicates
nothing."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from decisions.storage import replication
from decisions.storage.replication import ReplicaPair
from plan.engine import peer_stack_outputs
from tests.conftest import run_stack

ROOT = Path(__file__).resolve().parent.parent
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
SRC = "arn:aws:s3:::src-checkpoints"
DST = "arn:aws:s3:::dst-checkpoints"
SRC_KEY = "arn:aws:kms:us-east-1:123456789012:key/src"
DST_KEY = "arn:aws:kms:eu-west-1:123456789012:key/dst"


def test_the_role_may_do_exactly_what_replication_needs_and_no_more():
    statements = replication.role_policy_statements(
        [ReplicaPair("checkpoints", SRC, SRC_KEY, DST, DST_KEY)])
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["ReadReplicationConfiguration"]["Resource"] == [SRC]
    assert by_sid["ReadSourceVersions"]["Resource"] == [SRC + "/*"]
    assert by_sid["WriteReplicas"] == {"Sid": "WriteReplicas", "Effect": "Allow",
                                       "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                                       "Resource": [DST + "/*"]}
    # decrypt only with the source key, through S3 in the source region, for objects of the source bucket
    assert by_sid["DecryptCheckpointsSource"] == {
        "Sid": "DecryptCheckpointsSource", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": SRC_KEY,
        "Condition": {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"},
                      "StringLike": {"kms:EncryptionContext:aws:s3:arn": [SRC, SRC + "/*"]}}}
    assert by_sid["EncryptCheckpointsReplica"] == {
        "Sid": "EncryptCheckpointsReplica", "Effect": "Allow", "Action": ["kms:Encrypt", "kms:GenerateDataKey"],
        "Resource": DST_KEY,
        "Condition": {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"},
                      "StringLike": {"kms:EncryptionContext:aws:s3:arn": [DST, DST + "/*"]}}}
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not any(a.endswith("*") for a in actions) and "s3:PutObject" not in actions


def test_deletes_replicate_for_checkpoints_and_not_for_models():
    assert replication.delete_marker_replication("checkpoints") == "Enabled"
    assert replication.delete_marker_replication("models") == "Disabled"
    with pytest.raises(ValueError, match="'datasets' is not replicated"):
        replication.delete_marker_replication("datasets")


def test_nothing_to_replicate_is_an_error():
    with pytest.raises(ValueError, match="no bucket to replicate"):
        replication.role_policy_statements([])


@pytest.mark.parametrize("arn", ["arn:aws:s3:::bucket", "arn:aws:kms::123456789012:key/x", "key/x", None])
def test_a_target_key_that_is_not_a_kms_key_arn_is_refused(arn):
    with pytest.raises(ValueError, match="is not a KMS key ARN"):
        replication.role_policy_statements([ReplicaPair("models", SRC, SRC_KEY, DST, arn)])


@pytest.mark.parametrize("exports, missing", [
    ({}, "buckets.models"), ({"models": {"arn": "arn:aws:s3:::x"}}, "buckets.models"), (None, "buckets.models")])
def test_a_peer_that_exports_no_bucket_is_a_clear_error(exports, missing):
    with pytest.raises(ValueError, match=f"exports no {missing}.*run `pulumi up` on the peer stack first"):
        replication.peer_bucket(exports, "acme/gpu-cloud/prod-eu-west-1", "models")


@pytest.fixture(scope="module")
def peer_exports(stack_runs):
    """What the secondary really exports when its own program runs."""
    return stack_runs["prod-eu-west-1"].outputs["buckets"]


@pytest.mark.parametrize("purpose", replication_purposes := ["checkpoints", "models"])
def test_the_primary_replicates_into_the_peers_bucket_with_the_peers_key(stack_runs, peer_exports, purpose):
    run = stack_runs["prod-us-east-1"]
    config = run.one(REPLICATION, f"replication-{purpose}")
    source = next(r for r in run.of_type("aws:s3/bucket:Bucket") if r.name == f"{purpose}-bucket")
    assert config.inputs["bucket"] == source.state["bucket"]
    (rule,) = config.inputs["rules"]
    destination = rule["destination"]
    # the targets come from the StackReference and are what the peer's own program exports
    assert destination["bucket"] == peer_exports[purpose]["arn"]
    assert destination["encryptionConfiguration"] == {"replicaKmsKeyId": peer_exports[purpose]["keyArn"]}
    assert ":eu-west-1:" in peer_exports[purpose]["keyArn"]
    assert rule["status"] == "Enabled" and rule["filter"] == {"prefix": ""}
    # A pruned checkpoint is pruned in both regions; a deleted model keeps serving in the peer
    # (decisions/storage/replication.py).
    assert rule["deleteMarkerReplication"] == {"status": {"checkpoints": "Enabled", "models": "Disabled"}[purpose]}
    assert rule["sourceSelectionCriteria"] == {"sseKmsEncryptedObjects": {"status": "Enabled"}}
    assert destination["replicationTime"] == {"status": "Enabled", "time": {"minutes": 15}}
    assert destination["metrics"] == {"status": "Enabled", "eventThreshold": {"minutes": 15}}


def test_the_offline_plan_answers_the_peer_as_the_peer_itself_would(peer_exports):
    assert peer_stack_outputs("acme/gpu-cloud/prod-eu-west-1")["buckets"] == peer_exports


def test_replication_waits_for_versioning_and_the_roles_policy(stack_runs):
    run = stack_runs["prod-us-east-1"]
    policy = run.one("aws:iam/rolePolicy:RolePolicy", "replication-policy")
    for purpose in replication_purposes:
        config = run.one(REPLICATION, f"replication-{purpose}")
        versioning = run.one("aws:s3/bucketVersioning:BucketVersioning", f"{purpose}-versioning")
        assert {versioning.urn, policy.urn} <= set(config.dependencies)


def test_the_primarys_role_covers_exactly_its_two_buckets_and_the_peers(stack_runs, peer_exports):
    run = stack_runs["prod-us-east-1"]
    role = run.one("aws:iam/role:Role", "replication-role")
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "s3.amazonaws.com"}
    policy = json.loads(run.one("aws:iam/rolePolicy:RolePolicy", "replication-policy").inputs["policy"])
    writes = next(s for s in policy["Statement"] if s["Sid"] == "WriteReplicas")
    assert writes["Resource"] == [peer_exports[p]["arn"] + "/*" for p in replication_purposes]
    keys = {s["Resource"] for s in policy["Statement"] if s["Sid"].startswith("Encrypt")}
    assert keys == {peer_exports[p]["keyArn"] for p in replication_purposes}


@pytest.mark.parametrize("stack", ["prod-eu-west-1", "dev"])
def test_a_secondary_or_a_stack_without_dr_replicates_nothing(stack_runs, stack):
    run = stack_runs[stack]
    assert run.of_type(REPLICATION) == [] and run.of_type("pulumi:pulumi:StackReference") == []


def test_a_primary_whose_peer_is_not_deployed_fails_with_the_reason():
    # In its own process: a program that fails inside an Output leaves tasks behind in the Pulumi runtime.
    script = ("from plan.engine import run_program\n"
              "from tests.conftest import stack_config\n"
              "run_program(stack_config('prod-us-east-1'), stack='prod-us-east-1', peer_outputs=lambda name: {})\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode != 0
    assert ("dr.peerStack acme/gpu-cloud/prod-eu-west-1 exports no buckets.checkpoints (arn, keyArn): run `pulumi up` "
            "on the peer stack first") in result.stderr


def test_a_primary_names_the_peer_stack_it_reads(stack_runs):
    (reference,) = stack_runs["prod-us-east-1"].of_type("pulumi:pulumi:StackReference")
    assert reference.inputs["name"] == "acme/gpu-cloud/prod-eu-west-1"


def test_a_stack_promoted_to_primary_replicates_to_its_peer():
    run = run_stack("prod-eu-west-1", {"gpu-cloud:dr": {
        "role": "primary", "peerStack": "acme/gpu-cloud/prod-us-east-1", "domain": "infer.ml.example.com",
        "hostedZoneId": "Z0123456789ABCDEFGHIJ"}})
    destinations = {r.name: r.inputs["rules"][0]["destination"]["bucket"] for r in run.of_type(REPLICATION)}
    assert destinations == {
        "replication-checkpoints": "arn:aws:s3:::gpu-cloud-prod-us-east-1-123456789012-checkpoints",
        "replication-models": "arn:aws:s3:::gpu-cloud-prod-us-east-1-123456789012-models"}
