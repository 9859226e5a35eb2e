"""How long `pulumi up` takes to create each stack: the critical path through the plan's dependency graph."""
from pathlib import Path

import pytest

from plan.deploy_time import CreateTimesError, estimate, load_create_times, resources_of
from tests.conftest import STACKS

EKS = "aws:eks/cluster:Cluster"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
ASG = "aws:autoscaling/group:Group"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"

# Today's critical path of each shipped stack, in seconds (bench/RESULTS.md shows the chains). A change that makes
# the path longer (a new wait for the cluster, or for anything a resource does not use) fails here; a change that
# shortens it lowers the figure.
HELD_CRITICAL_SECONDS = {
    # network -> FSx's own group rules -> FSx (10 min) -> data repository (20 min): the inherent chain. FSx used to
    # wait for the EKS cluster through the rules naming its group (2545 s).
    "prod-us-east-1": 1820,
    "prod-eu-west-1": 1820,
    # network -> EKS -> add-ons -> system nodes -> coredns -> monitoring release -> GPU operator: the operator waits
    # for the ServiceMonitor CRD the monitoring release installs (it makes the DCGM exporter's ServiceMonitor only
    # when the CRD exists), 60 s more than the drain handler -> GPU pool chain it replaced (1405 s).
    "dev": 1465,
}


@pytest.fixture(scope="module")
def times():
    return load_create_times()


def resource(name, type_="aws:ec2/vpc:Vpc", deps=(), parent=None, provider=None, custom=True, inputs=None):
    return {"urn": f"urn:{name}", "name": name, "type": type_, "custom": custom, "dependencies": [f"urn:{d}" for d in deps],
            "parent": f"urn:{parent}" if parent else None, "provider": f"urn:{provider}" if provider else None,
            "inputs": inputs or {}}


@pytest.mark.parametrize("stack", STACKS)
def test_the_critical_path_is_no_longer_than_today(stack_runs, times, stack):
    result = estimate(resources_of(stack_runs[stack]), times)
    assert result.critical_seconds <= HELD_CRITICAL_SECONDS[stack], [(s.name, s.seconds) for s in result.critical_path]
    # The path is a chain: each step starts when the one before it ends. With Lustre it is the file system and its
    # data repository, which wait for nothing of the cluster's; without, the EKS control plane is on it.
    for before, after in zip(result.critical_path, result.critical_path[1:]):
        assert after.waited_for == before.urn and after.start == before.finish
    types = [s.type for s in result.critical_path]
    assert types[-2:] == [FSX, DRA] and EKS not in types if stack != "dev" else EKS in types
    # One resource at a time would take far longer: the engine's parallelism is what the path measures.
    assert result.total_seconds > 2 * result.critical_seconds


def test_a_file_system_made_to_wait_for_the_cluster_lengthens_the_path(stack_runs, times):
    """The held figure catches an avoidable wait: FSx (and its data repository association) made to wait for the
    control plane too, where on its own it runs beside the cluster."""
    resources = resources_of(stack_runs["dev"])
    cluster = next(r for r in resources if r["type"] == EKS)
    fsx, association = resource("fsx", FSX), resource("dra", DRA, deps=["fsx"])
    longer = estimate(resources + [{**fsx, "dependencies": [cluster["urn"]]}, association], times)
    assert longer.critical_seconds > HELD_CRITICAL_SECONDS["dev"]
    assert [s.name for s in longer.critical_path][-3:] == [cluster["name"], "fsx", "dra"]
    alongside = estimate(resources + [fsx, association], times)
    assert alongside.critical_seconds == max(estimate(resources, times).critical_seconds,
                                             sum(times.of(r).seconds for r in (fsx, association)))


def test_waits_through_dependencies_parents_and_providers(times):
    resources = [
        resource("vpc"), resource("eks", EKS, deps=["vpc"]), resource("component", "gpu-cloud:x:X", custom=False),
        resource("k8s", "pulumi:providers:kubernetes", deps=["eks"]),
        resource("release", "kubernetes:helm.sh/v3:Release", parent="component", provider="k8s"),
        resource("fsx", FSX, deps=["vpc"])]
    result = estimate(resources, times)
    assert [(s.name, s.because) for s in result.critical_path] == [
        ("vpc", None), ("eks", "dependency"), ("k8s", "dependency"), ("release", "provider")]
    seconds = {name: times.of(r).seconds for name, r in zip("vpc eks component k8s release fsx".split(), resources)}
    assert seconds["component"] == 0 and seconds["eks"] >= 600
    assert result.critical_seconds == seconds["vpc"] + seconds["eks"] + seconds["k8s"] + seconds["release"]
    assert result.total_seconds == sum(seconds.values())
    # A provider recorded as `urn::id` (a run's record, not the document) is the same wait.
    with_id = [dict(r, provider=r["provider"] + "::provider-id") if r["provider"] else r for r in resources]
    assert estimate(with_id, times).critical_seconds == result.critical_seconds


def test_an_auto_scaling_group_that_does_not_wait_for_capacity_is_quick(times):
    waits = times.of(resource("asg", ASG)).seconds
    assert times.of(resource("asg", ASG, inputs={"waitForCapacityTimeout": "0"})).seconds < waits / 5


def test_a_cycle_is_an_error(times):
    with pytest.raises(ValueError, match="cycle"):
        estimate([resource("a", deps=["b"]), resource("b", deps=["a"])], times)


def test_every_figure_has_a_source(tmp_path: Path):
    table = tmp_path / "times.yaml"
    table.write_text("default: {seconds: 5, source: x}\ntypes:\n  aws:eks/cluster:Cluster: {seconds: 720}\n")
    with pytest.raises(CreateTimesError, match=r"types\.aws:eks/cluster:Cluster\.source"):
        load_create_times(table)
    table.write_text("default: {seconds: -1, source: x}\ntypes: {}\n")
    with pytest.raises(CreateTimesError, match=r"default\.seconds"):
        load_create_times(table)
