"""Drain GPU nodes before AWS takes them: EventBridge rules -> one SQS queue -> aws-node-termination-handler.

All timings, patterns, Helm values and IAM statements come from decisions/nodes/drain.py (the workload contract is
in its docstring); this file only turns them into resources.

The queue uses SSE-SQS (`sqs_managed_sse_enabled`), not a KMS key: EventBridge can deliver to an SSE-SQS
queue with no key policy to maintain (a customer key would have to grant events.amazonaws.com
kms:GenerateDataKey and kms:Decrypt, and the AWS-managed aws/sqs key cannot be used by EventBridge at
all), there is no per-request KMS cost, and interruption notices hold no secrets.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import pulumi
import pulumi_aws as aws
from pulumi_kubernetes.helm.v3 import Release

from components.helm import pinned_release
from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from decisions.catalog import charts
from decisions.nodes import drain

_DESCRIPTIONS = {
    drain.SPOT_INTERRUPTION: "EC2 spot interruption warnings (2 minutes' notice)",
    drain.REBALANCE: "EC2 rebalance recommendations (spot at elevated risk)",
    drain.STATE_CHANGE: "EC2 instances stopping or terminating",
    drain.SCHEDULED_CHANGE: "AWS Health scheduled changes for EC2 (retirement, maintenance)",
    drain.ASG_TERMINATE: "Termination lifecycle actions of this cluster's GPU pools",
}


@dataclass(frozen=True)
class NodeDrainArgs:
    cluster_name: pulumi.Input[str]
    region: str
    asg_names: Tuple[str, ...]      # the GPU pools' ASG names (fixed physical names)
    # ARN patterns of those groups (decisions.nodes.pools.asg_arn_pattern): names, not the groups' outputs, so the drain
    # handler can be created before the pools and deleted after them, draining their last nodes.
    asg_arn_patterns: Tuple[str, ...]


class NodeDrain(pulumi.ComponentResource):
    """Queue-mode aws-node-termination-handler for the cluster's GPU pools.

    The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it.
    """
    queue: aws.sqs.Queue
    queue_url: pulumi.Output[str]
    queue_policy: aws.sqs.QueuePolicy
    rules: Dict[str, aws.cloudwatch.EventRule]
    targets: Dict[str, aws.cloudwatch.EventTarget]
    role: aws.iam.Role
    release: Release

    def __init__(self, name: str, args: NodeDrainArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        patterns = drain.event_patterns(args.asg_names)
        if not args.asg_arn_patterns:
            raise ValueError("NodeDrain needs the pools' ASG ARN patterns")
        pin = charts.chart(charts.NODE_TERMINATION_HANDLER)

        super().__init__("gpu-cloud:node_drain:NodeDrain", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # Not protected: it holds only notices that expire in 5 minutes; replacing it loses nothing.
        self.queue = aws.sqs.Queue(
            f"{name}-queue",
            message_retention_seconds=drain.QUEUE_RETENTION_S,
            receive_wait_time_seconds=drain.QUEUE_LONG_POLL_S,
            sqs_managed_sse_enabled=True,
            opts=child)
        self.queue_url = self.queue.url

        self.rules = {
            key: aws.cloudwatch.EventRule(
                f"{name}-{key}", description=f"gpu-cloud node drain: {_DESCRIPTIONS[key]}",
                event_pattern=json.dumps(pattern, sort_keys=True), opts=child)
            for key, pattern in patterns.items()}

        self.queue_policy = aws.sqs.QueuePolicy(
            f"{name}-queue-policy", queue_url=self.queue.url,
            policy=policy_document(*drain.queue_policy_statements(
                self.queue.arn, [rule.arn for rule in self.rules.values()])),
            opts=child)

        # Targets after the policy: EventBridge cannot deliver before the queue lets it. (The rule is
        # named in depends_on too, so the pairing stays visible where the rule's name is not yet known.)
        self.targets = {
            key: aws.cloudwatch.EventTarget(
                f"{name}-{key}-target", rule=rule.name, arn=self.queue.arn,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[rule, self.queue_policy]))
            for key, rule in self.rules.items()}

        identity = ServiceAccountRole(f"{name}-identity", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=drain.NAMESPACE, service_account=drain.NTH_SERVICE_ACCOUNT,
            policy=policy_document(*drain.nth_policy_statements(self.queue.arn, list(args.asg_arn_patterns)))), opts=child)
        self.role = identity.role

        self.release = pinned_release(
            f"{name}-nth", pin, release_name=drain.NTH_RELEASE_NAME, namespace=drain.NAMESPACE,
            values=drain.nth_values(self.queue.url, args.region, drain.NTH_SERVICE_ACCOUNT,
                                    managed_tag=drain.NTH_MANAGED_TAG),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[identity, *self.targets.values()]))

        self.register_outputs({
            "queueUrl": self.queue.url,
            "queueArn": self.queue.arn,
            "ruleArns": {key: rule.arn for key, rule in self.rules.items()},
            "roleArn": self.role.arn,
            "releaseStatus": self.release.status,
        })
