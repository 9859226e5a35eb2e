"""The stack's S3 buckets as plain decisions: which buckets, their names, and how long old data stays.

components/storage/buckets.py makes one SecureBucket per purpose from these. Every bucket is encrypted with its own
customer-managed KMS key (bucket keys on), versioned, private, TLS-only, logged to the log bucket, and protected;
the log bucket alone is SSE-S3 and logs nowhere (see LOG_BUCKET_SSE).

- **datasets**: training data; FSx for Lustre imports it to `/data` (decisions/storage/lustre.py). Objects go to
  S3 Intelligent-Tiering from day 0: datasets are large and read in bursts, and Intelligent-Tiering moves what
  is not read for 30 days to a cheaper tier with no retrieval fee, so a dataset read again costs nothing extra.
- **checkpoints**: what a training job saves; replicated to the DR peer (components/storage/replication.py).
  Old checkpoints are rarely read again: Intelligent-Tiering after 7 days, once the newest ones have been used
  to resume. Overwritten or deleted checkpoints are kept 7 days (a bad save can be undone, a week's worth of
  noncurrent versions of terabyte files is not kept).
- **models**: Triton's model repository; replicated to the DR peer (deletes stay in the region:
decisions/storage/replication.py).
  Written only by the stack's model publisher, read by training jobs too. Small and read at every model load:
  no transition; a replaced or deleted model stays 30 days as a noncurrent version, for rollbacks.
- **artifacts**: node verifier bundles (read by nodes at boot; rebuilt by the program), and the gate's verdicts
  (gate-reports/<pool>/, one per boot, written by the nodes, read by the repair controller; expire after 90 days).
- **logs**: S3 server access logs of the other four, each under its own prefix; SSE-S3, the only default encryption
  S3 server access logging writes to; kept `monitoring.logRetentionDays` (decisions/observability/logs.py).

Names carry the project, the stack and the account, so two regions, or two accounts, never collide (S3 names
are global). Lifecycle: every bucket aborts incomplete multipart uploads (their parts are billed until then)
and expires noncurrent versions after a set time.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from decisions.nodes.repair import GATE_REPORT_RETENTION_DAYS, GATE_REPORTS_PREFIX

PURPOSES = ("datasets", "checkpoints", "models", "artifacts", "logs")
LOGS = "logs"
DATASETS = "datasets"     # what FSx for Lustre links to /data by default
MODELS = "models"         # where Triton's repository is by default (s3://<models bucket>/triton)
REPLICATED = ("checkpoints", "models")     # what a primary stack replicates to its DR peer
JOB_DATA = ("datasets", "checkpoints", "models")   # what training jobs read (components/storage/data_access.py)
# ... and may not write: Triton's repository changes only through its publisher (decisions/storage/data_access.py).
JOB_READ_ONLY = (MODELS,)

BUCKET_NAME_MAX = 63                       # S3 bucket naming rules: 3 to 63 characters
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
INTELLIGENT_TIERING = "INTELLIGENT_TIERING"
LOGGING_SERVICE = "logging.s3.amazonaws.com"   # the S3 server access logging service principal
# The log bucket's default encryption: SSE-S3 (AES-256). S3 server access logging supports no other on its target
# (log_delivery_statements cites the S3 User Guide); every other bucket is SSE-KMS under its own key.
LOG_BUCKET_SSE = "AES256"


@dataclass(frozen=True)
class Lifecycle:
    noncurrent_days: int                       # overwritten or deleted versions are removed after this
    abort_upload_days: int                     # incomplete multipart uploads are aborted after this
    transition: Optional[Tuple[int, str]] = None   # (days after creation, storage class)
    expire_days: Optional[int] = None          # current objects expire (the log bucket only)
    expire_prefix: Optional[Tuple[str, int]] = None   # (key prefix, days): current objects under it expire


LIFECYCLE: Mapping[str, Lifecycle] = {
    # A dataset upload of many terabytes can run for days; a week before its parts are dropped.
    "datasets": Lifecycle(noncurrent_days=30, abort_upload_days=7, transition=(0, INTELLIGENT_TIERING)),
    "checkpoints": Lifecycle(noncurrent_days=7, abort_upload_days=1, transition=(7, INTELLIGENT_TIERING)),
    "models": Lifecycle(noncurrent_days=30, abort_upload_days=1),
    # Bundles a pool no longer uses become noncurrent when Pulumi deletes them; nodes read them only at boot. The
    # gate's verdicts (decisions/nodes/repair.py) are kept for a quarter: long enough to look back on a pool's
    # rejections.
    "artifacts": Lifecycle(noncurrent_days=30, abort_upload_days=1,
                           expire_prefix=(GATE_REPORTS_PREFIX, GATE_REPORT_RETENTION_DAYS)),
}


def lifecycle(purpose: str, log_retention_days: int) -> Lifecycle:
    """The lifecycle of a bucket; the log bucket's logs expire after the stack's log retention."""
    if purpose == LOGS:
        if log_retention_days < 1:
            raise ValueError(f"log retention must be at least 1 day, got {log_retention_days}")
        return Lifecycle(noncurrent_days=1, abort_upload_days=1, expire_days=log_retention_days)
    if purpose not in LIFECYCLE:
        raise ValueError(f"unknown bucket purpose {purpose!r}; known: {', '.join(PURPOSES)}")
    return LIFECYCLE[purpose]


def bucket_name(project: str, stack: str, account_id: str, purpose: str) -> str:
    """`<project>-<stack>-<account>-<purpose>`, lower case; when that is longer than S3 allows, the project and
    stack part is cut and an 8-character hash of the whole name keeps it unique (and stable)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown bucket purpose {purpose!r}; known: {', '.join(PURPOSES)}")
    if not re.fullmatch(r"\d{12}", account_id):
        raise ValueError(f"account id {account_id!r} is not 12 digits")
    prefix = re.sub(r"[^a-z0-9]+", "-", f"{project}-{stack}".lower()).strip("-")
    suffix = f"-{account_id}-{purpose}"
    name = prefix + suffix
    if len(name) > BUCKET_NAME_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        room = BUCKET_NAME_MAX - len(suffix) - len(digest) - 1
        name = f"{prefix[:room].rstrip('-')}-{digest}{suffix}"
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a valid S3 bucket name")
    return name


