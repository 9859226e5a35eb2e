"""The whole program (__main__.py) for each shipped stack, under the shared mocks."""
import base64
import json
import os
import re

import pulumi
import pytest

from decisions.config.validate import load_stack_spec
from decisions.platform import kueue, tenancy
from decisions.serving import lb_controller
from plan.engine import run_program
from plan.stackfile import load_stack
from tests.conftest import STACKS, PlanProcess, run_stack

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"


def pool_parts(run, pool):
    """The launch template, ASG and verifier object registered for one pool."""
    return ([run.one(LT, f"{pool}-lt")], [run.one(ASG, f"{pool}-asg")],
            [run.one("aws:s3/bucketObjectv2:BucketObjectv2", f"{pool}-verifier")])


@pytest.mark.parametrize("stack,efa_counts", [
    ("prod-us-east-1", {"train-h100": 32, "finetune-a100-80gb-spot": 0, "finetune-a100-40gb-spot": 0, "infer-l40s": 0}),
    ("prod-eu-west-1", {"train-a100": 4, "infer-a10g": 0, "infer-a10g-spot": 0}),
    ("dev", {"dev-gpu-spot": 0}),
])
def test_every_gpu_pool_is_gated_wired_and_carries_its_bundle(stack_runs, stack, efa_counts):
    run = stack_runs[stack]
    for pool, efa in efa_counts.items():
        (lt,), (asg,), (bundle,) = pool_parts(run, pool)
        interfaces = lt.inputs["networkInterfaces"]
        assert sum(i.get("interfaceType") == "efa-only" for i in interfaces) == efa
        assert sum(int(i["networkCardIndex"]) == 0 and int(i["deviceIndex"]) == 0 for i in interfaces) == 1
        user_data = base64.b64decode(lt.inputs["userData"])
        assert len(user_data) <= 16384 and b"GPU_CLOUD_ARTIFACT_SHA256" in user_data
        assert bundle.inputs["key"].split("/")[-1].split(".")[0] in user_data.decode()
        hooks = {h["lifecycleTransition"]: h["defaultResult"] for h in asg.inputs["initialLifecycleHooks"]}
        assert hooks["autoscaling:EC2_INSTANCE_LAUNCHING"] == "ABANDON"
        assert lt.inputs["metadataOptions"]["httpTokens"] == "required"
        assert lt.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"


@pytest.mark.parametrize("stack", STACKS)
def test_stateful_resources_are_protected(stack_runs, stack):
    run = stack_runs[stack]
    for type_token in ("aws:eks/cluster:Cluster", "aws:kms/key:Key", "aws:s3/bucket:Bucket"):
        found = run.of_type(type_token)
        assert found and all(r.protect for r in found), type_token
    # FSx exists only where storage.lustre is set (both prod stacks); where it does, it is protected.
    file_systems = run.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert len(file_systems) == (stack != "dev") and all(r.protect for r in file_systems)


@pytest.mark.parametrize("stack", STACKS)
def test_every_aws_resource_gets_the_stack_tags_through_one_provider(stack_runs, stack):
    run = stack_runs[stack]
    provider = run.one("pulumi:providers:aws")
    spec_tags = provider.inputs["defaultTags"]
    assert '"managed-by": "gpu-cloud"' in spec_tags and f'"stack": "{stack}"' in spec_tags
    assert '"team": "ml-platform"' in spec_tags and '"costCenter"' in spec_tags
    for resource in run.resources:
        if resource.custom and resource.type.startswith("aws:"):
            assert resource.provider and resource.provider.startswith(provider.urn), resource.name


@pytest.mark.parametrize("stack", STACKS)
def test_components_follow_the_naming_contract(stack_runs, stack):
    run = stack_runs[stack]
    by_urn = {r.urn: r for r in run.resources}
    for resource in run.resources:
        # Components are ours, except the provider's own (a yaml/v2 ConfigFile is a component of the provider).
        if not resource.custom and not resource.type.startswith("kubernetes:"):
            module, name = resource.type.split(":")[1:]
            assert resource.type.startswith("gpu-cloud:") and name[0].isupper() and module.islower()
        parent = by_urn.get(resource.parent)
        if parent is not None:
            # A release manifest's objects keep yaml/v2's "<prefix>:" (decisions/platform/release_manifest.py).
            separator = ":" if parent.type == "gpu-cloud:release_manifest:ReleaseManifest" else "-"
            assert resource.name.startswith(f"{parent.name}{separator}"), (resource.name, parent.name)


