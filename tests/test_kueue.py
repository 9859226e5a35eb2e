"""The training queue as values (decisions/platform/kueue.py): one flavor per pool in the autoscaler's order, quotas
from the pools, spot only for interruptible jobs, shared GPUs only for jobs that take a share; Kueue's flavor assignment
as it treats those flavors; nothing in the training namespace bypassing the queue; priorities; Kueue's configuration and
chart values. The component: test_training.py."""
from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Set

import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from decisions.catalog import charts
from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes import boot
from decisions.nodes.pods import system_placement, tolerates
from decisions.nodes.pools import GPU_TAINT, INTERRUPTIBLE_TAINT, POOL_LABEL, QUEUE_LABEL, Taint, autoscaler_priority, \
    node_labels, node_taints, queue_flavor, toleration
from decisions.platform import kueue, mpijob
from decisions.platform.tenancy import TRAINING_NAMESPACE
from plan.stackfile import load_stack
from tests import upstream_records
from tests.chart_values import assert_values_confirmed, merged_values
from tests.conftest import STACKS
from tests.test_validate import issues_of, load, valid_config

catalog = load_catalog()
GPU, EFA, MIG = "nvidia.com/gpu", kueue.EFA_RESOURCE, "nvidia.com/mig-1g.10gb"
RELEASE, CONFIG_FILE = "kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile"
KUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:"


def pool(name, instance_type, capacity, workload="training", max_nodes=2, sharing=None, efa=False,
         **extra) -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": capacity, "minNodes": 0, "desiredNodes": 0,
        "maxNodes": max_nodes, "workload": workload, "gpuSharing": sharing or {"mode": "none"}, **extra})
    return ResolvedPool(spec=spec, types=(catalog.instance_types[instance_type],), efa=efa)


# Listed out of order on purpose; one pool of every capacity type, two spot pools, an inference pool the queue
# must ignore, a general pool it must use, a MIG pool and a time-slicing pool.
POOLS = (
    pool("od-a100", "p4d.24xlarge", "on-demand", max_nodes=3, efa=True),          # 8 GPUs, 4 EFA per node
    pool("spot-h100", "p5.48xlarge", "spot", max_nodes=2),                         # 8 GPUs
    pool("spot-l4", "g6.12xlarge", "spot", workload="general", max_nodes=5,
         sharing={"mode": "time-slicing", "replicas": 3}),                         # 4 GPUs x 3
    pool("block-h200", "p5e.48xlarge", "capacity-block", max_nodes=4, efa=True),   # 8 GPUs, 32 EFA
    pool("reserved-h100", "p5.48xlarge", "reserved", max_nodes=2, efa=True),       # 8 GPUs, 32 EFA
    pool("mig-a100", "p4de.24xlarge", "reserved", max_nodes=1,
         sharing={"mode": "mig", "migProfile": "1g.10gb"}),                        # 8 GPUs x 7 slices
    pool("infer-l40s", "g6e.12xlarge", "on-demand", workload="inference", max_nodes=8),
)
FLAVORS = kueue.flavors(POOLS, catalog)
SPOT = Taint(*INTERRUPTIBLE_TAINT)


def by_name(flavors=FLAVORS) -> Dict[str, kueue.Flavor]:
    return {f.name: f for f in flavors}


# --- flavors, order and quotas ----------------------------------------------------------------------------

def test_one_flavor_per_queue_pool_paid_for_then_spot_then_on_demand():
    # Reserved and capacity-block weigh the same for the autoscaler (50): capacity order, then the stack's order.
    assert [f.name for f in FLAVORS] == ["reserved-h100", "mig-a100", "block-h200", "spot-h100", "spot-l4",
                                         "od-a100"]


def test_the_queue_order_is_the_autoscalers_order_even_with_a_pool_given_its_own_priority():
    # Kueue picks the pool, cluster-autoscaler only grows it: they must agree on what comes first. A small on-demand
    # pool the stack puts first (autoscalerPriority 60) is where small jobs land first (docs/training.md).
    small = pool("small-l4", "g6.12xlarge", "on-demand", max_nodes=4, autoscalerPriority=60)
    pools = {p.spec.name: p for p in POOLS + (small,)}
    order = [f.name for f in kueue.flavors(POOLS + (small,), catalog)]
    assert order[0] == "small-l4"
    weights = [autoscaler_priority(pools[name]) for name in order]
    assert weights == sorted(weights, reverse=True)


