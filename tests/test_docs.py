"""The README and docs/ cannot drift: their shell blocks run, their printed output is the program's, their links
resolve, and the README stays a five-minute read whose timings are the measured ones.

Fenced shell blocks (sh, bash) carry one word after the language:
- `run`: runs offline here, in a fresh copy of the checkout, each file's blocks in order under `bash -euo pipefail`;
- `cluster`: needs an AWS account, the Pulumi CLI or the deployed cluster; shown, not run;
- `ci`: what CI itself runs (`make test` is the suite that runs this file).
A ```text output``` block right after a `run` block lists lines its output must hold, in order; a line `...`
stands for any lines.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, NamedTuple

import pytest
import yaml

from tests.conftest import ROOT, missing

DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SHELLS = {"sh", "bash"}
KINDS = {"run", "cluster", "ci"}
README_WORDS = 1200          # five minutes at 240 words a minute
# What a reader supplies to a `run` block: the README's personal stack opens its endpoint to MY_IP/32. The stand-in is
# in 198.18.0.0/15 (RFC 2544, benchmarking): no one's address, and not a documentation range, which a stack refuses.
READER = {"MY_IP": "198.18.0.7"}


class Block(NamedTuple):
    path: Path
    line: int                # of the opening fence, 1-based
    language: str
    kind: str
    text: str


def blocks(path: Path) -> List[Block]:
    found, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        opening = re.fullmatch(r"```(\S*)\s*(\S*)\s*", lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append(Block(path, i + 1, opening.group(1), opening.group(2), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


def where(block: Block) -> str:
    return f"{block.path.relative_to(ROOT)}:{block.line}"


def test_every_shell_block_says_whether_it_runs_offline():
    unmarked = [where(b) for path in DOCS for b in blocks(path) if b.language in SHELLS and b.kind not in KINDS]
    assert unmarked == [], f"mark each shell block `run`, `cluster` or `ci`: {unmarked}"
    stray = [where(b) for path in DOCS for b in blocks(path) if b.kind == "output" and b.language != "text"]
    assert stray == []


def test_ci_runs_what_the_readme_calls_the_test_command():
    (test_block,) = [b for b in blocks(ROOT / "README.md") if b.kind == "ci"]
    assert test_block.text.split("#")[0].strip() == "make test"
    assert re.search(r"^make test$", (ROOT / ".ci/run").read_text(), re.M)


def _checkout_copy(tmp_path: Path) -> Path:
    """The working tree as a fresh clone has it, sharing this checkout's .venv (already installed)."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", ".pytest_cache"))
    (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


# What a page's blocks may leave behind that is neither ignored nor a scratch file: the README's "Add a stack" writes
# the reader's own stack file, which they commit.
KEPT = {"stacks/Pulumi.dev-alice.yaml"}


def _files(root: Path) -> set:
    found = set()
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in (".venv", "__pycache__", ".pytest_cache")]
        found |= {str((Path(directory) / name).relative_to(root)) for name in names}
    return found


def not_ignored(paths) -> List[str]:
    """The paths (relative to the repository root) that .gitignore does not cover, sorted."""
    if shutil.which("git") is None:
        missing("git is not installed: the ignore rules cannot be read")
    paths = sorted(paths)
    found = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"], input="\n".join(paths),
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    return [path for path in paths if path not in set(found.stdout.splitlines())]


