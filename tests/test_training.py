"""The training components: the MPI Operator and Kueue (TrainingOperators), the wait for Kueue's webhooks, and
Kueue's custom resources in the order the API server needs (TrainingQueue), with the NCCL acceptance test's
standing parts (judge ConfigMap, its service account, the NVLink-check CronJobs, the across-node CronJobs and the
account that starts their runs)."""
from __future__ import annotations

import inspect

import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from components.platform.training import TrainingOperators, TrainingOperatorsArgs, TrainingQueue, TrainingQueueArgs
from decisions.catalog import charts
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.nodes.pods import SYSTEM_NODE_LABELS, system_placement
from decisions.platform import acceptance, kueue
from tests.conftest import run_component, run_stack, stack_config, validate_kubernetes
from tests.crds import crd_schema, validate_against_crd
from tests.test_kueue import CONFIG_FILE, KUEUE_TYPE, POOLS, RELEASE, catalog

CRONJOB = "kubernetes:batch/v1:CronJob"
JOB = "kubernetes:batch/v1:Job"
ROLE, BINDING = "kubernetes:rbac.authorization.k8s.io/v1:Role", "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
# A reserved H100 EFA pool that keeps two nodes: the only one a schedule makes run by itself, and the only one with
# an across-node check.
STANDING = ResolvedPool(spec=NodePool.model_validate({
    "name": "standing-h100", "instanceTypes": ["p5.48xlarge"], "capacity": "reserved", "minNodes": 2,
    "desiredNodes": 2, "maxNodes": 2, "workload": "training"}), types=(catalog.instance_types["p5.48xlarge"],), efa=True)
ALL_POOLS = POOLS + (STANDING,)
FLAVORS = kueue.flavors(ALL_POOLS, catalog)
# NVLink pools of the queue with a withinNode minimum (test_kueue.POOLS): p4d on-demand, p5 spot, p5e capacity
# block, p5 reserved; not the time-sliced L4s (no NVLink), the MIG p4de (shared GPUs) or the inference L40S.
CHECKED = {"od-a100", "spot-h100", "block-h200", "reserved-h100", "standing-h100"}


def _build(schedule=None, across_schedule="0 6 * * 0"):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        opts = pulumi.ResourceOptions(providers={"kubernetes": k8s})
        training = kubernetes.core.v1.Namespace("training-ns", metadata={"name": "training"}, opts=opts)
        operators = TrainingOperators("training-operators", TrainingOperatorsArgs(driver_source="ami"), opts=opts)
        queue = TrainingQueue("training", TrainingQueueArgs.for_pools(
            ALL_POOLS, catalog, operators=operators, nvlink_schedule=schedule, across_node_schedule=across_schedule),
            opts=opts)
        queue.serve(training.metadata.name)
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build())


@pytest.fixture(scope="module")
def scheduled():
    return run_component(_build(schedule="30 2 * * *"))


def _named(run, type_token):
    return {r.inputs["metadata"]["name"]: r for r in run.of_type(type_token)}


def _checks(run, component):
    """CronJobs of one NCCL check: 'within-node' (NVLink) or 'across-nodes-start' (EFA, two nodes)."""
    return [c for c in run.of_type(CRONJOB) if c.inputs["metadata"]["labels"]["app.kubernetes.io/component"] == component]


# --- Kueue, the MPI Operator and JobSet ------------------------------------------------------------------

MANIFEST = "gpu-cloud:release_manifest:ReleaseManifest"


