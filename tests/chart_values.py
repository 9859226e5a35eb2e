"""Holds the Helm values the program sets against the pinned chart's own values.yaml (reference data beside the
checkout, ../shared/chartvalues/values; never copied into the repository)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping, Tuple

import yaml

from spec.charts import ChartPin
from tests.conftest import missing

# The project's reference data sits beside the checkout; a clone elsewhere finds it at the workspace's path.
VALUES_DIR = next((d for d in (Path(__file__).resolve().parent.parent.parent / "shared" / "chartvalues" / "values",
                               Path("/work/shared/chartvalues/values")) if d.is_dir()),
                  Path("/work/shared/chartvalues/values"))


def values_file(pin: ChartPin) -> Path:
    """The chart's own values.yaml at the pinned version."""
    path = VALUES_DIR / f"{pin.chart}-{pin.version}.yaml"
    if not path.is_file():
        missing(f"{path} is not on this machine: the project's reference chart values (../shared/chartvalues, "
                "beside the checkout; never copied into the repository)")
    return path


def set_paths(values: Mapping[str, Any], confirmed: Mapping[str, int], prefix: Tuple[str, ...] = ()) -> Iterator[str]:
    """Each path the program sets: a confirmed path (which may hold a list or a free-form map), else a leaf."""
    for key, value in values.items():
        path = ".".join(prefix + (key,))
        if path not in confirmed and isinstance(value, dict) and value:
            yield from set_paths(value, confirmed, prefix + (key,))
        else:
            yield path


def assert_values_confirmed(values: Mapping[str, Any], pin: ChartPin, confirmed: Mapping[str, int]) -> None:
    """Every path in `values` is in `confirmed`, and each confirmed path is at its stated line of the pinned
    chart's values.yaml."""
    path = values_file(pin)
    text = path.read_text()
    chart_values, lines = yaml.safe_load(text), text.splitlines()
    unconfirmed = sorted(set(set_paths(values, confirmed)) - set(confirmed))
    assert not unconfirmed, f"set but not confirmed in {path.name}: {unconfirmed}"
    for dotted, line in confirmed.items():
        node: Any = chart_values
        for key in dotted.split("."):
            assert isinstance(node, dict) and key in node, f"{dotted} is not in {path.name}"
            node = node[key]
        assert lines[line - 1].strip().startswith(f"{dotted.split('.')[-1]}:"), \
            f"{path.name}:{line} is not {dotted}: {lines[line - 1]!r}"
