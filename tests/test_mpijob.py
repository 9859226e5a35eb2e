"""The training-job template (decisions/platform/mpijob.training_mpijob) and what every EFA MPIJob carries
(decisions/platform/mpijob.py)."""
from __future__ import annotations

import shlex
import subprocess

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import INTERRUPTIBLE_TAINT
from decisions.platform import mpijob
from tests.conftest import require_tool
from tests.crds import crd_schema, validate_against_crd

CATALOG = load_catalog()
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-train:2026.11"
PROGRAM = ["python", "/app/train.py", "--config", "/app/7b.yaml"]


def pool(instance_type="p5.48xlarge", capacity="reserved", efa=True, max_nodes=4, sharing=None) -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": "train", "instanceTypes": [instance_type], "capacity": capacity, "minNodes": 0, "desiredNodes": 0,
        "maxNodes": max_nodes, "workload": "training", "gpuSharing": sharing or {"mode": "none"}})
    return ResolvedPool(spec=spec, types=(CATALOG.instance_types[instance_type],), efa=efa)


def job(p=None, **overrides):
    kwargs = dict(name="llama-7b", namespace="training", queue_name="training", image=IMAGE, workers=4,
                  program=PROGRAM, worker_wait_s=2100, checkpoint_uri="s3://ckpt-bucket/llama-7b")
    return mpijob.training_mpijob(p or pool(), **{**kwargs, **overrides})


def launcher(manifest):
    return manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


def worker_spec(manifest):
    return manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def mpirun_args(manifest):
    script = launcher(manifest)["command"][2]
    return shlex.split(script.rsplit("exec ", 1)[1])


def test_the_job_enters_the_training_queue_under_a_stable_name():
    manifest = job()
    assert manifest["metadata"]["name"] == "llama-7b"          # checkpoints are kept under it across resubmits
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"