def test_the_mpi_operator_and_jobset_come_from_the_repositorys_copies_of_their_release_manifests(run):
    """Every object of both pinned manifests is a resource of its own, child of its ReleaseManifest: nothing is
    fetched at `pulumi up`, and the plan and the pack see what the engine registers (no yaml/v2 ConfigFile)."""
    assert not run.of_type(CONFIG_FILE) and not run.unexpanded()
    for key in (charts.MPI_OPERATOR, charts.JOBSET):
        component = run.one(MANIFEST, f"training-operators-{key}")
        children = run.children_of(component.urn)
        expected = charts.manifest_objects(key)
        assert len(children) == len(expected) > 1, key
        by_identity = {(c.inputs["kind"], c.inputs["metadata"].get("namespace"), c.inputs["metadata"]["name"]): c
                       for c in children}
        for obj in expected:
            metadata = obj["metadata"]
            child = by_identity[(obj["kind"], metadata.get("namespace"), metadata["name"])]
            # Named and typed as yaml/v2 registered it under the ConfigFile of the same name.
            scoped = f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"]
            assert child.name == f"training-operators-{key}:{scoped}"
            group_version = obj["apiVersion"] if "/" in obj["apiVersion"] else f"core/{obj['apiVersion']}"
            assert child.type == f"kubernetes:{group_version}:{obj['kind']}"
            # The release's object as it is, but for the annotation (and a workload's placement).
            assert child.inputs["metadata"]["annotations"]["gpu-cloud.io/release"] == \
                f"{key}@{charts.manifest(key).version}"
            if obj["kind"] != "Deployment":
                body = {k: v for k, v in child.inputs.items() if k != "metadata"}
                assert body == {k: v for k, v in obj.items() if k != "metadata"}, child.name


def test_the_manifests_deployments_run_on_the_system_nodes_and_are_waited_for(run):
    """Neither manifest's Deployment selects or tolerates anything: with the system nodes tainted they would run
    nowhere. Their pod templates get the system nodes' placement, as every system-node pod; no patch, and no
    skipAwait: Kueue waits until both controllers are ready."""
    from decisions.nodes.pods import SYSTEM_NODE_TAINT, tolerates

    assert not run.of_type("kubernetes:apps/v1:DeploymentPatch")
    deployments = {d.inputs["metadata"]["name"]: d for d in run.of_type("kubernetes:apps/v1:Deployment")}
    assert set(deployments) == {"mpi-operator", "jobset-controller-manager"}
    release = run.one(RELEASE)
    for deployment in deployments.values():
        pod = deployment.inputs["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == SYSTEM_NODE_LABELS and tolerates(pod["tolerations"], SYSTEM_NODE_TAINT)
        assert {k: pod[k] for k in ("nodeSelector", "tolerations")} == system_placement(SYSTEM_NODE_LABELS)
        assert "pulumi.com/skipAwait" not in deployment.inputs["metadata"]["annotations"]
        # A dependency on a component is one on everything beneath it (the SDK expands it).
        assert deployment.urn in release.dependencies


def test_each_manifest_object_waits_for_the_namespace_the_crds_and_what_its_controller_runs_with(run):
    """Namespace, then CRDs, then accounts, RBAC, configuration and Services, then the controller, then the webhook
    configurations: the API server is never told to call a webhook nobody serves."""
    by_urn = {r.urn: r for r in run.resources}
    for component in run.of_type(MANIFEST):
        children = run.children_of(component.urn)
        kinds = {c.urn: c.inputs["kind"] for c in children}

        def before(child):
            return {kinds[d] for d in child.dependencies if d in kinds}

        for child in children:
            kind = child.inputs["kind"]
            if kind == "Namespace":
                assert before(child) == set()
            elif kind == "CustomResourceDefinition":
                assert before(child) == {"Namespace"}
            elif kind == "Deployment":
                assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                        "ClusterRoleBinding"} <= before(child) and "Deployment" not in before(child)
            elif kind.endswith("WebhookConfiguration"):
                assert "Deployment" in before(child) and "Service" in before(child)
            else:
                assert before(child) == {"Namespace", "CustomResourceDefinition"}, child.name
            assert all(by_urn[d].parent == component.urn for d in child.dependencies)


