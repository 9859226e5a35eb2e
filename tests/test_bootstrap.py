"""The node gate run for real: the user-data script (bootstrap.sh as rendered, with its exports) fetching the
real bundle (gate.sh, install.sh, built by build_verifier_artifact) from S3, on a sandbox modelled on the EKS
AL2023 AMIs.

What is real: bash and the scripts as rendered and bundled, curl, sha256sum, tar, timeout, readlink, python3,
the AWS CLI (`.venv/bin/aws`) against moto in server mode on 127.0.0.1 (S3 download, EC2 CreateTags, Auto
Scaling CompleteLifecycleAction; moto 5.2.5 lacks the last, so a recording implementation is added) and a fake
IMDSv2 on 127.0.0.1.

The host is modelled on awslabs/amazon-eks-ami templates/al2023 (v20260714, Kubernetes 1.33), not a laptop:
- Accelerated (NVIDIA) AMI: the driver's kernel module is not loaded when cloud-final runs. nvidia-kmod-load
  .service (a one-shot ordered only after network-online) loads it some time later; until then nvidia-smi
  fails as it does without a loaded module. nvidia-fabricmanager (ordered after it) becomes active minutes
  later on NVSwitch types; nvidia-persistenced once the module is loaded.
- EFA is installed with `efa_installer.sh --minimal` on both AMIs: no libfabric, so no `fi_info` anywhere; the
  devices exist only in sysfs, as /sys/class/infiniband/<dev> whose device/driver links to the efa PCI driver.
- Standard AMI (gpuDriver.source install): no nvidia-smi, no NVIDIA units, kernel 6.12.94-123.180.amzn2023;
  packages appear only when the gate installs them; the gate installs no EFA software.
A background thread plays systemd's part of the boot (the one-shot finishing, the fabric manager training).
The AMI's own boot units (nodeadm-run.service, kubelet.service, ... at v20260714, tests/upstream/al2023-units.json)
sit in the sandbox's /etc/systemd/system; the real `systemctl --root=DIR enable` links the gate's units among them,
and a reboot (`reboot()` below) starts nodeadm-run.service as systemd would: first the units it requires and that
come before it, run from their unit files; if one fails, nodeadm-run and so the kubelet never start.

Stand-ins (PATH shims) exist only for what this machine lacks or must not touch: `nvidia-smi`,
`nv-fabricmanager`, `systemctl` (unit states in files; `start` waits for an activating job as systemd does;
`--root=DIR mask` makes the /dev/null links; `--root=DIR enable` is the real systemctl), `dnf`, `modprobe`, `modinfo`, `uname` (the AMI's kernel), and on the
a libfabric `fi_info` where a test plants one (an image with the full EFA install). The verifier inside the bundle is a
small stand-in gpu_verify.py that writes a pass or fail report chosen by FAKE_VERIFY; the real verifier is
tested in test_gpu_verify.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import boto3
import pytest
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import EmptyResult

from tests import upstream_records
from tests.conftest import VENV_BIN, require_tool
from tests.loopback import LoopbackServer, QuietHandler, moto_server
from userdata.render import NodeBootstrap, build_verifier_artifact, render_shell_part

REGION = "us-east-1"
BUCKET = "gpu-cloud-artifacts"
ASG = "gpu-cloud-p5-asg"
HOOK = "gpu-cloud-verify"
AMI_DRIVER = "580.159.03"        # kmod-nvidia-latest-dkms of amazon-eks-node-al2023-x86_64-nvidia-1.33-v20260714
AMI_NAME = "amazon-eks-node-al2023-x86_64-nvidia-1.33-v20260714"
STANDARD_AMI = "amazon-eks-node-al2023-x86_64-standard-1.33-v20260714"
AMI_KERNEL = "6.12.94-123.180.amzn2023.x86_64"
AMI_UNITS = upstream_records.record("al2023-units.json")
REPO_DRIVER = "580.159.03"       # what `dnf install nvidia-open` resolves to on the 580-open stream
CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="

# ----------------------------------------------------------------------------- moto, IMDS, EFA download

LIFECYCLE_CALLS: list = []


def _complete_lifecycle_action(self):  # recording stand-in; moto 5.2.5 lacks this action
    LIFECYCLE_CALLS.append({
        "hook": self._get_param("LifecycleHookName"),
        "asg": self._get_param("AutoScalingGroupName"),
        "instance": self._get_param("InstanceId"),
        "result": self._get_param("LifecycleActionResult"),
    })
    return EmptyResult()  # like moto's other no-output actions (e.g. delete_lifecycle_hook)


@pytest.fixture(scope="module")
def moto_endpoint():
    mp = pytest.MonkeyPatch()
    mp.setattr(AutoScalingResponse, "complete_lifecycle_action", _complete_lifecycle_action, raising=False)
    try:
        with moto_server() as endpoint:
            yield endpoint
    finally:
        mp.undo()


def _client(service, endpoint):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


class FakeImds:
    """IMDSv2 only: PUT /latest/api/token (TTL header required), GET needs the token."""

    def __init__(self):
        self.instance_id = ""
        self.instance_type = "p5.48xlarge"
        self.fail_token_puts = 0
        self.token_puts = 0
        owner = self

        class Handler(QuietHandler):
            def do_PUT(self):
                owner.token_puts += 1
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.answer(400)
                if owner.fail_token_puts > 0:
                    owner.fail_token_puts -= 1
                    return self.answer(500, b"transient")
                self.answer(200, b"tok-123")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    return self.answer(401)
                found = {"/latest/meta-data/instance-id": owner.instance_id,
                         "/latest/meta-data/instance-type": owner.instance_type}.get(self.path)
                self.answer(200, found.encode()) if found is not None else self.answer(404)

        self._server = LoopbackServer(Handler)
        self.url = self._server.url

    def close(self):
        self._server.close()


@pytest.fixture(scope="module")
def imds():
    fake = FakeImds()
    yield fake
    fake.close()


# libfabric's fi_info, where an image has the full EFA install (/opt/amazon/efa/bin): one RDM domain per EFA device
# the kernel exposes (libfabric's efa provider enumerates them through rdma-core, which reads sysfs), each listed
# for both fabrics, as fi_info does. Neither EKS AMI has it (both install EFA with `efa_installer.sh --minimal`).
FAKE_FI_INFO = r"""
n=${FAKE_FI_INFO_DEVICES:-$(ls "$GPU_CLOUD_ROOT/sys/class/infiniband" 2>/dev/null | wc -l)}
for i in $(seq 1 "$n"); do for fabric in efa efa-direct; do
  printf 'provider: efa\n    fabric: %s\n    domain: rdmap%ss0-rdm\n    version: 122.0\n    type: FI_EP_RDM\n' "$fabric" "$i"
