"""The offline change preview (`python -m plan STACK --against OLD.json`): real dev plan documents, changed
by hand or through the stack file, diffed by URN."""
import copy
import json
import re

import pytest
import yaml

from plan.diff import (WIDTH, capacity_and_cost, diff_documents, initial_sizes, keep_ignored, parse_property_path,
                       render_capacity_and_cost, render_changes, wrapped)
from tests.conftest import ROOT
from tests.test_plan import plan

SUBNET, LAUNCH_TEMPLATE = "aws:ec2/subnet:Subnet", "aws:ec2/launchTemplate:LaunchTemplate"
GROUP, CLUSTER = "aws:autoscaling/group:Group", "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


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
    group["ignoreChanges"] = []     # a group that does not ignore its hooks, as the pools' groups do (below)
    group["inputs"]["initialLifecycleHooks"][0]["heartbeatTimeout"] += 60
    hook = group["inputs"]["initialLifecycleHooks"][0]["name"]     # hooks are named entries, shown by name
    cluster["inputs"]["kubernetesNetworkConfig"]["ipFamily"] = "ipv6"
    changes = changed(diff_documents(old, new))
    assert {urn: (c.action, c.paths, c.forced_by) for urn, c in changes.items()} == {
        group["urn"]: ("replace", (f'initialLifecycleHooks["{hook}"].heartbeatTimeout',), ("initialLifecycleHooks",)),
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
    stack_file, old_path, new_path = tmp_path / "Pulumi.dev.yaml", tmp_path / "old.json", tmp_path / "new.json"
    stack_file.write_text(yaml.safe_dump(stack))
    old_path.write_text(json.dumps(old))
    group = next(r for r in old["resources"] if r["type"] == GROUP and r["parent"].endswith(f"::{pool['name']}"))

    result = plan("dev", "--stack-file", stack_file, "--against", old_path, "--json", new_path)

    assert result.returncode == 0, result.stderr
    report = result.stdout.split(f"\nChanges against {old_path}:\n", 1)[1].splitlines()
    line = report.index(f"  update   {group['urn']}")
    assert "maxSize" in report[line + 1].removeprefix("           changed: ").split(", ")
    assert ", 0 to replace, 0 to delete, " in report[-1]
    # The capacity and cost difference: one more node of the pool at max, its GPUs and its node's rate.
    gpus = next(r for r in old["capacity"] if r["pool"] == pool["name"])
    cost = next(p for p in old["cost"]["pools"] if p["pool"] == pool["name"])
    was, now = gpus["gpusAtMax"], gpus["gpusAtMax"] + gpus["gpusPerNode"]
    table = result.stdout.split(f"\nCapacity and cost against {old_path} (stack dev; ", 1)[1].split("\n\n")[0]
    row = next(line.split("  ") for line in table.splitlines() if line.startswith(f"  {pool['name']} "))
    assert [cell.strip() for cell in row if cell.strip()] == [
        pool["name"], str(gpus["gpusAtDesired"]), f"{was} -> {now} (+{gpus['gpusPerNode']})",
        f"${cost['hourlyAtDesired']:,.2f}",
        f"${cost['hourlyAtMax']:,.2f} -> ${cost['hourlyAtMax'] + cost['nodeHourly']:,.2f} "
        f"(+${cost['nodeHourly']:,.2f})"]
    assert re.search(rf"\n  total +{gpus['gpusAtDesired']} +{was} -> {now} \(\+", table), table
    # The document written alongside keeps every change and the figures.
    changes = json.loads(new_path.read_text())["changes"]
    assert changes["against"] == str(old_path) and changes["stack"] == "dev"
    assert {r["urn"]: r["paths"] for r in changes["resources"]}[group["urn"]] == ["maxSize"]
    (figures,) = [r for r in changes["capacityAndCost"] if r["pool"] == pool["name"]]
    assert figures["gpusAtMax"] == {"old": was, "new": now}


def test_the_capacity_and_cost_difference_names_new_and_removed_pools_and_price_gaps(old):
    new = copy.deepcopy(old)
    (row,), (cost,) = new["capacity"], new["cost"]["pools"]
    added = dict(copy.deepcopy(row), pool="batch", gpusAtDesired=0, gpusAtMax=16)
    new["capacity"].append(added)
    new["cost"]["pools"].append(dict(copy.deepcopy(cost), pool="batch", hourlyAtDesired=None, hourlyAtMax=None))
    new["cost"]["complete"] = False
    rows = {r["pool"]: r for r in capacity_and_cost(old, new)}
    assert list(rows) == [row["pool"], "batch", "fixed costs", "total"]
    assert rows["batch"]["added"] and rows["batch"]["incomplete"] and not rows[row["pool"]]["incomplete"]
    assert rows["total"]["gpusAtMax"] == {"old": row["gpusAtMax"], "new": row["gpusAtMax"] + 16}
    assert rows["total"]["incomplete"] and not rows["fixed costs"]["incomplete"]
    lines = render_capacity_and_cost(list(rows.values()))
    assert re.search(r"\n  batch \(new\) \(incomplete\) +- -> 0 +- -> 16 +- -> no price +- -> no price\n",
                     "\n".join(lines) + "\n"), lines
    assert next(line for line in lines if line.startswith("  total")).startswith("  total (incomplete)")
    gone = {r["pool"]: r for r in capacity_and_cost(new, old)}["batch"]
    assert gone["removed"] and not gone["added"]


def test_the_fixed_costs_row_is_the_documents_recorded_total_not_a_sum_of_rounded_items(old):
    # cost.fixedCosts is summed from the unrounded figures; the items carry each figure rounded to 1/100 cent, so a
    # sum of them can be off. Whatever the items say, the row shows what the document recorded.
    recorded = old["cost"]["fixedCosts"]
    new = copy.deepcopy(old)
    new["cost"]["fixedCosts"] = dict(recorded, hourlyAtDesired=recorded["hourlyAtDesired"] + 1.0,
                                     hourlyAtMax=recorded["hourlyAtMax"] + 2.0)
    rows = {r["pool"]: r for r in capacity_and_cost(old, new)}
    assert rows["fixed costs"]["hourlyAtDesired"] == {"old": recorded["hourlyAtDesired"],
                                                       "new": recorded["hourlyAtDesired"] + 1.0}
    assert rows["fixed costs"]["hourlyAtMax"] == {"old": recorded["hourlyAtMax"], "new": recorded["hourlyAtMax"] + 2.0}
    line = next(line for line in render_capacity_and_cost(list(rows.values())) if line.startswith("  fixed costs"))
    assert "(+$2.00)" in line and "(+$1.00)" in line
    # a document written before fixedCosts existed still compares, from its items
    older = copy.deepcopy(old)
    del older["cost"]["fixedCosts"]
    items = sum(i["hourlyAtMax"] or 0 for i in old["cost"]["fixed"])
    assert {r["pool"]: r for r in capacity_and_cost(older, old)}["fixed costs"]["hourlyAtMax"]["old"] == \
        round(items, 4)


def test_tags_and_other_lists_of_named_entries_are_compared_by_key(old):
    new = copy.deepcopy(old)
    group = first(new, GROUP)
    tags = {t["key"]: t for t in group["inputs"]["tags"]}
    assert len(tags) > 3                      # the group's tags are a list of {key, value, propagateAtLaunch}
    name, other = list(tags)[:2]
    tags[name]["value"] += "-renamed"
    tags[other]["propagateAtLaunch"] = not tags[other]["propagateAtLaunch"]
    group["inputs"]["tags"].insert(0, {"key": "Team", "value": "ml", "propagateAtLaunch": True})  # order moves
    group["ignoreChanges"] = []     # the hooks compared, as a group that does not ignore them would have them
    group["inputs"]["initialLifecycleHooks"][0]["heartbeatTimeout"] += 60
    hook = group["inputs"]["initialLifecycleHooks"][0]["name"]
    (change,) = changed(diff_documents(old, new)).values()
    key = lambda k: f"tags.{k}" if re.fullmatch(r"[A-Za-z_]\w*", k) else f"tags[{json.dumps(k)}]"  # noqa: E731
    assert set(change.paths) == {key(name), f"{key(other)}.propagateAtLaunch", "tags.Team",
                                 f'initialLifecycleHooks["{hook}"].heartbeatTimeout'}
    assert not [p for p in change.paths if re.search(r"\[\d+\]", p)]


def test_a_reordered_list_of_named_entries_is_a_change_of_the_list(old):
    new = copy.deepcopy(old)
    group = first(new, GROUP)
    hooks = group["inputs"]["initialLifecycleHooks"]
    assert len(hooks) >= 2
    group["ignoreChanges"] = []     # as a group that does not ignore its hooks would have them
    hooks.reverse()
    (change,) = changed(diff_documents(old, new)).values()
    assert change.paths == ("initialLifecycleHooks",)


def test_changed_paths_wrap_to_the_width_and_the_rest_is_counted():
    paths = [f'tags["example.com/label-{i:02}"]' for i in range(40)]
    lines = wrapped("changed", paths)
    assert all(len(line) <= WIDTH for line in lines) and len(lines) == 3
    assert lines[0].startswith("           changed: tags[")
    shown = [p.strip(", ") for line in lines[:-1] for p in line.split(": ", 1)[-1].split(", ")]
    assert shown == paths[:len(shown)]
    assert lines[-1].strip() == f"... and {40 - len(shown)} more (all 40 in the --json document's changes)"
    assert wrapped("changed", paths[:2]) == [f"           changed: {paths[0]}, {paths[1]}"]
    long = "spec." + "x" * 200
    assert all(len(line) <= WIDTH for line in wrapped("changed", [long, "a"]))


@pytest.mark.parametrize("content", [None, "{not json", '{"version": 1, "resources": []}'],
                         ids=["missing", "not-json", "not-a-plan-document"])
def test_an_unusable_old_document_is_one_line_exit_2(tmp_path, content):
    old_path = tmp_path / "old.json"
    if content is not None:
        old_path.write_text(content)
    result = plan("dev", "--against", old_path)
    assert result.returncode == 2       # as --policy-check's: a plan document that cannot be read is an input error
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1 and str(old_path) in result.stderr
    assert f"python -m plan STACK --json {old_path}" in result.stderr and "Traceback" not in result.stderr


def test_a_document_of_another_stack_is_refused_unless_forced(old, tmp_path):
    other = tmp_path / "prod.json"
    other.write_text(json.dumps(dict(old, stack="prod-us-east-1")))
    refused = plan("dev", "--against", other)
    assert refused.returncode == 4 and refused.stdout == ""
    assert (f"--against {other} is the plan document of stack prod-us-east-1, not dev" in refused.stderr
            and "--force" in refused.stderr), refused.stderr
    forced = plan("dev", "--against", other, "--force", "--no-policy")
    assert forced.returncode == 0, forced.stderr
    assert f"Capacity and cost against {other} (stack prod-us-east-1; " in forced.stdout
    assert re.search(r"\n  \d+ to create, \d+ to update, \d+ to replace, \d+ to delete, \d+ unchanged$",
                     forced.stdout.rstrip()), forced.stdout[-2000:]


# --- ignoreChanges, as the engine applies it to an update (pkg/resource/deploy/step_generator.go) --------------------
@pytest.mark.parametrize("path, elements", [
    ("desiredCapacity", ("desiredCapacity",)),
    ("scalingConfig.desiredSize", ("scalingConfig", "desiredSize")),
    ('a.b[0]["c.d"].e', ("a", "b", 0, "c.d", "e")),
    ('tags["kubernetes.io/cluster/x"]', ("tags", "kubernetes.io/cluster/x")),
    ('["say \\"hi\\""][1]', ('say "hi"', 1)),
    ("a[*].b", ("a", "*", "b")),
    ("a.*", ("a", "*")),
])
def test_property_paths_parse_as_the_engine_parses_them(path, elements):
    assert parse_property_path(path) == elements


@pytest.mark.parametrize("path", ["a[0", 'a["b', 'a["b"x', "a[b]"])
def test_a_property_path_the_engine_cannot_parse_is_an_error(path):
    with pytest.raises(ValueError):
        parse_property_path(path)


def test_keep_ignored_puts_the_old_value_back_and_removes_what_the_old_inputs_lack():
    old = {"size": 1, "spec": {"replicas": 2, "image": "a"}, "list": [{"x": 1}, {"x": 2}]}
    new = {"size": 5, "spec": {"replicas": 9, "image": "b"}, "list": [{"x": 3}, {"x": 4}], "added": True}
    kept, invalid = keep_ignored(old, new, ["size", "spec.replicas", "list[*].x", "added", "absent.deeper"])
    assert (kept, invalid) == ({"size": 1, "spec": {"replicas": 2, "image": "b"}, "list": [{"x": 1}, {"x": 2}]}, [])
    assert new["size"] == 5                                 # the program's inputs are left as they are
    # a path whose parent only the old inputs hold fails the step, as Reset's path error does; an unparsable one is
    # skipped, as processIgnoreChanges skips it
    assert keep_ignored({"a": {"b": 1}}, {}, ["a.b", "x[y]"]) == ({}, ["a.b"])
    assert keep_ignored({"l": [1, 2]}, {"l": [1]}, ["l[1]"])[1] == ["l[1]"]   # an array keeps its length


def test_an_ignored_input_is_listed_as_ignored_never_as_an_update(old):
    new = copy.deepcopy(old)
    group, system = first(new, GROUP), first(new, NODE_GROUP)
    assert {"desiredCapacity", "initialLifecycleHooks"} <= set(group["ignoreChanges"])
    assert system["ignoreChanges"] == ["scalingConfig.desiredSize"]
    group["inputs"]["desiredCapacity"] += 1
    hooks = group["inputs"]["initialLifecycleHooks"]
    hooks[0]["heartbeatTimeout"] += 60                       # under a forcing input, yet ignored: no replace
    system["inputs"]["scalingConfig"]["desiredSize"] += 1
    changes = {c.urn: c for c in diff_documents(old, new)}
    assert (changes[group["urn"]].action, changes[group["urn"]].ignored) == (
        "unchanged", ("desiredCapacity", f'initialLifecycleHooks["{hooks[0]["name"]}"].heartbeatTimeout'))
    assert (changes[system["urn"]].action, changes[system["urn"]].ignored) == (
        "unchanged", ("scalingConfig.desiredSize",))
    lines = render_changes(list(changes.values()))
    at = lines.index(f"  ignored  {group['urn']}")
    assert lines[at + 1] == (f'           ignored (ignoreChanges): desiredCapacity, '
                             f'initialLifecycleHooks["{hooks[0]["name"]}"].heartbeatTimeout')
    assert lines[-1].endswith(" 0 to update, 0 to replace, 0 to delete, "
                              f"{len(changes)} unchanged; 2 with changes ignored (ignoreChanges)")
    # beside a change that is applied, only that change is an update
    system["inputs"]["scalingConfig"]["maxSize"] += 1
    change = {c.urn: c for c in diff_documents(old, new)}[system["urn"]]
    assert (change.action, change.paths, change.ignored) == ("update", ("scalingConfig.maxSize",),
                                                             ("scalingConfig.desiredSize",))


def test_a_created_resource_takes_every_input_and_a_path_the_engine_refuses_is_said(old):
    new = copy.deepcopy(old)
    group = first(new, GROUP)
    added = dict(copy.deepcopy(group), urn=group["urn"] + "-extra")
    added["inputs"]["desiredCapacity"] += 1
    new["resources"].append(added)
    # the old group has a warm pool, the new one none: the ignored path's parent is missing on one side only
    before = copy.deepcopy(old)
    first(before, GROUP)["inputs"]["warmPool"] = {"minSize": 1}
    group["inputs"].pop("warmPool", None)
    group["ignoreChanges"] = ["warmPool.minSize"]
    changes = {c.urn: c for c in diff_documents(before, new)}
    assert (changes[added["urn"]].action, changes[added["urn"]].ignored) == ("create", ())
    refused = changes[group["urn"]]
    assert refused.note == ("`pulumi up` fails here: cannot ignore changes to warmPool.minSize, one or more elements "
                            "of the path are missing")
    assert (refused.action, refused.paths, refused.ignored) == ("update", ("warmPool",), ())


def test_initial_sizes_new_pools_take_desired_existing_keep_theirs_within_the_new_bounds(old):
    (row,) = old["capacity"]
    assert row["desiredNodes"] == 1

    def document(**pools):
        return {"capacity": [dict(row, pool=name, minNodes=low, desiredNodes=desired, maxNodes=high)
                             for name, (low, desired, high) in pools.items()]}

    before = document(a=(0, 1, 3), b=(0, 3, 4), c=(0, 1, 3))
    after = document(a=(0, 2, 3), b=(0, 1, 2), c=(2, 2, 3), d=(0, 2, 4))
    assert initial_sizes(before, after) == {
        "a": {"old": 1, "new": 2, "applied": 1},      # ignoreChanges desiredCapacity: the group keeps 1
        "b": {"old": 3, "new": 1, "applied": 2},      # a new maxSize below it moves the group down to it
        "c": {"old": 1, "new": 2, "applied": 2},      # a new minSize above it moves the group up to it
        "d": {"old": None, "new": 2, "applied": 2},   # created at its desiredNodes
    }
    rows = capacity_and_cost(before, after, initial_sizes(before, after))
    lines = render_capacity_and_cost(rows)
    assert lines[0].split() == ["pool", "GPUs@initial", "GPUs@max", "USD/hour@initial", "USD/hour@max"]
    assert lines[-3:] == [
        "  a: desiredNodes 1 -> 2 does not apply to its existing group, which keeps 1 node (ignoreChanges)",
        "  b: desiredNodes 3 -> 1 does not apply to its existing group, which goes to 2 nodes (its new maxNodes)",
        "  initial: at desiredNodes, a pool's size when created; an existing group's size is the cluster-autoscaler's"]


def _changed_stack(tmp_path, old, change):
    """A dev stack file with `change` made to its first pool, and the old document written beside it."""
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    change(stack["config"])
    stack_file, old_path = tmp_path / "Pulumi.dev.yaml", tmp_path / "old.json"
    stack_file.write_text(yaml.safe_dump(stack))
    old_path.write_text(json.dumps(old))
    return stack_file, old_path


def _difference(stdout, old_path):
    """The capacity and cost table of --against, and its change listing."""
    after = stdout.split(f"\nCapacity and cost against {old_path} (stack dev; ", 1)[1]
    table, listing = after.split(f"\nChanges against {old_path}:\n", 1)
    return table, listing.splitlines()


def test_cli_raising_desired_nodes_changes_nothing_pulumi_up_would_apply(old, tmp_path):
    pool = old["capacity"][0]["pool"]
    stack_file, old_path = _changed_stack(tmp_path, old, lambda c: c["gpu-cloud:nodePools"][0].update(desiredNodes=2))
    new_path = tmp_path / "new.json"
    result = plan("dev", "--stack-file", stack_file, "--against", old_path, "--json", new_path, "--no-policy")
    assert result.returncode == 0, result.stderr
    table, listing = _difference(result.stdout, old_path)
    group = next(r for r in old["resources"] if r["type"] == GROUP and r["parent"].endswith(f"::{pool}"))
    at = listing.index(f"  ignored  {group['urn']}")
    assert listing[at + 1] == "           ignored (ignoreChanges): desiredCapacity"
    assert not [line for line in listing if line.startswith("  update ") and line.endswith(group["urn"])]
    # no figure moves: not the pool's, not its root volume's among the fixed costs, not the total
    rows = [line for line in table.splitlines() if line.startswith((f"  {pool}  ", "  fixed costs  ", "  total  "))]
    assert len(rows) == 3 and not [row for row in rows if "->" in row], table
    assert f"\n  {pool}: desiredNodes 1 -> 2 does not apply to its existing group, which keeps 1 node " \
           "(ignoreChanges)\n" in table
    changes = json.loads(new_path.read_text())["changes"]
    assert {r["urn"]: (r["action"], r["ignored"]) for r in changes["resources"]}[group["urn"]] == (
        "unchanged", ["desiredCapacity"])
    figures = {r["pool"]: r for r in changes["capacityAndCost"]}
    assert figures[pool]["desiredNodes"] == {"old": 1, "new": 2, "applied": 1}
    assert all(r[f]["old"] == r[f]["new"] for r in figures.values() for f in ("gpusAtDesired", "hourlyAtDesired"))
    # the report above it still plans the stack as its file says: 2 nodes at desired
    assert json.loads(new_path.read_text())["capacity"][0]["desiredNodes"] == 2


def test_cli_over_budget_still_shows_the_difference_then_exits_2(old, tmp_path):
    pool = old["capacity"][0]
    stack_file, old_path = _changed_stack(tmp_path, old, lambda c: c["gpu-cloud:nodePools"][0].update(maxNodes=9))
    result = plan("dev", "--stack-file", stack_file, "--against", old_path, "--no-policy")
    assert result.returncode == 2, result.stderr
    table, listing = _difference(result.stdout, old_path)
    assert re.search(rf"\n  {pool['pool']} +{pool['gpusAtDesired']} +{pool['gpusAtMax']} -> "
                     rf"{9 * pool['gpusPerNode']} \(\+", table), table
    assert any(line.startswith("  update ") for line in listing)
    assert "gpu-cloud:budget.maxHourlyUsd: GPU pools at maxNodes cost $" in result.stderr
    assert result.stderr.rstrip().endswith(f"python -m plan: exit 2: the stack is over its budget, which `pulumi up` "
                                           f"refuses; the difference against {old_path} shows what the change would do")
    # without --against the plan stops before it runs, as before; a budget that is no number stops it either way
    alone = plan("dev", "--stack-file", stack_file)
    assert (alone.returncode, alone.stdout) == (2, "") and "above the budget" in alone.stderr
    stack_file, old_path = _changed_stack(tmp_path, old, lambda c: c["gpu-cloud:budget"].update(maxHourlyUsd=-5))
    invalid = plan("dev", "--stack-file", stack_file, "--against", old_path)
    assert (invalid.returncode, invalid.stdout) == (2, "") and "Input should be greater than 0" in invalid.stderr
