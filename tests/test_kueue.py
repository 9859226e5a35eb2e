"""The training queue as values (spec/kueue.py): flavors per capacity type in admission order, quotas from the
pools, spot only for interruptible jobs, Kueue's configuration and chart values. The component: test_training.py."""
from __future__ import annotations

import re
from typing import Any, Dict, Set

import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from spec import boot, charts, kueue
from spec.catalog import load_catalog
from spec.model import NodePool
from spec.pools import DEFAULT_PRIORITY, GPU_TAINT, INTERRUPTIBLE_TAINT, QUEUE_FLAVOR_LABEL, Taint, node_labels, \
    node_taints
from spec.validate import ResolvedPool
from tests import upstream_records
from tests.chart_values import assert_values_confirmed, merged_values
from tests.conftest import STACKS

catalog = load_catalog()
GPU, EFA = "nvidia.com/gpu", kueue.EFA_RESOURCE
RELEASE, CONFIG_FILE = "kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile"
KUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:"


def pool(name, instance_type, capacity, workload="training", max_nodes=2, sharing=None, efa=False) -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": capacity, "minNodes": 0, "desiredNodes": 0,
        "maxNodes": max_nodes, "workload": workload, "gpuSharing": sharing or {"mode": "none"}})
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


def by_name(flavors=FLAVORS) -> Dict[str, kueue.Flavor]:
    return {f.name: f for f in flavors}


# --- flavors, order and quotas ----------------------------------------------------------------------------

def test_flavors_go_paid_for_then_spot_then_on_demand():
    assert [f.name for f in FLAVORS] == ["training-reserved", "training-capacity-block", "training-spot",
                                         "training-on-demand"]


def test_the_queue_order_is_the_autoscalers_order():
    # Kueue picks the flavor, cluster-autoscaler the node group: they must agree on what comes first.
    weights = [DEFAULT_PRIORITY[f.capacity] for f in FLAVORS]
    assert weights == sorted(weights, reverse=True)


def test_inference_pools_are_not_in_the_queue():
    assert all("infer-l40s" not in f.pools for f in FLAVORS)
    assert by_name()["training-on-demand"].pools == ("od-a100",)


@pytest.mark.parametrize("flavor,quotas", [
    # reserved: 2 x p5 (8 GPUs, 32 EFA) and 1 p4de cut into 7 x 1g.10gb per GPU.
    ("training-reserved", {GPU: 16, EFA: 64, "nvidia.com/mig-1g.10gb": 56}),
    ("training-capacity-block", {GPU: 32, EFA: 128}),
    # spot: 2 x p5 (8) + 5 x g6.12xlarge (4 GPUs x 3 time-slicing replicas); no EFA (both pools without it).
    ("training-spot", {GPU: 16 + 60}),
    ("training-on-demand", {GPU: 24, EFA: 12}),
])
def test_quotas_are_what_the_flavors_pools_offer_at_max_nodes(flavor, quotas):
    assert dict(by_name()[flavor].quotas) == quotas


def test_only_the_spot_flavor_requires_a_toleration_and_every_flavor_adds_the_gpu_one():
    for flavor in FLAVORS:
        expected = (Taint(*INTERRUPTIBLE_TAINT),) if flavor.capacity == "spot" else ()
        assert flavor.node_taints == expected, flavor.name
        assert flavor.tolerations == (Taint(*GPU_TAINT),), flavor.name
        # Kueue would add a toleration listed in .spec.tolerations and then ignore the matching nodeTaint.
        assert not set(flavor.node_taints) & set(flavor.tolerations), flavor.name


def test_spot_nodes_carry_the_interruptible_taint_and_no_other_capacity_does():
    for p in POOLS:
        assert (Taint(*INTERRUPTIBLE_TAINT) in node_taints(p)) == (p.spec.capacity == "spot"), p.spec.name


def test_queue_pools_label_their_nodes_with_their_flavor_and_inference_pools_do_not():
    for p in POOLS:
        label = node_labels(p).get(QUEUE_FLAVOR_LABEL)
        assert label == (None if p.spec.workload == "inference" else f"training-{p.spec.capacity}"), p.spec.name
    for flavor in FLAVORS:
        assert flavor.node_labels == {QUEUE_FLAVOR_LABEL: flavor.name}


