"""decisions/platform/pod_identity.py: a Pod Identity role trusts one service account of one cluster of its account."""
import pytest

from decisions.platform import pod_identity

CLUSTER = "arn:aws:eks:us-east-1:123456789012:cluster/gpu-cloud-prod-us-east-1"


def _condition(policy):
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert statement["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    return statement["Condition"]


def test_the_trust_names_the_account_the_cluster_the_namespace_and_the_service_account():
    condition = _condition(pod_identity.trust_policy(CLUSTER, "kube-system", "aws-load-balancer-controller"))
    assert condition == {"StringEquals": {
        "aws:SourceAccount": "123456789012",
        "aws:RequestTag/eks-cluster-arn": CLUSTER,
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": "aws-load-balancer-controller"}}


def test_the_account_is_the_clusters_not_a_fixed_one():
    other = "arn:aws:eks:eu-west-1:210987654321:cluster/gpu-cloud-dev"
    condition = _condition(pod_identity.trust_policy(other, "training", "trainer"))["StringEquals"]
    assert condition["aws:SourceAccount"] == "210987654321"
    assert condition["aws:RequestTag/eks-cluster-arn"] == other


@pytest.mark.parametrize("parts, arn", [
    (("aws", "us-east-1", "123456789012", "gpu-cloud-dev"), "arn:aws:eks:us-east-1:123456789012:cluster/gpu-cloud-dev"),
    (("aws-us-gov", "us-gov-west-1", "123456789012", "c1"), "arn:aws-us-gov:eks:us-gov-west-1:123456789012:cluster/c1"),
])
def test_the_cluster_arn_is_the_one_eks_tags_sessions_with(parts, arn):
    assert pod_identity.cluster_arn(*parts) == arn


@pytest.mark.parametrize("parts", [
    ("aws", "us-east-1", "12345678901", "c"),          # 11 digits
    ("aws", "us-east-1", "123456789012", "-c"),        # EKS names start with a letter or digit
    ("aws", "useast1", "123456789012", "c"),
    ("aws", "us-east-1", "123456789012", ""),
])
def test_what_is_not_a_cluster_arn_is_refused(parts):
    with pytest.raises(ValueError, match="is not an EKS cluster ARN"):
        pod_identity.cluster_arn(*parts)


@pytest.mark.parametrize("namespace, service_account", [
    ("Kube-System", "sa"), ("kube-system", ""), ("kube-system", "a b"), ("kube-system", "sa-")])
def test_names_that_kubernetes_does_not_allow_are_refused(namespace, service_account):
    with pytest.raises(ValueError, match="is not a Kubernetes name"):
        pod_identity.trust_policy(CLUSTER, namespace, service_account)


def test_a_trust_needs_a_cluster_arn_not_a_name():
    with pytest.raises(ValueError, match="is not an EKS cluster ARN"):
        pod_identity.trust_policy("gpu-cloud-prod-us-east-1", "kube-system", "sa")