def test_a_pool_has_a_flavor_exactly_when_queue_flavor_names_one():
    """jobs/__main__.py asks decisions.nodes.pools.queue_flavor whether a pool is the queue's, where it once built the
    pool's Flavor: the two must agree on every pool, shipped or not."""
    pools = list(POOLS) + [p for stack in STACKS for p in load_stack(stack)[1].pools]
    for p in pools:
        assert bool(kueue.flavors([p], catalog)) == (queue_flavor(p) is not None), p.spec.name


def test_inference_pools_are_not_in_the_queue():
    assert "infer-l40s" not in by_name()
    assert kueue.flavors([p for p in POOLS if p.spec.workload == "inference"], catalog) == ()
    with pytest.raises(ValueError, match="no training or general pool"):
        kueue.cluster_queue_spec(())


@pytest.mark.parametrize("flavor,quotas", [
    ("reserved-h100", {GPU: 16, EFA: 64}),                 # 2 x p5: 8 GPUs, 32 EFA each
    ("mig-a100", {MIG: 56}),                               # 1 p4de cut into 7 x 1g.10gb per GPU
    ("block-h200", {GPU: 32, EFA: 128}),
    ("spot-h100", {GPU: 16}),                              # no EFA: the pool has it off
    ("spot-l4", {GPU: 60}),                                # 5 x g6.12xlarge: 4 GPUs x 3 time-slicing replicas
    ("od-a100", {GPU: 24, EFA: 12}),
])
def test_quotas_are_what_the_pool_offers_at_max_nodes(flavor, quotas):
    assert dict(by_name()[flavor].quotas) == quotas


def test_each_flavor_selects_exactly_its_pools_nodes():
    for p in POOLS:
        if p.spec.workload == "inference":
            continue
        flavor = by_name()[p.spec.name]
        assert flavor.node_labels[POOL_LABEL] == p.spec.name
        # The labels the pool's nodes register with (and its autoscaler templates carry) hold the flavor's, so the
        # selector Kueue adds to admitted pods matches the pool's nodes, booted or still to come.
        assert flavor.node_labels.items() <= node_labels(p).items()
        assert kueue.resource_flavor_spec(flavor)["nodeLabels"]["gpu-cloud.io/pool"] == p.spec.name
    # A ResourceFlavor holds at most 8 node labels (apis/kueue/v1beta2/resourceflavor_types.go:62-66 at v0.19.2).
    assert len(kueue.FLAVOR_LABEL_KEYS) <= 8


def test_a_flavor_asks_for_what_its_nodes_are_tainted_with_and_adds_only_the_gpu_toleration():
    tainted = pool("dedicated-h100", "p5.48xlarge", "spot", taints=[
        {"key": "team", "value": "llm", "effect": "NoSchedule"},
        {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}])        # Kueue ignores PreferNoSchedule
    [flavor] = kueue.flavors([tainted], catalog)
    assert flavor.node_taints == (SPOT, Taint("team", "llm", "NoSchedule"))
    assert set(flavor.node_taints) <= set(node_taints(tainted))          # what the pool's nodes carry
    for f in FLAVORS:
        assert f.tolerations == (Taint(*GPU_TAINT),), f.name
        # Kueue would add a toleration listed in .spec.tolerations and then ignore the matching nodeTaint.
        assert not set(f.node_taints) & set(f.tolerations), f.name
    assert by_name()["spot-h100"].node_taints == (SPOT,)
    assert by_name()["spot-l4"].node_taints == (SPOT, kueue.SHARED_GPU_TAINT)
    assert all(not f.node_taints for f in FLAVORS if f.capacity != "spot")


def test_the_shared_gpu_taint_is_on_no_node():
    # It only says, at admission, that a job takes a share; a node tainted with it would refuse those jobs.
    assert all(kueue.SHARED_GPU_TAINT not in node_taints(p) for p in POOLS)


# --- the ClusterQueue -------------------------------------------------------------------------------------

def test_every_flavor_lists_every_covered_resource_in_the_same_order():
    group, = kueue.cluster_queue_spec(FLAVORS)["resourceGroups"]
    covered = group["coveredResources"]
    assert covered == sorted([EFA, GPU, MIG])
    for flavor in group["flavors"]:
        assert [r["name"] for r in flavor["resources"]] == covered, flavor["name"]
    spot = next(f for f in group["flavors"] if f["name"] == "spot-l4")
    assert {r["name"]: r["nominalQuota"] for r in spot["resources"]} == {EFA: 0, GPU: 60, MIG: 0}


