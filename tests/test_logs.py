"""CloudWatch retention: a stack's retentionDays becomes a value CloudWatch accepts, never shorter."""
import pytest

from spec.logs import CLOUDWATCH_RETENTION_DAYS, cloudwatch_retention_days


@pytest.mark.parametrize("asked, kept", [(1, 1), (14, 14), (15, 30), (400, 400), (3653, 3653)])
def test_log_retention_rounds_up_to_a_cloudwatch_value(asked, kept):
    assert cloudwatch_retention_days(asked) == kept
    assert kept in CLOUDWATCH_RETENTION_DAYS


@pytest.mark.parametrize("days", [0, 4000])
def test_retention_outside_cloudwatch_range_is_rejected(days):
    with pytest.raises(ValueError):
        cloudwatch_retention_days(days)
