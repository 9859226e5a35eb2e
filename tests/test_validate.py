"""Config validation: every mistake is reported, by full key path, with what is allowed."""
import pytest

from decisions.catalog.catalog import EfaSpec, load_catalog
from decisions.config.errors import ConfigError
from decisions.config.validate import load_stack_spec
from tests.conftest import setting


def valid_config():
    return {
        "environment": "prod",
        "tags": {"team": "ml", "costCenter": "cc-1"},
        "network": {"cidr": "10.0.0.0/16", "zones": ["use1-az1", "use1-az2", "use1-az4"]},
        "cluster": {"adminRoleArns": ["arn:aws:iam::123456789012:role/admin"], "deployerAccess": "public",
                    "publicAccessCidrs": ["198.18.0.0/24"]},
        "nodePools": [
            {"name": "train", "instanceTypes": ["p5.48xlarge"], "capacity": "reserved",
             "capacityReservationId": "cr-0123456789abcdef0", "minNodes": 1, "desiredNodes": 2, "maxNodes": 2,
             "availabilityZone": "us-east-1a", "workload": "training"},
            {"name": "infer", "instanceTypes": ["g6e.12xlarge"], "capacity": "spot", "efa": False,
             "minNodes": 0, "desiredNodes": 0, "maxNodes": 4, "workload": "inference"},
        ],
        # 8 replicas (10 in a rollout) fill 3 nodes of 4 GPUs, and one more drains: the infer pool's maxNodes 4
        "inference": {"triton": {"enabled": True, "pool": "infer", "modelRepository": "s3://models/triton",
                                 "maxReplicas": 8}},
        "dr": {"role": "none"},
    }


def test_a_type_not_in_the_catalog_gets_no_did_you_mean():
    config = valid_config()
    config["nodePools"][1]["instanceTypes"] = ["g6e.4xlarge"]
    with pytest.raises(ConfigError) as raised:
        load(config)
    (issue,) = [i for i in raised.value.issues if i.path == "gpu-cloud:nodePools[1].instanceTypes[0]"]
    assert "did you mean" not in issue.message


def test_a_slash_8_public_range_is_accepted():
    config = valid_config()
    config["cluster"]["publicAccessCidrs"] = ["44.0.0.0/8"]
    assert load(config).cluster.public_access_cidrs == ("44.0.0.0/8",)


def test_private_paths_that_reach_the_endpoint_are_accepted():
    config = valid_config()
    config["network"]["transitGateway"] = {"id": "tgw-0123456789abcdef0", "routes": ["10.200.0.0/22"]}
    config["cluster"].update(deployerAccess="private", publicAccessCidrs=[],
                             privateAccessCidrs=["10.200.1.0/24", "10.0.250.0/24"])       # routed; in the VPC
    assert load(config).cluster.private_access_cidrs == ("10.200.1.0/24", "10.0.250.0/24")
    config["cluster"].update(privateAccessCidrs=[], privateAccessSecurityGroupIds=["sg-0123456789abcdef0"])
    assert load(config).cluster.deployer_access == "private"


def load(config, region="us-east-1"):
    return load_stack_spec(config, stack="test", region=region)


def issues_of(mutate, region="us-east-1"):
    config = valid_config()
    mutate(config)
    with pytest.raises(ConfigError) as raised:
        load(config, region)
    return raised.value.issues


def pool(i):
    return lambda c: c["nodePools"][i]


def setter(path, value):
    return setting(*path, value=value)


def deleter(path):
    def mutate(config):
        target = config
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
    return mutate


