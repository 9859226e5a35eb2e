"""The deployer's IAM policy (decisions/config/deployer_policy.py, its table deployer_actions.yaml, and
scripts/deployer_policy.py, which writes docs/deployer-policy-*.json): every AWS resource type and provider function of
each shipped stack's plan has its actions, the table grants nothing no stack uses, the kept documents are the generated
ones and fit IAM's managed-policy size, and parliament (the IAM policy linter) knows every action and condition."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from decisions.catalog.data_files import read_yaml
from decisions.config.deployer_policy import (
    ACTIONS_PATH, MANAGED_POLICY_LIMIT, SERVICE_LINKED_ROLE, DeployerActions, Grants, UnmappedTokens,
    load_deployer_actions, policy_documents, policy_size, required_grants, statements, unused_entries)
from scripts.deployer_policy import documents_for, stack_tokens, stale, write
from tests.conftest import ROOT, STACKS, missing


@pytest.fixture(scope="module")
def table():
    return load_deployer_actions()


@pytest.fixture(scope="module")
def shipped(stack_runs):
    """The union of the shipped stacks' resource types and provider functions."""
    types, invokes = set(), set()
    for run in stack_runs.values():
        found = stack_tokens(run)
        types |= found[0]
        invokes |= found[1]
    return types, invokes


@pytest.mark.parametrize("stack", STACKS)
def test_every_aws_type_and_function_of_each_stack_has_its_actions(stack_runs, table, stack):
    types, invokes = stack_tokens(stack_runs[stack])
    grants = required_grants(types, invokes, table)
    assert grants.actions
    # An AWS resource always needs IAM: none of them may hide under withoutIam.
    assert sorted(t for t in types if t.startswith("aws:") and t not in table.resources) == []


def test_a_type_the_table_does_not_know_fails_naming_it(shipped, table):
    types, invokes = shipped
    with pytest.raises(UnmappedTokens) as raised:
        required_grants(types | {"aws:ec2/instance:Instance"}, invokes | {"aws:ec2/getAmi:getAmi"}, table)
    assert raised.value.tokens == ("aws:ec2/instance:Instance", "aws:ec2/getAmi:getAmi")
    assert "aws:ec2/instance:Instance" in str(raised.value) and "deployer_actions.yaml" in str(raised.value)


def test_the_table_grants_nothing_no_shipped_stack_uses(shipped, table):
    assert unused_entries(table, *shipped) == []
    extra = DeployerActions.model_validate({**read_yaml(ACTIONS_PATH), "resources": {
        **read_yaml(ACTIONS_PATH)["resources"], "aws:ec2/instance:Instance": {"actions": ["ec2:RunInstances"]}}})
    assert unused_entries(extra, *shipped) == ["aws:ec2/instance:Instance"]


def test_kubernetes_objects_need_no_iam_beyond_the_access_entry(shipped, table):
    types, invokes = shipped
    kubernetes = {t for t in types if t.startswith("kubernetes:")}
    assert kubernetes and required_grants(kubernetes, (), table).actions == frozenset()
    # ... which the deployer gets through the EKS actions the policy holds.
    grants = required_grants(*shipped, table)
    assert {"eks:CreateAccessEntry", "eks:AssociateAccessPolicy"} <= grants.actions


def test_the_kept_documents_are_the_ones_the_shipped_plans_give(shipped):
    expected = documents_for(*shipped)
    assert stale(expected) == [], "run .venv/bin/python scripts/deployer_policy.py"


def test_writing_leaves_exactly_the_expected_documents(tmp_path):
    (tmp_path / "deployer-policy-3.json").write_text("{}")          # a document an earlier, larger policy needed
    (tmp_path / "deployer-policy-1.json").write_text("{}")
    expected = {"deployer-policy-1.json": "one\n", "deployer-policy-2.json": "two\n"}
    assert stale(expected, tmp_path) == ["deployer-policy-1.json (differs)", "deployer-policy-2.json (missing)",
                                         "deployer-policy-3.json (left over)"]
    write(expected, tmp_path)
    assert stale(expected, tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)


def test_each_document_fits_a_managed_policy_and_the_split_is_by_service(shipped, table):
    grants = required_grants(*shipped, table)
    documents = policy_documents(grants)
    assert len(documents) > 1 and policy_size({"Version": "2012-10-17", "Statement": statements(grants)}) > \
        MANAGED_POLICY_LIMIT, "one document would do: the docs say the policy is split because it is too large"
    assert all(policy_size(d) <= MANAGED_POLICY_LIMIT for d in documents)
    sids = [s["Sid"] for d in documents for s in d["Statement"]]
    assert len(sids) == len(set(sids)) and statements(grants) == [s for d in documents for s in d["Statement"]]
    for document in documents:
        for statement in document["Statement"]:
            if statement["Sid"] != "ServiceLinkedRoles":
                assert {a.split(":")[0] for a in statement["Action"]} == {statement["Action"][0].split(":")[0]}


