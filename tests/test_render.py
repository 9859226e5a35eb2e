"""userdata/render.py: the MIME user-data document, its NodeConfig, the shell part, the size
limit, input validation and the verifier artifact.

cloud-init check: the document has no cloud-config part, and `cloud-init schema --config-file`
(22.4 here) only validates documents starting with "#cloud-config", so instead the system
cloud-init package itself parses the document: `cloudinit.user_data.UserDataProcessor.process`
(what cloud-init's init stage does with user-data) and then `cloudinit.handlers.walk` with the
stock `ShellScriptPartHandler` (what writes /var/lib/cloud/instance/scripts/part-NNN, which
cloud-final runs). It runs under /usr/bin/python3 in a subprocess, because cloud-init lives in
the system dist-packages, not in the venv.
"""
from __future__ import annotations

import base64
import email
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest
import yaml

from decisions.nodes.faults import bundle_document
from tests.conftest import ROOT, missing, require_tool
from userdata import render
from userdata.render import (
    USER_DATA_LIMIT_BYTES,
    NodeBootstrap,
    Taint,
    bootstrap_env,
    build_verifier_artifact,
    render_shell_part,
    render_user_data,
)

SYSTEM_PYTHON = "/usr/bin/python3"


def _ca(size: int) -> str:
    """A fixed pseudo-random base64 PEM bundle of at least `size` characters, the form EKS
    returns certificateAuthority.data in (~1.5 KB for a real cluster CA)."""
    rng = random.Random(size)
    raw = 16
    while True:
        body = base64.b64encode(rng.randbytes(raw)).decode()
        pem = "-----BEGIN CERTIFICATE-----\n" + "\n".join(textwrap.wrap(body, 64)) + "\n-----END CERTIFICATE-----\n"
        encoded = base64.b64encode(pem.encode()).decode()
        if len(encoded) >= size:
            return encoded
        raw += 3


CA = _ca(1500)


def make_node(**overrides) -> NodeBootstrap:
    params = dict(
        cluster_name="gpu-prod",
        api_server_endpoint="https://0123456789ABCDEF0123456789ABCDEF.gr7.us-east-1.eks.amazonaws.com",
        certificate_authority=CA,
        service_cidr="172.20.0.0/16",
        labels={"gpu-cloud.io/pool": "p5", "node.kubernetes.io/gpu": "h100"},
        taints=(Taint("nvidia.com/gpu", "true", "NoSchedule"),),
        max_pods=100,
        raid0_instance_store=False,
        region="us-east-1",
        asg_name="gpu-prod-p5-asg",
        lifecycle_hook_name="gpu-cloud-verify",
        pool_name="p5",
        artifact_uri="s3://gpu-prod-artifacts/verify/" + "a" * 64 + ".tar",
        artifact_sha256="a" * 64,
        driver_source="ami",
        ami_name="amazon-eks-node-al2023-x86_64-nvidia-1.33-v20260714",
        driver_branch="580",
        driver_version="580.159.03",
        nvswitch=True,
        efa_count=32,
        kmod_wait_s=300,
        fabric_manager_wait_s=300,
    )
    params.update(overrides)
    return NodeBootstrap(**params)


def largest_node() -> NodeBootstrap:
    """The biggest input a pool may realistically carry."""
    labels = {f"gpu-cloud.example.com/label-{i:02d}": f"value-{i:02d}-" + "x" * 40 for i in range(20)}
    taints = tuple(
        Taint(f"gpu-cloud.example.com/taint-{i}", "reserved-" + "y" * 30, effect)
        for i, effect in enumerate(["NoSchedule", "NoExecute", "PreferNoSchedule"] * 2)
    )
    return make_node(
        cluster_name="gpu-cloud-production-us-east-1-training-cluster",
        api_server_endpoint="https://" + "A" * 32 + ".gr7.ap-southeast-4.eks.amazonaws.com",
        certificate_authority=_ca(1500),
        labels=labels,
        taints=taints,
        max_pods=198,
        raid0_instance_store=True,
        region="ap-southeast-4",
        asg_name="gpu-cloud-production-ap-southeast-4-p6-b200-training-pool-asg",
        lifecycle_hook_name="gpu-cloud-production-verify-launch-hook",
        pool_name="p6-b200-training-pool",
        artifact_uri="s3://gpu-cloud-production-artifacts-ap-southeast-4/verify/" + "f" * 64 + ".tar",
        driver_version="580.105.08",
        efa_count=8,
        verify_budget_s=600,
    )


