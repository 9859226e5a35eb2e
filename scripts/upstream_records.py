"""Write tests/upstream/: the facts the tests take from pinned upstream sources (tests/upstream_records.py says
which), read from local mirrors, so that CI, which cannot fetch them, checks against the same facts.

    .venv/bin/python scripts/upstream_records.py [--mirror DIR] [--check]

DIR holds the mirrors as <owner>+<name>/repo git directories (default: $GPU_CLOUD_MIRROR or /work/.mirror), made with
`git clone --mirror https://github.com/<owner>/<name> DIR/<owner>+<name>/repo`. Each pinned chart's values.yaml is
recorded without its prose (tests/upstream_records.py without_prose) into tests/upstream/chart-values/ from the
source CHART_SOURCES names (a chart pinned without one is
an error), after checking that the tag's Chart.yaml carries the pinned version. The CRD
schemas are pruned to the fields the tests' objects use: the script runs the tests that validate custom resources
(about a minute) with GPU_CLOUD_CRD_USES set, and keeps each used field's whole schema and nothing else. With
--check it writes nothing and exits 1 when a record is not what the sources and the tests give now: that is how a
record is held against its source. Needs git and the mirrors, so the tests (and CI) do not run it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import crds, upstream_records  # noqa: E402

KUEUE = ("kubernetes-sigs/kueue", "v0.19.2", "apis/config/v1beta2/configuration_types.go")
# The AMI's boot units the gate's own unit hooks into (tests/test_bootstrap.py boots a sandbox with them), at the
# default AMI release (decisions/nodes/amis.yaml).
AL2023_UNITS = ("awslabs/amazon-eks-ami", "v20260714", {
    "nodeadm-config.service": "templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-config.service",
    "nodeadm-run.service": "templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service",
    "kubelet.service": "templates/al2023/runtime/rootfs/etc/systemd/system/kubelet.service",
    "nvidia-kmod-load.service": "templates/al2023/runtime/gpu/nvidia-kmod-load.service"})
# The pinned charts' own values.yaml (decisions/catalog/charts.yaml, and the subcharts
# decisions/observability/monitoring.py and decisions/platform/gpu_operator.py set values in), which
# tests/chart_values.py holds every Helm value against: (chart, version) -> (repository, the release tag or commit that
# version was packaged from, the chart's directory). Recorded one file each without the authors' prose
# (tests/upstream_records.py without_prose: keys, values and commented-out keys, each on its source line), so that a
# value's file:line holds in the record as in the source.
CHART_SOURCES = {
    ("aws-node-termination-handler", "0.27.1"): (
        "aws/aws-node-termination-handler", "v1.25.1", "config/helm/aws-node-termination-handler"),
    ("cluster-autoscaler", "9.59.0"): ("kubernetes/autoscaler", "cluster-autoscaler-chart-9.59.0",
                                       "cluster-autoscaler/charts/cluster-autoscaler"),
    # Chart.yaml in git carries a development version; release CI writes the tag's (decisions/catalog/charts.yaml).
    ("gpu-operator", "v26.7.0"): ("NVIDIA/gpu-operator", "v26.7.0", "deployments/gpu-operator"),
    ("node-feature-discovery", "0.19.0"): ("kubernetes-sigs/node-feature-discovery", "v0.19.0",
                                           "deployment/helm/node-feature-discovery"),
    # aws/eks-charts has no per-chart tags: the commit that set version v0.5.30.
    ("aws-efa-k8s-device-plugin", "v0.5.30"): ("aws/eks-charts", "bfe91c4b9257c80f754ad4b3d6a9a3c239b2b8ec",
                                               "stable/aws-efa-k8s-device-plugin"),
    ("kueue", "0.19.2"): ("kubernetes-sigs/kueue", "v0.19.2", "charts/kueue"),
    ("aws-fsx-csi-driver", "1.17.0"): ("kubernetes-sigs/aws-fsx-csi-driver", "helm-chart-aws-fsx-csi-driver-1.17.0",
                                       "charts/aws-fsx-csi-driver"),
    ("kube-prometheus-stack", "88.5.3"): ("prometheus-community/helm-charts", "kube-prometheus-stack-88.5.3",
                                          "charts/kube-prometheus-stack"),
    ("kube-state-metrics", "8.4.0"): ("prometheus-community/helm-charts", "kube-state-metrics-8.4.0",
                                      "charts/kube-state-metrics"),
    ("prometheus-node-exporter", "4.56.1"): ("prometheus-community/helm-charts", "prometheus-node-exporter-4.56.1",
                                             "charts/prometheus-node-exporter"),
    ("grafana", "12.11.1"): ("grafana-community/helm-charts", "grafana-12.11.1", "charts/grafana"),
    ("prometheus-adapter", "5.3.0"): ("prometheus-community/helm-charts", "prometheus-adapter-5.3.0",
                                      "charts/prometheus-adapter"),
    ("aws-load-balancer-controller", "3.5.0"): ("kubernetes-sigs/aws-load-balancer-controller", "v3.5.0",
                                                "helm/aws-load-balancer-controller"),
}
# Charts whose Chart.yaml in git does not carry the released version (stamped by release CI).
CHART_VERSION_STAMPED = {"gpu-operator", "node-feature-discovery"}
# The tests that validate custom resources against their CRDs (tests/crds.py validate_against_crd), less the one
# that tests the loader on the record itself.
CRD_TESTS = ("tests/test_acceptance.py", "tests/test_jobs.py", "tests/test_jobset.py", "tests/test_mpijob.py",
             "tests/test_monitoring.py", "tests/test_training.py",
             "--deselect", "tests/test_acceptance.py::test_crd_loader_and_validator")


class RecordError(Exception):
    pass


def _source(repo: str, tag: str, path: str, mirror: Path) -> Tuple[Dict[str, str], str]:
    text = upstream_records.show(repo, tag, path, mirror=mirror)
    if text is None:
        raise RecordError(f"{repo} {tag}:{path} is not in {upstream_records.git_dir(repo, mirror)}")
    return {"repo": repo, "tag": tag, "path": path, "blob": upstream_records.blob(repo, tag, path, mirror)}, text


def _go_fields(repo: str, tag: str, path: str, mirror: Path) -> Dict[str, Any]:
    """A Go file's source and the JSON field names its struct tags declare."""
    where, text = _source(repo, tag, path, mirror)
    return {**where, "fields": sorted(upstream_records.go_field_names(text))}


