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
    assert trainer["command"] == ["bash", "-c", jobset.TRAINER_SCRIPT, "torchrun", "/app/train.py", "--resume"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    # prod-eu-west-1 has Lustre: the claim is at /data. Its nodes boot from zero through the gate with the AMI's
    # driver, so torchrun's store waits Kueue's pods-ready timeout for them.
    assert {"name": "data", "mountPath": "/data", "subPath": "data"} in trainer["volumeMounts"]
    assert env["PET_RDZV_CONF"] == f"timeout={kueue.pods_ready_timeout_s('ami')}"
    assert env["CHECKPOINT_URI"] == "s3://ckpt/bert"


@pytest.mark.parametrize("bad,expected", [
    ({"maxNodes": 999}, ["gpu-cloud:nodePools[0].maxNodes (pool dev-gpu-spot): 999"]),
    ({"maxNodes": 999, "minNodes": -1}, ["(2 mistakes)", "nodePools[0].", "(and 1 more: python -m plan STACK lists them)"]),
])
def test_a_bad_stack_says_its_first_mistake_on_one_line(tmp_path, bad, expected):
    from tests.conftest import stack_config

    config = stack_config("dev")
    config["gpu-cloud:nodePools"][0].update(bad)
    stack_file = tmp_path / "Pulumi.dev.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    result = jobs("job", "dev", "--stack-file", str(stack_file), "--pool", "dev-gpu-spot", "--name", "x", "--image",
                  "example.com/x:1", "--", "true")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert all(part in result.stderr for part in expected), result.stderr


def test_pytorch_job_mounts_no_file_system_where_the_stack_has_none(tmp_path):
    from tests.conftest import stack_config

    config = stack_config("prod-eu-west-1")
    config["gpu-cloud:storage"] = {"nvmeScratch": False}
    budget = config["gpu-cloud:budget"]      # no file system: its acknowledged gap goes with it
    budget["unpriced"] = [name for name in budget["unpriced"] if name != "fsx-lustre"]
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
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--nodes", "5", "--",
      "true"], "5 worker(s) do not fit its maxNodes 4"),
    (["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", "--max-restarts", "-1",
      "--", "true"], "python -m jobs mpijob: max restarts -1: must be 0 or more"),
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


@pytest.mark.parametrize("command", ["job", "mpijob", "pytorch-job"])
def test_every_job_declares_its_maximum_run_time_where_kueue_reads_it(command):
    """On the job object's own labels (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobframework/utils.go lines
    190-205 reads kueue.x-k8s.io/max-exec-time-seconds there, for every integration), in seconds; none without
    --max-run-time."""
    base = [command, "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i"]
    declared = yaml.safe_load(jobs(*base, "--max-run-time", "1d2h30m", "--", "t.py").stdout)
    assert declared["metadata"]["labels"]["kueue.x-k8s.io/max-exec-time-seconds"] == str(86400 + 2 * 3600 + 30 * 60)
    plain = yaml.safe_load(jobs(*base, "--", "t.py").stdout)
    assert "kueue.x-k8s.io/max-exec-time-seconds" not in plain["metadata"]["labels"]
    assert {**plain["metadata"]["labels"], "kueue.x-k8s.io/max-exec-time-seconds": "95400"} == \
        declared["metadata"]["labels"]


@pytest.mark.parametrize("value, ok", [("1", True), ("2147483647", True), ("2147483648", False), ("0", False),
                                       ("90", True), ("90x", False), ("1h30", False), ("-5m", False)])
