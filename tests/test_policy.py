"""The CrossGuard pack (policy/): every policy holds on the real stacks and catches a real resource gone wrong.

Cases are the shipped stacks' plan documents with one compliant resource mutated; the offline runner
(plan/policy_runner.py) gives the policies the arguments the engine would.
"""
import copy
import json
import re
import os
import py_compile
import runpy
import subprocess
import sys

import pytest
import yaml

import pulumi_policy
from plan.document import resources_in_reading_order
from plan.policy_runner import PolicyConfigError, engine_arguments, resolve_config, run_pack
from plan.views import VIEWS, view_outputs
from policy import policies as pack
from pulumi_policy import (PolicyResource, ResourceValidationArgs, ResourceValidationPolicy, StackValidationArgs,
                           StackValidationPolicy)
from tests.conftest import ROOT, STACKS
from tests.test_validate import setter as _set     # sets a nested key: of a resource here, of a config there

class _Documents(dict):
    """Each test gets its own copy of a document: tests mutate them."""
    def __getitem__(self, stack):
        return copy.deepcopy(super().__getitem__(stack))

    def values(self):
        return [self[stack] for stack in self]


@pytest.fixture(scope="module")
def documents(plan_documents):
    """Each shipped stack's plan document, as `python -m plan STACK --json` writes it (a JSON round trip)."""
    out = _Documents()
    for stack in STACKS:
        dict.__setitem__(out, stack, plan_documents[stack])
    return out


def found(document, config=None):
    """{(policyName, resource name or "")} the pack reports on a document."""
    names = {r["urn"]: r["name"] for r in document["resources"]}
    return {(v["policyName"], names.get(v["urn"], "")) for v in run_pack(document, config)["violations"]}


def test_an_efa_groups_subnets_unknown_in_preview_are_not_a_violation(documents):
    # Stack policies see outputs; a preview creating the subnets may give the whole list as one unknown value.
    preview = mutated(documents[US], "train-h100-asg",
                      _set(["inputs", "vpcZoneIdentifiers"], "04da6b54-80e4-46f7-96ec-b56ff0331ba9"))
    assert not {v for v in found(preview) if v[0] == "efa-placement-and-zone"}


def mutated(document, name, change):
    """A copy of `document` with `change(resource)` applied to the resource called `name`."""
    document = copy.deepcopy(document)
    (resource,) = [r for r in document["resources"] if r["name"] == name]
    change(resource)
    return document


def without(document, *names):
    document = copy.deepcopy(document)
    document["resources"] = [r for r in document["resources"] if r["name"] not in names]
    return document


def mandatory_names(document, config=None):
    return {v["policyName"] for v in run_pack(document, config)["violations"] if v["enforcementLevel"] == "mandatory"}


# --- the shipped stacks -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_pass_every_mandatory_policy(documents, stack):
    assert mandatory_names(documents[stack]) == set()


def test_policies_are_written_against_resources_the_stacks_really_have(documents):
    """Every resource type a policy reads is one the program registers (or monitoring will: PrometheusRule)."""
    types = {r["type"] for d in documents.values() for r in d["resources"]}
    read = {pack.LAUNCH_TEMPLATE, pack.ASG, pack.PLACEMENT_GROUP, pack.SECURITY_GROUP, pack.SG_INGRESS,
            pack.SG_EGRESS, pack.DEFAULT_SG, pack.VPC, pack.EKS_CLUSTER, pack.PUBLIC_ACCESS_BLOCK, pack.BUCKET_POLICY,
            pack.BUCKET_REPLICATION, pack.KMS_KEY, pack.LUSTRE, pack.IAM_ROLE, pack.IAM_ROLE_POLICY,
            pack.IAM_ATTACHMENT, pack.SQS_QUEUE, pack.AWS_PROVIDER, pack.STACK_REFERENCE, pack.HELM_RELEASE,
            pack.NAMESPACE, pack.NETWORK_POLICY, pack.BUCKET_TYPES[0], pack.BUCKET_SSE[0], pack.BUCKET_VERSIONING[0],
            pack.BUCKET_LOGGING[0], *pack.BINDINGS, "kubernetes:batch/v1:CronJob"}
    assert read <= types


# --- one compliant and one violating case per policy --------------------------------------------------------------
def _deny_gone(resource):
    policy = json.loads(resource["inputs"]["policy"])
    policy["Statement"] = [s for s in policy["Statement"] if s["Effect"] != "Deny"]
    resource["inputs"]["policy"] = json.dumps(policy)


def _add_statement(statement):
    def change(resource):
        policy = json.loads(resource["inputs"]["policy"])
        policy["Statement"].append(statement)
        resource["inputs"]["policy"] = json.dumps(policy)
    return change


def _widen_autoscaler(resource):
    policy = json.loads(resource["inputs"]["policy"])
    policy["Statement"][0]["Action"].append("autoscaling:SetDesiredCapacity")
    resource["inputs"]["policy"] = json.dumps(policy)