def test_the_capacity_block_check_runs_on_the_blocks_flavors_alone_and_only_where_there_is_one():
    """Kueue runs a check on a workload whose quota it reserved on a flavor the check names (v0.19.2
    pkg/workload/workload.go lines 1475-1508): the block's flavor, not the reserved or spot ones beside it."""
    from decisions.nodes import capacity_blocks
    assert kueue.cluster_queue_spec(FLAVORS)["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "capacity-block-window", "onFlavors": ["block-h200"]}]}
    assert kueue.admission_check_spec() == {"controllerName": capacity_blocks.CONTROLLER_NAME}
    # An empty onFlavors would put it on every flavor (pkg/util/admissioncheck/admissioncheck.go lines 174-178),
    # and a check nobody answers holds the whole queue: no block, no check.
    without = [f for f in FLAVORS if f.capacity != "capacity-block"]
    assert "admissionChecksStrategy" not in kueue.cluster_queue_spec(without)
    for stack in STACKS:
        spec = load_stack(stack)[1]
        assert "admissionChecksStrategy" not in kueue.cluster_queue_spec(kueue.flavors(spec.pools, catalog)), stack


def test_only_the_training_namespace_submits_and_every_local_queue_feeds_the_cluster_queue():
    assert kueue.cluster_queue_spec(FLAVORS)["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "training"}}
    assert kueue.local_queue_spec() == {"clusterQueue": kueue.CLUSTER_QUEUE}
    # Kueue's DefaultLocalQueueName (pkg/controller/constants/constants.go:25-27 at v0.19.2).
    assert kueue.LOCAL_QUEUES == ("training", "default")


def test_each_shipped_stacks_flavors_and_quotas(stack_runs):
    expected = {
        # The A100 80GB and 40GB spot pools were one flavor: a job pinned to one was admitted on the other's quota.
        "prod-us-east-1": [("train-h100", {EFA: 128, GPU: 32}), ("finetune-a100-80gb-spot", {EFA: 0, GPU: 24}),
                           ("finetune-a100-40gb-spot", {EFA: 0, GPU: 24})],
        "prod-eu-west-1": [("train-a100", {EFA: 16, GPU: 32})],
        "dev": [("dev-gpu-spot", {GPU: 12})],
    }
    assert set(expected) == set(STACKS)
    for stack, flavors in expected.items():
        group, = stack_runs[stack].one(KUEUE_TYPE + "ClusterQueue").inputs["spec"]["resourceGroups"]
        assert [(f["name"], {r["name"]: r["nominalQuota"] for r in f["resources"]})
                for f in group["flavors"]] == flavors, stack


# --- a pool's limits as Kueue's API sets them ---------------------------------------------------------------

def taints(n):
    return [{"key": f"t{i}", "value": "x", "effect": "NoSchedule"} for i in range(n)]


def test_a_queue_pool_with_more_taints_than_its_flavor_holds_is_named():
    # valid_config's pool 0 is reserved (its flavor adds no taint of its own), pool 1 an inference pool (no flavor).
    config = valid_config()
    config["nodePools"][0]["taints"], config["nodePools"][1]["taints"] = taints(8), taints(12)
    load(config)
    [issue] = issues_of(lambda c: c["nodePools"][0].update(taints=taints(9)))
    assert issue.path == "gpu-cloud:nodePools[0].taints"
    assert "9 NoSchedule or NoExecute taints" in issue.message and "at most 8" in issue.message


def test_at_most_64_queue_pools():
    spec = pool("p", "p5.48xlarge", "reserved").spec
    assert kueue.pool_issues([(i, spec) for i in range(64)]) == []
    [(path, message)] = kueue.pool_issues([(i, spec) for i in range(65)])
    assert path == ("nodePools",) and "at most 64" in message


# --- Kueue's flavor assignment, as the project relies on it ---------------------------------------------------
# Read in kubernetes-sigs/kueue v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go, and only what the flavors
# here need: flavors are tried in the resource group's order (findFlavorForPodSets, lines 1086-1093); a flavor is out
# when one of its NoSchedule/NoExecute nodeTaints is tolerated by neither the pod nor the flavor's own tolerations
# (lines 1239-1244), or when the pod's nodeSelector, cut to the flavor's own label keys, does not match its
# nodeLabels (lines 1224-1227, 1246-1252, 1278-1292); it fits when, for each resource the queue covers, what is in
# use plus the request stays within the nominal quota (fitsResourceQuota, lines 1330-1365, without a cohort);
# resources the queue does not cover are skipped under IgnoreUndeclared (lines 802-812). No preemption, borrowing,
# affinity terms or topology.

def _pod_requests(pod: Mapping[str, Any], count: int) -> Dict[str, int]:
    total: Dict[str, int] = {}
    for container in pod.get("containers", ()):
        resources = container.get("resources", {})
        for name, value in {**resources.get("limits", {}), **resources.get("requests", {})}.items():
            if re.fullmatch(r"\d+", str(value)):
                total[name] = total.get(name, 0) + int(value) * count
    return total


def admitted(pod: Mapping[str, Any], count: int, queue: Mapping[str, Any], flavor_specs: Mapping[str, Mapping],
             used: Optional[Mapping[str, Mapping[str, int]]] = None) -> Optional[str]:
    """The flavor Kueue admits `count` pods of `pod` (a pod spec) to, or None: the workload waits."""
    used = used or {}
    group, = queue["resourceGroups"]
    requests = {r: n for r, n in _pod_requests(pod, count).items() if r in group["coveredResources"] and n}
    for entry in group["flavors"]:
        spec = flavor_specs[entry["name"]]
        tolerations = [*pod.get("tolerations", ()), *spec.get("tolerations", ())]
        # k8s.io/api core/v1 Toleration.ToleratesTaint, as the scheduler decides it (decisions/nodes/pods.tolerates).
        if any(not tolerates(tolerations, Taint(**taint)) for taint in spec.get("nodeTaints", ())
               if taint["effect"] in ("NoSchedule", "NoExecute")):
            continue
        labels = spec.get("nodeLabels", {})
        if any(labels[key] != value for key, value in pod.get("nodeSelector", {}).items() if key in labels):
            continue
        quota = {r["name"]: r["nominalQuota"] for r in entry["resources"]}
        if all(used.get(entry["name"], {}).get(r, 0) + n <= quota[r] for r, n in requests.items()):
            return entry["name"]
    return None


def queue_of(flavors):
    return kueue.cluster_queue_spec(flavors), {f.name: kueue.resource_flavor_spec(f) for f in flavors}


def gpu_pod(gpus=8, resource=GPU, pool_name=None, tolerate=(), efa=0):
    limits = {resource: gpus, **({EFA: efa} if efa else {})}
    return {"containers": [{"name": "train", "resources": {"limits": limits}}],
            **({"nodeSelector": {POOL_LABEL: pool_name}} if pool_name else {}),
            **({"tolerations": [toleration(t) for t in tolerate]} if tolerate else {})}


@pytest.fixture(scope="module")
def prod():
    return queue_of(kueue.flavors(load_stack("prod-us-east-1")[1].pools, catalog))


def test_a_job_pinned_to_a_pool_is_admitted_only_to_its_pool(prod):
    queue, specs = prod
    pinned = gpu_pod(pool_name="finetune-a100-80gb-spot", tolerate=[SPOT])
    assert admitted(pinned, 1, queue, specs) == "finetune-a100-80gb-spot"      # though train-h100 has room
    # Its pool's quota used up, it waits: never on the A100 40GB pool's nodes, which its selector excludes.
    assert admitted(pinned, 1, queue, specs, used={"finetune-a100-80gb-spot": {GPU: 24}}) is None


def test_an_unpinned_job_takes_paid_for_capacity_first_and_spot_only_when_it_says_it_may_be_interrupted(prod):
    queue, specs = prod
    reserved_full = {"train-h100": {GPU: 32}}
    assert admitted(gpu_pod(), 1, queue, specs) == "train-h100"
    assert admitted(gpu_pod(), 1, queue, specs, used=reserved_full) is None        # prod has no on-demand pool
    assert admitted(gpu_pod(tolerate=[SPOT]), 1, queue, specs, used=reserved_full) == "finetune-a100-80gb-spot"
    assert admitted(gpu_pod(tolerate=[SPOT]), 1, queue, specs,
                    used={**reserved_full, "finetune-a100-80gb-spot": {GPU: 24}}) == "finetune-a100-40gb-spot"


def test_quota_is_checked_per_resource():
    queue, specs = queue_of(FLAVORS)
    # 2 workers of 8 GPUs and 32 EFA devices: the reserved H100s have both; with them taken, spot-h100 has GPUs but
    # no EFA quota, so the job goes on to the capacity block.
    efa_job = gpu_pod(efa=32, tolerate=[SPOT])
    assert admitted(efa_job, 2, queue, specs) == "reserved-h100"
    assert admitted(efa_job, 2, queue, specs, used={"reserved-h100": {GPU: 16, EFA: 64}}) == "block-h200"
    # Both taken, no flavor has 64 EFA devices left (od-a100 has 12): it waits.
    assert admitted(efa_job, 2, queue, specs, used={"reserved-h100": {GPU: 16, EFA: 64},
                                                    "block-h200": {GPU: 32, EFA: 128}}) is None
    # MIG slices only where they are offered.
    assert admitted(gpu_pod(7, MIG), 1, queue, specs) == "mig-a100"
    assert admitted(gpu_pod(7, MIG), 1, queue, specs, used={"mig-a100": {MIG: 50}}) is None


def test_a_job_that_selects_its_node_size_is_admitted_only_where_nodes_have_it():
    # A pool of 4-GPU nodes the stack puts first: its quota (16) would take an 8-GPU pod that no node of it can hold.
    small = pool("small-l4", "g6.12xlarge", "on-demand", max_nodes=4, autoscalerPriority=60)
    queue, specs = queue_of(kueue.flavors(POOLS + (small,), catalog))
    eight = {**gpu_pod(8), "nodeSelector": {"gpu-cloud.io/gpu-count": "8"}}
    assert admitted(gpu_pod(1), 1, queue, specs) == "small-l4"
    assert admitted(eight, 1, queue, specs) == "reserved-h100"
    h200 = {**gpu_pod(8), "nodeSelector": {"gpu-cloud.io/gpu-model": "H200"}}
    assert admitted(h200, 1, queue, specs) == "block-h200"


def test_a_shared_gpu_takes_only_jobs_that_ask_for_a_share():
    queue, specs = queue_of(FLAVORS)
    full = {"reserved-h100": {GPU: 16}, "block-h200": {GPU: 32}, "spot-h100": {GPU: 16}}
    # 8 GPUs would fit the time-sliced pool's quota (60) but the device plugin refuses a pod more than one replica.
    assert admitted(gpu_pod(8, tolerate=[SPOT]), 1, queue, specs, used=full) == "od-a100"
    assert admitted(gpu_pod(1, tolerate=[SPOT, kueue.SHARED_GPU_TAINT]), 1, queue, specs, used=full) == "spot-l4"


def test_the_mpijob_template_lands_on_the_pool_it_was_rendered_for():
    queue, specs = queue_of(FLAVORS)
    od = by_name_pool("od-a100")
    job = mpijob.training_mpijob(od, name="llm", namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
                                 image="train:1", workers=2, program=["python", "train.py"], worker_wait_s=60)
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]
    # Last in the order, though every flavor before it has room.
    assert admitted(worker["template"]["spec"], worker["replicas"], queue, specs) == "od-a100"


def by_name_pool(name: str) -> ResolvedPool:
    return next(p for p in POOLS if p.spec.name == name)


# --- nothing in the training namespace bypasses the queue -------------------------------------------------------
# What Kueue v0.19.2's webhooks do with an object created in a namespace, only as far as this needs:
# - a kind is Kueue's only through an enabled integration (framework names: pkg/controller/jobs/job/
#   job_controller.go:55, mpijob/mpijob_controller.go:42, jobset/jobset_controller.go:44, pod/pod_controller.go:68);
# - the namespace must match managedJobsNamespaceSelector (jobframework/defaults.go:59-78; pods:
#   pod/pod_webhook.go:118-120);
# - without the queue label, and with a LocalQueue `default` in the namespace, it is labelled `default`
#   (defaults.go:80-98; pod/pod_webhook.go:151-158);
# - it is then held, suspended or gated, when it has a queue name or manageJobsWithoutQueueName is set
#   (jobframework/utils.go:147-155; pod/pod_webhook.go:160-176).
FRAMEWORKS = {"Job": "batch/job", "MPIJob": "kubeflow.org/mpijob", "JobSet": "jobset.x-k8s.io/jobset",
              "Pod": "pod"}


def webhook_outcome(obj: Mapping[str, Any], config: Mapping[str, Any], local_queues: Set[str],
                    namespace_labels: Mapping[str, str]):
    """None if Kueue leaves the object alone; else (held, queue name or None)."""
    if FRAMEWORKS[obj["kind"]] not in config["integrations"]["frameworks"]:
        return None
    selector = config["managedJobsNamespaceSelector"]["matchLabels"]
    if not selector.items() <= namespace_labels.items():
        return None
    queue = obj["metadata"].get("labels", {}).get(QUEUE_LABEL)
    if queue is None and kueue.DEFAULT_LOCAL_QUEUE in local_queues:
        queue = kueue.DEFAULT_LOCAL_QUEUE
    return (queue is not None or config["manageJobsWithoutQueueName"]), queue


def _unlabelled(obj):
    labels = {k: v for k, v in obj["metadata"].get("labels", {}).items() if k != QUEUE_LABEL}
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def _objects():
    meta = {"name": "x", "namespace": TRAINING_NAMESPACE}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": gpu_pod(1)}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
           "spec": {"template": {"spec": {**gpu_pod(8), "restartPolicy": "Never"}}}}
    mpi = mpijob.training_mpijob(by_name_pool("reserved-h100"), name="llm", namespace=TRAINING_NAMESPACE,
                                 queue_name=kueue.LOCAL_QUEUE, image="train:1", workers=2, program=["train"],
                                 worker_wait_s=60)
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
              "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": job["spec"]}]}}
    return {"bare pod": pod, "Job": job, "MPIJob": mpi, "JobSet": jobset}


