"""bench/plan_bench.py: its floors must register what they claim to, or its ratios mean nothing. Nothing here is timed
(speed is measured by the bench itself). bench/rollout_bench.py: its batches and step times follow EC2 Auto Scaling's
pacing. bench/repair_bench.py: it covers every shipped pool and fault class, and its steps add up."""
import json
import math

import pytest

from bench import repair_bench as rb
from bench.plan_bench import (fit_line, floor_run, large_stack, record_constructions,
                              same_inputs_run, typed_floor_run)
from bench.rollout_bench import batch_size, rollout_seconds, stack_rollouts
from conftest import stack_config
from decisions.config.validate import NAMESPACE, load_stack_spec
from decisions.nodes import drain as drain_rules
from decisions.nodes import faults as fault_rules
from decisions.nodes import repair as repair_rules
from plan.stackfile import known_stacks, load_stack, project_keys


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


# bench/repair_bench.py: a model of the repair loop, from the code's own constants. Nothing here is timed.


@pytest.fixture(scope="module")
def repair_rows():
    return {stack: rb.stack_timelines(stack) for stack in known_stacks()}


def test_repair_bench_covers_every_shipped_pool_and_every_fault_class(repair_rows):
    for stack, rows in repair_rows.items():
        _, spec = load_stack(stack)
        assert sorted({(t.pool.pool, t.fault) for t in rows}) == sorted(
            (p.name, f) for p in spec.pools for f in rb.FAULTS)
        assert {t.pool.pool: t.pool.reserved for t in rows} == {
            p.name: bool(p.spec.reserved_capacity) for p in spec.pools}
    # Every class of the fault table is in exactly one row kind, by what the controller does for it.
    classes = rb.fault_classes()
    table = {f.id: f.remediation for f in fault_rules.load_faults().faults}
    checked = {f.id for f in fault_rules.load_faults().faults if f.checks}
    assert sorted(c for ids in classes.values() for c in ids) == sorted(table)
    for kind, ids in classes.items():
        if kind == "dcgm":                          # DCGM's counters, read by the controller: reboots
            assert set(ids) == set(repair_rules.COUNTER_FAULTS) and {table[i] for i in ids} == {"reboot"}
            continue
        assert {repair_rules.ACTIONS.get(table[i], "none") if i in checked else "none" for i in ids} <= {kind}
    # What neither the run-time checker nor a DCGM counter reports is repaired by nobody (a job's verdict names no
    # node); NVLink replay and recovery errors are the controller's now.
    assert "nccl-within-node" in classes["none"]
    assert {"nvlink-replay", "nvlink-recovery"} == set(classes["dcgm"])
    assert set(classes) == {"none", "dcgm"} | set(repair_rules.ACTIONS.values())


def test_repair_bench_steps_add_up_and_its_milestones_come_in_order(repair_rows):
    order = (rb.OUT, rb.STARTED, rb.GONE, rb.LAUNCHED, rb.GATE, rb.READY, rb.BACK)
    for rows in repair_rows.values():
        for t in rows:
            if not t.ends_at:
                assert t.fault == "none" and t.steps == () and t.repaired_ratio("worst") is None
                continue
            for case in ("typical", "worst"):
                assert all(s.typical_s >= 0 and s.worst_s >= 0 for s in t.steps), t
                # The timeline ends where it is repaired: its steps add up to the repaired time.
                assert t.at(t.ends_at, case) == t.total(case) == sum(
                    s.typical_s if case == "typical" else s.worst_s for s in t.steps)
                reached = [t.at(m, case) for m in order if t.at(m, case) is not None]
                assert reached == sorted(reached) and t.at(rb.OUT, case) <= t.total(case)
            # (A wait counted from a pass, less the cordon made on it, is shorter in the worst case; no milestone is.)
            assert all(t.at(m, "typical") <= t.at(m, "worst") for m in order if t.at(m, "worst") is not None)
            assert t.goal_repaired_s() == rb.GOAL_REPAIR_MARGIN_S + t.pool.one_boot_worst_s
            assert t.repaired_ratio("worst") == t.total("worst") / t.goal_repaired_s()
            # A miss is always named, and only a miss.
            misses = t.misses()
            assert bool(misses) == (t.out_ratio("worst") > 1 or t.repaired_ratio("worst") > 1)