done; done
"""


# ----------------------------------------------------------------------------- the host's stand-ins

SHIMS = {
    # installed (into bin) by the AMI, or by `dnf install nvidia-open` on the standard AMI
    "nvidia-smi.installed": r"""
        echo "nvidia-smi $*" >>"$FAKE_STATE/calls.log"
        if [ ! -s "$FAKE_STATE/kmod" ]; then
          echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
          exit 9
        fi
        each() { for _ in 1 2 3 4 5 6 7 8; do echo "$1"; done; }
        case "$*" in
          *driver_version*) each "$(cat "$FAKE_STATE/kmod")" ;;
          *persistence_mode*) if [ -e "$FAKE_STATE/pm" ]; then each Enabled; else each Disabled; fi ;;
          "-pm 1") touch "$FAKE_STATE/pm"; echo "Enabled persistence mode" ;;
          "-mig 1") [ -z "$FAKE_MIG_NEEDS_RESET" ] && touch "$FAKE_STATE/mig"; echo "Enabled MIG Mode" ;;
          *mig.mode.current*) if [ -e "$FAKE_STATE/mig" ]; then each Enabled; else each Disabled; fi ;;
          *) exit 2 ;;
        esac
    """,
    "nv-fabricmanager.installed": r"""
        echo "Fabric Manager version is : $(cat "$FAKE_STATE/fm_version")"
    """,
    "systemctl": r"""
        echo "systemctl $*" >>"$FAKE_STATE/systemctl.log"
        root=""
        if [ "${1#--root=}" != "$1" ]; then root=${1#--root=}; shift; fi
        [ "$1" = --no-block ] && { nb=1; shift; }
        cmd=$1; shift
        unit() { u=${1%.service}; echo "$FAKE_STATE/units/$u"; }
        state() { f=$(unit "$1"); if [ -e "$f" ]; then cat "$f"; else echo inactive; fi; }
        begin() {  # joins a running start job; starts an inactive unit (persistenced at once, FM after training)
          f=$(unit "$1")
          [ -e "$f" ] || { echo "Failed to start $1: Unit $1 not found." >&2; return 5; }
          case "$(cat "$f")" in
            active) return 0 ;;
            inactive|failed) case "${1%.service}" in
                nvidia-fabricmanager) echo activating >"$f"
                  ( sleep "${FAKE_FM_START_S:-0}"; echo active >"$f" ) >/dev/null 2>&1 & ;;
                nvidia-persistenced) echo active >"$f"; touch "$FAKE_STATE/pm" ;;
                nvidia-kmod-load) ;;    # a re-run meets the same module problem: it stays failed
                *) echo active >"$f" ;;
              esac ;;
          esac
          [ -n "$nb" ] && return 0
          # systemctl start waits for the job (logged, so a test can tell it really met a job still running)
          [ "$(cat "$f")" = activating ] && echo "waited for ${1%.service}" >>"$FAKE_STATE/systemctl.log"
          while [ "$(cat "$f")" = activating ]; do sleep 0.05; done
          [ "$(cat "$f")" = active ]
        }
        case "$cmd" in
          is-active) [ "$1" = --quiet ] && { q=1; shift; }
                     s=$(state "$1"); [ -z "$q" ] && echo "$s"; [ "$s" = active ] ;;
          start) for u in "$@"; do begin "$u" || exit $?; done ;;
          enable) if [ -n "$root" ]; then exec "$FAKE_REAL_SYSTEMCTL" --root="$root" enable "$@"; fi
                  [ "$1" = --now ] && { now=1; shift; }
                  for u in "$@"; do [ -e "$(unit "$u")" ] || exit 1; [ -n "$now" ] && { begin "$u" || exit $?; }; done; true ;;
          mask) mkdir -p "$root/etc/systemd/system"
                for u in "$@"; do ln -sf /dev/null "$root/etc/systemd/system/$u"; done ;;
          stop) ;;
          *) exit 1 ;;
        esac
    """,
    "dnf": r"""
        echo "dnf $*" >>"$FAKE_STATE/dnf.log"
        case "$*" in
          *"config-manager --add-repo"*) mkdir -p "$GPU_CLOUD_ROOT/etc/yum.repos.d"
                                         touch "$GPU_CLOUD_ROOT/etc/yum.repos.d/cuda-amzn2023.repo" ;;
        esac
        [ "$2" = install ] || exit 0
        for p in "${@:3}"; do case "$p" in
          nvidia-open|nvidia-open-*) v=${p#nvidia-open}; v=${v#-}; echo "${FAKE_BUILT_DRIVER:-${v:-$FAKE_REPO_DRIVER}}" >"$FAKE_STATE/dkms"
                                     cp "$FAKE_STATE/templates/nvidia-smi" "$FAKE_BIN/nvidia-smi" ;;
          nvidia-fabricmanager-*|nvidia-fabric-manager-*) echo "${p##*-}" >"$FAKE_STATE/fm_version"
                                     echo inactive >"$FAKE_STATE/units/nvidia-fabricmanager"
                                     cp "$FAKE_STATE/templates/nv-fabricmanager" "$FAKE_BIN/nv-fabricmanager" ;;
          nvidia-persistenced-*) echo inactive >"$FAKE_STATE/units/nvidia-persistenced" ;;
          nvidia-container-toolkit) printf '#!/bin/sh\n' >"$FAKE_BIN/nvidia-container-runtime"
                                    chmod +x "$FAKE_BIN/nvidia-container-runtime" ;;
          lustre-client) echo "${FAKE_LUSTRE_KMOD_KERNEL:-$FAKE_KERNEL}" >"$FAKE_STATE/lustre_kmod" ;;
        esac; done
    """,
    # Modules live under /lib/modules/<kernel>: one built for another kernel is invisible to modinfo and modprobe.
    "modinfo": r"""
        echo "modinfo $*" >>"$FAKE_STATE/calls.log"
        case "$1" in
          nvidia) [ -s "$FAKE_STATE/dkms" ] && { echo "filename: /lib/modules/$FAKE_KERNEL/extra/nvidia.ko.xz"; exit 0; } ;;
          lustre) [ "$(cat "$FAKE_STATE/lustre_kmod" 2>/dev/null)" = "$FAKE_KERNEL" ] &&
                    { echo "filename: /lib/modules/$FAKE_KERNEL/extra/lustre/lustre.ko"; exit 0; } ;;
        esac
        echo "modinfo: ERROR: Module $1 not found." >&2; exit 1
    """,
    "modprobe": r"""
        echo "modprobe $*" >>"$FAKE_STATE/calls.log"
        case "$1" in
          nvidia) [ -s "$FAKE_STATE/dkms" ] || { echo "modprobe: FATAL: Module $1 not found" >&2; exit 1; }
                  cp "$FAKE_STATE/dkms" "$FAKE_STATE/kmod" ;;
          lustre) [ "$(cat "$FAKE_STATE/lustre_kmod" 2>/dev/null)" = "$FAKE_KERNEL" ] ||
                    { echo "modprobe: FATAL: Module lustre not found in directory /lib/modules/$FAKE_KERNEL" >&2; exit 1; }
                  mkdir -p "$GPU_CLOUD_ROOT/sys/module/lustre" ;;
          ib_umad) mkdir -p "$GPU_CLOUD_ROOT/sys/module/ib_umad" ;;   # in the AL2023 kernel's modules
          *) echo "modprobe: FATAL: Module $1 not found" >&2; exit 1 ;;
        esac
    """,
    "uname": r"""
        case "$1" in -r) echo "$FAKE_KERNEL" ;; -m) echo x86_64 ;; *) echo Linux ;; esac
    """,
}

FAKE_VERIFIER = r'''
import argparse, json, os, sys
import pynvml  # must come from the artifact via PYTHONPATH
p = argparse.ArgumentParser()
for a in ("--expect", "--report", "--textfile", "--budget-s"):
    p.add_argument(a, required=True)
p.add_argument("--mode", default="boot")
args = p.parse_args()
expect = json.load(open(args.expect))
mode = os.environ.get("FAKE_VERIFY", "pass")
if mode == "crash":
    sys.exit(2)
if mode == "hang":                      # stuck where a signal cannot reach it (a call into the NVIDIA library)
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
checks = [{"name": "gpu_count", "status": "pass", "gpu": None, "value": 8, "threshold": 8, "detail": ""}]
if mode == "fail":
    checks += [
        {"name": "nvlink_active", "status": "fail", "gpu": 3, "value": 16, "threshold": 18, "detail": "2 links down"},
        {"name": "temperature", "status": "pass", "gpu": 1, "value": 40, "threshold": 85, "detail": ""},
        {"name": "ecc_uncorrected", "status": "fail", "gpu": 1, "value": 2, "threshold": 0, "detail": ""},
    ]
report = {"verdict": "fail" if mode == "fail" else "pass", "mode": args.mode, "instanceType": expect["instanceType"],
          "instanceId": os.environ["GPU_CLOUD_INSTANCE_ID"], "durationS": 0.1, "checks": checks,
          "argv": {"budget_s": args.budget_s, "textfile": args.textfile}, "pynvml": pynvml.MARKER}
open(args.report, "w").write(json.dumps(report))
open(args.textfile, "w").write('gpu_cloud_verify_pass %d\n' % (mode != "fail"))
sys.exit(1 if mode == "fail" else 0)
'''


def _write_exe(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body).lstrip())
    path.chmod(0o755)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    src = tmp_path_factory.mktemp("artifact-src")
    (src / "gpu_verify.py").write_text(FAKE_VERIFIER)
    (src / "pynvml.py").write_text("MARKER = 'artifact-pynvml'\n")
    data = build_verifier_artifact(
        {"p5.48xlarge": {"instanceType": "p5.48xlarge", "gpuCount": 8},
         "p4d.24xlarge": {"instanceType": "p4d.24xlarge", "gpuCount": 8}},
        verifier_source=src / "gpu_verify.py", pynvml_source=src / "pynvml.py")
    return data, hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the harness


def _pool_group(ec2, autoscaling):
    """The pool's Auto Scaling group in moto (made once): every test instance is attached to it, as the group's
    own launches are, so that SetInstanceHealth finds it."""
    if not autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[ASG])["AutoScalingGroups"]:
        ec2.create_launch_template(LaunchTemplateName="gpu-cloud-p5", LaunchTemplateData={"ImageId": "ami-12c6146b"})
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=ASG, MinSize=0, MaxSize=1000, DesiredCapacity=0, AvailabilityZones=[f"{REGION}a"],
            LaunchTemplate={"LaunchTemplateName": "gpu-cloud-p5", "Version": "$Latest"})
    return autoscaling


_LIST_KEYS = {"After", "Before", "Requires", "Wants", "RequiredBy", "WantedBy"}


class Node:
    """One fresh EC2 instance in moto, a sandbox root modelled on one AMI, and run() of its user-data."""

    def __init__(self, tmp_path, endpoint, imds, artifact, *, ami="nvidia", efa_devices=32,
                 ami_driver=AMI_DRIVER, **overrides):
        self.tmp, self.imds, self.ami = tmp_path, imds, ami
        self.root, self.state, self.bin = tmp_path / "root", tmp_path / "state", tmp_path / "bin"
        for d in (self.root, self.state, self.bin, self.state / "units", self.state / "templates"):
            d.mkdir(parents=True, exist_ok=True)
        for name, body in SHIMS.items():
            if name.endswith(".installed"):
                _write_exe(self.state / "templates" / name.removesuffix(".installed"), body)
            else:
                _write_exe(self.bin / name, body)
        self._sysfs(efa_devices)
        if ami == "nvidia":   # what the accelerated AMI brings: user space, archived module, enabled units
            for name in ("nvidia-smi", "nv-fabricmanager"):
                (self.bin / name).write_bytes((self.state / "templates" / name).read_bytes())
                (self.bin / name).chmod(0o755)
            (self.state / "fm_version").write_text(ami_driver + "\n")
            self.ami_driver = ami_driver
            for unit in ("nvidia-kmod-load", "nvidia-fabricmanager", "nvidia-persistenced"):
                (self.state / "units" / unit).write_text("activating\n" if unit == "nvidia-kmod-load" else "inactive\n")
        data, sha = artifact
        key = overrides.pop("artifact_key", f"verify/{sha}.tar")
        s3 = _client("s3", endpoint)
        try:
            s3.create_bucket(Bucket=BUCKET)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        s3.put_object(Bucket=BUCKET, Key=f"verify/{sha}.tar", Body=data)
        self.ec2 = _client("ec2", endpoint)
        self.instance_id = self.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        imds.instance_id = self.instance_id
        self.s3, self.autoscaling = s3, _client("autoscaling", endpoint)
        _pool_group(self.ec2, self.autoscaling).attach_instances(AutoScalingGroupName=ASG, InstanceIds=[self.instance_id])
        units = self.root / "etc/systemd/system"    # the AMI's boot units, as it installs them
        units.mkdir(parents=True)
        for unit, found in AMI_UNITS["units"].items():
            (units / unit).write_text(found["text"])
        params = dict(
            cluster_name="gpu", api_server_endpoint="https://example.eks.amazonaws.com", certificate_authority=CA,
            service_cidr="172.20.0.0/16", labels={}, taints=(), max_pods=None, raid0_instance_store=False,
            region=REGION, asg_name=ASG, lifecycle_hook_name=HOOK, pool_name="p5",
            artifact_uri=f"s3://{BUCKET}/{key}", artifact_sha256=sha,
            driver_source="ami" if ami == "nvidia" else "install",
            ami_name=AMI_NAME if ami == "nvidia" else STANDARD_AMI,
            driver_branch="580", driver_version=AMI_DRIVER if ami == "nvidia" else None,
            nvswitch=True, efa_count=32, kmod_wait_s=30, fabric_manager_wait_s=30, verify_budget_s=30)
        params.update(overrides)
        self.script = tmp_path / "user-data.sh"
        self.script.write_text(render_shell_part(NodeBootstrap(**params)))
        self.env = {
            "PATH": f"{self.bin}:{VENV_BIN}:/usr/bin:/bin",
            "HOME": str(tmp_path), "LANG": "C.UTF-8",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
            "GPU_CLOUD_ROOT": str(self.root), "GPU_CLOUD_IMDS_ENDPOINT": imds.url,
            "GPU_CLOUD_RETRY_BASE_S": "0.05", "GPU_CLOUD_POLL_S": "0.1",
            "FAKE_STATE": str(self.state), "FAKE_BIN": str(self.bin), "FAKE_KERNEL": AMI_KERNEL,
            "FAKE_REPO_DRIVER": REPO_DRIVER, "FAKE_VERIFY": "pass",
            "FAKE_REAL_SYSTEMCTL": require_tool("systemctl"),
        }

    def _sysfs(self, count):
        """EFA devices as the kernel shows them: class links into the PCI device, whose driver is efa."""
        sys_ = self.root / "sys"
        (sys_ / "bus/pci/drivers/efa").mkdir(parents=True, exist_ok=True)
        (sys_ / "class/infiniband").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pci = f"0000:{0x10 + i:02x}:00.0"
            dev = sys_ / "devices/pci0000:00" / pci
            (dev / "infiniband" / f"rdmap{16 + i}s0").mkdir(parents=True)
            (dev / "driver").symlink_to("../../../bus/pci/drivers/efa")
            (dev / "infiniband" / f"rdmap{16 + i}s0" / "device").symlink_to(f"../../../{pci}")
            (sys_ / "class/infiniband" / f"rdmap{16 + i}s0").symlink_to(
                f"../../devices/pci0000:00/{pci}/infiniband/rdmap{16 + i}s0")

    def boot(self, kmod_after=0.0, kmod_result="active", fm_after=0.0, fm_result="active"):
        """systemd's part of the accelerated AMI's boot, running alongside cloud-final: nvidia-kmod-load
        finishes `kmod_after` seconds in (loading the AMI's module), then the fabric manager and persistenced."""
        units = self.state / "units"

        def run():
            time.sleep(kmod_after)
            if kmod_result == "active":
                (self.state / "kmod").write_text(self.ami_driver + "\n")
                (units / "nvidia-persistenced").write_text("active\n")
                (self.state / "pm").touch()     # the daemon turns persistence mode on for every GPU
                (units / "nvidia-fabricmanager").write_text("activating\n")
            (units / "nvidia-kmod-load").write_text(kmod_result + "\n")
            if kmod_result == "active" and fm_result is not None:
                time.sleep(fm_after)
                (units / "nvidia-fabricmanager").write_text(fm_result + "\n")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def run(self, **env):
        self.proc = subprocess.run(["bash", str(self.script)], env={**self.env, **env}, capture_output=True,
                                   text=True, timeout=120)
        return self.proc

    # --- observations
    def tags(self):
        """The gate's tags (the group adds aws:autoscaling:groupName itself)."""
        found = self.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [self.instance_id]}])
        return {t["Key"]: t["Value"] for t in found["Tags"] if not t["Key"].startswith("aws:")}

    def lifecycle(self):
        return [c for c in LIFECYCLE_CALLS if c["instance"] == self.instance_id]

    def shim_log(self, name):
        path = self.state / f"{name}.log"
        return path.read_text().splitlines() if path.exists() else []

    def log(self):
        return (self.root / "var/log/gpu-cloud/bootstrap.log").read_text()

    def report(self):
        return json.loads((self.root / "var/lib/gpu-cloud/verify.json").read_text())

    def published(self):
        """This instance's reports in the artifact bucket's gate-reports/, oldest first."""
        found = self.s3.list_objects_v2(Bucket=BUCKET, Prefix="gate-reports/p5/").get("Contents", [])
        keys = [o["Key"] for o in found if f"-{self.instance_id}-" in o["Key"]]
        return [(k, json.loads(self.s3.get_object(Bucket=BUCKET, Key=k)["Body"].read())) for k in keys]

    def health(self):
        found = self.autoscaling.describe_auto_scaling_instances(InstanceIds=[self.instance_id])
        return found["AutoScalingInstances"][0]["HealthStatus"]

    def unit(self, name):
        """A unit file of the sandbox, as {key: [values]} per section (systemd's list settings accumulate)."""
        sections: dict = {}
        current = None
        for line in (self.root / "etc/systemd/system" / name).read_text().splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            current.setdefault(key, []).extend(value.split() if key in _LIST_KEYS else [value])
        return sections

    def reboot(self, boot=None, **env):
        """The instance boots again: its modules and daemons start afresh (boot(**boot) plays them), and systemd starts
        nodeadm-run.service, which nodeadm uses to (re)start the kubelet. Before it, every unit it requires that is
        ordered before it runs from its unit file (ExecStart, Environment); a failed one fails nodeadm-run's start
        job, as systemd's Requires= with After= does. Returns whether the kubelet started."""
        for path in ("kmod", "pm"):
            (self.state / path).unlink(missing_ok=True)
        for unit in ("nvidia-kmod-load", "nvidia-fabricmanager", "nvidia-persistenced"):
            if (self.state / "units" / unit).exists():
                (self.state / "units" / unit).write_text("activating\n" if unit == "nvidia-kmod-load" else "inactive\n")
        if self.ami == "nvidia":
            self.boot(**(boot or {}))
        units = self.root / "etc/systemd/system"
        run = units / "nodeadm-run.service"
        self.boot_runs = []
        if run.is_symlink() and os.readlink(run) == "/dev/null":
            return False                                   # masked: nothing starts it
        nodeadm_run = self.unit("nodeadm-run.service")
        required = set(nodeadm_run["Unit"].get("Requires", []))
        required |= {p.name for p in (units / "nodeadm-run.service.requires").glob("*")}
        for name in sorted(required):
            if not (units / name).exists():
                continue                                   # the AMI's nodeadm-config: not modelled here
            unit = self.unit(name)
            if "nodeadm-run.service" not in unit["Unit"].get("Before", []):
                continue
            environment = dict(item.split("=", 1) for item in unit["Service"].get("Environment", []))
            command = unit["Service"]["ExecStart"][0].split()
            command[0] = str(self.root) + command[0]       # the unit's command, in the sandbox
            self.boot_runs.append(name)
            self.proc = subprocess.run(command, env={**self.env, **environment, **env}, capture_output=True,
                                       text=True, timeout=120)
            if self.proc.returncode != 0:
                return False                               # "Dependency failed for EKS Nodeadm Run"
        kubelet = units / "kubelet.service"
        return not (kubelet.is_symlink() and os.readlink(kubelet) == "/dev/null")

    def masked(self):
        unit_dir = self.root / "etc/systemd/system"
        return sorted(p.name for p in unit_dir.glob("*") if p.is_symlink() and os.readlink(p) == "/dev/null") \
            if unit_dir.exists() else []

    def explain(self):
        return f"rc={self.proc.returncode}\n--- stderr ---\n{self.proc.stderr[-6000:]}"


