"""Facts the tests take from pinned upstream sources, recorded in tests/upstream/ so that they hold on every machine.

CI cannot fetch upstream repositories, so the checks that read them (prometheus-operator's, Kueue's and the MPI
Operator's CRD schemas, Kueue's Configuration fields, the FSx CSI chart's values) read a record instead:
`scripts/upstream_records.py` writes it from local mirrors (git show <tag>:<path>, with the file's blob id) and, with
--check, holds it against them; where a mirror is present the tests read the source itself instead of the record.

Records, each with its sources' repository, tag, path and blob:
- crd-schemas.json: each CRD version's openAPIV3Schema without descriptions, pruned to the fields the tests'
  objects use (an object that uses another field fails until the record is made again, from the source);
- kueue-configuration-fields.json: the JSON field names Kueue's config API declares;
- fsx-csi-driver-values.json: every key path of the chart's values.yaml (not into lists) with its line;
- al2023-units.json: the EKS AL2023 AMI's boot units (nodeadm-config, nodeadm-run, kubelet, nvidia-kmod-load) as
  the AMI installs them, for the sandbox the node gate boots in.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, Optional, Set

import yaml

RECORDS = Path(__file__).resolve().parent / "upstream"
# Where mirrors of upstream repositories are (DIR/<owner>+<name>/repo); GPU_CLOUD_MIRROR=/nonexistent shows what CI sees.
MIRROR = Path(os.environ.get("GPU_CLOUD_MIRROR", "/work/.mirror"))
RERECORD = "make the record again from the source: .venv/bin/python scripts/upstream_records.py"


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


def go_json_fields(source: str) -> Set[str]:
    """The JSON names a Go file's struct tags declare (`json:"name,omitempty"`)."""
    return set(re.findall(r'json:"([A-Za-z]+)[,"]', source))


def yaml_key_lines(text: str) -> Dict[str, int]:
    """Each key path of a YAML document's mappings ("controller.nodeSelector"), not into lists -> its line."""
    lines: Dict[str, int] = {}

    def walk(node, prefix):
        for key, value in node.value:
            path = f"{prefix}{key.value}"
            lines[path] = key.start_mark.line + 1
            if isinstance(value, yaml.MappingNode):
                walk(value, path + ".")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if isinstance(root, yaml.MappingNode):
        walk(root, "")
    return lines


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