def test_documents_split_at_the_limit_and_refuse_a_statement_too_large_alone():
    grants = Grants(frozenset({"ec2:DescribeVpcs", "s3:ListBucket", "sqs:GetQueueAttributes"}), frozenset())
    one = policy_documents(grants)
    assert len(one) == 1
    small = max(policy_size({"Version": "2012-10-17", "Statement": [s]}) for s in statements(grants))
    assert [len(d["Statement"]) for d in policy_documents(grants, limit=small)] == [1, 1, 1]
    with pytest.raises(ValueError, match="alone is over"):
        policy_documents(grants, limit=small - 1)


def test_service_linked_roles_are_granted_for_their_services_only(shipped, table):
    grants = required_grants(*shipped, table)
    (statement,) = [s for s in statements(grants) if SERVICE_LINKED_ROLE in s["Action"]]
    assert statement["Condition"] == {"StringEquals": {"iam:AWSServiceName": sorted(grants.service_linked_roles)}}
    assert {"eks.amazonaws.com", "autoscaling.amazonaws.com", "fsx.amazonaws.com"} <= grants.service_linked_roles


def test_every_resource_type_can_be_read_back(table):
    """`pulumi up` reads every resource back after its create and `refresh` reads them all: each type has a read."""
    unreadable = [t for t, g in table.resources.items()
                  if not any(a.split(":")[1].startswith(("Describe", "Get", "List")) for a in g.actions)]
    assert unreadable == []


_PASSED_ROLE_KEYS = ("roleArn", "nodeRoleArn", "iamRoleArn", "role")


def _passes_a_role(resource) -> bool:
    inputs = resource.inputs
    direct = any(isinstance(inputs.get(k), str) and ":role/" in inputs[k] for k in _PASSED_ROLE_KEYS)
    nested = any(":role/" in str(a.get("roleArn", "")) for a in inputs.get("podIdentityAssociations") or [])
    return direct or nested


@pytest.mark.parametrize("stack", STACKS)
def test_what_hands_aws_a_role_may_pass_it(stack_runs, table, stack):
    """A resource that gives an AWS service one of the stack's roles (the cluster's, a node group's, the flow logs', an
    add-on's or association's Pod Identity role, S3 replication's) needs iam:PassRole; an Auto Scaling group launching
    from a template with an instance profile also launches as the caller (ec2:RunInstances)."""
    lacking = sorted({r.type for r in stack_runs[stack].resources
                      if r.type.startswith("aws:") and _passes_a_role(r)
                      and "iam:PassRole" not in table.resources[r.type].actions})
    assert lacking == []
    groups = stack_runs[stack].of_type("aws:autoscaling/group:Group")
    assert groups and {"ec2:RunInstances", "iam:PassRole"} <= set(table.resources[groups[0].type].actions)


def test_a_grant_must_name_real_actions_with_their_source():
    base = read_yaml(ACTIONS_PATH)
    for bad in ({"aws:x/y:Y": {"actions": []}}, {"aws:x/y:Y": {"actions": ["ec2 DescribeVpcs"]}},
                {"aws:x/y:Y": {"actions": [SERVICE_LINKED_ROLE]}}, {"aws:x/y:Y": {"actions": ["nosuch:Thing"]}},
                {"aws:x/y:Y": {"action": ["ec2:DescribeVpcs"]}}):
        with pytest.raises(ValidationError):
            DeployerActions.model_validate({**base, "resources": {**base["resources"], **bad}})


def _parliament():
    try:
        import parliament
    except ImportError:
        missing("parliament is not installed (requirements-dev.txt)")
    return parliament


# Parliament flags every `"Resource": "*"` on an action that could name resources: the policy grants every resource on
# purpose (docs/deploying.md, "The deployer's permissions": Pulumi's names carry random suffixes), so that finding is
# expected; any other (an unknown action or prefix, a condition key the action does not take, a malformed statement)
# fails.
EXPECTED_FINDINGS = {"RESOURCE_STAR"}


def _findings(document):
    return [(f.issue, f.detail) for f in _parliament().analyze_policy_string(json.dumps(document)).findings
            if f.issue not in EXPECTED_FINDINGS]


def test_parliament_knows_every_action_and_condition_of_the_kept_documents():
    kept = sorted((ROOT / "docs").glob("deployer-policy-*.json"))
    assert kept
    for path in kept:
        assert _findings(json.loads(path.read_text(encoding="utf-8"))) == [], path.name


def test_parliament_catches_an_action_that_does_not_exist():
    document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["eks:CreateClusters"],
                                                         "Resource": "*"}]}
    assert [issue for issue, _ in _findings(document)] == ["UNKNOWN_ACTION"]