def test_efa_pools_and_pools_that_read_lustre_run_in_one_zone_and_the_rest_span_every_zone(stack_runs):
    """EFA needs one zone; a pool that mounts Lustre without EFA launches in the file system's zone, since reads from
    another zone are billed on both sides (decisions/storage/lustre.py in_file_system_zone); the inference pool,
    which mounts nothing, spans every declared zone."""
    run = stack_runs["prod-us-east-1"]
    (_,), (train,), _ = pool_parts(run, "train-h100")
    (_,), (spot,), _ = pool_parts(run, "finetune-a100-80gb-spot")
    (_,), (infer,), _ = pool_parts(run, "infer-l40s")
    assert len(train.inputs["vpcZoneIdentifiers"]) == 1
    assert spot.inputs["vpcZoneIdentifiers"] == train.inputs["vpcZoneIdentifiers"]
    assert len(infer.inputs["vpcZoneIdentifiers"]) == 3
    assert spot.inputs["mixedInstancesPolicy"]["instancesDistribution"]["spotAllocationStrategy"] == "price-capacity-optimized"


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_boots_its_pinned_release_and_the_autoscaler_waits_out_the_gate(stack_runs, stack):
    run = stack_runs[stack]
    # Read once for every pool (the same release in the same region), and every launch template boots it.
    parameters = [args["name"] for token, args in run.invokes if token == "aws:ssm/getParameter:getParameter"]
    assert parameters == ["/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
                          "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id"]
    assert len({lt.inputs["imageId"] for lt in run.of_type("aws:ec2/launchTemplate:LaunchTemplate")}) == 1
    release = run.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    hooks = [h["heartbeatTimeout"] for asg in run.of_type(ASG) for h in asg.inputs["initialLifecycleHooks"]
             if h["lifecycleTransition"].endswith("LAUNCHING")]
    assert release.inputs["values"]["extraArgs"]["max-node-provision-time"] == "25m0s" and set(hooks) == {1200}


def recording():
    """A monitor factory for run_program that keeps the monitor, so a run that raises still shows what it registered."""
    from plan.engine import RecordingMonitor
    kept = []

    def monitor(mocks):
        kept.append(RecordingMonitor(mocks))
        return kept[-1]
    return monitor, kept


def test_a_bad_config_registers_nothing_and_fails_cleanly():
    from tests.conftest import stack_config
    monitor, kept = recording()
    config = stack_config("dev", {"gpu-cloud:environment": "qa",
                                  "gpu-cloud:network": {"cidr": "10.0.0.0/16", "azCnt": 2}})
    with pytest.raises(pulumi.RunError) as raised:
        run_program(config, stack="dev", monitor=monitor)
    message = str(raised.value)
    assert "gpu-cloud:environment" in message and "gpu-cloud:network.azCnt" in message
    # Not even the AWS provider: the config is refused before anything is registered.
    assert len(kept) == 1 and [r.urn for r in kept[0].registrations] == []


def test_an_ami_parameter_ssm_does_not_have_fails_before_anything_but_the_provider_is_registered(monkeypatch):
    """The node image's AMI is read in prepare: a release whose parameter the region lacks is a config mistake
    found before the VPC, the cluster and the buckets are registered, not a half-built stack."""
    from plan.engine import GpuCloudMocks
    from tests.conftest import stack_config
    answer = GpuCloudMocks.call

    def call(self, args):
        if args.token == "aws:ssm/getParameter:getParameter":
            return {}, [("name", f"ParameterNotFound: {args.args['name']}")]
        return answer(self, args)
    monkeypatch.setattr(GpuCloudMocks, "call", call)
    monitor, kept = recording()
    with pytest.raises(pulumi.RunError) as raised:
        run_program(stack_config("dev"), stack="dev", monitor=monitor)
    assert "gpu-cloud:gpuDriver: the AMI of release" in str(raised.value)
    assert "could not be read from SSM (/aws/service/eks/optimized-ami/" in str(raised.value)
    assert [r.type for r in kept[0].registrations] == ["pulumi:providers:aws"]


