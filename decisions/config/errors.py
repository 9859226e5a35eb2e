"""Config errors: every mistake in a stack config, each with its full key path."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, List, Optional, Sequence, Tuple, Union

PathPart = Union[str, int]

# Plain scalars YAML 1.1 (PyYAML) reads as booleans or base-60 numbers and the Pulumi CLI, which reads stack files
# with yaml.v3 (plan/stackfile.py), reads as strings: a wrong-type message says what to write instead.
YAML11_BOOLEANS = frozenset("yes Yes YES no No NO on On ON off Off OFF y Y n N".split())
YAML11_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")


def key_path(namespace: str, parts: Sequence[PathPart]) -> str:
    """`gpu-cloud`, ("nodePools", 1, "instanceTypes", 0) -> `gpu-cloud:nodePools[1].instanceTypes[0]`."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return f"{namespace}:{text}" if text else namespace


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    message: str
    # What the path points into, in words: a node pool's name ("pool batch-h200-spot"), so an error under
    # nodePools[3] needs no counting. The path stays one `pulumi config set --path` takes.
    label: str = ""

    def __str__(self) -> str:
        return f"{self.path} ({self.label}): {self.message}" if self.label else f"{self.path}: {self.message}"


POOL_PATH = re.compile(r"^[\w-]+:nodePools\[(\d+)\]")


def name_pools(issues: Iterable[ConfigIssue], pool_names: Sequence[Optional[str]]) -> List[ConfigIssue]:
    """Each issue under nodePools[i] labelled with that pool's name (where the pool has a name)."""
    named = []
    for issue in issues:
        match = POOL_PATH.match(issue.path)
        index = int(match.group(1)) if match else None
        if index is not None and index < len(pool_names) and pool_names[index] and not issue.label:
            issue = replace(issue, label=f"pool {pool_names[index]}")
        named.append(issue)
    return named


class ConfigError(Exception):
    """Raised once, before any resource is registered, with every mistake found."""

    def __init__(self, issues: Iterable[ConfigIssue], *, pool_names: Sequence[Optional[str]] = (),
                 source: Optional[str] = None):
        """`pool_names`: the stack's pools in order, to name the pool of each nodePools[i] issue; `source`: the stack
        file the config came from, when it is not the stack's own (`--stack-file`)."""
        self.issues: Tuple[ConfigIssue, ...] = tuple(name_pools(issues, pool_names))
        self.source = source
        count = len(self.issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        where = f" in {source}" if source else ""
        super().__init__(f"invalid stack config{where} ({count} {'mistake' if count == 1 else 'mistakes'}):\n{lines}")