def parse(doc: str):
    msg = email.message_from_string(doc)
    parts = [p for p in msg.walk() if not p.is_multipart()]
    return msg, parts


def node_config_of(doc: str) -> dict:
    _, parts = parse(doc)
    return yaml.safe_load(parts[0].get_payload())


def shell_part_of(doc: str) -> str:
    _, parts = parse(doc)
    return parts[1].get_payload()


# ----------------------------------------------------------------------------- MIME


def test_user_data_is_two_part_mime_in_nodeadm_then_script_order():
    doc = render_user_data(make_node())
    msg, parts = parse(doc)
    assert msg.get_content_type() == "multipart/mixed"
    assert msg.get_boundary() == render.MIME_BOUNDARY
    assert [p.get_content_type() for p in parts] == ["application/node.eks.aws", "text/x-shellscript"]
    assert doc.count(f"--{render.MIME_BOUNDARY}") == 3  # two parts + the closing delimiter
    assert doc.rstrip().endswith(f"--{render.MIME_BOUNDARY}--")


def test_render_is_deterministic():
    assert render_user_data(largest_node()) == render_user_data(largest_node())


# ----------------------------------------------------------------------------- NodeConfig


def test_node_config_carries_cluster_labels_taints_and_max_pods():
    node = make_node(
        labels={"zeta.example.com/b": "2", "alpha.example.com/a": "1", "plain": ""},
        taints=(Taint("nvidia.com/gpu", "true", "NoSchedule"), Taint("gpu-cloud/draining", "", "NoExecute")),
    )
    cfg = node_config_of(render_user_data(node))
    assert cfg["apiVersion"] == "node.eks.aws/v1alpha1" and cfg["kind"] == "NodeConfig"
    assert cfg["spec"]["cluster"] == {
        "name": node.cluster_name,
        "apiServerEndpoint": node.api_server_endpoint,
        "certificateAuthority": node.certificate_authority,
        "cidr": "172.20.0.0/16",
    }
    kubelet = cfg["spec"]["kubelet"]
    assert kubelet["config"]["maxPods"] == 100
    assert kubelet["config"]["registerWithTaints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
        {"key": "gpu-cloud/draining", "effect": "NoExecute"},
    ]
    assert kubelet["flags"] == ["--node-labels=alpha.example.com/a=1,plain=,zeta.example.com/b=2"]
    # the CA survives the YAML round trip byte for byte and is the PEM it claims to be
    assert base64.b64decode(cfg["spec"]["cluster"]["certificateAuthority"]).startswith(b"-----BEGIN CERTIFICATE")


