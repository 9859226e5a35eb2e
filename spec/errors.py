"""Config errors: every mistake in a stack config, each with its full key path."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Tuple, Union

PathPart = Union[str, int]


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

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(Exception):
    """Raised once, before any resource is registered, with every mistake found."""

    def __init__(self, issues: Iterable[ConfigIssue]):
        self.issues: Tuple[ConfigIssue, ...] = tuple(issues)
        count = len(self.issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"invalid stack config ({count} {'mistake' if count == 1 else 'mistakes'}):\n{lines}")