def test_repair_bench_reads_its_figures_from_the_code():
    assert rb.FIGURES["pass"].worst_s == repair_rules.INTERVAL_S
    assert rb.FIGURES["confirm"].worst_s == repair_rules.CONFIRM_S          # 60 s: two passes of 30 s
    assert rb.FIGURES["evict"].worst_s == repair_rules.FAST_DRAIN_S == 120  # the spot notice, not the hook's 900 s
    assert (rb.FIGURES["check"].worst_s, rb.FIGURES["scrape"].worst_s) == (30 + 1, 30)  # the timer's 30s + 1s
    assert rb.FIGURES["call"].worst_s == (1 + 5) + (2 + 5)     # waits before attempts 2 and 3, each at its top
    today = rb.hook_figures(None)
    assert today["drain-hook"].worst_s == today["drain-hook-dead-kubelet"].worst_s == \
        drain_rules.LIFECYCLE_DRAIN_TIMEOUT_S
    assert rb.FAST_DRAIN_S == getattr(repair_rules, "FAST_DRAIN_S", None)
    if rb.FAST_DRAIN_S is not None:
        # Seen on a pass, completed at the cap (a whole number of passes), and the call's retry waits.
        assert rb.FIGURES["drain-hook"].worst_s == 30 + math.ceil(rb.FAST_DRAIN_S / 30) * 30 + 13


def _replace_row(stack, pool, fault="replace"):
    return next(t for t in rb.stack_timelines(stack) if t.pool.label == pool and t.fault == fault)


def test_repair_bench_replaces_a_reserved_p5_after_the_drain_heartbeat_on_todays_path(monkeypatch):
    # Without the fast path: XID 79 on the 4-node p5 reservation. Seen at 31 + 30 + 30 = 91 s, cordoned at 104 s (the
    # cordon's retry waits), the replacement decided at 91 + 60 = 151 s; terminate 13 s, then the drain heartbeat
    # 900 s, EC2 terminates (300 s) and the launch into the freed slot (120 s), then one p5 boot: 1170 s to CONTINUE
    # and 600 s to Ready. 3254 s against the goal's 600 + 1770 = 2370 s.
    monkeypatch.setattr(rb, "FIGURES", {**rb.FIGURES, **rb.hook_figures(None)})
    monkeypatch.setattr(rb, "FAST_DRAIN_S", None)
    t = _replace_row("prod-us-east-1", "train-h100")
    assert (t.at(rb.SEEN, "worst"), t.at(rb.OUT, "worst"), t.at(rb.STARTED, "worst")) == (91, 104, 151)
    assert [s.worst_s for s in t.steps[5:]] == [13, 900, 300, 120, 1170, 600]
    assert (t.total("worst"), t.goal_repaired_s()) == (3254, 2370)
    assert t.misses() == [f"repaired x{3254 / 2370:.2f}: termination hook 900 s: " + rb._HEARTBEAT]
    # An on-demand pool launches the replacement at once: the drain runs beside the boot, off the path.
    l40s = _replace_row("prod-us-east-1", "infer-l40s")
    assert not any("hook" in s.name for s in l40s.steps) and l40s.repaired_ratio("worst") < 1
    assert any("off the path" in n and "900 s worst" in n for n in l40s.notes)
    # A NotReady node's pods never terminate: the heartbeat every time, typical too.
    not_ready = _replace_row("prod-us-east-1", "train-h100", "NotReady")
    hook = next(s for s in not_ready.steps if s.name == "termination hook")
    assert hook.typical_s == hook.worst_s == drain_rules.LIFECYCLE_DRAIN_TIMEOUT_S


def test_repair_bench_names_what_misses_each_goal():
    rows = {(t.pool.label, t.fault): t for t in rb.stack_timelines("prod-us-east-1")}
    # Out of service: every checker fault at 104 s of 120 in the worst case (31 + 30 + 30 and the cordon's retries).
    for pool in ("train-h100", "infer-l40s", "finetune-a100-80gb-spot"):
        for fault in ("reboot", "replace", "reboot, gate fails"):
            assert rows[(pool, fault)].at(rb.OUT, "worst") == 104, (pool, fault)
    assert rows[("train-h100", "NotReady")].out_ratio("worst") < 1                 # the not-ready taint, 45 s
    # Met: a reboot back in service (the 120 s drain, the uncordon on the new boot), a replacement where the group
    # can launch at once or into a spare slot.
    for pool in ("train-h100", "infer-l40s"):
        assert rows[(pool, "reboot")].misses() == [], rows[(pool, "reboot")].misses()
    assert rows[("train-h100 (spare slot)", "replace")].misses() == []
    assert rows[("infer-l40s", "replace")].misses() == []
    # Missed, each with its reason: the reservation with no spare slot, a reboot whose gate fails (two boots),
    # NotReady's 30 minutes, a silent checker's stated times.
    [reserved] = rows[("train-h100", "replace")].misses()
    assert reserved.startswith("repaired x1.06") and "no spare slot" in reserved
    assert "two boots" in rows[("infer-l40s", "reboot, gate fails")].misses()[0]
    assert "NOT_READY_S" in rows[("infer-l40s", "NotReady")].misses()[0]
    stale = rows[("train-h100", "stale checker")].misses()
    assert "STALE_CHECK_S" in stale[0] and "STALE_REPAIR_S" in stale[1]
    assert rows[("infer-l40s", "none")].misses() == []