def _nccl(change):
    def apply(resource):
        pod = resource["inputs"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        change([c for c in pod["containers"] if c["name"] == "nccl"][0])
    return apply


def _untag(key):
    def change(resource):
        resource["inputs"]["tags"] = [t for t in resource["inputs"]["tags"] if t["key"] != key]
    return change


def _drop_default_tag(key):
    def change(resource):
        tags = json.loads(resource["inputs"]["defaultTags"])
        del tags["tags"][key]
        resource["inputs"]["defaultTags"] = json.dumps(tags)
    return change


def _release(label):
    """Set (or, with None, drop) an object's release annotation."""
    def change(resource):
        annotations = resource["inputs"]["metadata"]["annotations"]
        annotations.pop("gpu-cloud.io/release")
        if label:
            annotations["gpu-cloud.io/release"] = label
    return change


US, EU, DEV = STACKS
P = "prod-us-east-1"
JOBSET_NAMESPACE = "training-operators-jobset:jobset-system"
JOBSET_CONTROLLER = "training-operators-jobset:jobset-system/jobset-controller-manager"
# (policy, stack, resource to mutate, change, the resource the violation names ("" for the stack))
VIOLATIONS = [
    ("launch-template-imdsv2", P, "train-h100-lt", _set(["inputs", "metadataOptions", "httpTokens"], "optional"),
     "train-h100-lt"),
    ("launch-template-imdsv2", P, "infer-l40s-lt", _set(["inputs", "metadataOptions", "httpPutResponseHopLimit"], 3.0),
     "infer-l40s-lt"),
    ("launch-template-encrypted-volumes", DEV, "dev-gpu-spot-lt",
     _set(["inputs", "blockDeviceMappings", 0, "ebs", "encrypted"], "false"), "dev-gpu-spot-lt"),
    ("launch-template-no-public-ip", EU, "infer-a10g-lt",
     _set(["inputs", "networkInterfaces", 0, "associatePublicIpAddress"], "true"), "infer-a10g-lt"),
    ("efa-interface-layout", P, "train-h100-lt", lambda r: r["inputs"]["networkInterfaces"].pop(), "train-h100-lt"),
    ("efa-interface-layout", EU, "train-a100-lt", _set(["inputs", "networkInterfaces", 1, "deviceIndex"], 0.0),
     "train-a100-lt"),
    ("efa-placement-and-zone", EU, "train-a100-placement", _set(["inputs", "strategy"], "spread"),
     "train-a100-placement"),
    ("efa-placement-and-zone", EU, "train-a100-asg",
     lambda r: r["inputs"]["vpcZoneIdentifiers"].append("subnet-0aaaaaaaaaaaaaaaa"), "train-a100-asg"),
    ("efa-placement-and-zone", EU, "train-a100-lt", lambda r: r["inputs"].pop("placement"), "train-a100-lt"),
    # A reserved pool is placed by its reservation: without it, the same pool must name a group.
    ("efa-placement-and-zone", P, "train-h100-lt", lambda r: r["inputs"].pop("capacityReservationSpecification"),
     "train-h100-lt"),
    ("efa-security-group-self", P, "train-h100-efa-in",
     _set(["inputs", "referencedSecurityGroupId"], "sg-0bbbbbbbbbbbbbbbb"), "train-h100-lt"),
    ("gpu-pool-verification-hook", P, "infer-l40s-asg",
     _set(["inputs", "initialLifecycleHooks", 0, "defaultResult"], "CONTINUE"), "infer-l40s-asg"),
    ("gpu-pool-instance-types", DEV, "dev-gpu-spot-asg",
     _set(["inputs", "mixedInstancesPolicy", "launchTemplate", "overrides", 0, "instanceType"], "g6.16xlarge"),
     "dev-gpu-spot-asg"),
    ("gpu-pool-one-shape", P, "finetune-a100-40gb-spot-asg",
     lambda r: r["inputs"]["mixedInstancesPolicy"]["launchTemplate"]["overrides"].append(
         {"instanceType": "g6e.12xlarge"}), "finetune-a100-40gb-spot-asg"),
    ("spot-interruption-handling", DEV, "dev-gpu-spot-asg", _untag("aws-node-termination-handler/managed"),
     "dev-gpu-spot-asg"),
    ("eks-endpoint-not-public", DEV, "cluster-eks", _set(["inputs", "vpcConfig", "endpointPublicAccess"], True),
     "cluster-eks"),
    # half the Internet is not an egress range: wider than /8 (decisions/network/public_access.py), as the config says
    ("eks-endpoint-not-public", DEV, "cluster-eks", lambda r: r["inputs"]["vpcConfig"].update(
        endpointPublicAccess=True, publicAccessCidrs=["198.18.0.0/24", "0.0.0.0/1"]), "cluster-eks"),
    ("eks-endpoint-not-public", DEV, "cluster-eks", lambda r: r["inputs"]["vpcConfig"].update(
        endpointPublicAccess=True, publicAccessCidrs=["44.0.0.0/7"]), "cluster-eks"),
    ("eks-secrets-encrypted", EU, "cluster-eks", lambda r: r["inputs"].pop("encryptionConfig"), "cluster-eks"),
    ("eks-control-plane-logs", P, "cluster-eks", lambda r: r["inputs"]["enabledClusterLogTypes"].remove("audit"),
     "cluster-eks"),
    ("no-open-ingress", P, "lustre-in-988-client-0",
     lambda r: (r["inputs"].pop("referencedSecurityGroupId"), r["inputs"].update(cidrIpv4="0.0.0.0/0")),
     "lustre-in-988-client-0"),
    ("no-open-ingress", DEV, "network-endpoints-https",
     lambda r: r["inputs"].update(cidrIpv4=None, cidrIpv6="::/0", fromPort=80.0), "network-endpoints-https"),
    ("vpc-default-security-group-empty", DEV, "network-default-sg",
     _set(["inputs", "ingress"], [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}]),
     "network-default-sg"),
    ("s3-public-access-blocked", P, "artifacts-public-access", _set(["inputs", "blockPublicPolicy"], False),
     "artifacts-bucket"),
    ("s3-sse-kms", DEV, "models-encryption",
     _set(["inputs", "rules", 0, "applyServerSideEncryptionByDefault", "sseAlgorithm"], "AES256"), "models-bucket"),
    # The log bucket is excepted as SSE-S3, and held to it: S3 server access logging does not write to SSE-KMS.
    ("s3-sse-kms", P, "logs-encryption",
     _set(["inputs", "rules", 0, "applyServerSideEncryptionByDefault"], {"sseAlgorithm": "aws:kms",
                                                                          "kmsMasterKeyId": "arn:aws:kms:key"}),
     "logs-bucket"),
    ("s3-versioning", EU, "checkpoints-versioning", _set(["inputs", "versioningConfiguration", "status"], "Suspended"),
     "checkpoints-bucket"),
    ("s3-tls-only", P, "datasets-policy", _deny_gone, "datasets-bucket"),
    ("kms-key-rotation", P, "cluster-kms", _set(["inputs", "enableKeyRotation"], False), "cluster-kms"),
    ("fsx-customer-managed-key", EU, "lustre-fs", lambda r: r["inputs"].pop("kmsKeyId"), "lustre-fs"),
    # FSx backs up no file system linked to S3: asking for backups of one is refused, in any environment ...
    ("fsx-backups-or-export", P, "lustre-fs", _set(["inputs", "automaticBackupRetentionDays"], 14.0), "lustre-fs"),
    ("fsx-backups-or-export", EU, "lustre-fs", _set(["inputs", "skipFinalBackup"], False), "lustre-fs"),
    # ... and a prod file system linked to S3 exports what jobs write, its only protection.
    ("fsx-backups-or-export", P, "lustre-data", _set(["inputs", "s3", "autoExportPolicy", "events"], ["DELETED"]),
     "lustre-fs"),
    ("iam-no-wildcard-admin", P, "train-h100-node-gate",
     _add_statement({"Effect": "Allow", "Action": "*", "Resource": "*"}), "train-h100-node-gate"),
    ("iam-actions-name-resources", P, "autoscaler-identity-policy", _widen_autoscaler, "autoscaler-identity-policy"),
    # Reads that take a resource type (Service Authorization Reference) are not excused on "*".
    ("iam-actions-name-resources", EU, "lb-controller-identity-policy",
     _add_statement({"Effect": "Allow", "Action": "ec2:GetSecurityGroupsForVpc", "Resource": "*"}),
     "lb-controller-identity-policy"),
    ("log-retention-in-prod", P, "network-flow-logs", _set(["inputs", "retentionInDays"], 30.0), "network-flow-logs"),
    ("log-retention-in-prod", EU, "cluster-logs", _set(["inputs", "retentionInDays"], 180.0), "cluster-logs"),
    ("iam-no-admin-policies", DEV, "dev-gpu-spot-node-policy-2",
     _set(["inputs", "policyArn"], "arn:aws:iam::aws:policy/AdministratorAccess"), "dev-gpu-spot-node-policy-2"),
    ("k8s-no-privileged-containers", P, "training-nccl-nvlink-train-h100",
     _nccl(lambda c: c["securityContext"].update(privileged=True)), "training-nccl-nvlink-train-h100"),
    ("k8s-gpu-resource-limits", P, "training-nccl-nvlink-train-h100",
     _nccl(lambda c: c["resources"].pop("limits")), "training-nccl-nvlink-train-h100"),
    ("k8s-gpu-resource-limits", P, "training-nccl-nvlink-train-h100",
     _nccl(lambda c: c["resources"].setdefault("limits", {}).update({"nvidia.com/gpu": 4.0})),
     "training-nccl-nvlink-train-h100"),
    ("k8s-no-cluster-admin-default-sa", DEV, "tenancy-node-reader",
     lambda r: r["inputs"].update(roleRef={**r["inputs"]["roleRef"], "name": "cluster-admin"},
                                  subjects=[{"kind": "ServiceAccount", "name": "default", "namespace": "training"}])
     if r["type"].endswith("ClusterRoleBinding") else None, "tenancy-node-reader"),
    ("required-tags", EU, "infer-a10g-spot-asg", _untag("costCenter"), "infer-a10g-spot-asg"),
    ("required-tags", DEV, "aws", _drop_default_tag("team"), "network-vpc"),
    ("stateful-resources-protected", P, "cluster-eks", _set(["protect"], False), "cluster-eks"),
    ("stateful-resources-protected", DEV, "logs-bucket", _set(["protect"], False), "logs-bucket"),
    ("hourly-cost-within-budget", P, "train-h100-asg", _set(["inputs", "maxSize"], 64.0), ""),
    ("gpu-pool-observability", DEV, "gpu-operator-release",
     _set(["inputs", "values", "dcgmExporter", "enabled"], False), ""),
    # A release manifest's namespace is its operator's only while the release declares it and runs its controller,
    # and nothing else, there (decisions/platform/release_manifest.py RELEASE_ANNOTATION).
    ("k8s-namespace-default-deny", P, JOBSET_NAMESPACE, _release(None), JOBSET_NAMESPACE),
    ("k8s-namespace-default-deny", DEV, JOBSET_CONTROLLER, _release("someone-else@v1"), JOBSET_NAMESPACE),
]


