"""IAM for Kubernetes service accounts through EKS Pod Identity, the one mechanism gpu-cloud uses.

Pod Identity (not IRSA/OIDC) because one fixed trust policy serves every role, nothing has to be
rewritten when the cluster's OIDC issuer changes, and the eks-pod-identity-agent add-on is pinned
with the others.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

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


def pod_identity_role(name: str, *, cluster_name: pulumi.Input[str], namespace: str, service_account: str,
                      policy: pulumi.Input[str], parent: pulumi.Resource,
                      depends_on: Any = None) -> aws.iam.Role:
    """A role for one service account: trust for Pod Identity, an inline least-privilege policy, the association.

    `policy` is an IAM policy document (JSON string or Output of one).
    """
    opts = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(f"{name}-role", assume_role_policy=POD_IDENTITY_TRUST_POLICY,
                        description=f"Pod Identity role for {namespace}/{service_account}", opts=opts)
    aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy, opts=opts)
    aws.eks.PodIdentityAssociation(
        f"{name}-association", cluster_name=cluster_name, namespace=namespace, service_account=service_account,
        role_arn=role.arn, opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on))
    return role


def policy_document(*statements: Mapping[str, Any]) -> pulumi.Output[str]:
    """An IAM policy document from statements (dicts whose values may be Outputs, such as ARNs), as JSON."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": list(statements)})
