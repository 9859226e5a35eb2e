"""components/platform/gpu_operator.py under the mock engine, and the pure decisions in
decisions/platform/gpu_operator.py.

What users rely on: the pinned GPU operator leaves the node image's driver and container toolkit alone; a
time-sliced or MPS pool's nodes get exactly the replicas the pool asks for (MPS: each a 1/N share of memory and
compute, under a MIG strategy the plugin accepts with MPS), and every other node whole GPUs; a MIG pool's GPUs are
cut into its layout, one profile or a mix, into as many instances as the autoscaler and the quotas count, and the MIG
manager never reboots a node; the EFA device plugin exists only when some pool has EFA, runs only on EFA nodes, and
is new enough not to hand out a p6-b200's NVLink controllers; every operand reaches every GPU node whatever taints
its pool adds; every Helm value set is one the pinned chart has; the ConfigMap exists before the operator reads it.

The value paths are checked against each chart's own values.yaml at the pinned version, recorded from the chart's
repository at its release tag in tests/upstream/chart-values/ (scripts/upstream_records.py; tests/chart_values.py).
"""
from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Set

import pulumi
import pulumi_kubernetes as kubernetes
import pytest
import yaml

from components.cluster import SYSTEM_NODE_LABELS
from components.platform.gpu_operator import GpuOperator, GpuOperatorArgs
from decisions.catalog import charts
from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool, load_stack_spec
from decisions.nodes.pods import tolerates
from decisions.nodes.pools import Taint, mig_layout, mig_resource, node_labels, node_taints, offered_gpu_resources
from decisions.observability import dcgm, monitoring
from decisions.platform import gpu_operator, tenancy
from plan.stackfile import project_keys
from tests import upstream_records
from tests.chart_values import assert_values_confirmed, merged_values, values_file
from tests.conftest import run_component, run_stack, stack_config, validate_kubernetes

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


