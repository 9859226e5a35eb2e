"""decisions/nodes/amis.py and decisions/nodes/amis.yaml: which AMI release a stack boots, the driver it carries, and
when to move on."""
from datetime import date

import pytest
import yaml

from decisions.config.model import GpuDriver
from decisions.nodes.amis import AMIS_PATH, AmiTable, NodeImage, image_warnings, load_amis, resolve_node_image

TABLE = load_amis()


def driver(**keys) -> GpuDriver:
    """gpuDriver as a stack file spells it (camelCase keys)."""
    return GpuDriver.model_validate(keys)


# Entries checked one by one against awslabs/amazon-eks-ami CHANGELOG.md (AL2023_x86_64_NVIDIA column):
# where the driver changed, the branch changed, and where containerd 2 arrived for 1.32.
@pytest.mark.parametrize("release,minor,driver,containerd", [
    ("v20260714", "1.33", "580.159.03", "2.2.4"),
    ("v20260714", "1.35", "580.159.03", "2.2.4"),
    ("v20260610", "1.32", "580.159.03", "2.2.4"),
    ("v20260505", "1.34", "580.126.09", "2.2.3"),
    ("v20260120", "1.33", "580.126.09", "2.1.5"),
    ("v20260116", "1.33", "580.105.08", "2.1.5"),
    ("v20251217", "1.32", "580.105.08", "2.1.5"),
    ("v20251209", "1.32", "580.105.08", "1.7.29"),
    ("v20251112", "1.33", "580.95.05", "2.1.4"),
    ("v20251029", "1.32", "570.195.03", "1.7.27"),
    ("v20251029", "1.33", "580.95.05", "2.1.4"),
])
def test_release_table_entries(release, minor, driver, containerd):
    image = TABLE.releases[release][minor]
    assert (image.nvidia_driver, image.containerd) == (driver, containerd)


def test_kubernetes_1_35_amis_start_at_v20260114():
    assert TABLE.releases_for("1.35")[-1] == "v20260114"
    assert "1.35" not in TABLE.releases["v20260107"]


def test_default_release_is_the_newest_and_releases_run_newest_first():
    names = list(TABLE.releases)
    assert TABLE.default == names[0] == "v20260714"
    assert names == sorted(names, reverse=True)


@pytest.mark.parametrize("mutate,words", [
    (lambda d: d.update(default="v20990101"), "default release v20990101"),
    (lambda d: d["releases"]["v20260714"]["1.33"].update(nvidiaDriver="590.10.01"), "branches ['590']"),
    (lambda d: d.update(releases={"v20251112": d["releases"]["v20251112"], "v20260714": d["releases"]["v20260714"]}),
     "newest first"),
])
def test_table_refuses_inconsistent_data(mutate, words):
    data = yaml.safe_load(AMIS_PATH.read_text())
    mutate(data)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        AmiTable.model_validate(data)


def test_ami_source_boots_the_nvidia_ami_of_the_release_and_requires_its_exact_driver():
    image, issues = resolve_node_image(driver(amiRelease="v20251112"), "1.33")
    assert issues == []
    assert image == NodeImage("ami", "1.33", "v20251112", "580", "580.95.05", "2.1.4")
    assert image.ami_name == "amazon-eks-node-al2023-x86_64-nvidia-1.33-v20251112"
    assert image.ssm_parameter == ("/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/"
                                   "amazon-eks-node-al2023-x86_64-nvidia-1.33-v20251112/image_id")


def test_ami_source_takes_its_branch_from_the_release():
    image, _ = resolve_node_image(driver(amiRelease="v20251029"), "1.32")
    assert (image.driver_branch, image.driver_version) == ("570", "570.195.03")


def test_install_source_boots_the_standard_ami_and_installs_the_asked_branch():
    image, issues = resolve_node_image(driver(source="install", branch="595"), "1.34")
    assert issues == []
    assert (image.variant, image.driver_branch, image.driver_version) == ("standard", "595", None)
    assert image.ssm_parameter.endswith("/x86_64/standard/amazon-eks-node-al2023-x86_64-standard-1.34-v20260714/image_id")
    pinned, _ = resolve_node_image(driver(source="install", version="580.126.09"), "1.34")
    assert (pinned.driver_branch, pinned.driver_version) == ("580", "580.126.09")


def test_an_outdated_release_warns_and_the_newest_does_not():
    old, _ = resolve_node_image(driver(amiRelease="v20260505"), "1.33")
    (warning,) = image_warnings(old, date(2026, 12, 2))
    assert "v20260505 is older than v20260714" in warning and "driver 580.159.03" in warning
    new, _ = resolve_node_image(driver(), "1.33")
    assert image_warnings(new, date(2026, 12, 2)) == []


@pytest.mark.parametrize("today,warns", [(date(2026, 8, 31), False), (date(2026, 9, 1), True)])
def test_end_of_life_branch_warns_from_its_end_of_life_month(today, warns):
    image = NodeImage("ami", "1.32", TABLE.releases_for("1.32")[0], "570", "570.195.03", "1.7.27")
    eol = [w for w in image_warnings(image, today) if "end of life" in w]
    assert bool(eol) is warns
    if warns:
        assert eol == ["gpu-cloud:gpuDriver: NVIDIA driver branch 570 (production) reached end of life in 2026-09; "
                       "move to a supported branch"]


def test_installed_branch_older_than_the_newest_known_warns():
    image, _ = resolve_node_image(driver(source="install", branch="580"), "1.33")
    assert image_warnings(image, date(2026, 12, 2)) == [
        "gpu-cloud:gpuDriver.branch: 580 is older than 595, the newest branch gpu-cloud knows (production)"]
    newest, _ = resolve_node_image(driver(source="install", branch="595"), "1.33")
    assert image_warnings(newest, date(2026, 12, 2)) == []