def _mutate_named(document, name, change):
    """`mutated`, but a name two resources share (a ClusterRole and its binding) picks the one `change` handles."""
    matches = [r for r in document["resources"] if r["name"] == name]
    if len(matches) == 1:
        return mutated(document, name, change)
    document = copy.deepcopy(document)
    for resource in [r for r in document["resources"] if r["name"] == name]:
        change(resource)
    return document


@pytest.mark.parametrize("policy,stack,name,change,culprit", VIOLATIONS,
                         ids=[f"{v[0]}-{v[1]}-{v[2]}-{i}" for i, v in enumerate(VIOLATIONS)])
def test_each_policy_passes_the_real_resource_and_catches_it_mutated(documents, policy, stack, name, change, culprit):
    compliant = documents[stack]
    assert not {f for f in found(compliant) if f[0] == policy}
    reported = {f for f in found(_mutate_named(compliant, name, change)) if f[0] == policy}
    assert (policy, culprit) in reported


def test_every_policy_has_a_violating_case():
    assert {p.name for p in pack.POLICIES} - {v[0] for v in VIOLATIONS} == {
        "s3-access-logging", "s3-replication"}   # removal cases below


def test_no_policy_writes_to_the_props_the_runner_shares_between_policies(documents, monkeypatch):
    """plan/policy_runner.py builds one props proxy per resource for every resource policy, where pulumi_policy's
    analyzer builds one per policy: sound only while no policy writes to them."""
    from pulumi_policy import proxy

    def refuse(self, key, value):
        raise AssertionError(f"a policy wrote {key!r} into a resource's props")

    monkeypatch.setattr(proxy._DictProxy, "__setitem__", refuse)
    for document in documents.values():
        for view in VIEWS:
            run_pack(document, view=view)


def test_only_a_pinned_releases_namespace_is_excepted(documents):
    """The namespace and its controller carrying one label is not enough: it must be a release that
    decisions/catalog/charts.yaml pins, or any namespace could except itself by annotating its workloads."""
    document = documents[US]
    for resource in document["resources"]:
        if resource["name"] in (JOBSET_NAMESPACE, JOBSET_CONTROLLER):
            _release("jobset@v9.9.9")(resource)
    assert ("k8s-namespace-default-deny", JOBSET_NAMESPACE) in found(document)
    assert pack.PINNED_RELEASES == {"mpi-operator@v0.8.0", "jobset@v0.12.0"}


def test_a_missing_resource_is_caught_too(documents):
    us, dev = documents[US], documents[DEV]
    assert ("s3-access-logging", "artifacts-bucket") in found(without(us, "artifacts-access-logs"))
    assert ("s3-replication", "models-bucket") in found(without(us, "replication-models"))
    assert ("k8s-namespace-default-deny", "tenancy-training") in found(without(dev, "tenancy-training-default-deny"))
    assert ("spot-interruption-handling", "dev-gpu-spot-asg") in found(without(dev, "node-drain-nth"))
    assert ("vpc-default-security-group-empty", "network-vpc") in found(without(dev, "network-default-sg"))
    assert ("gpu-pool-observability", "") in found(without(dev, "monitoring-gpu-alerts"))


