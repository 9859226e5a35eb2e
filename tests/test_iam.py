"""IAM across every shipped stack's plan: each statement left on "*" is listed, with its actions and reason, in
docs/security.md; the managed policies attached are the ones listed there; conditions use documented keys."""
import json
import re

import pytest

from tests.conftest import ROOT, STACKS

ACCOUNT = "123456789012"
# Where the program puts policy documents: IAM inline policies, KMS key policies, bucket policies.
DOCUMENT_TYPES = ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy", "aws:kms/key:Key",
                  "aws:s3/bucketPolicy:BucketPolicy")
SECTION = "## Every `*` resource"


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def documents(run):
    """(resource name, policy document) for every policy document a stack's plan renders."""
    found = []
    for resource in run.resources:
        raw = []
        if resource.type in DOCUMENT_TYPES and resource.inputs.get("policy"):
            raw.append(resource.inputs["policy"])
        if resource.type == "aws:iam/role:Role":
            raw += [p.get("policy") for p in resource.inputs.get("inlinePolicies") or []]
            raw.append(resource.inputs.get("assumeRolePolicy"))
        found += [(resource.name, json.loads(d) if isinstance(d, str) else d) for d in raw if d]
    return found


def star_statements(run):
    """{(resource name, Sid): set of actions} of every Allow statement on "*"."""
    found = {}
    for name, document in documents(run):
        for statement in _as_list(document.get("Statement", [])):
            if statement.get("Effect") == "Allow" and "*" in _as_list(statement.get("Resource")):
                assert "Sid" in statement, f"{name}: a statement on \"*\" without a Sid cannot be listed"
                found[(name, statement["Sid"])] = set(_as_list(statement["Action"]))
    return found


def _section(text, heading):
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else len(text)]


def _tables(section):
    """The section's tables, each a list of rows, each a list of cells (header and rule dropped)."""
    tables, current = [], None
    for line in section.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            current = None
    return [table[2:] for table in tables]


def _ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def documented():
    """({(resource, Sid): actions}, {managed policy name}) as docs/security.md lists them."""
    statements, managed = _tables(_section((ROOT / "docs/security.md").read_text(), SECTION))
    listed = {}
    for names, sid, actions, reason in statements:
        assert reason and len(_ticked(sid)) == 1, (names, sid)
        for name in _ticked(names):
            key = (name, _ticked(sid)[0])
            assert key not in listed, f"{key} is listed twice"
            listed[key] = set(_ticked(actions))
    return listed, {_ticked(row[0])[0] for row in managed if row[2]}


@pytest.fixture(scope="module")
def stars(stack_runs):
    return {stack: star_statements(stack_runs[stack]) for stack in STACKS}


def test_every_statement_on_star_in_any_stack_is_listed_with_its_actions(stars):
    listed, _ = documented()
    for stack, found in stars.items():
        unlisted = sorted(set(found) - set(listed))
        assert not unlisted, f"{stack}: statements on \"*\" missing from docs/security.md {SECTION!r}: {unlisted}"
        for key, actions in found.items():
            assert actions == listed[key], (stack, key, sorted(actions ^ listed[key]))


def test_the_table_lists_no_statement_that_no_stack_has(stars):
    listed, _ = documented()
    everywhere = set().union(*(set(found) for found in stars.values()))
    assert sorted(set(listed) - everywhere) == []


