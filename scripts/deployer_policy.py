"""Write the deployer's IAM policy for the shipped stacks (or the stacks named) into docs/, from their plans.

    .venv/bin/python scripts/deployer_policy.py                 write docs/deployer-policy-N.json for the shipped stacks
    .venv/bin/python scripts/deployer_policy.py --check         offline: say whether the kept documents are current
    .venv/bin/python scripts/deployer_policy.py --print STACK…  print the documents a set of stacks needs (your own)

Each stack is planned offline (plan/engine.py, the offline account); every resource type it registers and every provider
function it calls is looked up in decisions/config/deployer_actions.yaml, and the actions they need become the policy
(decisions/config/deployer_policy.py), one statement per service, split by service into as few documents as fit IAM's
6,144 characters for a managed policy. A type or function the table does not know stops the script with its name.
Exit codes: 0 done (or current), 1 --check found the kept documents stale, 2 a token has no actions recorded.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decisions.config.deployer_policy import (  # noqa: E402
    UnmappedTokens, load_deployer_actions, policy_documents, policy_size, render, required_grants)

SHIPPED = ("prod-us-east-1", "prod-eu-west-1", "dev")
DOCS = ROOT / "docs"
PATTERN = "deployer-policy-*.json"


def stack_tokens(run) -> Tuple[Set[str], Set[str]]:
    """A plan run's resource types (custom resources, and components a provider builds such as a Helm chart; not
    gpu-cloud's own components, which create nothing themselves) and the provider functions it called."""
    return ({r.type for r in run.resources if r.custom or r.remote}, {token for token, _ in run.invokes})


def plan_tokens(stacks: Iterable[str]) -> Tuple[Set[str], Set[str]]:
    """The union of the stacks' types and provider functions, each stack planned offline from its stack file."""
    from plan.engine import run_program
    from plan.stackfile import load_stack_config

    types: Set[str] = set()
    invokes: Set[str] = set()
    for stack in stacks:
        found = stack_tokens(run_program(load_stack_config(stack), stack=stack))
        types |= found[0]
        invokes |= found[1]
    return types, invokes


def documents_for(types: Iterable[str], invokes: Iterable[str]) -> Dict[str, str]:
    """File name -> rendered document, numbered from 1."""
    grants = required_grants(types, invokes, load_deployer_actions())
    return {f"deployer-policy-{i}.json": render(doc) for i, doc in enumerate(policy_documents(grants), start=1)}


def stale(expected: Dict[str, str], directory: Path = DOCS) -> List[str]:
    """What differs between the kept documents and `expected`: missing, changed or left over, by file name."""
    kept = {p.name: p.read_text(encoding="utf-8") for p in directory.glob(PATTERN)}
    return sorted([f"{name} (missing)" for name in expected if name not in kept]
                  + [f"{name} (differs)" for name in expected if name in kept and kept[name] != expected[name]]
                  + [f"{name} (left over)" for name in kept if name not in expected])


def write(expected: Dict[str, str], directory: Path = DOCS) -> None:
    for path in directory.glob(PATTERN):
        if path.name not in expected:
            path.unlink()
    for name, text in expected.items():
        (directory / name).write_text(text, encoding="utf-8")


def summary(expected: Dict[str, str]) -> List[str]:
    import json

    return [f"docs/{name}: {policy_size(json.loads(text)):,} of 6,144 characters, "
            f"{', '.join(s['Sid'] for s in json.loads(text)['Statement'])}" for name, text in expected.items()]


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="write nothing; exit 1 when docs/ is not current")
    group.add_argument("--print", nargs="+", metavar="STACK", dest="stacks",
                       help="print the documents these stacks need instead of writing the shipped stacks' ones")
    args = parser.parse_args(argv)
    try:
        expected = documents_for(*plan_tokens(args.stacks or SHIPPED))
    except UnmappedTokens as error:
        print(f"deployer_policy: {error}", file=sys.stderr)
        return 2
    if args.stacks:
        for name, text in expected.items():
            print(f"--- {name}\n{text}", end="")
        return 0
    if args.check:
        differences = stale(expected)
        for line in differences:
            print(f"docs/{line}: run .venv/bin/python scripts/deployer_policy.py", file=sys.stderr)
        if differences:
            return 1
    else:
        write(expected)
    print("\n".join(summary(expected)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