def test_boundaries_pass(documents):
    us, dev = documents[US], documents[DEV]
    hop2 = mutated(us, "train-h100-lt", _set(["inputs", "metadataOptions", "httpPutResponseHopLimit"], 2.0))
    assert not {f for f in found(hop2) if f[0] == "launch-template-imdsv2"}
    listener = mutated(dev, "network-endpoints-https", lambda r: r["inputs"].update(cidrIpv4="0.0.0.0/0"))
    assert not {f for f in found(listener) if f[0] == "no-open-ingress"}          # 443: a listener port
    scoped = mutated(dev, "cluster-eks", lambda r: r["inputs"]["vpcConfig"].update(
        endpointPublicAccess=True, publicAccessCidrs=["203.0.113.0/24"]))
    assert not {f for f in found(scoped) if f[0] == "eks-endpoint-not-public"}
    slash8 = mutated(dev, "cluster-eks", lambda r: r["inputs"]["vpcConfig"].update(       # one organisation's widest
        endpointPublicAccess=True, publicAccessCidrs=["44.0.0.0/8"]))
    assert not {f for f in found(slash8) if f[0] == "eks-endpoint-not-public"}
    # The log bucket takes no logging of itself, and the secondary region replicates nothing of its own.
    assert not {f for f in found(documents[EU]) if f[0] in ("s3-access-logging", "s3-replication")}
    # A protection is a prod rule: the same linked file system exporting nothing, in a stack tagged staging, passes;
    # backups of a linked file system are refused in any stack (FSx does not take them).
    eu = mutated(documents[EU], "lustre-data", _set(["inputs", "s3", "autoExportPolicy", "events"], []))
    assert ("fsx-backups-or-export", "lustre-fs") in found(eu)
    staging = lambda r: r["inputs"].update(defaultTags=r["inputs"]["defaultTags"].replace(  # noqa: E731
        '"environment": "prod"', '"environment": "staging"'))
    assert not {f for f in found(mutated(eu, "aws", staging)) if f[0] == "fsx-backups-or-export"}
    backed_up = mutated(mutated(documents[EU], "aws", staging), "lustre-fs",
                        _set(["inputs", "automaticBackupRetentionDays"], 7.0))
    assert ("fsx-backups-or-export", "lustre-fs") in found(backed_up)
    # A year exactly is enough in prod, and "never expire" (no retention) keeps them longer; a dev stack's week passes.
    year = mutated(us, "network-flow-logs", _set(["inputs", "retentionInDays"], 365.0))
    forever = mutated(us, "lustre-logs", lambda r: r["inputs"].pop("retentionInDays"))
    assert not {f for d in (year, forever, dev) for f in found(d) if f[0] == "log-retention-in-prod"}
    # Only a bucket that receives access logs is excepted from SSE-KMS: the same SSE-S3 elsewhere is reported.
    assert ("s3-sse-kms", "artifacts-bucket") in found(mutated(us, "artifacts-encryption", _set(
        ["inputs", "rules", 0, "applyServerSideEncryptionByDefault"], {"sseAlgorithm": "AES256"})))
    # A tag the provider lost can be carried by the resource itself.
    untagged = mutated(dev, "aws", _drop_default_tag("team"))
    retagged = mutated(untagged, "network-vpc", lambda r: r["inputs"].setdefault("tags", {}).update(team="x"))
    assert ("required-tags", "network-vpc") not in found(retagged)


def test_a_file_system_not_linked_to_s3_is_held_to_backups_instead(documents):
    """The reverse of the program's choice: without its association a prod file system has no export, so FSx
    backups (daily and a final one) must protect it, and then they are no contradiction."""
    unlinked = without(documents[P], "lustre-data")
    messages = [v["message"] for v in run_pack(unlinked)["violations"] if v["policyName"] == "fsx-backups-or-export"]
    assert len(messages) == 2 and "neither linked to S3 with automatic export nor backed up" in messages[0]
    assert "skips its final backup on delete" in messages[1]       # the provider's default, left as it is
    backed_up = mutated(unlinked, "lustre-fs", lambda r: r["inputs"].update(automaticBackupRetentionDays=14.0,
                                                                           skipFinalBackup=False))
    assert not {f for f in found(backed_up) if f[0] == "fsx-backups-or-export"}
    # ... while the very same backups on the linked file system are what FSx refuses
    assert ("fsx-backups-or-export", "lustre-fs") in found(mutated(documents[P], "lustre-fs", lambda r: r[
        "inputs"].update(automaticBackupRetentionDays=14.0, skipFinalBackup=False)))


def test_budget_is_the_stacks_and_its_edge_passes(documents):
    document = documents[US]
    at_max = document["cost"]["gpuPools"]["hourlyAtMax"]        # what the plan prices (decisions/cost/cost.py)
    assert document["cost"]["budgetMaxHourlyUsd"] == 450
    assert ("hourly-cost-within-budget", "") not in found(document, {"hourly-cost-within-budget": {"maxHourlyUsd": at_max}})
    assert ("hourly-cost-within-budget", "") in found(document, {"hourly-cost-within-budget": {"maxHourlyUsd": at_max - 0.01}})
    document["cost"]["budgetMaxHourlyUsd"] = None
    verdict = run_pack(document)
    assert {"policyName": "hourly-cost-within-budget", "reason": "no maxHourlyUsd configured"} in verdict["notApplicable"]


def test_an_unpriced_item_is_a_violation_unless_the_stack_acknowledges_it(documents):
    """The budget's rule on holes, as the engine feeds the pack: a pool whose type has no price in the region (here
    train-h100 moved to p5e.48xlarge, which has no on-demand price in us-east-1) or a file system in a tier without a
    rate is reported unless gpu-cloud:budget.unpriced names it (decisions/cost/cost.py unacknowledged)."""
    document = mutated(documents[US], "train-h100-lt", _set(["inputs", "instanceType"], "p5e.48xlarge"))
    document["cost"]["budgetUnpriced"] = [n for n in document["cost"]["budgetUnpriced"] if n != "train-h100"]
    messages = _budget_verdict(document, 450, document["cost"]["budgetUnpriced"])
    assert [m for m in messages if "train-h100" in m] == [
        "GPU pools at maxSize cost no more than the hourly budget.\npool train-h100: no on-demand price for "
        "p5e.48xlarge in us-east-1 (decisions/catalog/catalog.yaml), so the budget cannot cover it: price it, or "
        "acknowledge it in gpu-cloud:budget.unpriced (train-h100)"]
    assert not [m for m in _budget_verdict(document, 450, document["cost"]["budgetUnpriced"] + ["train-h100"])
                if "train-h100" in m]
    # a price the stack assumes (gpu-cloud:budget.assumed) prices the pool instead, and the budget counts it
    assumed = {"train-h100": {"usdPerNodeHour": 100.0, "source": "the stack's own figure, for this test"}}
    config = {"maxHourlyUsd": 450, "unpriced": document["cost"]["budgetUnpriced"], "assumed": assumed}
    (over,) = [v["message"] for v in run_pack(document, {"hourly-cost-within-budget": config})["violations"]
               if v["policyName"] == "hourly-cost-within-budget"]
    assert "train-h100 $400.00" in over and "over the budget of $450.00/hour" in over       # 4 reserved x $100
    # a file system in a tier prices.yaml has no rate for
    from decisions.cost.cost import load_prices
    tiers = load_prices().region("us-east-1").lustre_persistent2_gb_month
    unpriced_tier = next(t for t in (125, 250, 500, 1000) if t not in tiers)
    lustre = mutated(documents[US], "lustre-fs", _set(["inputs", "perUnitStorageThroughput"], float(unpriced_tier)))
    acknowledged = [n for n in lustre["cost"]["budgetUnpriced"] if n != "fsx-lustre"]
    (message,) = _budget_verdict(lustre, 450, acknowledged)
    assert f"FSx for Lustre lustre-fs ({unpriced_tier} MB/s/TiB): no sourced rate" in message
    # reported on the file system, where a reviewer of the preview looks for it
    assert ("hourly-cost-within-budget", "lustre-fs") in found(
        lustre, {"hourly-cost-within-budget": {"maxHourlyUsd": 450, "unpriced": acknowledged}})
    assert _budget_verdict(lustre, 450, acknowledged + ["fsx-lustre"]) == []


