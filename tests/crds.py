"""CRD schemas for tests, and a validator that, unlike the API server, reports unknown fields.

`crd_schema("mpijobs.kubeflow.org")` (or "kubeflow.org/mpijobs") returns the openAPIV3Schema of the storage
version (or `version`). It reads the CRDs from the directory GPU_CLOUD_CRD_DIR (any *.yaml there), else from the
pinned releases in the local mirror (git show <tag>:<path>): mpi-operator v0.8.0 for kubeflow.org, Kueue v0.19.2's
chart for kueue.x-k8s.io, JobSet v0.12.0 for jobset.x-k8s.io and kube-prometheus-stack 88.5.3's for
monitoring.coreos.com; else (CI has no mirror)
from the record tests/upstream/crd-schemas.json (see tests/upstream_records.py), pruned to the fields the tests
use. Run with GPU_CLOUD_CRD_USES=FILE, `validate_against_crd` appends each object it checks against a mirrored
schema to FILE: that is how scripts/upstream_records.py learns which fields to keep.

`validate_against_crd(obj, schema)` checks types, enums, required fields and the like with jsonschema, and flags
every field the schema does not name. The API server prunes unknown fields of a structural schema silently, so a
misspelt field would otherwise vanish without an error.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator, List, Optional

import yaml

from tests import upstream_records
from tests.conftest import missing

RECORD = "crd-schemas.json"
# group -> (repository, tag, path of the CRD file for a plural)
SOURCES = {
    "kubeflow.org": ("kubeflow/mpi-operator", "v0.8.0", lambda plural: "deploy/v2beta1/mpi-operator.yaml"),
    "kueue.x-k8s.io": ("kubernetes-sigs/kueue", "v0.19.2",
                       lambda plural: f"charts/kueue/templates/crd/kueue.x-k8s.io_{plural}.yaml"),
    # The CRD its release manifest (decisions/catalog/charts.yaml) is built from (Makefile `artifacts`: config/default).
    "jobset.x-k8s.io": ("kubernetes-sigs/jobset", "v0.12.0",
                        lambda plural: f"config/components/crd/bases/jobset.x-k8s.io_{plural}.yaml"),
    # prometheus-operator's CRDs as kube-prometheus-stack 88.5.3 installs them (its crds subchart).
    "monitoring.coreos.com": ("prometheus-community/helm-charts", "kube-prometheus-stack-88.5.3",
                              lambda plural: f"charts/kube-prometheus-stack/charts/crds/crds/crd-{plural}.yaml"),
}


class CrdSchema(dict):
    """An openAPIV3Schema that knows its CRD, version and where it was read: "dir", "mirror" or "record"."""

    def __init__(self, schema: dict, crd: str, version: str, origin: str):
        super().__init__(schema)
        self.crd, self.version, self.origin = crd, version, origin


def _crd_name(group_plural: str) -> str:
    """'kubeflow.org/mpijobs' or 'mpijobs.kubeflow.org' -> 'mpijobs.kubeflow.org'."""
    if "/" in group_plural:
        group, plural = group_plural.split("/", 1)
        return f"{plural}.{group}"
    return group_plural


def strip_helm(text: str) -> str:
    """A chart template as plain YAML: drop template comments and lines that are only template actions, and
    put the literal string "helm-value" where an expression sits inside a value (only in fields no schema test reads)."""
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", text, flags=re.S)
    lines = [line for line in text.splitlines() if not re.fullmatch(r"\s*\{\{.*\}\}\s*", line)]
    return re.sub(r"\{\{.*?\}\}", "helm-value", "\n".join(lines))


def _documents(text: str) -> Iterator[dict]:
    for doc in yaml.safe_load_all(strip_helm(text)):
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
            yield doc


def _from_dir(name: str) -> Optional[dict]:
    directory = os.environ.get("GPU_CLOUD_CRD_DIR")
    if not directory or not Path(directory).is_dir():
        return None
    for path in sorted(Path(directory).glob("*.y*ml")):
        for crd in _documents(path.read_text(encoding="utf-8")):
            if crd["metadata"]["name"] == name:
                return crd
    return None


def source(name: str):
    """(repository, tag, path) of a CRD's pinned file, or None for a group not pinned here."""
    plural, group = name.split(".", 1)
    if group not in SOURCES:
        return None
    repo, tag, path = SOURCES[group]
    return repo, tag, path(plural)


def from_mirror(name: str, mirror: Optional[Path] = None) -> Optional[dict]:
    pinned = source(name)
    text = upstream_records.show(*pinned, mirror=mirror) if pinned else None
    if text is None:
        return None
    return next((crd for crd in _documents(text) if crd["metadata"]["name"] == name), None)


def _chosen(versions: dict, group_plural: str, version: Optional[str]) -> str:
    chosen = [name for name, v in versions.items() if (name == version if version else v.get("storage"))]
    assert chosen, f"{group_plural}: no version {version or '(storage)'} among {sorted(versions)}"
    return chosen[0]


def crd_schema(group_plural: str, version: Optional[str] = None) -> CrdSchema:
    """The openAPIV3Schema of `version`, by default the storage version."""
    name = _crd_name(group_plural)
    for origin, found in (("dir", _from_dir(name)), ("mirror", from_mirror(name))):
        if found is not None:
            versions = {v["name"]: {"storage": v.get("storage", False), "schema": v["schema"]["openAPIV3Schema"]}
                        for v in found["spec"]["versions"]}
            chosen = _chosen(versions, group_plural, version)
            return CrdSchema(versions[chosen]["schema"], name, chosen, origin)
    recorded = upstream_records.record(RECORD)["crds"].get(name)
    if recorded is None:
        missing(f"CRD {name} is not in tests/upstream/{RECORD}, and neither GPU_CLOUD_CRD_DIR nor a mirror of its "
                f"source is here ({upstream_records.MIRROR}): set GPU_CLOUD_CRD_DIR to a directory of CRD YAML "
                f"files, or {upstream_records.RERECORD}")
    chosen = _chosen(recorded["versions"], group_plural, version)
    return CrdSchema(recorded["versions"][chosen]["schema"], name, chosen, "record")


def _as_json_schema(schema):
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema: int-or-string and nullable become types; x-kubernetes-*
    are annotations; objects that name their properties and neither preserve unknown fields nor declare
    additionalProperties get additionalProperties: false, which is what reports an unknown field."""
    if isinstance(schema, list):
        return [_as_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: (value if key in ("enum", "default", "example", "required") else _as_json_schema(value))
           for key, value in schema.items()
           if not key.startswith("x-kubernetes-") and key not in ("nullable", "properties")}
    if "properties" in schema:      # keyed by field name: every name is kept, whatever it looks like
        out["properties"] = {name: _as_json_schema(sub) for name, sub in schema["properties"].items()}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def validate_against_crd(obj: dict, schema: dict) -> None:
    """Raise AssertionError listing every violation (by path) of `obj` against a CRD's openAPIV3Schema."""
    import jsonschema

    origin = getattr(schema, "origin", None)
    uses = os.environ.get("GPU_CLOUD_CRD_USES")
    if uses and origin == "mirror":
        with open(uses, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"crd": schema.crd, "version": schema.version, "object": obj}) + "\n")
    validator = jsonschema.Draft7Validator(_as_json_schema(schema))
    errors: List[str] = [f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
                         for error in validator.iter_errors(obj)]
    hint = (f"\n(checked against tests/upstream/{RECORD}, which names only the fields the tests used when it was "
            f"made: if a field above is real, {upstream_records.RERECORD})" if origin == "record" else "")
    assert not errors, "\n".join(sorted(errors)) + hint