def test_the_managed_policies_attached_are_the_ones_listed(stack_runs):
    _, managed = documented()
    attached = set()
    for run in stack_runs.values():
        attached |= {r.inputs["policyArn"].rsplit("/", 1)[-1]
                     for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
        attached |= {arn.rsplit("/", 1)[-1] for r in run.of_type("aws:iam/role:Role")
                     for arn in r.inputs.get("managedPolicyArns") or []}
    assert attached == managed


def test_the_tables_parser_sees_a_planted_row_and_a_changed_action(stars):
    """The check above fails as it should: a statement the table lacks is found, and so is one action more."""
    listed, _ = documented()
    found = dict(stars["prod-us-east-1"])
    found[("node-gate", "Planted")] = {"ec2:DescribeInstances"}
    assert set(found) - set(listed) == {("node-gate", "Planted")}
    key = ("lb-controller-identity-policy", "Describe")
    assert found[key] | {"ec2:GetCoipPoolUsage"} != listed[key]


@pytest.mark.parametrize("stack", STACKS)
def test_no_condition_uses_the_undocumented_aws_arn_key(stack_runs, stack):
    for name, document in documents(stack_runs[stack]):
        for statement in _as_list(document.get("Statement", [])):
            keys = {key.lower() for block in (statement.get("Condition") or {}).values() for key in block}
            assert "aws:arn" not in keys, (stack, name, statement.get("Sid"))


@pytest.mark.parametrize("stack", STACKS)
def test_every_node_role_tags_only_the_instance_it_runs_on(stack_runs, stack):
    run = stack_runs[stack]
    gates = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-node-gate")]
    assert gates
    for gate in gates:
        (tag,) = [s for s in json.loads(gate.inputs["policy"])["Statement"] if s["Sid"] == "TagSelfWithVerdict"]
        instances = f"arn:aws:ec2:{run.region}:{ACCOUNT}:instance/"
        assert tag["Action"] == "ec2:CreateTags" and tag["Resource"] == instances + "*"
        # the calling instance (ec2:SourceInstanceARN) is the tagged one (ec2:InstanceID), as AWSEC2VssSnapshotPolicy
        assert tag["Condition"] == {
            "ArnEquals": {"ec2:SourceInstanceARN": instances + "${ec2:InstanceID}"},
            "ForAllValues:StringEquals": {"aws:TagKeys": ["gpu-cloud:verify", "gpu-cloud:verify-reason"]}}


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1"])
def test_the_load_balancer_controller_has_no_outposts_reads_and_reads_groups_of_its_own_vpc_only(stack_runs, stack):
    run = stack_runs[stack]
    policy = json.loads(run.one("aws:iam/rolePolicy:RolePolicy", "lb-controller-identity-policy").inputs["policy"])
    actions = [a for s in policy["Statement"] for a in _as_list(s["Action"])]
    assert not {"ec2:GetCoipPoolUsage", "ec2:DescribeCoipPools"} & set(actions)
    (reads,) = [s for s in policy["Statement"] if "ec2:GetSecurityGroupsForVpc" in _as_list(s["Action"])]
    vpc = run.one("aws:ec2/vpc:Vpc").state["id"]
    assert reads["Resource"] == f"arn:aws:ec2:{run.region}:{ACCOUNT}:vpc/{vpc}"


@pytest.mark.parametrize("stack", STACKS)
def test_every_pod_identity_role_trusts_only_its_service_account_on_this_stacks_cluster(stack_runs, stack):
    """EKS User Guide, pod-id-role.adoc: the request tags name the cluster, namespace and service account; without
    them any Pod Identity association of the account (another stack's cluster) could use the role."""
    run = stack_runs[stack]
    cluster = f"arn:aws:eks:{run.region}:{ACCOUNT}:cluster/{run.one('aws:eks/cluster:Cluster').inputs['name']}"
    used_by = {a.inputs["roleArn"]: (a.inputs["namespace"], a.inputs["serviceAccount"])
               for a in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    used_by.update({a["roleArn"]: ("kube-system", a["serviceAccount"]) for addon in run.of_type("aws:eks/addon:Addon")
                    for a in addon.inputs.get("podIdentityAssociations") or []})
    trusted = [r for r in run.of_type("aws:iam/role:Role") if "pods.eks.amazonaws.com" in r.inputs["assumeRolePolicy"]]
    assert trusted and {r.state["arn"] for r in trusted} == set(used_by)
    for role in trusted:
        (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        namespace, service_account = used_by[role.state["arn"]]
        assert statement["Condition"] == {"StringEquals": {
            "aws:SourceAccount": ACCOUNT, "aws:RequestTag/eks-cluster-arn": cluster,
            "aws:RequestTag/kubernetes-namespace": namespace,
            "aws:RequestTag/kubernetes-service-account": service_account}}, role.name
        assert not [a for a in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                    if a.inputs.get("disableSessionTags")], "the trust needs the session tags"