# dev's GPU pool at maxNodes, as the plan and docs/configuration.md show it: 3 x g6.12xlarge spot = $7.2903... an hour.
# tests/test_validate.py holds the config check to the same figure.
DEV_AT_MAX = 7.29


def _budget_verdict(document, budget, unpriced=None):
    config = {"maxHourlyUsd": budget, **({} if unpriced is None else {"unpriced": unpriced})}
    return [v["message"] for v in run_pack(document, {"hourly-cost-within-budget": config})[
        "violations"] if v["policyName"] == "hourly-cost-within-budget"]


def test_the_pack_and_the_config_check_agree_at_the_exact_cent(documents):
    """A budget written as the cost the plan shows passes the config check AND the pack; one cent less, both refuse.
    (The pack once compared the unrounded 7.2903 with 7.29 and refused what the config check had accepted.)"""
    from decisions.config.errors import ConfigError
    from tests.test_validate import dev_config, load_dev
    dev = documents[DEV]
    page = (ROOT / "docs/configuration.md").read_text()
    assert dev["cost"]["budgetHourlyAtMax"] == 7.2903 and f"cost ${DEV_AT_MAX:.2f}/hour" in page
    assert "costs $7.2903 an hour, shown $7.29, and\n`maxHourlyUsd: 7.29` passes" in page
    assert _budget_verdict(dev, DEV_AT_MAX) == []
    assert load_dev(dev_config(DEV_AT_MAX)).budget.max_hourly_usd == DEV_AT_MAX
    below = round(DEV_AT_MAX - 0.01, 2)
    (message,) = _budget_verdict(dev, below)
    assert f"GPU pools at maxSize cost ${DEV_AT_MAX:.2f}/hour, over the budget of ${below:.2f}/hour" in message
    with pytest.raises(ConfigError) as raised:
        load_dev(dev_config(below))
    assert f"GPU pools at maxNodes cost ${DEV_AT_MAX:.2f}/hour, above the budget ${below:.2f}/hour" in str(raised.value)


@pytest.mark.parametrize("stack", STACKS)
def test_the_pack_sums_the_budget_figure_the_plan_shows(documents, stack):
    """The pack sees resources only (no commitment, each reservation at maxSize); the program checks the budget by the
    same rule (decisions/cost/cost.py over_budget), so for every shipped stack the two totals are one figure."""
    document = documents[stack]
    (message,) = _budget_verdict(document, 0.01)
    shown = re.search(r"GPU pools at maxSize cost \$([\d,.]+)/hour", message)[1]
    assert shown == f"{document['cost']['budgetHourlyAtMax']:,.2f}"
    # what the config check would say of the same budget
    from decisions.config.validate import budget_issues
    from decisions.network.zones import reservations_from_table
    from plan.stackfile import load_stack
    import dataclasses
    spec = load_stack(stack)[1]
    spec = dataclasses.replace(spec, budget=spec.budget.model_copy(update={"max_hourly_usd": 0.01}))
    read = document["outputs"].get("reservations")
    (issue,) = budget_issues(spec, reservations_from_table(read) if read is not None else None)
    assert f"cost ${shown}/hour" in issue.message


