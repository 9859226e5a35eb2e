"""Offline preview of a change: what a new plan document would create, update, replace or delete
compared with an older one (`python -m plan STACK --against OLD.json`). Pure: documents in, records out.

Resources are matched by URN and compared on their inputs only (dependency order varies run to run).
An update is a replacement when an input listed in replace_on_change.yaml changed. The mocks give a
replaced resource the same ID as before, so changes that follow from a new ID are not seen here:
`pulumi preview` against the real state stays the authority.

A resource's `ignoreChanges` is applied as the engine applies it to an update: the old input at each ignored path
is put back on the new inputs before they are compared (keep_ignored), so what `pulumi up` would leave alone is
listed as ignored, never as an update. A new resource gets every input as the program gives it.

A list that stands for a map (tags as {key, value} entries, environment variables as {name, value}) is compared
entry by entry under its key, so a path reads `tags.Team`, not `tags[9].value`. The report wraps each resource's
paths to WIDTH characters and summarises past a few lines; the document written with --json keeps them all.
Capacity and cost are compared from the figures both documents record (`capacity[]`, `cost`); an existing pool's
figures at its initial size (desiredNodes) are taken at the size its group keeps (initial_sizes).
"""
from __future__ import annotations

import copy
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import yaml

REPLACE_TABLE = Path(__file__).with_name("replace_on_change.yaml")
ACTIONS = ("create", "update", "replace", "delete")
# The Auto Scaling group follows the template's latest_version, so every new version starts an instance refresh.
NOTES = {"aws:ec2/launchTemplate:LaunchTemplate": "rolls the pool's nodes (instance refresh)"}
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ABSENT = object()   # a key or list item one side does not have
WIDTH = 120          # the longest line the change listing prints
PATH_LINES = 3       # wrapped lines of paths shown per resource before the rest is summarised
_INDENT = " " * 11
IGNORED_LABEL = "ignored (ignoreChanges)"     # paths `pulumi up` leaves at the deployed value
# A list stands for a map when each entry names itself, distinctly, with one of these fields: Auto Scaling tags
# ({key, value, propagateAtLaunch}), tolerations, environment variables ({name, value}), containers, lifecycle hooks,
# Kueue flavors and their resources. Whether order counts: a "name" list's order can (Kueue tries flavors in order).
_MAP_ENTRY_FIELDS = {"key": False, "name": True}


@dataclass(frozen=True)
class ResourceChange:
    urn: str
    type: str
    action: str                      # one of ACTIONS, or "unchanged"
    paths: Tuple[str, ...] = ()      # inputs that differ (update and replace)
    forced_by: Tuple[str, ...] = ()  # table paths whose change forces the replacement
    note: Optional[str] = None
    ignored: Tuple[str, ...] = ()    # inputs that differ under the resource's ignoreChanges: `pulumi up` keeps them


def replace_on_change() -> Dict[str, Tuple[str, ...]]:
    """Resource type -> input paths that force replacement."""
    table = yaml.safe_load(REPLACE_TABLE.read_text(encoding="utf-8"))
    return {kind: tuple(entry["paths"]) for kind, entry in table.items()}


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[ResourceChange]:
    """One record per URN in either document, in URN order."""
    forcing = replace_on_change()
    before = {r["urn"]: r for r in old["resources"]}
    after = {r["urn"]: r for r in new["resources"]}
    changes = []
    for urn in sorted(before.keys() | after.keys()):
        if urn not in before:
            changes.append(ResourceChange(urn, after[urn]["type"], "create"))
        elif urn not in after:
            changes.append(ResourceChange(urn, before[urn]["type"], "delete"))
        else:
            changes.append(_compare(after[urn]["type"], urn, before[urn]["inputs"], after[urn]["inputs"],
                                    forcing.get(after[urn]["type"], ()), after[urn].get("ignoreChanges") or ()))
    return changes


def _compare(kind: str, urn: str, old: Mapping[str, Any], new: Mapping[str, Any],
             forcing: Sequence[str], ignore_changes: Sequence[str] = ()) -> ResourceChange:
    kept, invalid = keep_ignored(old, new, ignore_changes)
    note = NOTES.get(kind)
    if invalid:     # the engine stops on such a path (processIgnoreChanges' error), before any diff
        kept, note = new, (f"`pulumi up` fails here: cannot ignore changes to {', '.join(invalid)}, one or more "
                           "elements of the path are missing")
    ignored = tuple(changed_paths(kept, new))
    paths = tuple(changed_paths(old, kept))
    if not paths:
        return ResourceChange(urn, kind, "unchanged", ignored=ignored, note=note if invalid else None)
    forced_by = tuple(p for p in forcing if _value_at(old, p) != _value_at(kept, p))
    return ResourceChange(urn, kind, "replace" if forced_by else "update", paths, forced_by, note, ignored)


