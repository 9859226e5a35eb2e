"""Which image a GPU node boots and which NVIDIA driver it ends up with: loads decisions/nodes/amis.yaml once.

Two ways to get the driver (`gpuDriver.source`):
- `ami` (default): the EKS-optimized AL2023 *NVIDIA* AMI of one pinned release. The driver is part of the
  image; the node gate verifies it is exactly the release's driver and never installs another.
- `install`: the *standard* EKS AL2023 AMI of the same release; the node gate installs the requested
  branch (or exact version) from NVIDIA's amzn2023 repository, then verifies it the same way.

Pure: no Pulumi. Resolution errors come back as (key path parts, message) pairs for decisions/config/validate.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from pydantic import Field, model_validator

from decisions.catalog.charts import kubernetes_minor
from decisions.catalog.data_files import DataModel, load_model
from decisions.config.model import AMI_RELEASE, DRIVER_VERSION

AMIS_PATH = Path(__file__).with_name("amis.yaml")
MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")
# The install path configures containerd through the NodeConfig in config version 3, which containerd 2 reads.
INSTALL_MIN_CONTAINERD_MAJOR = 2

Issue = Tuple[Tuple[str, ...], str]
# Families the EKS NVIDIA AMI runs on NVIDIA's proprietary kernel module with GPU System Processor firmware off
# (NVreg_EnableGpuFirmware=0, "only possible on the proprietary kmod"): awslabs/amazon-eks-ami@v20260724
# templates/al2023/runtime/gpu/nvidia-kmod-load.sh lines 80-98. gpuDriver.source: install installs the open module
# only (userdata/install.sh), so it refuses these types.
INSTALL_REFUSED_FAMILIES = ("g4dn", "g5", "g5g")


def install_refusal(instance_type: str) -> Optional[str]:
    """Why gpuDriver.source: install cannot drive this type, or None."""
    family = instance_type.split(".", 1)[0]
    if family not in INSTALL_REFUSED_FAMILIES:
        return None
    return (f"{instance_type}: gpuDriver.source install installs NVIDIA's open kernel module, but {family} needs the "
            "proprietary module with GPU System Processor firmware off, as the EKS NVIDIA AMI loads it; use "
            "gpuDriver.source: ami (the default) or another instance type")


class DriverBranch(DataModel):
    designation: str
    end_of_life: Optional[str] = Field(alias="endOfLife", pattern=MONTH.pattern)


class ReleaseImage(DataModel):
    """One release's AMIs for one Kubernetes minor."""
    nvidia_driver: str = Field(alias="nvidiaDriver", pattern=DRIVER_VERSION.pattern)
    containerd: str = Field(pattern=r"^\d+\.\d+\.\d+$")

    @property
    def driver_branch(self) -> str:
        return self.nvidia_driver.split(".", 1)[0]


class AmiTable(DataModel):
    checked_at: str = Field(alias="checkedAt")
    default: str
    driver_branches: Dict[str, DriverBranch] = Field(alias="driverBranches")
    releases: Dict[str, Dict[str, ReleaseImage]]   # release -> Kubernetes minor -> image facts, newest first

    @model_validator(mode="after")
    def _consistent(self) -> "AmiTable":
        names = list(self.releases)
        bad = [n for n in names if not AMI_RELEASE.match(n)]
        if bad:
            raise ValueError(f"release names {bad} are not vYYYYMMDD")
        if names != sorted(names, reverse=True):
            raise ValueError("releases must be listed newest first")
        if self.default not in self.releases:
            raise ValueError(f"default release {self.default} is not under releases")
        unknown = sorted({i.driver_branch for r in self.releases.values() for i in r.values()} - set(self.driver_branches))
        if unknown:
            raise ValueError(f"drivers of branches {unknown} have no driverBranches entry")
        return self

    def releases_for(self, minor: str) -> List[str]:
        """Releases with AMIs for this Kubernetes minor, newest first."""
        return [name for name, images in self.releases.items() if minor in images]

    def carrying(self, minor: str, driver_version: str) -> List[str]:
        return [name for name in self.releases_for(minor) if self.releases[name][minor].nvidia_driver == driver_version]


@lru_cache(maxsize=None)
def load_amis(path: Path = AMIS_PATH) -> AmiTable:
    return load_model(path, AmiTable)


@dataclass(frozen=True)
class NodeImage:
    """The image every GPU node of a stack boots and the driver the gate requires on it."""
    source: str                     # "ami" | "install"
    kubernetes_minor: str
    release: str                    # vYYYYMMDD
    driver_branch: str
    driver_version: Optional[str]   # exact version the gate requires: the AMI's, or a pinned install; None = any on branch
    containerd: str

    @property
    def variant(self) -> str:
        return "nvidia" if self.source == "ami" else "standard"

    @property
    def ami_name(self) -> str:
        return f"amazon-eks-node-al2023-x86_64-{self.variant}-{self.kubernetes_minor}-{self.release}"

    @property
    def ssm_parameter(self) -> str:
        """The release's own public SSM parameter (never `recommended`, which moves)."""
        return (f"/aws/service/eks/optimized-ami/{self.kubernetes_minor}/amazon-linux-2023/x86_64/"
                f"{self.variant}/{self.ami_name}/image_id")


