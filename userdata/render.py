"""EC2 user-data for gpu-cloud GPU nodes (EKS AL2023 accelerated AMI, self-managed ASGs).

Pure functions, no Pulumi imports. :func:`render_user_data` returns a MIME multipart/mixed
document with two parts:

1. ``application/node.eks.aws``: a nodeadm ``NodeConfig`` (apiVersion node.eks.aws/v1alpha1).
   Field names follow awslabs/amazon-eks-ami ``nodeadm/doc/api.md``: spec.cluster
   {name, apiServerEndpoint, certificateAuthority, cidr}, spec.containerd.config (TOML that nodeadm
   merges over its own containerd config), spec.kubelet {config (a KubeletConfiguration merged over
   the defaults: maxPods, registerWithTaints), flags}, spec.instance.localStorage.strategy
   (enum RAID0 | RAID10 | Mount).
2. ``text/x-shellscript``: ``export`` lines for the bootstrap environment contract, the gate's unit and the
   kubelet's drop-in (``GATE_UNITS``, installed before anything else), then
   the body of ``userdata/bootstrap.sh``. cloud-init runs it in cloud-final, before
   nodeadm-run.service starts the kubelet. It stays small: it fetches the pool's bundle, checks it
   and sources the bundle's ``gate.sh``, where the checks and the driver install live.

:func:`build_verifier_artifact` builds that bundle, an uncompressed ustar archive whose bytes depend
only on its inputs; the bootstrap downloads it from S3 and checks it against its sha256.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from decisions.config.model import kubelet_may_set_label
from decisions.nodes.faults import bundle_document

USER_DATA_LIMIT_BYTES = 16384  # EC2 user-data limit, before base64
MIME_BOUNDARY = "==GPU-CLOUD-USER-DATA=="
HERE = Path(__file__).resolve().parent
BOOTSTRAP_SH = HERE / "bootstrap.sh"
GPU_VERIFY_PY = HERE / "gpu_verify.py"
BUNDLE_SCRIPTS = ("gate.sh", "install.sh", "health.sh")   # sourced by bootstrap.sh; health.sh run by its unit
# systemd units in the bundle, which bootstrap.sh installs on a pass: the run-time checker and its timer
BOOT_UNITS = ("gpu-cloud-health.service", "gpu-cloud-health.timer")
# What bootstrap.sh installs first of all, before it has a bundle, so they travel in the user-data itself: the gate's
# unit, and the kubelet's drop-in that requires this boot's verdict (shell variable -> file in userdata/units/).
GATE_UNITS = {"GATE_UNIT": "gpu-cloud-gate.service", "KUBELET_DROPIN": "kubelet-gpu-cloud-gate.conf"}
DRIVER_SOURCES = ("ami", "install")
# gpuDriver.source install: containerd 2 (config version 3) runs containers through the NVIDIA runtime, set
# through the NodeConfig, the way nodeadm sets it itself when it finds nvidia-container-runtime on the
# accelerated AMI (nodeadm/internal/containerd/config2.template.toml, runtime_config_nvidia.go).
NVIDIA_CONTAINERD_CONFIG = """version = 3

