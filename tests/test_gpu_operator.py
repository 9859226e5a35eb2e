"""components/gpu_operator.py under the mock engine, and the pure decisions in spec/gpu_operator.py.

What users rely on: the pinned GPU operator leaves the node image's driver and container toolkit alone; a
time-sliced pool's nodes get exactly the replicas the pool asks for, and every other node whole GPUs; a MIG pool's
profile is one the MIG manager can cut, into as many instances as the autoscaler and the quotas count, and the MIG
manager never reboots a node; the EFA device plugin exists only when some pool has EFA, runs only on EFA nodes, and
is new enough not to hand out a p6-b200's NVLink controllers; every operand reaches every GPU node whatever taints
its pool adds; every Helm value set is one the pinned chart has; the ConfigMap exists before the operator reads it.

The value paths are checked against each chart's own values.yaml at the pinned version, read from the project's
reference data beside the checkout (../shared/chartvalues/values/<chart>-<version>.yaml, taken with `git show` at
the release tag; never copied into the repository). Where that reference data is not on the machine, those tests
skip and the file:line records in spec/gpu_operator.py stand as the confirmation.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from components.gpu_operator import GpuOperator, GpuOperatorArgs
from spec import charts, dcgm, gpu_operator, monitoring
from spec.catalog import load_catalog
from spec.model import NodePool
from spec.pools import Taint, mig_resource, node_labels, node_taints, offered_gpu_resources
from spec.validate import ResolvedPool
from tests.chart_values import assert_values_confirmed, values_file
from tests.conftest import run_component, validate_kubernetes

COMPONENT = "gpu-cloud:gpu_operator:GpuOperator"
NAMESPACE = "kubernetes:core/v1:Namespace"
CONFIGMAP = "kubernetes:core/v1:ConfigMap"
RELEASE = "kubernetes:helm.sh/v3:Release"
K8S_PROVIDER = "pulumi:providers:kubernetes"

catalog = load_catalog()
BATCH_TAINT = {"key": "example.com/batch", "value": "true", "effect": "NoSchedule"}
DEDICATED_TAINT = {"key": "example.com/dedicated", "value": "", "effect": "NoExecute"}


def gpu_pool(name: str, instance_type: str, sharing=None, efa: bool = False, taints=()) -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": "on-demand", "minNodes": 0, "desiredNodes": 0,
        "maxNodes": 2, "workload": "general", "gpuSharing": sharing or {"mode": "none"}, "taints": list(taints)})
    return ResolvedPool(spec=spec, types=(catalog.instance_types[instance_type],), efa=efa)


# Two pools share replicas 3 (one config for both), one asks for 4; two MIG pools on different GPUs; pools add
# their own taints; one EFA pool.
POOLS = (
    gpu_pool("train-h100", "p5.48xlarge", efa=True),
    gpu_pool("infer-l40s", "g6e.12xlarge", {"mode": "time-slicing", "replicas": 3}, taints=[BATCH_TAINT]),
    gpu_pool("infer-l4", "g6.12xlarge", {"mode": "time-slicing", "replicas": 3}),
    gpu_pool("dev-l4", "g6.12xlarge", {"mode": "time-slicing", "replicas": 4}, taints=[DEDICATED_TAINT]),
    gpu_pool("mig-a100", "p4de.24xlarge", {"mode": "mig", "migProfile": "1g.10gb"}),
    gpu_pool("mig-h200", "p5e.48xlarge", {"mode": "mig", "migProfile": "3g.71gb"}),
)
NO_EFA_POOLS = tuple(pool for pool in POOLS if not pool.efa)


def _build(pools=POOLS):
    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        GpuOperator("gpu", GpuOperatorArgs.for_pools(pools), opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
    return build


@pytest.fixture(scope="module")
def run():
    return run_component(_build())


@pytest.fixture(scope="module")
def run_without_efa():
    return run_component(_build(NO_EFA_POOLS))


def _release(run, chart: str):
    found = [r for r in run.of_type(RELEASE) if r.inputs["chart"] == chart]
    assert len(found) == 1, f"expected one {chart} release, found {[r.name for r in found]}"
    return found[0]


def _operator_values(run) -> Dict[str, Any]:
    return _release(run, "gpu-operator").inputs["values"]


def _efa_values(run) -> Dict[str, Any]:
    return _release(run, "aws-efa-k8s-device-plugin").inputs["values"]


def _device_plugin_configs(run) -> Dict[str, Dict[str, Any]]:
    return {key: yaml.safe_load(text) for key, text in run.one(CONFIGMAP, "gpu-device-plugin-config").inputs["data"].items()}


def _tolerates(tolerations: List[Mapping[str, str]], taint: Taint) -> bool:
    """Kubernetes' toleration matching (core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.effect):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint.key:
                return True
        elif t.get("key") == taint.key and t.get("value", "") == taint.value:
            return True
    return False


