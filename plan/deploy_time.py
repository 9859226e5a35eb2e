"""How long `pulumi up` takes to create a stack from nothing, from the plan's dependency graph.

The engine starts a resource as soon as everything it waits for is created: its `dependencies` (explicit
`depends_on` and every resource whose outputs feed its inputs), its `parent` (a child's registration needs the
parent's URN, which a custom resource has only once created; a component has it at once, after its own
dependencies) and its `provider` (the Kubernetes provider, for one, waits for the cluster it talks to). With a
create time per resource type (plan/create_times.yaml, with sources), the earliest finish of every resource
follows; the last one to finish ends the critical path. The sum of all create times is what the same program
would take if the engine created one resource at a time.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import yaml

CREATE_TIMES = Path(__file__).with_name("create_times.yaml")


@dataclass(frozen=True)
class CreateTime:
    seconds: float
    source: str


@dataclass(frozen=True)
class Override:
    input: str          # an input key of the resource (engine view: camelCase)
    equals: Any         # the value that selects this figure
    time: CreateTime


@dataclass(frozen=True)
class CreateTimes:
    default: CreateTime
    types: Mapping[str, CreateTime]
    overrides: Mapping[str, Tuple[Override, ...]]

    def of(self, resource: Mapping[str, Any]) -> CreateTime:
        """A resource's create time: its input override, else its type's, else 0 for a component (it creates
        nothing itself; its children are resources of their own) and the default for any other resource."""
        for override in self.overrides.get(resource["type"], ()):
            if (resource.get("inputs") or {}).get(override.input) == override.equals:
                return override.time
        if resource["type"] in self.types:
            return self.types[resource["type"]]
        if not resource["custom"]:
            return CreateTime(0, "a component: nothing to create")
        return self.default


class CreateTimesError(ValueError):
    pass


def _time(entry: Any, where: str) -> CreateTime:
    if not isinstance(entry, dict) or set(entry) - {"seconds", "source", "when"}:
        raise CreateTimesError(f"{where}: expected a mapping of seconds, source (and when)")
    seconds, source = entry.get("seconds"), entry.get("source")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise CreateTimesError(f"{where}.seconds: expected a number of seconds >= 0, got {seconds!r}")
    if not isinstance(source, str) or not source.strip():
        raise CreateTimesError(f"{where}.source: every figure needs its source")
    return CreateTime(float(seconds), source)


def load_create_times(path: Path = CREATE_TIMES) -> CreateTimes:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or set(data) != {"default", "types"} or not isinstance(data["types"], dict):
        raise CreateTimesError(f"{path}: expected the keys default and types (a mapping of type token to figure)")
    types, overrides = {}, {}
    for token, entry in data["types"].items():
        types[token] = _time(entry, f"types.{token}")
        rules = []
        for i, rule in enumerate(entry.get("when") or []):
            where = f"types.{token}.when[{i}]"
            if not isinstance(rule, dict) or "input" not in rule or "equals" not in rule:
                raise CreateTimesError(f"{where}: expected input, equals, seconds and source")
            rules.append(Override(rule["input"], rule["equals"],
                                  _time({k: v for k, v in rule.items() if k not in ("input", "equals")}, where)))
        overrides[token] = tuple(rules)
    return CreateTimes(default=_time(data["default"], "default"), types=types, overrides=overrides)


@dataclass(frozen=True)
class Step:
    """One resource on the critical path: when it can start, how long it takes, and why it waited."""
    urn: str
    name: str
    type: str
    seconds: float
    start: float
    finish: float
    source: str
    waited_for: Optional[str]    # the URN of the resource it waited for last (None: it starts at once)
    because: Optional[str]       # "dependency", "parent" or "provider"


@dataclass(frozen=True)
class DeployEstimate:
    critical_path: Tuple[Step, ...]
    resources: int
    total_seconds: float          # every create time added up: one resource at a time

    @property
    def critical_seconds(self) -> float:
        return self.critical_path[-1].finish if self.critical_path else 0.0


def waits(resource: Mapping[str, Any], known: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(URN, why) of everything in `known` that `resource` waits for before the engine creates it."""
    found = [(urn, "dependency") for urn in resource.get("dependencies") or ()]
    if resource.get("parent"):
        found.append((resource["parent"], "parent"))
    provider = resource.get("provider")
    if provider:   # the plan document drops the provider's id; a run's record keeps `urn::id`
        found.append((provider if provider in known else provider.rsplit("::", 1)[0], "provider"))
    return [(urn, why) for urn, why in found if urn in known]