def test_the_packs_constants_are_the_decisions_it_enforces(documents):
    from decisions.config.validate import REQUIRED_TAGS, resource_tags
    from decisions.nodes.drain import NTH_MANAGED_TAG
    from decisions.observability.logs import PROD_MIN_RETENTION_DAYS
    from decisions.storage import buckets
    assert pack.PROD_LOG_RETENTION_DAYS == PROD_MIN_RETENTION_DAYS
    assert tuple(pack.REPLICATED_PURPOSES) == buckets.REPLICATED
    assert pack.REQUIRED_TAG_KEYS == [*REQUIRED_TAGS, *resource_tags({}, environment="prod", stack="s")]
    # the StackReference to the DR peer is the one layers.py registers
    registered = {r["name"] for r in documents[US]["resources"] if r["type"] == pack.STACK_REFERENCE}
    assert registered == {pack.DR_PEER_REFERENCE}
    # the handler's default tag, and the log bucket's encryption, are the program's
    dev = documents[DEV]
    handler = next(r for r in dev["resources"] if r["name"] == "node-drain-nth")
    assert handler["inputs"]["values"].get("managedTag", NTH_MANAGED_TAG) == NTH_MANAGED_TAG
    untagged = _mutate_named(dev, "node-drain-nth", lambda r: r["inputs"]["values"].pop("managedTag", None))
    assert not {f for f in found(untagged) if f[0] == "spot-interruption-handling"}    # the default is the tag
    logs = next(r for r in dev["resources"] if r["name"] == "logs-encryption")
    assert logs["inputs"]["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == buckets.LOG_BUCKET_SSE


def test_only_the_stacks_log_bucket_is_excepted_not_any_bucket_a_logging_names(documents):
    """A BucketLogging pointed at the models bucket by mistake waives neither SSE-KMS nor access logging for it:
    only the stack's log bucket (decisions.storage.buckets.bucket_name(..., LOGS)) is excepted."""
    us = documents[US]
    models = next(r for r in us["resources"] if r["name"] == "models-bucket")

    def retarget(resource):
        resource["inputs"]["targetBucket"] = models["inputs"]["bucket"]
        resource["propertyDependencies"]["targetBucket"] = [models["urn"]]
    misdirected = mutated(us, "artifacts-access-logs", retarget)
    misdirected = mutated(misdirected, "models-encryption", _set(
        ["inputs", "rules", 0, "applyServerSideEncryptionByDefault"], {"sseAlgorithm": "AES256"}))
    misdirected = without(misdirected, "models-access-logs")
    for view in ("update", "preview"):
        reported = found_in(misdirected, view)
        assert {("s3-sse-kms", "models-bucket"), ("s3-access-logging", "models-bucket")} <= reported, view
        assert not {f for f in reported if f[1] == "logs-bucket"}, view       # the log bucket is still known
    # ... while the same models bucket, rightly encrypted and logged, is fine as a (misdirected) target
    assert not {f for f in found(mutated(us, "artifacts-access-logs", retarget)) if f[1] == "models-bucket"}


def test_the_log_bucket_is_known_by_its_name_for_the_stack_of_its_urn():
    from decisions.storage.buckets import LOGS, MODELS, bucket_name
    from types import SimpleNamespace

    def bucket(stack):
        return SimpleNamespace(urn=f"urn:pulumi:{stack}::gpu-cloud::gpu-cloud:buckets:SecureBucket$aws:s3/bucket:"
                                   "Bucket::logs-bucket")
    name = bucket_name("gpu-cloud", "dev", "123456789012", LOGS)
    assert pack.log_bucket(bucket("dev"), name) is True
    assert pack.log_bucket(bucket("prod-us-east-1"), name) is False             # another stack's log bucket
    assert pack.log_bucket(bucket("dev"), bucket_name("gpu-cloud", "dev", "123456789012", MODELS)) is False
    assert pack.log_bucket(bucket("dev"), pack.UNKNOWN) is None                # a preview cannot tell
    long = "a-stack-name-long-enough-to-cut-the-bucket-name"
    assert pack.log_bucket(bucket(long), bucket_name("gpu-cloud", long, "123456789012", LOGS)) is True


def test_config_sets_allowed_types_tags_and_advisory_levels(documents):
    document = documents[US]
    allowed = [t for t in pack.allowed_instance_types_default() if t != "p5.48xlarge"]
    assert ("gpu-pool-instance-types", "train-h100-asg") in found(
        document, {"gpu-pool-instance-types": {"allowedInstanceTypes": allowed}})
    assert ("required-tags", "network-vpc") in found(document, {"required-tags": {"requiredTagKeys": ["owner"]}})
    broken = mutated(document, "cluster-eks", _set(["protect"], False))
    levels = {v["policyName"]: v["enforcementLevel"]
              for v in run_pack(broken, {"stateful-resources-protected": "advisory"})["violations"]}
    assert levels == {"stateful-resources-protected": "advisory"}
    assert run_pack(broken, {"all": "disabled"})["violations"] == []
    for bad in ({"no-such-policy": "advisory"}, {"required-tags": "fatal"}, {"required-tags": {"colour": 1}}):
        with pytest.raises(PolicyConfigError):
            resolve_config(pack.POLICIES, bad)


@pytest.mark.parametrize("config, message", [
    ({"requried-tags": "advisory"}, "policy config: 'requried-tags' is not a policy of the pack; did you mean "
                                    "'required-tags'? (valid: all, "),
    ({"xyzzy": "advisory"}, "policy config: 'xyzzy' is not a policy of the pack (valid: all, "),
    ({"required-tags": {"requiredTagKey": ["team"]}}, "policy config: required-tags: 'requiredTagKey' is not a key "
     "of this policy; did you mean 'requiredTagKeys'? (valid: enforcementLevel, requiredTagKeys)"),
    ({"s3-versioning": {"colour": 1}}, "s3-versioning: 'colour' is not a key of this policy (valid: enforcementLevel)"),
    ({"required-tags": "advisry"}, "required-tags: enforcement level 'advisry' is not a level; did you mean "
                                   "'advisory'? (valid: advisory, mandatory, remediate, disabled)"),
], ids=["policy", "policy-far-off", "key", "no-keys", "level"])
def test_a_misspelt_policy_key_or_level_gets_did_you_mean_and_the_valid_names(config, message):
    with pytest.raises(PolicyConfigError) as raised:
        resolve_config(pack.POLICIES, config)
    assert message in str(raised.value), str(raised.value)
    if "policy of the pack" in message:
        assert str(raised.value).endswith(", ".join(sorted(p.name for p in pack.POLICIES)) + ")")


# --- one code path: the runner against direct calls ---------------------------------------------------------------
def test_runner_and_direct_validate_calls_agree_on_a_document_with_many_violations(documents):
    document = documents[US]
    names = {r["name"] for r in document["resources"]}
    for policy, _, name, change, _ in VIOLATIONS:     # each mutation the stack has a resource for
        if name in names:
            document = _mutate_named(document, name, change)
    by_runner = sorted((v["policyName"], v["urn"], v["message"].split("\n", 1)[1])
                       for v in run_pack(document)["violations"])
    assert len({p for p, *_ in by_runner}) >= 20

    direct = []
    providers = {r["urn"]: pulumi_policy.PolicyProviderResource(r["type"], r["inputs"], r["urn"], r["name"])
                 for r in document["resources"] if r["type"].startswith("pulumi:providers:")}

    def options(r):
        return pulumi_policy.PolicyResourceOptions(r["protect"], r["ignoreChanges"], r["deleteBeforeReplace"],
                                                   r["aliases"], pulumi_policy.PolicyCustomTimeouts(0, 0, 0), [],
                                                   r["parent"])

    # The engine hands a stack policy its resources in registration order (the pools as the stack file lists
    # them), each with its outputs (inputs and what the provider computed) and property dependencies.
    registered = resources_in_reading_order(document)
    stack = [PolicyResource(r["type"], view_outputs(r, None), r["urn"], r["name"], options(r),
                            providers.get(r["provider"]), None, [], {}) for r in registered]
    by_urn = {r.urn: r for r in stack}
    for raw, resource in zip(registered, stack):
        resource.parent = by_urn.get(raw["parent"])
        resource.dependencies.extend(by_urn[d] for d in raw["dependencies"] if d in by_urn)
        resource.property_dependencies.update({key: [by_urn[d] for d in urns if d in by_urn]
                                               for key, urns in raw["propertyDependencies"].items()})
    budget = {"maxHourlyUsd": document["cost"]["budgetMaxHourlyUsd"], "unpriced": document["cost"]["budgetUnpriced"]}
    for policy in pack.POLICIES:
        config = budget if policy.name == "hourly-cost-within-budget" else {}
        if isinstance(policy, ResourceValidationPolicy):
            for r in document["resources"]:
                policy.validate(ResourceValidationArgs(r["type"], r["inputs"], r["urn"], r["name"], options(r),
                                                       providers.get(r["provider"]), config),
                                lambda m, u=None, p=policy.name, urn=r["urn"]: direct.append((p, urn, m)))
        else:
            assert isinstance(policy, StackValidationPolicy)
            policy.validate(StackValidationArgs(stack, config),
                            lambda m, u=None, p=policy.name: direct.append((p, u or "", m)))
    assert by_runner == sorted(direct)


def test_the_runner_builds_what_the_engine_builds(documents):
    resources, resource_args, stack = engine_arguments(documents[US])
    asg = next(r for r in stack if r.name == "train-h100-asg")
    assert asg.parent.name == "train-h100" and "train-h100-lt" in {d.name for d in asg.dependencies}
    assert asg.provider.resource_type == "pulumi:providers:aws"
    assert asg.opts.ignore_changes == ["desiredCapacity", "initialLifecycleHooks", "suspendedProcesses"]
    assert asg.opts.custom_timeouts.delete_seconds == 25 * 60
    cluster = next(r for r in resources if r["name"] == "cluster-eks")
    args = resource_args(cluster, {"k": 1})
    assert args.opts.protect is True and args.get_config() == {"k": 1} and args.props["version"] == "1.35"


# --- the pack as the engine loads it ------------------------------------------------------------------------------
def test_policy_names_are_unique_and_each_says_what_it_checks():
    names = [p.name for p in pack.POLICIES]
    assert len(names) == len(set(names)) == 36
    assert all(p.description.endswith(".") and p.enforcement_level is None for p in pack.POLICIES)
    configured = {p.name: set(p.config_schema.properties) for p in pack.POLICIES if p.config_schema}
    assert configured == {"gpu-pool-instance-types": {"allowedInstanceTypes"}, "no-open-ingress": {"publicListenerPorts"},
                          "required-tags": {"requiredTagKeys"},
                          "hourly-cost-within-budget": {"maxHourlyUsd", "unpriced", "assumed"}}


def test_pack_entry_point_compiles_and_serves_exactly_the_policies(monkeypatch, tmp_path):
    py_compile.compile(str(ROOT / "policy" / "__main__.py"), cfile=str(tmp_path / "main.pyc"), doraise=True)
    served = {}
    monkeypatch.setattr(pulumi_policy, "PolicyPack", lambda **kwargs: served.update(kwargs))
    monkeypatch.setenv("PULUMI_STACK", "acme/prod-us-east-1")
    runpy.run_path(str(ROOT / "policy" / "__main__.py"), run_name="__main__")
    assert served["policies"] is pack.POLICIES and served["name"] == pack.PACK_NAME == "gpu-cloud"
    assert served["enforcement_level"] == pulumi_policy.EnforcementLevel.MANDATORY
    assert served["initial_config"] == {"hourly-cost-within-budget": {"maxHourlyUsd": 450.0, "unpriced": ["fsx-lustre"]}}
    manifest = yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert manifest["runtime"]["name"] == "python" and manifest["version"]


# --- the CLI: exit codes ------------------------------------------------------------------------------------------
def policy_check(path, *extra):
    return subprocess.run([sys.executable, "-m", "plan", "--policy-check", str(path), *map(str, extra)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CI": ""})


def test_policy_check_runs_the_pack_and_refuses_malformed_documents(documents, tmp_path):
    good = documents[DEV]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(good))
    result = policy_check(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Policy (pack gpu-cloud v1.0.0), as an update shows it: no violations" in result.stdout

    broken = mutated(good, "dev-gpu-spot-lt", _set(["inputs", "metadataOptions", "httpTokens"], "optional"))
    path.write_text(json.dumps(broken))
    result = policy_check(path)
    assert result.returncode == 1 and "[mandatory] launch-template-imdsv2: launch template dev-gpu-spot-lt" in result.stdout
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"launch-template-imdsv2": "advisory"}))
    result = policy_check(path, "--policy-config", config)
    assert result.returncode == 0 and "[advisory] launch-template-imdsv2" in result.stdout

    for violations, needle in ((["not an object"], "is not an object"),
                               ([{"policyName": "x", "enforcementLevel": "fatal", "message": "m", "urn": ""}], "fatal"),
                               ([{"policy": "x", "enforcement": "mandatory", "message": "m"}], "policyName")):
        document = copy.deepcopy(good)
        document["policy"]["violations"] = violations
        path.write_text(json.dumps(document))
        result = policy_check(path)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr

    path.write_text(json.dumps(good))
    config.write_text(json.dumps({"launch-template-imdsv2": "sometimes"}))
    result = policy_check(path, "--policy-config", config)
    assert result.returncode == 2 and "sometimes" in result.stderr and "Traceback" not in result.stderr


