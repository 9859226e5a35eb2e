"""Offline plan: render a stack (resources, GPU capacity, cost, policy) with no cloud account.

    python -m plan STACK [--stack-file PATH] [--json PATH] [--no-policy] [--against OLD.json]
    python -m plan --policy-check PLAN.json

Exit codes: 0 clean, 1 a mandatory policy violation, 2 a config error, 3 anything else (one line).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

EXIT_OK, EXIT_POLICY, EXIT_CONFIG, EXIT_OTHER = 0, 1, 2, 3
NO_PACK = "the policy pack is not part of gpu-cloud yet"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", nargs="?", help="stack name, e.g. prod-us-east-1")
    parser.add_argument("--stack-file", type=Path, help="stack file to use instead of stacks/Pulumi.STACK.yaml")
    parser.add_argument("--json", type=Path, dest="json_path", help="write the plan document here")
    parser.add_argument("--no-policy", action="store_true", help="skip the policy pack")
    parser.add_argument("--policy-check", type=Path, metavar="PLAN.json", help="check a written plan document")
    parser.add_argument("--against", type=Path, metavar="OLD.json",
                        help="also list what changed since an earlier plan document of the stack")
    args = parser.parse_args(argv)
    if bool(args.stack) == bool(args.policy_check):
        parser.error("give a STACK, or --policy-check PLAN.json")
    if args.against and not args.stack:
        parser.error("--against needs a STACK to plan")
    try:
        return policy_check(args.policy_check) if args.policy_check else plan(args)
    except Exception as error:  # the contract: one line, exit 3, no traceback
        print(f"plan failed: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
        return EXIT_OTHER


def plan(args) -> int:
    from pulumi import RunError

    from plan.diff import diff_documents, render_changes
    from plan.document import build_document, render_text
    from plan.engine import run_program
    from plan.stackfile import StackFileError, load_stack
    from spec.errors import ConfigError

    # Read OLD.json first, so an unusable one fails before the plan prints anything.
    old_document = read_document(args.against) if args.against else None
    if args.against and old_document is None:
        return EXIT_OTHER
    try:
        # Validate before running anything, so a bad config registers nothing and reads as a list.
        config, spec = load_stack(args.stack, args.stack_file)
    except (ConfigError, StackFileError) as error:
        print(f"config error in stack {args.stack}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        run = run_program(config, stack=args.stack)
    except RunError as error:   # the program's own clean config error (checks that need the provider)
        print(f"config error in stack {args.stack}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    policy = {"violations": [], "skipped": "--no-policy" if args.no_policy else NO_PACK}
    document = build_document(spec, run, policy, run.warnings)
    print(render_text(document))
    if old_document is not None:
        # Compared as written (a JSON round trip), so both sides hold the same kinds of values.
        changes = diff_documents(old_document, json.loads(json.dumps(document)))
        print("\n".join([f"\nChanges against {args.against}:"] + render_changes(changes)))
    if args.json_path:
        args.json_path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        print(f"\nplan document written to {args.json_path}")
    mandatory = [v for v in policy["violations"] if v.get("enforcement") == "mandatory"]
    return EXIT_POLICY if mandatory else EXIT_OK


def read_document(path: Path) -> Optional[dict]:
    """A written plan document, or None once one line on stderr has said why it cannot be used."""
    from plan.document import document_problems

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:   # ValueError: not UTF-8, or not JSON
        print(f"cannot read plan document {path}: {error}", file=sys.stderr)
        return None
    problems = document_problems(document)
    if problems:
        print(f"{path} is not a valid plan document: " + "; ".join(problems), file=sys.stderr)
        return None
    return document


def policy_check(path: Path) -> int:
    document = read_document(path)
    if document is None:
        return EXIT_OTHER
    violations = document["policy"]["violations"]
    print(f"{path}: valid plan document for stack {document['stack']} ({len(document['resources'])} resources); "
          f"policy: {NO_PACK}, {len(violations)} recorded violation(s)")
    return EXIT_POLICY if any(v.get("enforcement") == "mandatory" for v in violations) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
