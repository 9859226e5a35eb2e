"""plan/destroy.py: `pulumi destroy` as the engine runs it, on small graphs and on the shipped stacks' plans; and
docs/deploying.md's "Destroying a stack" run as written on a copy of prod-us-east-1's plan.

What users rely on: the destroy the docs describe finishes. The claim lustre-data is never deleted by itself, which
would wait on its pvc-protection finalizer while team pods mount it: it goes with the training namespace, whose
deletion removes the pods first; the volume does not wait on the namespace either; the file system's KMS key
stays. And a destroy run without unprotecting deletes nothing protected and drops nothing from the state that
still exists.
"""
from __future__ import annotations

import copy
import re
import shlex

import pytest

from plan import destroy as engine
from tests.conftest import ROOT, STACKS

NAMESPACE = "kubernetes:core/v1:Namespace"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
PV = "kubernetes:core/v1:PersistentVolume"
KEY = "aws:kms/key:Key"
FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
EKS = "aws:eks/cluster:Cluster"


def resource(name, *, deps=(), parent=None, provider=None, custom=True, protect=False, retain=False, with_=None,
             props=None, type_="test:index:Thing"):
    return {"urn": f"urn:{name}", "name": name, "type": type_, "custom": custom, "parent": parent and f"urn:{parent}",
            "provider": provider and f"urn:{provider}", "dependencies": [f"urn:{d}" for d in deps],
            "propertyDependencies": {k: [f"urn:{d}" for d in v] for k, v in (props or {}).items()},
            "deletedWith": with_ and f"urn:{with_}", "protect": protect, "retainOnDelete": retain}


def outcomes(result):
    return {d.name: d.outcome for d in result.deletions}


def position(result):
    return {d.name: d.round for d in result.deletions}


# --- the engine's rules on small graphs ------------------------------------------------------------------------------

def test_what_depends_on_a_resource_goes_before_it_children_before_parents_providers_last():
    result = engine.destroy([
        resource("provider", type_="pulumi:providers:test"),
        resource("component", custom=False),
        resource("network", parent="component", provider="provider"),
        resource("server", deps=["network"], parent="component", provider="provider"),
        resource("record", props={"target": ["server"]}, provider="provider"),
    ])
    at = position(result)
    assert at["record"] < at["server"] < at["network"] < at["provider"]     # property dependency, dependency
    assert at["server"] < at["component"] and at["network"] < at["component"]       # children, then the parent
    assert set(outcomes(result).values()) == {engine.DELETED}
    assert [d.round for d in result.deletions] == sorted(d.round for d in result.deletions)


def test_a_resource_deleted_with_another_is_left_to_it_and_goes_first():
    result = engine.destroy([resource("namespace"), resource("claim", with_="namespace")])
    assert outcomes(result) == {"claim": engine.GOES_WITH, "namespace": engine.DELETED}
    assert position(result)["claim"] < position(result)["namespace"]     # deletedWith is a dependency too
    assert not result.of("urn:claim").provider_deletes and result.of("urn:namespace").provider_deletes


def test_a_protected_resource_refuses_and_keeps_what_it_depends_on_but_not_what_depends_on_it():
    result = engine.destroy([
        resource("vpc"), resource("subnet", deps=["vpc"]), resource("cluster", deps=["subnet"], protect=True),
        resource("app", deps=["cluster"]), resource("unrelated"),
        resource("node", parent="group"), resource("group", custom=False, deps=["subnet"]),
    ])
    assert outcomes(result) == {"app": engine.DELETED, "cluster": engine.REFUSED, "subnet": engine.SKIPPED,
                                "vpc": engine.SKIPPED, "unrelated": engine.DELETED, "node": engine.DELETED,
                                "group": engine.DELETED}


def test_protection_is_checked_before_retain_and_deleted_with():
    kept = engine.destroy([resource("key", protect=True, retain=True), resource("ns", protect=True),
                           resource("claim", with_="ns", protect=True)])
    assert outcomes(kept) == {"key": engine.REFUSED, "claim": engine.REFUSED, "ns": engine.SKIPPED}
    freed = engine.destroy(engine.unprotect(
        [resource("key", protect=True, retain=True), resource("ns", protect=True), resource("claim", with_="ns")]))
    assert outcomes(freed) == {"key": engine.RETAINED, "ns": engine.DELETED, "claim": engine.GOES_WITH}


