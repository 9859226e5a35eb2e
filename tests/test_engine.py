"""The shared mock harness answers like AWS would, and records what the engine would see."""
import pulumi
import pulumi_aws as aws

from plan.engine import ACCOUNT_ID
from tests.conftest import run_component


def test_zones_ids_and_arns_are_regional_and_well_formed():
    def build():
        zones = aws.get_availability_zones(state="available")
        pulumi.export("zones", zones.names)
        vpc = aws.ec2.Vpc("v", cidr_block="10.0.0.0/16")
        queue = aws.sqs.Queue("q")
        pulumi.export("vpc", vpc.id)
        pulumi.export("queue", queue.arn)
    run = run_component(build, region="eu-west-1")
    assert run.outputs["zones"] == ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    assert run.outputs["vpc"].startswith("vpc-") and len(run.outputs["vpc"]) == 4 + 17
    assert run.outputs["queue"].startswith(f"arn:aws:sqs:eu-west-1:{ACCOUNT_ID}:q-")


def test_secrets_are_redacted_in_inputs_and_outputs():
    def build():
        aws.ssm.Parameter("p", type="SecureString", value=pulumi.Output.secret("hunter2"))
        pulumi.export("token", pulumi.Output.secret("hunter2"))
    run = run_component(build)
    assert run.one("aws:ssm/parameter:Parameter").inputs["value"] == "[secret]"
    assert run.outputs["token"] == "[secret]"
    assert "hunter2" not in repr(run.resources) + repr(run.outputs)


def test_options_and_parents_are_recorded():
    def build():
        class Box(pulumi.ComponentResource):
            def __init__(self, name):
                super().__init__("gpu-cloud:test:Box", name)
                aws.kms.Key(f"{name}-key", opts=pulumi.ResourceOptions(parent=self, protect=True))
                self.register_outputs({})
        Box("box")
    run = run_component(build)
    box, key = run.one("gpu-cloud:test:Box"), run.one("aws:kms/key:Key")
    assert key.parent == box.urn and key.protect and not box.custom
    assert key.urn.endswith("::gpu-cloud:test:Box$aws:kms/key:Key::box-key")


def test_peer_stack_reference_answers_from_the_peer_stack_file():
    def build():
        peer = pulumi.StackReference("acme/gpu-cloud/prod-eu-west-1")
        pulumi.export("peerRegion", peer.get_output("region"))
        pulumi.export("peerCluster", peer.get_output("clusterName"))
    run = run_component(build, stack="prod-us-east-1")
    assert run.outputs == {"peerRegion": "eu-west-1", "peerCluster": "gpu-cloud-prod-eu-west-1"}


def test_accelerated_ami_comes_from_its_ssm_parameter():
    def build():
        name = "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
        pulumi.export("ami", aws.ssm.get_parameter(name=name).value)
    assert run_component(build).outputs["ami"].startswith("ami-")


def test_a_component_its_provider_builds_at_up_is_named_when_the_run_holds_none_of_its_children():
    """A yaml/v2 ConfigFile or a Helm v4 Chart is a remote component: the provider registers its objects at
    `pulumi up` (pulumi-kubernetes provider/pkg/provider/yaml/v2/yaml.go register), the mocks answer it as
    one resource with no children. The run names it, and the plan warns that the pack did not see its objects."""
    import pulumi_kubernetes as kubernetes

    def build():
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        opts = pulumi.ResourceOptions(provider=k8s)
        kubernetes.yaml.v2.ConfigFile("operator", file="https://example.com/operator.yaml", opts=opts)
        kubernetes.helm.v4.Chart("chart", chart="oci://example.com/charts/x", opts=opts)
        kubernetes.core.v1.Namespace("plain", metadata={"name": "plain"}, opts=opts)

    run = run_component(build)
    assert sorted(r.name for r in run.unexpanded()) == ["chart", "operator"]
    assert sorted(w.split(" ")[0] for w in run.warnings) == ["chart", "operator"]
    assert all("is built by its provider at `pulumi up`" in w for w in run.warnings)


def test_the_shipped_stacks_register_every_object_the_engine_would(stack_runs):
    """No shipped stack has a component whose objects only the provider knows: the plan, the pack and every check
    built on the plan see each object `pulumi up` registers."""
    for stack, run in stack_runs.items():
        assert [f"{r.name} ({r.type})" for r in run.unexpanded()] == [], stack
        assert not [w for w in run.warnings if "is built by its provider" in w], stack
