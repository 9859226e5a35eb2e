"""Benchmark the offline plan: config validation and the full mock run, per shipped stack, against three floors
registered under the same mocks in the same process and run:
  - bare: as many bare resources (no inputs) as the plan registers (the issue's floor);
  - untyped: the plan's own resources, same types, names and resolved inputs, as plain `pulumi.CustomResource`s;
  - typed: the same resources built with the same provider classes (pulumi_aws.ec2.LaunchTemplate, ...) from the
    same resolved inputs, with no options and no Outputs between them: what any program that declares these
    resources with the typed classes must pay, so plan / typed is the program's own overhead.
Then synthetic stacks of 1 to 64 pools show the cost per pool and whether it grows linearly. Prints Markdown
tables; results are kept in bench/RESULTS.md.

    .venv/bin/python -m bench.plan_bench [--repeat 5] [--pools 1 2 4 8 16 64]
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pulumi
from pulumi import _types
from pulumi.resource import Resource

from decisions.config.validate import NAMESPACE, load_stack_spec
from plan.engine import run_program
from plan.stackfile import load_stack_config, project_keys

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
    config[f"{NAMESPACE}:budget"] = {**config[f"{NAMESPACE}:budget"], "maxHourlyUsd": 10_000_000}
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


@dataclass(frozen=True)
class Construction:
    """One resource as the typed floor builds it: its class (None for a component), type, name and keyword args."""
    cls: Optional[type]
    type: str
    name: str
    kwargs: Dict[str, Any]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _decoded(value: Any) -> Any:
    """A provider resource's inputs reach the engine JSON-encoded; its constructor takes them decoded."""
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def record_constructions(config, stack: str) -> Tuple[Any, List[Construction]]:
    """Run the plan once, noting the Python class and keyword names of every resource it builds (by wrapping the
    SDK's Resource constructor for this run only), and pair them with the inputs the engine saw."""
    seen = []
    original = Resource.__init__

    def noting(self, t, name, custom=False, props=None, opts=None, remote=False, dependency=False, package_ref=None):
        if not dependency and t != "pulumi:pulumi:Stack":
            seen.append((type(self) if custom else None, t, name, props))
        original(self, t, name, custom, props, opts, remote, dependency, package_ref)

    Resource.__init__ = noting
    try:
        run = run_program(config, stack=stack)
    finally:
        Resource.__init__ = original
    engine_inputs = {(r.type, r.name): r.inputs for r in run.resources}
    constructions = []
    for cls, t, name, props in seen:
        if cls is None:
            constructions.append(Construction(None, t, name, {}))
            continue
        inputs = engine_inputs[(t, name)]
        if issubclass(cls, pulumi.StackReference):
            constructions.append(Construction(cls, t, name, {"stack_name": inputs["name"]}))
            continue
        parameters = inspect.signature(getattr(cls, "_internal_init", cls.__init__)).parameters
        if "body" in parameters:    # an object registered whole (components/platform/release_manifest.py)
            constructions.append(Construction(cls, t, name, {"body": inputs}))
            continue
        typed = _types.is_input_type(type(props))
        engine_names = _types.input_type_py_to_pulumi_names(type(props)) if typed else {}
        decode = _decoded if t.startswith("pulumi:providers:") else (lambda value: value)
        kwargs = {}
        for key in (props.__dict__ if typed else props or {}):
            engine_name = engine_names.get(key, _camel(key))
            if key in parameters and engine_name in inputs:
                kwargs[key] = decode(inputs[engine_name])
        constructions.append(Construction(cls, t, name, kwargs))
    return run, constructions


def typed_floor_run(region: str, constructions: Sequence[Construction]):
    """The third floor: the plan's resources built again with their own provider classes from resolved inputs."""
    def program():
        for c in constructions:
            if c.cls is None:
                pulumi.ComponentResource(c.type, c.name)
            else:
                c.cls(c.name, **c.kwargs)
    return run_program({"aws:region": region}, stack="bench", program=program)


def fit_line(points: Sequence[Tuple[float, float]]) -> Tuple[float, float, float]:
    """Least-squares line through (x, y) points: (intercept, slope, R^2)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fitted = [my + slope * (x - mx) for x in xs]
    r2 = 1 - sum((y - f) ** 2 for y, f in zip(ys, fitted)) / sum((y - my) ** 2 for y in ys)
    return my - slope * mx, slope, r2


def timed(fn, repeat):
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), max(samples), result


def stacks_table(repeat: int) -> None:
    print("| stack | pools | resources | validate median ms | plan run median s | plan run max s | bare floor s "
          "| plan / bare | untyped floor s | plan / untyped | typed floor s | plan / typed | typed / bare |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for stack in STACKS:
        config = load_stack_config(stack)
        keys = project_keys(config, NAMESPACE)
        v_med, _, spec = timed(lambda: load_stack_spec(keys, stack=stack, region=config["aws:region"]), repeat)
        run, constructions = record_constructions(config, stack)   # the first run in a process also pays imports
        region, count = config["aws:region"], len(run.resources)
        typed_floor_run(region, constructions)
        runs, floors, untyped, typed = [], [], [], []
        for _ in range(repeat):   # interleaved, so that machine load hits all alike
            runs.append(timed(lambda: run_program(config, stack=stack), 1)[0])
            floors.append(timed(lambda: floor_run(region, count), 1)[0])
            untyped.append(timed(lambda: same_inputs_run(region, run.resources), 1)[0])
            typed.append(timed(lambda: typed_floor_run(region, constructions), 1)[0])
        r_med, f_med = statistics.median(runs), statistics.median(floors)
        u_med, t_med = statistics.median(untyped), statistics.median(typed)
        print(f"| {stack} | {len(spec.pools)} | {count} | {v_med * 1000:.1f} | {r_med:.2f} | {max(runs):.2f} | "
              f"{f_med:.2f} | {r_med / f_med:.2f} | {u_med:.2f} | {r_med / u_med:.2f} | {t_med:.2f} | "
              f"{r_med / t_med:.2f} | {t_med / f_med:.2f} |")


def scale_table(repeat: int, sizes) -> None:
    print("\n| pools | resources | plan run median s | bare floor s | plan / bare | typed floor s | plan / typed "
          "| s per pool since the previous size |")
    print("|---|---|---|---|---|---|---|---|")
    points = []
    for pools in sizes:
        config = large_stack(pools)
        run, constructions = record_constructions(config, "prod-us-east-1")
        region, count = config["aws:region"], len(run.resources)
        runs, floors, typed = [], [], []
        for _ in range(repeat):
            runs.append(timed(lambda: run_program(config, stack="prod-us-east-1"), 1)[0])
            floors.append(timed(lambda: floor_run(region, count), 1)[0])
            typed.append(timed(lambda: typed_floor_run(region, constructions), 1)[0])
        r_med, f_med, t_med = statistics.median(runs), statistics.median(floors), statistics.median(typed)
        step = "-" if not points else f"{(r_med - points[-1][1]) / (pools - points[-1][0]):.3f}"
        points.append((pools, r_med, count))
        print(f"| {pools} | {count} | {r_med:.2f} | {f_med:.2f} | {r_med / f_med:.2f} | {t_med:.2f} | "
              f"{r_med / t_med:.2f} | {step} |")
    # The slope of the line through (pools, seconds) is the cost of one more pool.
    intercept, slope, r2 = fit_line([(p[0], p[1]) for p in points])
    per_pool_resources = (points[-1][2] - points[0][2]) / (points[-1][0] - points[0][0])
    print(f"\nfit: {intercept:.2f} s + {slope:.3f} s per pool (R^2 {r2:.4f}); "
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