TRAINING_LABELS = {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}


@pytest.mark.parametrize("kind", ["bare pod", "Job", "MPIJob", "JobSet"])
def test_every_kind_of_job_is_queued_with_or_without_the_label(kind):
    config = kueue.manager_configuration("ami")
    obj = _objects()[kind]
    queues = set(kueue.LOCAL_QUEUES)
    labelled = {**obj, "metadata": {**obj["metadata"], "labels": {QUEUE_LABEL: kueue.LOCAL_QUEUE}}}
    assert webhook_outcome(labelled, config, queues, TRAINING_LABELS) == (True, kueue.LOCAL_QUEUE)
    assert webhook_outcome(_unlabelled(obj), config, queues, TRAINING_LABELS) == (True, kueue.DEFAULT_LOCAL_QUEUE)
    # Created while Kueue does not know the default queue yet: held until it is given one, not run.
    assert webhook_outcome(_unlabelled(obj), config, {kueue.LOCAL_QUEUE}, TRAINING_LABELS) == (True, None)
    # Other namespaces are not Kueue's (its webhooks refuse requests while it is down: they must see only training).
    assert webhook_outcome(_unlabelled(obj), config, queues, {"kubernetes.io/metadata.name": "inference"}) is None


@pytest.mark.parametrize("command", ["nccl-acceptance", "mpijob", "pytorch-job", "job"])
def test_the_templates_name_a_queue_that_feeds_the_cluster_queue(command, capsys):
    """The queue each `python -m jobs` template is rendered into is the program's choice (jobs/__main__.py): one of
    the LocalQueues the stack creates, each feeding the training ClusterQueue."""
    from jobs.__main__ import main

    program = [] if command == "nccl-acceptance" else ["--name", "llm", "--image", "i", "--", "train.py"]
    assert main([command, "prod-us-east-1", "--pool", "train-h100", *program]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    queue = manifest["metadata"]["labels"][QUEUE_LABEL]
    assert queue == kueue.LOCAL_QUEUE and queue in kueue.LOCAL_QUEUES
    assert kueue.local_queue_spec() == {"clusterQueue": kueue.CLUSTER_QUEUE}


# --- priorities ---------------------------------------------------------------------------------------------------

def test_production_preempts_experiments_within_the_one_queue():
    classes = {p.name: p.value for p in kueue.PRIORITY_CLASSES}
    # A job without the label runs at Kueue's default priority (pkg/constants/constants.go:41): an experiment.
    assert classes == {"production": 1000, "experiment": 0}
    queue = kueue.cluster_queue_spec(FLAVORS)
    # clusterqueue_types.go:546-560: LowerPriority preempts only lower-priority workloads of the same ClusterQueue.
    assert queue["preemption"] == {"withinClusterQueue": "LowerPriority"}
    # One team queue: no cohort to borrow from or reclaim in, so no fair sharing.
    assert "cohortName" not in queue
    # The label jobs set (pkg/controller/constants/constants.go:48).
    assert kueue.PRIORITY_LABEL == "kueue.x-k8s.io/priority-class"
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) for name in classes)


