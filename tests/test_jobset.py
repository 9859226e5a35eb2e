"""The torchrun template (spec/jobset.pytorch_jobset): a JobSet the JobSet controller and Kueue accept, on whole GPU
nodes of one pool, that comes back after a node is lost."""
from __future__ import annotations

import re

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import GPU_TAINT, INTERRUPTIBLE_TAINT, Taint, node_taints, toleration
from decisions.platform import jobset, kueue
from tests.crds import crd_schema, validate_against_crd

CATALOG = load_catalog()
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-train:2026.11"
PROGRAM = ["/app/train.py", "--config", "/app/70b.yaml"]
TAINT = {"key": "example.com/batch", "value": "true", "effect": "NoSchedule"}


def pool(instance_type="p5.48xlarge", capacity="reserved", efa=True, max_nodes=4, taints=(), sharing=None):
    spec = NodePool.model_validate({
        "name": "train", "instanceTypes": [instance_type], "capacity": capacity, "minNodes": 0, "desiredNodes": 0,
        "maxNodes": max_nodes, "workload": "training", "taints": list(taints),
        "gpuSharing": sharing or {"mode": "none"}})
    return ResolvedPool(spec=spec, types=(CATALOG.instance_types[instance_type],), efa=efa)


def job(p=None, **overrides):
    kwargs = dict(name="llama-70b", namespace="training", queue_name="training", image=IMAGE, nodes=4,
                  program=PROGRAM, rendezvous_timeout_s=2100, scratch="2Ti", mounts_lustre=True,
                  checkpoint_uri="s3://ckpt-bucket/llama-70b")
    return jobset.pytorch_jobset(p or pool(), **{**kwargs, **overrides})


def node_job(manifest):
    [replicated] = manifest["spec"]["replicatedJobs"]
    return replicated


def pod(manifest):
    return node_job(manifest)["template"]["spec"]["template"]["spec"]


def trainer(manifest):
    [container] = pod(manifest)["containers"]
    return container


def env(manifest):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer(manifest)["env"]}