@pytest.mark.parametrize("instance_type,gpus,efa,rdma", [
    ("p4d.24xlarge", 8, 4, True), ("p5.48xlarge", 8, 32, True), ("p5en.48xlarge", 8, 16, True),
    ("p6-b200.48xlarge", 8, 8, True), ("g6e.48xlarge", 8, 4, False),
])
def test_workers_take_whole_nodes_with_every_efa_device(instance_type, gpus, efa, rdma):
    manifest = job(pool(instance_type))
    worker = worker_spec(manifest)["containers"][0]
    devices = {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": efa}
    assert {k: worker["resources"]["limits"][k] for k in devices} == devices
    assert {k: worker["resources"]["requests"][k] for k in devices} == devices
    assert manifest["spec"]["slotsPerWorker"] == gpus
    env = {e["name"]: e["value"] for e in launcher(manifest)["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_SOCKET_IFNAME"] == "eth0" and env["NCCL_DEBUG"] == "INFO"
    assert ("FI_EFA_USE_DEVICE_RDMA" in env) == rdma


def test_efa_needs_locked_memory_and_a_large_shm():
    spec = worker_spec(job())
    # IPC_LOCK for EFA, and what sshd needs as root (decisions/platform/pod_security.WAIVERS); nothing else.
    assert spec["containers"][0]["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["IPC_LOCK", "SETUID", "SETGID", "SYS_CHROOT", "NET_BIND_SERVICE", "AUDIT_WRITE"]}
    assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in spec["volumes"]


def test_mpirun_runs_one_rank_per_gpu_and_forwards_every_setting_the_ranks_need():
    args = mpirun_args(job())
    assert args[0] == mpijob.MPIRUN
    assert args[args.index("-np") + 1] == "32" and args[args.index("-N") + 1] == "8"
    forwarded = {args[i + 1] for i, arg in enumerate(args) if arg == "-x"}
    env = {e["name"] for e in launcher(job())["env"]}
    assert env <= forwarded and {"PATH", "LD_LIBRARY_PATH", "CHECKPOINT_URI"} <= forwarded
    assert args[-len(PROGRAM):] == PROGRAM


def test_the_checkpoint_location_reaches_every_rank():
    env = {e["name"]: e["value"] for e in launcher(job())["env"]}
    assert env["CHECKPOINT_URI"] == "s3://ckpt-bucket/llama-7b"
    assert "CHECKPOINT_URI" not in {e["name"] for e in launcher(job(checkpoint_uri=""))["env"]}


def test_workers_mount_data_scratch_and_the_users_claims_and_ranks_get_the_users_env():
    from decisions.platform.job_options import UserVolume

    manifest = job(scratch="2Ti", mounts_lustre=True, lustre_configured=True, env={"NCCL_DEBUG": "WARN", "A": "1"},
                   volumes=[UserVolume("models", "/models", True)])
    worker = worker_spec(manifest)["containers"][0]
    assert [m["mountPath"] for m in worker["volumeMounts"]] == ["/dev/shm", "/scratch", "/data", "/nccl-traces",
                                                                "/models"]
    volumes = {v["name"]: v for v in worker_spec(manifest)["volumes"]}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "2Ti"}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "lustre-data"}
    assert worker["resources"]["requests"]["ephemeral-storage"] == worker["resources"]["limits"][
        "ephemeral-storage"] == "2Ti"
    env = {e["name"]: e["value"] for e in launcher(manifest)["env"]}
    assert env["NCCL_DEBUG"] == "WARN" and env["A"] == "1" and env["CHECKPOINT_DIR"] == "/scratch/checkpoints"
    args = mpirun_args(manifest)
    forwarded = [args[i + 1] for i, arg in enumerate(args) if arg == "-x"]
    assert {"A", "NCCL_DEBUG", "CHECKPOINT_DIR"} <= set(forwarded) and len(forwarded) == len(set(forwarded))
    # Without the RAID0 array's size, scratch stays small on the root volume; without Lustre, no /data.
    plain = worker_spec(job())
    assert {"name": "scratch", "emptyDir": {"sizeLimit": mpijob.ROOT_VOLUME_SCRATCH}} in plain["volumes"]
    assert "/data" not in {m["mountPath"] for m in plain["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize("checkpoint_uri", ["s3://ckpt-bucket/llama-7b", ""])
def test_every_rank_gets_the_job_service_accounts_aws_credentials(checkpoint_uri):
    manifest = job(checkpoint_uri=checkpoint_uri)
    launcher_pod = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    # both sides run as the service account whose role reaches the buckets; the webhook mounts its token in each
    assert launcher_pod["serviceAccountName"] == worker_spec(manifest)["serviceAccountName"] == "trainer"
    # ranks start through sshd with no environment: mpirun carries the Pod Identity settings to them
    args = mpirun_args(manifest)
    forwarded = {args[i + 1] for i, arg in enumerate(args) if arg == "-x"}
    assert {"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"} <= forwarded


def test_an_interrupted_job_retries_and_frees_its_gpus_when_it_ends():
    spec = job()["spec"]
    assert spec["runPolicy"]["backoffLimit"] == mpijob.TRAINING_BACKOFF_LIMIT > 0
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    assert {r["restartPolicy"] for r in spec["mpiReplicaSpecs"].values()} == {"OnFailure"}


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_max_restarts_is_the_field_the_operator_gives_the_launcher_job(max_restarts):
    """mpi-operator v0.8.0 copies runPolicy.backoffLimit, and nothing else, to the launcher Job's backoffLimit
    (pkg/controller/mpi_job_controller.go line 1543): the times mpirun starts again."""
    spec = job(max_restarts=max_restarts)["spec"]
    assert spec["runPolicy"]["backoffLimit"] == max_restarts
    assert "backoffLimit" not in spec["mpiReplicaSpecs"]["Launcher"]
    with pytest.raises(ValueError, match="max restarts -1: must be 0 or more"):
        job(max_restarts=-1)


def test_the_launcher_waits_for_workers_no_longer_than_kueue_would():
    script = launcher(job(worker_wait_s=2100))["command"][2]
    assert "deadline=$((SECONDS + 2100))" in script
    assert script.index(f"done < {mpijob.HOSTFILE}") < script.index("exec ")


def test_a_spot_pools_job_is_marked_interruptible_and_others_are_not():
    key, value, effect = INTERRUPTIBLE_TAINT
    interruptible = {"key": key, "operator": "Equal", "value": value, "effect": effect}
    assert interruptible in worker_spec(job(pool(capacity="spot")))["tolerations"]
    assert interruptible not in worker_spec(job(pool(capacity="on-demand")))["tolerations"]


@pytest.mark.parametrize("p,workers,message", [
    (pool(efa=False), 2, "EFA is off"),
    (pool(max_nodes=2), 3, "3 worker\\(s\\) do not fit its maxNodes 2"),
    (pool("p4de.24xlarge", sharing={"mode": "mig", "migProfile": "1g.10gb"}), 2, "GPU sharing mode 'mig'"),
])
def test_pools_a_multi_node_efa_job_cannot_use_are_refused(p, workers, message):
    with pytest.raises(ValueError, match=f"pool train: {message}"):
        job(p, workers=workers)


@pytest.mark.parametrize("workers,longest", [(2, 54), (10, 54), (11, 53), (64, 53)])
def test_names_leave_room_for_every_worker_pod_name(workers, longest):
    p = pool(max_nodes=64)
    manifest = job(p, name="a" * longest, workers=workers)
    assert len(f"{manifest['metadata']['name']}-worker-{workers - 1}") <= 63
    with pytest.raises(ValueError, match="too long"):
        job(p, name="a" * (longest + 1), workers=workers)
    with pytest.raises(ValueError, match=f"at most {longest} characters with {workers} worker"):
        job(p, name="a" * (longest + 1), workers=workers)


@pytest.mark.parametrize("overrides,message", [
    (dict(name="Llama"), "job name 'Llama': a DNS-1035 label"),
    (dict(name="7b"), "job name '7b': a DNS-1035 label"),
    (dict(program=[]), "no program: give the command mpirun runs and its arguments after --"),
    (dict(scratch="2TB"), "scratch size '2TB' is not a Kubernetes quantity"),
])
def test_jobs_the_other_templates_refuse_are_refused_here_too(overrides, message):
    """decisions/platform/job_options.check_job, as single_job and jobset apply it."""
    with pytest.raises(ValueError, match=message):
        job(**overrides)


def test_the_template_validates_against_the_mpijob_crd():
    validate_against_crd(job(), crd_schema("kubeflow.org/mpijobs"))


def test_the_launcher_script_passes_shellcheck(tmp_path):
    shellcheck = require_tool("shellcheck")
    path = tmp_path / "launcher.sh"
    path.write_text("#!/usr/bin/env bash\n" + launcher(job())["command"][2])
    checked = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize("capacity", ["reserved", "spot"])
def test_the_launcher_runs_on_the_jobs_pool_beside_a_worker(capacity):
    """Kueue gives the CPU-only launcher no flavor, so without its own placement it would fit no node: GPU and system
    nodes are all tainted (decisions/platform/mpijob.py, "Where the launcher runs")."""
    from decisions.platform import acceptance

    p = pool(capacity=capacity)
    judged = acceptance.mpijob_manifest(p, CATALOG, namespace="training", queue_name="training",
                                        judge_configmap="nccl-judge", service_account="nccl-acceptance")
    for manifest in (job(p), judged):
        launcher_pod = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        workers = worker_spec(manifest)
        assert launcher_pod["nodeSelector"] == workers["nodeSelector"] == {"gpu-cloud.io/pool": "train"}
        assert launcher_pod["tolerations"] == workers["tolerations"]
        # It takes no GPU: the node's GPUs stay its worker's.
        assert not {"nvidia.com/gpu", "vpc.amazonaws.com/efa"} & set(
            launcher_pod["containers"][0]["resources"].get("requests", {}))
        assert launcher_pod["containers"][0]["resources"] == mpijob.LAUNCHER_RESOURCES
        # Preferably on a node of one of its own workers, whose image is already there: mpi-operator v0.8.0 labels
        # every pod of an MPIJob with its name and role (pkg/controller/mpi_job_controller.go lines 1743-1749).
        [term] = launcher_pod["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"] == {
            "labelSelector": {"matchLabels": {"training.kubeflow.org/job-role": "worker"}},
            "matchLabelKeys": ["training.kubeflow.org/job-name"], "topologyKey": "kubernetes.io/hostname"}
        validate_against_crd(manifest, crd_schema("kubeflow.org/mpijobs"))


def test_workers_prefer_one_zone_then_the_nearest_switch_of_their_own_job():
    """EKS labels p-family nodes with EC2's network layers (kubernetes/cloud-provider-aws v1.35.2
    pkg/providers/v1/topology.go line 43: types matching ^(hpc|trn|p)[0-9]...); a preferred affinity draws one job's
    workers into one zone (traffic between zones is billed), then under one bottom-layer switch, and never keeps a
    pod from starting."""
    from decisions.platform.mpijob import NEAREST_SWITCH_LABEL
    import re as _re

    workers = worker_spec(job())
    zone, switch = workers["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    same_job = {"labelSelector": {"matchLabels": {"training.kubeflow.org/job-role": "worker"}},
                "matchLabelKeys": ["training.kubeflow.org/job-name"]}
    assert zone == {"weight": 100, "podAffinityTerm": {**same_job, "topologyKey": "topology.kubernetes.io/zone"}}
    assert switch == {"weight": 50, "podAffinityTerm": {**same_job,
                                                        "topologyKey": "topology.k8s.aws/network-node-layer-3"}}
    assert NEAREST_SWITCH_LABEL == "topology.k8s.aws/network-node-layer-3"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in workers["affinity"]["podAffinity"]
    # every EFA training type gets the labels; no g type does (their NCCL stays within a node)
    pattern = _re.compile(r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$")
    assert all(bool(pattern.match(name)) == name.startswith("p") for name in CATALOG.instance_types)


@pytest.mark.parametrize("instance_type,limit", [
    # 90 % of the node's memory (decisions/catalog/catalog.yaml memoryGiB), rounded down: the rest is the kubelet's and
    # the daemons'.
    ("p4d.24xlarge", "1036Gi"), ("p5.48xlarge", "1843Gi"), ("p5en.48xlarge", "1843Gi"), ("g6e.48xlarge", "1382Gi"),
])
def test_whole_node_pods_are_limited_to_most_of_the_nodes_memory(instance_type, limit):
    manifest = job(pool(instance_type))
    assert worker_spec(manifest)["containers"][0]["resources"]["limits"]["memory"] == limit
    assert launcher(manifest)["resources"]["limits"]["memory"] == "2Gi"
    assert launcher(manifest)["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