# --- ignoreChanges, as the engine applies it ------------------------------------------------------------------------
# pulumi/pulumi pkg/resource/deploy/step_generator.go: for a resource the state already holds (`if old != nil`),
# processIgnoreChanges parses each path (resource.ParsePropertyPath; one that does not parse is skipped) and calls
# PropertyPath.Reset(oldInputs, newInputs) (sdk/go/common/resource/properties_path.go), which puts the old value at
# the path on the new inputs, or removes it there when the old inputs have none; a path whose parents one side lacks
# fails the step ("cannot ignore changes to the following properties because one or more elements of the path are
# missing"). The diff, and the inputs the update or replacement is made with, then carry the old value. A create has
# no old inputs: it gets the new ones. The program ignores top-level keys (desiredCapacity, initialLifecycleHooks,
# suspendedProcesses) and nested ones (scalingConfig.desiredSize, spec.replicas); the whole syntax is ported.
PathElement = Union[str, int]


def parse_property_path(path: str) -> Tuple[PathElement, ...]:
    """An engine property path as its elements: `a.b[0]["c.d"]` -> ("a", "b", 0, "c.d"); `[*]` and `.*` are the
    wildcard "*". Raises ValueError where resource.ParsePropertyPath returns an error."""
    elements: List[PathElement] = []
    i = 0
    while i < len(path):
        if path[i] == ".":
            i += 1
        elif path[i] == "[" and path[i + 1:i + 2] == '"':
            key, i = [], i + 2
            while True:
                if i >= len(path):
                    raise ValueError(f"missing closing quote in property name: {path}")
                if path[i] == '"':
                    i += 1
                    break
                if path[i] == "\\" and path[i + 1:i + 2] == '"':
                    key.append('"')
                    i += 2
                else:
                    key.append(path[i])
                    i += 1
            if path[i:i + 1] != "]":
                raise ValueError(f"missing closing bracket in property access: {path}")
            elements.append("".join(key))
            i += 1
        elif path[i] == "[":
            end = path.find("]", i)
            if end == -1:
                raise ValueError(f"missing closing bracket in array index: {path}")
            segment = path[i + 1:end]
            elements.append("*" if segment == "*" else int(segment))   # int() raises ValueError, as ParseInt errs
            i = end + 1
        else:
            end = i
            while end < len(path) and path[end] not in ".[":
                end += 1
            elements.append(path[i:end])
            i = end
    return tuple(elements)


def keep_ignored(old: Mapping[str, Any], new: Mapping[str, Any],
                 ignore_changes: Sequence[str]) -> Tuple[Dict[str, Any], List[str]]:
    """(the new inputs with each ignored path's old value put back, the paths the engine would refuse), as
    processIgnoreChanges has them for an update. `new` is left as it is."""
    kept = copy.deepcopy(dict(new))
    invalid = []
    for text in ignore_changes:
        try:
            path = parse_property_path(text)
        except ValueError:
            continue
        if not _reset(path, dict(old), kept):
            invalid.append(text)
    return kept, invalid


def _reset(path: Tuple[PathElement, ...], old: Any, new: Any) -> bool:
    """PropertyPath.reset: `new` (changed in place) takes `old`'s value at `path`; False on a path error. A key one
    side lacks reads as null, as a missing PropertyValue does."""
    if not path:
        return False
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        if key < 0:
            return False
        if not isinstance(old, list) or not isinstance(new, list):
            return not isinstance(old, list) and not isinstance(new, list)
        if not rest and key >= len(old) and key >= len(new):
            return True
        if key >= len(old) or key >= len(new):
            return False                # an array cannot gain or lose an element here
        if not rest:
            new[key] = copy.deepcopy(old[key])
            return True
        return _reset(rest, old[key], new[key])
    if key == "*":
        if not rest:
            if isinstance(new, dict):
                if isinstance(old, dict):
                    new.clear()
                    new.update(copy.deepcopy(old))
                return True
            if isinstance(new, list):
                if isinstance(old, list):
                    if len(old) != len(new):
                        return False
                    new[:] = copy.deepcopy(old)
                return True
            return False
        if isinstance(old, dict) and isinstance(new, dict):
            return all(k in new and _reset(rest, old[k], new[k]) for k in old)
        if isinstance(old, list) and isinstance(new, list):
            return len(old) == len(new) and all(_reset(rest, a, b) for a, b in zip(old, new))
        return False
    if not rest:
        if isinstance(old, dict) and key in old:
            if not isinstance(new, dict):
                return False
            new[key] = copy.deepcopy(old[key])
        elif isinstance(new, dict):
            new.pop(key, None)
        return True
    if not isinstance(old, dict) or not isinstance(new, dict):
        return not isinstance(old, dict) and not isinstance(new, dict)
    if key not in new:
        return key not in old           # old has it and new does not: a path error; neither: nothing to do
    return _reset(rest, old.get(key), new[key])


