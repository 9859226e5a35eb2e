"""The requirements ledger: every figure or rule of the design this project was built from, with its status (met,
departed from, or not applicable on AWS), why, where it is implemented and the tests that hold it. Data in
decisions/requirements.yaml; this module loads and checks it, resolves each row's `holds` against the code, and renders
docs/requirements.md.

A `holds` entry ties a row to the code: `ref` is "module:expression", where the expression is names, attributes,
calls with literal arguments and subscripts with literal keys only (`decisions.config.model:Alerts().gpu_temp_c`,
`decisions.nodes.amis:load_amis().releases['v20260714']['1.35'].driver_branch`); tests/test_requirements.py resolves
each one and compares it with `value`, so a figure that moves in the code without its row fails.

Regenerate the page: `.venv/bin/python -m decisions.requirements --write`.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from decisions.catalog.data_files import read_yaml

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS_PATH = Path(__file__).with_name("requirements.yaml")
PAGE_PATH = ROOT / "docs" / "requirements.md"
WRITE_COMMAND = ".venv/bin/python -m decisions.requirements --write"
STATUSES = ("met", "departed", "not-applicable")
STATUS_WORDS = {"met": "met", "departed": "departed", "not-applicable": "not applicable"}


class Hold(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ref: str = Field(pattern=r"^[a-z_][a-z0-9_.]*:.+$")
    value: Any


class Requirement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    requirement: str = Field(min_length=1)
    status: Literal["met", "departed", "not-applicable"]
    why: Optional[str] = None
    where: Tuple[str, ...] = Field(min_length=1)
    test: Tuple[str, ...] = ()
    holds: Tuple[Hold, ...] = ()

    @model_validator(mode="after")
    def _status_rules(self) -> "Requirement":
        if self.status != "met" and not (self.why or "").strip():
            raise ValueError(f"{self.id}: status {self.status} needs `why` (the reason, with figures)")
        if self.status == "met" and not self.test:
            raise ValueError(f"{self.id}: status met needs `test` (the tests that hold it)")
        bad = [t for t in self.test if not _is_test_id(t)]
        if bad:
            raise ValueError(f"{self.id}: tests {bad} are not tests/test_x.py::test_name")
        return self


def _is_test_id(text: str) -> bool:
    path, sep, name = text.partition("::")
    return bool(sep) and path.startswith("tests/") and Path(path).name.startswith("test_") and path.endswith(".py") \
        and name.startswith("test_") and name.isidentifier()


def load_requirements(path: Path = REQUIREMENTS_PATH) -> Tuple[Requirement, ...]:
    """The ledger's rows, checked: known statuses, `why` unless met, tests named as pytest ids, ids unique."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("requirements"), list):
        raise ValueError(f"{path.name}: needs a `requirements` list")
    rows = tuple(Requirement.model_validate(row) for row in data["requirements"])
    ids = [r.id for r in rows]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"{path.name}: ids listed twice: {', '.join(repeated)}")
    return rows


# --- resolving `holds` ----------------------------------------------------------------------------------------------

def resolve(ref: str) -> Any:
    """The value `ref` ("module:expression") names in the code. Only names, attributes, literal subscripts and calls
    with literal positional arguments are evaluated; anything else is refused."""
    module_name, _, expression = ref.partition(":")
    module = importlib.import_module(module_name)
    return _evaluate(ast.parse(expression, mode="eval").body, module, ref)


def _evaluate(node: ast.AST, module: Any, ref: str) -> Any:
    if isinstance(node, (ast.Name, ast.Attribute)) and getattr(node, "id", getattr(node, "attr", "")).startswith("_"):
        raise ValueError(f"{ref}: only names, attributes, literal subscripts and calls with literal arguments, "
                         "none private")
    if isinstance(node, ast.Name):
        return getattr(module, node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate(node.value, module, ref), node.attr)
    if isinstance(node, ast.Subscript):
        return _evaluate(node.value, module, ref)[ast.literal_eval(node.slice)]
    if isinstance(node, ast.Call) and not node.keywords:
        return _evaluate(node.func, module, ref)(*[ast.literal_eval(a) for a in node.args])
    raise ValueError(f"{ref}: only names, attributes, literal subscripts and calls with literal arguments")


