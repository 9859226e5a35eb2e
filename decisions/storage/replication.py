"""Cross-region replication of the checkpoints and models buckets, as plain decisions
(components/storage/replication.py).

A stack whose `dr.role` is `primary` replicates to the DR peer stack's buckets of the same purpose
(decisions.storage.buckets.REPLICATED), which the peer exports as `buckets` (read through a StackReference):
- **Replication Time Control**: S3 is designed to replicate 99.99 % of objects within 15 minutes (S3 User Guide,
  "Meeting compliance requirements with S3 Replication Time Control"), and its SLA commits to 99.9 % a month (RTC_SLA),
  so the recovery point of a checkpoint or a model is stated: 15 minutes behind, for all but a share of objects that
  the SLA only compensates. RTC needs replication metrics, turned on with the same 15-minute threshold.
- **KMS**: objects are SSE-KMS in the source; S3 replicates them only when told to (`sse_kms_encrypted_objects`),
  and re-encrypts them with the peer's own key, so each region's data is under its own key.
- **Deletes** are a choice per bucket (DELETE_MARKERS_REPLICATE): a checkpoint deleted in the primary is deleted in
  the peer too (a job's pruning is pruning in both regions); a model deleted in the primary is not: the peer is
  what clients fail over to, and it keeps serving the model until the publisher deletes it there as well. Deletes
  of specific versions never replicate, and each region's lifecycle expires its own noncurrent versions (S3 User
  Guide, "Replicating delete markers between buckets").
- **The role** may read only these source buckets, write replicas only into these peer buckets, decrypt only with
  the source keys and encrypt only with the peer keys, each through S3 in its own region. Its permissions follow
  the S3 User Guide, "Setting up permissions for live replication" and "Replicating encrypted objects".

The secondary replicates nothing outward: on failover its buckets already hold the primary's data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence

REPLICATION_TIME_MINUTES = 15      # the only value S3 Replication Time Control takes
# Of the objects replicated in a month, the share within REPLICATION_TIME_MINUTES: S3 RTC's design figure (S3 User
# Guide, above), and what its SLA commits to, per region pair and account, with service credits below it (Amazon S3
# Replication Time Control Feature Service Level Agreement, aws.amazon.com/s3/sla-rtc, last updated 2022-05-04).
RTC_DESIGN_PCT = "99.99"
RTC_SLA_PCT = "99.9"
RTC_FIGURES = (f"designed to replicate {RTC_DESIGN_PCT} % of objects within {REPLICATION_TIME_MINUTES} minutes, and "
               f"its SLA commits to {RTC_SLA_PCT} % a month, with service credits below that")
RULE_ID = "to-dr-peer"
PEER_REFERENCE = "dr-peer"          # the StackReference a primary reads its DR peer's bucket names through
# Whether a delete marker written in the source is written in the peer, per replicated purpose.
DELETE_MARKERS_REPLICATE: Mapping[str, bool] = {"checkpoints": True, "models": False}


def delete_marker_replication(purpose: str) -> str:
    """The replication rule's delete_marker_replication status for a bucket of this purpose."""
    if purpose not in DELETE_MARKERS_REPLICATE:
        raise ValueError(f"{purpose!r} is not replicated; replicated: {', '.join(DELETE_MARKERS_REPLICATE)}")
    return "Enabled" if DELETE_MARKERS_REPLICATE[purpose] else "Disabled"


@dataclass(frozen=True)
class ReplicaPair:
    """One replicated bucket: source and destination, each with its key, by ARN."""
    purpose: str
    source_bucket_arn: str
    source_key_arn: str
    target_bucket_arn: str
    target_key_arn: str


def _in_bucket(bucket_arn: str) -> List[str]:
    """The KMS encryption context S3 sets: the object ARN, or the bucket ARN when bucket keys are on."""
    return [bucket_arn, _objects(bucket_arn)]


def _objects(bucket_arn: str) -> str:
    return f"{bucket_arn}/*"


def key_region(key_arn: str) -> str:
    """The region of a KMS key (arn:<partition>:kms:<region>:<account>:key/<id>): S3 uses a key in its own region."""
    parts = key_arn.split(":") if isinstance(key_arn, str) else []
    if len(parts) != 6 or parts[2] != "kms" or not parts[3] or not parts[5].startswith("key/"):
        raise ValueError(f"{key_arn!r} is not a KMS key ARN")
    return parts[3]


def role_policy_statements(pairs: Sequence[ReplicaPair]) -> List[Dict[str, Any]]:
    """The replication role's policy: exactly what S3 needs to replicate these pairs, nothing else. Each key is
    used only through S3 in the key's own region (where its bucket is)."""
    if not pairs:
        raise ValueError("no bucket to replicate")
    statements: List[Dict[str, Any]] = [
        {"Sid": "ReadReplicationConfiguration", "Effect": "Allow",
         "Action": ["s3:GetReplicationConfiguration", "s3:ListBucket"],
         "Resource": [p.source_bucket_arn for p in pairs]},
        {"Sid": "ReadSourceVersions", "Effect": "Allow",
         "Action": ["s3:GetObjectVersionForReplication", "s3:GetObjectVersionAcl", "s3:GetObjectVersionTagging"],
         "Resource": [_objects(p.source_bucket_arn) for p in pairs]},
        {"Sid": "WriteReplicas", "Effect": "Allow",
         "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
         "Resource": [_objects(p.target_bucket_arn) for p in pairs]}]
    for p in pairs:
        statements.append({
            "Sid": f"Decrypt{p.purpose.capitalize()}Source", "Effect": "Allow", "Action": "kms:Decrypt",
            "Resource": p.source_key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": f"s3.{key_region(p.source_key_arn)}.amazonaws.com"},
                          "StringLike": {"kms:EncryptionContext:aws:s3:arn": _in_bucket(p.source_bucket_arn)}}})
        statements.append({
            "Sid": f"Encrypt{p.purpose.capitalize()}Replica", "Effect": "Allow",
            "Action": ["kms:Encrypt", "kms:GenerateDataKey"], "Resource": p.target_key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": f"s3.{key_region(p.target_key_arn)}.amazonaws.com"},
                          "StringLike": {"kms:EncryptionContext:aws:s3:arn": _in_bucket(p.target_bucket_arn)}}})
    return statements


S3_TRUST_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def peer_bucket(exports: Any, peer_stack: str, purpose: str) -> Dict[str, str]:
    """The peer stack's `buckets.<purpose>` export ({name, arn, keyArn}); a clear error when the peer has not
    been deployed (or predates the export): the primary cannot replicate into a bucket that does not exist."""
    entry = exports.get(purpose) if isinstance(exports, dict) else None
    if not isinstance(entry, dict) or not entry.get("arn") or not entry.get("keyArn"):
        raise ValueError(f"dr.peerStack {peer_stack} exports no buckets.{purpose} (arn, keyArn): run `pulumi up` "
                         "on the peer stack first, then on this one")
    return entry
