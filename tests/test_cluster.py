"""components/cluster.py and decisions/catalog/addons.py under the shared mocks (tests/conftest.py).

Each cluster is built once per module (a run takes a fraction of a second) and only read afterwards.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pulumi
import pytest
import yaml

from components.cluster import (
    ClusterArgs, EksCluster, is_accelerated_instance_type,
)
from decisions.catalog.addons import (
    ADDON_NAMES, ADDONS_PATH, AddonPinError, addon_versions, load_addon_pins, parse_addon_version,
    supported_kubernetes_versions,
)
from decisions.catalog.catalog import load_catalog
from decisions.platform import pod_identity
from tests.conftest import run_component

CLUSTER = "aws:eks/cluster:Cluster"
ADDON = "aws:eks/addon:Addon"
KEY = "aws:kms/key:Key"
COMPONENT = "gpu-cloud:cluster:EksCluster"
ADMINS = ("arn:aws:iam::123456789012:role/PlatformAdmin", "arn:aws:iam::210987654321:role/BreakGlass")

BASE = ClusterArgs(
    name="gpu-cloud-test-us-east-1", kubernetes_version="1.33",
    subnet_ids=["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"], public_access_cidrs=(),
    admin_role_arns=ADMINS, log_retention_days=90, deployer_arn=ADMINS[0])
DEPLOYER = "arn:aws:iam::123456789012:role/ci/gpu-cloud-deployer"


def build(args: ClusterArgs, name: str = "cluster"):
    """Run one EksCluster; the kubeconfig is exported unsecreted so the test can read it."""
    def program():
        component = EksCluster(name, args)
        pulumi.export("kubeconfig", pulumi.Output.unsecret(component.kubeconfig))
        pulumi.export("serviceCidr", component.service_cidr)
    return run_component(program)


@pytest.fixture(scope="module")
def private_run():
    return build(BASE)


@pytest.fixture(scope="module")
def public_run():
    return build(replace(BASE, public_access_cidrs=("203.0.113.0/24", "198.51.100.17/32")))


@pytest.fixture(scope="module", params=supported_kubernetes_versions())
def versioned_run(request):
    return request.param, build(replace(BASE, kubernetes_version=request.param))


def by_urn(run):
    return {r.urn: r for r in run.resources}


# --- endpoint access -------------------------------------------------------------------------------

def test_endpoint_is_private_only_without_cidrs(private_run):
    vpc = private_run.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc


def test_public_endpoint_open_to_exactly_the_configured_cidrs(public_run):
    vpc = public_run.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.17/32"]


def test_cluster_is_pinned_and_in_the_private_subnets(private_run):
    inputs = private_run.one(CLUSTER).inputs
    assert inputs["name"] == BASE.name
    assert inputs["version"] == "1.33"
    assert inputs["vpcConfig"]["subnetIds"] == list(BASE.subnet_ids)


# --- encryption, logging, protection ---------------------------------------------------------------

def test_secrets_are_encrypted_with_the_components_key(private_run):
    key = private_run.one(KEY)
    encryption = private_run.one(CLUSTER).inputs["encryptionConfig"]
    assert encryption["provider"]["keyArn"] == key.state["arn"]
    assert encryption["resources"] == ["secrets"]


def test_kms_key_rotates_and_cannot_be_deleted_quickly(private_run):
    key = private_run.one(KEY).inputs
    assert key["enableKeyRotation"] is True
    assert key["deletionWindowInDays"] == 30
    alias = private_run.one("aws:kms/alias:Alias").inputs
    assert alias["name"] == f"alias/eks/{BASE.name}"


def test_key_policy_keeps_the_account_in_control_and_lets_logs_use_it_for_this_group_only(private_run):
    statements = json.loads(private_run.one(KEY).inputs["policy"])["Statement"]
    root = [s for s in statements if s["Principal"].get("AWS") == "arn:aws:iam::123456789012:root"]
    assert root and root[0]["Action"] == "kms:*"
    logs = [s for s in statements if s["Principal"].get("Service") == "logs.us-east-1.amazonaws.com"]
    assert len(logs) == 1
    assert logs[0]["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"] == (
        f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/eks/{BASE.name}/cluster")


def test_all_control_plane_logs_go_to_a_retained_encrypted_group_created_first(private_run):
    cluster = private_run.one(CLUSTER)
    assert sorted(cluster.inputs["enabledClusterLogTypes"]) == sorted(
        ["api", "audit", "authenticator", "controllerManager", "scheduler"])
    group = private_run.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/eks/{BASE.name}/cluster"
    assert group.inputs["retentionInDays"] == 90
    assert group.inputs["kmsKeyId"] == private_run.one(KEY).state["arn"]
    assert group.urn in cluster.dependencies


def test_cluster_and_key_are_protected(private_run):
    assert private_run.one(CLUSTER).protect
    assert private_run.one(KEY).protect


def test_cluster_role_can_use_the_key(private_run):
    key_arn = private_run.one(KEY).state["arn"]
    policy = json.loads(private_run.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    statement = policy["Statement"][0]
    assert statement["Resource"] == key_arn
    assert {"kms:Encrypt", "kms:Decrypt", "kms:DescribeKey"} <= set(statement["Action"])


# --- authentication and admins ---------------------------------------------------------------------

def test_authentication_is_api_only_without_creator_admin(private_run):
    access = private_run.one(CLUSTER).inputs["accessConfig"]
    assert access["authenticationMode"] == "API"
    assert access["bootstrapClusterCreatorAdminPermissions"] is False


def test_one_cluster_admin_access_entry_per_admin_role(private_run):
    entries = private_run.of_type("aws:eks/accessEntry:AccessEntry")
    associations = private_run.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert sorted(e.inputs["principalArn"] for e in entries) == sorted(ADMINS)
    assert sorted(a.inputs["principalArn"] for a in associations) == sorted(ADMINS)
    entry_by_principal = {e.inputs["principalArn"]: e for e in entries}
    for association in associations:
        assert association.inputs["policyArn"] == \
            "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert association.inputs["accessScope"] == {"type": "cluster"}
        assert entry_by_principal[association.inputs["principalArn"]].urn in association.dependencies
    assert all(e.inputs["clusterName"] == BASE.name for e in entries)



def test_admin_access_entries_keep_their_names_and_share_the_team_entries_suffix(private_run):
    """An access entry's resource name is its URN: a new name would replace the entry (and drop the admin's access
    while it is recreated). The admins' entries are named as the teams' are (decisions/platform/tenancy.py)."""
    from decisions.platform.tenancy import access_entry_suffix

    names = {e.inputs["principalArn"]: e.name for e in private_run.of_type("aws:eks/accessEntry:AccessEntry")}
    assert names == {ADMINS[0]: "cluster-admin-PlatformAdmin-c6a068", ADMINS[1]: "cluster-admin-BreakGlass-9b95c5"}
    assert all(name == f"cluster-admin-{access_entry_suffix(arn)}" for arn, name in names.items())


# --- add-ons ---------------------------------------------------------------------------------------

def test_every_pinned_addon_is_installed_at_its_pinned_version(versioned_run):
    kubernetes_version, run = versioned_run
    installed = {a.inputs["addonName"]: a.inputs["addonVersion"] for a in run.of_type(ADDON)}
    assert installed == addon_versions(kubernetes_version)
    assert set(installed) == set(ADDON_NAMES)
    assert run.one(CLUSTER).inputs["version"] == kubernetes_version


def test_addon_pins_come_from_the_data_file():
    raw = yaml.safe_load(ADDONS_PATH.read_text())["kubernetes"]
    for version in supported_kubernetes_versions():
        assert addon_versions(version) == {name: raw[version][name] for name in ADDON_NAMES}


def test_vpc_cni_is_at_least_1_18_5_for_every_supported_version():
    for version in supported_kubernetes_versions():
        assert parse_addon_version(addon_versions(version)["vpc-cni"])[:3] >= (1, 18, 5), version


def test_loader_rejects_a_vpc_cni_below_the_efa_floor(tmp_path: Path):
    data = yaml.safe_load(ADDONS_PATH.read_text())
    data["kubernetes"]["1.34"]["vpc-cni"] = "v1.18.4-eksbuild.1"
    path = tmp_path / "addons.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(AddonPinError, match=r"1\.34\.vpc-cni: v1\.18\.4-eksbuild\.1 is below the minimum 1\.18\.5"):
        load_addon_pins(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["kubernetes"]["1.33"].pop("coredns"), r"1\.33: missing coredns"),
    (lambda d: d["kubernetes"]["1.33"].update({"kube-proxy": "v1.32.13-eksbuild.5"}), r"not a 1\.33 build"),
    (lambda d: d["kubernetes"]["1.32"].update({"coredns": "1.11.4"}), r"is not an EKS add-on version"),
    (lambda d: d["sources"].pop("aws-ebs-csi-driver"), r"sources has no entry for aws-ebs-csi-driver"),
])
def test_loader_rejects_incomplete_or_malformed_pins(tmp_path: Path, mutate, message):
    data = yaml.safe_load(ADDONS_PATH.read_text())
    mutate(data)
    path = tmp_path / "addons.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(AddonPinError, match=message):
        load_addon_pins(path)


def test_unpinned_kubernetes_version_is_refused_before_anything_is_registered():
    with pytest.raises(ValueError, match="no add-on versions pinned for Kubernetes '1.31'"):
        EksCluster("cluster", replace(BASE, kubernetes_version="1.31"))


def test_addons_overwrite_conflicts_and_core_networking_survives_addon_deletion(private_run):
    addons = {a.inputs["addonName"]: a.inputs for a in private_run.of_type(ADDON)}
    for inputs in addons.values():
        assert inputs["resolveConflictsOnCreate"] == "OVERWRITE"
        assert inputs["resolveConflictsOnUpdate"] == "OVERWRITE"
        assert inputs["clusterName"] == BASE.name
    for name in ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent"):
        assert addons[name]["preserve"] is True, name


def test_vpc_cni_settings(private_run):
    cni = next(a for a in private_run.of_type(ADDON) if a.inputs["addonName"] == "vpc-cni")
    config = json.loads(cni.inputs["configurationValues"])
    env = config["env"]
    assert env["ENABLE_PREFIX_DELEGATION"] == "false"
    # NetworkPolicies are enforced only with the CNI's policy agent on (EKS user guide, cni-network-policy)
    assert config["enableNetworkPolicy"] == "true"
    assert all(isinstance(value, str) for value in env.values())     # the add-on schema takes strings


@pytest.mark.parametrize("addon_name, service_account, policy", [
    ("vpc-cni", "aws-node", "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"),
    ("aws-ebs-csi-driver", "ebs-csi-controller-sa", "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"),
])
def test_aws_calling_addons_get_their_own_pod_identity_role(private_run, addon_name, service_account, policy):
    addon = next(a for a in private_run.of_type(ADDON) if a.inputs["addonName"] == addon_name)
    [association] = addon.inputs["podIdentityAssociations"]
    assert association["serviceAccount"] == service_account
    role = next(r for r in private_run.of_type("aws:iam/role:Role") if r.state["arn"] == association["roleArn"])
    # only this cluster's kube-system/<service account>, in this account
    assert json.loads(role.inputs["assumeRolePolicy"]) == pod_identity.trust_policy(
        "arn:aws:eks:us-east-1:123456789012:cluster/gpu-cloud-test-us-east-1", "kube-system", service_account)
    attached = [a for a in private_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == role.state["name"]]
    assert [a.inputs["policyArn"] for a in attached] == [policy]
    assert {a.urn for a in attached} <= set(addon.dependencies)     # permissions exist before the pods start


def test_addon_ordering_around_the_system_node_group(private_run):
    urns = {a.inputs["addonName"]: a.urn for a in private_run.of_type(ADDON)}
    node_group = private_run.one("aws:eks/nodeGroup:NodeGroup")
    # Nodes join with pod networking, kube-proxy and the Pod Identity agent already installed.
    for name in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
        assert urns[name] in node_group.dependencies, name
    # Deployments need nodes to become ACTIVE.
    resources = by_urn(private_run)
    for name in ("coredns", "aws-ebs-csi-driver"):
        assert node_group.urn in resources[urns[name]].dependencies, name


# --- system node group -----------------------------------------------------------------------------

def test_system_node_group_is_small_on_demand_and_gpu_free(private_run):
    group = private_run.one("aws:eks/nodeGroup:NodeGroup").inputs
    assert group["capacityType"] == "ON_DEMAND"
    assert group["amiType"] == "AL2023_x86_64_STANDARD"
    assert group["instanceTypes"] == ["m7i.xlarge", "m6i.xlarge"]
    gpu_types = set(load_catalog().instance_types)
    assert not [t for t in group["instanceTypes"] if t in gpu_types or is_accelerated_instance_type(t)]
    assert group["labels"] == {"gpu-cloud.io/node-role": "system"}
    assert group["subnetIds"] == list(BASE.subnet_ids)
    assert group["scalingConfig"] == {"minSize": 2, "desiredSize": 2, "maxSize": 4}
    assert group["updateConfig"] == {"maxUnavailable": 1}
    assert group["version"] == BASE.kubernetes_version
    # Tainted from creation, for critical add-ons only.
    assert group["taints"] == [{"key": "CriticalAddonsOnly", "value": "true", "effect": "NO_SCHEDULE"}]


# What `aws eks describe-addon-configuration` answers, transcribed as far as the program's values reach
# (decisions/catalog/addons.py names each source). additionalProperties false where the add-on's schema says so: a
# misspelt key is refused.
_OBJECTS = {"type": "array", "items": {"type": "object"}}
COREDNS_SCHEMA = {   # coredns v1.10.1-eksbuild.11 (cloudbees/terraform-aws-cloudbees-ci-eks-addon, windows blueprint)
    "type": "object", "additionalProperties": False,
    "properties": {"nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                   "tolerations": _OBJECTS, "replicaCount": {"type": "integer"}, "corefile": {"type": "string"}}}
EBS_CSI_SCHEMA = {   # kubernetes-sigs/aws-ebs-csi-driver v1.60.0 charts/aws-ebs-csi-driver/values.schema.json
    "type": "object", "additionalProperties": False,
    "properties": {"controller": {"type": "object", "additionalProperties": False, "properties": {
        "nodeSelector": {"type": ["object", "null"]}, "tolerations": _OBJECTS}}}}


@pytest.mark.parametrize("addon_name, schema", [("coredns", COREDNS_SCHEMA), ("aws-ebs-csi-driver", EBS_CSI_SCHEMA)])
def test_addon_configuration_is_valid_for_its_schema_and_tolerates_the_system_taint(private_run, addon_name, schema):
    import jsonschema
    from decisions.nodes.pods import SYSTEM_NODE_LABELS, SYSTEM_NODE_TAINT, tolerates

    addon = next(a for a in private_run.of_type(ADDON) if a.inputs["addonName"] == addon_name)
    config = json.loads(addon.inputs["configurationValues"])
    jsonschema.validate(config, schema)
    placement = config["controller"] if addon_name == "aws-ebs-csi-driver" else config
    assert placement["nodeSelector"] == SYSTEM_NODE_LABELS
    assert tolerates(placement["tolerations"], SYSTEM_NODE_TAINT)
    with pytest.raises(jsonschema.ValidationError):      # the schemas refuse what they do not know
        jsonschema.validate({**config, "toleration": []}, schema)


def test_the_toleration_check_tells_a_matching_toleration_from_a_near_miss():
    from decisions.nodes.pods import SYSTEM_NODE_TAINT, system_tolerations, tolerates

    assert tolerates(system_tolerations(), SYSTEM_NODE_TAINT)
    assert tolerates([{"operator": "Exists"}], SYSTEM_NODE_TAINT)                            # every taint
    assert tolerates([{"key": "CriticalAddonsOnly", "operator": "Exists"}], SYSTEM_NODE_TAINT)   # every effect
    assert tolerates([{"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}], SYSTEM_NODE_TAINT)
    assert not tolerates([], SYSTEM_NODE_TAINT)
    assert not tolerates([{"key": "CriticalAddonsOnly", "value": "false"}], SYSTEM_NODE_TAINT)
    assert not tolerates([{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"}],
                         SYSTEM_NODE_TAINT)
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], SYSTEM_NODE_TAINT)
    assert not tolerates([{"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "",
                           "effect": "NoSchedule"}], SYSTEM_NODE_TAINT)
    # The operator defaults to Equal and the value to "": no value matches only a taint whose value is empty.
    from decisions.nodes.pools import Taint
    keyed = Taint("gpu-cloud.io/example", "", "NoSchedule")
    assert tolerates([{"key": "gpu-cloud.io/example"}], keyed)
    assert tolerates([{"key": "gpu-cloud.io/example", "operator": "Equal", "value": ""}], keyed)
    assert not tolerates([{"key": "gpu-cloud.io/example", "value": "true"}], keyed)
    assert not tolerates([{"key": "gpu-cloud.io/example"}], SYSTEM_NODE_TAINT)
    assert tolerates([{"key": "", "operator": "Exists", "effect": "NoSchedule"}], SYSTEM_NODE_TAINT)
    assert not tolerates([{"key": "", "operator": "Exists", "effect": "NoExecute"}], SYSTEM_NODE_TAINT)


def test_system_node_role_has_no_cni_permissions(private_run):
    node_group = private_run.one("aws:eks/nodeGroup:NodeGroup")
    role = next(r for r in private_run.of_type("aws:iam/role:Role")
                if r.state["arn"] == node_group.inputs["nodeRoleArn"])
    attachments = private_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    policies = sorted(a.inputs["policyArn"] for a in attachments if a.inputs["role"] == role.state["name"])
    assert policies == ["arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
                        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy"]


@pytest.mark.parametrize("instance_types", [("p5.48xlarge",), ("m7i.xlarge", "g6e.2xlarge"), ("trn1.32xlarge",)])
def test_accelerated_system_instance_types_are_refused(instance_types):
    with pytest.raises(ValueError, match="must not use accelerated instance types"):
        EksCluster("cluster", replace(BASE, system_instance_types=instance_types))


@pytest.mark.parametrize("change, message", [
    ({"public_access_cidrs": ("0.0.0.0/33",)}, "is not an IPv4 network"),
    ({"admin_role_arns": ("arn:aws:iam::123456789012:user/alice",)}, "is not an IAM role ARN"),
    ({"system_min_nodes": 3, "system_desired_nodes": 2}, "min"),
])
def test_invalid_args_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        EksCluster("cluster", replace(BASE, **change))


# --- Kubernetes provider and outputs ---------------------------------------------------------------

def test_kube_provider_uses_aws_eks_get_token_and_its_kubeconfig_is_secret(private_run):
    provider = private_run.one("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == "[secret]"
    kubeconfig = json.loads(private_run.outputs["kubeconfig"])
    cluster = private_run.one(CLUSTER)
    [entry] = kubeconfig["clusters"]
    assert entry["cluster"]["server"] == cluster.state["endpoint"]
    assert entry["cluster"]["certificate-authority-data"] == cluster.state["certificateAuthority"]["data"]
    [user] = kubeconfig["users"]
    assert set(user["user"]) == {"exec"}                 # no token, password or client key
    command = user["user"]["exec"]
    assert command["command"] == "aws"
    assert command["args"][:2] == ["eks", "get-token"]
    assert command["args"][command["args"].index("--cluster-name") + 1] == BASE.name
    assert command["args"][command["args"].index("--region") + 1] == "us-east-1"


def test_kube_provider_waits_for_admin_access_and_cluster_dns(private_run):
    provider = private_run.one("pulumi:providers:kubernetes")
    associations = {a.urn for a in private_run.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")}
    coredns = next(a.urn for a in private_run.of_type(ADDON) if a.inputs["addonName"] == "coredns")
    assert associations | {coredns} <= set(provider.dependencies)


@pytest.fixture(scope="module")
def deployer_run():
    """Pulumi runs as a CI role that is not an admin role, from runners reached through the network."""
    return build(replace(BASE, deployer_arn=DEPLOYER, private_access_cidrs=("10.0.0.0/22",),
                         private_access_security_group_ids=("sg-0123456789abcdef0",),
                         token_args=("--profile", "ci", "--role-arn", DEPLOYER)))


def test_the_deployer_gets_cluster_admin_and_the_provider_waits_for_it(deployer_run):
    entries = {e.inputs["principalArn"]: e for e in deployer_run.of_type("aws:eks/accessEntry:AccessEntry")}
    assert set(entries) == {*ADMINS, DEPLOYER}
    assert entries[DEPLOYER].name == "cluster-admin-deployer"     # one stable name, whoever deploys
    grant = next(a for a in deployer_run.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
                 if a.inputs["principalArn"] == DEPLOYER)
    assert grant.inputs["policyArn"].endswith(":cluster-access-policy/AmazonEKSClusterAdminPolicy")
    assert grant.urn in deployer_run.one("pulumi:providers:kubernetes").dependencies


def test_an_admin_role_deploying_gets_no_second_entry(private_run):
    assert len(private_run.of_type("aws:eks/accessEntry:AccessEntry")) == len(ADMINS)


def test_the_kubeconfig_authenticates_as_the_aws_providers_identity(deployer_run):
    args = json.loads(deployer_run.outputs["kubeconfig"])["users"][0]["user"]["exec"]["args"]
    assert args[-4:] == ["--profile", "ci", "--role-arn", DEPLOYER]


def test_the_deployers_network_may_reach_the_private_endpoint_before_the_provider_is_used(deployer_run):
    rules = deployer_run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    cluster = deployer_run.one(CLUSTER)
    assert {(r.inputs.get("cidrIpv4"), r.inputs.get("referencedSecurityGroupId")) for r in rules} == {
        ("10.0.0.0/22", None), (None, "sg-0123456789abcdef0")}
    for rule in rules:
        assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == ("tcp", 443, 443)
        assert rule.inputs["securityGroupId"] == cluster.state["vpcConfig"]["clusterSecurityGroupId"]
        assert rule.urn in deployer_run.one("pulumi:providers:kubernetes").dependencies


def test_the_kube_provider_has_a_fixed_identity_so_a_new_kubeconfig_replaces_nothing(private_run, deployer_run):
    ids = {run.one("pulumi:providers:kubernetes").inputs["clusterIdentifier"] for run in (private_run, deployer_run)}
    assert ids == {BASE.name}


def test_addon_configuration_is_compact_sorted_json(private_run):
    for addon in private_run.of_type(ADDON):
        values = addon.inputs.get("configurationValues")
        if values:
            assert values == json.dumps(json.loads(values), sort_keys=True, separators=(",", ":"))


def test_service_cidr_is_read_back_from_the_cluster(private_run):
    assert private_run.outputs["serviceCidr"] == \
        private_run.one(CLUSTER).state["kubernetesNetworkConfig"]["serviceIpv4Cidr"]


def test_every_child_is_parented_under_the_component_and_prefixed(private_run):
    component = private_run.one(COMPONENT, "cluster")
    children = [r for r in private_run.resources if r.urn != component.urn]
    assert len(children) >= 20
    for resource in children:
        assert resource.parent == component.urn, resource.name
        assert resource.name.startswith("cluster-"), resource.name
