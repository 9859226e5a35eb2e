"""decisions/nodes/repair.py and components/nodes/node_repair.py: the repair controller as the stacks deploy it (its
program, config, identity, rights and metrics), and the stack config that sets it. Its rules and loop are tested in
tests/test_node_repair.py, its AWS calls against moto in tests/test_aws_api.py."""
from __future__ import annotations

import json

import pytest

from components.cluster import SYSTEM_NODE_LABELS
from decisions.config.errors import ConfigError
from decisions.config.validate import load_stack_spec
from decisions.nodes import boot, drain, repair
from decisions.nodes import pools as pool_rules
from decisions.observability import monitoring
from tests.conftest import run_stack, stack_config

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
SERVICE_MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"


def _config(run):
    data = run.one(CONFIG_MAP, "node-repair-program").inputs["data"]
    return json.loads(data[repair.CONFIG_KEY]), data


def test_the_controller_is_told_every_pool_of_the_stack_with_its_group_and_safety(stack_runs):
    for stack, run in stack_runs.items():
        config, data = _config(run)
        assert config["dryRun"] is False and config["region"] == run.region
        for name, policy in config["pools"].items():
            assert policy["asg"] == pool_rules.asg_name(f"gpu-cloud-{stack}", name)
            assert policy["maxPerHour"] == 2 and policy["maxInFlight"] == 1
        assert set(config["pools"]) == {r.name.removesuffix("-asg") for r in run.of_type(
            "aws:autoscaling/group:Group")}, stack
        # the program shipped is the repository's, byte for byte
        for name in repair.PROGRAM_FILES:
            assert data[name] == (repair.JOBS / name).read_text()
        assert config["reportsBucket"].endswith("-artifacts") and config["reportsPrefix"] == "gate-reports/"
        assert config["prometheusUrl"] == f"{monitoring.PROMETHEUS_URL}:{monitoring.PROMETHEUS_PORT}"


def test_each_pool_repairs_one_at_a_time_within_its_budget_and_says_whether_it_is_reserved(stack_runs):
    config, _ = _config(stack_runs["prod-us-east-1"])
    assert config["pools"]["train-h100"] == {"asg": "gpu-cloud-prod-us-east-1-train-h100", "reserved": True,
                                             "maxPerHour": 2, "maxInFlight": 1}
    assert config["pools"]["infer-l40s"]["reserved"] is False


def test_timings_follow_the_drain_and_the_gate():
    assert repair.REPAIR_TIMEOUT_S == drain.LIFECYCLE_DRAIN_TIMEOUT_S + 3000 + boot.node_ready_seconds() == 4500
    assert repair.CONFIRM_S == 120 and repair.STALE_CHECK_S == 300 and repair.BRAKE_AFTER == 3
    # NotReady: EKS node auto repair's 30 minutes; a silent checker: when GpuNodeHealthCheckStale fires (300 s, for 5m)
    assert repair.NOT_READY_S == 1800 and repair.STALE_REPAIR_S == repair.STALE_CHECK_S + 300
    # a reboot not seen within EC2's four minutes to a hard reboot, node-monitor-grace-period and a pass
    assert repair.REBOOT_RETRY_S >= 240 + 40 + repair.INTERVAL_S
    assert repair.RECURRENCE_S == 24 * 3600