def key_alias(name: str) -> str:
    """The alias of a bucket's KMS key, so the key is found by the bucket it encrypts."""
    return f"alias/s3/{name}"


def log_prefix(source_bucket: str) -> str:
    """Where a bucket's server access logs go in the log bucket: under its own name."""
    return f"{source_bucket}/"


def log_delivery_statements(partition: str, account_id: str, log_bucket: str, sources: Sequence[str]) -> List[dict]:
    """The log bucket's policy for S3 server access logging: the logging service principal may put objects only
    under each source bucket's prefix, only for that source bucket (aws:SourceArn) of this account
    (aws:SourceAccount), as the S3 User Guide's example does ("Enabling Amazon S3 server access logging",
    "Grant permissions to the logging service principal by using a bucket policy";
    awsdocs/amazon-s3-userguide doc_source/enable-server-access-logging.md). No KMS grant: the log bucket is SSE-S3,
    the only default encryption a log target supports (same page: "Default server-side encryption with AWS Key
    Management Service (AWS KMS) keys (SSE-KMS) is not supported")."""
    if not sources:
        raise ValueError("a log bucket with no source bucket admits no one; name the buckets that log into it")
    return [{"Sid": f"S3ServerAccessLogs{i}", "Effect": "Allow", "Principal": {"Service": LOGGING_SERVICE},
             "Action": "s3:PutObject", "Resource": f"arn:{partition}:s3:::{log_bucket}/{log_prefix(source)}*",
             "Condition": {"ArnLike": {"aws:SourceArn": f"arn:{partition}:s3:::{source}"},
                           "StringEquals": {"aws:SourceAccount": account_id}}}
            for i, source in enumerate(sources)]


def fsx_data_repository_key_statement(partition: str, account_id: str, region: str) -> dict:
    """The datasets bucket's key: FSx for Lustre reads and writes the bucket through its S3 service-linked role,
    which exists only once a file system does and carries the file system's id in its name
    (AWSServiceRoleForFSxS3Access_fs-...), so the grant matches the role's path, never a principal that may not
    exist yet (a key policy naming a missing principal is refused). Only through S3 in this region (the statement
    the FSx for Lustre User Guide gives for SSE-KMS buckets, "Working with server-side encrypted Amazon S3 buckets")."""
    return {"Sid": "FsxLustreDataRepository", "Effect": "Allow", "Principal": {"AWS": "*"},
            "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
            "Resource": "*",
            "Condition": {"ArnLike": {"aws:PrincipalArn": f"arn:{partition}:iam::{account_id}:role/aws-service-role/"
                                                          "s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"},
                          "StringEquals": {"kms:CallerAccount": account_id,
                                           "kms:ViaService": f"s3.{region}.amazonaws.com"}}}
