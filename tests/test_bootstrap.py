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
sit in the sandbox's /etc/systemd/system; the real `systemctl --root=DIR` links the gate's units among them (and
refuses what systemd refuses there, such as masking a unit whose file is in /etc/systemd/system).
The boot is modelled as the AMI runs it:
- cloud-final runs the user-data script through cloud-init's own code (the Debian cloud-init package under the system
  python3, as .ci/run installs it): cloudinit/helpers.py Runners.run with cc_scripts_user at its per-instance
  frequency, which writes the semaphore before it runs the script and skips the module once it is there;
- a reboot (`reboot()` below) clears /run (a tmpfs), stops what the last boot left running, runs cloud-final again,
  then starts nodeadm-run.service as systemd would: first the units it requires and that come before it, run from
  their unit files; if one fails, nodeadm-run never runs. nodeadm-run restarts the kubelet, whose start runs the
  ExecStartPre= commands of kubelet.service and its drop-ins (`start_kubelet()`); one that fails keeps it down;
- a boot can die at any moment (`run(die_in_gate=True)`, `reboot(die_in_gate=True)`): every process of it is
  SIGKILLed, with no trap run, as a kernel panic ends it (the AMI panics on an oops).

Stand-ins (PATH shims) exist only for what this machine lacks or must not touch: `nvidia-smi`,
`nv-fabricmanager`, `systemctl` without `--root` (unit states in files; `start` waits for an activating job as
systemd does; with `--root=DIR` it is the real systemctl), `dnf`, `modprobe`, `modinfo`, `uname` (the AMI's kernel),
and a libfabric `fi_info` where a test plants one (an image with the full EFA install). The verifier inside the bundle is a
small stand-in gpu_verify.py that writes a pass or fail report chosen by FAKE_VERIFY; the real verifier is
tested in test_gpu_verify.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import boto3
import pytest
from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import EmptyResult

from tests import upstream_records
from tests.conftest import VENV_BIN, missing, require_tool
from tests.loopback import LoopbackServer, QuietHandler, moto_server
from userdata.render import NodeBootstrap, build_verifier_artifact, gate_unit_text, render_shell_part

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
SYSTEM_PYTHON = "/usr/bin/python3"   # cloud-init's, from the Debian package
CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="

# ----------------------------------------------------------------------------- moto, IMDS, EFA download

LIFECYCLE_CALLS: list = []


def _complete_lifecycle_action(self):  # recording stand-in; moto 5.2.5 lacks this action
    call = {
        "hook": self._get_param("LifecycleHookName"),
        "asg": self._get_param("AutoScalingGroupName"),
        "instance": self._get_param("InstanceId"),
        "result": self._get_param("LifecycleActionResult"),
    }
    if any(c["instance"] == call["instance"] for c in LIFECYCLE_CALLS):   # answered: the action is closed
        raise ValidationError(f"No active Lifecycle Action found with instance ID {call['instance']}")
    LIFECYCLE_CALLS.append(call)
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
        # on the sandbox's unit files: the real one, whatever the verb
        if [ "${1#--root=}" != "$1" ]; then exec "$FAKE_REAL_SYSTEMCTL" "$@"; fi
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
          enable) [ "$1" = --now ] && { now=1; shift; }
                  for u in "$@"; do [ -e "$(unit "$u")" ] || exit 1; [ -n "$now" ] && { begin "$u" || exit $?; }; done; true ;;
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


