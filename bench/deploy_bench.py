"""Estimate how long `pulumi up` takes to create each shipped stack from nothing: the critical path through the
plan's dependency graph (plan/deploy_time.py, create times from plan/create_times.yaml) and the sum of all create
times. Then the waits on the path that carry no value (the waiting resource's inputs hold nothing of what it waits
for), and the critical path with every such wait dropped: the floor a reordering could reach.

    .venv/bin/python -m bench.deploy_bench [--stack prod-us-east-1 ...]
"""
from __future__ import annotations

import argparse
from typing import Dict, Tuple

from plan import engine
from plan.deploy_time import estimate, load_create_times, output_strings, resources_of, uses
from plan.stackfile import load_stack_config

STACKS = ("prod-us-east-1", "prod-eu-west-1", "dev")


def run_with_ids(stack: str):
    """The stack's plan run, and the id the mocks gave each resource (the run records state, not ids)."""
    ids: Dict[Tuple[str, str], str] = {}
    original = engine.GpuCloudMocks.new_resource

    def recording(self, args):
        rid, state = original(self, args)
        ids[(args.typ, args.name)] = rid
        return rid, state

    engine.GpuCloudMocks.new_resource = recording
    try:
        run = engine.run_program(load_stack_config(stack), stack=stack)
    finally:
        engine.GpuCloudMocks.new_resource = original
    return run, ids


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def report(stack: str) -> None:
    run, ids = run_with_ids(stack)
    times = load_create_times()
    resources = resources_of(run)
    by_urn = {r.urn: r for r in run.resources}
    outputs = {r.urn: output_strings(r.urn, ids.get((r.type, r.name)), r.state, r.inputs) for r in run.resources}
    known = {r["urn"]: r for r in resources}

    def used(resource, urn, why):
        # A parent or a provider is always needed; a dependency only when some output of it reaches the inputs.
        return why != "dependency" or uses(resource, outputs[urn])

    today = estimate(resources, times)
    floor = estimate(resources, times, keep=used)
    print(f"### {stack}: {today.resources} resources")
    print(f"critical path {minutes(today.critical_seconds)}; all create times added up {minutes(today.total_seconds)}; "
          f"with every value-less wait dropped {minutes(floor.critical_seconds)}")
    print("| start | create | resource | type | waits for | why | carries a value |")
    print("|---|---|---|---|---|---|---|")
    for step in today.critical_path:
        waited = by_urn[step.waited_for].name if step.waited_for else "-"
        value = "-" if not step.waited_for else (
            "yes" if used(known[step.urn], step.waited_for, step.because) else "**no**")
        print(f"| {minutes(step.start)} | {step.seconds:.0f} s | {step.name} | {step.type} | {waited} | "
              f"{step.because or '-'} | {value} |")
    print("\nWith the value-less waits dropped, the path is:")
    print("  " + " -> ".join(f"{s.name} ({s.seconds:.0f} s)" for s in floor.critical_path if s.seconds))
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", action="append", choices=STACKS, help="a stack (default: all three)")
    args = parser.parse_args()
    for stack in args.stack or STACKS:
        report(stack)


if __name__ == "__main__":
    main()