MISTAKES = [
    # (what the user got wrong, mutation, key path reported, words the message must contain)
    ("missing environment", deleter(["environment"]), "gpu-cloud:environment", "required"),
    ("unknown environment", setter(["environment"], "production"), "gpu-cloud:environment", "'prod', 'staging' or 'dev'"),
    ("misspelt top-level key", setter(["nodepools"], []), "gpu-cloud:nodepools", "did you mean nodePools"),
    ("tags without costCenter", setter(["tags"], {"team": "ml"}), "gpu-cloud:tags.costCenter", "must be set"),
    ("tag key reserved by AWS", setter(["tags", "aws:owner"], "x"), "gpu-cloud:tags.aws:owner", "reserved by AWS"),
    ("CIDR is not a CIDR", setter(["network", "cidr"], "10.0.0.0/33"), "gpu-cloud:network.cidr", "not an IPv4 CIDR"),
    ("VPC too large", setter(["network", "cidr"], "10.0.0.0/12"), "gpu-cloud:network", "/16 to /20"),
    ("too many zones", setter(["network", "zones"], [f"use1-az{i}" for i in range(1, 8)]), "gpu-cloud:network.zones", "at most 6 items"),
    ("one zone", setter(["network", "zones"], ["use1-az1"]), "gpu-cloud:network.zones", "at least 2 items"),
    ("zones not declared", deleter(["network", "zones"]), "gpu-cloud:network.zones", "required"),
    ("zone given by name", setter(["network", "zones"], ["us-east-1a", "us-east-1b"]), "gpu-cloud:network.zones", "us-east-1a, us-east-1b are zone names; zones takes zone IDs (use1-az1)"),
    ("zone neither name nor ID", setter(["network", "zones"], ["use1-az1", "az2"]), "gpu-cloud:network.zones[1]", "'az2' is not an availability zone ID such as use1-az1"),
    ("zone repeated", setter(["network", "zones"], ["use1-az1", "use1-az1"]), "gpu-cloud:network", "zones repeat"),
    ("zone of another region", setter(["network", "zones"], ["use1-az1", "euw1-az2"]), "gpu-cloud:network.zones[1]", "not a zone ID of us-east-1"),
    ("zone EKS refuses", setter(["network", "zones"], ["use1-az1", "use1-az3"]), "gpu-cloud:network.zones[1]", "EKS does not accept cluster subnets"),
    ("public address range", setter(["network", "cidr"], "100.64.0.0/16"), "gpu-cloud:network", "not in a private (RFC 1918) range"),
    ("pool pinned to an undeclared zone ID", lambda c: pool(0)(c).update(availabilityZone="use1-az6"), "gpu-cloud:nodePools[0].availabilityZone", "not one of network.zones"),
    ("placement group on a capacity block", lambda c: pool(0)(c).update(capacity="capacity-block", placementGroup="pg-1"), "gpu-cloud:nodePools[0].placementGroup", "capacity blocks need no placement group"),
    ("unknown NAT mode", setter(["network", "natGateways"], "none"), "gpu-cloud:network.natGateways", "'one-per-az' or 'single'"),
    ("misspelt nested key", setter(["network", "zone"], ["use1-az1"]), "gpu-cloud:network.zone", "did you mean zones"),
    ("unsupported Kubernetes version", setter(["cluster", "kubernetesVersion"], "1.21"), "gpu-cloud:cluster.kubernetesVersion", "allowed:"),
    ("public CIDR not a CIDR", setter(["cluster", "publicAccessCidrs"], ["0.0.0.0", "1.2.3.4/40"]), "gpu-cloud:cluster.publicAccessCidrs[1]", "not an IPv4 CIDR"),
    ("maxNodes given as a boolean", lambda c: pool(1)(c).update(maxNodes=True), "gpu-cloud:nodePools[1].maxNodes",
     "true is a boolean where a whole number belongs"),
    ("efa given as a word", lambda c: pool(1)(c).update(efa="yes"), "gpu-cloud:nodePools[1].efa", "'yes' is a string where true or false belongs: the Pulumi CLI reads stack files as YAML 1.2, where yes is a string and only true and false are booleans; write efa: true"),
    ("efa given as a quoted boolean", lambda c: pool(1)(c).update(efa="false"), "gpu-cloud:nodePools[1].efa", "'false' is a string where true or false belongs: remove the quotes (efa: false)"),
    ("maxNodes given in base 60", lambda c: pool(1)(c).update(maxNodes="1:30"), "gpu-cloud:nodePools[1].maxNodes", "'1:30' is a string where a whole number belongs: the Pulumi CLI reads stack files as YAML 1.2, which has no base-60 numbers"),
    ("budget given as a string", setter(["budget"], {"maxHourlyUsd": "20.5"}), "gpu-cloud:budget.maxHourlyUsd", "'20.5' is a string where a number belongs: remove the quotes (maxHourlyUsd: 20.5)"),
    ("label value given as a number", lambda c: pool(1)(c).update(labels={"tier": 2}), "gpu-cloud:nodePools[1].labels.tier", "2 is a number where a string belongs: quote it (tier: \"2\")"),
    ("minNodes given as a string", lambda c: pool(1)(c).update(minNodes="1"), "gpu-cloud:nodePools[1].minNodes",
     "'1' is a string where a whole number belongs: remove the quotes (minNodes: 1)"),
    ("version given as a number", setter(["cluster", "kubernetesVersion"], 1.35), "gpu-cloud:cluster.kubernetesVersion",
     "1.35 is a number where a string belongs: quote it (kubernetesVersion: \"1.35\")"),
    # 1.30 reaches the program as 1.3: the hint must not offer "1.3" as the fix without saying so.
    ("version given as a number that lost a zero", setter(["cluster", "kubernetesVersion"], 1.30),
     "gpu-cloud:cluster.kubernetesVersion", "quote it (kubernetesVersion: \"1.3\"), as the file writes it: unquoted, "
     "YAML reads a number and drops its trailing zeros (1.30 arrives as 1.3)"),
    ("more nodes than one pool may have", lambda c: pool(1)(c).update(maxNodes=65), "gpu-cloud:nodePools[1].maxNodes",
     "less than or equal to 64"),
    ("deployer path missing", deleter(["cluster", "deployerAccess"]), "gpu-cloud:cluster.deployerAccess", "required"),
    ("public path, no CIDRs", setter(["cluster", "publicAccessCidrs"], []), "gpu-cloud:cluster.publicAccessCidrs",
     "deployerAccess is public"),
    ("documentation range", setter(["cluster", "publicAccessCidrs"], ["203.0.113.0/24"]), "gpu-cloud:cluster.publicAccessCidrs[0]",
     "203.0.113.0/24 is inside 203.0.113.0/24, a documentation-only range (RFC 5737)"),
    # 0.0.0.0/0 overlaps the documentation ranges but is inside none of them: refused for its width, by key
    ("the whole Internet", setter(["cluster", "publicAccessCidrs"], ["198.18.0.0/24", "0.0.0.0/0"]),
     "gpu-cloud:cluster.publicAccessCidrs[1]", "0.0.0.0/0 opens the public endpoint to the whole Internet"),
    ("half the Internet", setter(["cluster", "publicAccessCidrs"], ["0.0.0.0/1"]), "gpu-cloud:cluster.publicAccessCidrs[0]",
     "0.0.0.0/1 opens the public endpoint to 1/2 of the Internet (2,147,483,648 addresses), wider than /8"),
    ("one step wider than /8", setter(["cluster", "publicAccessCidrs"], ["44.0.0.0/7"]),
     "gpu-cloud:cluster.publicAccessCidrs[0]", "wider than /8"),
    ("private range on the public endpoint", setter(["cluster", "publicAccessCidrs"], ["10.20.0.0/16"]),
     "gpu-cloud:cluster.publicAccessCidrs[0]", "inside 10.0.0.0/8, a private range (RFC 1918)"),
    ("loopback on the private endpoint", lambda c: c["cluster"].update(privateAccessCidrs=["127.0.0.1/32"]),
     "gpu-cloud:cluster.privateAccessCidrs[0]", "inside 127.0.0.0/8, loopback"),
    ("private path, nobody admitted", setter(["cluster", "deployerAccess"], "private"), "gpu-cloud:cluster.privateAccessCidrs",
     "nothing outside the nodes may reach the private endpoint"),
    ("private CIDR without a route", lambda c: c["cluster"].update(deployerAccess="private", privateAccessCidrs=["10.200.0.0/24"]),
     "gpu-cloud:cluster.privateAccessCidrs[0]", "neither in the VPC (10.0.0.0/16) nor in a network.transitGateway.routes range"),
    ("transit route over the VPC", setter(["network", "transitGateway"], {"id": "tgw-0123456789abcdef0", "routes": ["10.0.128.0/20"]}),
     "gpu-cloud:network", "transitGateway.routes: 10.0.128.0/20 overlaps the VPC 10.0.0.0/16"),
    ("bad transit gateway ID", setter(["network", "transitGateway"], {"id": "tgw-1", "routes": ["10.200.0.0/24"]}),
     "gpu-cloud:network.transitGateway.id", "transit gateway ID"),
    ("admin ARN is a user", setter(["cluster", "adminRoleArns"], ["arn:aws:iam::123456789012:user/bob"]), "gpu-cloud:cluster.adminRoleArns[0]", "IAM role ARN"),
    ("no admin role", setter(["cluster", "adminRoleArns"], []), "gpu-cloud:cluster.adminRoleArns", "at least 1"),
    ("cluster left at its default", deleter(["cluster"]), "gpu-cloud:cluster.adminRoleArns", "required"),
    ("installed driver branch too old for B200", lambda c: (c.update(gpuDriver={"source": "install", "branch": "535"}), pool(0)(c).update(instanceTypes=["p6-b200.48xlarge"])),
     "gpu-cloud:nodePools[0].instanceTypes[0]", "needs NVIDIA driver branch >= 570; the stack's driver is on branch 535"),
    ("driver version off its branch", setter(["gpuDriver"], {"branch": "580", "version": "570.1.2"}), "gpu-cloud:gpuDriver", "not on branch 580"),
    ("unknown driver source", setter(["gpuDriver"], {"source": "runfile"}), "gpu-cloud:gpuDriver.source", "'ami' or 'install'"),
    ("AMI release not a release name", setter(["gpuDriver"], {"amiRelease": "latest"}), "gpu-cloud:gpuDriver.amiRelease", "EKS AMI release"),
    ("AMI release gpu-cloud does not know", setter(["gpuDriver"], {"amiRelease": "v20240101"}),
     "gpu-cloud:gpuDriver.amiRelease",
     "not a release in decisions/nodes/amis.yaml; releases for Kubernetes 1.35: v20260714"),
    ("AMI release without the cluster's minor", lambda c: (c["cluster"].update(kubernetesVersion="1.35"), c.update(gpuDriver={"amiRelease": "v20251217"})),
     "gpu-cloud:gpuDriver.amiRelease", "has no Kubernetes 1.35 AMI"),
    ("branch the AMI does not carry", setter(["gpuDriver"], {"branch": "570"}), "gpu-cloud:gpuDriver.branch", "carries driver 580.159.03"),
    ("version another AMI release carries", setter(["gpuDriver"], {"version": "580.105.08"}), "gpu-cloud:gpuDriver.version", "carries it: v20260116, v20260114"),
    ("version no AMI release carries", setter(["gpuDriver"], {"version": "580.65.06"}), "gpu-cloud:gpuDriver.version", "use source: install"),
    ("install of a branch gpu-cloud does not know", setter(["gpuDriver"], {"source": "install", "branch": "590"}), "gpu-cloud:gpuDriver.branch", "known: 535, 570, 575, 580, 595"),
    ("install onto a containerd 1.7 AMI", lambda c: (c["cluster"].update(kubernetesVersion="1.32"), c.update(gpuDriver={"source": "install", "amiRelease": "v20251112"})),
     "gpu-cloud:gpuDriver.amiRelease", "containerd 1.7.27"),
    ("empty node pool list", setter(["nodePools"], []), "gpu-cloud:nodePools", "non-empty list"),
    ("misspelt instance type", lambda c: pool(1)(c)["instanceTypes"].__setitem__(0, "g6e.12xlarg"), "gpu-cloud:nodePools[1].instanceTypes[0]", "did you mean g6e.12xlarge"),
    ("type not offered in region", lambda c: pool(1)(c).update(instanceTypes=["g6e.12xlarge"]), "gpu-cloud:nodePools[1].instanceTypes[0]", "not offered in eu-west-1", "eu-west-1"),
    # the refusal names the snapshot it rests on and its date, and where to add an offer AWS made since
    ("type not offered as of the snapshot", lambda c: pool(1)(c).update(instanceTypes=["g6.2xlarge"]),
     "gpu-cloud:nodePools[1].instanceTypes[0]", "g6.2xlarge is not offered in eu-west-1 as of the catalog's snapshot "
     "(skypilot-org/skypilot-catalog@27f67dd4", "eu-west-1"),
    ("snapshot date and how to add", lambda c: pool(1)(c).update(instanceTypes=["g6.2xlarge"]),
     "gpu-cloud:nodePools[1].instanceTypes[0]", ', 2025-H1); types offered there: ', "eu-west-1"),
    # a type the catalog does not list is unknown to its source at its date, not a typo of a neighbour
    ("type not in the catalog", lambda c: pool(1)(c).update(instanceTypes=["g6e.4xlarge"]),
     "gpu-cloud:nodePools[1].instanceTypes[0]", "'g6e.4xlarge' is not in the catalog (EC2 DescribeInstanceTypes as "
     "generated into aws/karpenter-provider-aws v1.14.1"),
    ("type not in the catalog, how to add it", lambda c: pool(1)(c).update(instanceTypes=["g6e.4xlarge"]),
     "gpu-cloud:nodePools[1].instanceTypes[0]", ', 2026-07/08): to add it, see docs/how-to.md "Add an instance type"'),
    ("misspelt type", lambda c: pool(1)(c).update(instanceTypes=["g6e.12xlarg"]),
     "gpu-cloud:nodePools[1].instanceTypes[0]", 'to add it, see docs/how-to.md "Add an instance type"; did you mean '
     "g6e.12xlarge?"),
    ("pool name not DNS-1123", lambda c: pool(1)(c).update(name="Infer_Pool"), "gpu-cloud:nodePools[1].name", "DNS-1123"),
    ("duplicate pool name", lambda c: pool(1)(c).update(name="train"), "gpu-cloud:nodePools[1].name", "already used by nodePools[0]"),
    ("unknown capacity type", lambda c: pool(1)(c).update(capacity="preemptible"), "gpu-cloud:nodePools[1].capacity", "'on-demand', 'spot', 'reserved' or 'capacity-block'"),
    ("reserved pool without reservation", lambda c: pool(0)(c).pop("capacityReservationId"), "gpu-cloud:nodePools[0].capacityReservationId", "is required for a reserved pool: the ID of the reservation"),
    ("reservation on a spot pool", lambda c: pool(1)(c).update(capacityReservationId="cr-0123456789abcdef0"), "gpu-cloud:nodePools[1].capacityReservationId", "only allowed"),
    ("malformed reservation id", lambda c: pool(0)(c).update(capacityReservationId="cr-12345"), "gpu-cloud:nodePools[0].capacityReservationId", "8 or 17 hex digits"),
    ("min greater than desired", lambda c: pool(0)(c).update(minNodes=3), "gpu-cloud:nodePools[0]", "minNodes <= desiredNodes <= maxNodes"),
    ("negative max", lambda c: pool(1)(c).update(maxNodes=-1), "gpu-cloud:nodePools[1].maxNodes", "greater than or equal to 0"),
    ("EFA pool with two types", lambda c: pool(1)(c).update(instanceTypes=["p5en.48xlarge", "p5e.48xlarge"], efa=True, availabilityZone="us-east-1a"), "gpu-cloud:nodePools[1].instanceTypes", "exactly one instance type"),
    ("EFA pool without a zone", lambda c: pool(0)(c).update(capacity="on-demand", capacityReservationId=None) or pool(0)(c).pop("availabilityZone"), "gpu-cloud:nodePools[0].availabilityZone", "required for EFA pools"),
    ("pool zone of another region", lambda c: pool(0)(c).update(availabilityZone="us-west-2a"), "gpu-cloud:nodePools[0].availabilityZone", "not a zone of us-east-1"),
    ("mixed GPU counts in a pool", lambda c: pool(1)(c).update(instanceTypes=["g6e.12xlarge", "g6e.48xlarge"]), "gpu-cloud:nodePools[1].instanceTypes",
     "g6e.12xlarge has 4 x L40S (45776 MiB), 48 vCPUs, 384 GiB; g6e.48xlarge has 8 x L40S (45776 MiB), 192 vCPUs, 1536 GiB"),
    ("A100 40 GB and 80 GB in one pool", lambda c: pool(1)(c).update(instanceTypes=["p4de.24xlarge", "p4d.24xlarge"]), "gpu-cloud:nodePools[1].instanceTypes",
     "p4de.24xlarge has 8 x A100 80GB (81920 MiB), 96 vCPUs, 1152 GiB; p4d.24xlarge has 8 x A100 40GB (40960 MiB)"),
    ("two GPU models of one size in a pool", lambda c: pool(1)(c).update(instanceTypes=["g6.12xlarge", "g5.12xlarge"]), "gpu-cloud:nodePools[1].instanceTypes", "one pool per shape"),
    ("label key too long for its autoscaler tag", lambda c: pool(1)(c).update(labels={"a" * 20 + ".example.com/" + "b" * 50: "x"}), "gpu-cloud:nodePools[1].labels." + "a" * 20 + ".example.com/" + "b" * 50,
     "has 83 characters; the autoscaler tag k8s.io/cluster-autoscaler/node-template/label/<key> would have 129, over the 128-character limit"),
    ("taint key too long for its autoscaler tag", lambda c: pool(1)(c).update(taints=[{"key": "a" * 20 + ".example.com/" + "b" * 50, "effect": "NoSchedule"}]),
     "gpu-cloud:nodePools[1].taints[0].key", "keys of up to 82 characters fit"),
    ("accelerator label set by hand", lambda c: pool(1)(c).update(labels={"k8s.amazonaws.com/accelerator": "l40s"}), "gpu-cloud:nodePools[1].labels.k8s.amazonaws.com/accelerator", "set by gpu-cloud itself"),
    ("MIG on a GPU without MIG", lambda c: pool(1)(c).update(gpuSharing={"mode": "mig", "migProfile": "1g.10gb"}), "gpu-cloud:nodePools[1].gpuSharing.mode", "mig is not supported on L40S"),
    ("MIG profile of another GPU", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfile": "1g.5gb"}), "gpu-cloud:nodePools[0].gpuSharing.migProfile", "allowed: 1g.10gb"),
    # Turning MIG mode on on an A100 takes a GPU reset, which EC2's pass-through GPUs do not expose (NVML:
    # NVML_ERROR_RESET_REQUIRED, a VM reboot needed; the gate does not reboot for it): refused, naming what is allowed.
    ("MIG on an A100 80GB", lambda c: pool(1)(c).update(instanceTypes=["p4de.24xlarge"], gpuSharing={"mode": "mig", "migProfile": "1g.10gb"}), "gpu-cloud:nodePools[1].gpuSharing.mode",
     "mig is refused on A100 80GB (p4de.24xlarge): turning MIG mode on on an Ampere GPU takes a GPU reset"),
    ("MIG mix on an A100 40GB", lambda c: pool(1)(c).update(instanceTypes=["p4d.24xlarge"], gpuSharing={"mode": "mig", "migProfiles": {"1g.10gb": 2}}), "gpu-cloud:nodePools[1].gpuSharing.mode",
     "NVML_ERROR_RESET_REQUIRED until a VM reboot), and the node gate does not reboot for it: every new node would be rejected. Allowed here: none, time-slicing or mps; mig on H100, H200 or B200"),
    ("time-slicing replicas out of range", lambda c: pool(1)(c).update(gpuSharing={"mode": "time-slicing", "replicas": 64}), "gpu-cloud:nodePools[1].gpuSharing.replicas", "less than or equal to 48"),
    ("MPS without replicas", lambda c: pool(1)(c).update(gpuSharing={"mode": "mps"}), "gpu-cloud:nodePools[1].gpuSharing", "mode mps needs replicas (2 to 48)"),
    ("MPS over the MPS server's 48 clients", lambda c: pool(1)(c).update(gpuSharing={"mode": "mps", "replicas": 49}), "gpu-cloud:nodePools[1].gpuSharing.replicas", "less than or equal to 48"),
    ("MPS with one replica", lambda c: pool(1)(c).update(gpuSharing={"mode": "mps", "replicas": 1}), "gpu-cloud:nodePools[1].gpuSharing.replicas", "greater than or equal to 2"),
    ("replicas with MIG", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfile": "1g.10gb", "replicas": 2}), "gpu-cloud:nodePools[0].gpuSharing", "replicas is only allowed with mode time-slicing or mps, not mig"),
    ("MIG profiles on an MPS pool", lambda c: pool(1)(c).update(gpuSharing={"mode": "mps", "replicas": 4, "migProfiles": {"1g.10gb": 1}}), "gpu-cloud:nodePools[1].gpuSharing", "only allowed with mode mig, not mps"),
    ("MIG with both migProfile and migProfiles", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfile": "1g.10gb", "migProfiles": {"1g.10gb": 2}}), "gpu-cloud:nodePools[0].gpuSharing", "needs one of migProfile"),
    ("MIG mix without a profile", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfiles": {}}), "gpu-cloud:nodePools[0].gpuSharing", "at least one profile"),
    ("MIG mix with no instance of a profile", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfiles": {"1g.10gb": 0}}), "gpu-cloud:nodePools[0].gpuSharing.migProfiles.1g.10gb", "greater than or equal to 1"),
    ("MIG mix with a profile of another GPU", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfiles": {"1g.5gb": 1, "1g.10gb": 2}}), "gpu-cloud:nodePools[0].gpuSharing.migProfiles.1g.5gb", "is not a MIG profile of H100; allowed: 1g.10gb, 1g.20gb"),
    ("MIG mix on a GPU without MIG", lambda c: pool(1)(c).update(gpuSharing={"mode": "mig", "migProfiles": {"1g.10gb": 2}}), "gpu-cloud:nodePools[1].gpuSharing.mode", "mig is not supported on L40S (g6e.12xlarge)"),
    ("MIG mix over the compute slices", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfiles": {"2g.20gb": 3, "1g.10gb": 2}}), "gpu-cloud:nodePools[0].gpuSharing.migProfiles",
     "needs 8 compute and 8 memory slices of each GPU (3 x 2g.20gb: 6 and 6; 2 x 1g.10gb: 2 and 2), over the budget of one H100: 7 compute and 8 memory slices"),
    ("MIG mix over the memory slices", lambda c: pool(0)(c).update(gpuSharing={"mode": "mig", "migProfiles": {"3g.40gb": 1, "1g.20gb": 2, "1g.10gb": 1}}), "gpu-cloud:nodePools[0].gpuSharing.migProfiles",
     "needs 6 compute and 9 memory slices of each GPU"),
    ("Triton on a pool of several MIG profiles", lambda c: pool(1)(c).update(instanceTypes=["p5.48xlarge"], gpuSharing={"mode": "mig", "migProfiles": {"1g.10gb": 2, "3g.40gb": 1}}),
     "gpu-cloud:inference.triton.pool", "'infer' cuts its GPUs into several MIG profiles"),
    ("label key with a space", lambda c: pool(1)(c).update(labels={"my label": "x"}), "gpu-cloud:nodePools[1].labels.my label", "Kubernetes label key"),
    ("label the kubelet may not set itself", lambda c: pool(1)(c).update(labels={"node-role.kubernetes.io/gpu": "x"}), "gpu-cloud:nodePools[1].labels.node-role.kubernetes.io/gpu", "kubelet may not set"),
    ("label in gpu-cloud's prefix", lambda c: pool(1)(c).update(labels={"gpu-cloud.io/pool": "x"}), "gpu-cloud:nodePools[1].labels.gpu-cloud.io/pool", "gpu-cloud sets itself"),
    ("taint with unknown effect", lambda c: pool(1)(c).update(taints=[{"key": "a", "effect": "NoRun"}]), "gpu-cloud:nodePools[1].taints[0].effect", "'NoSchedule', 'PreferNoSchedule' or 'NoExecute'"),
    ("Lustre size not PERSISTENT_2", setter(["storage"], {"lustre": {"capacityGiB": 3000}}), "gpu-cloud:storage.lustre", "1200 or a multiple of 2400"),
    ("Lustre throughput not offered", setter(["storage"], {"lustre": {"capacityGiB": 2400, "throughputPerTiB": 300}}), "gpu-cloud:storage.lustre.throughputPerTiB", "125, 250, 500 or 1000"),
    ("Lustre import path not S3", setter(["storage"], {"lustre": {"capacityGiB": 1200, "importPath": "/data"}}), "gpu-cloud:storage.lustre.importPath", "s3://"),
    ("Triton on a training pool", setter(["inference", "triton", "pool"], "train"), "gpu-cloud:inference.triton.pool", "not an inference pool"),
    ("Triton min above max", setter(["inference", "triton", "minReplicas"], 9), "gpu-cloud:inference.triton", "minReplicas 9 > maxReplicas 8"),
    ("alert temperature out of range", setter(["monitoring"], {"alerts": {"gpuTempC": 150}}), "gpu-cloud:monitoring.alerts.gpuTempC", "less than or equal to 110"),
    ("NVLink check schedule not cron", setter(["training"], {"nvlinkCheckSchedule": "weekly"}), "gpu-cloud:training.nvlinkCheckSchedule", "'weekly' is not a five-field cron schedule"),
    ("across-node check schedule not cron", setter(["training"], {"acrossNodeCheckSchedule": "0 6 * *"}), "gpu-cloud:training.acrossNodeCheckSchedule", "'0 6 * *' is not a five-field cron schedule such as '0 6 * * 0'"),
    ("across-node check schedule not a string", setter(["training"], {"acrossNodeCheckSchedule": 6}), "gpu-cloud:training.acrossNodeCheckSchedule", "6 is a number where a string belongs: quote it"),
    ("across-node check schedule misspelt", setter(["training"], {"acrossNodesCheckSchedule": "0 6 * * 0"}), "gpu-cloud:training.acrossNodesCheckSchedule", "did you mean acrossNodeCheckSchedule?"),
    ("DR role without peer", setter(["dr"], {"role": "primary"}), "gpu-cloud:dr", "needs peerStack, domain, hostedZoneId"),
    ("DR peer stack of another project", setter(["dr"], {"role": "secondary", "peerStack": "acme/other/prod", "domain": "a.example.com", "hostedZoneId": "Z123"}), "gpu-cloud:dr.peerStack", "org/gpu-cloud/<stack>"),
    ("budget below the pools' cost", setter(["budget"], {"maxHourlyUsd": 10}), "gpu-cloud:budget.maxHourlyUsd", "above the budget"),
]


@pytest.mark.parametrize("what,mutate,path,words,region", [(*m, "us-east-1")[:5] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_named_by_key_path(what, mutate, path, words, region):
    found = issues_of(mutate, region)
    matching = [i for i in found if i.path == path]
    assert matching, f"{what}: no issue at {path}; got {[str(i) for i in found]}"
    assert any(words in i.message for i in matching), f"{what}: {[str(i) for i in matching]}"


def test_efa_on_a_type_without_efa_is_an_error():
    # Every shipped type has EFA; a catalog entry without it (as a new type might be) must refuse efa: true.
    catalog = load_catalog()
    no_efa = catalog.instance_types["g6.12xlarge"].model_copy(update={"efa": EfaSpec(cards=0)})
    catalog = catalog.model_copy(update={"instance_types": {**catalog.instance_types, "g6.12xlarge": no_efa}})
    config = valid_config()
    config["nodePools"][1].update(instanceTypes=["g6.12xlarge"], efa=True, availabilityZone="us-east-1b")
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(config, stack="test", region="us-east-1", catalog=catalog)
    assert any(i.path == "gpu-cloud:nodePools[1].efa" and "does not support EFA" in i.message
               for i in raised.value.issues)
    config["nodePools"][1]["efa"] = None
    del config["nodePools"][1]["efa"]
    assert load_stack_spec(config, stack="test", region="us-east-1", catalog=catalog).pools[1].efa is False


def test_mps_needs_a_gpu_of_compute_capability_7_5_or_newer():
    # Every catalog GPU is Turing or newer; an older one (as a new catalog entry might be) is refused: the plugin's
    # MPS server would take only 16 clients there.
    catalog = load_catalog()
    volta = catalog.gpus["L40S"].model_copy(update={"architecture": "volta"})
    catalog = catalog.model_copy(update={"gpus": {**catalog.gpus, "L40S": volta}})
    config = valid_config()
    config["nodePools"][1].update(gpuSharing={"mode": "mps", "replicas": 4}, maxNodes=2)   # 16 slots: Triton's 2 nodes
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(config, stack="test", region="us-east-1", catalog=catalog)
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[1].gpuSharing.mode"
    assert issue.message == ("mps needs a GPU of compute capability 7.5 or newer (turing, ampere, ada, hopper, "
                             "blackwell); L40S (g6e.12xlarge) is volta")
    config["nodePools"][1]["gpuSharing"] = {"mode": "time-slicing", "replicas": 4}
    assert load_stack_spec(config, stack="test", region="us-east-1", catalog=catalog).pools[1].spec.gpu_sharing.replicas == 4


@pytest.mark.parametrize("sharing", [
    {"mode": "mps", "replicas": 2}, {"mode": "mps", "replicas": 48},
    {"mode": "mig", "migProfiles": {"4g.40gb": 1, "3g.40gb": 1}},                  # every compute and memory slice
    {"mode": "mig", "migProfiles": {"1g.10gb": 7}}, {"mode": "mig", "migProfiles": {"1g.20gb": 1, "1g.10gb": 6}},
    {"mode": "mig", "migProfiles": {"3g.40gb": 1}},                                 # some slices left unused
], ids=lambda s: str(s))
def test_sharing_within_what_the_gpu_allows_is_accepted(sharing):
    config = valid_config()
    config["nodePools"][0]["gpuSharing"] = sharing
    assert load(config).pools[0].spec.gpu_sharing.mode == sharing["mode"]


def test_the_across_node_check_runs_weekly_unless_the_stack_says_otherwise():
    assert load(valid_config()).training.across_node_check_schedule == "0 6 * * 0"      # Sundays 06:00 UTC
    config = valid_config()
    config["training"] = {"acrossNodeCheckSchedule": "30 1 * * 3"}
    assert load(config).training.across_node_check_schedule == "30 1 * * 3"


def test_all_mistakes_are_reported_at_once():
    def many(config):
        config["environment"] = "qa"
        config["network"]["cidr"] = "bad"
        config["nodePools"][0]["instanceTypes"] = ["p5.48xlarg"]
        config["nodePools"][1]["minNodes"] = 9
        config["dr"] = {"role": "primary"}
    paths = {i.path for i in issues_of(many)}
    assert {"gpu-cloud:environment", "gpu-cloud:network.cidr", "gpu-cloud:nodePools[0].instanceTypes[0]",
            "gpu-cloud:nodePools[1]", "gpu-cloud:dr"} <= paths


def test_a_pool_of_exactly_64_nodes_is_accepted():
    config = valid_config()
    config["nodePools"][1].update(maxNodes=64)
    config["inference"]["triton"]["enabled"] = False       # Triton's own pool is held to what its replicas reach
    assert load(config).pools[1].spec.max_nodes == 64


@pytest.mark.parametrize("stack,accepted", [("prod-us-east-1", True), ("a" * 90, True), ("a" * 91, False),
                                            ("prod.us-east-1", False), ("-prod", True)])
def test_the_stack_name_must_make_a_valid_eks_cluster_name(stack, accepted):
    # gpu-cloud-<stack>: 10 + 90 = 100 characters, EKS's limit
    if accepted:
        assert load_stack_spec(valid_config(), stack=stack, region="us-east-1").cluster_name == f"gpu-cloud-{stack}"
        return
    with pytest.raises(ConfigError) as raised:
        load_stack_spec(valid_config(), stack=stack, region="us-east-1")
    (issue,) = raised.value.issues
    assert issue.path == "stack" and f"{stack!r} makes the EKS cluster name" in issue.message


def test_a_prod_stack_without_a_budget_is_warned_about():
    from datetime import date
    from decisions.config.validate import stack_warnings
    config = valid_config()
    config["budget"] = {"maxHourlyUsd": 1000}
    assert not [w for w in stack_warnings(load(config), date(2026, 12, 3)) if "budget" in w]
    config.pop("budget")
    assert config["environment"] == "prod"
    (warning,) = [w for w in stack_warnings(load(config), date(2026, 12, 3)) if "budget" in w]
    assert warning.startswith("gpu-cloud:budget.maxHourlyUsd: not set on a prod stack")
    config["environment"] = "dev"
    assert not [w for w in stack_warnings(load(config), date(2026, 12, 3)) if "budget" in w]


def test_missing_region_is_named():
    with pytest.raises(ConfigError) as raised:
        load(valid_config(), region=None)
    assert [str(i) for i in raised.value.issues if i.path == "aws:region"]


def test_region_without_catalog_types_is_named():
    with pytest.raises(ConfigError) as raised:
        load(valid_config(), region="ap-south-1")
    assert any(i.path == "aws:region" and "known regions" in i.message for i in raised.value.issues)


def test_valid_config_resolves_defaults_and_catalog_facts():
    spec = load(valid_config())
    train, infer = spec.pools
    assert train.efa is True and train.gpus_per_node == 8          # EFA defaults on where the type has it
    assert infer.efa is False and [t.name for t in infer.types] == ["g6e.12xlarge"]
    assert spec.network.zones == ("use1-az1", "use1-az2", "use1-az4") and spec.network.nat_gateways == "one-per-az"
    assert spec.cluster.kubernetes_version == "1.35"
    # No gpuDriver: the default release's accelerated AMI, whose driver the gate then requires exactly.
    assert (spec.node_image.source, spec.node_image.release, spec.node_image.driver_version) == ("ami", "v20260714", "580.159.03")
    assert spec.monitoring.alerts.gpu_temp_c == 85
    assert spec.resource_tags == {"team": "ml", "costCenter": "cc-1", "environment": "prod", "stack": "test",
                                  "managed-by": "gpu-cloud"}


def test_types_of_one_node_shape_share_a_pool():
    config = valid_config()
    config["nodePools"][1].update(instanceTypes=["p5en.48xlarge", "p5e.48xlarge"],   # 8 x H200 141 GB, 192 vCPU, 2 TiB
                                  maxNodes=3)                                        # all Triton reaches on 8 GPUs
    assert [t.name for t in load(config).pools[1].types] == ["p5en.48xlarge", "p5e.48xlarge"]


def test_keys_at_the_tag_limit_are_accepted():
    config = valid_config()
    key = "a" * 20 + ".example.com/" + "b" * 49                                   # 82 characters: tag key of 128
    config["nodePools"][1].update(labels={key: "x"}, taints=[{"key": key, "effect": "NoSchedule"}])
    assert dict(load(config).pools[1].spec.labels) == {key: "x"}


def test_spec_is_frozen():
    spec = load(valid_config())
    with pytest.raises(Exception):
        spec.network.nat_gateways = "single"  # type: ignore[misc]


def test_kubernetes_versions_accepted_are_exactly_those_with_every_pin():
    from decisions.catalog import addons, charts
    from decisions.config.validate import supported_kubernetes_versions
    supported = supported_kubernetes_versions()
    assert supported and all(v in addons.supported_kubernetes_versions() and v in charts.autoscaler_minors()
                             for v in supported)
    assert load(valid_config()).cluster.kubernetes_version in supported


ADMIN = "arn:aws:iam::123456789012:role/admin"
TRAIN_ROLE = "arn:aws:iam::123456789012:role/ml-training"


def test_team_roles_are_read_by_namespace():
    from decisions.config.model import TeamAccess
    config = valid_config()
    config["tenancy"] = {"teams": {"training": {"roleArns": [TRAIN_ROLE]},
                                   "inference": {"roleArns": [TRAIN_ROLE, "arn:aws:iam::123456789012:role/a/serve"]}}}
    teams = load(config).tenancy.teams
    assert dict(teams) == {"training": TeamAccess(roleArns=(TRAIN_ROLE,)),
                           "inference": TeamAccess(roleArns=(TRAIN_ROLE, "arn:aws:iam::123456789012:role/a/serve"))}
    assert [access.role_arns for _, access in load(valid_config()).tenancy.teams] == [(), ()]


def test_the_team_keys_are_the_tenancy_namespaces():
    from decisions.config.model import Teams
    from decisions.platform import tenancy
    assert tuple(Teams.model_fields) == tenancy.TEAM_NAMESPACES


@pytest.mark.parametrize("tenancy_config,path,words", [
    ({"teams": {"trainning": {"roleArns": [TRAIN_ROLE]}}}, "gpu-cloud:tenancy.teams.trainning", "did you mean training"),
    ({"teams": {"training": {"roleArns": ["arn:aws:iam::123456789012:user/alice"]}}},
     "gpu-cloud:tenancy.teams.training.roleArns[0]", "IAM role ARN"),
    ({"teams": {"training": {"roleArn": [TRAIN_ROLE]}}}, "gpu-cloud:tenancy.teams.training.roleArn", "did you mean roleArns"),
    ({"teams": {"training": {"roleArns": TRAIN_ROLE}}}, "gpu-cloud:tenancy.teams.training.roleArns", "valid array"),
    ({"teams": {"inference": {"roleArns": [ADMIN]}}}, "gpu-cloud:tenancy.teams.inference.roleArns[0]", "adminRoleArns"),
    ({"teams": {"training": {"roleArns": [TRAIN_ROLE, TRAIN_ROLE]}}}, "gpu-cloud:tenancy.teams.training.roleArns[1]", "listed twice"),
], ids=["unknown-team", "user-not-role", "misspelt-key", "string-not-list", "admin-role", "duplicate"])
def test_team_role_mistakes_are_named_by_key_path(tenancy_config, path, words):
    issues = issues_of(setter(["tenancy"], tenancy_config))
    assert [(i.path, words in i.message) for i in issues] == [(path, True)], issues


@pytest.mark.parametrize("budget,accepted", [(144.03418304, True), (144.0342, True), (144.04, True), (144.02, False)])
def test_the_budget_holds_at_exactly_the_pools_cost(budget, accepted):
    # valid_config's pools at maxNodes: 2 x p5.48xlarge on-demand 55.04 + 4 x g6e.12xlarge spot 10.49264 x
    # (1 - 0.191), g6e's us-east-1 spot discount in decisions/cost/prices.yaml (the family's smallest: g6e.xlarge's)
    config = valid_config()
    config["budget"] = {"maxHourlyUsd": budget}
    if accepted:
        assert load(config).budget.max_hourly_usd == budget
        return
    with pytest.raises(ConfigError) as raised:
        load(config)
    assert "pools at maxNodes cost $144.03/hour, above the budget $144.02/hour" in str(raised.value)


def dev_config(budget):
    """The dev stack's gpu-cloud: config with `budget` as its maxHourlyUsd."""
    from tests.conftest import stack_config
    config = {key.split(":", 1)[1]: value for key, value in stack_config("dev").items()
              if key.startswith("gpu-cloud:")}
    config["budget"] = {"maxHourlyUsd": budget}
    return config


def load_dev(config):
    return load_stack_spec(config, stack="dev", region="us-east-1")


@pytest.mark.parametrize("budget,accepted", [(7.29, True), (7.28, False)])
def test_dev_budgeted_at_its_cost_in_cents_is_accepted_and_one_cent_less_is_not(budget, accepted):
    # dev's pool at maxNodes: 3 x g6.12xlarge spot, $7.2903 an hour, which the plan and docs/configuration.md show as
    # $7.29 (tests/test_policy.py runs the pack on the same figure: it must agree)
    if accepted:
        assert load_dev(dev_config(budget)).budget.max_hourly_usd == budget
        return
    with pytest.raises(ConfigError) as raised:
        load_dev(dev_config(budget))
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:budget.maxHourlyUsd"
    assert issue.message.startswith("GPU pools at maxNodes cost $7.29/hour, above the budget $7.28/hour")


@pytest.mark.parametrize("peer,is_self", [
    ("acme/gpu-cloud/test", True),               # this project, this stack (load() uses stack "test")
    ("other-org/gpu-cloud/test", True),          # the organisation does not make it another stack
    ("acme/gpu-cloud/test-eu", False),
])
def test_a_dr_peer_that_is_this_very_stack_is_a_config_error(peer, is_self):
    dr = {"role": "secondary", "peerStack": peer, "domain": "infer.example.com", "hostedZoneId": "Z0123456789ABC"}
    if not is_self:
        config = valid_config()
        config["dr"] = dr
        assert load(config).dr.peer_stack == peer
        return
    issues = issues_of(lambda c: c.update(dr=dr))
    assert [(i.path, i.message) for i in issues] == [
        ("gpu-cloud:dr.peerStack", f"{peer} is this very stack; name the stack in the other region that backs this "
                                   "one up")]


SECRET_URL = "https://hooks.example.com/services/T04ALERTS/B07GPUCLOUD/q9Zk3LmW8vRt2YpHc6"


@pytest.mark.parametrize("value, accepted", [
    (SECRET_URL, True), ("", True), ({"secure": "v1:abcdef=="}, True),   # set, unset, encrypted (plan cannot read it)
    ("http://hooks.example.com/x", False), ("hooks.example.com/x", False), (42, False),
])
def test_the_alert_webhook_is_an_https_url_and_its_value_is_never_repeated(value, accepted):
    config = valid_config()
    config["alertWebhookUrl"] = value
    if accepted:
        load(config)
        return
    with pytest.raises(ConfigError) as error:
        load(config)
    assert "gpu-cloud:alertWebhookUrl: must be an https:// URL" in str(error.value)
    assert str(value) not in str(error.value)


def test_a_misspelt_secret_key_is_unknown_and_the_real_one_is_offered():
    config = valid_config()
    config["alertWebhookURL"] = SECRET_URL
    with pytest.raises(ConfigError, match="alertWebhookURL: unknown key.*alertWebhookUrl"):
        load(config)


@pytest.mark.parametrize("tags, problem", [
    ({"team": "ml,infra"}, "tags.team"),                 # the annotation splits pairs on ','
    ({"owner ": "x"}, "tags.owner "),                    # trimmed by the controller: another key
    ({"elbv2.k8s.aws/cluster": "x"}, "tags.elbv2.k8s.aws/cluster"),   # the controller's own tag wins
    ({"project": "a=b"}, None),                          # split on the first '=': comes back the same
])
def test_tags_the_triton_load_balancer_cannot_carry_are_config_errors(tags, problem):
    mutate = lambda c: c["tags"].update(tags)            # noqa: E731
    if problem is None:
        config = valid_config()
        mutate(config)
        assert load(config).tags["project"] == "a=b"
        return
    issues = issues_of(mutate)
    assert [i.path for i in issues] == [f"gpu-cloud:{problem}"]
    assert "cannot be tagged on Triton's load balancer" in issues[0].message
    without_triton = valid_config()
    mutate(without_triton)
    without_triton["inference"]["triton"]["enabled"] = False
    load(without_triton)                                 # no load balancer, nothing to refuse


@pytest.mark.parametrize("itype, refused", [
    ("g4dn.12xlarge", True), ("g5.12xlarge", True), ("g5.48xlarge", True),   # proprietary module, GSP off on the AMI
    ("g6.12xlarge", False), ("g6e.12xlarge", False),                         # the open module, as on the AMI
])
def test_install_refuses_the_types_the_ami_runs_on_the_proprietary_module(itype, refused):
    config = valid_config()
    config["gpuDriver"] = {"source": "install"}
    config["nodePools"][1].update(instanceTypes=[itype], maxNodes=3)    # Triton reaches 3 nodes of 8 GPUs, 4 of 4
    if not refused:
        assert load(config).pools[1].primary_type.name == itype
        return
    with pytest.raises(ConfigError) as raised:
        load(config)
    (issue,) = raised.value.issues
    assert issue.path == "gpu-cloud:nodePools[1].instanceTypes[0]"
    assert f"{itype}: gpuDriver.source install installs NVIDIA's open kernel module" in issue.message
    assert "GPU System Processor firmware off" in issue.message
    config["gpuDriver"] = {"source": "ami"}
    assert load(config).pools[1].primary_type.name == itype        # the AMI path drives them


# --- errors that say the fix -------------------------------------------------------------------------------------
def test_a_pools_mistakes_name_the_pool_beside_its_index():
    def mutate(config):
        pool(1)(config).update(maxNodes="4")
        pool(0)(config).pop("name")
    with pytest.raises(ConfigError) as raised:
        load(_mutated(mutate))
    lines = str(raised.value).splitlines()
    # The path stays one `pulumi config set --path` takes; the name follows it, so either can be searched for.
    assert "  - gpu-cloud:nodePools[1].maxNodes (pool infer): '4' is a string where a whole number belongs: remove " \
           "the quotes (maxNodes: 4)" in lines
    assert "  - gpu-cloud:nodePools[0].name: is required" in lines          # a pool without a name keeps its index
    assert [i.label for i in raised.value.issues] == ["", "pool infer"]


def test_zone_names_in_place_of_ids_are_one_mistake_with_the_command_that_lists_the_ids():
    issues = issues_of(setter(["network", "zones"], ["use1-az1", "eu-west-1a", "eu-west-1b"]), region="eu-west-1")
    zone_issues = [i for i in issues if i.path.startswith("gpu-cloud:network")]
    assert [str(i) for i in zone_issues] == [
        "gpu-cloud:network.zones: eu-west-1a, eu-west-1b are zone names; zones takes zone IDs (use1-az1), which name "
        "the same zone in every account, where names differ. Your account's names and IDs: aws ec2 "
        "describe-availability-zones --region eu-west-1 --query 'AvailabilityZones[].[ZoneName,ZoneId]' --output text"]
    one = issues_of(setter(["network", "zones"], ["us-east-1a", "use1-az2"]))
    assert [i.message.split(";")[0] for i in one if i.path.startswith("gpu-cloud:network")] == [
        "us-east-1a is a zone name"]


def test_no_list_of_failed_items_is_also_reported_as_too_short():
    issues = issues_of(setter(["network", "zones"], ["az-1", "az-2"]))
    assert [i.path for i in issues if i.path.startswith("gpu-cloud:network")] == [
        "gpu-cloud:network.zones[0]", "gpu-cloud:network.zones[1]"]
    assert "at least 2 items" in str(issues_of(setter(["network", "zones"], ["use1-az1"])))   # a real short list


def _mutated(mutate):
    config = valid_config()
    mutate(config)
    return config


def p5_in_us_west_2(unpriced=()):
    """The new user of issue 41: dev copied to us-west-2 with four p5.48xlarge spot nodes and a $20 budget. The
    catalog has no P-family price in us-west-2, so at that budget only an acknowledged gap lets the stack pass."""
    config = dev_config(20)
    config["network"]["zones"] = ["usw2-az1", "usw2-az2"]
    config["nodePools"][0].update(instanceTypes=["p5.48xlarge"], desiredNodes=4, maxNodes=4)
    config["budget"]["unpriced"] = list(unpriced)
    return config


def test_an_unpriced_pool_refuses_a_budgeted_stack_until_the_stack_acknowledges_it():
    from decisions.cost import cost

    with pytest.raises(ConfigError) as raised:
        load_stack_spec(p5_in_us_west_2(), stack="dev", region="us-west-2")
    by_path = {}
    for issue in raised.value.issues:
        by_path.setdefault(issue.path, []).append(issue.message)
    (pool_refusal,) = by_path.pop("gpu-cloud:nodePools[0]")
    assert pool_refusal.startswith("no on-demand price for p5.48xlarge in us-west-2 (decisions/catalog/catalog.yaml), "
                                   "so gpu-cloud:budget.maxHourlyUsd cannot cover it")
    assert pool_refusal.endswith("or acknowledge the gap: add dev-gpu-spot to gpu-cloud:budget.unpriced")
    assert "(pool dev-gpu-spot)" in str(raised.value)
    # Whatever else us-west-2 cannot price is a fixed cost: one refusal for the data file that lacks their rates,
    # naming each by the name budget.unpriced takes.
    grouped = by_path.pop("gpu-cloud:budget.unpriced", [])
    assert by_path == {} and len(grouped) <= 1
    fixed = grouped and grouped[0].rsplit("add ", 1)[1].split(" to ")[0].split(", ")
    assert not grouped or grouped[0].startswith("decisions/cost/prices.yaml lacks what prices these in us-west-2: ")
    assert all(name in {"system-nodes", "root-volumes", "nat-gateways", "nat-public-ipv4", "interface-endpoints",
                        "transit-gateway", "eks-control-plane"} for name in fixed), fixed
    fixed = list(fixed or [])
    spec = load_stack_spec(p5_in_us_west_2(["dev-gpu-spot", *fixed]), stack="dev", region="us-west-2")
    assert [u.name for u in cost.estimate(spec).unpriced] == ["dev-gpu-spot", *fixed]
    # the pool alone acknowledged: the fixed gaps still refuse (and only they)
    if fixed:
        with pytest.raises(ConfigError) as raised:
            load_stack_spec(p5_in_us_west_2(["dev-gpu-spot"]), stack="dev", region="us-west-2")
        assert {i.path for i in raised.value.issues} == {"gpu-cloud:budget.unpriced"}


def test_an_assumed_price_stands_in_for_a_missing_one_and_the_budget_counts_it():
    """budget.assumed: the stack states the rate the catalog lacks, with its source; the bill and the budget count
    it, marked ASSUMED, so no acknowledgement is needed and the budget can be broken by it."""
    from decisions.cost import cost

    def with_assumption(budget, usd=55.04):
        config = p5_in_us_west_2()
        fixed = [u.name for u in cost.estimate(load_stack_spec({**config, "budget": {}}, stack="dev",
                                                               region="us-west-2")).unpriced
                 if u.name != "dev-gpu-spot"]
        config["budget"] = {"maxHourlyUsd": budget, "unpriced": fixed,
                            "assumed": {"dev-gpu-spot": {"usdPerNodeHour": usd,
                                                         "source": "AWS pricing page, us-west-2, read 2026-12-06"}}}
        return load_stack_spec(config, stack="dev", region="us-west-2")

    sourced = cost.load_prices().region("us-west-2").spot_discount.get("p5")     # else the catalog's default
    spot = 1 - (sourced.fraction if sourced else load_catalog().default_spot_discount)
    at_max = 4 * 55.04 * spot
    spec = with_assumption(round(at_max + 0.01, 2))
    (row,) = cost.budget_pool_costs(spec.pools, spec.catalog, spec.region, assumed=spec.budget.assumed)
    assert row.gap is None and row.hourly_at_max == pytest.approx(at_max)
    assert "on-demand $55.04 (ASSUMED by gpu-cloud:budget.assumed: AWS pricing page, us-west-2, read 2026-12-06" in row.basis
    assert "dev-gpu-spot" not in [u.name for u in cost.estimate(spec).unpriced]
    with pytest.raises(ConfigError) as raised:        # the assumed pool alone breaks a budget below it
        with_assumption(round(at_max - 0.01, 2))
    assert [i.path for i in raised.value.issues] == ["gpu-cloud:budget.maxHourlyUsd"]


@pytest.mark.parametrize("assumed,unpriced,path,words", [
    ({"dev-gpu-spot": {"usdPerNodeHour": 5.0, "source": "a guess of nobody's"}}, [],
     "gpu-cloud:budget.assumed.dev-gpu-spot", "pool dev-gpu-spot has a sourced price"),
    ({"batch": {"usdPerNodeHour": 5.0, "source": "a guess of nobody's"}}, [],
     "gpu-cloud:budget.assumed.batch", "is not a pool of this stack (pools: dev-gpu-spot)"),
    ({"dev-gpu-spot": {"usdPerNodeHour": 5.0, "source": "a guess of nobody's"}}, ["dev-gpu-spot"],
     "gpu-cloud:budget", "dev-gpu-spot: in both unpriced and assumed"),
], ids=["over-a-sourced-price", "no-such-pool", "also-acknowledged"])
def test_an_assumption_only_stands_in_where_the_data_has_no_price(assumed, unpriced, path, words):
    config = dev_config(20)
    config["budget"].update(assumed=assumed, unpriced=unpriced)
    with pytest.raises(ConfigError) as raised:
        load_dev(config)
    assert [(i.path, words in i.message) for i in raised.value.issues] == [(path, True)], raised.value.issues


def test_an_acknowledgement_that_excuses_nothing_is_refused():
    config = dev_config(20)
    config["budget"]["unpriced"] = ["dev-gpu-spot", "fsx-lustre"]     # dev's pool is priced; dev has no Lustre
    with pytest.raises(ConfigError) as raised:
        load_dev(config)
    assert [(i.path, i.message) for i in raised.value.issues] == [
        ("gpu-cloud:budget.unpriced[0]", "'dev-gpu-spot' is not an unpriced item of this stack (unpriced: none); "
                                         "remove it"),
        ("gpu-cloud:budget.unpriced[1]", "'fsx-lustre' is not an unpriced item of this stack (unpriced: none); "
                                         "remove it")]


def test_unpriced_needs_a_budget_and_names_each_item_once():
    for budget, problem in (({"unpriced": ["a"]}, "set maxHourlyUsd, or remove unpriced"),
                            ({"maxHourlyUsd": 20, "unpriced": ["a", "a"]}, "unpriced names an item twice")):
        config = dev_config(20)
        config["budget"] = budget
        with pytest.raises(ConfigError) as raised:
            load_dev(config)
        assert problem in str(raised.value)


def test_without_a_budget_gaps_are_listed_not_refused():
    from decisions.cost import cost

    config = p5_in_us_west_2()
    config.pop("budget")
    spec = load_stack_spec(config, stack="dev", region="us-west-2")
    assert cost.estimate(spec).unpriced[0].name == "dev-gpu-spot"


def _model_keys():
    """Every key a stack may set, as a dotted path (`nodePools.commitment.term`), from the models themselves."""
    from pydantic import BaseModel

    from decisions.config.model import SECRET_KEYS, SECTIONS
    from decisions.config.validate import _unwrap

    def walk(type_, path):
        type_ = _unwrap(type_)
        if isinstance(type_, type) and issubclass(type_, BaseModel):
            for field in type_.model_fields.values():
                yield from walk(field.annotation, path + (field.alias,))
        else:
            yield path
    return [".".join(p) for key, (type_, _) in SECTIONS.items() for p in walk(type_, (key,))] + list(SECRET_KEYS)


def documented(page: str, key: str) -> bool:
    """Whether docs/configuration.md documents a dotted key: a table row whose first cell names it (`a.b.c`, or a
    sibling after the first, `a.b.c`, `d`; `a.<b\\|c>.d` for both), or a row for one of its parents or siblings
    that names it in backticks."""
    import re

    parts = key.split(".")
    nodepools_table = page[page.index("`nodePools[]` fields:"):]
    for table, prefix in ((page, ()), (nodepools_table, ("nodePools",))):
        for row in re.findall(r"^\| (.+?) \|(.*)$", table, re.M):
            named = [re.sub(r"<[^>]+>", choice, n) for n in re.findall(r"`([^`]+)`", row[0])
                     for choice in (re.findall(r"<([^>]+)>", n) or ["-"])[0].replace("\\|", "|").split("|")]
            paths = [tuple(n.split(".")) for n in named]
            if paths:        # siblings written after the first: `monitoring.alerts.gpuUtilHighPct`, `gpuMemHighPct`
                paths = paths[:1] + [paths[0][:-1] + p if len(p) == 1 else p for p in paths[1:]]
            for path in (prefix + p for p in paths):
                if tuple(parts) == path:
                    return True
                if tuple(parts[:len(path) - 1]) == path[:-1] and len(parts) >= len(path) and any(
                        re.search(rf"\b{re.escape(parts[-1])}\b", span) for span in re.findall(r"`([^`]+)`", row[1])):
                    return True
    return False


def test_every_key_the_models_allow_is_in_the_configuration_reference():
    from tests.conftest import ROOT

    page = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    keys = _model_keys()
    assert {"nodePools.commitment.type", "nodePools.commitment.term", "nodePools.commitment.payment",
            "storage.lustre.capacityGiB", "alertWebhookUrl"} <= set(keys)
    assert [key for key in keys if not documented(page, key)] == []
    assert not documented("`nodePools[]` fields:\n| `name` | x |\n", "nodePools.commitment.type")


# --- Triton's pool: no larger than Triton can make it (decisions/nodes/autoscaling.reachable_nodes) -----------------
@pytest.mark.parametrize("replicas, pods", [(1, 2), (4, 5), (8, 10), (10, 13)])
def test_a_rollout_runs_a_quarter_more_pods_rounded_up(replicas, pods):
    from decisions.nodes import autoscaling
    assert autoscaling.rollout_pods(replicas) == pods


@pytest.mark.parametrize("min_nodes, max_replicas, slots, reachable", [
    (2, 8, 8, 3),      # prod-us-east-1: 10 pods fill 2 nodes of 8 slots, one more drains (not 2: surge and drain)
    (1, 8, 4, 4),      # prod-eu-west-1: 10 pods fill 3 nodes of 4 (8 alone would fill 2)
    (0, 10, 4, 5),     # 13 pods (the surge rounds up from 2.5) fill 4 nodes of 4, not 3
    (0, 1, 1, 3),      # 2 pods, one slot a node: 2, one more drains
    (5, 8, 8, 5),      # minNodes above what the replicas fill
])
def test_the_nodes_triton_can_reach(min_nodes, max_replicas, slots, reachable):
    from decisions.nodes import autoscaling
    assert autoscaling.reachable_nodes(min_nodes, max_replicas, slots) == reachable


def test_tritons_pool_may_reach_exactly_what_triton_can_ask_for():
    # the infer pool: 4 L40S a node; maxReplicas 8 (10 pods in a rollout) fill 3 nodes, and one drains: 4
    assert load(valid_config()).pools[1].spec.max_nodes == 4
    (issue,) = issues_of(lambda c: c["nodePools"][1].update(maxNodes=5))
    assert issue.path == "gpu-cloud:nodePools[1].maxNodes"
    assert issue.message.startswith("5 is more than Triton's pool can ever grow to, 4: ")
    assert "maxReplicas 8 (10 pods during a rollout), one GPU slot each of the 4 a node has, fill 3 node(s)" in \
        issue.message and "Set maxNodes to 4" in issue.message


def test_minnodes_that_hold_more_than_triton_asks_for_are_the_pools_reach():
    (issue,) = issues_of(lambda c: c["nodePools"][1].update(minNodes=5, desiredNodes=5, maxNodes=6))
    assert issue.path == "gpu-cloud:nodePools[1].maxNodes"
    assert "6 is more than Triton's pool can ever grow to, 5" in issue.message and "minNodes is 5" in issue.message


def test_an_inference_pool_triton_does_not_run_on_is_sized_freely():
    config = valid_config()
    config["nodePools"].append({"name": "infer-spare", "instanceTypes": ["g6e.12xlarge"], "capacity": "spot",
                                "efa": False, "minNodes": 0, "desiredNodes": 0, "maxNodes": 8,
                                "workload": "inference"})
    assert load(config).pools[2].spec.max_nodes == 8
