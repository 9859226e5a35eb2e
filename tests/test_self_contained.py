"""The product stands on its own: a clone has everything its docs, comments, output and tests refer to.

What users rely on: no page, comment or printed line sends them to material outside the repository (the notes the
project was built from, a reference directory next to the clone); facts cite their public primary sources instead.
The tests read the pinned charts' values.yaml from the repository's own record (tests/upstream/chart-values/): each
chart's file at its release tag without the authors' prose (every key and value, and each commented-out key, on its
source line; the comment lines blanked). Walking the docs leaves nothing `git status` shows as new.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import List, Tuple

import pytest
import yaml

from tests import upstream_records
from tests.conftest import ROOT, missing
from tests.test_docs import DOCS, KEPT, blocks, not_ignored, where

# References to material a clone does not have, each with what to write instead. The expressions are written so that
# this file does not match them itself (`\s+`, `\.`).
OUTSIDE: List[Tuple[str, str]] = [
    (r"(?i)\bthe\s+seeds\b|\bseeds'", "name the design requirement in words"),
    (r"gpu-facts\.md|\binstances\.md\b", "cite the public primary source (repository at tag and path, or doc page)"),
    (r"\.\./shared\b|\bshared/(reference|chartvalues)\b|/work/share[d]\b",
     "cite the public primary source; tests read records under tests/upstream/"),
    (r"\bdesign/architecture\.md\b", "docs/architecture.md is the repository's own"),
    (r"(?i)\bvetted\s+(reference|facts|tables?)\b|\bbeside\s+the\s+checkout\b", "cite the public primary source"),
]
# Records that quote upstream files verbatim (scripts/upstream_records.py writes them): their words are upstream's.
VERBATIM = ("tests/upstream/",)


def outside_references(text: str) -> List[Tuple[int, str, str]]:
    """(line, the text that matched, what to write instead) for each reference to material outside the repository."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, instead in OUTSIDE:
            found += [(number, match.group(0), instead) for match in re.finditer(pattern, line)]
    return found


def repository_files(*, new: bool = True) -> List[str]:
    """What a commit would hold: tracked files and (with `new`) new ones .gitignore does not cover."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        missing("git or the repository's .git is not here: cannot list the repository's files")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "-z"]
                            + (["--others", "--exclude-standard"] if new else []),
                            capture_output=True, text=True, check=True)
    return sorted({name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file()})


# --- no reference to material outside the repository ----------------------------------------------------------------

@pytest.mark.parametrize("text", [
    # Split so that this file does not hold the references it tests for.
    "Defaults are the se" + "eds' figures",
    "The se" + "eds' hot tier",
    "the se" + "eds ask for more than 500K",
    "(see ../sh" + "ared/reference/inst" + "ances.md)",
    "gpu-fa" + "cts.md: fail on uncorrected volatile > 0",
    "values files (`../sh" + "ared/chartvalues`)",
    "Path('/work/sh" + "ared/chartvalues/values')",
    "sh" + "ared/reference/gpu-fa" + "cts.md, EFA section",
    "the brief's des" + "ign/architecture.md",
    "from the vet" + "ted reference table",
    "the vet" + "ted tables",
    "reference data beside the che" + "ckout",
])
def test_each_kind_of_outside_reference_is_found(text):
    assert outside_references(text), text


@pytest.mark.parametrize("text", [
    "plans every stack twice in separate processes (different hash seeds)",
    "seed = f'{args.typ}::{args.name}'",
    "see [the architecture](docs/architecture.md) and the EC2 User Guide",
    "tests/upstream/chart-values/gpu-operator-v26.7.0.yaml",
    "the hot tier's design target of more than 500K random read IOPS",
])
def test_ordinary_text_is_not_an_outside_reference(text):
    assert outside_references(text) == []


def test_no_file_refers_to_material_outside_the_repository():
    found = []
    for name in repository_files():
        if name.startswith(VERBATIM):
            continue
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue        # binary
        found += [f"{name}:{line}: {match!r} ({instead})" for line, match, instead in outside_references(text)]
    assert found == [], "references to material a clone does not have:\n" + "\n".join(found)


# --- the chart values the tests hold Helm values against -------------------------------------------------------------

def test_every_pinned_chart_has_a_values_record_indexed_with_its_source_and_without_prose():
    """Each pinned chart has one values record, indexed with its source (repository, tag, path, blob), unchanged since
    the script wrote it, and holding no prose. That the record is what the source gives now is
    test_upstream_records.py's (scripts/upstream_records.py --check)."""
    index = upstream_records.record(upstream_records.CHART_VALUES_INDEX)["charts"]
    expected = {upstream_records.chart_values_name(chart, version): (chart, version)
                for chart, version in upstream_records.pinned_charts()}
    assert {name: (entry["chart"], entry["version"]) for name, entry in index.items()} == expected, \
        upstream_records.RERECORD
    recorded = {path.name for path in upstream_records.CHART_VALUES_DIR.glob("*.yaml")}
    assert recorded == set(expected), upstream_records.RERECORD
    for name, entry in index.items():
        assert set(entry) == {"chart", "version", "repo", "tag", "path", "blob", "recordedBlob"}
        assert entry["path"].endswith("/values.yaml") and entry["repo"].count("/") == 1
        # The file is the one the script wrote (its blob id is in the index, written in the same run): not edited
        # by hand since.
        data = (upstream_records.CHART_VALUES_DIR / name).read_bytes()
        assert upstream_records.git_blob_id(data) == entry["recordedBlob"], \
            f"{name} is not the file the index was written with: {upstream_records.RERECORD}"
        # Without the authors' prose: a comment line left is a commented-out key.
        kept = upstream_records.CHART_COMMENT_LINES.get((entry["chart"], entry["version"]), ())
        prose = [line for number, line in enumerate(data.decode().splitlines(), start=1)
                 if line.lstrip().startswith("#") and not upstream_records._COMMENTED_KEY.match(line)
                 and number not in kept]
        assert prose == [] or all(_inside_block(data.decode(), line) for line in prose), (name, prose[:3])


