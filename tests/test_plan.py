"""The offline plan CLI: tables, the JSON document, exit codes, config errors without tracebacks."""
import json
import os
import re
import subprocess
import sys
from typing import List

import pytest
import yaml

from plan.document import document_problems
from plan.stackfile import known_stacks
from tests.conftest import ROOT, STACKS, PlanProcess, run_stack

def plan(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "plan", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """`python -m plan STACK --json PATH` for each shipped stack: its stdout and document (one process plans
    them all; conftest.PlanProcess)."""
    directory = tmp_path_factory.mktemp("plan")
    paths = {stack: directory / f"{stack}.json" for stack in STACKS}
    process = PlanProcess([[stack, "--json", path] for stack, path in paths.items()], directory / "results.json")
    results = process.results()
    out = {}
    for (stack, path), result in zip(paths.items(), results):
        document = json.loads(path.read_text())
        assert result.returncode == 0 and document["policy"]["violations"] == [], result.stderr
        out[stack] = (result.stdout, document)
    return out


def test_make_plan_shows_capacity_and_cost_tables(documents):
    text, _ = documents["prod-us-east-1"]
    assert "stack prod-us-east-1 (project gpu-cloud, region us-east-1)" in text
    assert "GPU capacity:" in text and "Hourly cost (USD" in text
    assert re.search(r"\n  train-h100 +p5\.48xlarge +H100 +8 +51 +reserved +4/4/4 +32 +32", text)


def _summary_expected(document) -> List[str]:
    """The summary block as each figure of the document must show it (plan/document.py summary_lines)."""
    capacity, bill, policy = document["capacity"], document["cost"], document["policy"]
    views = {policy["view"]: (len(policy["violations"]),
                              sum(v["enforcementLevel"] == "mandatory" for v in policy["violations"])), **{
        view: (counts["violations"], counts["mandatory"]) for view, counts in policy["otherViews"].items()}}
    gaps, warnings = len(bill["gaps"]), len(document["warnings"])
    return [
        f"gpu-cloud plan: stack {document['stack']} (project gpu-cloud, region {document['region']})",
        f"  GPUs      {sum(r['gpusAtDesired'] for r in capacity)} now (desired), "
        f"{sum(r['gpusAtMax'] for r in capacity)} at max, in {len(capacity)} pool" + "s" * (len(capacity) > 1),
        f"  cost      ${bill['hourlyAtDesired']:,.2f}/h now, ${bill['hourlyAtMax']:,.2f}/h at max; within budget "
        f"${bill['budgetMaxHourlyUsd']:,.2f}/h (GPU pools at maxNodes ${bill['budgetHourlyAtMax']:,.2f}/h)",
        # every shipped stack has a budget, so every gap it has is one it acknowledged by name
        "  unpriced  " + (f"{gaps} acknowledged unpriced ({', '.join(bill['budgetUnpriced'])}), left out of every "
                          "total (listed under Hourly cost)" if gaps else "none"),
        "  policy    " + "; ".join(f"{view}: no violations" for view in ("update", "preview", "first-preview")
                                   if views[view] == (0, 0)),
        "  warnings  " + (f"{warnings} (listed under Warnings)" if warnings else "none"),
        ""]


def test_the_report_opens_with_a_summary_of_the_documents_own_figures(documents):
    for stack, (text, document) in documents.items():
        assert text.splitlines()[:7] == _summary_expected(document), stack
        assert text.splitlines()[7].startswith("Resources: "), stack
    # The figures stated, so that a summary and a document wrong together still fail (the README shows them).
    text, document = documents["prod-us-east-1"]
    assert text.splitlines()[1:4] == [
        "  GPUs      40 now (desired), 92 at max, in 4 pools",
        "  cost      $242.72/h now, $328.39/h at max; within budget $450.00/h (GPU pools at maxNodes $325.74/h)",
        "  unpriced  1 acknowledged unpriced (fsx-lustre), left out of every total (listed under Hourly cost)"]
    assert document["cost"]["withinBudget"] is True


def test_a_budget_with_an_unacknowledged_hole_is_refused_and_an_acknowledged_one_is_counted(tmp_path):
    """Issue 41's new user: dev in us-west-2 with four p5.48xlarge spot nodes and a $20 budget. us-west-2 has no
    P-family price, so the budget could not see the pool: refused, naming it; acknowledged, planned, and the summary
    says so."""
    from tests.test_validate import p5_in_us_west_2

    def stack_file(unpriced):
        config = {"aws:region": "us-west-2",
                  **{f"gpu-cloud:{k}": v for k, v in p5_in_us_west_2(unpriced).items()}}
        path = tmp_path / f"dev-{len(unpriced)}.yaml"
        path.write_text(yaml.safe_dump({"config": config}))
        return path

    refused = plan("dev", "--stack-file", stack_file([]), "--quiet")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert ("gpu-cloud:nodePools[0] (pool dev-gpu-spot): no on-demand price for p5.48xlarge in us-west-2"
            in refused.stdout + refused.stderr)
    fixed = [name for names in re.findall(r"add ([a-z0-9, -]+) to gpu-cloud:budget.unpriced",
                                          refused.stdout + refused.stderr) for name in names.split(", ")]
    assert fixed[0] == "dev-gpu-spot"
    planned = plan("dev", "--stack-file", stack_file(fixed), "--quiet", "--no-policy")
    assert planned.returncode == 0, planned.stderr
    assert (f"  unpriced  {len(fixed)} acknowledged unpriced ({', '.join(fixed)}), left out of every total "
            "(listed under Hourly cost)") in planned.stdout.splitlines()


def test_the_summary_counts_acknowledged_gaps_and_assumed_prices(documents):
    from plan.document import summary_lines

    document = json.loads(json.dumps(documents["prod-us-east-1"][1]))
    assert summary_lines(document)[3] == ("  unpriced  1 acknowledged unpriced (fsx-lustre), left out of every total "
                                          "(listed under Hourly cost)")
    document["cost"]["budgetAssumed"] = {"train-h100": {"usdPerNodeHour": 55.04, "source": "an invoice, 2026-11"}}
    assert summary_lines(document)[3].endswith(
        "; 1 priced by the stack's assumption (train-h100: gpu-cloud:budget.assumed)")
    document["cost"].update(gaps=[], unpriced=[], budgetAssumed={})
    assert summary_lines(document)[3] == "  unpriced  none"


def test_the_summary_says_over_budget_and_each_views_mandatory_violations(documents):
    from plan.document import summary_lines

    document = json.loads(json.dumps(documents["dev"][1]))
    # cents, as the budget rule compares: $7.29 for $7.2903 is within, a cent less is over
    document["cost"].update(budgetMaxHourlyUsd=7.28, withinBudget=False)
    document["policy"]["violations"] = [{"policyName": "p", "enforcementLevel": "mandatory", "message": "m",
                                         "urn": ""}]
    document["policy"]["otherViews"]["first-preview"] = {"violations": 2, "mandatory": 1}
    document["warnings"] = ["one"]
    lines = summary_lines(document)
    assert len(lines) <= 10
    assert lines[2].endswith("; OVER budget $7.28/h (GPU pools at maxNodes $7.29/h)")
    assert lines[4] == ("  policy    update: 1 violation(s), 1 mandatory; preview: no violations; "
                        "first-preview: 2 violation(s), 1 mandatory")
    assert lines[5] == "  warnings  1 (listed under Warnings)"
    document["cost"]["budgetMaxHourlyUsd"] = None
    document["policy"] = {"violations": [], "skipped": "--no-policy"}
    lines = summary_lines(document)
    assert lines[2].endswith("; no budget (gpu-cloud:budget.maxHourlyUsd)")
    assert lines[4] == "  policy    not run (--no-policy)"


def test_the_report_ends_with_the_design_ledgers_counts(documents):
    from decisions.requirements import load_requirements, summary

    rows = load_requirements()
    # Stated, not built with summary(): the counts of decisions/requirements.yaml, as docs/requirements.md says them.
    line = "Design ledger: 48 requirements: 21 met, 24 departed, 3 not applicable (docs/requirements.md)"
    assert summary(rows).startswith(f"{len(rows)} requirements: ")
    assert (len(rows), sum(r.status == "met" for r in rows), sum(r.status == "departed" for r in rows),
            sum(r.status == "not-applicable" for r in rows)) == (48, 21, 24, 3)
    for stack, (text, _) in documents.items():
        assert text.rstrip("\n").splitlines()[-1] == line, stack


def test_plan_shows_each_zones_subnets_pools_and_address_demand(documents):
    text, document = documents["prod-us-east-1"]
    zones = {z["zoneId"]: z for z in document["outputs"]["zones"]}
    assert list(zones) == ["use1-az1", "use1-az2", "use1-az4"]
    # 10.64.0.0/16: private /19 blocks 0, 1, 2 in declared order; public /24s in block 7.
    assert [(z["privateSubnet"], z["publicSubnet"]) for z in zones.values()] == [
        ("10.64.0.0/19", "10.64.224.0/24"), ("10.64.32.0/19", "10.64.225.0/24"), ("10.64.64.0/19", "10.64.226.0/24")]
    assert zones["use1-az1"]["pools"] == ["train-h100", "finetune-a100-80gb-spot", "finetune-a100-40gb-spot", "infer-l40s"]
    # the spot A100 pools mount Lustre without EFA: they launch in its zone, the EFA pool's (lustre.in_file_system_zone)
    assert zones["use1-az2"]["pools"] == zones["use1-az4"]["pools"] == ["infer-l40s"]
    # at maxNodes: p5 4 x 50, p4de 3 x 116, p4d 3 x 116, g6e.12xlarge 3 x 117, system nodes 4 x 60
    assert zones["use1-az1"]["addressesAtMax"] == 200 + 348 + 348 + 351 + 240 == 1487
    assert zones["use1-az2"]["addressesAtMax"] == 351 + 240
    assert zones["use1-az1"]["usableAddresses"] == 8192 - 5
    assert re.search(r"\n  use1-az1 +us-east-1a +10\.64\.0\.0/19 +10\.64\.224\.0/24 +1487 of 8187 +train-h100, ", text)
    assert {r["pool"]: r["maxPodsPerNode"] for r in document["capacity"]} == {
        "train-h100": 51, "finetune-a100-80gb-spot": 110, "finetune-a100-40gb-spot": 110, "infer-l40s": 110}


def test_plan_shows_the_gpu_platform_and_the_training_queue(documents):
    text, document = documents["prod-us-east-1"]
    platform = document["platform"]
    assert (platform["gpuOperator"], platform["efaDevicePlugin"], platform["kueue"], platform["mpiOperator"]) == \
        ("v26.7.0", "v0.5.30", "0.19.2", "v0.8.0")
    offers = {p["pool"]: p["offersPerNode"] for p in platform["pools"]}
    assert offers["train-h100"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert offers["infer-l40s"] == {"nvidia.com/gpu": 8}           # 4 L40S x 2 time-slicing replicas
    queue = platform["trainingQueue"]
    # One flavor per pool, named as the pool, in the autoscaler's order; spot ones only for jobs that tolerate it.
    spot = ["gpu-cloud.io/interruptible=true:NoSchedule"]
    assert [(f["name"], f["capacity"], f["quotas"], f["mustTolerate"]) for f in queue["flavors"]] == [
        ("train-h100", "reserved", {"nvidia.com/gpu": 32, "vpc.amazonaws.com/efa": 128}, []),
        ("finetune-a100-80gb-spot", "spot", {"nvidia.com/gpu": 24}, spot),
        ("finetune-a100-40gb-spot", "spot", {"nvidia.com/gpu": 24}, spot)]
    assert queue["localQueues"] == ["training", "default"]
    assert queue["priorityClasses"] == [{"name": "production", "value": 1000}, {"name": "experiment", "value": 0}]
    assert ("Training queue (LocalQueues training and default in namespace training -> ClusterQueue training), one "
            "flavor per pool, in admission order:") in text
    assert re.search(r"\n  train-h100 +reserved +nvidia\.com/gpu 32, vpc\.amazonaws\.com/efa 128 +any job\n", text)
    assert re.search(r"\n  finetune-a100-40gb-spot +spot +nvidia\.com/gpu 24 +jobs tolerating "
                     r"gpu-cloud\.io/interruptible\n", text)
    assert ("priorities (label kueue.x-k8s.io/priority-class; higher preempts lower): production 1000, experiment 0; "
            "no label runs at 0") in text
    assert queue["nvlinkChecks"] == [{"pool": "train-h100", "schedule": "0 4 * * 0"},
                                     {"pool": "finetune-a100-80gb-spot", "schedule": None},
                                     {"pool": "finetune-a100-40gb-spot", "schedule": None}]
    # The reserved H100s keep 4 nodes on EFA: the across-node check runs on the default weekly slot.
    assert queue["acrossNodeChecks"] == [{"pool": "train-h100", "schedule": "0 6 * * 0"}]
    assert ("NVLink bandwidth check: train-h100 (0 4 * * 0 UTC), finetune-a100-80gb-spot (suspended: run by hand), "
            "finetune-a100-40gb-spot (suspended") in text
    assert "\n  EFA bandwidth check across two nodes: train-h100 (0 6 * * 0 UTC)\n" in text
    # The flavors and queue wait for Kueue's webhooks, for a stated time.
    assert queue["webhookWait"] == {"job": "kueue-system/kueue-webhook-ready", "probeSeconds": 300,
                                    "timeoutSeconds": 600}
    assert ("created once Kueue's webhooks answer: Job kueue-system/kueue-webhook-ready retries a dry-run "
            "ResourceFlavor for up to 300 s; pulumi up waits for it up to 600 s") in text
    dev_text, dev = documents["dev"]
    assert "GPU platform: gpu-operator v26.7.0, Kueue 0.19.2" in dev_text        # no EFA pool, no EFA plugin
    assert dev["platform"]["trainingQueue"]["acrossNodeChecks"] == []
    assert "EFA bandwidth check across two nodes: none (no EFA pool with a minimum keeps two nodes)" in dev_text


@pytest.mark.parametrize("stack", STACKS)
def test_plan_names_the_node_image_and_shipped_stacks_have_nothing_to_warn_about(documents, stack):
    text, document = documents[stack]
    assert document["nodeImage"] == {
        "release": "v20260714", "amiName": "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714",
        "ssmParameter": "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
                        "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id",
        "driverSource": "ami", "driverBranch": "580", "driverVersion": "580.159.03"}
    assert "GPU node image: amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714" in text
    # prod-eu-west-1's unpriced A100 pool is no warning: its budget acknowledges it by name (budget.unpriced), and
    # the summary and the gaps list say so
    assert document["warnings"] == [] and "Warnings:" not in text


def test_plan_warns_about_an_outdated_release_and_still_plans(tmp_path):
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    stack["config"]["gpu-cloud:gpuDriver"] = {"amiRelease": "v20260116"}
    path = tmp_path / "Pulumi.old.yaml"
    path.write_text(yaml.safe_dump(stack))
    out = tmp_path / "old.json"
    result = plan("dev", "--stack-file", path, "--json", out)
    assert result.returncode == 0, result.stderr
    (warning,) = json.loads(out.read_text())["warnings"]
    assert warning.startswith("gpu-cloud:gpuDriver.amiRelease: v20260116 is older than v20260714")
    assert "Warnings:\n  - " + warning in result.stdout
    assert "NVIDIA driver 580.105.08, carried by the AMI" in result.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_json_document_has_the_contract_fields(documents, stack):
    _, document = documents[stack]
    assert document_problems(document) == []
    assert document["version"] == 1 and document["project"] == "gpu-cloud" and document["stack"] == stack
    for resource in document["resources"]:
        assert set(resource) >= {"urn", "type", "name", "custom", "parent", "provider", "inputs", "dependencies",
                                 "protect", "retainOnDelete"}
    for row in document["capacity"]:
        assert set(row) >= {"pool", "instanceTypes", "gpuModel", "gpusPerNode", "capacity", "minNodes",
                            "desiredNodes", "maxNodes"}
    assert set(document["cost"]) >= {"currency", "hourlyAtDesired", "hourlyAtMax", "pools"}
    assert document["policy"]["pack"] == "gpu-cloud" and document["policy"]["violations"] == []
    assert set(document["monitoring"]) >= {"chart", "retentionDays", "webhook", "alerts", "dashboards"}


def test_capacity_and_cost_figures_follow_the_stack(documents):
    _, document = documents["prod-us-east-1"]
    rows = {r["pool"]: r for r in document["capacity"]}
    assert rows["train-h100"]["gpusPerNode"] == 8 and rows["train-h100"]["gpusAtMax"] == 32
    assert rows["infer-l40s"]["gpusAtMax"] == 4 * 3        # maxNodes 3: all Triton's 8 replicas can reach
    pools = {p["pool"]: p for p in document["cost"]["pools"]}
    assert pools["train-h100"]["hourlyAtDesired"] == pytest.approx(4 * 55.04)
    assert document["cost"]["hourlyAtMax"] <= document["cost"]["budgetMaxHourlyUsd"]


def test_secondary_region_shows_what_it_can_really_take_over(documents):
    primary = documents["prod-us-east-1"][1]["capacity"]
    secondary = documents["prod-eu-west-1"][1]["capacity"]
    assert {t for r in secondary for t in r["instanceTypes"]} <= {"p4d.24xlarge", "g5.12xlarge"}
    assert sum(r["gpusAtMax"] for r in secondary) < sum(r["gpusAtMax"] for r in primary)


def test_no_secret_reaches_the_document(documents):
    for _, document in documents.values():
        kube = [r for r in document["resources"] if r["type"] == "pulumi:providers:kubernetes"]
        assert kube and all(r["inputs"]["kubeconfig"] == "[secret]" for r in kube)


def test_broken_stack_file_exits_2_naming_every_mistake(tmp_path):
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.prod-us-east-1.yaml").read_text())
    config = stack["config"]
    config["gpu-cloud:environment"] = "production"
    config["gpu-cloud:nodePools"][0]["instanceTypes"] = ["p5.48xlarg"]
    config["gpu-cloud:nodePools"][1]["maxNode"] = 3
    config["gpu-cloud:network"]["cidr"] = "10.64.0.0/8"
    config["gpu-cloud:nodePools"][2]["instanceTypes"] = ["p4d.24xlarge", "p4de.24xlarge"]
    config["gpu-cloud:gpuDriver"]["version"] = "580.105.08"
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text(yaml.safe_dump(stack))
    result = plan("prod-us-east-1", "--stack-file", broken)
    assert result.returncode == 2
    for expected in ("gpu-cloud:environment", "gpu-cloud:nodePools[0].instanceTypes[0]",
                     "did you mean p5.48xlarge?", "gpu-cloud:nodePools[1].maxNode", "gpu-cloud:network",
                     "gpu-cloud:nodePools[2].instanceTypes (pool finetune-a100-40gb-spot): types in one pool need one node shape",
                     "gpu-cloud:gpuDriver.version: 580.105.08 does not match"):
        assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""          # nothing was planned


def test_missing_stack_file_is_a_config_error_that_lists_the_stacks(tmp_path):
    result = plan("nope")
    assert result.returncode == 2 and "no stack file" in result.stderr and "Traceback" not in result.stderr
    # The stacks stacks/ holds: the shipped ones, and any a user added (the README's "Add a stack").
    listed = re.search(r"\(stacks: ([^)]*)\)", result.stderr).group(1).split(", ")
    assert listed == known_stacks() and set(STACKS) <= set(listed)


def test_help_lists_the_stacks_the_exit_codes_and_an_example():
    result = plan("--help")
    assert result.returncode == 0
    listed = re.search(r"^stacks: (.*)$", result.stdout, re.M).group(1).split(", ")
    assert listed == known_stacks() and set(STACKS) <= set(listed)
    assert "4 a usage error" in result.stdout and "example: python -m plan prod-us-east-1" in result.stdout


@pytest.mark.parametrize("args, words", [
    ((), "give a STACK, or --policy-check PLAN.json"),
    (("dev", "--json", "/no-such-folder/plan.json"), "argument --json: /no-such-folder does not exist"),
    (("dev", "--frobnicate"), "unrecognized arguments: --frobnicate"),
])
def test_usage_errors_have_their_own_exit_code_and_come_before_the_plan(args, words):
    result = plan(*args)
    assert result.returncode == 4 and words in result.stderr, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_policy_check_validates_a_written_document(documents, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(documents["dev"][1]))
    assert plan("--policy-check", path).returncode == 0
    config = tmp_path / "config.json"     # a pack config that forbids dev's g6.12xlarge: exit 1, shown
    config.write_text(json.dumps({"gpu-pool-instance-types": {"allowedInstanceTypes": ["g6e.12xlarge"]}}))
    result = plan("--policy-check", path, "--policy-config", config)
    assert result.returncode == 1 and "[mandatory] gpu-pool-instance-types: " in result.stdout, result.stdout
    bad = dict(documents["dev"][1])
    del bad["capacity"]
    path.write_text(json.dumps(bad))
    result = plan("--policy-check", path)
    assert result.returncode == 2 and "capacity" in result.stderr and "Traceback" not in result.stderr


def test_unexpected_failure_is_one_line_exit_3(monkeypatch, capsys):
    from plan import __main__ as cli

    def broken(*args, **kwargs):
        raise RuntimeError("something unforeseen\nand a second line")

    monkeypatch.setattr(cli, "policy_check", broken)
    assert cli.main(["--policy-check", "plan.json"]) == 3
    assert capsys.readouterr().err == "plan failed: RuntimeError: something unforeseen\n"


def test_a_config_error_found_while_the_program_runs_names_the_stack_file_given(monkeypatch, capsys, tmp_path):
    from pulumi import RunError

    from plan import __main__ as cli, engine

    def refused(*args, **kwargs):
        raise RunError("gpu-cloud:network.zones[0]: use1-az9 is not a zone of us-east-1")

    monkeypatch.setattr(engine, "run_program", refused)
    stack_file = tmp_path / "mine.yaml"
    stack_file.write_text((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    assert cli.main(["dev", "--stack-file", str(stack_file), "--no-policy"]) == 2
    assert capsys.readouterr().err.endswith(f"config error in {stack_file}: gpu-cloud:network.zones[0]: use1-az9 is "
                                            "not a zone of us-east-1\n")
    assert cli.main(["dev", "--no-policy"]) == 2
    assert "config error in stack dev: " in capsys.readouterr().err


@pytest.mark.parametrize("content, words", [
    (None, "there is no such file; write one with `make plan JSON={path}` or `python -m plan STACK --json {path}`"),
    ("{", "it is not JSON ("),
    ('{"version": 1}', "is not a valid plan document: "),
], ids=["missing", "not-json", "not-a-plan-document"])
def test_policy_check_of_an_unreadable_document_exits_2_saying_how_to_write_one(tmp_path, content, words):
    # docs/plan.md: 2 for a config error or a plan document that cannot be read or is not valid.
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = plan("--policy-check", path)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    (line,) = result.stderr.splitlines()
    assert words.format(path=path) in line and "python -m plan STACK --json" in line


@pytest.mark.parametrize("config, words", [
    ({"gpu-pool-instance-type": "advisory"}, "policy config: 'gpu-pool-instance-type' is not a policy of the pack; "
                                             "did you mean 'gpu-pool-instance-types'? (valid: all, "),
    ({"gpu-pool-instance-types": {"allowedInstanceType": ["g6.12xlarge"]}},
     "gpu-pool-instance-types: 'allowedInstanceType' is not a key of this policy; did you mean "
     "'allowedInstanceTypes'? (valid: enforcementLevel, allowedInstanceTypes)"),
    ({"required-tags": "mandatry"}, "required-tags: enforcement level 'mandatry' is not a level; did you mean "
                                    "'mandatory'? (valid: advisory, mandatory, remediate, disabled)"),
], ids=["policy", "key", "level"])
def test_policy_check_names_a_misspelt_policy_key_or_level_with_the_valid_ones(documents, tmp_path, config, words):
    path, config_path = tmp_path / "plan.json", tmp_path / "config.json"
    path.write_text(json.dumps(documents["dev"][1]))
    config_path.write_text(json.dumps(config))
    result = plan("--policy-check", path, "--policy-config", config_path)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    if "valid: all, " in words:     # every policy of the pack is listed
        from policy.policies import POLICIES
        assert all(p.name in result.stderr for p in POLICIES)


# --- CLI conventions: where the document, the report and the diagnostics go ----------------------------------------
@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli")
    forbid = directory / "forbid-g6.json"       # a pack config that forbids dev's g6.12xlarge: exit 1
    forbid.write_text(json.dumps({"gpu-pool-instance-types": {"allowedInstanceTypes": ["g6e.12xlarge"]}}))
    argvs = {"json to stdout": ["dev", "--json", "-"],
             "quiet json": ["dev", "--quiet", "--json", "-"],
             "quiet": ["dev", "--quiet", "--no-policy"],
             "--stack and a file": ["--stack", "dev", "--no-policy", "--json", directory / "dev.json"],
             "violation": ["dev", "--policy-config", forbid],
             "quiet violation": ["dev", "--quiet", "--policy-config", forbid],
             "two stacks": ["dev", "--stack", "prod-us-east-1"],
             "force alone": ["dev", "--force"]}
    results = PlanProcess(list(argvs.values()), directory / "results.json").results()
    return dict(zip(argvs, results)), directory


def test_json_dash_writes_the_document_to_stdout_and_the_report_to_stderr(cli_runs):
    runs, _ = cli_runs
    result = runs["json to stdout"]
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["stack"] == "dev" and document_problems(document) == []
    assert result.stderr.startswith("gpu-cloud plan: stack dev (project gpu-cloud, region us-east-1)")
    assert "plan document written to" not in result.stderr + result.stdout
    assert not (ROOT / "-").exists()


def test_quiet_prints_the_summary_alone(cli_runs):
    runs, _ = cli_runs
    quiet_json = runs["quiet json"]                # the document alone on stdout, the summary where the report goes
    assert quiet_json.returncode == 0, quiet_json.stderr
    document = json.loads(quiet_json.stdout)
    assert quiet_json.stderr.splitlines() == _summary_expected(document)[:-1]
    quiet = runs["quiet"]
    assert (quiet.returncode, quiet.stderr) == (0, "")
    assert quiet.stdout.splitlines()[:4] == quiet_json.stderr.splitlines()[:4]
    assert quiet.stdout.splitlines()[4:] == ["  policy    not run (--no-policy)", "  warnings  none"]


def test_diagnostics_go_to_stderr_and_the_report_to_stdout(cli_runs):
    runs, directory = cli_runs
    written = runs["--stack and a file"]           # --stack names the stack as the positional does
    assert written.returncode == 0 and written.stdout.startswith("gpu-cloud plan: stack dev "), written.stderr
    assert written.stderr == f"plan document written to {directory / 'dev.json'}\n"
    assert "written to" not in written.stdout and json.loads((directory / "dev.json").read_text())["stack"] == "dev"
    violation = runs["violation"]
    assert violation.returncode == 1
    assert "[mandatory] gpu-pool-instance-types: " in violation.stdout          # the report's Policy section
    assert violation.stderr.splitlines() == [
        "python -m plan: exit 1: 1 mandatory policy violation(s) as an update shows it (gpu-pool-instance-types); "
        "the report's Policy section lists them"]
    quiet = runs["quiet violation"]                # the summary alone: the violations themselves on stderr
    assert quiet.returncode == 1 and "Policy (pack" not in quiet.stdout
    assert quiet.stdout.splitlines()[4].startswith("  policy    update: 1 violation(s), 1 mandatory; "), quiet.stdout
    assert quiet.stderr.splitlines()[1].startswith("  [mandatory] gpu-pool-instance-types: pool dev-gpu-spot "), \
        quiet.stderr


def test_stack_named_twice_and_force_without_against_are_usage_errors(cli_runs):
    runs, _ = cli_runs
    assert runs["two stacks"].returncode == 4
    assert "the stack is named twice: dev and --stack prod-us-east-1" in runs["two stacks"].stderr
    assert runs["force alone"].returncode == 4 and "--force has nothing to force" in runs["force alone"].stderr


@pytest.mark.parametrize("setting", ["always", "error"])
def test_a_users_python_warnings_setting_adds_no_library_noise(setting, tmp_path):
    # The SDKs' deprecation notices and the runtime's unclosed event loops are not the user's to fix: a clean plan
    # prints nothing on stderr, a config error only its own lines, whether warnings are shown or made errors.
    env = dict(os.environ, PYTHONWARNINGS=setting)
    clean = plan("dev", "--no-policy", env=env)
    assert clean.returncode == 0 and clean.stderr == "", clean.stderr[-2000:]
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    stack["config"]["gpu-cloud:nodePools"][0]["desiredNodes"] = 9
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(stack))
    broken = plan("dev", "--stack-file", path, env=env)
    assert broken.returncode == 2 and broken.stderr.splitlines() == [
        f"config error in stack dev: invalid stack config in {path} (1 mistake):",
        "  - gpu-cloud:nodePools[0] (pool dev-gpu-spot): needs minNodes <= desiredNodes <= maxNodes; got 0, 9, 3"], broken.stderr


def test_an_aws_key_the_provider_would_not_get_is_a_config_error(tmp_path):
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    stack["config"]["aws:skipMetadataApiCheck"] = True
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(stack))
    result = plan("dev", "--stack-file", path)
    assert result.returncode == 2
    assert "aws:skipMetadataApiCheck: is not passed to gpu-cloud's AWS provider" in result.stderr


def test_a_config_error_found_at_run_time_is_exit_2_without_traceback(tmp_path):
    # use1-az7 passes the static checks, but the offline plan's account (us-east-1's gpuZoneIds: use1-az1..az6)
    # does not have it; no account was read, so the one mistake names the data, never "this account"
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    stack["config"]["gpu-cloud:network"]["zones"] = ["use1-az1", "use1-az7"]
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(stack))
    result = plan("dev", "--stack-file", path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "invalid stack config (1 mistake):" in result.stderr
    assert ("gpu-cloud:network.zones[1]: use1-az7 is not among the zones of us-east-1 that offer a catalog GPU type, as "
            "decisions/network/zones.yaml gpuZoneIds (EC2 offerings as of 2025-H1) records them") in result.stderr
    assert "this account" not in result.stderr


def test_make_plan_exits_1_on_a_mandatory_violation_and_shows_it(documents, tmp_path):
    text, _ = documents["prod-us-east-1"]
    assert "Policy (pack gpu-cloud v1.0.0), as an update shows it: no violations" in text
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"gpu-pool-instance-types": {"allowedInstanceTypes": ["p5.48xlarge"]}}))
    result = plan("prod-us-east-1", "--policy-config", config)
    assert result.returncode == 1, result.stderr
    assert "[mandatory] gpu-pool-instance-types: pool infer-l40s launches g6e.12xlarge" in result.stdout