# cloud-final's user scripts, run by cloud-init's own code: the module runner (cloudinit/helpers.py Runners.run, which
# writes the per-instance semaphore in FileSemaphores._acquire before it calls the module) with cc_scripts_user's
# handler at the module's own frequency, as cloudinit/config/modules.py _run_modules calls it ("config-" + name).
CLOUD_FINAL = r"""
import inspect, json, logging, sys
from cloudinit import helpers
from cloudinit.cloud import Cloud
from cloudinit.config import cc_scripts_user

cloud_dir, iid, out = sys.argv[1:4]


class Datasource:  # what Paths and Cloud ask of one here: the instance id
    def get_instance_id(self):
        return iid


paths = helpers.Paths({"cloud_dir": cloud_dir}, ds=Datasource())
cloud = Cloud(Datasource(), paths, {}, None, helpers.Runners(paths))
handle = cc_scripts_user.handle
args = ["scripts_user", {}, cloud, logging.getLogger("cloud-final"), []]
if "log" not in inspect.signature(handle).parameters:   # cloud-init 23.2 and later drop the log argument
    del args[3]
result = {"ran": False, "failed": None}
try:
    result["ran"], _ = cloud.run("config-scripts_user", handle, args, freq=cc_scripts_user.meta["frequency"])
except Exception as e:  # cloud-final logs a failed module and goes on
    result.update(ran=True, failed=str(e))
with open(out, "w") as f:
    json.dump(result, f)
sys.exit(1 if result["failed"] else 0)
"""


def _require_cloud_init():
    if not (Path(SYSTEM_PYTHON).exists() and Path("/usr/lib/python3/dist-packages/cloudinit").is_dir()):
        missing("cloud-init's Python package (Debian cloud-init, installed by .ci/run) is not under the system python3")


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


