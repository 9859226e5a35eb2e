"""cluster-autoscaler for the GPU pools: pinned chart, image of the cluster's Kubernetes minor, priority
expander over the pools' exact ASG names, and a Pod Identity role limited to this cluster's ASGs.

Values and IAM come from decisions/nodes/autoscaling.py; this file only turns them into resources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

import pulumi
import pulumi_aws as aws
from pulumi_kubernetes.helm.v3 import Release

from components.helm import pinned_release
from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from decisions.catalog import charts
from decisions.nodes import autoscaling


@dataclass(frozen=True)
class AutoscalerArgs:
    cluster_name: pulumi.Input[str]      # also a plain str copy for tags/regexes:
    cluster_name_plain: str
    region: str
    kubernetes_version: str
    priorities: Mapping[int, Tuple[str, ...]]   # weight -> ASG names (exact), higher weight preferred
    max_node_provision_time: str                 # Go duration, from decisions.nodes.boot.max_node_provision_time
    # the pools' ASGs (decisions.nodes.pools.asg_arn_pattern): what CA may scale
    asg_arn_patterns: Tuple[str, ...]
    nodegroup_arns: str                          # the cluster's managed node groups (autoscaling.nodegroup_arn_pattern)


class ClusterAutoscaler(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    role: aws.iam.Role
    release: Release
    image: str            # repository:tag actually deployed
    chart_version: str

    def __init__(self, name: str, args: AutoscalerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        priorities = {weight: [autoscaling.exact_name_regex(asg) for asg in names]
                      for weight, names in args.priorities.items()}
        values = autoscaling.autoscaler_values(args.cluster_name_plain, args.region, args.kubernetes_version,
                                               priorities, args.max_node_provision_time, autoscaling.SERVICE_ACCOUNT)
        statements = autoscaling.autoscaler_policy_statements(args.cluster_name_plain, args.asg_arn_patterns,
                                                              args.nodegroup_arns)
        pin = charts.chart(charts.CLUSTER_AUTOSCALER)
        self.image = f"{values['image']['repository']}:{values['image']['tag']}"
        self.chart_version = pin.version

        super().__init__("gpu-cloud:autoscaler:ClusterAutoscaler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # Role, policy and association under one child component, so the release waits for all three:
        # a pod admitted before its Pod Identity association gets no AWS credentials.
        identity = ServiceAccountRole(f"{name}-identity", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=autoscaling.NAMESPACE,
            service_account=autoscaling.SERVICE_ACCOUNT, policy=policy_document(*statements)), opts=child)
        self.role = identity.role

        self.release = pinned_release(
            f"{name}-release", pin, release_name=autoscaling.RELEASE_NAME, namespace=autoscaling.NAMESPACE,
            values=values, opts=pulumi.ResourceOptions(parent=self, depends_on=[identity]))

        self.register_outputs({"roleArn": self.role.arn, "image": self.image, "chartVersion": pin.version,
                               "releaseStatus": self.release.status})