def test_kueue_starts_after_the_mpijob_and_jobset_crds_and_its_custom_resources_after_kueue(run):
    release = run.one(RELEASE)
    assert release.inputs["chart"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert release.inputs["namespace"] == kueue.NAMESPACE
    # Both CRDs exist when Kueue starts, so it runs both integrations from its start.
    crds = {c.inputs["metadata"]["name"]: c.urn
            for c in run.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")}
    assert set(crds) == {"mpijobs.kubeflow.org", "jobsets.jobset.x-k8s.io"} and set(crds.values()) <= set(release.dependencies)
    flavors = run.of_type(KUEUE_TYPE + "ResourceFlavor")
    assert sorted(f.inputs["metadata"]["name"] for f in flavors) == sorted(f.name for f in FLAVORS)
    probe = run.one(JOB)
    assert release.urn in probe.dependencies
    # Not merely after Kueue's pods are Ready: after its webhooks answered (the probe Job completed).
    assert all(probe.urn in f.dependencies for f in flavors)
    queue = run.one(KUEUE_TYPE + "ClusterQueue")
    assert {f.urn for f in flavors} | {probe.urn} <= set(queue.dependencies)
    # The capacity blocks' check exists before the queue that names it: a check Kueue cannot find holds the queue.
    check = run.one(KUEUE_TYPE + "AdmissionCheck")
    assert probe.urn in check.dependencies and check.urn in queue.dependencies
    assert check.inputs["metadata"]["name"] == kueue.ADMISSION_CHECK
    assert check.inputs["spec"] == kueue.admission_check_spec()
    priorities = run.of_type(KUEUE_TYPE + "WorkloadPriorityClass")
    assert priorities and all(probe.urn in p.dependencies for p in priorities)
    # Both LocalQueues, `default` taking jobs without the label; once they exist, so do the priorities jobs name.
    locals_ = _named(run, KUEUE_TYPE + "LocalQueue")
    assert sorted(locals_) == sorted(kueue.LOCAL_QUEUES)
    for name, local in locals_.items():
        assert {queue.urn} | {p.urn for p in priorities} <= set(local.dependencies)
        assert local.inputs["metadata"] == {"name": name, "namespace": "training"}
        assert local.inputs["spec"] == {"clusterQueue": kueue.CLUSTER_QUEUE}
    # The queue jobs already name keeps its place in deployed stacks: it answers to its earlier resource name.
    assert locals_[kueue.LOCAL_QUEUE].aliases == ("name=training-local-queue",)


def test_custom_resources_carry_the_specs_spec_kueue_renders(run):
    assert run.one(KUEUE_TYPE + "ClusterQueue").inputs["spec"] == kueue.cluster_queue_spec(FLAVORS)
    flavors = _named(run, KUEUE_TYPE + "ResourceFlavor")
    assert {name: f.inputs["spec"] for name, f in flavors.items()} == {
        f.name: kueue.resource_flavor_spec(f) for f in FLAVORS}
    assert flavors["spot-h100"].inputs["spec"]["nodeLabels"]["gpu-cloud.io/pool"] == "spot-h100"
    assert flavors["spot-h100"].inputs["spec"]["nodeTaints"] == [{"key": "gpu-cloud.io/interruptible",
                                                                  "value": "true", "effect": "NoSchedule"}]


def test_one_priority_class_per_kind_of_work(run):
    priorities = _named(run, KUEUE_TYPE + "WorkloadPriorityClass")
    assert {name: p.inputs["value"] for name, p in priorities.items()} == {"production": 1000, "experiment": 0}
    assert all(p.inputs["description"] for p in priorities.values())


@pytest.mark.parametrize("kind,plural,each", [("ResourceFlavor", "resourceflavors", None),
                                              ("AdmissionCheck", "admissionchecks", 0),
                                              ("ClusterQueue", "clusterqueues", 1),
                                              ("LocalQueue", "localqueues", len(kueue.LOCAL_QUEUES)),
                                              ("WorkloadPriorityClass", "workloadpriorityclasses",
                                               len(kueue.PRIORITY_CLASSES))])
def test_custom_resources_validate_against_kueues_crds(run, stack_runs, kind, plural, each):
    schema = crd_schema(f"kueue.x-k8s.io/{plural}", "v1beta2")
    checked = 0
    for result in (run, *stack_runs.values()):
        for resource in result.of_type(KUEUE_TYPE + kind):
            # A WorkloadPriorityClass has its fields beside metadata; the others under spec.
            validate_against_crd({"apiVersion": kueue.API_VERSION, "kind": kind, **resource.inputs}, schema)
            checked += 1
    # The component's and 3 stacks': one flavor per queue pool (3 in prod-us-east-1, 1 in the others); the capacity
    # blocks' check in the component's alone (block-h200), no shipped stack having a block.
    assert checked == (len(FLAVORS) + 5 if each is None else 1 if kind == "AdmissionCheck" else 4 * each)


# --- the NCCL acceptance test's standing parts ------------------------------------------------------------

def test_the_judge_and_starter_scripts_are_shipped_as_is(run):
    configmap = _named(run, "kubernetes:core/v1:ConfigMap")[acceptance.JUDGE_CONFIGMAP]
    assert configmap.inputs["data"] == {acceptance.JUDGE_SCRIPT_KEY: acceptance.JUDGE_SCRIPT.read_text(),
                                        acceptance.SUBMIT_SCRIPT_KEY: acceptance.SUBMIT_SCRIPT.read_text()}
    assert configmap.inputs["metadata"]["namespace"] == "training"


def test_the_judges_account_may_post_events_and_nothing_else(run):
    account = _named(run, "kubernetes:core/v1:ServiceAccount")[acceptance.SERVICE_ACCOUNT]
    assert account.inputs["automountServiceAccountToken"] is False
    role = _named(run, ROLE)[acceptance.SERVICE_ACCOUNT]
    assert role.inputs["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = _named(run, BINDING)[acceptance.SERVICE_ACCOUNT]
    assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": acceptance.SERVICE_ACCOUNT}
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": acceptance.SERVICE_ACCOUNT,
                                           "namespace": "training"}]
    assert not [b for b in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
                if any(subject["name"] == acceptance.SERVICE_ACCOUNT for subject in b.inputs["subjects"])]


def test_an_nvlink_check_exists_for_each_queue_pool_it_can_run_on(run):
    pools = {c.inputs["metadata"]["labels"]["gpu-cloud.io/pool"] for c in _checks(run, "within-node")}
    assert pools == CHECKED


def test_without_a_schedule_every_check_is_suspended(run):
    assert all(c.inputs["spec"]["suspend"] is True for c in _checks(run, "within-node"))


def test_a_schedule_runs_the_check_only_on_pools_that_keep_nodes(scheduled):
    running = {c.inputs["metadata"]["labels"]["gpu-cloud.io/pool"]: c.inputs["spec"]
               for c in _checks(scheduled, "within-node") if not c.inputs["spec"]["suspend"]}
    assert list(running) == ["standing-h100"]
    assert running["standing-h100"]["schedule"] == "30 2 * * *"


def test_the_across_node_check_runs_on_its_schedule_on_the_pool_that_keeps_two_nodes(run):
    from decisions.nodes.pods import SYSTEM_NODE_TAINT, tolerates
    [check] = _checks(run, "across-nodes-start")
    assert check.inputs["metadata"]["name"] == "nccl-efa-start-standing-h100"
    assert check.inputs["spec"]["schedule"] == "0 6 * * 0"
    assert check.inputs["spec"] == acceptance.across_node_cronjob_manifest(
        STANDING, catalog, namespace="training", queue_name=kueue.LOCAL_QUEUE, schedule="0 6 * * 0",
        judge_configmap=acceptance.JUDGE_CONFIGMAP, service_account=acceptance.SERVICE_ACCOUNT,
        scheduler_account=acceptance.SCHEDULER_SERVICE_ACCOUNT)["spec"]
    # The starter runs on the pool it tests, not on the system nodes (a team namespace may not tolerate their taint).
    starter = check.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert starter["nodeSelector"] == {"gpu-cloud.io/pool": "standing-h100"}
    assert not tolerates(starter["tolerations"], SYSTEM_NODE_TAINT) and starter["tolerations"]
    assert [c.inputs["spec"]["schedule"] for c in _checks(run_component(_build(across_schedule="15 1 * * 3")),
                                                          "across-nodes-start")] == ["15 1 * * 3"]


def test_the_starters_account_may_list_and_create_mpijobs_and_nothing_else(run):
    account = _named(run, "kubernetes:core/v1:ServiceAccount")[acceptance.SCHEDULER_SERVICE_ACCOUNT]
    assert account.inputs["metadata"]["namespace"] == "training"
    role = _named(run, ROLE)[acceptance.SCHEDULER_SERVICE_ACCOUNT]
    assert role.inputs["rules"] == [{"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"],
                                     "verbs": ["list", "create"]}]
    binding = _named(run, BINDING)[acceptance.SCHEDULER_SERVICE_ACCOUNT]
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": acceptance.SCHEDULER_SERVICE_ACCOUNT,
                                           "namespace": "training"}]