def kueue_fields(mirror: Path) -> Dict[str, Any]:
    return _go_fields(*KUEUE, mirror)


def gpu_config_fields(mirror: Path) -> Dict[str, Any]:
    return {"files": [_go_fields(repo, tag, path, mirror) for repo, tag, path in upstream_records.GO_CONFIG_SOURCES]}


def chart_values(mirror: Path) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The index (per values file: chart, version, repository, tag, path, the source's blob and the recorded file's)
    and the files themselves, without the charts' prose."""
    index: Dict[str, Any] = {}
    files: Dict[str, str] = {}
    for chart, version in upstream_records.pinned_charts():
        if (chart, version) not in CHART_SOURCES:
            raise RecordError(f"chart {chart} {version} is pinned but has no source in CHART_SOURCES "
                              "(scripts/upstream_records.py): add its repository, release tag and directory")
        repo, tag, directory = CHART_SOURCES[chart, version]
        if chart not in CHART_VERSION_STAMPED:
            _, meta = _source(repo, tag, f"{directory}/Chart.yaml", mirror)
            found = yaml.safe_load(meta).get("version")
            if str(found) != version:
                raise RecordError(f"{repo} {tag}:{directory}/Chart.yaml has version {found}, not {version}")
        where, text = _source(repo, tag, f"{directory}/values.yaml", mirror)
        name = upstream_records.chart_values_name(chart, version)
        keep = upstream_records.CHART_COMMENT_LINES.get((chart, version), ())
        files[name] = upstream_records.without_prose(text, keep)
        index[name] = {"chart": chart, "version": version, **where,
                       "recordedBlob": upstream_records.git_blob_id(files[name].encode())}
    return {"charts": index}, files


