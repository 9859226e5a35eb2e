"""IAM helpers shared by the components: policy documents, and service-account roles through EKS
Pod Identity, the one mechanism gpu-cloud uses for add-on credentials.

Pod Identity (not IRSA/OIDC) because nothing has to be rewritten when the cluster's OIDC issuer changes, and the
eks-pod-identity-agent add-on is pinned with the others. Each role trusts one service account of one cluster
(decisions/platform/pod_identity.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pulumi
import pulumi_aws as aws

from decisions.observability.logs import log_group_arn
from decisions.platform import pod_identity


def pod_identity_trust_policy(partition: pulumi.Input[str], region: pulumi.Input[str], account_id: pulumi.Input[str],
                              cluster_name: pulumi.Input[str], namespace: str,
                              service_account: str) -> pulumi.Output[str]:
    """The trust policy (JSON) of a Pod Identity role for `namespace`/`service_account` of this cluster only."""
    return pulumi.Output.all(partition, region, account_id, cluster_name).apply(lambda a: json.dumps(
        pod_identity.trust_policy(pod_identity.cluster_arn(*a), namespace, service_account)))


def policy_document(*statements: Mapping[str, Any]) -> pulumi.Output[str]:
    """An IAM policy document from statements (dicts whose values may be Outputs, such as ARNs), as JSON."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": list(statements)})


def log_group_key_policy(partition: pulumi.Input[str], dns_suffix: pulumi.Input[str], region: pulumi.Input[str],
                         account_id: pulumi.Input[str], log_group_name: pulumi.Input[str]) -> pulumi.Output[str]:
    """The key policy of a KMS key that encrypts one CloudWatch Logs log group (and perhaps other data of its owner).
    The account root administers the key, so IAM policies in the account decide who uses it (the default key policy's
    first statement) and the key never becomes unmanageable. CloudWatch Logs of the region may use it for this log
    group only: kms:EncryptionContext:aws:logs:arn, as the CloudWatch Logs User Guide's "Encrypt log data in CloudWatch
    Logs using AWS Key Management Service" shows; its own warning: without the condition the key serves any log group
    of the region."""
    group_arn = pulumi.Output.all(partition, region, account_id, log_group_name).apply(lambda a: log_group_arn(*a))
    return policy_document(
        {"Sid": "AccountAdministersKey", "Effect": "Allow",
         "Principal": {"AWS": pulumi.Output.concat("arn:", partition, ":iam::", account_id, ":root")},
         "Action": "kms:*", "Resource": "*"},
        {"Sid": "CloudWatchLogsForItsLogGroup", "Effect": "Allow",
         "Principal": {"Service": pulumi.Output.concat("logs.", region, ".", dns_suffix)},
         "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
         "Resource": "*", "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": group_arn}}})


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
        # The cluster's ARN from the caller's account, partition and region (as EksCluster reads them): known at
        # preview, before the cluster exists.
        invoke = pulumi.InvokeOutputOptions(parent=self)
        trust = pod_identity_trust_policy(
            aws.get_partition_output(opts=invoke).partition, aws.get_region_output(opts=invoke).region,
            aws.get_caller_identity_output(opts=invoke).account_id, args.cluster_name, args.namespace,
            args.service_account)
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=trust,
                                 description=f"Pod Identity role for {args.namespace}/{args.service_account}",
                                 opts=child)
        aws.iam.RolePolicy(f"{name}-policy", role=self.role.id, policy=args.policy, opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-association", cluster_name=args.cluster_name, namespace=args.namespace,
            service_account=args.service_account, role_arn=self.role.arn, opts=child)
        self.register_outputs({"roleArn": self.role.arn})