def plain(value: Any) -> Any:
    """A resolved value as YAML data: tuples become lists, pydantic models their aliased dicts."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    return json.loads(json.dumps(value, default=str))


def default_alert_rule(alert: str) -> Dict[str, Any]:
    """The first rule named `alert` with the default thresholds (decisions.config.model.Alerts()), network rules on one
    p5 pool."""
    from decisions.catalog.catalog import load_catalog
    from decisions.config.model import Alerts
    from decisions.observability.alert_rules import gpu_rules, network_rules, storage_rules
    alerts = Alerts()
    pool = SimpleNamespace(name="ledger", types=(load_catalog().instance_types["p5.48xlarge"],), efa=True)
    for rule in [*gpu_rules(alerts), *network_rules(alerts, [pool]), *storage_rules(alerts)]:
        if rule["alert"] == alert:
            return rule
    raise KeyError(alert)


def stack_setting(stack: str, key: str) -> Any:
    """A key of a shipped stack file (stacks/Pulumi.<stack>.yaml) as the Pulumi CLI hands it to the program:
    plan.stackfile.load_stack_config (yaml.v3's scalars, UTF-8, Pulumi.yaml defaults)."""
    from plan.stackfile import load_stack_config
    return load_stack_config(stack)[key]


def gpus_at_max(stack: str) -> Dict[str, int]:
    """Each pool of a shipped stack file and the GPUs it reaches at maxNodes, counted as the plan's capacity table
    counts them (decisions.config.stack.ResolvedPool.gpus_per_node, the first instance type's GPUs, x maxNodes)."""
    from decisions.catalog.catalog import load_catalog
    from decisions.config.model import NodePool
    from decisions.config.stack import ResolvedPool
    types = load_catalog().instance_types
    gpus = {}
    for raw in stack_setting(stack, "gpu-cloud:nodePools"):
        spec = NodePool.model_validate(raw)
        pool = ResolvedPool(spec=spec, types=tuple(types[t] for t in spec.instance_types), efa=spec.efa)
        gpus[spec.name] = pool.gpus_per_node * spec.max_nodes
    return gpus


def rank_env(instance_type: str) -> Dict[str, str]:
    """What every rank of a multi-node job on an EFA pool of `instance_type` gets in its environment
    (decisions.platform.mpijob.efa_env, which reads only the pool's first type)."""
    from decisions.catalog.catalog import load_catalog
    from decisions.platform.mpijob import efa_env
    return efa_env(SimpleNamespace(primary_type=load_catalog().instance_types[instance_type]))


def device_rdma_types() -> List[str]:
    """The catalog types with EFA whose ranks get GPUDirect RDMA over it (FI_EFA_USE_DEVICE_RDMA in rank_env)."""
    from decisions.catalog.catalog import load_catalog
    return sorted(name for name, itype in load_catalog().instance_types.items()
                  if itype.efa and itype.efa.cards and "FI_EFA_USE_DEVICE_RDMA" in rank_env(name))


def choices(model: str, field: str) -> Tuple[Any, ...]:
    """The values a Literal field of a config model accepts (`model`: "module:Class"), read from its annotation:
    what validation lets through, not a list kept beside it."""
    module_name, _, class_name = model.partition(":")
    annotation = getattr(importlib.import_module(module_name), class_name).model_fields[field].annotation
    while get_origin(annotation) is not Literal:   # Optional[Literal[...]], Annotated[Literal[...], ...]
        inner = [a for a in get_args(annotation) if a is not type(None)]
        if not inner:
            raise ValueError(f"{model}.{field} is not a Literal field")
        annotation = inner[0]
    return get_args(annotation)


# --- the page -------------------------------------------------------------------------------------------------------

def summary(rows: Sequence[Requirement]) -> str:
    """One line: "31 requirements: 18 met, 11 departed, 2 not applicable"."""
    counts = [f"{sum(r.status == s for r in rows)} {STATUS_WORDS[s]}" for s in STATUSES]
    return f"{len(rows)} requirements: {', '.join(counts)}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# What the ledger leaves out, stated on the page so that a missing row is either a gap or this rule, never silent.
LEAVES_OUT = (
    "What it leaves out: advice to the training or serving program that no platform setting carries and that the",
    "design gives as practice, not as a figure, such as mixed precision or gradient accumulation. Where the design",
    "gives such a rule a figure (checkpoint every 1,000 steps), the row stays and says the platform cannot hold it.",
)


def render(rows: Sequence[Requirement]) -> str:
    lines = [
        "# Requirements ledger",
        "",
        "Every figure or rule of the design this project was built from: met, departed from (why), or not applicable",
        "on AWS (why), where it is implemented and the tests that hold it. "
        "Generated from `decisions/requirements.yaml`",
        f"by `{WRITE_COMMAND}`; do not edit by hand. `tests/test_requirements.py`",
        "compares this page with the data and each row's figures (`holds` in the data) with the code, so a figure",
        "that moves without its row fails.",
        "",
        *LEAVES_OUT,
        "",
        f"{summary(rows)}.",
        "",
        "| Requirement | Status | Why | Where | Tests |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        where = "<br>".join(f"`{w}`" for w in r.where)
        tests = "<br>".join(f"`{t.split('::', 1)[1]}` ({t.split('::', 1)[0].removeprefix('tests/')})" for t in r.test)
        lines.append(f"| {_cell(r.requirement)} | {STATUS_WORDS[r.status]} | {_cell(r.why or '')} | {where} | "
                     f"{tests or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decisions.requirements", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE_PATH.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows = load_requirements()
    if args.write:
        PAGE_PATH.write_text(render(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
