"""Benchmark the offline plan: config validation and the full mock run, per shipped stack, against the floor (the
time the SDK itself needs to register as many bare resources under the same mocks, in the same process and run)
and a second floor (the plan's resources with the same types and inputs, untyped), then synthetic stacks of 1 to
64 pools to show the cost per pool and whether it grows linearly. Prints Markdown tables; results are kept in
bench/RESULTS.md.

    .venv/bin/python -m bench.plan_bench [--repeat 5] [--pools 1 2 4 8 16 64]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import pulumi

from plan.engine import run_program
from plan.stackfile import load_stack_config, project_keys
from spec.validate import NAMESPACE, load_stack_spec

STACKS = ("prod-us-east-1", "prod-eu-west-1", "dev")
SCALE = (1, 2, 4, 8, 16, 64)


def large_stack(pools: int):
    """prod-us-east-1 with `pools` pools cycled from its own, renamed, budget lifted, at most one node each
    (the subnet room check counts every pool at maxNodes in each zone it may use)."""
    config = load_stack_config("prod-us-east-1")
    base = config[f"{NAMESPACE}:nodePools"]
    config[f"{NAMESPACE}:nodePools"] = [
        {**copy.deepcopy(base[i % len(base)]), "name": f"pool-{i:03d}", "minNodes": min(base[i % len(base)]["minNodes"], 1),
         "desiredNodes": min(base[i % len(base)]["desiredNodes"], 1), "maxNodes": 1} for i in range(pools)]
    config[f"{NAMESPACE}:budget"] = {"maxHourlyUsd": 10_000_000}
    config[f"{NAMESPACE}:inference"] = {}
    return config


def floor_run(region: str, count: int):
    """The SDK's own cost: `count` bare custom resources (no inputs) registered under the same mocks."""
    def program():
        for i in range(count):
            pulumi.CustomResource("bench:index:Bare", f"bare-{i}", {})
    return run_program({"aws:region": region}, stack="bench", program=program)


def same_inputs_run(region: str, resources):
    """A second floor: the plan's own cloud resources, same types, names and resolved inputs, registered as plain
    `pulumi.CustomResource`s: the SDK's cost of those inputs without the typed provider classes (an Output per
    property) and without the program's Output graph."""
    custom = [r for r in resources if r.custom and not r.type.startswith("pulumi:")]

    def program():
        for r in custom:
            pulumi.CustomResource(r.type, r.name, dict(r.inputs))
    return run_program({"aws:region": region}, stack="bench", program=program)


def timed(fn, repeat):
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), max(samples), result


def stacks_table(repeat: int) -> None:
    print("| stack | pools | resources | validate median ms | plan run median s | plan run max s | floor median s "
          "| ratio | same inputs untyped median s | ratio to it |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for stack in STACKS:
        config = load_stack_config(stack)
        keys = project_keys(config, NAMESPACE)
        v_med, _, spec = timed(lambda: load_stack_spec(keys, stack=stack, region=config["aws:region"]), repeat)
        run = run_program(config, stack=stack)   # once before timing: the first run in a process pays imports
        count = len(run.resources)
        runs, floors, untyped = [], [], []
        for _ in range(repeat):   # interleaved, so that machine load hits all alike
            runs.append(timed(lambda: run_program(config, stack=stack), 1)[0])
            floors.append(timed(lambda: floor_run(config["aws:region"], count), 1)[0])
            untyped.append(timed(lambda: same_inputs_run(config["aws:region"], run.resources), 1)[0])
        r_med, f_med, u_med = statistics.median(runs), statistics.median(floors), statistics.median(untyped)
        print(f"| {stack} | {len(spec.pools)} | {count} | {v_med * 1000:.1f} | {r_med:.2f} | {max(runs):.2f} | "
              f"{f_med:.2f} | {r_med / f_med:.2f} | {u_med:.2f} | {r_med / u_med:.2f} |")


def scale_table(repeat: int, sizes) -> None:
    print("\n| pools | resources | plan run median s | floor median s | ratio | s per pool since the previous size |")
    print("|---|---|---|---|---|---|")
    points = []
    for pools in sizes:
        config = large_stack(pools)
        run = run_program(config, stack="prod-us-east-1")
        count = len(run.resources)
        runs, floors = [], []
        for _ in range(repeat):
            runs.append(timed(lambda: run_program(config, stack="prod-us-east-1"), 1)[0])
            floors.append(timed(lambda: floor_run(config["aws:region"], count), 1)[0])
        r_med, f_med = statistics.median(runs), statistics.median(floors)
        step = "-" if not points else f"{(r_med - points[-1][1]) / (pools - points[-1][0]):.3f}"
        points.append((pools, r_med, count))
        print(f"| {pools} | {count} | {r_med:.2f} | {f_med:.2f} | {r_med / f_med:.2f} | {step} |")
    # Least-squares line through (pools, seconds): the slope is the cost of one more pool.
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fitted = [my + slope * (x - mx) for x in xs]
    r2 = 1 - sum((y - f) ** 2 for y, f in zip(ys, fitted)) / sum((y - my) ** 2 for y in ys)
    per_pool_resources = (points[-1][2] - points[0][2]) / (xs[-1] - xs[0])
    print(f"\nfit: {my - slope * mx:.2f} s + {slope:.3f} s per pool (R^2 {r2:.4f}); "
          f"{per_pool_resources:.1f} resources per pool")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pools", type=int, nargs="+", default=list(SCALE))
    args = parser.parse_args()
    stacks_table(args.repeat)
    scale_table(args.repeat, args.pools)


if __name__ == "__main__":
    main()
