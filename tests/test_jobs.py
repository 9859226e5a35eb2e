"""`python -m jobs`: renders the NCCL acceptance job and the training-job template from a stack file, one line and
exit 2 on a mistake."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.crds import crd_schema, validate_against_crd


def jobs(*args):
    return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=ROOT, capture_output=True, text=True)


def test_nccl_acceptance_renders_an_mpijob_for_the_stacks_efa_pool():
    result = jobs("nccl-acceptance", "--stack", "prod-us-east-1", "--pool", "train-h100")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert manifest["kind"] == "MPIJob" and manifest["metadata"]["generateName"] == "nccl-efa-train-h100-"
    judge = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][1]
    # p5: 0.9 x AWS's published 487.09 GB/s for two p5s at 16 GiB, the size the launcher runs up to
    assert {e["name"]: e.get("value") for e in judge["env"]}["MIN_BUS_GBPS"] == "438.381"
    assert "all_reduce_perf -b 8 -e 17179869184 " in manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"][
        "spec"]["containers"][0]["command"][2]
    validate_against_crd(manifest, crd_schema("kubeflow.org/mpijobs"))


def test_mpijob_renders_the_training_template_with_the_program_after_the_separator():
    result = jobs("mpijob", "--stack", "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image",
                  "example.com/train:1", "--workers", "3", "--checkpoint-uri", "s3://ckpt/bert",
                  "--", "python", "train.py", "--resume")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert manifest["metadata"]["name"] == "bert" and manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    script = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2]
    assert script.rstrip().endswith("python train.py --resume")


@pytest.mark.parametrize("args,message", [
    (["nccl-acceptance", "--stack", "prod-us-east-1", "--pool", "nope"],
     "stack prod-us-east-1 has no pool 'nope'; its pools: train-h100, finetune-a100-80gb-spot"),
    (["nccl-acceptance", "--stack", "prod-us-east-1", "--pool", "infer-l40s"],
     "pool infer-l40s is an inference pool"),
    (["nccl-acceptance", "--stack", "prod-us-east-1", "--pool", "finetune-a100-40gb-spot"],
     "pool finetune-a100-40gb-spot: EFA is off"),
    (["nccl-acceptance", "--stack", "no-such-stack", "--pool", "x"], "stack no-such-stack: "),
    (["mpijob", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i",
      "--checkpoint-uri", "/local/dir", "--", "true"], "--checkpoint-uri '/local/dir' is not an s3:// URI"),
    (["mpijob", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--workers", "5",
      "--", "true"], "5 worker(s) do not fit its maxNodes 4"),
])
def test_mistakes_get_one_line_and_exit_2(args, message):
    result = jobs(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