def test_the_controller_runs_once_on_a_system_node_as_nobody_after_its_identity(stack_runs):
    run = stack_runs["prod-us-east-1"]
    deployment = run.one(DEPLOYMENT, "node-repair-deployment")
    spec = deployment.inputs["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == SYSTEM_NODE_LABELS
    [container] = pod["containers"]
    assert container["image"] == repair.IMAGE and container["command"] == ["python3", "/opt/gpu-node-repair/node_repair.py"]
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert pod["serviceAccountName"] == repair.NAME and deployment.inputs["metadata"]["namespace"] == "kube-system"
    association = next(r for r in run.of_type(ASSOCIATION) if r.inputs["serviceAccount"] == repair.NAME)
    assert association.inputs["namespace"] == "kube-system"
    assert association.urn in deployment.dependencies or any(
        association.urn in r.dependencies for r in run.resources if r.urn in deployment.dependencies)


def test_its_aws_rights_name_this_clusters_groups_and_the_gate_reports_only(stack_runs):
    run = stack_runs["prod-us-east-1"]
    [policy] = [r for r in run.of_type(ROLE_POLICY) if r.name.startswith("node-repair-identity")]
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    groups = [pool_rules.asg_arn_pattern("aws", run.region, "123456789012", pool_rules.asg_name(
        "gpu-cloud-prod-us-east-1", p)) for p in sorted(_config(run)[0]["pools"])]
    assert sorted(statements["ReplaceAndBrakeOwnPools"]["Resource"]) == sorted(groups)
    assert statements["ReplaceAndBrakeOwnPools"]["Action"] == ["autoscaling:TerminateInstanceInAutoScalingGroup",
                                                               "autoscaling:SuspendProcesses"]
    # the fast path for dead hardware: CONTINUE a termination hook of these groups, no other
    assert statements["CompleteOwnPoolsTerminationHook"]["Action"] == "autoscaling:CompleteLifecycleAction"
    assert sorted(statements["CompleteOwnPoolsTerminationHook"]["Resource"]) == sorted(groups)
    reboot = statements["RebootOwnPoolInstances"]
    assert sorted(reboot["Condition"]["StringEquals"]["ec2:ResourceTag/aws:autoscaling:groupName"]) == sorted(
        g.rsplit("/", 1)[1] for g in groups)
    assert statements["ReadGateReports"]["Resource"].endswith("-artifacts/gate-reports/*")
    assert statements["DescribeGroups"]["Resource"] == "*"        # DescribeAutoScalingGroups takes no resource
    assert all(s["Resource"] != "*" for sid, s in statements.items() if sid != "DescribeGroups")


def test_its_metrics_are_scraped_by_the_stacks_prometheus(stack_runs):
    run = stack_runs["dev"]
    [monitor] = [r for r in run.of_type(SERVICE_MONITOR) if r.inputs["metadata"]["name"] == repair.NAME]
    assert monitor.inputs["metadata"]["labels"] == dict(monitoring.SELECTOR_LABELS)
    assert monitor.inputs["spec"]["endpoints"][0]["port"] == "metrics"


def test_dry_run_and_the_budget_come_from_the_stack():
    run = run_stack("dev", {"gpu-cloud:repair": {"dryRun": True, "maxPerPoolPerHour": 5}})
    config, _ = _config(run)
    assert config["dryRun"] is True
    assert {p["maxPerHour"] for p in config["pools"].values()} == {5}


@pytest.mark.parametrize("value,message", [
    ({"maxPerPoolPerHour": 0}, "repair.maxPerPoolPerHour"),
    ({"dryrun": True}, "repair.dryrun"),
])
def test_bad_repair_settings_name_the_key(value, message):
    config = {k.split(":", 1)[1]: v for k, v in stack_config("dev").items() if k.startswith("gpu-cloud:")}
    with pytest.raises(ConfigError) as raised:
        load_stack_spec({**config, "repair": value}, stack="dev", region=stack_config("dev")["aws:region"])
    assert message in str(raised.value)


def test_every_remediation_of_the_fault_table_but_none_is_something_the_controller_does():
    from decisions.nodes.faults import REMEDIATIONS, load_faults
    assert set(repair.ACTIONS) == set(REMEDIATIONS) - {"none"}
    assert repair.ACTIONS["reboot"] == "reboot" and repair.ACTIONS["replace"] == "replace"
    assert repair.ACTIONS.get("reset", "reboot") == "reboot"
    assert {f.remediation for f in load_faults().faults} - {"none"} <= set(repair.ACTIONS)


def test_its_kubernetes_rights_delete_pods_for_the_fast_path_and_nothing_more():
    """Pods: list (what a node holds), delete (grace 0, on a node being terminated whose kubelet is gone); evictions
    for a drain; nothing else of pods."""
    pods = [r for r in repair.CLUSTER_RULES if any(x.startswith("pods") for x in r["resources"])]
    assert sorted((tuple(r["resources"]), tuple(r["verbs"])) for r in pods) == [
        (("pods",), ("list", "delete")), (("pods/eviction",), ("create",))]
    config = repair.controller_config(cluster_name="c", region="us-east-1", partition="aws", pools=[], dry_run=False,
                                      max_per_hour=2, reports_bucket="b")
    assert config["fastDrainSeconds"] == 120 and config["drainHook"] == "gpu-cloud-drain"