def test_checks_wait_for_the_queue_their_judge_and_its_rights(run):
    needs = {*(q.urn for q in run.of_type(KUEUE_TYPE + "LocalQueue")),
             _named(run, BINDING)[acceptance.SERVICE_ACCOUNT].urn,
             _named(run, "kubernetes:core/v1:ConfigMap")[acceptance.JUDGE_CONFIGMAP].urn}
    for check in run.of_type(CRONJOB):
        assert needs <= set(check.dependencies), check.name
    for check in _checks(run, "across-nodes-start"):     # and for the right to start the MPIJob
        assert _named(run, BINDING)[acceptance.SCHEDULER_SERVICE_ACCOUNT].urn in check.dependencies


def test_the_shipped_stacks_nvlink_checks(stack_runs):
    def checks(stack):
        return {c.inputs["metadata"]["labels"]["gpu-cloud.io/pool"]: c.inputs["spec"]["suspend"]
                for c in _checks(stack_runs[stack], "within-node")}
    # prod-us-east-1 schedules the check: it runs on the reserved H100s (4 standing nodes); the A100 spot pools scale
    # from zero, so their checks wait to be run by hand.
    assert checks("prod-us-east-1") == {"train-h100": False, "finetune-a100-80gb-spot": True,
                                        "finetune-a100-40gb-spot": True}
    assert checks("prod-eu-west-1") == {"train-a100": True}
    assert checks("dev") == {}