@pytest.fixture
def node(tmp_path, moto_endpoint, imds, artifact):
    require_tool("aws")
    require_tool("systemctl")
    created = []

    def make(**overrides):
        n = Node(tmp_path / f"n{len(created)}", moto_endpoint, imds, artifact, **overrides)
        created.append(n)
        return n

    return make


@pytest.fixture(scope="module")
def default_node(tmp_path_factory, moto_endpoint, imds, artifact):
    """One node with every default (accelerated AMI, boot at once), run once: the tests that assert different
    things about that same run share it and only read it."""
    require_tool("aws")
    require_tool("systemctl")
    n = Node(tmp_path_factory.mktemp("default-node"), moto_endpoint, imds, artifact)
    n.boot()
    n.run()
    return n


def _assert_abandoned(n, reason_part):
    assert n.proc.returncode != 0, n.explain()
    assert n.lifecycle() == [{"hook": HOOK, "asg": ASG, "instance": n.instance_id, "result": "ABANDON"}], n.explain()
    tags = n.tags()
    assert tags.get("gpu-cloud:verify") == "fail", n.explain()
    reason = tags.get("gpu-cloud:verify-reason", "")
    assert reason and reason_part in reason, (reason, n.explain())
    assert len(reason) <= 256
    assert n.masked() == ["kubelet.service", "nodeadm-run.service"], n.explain()
    assert any(line.split()[-3:] == ["mask", "nodeadm-run.service", "kubelet.service"]
               for line in n.shim_log("systemctl")), n.shim_log("systemctl")
    # the report (the verifier's, or the bootstrap's own stub) is printed into the log
    assert n.report()["verdict"] == "fail"
    assert (n.root / "var/lib/gpu-cloud/verify.json").read_text().strip() in n.log()
    # ... and published where it outlives the instance, with the reason and what booted
    (key, published), = n.published()
    assert key.endswith(f"-{n.instance_id}-launch.json") and published["verdict"] == "fail"
    assert " ".join(published["boot"]["reason"].split())[:256] == reason
    assert published["boot"]["mode"] == "launch" and published["boot"]["pool"] == "p5"
    assert published["checks"] == n.report()["checks"]
    # a rejected launch never installs the boot units
    assert not (n.root / "etc/systemd/system/nodeadm-run.service.requires").exists()
    return reason