# Two pools share replicas 3 (one config for both), one asks for 4; one MPS pool; three MIG pools on different GPUs,
# one of them mixing profiles; pools add their own taints; one EFA pool.
POOLS = (
    gpu_pool("train-h100", "p5.48xlarge", efa=True),
    gpu_pool("infer-l40s", "g6e.12xlarge", {"mode": "time-slicing", "replicas": 3}, taints=[BATCH_TAINT]),
    gpu_pool("infer-l4", "g6.12xlarge", {"mode": "time-slicing", "replicas": 3}),
    gpu_pool("dev-l4", "g6.12xlarge", {"mode": "time-slicing", "replicas": 4}, taints=[DEDICATED_TAINT]),
    gpu_pool("share-a100", "p4de.24xlarge", {"mode": "mps", "replicas": 8}),
    gpu_pool("mig-a100", "p4de.24xlarge", {"mode": "mig", "migProfile": "1g.10gb"}),
    gpu_pool("mig-h200", "p5e.48xlarge", {"mode": "mig", "migProfile": "3g.71gb"}),
    gpu_pool("mig-h100-mixed", "p5.48xlarge", {"mode": "mig", "migProfiles": {"1g.10gb": 2, "3g.40gb": 1}}),
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


def _mig_manager_config(run) -> Dict[str, Any]:
    (text,) = run.one(CONFIGMAP, "gpu-mig-config").inputs["data"].values()
    return yaml.safe_load(text)


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


# --- time-slicing and MPS: the device plugin's configs ------------------------------------------------------

# The device plugin's config v1 at the tag the operator pins (values.yaml devicePlugin.version v0.20.0): the JSON
# names each file's structs declare. api/config/v1/config.go lines 34-40 (Config), sharing.go lines 20-25
# (Sharing), replicas.go lines 29-34 and 80-86 (ReplicatedResources, ReplicatedResource); flags.go line 60 declares
# migStrategy among many flags. The tests read them from the record made from those sources.
PLUGIN_REPO, PLUGIN_TAG = "NVIDIA/k8s-device-plugin", "v0.20.0"
PLUGIN_FIELDS = {
    "api/config/v1/config.go": {"version", "flags", "resources", "sharing", "imex"},
    "api/config/v1/sharing.go": {"timeSlicing", "mps"},
    "api/config/v1/replicas.go": {"renameByDefault", "failRequestsGreaterThanOne", "resources", "name", "rename",
                                  "devices", "replicas"},
}
# mig-parted's config v1 at the MIG manager's tag (values.yaml migManager.version v0.15.0): api/spec/v1/spec.go
# lines 29-41 (Spec, MigConfigSpec).
MIG_PARTED_REPO, MIG_PARTED_TAG, MIG_PARTED_SPEC = "NVIDIA/mig-parted", "v0.15.0", "api/spec/v1/spec.go"
MIG_PARTED_FIELDS = {"version", "mig-configs", "device-filter", "devices", "mig-enabled", "mig-devices"}


def _go_fields(repo: str, tag: str, path: str) -> Set[str]:
    """The JSON names a Go file declares at its tag, as recorded from the source (tests/upstream_records.py)."""
    return upstream_records.recorded_go_fields(repo, tag, path)


def _plugin_config_mistakes(config: Mapping[str, Any]) -> List[str]:
    """What the plugin would not read as gpu-cloud means it, in one config entry."""
    fields = {path: _go_fields(PLUGIN_REPO, PLUGIN_TAG, path) for path in PLUGIN_FIELDS}
    mistakes = [f"unknown key {k}" for k in set(config) - fields["api/config/v1/config.go"]]
    if config.get("version") != "v1":                                   # config.go lines 128-134
        mistakes.append(f"version {config.get('version')!r}")
    flags = config.get("flags", {})
    mistakes += [f"unknown flag {k}" for k in set(flags) - {"migStrategy"}]
    if flags.get("migStrategy") not in ("none", "single", "mixed"):     # cmd/nvidia-device-plugin/main.go 244-250
        mistakes.append(f"migStrategy {flags.get('migStrategy')!r}")
    sharing = config.get("sharing", {})
    mistakes += [f"unknown sharing {k}" for k in set(sharing) - fields["api/config/v1/sharing.go"]]
    if len(sharing) > 1:                                                # sharing.go lines 36-45: MPS would win
        mistakes.append(f"two sharing strategies {sorted(sharing)}")
    for replicated in sharing.values():
        mistakes += [f"unknown key {k}" for k in set(replicated) - fields["api/config/v1/replicas.go"]]
        for resource in replicated.get("resources", []):
            mistakes += [f"unknown key {k}" for k in set(resource) - fields["api/config/v1/replicas.go"]]
            if not isinstance(resource.get("replicas"), int) or resource["replicas"] < 2:   # replicas.go 251-253
                mistakes.append(f"replicas {resource.get('replicas')!r}")
    return mistakes


def test_device_plugin_configs_exist_only_for_what_pools_ask_for_entry_by_entry(run):
    def shared(strategy: str, replicas: int, mig_strategy: str) -> Dict[str, Any]:
        return {"version": "v1", "flags": {"migStrategy": mig_strategy}, "sharing": {strategy: {
            "renameByDefault": False, "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}
    assert _device_plugin_configs(run) == {
        "default": {"version": "v1", "flags": {"migStrategy": "mixed"}},       # whole GPUs, or MIG instances
        "time-slicing-3": shared("timeSlicing", 3, "mixed"),
        "time-slicing-4": shared("timeSlicing", 4, "mixed"),
        # A replica stays nvidia.com/gpu (no .shared suffix), what the quotas and templates count; the plugin refuses
        # MPS under the mixed strategy (cmd/nvidia-device-plugin/main.go lines 227-230), and MPS GPUs have no MIG.
        "mps-8": shared("mps", 8, "none"),
    }


def test_every_device_plugin_config_is_one_the_plugin_reads(run):
    for name, config in _device_plugin_configs(run).items():
        assert not _plugin_config_mistakes(config), (name, _plugin_config_mistakes(config))
    # The check itself catches what the plugin would not read.
    assert _plugin_config_mistakes({"version": "v1", "flags": {"migStrategy": "mixed"},
                                    "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1,
                                                                       "memory": "10G"}]}}}) == [
        "unknown key memory", "replicas 1"]


