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
from plan.document import repair_section
from plan.engine import offline_account
from plan.stackfile import load_stack
from tests.conftest import STACKS, run_stack, stack_config

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
                                             "launchFirst": False, "maxPerHour": 2, "maxInFlight": 1}
    assert config["pools"]["infer-l40s"]["reserved"] is False


def test_timings_follow_the_checker_the_drain_and_the_gate():
    assert repair.REPAIR_TIMEOUT_S == drain.LIFECYCLE_DRAIN_TIMEOUT_S + 3000 + boot.node_ready_seconds() == 4500
    # two checks 30 s apart; five missed checks; the brake after three rejected launches
    assert repair.CONFIRM_S == 60 and repair.STALE_CHECK_S == 150 and repair.BRAKE_AFTER == 3
    # a healthy node's check is at most a period (and its timer's 1 s), a scrape and a missed scrape old: not stale
    assert repair.CHECK_PERIOD_S + 1 + 2 * 30 < repair.STALE_CHECK_S
    # out of service within 2 minutes: the next check, its scrape, the controller's pass (the cordon call's retries
    # are the rest: bench/repair_bench.py)
    assert repair.CHECK_PERIOD_S + 1 + 30 + repair.INTERVAL_S < 120
    # NotReady: EKS node auto repair's 30 minutes; a silent checker: when GpuNodeHealthCheckStale fires (for 5m)
    assert repair.NOT_READY_S == 1800 and repair.STALE_REPAIR_S == repair.STALE_CHECK_S + 300
    # the drain before a reboot is the spot notice, not the termination hook's 900 s
    assert repair.FAST_DRAIN_S == drain.NODE_DRAIN_GRACE_S == 120
    # a reboot not seen within EC2's four minutes to a hard reboot, node-monitor-grace-period and a pass
    assert repair.REBOOT_RETRY_S >= 240 + 40 + repair.INTERVAL_S
    assert repair.RECURRENCE_S == 24 * 3600


def test_the_checkers_timer_runs_at_the_period_the_controller_counts_on():
    import configparser
    unit = configparser.ConfigParser(strict=False)
    unit.read_string((repair.JOBS.parent / "userdata/units/gpu-cloud-health.timer").read_text())
    assert unit["Timer"]["OnUnitActiveSec"] == f"{repair.CHECK_PERIOD_S}s" == unit["Timer"]["OnActiveSec"]
    assert unit["Timer"]["AccuracySec"] == "1s"


@pytest.mark.parametrize("stack", STACKS)
def test_a_node_rebooting_itself_through_its_gate_is_not_replaced_for_being_not_ready(stack):
    """A kernel panic reboots the node 10 s later (kernel.panic=10 on the AMI) and its gate proves it again before its
    kubelet runs: NotReady for its whole boot. NOT_READY_S outlasts every pool's worst boot, or the controller would
    replace a node in the middle of proving itself."""
    spec = load_stack_spec({k.split(":", 1)[1]: v for k, v in stack_config(stack).items()
                            if k.startswith("gpu-cloud:")}, stack=stack, region=stack_config(stack)["aws:region"])
    for pool in spec.pools:
        gpu = spec.catalog.gpu_model(pool.primary_type.name)
        steps = boot.worst_case(spec.node_image.source, nvswitch=gpu.nvswitch, efa=bool(pool.efa),
                                lustre=spec.storage.lustre is not None)
        assert 10 + sum(steps.values()) + boot.node_ready_seconds() < repair.NOT_READY_S, pool.name