def _expect_lines(expected: str, output: str, block: Block) -> None:
    actual = [line.rstrip() for line in output.splitlines()]
    at = 0
    for wanted in expected.splitlines():
        if wanted.strip() == "...":
            continue
        try:
            at = actual.index(wanted.rstrip(), at) + 1
        except ValueError:
            pytest.fail(f"{where(block)}: the output has no line {wanted!r} (in order); it printed:\n{output}")


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.kind == "run" for b in blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run_offline_and_print_what_the_page_shows(path, tmp_path):
    if shutil.which("dot") is None and any(".svg" in b.text for b in blocks(path) if b.kind == "run"):
        missing(f"{path.name} draws an SVG and Graphviz's dot is not installed (.ci/run installs graphviz)")
    copy = _checkout_copy(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}, **READER}
    found, before = blocks(path), _files(copy)
    for i, block in enumerate(found):
        if block.kind != "run":
            continue
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=copy, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{where(block)} failed ({result.returncode}):\n{block.text}\n" \
                                       f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr, where(block)
        if i + 1 < len(found) and found[i + 1].kind == "output":
            _expect_lines(found[i + 1].text, result.stdout, found[i + 1])
    # Walking the page by hand leaves nothing `git status` would show as new: it writes into build/, a temporary
    # directory, or a path .gitignore covers.
    left = not_ignored(_files(copy) - before - KEPT)
    assert left == [], f"{path.relative_to(ROOT)}'s blocks leave files .gitignore does not cover: {left}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue        # https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", linked.read_text(), flags=re.S), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_a_five_minute_read_that_links_every_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    words = len(re.sub(r"```.*?```", "", readme, flags=re.S).split())
    assert words <= README_WORDS, f"README.md has {words} words outside code blocks; move detail to docs/"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    assert linked == {p.name for p in DOCS if p.parent.name == "docs"}


def test_the_readme_pool_example_is_a_valid_pool(tmp_path):
    from decisions.config.validate import load_stack_spec
    from tests.conftest import stack_config

    example, budget = [b for b in blocks(ROOT / "README.md") if b.language == "yaml"]
    pool = yaml.safe_load(example.text)[0]
    config = stack_config("dev")
    config["gpu-cloud:nodePools"] = config["gpu-cloud:nodePools"] + [pool]
    config.update(yaml.safe_load(budget.text))        # its budget acknowledges the pool's missing price
    keys = {k.split(":", 1)[1]: v for k, v in config.items() if k.startswith("gpu-cloud:")}
    spec = load_stack_spec(keys, stack="dev", region=config["aws:region"])
    assert [p.spec.name for p in spec.pools] == ["dev-gpu-spot", pool["name"]]


def test_the_readme_timings_are_the_measured_ones():
    """Each wait the README states is the one bench/RESULTS.md records for the reference machine."""
    row = re.compile(r"^\| `(make [a-z]+)` \| (first run|again) \| (\d+ s) \|", re.M)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    results = (ROOT / "bench/RESULTS.md").read_text(encoding="utf-8")
    claimed, measured = set(row.findall(readme)), set(row.findall(results[results.index("## First run"):]))
    assert {command for command, _, _ in claimed} == {"make plan", "make test"}
    assert claimed <= measured, claimed - measured