[plugins.'io.containerd.cri.v1.runtime'.containerd]
default_runtime_name = "nvidia"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
base_runtime_spec = "/etc/containerd/base-runtime-spec.json"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
BinaryName = "/usr/bin/nvidia-container-runtime"
SystemdCgroup = true
"""
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# Fixed archive metadata so equal inputs give byte-identical output (and the same sha256).
_ARCHIVE_MTIME = 946684800  # 2000-01-01T00:00:00Z
_ARCHIVE_MODE = 0o644
_TAR_BLOCK = 512
_TAR_RECORD = 20 * _TAR_BLOCK  # tar's default blocking factor

_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_S3_URI_RE = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S+$")
_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9._/@:+-]{1,255}$")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class NodeBootstrap:
    cluster_name: str
    api_server_endpoint: str
    certificate_authority: str  # base64 PEM as EKS returns it
    service_cidr: str
    labels: Mapping[str, str]
    taints: Sequence[Taint]
    max_pods: Optional[int]
    raid0_instance_store: bool
    region: str
    asg_name: str
    lifecycle_hook_name: str
    pool_name: str
    artifact_uri: str
    artifact_sha256: str
    driver_source: str          # "ami": verify the AMI's driver; "install": install it, then verify
    ami_name: str               # the image the node boots (named in failure reasons)
    driver_branch: str
    driver_version: Optional[str]   # exact version the gate requires (always set for source ami)
    nvswitch: bool
    efa_count: int
    kmod_wait_s: int            # nvidia-kmod-load.service (accelerated AMI)
    fabric_manager_wait_s: int
    verify_budget_s: int = 60
    verify_kill_grace_s: int = 60  # the gate kills the verifier this long after its budget (decisions/nodes/boot.py)
    mig: bool = False          # MIG pools: the bootstrap turns MIG mode on before the verifier checks it
    lustre_client: bool = False    # pools whose pods mount FSx for Lustre: install the client, check the module loads


# --------------------------------------------------------------------------- validation


def _check_qualified_key(key: str, what: str) -> None:
    """Kubernetes qualified name: optional DNS-subdomain prefix + '/' + name (<= 63)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what} key must be a non-empty string, got {key!r}")
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        raise ValueError(f"{what} key {key!r}: prefix {prefix!r} is not a DNS subdomain")
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{what} key {key!r}: name part must be <= 63 characters of [A-Za-z0-9-_.], "
            "starting and ending alphanumeric"
        )


def _check_value(value: str, what: str) -> None:
    if not isinstance(value, str) or (value and not _NAME_RE.match(value)):
        raise ValueError(
            f"{what} value {value!r} must be empty or <= 63 characters of [A-Za-z0-9-_.], "
            "starting and ending alphanumeric"
        )


def _check_self_label(key: str) -> None:
    if not kubelet_may_set_label(key):
        raise ValueError(
            f"label {key!r} is in a reserved kubernetes.io/k8s.io namespace that the kubelet may "
            "not set on itself (use node.kubernetes.io/ or your own prefix)"
        )