def resolve_node_image(driver, kubernetes_version: str, table: Optional[AmiTable] = None
                       ) -> Tuple[Optional[NodeImage], List[Issue]]:
    """Turn `gpuDriver` (decisions.config.model.GpuDriver) into a NodeImage, or the reasons it cannot be one."""
    table = table or load_amis()
    minor = kubernetes_minor(kubernetes_version)
    release = driver.ami_release or table.default
    known = table.releases_for(minor)
    if release not in table.releases or minor not in table.releases[release]:
        where = ("is not a release in decisions/nodes/amis.yaml" if release not in table.releases
                 else f"has no Kubernetes {minor} AMI")
        return None, [(("gpuDriver", "amiRelease"), f"{release} {where}; releases for Kubernetes {minor}: "
                       f"{', '.join(known) or 'none'}")]
    image = table.releases[release][minor]
    if driver.source == "ami":
        return _ami_image(driver, table, minor, release, image)
    return _install_image(driver, table, minor, release, image)


def _ami_image(driver, table: AmiTable, minor: str, release: str, image: ReleaseImage
               ) -> Tuple[Optional[NodeImage], List[Issue]]:
    issues: List[Issue] = []
    carries = f"AMI release {release} (Kubernetes {minor}) carries driver {image.nvidia_driver}"
    if driver.branch and driver.branch != image.driver_branch:
        on_branch = [r for r in table.releases_for(minor) if table.releases[r][minor].driver_branch == driver.branch]
        issues.append((("gpuDriver", "branch"), f"{driver.branch} does not match: {carries}; leave branch out, "
                       + (f"or set amiRelease to a release on {driver.branch}: {', '.join(on_branch)}" if on_branch
                          else "or use source: install (no release in decisions/nodes/amis.yaml has a "
                               f"{driver.branch} driver)")))
    if driver.version and driver.version != image.nvidia_driver:
        releases = table.carrying(minor, driver.version)
        issues.append((("gpuDriver", "version"), f"{driver.version} does not match: {carries}; "
                       + (f"set amiRelease to one that carries it: {', '.join(releases)}" if releases
                          else "no release in decisions/nodes/amis.yaml carries it; use source: install")))
    if issues:
        return None, issues
    return NodeImage("ami", minor, release, image.driver_branch, image.nvidia_driver, image.containerd), []


def _install_image(driver, table: AmiTable, minor: str, release: str, image: ReleaseImage
                   ) -> Tuple[Optional[NodeImage], List[Issue]]:
    issues: List[Issue] = []
    branch = driver.branch or (driver.version.split(".", 1)[0] if driver.version else image.driver_branch)
    if branch not in table.driver_branches:
        issues.append((("gpuDriver", "branch"), f"{branch} is not a driver branch gpu-cloud knows; known: "
                       f"{', '.join(table.driver_branches)} (decisions/nodes/amis.yaml driverBranches)"))
    if int(image.containerd.split(".", 1)[0]) < INSTALL_MIN_CONTAINERD_MAJOR:
        issues.append((("gpuDriver", "amiRelease"), f"{release} has containerd {image.containerd} for Kubernetes "
                       f"{minor}; source: install configures the NVIDIA runtime through containerd 2's config "
                       f"version 3; releases for {minor} with containerd 2: "
                       + ", ".join(r for r in table.releases_for(minor)
                                   if int(table.releases[r][minor].containerd.split(".")[0]) >= INSTALL_MIN_CONTAINERD_MAJOR)))
    if issues:
        return None, issues
    return NodeImage("install", minor, release, branch, driver.version, image.containerd), []


def image_warnings(image: NodeImage, today: date, table: Optional[AmiTable] = None) -> List[str]:
    """What a stack pinned to `image` should move off, as of `today` (the plan prints these)."""
    table = table or load_amis()
    warnings: List[str] = []
    newest = table.releases_for(image.kubernetes_minor)[0]
    if image.release < newest:
        newest_driver = table.releases[newest][image.kubernetes_minor].nvidia_driver
        warnings.append(f"gpu-cloud:gpuDriver.amiRelease: {image.release} is older than {newest}, the newest release "
                        f"gpu-cloud knows for Kubernetes {image.kubernetes_minor} (driver {newest_driver}); set "
                        f"amiRelease: {newest} to roll the pools onto it")
    branch = table.driver_branches.get(image.driver_branch)
    if branch and branch.end_of_life and today.strftime("%Y-%m") >= branch.end_of_life:
        warnings.append(f"gpu-cloud:gpuDriver: NVIDIA driver branch {image.driver_branch} ({branch.designation}) reached "
                        f"end of life in {branch.end_of_life}; move to a supported branch")
    newest_branch = max(table.driver_branches, key=int)
    if image.source == "install" and int(image.driver_branch) < int(newest_branch):
        warnings.append(f"gpu-cloud:gpuDriver.branch: {image.driver_branch} is older than {newest_branch}, the newest "
                        f"branch gpu-cloud knows ({table.driver_branches[newest_branch].designation})")
    return warnings