def test_the_shipped_stacks_across_node_checks(stack_runs):
    # Only prod-us-east-1's reserved H100s keep two nodes (4) on EFA; on its default weekly slot. prod-eu-west-1's
    # A100 EFA pool scales from zero, dev has no EFA pool: neither gets a check, nor the account that starts one.
    [check] = _checks(stack_runs["prod-us-east-1"], "across-nodes-start")
    assert (check.inputs["metadata"]["name"], check.inputs["spec"]["schedule"]) == (
        "nccl-efa-start-train-h100", "0 6 * * 0")
    for stack in ("prod-eu-west-1", "dev"):
        assert _checks(stack_runs[stack], "across-nodes-start") == []
        assert acceptance.SCHEDULER_SERVICE_ACCOUNT not in _named(stack_runs[stack], "kubernetes:core/v1:ServiceAccount")


# --- validity and structure -------------------------------------------------------------------------------

def test_objects_created_directly_are_valid_kubernetes_1_35(run, stack_runs):
    # kueue-system and the test's own namespace, the judge ConfigMap, ServiceAccount, Role, RoleBinding, 5 NVLink
    # CronJobs, the across-node CronJob and its starter's ServiceAccount, Role, RoleBinding, the webhook probe's
    # ConfigMap, ServiceAccount, ClusterRole, ClusterRoleBinding and Job; every object of the MPI Operator's and
    # JobSet's release manifests (9 and 20, their CRDs and webhook configurations included).
    assert validate_kubernetes(run, "1.35") == 2 + 4 + len(CHECKED) + 4 + 5 + 9 + 20
    for stack in stack_runs.values():
        validate_kubernetes(stack, "1.35")


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one("gpu-cloud:training:TrainingQueue", "training")
    children = run.children_of(component.urn)
    # flavors, the capacity blocks' admission check, the ClusterQueue, its LocalQueues and priority classes; the
    # judge's ConfigMap, account, Role and binding; the NVLink CronJobs; the across-node CronJob and its starter's
    # account, Role and binding.
    assert len(children) == len(FLAVORS) + 1 + 1 + len(kueue.LOCAL_QUEUES) + len(kueue.PRIORITY_CLASSES) + 4 \
        + len(CHECKED) + 4
    assert all(r.name.startswith("training-") for r in children)
    operators = run.one("gpu-cloud:training:TrainingOperators", "training-operators")
    children = run.children_of(operators.urn)
    # the MPI Operator's and JobSet's manifests, kueue-system, Kueue; the probe's ConfigMap, account, ClusterRole,
    # binding and Job
    assert len(children) == 4 + 5 and all(r.name.startswith("training-operators-") for r in children)


