"""Offline plan: render a stack (resources, GPU capacity, cost, policy) with no cloud account.

    python -m plan STACK [--stack-file PATH] [--json PATH|-] [--quiet] [--no-policy] [--policy-config FILE]
                         [--against OLD.json [--force]] [--policy-view update|preview|first-preview]
    python -m plan --policy-check PLAN.json [--policy-config FILE] [--policy-view VIEW]
    python -m plan --dr-pair PRIMARY SECONDARY

The stack is named positionally or with --stack, as `python -m jobs` takes it. The report goes to stdout; with
`--json -` the document goes to stdout and the report to stderr; --quiet prints the report's summary alone.
Diagnostics (errors, what was written where, why the exit code is 1) go to stderr.

Exit codes: 0 clean, 1 a mandatory policy violation, 2 a config error or a plan document that cannot be read or
is not valid (with --against, a stack over its budget exits 2 after its report and the difference), 3 anything else
(one line), 4 a usage error (arguments; --against a document of another stack).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import List, Optional

EXIT_OK, EXIT_POLICY, EXIT_CONFIG, EXIT_OTHER, EXIT_USAGE = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    """Usage errors exit with their own code, apart from a config error's."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _epilog() -> str:
    from plan.stackfile import known_stacks

    return (f"stacks: {', '.join(known_stacks())}\n"
            "exit codes: 0 clean, 1 a mandatory policy violation, 2 a config error or an unreadable or invalid\n"
            "            plan document, 3 anything else (one line), 4 a usage error\n"
            "example: python -m plan prod-us-east-1 --json plan.json --diagram docs/prod.svg")


STDOUT = "-"     # `--json -`: the document on stdout, the report on stderr


def _writable_file(text: str):
    """argparse type of `--json`: a file in a folder that exists, checked before the plan runs, or `-`."""
    if text == STDOUT:
        return STDOUT
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder")
    return path


