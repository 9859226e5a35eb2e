"""`python -m jobs`: renders the NCCL acceptance job and the training-job templates from a stack file, one line and
exit 2 on a mistake; and every single-node Job template lets a disrupted pod start again."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from spec import jobset, kueue
from spec.catalog import load_catalog
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


def test_pytorch_job_renders_a_jobset_for_the_pool_with_its_file_system():
    result = jobs("pytorch-job", "--stack", "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image",
                  "example.com/train:1", "--nodes", "3", "--checkpoint-uri", "s3://ckpt/bert", "--max-restarts", "2",
                  "--", "/app/train.py", "--resume")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    validate_against_crd(manifest, crd_schema("jobset.x-k8s.io/jobsets"))
    assert manifest["kind"] == "JobSet" and manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] == 2
    [node] = manifest["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["template"]["spec"]["parallelism"] == 3 and pod["nodeSelector"] == {"gpu-cloud.io/pool": "train-a100"}
    [trainer] = pod["containers"]
    assert trainer["command"] == ["torchrun", "/app/train.py", "--resume"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    # prod-eu-west-1 has Lustre: the claim is at /data. Its nodes boot from zero through the gate with the AMI's
    # driver, so torchrun's store waits Kueue's pods-ready timeout for them.
    assert {"name": "data", "mountPath": "/data"} in trainer["volumeMounts"]
    assert env["PET_RDZV_CONF"] == f"timeout={kueue.pods_ready_timeout_s('ami')}"
    assert env["CHECKPOINT_URI"] == "s3://ckpt/bert"


def test_pytorch_job_mounts_no_file_system_where_the_stack_has_none(tmp_path):
    from tests.conftest import stack_config

    config = stack_config("prod-eu-west-1")
    config["gpu-cloud:storage"] = {"nvmeScratch": False}
    stack_file = tmp_path / "Pulumi.nolustre.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    result = jobs("pytorch-job", "--stack", "prod-eu-west-1", "--stack-file", str(stack_file), "--pool", "train-a100",
                  "--name", "bert", "--image", "example.com/train:1", "--", "/app/train.py")
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "data" not in {v["name"] for v in pod["volumes"]}
    # Without the RAID0 array, scratch stays small: it shares the root volume with the images.
    assert {"name": "scratch", "emptyDir": {"sizeLimit": jobset.ROOT_VOLUME_SCRATCH}} in pod["volumes"]


def _single_node_jobs():
    """The single-node Job example of docs/training.md, and the NVLink check's Job (spec/acceptance.py)."""
    from spec import acceptance
    from tests.test_jobset import pool

    [example] = [doc for block in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs/training.md").read_text(), re.S)
                 for doc in [yaml.safe_load(block)] if isinstance(doc, dict) and doc.get("kind") == "Job"]
    check = acceptance.nvlink_cronjob_manifest(
        pool("p5.48xlarge"), load_catalog(), namespace="training", queue_name="training", schedule="0 4 * * 0",
        suspend=False, judge_configmap="nccl-judge", service_account="nccl-acceptance")
    return {"docs/training.md": example,
            "NVLink check": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nvlink"},
                             "spec": check["spec"]["jobTemplate"]["spec"]}}


@pytest.mark.parametrize("which", ["docs/training.md", "NVLink check"])
def test_single_node_jobs_start_again_after_a_disruption(which):
    """A pod with the DisruptionTarget condition (evicted for a drain or a spot reclaim, lost with its node) is
    replaced and counts against no backoffLimit; a podFailurePolicy requires restartPolicy Never (Kubernetes
    pkg/apis/batch/validation/validation.go), which the schema below cannot check."""
    import kubernetes_validate

    job = _single_node_jobs()[which]
    kubernetes_validate.validate(job, "1.35", strict=True)
    assert job["spec"]["podFailurePolicy"] == jobset.IGNORE_DISRUPTIONS
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


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
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "finetune-a100-40gb-spot", "--name", "x", "--image", "i",
      "--", "train.py"], "pool finetune-a100-40gb-spot: EFA is off"),
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "Big_Run", "--image", "i",
      "--", "train.py"], "job name 'Big_Run': a DNS-1035 label"),
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i",
      "--checkpoint-uri", "gs://b/x", "--", "train.py"], "--checkpoint-uri 'gs://b/x' is not an s3:// URI"),
])
def test_mistakes_get_one_line_and_exit_2(args, message):
    result = jobs(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