def _validate(node: NodeBootstrap) -> None:
    if not node.cluster_name or not _SAFE_NAME_RE.match(node.cluster_name):
        raise ValueError(f"cluster_name {node.cluster_name!r} is not a valid EKS cluster name")
    if not re.match(r"^https://[^\s/]+(/\S*)?$", node.api_server_endpoint or ""):
        raise ValueError(f"api_server_endpoint must be an https:// URL, got {node.api_server_endpoint!r}")
    try:
        pem = base64.b64decode(node.certificate_authority, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"certificate_authority is not base64 ({exc})") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError("certificate_authority must be the base64 of a PEM certificate bundle")
    try:
        ipaddress.ip_network(node.service_cidr, strict=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"service_cidr {node.service_cidr!r} is not a network CIDR: {exc}") from None
    for key, value in node.labels.items():
        _check_qualified_key(key, "label")
        _check_value(value, f"label {key!r}")
        _check_self_label(key)
    seen = set()
    for taint in node.taints:
        if not isinstance(taint, Taint):
            raise ValueError(f"taints must be Taint instances, got {taint!r}")
        _check_qualified_key(taint.key, "taint")
        _check_value(taint.value, f"taint {taint.key!r}")
        if taint.effect not in TAINT_EFFECTS:
            raise ValueError(f"taint {taint.key!r}: effect {taint.effect!r} not in {TAINT_EFFECTS}")
        if (taint.key, taint.effect) in seen:
            raise ValueError(f"duplicate taint {taint.key}:{taint.effect}")
        seen.add((taint.key, taint.effect))
    if node.max_pods is not None and (
        isinstance(node.max_pods, bool) or not isinstance(node.max_pods, int) or node.max_pods < 1
    ):
        raise ValueError(f"max_pods must be a positive integer or None, got {node.max_pods!r}")
    if not _REGION_RE.match(node.region or ""):
        raise ValueError(f"region {node.region!r} is not an AWS region name")
    for field, value in (
        ("asg_name", node.asg_name),
        ("lifecycle_hook_name", node.lifecycle_hook_name),
        ("pool_name", node.pool_name),
    ):
        if not isinstance(value, str) or not _SAFE_NAME_RE.match(value):
            raise ValueError(f"{field} {value!r} must be 1-255 characters of [A-Za-z0-9._/@:+-]")
    if not _S3_URI_RE.match(node.artifact_uri or ""):
        raise ValueError(f"artifact_uri must look like s3://bucket/key.tar, got {node.artifact_uri!r}")
    if not _SHA256_RE.match(node.artifact_sha256 or ""):
        raise ValueError("artifact_sha256 must be 64 lowercase hex characters")
    if not re.match(r"^\d{3,4}$", node.driver_branch or ""):
        raise ValueError(f"driver_branch must be a driver branch number like '580', got {node.driver_branch!r}")
    if node.driver_version is not None and not re.match(
        rf"^{re.escape(node.driver_branch)}(\.\d+){{1,2}}$", node.driver_version
    ):
        raise ValueError(
            f"driver_version {node.driver_version!r} must be a full version on branch "
            f"{node.driver_branch} (e.g. {node.driver_branch}.65.06) or None"
        )
    if node.driver_source not in DRIVER_SOURCES:
        raise ValueError(f"driver_source must be one of {DRIVER_SOURCES}, got {node.driver_source!r}")
    if node.driver_source == "ami" and node.driver_version is None:
        raise ValueError("driver_version is required with driver_source ami (the AMI's driver)")
    if not re.match(r"^amazon-eks-node-al2023-[a-z0-9_.-]+$", node.ami_name or ""):
        raise ValueError(f"ami_name {node.ami_name!r} is not an EKS AL2023 AMI name")
    if isinstance(node.efa_count, bool) or not isinstance(node.efa_count, int) or node.efa_count < 0:
        raise ValueError(f"efa_count must be an integer >= 0, got {node.efa_count!r}")
    for field, value in (("verify_budget_s", node.verify_budget_s), ("verify_kill_grace_s", node.verify_kill_grace_s),
                         ("kmod_wait_s", node.kmod_wait_s),
                         ("fabric_manager_wait_s", node.fabric_manager_wait_s)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3600:
            raise ValueError(f"{field} must be an integer in 1..3600, got {value!r}")


# --------------------------------------------------------------------------- NodeConfig


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar
    raise TypeError(f"unsupported YAML scalar {value!r}")


def _yaml_lines(obj: Any, indent: int = 0) -> List[str]:
    """Block-style YAML for the small dict/list/scalar trees NodeConfig needs (deterministic)."""
    pad = "  " * indent
    lines: List[str] = []
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(value, (Mapping, list)) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(value, indent + 1))
            elif isinstance(value, (Mapping, list)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(value, Mapping) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_yaml_scalar(value)}")
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (Mapping, list)) and item:
                sub = _yaml_lines(item, indent + 1)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    else:
        raise TypeError(f"unsupported YAML node {obj!r}")
    return lines