def changed_paths(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """Paths at which two input values differ: into objects by key and lists by index; a value that
    appears, vanishes or changes kind is one path."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            yield from changed_paths(old.get(key, _ABSENT), new.get(key, _ABSENT), _key_path(path, key))
    elif isinstance(old, list) and isinstance(new, list) and _map_field(old, new):
        yield from _changed_entries(old, new, path, _map_field(old, new))
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            yield from changed_paths(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT,
                                     f"{path}[{i}]")
    elif old != new:
        yield path


def _map_field(old: list, new: list) -> Optional[str]:
    """The field that keys both lists' entries when they stand for a map (each entry an object naming itself
    with a distinct string), else None."""
    entries = old + new
    for field in _MAP_ENTRY_FIELDS:
        if entries and all(isinstance(e, dict) and isinstance(e.get(field), str) for e in entries) and \
                all(len({e[field] for e in side}) == len(side) for side in (old, new)):
            return field
    return None


def _changed_entries(old: list, new: list, path: str, field: str) -> Iterator[str]:
    """Map-like lists entry by entry, by key: an entry that appears or vanishes, or whose value changes, is
    `path.KEY`; another field of it `path.KEY.field`; entries kept in another order, where order counts, `path`."""
    before, after = {e[field]: e for e in old}, {e[field]: e for e in new}
    if _MAP_ENTRY_FIELDS[field] and [k for k in before if k in after] != [k for k in after if k in before]:
        yield path
    for key in sorted(before.keys() | after.keys()):
        at = _key_path(path, key)
        a, b = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if a is _ABSENT or b is _ABSENT:
            yield at
            continue
        for name in sorted((a.keys() | b.keys()) - {field}):
            yield from changed_paths(a.get(name, _ABSENT), b.get(name, _ABSENT),
                                     at if name == "value" else _key_path(at, name))


def _key_path(path: str, key: str) -> str:
    if not _PLAIN_KEY.match(key):   # tag keys such as kubernetes.io/cluster/NAME stay one readable segment
        return f"{path}[{json.dumps(key)}]"
    return f"{path}.{key}" if path else key


def _value_at(inputs: Mapping[str, Any], dotted: str) -> Any:
    value: Any = inputs
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def render_changes(changes: Sequence[ResourceChange]) -> List[str]:
    """The report's lines: each change by URN with its paths, then the summary line."""
    lines = []
    for change in changes:
        if change.action == "unchanged" and not change.ignored and not change.note:
            continue
        # A resource whose only differences are ignored is no update: `pulumi preview` shows it as unchanged.
        label = change.action if change.action != "unchanged" else "ignored" if change.ignored else "unchanged"
        lines.append(f"  {label:<8} {change.urn}")
        if change.paths:
            lines += wrapped("changed", change.paths)
        if change.forced_by:
            lines += wrapped("forces replacement", change.forced_by)
        if change.ignored:
            lines += wrapped(IGNORED_LABEL, change.ignored)
        if change.note:
            lines.append(f"           note: {change.note}")
    counts = {action: sum(1 for c in changes if c.action == action) for action in ACTIONS + ("unchanged",)}
    ignored = sum(1 for c in changes if c.ignored)
    lines.append("  " + ", ".join(f"{counts[a]} to {a}" for a in ACTIONS) + f", {counts['unchanged']} unchanged"
                 + (f"; {ignored} with changes ignored (ignoreChanges)" if ignored else ""))
    return lines


