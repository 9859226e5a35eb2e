"""The policy pack's views of a stack (plan/views.py, plan/preview.py): what the engine hands CrossGuard on an update,
a later preview and a new stack's first preview, and the CLI that judges each."""
import json

import pytest
from pulumi_policy.proxy import UnknownValueError

from plan.engine import ProgramRun, RegisteredResource
from plan.policy_runner import PolicyViewError, engine_arguments, run_pack
from plan.preview import PreviewMonitor, existing_in
from plan.views import (PREVIEW_VIEWS, UNKNOWN, VIEWS, ViewFacts, computed_outputs, merged, unknown_paths,
                        view_inputs, view_outputs, with_unknowns)
from tests.conftest import STACKS, PlanProcess

US = "prod-us-east-1"
K8S_PROVIDER = "urn:pulumi:prod-us-east-1::gpu-cloud::gpu-cloud:cluster:EksCluster$pulumi:providers:kubernetes::cluster-k8s"


def by_name(document, name):
    (found,) = [r for r in document["resources"] if r["name"] == name]
    return found


# --- the rules, on values worked by hand ------------------------------------------------------------------------
def test_computed_outputs_are_what_the_provider_adds_at_any_depth():
    inputs = {"name": "c", "vpcConfig": {"subnetIds": ["s-1"]}, "tags": {"a": "b"}}
    state = {"name": "c", "vpcConfig": {"subnetIds": ["s-1"], "clusterSecurityGroupId": "sg-1"},
             "tags": {"a": "b"}, "arn": "arn:x", "endpoint": "https://e"}
    assert computed_outputs(inputs, state) == {"vpcConfig": {"clusterSecurityGroupId": "sg-1"}, "arn": "arn:x",
                                               "endpoint": "https://e"}
    assert merged(inputs, computed_outputs(inputs, state)) == state


def test_unknown_paths_and_back():
    value = {"a": [1, UNKNOWN, {"b": UNKNOWN}], "c": "x", "d": UNKNOWN}
    paths = unknown_paths(value)
    assert paths == [("a", 1), ("a", 2, "b"), ("d",)]
    known = {"a": [1, 2, {"b": 3}], "c": "x", "d": 4}
    assert with_unknowns(known, paths) == value and known["d"] == 4      # a copy: the document is not changed


def _resource(urn, inputs, computed=None, provider="urn:p"):
    return {"urn": urn, "type": "aws:s3/bucketPolicy:BucketPolicy", "inputs": inputs,
            "computedOutputs": computed or {}, "provider": provider}


def test_what_each_kind_of_resource_shows_in_a_view():
    created = _resource("urn:new", {"bucket": "b", "policy": "{}"}, {"id": "b", "arn": "arn:b"})
    deployed = _resource("urn:old", {"bucket": "b", "policy": "{}"}, {"id": "b"})
    hidden = _resource("urn:k8s", {"metadata": {"name": "x"}}, {"status": {"phase": "Active"}}, provider="urn:k")
    facts = ViewFacts("preview", existing=frozenset({"urn:old"}), unconfigured_providers=frozenset({"urn:k"}),
                      unknown_inputs={"urn:new": (("policy",),), "urn:old": (("policy",),)})
    # Resource policies: the inputs, what the preview cannot know as the engine's unknown value.
    assert view_inputs(created, facts) == {"bucket": "b", "policy": UNKNOWN}
    assert view_inputs(hidden, facts) == {"metadata": {"name": "x"}}      # Check returns them as they are
    # Stack policies: the outputs.
    assert view_outputs(created, facts) == {"bucket": "b", "policy": UNKNOWN, "id": UNKNOWN, "arn": UNKNOWN}
    assert view_outputs(deployed, facts) == {"bucket": "b", "policy": UNKNOWN, "id": "b"}
    assert view_outputs(hidden, facts) == {}
    # The update: everything known, outputs are inputs and what the provider added.
    assert view_outputs(created, None) == {"bucket": "b", "policy": "{}", "id": "b", "arn": "arn:b"}
    provider = {"urn": "urn:k", "type": "pulumi:providers:kubernetes", "inputs": {"kubeconfig": "[secret]"},
                "computedOutputs": {}, "provider": None}
    assert view_outputs(provider, ViewFacts("first-preview", unknown_inputs={"urn:k": (("kubeconfig",),)})) == {
        "kubeconfig": UNKNOWN}