def test_the_policy_page_lists_every_policy_and_its_example_config_is_one_the_runner_takes(documents):
    section = (ROOT / "docs/policies.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))
    assert listed == {p.name for p in pack.POLICIES}
    example = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    verdict = run_pack(documents["dev"], example)
    # The example allows p5 and g6e only: dev's g6.12xlarge pool is named, as a mandatory violation.
    assert [(v["policyName"], v["enforcementLevel"]) for v in verdict["violations"]] == [
        ("gpu-pool-instance-types", "mandatory")]


def test_violations_name_pools_in_the_stack_files_order(documents):
    verdict = run_pack(documents["prod-us-east-1"],
                       {"gpu-pool-instance-types": {"allowedInstanceTypes": ["p5.48xlarge", "g6e.12xlarge"]}})
    named = [v["urn"].rsplit("::", 1)[1] for v in verdict["violations"]]
    assert named == ["finetune-a100-80gb-spot-asg", "finetune-a100-40gb-spot-asg"]   # as the stack file lists them


# --- the views: what the engine shows the pack on a preview (plan/views.py) --------------------------------------
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_pass_the_pack_in_every_view(documents, stack, view):
    assert run_pack(documents[stack], view=view)["violations"] == []


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("stack", STACKS)
def test_the_pack_is_shown_every_object_of_the_release_manifests(documents, stack, view):
    """The MPI Operator's and JobSet's objects are resources of the plan (a yaml/v2 ConfigFile's are not), so the
    pack judges their namespaces, as the engine shows them in each view: 0 violations."""
    document = documents[stack]
    objects = [r for r in document["resources"] if "gpu-cloud:release_manifest:ReleaseManifest$" in r["urn"]]
    namespaces = sorted(r["inputs"]["metadata"]["name"] for r in objects if r["type"] == pack.NAMESPACE)
    assert namespaces == ["jobset-system", "mpi-operator"] and len(objects) == 29
    _, _, stack_resources = engine_arguments(document, view=view)
    assert {r["urn"] for r in objects} <= {r.urn for r in stack_resources}
    assert run_pack(document, view=view)["violations"] == []


def unknown_at(document, name, path):
    """A copy of `document` whose preview view is a deployed stack in which only `name`'s `path` is unknown."""
    document = copy.deepcopy(document)
    (resource,) = [r for r in document["resources"] if r["name"] == name]
    document["policyViews"]["preview"] = {
        "existing": [r["urn"] for r in document["resources"]], "unconfiguredProviders": [], "absent": [],
        "unknownInputs": {resource["urn"]: [list(path)]}}
    return document


def found_in(document, view):
    names = {r["urn"]: r["name"] for r in document["resources"]}
    return {(v["policyName"], names.get(v["urn"], "")) for v in run_pack(document, view=view)["violations"]}


def _append_override(itype):
    return lambda r: r["inputs"]["mixedInstancesPolicy"]["launchTemplate"]["overrides"].append({"instanceType": itype})


def _drop_tls(resource):
    _deny_gone(resource)


# Every stack policy on one resource of a shipped stack: (policy, stack, resource, the input a preview may not
# know, a known bad change there, the resource the violation names). stateful-resources-protected reads resource
# options only, which a preview always knows.
STACK_CASES = [
    ("efa-placement-and-zone", EU, "train-a100-placement", ["strategy"], _set(["inputs", "strategy"], "spread"),
     "train-a100-placement"),
    ("efa-security-group-self", P, "train-h100-efa-in", ["ipProtocol"], _set(["inputs", "ipProtocol"], "tcp"),
     "train-h100-lt"),
    ("gpu-pool-verification-hook", P, "infer-l40s-asg", ["initialLifecycleHooks", 0, "defaultResult"],
     _set(["inputs", "initialLifecycleHooks", 0, "defaultResult"], "CONTINUE"), "infer-l40s-asg"),
    ("gpu-pool-instance-types", DEV, "dev-gpu-spot-asg",
     ["mixedInstancesPolicy", "launchTemplate", "overrides", 0, "instanceType"],
     _set(["inputs", "mixedInstancesPolicy", "launchTemplate", "overrides", 0, "instanceType"], "g6.16xlarge"),
     "dev-gpu-spot-asg"),
    ("gpu-pool-one-shape", P, "finetune-a100-40gb-spot-asg", ["mixedInstancesPolicy", "launchTemplate", "overrides"],
     _append_override("g6e.12xlarge"), "finetune-a100-40gb-spot-asg"),
    ("spot-interruption-handling", DEV, "dev-gpu-spot-asg", ["tags"], _untag("aws-node-termination-handler/managed"),
     "dev-gpu-spot-asg"),
    ("vpc-default-security-group-empty", DEV, "network-default-sg", ["ingress"],
     _set(["inputs", "ingress"], [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}]),
     "network-default-sg"),
    ("s3-public-access-blocked", P, "artifacts-public-access", ["blockPublicPolicy"],
     _set(["inputs", "blockPublicPolicy"], False), "artifacts-bucket"),
    ("s3-sse-kms", DEV, "models-encryption", ["rules", 0, "applyServerSideEncryptionByDefault", "sseAlgorithm"],
     _set(["inputs", "rules", 0, "applyServerSideEncryptionByDefault", "sseAlgorithm"], "AES256"), "models-bucket"),
    ("s3-versioning", EU, "checkpoints-versioning", ["versioningConfiguration", "status"],
     _set(["inputs", "versioningConfiguration", "status"], "Suspended"), "checkpoints-bucket"),
    ("s3-tls-only", P, "datasets-policy", ["policy"], _drop_tls, "datasets-bucket"),
    # The logging's target is the new log bucket: unknown, yet its property dependency names the bucket.
    ("s3-access-logging", P, "artifacts-access-logs", ["targetBucket"],
     lambda r: r["propertyDependencies"].update(bucket=[]) or r["inputs"].update(bucket="elsewhere"),
     "artifacts-bucket"),
    ("s3-replication", P, "replication-models", ["rules", 0, "status"], _set(["inputs", "rules", 0, "status"], "Disabled"),
     "models-bucket"),
    ("fsx-backups-or-export", EU, "lustre-fs", ["automaticBackupRetentionDays"],
     _set(["inputs", "automaticBackupRetentionDays"], 7.0), "lustre-fs"),
    ("fsx-backups-or-export", P, "lustre-data", ["s3", "autoExportPolicy", "events"],
     _set(["inputs", "s3", "autoExportPolicy", "events"], ["NEW"]), "lustre-fs"),
    ("k8s-namespace-default-deny", DEV, "tenancy-training-default-deny", ["spec", "policyTypes"],
     _set(["inputs", "spec", "policyTypes"], ["Ingress"]), "tenancy-training"),
    ("k8s-namespace-default-deny", P, JOBSET_NAMESPACE, ["metadata", "annotations"], _release(None), JOBSET_NAMESPACE),
    ("required-tags", EU, "infer-a10g-spot-asg", ["tags"], _untag("costCenter"), "infer-a10g-spot-asg"),
    ("gpu-pool-observability", DEV, "gpu-operator-release", ["values", "dcgmExporter", "enabled"],
     _set(["inputs", "values", "dcgmExporter", "enabled"], False), ""),
    ("hourly-cost-within-budget", P, "train-h100-asg", ["maxSize"], _set(["inputs", "maxSize"], 64.0), ""),
]