def test_the_transcribed_schemas_are_the_sources():
    # The fields named beside the code above are the ones the record holds from the sources at their tags.
    for repo, tag, path, transcribed in [
            *((PLUGIN_REPO, PLUGIN_TAG, path, names) for path, names in PLUGIN_FIELDS.items()),
            (MIG_PARTED_REPO, MIG_PARTED_TAG, MIG_PARTED_SPEC, MIG_PARTED_FIELDS)]:
        assert _go_fields(repo, tag, path) == transcribed, f"{repo} {tag} {path}"
    assert "migStrategy" in _go_fields(PLUGIN_REPO, PLUGIN_TAG, "api/config/v1/flags.go")


def test_each_shared_pool_selects_its_own_config_by_label(run):
    # A node selects its config by label; what the plugin then advertises must be what the autoscaler's node
    # templates and the quotas count (decisions.nodes.pools.offered_gpu_resources).
    configs = _device_plugin_configs(run)
    key = {"time-slicing": "timeSlicing", "mps": "mps"}
    for pool in POOLS:
        selected = node_labels(pool).get("nvidia.com/device-plugin.config", "default")
        mode = pool.spec.gpu_sharing.mode
        if mode in key:
            assert selected == f"{mode}-{pool.spec.gpu_sharing.replicas}"
            (resource,) = configs[selected]["sharing"][key[mode]]["resources"]
            assert offered_gpu_resources(pool, catalog) == {
                resource["name"]: pool.gpus_per_node * resource["replicas"]}, pool.name
        else:
            assert selected == "default", f"{pool.name} must not be shared"


def test_without_shared_pools_only_the_default_config_exists():
    run = run_component(_build(tuple(p for p in POOLS if p.spec.gpu_sharing.mode in ("none", "mig"))))
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


@pytest.mark.parametrize("shared,words", [
    *(((("time-slicing", bad),), "at least 2") for bad in (1, 0, True, "4")),
    *(((("mps", bad),), "at least 2") for bad in (1, True)),
    ((("mps", 49),), "at most 48"),                 # the MPS server's client limit (mps/device.go lines 35-49)
    ((("timeslicing", 4),), "not a sharing mode"),
])
def test_replicas_the_device_plugin_would_refuse_are_refused(shared, words):
    with pytest.raises(ValueError, match=words):
        gpu_operator.device_plugin_configs(shared)


def test_the_mig_strategy_is_each_configs_so_mps_and_mig_share_a_cluster(run):
    # A cluster-wide strategy reaches the plugin as MIG_STRATEGY and overrides the file (module docstring of
    # decisions/platform/gpu_operator.py): left empty, the chart's ClusterPolicy has none (templates/clusterpolicy.yaml
    # lines 139-142), and each config says its own.
    values = _operator_values(run)
    assert values["mig"] == {"strategy": ""}
    assert merged_values(charts.chart(charts.GPU_OPERATOR), values)["mig"]["strategy"] == ""   # not the chart's single
    for name, config in _device_plugin_configs(run).items():
        assert config["flags"]["migStrategy"] == ("none" if "mps" in config.get("sharing", {}) else "mixed"), name


def test_the_mps_server_needs_no_value_of_its_own(run):
    # The operator deploys nvidia-device-plugin-mps-control-daemon with the device plugin, on MPS nodes, tolerating
    # daemonsets.tolerations, with the plugin's MPS root; the chart's root is the operator's default, so the
    # operator rewrites no volume (controllers/object_controls.go lines 184-185 and 1606-1618).
    assert "mps" not in _operator_values(run)["devicePlugin"]
    merged = merged_values(charts.chart(charts.GPU_OPERATOR), _operator_values(run))
    assert merged["devicePlugin"]["mps"] == {"root": "/run/nvidia/mps"}


# --- MIG --------------------------------------------------------------------------------------------------

def test_mig_strategy_is_mixed_so_each_profile_is_its_own_resource(run):
    assert _device_plugin_configs(run)["default"]["flags"]["migStrategy"] == "mixed"
    for pool in (p for p in POOLS if p.spec.gpu_sharing.mode == "mig"):
        assert set(offered_gpu_resources(pool, catalog)) == {mig_resource(p) for p in mig_layout(pool, catalog)}