def reachable(start: str, successors: Mapping[str, Iterable[str]]) -> set:
    """Every node reached from `start` along `successors` (start itself only through a cycle)."""
    found, todo = set(), [start]
    while todo:
        for node in successors.get(todo.pop(), ()):
            if node not in found:
                found.add(node)
                todo.append(node)
    return found


def estimate(resources: Sequence[Mapping[str, Any]], times: CreateTimes,
             keep: Optional[Any] = None) -> DeployEstimate:
    """The critical path and the total of create times for the plan document's `resources`.

    `keep(resource, urn, why)`, when given, decides which waits count (a what-if: drop the waits a resource
    does not need). Resources wait only for resources registered before them, so the graph has no cycle;
    one would raise ValueError.
    """
    known = {r["urn"]: r for r in resources}
    preds = {urn: [(p, why) for p, why in waits(r, known) if keep is None or keep(r, p, why)]
             for urn, r in known.items()}
    finish: Dict[str, float] = {}
    last: Dict[str, Optional[Tuple[str, str]]] = {}
    state: Dict[str, int] = {}
    for root in sorted(known):
        stack = [root]
        while stack:
            urn = stack[-1]
            if urn in finish:
                stack.pop()
                continue
            if state.get(urn) == 1:   # every predecessor done: place it
                stack.pop()
                # the latest predecessor; ties go to the first URN, so the path is the same run to run
                chosen = max(sorted(preds[urn]), key=lambda p: finish[p[0]], default=None)
                start = finish[chosen[0]] if chosen else 0.0
                finish[urn] = start + times.of(known[urn]).seconds
                last[urn] = chosen
                continue
            state[urn] = 1
            for pred, _ in preds[urn]:
                if pred not in finish:
                    if state.get(pred) == 1:
                        raise ValueError(f"dependency cycle through {pred}")
                    stack.append(pred)
    end = max(sorted(finish), key=lambda u: finish[u], default=None)
    path: List[Step] = []
    while end is not None:
        t, chosen = times.of(known[end]), last[end]
        path.append(Step(urn=end, name=known[end]["name"], type=known[end]["type"], seconds=t.seconds,
                         start=finish[end] - t.seconds, finish=finish[end], source=t.source,
                         waited_for=chosen[0] if chosen else None, because=chosen[1] if chosen else None))
        end = chosen[0] if chosen else None
    return DeployEstimate(critical_path=tuple(reversed(path)), resources=len(known),
                          total_seconds=sum(times.of(r).seconds for r in resources))


def resources_of(run) -> List[Dict[str, Any]]:
    """A plan.engine.ProgramRun's resources in the plan document's shape (the fields `estimate` reads)."""
    return [{"urn": r.urn, "type": r.type, "name": r.name, "custom": r.custom, "parent": r.parent,
             "provider": r.provider, "dependencies": list(r.dependencies), "inputs": r.inputs}
            for r in run.resources]


def _texts(value: Any) -> Iterable[str]:
    """Every string in an input value, and the text inside base64 strings (user data carries the endpoint)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, str):
        yield value
        if len(value) >= 64 and len(value) % 4 == 0:
            try:
                yield base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                pass


def uses(resource: Mapping[str, Any], outputs: Iterable[str]) -> bool:
    """Whether `resource`'s inputs carry any of another resource's `outputs` (its URN, id, ARN, endpoint...):
    a wait without that is a wait for something the resource does not read. (An ordering that matters without
    a value - add-ons before nodes, the drain handler before the pools it drains - reads as unused too: a
    person decides whether it is inherent.)"""
    wanted = [o for o in outputs if isinstance(o, str) and len(o) >= 6]
    haystack = "\n".join(_texts(resource.get("inputs") or {}))
    return any(o in haystack for o in wanted)


def output_strings(urn: str, resource_id: Optional[str], state: Mapping[str, Any],
                   inputs: Mapping[str, Any]) -> List[str]:
    """What a resource hands on: its URN, its id, and every top-level state value the provider computed
    (not merely echoed from its inputs), plus its name and ARN."""
    found = [urn] + ([resource_id] if resource_id else [])
    for key, value in state.items():
        if key in ("name", "arn") or key not in inputs:
            found += [value] if isinstance(value, str) else []
    return found
