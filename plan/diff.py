"""Offline preview of a change: what a new plan document would create, update, replace or delete
compared with an older one (`python -m plan STACK --against OLD.json`). Pure: documents in, records out.

Resources are matched by URN and compared on their inputs only (dependency order varies run to run).
An update is a replacement when an input listed in replace_on_change.yaml changed. The mocks give a
replaced resource the same ID as before, so changes that follow from a new ID are not seen here:
`pulumi preview` against the real state stays the authority.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import yaml

REPLACE_TABLE = Path(__file__).with_name("replace_on_change.yaml")
ACTIONS = ("create", "update", "replace", "delete")
# The Auto Scaling group follows the template's latest_version, so every new version starts an instance refresh.
NOTES = {"aws:ec2/launchTemplate:LaunchTemplate": "rolls the pool's nodes (instance refresh)"}
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ABSENT = object()   # a key or list item one side does not have


@dataclass(frozen=True)
class ResourceChange:
    urn: str
    type: str
    action: str                      # one of ACTIONS, or "unchanged"
    paths: Tuple[str, ...] = ()      # inputs that differ (update and replace)
    forced_by: Tuple[str, ...] = ()  # table paths whose change forces the replacement
    note: Optional[str] = None


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
                                    forcing.get(after[urn]["type"], ())))
    return changes


def _compare(kind: str, urn: str, old: Mapping[str, Any], new: Mapping[str, Any],
             forcing: Sequence[str]) -> ResourceChange:
    paths = tuple(changed_paths(old, new))
    if not paths:
        return ResourceChange(urn, kind, "unchanged")
    forced_by = tuple(p for p in forcing if _value_at(old, p) != _value_at(new, p))
    return ResourceChange(urn, kind, "replace" if forced_by else "update", paths, forced_by, NOTES.get(kind))


def changed_paths(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """Paths at which two input values differ: into objects by key and lists by index; a value that
    appears, vanishes or changes kind is one path."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            yield from changed_paths(old.get(key, _ABSENT), new.get(key, _ABSENT), _key_path(path, key))
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            yield from changed_paths(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT,
                                     f"{path}[{i}]")
    elif old != new:
        yield path


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
        if change.action == "unchanged":
            continue
        lines.append(f"  {change.action:<8} {change.urn}")
        if change.paths:
            lines.append(f"           changed: {', '.join(change.paths)}")
        if change.forced_by:
            lines.append(f"           forces replacement: {', '.join(change.forced_by)}")
        if change.note:
            lines.append(f"           note: {change.note}")
    counts = {action: sum(1 for c in changes if c.action == action) for action in ACTIONS + ("unchanged",)}
    lines.append("  " + ", ".join(f"{counts[a]} to {a}" for a in ACTIONS) + f", {counts['unchanged']} unchanged")
    return lines
