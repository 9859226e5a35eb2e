"""Record what each public source of the dashboards' metric names states, so the tests can hold
decisions/observability/dashboards/metrics.yaml against it on any machine.

    .venv/bin/python scripts/metric_sources.py [--clones DIR] [--check]

For each source in metrics.yaml (except gpu-cloud's own verifier), reads the file at its recorded commit from a
local clone (DIR/<owner>+<name>/repo; default /work/.mirror), checks that the commit is the tag's and the file the
recorded blob, parses the metric names and types it states, and writes them with the blob to
decisions/observability/dashboards/source_names.yaml. With --check it writes nothing and exits 1 when that file is not
what the sources state. Needs git and the clones; not run by the tests, which test the parser on samples.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping

import yaml

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "decisions/observability/dashboards/metrics.yaml"
SNAPSHOT = ROOT / "decisions/observability/dashboards/source_names.yaml"
OWN = "gpu-cloud"            # the verifier's names are held against userdata/gpu_verify.py directly
HEADER = ("# Metric names and types as each public source in metrics.yaml states them, with the file's git blob id.\n"
          "# Written by scripts/metric_sources.py from clones of the sources; do not edit by hand.\n")


class SourceError(Exception):
    pass


def stated(text: str, fmt: str) -> Dict[str, str]:
    """Metric name -> exposition type as the source text states it ("" where it states none)."""
    if fmt in ("dcgm-csv", "dcgm-csv-commented"):
        # The counters CSV: "DCGM_FI_DEV_GPU_UTIL, gauge, help"; commented out, the same after "#".
        pattern = r"^\s*(DCGM_\w+)\s*,\s*(\w+)\s*," if fmt == "dcgm-csv" else r"^#\s*(DCGM_\w+)\s*,\s*(\w+)\s*,"
        return dict(re.findall(pattern, text, re.M))
    if fmt == "markdown-backticks":       # Triton's metrics guide names each metric in backticks, no type
        return {name: "" for name in re.findall(r"`(nv_\w+)`", text)}
    if fmt == "markdown-table":           # kube-state-metrics: | name | Type | ...
        return {name: kind.lower() for name, kind in re.findall(r"^\|\s*(kube_\w+)\s*\|\s*(\w+)\s*\|", text, re.M)}
    if fmt == "go-quoted":                # NTH's tests: expected series "name{labels}" and gauge names "nth_..."
        return {name: "" for name in re.findall(r'"([a-z][a-z0-9_]*)\{', text) + re.findall(r'"(nth_\w+)"', text)}
    if fmt == "go-prometheus":            # Kueue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem:
        # constants.KueueName, Name: "pending_workloads" -> kueue_pending_workloads (constants.KueueName is "kueue",
        # MultiKueueName "multikueue": pkg/constants/constants.go)
        found = re.findall(r'prometheus\.New(Counter|Gauge|Histogram|Summary)(?:Vec)?\(\s*prometheus\.\w+Opts\{\s*'
                           r'Subsystem:\s*constants\.(\w+)Name,\s*Name:\s*"(\w+)"', text)
        return {f"{subsystem.lower()}_{name}": kind.lower() for kind, subsystem, name in found}
    raise SourceError(f"unknown source format {fmt!r}")


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True)


def source_text(git_dir: Path, key: str, source: Mapping[str, Any]) -> str:
    """The source's file at its recorded commit, after checking the tag still names that commit and the file is
    the recorded blob."""
    blob = _git(git_dir, "rev-parse", f"{source['commit']}:{source['path']}")
    if blob.returncode:
        raise SourceError(f"{key}: {source['repo']} clone at {git_dir} lacks {source['commit']}:{source['path']}")
    if blob.stdout.strip() != source["blob"]:
        raise SourceError(f"{key}: {source['path']} at {source['commit']} is blob {blob.stdout.strip()}, "
                          f"not the recorded {source['blob']}")
    if source.get("ref"):
        tag = _git(git_dir, "rev-parse", f"{source['ref']}^{{commit}}")
        if tag.returncode or tag.stdout.strip() != source["commit"]:
            raise SourceError(f"{key}: tag {source['ref']} no longer names {source['commit']}")
    return _git(git_dir, "cat-file", "-p", source["blob"]).stdout


def snapshot(sources: Mapping[str, Mapping[str, Any]], clones: Path) -> Dict[str, Any]:
    out = {}
    for key, source in sources.items():
        if source["repo"] == OWN:
            continue
        git_dir = clones / source["repo"].replace("/", "+") / "repo"
        if not git_dir.is_dir():
            raise SourceError(f"{key}: no clone of {source['repo']} at {git_dir}")
        names = stated(source_text(git_dir, key, source), source["format"])
        out[key] = {"blob": source["blob"], "names": dict(sorted(names.items()))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clones", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--check", action="store_true", help="compare with the recorded file; write nothing")
    args = parser.parse_args()
    try:
        fresh = snapshot(yaml.safe_load(TABLE.read_text())["sources"], args.clones)
    except SourceError as error:
        print(f"metric_sources: {error}", file=sys.stderr)
        return 2
    if args.check:
        same = yaml.safe_load(SNAPSHOT.read_text()) == fresh
        print(f"{SNAPSHOT.relative_to(ROOT)}: {'as the sources state' if same else 'differs from the sources'}")
        return 0 if same else 1
    SNAPSHOT.write_text(HEADER + yaml.safe_dump(fresh, sort_keys=False, width=120))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}: {sum(len(s['names']) for s in fresh.values())} names "
          f"from {len(fresh)} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