def test_a_maximum_run_time_kueue_would_refuse_is_one_line_and_exit_2(value, ok):
    """Kueue's webhook refuses a label that is not a whole number above 0 (validation.go lines 235-247), and the
    Workload's field is an int32 (workload_types.go lines 70-77)."""
    result = jobs("job", "dev", "--pool", "dev-gpu-spot", "--name", "x", "--image", "i", f"--max-run-time={value}",
                  "--", "true")
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert result.stderr.startswith(f"python -m jobs job: --max-run-time '{value}': give a duration from 1s to "
                                        "2147483647s") and len(result.stderr.strip().splitlines()) == 1


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
    """Spot and dev's pools: `job` renders a Job Kubernetes accepts; mpijob says it needs EFA and gives the `job`
    command for that pool (pytorch-job runs there over TCP: test_pytorch_job_runs_over_tcp_where_a_pool_has_no_efa)."""
    import kubernetes_validate

    result = jobs("job", stack, "--pool", pool, "--name", "finetune", "--image", "i", "--", "python", "t.py")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    kubernetes_validate.validate(manifest, "1.35", strict=True)
    pod = manifest["spec"]["template"]["spec"]
    assert manifest["kind"] == "Job" and pod["nodeSelector"] == {"gpu-cloud.io/pool": pool}
    assert {"key": "gpu-cloud.io/interruptible", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in pod["tolerations"]
    refused = jobs("mpijob", stack, "--pool", pool, "--name", "x", "--image", "i", "--", "t.py")
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"pool {pool}: EFA is off; mpijob runs over several whole nodes through EFA" in refused.stderr
    assert f"for work on one node of {pool}: python -m jobs job {stack} --pool {pool} ..." in refused.stderr


def test_pytorch_job_runs_over_tcp_where_a_pool_has_no_efa():
    """The spot A100 pools have no EFA: pytorch-job still runs across their nodes, with NCCL over TCP sockets and a
    warning of what that gets (one network card's 100 of the p4d's 400 Gbps: catalog.yaml)."""
    result = jobs("pytorch-job", "prod-us-east-1", "--pool", "finetune-a100-40gb-spot", "--name", "bert", "--image",
                  "i", "--nodes", "3", "--", "t.py")
    assert result.returncode == 0, result.stderr
    [warning] = result.stderr.splitlines()
    assert warning.startswith("python -m jobs pytorch-job: warning: pool finetune-a100-40gb-spot has no EFA: NCCL "
                              "runs across nodes over TCP sockets")
    assert "at most 100 Gbps a node (p4d.24xlarge: network card 0 of 4), against 400 Gbps over EFA" in warning
    manifest = yaml.safe_load(result.stdout)
    validate_against_crd(manifest, crd_schema("jobset.x-k8s.io/jobsets"))
    trainer, env = _program(manifest)
    assert env["NCCL_NET"] == "Socket" and "FI_PROVIDER" not in env
    assert "vpc.amazonaws.com/efa" not in trainer["resources"]["limits"]
    assert manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 3
    over_efa = jobs("pytorch-job", "prod-us-east-1", "--pool", "train-h100", "--name", "bert", "--image", "i", "--",
                    "t.py")
    assert over_efa.returncode == 0 and over_efa.stderr == ""


def test_mpijob_takes_nodes_and_its_old_workers_option_with_a_note():
    args = ["mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i"]
    by_nodes, by_workers = jobs(*args, "--nodes", "3", "--", "true"), jobs(*args, "--workers", "3", "--", "true")
    assert by_nodes.returncode == by_workers.returncode == 0, by_workers.stderr
    assert by_nodes.stdout == by_workers.stdout
    assert yaml.safe_load(by_nodes.stdout)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert by_nodes.stderr == ""
    assert by_workers.stderr == "python -m jobs mpijob: --workers is deprecated; use --nodes (the same value)\n"
    # Both at once is a usage error, whatever the values (2 is --nodes' default).
    both = jobs(*args, "--workers", "3", "--nodes", "2", "--", "true")
    assert both.returncode == 2 and "argument --nodes: not allowed with argument --workers" in both.stderr
    default = yaml.safe_load(jobs(*args, "--", "true").stdout)
    assert default["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.parametrize("given, backoff_limit", [([], 6), (["--max-restarts", "0"], 0), (["--max-restarts", "2"], 2)])
def test_every_multi_node_job_takes_max_restarts(given, backoff_limit):
    """mpijob's is the MPIJob's runPolicy.backoffLimit, which mpi-operator v0.8.0 gives the launcher Job
    (pkg/controller/mpi_job_controller.go line 1543); pytorch-job's the JobSet's failurePolicy.maxRestarts."""
    mpi = jobs("mpijob", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", *given, "--", "true")
    assert mpi.returncode == 0, mpi.stderr
    assert yaml.safe_load(mpi.stdout)["spec"]["runPolicy"]["backoffLimit"] == backoff_limit
    torch = jobs("pytorch-job", "prod-us-east-1", "--pool", "train-h100", "--name", "x", "--image", "i", *given, "--",
                 "t.py")
    expected = backoff_limit if given else jobset.DEFAULT_MAX_RESTARTS
    assert yaml.safe_load(torch.stdout)["spec"]["failurePolicy"]["maxRestarts"] == expected


def _mps_dev(tmp_path):
    """Stack dev with its GPU pool shared through MPS (4 clients per L4), as a stack file."""
    from tests.conftest import stack_config

    config = stack_config("dev")
    config["gpu-cloud:nodePools"][0]["gpuSharing"] = {"mode": "mps", "replicas": 4}
    stack_file = tmp_path / "Pulumi.dev-mps.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    return stack_file


def test_on_an_mps_pool_no_template_mounts_its_own_dev_shm(tmp_path):
    """On MPS the device plugin mounts the MPS server's shared memory at /dev/shm (k8s-device-plugin v0.20.0
    internal/plugin/mps.go lines 74-90), and a pod's own volume there would be mounted over it
    (NVIDIA/k8s-device-plugin#805). The one template that runs on MPS pools leaves it alone; the multi-node ones
    refuse shared GPUs; dev as shipped (whole GPUs) still gets its own."""
    stack_file = _mps_dev(tmp_path)
    args = ["dev", "--pool", "dev-gpu-spot", "--name", "finetune", "--image", "i"]
    on_mps = jobs("job", *args, "--stack-file", str(stack_file), "--", "true")
    assert on_mps.returncode == 0, on_mps.stderr
    pod = yaml.safe_load(on_mps.stdout)["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert "/dev/shm" not in {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    assert "#   /dev/shm  the MPS server's shared memory, mounted by the device plugin" in on_mps.stdout
    for command, why in (("mpijob", "EFA is off"), ("pytorch-job", "GPU sharing mode 'mps'")):
        refused = jobs(command, *args, "--stack-file", str(stack_file), "--", "t.py")
        assert refused.returncode == 2 and f"pool dev-gpu-spot: {why}" in refused.stderr
    shipped = yaml.safe_load(jobs("job", *args, "--", "true").stdout)["spec"]["template"]["spec"]
    [shm] = [v for v in shipped["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in shipped["containers"][0]["volumeMounts"]


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
    assert set(mounts) == {"/data", "/nccl-traces", "/scratch", "/dev/shm", "/models"}
    assert mounts["/models"]["readOnly"] is True
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
    comment = [" ".join(line.split()) for line in result.stdout.splitlines() if line.startswith("#")]
    assert comment[0] == f"# python -m jobs {command}: {manifest['kind']} bert on pool train-a100 of stack " \
                         "prod-eu-west-1"
    assert "# /data claim lustre-data (FSx for Lustre, the stack's datasets)" in comment
    assert "# /models claim models, read-only" in comment
    assert "# /nccl-traces claim lustre-data (FSx for Lustre outside the datasets link: kept, not exported)" in comment
    assert any(line.startswith("# /scratch emptyDir ") for line in comment)


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


# --- where a model fits: python -m jobs fit, and --model on the job commands -----------------------------------------
def _sharing_stack(tmp_path):
    """prod-us-east-1 with a pool of MPS shares (8 to each A100 80GB: 10,240 MiB each), one of MIG instances (each
    H100 cut into four 1g.10gb and one 3g.40gb) and a time-sliced one, all in the training queue."""
    from tests.conftest import stack_config

    config = stack_config("prod-us-east-1")
    spot = {"capacity": "spot", "minNodes": 0, "desiredNodes": 0, "maxNodes": 1, "efa": False}
    config["gpu-cloud:nodePools"] += [
        {"name": "share-a100-mps", "instanceTypes": ["p4de.24xlarge"], "workload": "training", **spot,
         "gpuSharing": {"mode": "mps", "replicas": 8}},
        {"name": "mig-h100", "instanceTypes": ["p5.48xlarge"], "workload": "training", **spot,
         "gpuSharing": {"mode": "mig", "migProfiles": {"1g.10gb": 4, "3g.40gb": 1}}},
        {"name": "sliced-l40s", "instanceTypes": ["g6e.12xlarge"], "workload": "general", **spot,
         "gpuSharing": {"mode": "time-slicing", "replicas": 4}}]
    path = tmp_path / "Pulumi.sharing.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return ["prod-us-east-1", "--stack-file", str(path)]


def fit_json(*args):
    import json

    result = jobs("fit", *args, "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_fit_places_the_designs_resnet50_on_one_gpu_of_dev_within_its_11_gb():
    code, answer = fit_json("dev", "--model", "resnet50", "--batch", "64")
    assert code == 0
    assert {k: answer["placement"][k] for k in ("pool", "share", "gpus", "nodes", "sharding", "gpuMemoryMiB")} == {
        "pool": "dev-gpu-spot", "share": "gpus", "gpus": 1, "nodes": 1, "sharding": "none", "gpuMemoryMiB": 22888}
    assert abs(answer["gpuMemoryGiB"] * 2 ** 30 / 11e9 - 1) <= 0.15          # the design: about 11 GB
    assert sum(answer["estimate"].values()) == pytest.approx(answer["gpuMemoryGiB"], abs=0.05)
    assert answer["workload"] == {"mode": "training", "precision": "fp32", "optimizer": "sgd-momentum", "batch": 64,
                                  "sequence": None, "recompute": False, "attention": None}


def test_fit_chooses_an_mps_share_over_a_whole_gpu_and_a_mig_instance_when_it_is_the_smallest(tmp_path):
    stack = _sharing_stack(tmp_path)
    _, small = fit_json(*stack, "--model", "resnet50", "--batch", "16")
    assert (small["placement"]["pool"], small["placement"]["share"], small["placement"]["memoryLimitMiB"]) == \
        ("share-a100-mps", "mps", 10240)
    # Past a 10 GiB share: the 3g.40gb instance ties an A100 40GB's 40 GiB and costs less an hour.
    _, larger = fit_json(*stack, "--model", "resnet50", "--batch", "64")
    assert (larger["placement"]["pool"], larger["placement"]["migProfile"]) == ("mig-h100", "3g.40gb")
    why = {p["pool"]: p["whyNot"] for p in larger["pools"]}
    assert why["share-a100-mps"].startswith("needs 10.3 GiB per GPU on its largest placement (an MPS share")
    assert "time-slicing does not partition memory" in why["sliced-l40s"]


def test_fit_prints_the_placement_and_each_pools_smallest():
    result = jobs("fit", "prod-us-east-1", "--model", "llama-2-7b")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("python -m jobs fit prod-us-east-1: llama-2-7b (6.74B parameters, 32 layers")
    assert lines[1].startswith("on one GPU: 124.5 GiB = weights 12.6 + gradients 12.6 + optimizer states 75.3")
    assert lines[2] == "placement: pool finetune-a100-80gb-spot, 2 A100 80GB GPUs (81,920 MiB each) on one node, " \
                       "zero-3, $3.43/hour"
    assert any(re.match(r"train-h100 +2 H100 GPUs \(81,920 MiB each\) on one node +zero-3 +75\.0 +80\.0", line)
               for line in lines)


def test_fit_refuses_a_model_that_fits_nowhere_with_its_figure():
    code, answer = fit_json("prod-us-east-1", "--model", "llama-2-70b")
    assert code == 1 and answer["placement"] is None
    assert answer["refusal"] == "llama-2-70b needs 1140.3 GiB on one GPU, and no placement on the training queue's " \
                                "pools holds it"
    assert all(p["whyNot"].startswith("needs ") for p in answer["pools"])
    text = jobs("fit", "prod-us-east-1", "--model", "llama-2-70b")
    assert text.returncode == 1 and "no placement: llama-2-70b needs 1140.3 GiB on one GPU" in text.stdout


def test_a_job_with_a_model_takes_the_smallest_placement_on_its_pool(tmp_path):
    stack = _sharing_stack(tmp_path)
    picked = {}
    for pool in ("finetune-a100-40gb-spot", "share-a100-mps", "mig-h100"):
        result = jobs("job", *stack, "--pool", pool, "--name", "r50", "--image", "i", "--model", "resnet50",
                      "--batch", "16", "--", "python", "t.py")
        assert result.returncode == 0, result.stderr
        container, _ = _program(yaml.safe_load(result.stdout))
        picked[pool] = container["resources"]["limits"]
        assert "# --model resnet50: 3.8 GiB per GPU on " in result.stdout
    assert picked["finetune-a100-40gb-spot"]["nvidia.com/gpu"] == 1          # not the whole node
    assert picked["share-a100-mps"]["nvidia.com/gpu"] == 1                   # its one share
    assert picked["mig-h100"]["nvidia.com/mig-1g.10gb"] == 1


@pytest.mark.parametrize("command, model, comment, nodes", [
    ("pytorch-job", ["llama-2-70b", "--recompute"], "77.3 GiB per GPU on 16 H100 GPUs (81,920 MiB each) on 2 nodes "
     "over EFA, zero-3", 2),
    ("pytorch-job", ["llama-2-7b"], "37.4 GiB per GPU on 8 H100 GPUs (81,920 MiB each) on one node, zero-3", 1),
    ("mpijob", ["llama-2-13b", "--recompute"], "30.3 GiB per GPU on 8 H100 GPUs (81,920 MiB each) on one node, "
     "zero-3", 1),
])
def test_a_multi_node_job_with_a_model_takes_the_nodes_that_hold_it(command, model, comment, nodes):
    """Whole nodes, the fewest that hold the model (not the default 2); a node's GPUs all shard it."""
    result = jobs(command, "prod-us-east-1", "--pool", "train-h100", "--name", "llm", "--image", "i",
                  "--model", *model, "--", "/app/train.py")
    assert result.returncode == 0, result.stderr
    assert f"# --model {model[0]}: {comment}\n" in result.stdout
    manifest = yaml.safe_load(result.stdout)
    spec = manifest["spec"]
    ran = spec["replicatedJobs"][0]["template"]["spec"]["parallelism"] if command == "pytorch-job" else \
        spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert ran == nodes


@pytest.mark.parametrize("args, message", [
    (["job", "prod-us-east-1", "--pool", "finetune-a100-80gb-spot", "--gpus", "1", "--model", "llama-2-7b"],
     "python -m jobs job: --model llama-2-7b needs 124.5 GiB per GPU on 1 A100 80GB GPU (81,920 MiB) on one node, "
     "which has 80.0 GiB; python -m jobs fit names a placement that holds it"),
    (["pytorch-job", "prod-us-east-1", "--pool", "train-h100", "--nodes", "1", "--model", "llama-2-70b", "--recompute"],
     "--model llama-2-70b needs 141.5 GiB per GPU on 8 H100 GPUs (81,920 MiB each) on one node (zero-3)"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--model", "llama-2-70b", "--inference"],
     "--model llama-2-70b: pool dev-gpu-spot needs 33.7 GiB per GPU on its largest placement (4 L4 GPUs"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--precision", "bf16"],
     "--precision describes the model for the memory estimate: give --model too"),
    (["job", "dev", "--pool", "dev-gpu-spot", "--model", "llama-2-7b", "--precision", "int8"],
     "--precision int8 is a weight format for inference"),
])
def test_a_model_its_placement_does_not_hold_is_refused_in_one_line(args, message):
    result = jobs(*args, "--name", "x", "--image", "i", "--", "t.py")
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