def _assert_continued(n):
    assert n.proc.returncode == 0, n.explain()
    assert n.lifecycle() == [{"hook": HOOK, "asg": ASG, "instance": n.instance_id, "result": "CONTINUE"}]
    assert n.tags() == {"gpu-cloud:verify": "pass"}
    assert n.masked() == []
    (key, published), = n.published()
    assert published["verdict"] == "pass" and published["boot"]["mode"] == "launch" and key.endswith("-launch.json")


# ----------------------------------------------------------------------------- the accelerated AMI


def test_healthy_node_whose_driver_module_loads_late_continues_without_installing_anything(node, artifact):
    n = node()
    n.boot(kmod_after=1.5, fm_after=1.0)
    n.run()
    _assert_continued(n)
    assert n.shim_log("dnf") == [] and "modprobe" not in " ".join(n.shim_log("calls"))
    # it waited for the AMI's one-shot instead of reading nvidia-smi before the module was loaded (whether the unit
    # was still activating when the gate asked depends on machine load: the shim logs "waited for ..." when it was)
    assert "systemctl start nvidia-kmod-load.service" in n.shim_log("systemctl")
    assert not any("NVIDIA-SMI has failed" in line for line in n.log().splitlines() if "installing" in line)
    # the verifier ran from the extracted bundle with its pynvml, the instance id and our paths
    report = n.report()
    assert report["instanceId"] == n.instance_id and report["pynvml"] == "artifact-pynvml"
    assert report["argv"]["budget_s"] == "30"
    prom = n.root / "var/lib/node_exporter/textfile_collector/gpu_cloud_verify.prom"
    assert report["argv"]["textfile"] == str(prom) and prom.read_text().startswith("gpu_cloud_verify_pass 1")
    for name in ("gate.sh", "install.sh", "gpu_verify.py", "pynvml.py", "expect/p5.48xlarge.json"):
        assert (n.root / "opt/gpu-cloud/verify" / name).is_file()
    # the bundle as downloaded: the plain tar from S3, byte for byte, that tar -xf unpacked
    assert (n.root / "var/lib/gpu-cloud/verifier.tar").read_bytes() == artifact[0]
    assert "CONTINUE" in n.log() and "CONTINUE" in n.proc.stderr   # the console stand-in saw it too