def test_independent_account_problems_are_one_error():
    """The transit gateway the account cannot see and a team given the deployer's role need nothing from each
    other: both are in the one error, not the first alone."""
    from plan.engine import offline_account
    from tests.conftest import stack_config
    account = offline_account("us-east-1", stack_config("dev"))
    account.transit_gateways = ()
    account.caller_arn = "arn:aws:sts::123456789012:assumed-role/gpu-cloud-ci/run-7"
    config = {"gpu-cloud:tenancy": {"teams": {"training": {"roleArns": ["arn:aws:iam::123456789012:role/gpu-cloud-ci"]}}}}
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", config, account=account)
    message = str(raised.value)
    assert "(2 mistakes)" in message
    assert "gpu-cloud:network.transitGateway.id: tgw-0c1d2e3f405162738 could not be read" in message
    assert "gpu-cloud:tenancy.teams.training.roleArns: arn:aws:iam::123456789012:role/gpu-cloud-ci runs Pulumi" in message


def test_zone_and_quota_problems_found_in_the_account_are_one_error():
    """Once the account is read, the zones (resolve_layout) and the quotas (the preflight) are checked side by side."""
    from plan.engine import offline_account
    from tests.conftest import stack_config
    config = stack_config("dev")
    account = offline_account("us-east-1", config)
    offered = set().union(*account.offerings.values())
    account.offerings = {zone: frozenset() for zone in account.offerings}     # no GPU type offered anywhere
    account.quotas = {code: 0.0 for code in account.quotas}                   # and no vCPU to launch one
    with pytest.raises(pulumi.RunError) as raised:
        run_program(config, stack="dev", account=account)
    message = str(raised.value)
    assert offered and "(2 mistakes)" in message
    assert "gpu-cloud:nodePools[0].instanceTypes (pool dev-gpu-spot): g6.12xlarge: no zone of network.zones offers it" \
        in message
    assert "gpu-cloud:nodePools[0].desiredNodes (pool dev-gpu-spot): the vCPU quota L-3819A6DF" in message


def test_program_and_plan_validate_the_same_way(stack_runs):
    from plan.stackfile import load_stack_config, project_keys
    config = load_stack_config("prod-us-east-1")
    spec = load_stack_spec(project_keys(config), stack="prod-us-east-1", region=config["aws:region"])
    assert sorted(p.name for p in spec.pools) == sorted(a.name.removesuffix("-asg")
                                                        for a in stack_runs["prod-us-east-1"].of_type(ASG))


def _policies(run, action):
    return [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if action in r.inputs["policy"]]