def test_a_reservation_with_a_spare_slot_launches_replacements_first_and_tells_the_controller():
    """train-h100's reservation read with 5 instances for the pool's 4: its group gets an instance maintenance policy
    (min 100 %, max 125 %: one instance above the desired 4) and the controller reports its sick instances Unhealthy
    instead of terminating them. Read with 4 (the offline plan's account): neither."""
    config = stack_config("prod-us-east-1")
    account = offline_account("us-east-1", config)
    [rid] = [r for r, found in account.reservations.items() if found["InstanceType"] == "p5.48xlarge"]
    account.reservations[rid] = {**account.reservations[rid], "InstanceCount": 5}
    for run, launches_first in ((run_stack("prod-us-east-1", account=account), True),
                                (run_stack("prod-us-east-1"), False)):
        groups = {r.name: r.inputs for r in run.of_type("aws:autoscaling/group:Group")}
        assert groups["train-h100-asg"].get("instanceMaintenancePolicy") == (
            {"minHealthyPercentage": 100, "maxHealthyPercentage": 125} if launches_first else None)
        assert all(inputs.get("instanceMaintenancePolicy") is None
                   for name, inputs in groups.items() if name != "train-h100-asg")
        controller, _ = _config(run)
        assert {p: c["launchFirst"] for p, c in controller["pools"].items()} == {
            p: launches_first and p == "train-h100" for p in controller["pools"]}
        # the plan says which pools can, from the sizes the program read
        rows = {r["pool"]: r for r in repair_section(load_stack("prod-us-east-1")[1], run)["pools"]}
        assert rows["train-h100"]["replacement"] == ("launch first" if launches_first else "terminate first")
        assert f"holds {5 if launches_first else 4} instances for maxNodes 4" in rows["train-h100"]["why"]
        assert rows["infer-l40s"]["replacement"] == "terminate and launch at once"


@pytest.mark.parametrize("nodes,expected", [(1, (100, 200)), (3, (100, 134)), (4, (100, 125)), (64, (100, 102))])
def test_the_launch_first_policy_leaves_room_for_exactly_one_more_instance(nodes, expected):
    from types import SimpleNamespace
    pool = SimpleNamespace(spec=SimpleNamespace(desired_nodes=nodes))
    low, high = pool_rules.launch_first_policy(pool)
    assert (low, high) == expected
    assert nodes * high // 100 >= nodes + 1 and nodes * (high - 1) // 100 < nodes + 1 or high == 200


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
                                                               "autoscaling:SetInstanceHealth",
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


def test_its_readiness_probe_is_the_programs_readyz_and_an_unready_controller_is_still_scraped(stack_runs):
    """The stack asks the program's /readyz on its metrics port (jobs/node_repair.py serve_metrics: 503 while no pass
    has read the nodes' health lately, 200 otherwise); the Service publishes the pod unready too, so Prometheus keeps
    the errors and GpuRepairControllerDown's series; the pod starts after Prometheus, since `pulumi up` waits for it
    to be ready."""
    import urllib.error
    import urllib.request

    from jobs import node_repair as program

    run = stack_runs["prod-us-east-1"]
    deployment = run.one(DEPLOYMENT, "node-repair-deployment")
    pod = deployment.inputs["spec"]["template"]["spec"]
    [container] = pod["containers"]
    probe = container["readinessProbe"]["httpGet"]
    assert [p["name"] for p in container["ports"] if p["containerPort"] == repair.METRICS_PORT] == [probe["port"]]
    ready = {"now": False}
    server = program.serve_metrics(program.Metrics(), 0, lambda: ready["now"])

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        assert status(probe["path"]) == 503 and status(container["livenessProbe"]["httpGet"]["path"]) == 200
        ready["now"] = True
        assert status(probe["path"]) == 200
    finally:
        server.shutdown()
        server.server_close()
    service = run.one("kubernetes:core/v1:Service", "node-repair-metrics")
    assert service.inputs["spec"]["publishNotReadyAddresses"] is True
    assert run.one("kubernetes:helm.sh/v3:Release", "monitoring-release").urn in deployment.dependencies
    # The pod as a whole runs as nobody under RuntimeDefault (Checkov reads the pod's context: tests/test_checkov.py).
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                      "seccompProfile": {"type": "RuntimeDefault"}}


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