def test_efa_devices_are_counted_from_sysfs_where_the_minimal_install_has_no_libfabric(default_node):
    n = default_node
    _assert_continued(n)
    assert not (n.root / "opt/amazon/efa/bin/fi_info").exists()
    assert "32 EFA devices in sysfs\n" in n.log()


def test_a_missing_efa_device_abandons(node):
    n = node(efa_devices=31)
    n.boot()
    n.run()
    _assert_abandoned(n, "efa: sysfs has 31 EFA devices, expected 32")
    assert n.report()["checks"][0]["name"] == "efa"


def test_fabric_manager_gets_minutes_to_come_up(node):
    # NVSwitch training keeps nvidia-fabricmanager activating well past a few quick retries.
    n = node()
    n.boot(fm_after=2.5)
    n.run()
    _assert_continued(n)


def test_fabric_manager_that_never_comes_up_abandons_once_its_wait_is_spent(node):
    n = node(fabric_manager_wait_s=2)
    n.boot(fm_result=None)     # stays activating
    started = time.monotonic()
    n.run()
    _assert_abandoned(n, "fabricmanager: nvidia-fabricmanager not active after 2s (activating)")
    assert time.monotonic() - started < 30


def test_failed_fabric_manager_abandons_without_waiting_out_the_clock(node):
    n = node(fabric_manager_wait_s=60)
    n.boot(fm_result="failed")
    started = time.monotonic()
    n.run()
    _assert_abandoned(n, "(failed)")
    assert time.monotonic() - started < 30


