"""Benchmark the offline plan: config validation and the full mock run, per shipped stack and for a
synthetic large stack (many pools). Prints a Markdown table; results are kept in bench/RESULTS.md.

    .venv/bin/python -m bench.plan_bench [--repeat 5] [--pools 40]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

from plan.engine import run_program
from plan.stackfile import load_stack_config, project_keys
from spec.validate import NAMESPACE, load_stack_spec

STACKS = ("prod-us-east-1", "prod-eu-west-1", "dev")


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


def timed(fn, repeat):
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), max(samples), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pools", type=int, default=40)
    args = parser.parse_args()
    cases = [(stack, load_stack_config(stack)) for stack in STACKS]
    cases.append((f"synthetic ({args.pools} pools)", large_stack(args.pools)))
    print("| stack | pools | resources | validate median ms | plan run median s | plan run max s |")
    print("|---|---|---|---|---|---|")
    for label, config in cases:
        stack = label if label in STACKS else "prod-us-east-1"
        keys = project_keys(config, NAMESPACE)
        v_med, _, spec = timed(lambda: load_stack_spec(keys, stack=stack, region=config["aws:region"]), args.repeat)
        r_med, r_max, run = timed(lambda: run_program(config, stack=stack), args.repeat)
        print(f"| {label} | {len(spec.pools)} | {len(run.resources)} | {v_med * 1000:.1f} | {r_med:.2f} | {r_max:.2f} |")


if __name__ == "__main__":
    main()