def test_every_stack_policy_has_a_case_of_unknown_known_bad_and_known_good():
    stack_policies = {p.name for p in pack.POLICIES if isinstance(p, StackValidationPolicy)}
    assert stack_policies - {c[0] for c in STACK_CASES} == {"stateful-resources-protected"}


@pytest.mark.parametrize("policy,stack,name,path,bad,culprit", STACK_CASES, ids=[c[0] for c in STACK_CASES])
def test_a_stack_policy_judges_known_values_and_leaves_unknown_ones_to_the_update(documents, policy, stack, name,
                                                                                 path, bad, culprit):
    document = documents[stack]
    assert not {f for f in found_in(document, "update") if f[0] == policy}                      # known good
    assert not {f for f in found_in(unknown_at(document, name, path), "preview") if f[0] == policy}   # unknown
    broken = _mutate_named(document, name, bad)
    assert (policy, culprit) in found_in(broken, "update")                                      # known bad
    # ... and still caught in a preview where something else of the resource is unknown.
    other = ["description"] if path != ["description"] else ["tags"]
    assert (policy, culprit) in found_in(unknown_at(broken, name, other), "preview")


def test_a_violation_visible_in_a_first_preview_is_still_reported(documents):
    """What a new stack's first preview can see, it judges: a plain-text bucket policy without the TLS statement,
    a rule open to the internet, a missing tag, a spot group the handler would skip."""
    def known_in_first_preview(document, name):
        urn = next(r["urn"] for r in document["resources"] if r["name"] == name)
        document["policyViews"]["first-preview"]["unknownInputs"].pop(urn, None)
        return document

    us, dev = documents[US], documents[DEV]
    plain = known_in_first_preview(_mutate_named(us, "datasets-policy", _drop_tls), "datasets-policy")
    assert ("s3-tls-only", "datasets-bucket") in found_in(plain, "first-preview")
    open_rule = _mutate_named(us, "lustre-in-988-client-0", lambda r: (
        r["inputs"].pop("referencedSecurityGroupId"), r["inputs"].update(cidrIpv4="0.0.0.0/0")))
    assert ("no-open-ingress", "lustre-in-988-client-0") in found_in(open_rule, "first-preview")
    untagged = _mutate_named(dev, "dev-gpu-spot-asg", _untag("team"))
    assert ("required-tags", "dev-gpu-spot-asg") in found_in(untagged, "first-preview")
    unmanaged = _mutate_named(dev, "dev-gpu-spot-asg", _untag("aws-node-termination-handler/managed"))
    assert ("spot-interruption-handling", "dev-gpu-spot-asg") in found_in(unmanaged, "preview")


def test_what_a_first_preview_cannot_see_is_not_reported_missing(documents):
    """Under the unconfigured Kubernetes provider every release is an empty map: a missing handler, exporter or
    network policy cannot be told from one not shown yet. The update reports it."""
    dev = documents[DEV]
    for name, policy in (("node-drain-nth", "spot-interruption-handling"),
                         ("gpu-operator-release", "gpu-pool-observability"),
                         ("tenancy-training-default-deny", "k8s-namespace-default-deny")):
        gone = without(dev, name)
        assert policy in {f[0] for f in found_in(gone, "update")}
        assert policy not in {f[0] for f in found_in(gone, "first-preview")}


def test_every_policy_says_what_it_does_with_unknowns_and_the_page_shows_it():
    assert set(pack.IN_PREVIEW) == {p.name for p in pack.POLICIES}
    page = (ROOT / "docs/policies.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \|.*\| ([^|]+) \|$", page, re.M))
    assert {name: text.strip() for name, text in rows.items()} == pack.IN_PREVIEW