def test_the_program_creates_no_priority_class_that_would_displace_kueues_default(stack_runs):
    """A job without the priority label gets the value of the cluster's globalDefault PriorityClass before Kueue's own
    0 (kubernetes-sigs/kueue v0.19.2 pkg/util/priority/priority.go:116-146): `experiment` is what such a job runs as
    only while the program creates none."""
    for stack, run in stack_runs.items():
        token = re.compile(r"kubernetes:scheduling\.k8s\.io/v\w+:PriorityClass")
        assert not [r.name for r in run.resources if token.fullmatch(r.type)], stack


# --- Kueue's configuration and chart values ---------------------------------------------------------------

@pytest.mark.parametrize("source", ["ami", "install"])
def test_pods_ready_timeouts_outlast_a_node_booting_from_zero(source):
    config = kueue.manager_configuration(source)["waitForPodsReady"]
    minutes, seconds = map(int, re.fullmatch(r"(\d+)m(\d+)s", config["timeout"]).groups())
    timeout = minutes * 60 + seconds
    assert timeout == boot.max_node_provision_seconds(source) + kueue.IMAGE_PULL_ALLOWANCE_S
    assert config["recoveryTimeout"] == config["timeout"]


def test_interrupted_jobs_are_requeued_without_limit():
    strategy = kueue.manager_configuration("ami")["waitForPodsReady"]["requeuingStrategy"]
    assert "backoffLimitCount" not in strategy          # null: requeue forever
    assert strategy["timestamp"] == "Eviction"
    assert strategy["backoffBaseSeconds"] <= strategy["backoffMaxSeconds"]


