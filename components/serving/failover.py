"""This stack's half of the inference DNS record set, with its health check (decisions in
decisions/serving/failover.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws

from decisions.serving import failover
from decisions.serving.failover import RecordPolicy


@dataclass(frozen=True)
class FailoverArgs:
    domain: str                                  # dr.domain
    hosted_zone_id: str                          # dr.hostedZoneId
    stack: str
    region: str
    policy: RecordPolicy                         # decisions.serving.failover.record_policy
    scheme: str                                  # the load balancer's: internal | internet-facing
    endpoint: pulumi.Input[str]                  # the load balancer's DNS name (from the Service's status)
    # decisions.serving.lb_controller.controller_load_balancer_tags, to find it (internal only)
    load_balancer_tags: dict


class Failover(pulumi.ComponentResource):
    def __init__(self, name: str, args: FailoverArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:failover:Failover", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        if args.scheme == "internet-facing":
            self.health_check = aws.route53.HealthCheck(
                f"{name}-health", type="HTTP", fqdn=args.endpoint, port=failover.HTTP_PORT,
                resource_path=failover.HEALTH_PATH, request_interval=failover.REQUEST_INTERVAL_S,
                failure_threshold=failover.FAILURE_THRESHOLD, reference_name=failover.reference_name(args.stack),
                tags={"Name": f"{args.domain} {args.stack}"}, opts=child)
        else:
            self.health_check = self._alarm_health_check(name, args)
        routing = {
            "failover": dict(failover_routing_policies=[aws.route53.RecordFailoverRoutingPolicyArgs(
                type=args.policy.failover)]),
            "weighted": dict(weighted_routing_policies=[aws.route53.RecordWeightedRoutingPolicyArgs(
                weight=args.policy.weight)]),
            "latency": dict(latency_routing_policies=[aws.route53.RecordLatencyRoutingPolicyArgs(
                region=args.policy.region)]),
        }[args.policy.kind]
        self.record = aws.route53.Record(
            f"{name}-record", zone_id=args.hosted_zone_id, name=args.domain, type="CNAME", ttl=failover.RECORD_TTL_S,
            records=[args.endpoint], set_identifier=failover.set_identifier(args.stack),
            health_check_id=self.health_check.id, **routing, opts=child)
        self.register_outputs({"fqdn": self.record.fqdn, "healthCheckId": self.health_check.id})

    def _alarm_health_check(self, name: str, args: FailoverArgs) -> aws.route53.HealthCheck:
        """An internal load balancer: Route 53 follows a CloudWatch alarm on its healthy targets. The load balancer
        is the AWS Load Balancer Controller's, found by its tags once the Service reports its DNS name."""
        child = pulumi.ResourceOptions(parent=self)
        # Looked up only after the Service has its load balancer (the endpoint resolves), never before it exists.
        tags = pulumi.Output.from_input(args.endpoint).apply(lambda _: args.load_balancer_tags)
        balancer = aws.lb.get_load_balancer_output(tags=tags, opts=pulumi.InvokeOutputOptions(parent=self))
        listener = aws.lb.get_listener_output(load_balancer_arn=balancer.arn, port=failover.HTTP_PORT,
                                              opts=pulumi.InvokeOutputOptions(parent=self))
        target_group_arn = listener.default_actions.apply(lambda actions: actions[0].target_group_arn)
        # Named, not auto-named: Route 53 follows the alarm by name, and a reader of either finds the other.
        # What the alarm means (no node of the load balancer sees a ready target) is decisions/serving/failover.py's.
        alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-no-healthy-targets", name=f"gpu-cloud-{args.stack}-triton-no-healthy-targets",
            namespace=failover.ALARM_NAMESPACE, metric_name=failover.ALARM_METRIC,
            dimensions={"LoadBalancer": balancer.arn.apply(failover.arn_suffix),
                        "TargetGroup": target_group_arn.apply(failover.arn_suffix)},
            statistic=failover.ALARM_STATISTIC, period=failover.ALARM_PERIOD_S,
            evaluation_periods=failover.ALARM_EVALUATION_PERIODS,
            datapoints_to_alarm=failover.ALARM_DATAPOINTS_TO_ALARM, comparison_operator=failover.ALARM_COMPARISON,
            threshold=failover.ALARM_THRESHOLD, treat_missing_data=failover.ALARM_TREAT_MISSING_DATA,
            alarm_description=f"No node of {args.stack}'s Triton load balancer sees a target that passes "
                              f"{failover.HEALTH_PATH}", opts=child)
        return aws.route53.HealthCheck(
            f"{name}-health", type="CLOUDWATCH_METRIC", cloudwatch_alarm_name=alarm.name,
            cloudwatch_alarm_region=args.region, insufficient_data_health_status="Unhealthy",
            reference_name=failover.reference_name(args.stack), tags={"Name": f"{args.domain} {args.stack}"}, opts=child)
