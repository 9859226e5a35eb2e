"""DNS across the two regions: each stack's half of the record set, its health check, and how long detection takes
(the whole recovery time, detection plus TTL plus scale-up: tests/test_dr_pair.py)."""
import pytest

from decisions.serving import failover
from decisions.serving.failover import RecordPolicy


@pytest.mark.parametrize("role, routing, expected", [
    ("primary", "failover", RecordPolicy("failover", failover="PRIMARY")),
    ("secondary", "failover", RecordPolicy("failover", failover="SECONDARY")),
    ("primary", "weighted", RecordPolicy("weighted", weight=100)),
    ("secondary", "weighted", RecordPolicy("weighted", weight=100)),
    ("secondary", "latency", RecordPolicy("latency", region="eu-west-1")),
])
def test_each_role_and_routing_makes_its_half_of_the_record_set(role, routing, expected):
    assert failover.record_policy(role, routing, "eu-west-1") == expected


@pytest.mark.parametrize("role, routing, message", [
    ("none", "failover", "dr.role 'none' makes no DNS record"), ("primary", "geo", "dr.routing 'geo'")])
def test_no_record_without_a_role_or_with_an_unknown_routing(role, routing, message):
    with pytest.raises(ValueError, match=message):
        failover.record_policy(role, routing, "us-east-1")


def test_detection_takes_the_checks_and_for_an_internal_nlb_the_alarms_window():
    # internet-facing: Route 53 every 10 s, 3 failures -> 30 s
    assert failover.detection_seconds("internet-facing") == 30
    # internal: target checks 10 s x 3, then 2 breaching one-minute periods after the one the targets fail in (which
    # may still hold a healthy report) -> 30 + 3 x 60 = 210 s
    assert failover.detection_seconds("internal") == 210


@pytest.mark.parametrize("arn, suffix", [
    ("arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/k8s-inferenc-triton-0a1b2c/0123456789abcdef",
     "net/k8s-inferenc-triton-0a1b2c/0123456789abcdef"),
    ("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/k8s-inferenc-triton-5d6e7f/89abcdef01234567",
     "targetgroup/k8s-inferenc-triton-5d6e7f/89abcdef01234567"),
])
def test_cloudwatch_dimensions_are_the_arns_resource_part(arn, suffix):
    assert failover.arn_suffix(arn) == suffix


def test_a_non_elb_arn_is_refused():
    with pytest.raises(ValueError, match="is not an ELB ARN"):
        failover.arn_suffix("not-an-arn")


@pytest.mark.parametrize("stack, name", [("prod-us-east-1", "prod-us-east-1"),
                                         ("x" * 27, "x" * 27), ("y" * 28, "y" * 27)])
def test_the_health_checks_reference_name_fits_what_the_provider_accepts(stack, name):
    assert failover.reference_name(stack) == name


# --- components/serving/failover.py in the shipped stacks
# -------------------------------------------------------------------
RECORD, CHECK, ALARM = "aws:route53/record:Record", "aws:route53/healthCheck:HealthCheck", "aws:cloudwatch/metricAlarm:MetricAlarm"


@pytest.mark.parametrize("stack, role", [("prod-us-east-1", "PRIMARY"), ("prod-eu-west-1", "SECONDARY")])
def test_each_region_owns_its_half_of_the_record_pointing_at_its_own_nlb(stack_runs, stack, role):
    run = stack_runs[stack]
    record = run.one(RECORD).inputs
    assert (record["name"], record["zoneId"], record["type"], record["ttl"]) == (
        "infer.ml.example.com", "Z0123456789ABCDEFGHIJ", "CNAME", 60)
    assert record["failoverRoutingPolicies"] == [{"type": role}]
    assert record["setIdentifier"] == failover.set_identifier(stack)
    assert record["records"] == [run.outputs["inferenceEndpoint"]]
    assert record["healthCheckId"] == run.one(CHECK).state["id"]


