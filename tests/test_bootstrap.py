"""userdata/bootstrap.sh run for real: bash, the real AWS CLI against moto, a fake IMDSv2.

What is real: bash and the script as rendered into user-data (export lines + body), curl,
sha256sum, tar, timeout, python3, the AWS CLI (`.venv/bin/aws`) talking to moto in server mode
on 127.0.0.1 (S3 download, EC2 CreateTags, Auto Scaling CompleteLifecycleAction).

Stand-ins (PATH shims) exist only for what a laptop lacks or must not touch: `nvidia-smi`,
`nv-fabricmanager`, `fi_info`, `dnf` and `systemctl` (it records its arguments; `--root=DIR mask`
creates the /dev/null symlinks like systemctl does). moto 5.2.5 does not implement
CompleteLifecycleAction, so the test adds a recording implementation to
moto's AutoScalingResponse. The verifier inside the S3 artifact is a small stand-in
gpu_verify.py that writes a pass or fail report chosen by FAKE_VERIFY; the artifact itself is
built by the real `build_verifier_artifact`. The real verifier (userdata/gpu_verify.py) is
tested elsewhere.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import EmptyResult
from moto.server import ThreadedMotoServer

from tests.conftest import ROOT, VENV_BIN, require_tool
from userdata.render import NodeBootstrap, build_verifier_artifact, render_shell_part

REGION = "us-east-1"
BUCKET = "gpu-cloud-artifacts"
ASG = "gpu-cloud-p5-asg"
HOOK = "gpu-cloud-verify"
DRIVER = "580.65.06"
CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="

# ----------------------------------------------------------------------------- moto + IMDS

LIFECYCLE_CALLS: list = []


def _complete_lifecycle_action(self):  # recording stand-in; moto 5.2.5 lacks this action
    LIFECYCLE_CALLS.append(
        {
            "hook": self._get_param("LifecycleHookName"),
            "asg": self._get_param("AutoScalingGroupName"),
            "instance": self._get_param("InstanceId"),
            "result": self._get_param("LifecycleActionResult"),
        }
    )
    return EmptyResult()  # like moto's other no-output actions (e.g. delete_lifecycle_hook)


@pytest.fixture(scope="module")
def moto_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    mp = pytest.MonkeyPatch()
    mp.setattr(AutoScalingResponse, "complete_lifecycle_action", _complete_lifecycle_action, raising=False)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        mp.undo()


def _client(service, endpoint):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


class FakeImds:
    """IMDSv2 only: PUT /latest/api/token (TTL header required), GET needs the token."""

    def __init__(self):
        self.instance_id = ""
        self.instance_type = "p5.48xlarge"
        self.fail_token_puts = 0
        self.token_puts = 0
        self.unauthenticated_gets = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, code, body=b""):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                owner.token_puts += 1
                if self.path != "/latest/api/token" or not self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    return self._send(400)
                if owner.fail_token_puts > 0:
                    owner.fail_token_puts -= 1
                    return self._send(500, b"transient")
                self._send(200, b"tok-123")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    owner.unauthenticated_gets += 1
                    return self._send(401)
                if self.path == "/latest/meta-data/instance-id":
                    return self._send(200, owner.instance_id.encode())
                if self.path == "/latest/meta-data/instance-type":
                    return self._send(200, owner.instance_type.encode())
                self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def imds():
    fake = FakeImds()
    yield fake
    fake.close()


# ----------------------------------------------------------------------------- stand-ins

SHIMS = {
    "nvidia-smi": r"""
        echo "nvidia-smi $*" >>"$FAKE_STATE/calls.log"
        case "$*" in
          *driver_version*) [ -s "$FAKE_STATE/driver" ] || exit 9
                            for _ in 1 2 3 4 5 6 7 8; do cat "$FAKE_STATE/driver"; done ;;
          *persistence_mode*) for _ in 1 2 3 4 5 6 7 8; do
                                if [ -e "$FAKE_STATE/pm" ]; then echo Enabled; else echo Disabled; fi; done ;;
          "-pm 1") touch "$FAKE_STATE/pm"; echo "Enabled persistence mode" ;;
          "-mig 1") [ -z "$FAKE_MIG_NEEDS_RESET" ] && touch "$FAKE_STATE/mig"; echo "Enabled MIG Mode" ;;
          *mig.mode.current*) for _ in 1 2 3 4 5 6 7 8; do
                                if [ -e "$FAKE_STATE/mig" ]; then echo Enabled; else echo Disabled; fi; done ;;
          *) exit 2 ;;
        esac
    """,
    "nv-fabricmanager": r"""
        echo "Fabric Manager version is : $(cat "$FAKE_STATE/fm_version")"
    """,
    "fi_info": r"""
        n=${FAKE_EFA_DEVICES:-0}
        if [ "$n" -eq 0 ]; then echo "fi_getinfo: -61 (No data available)" >&2; exit 1; fi
        for i in $(seq 1 "$n"); do for fabric in efa efa-direct; do  # same domain listed twice
          printf 'provider: efa\n    fabric: %s\n    domain: rdmap%ss0-rdm\n    version: 122.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n' "$fabric" "$i"
        done; done
    """,
    "dnf": r"""
        echo "dnf $*" >>"$FAKE_STATE/dnf.log"
        case "$*" in *" install "*nvidia-open*) echo "$FAKE_DRIVER_AFTER_INSTALL" >"$FAKE_STATE/driver" ;; esac
    """,
    "systemctl": r"""
        echo "systemctl $*" >>"$FAKE_STATE/systemctl.log"
        root=""
        if [ "${1#--root=}" != "$1" ]; then root=${1#--root=}; shift; fi
        case "$1" in
          is-active) for u in $FAKE_ACTIVE_UNITS; do [ "$u" = "${!#}" ] && exit 0; done; exit 3 ;;
          mask) shift; mkdir -p "$root/etc/systemd/system"
                for u in "$@"; do ln -sf /dev/null "$root/etc/systemd/system/$u"; done ;;
        esac
    """,
}

FAKE_VERIFIER = r'''
import argparse, json, os, sys
import pynvml  # must come from the artifact via PYTHONPATH
p = argparse.ArgumentParser()
for a in ("--expect", "--report", "--textfile", "--budget-s"):
    p.add_argument(a, required=True)
args = p.parse_args()
expect = json.load(open(args.expect))
mode = os.environ.get("FAKE_VERIFY", "pass")
if mode == "crash":
    sys.exit(2)
checks = [{"name": "gpu_count", "status": "pass", "gpu": None, "value": 8, "threshold": 8, "detail": ""}]
if mode == "fail":
    checks += [
        {"name": "nvlink_active", "status": "fail", "gpu": 3, "value": 16, "threshold": 18, "detail": "2 links down"},
        {"name": "temperature", "status": "pass", "gpu": 1, "value": 40, "threshold": 85, "detail": ""},
        {"name": "ecc_uncorrected", "status": "fail", "gpu": 1, "value": 2, "threshold": 0, "detail": ""},
    ]
report = {"verdict": "fail" if mode == "fail" else "pass", "instanceType": expect["instanceType"],
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
        verifier_source=src / "gpu_verify.py",
        pynvml_source=src / "pynvml.py",
    )
    return data, hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- the harness


class Node:
    """One fresh EC2 instance in moto plus a sandbox root, shims and a run() of the bootstrap."""

    def __init__(self, tmp_path, endpoint, imds, artifact, **overrides):
        self.tmp = tmp_path
        self.endpoint = endpoint
        self.imds = imds
        self.root = tmp_path / "root"
        self.state = tmp_path / "state"
        self.bin = tmp_path / "bin"
        for d in (self.root, self.state, self.bin):
            d.mkdir(parents=True)
        for name, body in SHIMS.items():
            _write_exe(self.bin / name, body)
        data, sha = artifact
        key = f"verify/{sha}.tar.gz"
        s3 = _client("s3", endpoint)
        try:
            s3.create_bucket(Bucket=BUCKET)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        self.ec2 = _client("ec2", endpoint)
        self.instance_id = self.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)[
            "Instances"
        ][0]["InstanceId"]
        imds.instance_id = self.instance_id
        params = dict(
            cluster_name="gpu",
            api_server_endpoint="https://example.eks.amazonaws.com",
            certificate_authority=CA,
            service_cidr="172.20.0.0/16",
            labels={},
            taints=(),
            max_pods=None,
            raid0_instance_store=False,
            region=REGION,
            asg_name=ASG,
            lifecycle_hook_name=HOOK,
            pool_name="p5",
            artifact_uri=f"s3://{BUCKET}/{key}",
            artifact_sha256=sha,
            driver_branch="580",
            driver_version=None,
            nvswitch=True,
            efa_count=32,
            verify_budget_s=30,
        )
        params.update(overrides)
        self.script = tmp_path / "user-data.sh"
        self.script.write_text(render_shell_part(NodeBootstrap(**params)))
        (self.state / "driver").write_text(DRIVER + "\n")
        (self.state / "fm_version").write_text(DRIVER + "\n")
        self.env = {
            "PATH": f"{self.bin}:{VENV_BIN}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
            "GPU_CLOUD_ROOT": str(self.root),
            "GPU_CLOUD_IMDS_ENDPOINT": imds.url,
            "GPU_CLOUD_RETRY_BASE_S": "0.05",
            "FAKE_STATE": str(self.state),
            "FAKE_ACTIVE_UNITS": "nvidia-fabricmanager",
            "FAKE_EFA_DEVICES": "32",
            "FAKE_VERIFY": "pass",
            "FAKE_DRIVER_AFTER_INSTALL": DRIVER,
        }

    def run(self, **env):
        full = {**self.env, **env}
        self.proc = subprocess.run(
            ["bash", str(self.script)], env=full, capture_output=True, text=True, timeout=120
        )
        return self.proc

    # --- observations
    def tags(self):
        found = self.ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [self.instance_id]}])
        return {t["Key"]: t["Value"] for t in found["Tags"]}

    def lifecycle(self):
        return [c for c in LIFECYCLE_CALLS if c["instance"] == self.instance_id]

    def shim_log(self, name):
        path = self.state / f"{name}.log"
        return path.read_text().splitlines() if path.exists() else []

    def log(self):
        return (self.root / "var/log/gpu-cloud/bootstrap.log").read_text()

    def report(self):
        return json.loads((self.root / "var/lib/gpu-cloud/verify.json").read_text())

    def masked(self):
        unit_dir = self.root / "etc/systemd/system"
        return sorted(
            p.name for p in unit_dir.glob("*") if p.is_symlink() and os.readlink(p) == "/dev/null"
        ) if unit_dir.exists() else []

    def explain(self):
        return f"rc={self.proc.returncode}\n--- stderr ---\n{self.proc.stderr[-6000:]}"


@pytest.fixture
def node(tmp_path, moto_endpoint, imds, artifact):
    require_tool("aws")
    created = []

    def make(**overrides):
        n = Node(tmp_path / f"n{len(created)}", moto_endpoint, imds, artifact, **overrides)
        created.append(n)
        return n

    return make


def _assert_abandoned(n, reason_part):
    assert n.proc.returncode != 0, n.explain()
    assert n.lifecycle() == [
        {"hook": HOOK, "asg": ASG, "instance": n.instance_id, "result": "ABANDON"}
    ], n.explain()
    tags = n.tags()
    assert tags.get("gpu-cloud:verify") == "fail", n.explain()
    reason = tags.get("gpu-cloud:verify-reason", "")
    assert reason and reason_part in reason, (reason, n.explain())
    assert len(reason) <= 256
    assert n.masked() == ["kubelet.service", "nodeadm-run.service"], n.explain()
    assert any(
        line.split()[-3:] == ["mask", "nodeadm-run.service", "kubelet.service"]
        for line in n.shim_log("systemctl")
    ), n.shim_log("systemctl")
    # the report (the verifier's, or the bootstrap's own stub) is printed into the log
    report = n.report()
    assert report["verdict"] == "fail"
    assert (n.root / "var/lib/gpu-cloud/verify.json").read_text().strip() in n.log()
    return reason


# ----------------------------------------------------------------------------- scenarios


def test_healthy_node_continues_and_never_masks_kubelet(node):
    n = node()
    n.run()
    assert n.proc.returncode == 0, n.explain()
    assert n.lifecycle() == [{"hook": HOOK, "asg": ASG, "instance": n.instance_id, "result": "CONTINUE"}]
    assert n.tags() == {"gpu-cloud:verify": "pass"}
    assert n.masked() == []
    assert not any(" mask " in f" {line} " for line in n.shim_log("systemctl"))
    # the accelerated-AMI path installs nothing
    assert n.shim_log("dnf") == []
    # persistence mode was switched on (nvidia-persistenced is not "active" here)
    assert "nvidia-smi -pm 1" in n.shim_log("calls")
    # verifier ran from the extracted artifact with its pynvml, the instance id and our paths
    report = n.report()
    assert report["instanceId"] == n.instance_id
    assert report["pynvml"] == "artifact-pynvml"
    assert report["argv"]["budget_s"] == "30"
    prom = n.root / "var/lib/node_exporter/textfile_collector/gpu_cloud_verify.prom"
    assert report["argv"]["textfile"] == str(prom) and prom.read_text().startswith("gpu_cloud_verify_pass 1")
    for name in ("gpu_verify.py", "pynvml.py", "expect/p5.48xlarge.json"):
        assert (n.root / "opt/gpu-cloud/verify" / name).is_file()
    log = n.log()
    assert n.instance_id in log and "CONTINUE" in log
    # everything logged went to the console stand-in (stderr) as well
    assert "CONTINUE" in n.proc.stderr


def test_failed_verification_abandons_with_failing_checks_as_reason(node):
    n = node()
    n.run(FAKE_VERIFY="fail")
    reason = _assert_abandoned(n, "nvlink_active gpu3")
    assert reason == "nvlink_active gpu3; ecc_uncorrected gpu1"
    assert n.report()["checks"][1]["name"] == "nvlink_active"  # the verifier's own report kept


def test_verifier_that_cannot_run_abandons(node):
    n = node()
    n.run(FAKE_VERIFY="crash")  # exit 2, no report
    reason = _assert_abandoned(n, "could not run")
    assert reason.startswith("verify: could not run (exit 2)")
    assert n.report()["checks"][0]["name"] == "verify"  # the bootstrap wrote the stub report


def test_transient_imds_failures_are_retried(node, imds):
    n = node()
    imds.fail_token_puts = 2
    before = imds.token_puts
    n.run()
    assert n.proc.returncode == 0, n.explain()
    assert imds.fail_token_puts == 0
    assert imds.token_puts - before == 4  # two 500s, then success; then one for instance-type
    assert [c["result"] for c in n.lifecycle()] == ["CONTINUE"]
    assert "retrying" in n.log()


def test_wrong_artifact_checksum_abandons_before_running_anything(node):
    n = node(artifact_sha256="0" * 64)
    n.run()
    reason = _assert_abandoned(n, "sha256")
    assert reason.startswith("artifact: sha256 mismatch")
    assert not (n.root / "opt/gpu-cloud/verify/gpu_verify.py").exists()
    assert n.report()["checks"][0]["name"] == "artifact"


def test_mig_pool_turns_mig_mode_on_before_verifying(node):
    n = node(mig=True)
    n.run(FAKE_EFA_DEVICES="32")
    assert n.proc.returncode == 0, n.explain()
    assert "nvidia-smi -mig 1" in n.shim_log("calls")
    assert n.lifecycle()[0]["result"] == "CONTINUE"


def test_mig_mode_that_does_not_take_effect_abandons(node):
    n = node(mig=True)
    n.run(FAKE_EFA_DEVICES="32", FAKE_MIG_NEEDS_RESET="1")
    _assert_abandoned(n, "mig: mode is 'Disabled'")


def test_pool_without_mig_never_touches_mig_mode(node):
    n = node()
    n.run(FAKE_EFA_DEVICES="32")
    assert n.proc.returncode == 0, n.explain()
    assert not [c for c in n.shim_log("calls") if "-mig" in c]


def test_efa_count_mismatch_abandons(node):
    n = node()
    n.run(FAKE_EFA_DEVICES="31")
    reason = _assert_abandoned(n, "efa")
    assert "31" in reason and "32" in reason


def test_driver_branch_mismatch_installs_pinned_stream(node):
    n = node()
    (n.state / "driver").write_text("570.172.08\n")
    n.run()
    assert n.proc.returncode == 0, n.explain()
    dnf = n.shim_log("dnf")
    assert any("module enable nvidia-driver:580-open" in line for line in dnf), dnf
    assert any(line.endswith("install nvidia-open") for line in dnf), dnf
    assert any("install nvidia-fabricmanager" in line for line in dnf), dnf
    assert any("cuda-amzn2023.repo" in line for line in dnf), dnf
    assert "systemctl enable --now nvidia-fabricmanager" in n.shim_log("systemctl")
    assert [c["result"] for c in n.lifecycle()] == ["CONTINUE"]


def test_driver_install_that_does_not_take_effect_abandons(node):
    n = node(driver_version="580.95.05")
    n.run()  # nvidia-smi keeps reporting 580.65.06 after "install"
    dnf = n.shim_log("dnf")
    assert any(line.endswith("install nvidia-open-580.95.05") for line in dnf), dnf
    _assert_abandoned(n, "driver")


def test_fabric_manager_version_must_equal_driver(node):
    n = node()
    (n.state / "fm_version").write_text("580.65.05\n")
    n.run()
    reason = _assert_abandoned(n, "fabricmanager")
    assert "580.65.05" in reason


def test_unexpected_bash_error_fails_closed(node):
    n = node()
    # make a directory the script must create impossible: an unhandled error, not a step failure
    (n.root / "var/lib").mkdir(parents=True)
    (n.root / "var/lib/node_exporter").write_text("not a directory")
    n.run()
    reason = _assert_abandoned(n, "verify")
    assert "unexpected error" in reason


def test_bad_config_fails_closed(node):
    n = node()
    text = n.script.read_text().replace("export GPU_CLOUD_EFA_COUNT=32", "export GPU_CLOUD_EFA_COUNT=lots")
    n.script.write_text(text)
    n.run()
    _assert_abandoned(n, "config")


def test_script_is_shellcheck_clean():
    shellcheck = require_tool("shellcheck")
    result = subprocess.run([shellcheck, str(ROOT / "userdata/bootstrap.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_size_budget():
    size = (ROOT / "userdata/bootstrap.sh").stat().st_size
    assert size <= 10 * 1024, f"bootstrap.sh is {size} bytes; keep it <= 10 KiB for the 16 KB user-data"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
