"""The single-node job template (decisions/platform/single_job.single_node_job): a batch/v1 Job Kubernetes accepts, that
Kueue admits to exactly its pool (spot, shared and MIG pools included), taking the GPUs the pool's device plugin grants,
and that comes back after a disruption; and what every template mounts and sets from --env and --volume
(decisions/platform/job_options.py)."""
from __future__ import annotations

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import GPU_TAINT, INTERRUPTIBLE_TAINT, QUEUE_LABEL, Taint, toleration
from decisions.platform import job_options, jobset, kueue, single_job
from decisions.platform.job_options import UserVolume
from decisions.platform.pod_security import check_pod_spec

CATALOG = load_catalog()
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/finetune:2026.11"
TAINT = {"key": "example.com/batch", "value": "true", "effect": "NoSchedule"}
TIME_SLICED = {"mode": "time-slicing", "replicas": 4}
MIG_ONE = {"mode": "mig", "migProfile": "1g.10gb"}                    # H100: 7 per GPU
MIG_TWO = {"mode": "mig", "migProfiles": {"3g.40gb": 1, "2g.20gb": 2}}


def pool(instance_type="p5.48xlarge", capacity="on-demand", efa=False, taints=(), sharing=None, workload="training"):
    spec = NodePool.model_validate({
        "name": "pool-a", "instanceTypes": [instance_type], "capacity": capacity, "minNodes": 0, "desiredNodes": 0,
        "maxNodes": 2, "workload": workload, "taints": list(taints), "gpuSharing": sharing or {"mode": "none"}})
    return ResolvedPool(spec=spec, types=(CATALOG.instance_types[instance_type],), efa=efa)


def job(p=None, **overrides):
    kwargs = dict(name="finetune", namespace="training", queue_name="training", image=IMAGE,
                  program=["python", "/app/finetune.py"], scratch="100Gi", mounts_lustre=True, lustre_configured=True)
    return single_job.single_node_job(p or pool(), CATALOG, **{**kwargs, **overrides})


def pod(manifest):
    return manifest["spec"]["template"]["spec"]


def container(manifest):
    [only] = pod(manifest)["containers"]
    return only


def env(manifest):
    return {e["name"]: e["value"] for e in container(manifest)["env"]}