def test_the_mig_managers_config_entry_by_entry(run):
    def cut(**instances):
        return [{"devices": "all", "mig-enabled": True, "mig-devices": instances}]
    assert _mig_manager_config(run) == {"version": "v1", "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],       # every GPU outside a MIG pool
        "1g.10gbx7": cut(**{"1g.10gb": 7}),                                 # mig-a100: migProfile, as many as fit
        "3g.71gbx2": cut(**{"3g.71gb": 2}),                                 # mig-h200
        "1g.10gbx2-3g.40gbx1": cut(**{"1g.10gb": 2, "3g.40gb": 1}),         # mig-h100-mixed: migProfiles
    }}


def test_the_mig_managers_config_is_one_mig_parted_reads(run):
    config = _mig_manager_config(run)
    fields = _go_fields(MIG_PARTED_REPO, MIG_PARTED_TAG, MIG_PARTED_SPEC)
    assert set(config) <= fields and config["version"] == "v1"
    for name, entries in config["mig-configs"].items():
        for entry in entries:
            assert set(entry) <= fields and entry["devices"] == "all", name
            # spec.go lines 173-179: instances only, and always, with MIG enabled.
            assert ("mig-devices" in entry) == entry["mig-enabled"], name
            assert all(isinstance(n, int) and n >= 1 for n in entry.get("mig-devices", {}).values()), name


def test_each_mig_pool_selects_the_layout_the_autoscaler_and_quotas_count(run):
    configs = _mig_manager_config(run)["mig-configs"]
    for pool in (p for p in POOLS if p.spec.gpu_sharing.mode == "mig"):
        (entry,) = configs[node_labels(pool)["nvidia.com/mig.config"]]
        assert offered_gpu_resources(pool, catalog) == {
            mig_resource(profile): pool.gpus_per_node * count for profile, count in entry["mig-devices"].items()}


def test_a_single_profile_pool_is_cut_as_nvidia_cuts_that_profile():
    for pool in (p for p in POOLS if p.spec.gpu_sharing.mig_profile):
        profile = pool.spec.gpu_sharing.mig_profile
        assert mig_layout(pool, catalog) == {
            profile: gpu_operator.MIG_MANAGER_PARTITIONS[pool.primary_type.gpu.model][profile]}, pool.name


@pytest.mark.parametrize("model", sorted(m for m, gpu in catalog.gpus.items() if gpu.mig_profiles))
def test_the_mig_manager_cuts_what_the_catalog_counts(model):
    # The catalog's counts size scale-from-zero templates, team quotas and a migProfile pool's layout; NVIDIA's own
    # `all-<profile>` configs cut the same. Every catalog profile must be one it knows, with the same count.
    assert gpu_operator.MIG_MANAGER_PARTITIONS[model] == dict(catalog.gpus[model].mig_profiles)


def test_mig_manager_never_reboots_and_reads_the_programs_config(run):
    mig_manager = _operator_values(run)["migManager"]
    assert {"name": "WITH_REBOOT", "value": "false"} in mig_manager["env"]
    assert mig_manager["config"] == {"default": "all-disabled", "name": "mig-parted-config"}
    configmap = run.one(CONFIGMAP, "gpu-mig-config")
    assert configmap.inputs["metadata"]["name"] == "mig-parted-config"
    assert configmap.inputs["metadata"]["namespace"] == gpu_operator.NAMESPACE
    assert list(configmap.inputs["data"]) == ["config.yaml"]          # the key the operator mounts
    assert mig_manager["config"]["default"] in _mig_manager_config(run)["mig-configs"]
    assert configmap.urn in _release(run, "gpu-operator").dependencies


def test_without_mig_pools_the_mig_manager_keeps_its_own_configs():
    # Its generated configs have `all-disabled`, all such a cluster needs; a config of the program's would replace them.
    run = run_component(_build(tuple(p for p in POOLS if p.spec.gpu_sharing.mode != "mig")))
    assert not [r for r in run.of_type(CONFIGMAP) if r.name == "gpu-mig-config"]
    assert _operator_values(run)["migManager"]["config"] == {"default": "all-disabled"}


