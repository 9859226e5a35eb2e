"""The policy of the VPC's S3 gateway endpoint: this account's buckets, and the few buckets of AWS and of the
Kubernetes project that nodes read (s3_endpoint.yaml, each with its source). Pure: no Pulumi.

A gateway endpoint's policy is a resource policy on the path from the private subnets to S3 in the region: it does not
grant, it limits. IAM still decides what each role may do; the endpoint refuses, whoever asks, any bucket it does not
list. "This account's buckets" is the aws:ResourceAccount condition key, which S3 supports in VPC endpoint policies
(AWS PrivateLink Guide, "Control access to VPC endpoints using endpoint policies"; IAM User Guide, global condition
keys, aws:ResourceAccount). Other stacks of the account keep their buckets reachable: their isolation is IAM's
(tests/test_isolation.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Sequence, Tuple

from decisions.catalog.data_files import DataModel, load_model

S3_ENDPOINT_PATH = Path(__file__).with_name("s3_endpoint.yaml")


class OutsideBucket(DataModel):
    bucket: str                  # with {region}
    why: str
    source: str


class OutsideBuckets(DataModel):
    buckets: Tuple[OutsideBucket, ...]


def load_outside_buckets(path: Path = S3_ENDPOINT_PATH) -> OutsideBuckets:
    return load_model(path, OutsideBuckets)


def gateway_endpoint_policy(partition: str, region: str, account_id: str,
                            readable_bucket_arns: Sequence[str] = ()) -> Dict[str, Any]:
    """The endpoint's policy. `readable_bucket_arns`: buckets the stack's config names for reading, which may be
    another account's (Triton's inference.triton.modelRepository outside the stack), listed and read."""
    if not (account_id.isdigit() and len(account_id) == 12):
        raise ValueError(f"account id {account_id!r} is not 12 digits")
    statements = [
        {"Sid": "ThisAccountsBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "*",
         "Condition": {"StringEquals": {"aws:ResourceAccount": account_id}}},
        {"Sid": "NodeImagesAndPackages", "Effect": "Allow", "Principal": "*",
         "Action": "s3:GetObject",
         "Resource": [f"arn:{partition}:s3:::{entry.bucket.format(region=region)}/*"
                      for entry in load_outside_buckets().buckets]}]
    for arn in readable_bucket_arns:
        if not arn.startswith(f"arn:{partition}:s3:::") or "/" in arn:
            raise ValueError(f"{arn!r} is not a bucket ARN")
    if readable_bucket_arns:
        statements.append({"Sid": "NamedBucketsToRead", "Effect": "Allow", "Principal": "*",
                           "Action": ["s3:GetObject", "s3:ListBucket"],
                           "Resource": [name for arn in sorted(set(readable_bucket_arns)) for name in (arn, f"{arn}/*")]})
    return {"Version": "2012-10-17", "Statement": statements}
