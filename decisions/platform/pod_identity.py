"""EKS Pod Identity trust policies: each role may be assumed for one service account of one cluster of its account.

EKS Pod Identity assumes a role with sts:AssumeRole and sts:TagSession, as the service principal
pods.eks.amazonaws.com, and sends request tags naming the cluster and the pod: eks-cluster-arn, eks-cluster-name,
kubernetes-namespace, kubernetes-service-account, kubernetes-pod-name, kubernetes-pod-uid (Amazon EKS User Guide,
"Create IAM role with trust policy required by EKS Pod Identity", awsdocs/amazon-eks-user-guide
latest/ug/manage-access/aws-access/pod-id-role.adoc; the same list in pod-id-abac.adoc, "Enable or disable session
tags"). That page's condition on the namespace and service account tags is the documented way to restrict which
pods use a role; the cluster's ARN is added because namespaces and service accounts repeat from cluster to cluster
(EKS Best Practices Guide, security/iam.md "ABAC and EKS Pod Identities": check eks-cluster-arn as well).

Without conditions the trust policy (the User Guide's first example) lets any Pod Identity association of the
account use the role: a cluster of another stack in the same account, given iam:PassRole on it, gets its
permissions. aws:SourceAccount pins the account the service acts for, as AWS recommends against the confused
deputy (IAM User Guide, "The confused deputy problem"); the EKS Best Practices Guide's Pod Identity trust policy
conditions on aws:SourceOrgId, a key of the same family that EKS passes. aws:SourceArn is not used: what EKS passes
there for Pod Identity is the association's ARN (reported in awslabs/mountpoint-s3-csi-driver#781), which does not
exist before the role it names.

The request tags are present only while the association keeps its session tags (its default; disableSessionTags
would make every assume fail closed). Pure: no Pulumi.
"""
from __future__ import annotations

import re
from typing import Any, Dict

SERVICE_PRINCIPAL = "pods.eks.amazonaws.com"
ACTIONS = ("sts:AssumeRole", "sts:TagSession")
# The request tags the trust policy pins (pod-id-role.adoc): the cluster, the namespace, the service account.
CLUSTER_ARN_TAG = "eks-cluster-arn"
NAMESPACE_TAG = "kubernetes-namespace"
SERVICE_ACCOUNT_TAG = "kubernetes-service-account"
SID = "EksPodIdentityForOneServiceAccount"

_CLUSTER_ARN = re.compile(r"^arn:(aws|aws-cn|aws-us-gov):eks:[a-z]{2}(-[a-z]+)+-\d:(\d{12}):cluster/"
                          r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
_KUBERNETES_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def cluster_arn(partition: str, region: str, account_id: str, cluster_name: str) -> str:
    """The EKS cluster's ARN, as EKS puts it in the eks-cluster-arn tag."""
    arn = f"arn:{partition}:eks:{region}:{account_id}:cluster/{cluster_name}"
    if not _CLUSTER_ARN.match(arn):
        raise ValueError(f"{arn!r} is not an EKS cluster ARN (partition, region, 12-digit account, cluster name)")
    return arn


def trust_policy(cluster: str, namespace: str, service_account: str) -> Dict[str, Any]:
    """The trust policy of a role for `namespace`/`service_account` of the cluster whose ARN is `cluster`."""
    found = _CLUSTER_ARN.match(cluster)
    if not found:
        raise ValueError(f"{cluster!r} is not an EKS cluster ARN (use cluster_arn())")
    for what, name in (("namespace", namespace), ("service account", service_account)):
        if not isinstance(name, str) or len(name) > 253 or not _KUBERNETES_NAME.match(name):
            raise ValueError(f"{what} {name!r} is not a Kubernetes name")
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": SID, "Effect": "Allow", "Principal": {"Service": SERVICE_PRINCIPAL}, "Action": list(ACTIONS),
        "Condition": {"StringEquals": {
            "aws:SourceAccount": found.group(3),
            f"aws:RequestTag/{CLUSTER_ARN_TAG}": cluster,
            f"aws:RequestTag/{NAMESPACE_TAG}": namespace,
            f"aws:RequestTag/{SERVICE_ACCOUNT_TAG}": service_account}}}]}
