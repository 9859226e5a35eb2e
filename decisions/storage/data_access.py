"""Who may do what with the stack's data, as IAM statements (components/storage/data_access.py and
components/serving/inference.py turn them into roles). Pure: no Pulumi; ARNs come in as strings (components resolve
their outputs first).

- **reader**: lists and reads a bucket's objects and decrypts them through S3 only; the trainer's reads and Triton's
  model sync (components/serving/inference.py) are both this.
- **trainer**, the training jobs' service account: reads and writes the datasets and checkpoints buckets, and reads
  the models bucket. It may not put or delete a model: the models bucket is Triton's repository, polled every minute,
  and a primary replicates it to the DR peer, so a job's mistake there would reach production in both regions.
- **model publisher**, a role the stack's `inference.triton.publisherRoleArns` (a CI or release job's roles) may
  assume: the only writer of Triton's repository. It may put and delete objects under the repository's prefix, and
  list and read every version of them, which a rollback needs; it may not delete a version
  (s3:DeleteObjectVersion), so versioning keeps every model it replaced or deleted for the bucket's noncurrent days
  (decisions/storage/buckets.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

# Every action a writer of objects needs (multipart uploads included), and none that removes a version.
OBJECT_WRITES = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")


@dataclass(frozen=True)
class DataBucket:
    arn: str                # the bucket's ARN
    key_arn: str            # its KMS key's ARN
    writable: bool = True   # False: the trainer may only list and read it


def _via_s3(region: str) -> Dict[str, Dict[str, str]]:
    return {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}


# One ARN (str) or several; a policy names them as given: one as a string, several as a list.
Arns = Union[str, Sequence[str]]


def reader_statements(noun: str, bucket_arns: Arns, key_arns: Optional[Arns], region: str,
                      list_sid: Optional[str] = None) -> List[Dict[str, Any]]:
    """List and read the objects of `bucket_arns`, and decrypt with `key_arns` only through S3 in `region` (None: the
    buckets' keys are not the stack's to grant, and no KMS statement is made). Sids: List<noun> (or `list_sid`),
    Read<noun>, Decrypt<noun>ThroughS3."""
    if not bucket_arns or (key_arns is not None and not key_arns):
        raise ValueError("a reader needs at least one bucket, and at least one key when keys are given")
    statements: List[Dict[str, Any]] = [
        {"Sid": list_sid or f"List{noun}", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": _each(bucket_arns)},
        {"Sid": f"Read{noun}", "Effect": "Allow", "Action": "s3:GetObject", "Resource": _each(bucket_arns, _objects)}]
    if key_arns is not None:
        statements.append({"Sid": f"Decrypt{noun}ThroughS3", "Effect": "Allow", "Action": "kms:Decrypt",
                           "Resource": _each(key_arns), "Condition": _via_s3(region)})
    return statements


def trainer_statements(buckets: Sequence[DataBucket], region: str) -> List[Dict[str, Any]]:
    """The trainer's policy: list and read every bucket; write and delete objects only in the writable ones; each key
    used only through S3 in the stack's region (decrypt for all, encrypt only for the writable)."""
    if not buckets:
        raise ValueError("the trainer needs at least one bucket")
    writable = [b for b in buckets if b.writable]
    statements = reader_statements("Data", [b.arn for b in buckets], [b.key_arn for b in buckets], region,
                                   list_sid="ListDataBuckets")
    if writable:
        statements += [
            {"Sid": "WriteData", "Effect": "Allow", "Action": list(OBJECT_WRITES),
             "Resource": [_objects(b.arn) for b in writable]},
            {"Sid": "EncryptDataThroughS3", "Effect": "Allow", "Action": "kms:GenerateDataKey",
             "Resource": [b.key_arn for b in writable], "Condition": _via_s3(region)}]
    return statements


def publisher_statements(bucket_arn: str, prefix: str, key_arn: str, region: str) -> List[Dict[str, Any]]:
    """The model publisher's policy: the repository prefix of the models bucket, every version of it readable (a
    rollback copies an old version back), none deletable."""
    if not prefix or prefix.startswith("/") or prefix.endswith("/"):
        raise ValueError(f"repository prefix {prefix!r}: a key prefix without leading or trailing /")
    models = _objects(bucket_arn, prefix)
    return [
        {"Sid": "ListModels", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListBucketVersions"],
         "Resource": bucket_arn},
        {"Sid": "ReadModelVersions", "Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"],
         "Resource": models},
        {"Sid": "PublishModels", "Effect": "Allow", "Action": list(OBJECT_WRITES), "Resource": models},
        {"Sid": "UseModelsKeyThroughS3", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn, "Condition": _via_s3(region)}]


def publisher_trust_policy(principal_arns: Sequence[str]) -> Dict[str, Any]:
    """Who may assume the publisher role: exactly the roles the stack names."""
    if not principal_arns:
        raise ValueError("a publisher role needs at least one principal (inference.triton.publisherRoleArns)")
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": sorted(principal_arns)}, "Action": "sts:AssumeRole"}]}


def _objects(bucket_arn: str, prefix: str = "") -> str:
    return f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"


def _each(arns: Arns, each=lambda arn: arn) -> Union[str, List[str]]:
    return each(arns) if isinstance(arns, str) else [each(arn) for arn in arns]