def wrapped(label: str, paths: Sequence[str], width: int = WIDTH, most: int = PATH_LINES) -> List[str]:
    """`label: a, b, c` wrapped to `width` under the URN, at most `most` lines; past them, how many more paths
    there are (the plan document written with --json lists every one under `changes`)."""
    head, rest = f"{_INDENT}{label}: ", _INDENT + " " * (len(label) + 2)
    room = width - len(rest) - 1     # a path and its comma
    shown = [p if len(p) <= room else p[:room - 3] + "..." for p in paths]
    lines = textwrap.wrap(", ".join(shown), width=width, initial_indent=head, subsequent_indent=rest,
                          break_long_words=False, break_on_hyphens=False)
    if len(lines) <= most:
        return lines
    lines = lines[:most - 1]
    listed = sum(line.count(", ") for line in lines) + len(lines)   # a line ends in "," or a whole path
    more = len(paths) - listed
    return lines + [f"{rest}... and {more} more (all {len(paths)} in the --json document's changes)"]


# --- capacity and cost: the figures each document records, pool by pool -------------------------------------------
# "At desired" is at desiredNodes, and desiredNodes is a pool's initial size: its group ignores desiredCapacity once
# it exists (components/nodes/nodepool.py: the cluster-autoscaler owns it), so the difference labels those figures
# as the initial size, and an existing pool's come from the size its group keeps (initial_sizes).
_FIGURES = ("gpusAtDesired", "gpusAtMax", "hourlyAtDesired", "hourlyAtMax")


def initial_sizes(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Dict[str, Optional[int]]]:
    """Per pool of the new document, its desiredNodes in each document ("old" None for a new pool) and "applied":
    the size its group has after `pulumi up`. A new pool is created at its desiredNodes. An existing pool's group
    keeps its desired capacity (ignoreChanges desiredCapacity), which the old document records, except where the
    new minNodes or maxNodes no longer admit it: AWS moves it to the new bound when an UpdateAutoScalingGroup call
    gives MinSize or MaxSize without DesiredCapacity (Amazon EC2 Auto Scaling API Reference,
    UpdateAutoScalingGroup), as this update's is: its desired capacity is unchanged after the ignore."""
    before = {r["pool"]: r for r in old.get("capacity") or []}
    sizes = {}
    for row in new.get("capacity") or []:
        was = before.get(row["pool"])
        applied = row["desiredNodes"] if was is None else \
            min(max(was["desiredNodes"], row["minNodes"]), row["maxNodes"])
        sizes[row["pool"]] = {"old": was and was["desiredNodes"], "new": row["desiredNodes"], "applied": applied}
    return sizes


def capacity_and_cost(old: Mapping[str, Any], new: Mapping[str, Any],
                      sizes: Optional[Mapping[str, Mapping[str, Optional[int]]]] = None) -> List[Dict[str, Any]]:
    """One row per pool (the new document's pools in order, then the ones it drops), then "fixed costs" and
    "total": each figure of _FIGURES as {"old", "new"} (None where a side has no such pool, or no price), taken
    from `capacity[]` (GPUs) and `cost` (USD an hour) as the documents recorded them. A row whose price is a gap
    on either side, and a total summed over gaps, carries "incomplete": true. `new` must have the figures at the
    initial sizes that apply (`sizes`, from initial_sizes: each pool row carries its own as "desiredNodes")."""
    def pools(document):
        gpus = {r["pool"]: r for r in document.get("capacity") or []}
        cost = {p["pool"]: p for p in (document.get("cost") or {}).get("pools") or []}
        return {name: {"gpusAtDesired": gpus.get(name, {}).get("gpusAtDesired"),
                       "gpusAtMax": gpus.get(name, {}).get("gpusAtMax"),
                       "hourlyAtDesired": cost.get(name, {}).get("hourlyAtDesired"),
                       "hourlyAtMax": cost.get(name, {}).get("hourlyAtMax")}
                for name in list(gpus) + [n for n in cost if n not in gpus]}

    def fixed(document):
        # The totals the document records (cost.fixedCosts, summed from the unrounded figures), not a sum of the
        # items' rounded ones; a document written before fixedCosts existed has only the items.
        cost = document.get("cost") or {}
        items = cost.get("fixed") or []
        recorded = cost.get("fixedCosts")
        figures = {figure: (recorded.get(figure) if recorded is not None else
                            round(sum(i.get(figure) or 0 for i in items), 4)) if figure.startswith("hourly") else None
                   for figure in _FIGURES}
        return figures, any(i.get("hourlyAtMax") is None for i in items)

    def total(document, rows):
        cost = document.get("cost") or {}
        figures = {"gpusAtDesired": sum(r.get("gpusAtDesired") or 0 for r in rows.values()),
                   "gpusAtMax": sum(r.get("gpusAtMax") or 0 for r in rows.values()),
                   "hourlyAtDesired": cost.get("hourlyAtDesired"), "hourlyAtMax": cost.get("hourlyAtMax")}
        return figures, not cost.get("complete", True)

    before, after = pools(old), pools(new)
    rows = []
    for name in list(after) + [n for n in before if n not in after]:
        a, b = before.get(name), after.get(name)
        rows.append({"pool": name, **{f: {"old": a and a[f], "new": b and b[f]} for f in _FIGURES},
                     "incomplete": any((side is not None and side[f] is None) for side in (a, b)
                                       for f in ("hourlyAtDesired", "hourlyAtMax")),
                     "added": a is None, "removed": b is None, "desiredNodes": dict((sizes or {}).get(name) or {})
                     or None})
    for name, (old_side, old_gap), (new_side, new_gap) in (
            ("fixed costs", fixed(old), fixed(new)), ("total", total(old, before), total(new, after))):
        rows.append({"pool": name, **{f: {"old": old_side[f], "new": new_side[f]} for f in _FIGURES},
                     "incomplete": old_gap or new_gap, "added": False, "removed": False, "desiredNodes": None})
    return rows