def _kill_session(sid):
    """SIGKILL every process of session `sid` until none is left. Not killpg: `timeout` puts what it runs in a process
    group of its own, which outlives the group's kill."""
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()   # state, ppid, pgrp, session, ...
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(pid))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


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
        self._halt = threading.Event()           # set when this boot ends: its systemd stand-in stops too
        (self.tmp / "cloud_final.py").write_text(CLOUD_FINAL)
        self.cloud_dir = self.root / "var/lib/cloud"
        self.semaphore = self.cloud_dir / "instances" / self.instance_id / "sem/config_scripts_user"

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
        units, halt = self.state / "units", self._halt

        def run():
            if halt.wait(kmod_after):
                return
            if kmod_result == "active":
                (self.state / "kmod").write_text(self.ami_driver + "\n")
                (units / "nvidia-persistenced").write_text("active\n")
                (self.state / "pm").touch()     # the daemon turns persistence mode on for every GPU
                (units / "nvidia-fabricmanager").write_text("activating\n")
            (units / "nvidia-kmod-load").write_text(kmod_result + "\n")
            if kmod_result == "active" and fm_result is not None and not halt.wait(fm_after):
                (units / "nvidia-fabricmanager").write_text(fm_result + "\n")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def _spawn(self, command, env, die_in_gate):
        """Run one boot's command to its end; or, with die_in_gate, until the gate waits for the driver module, then
        SIGKILL every process of it at once, as a kernel panic does (no trap runs)."""
        if not die_in_gate:
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        waits = self.shim_log("systemctl").count("systemctl start nvidia-kmod-load.service")
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.monotonic() + 60
        while self.shim_log("systemctl").count("systemctl start nvidia-kmod-load.service") == waits:
            assert proc.poll() is None and time.monotonic() < deadline, "the gate never reached the driver step"
            time.sleep(0.05)
        _kill_session(proc.pid)
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(command, proc.returncode, out, err)

    def cloud_final(self, env, die_in_gate=False):
        """cloud-final's scripts_user module, by cloud-init's own code (CLOUD_FINAL). The user-data's shell part is
        where cloud-init's init stage puts it (/var/lib/cloud/instance/scripts/part-002, mode 0700; test_render.py
        checks that it writes the script byte for byte)."""
        _require_cloud_init()
        scripts = self.cloud_dir / "instances" / self.instance_id / "scripts"
        scripts.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.script, scripts / "part-002")
        (scripts / "part-002").chmod(0o700)
        link = self.cloud_dir / "instance"
        if not link.is_symlink():
            link.symlink_to(f"instances/{self.instance_id}")
        out = self.tmp / "cloud-final.json"
        out.unlink(missing_ok=True)
        proc = self._spawn([SYSTEM_PYTHON, str(self.tmp / "cloud_final.py"), str(self.cloud_dir), self.instance_id,
                            str(out)], env, die_in_gate)
        self.final = json.loads(out.read_text()) if out.exists() else None
        return proc

    def run(self, die_in_gate=False, **env):
        """The first boot's cloud-final, which runs the user-data script."""
        self.proc = self.cloud_final({**self.env, **env}, die_in_gate)
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
        """A unit of the sandbox with its drop-ins (<name>.d/*.conf, in name order, after the unit file), as
        {key: [values]} per section: list settings accumulate and an empty assignment clears them (systemd.unit(5))."""
        units = self.root / "etc/systemd/system"
        sections: dict = {}
        for path in [units / name, *sorted((units / f"{name}.d").glob("*.conf"))]:
            current = None
            for line in path.read_text().splitlines():
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("["):
                    current = sections.setdefault(line.strip("[]"), {})
                    continue
                key, _, value = line.partition("=")
                if not value:
                    current[key] = []
                    continue
                current.setdefault(key, []).extend(value.split() if key in _LIST_KEYS else [value])
        return sections

    def _in_sandbox(self, command):
        """A unit's command line with its paths in the sandbox: the program where the sandbox has it (else the
        host's), and every argument under /run, /var, /etc or /opt."""
        argv = command.split()
        if (self.root / argv[0].lstrip("/")).exists():
            argv[0] = str(self.root) + argv[0]
        return [argv[0]] + [str(self.root) + a if a.startswith(("/run/", "/var/", "/etc/", "/opt/")) else a
                            for a in argv[1:]]

    def start_kubelet(self):
        """systemd starting kubelet.service: its ExecStartPre= commands, the AMI's and the drop-ins', in order;
        one that fails fails the start. The AMI's own (`iptables -P FORWARD ACCEPT`) is not modelled."""
        self.kubelet_checks = []
        for command in self.unit("kubelet.service")["Service"].get("ExecStartPre", []):
            if command.startswith("/sbin/iptables "):
                continue
            argv = self._in_sandbox(command)
            self.kubelet_checks.append(argv)
            if subprocess.run(argv, env=self.env, capture_output=True, timeout=30).returncode != 0:
                return False
        return True

    def reboot(self, boot=None, die_in_gate=False, **env):
        """The instance boots again: what the last boot ran is gone and /run (a tmpfs) is empty; its modules and
        daemons start afresh (boot(**boot) plays them); cloud-final runs its modules (cloud-init's semaphore skips the
        per-instance user script); systemd starts nodeadm-run.service. Before it, every unit it requires that is
        ordered before it runs from its unit file (ExecStart, Environment); a failed one fails nodeadm-run's start
        job, as systemd's Requires= with After= does. nodeadm-run then restarts the kubelet (start_kubelet).
        Returns whether the kubelet started."""
        self._halt.set()
        self._halt = threading.Event()
        shutil.rmtree(self.root / "run", ignore_errors=True)
        for path in ("kmod", "pm"):
            (self.state / path).unlink(missing_ok=True)
        for unit in ("nvidia-kmod-load", "nvidia-fabricmanager", "nvidia-persistenced"):
            if (self.state / "units" / unit).exists():
                (self.state / "units" / unit).write_text("activating\n" if unit == "nvidia-kmod-load" else "inactive\n")
        if self.ami == "nvidia":
            self.boot(**(boot or {}))
        self.final_proc = self.cloud_final({**self.env, **env})
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
            self.boot_runs.append(name)
            self.proc = self._spawn(self._in_sandbox(unit["Service"]["ExecStart"][0]),
                                    {**self.env, **environment, **env}, die_in_gate)
            if self.proc.returncode != 0:
                return False                               # "Dependency failed for EKS Nodeadm Run"
        return self.start_kubelet()

    def masked(self):
        unit_dir = self.root / "etc/systemd/system"
        return sorted(p.name for p in unit_dir.glob("*") if p.is_symlink() and os.readlink(p) == "/dev/null") \
            if unit_dir.exists() else []

    def marker(self, name):
        """The gate's state: persistent (in-service, gate-running, rejected) under /var/lib/gpu-cloud, or this boot's
        (verified) under /run/gpu-cloud; None where there is none."""
        for base in ("var/lib/gpu-cloud", "run/gpu-cloud"):
            if (self.root / base / name).exists():
                return (self.root / base / name).read_text()
        return None

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
    # the kubelet stays down by its drop-in (no verified file this boot), the AMI's unit files untouched
    assert n.marker("verified") is None and not n.start_kubelet(), n.explain()
    assert n.masked() == [] and _ami_units_intact(n)
    # for good: the reason on disk for every later boot of this instance, no gate left under way
    assert " ".join(n.marker("rejected").split())[:256] == reason
    assert n.marker("gate-running") is None and n.marker("in-service") is None
    # the report (the verifier's, or the bootstrap's own stub) is printed into the log
    assert n.report()["verdict"] == "fail"
    assert (n.root / "var/lib/gpu-cloud/verify.json").read_text().strip() in n.log()
    # ... and published where it outlives the instance, with the reason and what booted
    (key, published), = n.published()
    assert key.endswith(f"-{n.instance_id}-launch.json") and published["verdict"] == "fail"
    assert " ".join(published["boot"]["reason"].split())[:256] == reason
    assert published["boot"]["mode"] == "launch" and published["boot"]["pool"] == "p5"
    assert published["checks"] == n.report()["checks"]
    # the gate's own unit and the drop-in came first, before anything could fail; the run-time checker never
    assert _gate_installed(n)
    assert not (n.root / "etc/systemd/system/timers.target.wants/gpu-cloud-health.timer").exists()
    return reason