def node_config(node: NodeBootstrap) -> dict:
    """The nodeadm NodeConfig document as a plain dict (field names per nodeadm/doc/api.md)."""
    kubelet_config: dict = {}
    if node.max_pods is not None:
        kubelet_config["maxPods"] = node.max_pods
    if node.taints:
        kubelet_config["registerWithTaints"] = [
            {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
            for t in node.taints
        ]
    kubelet: dict = {}
    if kubelet_config:
        kubelet["config"] = kubelet_config
    if node.labels:
        labels = ",".join(f"{k}={node.labels[k]}" for k in sorted(node.labels))
        kubelet["flags"] = [f"--node-labels={labels}"]
    spec: dict = {
        "cluster": {
            "name": node.cluster_name,
            "apiServerEndpoint": node.api_server_endpoint,
            "certificateAuthority": node.certificate_authority,
            "cidr": node.service_cidr,
        }
    }
    if node.driver_source == "install":
        # nodeadm-config writes containerd's config before cloud-init, when the toolkit is not installed yet,
        # so nodeadm's own detection of nvidia-container-runtime cannot fire on the standard AMI.
        spec["containerd"] = {"config": NVIDIA_CONTAINERD_CONFIG}
    if kubelet:
        spec["kubelet"] = kubelet
    if node.raid0_instance_store:
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


# --------------------------------------------------------------------------- shell part


def bootstrap_env(node: NodeBootstrap) -> "dict[str, str]":
    """The environment contract of userdata/bootstrap.sh, in a fixed order."""
    return {
        "GPU_CLOUD_REGION": node.region,
        "GPU_CLOUD_ASG_NAME": node.asg_name,
        "GPU_CLOUD_LIFECYCLE_HOOK": node.lifecycle_hook_name,
        "GPU_CLOUD_POOL": node.pool_name,
        "GPU_CLOUD_ARTIFACT_URI": node.artifact_uri,
        "GPU_CLOUD_ARTIFACT_SHA256": node.artifact_sha256,
        "GPU_CLOUD_DRIVER_SOURCE": node.driver_source,
        "GPU_CLOUD_AMI_NAME": node.ami_name,
        "GPU_CLOUD_DRIVER_BRANCH": node.driver_branch,
        "GPU_CLOUD_DRIVER_VERSION": node.driver_version or "",
        "GPU_CLOUD_NVSWITCH": "true" if node.nvswitch else "false",
        "GPU_CLOUD_EFA_COUNT": str(node.efa_count),
        "GPU_CLOUD_KMOD_WAIT_S": str(node.kmod_wait_s),
        "GPU_CLOUD_FM_WAIT_S": str(node.fabric_manager_wait_s),
        "GPU_CLOUD_VERIFY_BUDGET_S": str(node.verify_budget_s),
        "GPU_CLOUD_VERIFY_KILL_GRACE_S": str(node.verify_kill_grace_s),
        "GPU_CLOUD_MIG": "true" if node.mig else "false",
        "GPU_CLOUD_LUSTRE": "true" if node.lustre_client else "false",
    }


def _bootstrap_body() -> str:
    """bootstrap.sh without its shebang and its whole-line comments (shellcheck directives stay): the comments
    are for the reader of the source, and the user-data has a 16 KB limit to share with the NodeConfig."""
    lines = BOOTSTRAP_SH.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines[lines[0].startswith("#!"):]
                   if not line.lstrip().startswith("#") or line.lstrip().startswith("# shellcheck"))


def gate_unit_text(name: str) -> str:
    """A unit file of userdata/units/ as the user-data carries it: without its comment lines (they explain the
    source to its reader; the user-data has a 16 KB limit)."""
    lines = (HERE / "units" / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().startswith(("#", ";")))


def render_shell_part(node: NodeBootstrap) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in bootstrap_env(node).items())
    units = "".join(f"{var}={shlex.quote(gate_unit_text(name))}\n" for var, name in GATE_UNITS.items())
    return "#!/usr/bin/env bash\n" + exports + units + _bootstrap_body()


# --------------------------------------------------------------------------- user-data


def render_user_data(node: NodeBootstrap) -> str:
    """MIME multipart/mixed user-data (text, not base64). Raises ValueError on bad input or
    when the document exceeds EC2's 16 KB user-data limit."""
    _validate(node)
    nodeadm = "---\n" + "\n".join(_yaml_lines(node_config(node))) + "\n"
    script = render_shell_part(node)
    for name, body in (("NodeConfig", nodeadm), ("shell script", script)):
        if MIME_BOUNDARY in body:
            raise ValueError(f"the {name} part contains the MIME boundary {MIME_BOUNDARY!r}")
        if not body.isascii():
            raise ValueError(f"the {name} part must be ASCII")
    doc = (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\n'
        "\n"
        f"--{MIME_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n"
        "\n"
        f"{nodeadm}\n"
        f"--{MIME_BOUNDARY}\n"
        'Content-Type: text/x-shellscript; charset="us-ascii"\n'
        "\n"
        f"{script}\n"
        f"--{MIME_BOUNDARY}--\n"
    )
    size = len(doc.encode("utf-8"))
    if size > USER_DATA_LIMIT_BYTES:
        raise ValueError(
            f"user-data is {size} bytes, over EC2's {USER_DATA_LIMIT_BYTES}-byte limit "
            f"(labels: {len(node.labels)}, taints: {len(node.taints)}); trim labels/taints"
        )
    return doc


# --------------------------------------------------------------------------- verifier artifact


def _pynvml_path() -> Path:
    import pynvml  # shipped by the nvidia-ml-py package

    return Path(pynvml.__file__)


