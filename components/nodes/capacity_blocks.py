"""The expiry warning of the stack's capacity blocks: an EventBridge rule for EC2's warning about this stack's blocks,
into an SQS queue the repair controller reads every pass (jobs/block_expiry.py), its backstop should the end date it
was given be wrong or its own timing late.

Every decision comes from decisions/nodes/capacity_blocks.py (the pattern, the queue's name and retention) and
decisions/nodes/drain.py (the queue policy: only the rule may send, nothing without TLS); this file only turns them into
resources. The queue is SSE-SQS for the reasons components/nodes/node_drain.py gives, and has a fixed name so that the
controller's config and IAM policy can name it before it exists.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Tuple

import pulumi
import pulumi_aws as aws

from components.iam import policy_document
from decisions.nodes import capacity_blocks, drain


@dataclass(frozen=True)
class CapacityBlockExpiryArgs:
    cluster_name_plain: str                           # names the queue (capacity_blocks.queue_name)
    blocks: Tuple[capacity_blocks.Block, ...]         # at least one


class CapacityBlockExpiry(pulumi.ComponentResource):
    queue: aws.sqs.Queue
    rule: aws.cloudwatch.EventRule
    queue_policy: aws.sqs.QueuePolicy
    target: aws.cloudwatch.EventTarget

    def __init__(self, name: str, args: CapacityBlockExpiryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        pattern = capacity_blocks.expiry_warning_pattern(args.blocks)

        super().__init__("gpu-cloud:capacity_blocks:CapacityBlockExpiry", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.queue = aws.sqs.Queue(
            f"{name}-queue", name=capacity_blocks.queue_name(args.cluster_name_plain),
            message_retention_seconds=capacity_blocks.QUEUE_RETENTION_S, sqs_managed_sse_enabled=True, opts=child)
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule", description="gpu-cloud: EC2's expiry warning of this stack's capacity blocks, 40 minutes "
                                        "before each ends", event_pattern=json.dumps(pattern, sort_keys=True),
            opts=child)
        self.queue_policy = aws.sqs.QueuePolicy(
            f"{name}-queue-policy", queue_url=self.queue.url,
            policy=policy_document(*drain.queue_policy_statements(self.queue.arn, [self.rule.arn])), opts=child)
        # After the policy: EventBridge cannot deliver before the queue lets it.
        self.target = aws.cloudwatch.EventTarget(
            f"{name}-target", rule=self.rule.name, arn=self.queue.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.rule, self.queue_policy]))

        self.register_outputs({"queueUrl": self.queue.url, "queueArn": self.queue.arn, "ruleArn": self.rule.arn,
                               "reservations": sorted({b.reservation_id for b in args.blocks})})