# --- the releases -----------------------------------------------------------------------------------------

def test_operator_release_is_the_pinned_chart_from_ngc(run):
    release = _release(run, "gpu-operator")
    pin = charts.chart(charts.GPU_OPERATOR)
    assert pin.version == "v26.7.0"
    assert release.inputs["version"] == pin.version
    assert release.inputs["repositoryOpts"]["repo"] == "https://helm.ngc.nvidia.com/nvidia"
    assert release.inputs["namespace"] == "gpu-operator" == run.one(NAMESPACE).inputs["metadata"]["name"]
    assert release.provider.startswith(run.one(K8S_PROVIDER).urn), "must deploy with the caller's cluster provider"


def test_efa_plugin_is_pinned_from_eks_charts_and_new_enough_for_p6_b200(run):
    release = _release(run, "aws-efa-k8s-device-plugin")
    pin = charts.chart(charts.EFA_DEVICE_PLUGIN)
    assert release.inputs["version"] == pin.version == "v0.5.30"
    assert release.inputs["repositoryOpts"]["repo"] == "https://aws.github.io/eks-charts"
    assert release.inputs["namespace"] == "kube-system"
    # Older than 0.5.10, the plugin counts a p6-b200's two NVLink controllers as EFA devices.
    assert gpu_operator.release_tuple(pin.version) >= (0, 5, 10)
    assert gpu_operator.release_tuple(pin.app_version) >= (0, 5, 10)


@pytest.mark.parametrize("version,app_version", [("v0.5.9", "v0.5.20"), ("v0.5.30", "v0.5.6")])
def test_an_efa_plugin_older_than_0_5_10_is_refused(version, app_version):
    pin = charts.chart(charts.EFA_DEVICE_PLUGIN).model_copy(update={"version": version, "app_version": app_version})
    with pytest.raises(ValueError, match="NVLink"):
        gpu_operator.checked_efa_plugin_pin(pin)


def test_driver_and_toolkit_are_left_to_the_node_image(run):
    values = _operator_values(run)
    assert values["driver"]["enabled"] is False
    assert values["toolkit"]["enabled"] is False


def test_the_operands_the_platform_needs_are_on(run):
    values = _operator_values(run)
    assert values["devicePlugin"]["enabled"] is True
    assert values["migManager"]["enabled"] is True
    assert values["dcgmExporter"]["enabled"] is True
    assert values["nfd"]["enabled"] is True
    assert values["nodeStatusExporter"]["enabled"] is True       # the validator's verdict, as metrics
    # The validator has no switch in the chart: it is on as long as nothing under `validator` is set.
    assert "validator" not in values


# --- time-slicing -----------------------------------------------------------------------------------------

def test_time_slicing_configs_exist_only_for_the_replicas_pools_ask_for(run):
    configs = _device_plugin_configs(run)
    assert set(configs) == {"default", "time-slicing-3", "time-slicing-4"}
    for replicas in (3, 4):
        sharing = configs[f"time-slicing-{replicas}"]["sharing"]["timeSlicing"]
        assert sharing["resources"] == [{"name": "nvidia.com/gpu", "replicas": replicas}]
        assert sharing["renameByDefault"] is False, "replicas must stay nvidia.com/gpu, the resource quotas count"
        assert sharing["failRequestsGreaterThanOne"] is True
    assert configs["default"] == {"version": "v1"}, "nodes without the label get whole GPUs"
    assert all(config["version"] == "v1" for config in configs.values())


def test_each_time_slicing_pool_selects_its_own_config_by_label(run):
    # A node selects its config by label; what the plugin then advertises must be what the autoscaler's node
    # templates and the quotas count (spec.pools.offered_gpu_resources).
    configs = _device_plugin_configs(run)
    for pool in POOLS:
        selected = node_labels(pool).get("nvidia.com/device-plugin.config", "default")
        if pool.spec.gpu_sharing.mode == "time-slicing":
            (resource,) = configs[selected]["sharing"]["timeSlicing"]["resources"]
            assert offered_gpu_resources(pool, catalog) == {
                resource["name"]: pool.gpus_per_node * resource["replicas"]}, pool.name
        else:
            assert selected == "default", f"{pool.name} must not be time-sliced"


def test_without_time_slicing_pools_only_the_default_config_exists():
    run = run_component(_build(tuple(p for p in POOLS if p.spec.gpu_sharing.mode != "time-slicing")))
    assert set(_device_plugin_configs(run)) == {"default"}