def test_the_document_records_what_protects_running_capacity(documents):
    resources = {r["name"]: r for r in documents["dev"][1]["resources"]}
    asg = resources["dev-gpu-spot-asg"]
    assert asg["ignoreChanges"] == ["desiredCapacity", "initialLifecycleHooks", "suspendedProcesses"]
    assert asg["customTimeouts"] == {"delete": "25m"}
    assert resources["cluster-system"]["ignoreChanges"] == ["scalingConfig.desiredSize"]
    # The pool's hooks go with its group, so deleting the pool still drains its nodes through them.
    assert {resources[f"dev-gpu-spot-hook-{hook}"]["deletedWith"] for hook in ("gpu-cloud-verify", "gpu-cloud-drain")} \
        == {asg["urn"]}
    assert all(set(r) >= {"ignoreChanges", "replaceOnChanges", "deleteBeforeReplace", "customTimeouts", "aliases",
                          "deletedWith"} for r in resources.values())


def test_an_encrypted_webhook_is_planned_and_shown_nowhere(tmp_path):
    """`pulumi config set --secret gpu-cloud:alertWebhookUrl ...` writes ciphertext the offline plan cannot read: the
    plan still routes alerts to a webhook, and neither the ciphertext nor its stand-in appears in text or document."""
    stack = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    stack["config"]["gpu-cloud:alertWebhookUrl"] = {"secure": "v1:Zm9vYmFyQ2lwaGVydGV4dA==:notreallyencrypted"}
    path, out = tmp_path / "Pulumi.dev.yaml", tmp_path / "dev.json"
    path.write_text(yaml.safe_dump(stack))
    result = plan("dev", "--stack-file", path, "--json", out)
    assert result.returncode == 0, result.stderr
    assert "alerts to the stack's webhook (gpu-cloud:alertWebhookUrl, a secret)" in result.stdout
    document = out.read_text()
    for leak in ("Zm9vYmFyQ2lwaGVydGV4dA", "notreallyencrypted", "encrypted-in-the-stack-file"):
        assert leak not in result.stdout and leak not in document
    (secret,) = [r for r in json.loads(document)["resources"] if r["type"] == "kubernetes:core/v1:Secret"
                 and "stringData" in r["inputs"]]     # JobSet's webhook certificate Secret has no payload of its own
    assert secret["inputs"]["stringData"] == "[secret]"