def _ustar_member(name: str, data: bytes) -> bytes:
    """One regular-file member: a 512-byte POSIX ustar header, then the data padded to 512 bytes.

    Written field by field (POSIX.1-1988 ustar, pax(1) "ustar Interchange Format") instead of through
    tarfile, whose header bytes have changed between Python releases (devmajor/devminor of regular
    files, for one). The fields are what GNU tar ``--format=ustar --numeric-owner`` writes.
    """
    raw = name.encode("utf-8")
    if not name.isascii() or not 0 < len(raw) <= 100 or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"bundle member name {name!r} must be a relative ASCII path of at most 100 bytes")
    if len(data) >= 8 ** 11:
        raise ValueError(f"bundle member {name!r} is too large for a ustar header")

    def octal(value: int, width: int) -> bytes:  # zero-padded octal digits and a NUL
        return b"%0*o\0" % (width - 1, value)

    header = b"".join((
        raw.ljust(100, b"\0"),               # name
        octal(_ARCHIVE_MODE, 8),               # mode
        octal(0, 8),                           # uid
        octal(0, 8),                           # gid
        octal(len(data), 12),                  # size
        octal(_ARCHIVE_MTIME, 12),             # mtime
        b" " * 8,                              # chksum, counted as spaces
        b"0",                                  # typeflag: regular file
        b"\0" * 100,                           # linkname
        b"ustar\0", b"00",                     # magic, version
        b"\0" * 32,                            # uname: empty (numeric owner only)
        b"\0" * 32,                            # gname
        octal(0, 8),                           # devmajor
        octal(0, 8),                           # devminor
        b"\0" * 155,                           # prefix: unused, names fit in name
    )).ljust(_TAR_BLOCK, b"\0")
    header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    return header + data + b"\0" * (-len(data) % _TAR_BLOCK)


def build_verifier_artifact(
    expectations: Mapping[str, Mapping],
    *,
    verifier_source: Optional[Path] = None,
    pynvml_source: Optional[Path] = None,
    faults: Optional[Mapping[str, Any]] = None,
) -> bytes:
    """The pool's verifier bundle: an uncompressed POSIX ustar archive of the gate scripts (gate.sh,
    install.sh), the run-time checker (health.sh) and its systemd units (units/; the gate's own unit travels in the
    user-data, GATE_UNITS), gpu_verify.py,
    pynvml.py, faults.json (decisions/nodes/faults.py: the fault table the verifier judges by) and
    expect/<instance type>.json per type.

    A pool may list several instance types; the bootstrap picks the expectation for the type IMDS reports.

    ``verifier_source`` / ``pynvml_source`` / ``faults`` default to userdata/gpu_verify.py, the installed
    nvidia-ml-py's pynvml.py and decisions/nodes/faults.py's table; tests pass stand-ins.

    The bytes depend only on the inputs, never on the machine that runs Pulumi: their sha256 is in every
    node's user-data, so a bundle that differed between machines would change every launch template and
    roll every node. Hence no compression (deflate output differs between zlib builds, zlib and zlib-ng
    for instance) and headers written here, not by tarfile: members sorted by name, regular files only,
    mode 0644, uid/gid 0, empty uname/gname, a fixed mtime, no pax or GNU extension headers, two zero
    blocks and padding to a 10240-byte record, as GNU tar ``--format=ustar --numeric-owner`` writes it.
    The bootstrap extracts it with ``tar -xf``. At about 400 KB, it is small enough not to need
    compression.
    """
    files = {
        **{script: (HERE / script).read_bytes() for script in BUNDLE_SCRIPTS},
        **{f"units/{unit}": (HERE / "units" / unit).read_bytes() for unit in BOOT_UNITS},
        "gpu_verify.py": Path(verifier_source or GPU_VERIFY_PY).read_bytes(),
        "pynvml.py": Path(pynvml_source or _pynvml_path()).read_bytes(),
        "faults.json": (json.dumps(bundle_document() if faults is None else faults, sort_keys=True, indent=2)
                        + "\n").encode("utf-8"),
        **{f"expect/{itype}.json": (json.dumps(expect, sort_keys=True, indent=2) + "\n").encode("utf-8")
           for itype, expect in expectations.items()},
    }
    out = b"".join(_ustar_member(name, files[name]) for name in sorted(files)) + b"\0" * (2 * _TAR_BLOCK)
    return out + b"\0" * (-len(out) % _TAR_RECORD)