# --- docs/deploying.md: the deployer's page ------------------------------------------------------------------------
DEPLOYING = ROOT / "docs" / "deploying.md"
# Values in a stack file that stand for something of the deployer's own: an account ID (in ARNs), a transit gateway, a
# capacity reservation, the Pulumi organization of a peer stack, a domain or hosted zone, a network range. Every tag
# value is the deployer's too (gpu-cloud:tags).
DEPLOYER_VALUE_PATTERNS = (re.compile(r"(?<!\d)\d{12}(?!\d)"), re.compile(r"\btgw-[0-9a-f]+\b"),
                        re.compile(r"\bcr-[0-9a-f]+\b"), re.compile(r"^acme/"), re.compile(r"\bexample\.com\b"),
                        re.compile(r"^Z[0-9A-Z]{10,32}$"), re.compile(r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$"))


def deployer_values(config: dict) -> set:
    """(key path below gpu-cloud:, value) for each value of a stack file that is the deployer's own's config: list items of objects as
    `[i]`, a mapping key that is one (a label under the deployer's domain) under its mapping's path."""
    found = set()

    def walk(value, path, every=False):
        if isinstance(value, dict):
            for key, item in value.items():
                if any(p.search(str(key)) for p in DEPLOYER_VALUE_PATTERNS):
                    found.add((path, str(key)))
                walk(item, f"{path}.{key}", every)
        elif isinstance(value, list):
            for item in value:
                walk(item, f"{path}[i]" if isinstance(item, dict) else path, every)
        elif value is not None and (every or any(p.search(str(value)) for p in DEPLOYER_VALUE_PATTERNS)):
            found.add((path, str(value)))

    for key, value in config.items():
        if key.startswith("gpu-cloud:"):
            name = key.split(":", 1)[1]
            walk(value, name, every=name == "tags")
    return found


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^#{1,3} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def _table_rows(section: str) -> list:
    """The rows of a section's table whose first cell is a `key`: (key, [the backticked values of the second cell])."""
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if key:
            rows.append((key.group(1), re.findall(r"`([^`]+)`", cells[1]) if len(cells) > 1 else []))
    return rows


def values_to_replace_table(text: str) -> dict:
    return {key: set(values) for key, values in _table_rows(_section(text, "### Placeholders"))}


def test_deploying_lists_every_value_of_the_shipped_stacks_to_replace():
    """Each value a shipped stack file holds for something of the deployer's own (by DEPLOYER_VALUE_PATTERNS, and every
    tag) is in the page's table, on its key's row; and each row names a key the stack files set."""
    from tests.conftest import STACKS

    found = set()
    for stack in STACKS:
        raw = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))["config"]
        found |= deployer_values(raw)
    table = values_to_replace_table(DEPLOYING.read_text(encoding="utf-8"))
    missing_rows = sorted(f"{path}: {value}" for path, value in found if value not in table.get(path, set()))
    assert missing_rows == [], f"docs/deploying.md's table of values to replace misses: {missing_rows}"
    assert set(table) == {path for path, _ in found}, set(table) ^ {path for path, _ in found}


def test_the_search_finds_every_value_a_stack_names_of_its_own():
    """The patterns see an account in an ARN, a hosted zone, a label under a domain and every tag; not an instance type,
    a zone ID or a count."""
    config = {"aws:region": "us-east-1", "gpu-cloud:tags": {"team": "ml"},
              "gpu-cloud:cluster": {"adminRoleArns": ["arn:aws:iam::210987654321:role/admin"]},
              "gpu-cloud:dr": {"hostedZoneId": "Z0987654321ZYXWVUTSRQ", "domain": "a.example.com"},
              "gpu-cloud:nodePools": [{"name": "p", "instanceTypes": ["p5.48xlarge"], "availabilityZone": "use1-az1",
                                       "maxNodes": 4, "labels": {"example.com/team": "x"}}]}
    assert deployer_values(config) == {
        ("tags.team", "ml"), ("cluster.adminRoleArns", "arn:aws:iam::210987654321:role/admin"),
        ("dr.hostedZoneId", "Z0987654321ZYXWVUTSRQ"), ("dr.domain", "a.example.com"),
        ("nodePools[i].labels", "example.com/team")}


def _exported_keys(path: Path) -> set:
    """The keys `pulumi.export` is called with in a module (string literals)."""
    import ast

    keys = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "export" \
                and node.args and isinstance(node.args[0], ast.Constant):
            keys.add(node.args[0].value)
    return keys


def test_deploying_lists_every_stack_output(stack_runs):
    """The page's outputs table is what the program exports: every key layers.py exports, and every key a shipped
    stack's run has, with the model publisher's role (exported where inference.triton.publisherRoleArns is set) from
    a run that sets it."""
    from tests.conftest import run_stack, stack_config

    documented = {key for key, _ in _table_rows(_section(DEPLOYING.read_text(encoding="utf-8"), "## Stack outputs"))}
    inference = stack_config("prod-us-east-1")["gpu-cloud:inference"]
    publisher = run_stack("prod-us-east-1", {"gpu-cloud:inference": {**inference, "triton": {
        **inference["triton"], "publisherRoleArns": ["arn:aws:iam::123456789012:role/ml-platform-admin"]}}})
    exported = set(publisher.outputs).union(*(set(run.outputs) for run in stack_runs.values()))
    assert documented == exported, f"documented but not exported: {sorted(documented - exported)}; " \
                                   f"exported but not documented: {sorted(exported - documented)}"
    assert documented == _exported_keys(ROOT / "layers.py")
