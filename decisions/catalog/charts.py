"""Pinned Helm charts and the cluster-autoscaler image per Kubernetes minor: loads decisions/catalog/charts.yaml once.

The pins are data (see charts.yaml for sources and dates); this module gives them types, checks them, and
answers "which chart" and "which image for this cluster". Pure: no Pulumi.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml
from pydantic import Field, model_validator

from decisions.catalog.data_files import DataModel, load_model

CHARTS_PATH = Path(__file__).with_name("charts.yaml")

NODE_TERMINATION_HANDLER = "aws-node-termination-handler"
CLUSTER_AUTOSCALER = "cluster-autoscaler"
GPU_OPERATOR = "gpu-operator"
EFA_DEVICE_PLUGIN = "aws-efa-k8s-device-plugin"
KUEUE = "kueue"
FSX_CSI_DRIVER = "aws-fsx-csi-driver"
MPI_OPERATOR = "mpi-operator"
JOBSET = "jobset"
KUBE_PROMETHEUS_STACK = "kube-prometheus-stack"
AWS_LOAD_BALANCER_CONTROLLER = "aws-load-balancer-controller"
PROMETHEUS_ADAPTER = "prometheus-adapter"

# Some repositories publish versions with a leading "v" (NGC's gpu-operator v26.7.0, eks-charts' EFA plugin
# v0.5.30); a pin keeps the spelling the repository's index lists.
_SEMVER = re.compile(r"^v?\d+\.\d+\.\d+$")
_MINOR = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")
_IMAGE_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


class ChartPin(DataModel):
    repository: str
    chart: str
    version: str = Field(pattern=_SEMVER.pattern)
    app_version: str = Field(alias="appVersion", pattern=_SEMVER.pattern)
    source: str

    @property
    def is_oci(self) -> bool:
        return self.repository.startswith("oci://")

    @property
    def chart_ref(self) -> str:
        """What Helm installs: the full `oci://` reference for OCI registries, else the chart name (with
        `repository` passed as the repo URL)."""
        return f"{self.repository}/{self.chart}" if self.is_oci else self.chart

    @model_validator(mode="after")
    def _repository_scheme(self) -> "ChartPin":
        if not self.repository.startswith(("oci://", "https://")):
            raise ValueError(f"chart {self.chart}: repository {self.repository!r} must be oci:// or https://")
        return self


class KnownBadTag(DataModel):
    tag: str
    reason: str


class ImagePins(DataModel):
    repository: str
    tags: Dict[str, str]
    known_bad: Tuple[KnownBadTag, ...] = Field(default=(), alias="knownBad")

    @model_validator(mode="after")
    def _tag_minor_matches(self) -> "ImagePins":
        bad = {b.tag: b.reason for b in self.known_bad}
        for minor, tag in self.tags.items():
            match = _IMAGE_TAG.match(tag)
            if not match or f"{match.group(1)}.{match.group(2)}" != minor:
                raise ValueError(f"image tag {tag!r} pinned for Kubernetes {minor} is not a v{minor}.x tag")
            if tag in bad:
                raise ValueError(f"image tag {tag} is known-bad: {bad[tag]}")
        return self


class ManifestPin(DataModel):
    """A project that ships no Helm chart, only a release manifest: kept in the repository (`file`, beside this
    module) with the file's sha256, as its release published it at `url` or, where charts.yaml says so (JobSet's), as
    its release builds it. The program applies the kept copy; nothing is fetched at `pulumi up`.
    scripts/vendor_manifests.py downloads `url`, checks it against `sha256`, and says whether a file that differs
    differs in bytes only or in objects."""
    url: str = Field(pattern=r"^https://")
    version: str = Field(pattern=_SEMVER.pattern)
    file: str = Field(pattern=r"^manifests/[a-z0-9.-]+\.yaml$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    source: str

    @model_validator(mode="after")
    def _url_and_file_name_version(self) -> "ManifestPin":
        if f"/{self.version}/" not in self.url:
            raise ValueError(f"manifest url {self.url} is not at the pinned tag {self.version}")
        if not self.file.endswith(f"-{self.version}.yaml"):
            raise ValueError(f"manifest file {self.file} does not name the pinned version {self.version}")
        return self


class ChartsFile(DataModel):
    checked_at: str = Field(alias="checkedAt")
    charts: Dict[str, ChartPin]
    manifests: Dict[str, ManifestPin]
    cluster_autoscaler_image: ImagePins = Field(alias="clusterAutoscalerImage")

    @model_validator(mode="after")
    def _required_pins(self) -> "ChartsFile":
        missing = {NODE_TERMINATION_HANDLER, CLUSTER_AUTOSCALER, GPU_OPERATOR, EFA_DEVICE_PLUGIN, KUEUE} - set(self.charts)
        missing |= {MPI_OPERATOR, JOBSET} - set(self.manifests)
        if missing:
            raise ValueError(f"charts.yaml lacks pins for {sorted(missing)}")
        return self


@lru_cache(maxsize=None)
def load_charts(path: Optional[Path] = None) -> ChartsFile:
    return load_model(path or CHARTS_PATH, ChartsFile)


def chart(name: str) -> ChartPin:
    pins = load_charts().charts
    if name not in pins:
        raise KeyError(f"no pinned chart {name!r}; pinned: {sorted(pins)}")
    return pins[name]


def manifest(name: str) -> ManifestPin:
    pins = load_charts().manifests
    if name not in pins:
        raise KeyError(f"no pinned manifest {name!r}; pinned: {sorted(pins)}")
    return pins[name]


class ManifestDigestError(ValueError):
    """A kept release manifest is missing or is not the file its pin's sha256 names."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@lru_cache(maxsize=None)