def test_kueue_manages_jobs_mpijobs_jobsets_and_bare_pods_and_only_quotas_gpus_and_efa():
    config = kueue.manager_configuration("ami")
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/mpijob", "jobset.x-k8s.io/jobset",
                                                    "pod"]
    assert config["resources"] == {"quotaCheckStrategy": "IgnoreUndeclared"}
    assert config["manageJobsWithoutQueueName"] is True
    # Its job and pod webhooks (failurePolicy Fail) see the training namespace only, where its LocalQueues are; the
    # pod integration needs a selector that leaves out kube-system and Kueue's namespace
    # (pkg/config/validation.go:349-382).
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "training"}}
    # Quota and use per flavor, for the training-queue dashboard.
    assert config["metrics"]["enableClusterQueueResources"] is True


def _configuration_fields() -> Set[str]:
    """The JSON fields of Kueue v0.19.2's config API: from its source where it is mirrored, else from the record
    (tests/upstream/, checked against the source by test_upstream_records.py)."""
    recorded = upstream_records.record("kueue-configuration-fields.json")
    source = upstream_records.show(recorded["repo"], recorded["tag"], recorded["path"])
    return upstream_records.go_field_names(source) if source is not None else set(recorded["fields"])


def _keys(node: Any,
          skip_values_of=("frameworks", "managedJobsNamespaceSelector", "groupKindConcurrency")) -> Set[str]:
    """Every key in the Configuration, but not inside framework names, Kubernetes types (a LabelSelector) or maps keyed
    by kind (groupKindConcurrency)."""
    if isinstance(node, dict):
        return set(node) | {k for key, value in node.items() if key not in skip_values_of for k in _keys(value)}
    return set()


