"""The AWS Load Balancer Controller (kube-system, system nodes) and its least-privilege Pod Identity role.

Its own component, created before the team namespaces, which depend on it: the controller puts finalizers on the
LoadBalancer Services and TargetGroupBindings of those namespaces and removes them only while it runs, so a
destroy deletes the namespaces first and the controller after. Values, IAM and annotations are
decisions/serving/lb_controller.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_kubernetes.helm.v3 import Release

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from components.iam import ServiceAccountRole, ServiceAccountRoleArgs
from decisions.catalog import charts
from decisions.platform import tenancy
from decisions.serving import lb_controller


@dataclass(frozen=True)
class LoadBalancerControllerArgs:
    cluster_name: pulumi.Input[str]
    cluster_name_plain: str
    region: str
    partition: str
    account_id: str
    vpc_id: pulumi.Input[str]
    scheme: str                               # the inference load balancer's: what the controller may create


class LoadBalancerController(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    release: Release

    def __init__(self, name: str, args: LoadBalancerControllerArgs, opts: Optional[pulumi.ResourceOptions] = None):
        pin = charts.chart(charts.AWS_LOAD_BALANCER_CONTROLLER)

        super().__init__("gpu-cloud:lb_controller:LoadBalancerController", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        identity = ServiceAccountRole(f"{name}-identity", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=lb_controller.NAMESPACE,
            service_account=lb_controller.SERVICE_ACCOUNT,
            policy=pulumi.Output.from_input(args.vpc_id).apply(lambda vpc_id: lb_controller.iam_policy_json(
                lb_controller.scoped_iam_policy(args.partition, args.region, args.account_id, vpc_id,
                                                args.scheme, args.cluster_name_plain)))), opts=child)
        self.release = pinned_release(
            f"{name}-release", pin, release_name=lb_controller.RELEASE_NAME, namespace=lb_controller.NAMESPACE,
            # The Service webhook only where Services may need it: elsewhere no Service creation waits on it.
            values=pulumi.Output.from_input(args.vpc_id).apply(lambda vpc_id: lb_controller.controller_values(
                args.cluster_name_plain, args.region, vpc_id, lb_controller.SERVICE_ACCOUNT, SYSTEM_NODE_LABELS,
                webhook_namespaces=list(tenancy.TEAM_NAMESPACES))),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[identity]))

        self.register_outputs({"chartVersion": pin.version, "release": lb_controller.RELEASE_NAME})