def manifest_objects(name: str) -> Tuple[Mapping[str, Any], ...]:
    """The objects of the pinned release manifest `name`, from the repository's copy (read_manifest). Cached and
    shared: callers copy what they change."""
    return read_manifest(name, manifest(name))


def read_manifest(name: str, pin: ManifestPin, directory: Path = CHARTS_PATH.parent) -> Tuple[Mapping[str, Any], ...]:
    """A kept manifest's objects in the file's order (empty documents dropped, as yaml/v2 drops them). The copy must
    be the file its pin's sha256 names: an edited or truncated copy is refused here, before anything is registered."""
    path = directory / pin.file
    if not path.is_file():
        raise ManifestDigestError(f"release manifest {name} {pin.version}: {path} is missing; "
                                  f"run scripts/vendor_manifests.py {name}")
    digest = file_sha256(path)
    if digest != pin.sha256:
        raise ManifestDigestError(f"release manifest {name} {pin.version}: {path.name} has sha256 {digest}, "
                                  f"not the pinned {pin.sha256} (decisions/catalog/charts.yaml); "
                                  f"run scripts/vendor_manifests.py {name} to restore the release's file")
    # libyaml's loader where PyYAML has it: the two files are 1.5 MB, which the pure-Python loader takes seconds over.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as text:
        return tuple(doc for doc in yaml.load_all(text, Loader=loader) if doc)


def kubernetes_minor(kubernetes_version: str) -> str:
    """'1.33' or '1.33.4' -> '1.33'."""
    match = _MINOR.match(kubernetes_version.strip())
    if not match:
        raise ValueError(f"{kubernetes_version!r} is not a Kubernetes version like 1.33")
    return f"{match.group(1)}.{match.group(2)}"


def autoscaler_image(kubernetes_version: str) -> Tuple[str, str]:
    """(repository, tag) of the cluster-autoscaler image whose minor equals the cluster's."""
    pins = load_charts().cluster_autoscaler_image
    minor = kubernetes_minor(kubernetes_version)
    if minor not in pins.tags:
        raise ValueError(f"no cluster-autoscaler image pinned for Kubernetes {minor}; pinned: {sorted(pins.tags)}")
    return pins.repository, pins.tags[minor]


def autoscaler_minors() -> Tuple[str, ...]:
    """Kubernetes minors with a pinned cluster-autoscaler image."""
    return tuple(sorted(load_charts().cluster_autoscaler_image.tags, key=lambda v: tuple(map(int, v.split(".")))))