def _figure(row: Mapping[str, Any], figure: str) -> str:
    money = figure.startswith("hourly")

    def show(value, absent):
        if absent:
            return "-"       # the pool is not in that document
        if value is None:
            return "no price" if money else "-"
        return f"${value:,.2f}" if money else f"{value:,}"

    old, new = row[figure]["old"], row[figure]["new"]
    if old == new and not row.get("added") and not row.get("removed"):
        return show(new, False)
    if old is None or new is None:
        return f"{show(old, row.get('added'))} -> {show(new, row.get('removed'))}"
    delta = new - old
    return f"{show(old, False)} -> {show(new, False)} ({'+' if delta >= 0 else '-'}{show(abs(delta), False)})"


def render_capacity_and_cost(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The table of capacity_and_cost: old -> new (difference) where a figure changed, the figure where not; a
    row with a price gap, and a total that leaves one out, is marked (incomplete)."""
    body = [[r["pool"] + (" (new)" if r.get("added") else "") + (" (removed)" if r.get("removed") else "")
             + (" (incomplete)" if r["incomplete"] else ""),
             _figure(r, "gpusAtDesired") if r["pool"] != "fixed costs" else "",
             _figure(r, "gpusAtMax") if r["pool"] != "fixed costs" else "",
             _figure(r, "hourlyAtDesired"), _figure(r, "hourlyAtMax")] for r in rows]
    header = ["pool", "GPUs@initial", "GPUs@max", "USD/hour@initial", "USD/hour@max"]
    widths = [max(len(x) for x in column) for column in zip(header, *body)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    kept = [_kept_line(r["pool"], size) for r in rows for size in [r.get("desiredNodes")]
            if size and size["old"] is not None and size["applied"] != size["new"]]
    return [("  " + fmt.format(*line)).rstrip() for line in [header, ["-" * w for w in widths]] + body] + kept + [
        "  initial: at desiredNodes, a pool's size when created; an existing group's size is the cluster-autoscaler's"]


def _kept_line(pool: str, size: Mapping[str, Any]) -> str:
    """Why an existing pool's figures at its initial size did not follow its desiredNodes."""
    nodes = f"{size['applied']} {'node' if size['applied'] == 1 else 'nodes'}"
    how = f"keeps {nodes} (ignoreChanges)" if size["applied"] == size["old"] else \
        f"goes to {nodes} (its new {'maxNodes' if size['applied'] < size['old'] else 'minNodes'})"
    return f"  {pool}: desiredNodes {size['old']} -> {size['new']} does not apply to its existing group, which {how}"


def changes_section(against: str, old: Mapping[str, Any], changes: Sequence[ResourceChange],
                    rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """What --against adds to the plan document: every changed resource with all its paths, the counts, and the
    capacity and cost rows."""
    return {"against": against, "stack": old.get("stack"),
            "counts": {action: sum(1 for c in changes if c.action == action) for action in ACTIONS + ("unchanged",)},
            "resources": [{"urn": c.urn, "type": c.type, "action": c.action, "paths": list(c.paths),
                           "forcedBy": list(c.forced_by), "note": c.note, "ignored": list(c.ignored)}
                          for c in changes if c.action != "unchanged" or c.ignored or c.note],
            "capacityAndCost": [dict(r) for r in rows]}