def test_a_plaintext_webhook_in_config_reaches_only_the_secret():
    url = "https://hooks.example.com/services/T0/B0/PLAINTEXTTOKEN123"
    run = run_stack("dev", {"gpu-cloud:alertWebhookUrl": url})
    assert not [r.urn for r in run.resources if "PLAINTEXTTOKEN123" in json.dumps(r.inputs, default=str)]
    assert "PLAINTEXTTOKEN123" not in json.dumps(run.outputs, default=str)


def test_make_alone_lists_the_targets_and_plan_passes_its_options_through():
    listed = subprocess.run(["make", "-s", "-C", str(ROOT)], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    assert [line.split()[1] for line in listed.stdout.splitlines() if line.startswith("make ")] == [
        "plan", "check", "test", "clean"]
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "plan", "STACK=dev", "JSON=p.json", "DIAGRAM=d.svg",
                          "ARGS=--no-policy"], capture_output=True, text=True, timeout=60)
    assert ".venv/bin/python -m plan dev --json p.json --diagram d.svg --no-policy" in dry.stdout
    check = subprocess.run(["make", "-n", "-C", str(ROOT), "check", "PLAN=p.json"], capture_output=True, text=True,
                           timeout=60)
    assert ".venv/bin/python -m plan --policy-check p.json" in check.stdout


