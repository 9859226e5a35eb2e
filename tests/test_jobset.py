"""The torchrun template (spec/jobset.pytorch_jobset): a JobSet the JobSet controller and Kueue accept, on whole GPU
nodes of one pool, that comes back after a node is lost."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import GPU_TAINT, INTERRUPTIBLE_TAINT, Taint, node_taints, toleration
from decisions.platform import jobset, kueue
from decisions.platform.job_options import UserVolume
from tests.conftest import require_tool
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
    assert trainer(manifest)["command"] == ["bash", "-c", jobset.TRAINER_SCRIPT, "torchrun", *PROGRAM]
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
    mounts = [(m["name"], m["mountPath"]) for m in trainer(manifest)["volumeMounts"]]
    assert mounts == [("shm", "/dev/shm"), ("scratch", "/scratch"), ("data", "/data"), ("data", "/nccl-traces")]
    volumes = {v["name"]: v for v in pod(manifest)["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "lustre-data"}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "2Ti"}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    values = env(manifest)
    assert values["CHECKPOINT_DIR"] == "/scratch/checkpoints"
    assert values["CHECKPOINT_URI"] == "s3://ckpt-bucket/llama-70b"
    without = job(mounts_lustre=False, checkpoint_uri="")
    assert "data" not in {v["name"] for v in pod(without)["volumes"]}
    assert "CHECKPOINT_URI" not in env(without)


def test_the_users_env_and_claims_join_the_templates_own():
    manifest = job(env={"NCCL_DEBUG": "WARN", "HF_HOME": "/scratch/hf"}, volumes=[UserVolume("models", "/models")])
    assert env(manifest)["NCCL_DEBUG"] == "WARN" and env(manifest)["HF_HOME"] == "/scratch/hf"
    assert [m["mountPath"] for m in trainer(manifest)["volumeMounts"]] == ["/dev/shm", "/scratch", "/data",
                                                                             "/nccl-traces", "/models"]
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
    (dict(p=pool(max_nodes=2), nodes=3), "3 worker\\(s\\) do not fit its maxNodes 2"),
    (dict(p=pool("p4de.24xlarge", sharing={"mode": "mig", "migProfile": "1g.10gb"})), "GPU sharing mode 'mig'"),
    # so no pytorch-job pod lands where the device plugin owns /dev/shm (MPS: decisions/platform/gpu_operator.py)
    (dict(p=pool("g6.12xlarge", efa=False, sharing={"mode": "mps", "replicas": 4})), "GPU sharing mode 'mps'"),
    (dict(name="Llama"), "job name 'Llama': a DNS-1035 label"),
    (dict(name="7b"), "job name '7b': a DNS-1035 label"),
    (dict(max_restarts=-1), "max restarts -1"),
    (dict(program=[]), "no program"),
    (dict(scratch="2TB"), "scratch size '2TB' is not a Kubernetes quantity"),
])
def test_jobs_the_template_cannot_run_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        job(**overrides)


def test_the_nodes_of_one_job_prefer_one_zone_then_one_switch():
    manifest = job()
    affinity = pod(manifest)["affinity"]["podAffinity"]
    terms = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["weight"], t["podAffinityTerm"]["topologyKey"]) for t in terms] == [
        (100, "topology.kubernetes.io/zone"), (50, "topology.k8s.aws/network-node-layer-3")]
    assert all(t["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "llama-70b"
               for t in terms)
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity


# --- across nodes without EFA: NCCL over TCP (decisions/platform/jobset.py, "Across nodes: EFA, or TCP") -------------
def test_without_efa_nccl_runs_over_its_own_sockets_and_asks_for_no_efa():
    manifest = job(pool("p4d.24xlarge", capacity="spot", efa=False), nodes=2)
    values, resources = env(manifest), trainer(manifest)["resources"]
    # NCCL's built-in socket network by name (NVIDIA/nccl v2.29.7-1 src/transport/net_socket.cc line 725: "Socket"),
    # over the pod's interface; libfabric is not involved.
    assert values["NCCL_NET"] == "Socket" and values["NCCL_SOCKET_IFNAME"] == "eth0"
    assert not [name for name in values if name.startswith("FI_")]
    assert "vpc.amazonaws.com/efa" not in resources["requests"] and "vpc.amazonaws.com/efa" not in resources["limits"]
    assert resources["limits"]["nvidia.com/gpu"] == 8
    assert "add" not in trainer(manifest)["securityContext"]["capabilities"]       # nothing pins memory
    # On an EFA pool nothing of that: the efa provider, EFA devices, IPC_LOCK.
    efa = job(pool("p4d.24xlarge"), nodes=2)
    assert "NCCL_NET" not in env(efa) and env(efa)["FI_PROVIDER"] == "efa"
    assert trainer(efa)["resources"]["limits"]["vpc.amazonaws.com/efa"] == 4
    assert trainer(efa)["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


@pytest.mark.parametrize("instance_type, tcp_gbps, efa_gbps", [
    # the pod's one interface sits on network card 0: networkGbps / networkCards of catalog.yaml
    ("p4d.24xlarge", 100, 400),          # 4 cards
    ("p4de.24xlarge", 100, 400),
    ("p5.48xlarge", 100, 3200),          # 32 cards
    ("g6.12xlarge", 40, 40),             # 1 card: the same bandwidth, without EFA's kernel bypass
])
def test_the_tcp_warning_names_the_bandwidth_it_gets_against_efas(instance_type, tcp_gbps, efa_gbps):
    warning = jobset.socket_bandwidth_warning(pool(instance_type, efa=False))
    assert f"at most {tcp_gbps} Gbps a node" in warning and f"against {efa_gbps} Gbps over EFA" in warning


def test_an_efa_pool_gets_no_tcp_warning():
    assert jobset.socket_bandwidth_warning(pool("p5.48xlarge")) is None


# --- hang diagnosis: the flight recorder's folder (decisions/platform/jobset.py, "Hang diagnosis") ------------------
def kubelet_env(container, annotations):
    """The container's environment as the kubelet makes it: annotations through the downward API, and $(VAR) in a
    value expanded with the variables listed before it, an unknown one left as is (Kubernetes API, EnvVar.value, as
    pulumi_kubernetes core/v1 EnvVarArgs documents it)."""
    values = {}
    for item in container["env"]:
        if "value" in item:
            values[item["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                          lambda m: values.get(m[1], m[0]), item["value"])
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            values[item["name"]] = annotations[re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)[1]]
    return values


def run_trainer(manifest, root, tmp_path, make_root=True):
    """The trainer's command under bash, with a fake torchrun first on PATH that records whether the flight
    recorder's folder exists when it starts, and its arguments. `root`, the folder's mount, is moved into tmp_path
    (the test's rewrite; the template names the real one). Returns (the folder, the finished process, the record)."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\n'
                                      'if [ -d "$(dirname "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE")" ]; then echo folder; '
                                      'else echo none; fi > "$RECORD"\n'
                                      'printf "%s\\n" "$@" >> "$RECORD"\n')
    (bin_dir / "torchrun").chmod(0o755)
    if make_root:
        (tmp_path / "root").mkdir()
    container = trainer(manifest)
    attempt = {"jobset.sigs.k8s.io/restart-attempt": "2", "batch.kubernetes.io/job-completion-index": "0"}
    values = kubelet_env(container, attempt)
    prefix = values["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    assert prefix.startswith(root + "/")
    values["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(tmp_path / "root") + prefix[len(root):]
    finished = subprocess.run(container["command"], env={**values, "RECORD": str(record),
                                                         "PATH": f"{bin_dir}:/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30)
    folder = Path(values["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]).parent
    return folder, finished, record.read_text().splitlines()


@pytest.mark.parametrize("mounts_lustre, root", [(True, "/nccl-traces"), (False, "/scratch")])
def test_the_flight_recorders_folder_exists_when_torchrun_starts(tmp_path, mounts_lustre, root):
    """PyTorch opens the dump file in a folder it never creates, and only logs the failure (DebugInfoWriter::write,
    torch/csrc/distributed/c10d); the trainer's shell makes it first, one per job and restart attempt."""
    program = ["/app/train.py", "--name", "two words", "--glob", "*"]
    folder, finished, record = run_trainer(job(mounts_lustre=mounts_lustre, program=program), root, tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert folder == tmp_path / "root" / ("llama-70b" if mounts_lustre else "nccl-traces/llama-70b") / "attempt-2"
    assert record == ["folder", *program]                   # made before torchrun, which got the program unchanged


def test_a_folder_that_cannot_be_made_costs_the_dumps_not_the_job(tmp_path):
    (tmp_path / "root").write_text("")                      # a file where the folder's parent should be
    folder, finished, record = run_trainer(job(), "/nccl-traces", tmp_path, make_root=False)
    assert finished.returncode == 0 and record[0] == "none"
    assert f"cannot create {folder}: the NCCL flight recorder's dumps will be lost" in finished.stderr


def test_the_trainer_script_passes_shellcheck(tmp_path):
    shellcheck = require_tool("shellcheck")
    path = tmp_path / "trainer.sh"
    path.write_text("#!/usr/bin/env bash\n" + jobset.TRAINER_SCRIPT)
    checked = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_the_dumps_are_kept_on_lustre_outside_the_datasets_link_one_folder_per_attempt():
    from decisions.storage import lustre

    manifest = job(mounts_lustre=True)
    [traces] = [m for m in trainer(manifest)["volumeMounts"] if m["mountPath"] == "/nccl-traces"]
    [data] = [m for m in trainer(manifest)["volumeMounts"] if m["mountPath"] == "/data"]
    # The same claim, the file system's root (decisions/storage/lustre.py): a sibling of the linked directory, which
    # the data repository association exports to the datasets bucket, never inside it.
    assert traces["name"] == data["name"] and traces["subPath"] == "nccl-traces" != lustre.MOUNT_SUBPATH
    assert not traces["subPath"].startswith(lustre.MOUNT_SUBPATH + "/")
    names = [e["name"] for e in trainer(manifest)["env"]]
    # The restart attempt comes first, so the kubelet can expand it in the file prefix listed after it.
    assert names.index("JOBSET_RESTART_ATTEMPT") < names.index("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    assert env(manifest)["JOBSET_RESTART_ATTEMPT"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}
    assert env(manifest)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == \
        "/nccl-traces/llama-70b/attempt-$(JOBSET_RESTART_ATTEMPT)/rank_"
    with pytest.raises(ValueError, match="/nccl-traces is already mounted"):
        job(volumes=[UserVolume("scratch-claim", "/nccl-traces")])
