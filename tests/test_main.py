"""The whole program (__main__.py) for each shipped stack, under the shared mocks."""
import base64

import pulumi
import pytest

from spec.validate import load_stack_spec
from tests.conftest import STACKS, run_stack

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
        if not resource.custom:
            module, name = resource.type.split(":")[1:]
            assert resource.type.startswith("gpu-cloud:") and name[0].isupper() and module.islower()
        parent = by_urn.get(resource.parent)
        if parent is not None:
            assert resource.name.startswith(f"{parent.name}-"), (resource.name, parent.name)


def test_spot_pools_span_every_zone_and_efa_pools_one(stack_runs):
    run = stack_runs["prod-us-east-1"]
    (_,), (train,), _ = pool_parts(run, "train-h100")
    (_,), (spot,), _ = pool_parts(run, "finetune-a100-80gb-spot")
    assert len(train.inputs["vpcZoneIdentifiers"]) == 1
    assert len(spot.inputs["vpcZoneIdentifiers"]) == 3
    assert spot.inputs["mixedInstancesPolicy"]["instancesDistribution"]["spotAllocationStrategy"] == "price-capacity-optimized"


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_boots_its_pinned_release_and_the_autoscaler_waits_out_the_gate(stack_runs, stack):
    run = stack_runs[stack]
    parameters = {args["name"] for token, args in run.invokes if token == "aws:ssm/getParameter:getParameter"}
    assert parameters == {"/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
                          "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id"}
    release = run.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    hooks = [h["heartbeatTimeout"] for asg in run.of_type(ASG) for h in asg.inputs["initialLifecycleHooks"]
             if h["lifecycleTransition"].endswith("LAUNCHING")]
    assert release.inputs["values"]["extraArgs"]["max-node-provision-time"] == "25m0s" and set(hooks) == {1200}


def test_a_bad_config_registers_nothing_and_fails_cleanly():
    with pytest.raises(pulumi.RunError) as raised:
        run_stack("dev", {"gpu-cloud:environment": "qa", "gpu-cloud:network": {"cidr": "10.0.0.0/16", "azCnt": 2}})
    message = str(raised.value)
    assert "gpu-cloud:environment" in message and "gpu-cloud:network.azCnt" in message


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
