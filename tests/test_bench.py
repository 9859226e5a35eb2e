"""bench/plan_bench.py: its floors must register what they claim to, or its ratios mean nothing. Nothing here is timed
(speed is measured by the bench itself). bench/rollout_bench.py: its batches and step times follow EC2 Auto Scaling's
pacing."""
import json

import pytest

from bench.plan_bench import (fit_line, floor_run, large_stack, record_constructions,
                              same_inputs_run, typed_floor_run)
from bench.rollout_bench import batch_size, rollout_seconds, stack_rollouts
from conftest import stack_config
from decisions.config.validate import NAMESPACE, load_stack_spec
from plan.stackfile import project_keys


@pytest.fixture(scope="module")
def dev_constructions():
    return record_constructions(stack_config("dev"), "dev")


def test_typed_floor_rebuilds_every_resource_of_the_plan_with_its_own_class_and_the_same_inputs(dev_constructions):
    run, constructions = dev_constructions
    floor = typed_floor_run("us-east-1", constructions)
    assert sorted((r.type, r.name) for r in floor.resources) == sorted((r.type, r.name) for r in run.resources)
    planned = {(r.type, r.name): r.inputs for r in run.resources}
    differing = [(r.type, r.name) for r in floor.resources if r.custom and r.inputs != planned[(r.type, r.name)]]
    assert differing == []
    # ... but none of the program's options or links between resources: that is what the floor leaves out.
    assert all(r.parent is None or "::pulumi:pulumi:Stack::" in r.parent for r in floor.resources)
    assert not any(r.dependencies for r in floor.resources)


def test_typed_floor_builds_provider_classes_not_plain_resources(dev_constructions):
    run, constructions = dev_constructions
    by_type = {c.type: c for c in constructions}
    import pulumi_aws
    import pulumi_kubernetes
    assert by_type["aws:ec2/launchTemplate:LaunchTemplate"].cls is pulumi_aws.ec2.LaunchTemplate
    assert by_type["kubernetes:helm.sh/v3:Release"].cls is pulumi_kubernetes.helm.v3.Release
    # A provider's inputs reach the engine JSON-encoded; the constructor gets them decoded.
    assert by_type["pulumi:providers:aws"].kwargs["skip_region_validation"] is True
    # Components (gpu-cloud's own, a manifest file) carry no provider class: they are built as plain components.
    assert sorted((c.type, c.name) for c in constructions if c.cls is None) == sorted(
        (r.type, r.name) for r in run.resources if not r.custom)


def test_the_other_floors_register_the_plans_count_and_its_inputs_untyped(dev_constructions):
    run, _ = dev_constructions
    assert len(floor_run("us-east-1", 7).resources) == 7
    custom = [r for r in run.resources if r.custom and not r.type.startswith("pulumi:")]
    untyped = same_inputs_run("us-east-1", run.resources)
    # Registration order follows the event loop, so compare by name.
    assert sorted((r.type, r.name, json.dumps(r.inputs, sort_keys=True)) for r in untyped.resources) == sorted(
        (r.type, r.name, json.dumps(r.inputs, sort_keys=True)) for r in custom)


@pytest.mark.parametrize("pools", [1, 5, 64])
def test_synthetic_stacks_have_the_pools_asked_for_and_pass_validation(pools):
    config = large_stack(pools)
    spec = load_stack_spec(project_keys(config, NAMESPACE), stack="prod-us-east-1", region=config["aws:region"])
    assert [p.name for p in spec.pools] == [f"pool-{i:03d}" for i in range(pools)]
    assert all(p.spec.max_nodes == 1 for p in spec.pools)


def test_fit_line_recovers_a_line_and_scores_scatter():
    intercept, slope, r2 = fit_line([(1, 5.0), (2, 8.0), (4, 14.0), (8, 26.0)])   # y = 2 + 3x
    assert (round(intercept, 9), round(slope, 9), round(r2, 9)) == (2.0, 3.0, 1.0)
    intercept, slope, r2 = fit_line([(0, 0.0), (1, 2.0), (2, 1.0)])
    # By hand: means (1, 1); sum dx*dy 1, sum dx^2 2; fitted 0.5, 1, 1.5; squared residuals 1.5 of a total 2.
    assert (round(intercept, 9), round(slope, 9), round(r2, 9)) == (0.5, 0.5, 0.25)


@pytest.mark.parametrize("nodes,min_healthy,max_healthy,batch", [
    (4, 75, 100, 1),     # a 4-node reservation: keep 3, never above 4
    (10, 90, 120, 3),    # keep 9, up to 12 in service or pending
    (20, 90, 110, 4),    # keep 18, up to 22
    (2, 90, 120, 1),     # keep 2 (1.8 rounded up), at most 2 (2.4 rounded down): no room, still one at a time
    (3, 50, 100, 1),     # keep 2 (1.5 rounded up, not down to 1)
    (5, 80, 130, 2),     # keep 4, at most 6 (6.5 rounded down, not up to 7)
    (3, 0, 100, 3),      # nothing kept: all at once
    (0, 90, 120, 0),     # an empty group replaces nothing
])
def test_refresh_batches_are_the_room_between_min_and_max_healthy(nodes, min_healthy, max_healthy, batch):
    assert batch_size(nodes, min_healthy, max_healthy) == batch


def test_rollout_steps_wait_for_the_warmup_or_the_node_whichever_is_longer():
    # 4 nodes one at a time: 4 steps of 1170 s to CONTINUE + the warmup (the old 1200, the new 600 = ready).
    assert rollout_seconds(4, 1, 1170, 600, 1200) == 4 * 2370
    assert rollout_seconds(4, 1, 1170, 600, 600) == rollout_seconds(4, 1, 1170, 600, 0) == 4 * 1770
    # 5 nodes two at a time: 3 steps; a warmup shorter than readiness does not shorten them.
    assert rollout_seconds(5, 2, 100, 50, 10) == 3 * 150
    assert rollout_seconds(0, 0, 1170, 600, 1200) == 0


def test_the_reserved_p5_pool_rolls_40_minutes_faster_and_at_its_floor():
    (train,) = [r for r in stack_rollouts("prod-us-east-1") if r.pool == "train-h100"]
    assert (train.nodes, train.batch, train.to_in_service_s, train.ready_s) == (4, 1, 1170, 600)
    assert (train.old_s, train.new_s, train.floor_s) == (9480, 7080, 7080)      # 158, 118, 118 minutes
    install = [r for r in stack_rollouts("prod-us-east-1", driver_source="install") if r.pool == "train-h100"][0]
    assert (install.old_s, install.new_s) == (4 * (2250 + 3000), 4 * (2250 + 600))     # boot through the install: 2250 s