def test_an_existing_stack_is_its_providers_and_what_they_are_built_from():
    def registered(urn, type_, dependencies=()):
        return RegisteredResource(urn=urn, type=type_, name=urn, custom=True, parent=None, provider=None, inputs={},
                                  dependencies=tuple(dependencies), protect=False, retain_on_delete=False, state={})
    run = ProgramRun("p", "s", "r", [registered("vpc", "aws:ec2/vpc:Vpc"),
                                     registered("cluster", "aws:eks/cluster:Cluster", ["vpc"]),
                                     registered("k8s", "pulumi:providers:kubernetes", ["cluster"]),
                                     registered("bucket", "aws:s3/bucket:Bucket")], {})
    assert existing_in("preview", run) == {"k8s", "cluster", "vpc"}
    assert existing_in("first-preview", run) == frozenset()


def test_a_preview_registering_what_the_update_did_not_is_refused(stack_runs):
    monitor = PreviewMonitor(None, stack_runs["dev"], frozenset())

    class Request:
        parent, type, name, provider = "", "aws:s3/bucket:Bucket", "not-in-the-update", ""

    with pytest.raises(AssertionError, match="not in the update"):
        monitor.RegisterResource(Request())


# --- the shipped stacks' views --------------------------------------------------------------------------------
def test_a_new_stacks_first_preview_shows_every_helm_release_and_prometheus_rule_as_an_empty_map(plan_documents):
    document = plan_documents[US]
    assert document["policyViews"]["first-preview"]["unconfiguredProviders"] == [K8S_PROVIDER]
    _, resource_args, stack = engine_arguments(document, "first-preview")
    hidden = [r for r in stack if r.resource_type in ("kubernetes:helm.sh/v3:Release",
                                                       "kubernetes:monitoring.coreos.com/v1:PrometheusRule")]
    assert len([r for r in hidden if r.resource_type.endswith(":Release")]) == 9
    assert len([r for r in hidden if r.resource_type.endswith(":PrometheusRule")]) == 1
    assert all(len(r.props) == 0 for r in hidden)
    # every Kubernetes object is hidden from stack policies, no AWS resource is
    for resource in stack:
        if resource.resource_type.startswith("kubernetes:"):
            assert len(resource.props) == 0, resource.urn
        elif resource.resource_type.startswith("aws:"):
            assert len(resource.props) > 0, resource.urn
    # A resource policy still sees the inputs: the provider's Check returns them unchanged.
    release = by_name(document, "node-drain-nth")
    assert resource_args(release, {}).props["chart"].endswith("aws-node-termination-handler")


def test_an_existing_stack_has_its_cluster_and_providers_and_creates_the_rest(plan_documents):
    for stack in STACKS:
        preview = plan_documents[stack]["policyViews"]["preview"]
        existing = set(preview["existing"])
        assert preview["unconfiguredProviders"] == [] and preview["absent"] == []
        types = {urn.split("::")[-2].split("$")[-1] for urn in existing}
        assert {"pulumi:providers:aws", "pulumi:providers:kubernetes", "aws:eks/cluster:Cluster",
                "aws:ec2/vpc:Vpc"} <= types
        assert not any(t.startswith(("aws:s3/", "aws:autoscaling/", "kubernetes:")) for t in types)


@pytest.mark.parametrize("view", PREVIEW_VIEWS)
def test_what_a_preview_cannot_know_is_what_the_sdk_leaves_unknown(plan_documents, view):
    document = plan_documents[US]
    unknown = document["policyViews"][view]["unknownInputs"]

    def paths(name):
        return unknown.get(by_name(document, name)["urn"], [])

    # A bucket policy names its bucket's ARN: unknown until the bucket exists. The bucket's own name is the
    # program's, known.
    assert ["policy"] in paths("datasets-policy") and paths("datasets-bucket") == []
    # A launch template's instance type and metadata options are the program's; its security groups are not.
    template = paths("train-h100-lt")
    assert template and not any(p[0] in ("instanceType", "metadataOptions") for p in template)
    # The Kubernetes provider's kubeconfig is built from the cluster's endpoint: unknown only on a new stack.
    assert (paths("cluster-k8s") == [["kubeconfig"]]) == (view == "first-preview")
    _, resource_args, _ = engine_arguments(document, view)
    with pytest.raises(UnknownValueError):
        resource_args(by_name(document, "datasets-policy"), {}).props["policy"]


