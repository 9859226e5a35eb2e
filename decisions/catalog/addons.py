"""Pinned Amazon EKS add-on versions per Kubernetes minor: loads and validates decisions/catalog/addons.yaml once.

The pins are data (see addons.yaml for sources and dates). This module only checks them and answers
"which version of each add-on for this cluster". Pure: no Pulumi.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Dict, Mapping, Tuple

from decisions.catalog.data_files import read_yaml

ADDONS_PATH = Path(__file__).with_name("addons.yaml")

# Every cluster gets exactly these managed add-ons.
ADDON_NAMES: Tuple[str, ...] = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "aws-ebs-csi-driver")

# EKS add-on versions look like v1.21.1-eksbuild.7.
_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)-eksbuild\.(\d+)$")
_MINOR = re.compile(r"^1\.(\d+)$")
_FLOOR = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


class AddonPinError(ValueError):
    """addons.yaml is malformed, incomplete, or pins a version below a floor."""


def parse_addon_version(version: str) -> Tuple[int, int, int, int]:
    """`v1.21.1-eksbuild.7` -> (1, 21, 1, 7)."""
    match = _VERSION.match(version)
    if not match:
        raise AddonPinError(f"{version!r} is not an EKS add-on version (vMAJOR.MINOR.PATCH-eksbuild.N)")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


def _minor_key(kubernetes_version: str) -> Tuple[int, int]:
    match = _MINOR.match(kubernetes_version)
    if not match:
        raise AddonPinError(f"{kubernetes_version!r} is not a Kubernetes minor such as \"1.33\"")
    return 1, int(match.group(1))


class AddonPins:
    """The validated content of addons.yaml (read-only)."""

    def __init__(self, data: object, source: str):
        if not isinstance(data, dict):
            raise AddonPinError(f"{source}: expected a mapping at the top level")
        self.as_of = str(data.get("asOf") or "")
        if not self.as_of:
            raise AddonPinError(f"{source}: asOf is missing")
        floors = data.get("minimums") or {}
        self.minimums: Mapping[str, Tuple[int, int, int]] = MappingProxyType(
            {name: self._floor(source, name, value) for name, value in floors.items()})
        if "vpc-cni" not in self.minimums:
            raise AddonPinError(f"{source}: minimums.vpc-cni is missing (EFA-only interfaces need VPC CNI >= 1.18.5)")
        sources = data.get("sources") or {}
        missing_sources = [name for name in ADDON_NAMES if not str(sources.get(name) or "").strip()]
        if missing_sources:
            raise AddonPinError(f"{source}: sources has no entry for {', '.join(missing_sources)}")
        self.sources: Mapping[str, str] = MappingProxyType({k: str(v) for k, v in sources.items()})

        table = data.get("kubernetes")
        if not isinstance(table, dict) or not table:
            raise AddonPinError(f"{source}: kubernetes: expected a mapping of minor -> add-on versions")
        problems = []
        pins: Dict[str, Mapping[str, str]] = {}
        for minor in sorted(table, key=lambda k: _minor_key(str(k))):
            versions = table[minor] or {}
            minor = str(minor)
            missing = [name for name in ADDON_NAMES if name not in versions]
            extra = [name for name in versions if name not in ADDON_NAMES]
            if missing:
                problems.append(f"{minor}: missing {', '.join(missing)}")
            if extra:
                problems.append(f"{minor}: unknown add-on {', '.join(extra)}")
            for name, version in versions.items():
                try:
                    parsed = parse_addon_version(str(version))
                except AddonPinError as error:
                    problems.append(f"{minor}.{name}: {error}")
                    continue
                floor = self.minimums.get(name)
                if floor and parsed[:3] < floor:
                    problems.append(f"{minor}.{name}: {version} is below the minimum {'.'.join(map(str, floor))}"
                                    + (" (EFA-only interfaces need it)" if name == "vpc-cni" else ""))
                if name == "kube-proxy" and f"{parsed[0]}.{parsed[1]}" != minor:
                    problems.append(f"{minor}.kube-proxy: {version} is not a {minor} build (kube-proxy must match "
                                    "the control plane's minor)")
            pins[minor] = MappingProxyType({name: str(versions[name]) for name in ADDON_NAMES if name in versions})
        if problems:
            raise AddonPinError(f"{source}: " + "; ".join(problems))
        self._pins: Mapping[str, Mapping[str, str]] = MappingProxyType(pins)

    @staticmethod
    def _floor(source: str, name: str, value: object) -> Tuple[int, int, int]:
        match = _FLOOR.match(str(value))
        if not match:
            raise AddonPinError(f"{source}: minimums.{name}: {value!r} is not MAJOR.MINOR.PATCH")
        return tuple(int(part) for part in match.groups())  # type: ignore[return-value]

    @property
    def kubernetes_versions(self) -> Tuple[str, ...]:
        return tuple(self._pins)

    def for_kubernetes(self, kubernetes_version: str) -> Dict[str, str]:
        try:
            return dict(self._pins[kubernetes_version])
        except KeyError:
            raise AddonPinError(f"no add-on versions pinned for Kubernetes {kubernetes_version!r}; "
                                f"pinned: {', '.join(self._pins)}") from None


def load_addon_pins(path: Path = ADDONS_PATH) -> AddonPins:
    """Load and validate an add-on pin file (uncached; tests use it on other files)."""
    return AddonPins(read_yaml(path), str(path))


@lru_cache(maxsize=None)
def _default_pins() -> AddonPins:
    return load_addon_pins(ADDONS_PATH)


def addon_versions(kubernetes_version: str) -> Dict[str, str]:
    """Add-on name -> pinned version for a Kubernetes minor, e.g. addon_versions("1.33")["vpc-cni"]."""
    return _default_pins().for_kubernetes(kubernetes_version)


def supported_kubernetes_versions() -> Tuple[str, ...]:
    """The Kubernetes minors with a complete set of pins, oldest first."""
    return _default_pins().kubernetes_versions


# --- configuration values of the add-ons that run Deployments on the system nodes --------------------------------
# Each is valid for the add-on's own configuration schema (what `aws eks describe-addon-configuration` returns;
# tests/test_cluster.py holds these against the parts of them transcribed there):
# - coredns: top-level `nodeSelector` (map of strings) and `tolerations` (array of objects), additionalProperties
#   false. Recorded for coredns v1.10.1-eksbuild.11 in cloudbees/terraform-aws-cloudbees-ci-eks-addon
#   blueprints/03-windows-builds/README.md; its `tolerations` default there is [CriticalAddonsOnly Exists,
#   control-plane NoSchedule]. Setting it replaces that default, so the list below is what CoreDNS tolerates.
# - aws-ebs-csi-driver: the driver's chart schema (kubernetes-sigs/aws-ebs-csi-driver v1.60.0
#   charts/aws-ebs-csi-driver/values.schema.json, "Configurable parameters of the AWS EBS CSI Driver", which is what
#   describe-addon-configuration returns for the add-on): `controller.nodeSelector` (object or null),
#   `controller.tolerations` (array of objects). Its node DaemonSet keeps `node.tolerateAllTaints` (default true,
#   values.yaml line 406), so it mounts volumes on the system nodes too (Prometheus' and Alertmanager's).
def addon_configuration(addon_name: str) -> Dict[str, object]:
    """configurationValues (before JSON encoding) of an add-on whose Deployment runs on the system nodes."""
    from decisions.nodes.pods import system_placement      # pods imports the catalog: imported here, not at the top

    placement = system_placement()
    if addon_name == "coredns":
        return placement
    if addon_name == "aws-ebs-csi-driver":
        return {"controller": placement}
    raise ValueError(f"{addon_name!r} runs no Deployment on the system nodes; configured add-ons: coredns, "
                     "aws-ebs-csi-driver")