def test_an_internal_nlb_is_judged_by_an_alarm_on_its_healthy_targets(stack_runs):
    run = stack_runs["prod-us-east-1"]
    (lookup,) = [args for token, args in run.invokes if token == "aws:lb/getLoadBalancer:getLoadBalancer"]
    # The tags the AWS Load Balancer Controller puts on the Service's NLB (decisions/serving/lb_controller.py).
    assert lookup["tags"] == {"elbv2.k8s.aws/cluster": "gpu-cloud-prod-us-east-1",
                              "service.k8s.aws/stack": "inference/triton", "service.k8s.aws/resource": "LoadBalancer"}
    alarm = run.one(ALARM).inputs
    assert (alarm["namespace"], alarm["metricName"]) == ("AWS/NetworkELB", "HealthyHostCount")
    assert alarm["dimensions"]["LoadBalancer"].startswith("net/") and alarm["dimensions"]["TargetGroup"].startswith("targetgroup/")
    # The Maximum over the load balancer's nodes below 1, for 2 of 3 minutes: the ELB guide's recommendation
    # (decisions/serving/failover.py); no data (no registered target at all) counts as breaching.
    assert (alarm["statistic"], alarm["comparisonOperator"], alarm["threshold"]) == ("Maximum", "LessThanThreshold", 1)
    assert (alarm["period"], alarm["datapointsToAlarm"], alarm["evaluationPeriods"]) == (60, 2, 3)
    assert alarm["treatMissingData"] == "breaching"
    check = run.one(CHECK).inputs
    assert check["type"] == "CLOUDWATCH_METRIC"
    assert check["cloudwatchAlarmName"] == alarm["name"] == "gpu-cloud-prod-us-east-1-triton-no-healthy-targets"
    assert check["insufficientDataHealthStatus"] == "Unhealthy"
    assert check["referenceName"] == "prod-us-east-1"


def test_a_stack_without_a_dr_role_makes_no_record(stack_runs):
    assert stack_runs["dev"].of_type(RECORD) == []


def test_an_internet_facing_nlb_is_checked_by_route53_on_tritons_readiness():
    from tests.conftest import run_stack, stack_config

    inference = stack_config("prod-us-east-1")["gpu-cloud:inference"]
    run = run_stack("prod-us-east-1", {"gpu-cloud:inference": {
        "triton": {**inference["triton"], "scheme": "internet-facing"}}})
    check = run.one(CHECK).inputs
    assert (check["type"], check["port"], check["resourcePath"]) == ("HTTP", 8000, "/v2/health/ready")
    assert (check["requestInterval"], check["failureThreshold"]) == (10, 3)     # 30 s to detect (above)
    assert check["fqdn"] == run.outputs["inferenceEndpoint"]                  # the NLB itself, not the shared name
    assert run.of_type(ALARM) == [] and not [t for t, _ in run.invokes if t == "aws:lb/getLoadBalancer:getLoadBalancer"]
    assert run.one(RECORD).inputs["healthCheckId"] == run.one(CHECK).state["id"]


# The alarm as decisions/serving/failover.py and docs/inference.md state it, written out here, not read from the code
# under test: per one-minute period the Maximum of HealthyHostCount over the load balancer's nodes (the ELB guide's
# recommendation), below 1 breaching; a period without any report (no registered target) breaching too; the alarm
# fires when 2 of the last 3 periods breach.
EXPECTED_ALARM = {"statistic": "Maximum", "comparisonOperator": "LessThanThreshold", "threshold": 1, "period": 60,
                  "datapointsToAlarm": 2, "evaluationPeriods": 3, "treatMissingData": "breaching"}


def _fires(minutes) -> bool:
    """CloudWatch's verdict on EXPECTED_ALARM: `minutes` holds, per one-minute period, the HealthyHostCount each node of
    the load balancer reported in it ([] when none reported)."""
    breaching = [not reports or max(reports) < 1 for reports in minutes[-3:]]
    return sum(breaching) >= 2


@pytest.mark.parametrize("minutes, down", [
    ([[2, 2, 0]] * 3, False),     # a zone without a replica (or its node counting none): the region still serves
    ([[1, 0, 0]] * 3, False),     # one node still sees a ready Triton
    ([[0, 0, 0]] * 3, True),      # no node sees one: the region is down
    ([[2, 2, 2], [2, 0, 0], [0, 0, 0]], False),   # the minute the targets fail still holds a healthy report
    ([[2, 0, 0], [0, 0, 0], [0, 0, 0]], True),    # one minute later: 2 of 3 periods breach
    ([[], [], []], True),         # no registered target: nothing reported, which breaches
])
def test_the_alarm_means_the_region_is_down_not_that_one_zone_has_no_triton(stack_runs, minutes, down):
    alarm = stack_runs["prod-us-east-1"].one(ALARM).inputs
    assert {key: alarm[key] for key in EXPECTED_ALARM} == EXPECTED_ALARM
    assert _fires(minutes) is down