# --- the design's "8 x 10 GB on an A100 80GB", planned ------------------------------------------------------
# MIG gives at most 7 (docs/gpu-platform.md); MPS with 8 replicas gives 8 clients, each limited to 1/8 of the
# memory. Planned on prod-us-east-1 with two pools added (the shipped stacks have no MPS or MIG pool): the MPS one,
# and a MIG pool cut 2 x 1g.10gb + 1 x 3g.40gb per GPU. That one is a p5 (H100): MIG on A100 is refused until the gate
# reboots for the GPU reset its mode needs (decisions/config/validate.py MIG_NEEDS_GPU_RESET).
EXAMPLE_POOLS = [
    {"name": "infer-a100-mps", "instanceTypes": ["p4de.24xlarge"], "capacity": "on-demand", "minNodes": 0,
     "desiredNodes": 0, "maxNodes": 2, "efa": False, "workload": "inference",
     "gpuSharing": {"mode": "mps", "replicas": 8}},
    {"name": "infer-h100-mig", "instanceTypes": ["p5.48xlarge"], "capacity": "spot", "minNodes": 0,
     "desiredNodes": 0, "maxNodes": 1, "efa": False, "workload": "inference",
     "gpuSharing": {"mode": "mig", "migProfiles": {"1g.10gb": 2, "3g.40gb": 1}}},
]
TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"


@pytest.fixture(scope="module")
def example_run():
    config = stack_config("prod-us-east-1")
    # A p5 at spot on top of the shipped pools passes the stack's $450 an hour: the budget rises with it.
    return run_stack("prod-us-east-1", {"gpu-cloud:nodePools": [*config["gpu-cloud:nodePools"], *EXAMPLE_POOLS],
                                        "gpu-cloud:budget": {**config["gpu-cloud:budget"], "maxHourlyUsd": 600}})


def _template(run, pool: str) -> Dict[str, str]:
    tags = run.one("aws:autoscaling/group:Group", f"{pool}-asg").inputs["tags"]
    return {t["key"][len(TEMPLATE):]: t["value"] for t in tags if t["key"].startswith(TEMPLATE)}