def test_a_stack_reference_is_read_not_deleted():
    result = engine.destroy([resource("peer", type_="pulumi:pulumi:StackReference"), resource("rule", deps=["peer"])])
    assert outcomes(result) == {"rule": engine.DELETED, "peer": engine.READ}


def test_what_goes_with_a_target_that_refuses_is_stranded():
    """The engine marks every resource of a destroy for deletion before it runs one, and a deletedWith resource
    counts its target's mark: it leaves the state while the refusing target keeps it."""
    result = engine.destroy([resource("ns", protect=True), resource("claim", with_="ns")])
    assert outcomes(result) == {"claim": engine.GOES_WITH, "ns": engine.REFUSED}
    assert [d.name for d in result.stranded] == ["claim"]


def test_depending_on_a_component_is_depending_on_its_children():
    result = engine.destroy([resource("release", custom=False), resource("crd", parent="release"),
                             resource("object", deps=["release"])])
    assert position(result)["object"] < position(result)["crd"]


def test_unprotect_takes_urns_or_all_and_leaves_the_plan_as_it_was():
    plan = [resource("a", protect=True), resource("b", protect=True)]
    assert [r["protect"] for r in engine.unprotect(plan, ["urn:a"])] == [False, True]
    assert [r["protect"] for r in engine.unprotect(plan)] == [False, False]
    assert [r["protect"] for r in plan] == [True, True]


def test_a_cycle_is_an_error():
    with pytest.raises(ValueError, match="cycle"):
        engine.rounds([resource("a", deps=["b"]), resource("b", deps=["a"])])


# --- docs/deploying.md, "Destroying a stack", run on a copy of the plan -----------------------------------------------

def destroy_section_commands():
    """The `pulumi` commands of docs/deploying.md's destroy section (its ```sh cluster blocks, list items' indented
    ones included), in the page's order, as argument lists."""
    text = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")
    start = text.index("## Destroying a stack")
    end = text.find("\n## ", start)
    section = text[start:] if end < 0 else text[start:end]
    commands = []
    for block in re.findall(r"^[ \t]*```sh cluster\n(.*?)^[ \t]*```", section, re.M | re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0]
            for found in re.finditer(r"(?:^|\$\(|;|&&)\s*pulumi\s+([^)|;&]*)", line):
                commands.append(shlex.split(found.group(1)))
    return commands


def run_commands(commands, plans):
    """Each command against the plan of the stack it names: `state unprotect` changes a copy of the plan,
    `destroy` computes the engine's deletes, `stack output` reads. {stack: Destroy}."""
    state, results = {}, {}
    for args in commands:
        stack = args[args.index("--stack") + 1]
        resources = state.setdefault(stack, copy.deepcopy(plans[stack]["resources"]))
        words = [a for a in args if not a.startswith("-") and a != stack]
        if words[:2] == ["state", "unprotect"]:
            urns = words[2:]
            assert ("--all" in args) != bool(urns), args
            state[stack] = engine.unprotect(resources, None if "--all" in args else urns)
        elif words[:1] == ["destroy"]:
            results[stack] = engine.destroy(state[stack])
        elif words[:2] == ["stack", "output"]:
            continue
        else:
            raise AssertionError(f"the destroy section runs `pulumi {' '.join(args)}`, which this test cannot run")
    return results


@pytest.fixture(scope="module")
def docs_destroy(plan_documents):
    results = run_commands(destroy_section_commands(), plan_documents)
    assert list(results) == ["prod-us-east-1"], "the section destroys prod-us-east-1, once"
    return results["prod-us-east-1"], {r["urn"]: r for r in plan_documents["prod-us-east-1"]["resources"]}


def one(result, type_token, name):
    return result.named(type_token, name)