def _quiet_library_noise() -> None:
    """A user's PYTHONWARNINGS (or -W) must not bury the plan under the SDKs' own deprecation notices and the event
    loops the Pulumi runtime leaves open at exit: neither is the user's to fix, and `error` would make them fatal."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="pulumi")   # pulumi, pulumi_aws, ...
    warnings.filterwarnings("ignore", message="unclosed event loop", category=ResourceWarning)


def main(argv: Optional[List[str]] = None) -> int:
    from plan.views import VIEWS

    _quiet_library_noise()
    parser = _Parser(prog="python -m plan", description=__doc__.split("\n\n")[0], epilog=_epilog(),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stack", nargs="?", help="stack name, e.g. prod-us-east-1 (or --stack NAME)")
    parser.add_argument("--stack", dest="stack_option", metavar="NAME", help="the stack, as `python -m jobs` names "
                        "it: the same as the positional STACK")
    parser.add_argument("--stack-file", type=Path, help="stack file to use instead of stacks/Pulumi.STACK.yaml")
    parser.add_argument("--json", type=_writable_file, dest="json_path", metavar="PATH|-",
                        help="write the plan document here; `-`: to stdout, with the report on stderr")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="print the report's summary alone (its first lines), where the report would go")
    from plan.diagram import diagram_argument   # standard library only: checks the path before the plan runs
    parser.add_argument("--diagram", type=diagram_argument, metavar="PATH.svg|PATH.dot",
                        help="draw the architecture picture (Graphviz; SVG needs its `dot` program)")
    parser.add_argument("--no-policy", action="store_true", help="skip the policy pack")
    parser.add_argument("--policy-check", type=Path, metavar="PLAN.json",
                        help="run the policy pack on a written plan document")
    parser.add_argument("--policy-config", type=Path, metavar="FILE",
                        help="policy pack config, as for `pulumi preview --policy-pack-config` (levels, keys)")
    parser.add_argument("--policy-view", choices=VIEWS, default="update",
                        help="judge the stack as the engine shows it to the pack on an update (default), on a later "
                             "preview, or on a new stack's first preview")
    parser.add_argument("--against", type=Path, metavar="OLD.json",
                        help="also show the capacity and cost difference and what changed since an earlier plan "
                             "document of the stack")
    parser.add_argument("--force", action="store_true",
                        help="with --against: compare with a document written for another stack")
    parser.add_argument("--dr-pair", nargs=2, metavar=("PRIMARY", "SECONDARY"),
                        help="check two stacks as a DR pair and print how long recovery from the primary's loss takes")
    args = parser.parse_args(argv)
    if args.stack_option:
        if args.stack and args.stack != args.stack_option:
            parser.error(f"the stack is named twice: {args.stack} and --stack {args.stack_option}")
        args.stack = args.stack_option
    if args.dr_pair:
        others = [option for option, given in (("STACK", args.stack), ("--policy-check", args.policy_check),
                                               ("--stack-file", args.stack_file), ("--json", args.json_path),
                                               ("--diagram", args.diagram), ("--no-policy", args.no_policy),
                                               ("--policy-config", args.policy_config), ("--against", args.against),
                                               ("--policy-view", args.policy_view != "update"),
                                               ("--quiet", args.quiet), ("--force", args.force)) if given]
        if others:
            parser.error(f"--dr-pair takes two stack names and nothing else, not {', '.join(others)}")
        if args.dr_pair[0] == args.dr_pair[1]:
            parser.error("--dr-pair needs two different stacks")
        try:
            return dr_pair(*args.dr_pair)
        except Exception as error:  # the contract: one line, exit 3, no traceback
            print(f"plan failed: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
            return EXIT_OTHER
    if bool(args.stack) == bool(args.policy_check):
        parser.error("give a STACK, or --policy-check PLAN.json, or --dr-pair PRIMARY SECONDARY")
    if args.against and not args.stack:
        parser.error("--against needs a STACK to plan")
    if args.force and not args.against:
        parser.error("--force has nothing to force without --against")
    if args.policy_config and args.no_policy:
        parser.error("--policy-config has nothing to configure with --no-policy")
    if args.policy_view != "update" and args.no_policy:
        parser.error("--policy-view has nothing to judge with --no-policy")
    try:
        return (policy_check(args.policy_check, args.policy_config, args.policy_view, quiet=args.quiet)
                if args.policy_check else plan(args))
    except Exception as error:  # the contract: one line, exit 3, no traceback
        print(f"plan failed: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
        return EXIT_OTHER


def plan(args) -> int:
    from pulumi import RunError

    from decisions.config.errors import ConfigError
    from plan.diff import (capacity_and_cost, changes_section, diff_documents, initial_sizes,
                           render_capacity_and_cost, render_changes)
    from plan.document import at_initial_sizes, build_document, render_text
    from plan.engine import run_program
    from plan.policy_runner import PolicyConfigError, load_config, run_pack
    from plan.preview import preview_facts
    from plan.stackfile import StackFileError, load_stack, load_stack_past_budget
    from plan.views import PREVIEW_VIEWS, VIEWS

    # Read OLD.json first, so an unusable one fails before the plan prints anything.
    old_document = read_document(args.against) if args.against else None
    if args.against and old_document is None:
        return EXIT_CONFIG
    if old_document is not None and old_document["stack"] != args.stack and not args.force:
        print(f"python -m plan: error: --against {args.against} is the plan document of stack "
              f"{old_document['stack']}, not {args.stack}: every resource would read as created or deleted. Compare "
              f"with a document of {args.stack} (python -m plan {args.stack} --json OLD.json), or add --force",
              file=sys.stderr)
        return EXIT_USAGE
    refusal = None     # with --against, a stack refused for its budget alone: planned, compared, then exit 2
    try:
        # Validate before running anything, so a bad config registers nothing and reads as a list.
        try:
            config, spec = load_stack(args.stack, args.stack_file)
        except ConfigError as error:
            # The difference is what a reviewer of a budget-breaking change needs most: show it, then refuse.
            past = load_stack_past_budget(args.stack, args.stack_file, error) if old_document is not None else None
            if past is None:
                raise
            (config, spec), refusal = past, error
        pack_config = load_config(args.policy_config) if args.policy_config else None
    except (ConfigError, StackFileError, PolicyConfigError) as error:
        print(f"config error in stack {args.stack}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if sys.stderr.isatty():     # the run takes seconds: say so where someone watches, stay quiet in pipes and CI
        print(f"planning {args.stack}: running the program under the offline mocks ...", file=sys.stderr)
    try:
        run = run_program(config, stack=args.stack)
    except RunError as error:   # the program's own clean config error (checks that need the provider)
        print(f"config error in {args.stack_file or f'stack {args.stack}'}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    # The preview views, for the pack and for the document (so that --policy-check can judge any of them later).
    views = {view: preview_facts(view, config, run) for view in PREVIEW_VIEWS} if not args.no_policy or \
        args.json_path else {}
    document = build_document(spec, run, {"violations": [], "skipped": "--no-policy"}, run.warnings, views)
    if not args.no_policy:
        try:    # the pack reads the document as the engine would read the stack (plan/policy_runner.py)
            written = json.loads(json.dumps(document))
            document["policy"] = run_pack(written, pack_config, view=args.policy_view)
            document["policy"]["otherViews"] = {view: _summary(run_pack(written, pack_config, view=view))
                                                for view in VIEWS if view != args.policy_view}
        except PolicyConfigError as error:
            print(f"config error in stack {args.stack}: {error}", file=sys.stderr)
            return EXIT_CONFIG
    # The report goes to stdout, or to stderr when stdout carries the document; --quiet prints its summary alone.
    report = sys.stderr if args.json_path == STDOUT else sys.stdout
    print(render_text(document, summary_only=args.quiet), file=report)
    if args.diagram:
        from plan.diagram import write_diagram

        write_diagram(document, args.diagram)
        print(f"architecture picture written to {args.diagram}", file=sys.stderr)
    if old_document is not None:
        # Compared as written (a JSON round trip), so both sides hold the same kinds of values.
        changes = diff_documents(old_document, json.loads(json.dumps(document)))
        sizes = initial_sizes(old_document, document)
        rows = capacity_and_cost(old_document, at_initial_sizes(document, spec, run, sizes), sizes)
        document["changes"] = changes_section(str(args.against), old_document, changes, rows)
        if not args.quiet:
            print("\n".join([f"\nCapacity and cost against {args.against} (stack {old_document['stack']}; "
                             "old -> new where a figure changed):"] + render_capacity_and_cost(rows)
                            + [f"\nChanges against {args.against}:"] + render_changes(changes)), file=report)
    if args.json_path == STDOUT:
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    elif args.json_path:
        args.json_path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        print(f"plan document written to {args.json_path}", file=sys.stderr)
    if refusal is not None:
        print(f"config error in stack {args.stack}: {refusal}\npython -m plan: exit 2: the stack is over its budget, "
              "which `pulumi up` refuses; the difference against "
              f"{args.against} shows what the change would do", file=sys.stderr)
        return EXIT_CONFIG
    return _verdict(document["policy"], quiet=args.quiet)


def _verdict(policy, quiet: bool = False) -> int:
    """The exit code of a verdict; on 1, why, on stderr (each mandatory violation too when no report shows it)."""
    from plan.policy_runner import mandatory
    from plan.views import VIEW_NAMES

    failed = mandatory(policy.get("violations") or [])
    if not failed:
        return EXIT_OK
    names = sorted({v["policyName"] for v in failed})
    print(f"python -m plan: exit 1: {len(failed)} mandatory policy violation(s) as "
          f"{VIEW_NAMES.get(policy.get('view'), 'an update')} shows it ({', '.join(names)})"
          + ("" if quiet else "; the report's Policy section lists them"), file=sys.stderr)
    if quiet:
        for v in failed:
            found = v["message"].split("\n", 1)[-1].replace("\n", " ")
            print(f"  [mandatory] {v['policyName']}: {found}" + (f" ({v['urn']})" if v["urn"] else ""),
                  file=sys.stderr)
    return EXIT_POLICY


def dr_pair(primary: str, secondary: str) -> int:
    """Check two stacks as a DR pair (decisions/serving/dr_pair.py), each validated as a plan validates it, and print
    the pair and its recovery time; a pair that does not hold exits 2 with every reason, by stack and key path."""
    from decisions.config.errors import ConfigError, key_path
    from decisions.config.model import NAMESPACE
    from decisions.serving import dr_pair as rules
    from decisions.storage import replication
    from plan.stackfile import StackFileError, load_stack

    specs = {}
    for stack in (primary, secondary):
        try:
            specs[stack] = load_stack(stack)[1]
        except (ConfigError, StackFileError) as error:
            print(f"config error in stack {stack}: {error}", file=sys.stderr)
    if len(specs) < 2:
        return EXIT_CONFIG
    p_spec, s_spec = specs[primary], specs[secondary]
    issues = rules.pair_issues(p_spec, s_spec)
    if issues:
        print(f"DR pair {primary} and {secondary} does not hold ({len(issues)} "
              f"{'mistake' if len(issues) == 1 else 'mistakes'}):", file=sys.stderr)
        for stack, parts, message in issues:
            print(f"  - {stack}: {key_path(NAMESPACE, parts)}: {message}", file=sys.stderr)
        return EXIT_CONFIG
    p, s = rules.serving(p_spec), rules.serving(s_spec)
    models = rules.declared_models(p_spec.inference.triton, s_spec.inference.triton)
    scheme, target = p_spec.inference.triton.scheme, p_spec.dr.rpo_minutes
    gpus = (f"{p.gpu_model} and {s.gpu_model} ({p.architecture})" if p.architecture == s.architecture else
            f"{p.gpu_model} ({p.architecture}) and {s.gpu_model} ({s.architecture}): models declared portable in both")
    lines = [
        f"DR pair: {primary} (primary, {p_spec.region}) and {secondary} (secondary, {s_spec.region}), routing "
        f"{p_spec.dr.routing}",
        f"  GPUs            {gpus}",
        f"  memory a slot   {p.slot_memory_mib:,} MiB and {s.slot_memory_mib:,} MiB",
        "  models          " + (f"{len(models)} declared, {sum(models.values()):,} MiB together: every replica in both "
                                "holds them all" if models else "none declared (inference.triton.models): a secondary "
                                "slot is held to the size of a primary's instead"),
        f"  capacity        {secondary} grows to {s.ceiling} GPU slots; {primary} always runs {p.floor}",
        f"  recovery point  {replication.REPLICATION_TIME_MINUTES} min: S3 Replication Time Control is "
        f"{replication.RTC_FIGURES}; " + (f"target {target} min" if target is not None else "no target (dr.rpoMinutes)"),
        "  clients         " + (f"{', '.join(p_spec.dr.client_cidrs)} reach both internal load balancers"
                                if scheme == "internal" else "anywhere: internet-facing load balancers"),
        *(f"  /data           {stack}: {text}" for stack, text in (
            (primary, rules.lustre_protection(p_spec, secondary)), (secondary, rules.lustre_protection(s_spec, None)))
          if text),
        "",
        f"Recovery time if {primary} fails, carrying its minimum ({p.floor} replicas), an estimate:"]
    at_minimum = rules.recovery(p_spec, s_spec, p.floor)
    for term in at_minimum.terms:
        lines.append(f"  {term.name:<10} {term.seconds:>6,} s  {term.why}")
        lines += _term_lines(term.parts, "    ")
    lines.append(f"  {'total':<10} {at_minimum.seconds:>6,} s  ({at_minimum.seconds / 60:.1f} min)")
    lines += _not_counted_lines(at_minimum)
    at_maximum = rules.recovery(p_spec, s_spec, p.ceiling)
    if at_maximum.terms is None:
        lines.append(f"Carrying its maximum ({p.ceiling} replicas): {secondary} reaches at most {s.ceiling}.")
    else:
        scale_up = at_maximum.terms[-1]
        lines.append(f"Carrying its maximum ({p.ceiling} replicas): {at_maximum.seconds:,} s "
                     f"({at_maximum.seconds / 60:.1f} min), of which scale-up {scale_up.seconds:,} s")
        lines += _term_lines(scale_up.parts, "  ")
        lines += _not_counted_lines(at_maximum)
        lines += [f"  assumes: {text}" for text in at_maximum.assumes]
    print("\n".join(lines))
    return EXIT_OK


def _term_lines(terms, indent: str) -> List[str]:
    return [f"{indent}{t.name:<20} {t.seconds:>6,} s  {t.why}" for t in terms]


def _not_counted_lines(recovery) -> List[str]:
    """What takes time and has no term in the total (decisions.serving.dr_pair.Recovery.not_counted)."""
    return [f"  not counted: {text}" for text in recovery.not_counted]


def _summary(verdict) -> dict:
    """A verdict in figures: how many violations, and how many of them mandatory."""
    levels = [v["enforcementLevel"] for v in verdict["violations"]]
    return {"violations": len(levels), "mandatory": levels.count("mandatory")}


def read_document(path: Path) -> Optional[dict]:
    """A written plan document, or None once one line on stderr has said why it cannot be used and, where there is
    none or it is no plan document, how to write one."""
    from plan.document import document_problems

    how = f"write one with `make plan JSON={path}` or `python -m plan STACK --json {path}`"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"cannot read plan document {path}: there is no such file; {how}", file=sys.stderr)
        return None
    except json.JSONDecodeError as error:
        print(f"cannot read plan document {path}: it is not JSON ({error}); {how}", file=sys.stderr)
        return None
    except (OSError, ValueError) as error:   # ValueError: not UTF-8
        print(f"cannot read plan document {path}: {error}", file=sys.stderr)
        return None
    problems = document_problems(document)
    if problems:
        print(f"{path} is not a valid plan document: " + "; ".join(problems) + f"; {how}", file=sys.stderr)
        return None
    return document


def policy_check(path: Path, config_path: Optional[Path] = None, view: str = "update", quiet: bool = False) -> int:
    """Run the pack on a written plan document, as `view` would show it: exit 1 on a mandatory violation, 2 on a
    document (or pack config) that cannot be read, is not valid or lacks the view, never a pass on one."""
    from plan.document import _policy_lines
    from plan.policy_runner import PolicyConfigError, PolicyViewError, load_config, run_pack

    document = read_document(path)
    if document is None:
        return EXIT_CONFIG
    try:
        verdict = run_pack(document, load_config(config_path) if config_path else None, view=view)
    except (PolicyConfigError, PolicyViewError) as error:
        print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    recorded = document["policy"]["violations"]
    if not quiet:
        print(f"{path}: plan document for stack {document['stack']} ({len(document['resources'])} resources; "
              f"{len(recorded)} violation(s) recorded when it was planned)")
        print("\n".join(_policy_lines(verdict)))
    return _verdict(verdict, quiet=quiet)


if __name__ == "__main__":
    sys.exit(main())