def _ami_units_intact(n):
    """The AMI's unit files as the AMI installs them (no /dev/null links over them, no edits)."""
    units = n.root / "etc/systemd/system"
    return all(not (units / u).is_symlink() and (units / u).read_text() == found["text"]
               for u, found in AMI_UNITS["units"].items())


def _gate_installed(n):
    """The gate's unit (enabled: nodeadm-run requires it) and the kubelet's drop-in, as the user-data carries them,
    and the unit's command, this very user-data script."""
    units = n.root / "etc/systemd/system"
    return ((units / "gpu-cloud-gate.service").read_text() == gate_unit_text("gpu-cloud-gate.service")
            and (units / "kubelet.service.d/10-gpu-cloud-gate.conf").read_text()
            == gate_unit_text("kubelet-gpu-cloud-gate.conf")
            and os.readlink(units / "nodeadm-run.service.requires/gpu-cloud-gate.service")
            == "/etc/systemd/system/gpu-cloud-gate.service"
            and (n.root / "opt/gpu-cloud/bin/gpu-cloud-gate").read_bytes() == n.script.read_bytes())


def _assert_continued(n):
    assert n.proc.returncode == 0, n.explain()
    assert n.final == {"ran": True, "failed": None}      # cloud-final ran the script, under its semaphore
    assert n.semaphore.is_file()
    assert n.lifecycle() == [{"hook": HOOK, "asg": ASG, "instance": n.instance_id, "result": "CONTINUE"}]
    assert n.tags() == {"gpu-cloud:verify": "pass"}
    assert n.masked() == [] and _ami_units_intact(n) and _gate_installed(n)
    # this boot's verdict lets the kubelet start; later boots are in service; no gate under way
    assert n.marker("verified") == "" and n.start_kubelet(), n.explain()
    assert n.marker("in-service") and n.marker("gate-running") is None and n.marker("rejected") is None
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
    # the boot mode is the gate's own (its markers on disk), nothing the unit says
    assert "Environment" not in gate["Service"]
    # the kubelet, whoever starts it, waits for the gate and needs this boot's verdict
    kubelet = n.unit("kubelet.service")
    assert kubelet["Unit"]["After"] == ["containerd.service", "gpu-cloud-gate.service"]
    assert kubelet["Service"]["ExecStartPre"] == ["/sbin/iptables -P FORWARD ACCEPT -w 5",
                                                  "/usr/bin/test -f /run/gpu-cloud/verified"]
    # the unit's command is this very user-data script, exports and all, executable
    command = n.root / gate["Service"]["ExecStart"][0].lstrip("/")
    assert command.read_bytes() == n.script.read_bytes() and os.access(command, os.X_OK)
    assert (n.root / "etc/gpu-cloud/health.env").read_text() == (
        "GPU_CLOUD_EXPECT=/opt/gpu-cloud/verify/expect/p5.48xlarge.json\n"
        f"GPU_CLOUD_INSTANCE_ID={n.instance_id}\nGPU_CLOUD_VERIFY_BUDGET_S=30\nGPU_CLOUD_VERIFY_KILL_GRACE_S=60\n")