def test_the_documented_destroy_removes_the_training_pods_before_the_claim_could_block(docs_destroy):
    result, _ = docs_destroy
    namespace = one(result, NAMESPACE, "tenancy-training")
    claim, volume = one(result, PVC, "lustre-pvc"), one(result, PV, "lustre-pv")
    assert namespace.outcome == engine.DELETED
    # The claim is not deleted by itself (that delete would wait on pvc-protection while a pod mounts it): the
    # namespace's deletion takes it, after the pods.
    assert claim.outcome == engine.GOES_WITH and claim.deleted_with == namespace.urn
    # Nothing whose deletion waits for the claim is deleted before the namespace: the volume (pv-protection holds a
    # volume bound to a claim in use) goes with the cluster, and does not depend on the namespace.
    assert volume.outcome == engine.GOES_WITH and volume.deleted_with == one(result, EKS, "cluster-eks").urn
    waiting = [d for d in (claim, volume) if d.provider_deletes and d.round <= namespace.round]
    assert waiting == []


def test_the_volume_does_not_wait_for_the_namespace(docs_destroy):
    _, by_urn = docs_destroy
    volume = next(r for r in by_urn.values() if r["type"] == PV)
    namespace = next(r for r in by_urn.values() if r["type"] == NAMESPACE and r["name"] == "tenancy-training")
    assert namespace["urn"] not in engine.dependencies_of(volume, by_urn)
    assert volume["inputs"]["spec"]["claimRef"] == {"namespace": "training", "name": "lustre-data"}


def test_the_documented_destroy_keeps_the_lustre_key_and_finishes(docs_destroy):
    result, _ = docs_destroy
    (lustre_key,) = [d for d in result.deletions if d.type == KEY and d.name == "lustre-kms"]
    assert lustre_key.outcome == engine.RETAINED          # not scheduled for deletion with what it encrypts
    assert one(result, FS, "lustre-fs").outcome == engine.DELETED
    assert not result.with_outcome(engine.REFUSED) and not result.with_outcome(engine.SKIPPED)
    assert result.stranded == []


@pytest.mark.parametrize("stack", STACKS)
def test_a_destroy_without_unprotecting_deletes_nothing_protected_and_strands_nothing(plan_documents, stack):
    result = engine.destroy(copy.deepcopy(plan_documents[stack]["resources"]))
    protected = {r["urn"] for r in plan_documents[stack]["resources"] if r["protect"]}
    # each one refuses, or is kept by one that refused and depends on it (the cluster keeps its KMS key)
    assert {d.outcome for d in result.deletions if d.urn in protected} == {engine.REFUSED, engine.SKIPPED}
    assert result.stranded == []      # the claim, protected too, keeps its namespace, volume and file system
    if stack != "dev":
        assert one(result, PVC, "lustre-pvc").outcome == engine.REFUSED
        assert {one(result, kind, name).outcome for kind, name in (
            (NAMESPACE, "tenancy-training"), (PV, "lustre-pv"), (FS, "lustre-fs"))} <= {engine.REFUSED, engine.SKIPPED}


def test_the_documented_destroy_deletes_the_training_namespace_before_the_kueue_objects_its_workloads_hold(
        docs_destroy):
    """Kueue keeps its finalizer on a ClusterQueue being deleted while a Workload reserves its quota, and on a
    ResourceFlavor while a ClusterQueue uses it (kubernetes-sigs/kueue v0.19.2 pkg/controller/core
    clusterqueue_controller.go lines 193-205, resourceflavor_controller.go lines 107-117). Deleted in that order, with
    Kueue still running, each delete finishes: the namespace (its Workloads), then the ClusterQueue, then the flavors,
    then Kueue."""
    result, _ = docs_destroy
    kueue = "kubernetes:kueue.x-k8s.io/v1beta2:"
    namespace = one(result, NAMESPACE, "tenancy-training")
    queue = one(result, kueue + "ClusterQueue", "training-cluster-queue")
    flavors = [d for d in result.deletions if d.type == kueue + "ResourceFlavor"]
    release = one(result, "kubernetes:helm.sh/v3:Release", "training-operators-kueue")
    assert {d.outcome for d in (namespace, queue, release, *flavors)} == {engine.DELETED}
    assert namespace.round < queue.round < min(f.round for f in flavors) <= max(f.round for f in flavors) < release.round