def test_driver_module_that_fails_to_load_abandons_naming_the_unit(node):
    n = node()
    n.boot(kmod_after=0.5, kmod_result="failed")
    n.run()
    _assert_abandoned(n, "driver: nvidia-kmod-load.service did not finish within 30s (failed)")
    assert n.shim_log("dnf") == []


def test_driver_module_that_never_loads_abandons_after_its_wait(node):
    n = node(kmod_wait_s=2)
    n.boot(kmod_after=60)
    n.run()
    _assert_abandoned(n, "within 2s (activating)")


def test_ami_whose_driver_is_not_the_pinned_one_fails_fast_without_installing(node):
    n = node(ami_driver="580.95.05")
    n.boot()
    n.run()
    _assert_abandoned(n, f"driver: AMI {AMI_NAME} carries {AMI_DRIVER}, nvidia-smi reports '580.95.05'")
    assert n.shim_log("dnf") == []


def test_fabric_manager_version_must_equal_driver(node):
    n = node()
    (n.state / "fm_version").write_text("580.126.09\n")
    n.boot()
    n.run()
    assert "580.126.09" in _assert_abandoned(n, "fabricmanager: version")


def test_mig_pool_turns_mig_mode_on_before_verifying(node):
    n = node(mig=True)
    n.boot()
    n.run()
    _assert_continued(n)
    assert "nvidia-smi -mig 1" in n.shim_log("calls")


def test_mig_mode_that_does_not_take_effect_abandons(node):
    n = node(mig=True)
    n.boot()
    n.run(FAKE_MIG_NEEDS_RESET="1")
    _assert_abandoned(n, "mig: mode is 'Disabled'")


def test_pool_without_mig_never_touches_mig_mode(default_node):
    n = default_node
    _assert_continued(n)
    assert not [c for c in n.shim_log("calls") if "-mig" in c]


# ----------------------------------------------------------------------------- the Lustre client
# Neither AL2023 AMI has a Lustre client (nothing under amazon-eks-ami templates/al2023 installs one): no module
# until the gate installs AL2023's lustre-client, whose kmod is built for the release's kernel.


def test_a_pool_that_mounts_lustre_installs_the_client_and_proves_the_module_loads(node):
    n = node(lustre_client=True)
    n.boot()
    n.run()
    _assert_continued(n)
    assert "dnf -y install lustre-client" in n.shim_log("dnf")
    assert "modprobe lustre" in n.shim_log("calls") and (n.root / "sys/module/lustre").is_dir()
    assert "lustre module loaded" in n.log()


def test_a_lustre_client_built_for_another_kernel_abandons_naming_the_kernel(node):
    n = node(lustre_client=True)
    n.boot()
    n.run(FAKE_LUSTRE_KMOD_KERNEL="6.1.150-174.273.amzn2023.x86_64")
    reason = _assert_abandoned(n, "lustre: the lustre module does not load")
    assert AMI_KERNEL in reason


def test_a_pool_that_does_not_mount_lustre_never_installs_the_client(default_node):
    n = default_node
    _assert_continued(n)
    assert not [c for c in n.shim_log("dnf") + n.shim_log("calls") if "lustre" in c]


# ----------------------------------------------------------------------------- verifier and plumbing


def test_failed_verification_abandons_with_failing_checks_as_reason(node):
    n = node()
    n.boot()
    n.run(FAKE_VERIFY="fail")
    assert _assert_abandoned(n, "nvlink_active gpu3") == "nvlink_active gpu3; ecc_uncorrected gpu1"
    assert n.report()["checks"][1]["name"] == "nvlink_active"  # the verifier's own report kept


def test_verifier_that_cannot_run_abandons(node):
    n = node()
    n.boot()
    n.run(FAKE_VERIFY="crash")  # exit 2, no report
    assert _assert_abandoned(n, "could not run").startswith("verify: could not run (exit 2)")
    assert n.report()["checks"][0]["name"] == "verify"  # the bootstrap wrote the stub report