SSM_CORE = lambda run: any(r.inputs["policyArn"].endswith("/AmazonSSMManagedInstanceCore")  # noqa: E731
                           for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"))
# Each interface endpoint's consumer in the program: an endpoint nothing here calls would only cost money.
ENDPOINT_CONSUMERS = {
    "ecr.api": lambda run: bool(run.of_type("aws:eks/addon:Addon")),          # add-on images live in ECR
    "ecr.dkr": lambda run: bool(run.of_type("aws:eks/addon:Addon")),
    "ec2": lambda run: bool(_policies(run, "ec2:CreateTags")) and bool(run.one("aws:eks/addon:Addon", "cluster-vpc-cni")),
    "eks-auth": lambda run: bool(run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")),
    "autoscaling": lambda run: bool(_policies(run, "autoscaling:CompleteLifecycleAction"))
    and bool(run.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")),
    "sqs": lambda run: bool(run.of_type("aws:sqs/queue:Queue")),
    "ssm": SSM_CORE, "ssmmessages": SSM_CORE, "ec2messages": SSM_CORE,
}


def test_every_interface_endpoint_has_a_consumer(stack_runs):
    from components.network import INTERFACE_ENDPOINTS

    run = stack_runs["prod-us-east-1"]
    assert set(INTERFACE_ENDPOINTS.values()) == set(ENDPOINT_CONSUMERS)
    endpoints = {e.inputs["serviceName"].removeprefix("com.amazonaws.us-east-1.")
                 for e in run.of_type("aws:ec2/vpcEndpoint:VpcEndpoint") if e.inputs["vpcEndpointType"] == "Interface"}
    assert endpoints == set(ENDPOINT_CONSUMERS)
    for service, consumer in ENDPOINT_CONSUMERS.items():
        assert consumer(run), f"nothing in the program uses the {service} endpoint"


# --- the first `pulumi up`: order, identity, reachability ------------------------------------------------

EKS_API_TYPES = ("aws:eks/accessEntry:AccessEntry", "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
                 "aws:eks/addon:Addon", "aws:eks/podIdentityAssociation:PodIdentityAssociation",
                 "aws:eks/nodeGroup:NodeGroup")


def waits_for(run, resource) -> set:
    """Every URN the engine makes `resource` wait for: its dependencies and its provider, transitively."""
    by_urn = {r.urn: r for r in run.resources}
    seen, todo = set(), [resource.urn]
    while todo:
        current = by_urn.get(todo.pop())
        if current is None:
            continue
        edges = list(current.dependencies) + ([current.provider.rsplit("::", 1)[0]] if current.provider else [])
        for urn in edges:
            if urn not in seen:
                seen.add(urn)
                todo.append(urn)
    return seen


@pytest.mark.parametrize("stack", STACKS)
def test_everything_that_calls_the_eks_api_waits_for_the_cluster(stack_runs, stack):
    run = stack_runs[stack]
    cluster = run.one("aws:eks/cluster:Cluster").urn
    callers = [r for r in run.resources if r.type in EKS_API_TYPES or r.type.startswith("kubernetes:")]
    assert len(callers) > 10
    late = [r.urn for r in callers if cluster not in waits_for(run, r)]
    assert late == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_provider_read_goes_through_the_stacks_own_aws_provider(stack_runs, stack):
    run = stack_runs[stack]
    provider = run.one("pulumi:providers:aws")
    used = {ref.rsplit("::", 1)[0] for token, ref in run.invoke_providers if token.startswith("aws:")}
    assert used == {provider.urn}
    assert len(run.invoke_providers) >= 8      # zones, offerings, caller, session, partition, region, AMIs, ...


def test_the_aws_provider_takes_the_stacks_aws_settings():
    role = "arn:aws:iam::123456789012:role/deploy"
    run = run_stack("dev", {"aws:profile": "platform", "aws:assumeRoles": [{"roleArn": role, "sessionName": "ci"}],
                            "aws:allowedAccountIds": ["123456789012"]})
    inputs = run.one("pulumi:providers:aws").inputs
    assert inputs["profile"] == "platform" and inputs["region"] == "us-east-1"
    assert json.loads(inputs["assumeRoles"]) == [{"roleArn": role, "sessionName": "ci"}] \
        if isinstance(inputs["assumeRoles"], str) else inputs["assumeRoles"] == [{"roleArn": role, "sessionName": "ci"}]
    assert "123456789012" in str(inputs["allowedAccountIds"])


def test_the_identity_running_pulumi_becomes_cluster_admin():
    from plan.engine import offline_account
    from tests.conftest import stack_config
    account = offline_account("us-east-1", stack_config("dev"))
    account.caller_arn = "arn:aws:sts::123456789012:assumed-role/gpu-cloud-ci/run-42"
    account.role_paths = {"gpu-cloud-ci": "/ci/"}
    run = run_stack("dev", account=account)
    entries = {e.inputs["principalArn"]: e for e in run.of_type("aws:eks/accessEntry:AccessEntry")
               if e.inputs.get("type") == "STANDARD"}
    # the session's role, with the path only IAM knows (the session ARN drops it)
    assert set(entries) == {"arn:aws:iam::123456789012:role/ml-platform-dev", "arn:aws:iam::123456789012:role/ci/gpu-cloud-ci"}
    provider = run.one("pulumi:providers:kubernetes")
    grants = [g.urn for g in run.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")]
    assert set(grants) <= set(provider.dependencies)


def test_the_shipped_stacks_run_as_an_admin_role_and_need_no_extra_entry(stack_runs):
    run = stack_runs["prod-us-east-1"]
    standard = [e for e in run.of_type("aws:eks/accessEntry:AccessEntry") if e.inputs.get("type") == "STANDARD"]
    assert [e.inputs["principalArn"] for e in standard] == ["arn:aws:iam::123456789012:role/ml-platform-admin"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_deployers_network_is_routed_and_admitted_before_kubernetes_is_used(stack_runs, stack):
    run = stack_runs[stack]
    provider = run.one("pulumi:providers:kubernetes")
    routes = [r for r in run.of_type("aws:ec2/route:Route") if r.inputs.get("destinationCidrBlock") == "10.0.0.0/22"]
    rules = [r for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
             if r.inputs.get("cidrIpv4") == "10.0.0.0/22"]
    zones = len(run.of_type("aws:ec2/routeTable:RouteTable")) - 1          # one private table per zone, one public
    assert len(routes) == zones and all(r.inputs["transitGatewayId"].startswith("tgw-") for r in routes)
    assert len(rules) == 1 and rules[0].inputs["fromPort"] == 443
    assert {r.urn for r in routes + rules} <= waits_for(run, provider)
    attachment = run.one("aws:ec2transitgateway/vpcAttachment:VpcAttachment")
    assert all(attachment.urn in r.dependencies for r in routes)


def test_a_transit_gateway_the_account_cannot_see_is_a_config_error():
    from plan.engine import offline_account
    from tests.conftest import stack_config
    account = offline_account("us-east-1", stack_config("dev"))
    account.transit_gateways = ()
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", account=account)
    assert "gpu-cloud:network.transitGateway.id: tgw-0c1d2e3f405162738 could not be read" in str(raised.value)


def test_config_set_the_way_the_engine_may_pass_it_is_read(monkeypatch):
    # The engine may hand a key to the program as its own PULUMI_CONFIG_<KEY> variable; the public Config API
    # reads it, a walk over the runtime's config store would not.
    from tests.conftest import stack_config
    config = stack_config("dev")
    config.pop("gpu-cloud:budget", None)
    monkeypatch.setenv("PULUMI_CONFIG_GPU_CLOUD_BUDGET", json.dumps({"maxHourlyUsd": 1}))
    with pytest.raises(pulumi.RunError) as raised:
        run_program(config, stack="dev")
    assert "gpu-cloud:budget.maxHourlyUsd" in str(raised.value)


# --- later runs: deletion order and the same bytes every time -------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_the_drain_handler_outlives_the_pools_it_drains(stack_runs, stack):
    # Deletion runs dependents first: every group must depend on the handler, and nothing of the handler on a group.
    run = stack_runs[stack]
    drain = [r for r in run.resources if r.urn.split("::")[2].startswith("gpu-cloud:node_drain:NodeDrain$") and r.custom]
    release = next(r for r in drain if r.type == "kubernetes:helm.sh/v3:Release")
    groups = run.of_type(ASG)
    assert groups and all({release.urn, *(r.urn for r in drain if r.type.startswith("aws:cloudwatch/eventRule"))}
                          <= set(g.dependencies) for g in groups)
    assert not {g.urn for g in groups} & set().union(*(waits_for(run, r) for r in drain))


@pytest.mark.parametrize("stack", STACKS)
def test_a_destroy_deletes_the_team_namespaces_while_their_controllers_still_run(stack_runs, stack):
    """Pulumi deletes a resource before what it depends on. Objects teams leave in the training and inference
    namespaces carry controllers' finalizers (Kueue's Workloads; the load balancer controller's LoadBalancer
    Services and TargetGroupBindings), which only those controllers remove: each namespace depends on every such
    controller, so the namespaces (and all in them) are gone before the controllers and Kueue's CRDs go."""
    run = stack_runs[stack]
    releases = {r.inputs["name"]: r for r in run.of_type("kubernetes:helm.sh/v3:Release")}
    controllers = [releases[name] for name in (kueue.RELEASE_NAME, lb_controller.RELEASE_NAME) if name in releases]
    serving = load_stack(stack)[1].inference.triton.enabled       # dev serves nothing: no load balancer controller
    assert [r.inputs["name"] for r in controllers] == ["kueue"] + ["aws-load-balancer-controller"] * serving
    namespaces = [r for r in run.of_type("kubernetes:core/v1:Namespace")
                  if r.inputs["metadata"]["name"] in tenancy.TEAM_NAMESPACES]
    assert len(namespaces) == 2
    for namespace in namespaces:
        assert {c.urn for c in controllers} <= waits_for(run, namespace), namespace.name
    # Kueue's own objects and the Triton Service go before their controllers too.
    kueue_objects = [r for r in run.resources if r.type.startswith("kubernetes:kueue.x-k8s.io/")]
    assert kueue_objects and all(releases["kueue"].urn in waits_for(run, r) for r in kueue_objects)
    for service in [r for r in run.of_type("kubernetes:core/v1:Service") if r.inputs["spec"].get("type") == "LoadBalancer"]:
        assert releases["aws-load-balancer-controller"].urn in waits_for(run, service)
    # ... and nothing of a controller waits for a team namespace (that would delete the controller first).
    for controller in controllers:
        assert not {n.urn for n in namespaces} & waits_for(run, controller)


@pytest.fixture(scope="module")
def plans_per_seed(tmp_path_factory):
    """Each stack planned (`python -m plan STACK --json`) under PYTHONHASHSEED 1 and 2: one process per seed
    plans every stack (conftest.PlanProcess), the two processes side by side."""
    directory = tmp_path_factory.mktemp("seeds")
    processes = {seed: PlanProcess([[stack, "--json", directory / f"{stack}.{seed}.json"] for stack in STACKS],
                                   directory / f"results.{seed}.json", env={**os.environ, "PYTHONHASHSEED": seed})
                 for seed in ("1", "2")}
    return {seed: dict(zip(STACKS, process.results())) for seed, process in processes.items()}, directory


@pytest.mark.parametrize("stack", STACKS)
def test_two_runs_in_separate_processes_give_the_same_inputs(plans_per_seed, stack):
    results, directory = plans_per_seed
    documents = []
    for seed in ("1", "2"):
        out = directory / f"{stack}.{seed}.json"
        result = results[seed][stack]
        assert result.returncode == 0, result.stderr
        documents.append({r["urn"]: (r["inputs"], r["dependencies"]) for r in json.loads(out.read_text())["resources"]})
    assert documents[0].keys() == documents[1].keys()
    assert [urn for urn in documents[0] if documents[0][urn] != documents[1][urn]] == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_kubernetes_object_of_the_stack_validates_against_its_kubernetes_version(stack_runs, stack):
    from tests.conftest import stack_config, validate_kubernetes
    version = stack_config(stack)["gpu-cloud:cluster"]["kubernetesVersion"]
    assert validate_kubernetes(stack_runs[stack], version) >= 18      # namespaces, quotas, RBAC, network policies


def test_the_role_running_pulumi_cannot_also_be_a_teams_role():
    from plan.engine import offline_account
    from tests.conftest import stack_config
    account = offline_account("us-east-1", stack_config("dev"))
    account.caller_arn = "arn:aws:sts::123456789012:assumed-role/gpu-cloud-ci/run-7"
    config = {"gpu-cloud:tenancy": {"teams": {"training": {"roleArns": ["arn:aws:iam::123456789012:role/gpu-cloud-ci"]}}}}
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", config, account=account)
    assert "gpu-cloud:tenancy.teams.training.roleArns: arn:aws:iam::123456789012:role/gpu-cloud-ci runs Pulumi" \
        in str(raised.value)


def test_operators_get_a_kubeconfig_without_credentials(stack_runs):
    """Exported in the clear: it names the cluster and runs `aws eks get-token` as whoever uses it, and holds no
    token, key or password."""
    for stack, run in stack_runs.items():
        config = json.loads(run.outputs["kubeconfig"])
        (user,) = config["users"]
        assert set(user["user"]) == {"exec"}, stack
        assert user["user"]["exec"]["command"] == "aws" and "get-token" in user["user"]["exec"]["args"]
        assert config["clusters"][0]["name"] == run.outputs["clusterName"] == f"gpu-cloud-{stack}"
        assert not re.search(r'"(token|client-key-data|password)"', run.outputs["kubeconfig"]), stack


def test_a_dr_peer_whose_stack_file_cannot_be_read_is_warned_about():
    """Without the peer's stack file the two VPCs' CIDRs cannot be compared: the run says so instead of skipping
    the check in silence."""
    from tests.conftest import stack_config
    dr = dict(stack_config("prod-eu-west-1")["gpu-cloud:dr"], peerStack="acme/gpu-cloud/prod-nowhere")
    run = run_stack("prod-eu-west-1", {"gpu-cloud:dr": dr})
    skipped = [w for w in run.warnings if w.startswith("gpu-cloud:dr.peerStack")]
    assert len(skipped) == 1 and "acme/gpu-cloud/prod-nowhere" in skipped[0]
    assert "could not be read" in skipped[0] and "overlap" in skipped[0] and "skipped" in skipped[0]


def test_a_readable_dr_peer_gives_no_such_warning(stack_runs):
    assert not [w for w in stack_runs["prod-eu-west-1"].warnings if w.startswith("gpu-cloud:dr.peerStack")]