def test_device_plugin_reads_the_configmap_created_before_the_release(run):
    release = _release(run, "gpu-operator")
    configmap = run.one(CONFIGMAP, "gpu-device-plugin-config")
    config = _operator_values(run)["devicePlugin"]["config"]
    assert config["create"] is False, "the program owns the ConfigMap"
    assert config["name"] == configmap.inputs["metadata"]["name"]
    assert configmap.inputs["metadata"]["namespace"] == release.inputs["namespace"]
    assert config["default"] in configmap.inputs["data"]
    assert configmap.urn in release.dependencies, "the config-manager fails on a config it cannot read"
    assert run.one(NAMESPACE).urn in release.dependencies


@pytest.mark.parametrize("replicas", [(1,), (0,), (True,), ("4",)])
def test_replicas_the_device_plugin_would_refuse_are_refused(replicas):
    with pytest.raises(ValueError, match="at least 2"):
        gpu_operator.device_plugin_configs(replicas)


# --- MIG --------------------------------------------------------------------------------------------------

def test_mig_strategy_is_mixed_so_each_profile_is_its_own_resource(run):
    assert _operator_values(run)["mig"]["strategy"] == "mixed"
    for pool in (p for p in POOLS if p.spec.gpu_sharing.mode == "mig"):
        assert set(offered_gpu_resources(pool, catalog)) == {mig_resource(pool.spec.gpu_sharing.mig_profile)}


def test_every_mig_profile_pools_use_is_a_config_the_mig_manager_cuts():
    for pool in (p for p in POOLS if p.spec.gpu_sharing.mode == "mig"):
        config = node_labels(pool)["nvidia.com/mig.config"]
        profile = pool.spec.gpu_sharing.mig_profile
        assert config == f"all-{profile}"
        assert profile in gpu_operator.MIG_MANAGER_PARTITIONS[pool.primary_type.gpu.model], pool.name


@pytest.mark.parametrize("model", sorted(m for m, gpu in catalog.gpus.items() if gpu.mig_profiles))
def test_the_mig_manager_cuts_what_the_catalog_counts(model):
    # The catalog's counts size scale-from-zero templates and team quotas; the MIG manager's `all-<profile>`
    # decides what a node actually offers. Every catalog profile must be one it knows, with the same count.
    assert gpu_operator.MIG_MANAGER_PARTITIONS[model] == dict(catalog.gpus[model].mig_profiles)


def test_mig_manager_never_reboots_and_leaves_other_gpus_whole(run):
    mig_manager = _operator_values(run)["migManager"]
    assert {"name": "WITH_REBOOT", "value": "false"} in mig_manager["env"]
    assert mig_manager["config"]["default"] == "all-disabled"
    assert "name" not in mig_manager["config"], "a custom config would turn off mig-manager's own discovery"


# --- EFA --------------------------------------------------------------------------------------------------

def test_efa_plugin_only_when_some_pool_has_efa(run, run_without_efa):
    assert len(run.of_type(RELEASE)) == 2
    assert [r.inputs["chart"] for r in run_without_efa.of_type(RELEASE)] == ["gpu-operator"]


def test_efa_plugin_runs_only_on_efa_nodes(run):
    selector = _efa_values(run)["nodeSelector"]
    for pool in POOLS:
        labels = node_labels(pool)
        matches = all(labels.get(key) == value for key, value in selector.items())
        assert matches == pool.efa, f"{pool.name}: efa={pool.efa}, selector {selector}"


def test_every_efa_capable_catalog_type_is_in_the_efa_charts_allowlist():
    # The chart adds a required node affinity on instance type: a type missing there never gets the plugin.
    values = yaml.safe_load(values_file(charts.chart(charts.EFA_DEVICE_PLUGIN)).read_text())
    allowed = set(values["supportedInstanceLabels"]["values"])
    assert values["supportedInstanceLabels"]["keys"] == ["node.kubernetes.io/instance-type"]
    missing = sorted(name for name, itype in catalog.instance_types.items() if itype.supports_efa and name not in allowed)
    assert not missing, f"the EFA chart would not schedule on {missing}"


# --- where things run -------------------------------------------------------------------------------------

def test_every_operand_tolerates_every_gpu_node_taint(run):
    values, efa = _operator_values(run), _efa_values(run)
    lists = {"daemonsets.tolerations": values["daemonsets"]["tolerations"],
             "node-feature-discovery.worker.tolerations": values["node-feature-discovery"]["worker"]["tolerations"],
             "EFA plugin tolerations": efa["tolerations"]}
    for pool in POOLS:
        for taint in node_taints(pool):
            for where, tolerations in lists.items():
                assert _tolerates(tolerations, taint), f"{where} does not tolerate {taint} of pool {pool.name}"