def test_install_path_makes_the_nvidia_runtime_containerds_default_through_the_node_config():
    assert "containerd" not in node_config_of(render_user_data(make_node()))["spec"]   # the AMI's nodeadm does it
    config = node_config_of(render_user_data(make_node(driver_source="install", driver_version=None,
                                                       ami_name="amazon-eks-node-al2023-x86_64-standard-1.33-v20260714")))
    toml = config["spec"]["containerd"]["config"]
    assert toml == render.NVIDIA_CONTAINERD_CONFIG
    # containerd 2 reads config version 3; nodeadm merges this over its own (which names the runc runtime)
    import tomllib
    parsed = tomllib.loads(toml)
    assert parsed["version"] == 3
    cri = parsed["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["runtimes"]["nvidia"]["runtime_type"] == "io.containerd.runc.v2"


def test_raid0_only_when_asked():
    assert "instance" not in node_config_of(render_user_data(make_node()))["spec"]
    spec = node_config_of(render_user_data(make_node(raid0_instance_store=True)))["spec"]
    assert spec["instance"] == {"localStorage": {"strategy": "RAID0"}}


def test_kubelet_section_omitted_when_empty():
    spec = node_config_of(render_user_data(make_node(labels={}, taints=(), max_pods=None)))["spec"]
    assert "kubelet" not in spec
    spec = node_config_of(render_user_data(make_node(labels={}, taints=(), max_pods=58)))["spec"]
    assert spec["kubelet"] == {"config": {"maxPods": 58}}


# ----------------------------------------------------------------------------- shell part


def test_shell_part_is_env_exports_plus_bootstrap_body():
    node = make_node(driver_source="install", driver_version="580.65.06", nvswitch=False, efa_count=0,
                     verify_budget_s=90, ami_name="amazon-eks-node-al2023-x86_64-standard-1.33-v20260714")
    script = shell_part_of(render_user_data(node))
    assert script == render_shell_part(node)
    assert script.startswith("#!/usr/bin/env bash\n")
    # bootstrap.sh's code, line for line in order, without its shebang and its comment lines (shellcheck's stay)
    source = (ROOT / "userdata/bootstrap.sh").read_text().splitlines()
    code = [line for line in source[1:] if not line.lstrip().startswith("#") or "# shellcheck" in line]
    assert script.splitlines()[-len(code):] == code
    assert len(code) < len(source) - 10 and any("# shellcheck source=" in line for line in code)
    assert script.count("#!") == 1  # bootstrap.sh's own shebang is dropped
    # bash sees exactly the contract values
    exports = "".join(line + "\n" for line in script.splitlines() if line.startswith("export GPU_CLOUD_"))
    out = subprocess.run(
        ["bash", "-c", exports + 'for v in "${!GPU_CLOUD_@}"; do printf "%s=%s\\0" "$v" "${!v}"; done'],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
    ).stdout
    seen = dict(item.split("=", 1) for item in out.split("\0") if item)
    assert seen == bootstrap_env(node)
    assert seen["GPU_CLOUD_DRIVER_VERSION"] == "580.65.06"
    assert seen["GPU_CLOUD_NVSWITCH"] == "false" and seen["GPU_CLOUD_EFA_COUNT"] == "0"
    assert seen["GPU_CLOUD_VERIFY_BUDGET_S"] == "90"
    assert seen["GPU_CLOUD_DRIVER_SOURCE"] == "install"
    assert seen["GPU_CLOUD_AMI_NAME"] == "amazon-eks-node-al2023-x86_64-standard-1.33-v20260714"
    assert (seen["GPU_CLOUD_KMOD_WAIT_S"], seen["GPU_CLOUD_FM_WAIT_S"]) == ("300", "300")
    assert set(seen) == {
        "GPU_CLOUD_REGION", "GPU_CLOUD_ASG_NAME", "GPU_CLOUD_LIFECYCLE_HOOK", "GPU_CLOUD_POOL",
        "GPU_CLOUD_ARTIFACT_URI", "GPU_CLOUD_ARTIFACT_SHA256", "GPU_CLOUD_DRIVER_SOURCE", "GPU_CLOUD_AMI_NAME",
        "GPU_CLOUD_DRIVER_BRANCH", "GPU_CLOUD_DRIVER_VERSION", "GPU_CLOUD_NVSWITCH", "GPU_CLOUD_EFA_COUNT",
        "GPU_CLOUD_KMOD_WAIT_S", "GPU_CLOUD_FM_WAIT_S", "GPU_CLOUD_VERIFY_BUDGET_S", "GPU_CLOUD_VERIFY_KILL_GRACE_S",
        "GPU_CLOUD_MIG", "GPU_CLOUD_LUSTRE",
    }
    # no test/operator overrides leak into production user-data
    assert "GPU_CLOUD_ROOT" not in script.split("set -Eeuo pipefail")[0]
    assert "AWS_ENDPOINT_URL" not in script


def test_shell_part_carries_the_gate_units():
    """The gate's unit and the kubelet's drop-in travel in the user-data (bootstrap.sh installs them before it has a
    bundle): bash sees exactly the unit files, without their comment lines, and nothing else of them."""
    script = shell_part_of(render_user_data(largest_node()))
    lines = [line for line in script.split("set -Eeuo pipefail")[0].splitlines(keepends=True)
             if not line.startswith(("#!", "export "))]
    out = subprocess.run(["bash", "-c", "".join(lines) + 'printf "%s\\0%s" "$GATE_UNIT" "$KUBELET_DROPIN"'],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    gate, dropin = out.split("\0")
    for text, name in ((gate, "gpu-cloud-gate.service"), (dropin, "kubelet-gpu-cloud-gate.conf")):
        source = (ROOT / "userdata/units" / name).read_text().splitlines(keepends=True)
        assert text == "".join(line for line in source if not line.startswith("#"))
        assert "#" not in text and text.startswith("[Unit]\n")
    assert "ExecStartPre=/usr/bin/test -f /run/gpu-cloud/verified\n" in dropin
    assert render.GATE_UNITS == {"GATE_UNIT": "gpu-cloud-gate.service", "KUBELET_DROPIN": "kubelet-gpu-cloud-gate.conf"}


def test_unset_driver_version_exports_empty():
    script = shell_part_of(render_user_data(make_node(driver_source="install", driver_version=None)))
    assert "export GPU_CLOUD_DRIVER_VERSION=''\n" in script


@pytest.mark.parametrize("which", ["bootstrap.sh", "gate.sh", "install.sh", "health.sh", "rendered shell part"])
def test_shellcheck_clean(which, tmp_path):
    shellcheck = require_tool("shellcheck")
    if which == "rendered shell part":
        path = tmp_path / "part-002.sh"
        path.write_text(shell_part_of(render_user_data(largest_node())))
    else:
        path = ROOT / "userdata" / which
    # -x with the userdata folder as source path: the bundle's gate.sh and install.sh are checked where sourced
    result = subprocess.run([shellcheck, "--shell=bash", "-x", f"--source-path={ROOT / 'userdata'}", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------- size


def test_largest_realistic_input_fits_16k():
    doc = render_user_data(largest_node())
    size = len(doc.encode())
    assert size <= USER_DATA_LIMIT_BYTES, size
    # the checks and the driver install travel in the bundle: the user-data script keeps only what must work
    # without one (fetching it, failing closed, publishing the verdict, and the gate's unit and the kubelet's drop-in,
    # installed before anything else; 10,054 bytes when this bound was set)
    assert len(shell_part_of(doc).encode()) <= 10.5 * 1024
    print(f"largest rendered user-data: {size} bytes")  # visible with -s; quoted in reports
    cfg = node_config_of(doc)
    assert len(cfg["spec"]["kubelet"]["config"]["registerWithTaints"]) == 6
    assert cfg["spec"]["kubelet"]["flags"][0].count("=") == 21  # flag '=' + 20 labels


def test_over_limit_raises_clear_error():
    labels = {f"gpu-cloud.example.com/label-{i:03d}": "v" * 63 for i in range(120)}
    with pytest.raises(ValueError, match=r"over EC2's 16384-byte limit"):
        render_user_data(make_node(labels=labels))


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"labels": {"bad key!": "v"}}, "label key"),
        ({"labels": {"UPPER.example.com/x": "v"}}, "not a DNS subdomain"),
        ({"labels": {"example.com/" + "n" * 64: "v"}}, "name part"),
        ({"labels": {"ok": "has space"}}, "value"),
        ({"labels": {"ok": "v" * 64}}, "value"),
        ({"labels": {"node-role.kubernetes.io/gpu": ""}}, "reserved"),
        ({"labels": {"k8s.io/anything": "x"}}, "reserved"),
        ({"taints": (Taint("nvidia.com/gpu", "true", "NoSched"),)}, "effect"),
        ({"taints": (Taint("-bad", "true", "NoSchedule"),)}, "taint key"),
        ({"taints": (Taint("a", "x", "NoSchedule"), Taint("a", "y", "NoSchedule"))}, "duplicate taint"),
        ({"max_pods": 0}, "max_pods"),
        ({"service_cidr": "172.20.0.1/16"}, "service_cidr"),
        ({"certificate_authority": "not base64!"}, "certificate_authority"),
        ({"certificate_authority": base64.b64encode(b"hello").decode()}, "PEM"),
        ({"api_server_endpoint": "http://insecure.example.com"}, "https"),
        ({"artifact_sha256": "A" * 64}, "sha256"),
        ({"artifact_uri": "https://bucket/key"}, "s3://"),
        ({"driver_branch": "r580"}, "driver_branch"),
        ({"driver_version": "570.1.2"}, "branch 580"),
        ({"efa_count": -1}, "efa_count"),
        ({"verify_budget_s": 0}, "verify_budget_s"),
        ({"kmod_wait_s": 0}, "kmod_wait_s"),
        ({"fabric_manager_wait_s": 4000}, "fabric_manager_wait_s"),
        ({"driver_source": "runfile"}, "driver_source"),
        ({"driver_version": None}, "required with driver_source ami"),
        ({"ami_name": "ubuntu-22.04"}, "ami_name"),
        ({"region": "us east"}, "region"),
        ({"asg_name": "asg with space"}, "asg_name"),
    ],
)
def test_invalid_input_is_rejected_with_a_clear_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        render_user_data(make_node(**overrides))