POOLS = {
    "on-demand p5": pool(),
    "spot g6 (dev's)": pool("g6.12xlarge", capacity="spot"),
    "EFA p4d with a taint": pool("p4d.24xlarge", efa=True, taints=[TAINT]),
    "time-sliced L40S": pool("g6e.12xlarge", sharing=TIME_SLICED),
    "MPS L4 spot": pool("g6.12xlarge", capacity="spot", sharing={"mode": "mps", "replicas": 2}),
    "MIG one profile": pool(sharing=MIG_ONE),
    "MIG two profiles": pool(sharing=MIG_TWO),
    "general pool": pool("g5.12xlarge", workload="general"),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_job_is_a_valid_batch_v1_job(name):
    import kubernetes_validate

    kubernetes_validate.validate(job(POOLS[name]), "1.35", strict=True)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_kueue_admits_it_to_its_pool_only(name):
    """Its selector is the flavor's pool label, it tolerates every taint the flavor lists (spot, shared GPUs, the
    pool's own), and what it requests fits one node and the flavor's quota."""
    p = POOLS[name]
    manifest = job(p)
    [flavor] = kueue.flavors([p], CATALOG)
    assert manifest["metadata"]["labels"][QUEUE_LABEL] == "training"
    assert pod(manifest)["nodeSelector"] == {"gpu-cloud.io/pool": flavor.node_labels["gpu-cloud.io/pool"]}
    tolerated = pod(manifest)["tolerations"]
    assert all(toleration(taint) in tolerated for taint in flavor.node_taints)
    assert toleration(Taint(*GPU_TAINT)) in tolerated
    gpus = {k: v for k, v in container(manifest)["resources"]["limits"].items() if k.startswith("nvidia.com/")}
    assert gpus and all(0 < count <= flavor.quotas[resource] // p.spec.max_nodes for resource, count in gpus.items())
    assert container(manifest)["resources"]["requests"].items() >= gpus.items()


@pytest.mark.parametrize("capacity, interruptible", [("spot", True), ("on-demand", False), ("reserved", False)])
def test_only_spot_pools_jobs_tolerate_interruption(capacity, interruptible):
    tolerated = pod(job(pool(capacity=capacity)))["tolerations"]
    assert (toleration(Taint(*INTERRUPTIBLE_TAINT)) in tolerated) is interruptible
    assert (toleration(kueue.SHARED_GPU_TAINT) in tolerated) is False


@pytest.mark.parametrize("p, gpus, mig_profile, expected, share", [
    (pool(), None, None, {"nvidia.com/gpu": 8}, 1.0),                            # the whole node
    (pool(), 1, None, {"nvidia.com/gpu": 1}, 1 / 8),
    (pool(), 8, None, {"nvidia.com/gpu": 8}, 1.0),                               # the boundary
    (pool("g6.12xlarge"), None, None, {"nvidia.com/gpu": 4}, 1.0),
    (pool("g6e.12xlarge", sharing=TIME_SLICED), None, None, {"nvidia.com/gpu": 1}, 1 / 16),   # one share
    (pool("g6e.12xlarge", sharing=TIME_SLICED), 1, None, {"nvidia.com/gpu": 1}, 1 / 16),
    (pool(sharing=MIG_ONE), None, None, {"nvidia.com/mig-1g.10gb": 56}, 1.0),
    (pool(sharing=MIG_ONE), 3, None, {"nvidia.com/mig-1g.10gb": 3}, 3 / 56),
    (pool(sharing=MIG_ONE), 56, None, {"nvidia.com/mig-1g.10gb": 56}, 1.0),
    (pool(sharing=MIG_TWO), None, None, {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 16}, 1.0),
    (pool(sharing=MIG_TWO), 2, "2g.20gb", {"nvidia.com/mig-2g.20gb": 2}, 2 / 24),
    (pool(sharing=MIG_TWO), None, "3g.40gb", {"nvidia.com/mig-3g.40gb": 8}, 8 / 24),
])
def test_gpus_are_what_the_pools_device_plugin_grants(p, gpus, mig_profile, expected, share):
    assert single_job.gpu_request(p, CATALOG, gpus, mig_profile) == (expected, pytest.approx(share))
    resources = container(job(p, gpus=gpus, mig_profile=mig_profile))["resources"]
    assert {k: v for k, v in resources["limits"].items() if k.startswith("nvidia.com/")} == expected


@pytest.mark.parametrize("p, gpus, mig_profile, message", [
    (pool(), 9, None, "a node of pool pool-a has 8 GPUs; ask for 1 to 8"),
    (pool(), 0, None, "ask for 1 to 8"),
    (pool("g6e.12xlarge", sharing=TIME_SLICED), 2, None, "the device plugin grants a pod one share"),
    (pool(sharing=MIG_ONE), 57, None, "has 56 1g.10gb MIG instances; ask for 1 to 56"),
    (pool(sharing=MIG_TWO), 2, None, "name one with --mig-profile (2g.20gb, 3g.40gb)"),
    (pool(sharing=MIG_TWO), 1, "1g.10gb", "pool pool-a's nodes have 2g.20gb, 3g.40gb"),
    (pool(sharing=MIG_TWO), 17, "2g.20gb", "has 16 2g.20gb MIG instances"),
    (pool(), 1, "1g.10gb", "--mig-profile 1g.10gb: pool pool-a does not use MIG"),
])
def test_gpu_counts_a_node_cannot_give_are_refused(p, gpus, mig_profile, message):
    with pytest.raises(ValueError) as error:
        single_job.gpu_request(p, CATALOG, gpus, mig_profile)
    assert message in str(error.value)


@pytest.mark.parametrize("p, gpus, cpu, memory, limit", [
    # A whole node asks what a multi-node template's pod asks: 16 CPUs, 64 GiB, limited to 90 % of the node.
    (pool(), None, "16", "64Gi", f"{int(2048 * 0.9)}Gi"),
    (pool(), 1, "2", "8Gi", f"{int(2048 * 0.9) // 8}Gi"),                        # an eighth of it
    (pool("g6e.12xlarge", sharing=TIME_SLICED), None, "1", "4Gi", f"{int(384 * 0.9) // 16}Gi"),
    (pool(sharing=MIG_ONE), 1, "1", "1Gi", f"{int(2048 * 0.9) // 56}Gi"),        # at least 1 CPU and 1 GiB
])
def test_cpu_memory_and_shm_follow_the_share_of_the_node(p, gpus, cpu, memory, limit):
    c = container(job(p, gpus=gpus))
    assert (c["resources"]["requests"]["cpu"], c["resources"]["requests"]["memory"]) == (cpu, memory)
    assert c["resources"]["limits"]["memory"] == limit
    [shm] = [v for v in pod(job(p, gpus=gpus))["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"]["sizeLimit"] == f"{min(16, int(limit.removesuffix('Gi')) // 2)}Gi"


def test_a_whole_node_job_asks_what_a_multi_node_templates_pod_asks():
    from decisions.platform import mpijob

    p = pool(efa=True)
    requests, multi = container(job(p))["resources"]["requests"], mpijob.whole_node_resources(p)["requests"]
    assert (requests["cpu"], requests["memory"]) == (multi["cpu"], multi["memory"])
    [shm] = [v for v in pod(job(p))["volumes"] if v["name"] == "shm"]
    assert shm == mpijob.SHM_VOLUME                             # the most /dev/shm any template gives
    assert job(p)["spec"]["backoffLimit"] == jobset.DEFAULT_MAX_RESTARTS      # as pytorch-job's restarts


MPS = {"mode": "mps", "replicas": 2}


@pytest.mark.parametrize("sharing, own_shm", [(MPS, False), (TIME_SLICED, True), (None, True)])
def test_on_mps_pools_dev_shm_is_the_mps_servers_not_the_pods(sharing, own_shm):
    """The device plugin mounts the MPS server's shared memory at /dev/shm in every MPS client (k8s-device-plugin
    v0.20.0 internal/plugin/mps.go lines 74-90); a pod volume there would be mounted over it (decisions/platform/
    gpu_operator.device_plugin_mounts_shm). Other pools keep their own, in memory."""
    manifest = job(pool("g6.12xlarge", sharing=sharing))
    volumes = [v for v in pod(manifest)["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    mounts = [m for m in container(manifest)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert (len(volumes), len(mounts)) == ((1, 1) if own_shm else (0, 0))
    comment = job_options.mounts_comment("x", pod(manifest), container(manifest))
    assert ("the MPS server's shared memory, mounted by the device plugin" in comment) is not own_shm


@pytest.mark.parametrize("sharing, message", [
    (MPS, "/dev/shm is the MPS server's shared memory on this pool, which the device plugin mounts"),
    (None, "/dev/shm is already mounted (emptyDir 16Gi in memory)"),
])
def test_no_volume_takes_dev_shm(sharing, message):
    with pytest.raises(ValueError, match="^--volume shm-claim:/dev/shm: ") as error:
        job(pool("g6.12xlarge", sharing=sharing), volumes=[UserVolume("shm-claim", "/dev/shm")])
    assert message in str(error.value)


def test_scratch_is_the_jobs_share_of_a_whole_nodes():
    assert single_job.default_scratch("12739Gi", 1.0) == "12739Gi"
    assert single_job.default_scratch("12739Gi", 1 / 8) == "1592Gi"
    assert single_job.default_scratch("100Gi", 1 / 192) == "1Gi"                 # never 0
    c = container(job(scratch="1592Gi"))
    assert c["resources"]["requests"]["ephemeral-storage"] == c["resources"]["limits"]["ephemeral-storage"] == "1592Gi"


def test_a_disrupted_pod_starts_again_and_the_programs_failures_count():
    manifest = job(max_restarts=5)
    assert manifest["spec"]["podFailurePolicy"] == jobset.IGNORE_DISRUPTIONS
    assert pod(manifest)["restartPolicy"] == "Never"            # a pod failure policy requires it
    assert manifest["spec"]["backoffLimit"] == 5


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_pod_is_hardened_as_every_template_is(name):
    p = pod(job(POOLS[name]))
    assert check_pod_spec("single-node-job", p) == []
    assert p["automountServiceAccountToken"] is False and p["serviceAccountName"] == "trainer"
    assert "add" not in container(job(POOLS[name]))["securityContext"]["capabilities"]


@pytest.mark.parametrize("name, ok", [("a" * 63, True), ("a" * 64, False), ("finetune-2", True),
                                      ("Finetune", False), ("2finetune", False), ("finetune-", False)])
def test_names_are_dns_labels_of_at_most_63_characters(name, ok):
    if ok:
        assert job(name=name)["metadata"]["name"] == name
    else:
        with pytest.raises(ValueError, match="DNS-1035 label"):
            job(name=name)


# --- what every template mounts and sets (decisions/platform/job_options.py)
# -----------------------------------------------------
def test_data_scratch_shm_and_a_users_claim_are_mounted():
    manifest = job(volumes=[UserVolume("models", "/models", read_only=True), UserVolume("cache", "/cache")])
    mounts = {m["mountPath"]: m for m in container(manifest)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(manifest)["volumes"]}
    assert set(mounts) == {"/dev/shm", "/scratch", "/data", "/nccl-traces", "/models", "/cache"}
    assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "lustre-data"}
    assert volumes[mounts["/scratch"]["name"]]["emptyDir"] == {"sizeLimit": "100Gi"}
    assert volumes[mounts["/models"]["name"]]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert mounts["/models"]["readOnly"] is True and "readOnly" not in mounts["/cache"]
    assert "/data" not in {m["mountPath"] for m in container(job(mounts_lustre=False))["volumeMounts"]}


@pytest.mark.parametrize("volume, lustre_configured, message", [
    (UserVolume("other", "/data"), True, "/data is already mounted (claim lustre-data)"),
    (UserVolume("other", "/scratch"), True, "/scratch is already mounted (emptyDir 100Gi)"),
    (UserVolume("lustre-data", "/lustre"), False, "the stack has no storage.lustre, so there is no claim lustre-data"),
])
def test_a_volume_that_cannot_be_mounted_is_refused(volume, lustre_configured, message):
    with pytest.raises(ValueError, match="^--volume ") as error:
        job(volumes=[volume], mounts_lustre=lustre_configured, lustre_configured=lustre_configured)
    assert message in str(error.value)


def test_lustre_data_mounts_again_elsewhere_where_the_stack_has_it():
    mounts = container(job(volumes=[UserVolume("lustre-data", "/lustre", True)]))["volumeMounts"]
    assert [m["mountPath"] for m in mounts].count("/lustre") == 1


def test_checkpoints_and_the_users_environment():
    values = env(job(checkpoint_uri="s3://bucket/finetune", env={"HF_HOME": "/scratch/hf", "A": ""}))
    assert values == {"CHECKPOINT_DIR": "/scratch/checkpoints", "CHECKPOINT_URI": "s3://bucket/finetune",
                      "HF_HOME": "/scratch/hf", "A": ""}
    assert "CHECKPOINT_URI" not in env(job())


@pytest.mark.parametrize("items, expected", [
    (["A=1", "B_2=x=y", "_C="], {"A": "1", "B_2": "x=y", "_C": ""}),
    (["NCCL_DEBUG=WARN"], {"NCCL_DEBUG": "WARN"}),
])
def test_env_options_are_parsed_in_order(items, expected):
    assert list(job_options.parse_env(items).items()) == list(expected.items())


@pytest.mark.parametrize("item, message", [
    ("A", "give KEY=VALUE"),
    ("1A=x", "'1A' is not an environment variable name"),
    ("A-B=x", "'A-B' is not an environment variable name"),
    ("=x", "'' is not an environment variable name"),
    ("CHECKPOINT_URI=s3://b/x", "use --checkpoint-uri"),
    ("PET_NNODES=4", "PET_* variables are set by"),
])
def test_bad_env_options_are_refused_naming_the_flag(item, message):
    with pytest.raises(ValueError) as error:
        job_options.parse_env([item], job_options.PYTORCH_JOB_ENV_PREFIXES)      # as pytorch-job parses them
    assert str(error.value).startswith(f"--env {item!r}: ") and message in str(error.value)


def test_pet_variables_are_refused_only_where_torchrun_reads_them():
    # job and mpijob (jobs/__main__.py) pass no reserved prefixes: PET_* is the user's there.
    assert job_options.parse_env(["PET_NNODES=4"]) == {"PET_NNODES": "4"}
    with pytest.raises(ValueError, match="PET_\\* variables are set by pytorch-job's own options"):
        job_options.parse_env(["PET_NNODES=4"], job_options.PYTORCH_JOB_ENV_PREFIXES)
    # CHECKPOINT_URI stays every template's own.
    with pytest.raises(ValueError, match="use --checkpoint-uri"):
        job_options.parse_env(["CHECKPOINT_URI=s3://b/x"])


def test_a_variable_given_twice_is_refused():
    with pytest.raises(ValueError, match="A is given twice"):
        job_options.parse_env(["A=1", "A=2"])


@pytest.mark.parametrize("item, expected", [
    ("models:/models", UserVolume("models", "/models", False)),
    ("models:/models:ro", UserVolume("models", "/models", True)),
    ("team.cache:/mnt/cache:rw", UserVolume("team.cache", "/mnt/cache", False)),
])
def test_volume_options_are_parsed(item, expected):
    assert job_options.parse_volume(item) == expected


@pytest.mark.parametrize("item, message", [
    ("models", "give CLAIM:/path"),
    ("models:/m:rx", "give CLAIM:/path"),
    ("Models:/m", "'Models' is not a PersistentVolumeClaim name"),
    ("models:m", "must be an absolute, normalised path"),
    ("models:/m/../n", "must be an absolute, normalised path"),
    ("models:/", "must be an absolute, normalised path"),
])
def test_bad_volume_options_are_refused_naming_the_flag(item, message):
    with pytest.raises(ValueError) as error:
        job_options.parse_volume(item)
    assert str(error.value).startswith(f"--volume {item!r}: ") and message in str(error.value)
