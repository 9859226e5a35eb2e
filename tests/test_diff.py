"""The offline change preview (`python -m plan STACK --against OLD.json`): real dev plan documents, changed
by hand or through the stack file, diffed by URN."""
import copy
import json

import pytest
import yaml

from plan.diff import diff_documents, render_changes
from tests.conftest import ROOT
from tests.test_plan import plan

SUBNET, LAUNCH_TEMPLATE = "aws:ec2/subnet:Subnet", "aws:ec2/launchTemplate:LaunchTemplate"
GROUP, CLUSTER = "aws:autoscaling/group:Group", "aws:eks/cluster:Cluster"


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """The dev stack's plan document as `--json` writes it."""
    path = tmp_path_factory.mktemp("diff") / "dev.json"
    result = plan("dev", "--json", path)
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text())


def first(document, kind):
    return next(r for r in document["resources"] if r["type"] == kind)


def changed(changes):
    """URN -> change, for the resources that do change."""
    return {c.urn: c for c in changes if c.action != "unchanged"}


def test_identical_documents_change_nothing(old):
    changes = diff_documents(old, json.loads(json.dumps(old)))
    assert changed(changes) == {}
    assert len(changes) == len(old["resources"])
    assert render_changes(changes) == [
        f"  0 to create, 0 to update, 0 to replace, 0 to delete, {len(changes)} unchanged"]


def test_a_subnet_cidr_change_is_a_replace_naming_the_forcing_input(old):
    new = copy.deepcopy(old)
    subnet = first(new, SUBNET)
    subnet["inputs"]["cidrBlock"] = "10.255.0.0/24"
    (change,) = changed(diff_documents(old, new)).values()
    assert (change.urn, change.action, change.paths, change.forced_by) == (
        subnet["urn"], "replace", ("cidrBlock",), ("cidrBlock",))
    assert render_changes([change])[:3] == [f"  replace  {subnet['urn']}", "           changed: cidrBlock",
                                            "           forces replacement: cidrBlock"]


def test_a_launch_template_user_data_change_is_an_update_that_rolls_the_pool(old):
    new = copy.deepcopy(old)
    template = first(new, LAUNCH_TEMPLATE)
    template["inputs"]["userData"] += "Cg=="
    (change,) = changed(diff_documents(old, new)).values()
    assert (change.urn, change.action, change.paths, change.forced_by) == (template["urn"], "update", ("userData",), ())
    assert "           note: rolls the pool's nodes (instance refresh)" in render_changes([change])


def test_nested_list_and_tag_paths_are_named_and_do_not_force_replacement(old):
    new = copy.deepcopy(old)
    group, subnet = first(new, GROUP), first(new, SUBNET)
    group["inputs"]["instanceRefresh"]["preferences"]["minHealthyPercentage"] = 50.0
    group["inputs"]["vpcZoneIdentifiers"][-1] = "subnet-0000000000000000f"
    subnet["inputs"]["tags"]["Name"] += "-renamed"
    subnet["inputs"]["tags"]["example.com/owner"] = "ml-platform"
    last = len(group["inputs"]["vpcZoneIdentifiers"]) - 1
    changes = changed(diff_documents(old, new))
    assert {urn: (c.action, c.paths) for urn, c in changes.items()} == {
        group["urn"]: ("update", ("instanceRefresh.preferences.minHealthyPercentage", f"vpcZoneIdentifiers[{last}]")),
        subnet["urn"]: ("update", ("tags.Name", 'tags["example.com/owner"]')),
    }


def test_a_change_at_or_under_a_nested_forcing_input_replaces(old):
    new = copy.deepcopy(old)
    group, cluster = first(new, GROUP), first(new, CLUSTER)
    group["inputs"]["initialLifecycleHooks"][0]["heartbeatTimeout"] += 60
    cluster["inputs"]["kubernetesNetworkConfig"]["ipFamily"] = "ipv6"
    changes = changed(diff_documents(old, new))
    assert {urn: (c.action, c.paths, c.forced_by) for urn, c in changes.items()} == {
        group["urn"]: ("replace", ("initialLifecycleHooks[0].heartbeatTimeout",), ("initialLifecycleHooks",)),
        cluster["urn"]: ("replace", ("kubernetesNetworkConfig.ipFamily",), ("kubernetesNetworkConfig.ipFamily",)),
    }


def test_cluster_subnets_update_in_place(old):
    new = copy.deepcopy(old)
    cluster = first(new, CLUSTER)
    cluster["inputs"]["vpcConfig"]["subnetIds"].pop()
    (change,) = changed(diff_documents(old, new)).values()
    assert (change.urn, change.action, change.forced_by) == (cluster["urn"], "update", ())


def test_removed_and_added_resources_are_delete_and_create(old):
    new = copy.deepcopy(old)
    removed = new["resources"].pop()
    subnet = first(new, SUBNET)
    added = dict(copy.deepcopy(subnet), urn=subnet["urn"] + "-extra")
    new["resources"].append(added)
    changes = diff_documents(old, new)
    assert {urn: c.action for urn, c in changed(changes).items()} == {removed["urn"]: "delete", added["urn"]: "create"}
    assert render_changes(changes)[-1] == (
        f"  1 to create, 0 to update, 0 to replace, 1 to delete, {len(old['resources']) - 1} unchanged")


def test_cli_lists_a_pool_size_change_as_an_update_of_its_group(old, tmp_path):
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    pool = stack["config"]["gpu-cloud:nodePools"][0]
    pool["maxNodes"] += 1
    stack_file, old_path = tmp_path / "Pulumi.dev.yaml", tmp_path / "old.json"
    stack_file.write_text(yaml.safe_dump(stack))
    old_path.write_text(json.dumps(old))
    group = next(r for r in old["resources"] if r["type"] == GROUP and r["parent"].endswith(f"::{pool['name']}"))

    result = plan("dev", "--stack-file", stack_file, "--against", old_path)

    assert result.returncode == 0, result.stderr
    report = result.stdout.split(f"\nChanges against {old_path}:\n", 1)[1].splitlines()
    line = report.index(f"  update   {group['urn']}")
    assert "maxSize" in report[line + 1].removeprefix("           changed: ").split(", ")
    assert ", 0 to replace, 0 to delete, " in report[-1]


@pytest.mark.parametrize("content", [None, "{not json", '{"version": 1, "resources": []}'],
                         ids=["missing", "not-json", "not-a-plan-document"])
def test_an_unusable_old_document_is_one_line_exit_3(tmp_path, content):
    old_path = tmp_path / "old.json"
    if content is not None:
        old_path.write_text(content)
    result = plan("dev", "--against", old_path)
    assert result.returncode == 3
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1 and str(old_path) in result.stderr
    assert "Traceback" not in result.stderr