def test_the_views_register_what_the_update_registers(stack_runs, stack_views):
    for stack in STACKS:
        for view, facts in stack_views[stack].items():
            assert facts.absent == frozenset(), (stack, view)


def test_an_unknown_view_or_a_document_without_views_is_refused(plan_documents):
    document = dict(plan_documents["dev"])
    with pytest.raises(PolicyViewError, match="not one of update, preview, first-preview"):
        run_pack(document, view="dry-run")
    del document["policyViews"]
    assert run_pack(document, view="update")["violations"] == []
    with pytest.raises(PolicyViewError, match="plan the stack again with --json"):
        run_pack(document, view="first-preview")


# --- the CLI: every shipped stack passes in every view --------------------------------------------------------
@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("views")
    paths = {stack: directory / f"{stack}.json" for stack in STACKS}
    plans = [[stack, "--policy-view", "first-preview", "--json", path] for stack, path in paths.items()]
    plans.append([US, "--policy-view", "preview"])
    checks = [["--policy-check", paths[stack], "--policy-view", view] for stack in STACKS for view in VIEWS]
    results = PlanProcess(plans + checks, directory / "results.json").results()
    return dict(zip(map(tuple, map(lambda a: map(str, a), plans + checks)), results)), paths


def test_every_shipped_stack_passes_the_pack_in_every_view_from_the_cli(cli_runs):
    results, paths = cli_runs
    assert len(results) == 4 + 3 * len(VIEWS)
    for argv, result in results.items():
        assert result.returncode == 0, (argv, result.stdout[-2000:], result.stderr)
        if "--policy-check" in argv:
            assert "Policy (pack gpu-cloud v1.0.0), as " in result.stdout and ": no violations" in result.stdout
        else:
            assert "other views: " in result.stdout
            # each view's verdict twice: in the summary's policy line and in the Policy section
            assert result.stdout.count("no violations") == 6, result.stdout[-600:]
    document = json.loads(paths[US].read_text())
    assert document["policy"]["view"] == "first-preview"
    assert set(document["policyViews"]) == set(PREVIEW_VIEWS)
    assert document["policy"]["otherViews"] == {"update": {"violations": 0, "mandatory": 0},
                                                "preview": {"violations": 0, "mandatory": 0}}


def test_a_document_without_the_view_asked_for_exits_2(plan_documents, tmp_path):
    document = dict(plan_documents["dev"])
    del document["policyViews"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    check, = PlanProcess([["--policy-check", path, "--policy-view", "preview"]], tmp_path / "r.json").results()
    assert check.returncode == 2 and "records no preview view" in check.stderr and "Traceback" not in check.stderr


def test_the_cli_the_program_and_the_pack_require_is_the_pinned_sdks_release_line():
    """Pulumi.yaml's and PulumiPolicy.yaml's requiredPulumiVersion, which the CLI enforces before it runs either
    (pulumi/pulumi v3.219.0 and later, plugin.ValidatePulumiVersionRange): the same range, from the release of the
    pinned Python SDK up to the next major, in blang/semver's range syntax (space-separated comparisons are AND-ed)."""
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    project = yaml.safe_load((root / "Pulumi.yaml").read_text())["requiredPulumiVersion"]
    pack = yaml.safe_load((root / "policy/PulumiPolicy.yaml").read_text())["requiredPulumiVersion"]
    (sdk,) = re.findall(r"^pulumi==(\d+\.\d+\.\d+)$", (root / "requirements.txt").read_text(), re.M)
    assert project == pack == f">={sdk} <4.0.0"
    assert "requiredPulumiVersion" in (root / "plan/views.py").read_text().split('"""')[1]
    assert f"`{project}`" in (root / "docs/deploying.md").read_text()      # the deployer is told which CLI