def test_no_queue_pools_means_no_flavors_and_no_queue():
    assert kueue.flavors([p for p in POOLS if p.spec.workload == "inference"], catalog) == ()
    with pytest.raises(ValueError, match="no training or general pool"):
        kueue.cluster_queue_spec(())


# --- the ClusterQueue -------------------------------------------------------------------------------------

def test_every_flavor_lists_every_covered_resource_in_the_same_order():
    group, = kueue.cluster_queue_spec(FLAVORS)["resourceGroups"]
    covered = group["coveredResources"]
    assert covered == sorted([EFA, GPU, "nvidia.com/mig-1g.10gb"])
    for flavor in group["flavors"]:
        assert [r["name"] for r in flavor["resources"]] == covered, flavor["name"]
    spot = next(f for f in group["flavors"] if f["name"] == "training-spot")
    assert {r["name"]: r["nominalQuota"] for r in spot["resources"]} == {EFA: 0, GPU: 76, "nvidia.com/mig-1g.10gb": 0}


def test_only_the_training_namespace_submits_to_the_cluster_queue():
    assert kueue.cluster_queue_spec(FLAVORS)["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "training"}}
    assert kueue.local_queue_spec() == {"clusterQueue": kueue.CLUSTER_QUEUE}


def test_each_shipped_stacks_queue_order_and_quotas(stack_runs):
    expected = {
        "prod-us-east-1": [("training-reserved", {EFA: 128, GPU: 32}), ("training-spot", {EFA: 0, GPU: 48})],
        "prod-eu-west-1": [("training-on-demand", {EFA: 16, GPU: 32})],
        "dev": [("training-spot", {GPU: 12})],
    }
    assert set(expected) == set(STACKS)
    for stack, flavors in expected.items():
        group, = stack_runs[stack].one(KUEUE_TYPE + "ClusterQueue").inputs["spec"]["resourceGroups"]
        assert [(f["name"], {r["name"]: r["nominalQuota"] for r in f["resources"]})
                for f in group["flavors"]] == flavors, stack


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


def test_kueue_manages_jobs_and_mpijobs_and_only_quotas_gpus_and_efa():
    config = kueue.manager_configuration("ami")
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/mpijob"]
    assert config["resources"] == {"quotaCheckStrategy": "IgnoreUndeclared"}
    assert config["manageJobsWithoutQueueName"] is False
    # Its job webhooks (failurePolicy Fail) see the training namespace only, where its LocalQueue is.
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "training"}}


def _configuration_fields() -> Set[str]:
    """The JSON fields of Kueue v0.19.2's config API: from its source where it is mirrored, else from the record
    (tests/upstream/, checked against the source by test_upstream_records.py)."""
    recorded = upstream_records.record("kueue-configuration-fields.json")
    source = upstream_records.show(recorded["repo"], recorded["tag"], recorded["path"])
    return upstream_records.go_json_fields(source) if source is not None else set(recorded["fields"])


def _keys(node: Any, skip_values_of=("frameworks", "managedJobsNamespaceSelector")) -> Set[str]:
    """Every key in the Configuration, but not inside framework names or Kubernetes types (a LabelSelector)."""
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


def test_kueue_values_are_in_the_pinned_chart_and_run_the_manager_on_system_nodes():
    values = kueue.kueue_values(SYSTEM_NODE_LABELS, "ami")
    assert_values_confirmed(values, charts.chart(charts.KUEUE), kueue.KUEUE_VALUE_PATHS)
    assert values["controllerManager"]["nodeSelector"] == SYSTEM_NODE_LABELS
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


def test_a_manifest_url_off_its_pinned_tag_is_refused():
    with pytest.raises(ValueError, match="not at the pinned tag"):
        charts.ManifestPin(url="https://raw.githubusercontent.com/kubeflow/mpi-operator/master/deploy/x.yaml",
                           version="v0.8.0", source="test")