def test_a_verifier_that_hangs_is_killed_after_its_budget_and_the_node_abandoned(node):
    n = node(verify_budget_s=1, verify_kill_grace_s=1)
    n.boot()
    started = time.monotonic()
    n.run(FAKE_VERIFY="hang")            # ignores SIGTERM: `timeout -k` must KILL it
    assert time.monotonic() - started < 60
    assert _assert_abandoned(n, "exceeded") == "verify: verifier exceeded 2s"


def test_transient_imds_failures_are_retried(node, imds):
    n = node()
    n.boot()
    imds.fail_token_puts = 2
    before = imds.token_puts
    n.run()
    _assert_continued(n)
    assert imds.token_puts - before == 4  # two 500s, then success; then one for instance-type
    assert "retrying" in n.log()


def test_wrong_bundle_checksum_abandons_before_running_anything_from_it(node):
    n = node(artifact_sha256="0" * 64)
    n.boot()
    n.run()
    assert _assert_abandoned(n, "sha256").startswith("artifact: sha256 mismatch")
    assert not (n.root / "opt/gpu-cloud/verify/gate.sh").exists()
    assert n.report()["checks"][0]["name"] == "artifact"
    assert "systemctl start nvidia-kmod-load.service" not in n.shim_log("systemctl")


def test_bundle_that_cannot_be_fetched_fails_closed(node):
    n = node(artifact_key="verify/missing.tar")
    n.boot()
    n.run()
    assert _assert_abandoned(n, "artifact: download failed")


def test_unexpected_bash_error_fails_closed(node):
    n = node()
    n.boot()
    # make a directory the gate must create impossible: an unhandled error, not a step failure
    (n.root / "var/lib").mkdir(parents=True)
    (n.root / "var/lib/node_exporter").write_text("not a directory")
    n.run()
    assert "unexpected error" in _assert_abandoned(n, "verify")


def test_bad_config_fails_closed(node):
    n = node()
    n.boot()
    text = n.script.read_text().replace("export GPU_CLOUD_EFA_COUNT=32", "export GPU_CLOUD_EFA_COUNT=lots")
    n.script.write_text(text)
    n.run()
    _assert_abandoned(n, "config")


# ----------------------------------------------------------------------------- every boot


def test_a_passing_gate_installs_itself_to_run_before_nodeadm_at_every_later_boot(default_node):
    n = default_node
    _assert_continued(n)
    units = n.root / "etc/systemd/system"
    # real `systemctl enable` links: nodeadm-run requires the gate, and the timers target wants the health timer
    assert os.readlink(units / "nodeadm-run.service.requires/gpu-cloud-gate.service") == \
        "/etc/systemd/system/gpu-cloud-gate.service"
    assert os.readlink(units / "timers.target.wants/gpu-cloud-health.timer") == \
        "/etc/systemd/system/gpu-cloud-health.timer"
    gate, run = n.unit("gpu-cloud-gate.service"), n.unit("nodeadm-run.service")
    assert gate["Unit"]["Before"] == ["nodeadm-run.service"] and gate["Install"]["RequiredBy"] == ["nodeadm-run.service"]
    # no ordering cycle: nodeadm-run waits for cloud-final (the AMI's unit), the gate for neither
    assert "cloud-final.service" in run["Unit"]["After"]
    assert not {"cloud-final.service", "nodeadm-run.service", "kubelet.service"} & set(gate["Unit"]["After"])
    assert gate["Service"]["Environment"] == ["GPU_CLOUD_BOOT=reboot"]
    # the unit's command is this very user-data script, exports and all, executable
    command = n.root / gate["Service"]["ExecStart"][0].lstrip("/")
    assert command.read_bytes() == n.script.read_bytes() and os.access(command, os.X_OK)
    assert (n.root / "etc/gpu-cloud/health.env").read_text() == (
        "GPU_CLOUD_EXPECT=/opt/gpu-cloud/verify/expect/p5.48xlarge.json\n"
        f"GPU_CLOUD_INSTANCE_ID={n.instance_id}\nGPU_CLOUD_VERIFY_BUDGET_S=30\nGPU_CLOUD_VERIFY_KILL_GRACE_S=60\n")