def test_make_refuses_a_python_older_than_3_11_before_creating_anything(tmp_path):
    # A copy of the Makefile and requirements in a folder without .venv; PYTHON is a real interpreter pretending
    # to be 3.10 (sys.version_info is what the check reads).
    for name in ("Makefile", "requirements.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    old = tmp_path / "python3.10"
    old.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.version_info = (3, 10, 14)\n"
                   "exec(compile(sys.argv[1], \"-c\", \"exec\"))' \"$2\"\n")
    old.chmod(0o755)
    result = subprocess.run(["make", "-C", str(tmp_path), "plan", f"PYTHON={old}"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "gpu-cloud needs Python 3.11 or newer" in result.stderr, result.stderr
    assert "PYTHON=python3.11" in result.stderr and not (tmp_path / ".venv").exists()


def _python_claiming(path, version):
    """A real interpreter that reports `version` (sys.version_info is what the Makefile's checks read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.version_info = {version!r}\n"
                    "exec(compile(sys.argv[1], \"-c\", \"exec\"))' \"$2\"\n")
    path.chmod(0o755)
    return path


def _make_copy(tmp_path):
    for name in ("Makefile", "requirements.txt", "requirements-dev.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    return tmp_path


def test_make_names_a_missing_interpreter_as_missing(tmp_path):
    _make_copy(tmp_path)
    result = subprocess.run(["make", "-C", str(tmp_path), "plan", "PYTHON=/nonexistent/python3.12"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr          # make's own code for a failed recipe
    assert "/nonexistent/python3.12: not found; install Python 3.11 or newer" in result.stderr, result.stderr
    assert "is not. Use" not in result.stderr and not (tmp_path / ".venv").exists()


def test_make_rebuilds_a_venv_of_another_python_when_python_is_named(tmp_path):
    _make_copy(tmp_path)
    _python_claiming(tmp_path / ".venv/bin/python", (3, 10, 14))       # a .venv made by another Python
    (tmp_path / ".venv/.installed").touch()
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"

    def dry(*args):
        return subprocess.run(["make", "-n", "--no-print-directory", "-C", str(tmp_path), "plan", *args],
                              capture_output=True, text=True, timeout=60).stdout

    named = dry(f"PYTHON={sys.executable}")
    assert f".venv has Python 3.10 and PYTHON={sys.executable} is {running}: rebuilding .venv with it" in named
    assert "rm -rf .venv" in named and f"{sys.executable} -m venv .venv" in named
    # PYTHON not named: the existing .venv is used as it is; named and of the .venv's version: nothing to rebuild.
    assert "rebuilding" not in dry() and "rm -rf" not in dry()
    _python_claiming(tmp_path / ".venv/bin/python", tuple(sys.version_info[:3]))
    (tmp_path / ".venv/.installed").touch()
    assert [line.strip() for line in dry(f"PYTHON={sys.executable}").splitlines() if line.strip()] == [
        ".venv/bin/python -m plan prod-us-east-1"]


def test_the_readmes_failure_table_gives_makes_exit_code_and_the_plans(tmp_path):
    # make exits 2 whenever a recipe fails (GNU make manual, "Running make": "The exit status of make is always one
    # of three values: 0 ... 2 ... 1 (-q)"); its "Error N" line carries python -m plan's own code.
    forbid = tmp_path / "forbid.json"
    forbid.write_text(json.dumps({"gpu-pool-instance-types": {"allowedInstanceTypes": ["g6e.12xlarge"]}}))

    def make(*args):      # -o: never reinstall .venv here, whatever requirements.txt's time
        return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "-C", str(ROOT), *args],
                              capture_output=True, text=True, timeout=300)

    violation = make("plan", "STACK=dev", f"ARGS=--quiet --policy-config {forbid}")
    missing_document = make("check", f"PLAN={tmp_path / 'missing.json'}")
    assert (violation.returncode, missing_document.returncode) == (2, 2)
    assert re.search(r"\] Error 1$", violation.stderr, re.M) and "mandatory policy violation" in violation.stderr
    assert re.search(r"\] Error 2$", missing_document.stderr, re.M) and "make plan JSON=" in missing_document.stderr
    rows = dict(re.findall(r"^\| `([^`]+)`[^|]* \| (.+) \|$", (ROOT / "README.md").read_text(), re.M))
    assert "`make` itself exits 2 on any failure; its `Error N` is `python -m plan`'s code" in rows["make plan"]
    assert "mandatory policy failed" in rows["Error 1"]
    assert "config error" in rows["Error 2"] and "plan document missing or not valid" in rows["Error 2"]
    assert "make plan exits 1" not in " ".join(rows).replace("`", "")


def test_the_text_has_no_trailing_spaces_and_a_tree_of_components(documents):
    for stack, (text, document) in documents.items():
        assert [line for line in text.splitlines() if line != line.rstrip()] == [], stack


def _tree(text: str) -> List[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Resources: "))
    return lines[start + 1:lines.index("", start)]


def test_the_resource_tree_nests_components_and_its_counts_add_up(documents):
    text, document = documents["dev"]
    tree = _tree(text)
    # A component, its resources by type and count one level in, then its own components one level in.
    at = tree.index("  autoscaler (gpu-cloud:autoscaler:ClusterAutoscaler): 5")
    assert tree[at + 1:at + 6] == [
        "      1 x kubernetes:helm.sh/v3:Release",
        "    autoscaler-identity (gpu-cloud:iam:ServiceAccountRole): 3",
        "        1 x aws:eks/podIdentityAssociation:PodIdentityAssociation",
        "        1 x aws:iam/role:Role",
        "        1 x aws:iam/rolePolicy:RolePolicy"]
    # Each component's figure is everything beneath it; the top level adds up to the whole plan.
    for i, line in enumerate(tree):
        heading = re.fullmatch(r"( *)(?:\S+ \(gpu-cloud:\S+\)|\(stack level\)): (\d+)", line)
        if not heading:
            continue
        indent, figure = heading.groups()
        below, j = 0, i + 1
        while j < len(tree) and len(tree[j]) - len(tree[j].lstrip()) > len(indent):
            counted = re.fullmatch(r" *(\d+) x \S+", tree[j])
            below += int(counted.group(1)) if counted else 1
            j += 1
        assert below == int(figure), line
    top = [line for line in tree if re.match(r"  \S", line)]
    assert sum(int(line.rsplit(": ", 1)[1]) + (0 if line.startswith("  (stack level)") else 1) for line in top) == \
        len(document["resources"])


def test_pools_keep_the_stack_file_order_in_every_section(documents):
    text, document = documents["prod-us-east-1"]
    in_file = ["train-h100", "finetune-a100-80gb-spot", "finetune-a100-40gb-spot", "infer-l40s"]  # the stack file's order
    assert [row["pool"] for row in document["capacity"]] == in_file
    assert [p["pool"] for p in document["cost"]["pools"]] == in_file
    assert [p["pool"] for p in document["platform"]["pools"]] == in_file
    tree_pools = [line.split()[0] for line in _tree(text) if "(gpu-cloud:nodepool:GpuNodePool)" in line]
    assert tree_pools == in_file
    # The tree reads like the architecture: network, cluster, pools, storage, then the platform.
    top = [line.split()[0] for line in _tree(text) if re.match(r"  [a-z]", line)]
    assert top[:2] == ["network", "cluster"] and top[2:6] == in_file and top[6] in ("artifacts", "checkpoints")


def test_whole_numbers_stay_integers_in_the_document(documents):
    _, document = documents["prod-us-east-1"]
    assert isinstance(document["cost"]["budgetMaxHourlyUsd"], int)     # maxHourlyUsd: 450 in the stack file
    keys = [r for r in document["resources"] if r["type"] == "aws:kms/key:Key"]
    assert keys and all(k["inputs"]["deletionWindowInDays"] == 30 and type(k["inputs"]["deletionWindowInDays"]) is int
                        for k in keys)
    group = next(r for r in document["resources"] if r["type"] == "aws:autoscaling/group:Group")
    assert type(group["inputs"]["maxSize"]) is int
    # A fraction stays a fraction.
    assert document["cost"]["hourlyAtDesired"] != int(document["cost"]["hourlyAtDesired"])


# --- --dr-pair: two stacks checked as a DR pair (decisions/serving/dr_pair.py; tests/test_dr_pair.py has the rules)
# -----------------
@pytest.fixture(scope="module")
def dr_pair_runs(tmp_path_factory):
    argvs = {"shipped": ["--dr-pair", "prod-us-east-1", "prod-eu-west-1"],
             "swapped": ["--dr-pair", "prod-eu-west-1", "prod-us-east-1"],
             "unknown": ["--dr-pair", "prod-us-east-1", "nope"],
             "with a stack": ["dev", "--dr-pair", "prod-us-east-1", "prod-eu-west-1"],
             "twice the same": ["--dr-pair", "dev", "dev"],
             "one stack": ["--dr-pair", "dev"]}
    directory = tmp_path_factory.mktemp("dr-pair")
    return dict(zip(argvs, PlanProcess(list(argvs.values()), directory / "results.json").results()))


def test_dr_pair_prints_the_pair_and_each_term_of_its_recovery_time(dr_pair_runs):
    result = dr_pair_runs["shipped"]
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("DR pair: prod-us-east-1 (primary, us-east-1) and prod-eu-west-1 (secondary, eu-west-1), "
                        "routing failover")
    assert "  GPUs            L40S (ada) and A10G (ampere): models declared portable in both" in lines
    assert "  capacity        prod-eu-west-1 grows to 8 GPU slots; prod-us-east-1 always runs 2" in lines
    assert ("  recovery point  15 min: S3 Replication Time Control is designed to replicate 99.99 % of objects within "
            "15 minutes, and its SLA commits to 99.9 % a month, with service credits below that; target 15 min"
            in lines)
    recovery = lines[lines.index("Recovery time if prod-us-east-1 fails, carrying its minimum (2 replicas), "
                                 "an estimate:") + 1:]
    assert [line.split()[:3] for line in recovery[:4]] == [
        ["detection", "210", "s"], ["DNS", "TTL", "60"], ["scale-up", "0", "s"], ["total", "270", "s"]]
    assert recovery[4].startswith("  not counted: in detection, ")
    assert recovery[5] == "Carrying its maximum (8 replicas): 3,325 s (55.4 min), of which scale-up 3,055 s"


def test_a_dr_pair_that_does_not_hold_exits_2_naming_each_stack_and_key(dr_pair_runs):
    result = dr_pair_runs["swapped"]
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "DR pair prod-eu-west-1 and prod-us-east-1 does not hold (2 mistakes):",
        "  - prod-eu-west-1: gpu-cloud:dr.role: is secondary; a pair is a primary, then a secondary",
        "  - prod-us-east-1: gpu-cloud:dr.role: is primary; a pair is a primary, then a secondary"]
    unknown = dr_pair_runs["unknown"]
    assert unknown.returncode == 2 and "config error in stack nope: no stack file" in unknown.stderr


@pytest.mark.parametrize("case, words", [
    ("with a stack", "--dr-pair takes two stack names and nothing else, not STACK"),
    ("twice the same", "--dr-pair needs two different stacks"),
    ("one stack", "argument --dr-pair: expected 2 arguments"),
])
def test_dr_pair_usage_errors_exit_4(dr_pair_runs, case, words):
    result = dr_pair_runs[case]
    assert result.returncode == 4 and words in result.stderr and result.stdout == "", result.stderr
