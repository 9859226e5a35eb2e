"""How long the stack keeps its logs, and the names the log groups and their keys are scoped by.

One stack key, `monitoring.logRetentionDays`, sets how long every log the stack writes is kept: the CloudWatch log
groups it creates (EKS control plane, VPC flow logs, FSx for Lustre) and the S3 server access logs in the log bucket.
Left out, a prod stack keeps them a year (PROD_MIN_RETENTION_DAYS) and other stacks a month; a prod stack may not
keep them less than a year (audit trails; the issue #30 scan's expectation). The value is rounded up to one that
CloudWatch Logs accepts, and the log bucket expires its objects after the same number of days.
"""
import bisect
from typing import List, Optional

# The values CloudWatch Logs accepts for a log group's retention (PutRetentionPolicy).
CLOUDWATCH_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                             2557, 2922, 3288, 3653)

PROD_MIN_RETENTION_DAYS = 365      # prod keeps every log at least a year
OTHER_DEFAULT_RETENTION_DAYS = 30  # staging and dev, left out: a month (what the default retention rounded to before)


def cloudwatch_retention_days(days: int) -> int:
    """The smallest retention CloudWatch accepts that keeps logs at least `days` days (15 -> 30)."""
    if days < 1 or days > CLOUDWATCH_RETENTION_DAYS[-1]:
        raise ValueError(f"log retention {days} days is outside 1..{CLOUDWATCH_RETENTION_DAYS[-1]}")
    return CLOUDWATCH_RETENTION_DAYS[bisect.bisect_left(CLOUDWATCH_RETENTION_DAYS, days)]


def log_retention_days(environment: str, configured: Optional[int]) -> int:
    """How long the stack keeps its logs, as CloudWatch Logs takes it: the configured days rounded up, else a
    year in prod and a month elsewhere."""
    if configured is None:
        return PROD_MIN_RETENTION_DAYS if environment == "prod" else OTHER_DEFAULT_RETENTION_DAYS
    return cloudwatch_retention_days(configured)


def log_retention_issues(environment: str, configured: Optional[int]) -> List[str]:
    """What is wrong with a stack's log retention: a prod stack keeps its logs at least a year."""
    if environment == "prod" and configured is not None and configured < PROD_MIN_RETENTION_DAYS:
        return [f"{configured} days: a prod stack keeps its logs (control plane, VPC flow logs, FSx, S3 access logs) "
                f"at least {PROD_MIN_RETENTION_DAYS} days; set {PROD_MIN_RETENTION_DAYS} or more, or leave it out "
                f"(prod: {PROD_MIN_RETENTION_DAYS})"]
    return []


def flow_log_group_name(cluster_name: str) -> str:
    """The VPC flow logs' log group: a fixed name, so that its ARN is known before the group exists and its KMS key
    can be scoped to it (the key is created first: the group is encrypted with it)."""
    return f"/aws/vpc/{cluster_name}/flow-logs"


def log_group_arn(partition: str, region: str, account_id: str, name: str) -> str:
    """A log group's ARN as CloudWatch Logs puts it in the KMS encryption context (kms:EncryptionContext:aws:logs:arn,
    "arn:aws:logs:region:account-id:log-group:log-group-name"; CloudWatch Logs User Guide, "Encrypt log data in
    CloudWatch Logs using AWS Key Management Service", "AWS KMS keys and encryption context")."""
    return f"arn:{partition}:logs:{region}:{account_id}:log-group:{name}"