def test_a_reboot_runs_the_gate_again_before_the_kubelet_starts(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    textfiles = n.root / "var/lib/node_exporter/textfile_collector"
    (textfiles / "gpu_cloud_health.prom").write_text("gpu_cloud_node_health_pass 0\n")   # last boot's
    assert n.reboot(boot={"kmod_after": 1.0}), n.explain()
    assert n.boot_runs == ["gpu-cloud-gate.service"]
    assert "instance %s (p5.48xlarge) pool p5 asg %s, reboot boot" % (n.instance_id, ASG) in n.log()
    assert "bundle from an earlier boot matches its sha256" in n.log()
    # it waited for this boot's driver module again, and verified again
    assert n.shim_log("systemctl").count("systemctl start nvidia-kmod-load.service") == 2
    assert n.report()["mode"] == "boot" and n.report()["instanceId"] == n.instance_id
    # in service already: no lifecycle action; this boot's verdict published beside the first
    assert [c["result"] for c in n.lifecycle()] == ["CONTINUE"]
    assert [(p["verdict"], p["boot"]["mode"]) for _, p in n.published()] == [("pass", "launch"), ("pass", "reboot")]
    assert not (textfiles / "gpu_cloud_health.prom").exists()
    assert n.health() == "Healthy" and n.masked() == []


def test_a_node_that_fails_its_gate_after_a_reboot_keeps_the_kubelet_down_and_is_replaced(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    assert not n.reboot(FAKE_VERIFY="fail")
    assert n.proc.returncode != 0
    assert n.masked() == ["kubelet.service", "nodeadm-run.service"]
    assert n.tags() == {"gpu-cloud:verify": "fail", "gpu-cloud:verify-reason": "nvlink_active gpu3; ecc_uncorrected gpu1"}
    # its group replaces it (through the termination hook); no launch hook to answer any more
    assert n.health() == "Unhealthy"
    assert [c["result"] for c in n.lifecycle()] == ["CONTINUE"]
    (_, first), (key, last) = n.published()
    assert key.endswith("-reboot.json") and last["verdict"] == "fail" and last["boot"]["mode"] == "reboot"
    assert last["boot"]["reason"] == "nvlink_active gpu3; ecc_uncorrected gpu1"
    # and the next boot stays down: nothing starts a masked nodeadm-run
    assert not n.reboot() and n.boot_runs == []


def test_the_health_unit_runs_the_verifier_in_runtime_mode_and_a_fault_is_not_its_failure(default_node, tmp_path):
    n = default_node
    unit = n.unit("gpu-cloud-health.service")["Service"]
    env = dict(line.split("=", 1) for line in
               (n.root / unit["EnvironmentFile"][0].lstrip("/")).read_text().splitlines())
    command = unit["ExecStart"][0].split()
    assert command[0] == "/bin/bash"
    script = str(n.root) + command[1]
    for verdict in ("pass", "fail"):
        ran = subprocess.run(["bash", script], env={**n.env, **env, "FAKE_VERIFY": verdict}, capture_output=True,
                             text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        report = json.loads((n.root / "var/lib/gpu-cloud/health.json").read_text())
        assert report["mode"] == "runtime" and report["verdict"] == verdict
        assert report["argv"]["textfile"].endswith("/textfile_collector/gpu_cloud_health.prom")
    ran = subprocess.run(["bash", script], env={**n.env, **env, "FAKE_VERIFY": "crash"}, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 2 and "could not run (exit 2)" in ran.stderr


def test_the_boot_units_pass_systemd_analyze_verify(default_node, tmp_path):
    """systemd's own parser over the gate's units beside the AMI's (commands moved into the sandbox, the AMI's
    binaries, absent here, stood in by /bin/true): unknown keys, bad values and missing commands are reported."""
    analyze = require_tool("systemd-analyze")
    n = default_node
    units = tmp_path / "units"
    units.mkdir()
    names = ["gpu-cloud-gate.service", "gpu-cloud-health.service", "gpu-cloud-health.timer", *AMI_UNITS["units"]]
    for name in names:
        text = (n.root / "etc/systemd/system" / name).read_text().replace("/opt/gpu-cloud", f"{n.root}/opt/gpu-cloud")
        text = re.sub(r"^(ExecStart(?:Pre)?)=(/usr/bin/nodeadm|/usr/bin/kubelet|/etc/eks/|/sbin/iptables)\S*",
                      r"\1=/bin/true", text, flags=re.M)
        (units / name).write_text(text)
    checked = subprocess.run([analyze, "verify", "--man=no", *(str(units / u) for u in names)],
                             env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"}, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr


# ----------------------------------------------------------------------------- the standard AMI (source: install)


def test_install_path_installs_the_driver_stack_then_passes_the_same_gate(node):
    n = node(ami="standard")
    n.run(FAKE_FM_START_S="1")
    _assert_continued(n)
    dnf = n.shim_log("dnf")
    kernel = AMI_KERNEL.removesuffix(".x86_64")
    assert dnf == [
        "dnf -y config-manager --add-repo "
        "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/x86_64/cuda-amzn2023.repo",
        f"dnf -y install kernel6.12-devel-{kernel} kernel6.12-modules-extra-{kernel} dkms",
        "dnf -y module reset nvidia-driver",
        "dnf -y module enable nvidia-driver:580-open",
        "dnf -y install nvidia-open",
        f"dnf -y install nvidia-container-toolkit nvidia-persistenced-{REPO_DRIVER}",
        # fourth-generation NVSwitch (p6-b200): NVLSM and what it talks through, before fabric manager
        "dnf -y install libibumad infiniband-diags nvlsm",
        f"dnf -y install nvidia-fabricmanager-{REPO_DRIVER}",
    ]
    assert "modprobe nvidia" in n.shim_log("calls")
    assert "modprobe ib_umad" in n.shim_log("calls")
    assert (n.root / "etc/modules-load.d/ib-umad.conf").read_text() == "ib_umad\n"   # loaded on every later boot
    assert "systemctl enable --now nvidia-persistenced" in n.shim_log("systemctl")
    assert "systemctl --no-block start nvidia-fabricmanager" in n.shim_log("systemctl")
    # no EFA install: the standard AMI's own minimal EFA software is the NVIDIA AMI's; the gate counts sysfs
    assert "32 EFA devices in sysfs" in n.log() and "in libfabric" not in n.log()
    assert not (n.root / "opt/amazon/efa").exists()
    assert not [line for line in n.shim_log("systemctl") if "nvidia-kmod-load" in line]


def test_install_path_is_idempotent_on_a_second_boot(node):
    n = node(ami="standard")
    n.run()
    _assert_continued(n)
    installs = len(n.shim_log("dnf"))
    assert n.reboot()      # the gate unit runs again: module and packages are in place
    assert n.proc.returncode == 0, n.explain()
    again = n.shim_log("dnf")[installs:]
    assert not [line for line in again if "nvidia-open" in line or "module" in line or "kernel" in line], again
    assert "not reinstalling" in n.log()
    assert [p["boot"]["mode"] for _, p in n.published()] == ["launch", "reboot"]
    # the module the first boot built, loaded by the gate when udev has not yet
    assert n.shim_log("calls").count("modprobe nvidia") == 2


def test_install_path_pins_an_exact_version_and_abandons_if_it_does_not_take(node):
    n = node(ami="standard", driver_version="580.126.09")
    n.run(FAKE_BUILT_DRIVER="580.105.08")     # the repository resolves something else
    assert any(line.endswith("install nvidia-open-580.126.09") for line in n.shim_log("dnf"))
    _assert_abandoned(n, "driver: want 580 580.126.09, have '580.105.08' after install")


def test_libfabric_and_sysfs_must_agree_where_both_exist(node):
    n = node(ami="standard")
    (n.root / "opt/amazon/efa/bin").mkdir(parents=True)
    _write_exe(n.root / "opt/amazon/efa/bin/fi_info", FAKE_FI_INFO)   # an image with the full EFA install
    n.run(FAKE_FI_INFO_DEVICES="31")
    _assert_abandoned(n, "efa: libfabric sees 31 EFA devices, sysfs 32")


def test_install_path_without_nvswitch_installs_no_fabric_manager_or_nvlsm(node):
    n = node(ami="standard", efa_devices=0, efa_count=0, nvswitch=False)
    n.run()
    _assert_continued(n)
    assert not any("fabric" in line or "nvlsm" in line for line in n.shim_log("dnf"))
    assert "modprobe ib_umad" not in n.shim_log("calls")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
