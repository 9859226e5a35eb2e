"""CloudWatch Logs retention: the values it accepts, and the nearest one that keeps logs long enough."""
import bisect

# The values CloudWatch Logs accepts for a log group's retention (PutRetentionPolicy).
CLOUDWATCH_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                             2557, 2922, 3288, 3653)


def cloudwatch_retention_days(days: int) -> int:
    """The smallest retention CloudWatch accepts that keeps logs at least `days` days (15 -> 30)."""
    if days < 1 or days > CLOUDWATCH_RETENTION_DAYS[-1]:
        raise ValueError(f"log retention {days} days is outside 1..{CLOUDWATCH_RETENTION_DAYS[-1]}")
    return CLOUDWATCH_RETENTION_DAYS[bisect.bisect_left(CLOUDWATCH_RETENTION_DAYS, days)]