def al2023_units(mirror: Path) -> Dict[str, Any]:
    repo, tag, paths = AL2023_UNITS
    units = {}
    for unit, path in paths.items():
        where, text = _source(repo, tag, path, mirror)
        units[unit] = {"path": path, "blob": where["blob"], "text": text}
    return {"repo": repo, "tag": tag, "units": units}


def crd_uses(mirror: Path) -> List[Dict[str, Any]]:
    """Every object the CRD tests validate against a mirrored schema: {crd, version, object}."""
    with tempfile.TemporaryDirectory() as scratch:
        uses = Path(scratch) / "uses.jsonl"
        env = {**os.environ, "GPU_CLOUD_CRD_USES": str(uses), "GPU_CLOUD_MIRROR": str(mirror)}
        env.pop("GPU_CLOUD_CRD_DIR", None)
        ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *CRD_TESTS],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if ran.returncode:
            raise RecordError(f"the CRD tests failed against the mirrored schemas:\n{ran.stdout[-3000:]}")
        return [json.loads(line) for line in uses.read_text(encoding="utf-8").splitlines()] if uses.exists() else []


def crd_schemas(mirror: Path) -> Dict[str, Any]:
    objects: Dict[Tuple[str, str], list] = {}
    for use in crd_uses(mirror):
        objects.setdefault((use["crd"], use["version"]), []).append(use["object"])
    out: Dict[str, Any] = {}
    for crd_name in sorted({name for name, _ in objects}):
        where, _ = _source(*crds.source(crd_name), mirror)
        full = crds.from_mirror(crd_name, mirror)
        versions = {v["name"]: v for v in full["spec"]["versions"]}
        out[crd_name] = {**where, "versions": {
            version: {"storage": bool(versions[version].get("storage")),
                      "schema": upstream_records.prune(versions[version]["schema"]["openAPIV3Schema"], used)}
            for (name, version), used in sorted(objects.items()) if name == crd_name}}
    return {"crds": out}


MAKERS = {"kueue-configuration-fields.json": kueue_fields, upstream_records.GO_CONFIG_FIELDS: gpu_config_fields,
          "al2023-units.json": al2023_units, crds.RECORD: crd_schemas}


def _write_or_check(path: Path, text: str, check: bool, stale: List[str]) -> None:
    """Write `text` to `path`, or with `check` write nothing and add the path (under tests/upstream/) to `stale` when
    the file is not `text`."""
    if check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path.relative_to(upstream_records.RECORDS)))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({len(text):,} bytes)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=upstream_records.MIRROR)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a record is stale")
    args = parser.parse_args(argv)
    stale = []
    try:
        index, files = chart_values(args.mirror)
    except RecordError as err:
        print(f"{upstream_records.CHART_VALUES_INDEX}: {err}", file=sys.stderr)
        return 2
    directory = upstream_records.CHART_VALUES_DIR
    for name in sorted(path.name for path in directory.glob("*.yaml")) if directory.is_dir() else []:
        if name not in files:                      # a chart no longer pinned
            if args.check:
                stale.append(f"chart-values/{name} (no longer pinned)")
            else:
                (directory / name).unlink()
    for name, text in files.items():
        _write_or_check(directory / name, text, args.check, stale)
    for name, make in {upstream_records.CHART_VALUES_INDEX: lambda _: index, **MAKERS}.items():
        try:
            fresh = make(args.mirror)
        except RecordError as err:
            print(f"{name}: {err}", file=sys.stderr)
            return 2
        _write_or_check(upstream_records.RECORDS / name, json.dumps(fresh, indent=1, sort_keys=True) + "\n",
                        args.check, stale)
    if stale:
        print(f"stale: {', '.join(stale)}; run without --check to write them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
