"""IAM helpers shared by the components: policy documents, and service-account roles through EKS
Pod Identity, the one mechanism gpu-cloud uses for add-on credentials.

Pod Identity (not IRSA/OIDC) because one fixed trust policy serves every role, nothing has to be
rewritten when the cluster's OIDC issuer changes, and the eks-pod-identity-agent add-on is pinned
with the others.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pulumi
import pulumi_aws as aws

POD_IDENTITY_TRUST_POLICY = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{
        "Effect": "Allow",
        "Principal": {"Service": "pods.eks.amazonaws.com"},
        "Action": ["sts:AssumeRole", "sts:TagSession"],
    }],
})


def policy_document(*statements: Mapping[str, Any]) -> pulumi.Output[str]:
    """An IAM policy document from statements (dicts whose values may be Outputs, such as ARNs), as JSON."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": list(statements)})


@dataclass(frozen=True)
class ServiceAccountRoleArgs:
    cluster_name: pulumi.Input[str]
    namespace: str
    service_account: str
    policy: pulumi.Input[str]          # an IAM policy document (JSON), least privilege


class ServiceAccountRole(pulumi.ComponentResource):
    """A role for one Kubernetes service account: Pod Identity trust, an inline policy, the association.

    Depend on the component, not just the role: a pod admitted before its association exists gets no
    AWS credentials.
    """

    def __init__(self, name: str, args: ServiceAccountRoleArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-cloud:iam:ServiceAccountRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=POD_IDENTITY_TRUST_POLICY,
                                 description=f"Pod Identity role for {args.namespace}/{args.service_account}",
                                 opts=child)
        aws.iam.RolePolicy(f"{name}-policy", role=self.role.id, policy=args.policy, opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-association", cluster_name=args.cluster_name, namespace=args.namespace,
            service_account=args.service_account, role_arn=self.role.arn, opts=child)
        self.register_outputs({"roleArn": self.role.arn})
