"""decisions/network/s3_endpoint.py: the S3 gateway endpoint lets through this account's buckets and, of other
accounts', only what nodes read (each bucket sourced), and what the stack names to read."""
import json

import pytest

from decisions.network import s3_endpoint
from tests.conftest import STACKS, stack_config

ACCOUNT = "123456789012"


def _by_sid(policy):
    return {s["Sid"]: s for s in policy["Statement"]}


def test_this_accounts_buckets_pass_whatever_the_action_and_no_other_accounts_do():
    this = _by_sid(s3_endpoint.gateway_endpoint_policy("aws", "us-east-1", ACCOUNT))["ThisAccountsBuckets"]
    assert this == {"Sid": "ThisAccountsBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
                    "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceAccount": ACCOUNT}}}


# Each bucket of another account nodes read, in eu-west-1: the name AWS or the project gives it, entry by entry.
@pytest.mark.parametrize("arn", [
    "arn:aws:s3:::prod-eu-west-1-starport-layer-bucket/*",      # ECR's image layers
    "arn:aws:s3:::al2023-repos-eu-west-1-de612dc2/*",           # the AL2023 AMI's dnf repositories
    "arn:aws:s3:::prod-registry-k8s-io-eu-west-1/*",            # registry.k8s.io's mirror in the region
])
def test_nodes_read_the_images_and_packages_of_their_region(arn):
    nodes = _by_sid(s3_endpoint.gateway_endpoint_policy("aws", "eu-west-1", ACCOUNT))["NodeImagesAndPackages"]
    assert nodes["Action"] == "s3:GetObject" and arn in nodes["Resource"]


def test_every_outside_bucket_says_why_and_where_its_name_comes_from():
    entries = s3_endpoint.load_outside_buckets().buckets
    assert len(entries) == 3 and all(e.why and e.source and "{region}" in e.bucket for e in entries)
    nodes = _by_sid(s3_endpoint.gateway_endpoint_policy("aws", "us-east-1", ACCOUNT))["NodeImagesAndPackages"]
    assert len(nodes["Resource"]) == len(entries) and not any("{" in r for r in nodes["Resource"])


def test_a_repository_in_another_account_is_listed_and_read_and_nothing_more():
    policy = s3_endpoint.gateway_endpoint_policy("aws", "us-east-1", ACCOUNT, ["arn:aws:s3:::acme-models"])
    assert _by_sid(policy)["NamedBucketsToRead"] == {
        "Sid": "NamedBucketsToRead", "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
        "Resource": ["arn:aws:s3:::acme-models", "arn:aws:s3:::acme-models/*"]}
    assert "NamedBucketsToRead" not in _by_sid(s3_endpoint.gateway_endpoint_policy("aws", "us-east-1", ACCOUNT))
    with pytest.raises(ValueError, match="is not a bucket ARN"):
        s3_endpoint.gateway_endpoint_policy("aws", "us-east-1", ACCOUNT, ["arn:aws:s3:::acme-models/triton"])


@pytest.mark.parametrize("stack", STACKS)
def test_every_stacks_s3_endpoint_carries_the_policy_of_its_region_and_account(stack_runs, stack):
    run = stack_runs[stack]
    (endpoint,) = [e for e in run.of_type("aws:ec2/vpcEndpoint:VpcEndpoint") if e.inputs["serviceName"].endswith(".s3")]
    assert json.loads(endpoint.inputs["policy"]) == s3_endpoint.gateway_endpoint_policy(
        "aws", stack_config(stack)["aws:region"], ACCOUNT)