def test_allowed_kubelet_self_labels_pass():
    labels = {"node.kubernetes.io/instance-type": "p5.48xlarge", "kubelet.kubernetes.io/x": "y",
              "topology.kubernetes.io/zone": "use1-az4"}
    assert "--node-labels=" in render_user_data(make_node(labels=labels))


# ----------------------------------------------------------------------------- cloud-init

CLOUD_INIT_PROBE = r"""
import json, logging, os, sys
from cloudinit import handlers, helpers
from cloudinit.handlers.shell_script import ShellScriptPartHandler
from cloudinit.settings import PER_INSTANCE
from cloudinit.user_data import UserDataProcessor

work, blob_path = sys.argv[1], sys.argv[2]
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.levelname + " " + record.getMessage())
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.DEBUG)

paths = helpers.Paths({"cloud_dir": work + "/cloud", "run_dir": work + "/run"})
msg = UserDataProcessor(paths).process(open(blob_path, "rb").read())
types = [p.get_content_type() for p in msg.walk() if not p.is_multipart()]
registry = helpers.ContentHandlers()
registry.register(ShellScriptPartHandler(paths))
data = {"handlers": registry, "handlerdir": work + "/handlers", "data": None,
        "frequency": PER_INSTANCE, "handlercount": 0, "excluded": []}
handlers.walk(msg, handlers.walker_callback, data)
script_dir = paths.get_ipath_cur("scripts")
scripts = {n: open(os.path.join(script_dir, n)).read() for n in sorted(os.listdir(script_dir))}
print(json.dumps({"types": types, "scripts": scripts,
                  "errors": [r for r in records if r.startswith(("ERROR", "CRITICAL"))],
                  "warnings": [r for r in records if r.startswith("WARNING")]}))
"""


