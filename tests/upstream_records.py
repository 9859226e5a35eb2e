"""Facts the tests take from pinned upstream sources, recorded in tests/upstream/ so that they hold on every machine.

CI cannot fetch upstream repositories, so the checks that read them (prometheus-operator's, Kueue's and the MPI
Operator's CRD schemas, Kueue's Configuration fields, the pinned charts' values.yaml) read a record instead:
`scripts/upstream_records.py` writes it from local mirrors (git show <tag>:<path>, with the file's blob id) and, with
--check, holds it against them; where a mirror is present the tests read the source itself instead of the record.

Records, each with its sources' repository, tag, path and blob:
- crd-schemas.json: each CRD version's openAPIV3Schema without descriptions, pruned to the fields the tests'
  objects use (an object that uses another field fails until the record is made again, from the source);
- kueue-configuration-fields.json: the JSON field names Kueue's config API declares;
- gpu-config-fields.json: the JSON field names of the device plugin's and mig-parted's config APIs (GO_CONFIG_SOURCES);
- chart-values/<chart>-<version>.yaml: each pinned chart's own values.yaml without its prose (`without_prose`: every
  key, value and commented-out key on its own line, the authors' comments left out), for the charts
  decisions/catalog/charts.yaml pins and the subcharts decisions/observability/monitoring.py and
  decisions/platform/gpu_operator.py set values in, indexed with its source (and the source's blob) in
  chart-values.json; tests/chart_values.py holds every Helm value the program sets against them;
- al2023-units.json: the EKS AL2023 AMI's boot units (nodeadm-config, nodeadm-run, kubelet, nvidia-kmod-load) as
  the AMI installs them, for the sandbox the node gate boots in.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import yaml

RECORDS = Path(__file__).resolve().parent / "upstream"
# Where mirrors of upstream repositories are (DIR/<owner>+<name>/repo); GPU_CLOUD_MIRROR=/nonexistent shows what CI sees.
MIRROR = Path(os.environ.get("GPU_CLOUD_MIRROR", "/work/.mirror"))
RERECORD = "make the record again from the source: .venv/bin/python scripts/upstream_records.py"
CHART_VALUES_DIR = RECORDS / "chart-values"
CHART_VALUES_INDEX = "chart-values.json"


def chart_values_name(chart: str, version: str) -> str:
    return f"{chart}-{version}.yaml"


def pinned_charts() -> List[Tuple[str, str]]:
    """(chart, version) of every chart the program installs (decisions/catalog/charts.yaml) and of each subchart it sets
    values in (decisions/observability/monitoring.py SUBCHARTS, decisions/platform/gpu_operator.py
    NFD_SUBCHART_VERSION), sorted."""
    from decisions.catalog import charts
    from decisions.observability import monitoring
    from decisions.platform import gpu_operator

    pins = {(pin.chart, pin.version) for pin in charts.load_charts().charts.values()}
    pins |= set(monitoring.SUBCHARTS.items()) | {("node-feature-discovery", gpu_operator.NFD_SUBCHART_VERSION)}
    return sorted(pins)


# Comment lines recorded as they are, each a fact the chart states only in a comment and a test reads.
CHART_COMMENT_LINES = {
    ("aws-load-balancer-controller", "3.5.0"): (519,),   # loadBalancerClass's default, service.k8s.aws/nlb
}
# A commented-out key with at most one value token ("#   interval: 15s", "# config:"): a value the chart documents but
# does not set, which tests read; any other comment line is the chart authors' prose and is not recorded.
_COMMENTED_KEY = re.compile(r"^\s*#\s*[A-Za-z0-9_.\-/\"']+:(\s+\S+)?\s*$")
_TRAILING_COMMENT = re.compile(r"\s+#.*$")


_BLOCK_SCALAR_START = re.compile(r"^(\s*)(?:- |[^#]*?:\s+)[|>][-+0-9]*\s*(#.*)?$")


def _in_block_scalar(lines: List[str]) -> List[bool]:
    """For each line, whether it is text of a literal or folded block (where "#" is content, not a comment)."""
    inside, indent, result = False, 0, []
    for line in lines:
        if inside and line.strip() and len(line) - len(line.lstrip()) <= indent:
            inside = False
        result.append(inside)
        start = None if inside else _BLOCK_SCALAR_START.match(line)
        if start:
            inside, indent = True, len(start.group(1))
    return result


def without_prose(text: str, keep: Tuple[int, ...] = ()) -> str:
    """A chart's values.yaml with its prose left out and nothing else changed: comment lines blanked (so every key
    keeps its line number) except commented-out keys, and trailing comments dropped where the parsed values stay the
    same; the comment lines numbered in `keep` (1-based) stay, for a fact a chart states only in a comment. Raises
    ValueError if the result does not parse to exactly the source's values."""
    source_lines = text.splitlines()
    lines = [("" if line.lstrip().startswith("#") and not _COMMENTED_KEY.match(line) and not in_block
              and number not in keep else line)
             for number, (line, in_block) in enumerate(zip(source_lines, _in_block_scalar(source_lines)), start=1)]
    source = yaml.safe_load(text)
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("#") and _TRAILING_COMMENT.search(line):
            trial = lines[:i] + [_TRAILING_COMMENT.sub("", line)] + lines[i + 1:]
            try:
                same = yaml.safe_load("\n".join(trial) + "\n") == source
            except yaml.YAMLError:
                same = False
            if same:
                lines = trial
    result = "\n".join(line.rstrip() for line in lines) + "\n"
    if yaml.safe_load(result) != source:
        raise ValueError("leaving the prose out changed the values")
    return result


