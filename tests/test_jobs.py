"""`python -m jobs`: renders the NCCL acceptance job and the training-job templates from a stack file, one line and
exit 2 on a mistake; and every single-node Job template lets a disrupted pod start again."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from decisions.catalog.catalog import load_catalog
from decisions.platform import jobset, kueue
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
    assert {"name": "data", "mountPath": "/data", "subPath": "data"} in trainer["volumeMounts"]
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
    """The Job `python -m jobs job` renders for dev's spot pool, and the NVLink check's Job
    (decisions/platform/acceptance.py)."""
    from decisions.platform import acceptance
    from tests.test_jobset import pool

    result = jobs("job", "dev", "--pool", "dev-gpu-spot", "--name", "finetune", "--image", "i", "--", "true")
    assert result.returncode == 0, result.stderr
    example = yaml.safe_load(result.stdout)
    check = acceptance.nvlink_cronjob_manifest(
        pool("p5.48xlarge"), load_catalog(), namespace="training", queue_name="training", schedule="0 4 * * 0",
        suspend=False, judge_configmap="nccl-judge", service_account="nccl-acceptance")
    return {"python -m jobs job": example,
            "NVLink check": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nvlink"},
                             "spec": check["spec"]["jobTemplate"]["spec"]}}


@pytest.mark.parametrize("which", ["python -m jobs job", "NVLink check"])
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
    # What job and pytorch-job refuse, mpijob refuses too (decisions/platform/job_options.check_job).
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "Big_Run", "--image", "i", "--", "true"],
     "python -m jobs mpijob: job name 'Big_Run': a DNS-1035 label"),
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--scratch", "2TB",
      "--", "true"], "python -m jobs mpijob: scratch size '2TB' is not a Kubernetes quantity"),
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "a" * 55, "--image", "i", "--", "true"],
     f"job name '{'a' * 55}' is too long: a DNS-1035 label (lower-case letters, digits, '-', starting with a letter) "
     "of at most 54 characters with 2 worker(s)"),
    (["pytorch-job", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--env", "PET_NNODES=4",
      "--", "t.py"], "python -m jobs pytorch-job: --env 'PET_NNODES=4': PET_* variables are set by pytorch-job's own"),
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "finetune-a100-40gb-spot", "--name", "x", "--image", "i",
      "--", "train.py"], "pool finetune-a100-40gb-spot: EFA is off"),
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "Big_Run", "--image", "i",
      "--", "train.py"], "job name 'Big_Run': a DNS-1035 label"),
    (["pytorch-job", "--stack", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i",
      "--checkpoint-uri", "gs://b/x", "--", "train.py"], "--checkpoint-uri 'gs://b/x' is not an s3:// URI"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--name", "x", "--image", "i", "--env", "HF-HOME=/x", "--", "true"],
     "python -m jobs job: --env 'HF-HOME=/x': 'HF-HOME' is not an environment variable name"),
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--env", "A", "--", "true"],
     "python -m jobs mpijob: --env 'A': give KEY=VALUE"),
    (["pytorch-job", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i",
      "--volume", "Models:/m", "--", "t.py"], "python -m jobs pytorch-job: --volume 'Models:/m': 'Models' is not a "
                                              "PersistentVolumeClaim name"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--name", "x", "--image", "i", "--volume", "lustre-data:/data",
      "--", "true"], "--volume lustre-data:/data: the stack has no storage.lustre"),
    (["job", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--volume", "m:/scratch",
      "--", "true"], "--volume m:/scratch: /scratch is already mounted (emptyDir 12739Gi)"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--name", "x", "--image", "i", "--gpus", "5", "--", "true"],
     "--gpus 5: a node of pool dev-gpu-spot has 4 GPUs; ask for 1 to 4"),
    (["job", "prod-us-east-1", "--pool", "infer-l40s", "--name", "x", "--image", "i", "--", "true"],
     "pool infer-l40s is an inference pool; the training queue does not place jobs there (its pools in stack "
     "prod-us-east-1: train-h100, finetune-a100-80gb-spot, finetune-a100-40gb-spot)"),
])
def test_mistakes_get_one_line_and_exit_2(args, message):
    result = jobs(*args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("positional, option", [
    (["nccl-acceptance", "prod-us-east-1", "--pool", "train-h100"],
     ["nccl-acceptance", "--stack", "prod-us-east-1", "--pool", "train-h100"]),
    (["mpijob", "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image", "i", "--", "python", "t.py"],
     ["mpijob", "--stack", "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image", "i", "--", "python",
      "t.py"]),
], ids=["nccl-acceptance", "mpijob"])
def test_the_stack_is_named_positionally_as_for_plan_or_with_the_option(positional, option):
    # `python -m plan STACK` and `python -m plan --stack STACK`: jobs takes the stack both ways too.
    by_position, by_option = jobs(*positional), jobs(*option)
    assert by_position.returncode == 0, by_position.stderr
    assert by_position.stdout == by_option.stdout and yaml.safe_load(by_position.stdout)["kind"] == "MPIJob"
    if "--" in positional:
        assert "python t.py" in by_position.stdout


@pytest.mark.parametrize("args, message", [
    (["nccl-acceptance", "--pool", "train-h100"], "name the stack: python -m jobs nccl-acceptance STACK"),
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i"],
     "give the program after --"),
    (["nccl-acceptance", "prod-us-east-1", "--stack", "prod-us-east-1", "--pool", "train-h100"],
     "the stack is named twice"),
])
def test_a_missing_stack_or_program_is_a_usage_error(args, message):
    result = jobs(*args)
    assert result.returncode == 2 and message in result.stderr and result.stdout == "", result.stderr


# --- a single-node job on any pool of the queue; what every template mounts and sets ------------------------------
QUEUE_POOLS_WITHOUT_EFA = [("dev", "dev-gpu-spot"), ("prod-us-east-1", "finetune-a100-80gb-spot"),
                           ("prod-us-east-1", "finetune-a100-40gb-spot")]


@pytest.mark.parametrize("stack, pool", QUEUE_POOLS_WITHOUT_EFA)
def test_a_single_node_job_runs_on_the_pools_the_multi_node_templates_refuse(stack, pool):
    """Spot and dev's pools: `job` renders a Job Kubernetes accepts; mpijob and pytorch-job say they need EFA and
    give the `job` command for that pool."""
    import kubernetes_validate

    result = jobs("job", stack, "--pool", pool, "--name", "finetune", "--image", "i", "--", "python", "t.py")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    kubernetes_validate.validate(manifest, "1.35", strict=True)
    pod = manifest["spec"]["template"]["spec"]
    assert manifest["kind"] == "Job" and pod["nodeSelector"] == {"gpu-cloud.io/pool": pool}
    assert {"key": "gpu-cloud.io/interruptible", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in pod["tolerations"]
    for command in ("mpijob", "pytorch-job"):
        refused = jobs(command, stack, "--pool", pool, "--name", "x", "--image", "i", "--", "t.py")
        assert refused.returncode == 2 and refused.stdout == ""
        assert f"pool {pool}: EFA is off; {command} runs over several whole nodes through EFA" in refused.stderr
        assert f"for work on one node of {pool}: python -m jobs job {stack} --pool {pool} ..." in refused.stderr


def _program(manifest):
    """(the program's container, its environment as the program sees it) in any job template."""
    from jobs.__main__ import _program_container

    _, container, env = _program_container(manifest)
    return container, env


@pytest.mark.parametrize("command", ["job", "mpijob", "pytorch-job"])
def test_every_template_mounts_the_stacks_storage_and_takes_env_and_volumes(command):
    """prod-eu-west-1 has Lustre: /data, /scratch and /dev/shm in every template, then each --volume; each --env
    reaches the program (through mpirun -x on MPI ranks); the opening comment lists what is mounted."""
    result = jobs(command, "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image", "i",
                  "--env", "HF_HOME=/scratch/hf", "--env", "NCCL_DEBUG=WARN", "--volume", "models:/models:ro",
                  "--checkpoint-uri", "s3://gpu-cloud-prod-eu-west-1-123456789012-checkpoints/bert", "--", "t.py")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    container, env = _program(manifest)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/data", "/scratch", "/dev/shm", "/models"} and mounts["/models"]["readOnly"] is True
    assert env["HF_HOME"] == "/scratch/hf" and env["CHECKPOINT_DIR"] == "/scratch/checkpoints"
    assert env["CHECKPOINT_URI"] == "s3://gpu-cloud-prod-eu-west-1-123456789012-checkpoints/bert"
    if command != "job":
        assert env["NCCL_DEBUG"] == "WARN"           # replaces the template's INFO
    if command == "mpijob":
        from tests.test_mpijob import mpirun_args

        args = mpirun_args(manifest)
        forwarded = [args[i + 1] for i, arg in enumerate(args) if arg == "-x"]
        assert {"HF_HOME", "NCCL_DEBUG", "CHECKPOINT_DIR", "CHECKPOINT_URI"} <= set(forwarded)
        assert len(forwarded) == len(set(forwarded))
    comment = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert comment[0] == f"# python -m jobs {command}: {manifest['kind']} bert on pool train-a100 of stack " \
                         "prod-eu-west-1"
    assert "#   /data     claim lustre-data (FSx for Lustre, the stack's datasets)" in comment
    assert "#   /models   claim models, read-only" in comment
    assert any(line.startswith("#   /scratch  emptyDir ") for line in comment)


@pytest.mark.parametrize("command", ["job", "mpijob"])
def test_pet_variables_are_the_users_where_no_torchrun_of_the_templates_reads_them(command):
    """Only pytorch-job sets torchrun's PET_* options (refused there: test_mistakes_get_one_line_and_exit_2); job and
    mpijob hand them to the program like any --env."""
    result = jobs(command, "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image", "i",
                  "--env", "PET_NNODES=4", "--", "torchrun", "t.py")
    assert result.returncode == 0, result.stderr
    _, env = _program(yaml.safe_load(result.stdout))
    assert env["PET_NNODES"] == "4"


def test_the_nccl_acceptance_test_has_no_opening_comment():
    result = jobs("nccl-acceptance", "prod-us-east-1", "--pool", "train-h100")
    assert result.returncode == 0 and result.stdout.startswith("apiVersion:"), result.stderr


def test_a_stack_without_lustre_says_so():
    result = jobs("job", "dev", "--pool", "dev-gpu-spot", "--name", "x", "--image", "i", "--gpus", "1", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "# no /data: stack dev has no storage.lustre\n" in result.stdout
    container, _ = _program(yaml.safe_load(result.stdout))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    # A quarter of dev's node: a quarter of the whole node's scratch (half the g6.12xlarge's array, 1574Gi).
    assert container["resources"]["limits"]["ephemeral-storage"] == "393Gi"


# --- checkpoints: one story across the templates and the docs --------------------------------------------------------
@pytest.mark.parametrize("command", ["job", "mpijob", "pytorch-job"])
def test_every_template_hands_the_program_the_checkpoint_dir(command, capsys):
    from decisions.platform import job_options
    from jobs.__main__ import main

    assert main([command, "prod-eu-west-1", "--pool", "train-a100", "--name", "bert", "--image", "i", "--", "t.py"]) == 0
    _, env = _program(yaml.safe_load(capsys.readouterr().out))
    assert env[job_options.CHECKPOINT_DIR_ENV] == job_options.CHECKPOINT_DIR == "/scratch/checkpoints"
    assert job_options.CHECKPOINT_URI_ENV not in env           # without --checkpoint-uri


def test_checkpoint_paths_agree_across_the_templates_and_the_docs():
    from decisions.platform import job_options
    from decisions.storage import buckets
    from tests.conftest import STACKS

    docs = {page: (ROOT / "docs" / page).read_text() for page in ("training.md", "storage.md")}
    # Every local checkpoint path the docs name is the templates' CHECKPOINT_DIR; none falls back elsewhere.
    for page, text in docs.items():
        assert set(re.findall(r"/\w+/checkpoints\b", text)) == {job_options.CHECKPOINT_DIR}, page
        assert "/tmp/ckpt" not in text
    assert "CHECKPOINT_DIR=/scratch/checkpoints" in docs["training.md"]
    assert "`CHECKPOINT_DIR` (`/scratch/checkpoints`)" in docs["storage.md"]
    # Every example CHECKPOINT_URI is s3://<a shipped stack's checkpoints bucket>/<the job's --name>.
    examples = re.findall(r"s3://([a-z0-9-]+-checkpoints)/([\w-]+)", docs["training.md"])
    names = set(re.findall(r"--name (\S+)", docs["training.md"]))
    assert examples
    for bucket, job_name in examples:
        assert bucket in {buckets.bucket_name("gpu-cloud", stack, "123456789012", "checkpoints") for stack in STACKS}
        assert job_name in names, job_name
    assert "`s3://<checkpoints bucket>/<job name>`" in docs["storage.md"]


# --- triton-config ---------------------------------------------------------------------------------------------------
def test_triton_config_renders_what_spec_triton_does_and_triton_parses_it():
    from decisions.serving import triton
    from tests.test_triton import parse

    result = jobs("triton-config", "resnet50", "--backend", "onnxruntime", "--max-batch-size", "32",
                  "--preferred-batch-sizes", "8,16", "--max-queue-delay-us", "500", "--instances-per-gpu", "2",
                  "--gpus", "0,1", "--input", "input:TYPE_FP32:3,224,224", "--output", "probs:TYPE_FP32:-1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == triton.model_config_pbtxt(
        "resnet50", backend="onnxruntime", max_batch_size=32, preferred_batch_sizes=[8, 16], max_queue_delay_us=500,
        instances_per_gpu=2, gpus=[0, 1], inputs=[{"name": "input", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
        outputs=[{"name": "probs", "data_type": "TYPE_FP32", "dims": [-1]}])
    config, schema = parse(result.stdout)
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16] and list(config.output[0].dims) == [-1]
    assert list(config.instance_group[0].gpus) == [0, 1] and config.input[0].data_type == schema.TYPE_FP32


def test_triton_configs_data_types_are_tritons():
    from decisions.serving import triton
    from tests.test_triton import model_config_schema

    assert set(triton.DATA_TYPES) == set(model_config_schema().DataType.keys()) - {"TYPE_INVALID"}


@pytest.mark.parametrize("args, message", [
    (["--preferred-batch-sizes", "8,x"], "--preferred-batch-sizes '8,x': give whole numbers separated by commas"),
    (["--preferred-batch-sizes", "64"], "between 1 and max_batch_size 32"),
    (["--input", "input:FP32:3"], "data type 'FP32' is not one of TYPE_BOOL"),
    (["--input", "input:TYPE_FP32"], "--input 'input:TYPE_FP32': give NAME:TYPE:DIMS"),
    (["--output", "probs:TYPE_FP32:0"], "--output 'probs:TYPE_FP32:0': DIMS are sizes of at least 1 (or -1"),
    (["--gpus", "0,"], "--gpus '0,': give whole numbers"),
])
def test_a_triton_config_triton_would_refuse_is_one_line_and_exit_2(args, message):
    base = {"--backend": "onnxruntime", "--max-batch-size": "32", "--preferred-batch-sizes": "8",
            "--max-queue-delay-us": "100"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = jobs("triton-config", "m", *[word for pair in base.items() for word in pair])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("python -m jobs triton-config: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