def test_a_stack_without_queue_pools_installs_no_queue():
    pools = [{**p, "workload": "inference"} for p in stack_config("dev")["gpu-cloud:nodePools"]]
    result = run_stack("dev", {"gpu-cloud:nodePools": pools})
    assert not result.of_type("gpu-cloud:training:TrainingQueue")
    assert not result.of_type("gpu-cloud:training:TrainingOperators")
    assert any("no training queue" in w for w in result.warnings)


# --- waiting for Kueue's webhooks -------------------------------------------------------------------------------
def test_the_webhook_probe_is_a_job_pulumi_waits_for_with_a_stated_timeout(run):
    """pulumi-kubernetes waits for a Job until its Complete condition (the Job resource's documented await), up to
    the create timeout: past the Job's own deadline, so a probe that gives up fails the up with its own reason."""
    job = run.one(JOB)
    assert job.inputs["metadata"]["name"] == kueue.WEBHOOK_PROBE and job.inputs["metadata"]["namespace"] == kueue.NAMESPACE
    assert job.custom_timeouts == {"create": f"{kueue.WEBHOOK_PROBE_TIMEOUT_S}s", "update": f"{kueue.WEBHOOK_PROBE_TIMEOUT_S}s"}
    deadline = job.inputs["spec"]["activeDeadlineSeconds"]
    assert kueue.WEBHOOK_PROBE_DEADLINE_S < deadline < kueue.WEBHOOK_PROBE_TIMEOUT_S == 600
    assert job.delete_before_replace          # a new Kueue version replaces the Job under its fixed name
    # A probe that failed is replaced by the next `pulumi up`, not waited on again: pulumi-kubernetes keeps awaiting
    # an unready resource without it (the Job's docstring in the pinned pulumi-kubernetes 4.34.2).
    assert job.inputs["metadata"]["annotations"] == {"pulumi.com/replaceUnready": "true"}
    assert '"pulumi.com/replaceUnready": "true" annotation' in inspect.getsource(kubernetes.batch.v1.Job)
    pod = job.inputs["spec"]["template"]
    assert pod["metadata"]["labels"]["kueue-version"] == charts.chart(charts.KUEUE).app_version
    # On the system nodes, tolerating their taint, as Kueue's manager.
    assert {key: pod["spec"][key] for key in ("nodeSelector", "tolerations")} == system_placement(SYSTEM_NODE_LABELS)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["DEADLINE_SECONDS"] == str(kueue.WEBHOOK_PROBE_DEADLINE_S)
    script = next(r for r in run.of_type("kubernetes:core/v1:ConfigMap")
                  if r.inputs["metadata"]["name"] == kueue.WEBHOOK_PROBE)
    assert script.inputs["data"][kueue.WEBHOOK_PROBE_SCRIPT_KEY] == kueue.WEBHOOK_PROBE_SCRIPT.read_text()
    assert script.urn in job.dependencies


def test_the_probe_may_create_resourceflavors_and_nothing_else(run):
    role = next(r for r in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
                if r.inputs["metadata"]["name"] == kueue.WEBHOOK_PROBE)
    assert role.inputs["rules"] == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"],
                                     "verbs": ["create"]}]
    binding = next(r for r in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
                   if r.inputs["metadata"]["name"] == kueue.WEBHOOK_PROBE)
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": kueue.WEBHOOK_PROBE,
                                           "namespace": kueue.NAMESPACE}]
    assert binding.urn in run.one(JOB).dependencies


def test_the_training_namespaces_half_is_registered_once():
    """TrainingQueue.serve registers the LocalQueues and the checks, then the outputs: a second call would register
    them twice under the same names, so it is refused."""
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        opts = pulumi.ResourceOptions(providers={"kubernetes": k8s})
        operators = TrainingOperators("training-operators", TrainingOperatorsArgs(driver_source="ami"), opts=opts)
        queue = TrainingQueue("training", TrainingQueueArgs.for_pools(
            ALL_POOLS, catalog, operators=operators, nvlink_schedule=None, across_node_schedule="0 6 * * 0"),
            opts=opts)
        queue.serve("training")
        queue.serve("training")

    with pytest.raises(Exception, match="already serves its namespace"):
        run_component(build)