def test_eight_10_gb_shares_of_each_a100_80gb_plan_as_64_gpus_a_node(example_run):
    template = _template(example_run, "infer-a100-mps")
    assert {k: v for k, v in template.items() if k.startswith("resources/nvidia.com/")} == {
        "resources/nvidia.com/gpu": "64"}
    assert template["label/nvidia.com/device-plugin.config"] == "mps-8"
    user_data = base64.b64decode(example_run.one("aws:ec2/launchTemplate:LaunchTemplate", "infer-a100-mps-lt")
                                 .inputs["userData"]).decode()
    assert "nvidia.com/device-plugin.config=mps-8" in user_data          # the node registers with it
    configs = {k: yaml.safe_load(v) for k, v in
               example_run.one(CONFIGMAP, "gpu-operator-device-plugin-config").inputs["data"].items()}
    assert configs["mps-8"]["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 8}]
    assert configs["mps-8"]["flags"] == {"migStrategy": "none"}
    # What the MPS server sets per client: the GPU's memory / replicas in MiB, rounded down, and 100 / replicas %
    # of its SMs (k8s-device-plugin v0.20.0 cmd/mps-control-daemon/mps/daemon.go lines 252-280). The GPU's memory is
    # the catalog's, which the node gate holds each GPU to.
    memory_mib, replicas = catalog.instance_types["p4de.24xlarge"].gpu.memory_mib, 8
    assert (memory_mib // replicas, 100 // replicas) == (10240, 12)     # 10 GiB and 12 % each


def test_the_documented_example_is_the_pool_planned():
    text = (Path(__file__).resolve().parent.parent / "docs" / "gpu-platform.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("- name: infer-a100-mps")]
    assert yaml.safe_load(block) == EXAMPLE_POOLS[:1]


def test_a_mixed_mig_pool_plans_one_resource_per_profile(example_run):
    template = _template(example_run, "infer-h100-mig")
    assert {k: v for k, v in template.items() if k.startswith("resources/nvidia.com/")} == {
        "resources/nvidia.com/mig-1g.10gb": str(8 * 2), "resources/nvidia.com/mig-3g.40gb": str(8 * 1),
        "resources/nvidia.com/gpu": "0"}                  # every GPU is cut: the device plugin advertises no whole one
    assert template["label/nvidia.com/mig.config"] == "1g.10gbx2-3g.40gbx1"
    (text,) = example_run.one(CONFIGMAP, "gpu-operator-mig-config").inputs["data"].values()
    assert yaml.safe_load(text)["mig-configs"]["1g.10gbx2-3g.40gbx1"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "3g.40gb": 1}}]


def test_the_example_pools_count_in_the_inference_quota_and_only_there(example_run):
    quotas = {q.inputs["metadata"]["namespace"]: q.inputs["spec"]["hard"]
              for q in example_run.of_type("kubernetes:core/v1:ResourceQuota") if q.inputs["metadata"]["name"] == "gpu"}
    config = stack_config("prod-us-east-1")
    shipped = tenancy.gpu_quotas(load_stack_spec(project_keys(config), stack="prod-us-east-1",
                                                 region=config["aws:region"]).pools)
    gpus = {ns: int(shipped[ns]["requests.nvidia.com/gpu"]) for ns in shipped}
    assert quotas["inference"] == {"requests.nvidia.com/gpu": str(gpus["inference"] + 2 * 64),   # the MPS pool
                                   "requests.nvidia.com/mig-1g.10gb": "16", "requests.nvidia.com/mig-3g.40gb": "8"}
    assert quotas["training"] == {"requests.nvidia.com/gpu": str(gpus["training"]),
                                  "requests.nvidia.com/mig-1g.10gb": "0", "requests.nvidia.com/mig-3g.40gb": "0"}


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
                assert tolerates(tolerations, taint), f"{where} does not tolerate {taint} of pool {pool.name}"


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
    assert args.shared == (("mps", 8), ("time-slicing", 3), ("time-slicing", 4))
    assert args.mig_layouts == {"1g.10gbx7": {"1g.10gb": 7}, "3g.71gbx2": {"3g.71gb": 2},
                                "1g.10gbx2-3g.40gbx1": {"1g.10gb": 2, "3g.40gb": 1}}
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
        # NFD's master and gc: keys of the subchart's own values.yaml, held there.
        nfd = values["node-feature-discovery"]
        subchart = {part: nfd.pop(part) for part in ("master", "gc")}
        nfd_pin = charts.chart(chart).model_copy(update={"chart": "node-feature-discovery",
                                                         "version": gpu_operator.NFD_SUBCHART_VERSION})
        assert_values_confirmed(subchart, nfd_pin, gpu_operator.NFD_SUBCHART_VALUE_PATHS)
    assert_values_confirmed(values, charts.chart(chart), confirmed)


def test_the_counter_file_value_is_documented_by_the_chart_and_names_the_configmap_made(run):
    lines = values_file(charts.chart(charts.GPU_OPERATOR)).read_text().splitlines()
    line, _template = gpu_operator.GPU_OPERATOR_COMMENTED_VALUE_PATHS["dcgmExporter.config.name"]
    assert lines[line - 2].strip() == "# config:" and lines[line - 1].strip().startswith("# name:")
    assert "dcgmExporter:" in "\n".join(lines[line - 60:line])
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
    assert validate_kubernetes(run, "1.35") == 4          # the namespace and the three ConfigMaps
    assert validate_kubernetes(run_without_efa, "1.35") == 4


def test_every_child_is_parented_under_the_component_with_its_prefix(run):
    component = run.one(COMPONENT, "gpu")
    children = run.children_of(component.urn)
    strays = [r.name for r in run.resources if r.parent != component.urn and r.urn != component.urn
              and r.type != K8S_PROVIDER]
    assert not strays, f"registered outside the component: {strays}"
    assert len(children) == 6 and all(r.name.startswith("gpu-") for r in children)