# Go config APIs the GPU operator's operands read, whose JSON field names the tests hold the program's configs to:
# the device plugin's config v1 at the operator's plugin tag, mig-parted's config v1 at the MIG manager's tag.
GO_CONFIG_SOURCES = (
    ("NVIDIA/k8s-device-plugin", "v0.20.0", "api/config/v1/config.go"),
    ("NVIDIA/k8s-device-plugin", "v0.20.0", "api/config/v1/sharing.go"),
    ("NVIDIA/k8s-device-plugin", "v0.20.0", "api/config/v1/replicas.go"),
    ("NVIDIA/k8s-device-plugin", "v0.20.0", "api/config/v1/flags.go"),
    ("NVIDIA/mig-parted", "v0.15.0", "api/spec/v1/spec.go"),
)
GO_CONFIG_FIELDS = "gpu-config-fields.json"


def go_field_names(source: str) -> Set[str]:
    """The JSON names a Go file's struct tags declare (`json:"name,omitempty"`), hyphenated ones included
    (`json:"mig-configs"`); `json:"-"` (a field left out of JSON) names none."""
    return set(re.findall(r'json:"([A-Za-z][A-Za-z-]*)[,"]', source))


def recorded_go_fields(repo: str, tag: str, path: str) -> Set[str]:
    """The JSON field names `path` declared at `tag`, from the record (scripts/upstream_records.py --check holds it
    against the source)."""
    for entry in record(GO_CONFIG_FIELDS)["files"]:
        if (entry["repo"], entry["tag"], entry["path"]) == (repo, tag, path):
            return set(entry["fields"])
    raise KeyError(f"{repo} {tag}:{path} is not in {GO_CONFIG_FIELDS}: add it to GO_CONFIG_SOURCES; {RERECORD}")


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's content (`git hash-object`): SHA-1 over "blob <size>\\0" and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_dir(repo: str, mirror: Optional[Path] = None) -> Path:
    """'kubernetes-sigs/kueue' -> its mirror's git directory."""
    return (mirror or MIRROR) / repo.replace("/", "+") / "repo"


def show(repo: str, tag: str, path: str, mirror: Optional[Path] = None) -> Optional[str]:
    """The file at the tag in the repository's mirror, or None without a mirror (or without the file)."""
    directory = git_dir(repo, mirror)
    if not directory.is_dir():
        return None
    shown = subprocess.run(["git", "--git-dir", str(directory), "show", f"{tag}:{path}"], capture_output=True,
                           text=True)
    return None if shown.returncode else shown.stdout


def blob(repo: str, tag: str, path: str, mirror: Optional[Path] = None) -> str:
    found = subprocess.run(["git", "--git-dir", str(git_dir(repo, mirror)), "rev-parse", f"{tag}:{path}"],
                           capture_output=True, text=True, check=True)
    return found.stdout.strip()


def record(name: str) -> Dict[str, Any]:
    """A record in tests/upstream/ by file name."""
    return json.loads((RECORDS / name).read_text(encoding="utf-8"))


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def prune(schema: Any, values: list) -> Any:
    """An openAPIV3Schema without descriptions, naming only the properties some of `values` (objects at this node)
    use. Everything else a property's schema says (type, enum, required, formats, int-or-string, ...) is kept."""
    if not isinstance(schema, dict):
        return schema
    out: Dict[str, Any] = {}
    for key, sub in schema.items():
        if key == "description":
            continue
        if key == "properties":
            maps = [value for value in values if isinstance(value, dict)]
            out[key] = {name: prune(child, [m[name] for m in maps if name in m])
                        for name, child in sub.items() if any(name in m for m in maps)}
        elif key == "items" and isinstance(sub, dict):
            out[key] = prune(sub, [item for value in values if isinstance(value, list) for item in value])
        elif key == "additionalProperties" and isinstance(sub, dict):
            out[key] = prune(sub, [item for value in values if isinstance(value, dict) for item in value.values()])
        else:
            out[key] = without_descriptions(sub)
    return out