def test_gpu_node_taints_start_with_the_gpu_taint_and_list_each_once():
    taints = gpu_operator.gpu_node_taints(POOLS)
    assert taints[0] == Taint("nvidia.com/gpu", "true", "NoSchedule")
    assert len(set(taints)) == len(taints) == 3
    with pytest.raises(ValueError, match="GPU taint"):
        gpu_operator.operator_values(taints[1:], SYSTEM_NODE_LABELS)


def test_operator_runs_on_the_system_nodes(run):
    assert _operator_values(run)["operator"]["nodeSelector"] == {"gpu-cloud.io/node-role": "system"} == SYSTEM_NODE_LABELS


def test_args_from_pools():
    args = GpuOperatorArgs.for_pools(POOLS)
    assert args.time_slicing_replicas == (3, 4)
    assert args.efa is True and GpuOperatorArgs.for_pools(NO_EFA_POOLS).efa is False
    assert args.node_taints == gpu_operator.gpu_node_taints(POOLS)


# --- values exist in the pinned charts, objects in Kubernetes 1.35 ----------------------------------------

@pytest.mark.parametrize("chart,values_of,confirmed", [
    (charts.GPU_OPERATOR, _operator_values, gpu_operator.GPU_OPERATOR_VALUE_PATHS),
    (charts.EFA_DEVICE_PLUGIN, _efa_values, gpu_operator.EFA_PLUGIN_VALUE_PATHS),
])
def test_every_value_the_program_sets_is_in_the_pinned_values_file(run, chart, values_of, confirmed):
    values = copy.deepcopy(values_of(run))
    if chart == charts.GPU_OPERATOR:     # documented in a comment only: held below
        del values["dcgmExporter"]["config"]
        del values["operator"]["metrics"]
    assert_values_confirmed(values, charts.chart(chart), confirmed)


def test_the_counter_file_value_is_documented_by_the_chart_and_names_the_configmap_made(run):
    lines = values_file(charts.chart(charts.GPU_OPERATOR)).read_text().splitlines()
    line, _template = gpu_operator.GPU_OPERATOR_COMMENTED_VALUE_PATHS["dcgmExporter.config.name"]
    assert lines[line - 2].strip() == "# config:" and lines[line - 1].strip().startswith("# name:")
    assert lines[line - 3].strip().startswith("#") and "dcgmExporter:" in "\n".join(lines[line - 60:line])
    assert _operator_values(run)["dcgmExporter"]["config"] == {"name": dcgm.CONFIGMAP}
    (configmap,) = [r for r in run.of_type(CONFIGMAP) if r.inputs["metadata"]["name"] == dcgm.CONFIGMAP]
    assert configmap.inputs["metadata"]["namespace"] == gpu_operator.NAMESPACE
    assert configmap.inputs["data"] == {"dcgm-metrics.csv": dcgm.metrics_csv()}
    assert configmap.urn in _release(run, "gpu-operator").dependencies


def test_dcgm_series_are_labelled_with_their_node_and_selected_by_prometheus(run):
    monitor = _operator_values(run)["dcgmExporter"]["serviceMonitor"]
    assert monitor["additionalLabels"] == dict(monitoring.SELECTOR_LABELS)
    assert monitor["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                                       "action": "replace"}]


def test_the_operators_own_service_monitor_is_labelled_for_prometheus_by_the_value_the_chart_documents(run):
    lines = values_file(charts.chart(charts.GPU_OPERATOR)).read_text().splitlines()
    line, _template = gpu_operator.GPU_OPERATOR_COMMENTED_VALUE_PATHS["operator.metrics.serviceMonitor.additionalLabels"]
    assert [text.strip() for text in lines[line - 5:line]] == [
        "# metrics:", "#   serviceMonitor:", "#     interval: 15s", "#     honorLabels: false", "#     additionalLabels: {}"]
    top_level = [text for text in lines[:line] if text[:1].isalpha()]
    assert top_level[-1] == "operator:"                      # the comment sits in the operator's section
    assert _operator_values(run)["operator"]["metrics"] == {
        "serviceMonitor": {"additionalLabels": dict(monitoring.SELECTOR_LABELS)}}


def test_every_object_created_directly_is_valid_kubernetes_1_35(run, run_without_efa):
    assert validate_kubernetes(run, "1.35") == 3          # the namespace and the two ConfigMaps
    assert validate_kubernetes(run_without_efa, "1.35") == 3


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one(COMPONENT, "gpu")
    children = run.children_of(component.urn)
    strays = [r.name for r in run.resources if r.parent != component.urn and r.urn != component.urn
              and r.type != K8S_PROVIDER]
    assert not strays, f"registered outside the component: {strays}"
    assert len(children) == 5 and all(r.name.startswith("gpu-") for r in children)
