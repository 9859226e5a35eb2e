"""GPU node pools as registered resources: EFA wiring, capacity targeting, launch template safety,
autoscaler tags, the verification hook and the node's own verifier bundle."""
import base64
import dataclasses
import email
import hashlib
import json

import pulumi
import pytest
import yaml

from components.nodes.nodepool import ClusterConnection, GpuNodePool, NodePoolArgs, read_ami_id
from decisions.nodes import autoscaling, boot
from decisions.nodes import pools as pool_rules
from tests.conftest import run_component
from tests.test_validate import load, valid_config

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
CLUSTER = "gpu-cloud-test"
ZONES = ("use1-az1", "use1-az2", "use1-az4")


def pool_run(pool_fields=None, index=0, mutate=None, partition="aws", dns_suffix="amazonaws.com", nvme_scratch=True):
    """Run one GpuNodePool for nodePools[index] of the test config, with pool fields overridden."""
    config = valid_config()
    config["nodePools"][index].update(pool_fields or {})
    if mutate:
        mutate(config)
    spec = load(config)
    pool = spec.pools[index]

    def build():
        GpuNodePool(pool.name, NodePoolArgs(
            pool=pool, cluster_name=CLUSTER,
            cluster=ClusterConnection(name=CLUSTER, endpoint="https://ABC.gr7.us-east-1.eks.amazonaws.com",
                                      certificate_authority=base64.b64encode(
                                          b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n").decode(),
                                      service_cidr="172.20.0.0/16", security_group_id="sg-0cluster"),
            region="us-east-1", account_id="123456789012", partition=partition, dns_suffix=dns_suffix,
            vpc_id="vpc-0123",
            subnet_ids={z: f"subnet-{z[-1]}" for z in ZONES}, image=spec.node_image, nvme_scratch=nvme_scratch,
            ami_id=read_ami_id(spec.node_image, pulumi.InvokeOptions()),
            zones=ZONES[:1] if pool.spec.availability_zone else ZONES,
            max_temp_c=85, catalog=spec.catalog, artifact_bucket="artifacts-bucket",
            artifact_key_arn="arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-artifacts", lustre_client=False,
            instance_tags=spec.resource_tags))
    return run_component(build), pool


EFA_TYPES = [("p5.48xlarge", 32), ("p4d.24xlarge", 4), ("p5en.48xlarge", 16), ("p6-b200.48xlarge", 8),
             ("g6e.48xlarge", 4), ("g5.48xlarge", 1)]


@pytest.mark.parametrize("itype,count", EFA_TYPES)
def test_efa_pool_wires_one_efa_device_per_card(itype, count):
    run, _ = pool_run({"instanceTypes": [itype], "capacity": "on-demand", "capacityReservationId": None,
                       "desiredNodes": 1, "maxNodes": 2})
    interfaces = run.one(LT).inputs["networkInterfaces"]
    efa = [i for i in interfaces if i.get("interfaceType") == "efa-only"]
    assert len(efa) == count
    assert sorted(int(i["networkCardIndex"]) for i in efa) == list(range(count))
    assert all(int(i["deviceIndex"]) == (1 if int(i["networkCardIndex"]) == 0 else 0) for i in efa)
    primary = [i for i in interfaces if int(i["networkCardIndex"]) == 0 and int(i["deviceIndex"]) == 0]
    assert len(primary) == 1 and "interfaceType" not in primary[0]          # plain ENA primary, no public IP
    assert primary[0]["associatePublicIpAddress"] == "false"
    efa_sg = run.one("aws:ec2/securityGroup:SecurityGroup").state["id"]
    assert all(efa_sg in i["securityGroups"] and "sg-0cluster" in i["securityGroups"] for i in interfaces)


def test_pool_without_efa_has_no_efa_device_placement_group_or_efa_group():
    run, _ = pool_run({"efa": False, "instanceTypes": ["p5.48xlarge"]})
    interfaces = run.one(LT).inputs["networkInterfaces"]
    assert [i.get("interfaceType") for i in interfaces] == [None]
    assert not run.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert not run.of_type("aws:ec2/securityGroup:SecurityGroup")


def test_efa_pool_sits_in_a_cluster_placement_group_in_one_zone_with_self_referencing_rules():
    run, pool = pool_run({"capacity": "on-demand", "capacityReservationId": None})
    group = run.one("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs["strategy"] == "cluster"
    placement = run.one(LT).inputs["placement"]
    assert placement == {"groupName": group.state["name"]}
    assert run.one(ASG).inputs["vpcZoneIdentifiers"] == ["subnet-1"]
    sg = run.one("aws:ec2/securityGroup:SecurityGroup").state["id"]
    for kind in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
                 "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"):
        rule = run.one(kind).inputs
        assert rule["ipProtocol"] == "-1" and rule["securityGroupId"] == sg and rule["referencedSecurityGroupId"] == sg


def test_reserved_pool_targets_only_its_reservation():
    run, _ = pool_run()
    spec = run.one(LT).inputs["capacityReservationSpecification"]
    assert spec == {"capacityReservationPreference": "capacity-reservations-only",
                    "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert "instanceMarketOptions" not in run.one(LT).inputs


def test_capacity_block_pool_uses_the_capacity_block_market_and_targets_the_block():
    run, _ = pool_run({"capacity": "capacity-block", "capacityReservationId": "cr-0aaaaaaaaaaaaaaaa"})
    inputs = run.one(LT).inputs
    assert inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert inputs["capacityReservationSpecification"]["capacityReservationTarget"] == {
        "capacityReservationId": "cr-0aaaaaaaaaaaaaaaa"}
    # A capacity block is placed by AWS: no placement group is made or named.
    assert not run.of_type("aws:ec2/placementGroup:PlacementGroup") and "placement" not in inputs


def test_reservation_made_outside_any_placement_group_launches_under_none():
    # A new cluster group would bind the launch to a spine the reservation was not made in: part of it (or all,
    # with capacity-reservations-only) would fail with InsufficientInstanceCapacity.
    run, pool = pool_run()
    assert pool.efa and pool.spec.capacity == "reserved" and pool.spec.placement_group is None
    assert not run.of_type("aws:ec2/placementGroup:PlacementGroup") and "placement" not in run.one(LT).inputs
    assert run.one("aws:ec2/securityGroup:SecurityGroup")     # still EFA: its own security group


def test_reservation_made_in_a_placement_group_launches_into_that_group():
    run, _ = pool_run({"placementGroup": "research-p5-cluster"})
    assert not run.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert run.one(LT).inputs["placement"] == {"groupName": "research-p5-cluster"}


@pytest.mark.parametrize("itype,efa,pods", [("p5.48xlarge", True, 51), ("p5.48xlarge", False, 100),
                                            ("p5en.48xlarge", True, 110), ("g6e.12xlarge", False, 110)])
def test_nodes_register_with_the_pods_the_cni_can_address(itype, efa, pods):
    run, _ = pool_run({"instanceTypes": [itype], "capacity": "on-demand", "capacityReservationId": None, "efa": efa})
    user_data = base64.b64decode(run.one(LT).inputs["userData"]).decode()
    parts = {p.get_content_type(): p.get_payload() for p in email.message_from_string(user_data).walk()
             if not p.is_multipart()}
    assert yaml.safe_load(parts["application/node.eks.aws"])["spec"]["kubelet"]["config"]["maxPods"] == pods


def test_spot_pool_is_price_capacity_optimized_over_every_type_and_zone():
    run, pool = pool_run({"instanceTypes": ["p5en.48xlarge", "p5e.48xlarge"], "maxNodes": 3}, index=1)   # Triton's 3
    asg = run.one(ASG).inputs
    policy = asg["mixedInstancesPolicy"]
    assert policy["instancesDistribution"]["spotAllocationStrategy"] == "price-capacity-optimized"
    assert policy["instancesDistribution"]["onDemandPercentageAboveBaseCapacity"] == 0
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == ["p5en.48xlarge", "p5e.48xlarge"]
    assert asg["capacityRebalance"] is True
    assert asg["vpcZoneIdentifiers"] == [f"subnet-{z[-1]}" for z in ZONES]
    assert "launchTemplate" not in asg
    assert "capacityReservationSpecification" not in run.one(LT).inputs


def test_launch_template_is_safe_by_default():
    for index in (0, 1):
        run, _ = pool_run(index=index)
        lt = run.one(LT).inputs
        assert lt["metadataOptions"]["httpTokens"] == "required"
        assert lt["metadataOptions"]["httpPutResponseHopLimit"] == 1
        root = lt["blockDeviceMappings"][0]
        assert root["deviceName"] == "/dev/xvda" and root["ebs"]["encrypted"] == "true"
        assert root["ebs"]["volumeType"] == "gp3" and root["ebs"]["volumeSize"] >= 200
        assert lt["monitoring"] == {"enabled": True}
        assert lt["imageId"].startswith("ami-")


@pytest.mark.parametrize("driver,parameter", [
    ({}, "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
         "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id"),
    ({"source": "install", "amiRelease": "v20260505"}, "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/"
     "standard/amazon-eks-node-al2023-x86_64-standard-1.35-v20260505/image_id"),
])
def test_launch_template_boots_the_pinned_release_never_recommended(driver, parameter):
    run, _ = pool_run(mutate=lambda c: c.update(gpuDriver=driver))
    looked_up = [args["name"] for token, args in run.invokes if token == "aws:ssm/getParameter:getParameter"]
    assert looked_up == [parameter]


def test_asg_carries_autoscaler_tags_for_labels_taints_and_resources():
    run, pool = pool_run()
    tags = {t["key"]: t["value"] for t in run.one(ASG).inputs["tags"]}
    for key, value in autoscaling.node_group_tags(pool, CLUSTER, nvme_scratch=True).items():
        assert tags[key] == value
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "8"
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "32"
    assert tags[f"k8s.io/cluster-autoscaler/{CLUSTER}/gpu-pool"] == "owned"
    assert tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
    propagated = [t["key"] for t in run.one(ASG).inputs["tags"] if t["propagateAtLaunch"]]
    assert propagated == ["aws-node-termination-handler/managed"] and tags[propagated[0]] == "true"
    assert tags["team"] == "ml"          # the ASG is not covered by the provider's default tags
    assert tags[f"kubernetes.io/cluster/{CLUSTER}"] == "owned"


@pytest.mark.parametrize("nvme_scratch,storage,pods", [
    # p5.48xlarge: 8 x 3,800 GB of NVMe = 28,312 GiB in RAID0; the kubelet keeps 10 % and 1 GiB back; 51 pods (EFA)
    (True, "25479Gi", "51"),
    # the root volume instead: 500 GiB, less 10 % and 1 GiB
    (False, "449Gi", "51"),
])
def test_the_template_node_offers_the_storage_and_pods_the_node_will(nvme_scratch, storage, pods):
    run, _ = pool_run(nvme_scratch=nvme_scratch)
    tags = {t["key"]: t["value"] for t in run.one(ASG).inputs["tags"]}
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage"] == storage
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/pods"] == pods
    user_data = base64.b64decode(run.one(LT).inputs["userData"]).decode()
    assert f"maxPods: {pods}" in user_data


def test_instances_are_tagged_as_owned_by_the_cluster():
    run, _ = pool_run()
    specs = {s["resourceType"]: s["tags"] for s in run.one(LT).inputs["tagSpecifications"]}
    assert specs["instance"][f"kubernetes.io/cluster/{CLUSTER}"] == "owned"
    assert f"kubernetes.io/cluster/{CLUSTER}" not in specs["volume"]


def test_lifecycle_hooks_gate_launch_and_drain_termination():
    run, _ = pool_run()
    asg = run.one(ASG)
    seeded = {h["lifecycleTransition"]: h for h in asg.inputs["initialLifecycleHooks"]}
    owned = {h.inputs["lifecycleTransition"]: h for h in run.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")}
    for hooks in (seeded, {t: h.inputs for t, h in owned.items()}):
        launch = hooks["autoscaling:EC2_INSTANCE_LAUNCHING"]
        assert launch["defaultResult"] == "ABANDON" and launch["name"] == boot.VERIFY_HOOK_NAME
        assert launch["heartbeatTimeout"] == 1200
        assert hooks["autoscaling:EC2_INSTANCE_TERMINATING"]["defaultResult"] == "CONTINUE"
        assert hooks["autoscaling:EC2_INSTANCE_TERMINATING"]["heartbeatTimeout"] == 900
    assert all(h.inputs["autoscalingGroupName"] == asg.inputs["name"] and asg.urn in h.dependencies
               for h in owned.values())


def test_a_hook_timeout_change_updates_the_hook_and_never_replaces_the_group():
    # The provider replaces a group whose initial hooks change (ForceNew): the group ignores them after
    # creation, and the LifecycleHook resources carry the change as an in-place update.
    ami, install = pool_run()[0], pool_run(mutate=lambda c: c.update(gpuDriver={"source": "install", "branch": "580"}))[0]
    assert "initialLifecycleHooks" in ami.one(ASG).ignore_changes
    timeouts = [{h.inputs["name"]: h.inputs["heartbeatTimeout"] for h in run.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")}
                for run in (ami, install)]
    assert timeouts == [{boot.VERIFY_HOOK_NAME: 1200, "gpu-cloud-drain": 900}, {boot.VERIFY_HOOK_NAME: 3000, "gpu-cloud-drain": 900}]
    assert sorted(h.urn for h in ami.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")) == \
        sorted(h.urn for h in install.of_type("aws:autoscaling/lifecycleHook:LifecycleHook"))


def test_deleting_a_pool_with_nodes_waits_for_them_to_drain():
    asg = pool_run()[0].one(ASG)
    minutes = int(asg.delete_timeout.removesuffix("m"))
    assert minutes * 60 > 900          # the termination hook holds each node up to 900 s
    assert asg.delete_timeout == "25m"


def test_the_hooks_are_deleted_with_the_group_so_its_delete_still_drains():
    # Deleted first on their own, the termination hook would be gone before the group terminates its nodes.
    run, _ = pool_run()
    asg = run.one(ASG)
    hooks = run.of_type("aws:autoscaling/lifecycleHook:LifecycleHook")
    assert {h.inputs["name"] for h in hooks} == {"gpu-cloud-verify", "gpu-cloud-drain"}
    assert all(h.deleted_with == asg.urn for h in hooks)


def test_nodes_start_only_once_their_bundle_and_grants_exist():
    run, _ = pool_run()
    template = run.one(LT)
    needed = [run.one("aws:s3/bucketObjectv2:BucketObjectv2"), run.one("aws:iam/rolePolicy:RolePolicy"),
              *run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert len(needed) == 5 and {r.urn for r in needed} <= set(template.dependencies)


def test_install_pools_wait_longer_in_the_hook_and_configure_the_nvidia_runtime():
    run, _ = pool_run(mutate=lambda c: c.update(gpuDriver={"source": "install", "branch": "580"}))
    asg = run.one(ASG).inputs
    (launch,) = [h for h in asg["initialLifecycleHooks"] if h["lifecycleTransition"].endswith("LAUNCHING")]
    assert launch["heartbeatTimeout"] == 3000
    user_data = base64.b64decode(run.one(LT).inputs["userData"]).decode()
    parts = {p.get_content_type(): p.get_payload() for p in email.message_from_string(user_data).walk()
             if not p.is_multipart()}
    containerd = yaml.safe_load(parts["application/node.eks.aws"])["spec"]["containerd"]["config"]
    assert 'default_runtime_name = "nvidia"' in containerd and "/usr/bin/nvidia-container-runtime" in containerd
    shell = parts["text/x-shellscript"]
    assert "GPU_CLOUD_DRIVER_SOURCE=install" in shell and "GPU_CLOUD_DRIVER_VERSION=''" in shell


@pytest.mark.parametrize("source", ["ami", "install"])
def test_refresh_warmup_and_grace_wait_for_registration_not_the_hook(source):
    # Both start at InService, after the gate's CONTINUE: waiting the hook's timeout again would idle every step.
    run, _ = pool_run(mutate=lambda c: c.update(gpuDriver={"source": source, "branch": "580"}))
    asg = run.one(ASG).inputs
    assert asg["instanceRefresh"]["preferences"]["instanceWarmup"] == "600" and asg["healthCheckGracePeriod"] == 600
    assert boot.node_ready_seconds() == 600 < boot.verify_hook_timeout(source)


def test_reserved_refresh_never_surges_and_cluster_autoscaler_owns_desired():
    run, _ = pool_run()
    prefs = run.one(ASG).inputs["instanceRefresh"]["preferences"]
    assert prefs["maxHealthyPercentage"] == 100 and prefs["minHealthyPercentage"] == 50
    # Without this every `pulumi up` would set the size back to desiredNodes and terminate busy GPU nodes.
    assert "desiredCapacity" in run.one(ASG).ignore_changes


def test_user_data_renders_the_pool_and_points_at_its_verified_bundle():
    run, pool = pool_run()
    user_data = base64.b64decode(run.one(LT).inputs["userData"]).decode()
    assert len(user_data.encode()) <= 16384
    message = email.message_from_string(user_data)
    parts = {p.get_content_type(): p.get_payload() for p in message.walk() if not p.is_multipart()}
    node_config = yaml.safe_load(parts["application/node.eks.aws"])["spec"]
    assert node_config["cluster"]["name"] == CLUSTER and node_config["cluster"]["cidr"] == "172.20.0.0/16"
    assert node_config["instance"]["localStorage"]["strategy"] == "RAID0"     # p5 has 8 NVMe disks
    assert "gpu-cloud.io/pool=train" in " ".join(node_config["kubelet"]["flags"])
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in node_config["kubelet"]["config"]["registerWithTaints"]
    shell = parts["text/x-shellscript"]
    obj = run.one("aws:s3/bucketObjectv2:BucketObjectv2")
    artifact = base64.b64decode(obj.inputs["contentBase64"])
    sha = hashlib.sha256(artifact).hexdigest()
    assert obj.inputs["key"] == f"verifier/train/{sha}.tar"
    assert f"GPU_CLOUD_ARTIFACT_SHA256={sha}" in shell
    assert f"s3://artifacts-bucket/verifier/train/{sha}.tar" in shell
    assert "GPU_CLOUD_EFA_COUNT=32" in shell and "GPU_CLOUD_NVSWITCH=true" in shell
    assert "GPU_CLOUD_ASG_NAME=gpu-cloud-test-train" in shell


def test_node_role_may_only_gate_itself():
    run, _ = pool_run()
    gate = json.loads(run.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in gate["Statement"]}
    assert by_sid["CompleteOwnLifecycleAction"]["Resource"].endswith("autoScalingGroupName/gpu-cloud-test-train")
    # the whole statement: only CreateTags, only on the calling instance, only the two verdict keys
    assert by_sid["TagSelfWithVerdict"] == {
        "Sid": "TagSelfWithVerdict", "Effect": "Allow", "Action": "ec2:CreateTags",
        "Resource": "arn:aws:ec2:us-east-1:123456789012:instance/*",
        "Condition": {"ArnEquals": {"ec2:SourceInstanceARN": "arn:aws:ec2:us-east-1:123456789012:instance/${ec2:InstanceID}"},
                      "ForAllValues:StringEquals": {"aws:TagKeys": ["gpu-cloud:verify", "gpu-cloud:verify-reason"]}}}
    assert by_sid["CompleteOwnLifecycleAction"]["Action"] == "autoscaling:CompleteLifecycleAction"
    assert by_sid["ReadVerifierBundle"]["Resource"].startswith("arn:aws:s3:::artifacts-bucket/verifier/train/")
    # the bundle is SSE-KMS: without Decrypt on the bucket's key, through S3 only, no node could read it
    assert by_sid["DecryptVerifierBundle"] == {
        "Sid": "DecryptVerifierBundle", "Effect": "Allow", "Action": "kms:Decrypt",
        "Resource": "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-artifacts",
        "Condition": {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}}
    # a later boot that fails reports its instance unhealthy to its own group; every verdict goes under the pool's
    # report prefix, encrypted with the bucket's key through S3 only
    assert by_sid["ReportOwnGroupInstanceUnhealthy"] == {
        "Sid": "ReportOwnGroupInstanceUnhealthy", "Effect": "Allow", "Action": "autoscaling:SetInstanceHealth",
        "Resource": by_sid["CompleteOwnLifecycleAction"]["Resource"]}
    assert by_sid["PublishGateReport"] == {"Sid": "PublishGateReport", "Effect": "Allow", "Action": "s3:PutObject",
                                           "Resource": "arn:aws:s3:::artifacts-bucket/gate-reports/train/*"}
    assert by_sid["EncryptGateReport"]["Action"] == "kms:GenerateDataKey"
    assert by_sid["EncryptGateReport"]["Condition"] == by_sid["DecryptVerifierBundle"]["Condition"]
    assert set(by_sid) == {"CompleteOwnLifecycleAction", "ReportOwnGroupInstanceUnhealthy", "TagSelfWithVerdict",
                           "ReadVerifierBundle", "DecryptVerifierBundle", "PublishGateReport", "EncryptGateReport"}
    assert run.one("aws:eks/accessEntry:AccessEntry").inputs["type"] == "EC2_LINUX"


def test_the_kms_conditions_follow_the_partitions_dns_suffix():
    """aws-cn's S3 endpoint is s3.<region>.amazonaws.com.cn: a hard-coded amazonaws.com would never match there,
    and no node could read its verifier bundle."""
    run, _ = pool_run(partition="aws-cn", dns_suffix="amazonaws.com.cn")
    gate = json.loads(run.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    conditions = [s["Condition"] for s in gate["Statement"] if s["Sid"] in ("DecryptVerifierBundle", "EncryptGateReport")]
    assert conditions == [{"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com.cn"}}] * 2


def test_children_are_parented_and_prefixed():
    run, _ = pool_run()
    component = run.one("gpu-cloud:nodepool:GpuNodePool")
    for resource in run.resources:
        if resource.custom and not resource.type.startswith("pulumi:providers:"):
            assert resource.parent == component.urn and resource.name.startswith("train-")


def test_user_data_over_16kb_is_a_config_error_before_anything_is_registered():
    from components.nodes.nodepool import check_user_data_fits
    from decisions.config.errors import ConfigError

    check_user_data_fits(load(valid_config()))            # the shipped shapes fit with room to spare
    many = {f"example.com/label-{i:03d}": "v" * 60 for i in range(120)}
    # decisions/config/validate.py refuses so many labels first (an Auto Scaling group carries at most 50 tags, one per
    # label): give the pool its labels past that check, to hold this one on its own
    spec = load(valid_config())
    pool = dataclasses.replace(spec.pools[1], spec=spec.pools[1].spec.model_copy(update={"labels": many}))
    with pytest.raises(ConfigError) as raised:
        check_user_data_fits(dataclasses.replace(spec, pools=(spec.pools[0], pool)))
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[1]" and "16384" in issue.message