def test_every_configuration_key_is_a_field_of_kueues_v1beta2_api():
    # leaderElection is k8s.io/component-base's LeaderElectionConfiguration, not defined in Kueue's file.
    leader_election = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
                       "resourceName", "resourceNamespace"}
    fields = _configuration_fields() | {"apiVersion", "kind"} | leader_election
    unknown = sorted(_keys(kueue.manager_configuration("install")) - fields)
    assert not unknown, f"not in config.kueue.x-k8s.io/v1beta2: {unknown}"


def _chart_default_configuration() -> Dict[str, Any]:
    """The Configuration the pinned chart ships as managerConfig.controllerManagerConfigYaml (its values.yaml, as
    recorded in tests/upstream/chart-values/)."""
    return yaml.safe_load(merged_values(charts.chart(charts.KUEUE), {})["managerConfig"]["controllerManagerConfigYaml"])


def _restates(ours: Any, chart: Any) -> bool:
    """Whether `ours` sets everything `chart` sets, to the same values (maps may add keys)."""
    if isinstance(chart, dict):
        return isinstance(ours, dict) and all(key in ours and _restates(ours[key], value)
                                              for key, value in chart.items())
    return ours == chart


def test_the_manager_configuration_restates_the_chart_defaults_group_kind_concurrency():
    chart = _chart_default_configuration()["controller"]["groupKindConcurrency"]
    assert kueue.manager_configuration("ami")["controller"]["groupKindConcurrency"] == chart
    assert dict(kueue.CHART_GROUP_KIND_CONCURRENCY) == chart