def test_the_kubelet_starts_only_in_a_boot_whose_gate_passed(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)            # this boot: verified, the kubelet may start
    shutil.rmtree(n.root / "run")    # the next boot's empty /run, before its gate has run
    assert not n.start_kubelet()
    assert n.kubelet_checks == [["/usr/bin/test", "-f", f"{n.root}/run/gpu-cloud/verified"]]


def test_systemd_refuses_to_mask_the_ami_units_so_the_gate_uses_a_drop_in(node):
    """Why no `systemctl mask`: on this AMI kubelet.service and nodeadm-run.service are files in /etc/systemd/system
    (awslabs/amazon-eks-ami v20260714 template.json line 172 copies runtime/rootfs to /), where masking needs the
    /dev/null link. The real systemctl, on the AMI's layout:"""
    n = node()
    for unit in ("kubelet.service", "nodeadm-run.service"):
        refused = subprocess.run([n.env["FAKE_REAL_SYSTEMCTL"], f"--root={n.root}", "mask", unit],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and "already exists" in refused.stderr, refused.stderr
    assert _ami_units_intact(n)


def test_a_reboot_runs_the_gate_again_before_the_kubelet_starts(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    textfiles = n.root / "var/lib/node_exporter/textfile_collector"
    (textfiles / "gpu_cloud_health.prom").write_text("gpu_cloud_node_health_pass 0\n")   # last boot's
    assert n.reboot(boot={"kmod_after": 1.0}), n.explain()
    assert n.final == {"ran": False, "failed": None}       # cloud-init: the user script ran for this instance
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
    assert n.health() == "Healthy" and n.masked() == [] and n.marker("verified") == ""


def test_a_node_that_fails_its_gate_after_a_reboot_keeps_the_kubelet_down_and_is_replaced(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    assert not n.reboot(FAKE_VERIFY="fail")
    assert n.proc.returncode != 0
    assert not n.start_kubelet() and n.masked() == [] and _ami_units_intact(n)
    assert n.tags() == {"gpu-cloud:verify": "fail", "gpu-cloud:verify-reason": "nvlink_active gpu3; ecc_uncorrected gpu1"}
    # its group replaces it (through the termination hook); no launch hook to answer any more
    assert n.health() == "Unhealthy"
    assert [c["result"] for c in n.lifecycle()] == ["CONTINUE"]
    (_, first), (key, last) = n.published()
    assert key.endswith("-reboot.json") and last["verdict"] == "fail" and last["boot"]["mode"] == "reboot"
    assert last["boot"]["reason"] == "nvlink_active gpu3; ecc_uncorrected gpu1"
    # and the next boot stays down: its gate refuses at once (the hardware is not given another chance), reports the
    # instance again, and publishes nothing new (the brake counts each rejection once)
    assert not n.reboot() and n.boot_runs == ["gpu-cloud-gate.service"]
    assert n.tags()["gpu-cloud:verify-reason"] == \
        "gate: rejected at an earlier boot: nvlink_active gpu3; ecc_uncorrected gpu1"
    assert "systemctl start nvidia-kmod-load.service" not in n.shim_log("systemctl")[-3:]
    assert len(n.published()) == 2 and n.health() == "Unhealthy"


# ----------------------------------------------------------------------------- a boot that dies in the gate
# The AMI panics on an oops and reboots 10 s later (kernel.panic_on_oops=1, kernel.panic=10: awslabs/amazon-eks-ami
# v20260714 templates/al2023/runtime/rootfs/etc/sysctl.d/99-amazon.conf lines 2-3): a driver oops on a bad GPU during
# the gate ends the boot with no trap run. cloud-init wrote its semaphore before the script ran, so it never runs it
# again.


def test_a_first_boot_that_dies_in_the_gate_is_abandoned_at_the_next_boot_and_its_kubelet_never_starts(node):
    n = node()
    n.boot(kmod_after=60)                    # the gate waits for the driver module when the instance goes down
    n.run(die_in_gate=True)
    assert n.proc.returncode == -signal.SIGKILL and n.final is None
    assert n.semaphore.is_file()             # cloud-init's, written before it ran the script
    assert n.lifecycle() == [] and n.published() == [] and n.tags() == {}
    # what the dead boot left on disk: the gate for every later boot, the kubelet's drop-in, a gate under way
    assert _gate_installed(n) and n.marker("gate-running").split()[1] == "launch"
    assert not n.reboot(), n.explain()
    assert n.final == {"ran": False, "failed": None}       # cloud-init skips the user script: "already ran"
    assert n.boot_runs == ["gpu-cloud-gate.service"]         # the gate ran as a unit, in launch mode
    reason = _assert_abandoned(n, "never reached a verdict")
    assert reason.startswith("gate: the gate started at ") and reason.endswith(
        "(launch boot) never reached a verdict: the instance went down during it")
    # it did not give the hardware a second run
    assert n.shim_log("systemctl").count("systemctl start nvidia-kmod-load.service") == 1
    # nor does any later boot
    assert not n.reboot() and "rejected at an earlier boot" in n.tags()["gpu-cloud:verify-reason"]
    assert len(n.published()) == 1 and len(n.lifecycle()) == 1


def test_a_later_boot_that_dies_in_the_gate_is_reported_unhealthy_at_the_boot_after(node):
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    assert not n.reboot(boot={"kmod_after": 60}, die_in_gate=True)
    assert n.proc.returncode == -signal.SIGKILL and n.marker("gate-running").split()[1] == "reboot"
    assert not n.reboot(), n.explain()
    assert n.proc.returncode != 0 and not n.start_kubelet()
    assert "(reboot boot) never reached a verdict" in n.tags()["gpu-cloud:verify-reason"]
    assert n.health() == "Unhealthy" and [c["result"] for c in n.lifecycle()] == ["CONTINUE"]
    assert [(p["verdict"], p["boot"]["mode"]) for _, p in n.published()] == [("pass", "launch"), ("fail", "reboot")]


def test_a_continue_that_went_through_without_its_marker_ends_in_unhealthy_not_in_a_stranded_node(node):
    """CONTINUE reached Auto Scaling, but the boot went down before the in-service marker was on disk: the next boot's
    gate runs in launch mode, and its answer to the hook is refused (no lifecycle action is open). It must not leave
    an instance in service with its kubelet down and nobody to replace it."""
    n = node()
    n.boot()
    n.run()
    _assert_continued(n)
    (n.root / "var/lib/gpu-cloud/in-service").unlink()
    assert not n.reboot(), n.explain()
    assert "gate: CompleteLifecycleAction CONTINUE failed" in n.tags()["gpu-cloud:verify-reason"]
    assert "ABANDON failed; reporting the instance Unhealthy instead" in n.log()
    assert n.health() == "Unhealthy" and not n.start_kubelet()


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
    """systemd's own parser over the gate's units and the kubelet's drop-in, beside the AMI's units (commands moved
    into the sandbox, the AMI's binaries, absent here, stood in by /bin/true): unknown keys, bad values and missing
    commands are reported, in a drop-in too."""
    analyze = require_tool("systemd-analyze")
    n = default_node
    units = tmp_path / "units"
    (units / "kubelet.service.d").mkdir(parents=True)
    names = ["gpu-cloud-gate.service", "gpu-cloud-health.service", "gpu-cloud-health.timer", *AMI_UNITS["units"]]
    for name in [*names, "kubelet.service.d/10-gpu-cloud-gate.conf"]:
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