def _inside_block(text, line):
    lines = text.splitlines()
    return all(inside for text_line, inside in zip(lines, upstream_records._in_block_scalar(lines)) if text_line == line)


def test_the_record_leaves_prose_out_and_keeps_every_value_and_line():
    source = ("# The chart's own words\nreplicas: 1  # how many\nconfig: |\n  # kept: content\n  a: b\n"
              "# metrics:\n#   interval: 15s\nname: \"a # b\"\n")
    recorded = upstream_records.without_prose(source)
    assert recorded.splitlines() == ["", "replicas: 1", "config: |", "  # kept: content", "  a: b",
                                     "# metrics:", "#   interval: 15s", 'name: "a # b"']
    assert yaml.safe_load(recorded) == yaml.safe_load(source)


def test_git_blob_id_is_gits():
    # `printf "" | git hash-object --stdin` and the same for "hello\n", as git 2.x prints them.
    assert upstream_records.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert upstream_records.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


# --- walking the docs leaves nothing new -----------------------------------------------------------------------------

# A path a run block writes: after `>`, `>>` or `tee`, or as the value of --json, --diagram, -o or --output.
WRITES = re.compile(r"(?:>>?|\btee\s+(?:-a\s+)?|--json\s+|--diagram\s+|-o\s+|--output\s+)\s*([^\s;|&()]+)")


def written_paths(text: str) -> List[str]:
    """The files a shell block writes inside the checkout (not /dev/null, not under a temporary directory held in a
    variable, not a descriptor)."""
    paths = []
    for line in text.splitlines():
        for target in WRITES.findall(line.split(" #")[0]):
            target = target.strip("\"'")
            if target.startswith(("/", "$", "&")) or target.isdigit() or target == "-":
                continue
            paths.append(target)
    return paths


@pytest.mark.parametrize("text,paths", [
    (".venv/bin/python -m plan dev > build/dev-plan.txt", ["build/dev-plan.txt"]),
    ("sed 's/a/b/' stacks/Pulumi.dev.yaml > broken.yaml", ["broken.yaml"]),
    ("make plan STACK=dev JSON=plan.json DIAGRAM=dev.svg", []),
    ("python -m plan dev --json before.json > /dev/null", ["before.json"]),
    ("python -m plan x --diagram docs/x.svg 2>&1", ["docs/x.svg"]),
    ('sed s/a/b/ x > "$d/Pulumi.dev.yaml"', []),
    ("python -m plan dev 2>&1 | tee -a log.txt", ["log.txt"]),
])
def test_written_paths_are_read_from_redirections_and_output_flags(text, paths):
    assert written_paths(text) == paths


def test_every_file_a_runnable_block_writes_is_ignored_or_kept():
    # make's JSON= and DIAGRAM= name files as the plan's --json and --diagram do.
    written = []
    for path in DOCS:
        for block in blocks(path):
            if block.kind == "run":
                text = re.sub(r"\bJSON=(\S+)", r"--json \1", re.sub(r"\bDIAGRAM=(\S+)", r"--diagram \1", block.text))
                written += [(where(block), target) for target in written_paths(text)]
    tracked = set(repository_files(new=False))
    uncovered = set(not_ignored({target for _, target in written} - KEPT - tracked))
    assert [f"{at}: {target}" for at, target in written if target in uncovered] == []