def test_cloud_init_parses_document_and_extracts_the_script(tmp_path):
    require_tool("cloud-init")
    if not (Path(SYSTEM_PYTHON).exists() and Path("/usr/lib/python3/dist-packages/cloudinit").is_dir()):
        missing("cloud-init's Python package (Debian cloud-init, installed by .ci/run) is not under the system python3")
    node = largest_node()
    doc = render_user_data(node)
    blob = tmp_path / "user-data"
    blob.write_text(doc)
    probe = tmp_path / "probe.py"
    probe.write_text(CLOUD_INIT_PROBE)
    result = subprocess.run(
        [SYSTEM_PYTHON, str(probe), str(tmp_path), str(blob)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["types"] == ["application/node.eks.aws", "text/x-shellscript"]
    assert out["errors"] == []
    # exactly one script is written for cloud-final to run, byte-identical to what we rendered
    assert list(out["scripts"].values()) == [shell_part_of(doc)]
    assert list(out["scripts"].values()) == [render_shell_part(node)]
    # cloud-init leaves the nodeadm part alone (nodeadm reads it from IMDS itself)
    assert any("application/node.eks.aws" in w for w in out["warnings"]), out["warnings"]


# ----------------------------------------------------------------------------- artifact

BUNDLE_MTIME = 946684800  # 2000-01-01T00:00:00Z


def _members(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:  # "r:": uncompressed only
        return {m.name: (m, tar.extractfile(m).read()) for m in tar.getmembers()}


def _raw_headers(data: bytes):
    """The archive's header blocks as written, extension headers included (tarfile hides pax headers)."""
    headers, offset = [], 0
    while data[offset:offset + 512].strip(b"\0"):
        block = data[offset:offset + 512]
        headers.append(block)
        size = int(block[124:136].rstrip(b"\0 ") or b"0", 8)
        offset += 512 + -(-size // 512) * 512
    assert data[offset:] == b"\0" * (len(data) - offset) and len(data) - offset >= 1024   # two zero blocks
    return headers


def _stand_ins(tmp_path: Path) -> dict:
    """Fixed, made-up bundle inputs, so that a hash of the bundle is pinned independently of the repo's scripts."""
    here = tmp_path / "userdata"
    here.mkdir()
    (here / "gate.sh").write_text("# gate\n")
    (here / "install.sh").write_text("# install\n" * 70)   # more than one 512-byte block
    (here / "gpu_verify.py").write_text("print('verify')\n")
    (here / "pynvml.py").write_text("X = 1\n")
    (here / "health.sh").write_text("# health\n")
    (here / "units").mkdir()
    for unit in render.BOOT_UNITS:
        (here / "units" / unit).write_text(f"# {unit}\n")
    return {"here": here, "verifier_source": here / "gpu_verify.py", "pynvml_source": here / "pynvml.py",
            "faults": {"faults": {"x": {"boot": "fail"}}}}


STAND_IN_EXPECT = {"p5.48xlarge": {"instanceType": "p5.48xlarge", "gpuCount": 8},
                   "p4d.24xlarge": {"instanceType": "p4d.24xlarge", "gpuCount": 8}}
# sha256 of the bundle build_verifier_artifact makes from _stand_ins and STAND_IN_EXPECT. It is the same on every
# machine and Python (no zlib, no tarfile writer): if this changes, every pool's launch template changes with it.
STAND_IN_SHA256 = "129024d5cc982e47129cb813db1096c9399148552d87765e316d13350b9ccfc9"


def test_artifact_is_deterministic_and_holds_the_gate_and_verifier(tmp_path):
    verifier = tmp_path / "gpu_verify.py"
    verifier.write_text("print('verify')\n")
    nvml = tmp_path / "pynvml.py"
    nvml.write_text("X = 1\n")
    expect = {"instanceType": "p5.48xlarge", "gpuCount": 8, "nvlinkPerGpu": 18}
    first = build_verifier_artifact({"p5.48xlarge": expect}, verifier_source=verifier, pynvml_source=nvml)
    os.utime(verifier, (1, 1))  # source mtimes must not leak into the archive
    second = build_verifier_artifact({"p5.48xlarge": dict(reversed(list(expect.items())))}, verifier_source=verifier,
                                     pynvml_source=nvml)
    assert first == second
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()
    members = _members(first)
    # the gate's own unit is not in the bundle: the user-data carries it (test_shell_part_carries_the_gate_units)
    assert list(members) == ["expect/p5.48xlarge.json", "faults.json", "gate.sh", "gpu_verify.py", "health.sh",
                             "install.sh", "pynvml.py", "units/gpu-cloud-health.service",
                             "units/gpu-cloud-health.timer"]
    for unit in ("health.sh", "units/gpu-cloud-health.service", "units/gpu-cloud-health.timer"):
        assert members[unit][1] == (ROOT / "userdata" / unit).read_bytes()
    # The fault table the verifier judges by: decisions/nodes/faults.py's, as JSON.
    assert json.loads(members["faults.json"][1]) == bundle_document()
    assert members["gate.sh"][1] == (ROOT / "userdata/gate.sh").read_bytes()
    assert members["install.sh"][1] == (ROOT / "userdata/install.sh").read_bytes()
    assert members["gpu_verify.py"][1] == b"print('verify')\n"
    assert members["pynvml.py"][1] == b"X = 1\n"
    assert json.loads(members["expect/p5.48xlarge.json"][1]) == expect
    for info, _ in members.values():
        assert info.isreg() and info.mode == 0o644 and info.mtime == BUNDLE_MTIME
        assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
        assert not info.pax_headers
        assert not info.name.startswith("/") and ".." not in info.name
    # a different expectation gives a different artifact
    assert build_verifier_artifact({"p5.48xlarge": {**expect, "gpuCount": 4}}, verifier_source=verifier,
                                   pynvml_source=nvml) != first


def test_artifact_is_a_plain_ustar_archive_without_extension_headers(tmp_path, monkeypatch):
    inputs = _stand_ins(tmp_path)
    monkeypatch.setattr(render, "HERE", inputs.pop("here"))
    data = build_verifier_artifact(STAND_IN_EXPECT, **inputs)
    assert data[:2] != b"\x1f\x8b"          # not gzip (nor any other compression tar -xf would have to detect)
    assert len(data) % 10240 == 0            # whole 20-block records, as tar writes them
    headers = _raw_headers(data)
    assert [h[:100].rstrip(b"\0") for h in headers] == [
        b"expect/p4d.24xlarge.json", b"expect/p5.48xlarge.json", b"faults.json", b"gate.sh", b"gpu_verify.py",
        b"health.sh", b"install.sh", b"pynvml.py", b"units/gpu-cloud-health.service", b"units/gpu-cloud-health.timer"]                        # sorted; regular files only, no pax (x/g) or GNU (L/K) headers
    for h in headers:
        assert h[156:157] == b"0" and h[257:265] == b"ustar\x0000"
        assert h[100:108] == b"0000644\0" and h[108:124] == b"0000000\0" * 2 and h[136:148] == b"07033241600\0"
        assert h[265:329] == b"\0" * 64    # uname, gname empty
        assert int(h[148:154], 8) == sum(h[:148]) + 8 * 32 + sum(h[156:])   # header checksum


def test_artifact_bytes_do_not_depend_on_zlib_or_the_tarfile_writer(tmp_path, monkeypatch):
    """The property that matters: the sha256 in every node's user-data is the same whichever machine (zlib or
    zlib-ng, Python release) runs Pulumi. Breaking zlib, gzip and tarfile's writer must not change a byte."""
    inputs = _stand_ins(tmp_path)
    monkeypatch.setattr(render, "HERE", inputs.pop("here"))
    before = build_verifier_artifact(STAND_IN_EXPECT, **inputs)
    assert hashlib.sha256(before).hexdigest() == STAND_IN_SHA256

    import zlib

    def broken(*args, **kwargs):
        raise AssertionError("the bundle must not go through zlib, gzip or tarfile's writer")

    for module, name in ((zlib, "compressobj"), (zlib, "compress"), (zlib, "crc32"), (gzip, "compress"),
                         (gzip, "GzipFile"), (gzip, "open"), (tarfile, "open"), (tarfile.TarFile, "addfile"),
                         (tarfile.TarInfo, "tobuf")):
        monkeypatch.setattr(module, name, broken)
    assert build_verifier_artifact(STAND_IN_EXPECT, **inputs) == before


def test_artifact_is_what_gnu_tar_writes_and_extracts(tmp_path, monkeypatch):
    tar = require_tool("tar")
    if "GNU tar" not in subprocess.run([tar, "--version"], capture_output=True, text=True).stdout:
        missing("the byte comparison is against GNU tar (Debian's tar), which this machine's `tar` is not")
    inputs = _stand_ins(tmp_path)
    here = inputs.pop("here")
    monkeypatch.setattr(render, "HERE", here)
    data = build_verifier_artifact(STAND_IN_EXPECT, **inputs)
    (tmp_path / "verifier.tar").write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([tar, "-xf", str(tmp_path / "verifier.tar"), "-C", str(out), "--no-same-owner"], check=True)
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert names == [name.decode() for name in (h[:100].rstrip(b"\0") for h in _raw_headers(data))]
    for name in ("gate.sh", "install.sh", "gpu_verify.py", "pynvml.py"):
        assert (out / name).read_bytes() == (here / name).read_bytes()
    # GNU tar, asked for the same fixed metadata, writes the same bytes
    subprocess.run([tar, "--format=ustar", f"--mtime=@{BUNDLE_MTIME}", "--owner=0", "--group=0", "--numeric-owner",
                    "--mode=0644", "-cf", str(tmp_path / "gnu.tar"), "-C", str(out), *names], check=True)
    assert (tmp_path / "gnu.tar").read_bytes() == data


@pytest.mark.parametrize("itype", ["../../etc/cron.d/x", "x" * 100, "p5.48xlarge\u00e9"])
def test_artifact_refuses_member_names_ustar_cannot_hold_safely(itype, tmp_path):
    (tmp_path / "v.py").write_text("")
    with pytest.raises(ValueError, match="bundle member name"):
        build_verifier_artifact({itype: {}}, verifier_source=tmp_path / "v.py", pynvml_source=tmp_path / "v.py")


def test_artifact_defaults_to_repo_verifier_and_installed_pynvml():
    import pynvml
    gpu_verify = ROOT / "userdata/gpu_verify.py"
    data = build_verifier_artifact({"g6.12xlarge": {"instanceType": "g6.12xlarge"}})
    assert data == build_verifier_artifact({"g6.12xlarge": {"instanceType": "g6.12xlarge"}})
    members = _members(data)
    assert members["gpu_verify.py"][1] == gpu_verify.read_bytes()
    assert members["pynvml.py"][1] == Path(pynvml.__file__).read_bytes()
    assert re.search(rb"nvmlInit", members["pynvml.py"][1])
    # uncompressed: the bundle is the size of what it carries (pynvml.py is most of it), well under 1 MiB
    assert sum(len(body) for _, body in members.values()) < len(data) < 1024 * 1024
    print(f"verifier bundle: {len(data)} bytes")  # visible with -s; quoted in reports
