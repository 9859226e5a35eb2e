"""CloudWatch retention: a stack's retentionDays becomes a value CloudWatch accepts, never shorter."""
import pytest

from decisions.observability.logs import CLOUDWATCH_RETENTION_DAYS, cloudwatch_retention_days


@pytest.mark.parametrize("asked, kept", [(1, 1), (14, 14), (15, 30), (400, 400), (3653, 3653)])
def test_log_retention_rounds_up_to_a_cloudwatch_value(asked, kept):
    assert cloudwatch_retention_days(asked) == kept
    assert kept in CLOUDWATCH_RETENTION_DAYS


@pytest.mark.parametrize("days", [0, 4000])
def test_retention_outside_cloudwatch_range_is_rejected(days):
    with pytest.raises(ValueError):
        cloudwatch_retention_days(days)


# --- the stack key: monitoring.logRetentionDays -------------------------------------------------------------------
from decisions.config.errors import ConfigError                               # noqa: E402
from decisions.observability import logs  # noqa: E402
from tests.test_validate import load, valid_config                # noqa: E402

LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


@pytest.mark.parametrize("environment, configured, kept", [
    ("prod", None, 365), ("prod", 365, 365), ("prod", 400, 400), ("prod", 366, 400),
    ("staging", None, 30), ("dev", None, 30), ("dev", 7, 7), ("dev", 15, 30)])
def test_logs_are_kept_a_year_in_prod_and_a_month_elsewhere_unless_the_stack_says(environment, configured, kept):
    assert logs.log_retention_days(environment, configured) == kept


@pytest.mark.parametrize("environment, days, refused", [
    ("prod", 364, True), ("prod", 1, True), ("prod", 365, False), ("prod", 3653, False),
    ("staging", 1, False), ("dev", 7, False)])
def test_a_prod_stack_may_not_keep_its_logs_less_than_a_year(environment, days, refused):
    config = valid_config()
    config["environment"] = environment
    config["monitoring"] = {"logRetentionDays": days}
    if not refused:
        assert load(config).log_retention_days == logs.cloudwatch_retention_days(days)
        return
    with pytest.raises(ConfigError) as raised:
        load(config)
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:monitoring.logRetentionDays" and "at least 365" in issue.message


@pytest.mark.parametrize("days", [0, 3654])
def test_retention_outside_what_cloudwatch_takes_is_a_config_error(days):
    config = valid_config()
    config["monitoring"] = {"logRetentionDays": days}
    with pytest.raises(ConfigError) as raised:
        load(config)
    assert [i.path for i in raised.value.issues] == ["gpu-cloud:monitoring.logRetentionDays"]


def test_the_flow_log_group_has_a_name_its_key_can_name_before_it_exists():
    assert logs.flow_log_group_name("gpu-cloud-dev") == "/aws/vpc/gpu-cloud-dev/flow-logs"
    assert logs.log_group_arn("aws", "us-east-1", "123456789012", "/aws/vpc/c/flow-logs") == \
        "arn:aws:logs:us-east-1:123456789012:log-group:/aws/vpc/c/flow-logs"


# --- every stack's plan -----------------------------------------------------------------------------------------
def test_every_log_group_a_stack_creates_keeps_its_logs_as_the_stack_says(stack_runs):
    expected = {"prod-us-east-1": 365, "prod-eu-west-1": 365, "dev": 7}
    for stack, run in stack_runs.items():
        groups = run.of_type(LOG_GROUP)
        # control plane, flow logs, and FSx where the stack has a file system
        assert {g.name for g in groups} >= {"cluster-logs", "network-flow-logs"}, stack
        assert {g.name: g.inputs["retentionInDays"] for g in groups} == {g.name: expected[stack] for g in groups}
        logs_bucket = [r for r in run.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
                       if r.name == "logs-lifecycle"]
        assert logs_bucket[0].inputs["rules"][0]["expiration"]["days"] == expected[stack], stack


def test_prod_stacks_keep_every_log_group_at_least_a_year(stack_runs):
    for stack in ("prod-us-east-1", "prod-eu-west-1"):
        groups = stack_runs[stack].of_type(LOG_GROUP)
        assert len(groups) == 3, stack                # control plane, VPC flow logs, FSx for Lustre
        assert all(g.inputs["retentionInDays"] >= logs.PROD_MIN_RETENTION_DAYS for g in groups), stack


def test_each_log_groups_key_lets_cloudwatch_logs_use_it_for_that_group_only(stack_runs):
    import json
    for stack, run in stack_runs.items():
        keys = {k.state["arn"]: k for k in run.of_type("aws:kms/key:Key")}
        for group in run.of_type(LOG_GROUP):
            key = keys[group.inputs["kmsKeyId"]]
            (grant,) = [s for s in json.loads(key.inputs["policy"])["Statement"]
                        if s["Principal"] == {"Service": f"logs.{run.region}.amazonaws.com"}]
            arn = logs.log_group_arn("aws", run.region, "123456789012", group.inputs["name"])
            assert grant["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": arn}}, (stack, group.name)