@pytest.mark.parametrize("source", ["ami", "install"])
def test_the_manager_configuration_restates_every_setting_of_the_charts_default(source):
    """The chart's value is the whole file, so a setting of its default left out here would silently fall back to
    Kueue's built-in default instead."""
    chart, ours = _chart_default_configuration(), kueue.manager_configuration(source)
    differ = sorted(key for key, value in chart.items() if not _restates(ours.get(key), value))
    # The one deliberate difference: only the frameworks with an operator here (kueue.INTEGRATIONS), each of them one
    # the chart enables too.
    assert differ == ["integrations"], f"the chart's default sets these differently or not at all here: {differ}"
    assert set(ours["integrations"]["frameworks"]) < set(chart["integrations"]["frameworks"])


def test_kueue_values_are_in_the_pinned_chart_and_run_the_manager_on_system_nodes():
    values = kueue.kueue_values(SYSTEM_NODE_LABELS, "ami")
    assert_values_confirmed(values, charts.chart(charts.KUEUE), kueue.KUEUE_VALUE_PATHS)
    assert values["controllerManager"]["nodeSelector"] == SYSTEM_NODE_LABELS
    assert values["controllerManager"] == system_placement(SYSTEM_NODE_LABELS)      # its taint tolerated
    assert yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"]) == kueue.manager_configuration("ami")


def test_kueues_metrics_are_scraped_as_its_chart_would_and_the_charts_own_monitor_stays_off():
    values = kueue.kueue_values(SYSTEM_NODE_LABELS, "ami")
    chart = merged_values(charts.chart(charts.KUEUE), values)
    assert not chart["enablePrometheus"]          # its labels are not the ones Prometheus selects
    assert kueue.METRICS_PORT_NAME in [port["name"] for port in chart["metricsService"]["ports"]]
    assert kueue.METRICS_ENDPOINT["tlsConfig"] == chart["metrics"]["serviceMonitor"]["tlsConfig"]
    # The manager serves metrics on the port the Service forwards to.
    (port,) = [p for p in chart["metricsService"]["ports"] if p["name"] == kueue.METRICS_PORT_NAME]
    assert kueue.manager_configuration("ami")["metrics"]["bindAddress"] == f":{port['targetPort']}"


def test_kueue_and_the_mpi_operator_are_pinned():
    pin = charts.chart(charts.KUEUE)
    assert (pin.chart_ref, pin.version, pin.app_version) == ("oci://registry.k8s.io/kueue/charts/kueue", "0.19.2",
                                                             "v0.19.2")
    mpi = charts.manifest(charts.MPI_OPERATOR)
    assert mpi.url == "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.0/deploy/v2beta1/mpi-operator.yaml"


def test_a_manifest_url_or_file_off_its_pinned_tag_is_refused():
    kept = dict(file="manifests/mpi-operator-v0.8.0.yaml", sha256="0" * 64, source="test")
    with pytest.raises(ValueError, match="not at the pinned tag"):
        charts.ManifestPin(url="https://raw.githubusercontent.com/kubeflow/mpi-operator/master/deploy/x.yaml",
                           version="v0.8.0", **kept)
    with pytest.raises(ValueError, match="does not name the pinned version"):
        charts.ManifestPin(url="https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.1/deploy/x.yaml",
                           version="v0.8.1", **kept)