def jobset_webhook_rules(manifest):
    """What the JobSet webhook refuses (kubernetes-sigs/jobset v0.12.0 pkg/webhooks/jobset_webhook.go): child Job
    and pod names that are not DNS-1035 labels, counting the pod name's 5-character suffix (lines 234-256); rule
    names outside ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ or longer than 128 (lines 416-418, 455-468); failure
    reasons other than the Job's own (lines 85-91, 477-482)."""
    dns1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
    name = manifest["metadata"]["name"]
    for replicated in manifest["spec"]["replicatedJobs"]:
        spec = replicated["template"]["spec"]
        assert dns1035.fullmatch(f"{name}-{replicated['name']}-{replicated['replicas'] - 1}")
        assert spec["completionMode"] == "Indexed"
        assert dns1035.fullmatch(f"{name}-{replicated['name']}-{replicated['replicas'] - 1}-"
                                 f"{spec['completions'] - 1}-abcde")
    for rule in manifest["spec"]["failurePolicy"]["rules"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]) and len(rule["name"]) <= 128
        assert set(rule["onJobFailureReasons"]) <= {"BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                                                     "MaxFailedIndexesExceeded", "PodFailurePolicy"}


def test_the_job_enters_the_training_queue_and_kueue_manages_jobsets():
    manifest = job()
    assert manifest["kind"] == "JobSet" and manifest["metadata"]["name"] == "llama-70b"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert "jobset.x-k8s.io/jobset" in kueue.INTEGRATIONS


@pytest.mark.parametrize("instance_type,gpus,efa,rdma", [
    ("p4d.24xlarge", 8, 4, True), ("p5.48xlarge", 8, 32, True), ("p5en.48xlarge", 8, 16, True),
    ("p6-b200.48xlarge", 8, 8, True), ("g6e.48xlarge", 8, 4, False),
])
def test_every_node_is_taken_whole_with_every_efa_device(instance_type, gpus, efa, rdma):
    manifest = job(pool(instance_type))
    resources = trainer(manifest)["resources"]
    limits = {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": efa, "ephemeral-storage": "2Ti"}
    assert {k: resources["limits"][k] for k in limits} == limits
    assert {k: resources["requests"][k] for k in limits} == limits
    assert env(manifest)["PET_NPROC_PER_NODE"] == str(gpus)            # one process per GPU
    assert ("FI_EFA_USE_DEVICE_RDMA" in env(manifest)) == rdma
    assert trainer(manifest)["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_kueue_counts_one_pod_per_node_within_the_pools_quota():
    """Kueue's pod set for a replicated Job is replicas x min(parallelism, completions) pods of its template
    (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/jobset/jobset_controller.go lines 115-121, 231-244)."""
    p = pool(max_nodes=4)
    replicated = node_job(job(p, nodes=4))
    spec = replicated["template"]["spec"]
    count = replicated["replicas"] * min(spec["parallelism"], spec["completions"])
    assert count == 4
    [flavor] = kueue.flavors([p], CATALOG)
    requests = trainer(job(p, nodes=4))["resources"]["requests"]
    for resource, quota in flavor.quotas.items():
        assert count * requests[resource] <= quota


@pytest.mark.parametrize("capacity", ["reserved", "spot", "on-demand"])
def test_pods_land_only_on_the_pools_gpu_nodes(capacity):
    p = pool(capacity=capacity, taints=[TAINT])
    spec = pod(job(p))
    assert spec["nodeSelector"] == {"gpu-cloud.io/pool": "train"}
    tolerated = spec["tolerations"]
    assert [toleration(t) for t in node_taints(p)] == tolerated
    assert toleration(Taint(*GPU_TAINT)) in tolerated
    key, value, effect = INTERRUPTIBLE_TAINT
    assert ({"key": key, "operator": "Equal", "value": value, "effect": effect} in tolerated) == (capacity == "spot")


def test_a_lost_node_restarts_the_whole_set_without_spending_its_restarts():
    manifest = job(max_restarts=5)
    spec = node_job(manifest)["template"]["spec"]
    # One disrupted pod fails its Job at once, with reason PodFailurePolicy...
    assert spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"] == {"rules": [{"action": "FailJob", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]}]}
    assert pod(manifest)["restartPolicy"] == "Never"          # what a podFailurePolicy requires
    # ...which the JobSet restarts on without counting; any other failure counts towards maxRestarts.
    policy = manifest["spec"]["failurePolicy"]
    assert policy["rules"] == [{"name": "node_lost", "action": "RestartJobSetAndIgnoreMaxRestarts",
                                "onJobFailureReasons": ["PodFailurePolicy"]}]
    assert policy["maxRestarts"] == 5
    # No pod of the old run is left when the new one starts.
    assert policy["restartStrategy"] == "BlockingRecreate"


def test_torchrun_meets_on_node_zero_through_the_headless_service():
    manifest = job(nodes=4, rendezvous_timeout_s=2100)
    values = env(manifest)
    assert trainer(manifest)["command"] == ["torchrun", *PROGRAM]
    assert manifest["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    replicated = node_job(manifest)
    # Pod <jobset>-<replicatedJob>-<job index>-<completion index> under the subdomain <jobset>
    # (jobset pkg/util/placement/placement.go lines 20-22; pkg/controllers/jobset_controller.go lines 1090-1099).
    leader = f"{manifest['metadata']['name']}-{replicated['name']}-0-0.{manifest['metadata']['name']}"
    assert values["PET_MASTER_ADDR"] == leader and values["PET_MASTER_PORT"] == "29500"
    assert values["PET_NNODES"] == str(replicated["template"]["spec"]["parallelism"]) == "4"
    assert values["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    # The store waits for nodes as long as Kueue waits for pods; torchrun itself never restarts.
    assert values["PET_RDZV_CONF"] == "timeout=2100" and values["PET_MAX_RESTARTS"] == "0"


def test_the_blueprints_nccl_and_pytorch_settings():
    values = env(job())
    assert {k: values[k] for k in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_DEBUG",
                                   "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                   "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT")} == {
        "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def test_data_scratch_shm_and_checkpoints():
    manifest = job(mounts_lustre=True, scratch="2Ti")
    mounts = {m["name"]: m["mountPath"] for m in trainer(manifest)["volumeMounts"]}
    assert mounts == {"shm": "/dev/shm", "scratch": "/scratch", "data": "/data"}
    volumes = {v["name"]: v for v in pod(manifest)["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "lustre-data"}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "2Ti"}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    values = env(manifest)
    assert values["CHECKPOINT_DIR"] == "/scratch/checkpoints"
    assert values["CHECKPOINT_URI"] == "s3://ckpt-bucket/llama-70b"
    # The flight recorder's dumps outlive the pod on Lustre.
    assert values["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/data/nccl-traces/llama-70b/rank_"
    without = job(mounts_lustre=False, checkpoint_uri="")
    assert "data" not in {v["name"] for v in pod(without)["volumes"]}
    assert "CHECKPOINT_URI" not in env(without)
    assert env(without)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith("/scratch/")


def test_the_users_env_and_claims_join_the_templates_own():
    from decisions.platform.job_options import UserVolume

    manifest = job(env={"NCCL_DEBUG": "WARN", "HF_HOME": "/scratch/hf"}, volumes=[UserVolume("models", "/models")])
    assert env(manifest)["NCCL_DEBUG"] == "WARN" and env(manifest)["HF_HOME"] == "/scratch/hf"
    assert [m["mountPath"] for m in trainer(manifest)["volumeMounts"]] == ["/dev/shm", "/scratch", "/data", "/models"]
    assert {"name": "volume-1", "persistentVolumeClaim": {"claimName": "models"}} in pod(manifest)["volumes"]


def test_scratch_defaults_to_half_the_array_and_stays_small_on_the_root_volume():
    from components.nodes.nodepool import ROOT_VOLUME_GIB

    # p5: 8 x 3,800 GB -> 28,312 GiB, allocatable 25,479 GiB (decisions/nodes/scratch.py), half of it.
    assert jobset.default_scratch(pool("p5.48xlarge"), nvme_scratch=True) == "12739Gi"
    assert jobset.default_scratch(pool("p5.48xlarge"), nvme_scratch=False) == jobset.ROOT_VOLUME_SCRATCH
    assert int(jobset.ROOT_VOLUME_SCRATCH.removesuffix("Gi")) <= ROOT_VOLUME_GIB // 4


def test_the_template_validates_against_the_jobset_crd_and_its_webhook():
    manifest = job(p=pool(taints=[TAINT]))
    validate_against_crd(manifest, crd_schema("jobset.x-k8s.io/jobsets"))
    jobset_webhook_rules(manifest)
    misspelt = {**manifest, "spec": {**manifest["spec"], "failurePolicy": {"maxRestart": 3}}}
    with pytest.raises(AssertionError, match="maxRestart"):
        validate_against_crd(misspelt, crd_schema("jobset.x-k8s.io/jobsets"))


def test_the_child_job_is_a_valid_batch_v1_job():
    import kubernetes_validate

    spec = node_job(job())["template"]["spec"]
    kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama-70b-node-0"},
                                  "spec": spec}, "1.35", strict=True)


@pytest.mark.parametrize("nodes,longest", [(1, 48), (10, 48), (11, 47), (64, 47)])
def test_names_leave_room_for_every_pod_name(nodes, longest):
    p = pool(max_nodes=64)
    jobset_webhook_rules(job(p, name="a" * longest, nodes=nodes))
    with pytest.raises(ValueError, match=f"at most {longest} characters"):
        job(p, name="a" * (longest + 1), nodes=nodes)


@pytest.mark.parametrize("overrides,message", [
    (dict(p=pool(efa=False)), "pool train: EFA is off"),
    (dict(p=pool(max_nodes=2), nodes=3), "3 worker\\(s\\) do not fit its maxNodes 2"),
    (dict(p=pool("p4de.24xlarge", sharing={"mode": "mig", "migProfile": "1g.10gb"})), "GPU sharing mode 'mig'"),
    (dict(name="Llama"), "job name 'Llama': a DNS-1035 label"),
    (dict(name="7b"), "job name '7b': a DNS-1035 label"),
    (dict(max_restarts=-1), "max restarts -1"),
    (dict(program=[]), "no program"),
    (dict(scratch="2TB"), "scratch size '2TB' is not a Kubernetes quantity"),
])
def test_jobs_the_template_cannot_run_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        job(**overrides)


def test_the_nodes_of_one_job_prefer_one_switch():
    manifest = job()
    affinity = pod(manifest)["affinity"]["podAffinity"]
    [term] = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "topology.k8s.aws/network-node-layer-3"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "llama-70b"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
