"""Two stacks checked as a DR pair (decisions/serving/dr_pair.py): the shipped pair holds, each broken rule is named by
stack and key, one stack's own DR keys are judged alone, and the recovery time adds up term by term."""
import copy

import pytest

from decisions.config.errors import ConfigError, key_path
from decisions.config.validate import load_stack_spec
from decisions.serving import dr_pair
from plan.stackfile import project_keys
from tests.conftest import dropping, setting, stack_config

PRIMARY, SECONDARY = "prod-us-east-1", "prod-eu-west-1"


def spec_of(stack, change=None, peer_cidr=None):
    """A shipped stack's validated spec after `change(keys)` edits its `gpu-cloud:` keys in place."""
    config = stack_config(stack)
    keys = copy.deepcopy(project_keys(config))
    if change:
        change(keys)
    return load_stack_spec(keys, stack=stack, region=config["aws:region"], peer_cidr=peer_cidr)


def issues(primary_change=None, secondary_change=None):
    found = dr_pair.pair_issues(spec_of(PRIMARY, primary_change), spec_of(SECONDARY, secondary_change))
    return [(stack, key_path("gpu-cloud", parts), message) for stack, parts, message in found]


def test_the_shipped_pair_holds():
    assert issues() == []


def test_the_shipped_pair_serves_the_same_memory_per_replica_on_two_architectures():
    p, s = dr_pair.serving(spec_of(PRIMARY)), dr_pair.serving(spec_of(SECONDARY))
    # An L40S time-sliced in two gives each replica half its 45,776 MiB: what an A10G has whole.
    assert (p.gpu_model, p.architecture, p.slot_memory_mib) == ("L40S", "ada", 45776 // 2)
    assert (s.gpu_model, s.architecture, s.slot_memory_mib) == ("A10G", "ampere", 22888)
    assert (p.floor, p.ceiling, s.floor, s.ceiling) == (2, 8, 2, 8)


@pytest.mark.parametrize("primary_change, secondary_change, expected", [
    (None, setting("dr", "routing", value="weighted"),
     [(SECONDARY, "gpu-cloud:dr.routing", "is weighted, prod-us-east-1's is failover")]),
    (None, setting("dr", "domain", value="infer.other.example.com"),
     [(SECONDARY, "gpu-cloud:dr.domain", "is infer.other.example.com, prod-us-east-1's is infer.ml.example.com")]),
    (None, setting("dr", "hostedZoneId", value="Z9999"),
     [(SECONDARY, "gpu-cloud:dr.hostedZoneId", "is Z9999")]),
    (setting("dr", "peerStack", value="acme/gpu-cloud/prod-ap-south-1"), None,
     [(PRIMARY, "gpu-cloud:dr.peerStack", "names acme/gpu-cloud/prod-ap-south-1, not prod-eu-west-1")]),
    (None, setting("inference", "triton", "enabled", value=False),
     [(SECONDARY, "gpu-cloud:inference.triton.enabled", "is false")]),
])
def test_the_record_is_one_record_set_with_triton_behind_both_halves(primary_change, secondary_change, expected):
    found = issues(primary_change, secondary_change)
    assert [(stack, path) for stack, path, _ in found] == [(stack, path) for stack, path, _ in expected]
    assert all(words in message for (_, _, message), (_, _, words) in zip(found, expected))


def test_a_pair_is_a_primary_then_a_secondary():
    found = dr_pair.pair_issues(spec_of(SECONDARY), spec_of(PRIMARY))
    assert [(stack, parts) for stack, parts, _ in found] == [(SECONDARY, ("dr", "role")), (PRIMARY, ("dr", "role"))]


@pytest.mark.parametrize("without", [PRIMARY, SECONDARY])
def test_two_architectures_need_both_stacks_to_declare_portable_models(without):
    change = dropping("inference", "triton", "portableModels")
    found = issues(change if without == PRIMARY else None, change if without == SECONDARY else None)
    assert [(stack, path) for stack, path, _ in found] == [(without, "gpu-cloud:inference.triton.portableModels")]
    assert "prod-us-east-1 serves on L40S (ada), prod-eu-west-1 on A10G (ampere)" in found[0][2]


def test_one_architecture_needs_no_declaration():
    def a10g_primary(keys):     # the primary's inference pool on g5 (A10G, Ampere), as the secondary's
        keys["nodePools"][3].update(instanceTypes=["g5.12xlarge"], gpuSharing={"mode": "none"})
        del keys["inference"]["triton"]["portableModels"]
    assert issues(a10g_primary, dropping("inference", "triton", "portableModels")) == []


def test_a_secondary_replica_with_less_gpu_memory_is_refused():
    # Time-slicing the A10G in two leaves a replica 11,444 MiB, half what a replica has in the primary (and 8 slots a
    # node: 3 nodes are all Triton can reach, decisions/nodes/autoscaling.reachable_nodes).
    found = issues(None, lambda keys: keys["nodePools"][1].update(
        gpuSharing={"mode": "time-slicing", "replicas": 2}, maxNodes=3))
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:inference.triton.pool")]
    assert "11,444 MiB of A10G, less than the 22,888 MiB of L40S" in found[0][2]


def declare(*models):
    """A change that declares these (name, MiB) models in inference.triton.models."""
    return setting("inference", "triton", "models", value=[{"name": n, "gpuMemoryMiB": mib} for n, mib in models])


def halved_a10g(keys):
    """The secondary's A10G time-sliced in two: 11,444 MiB a replica (and the pool no larger than 8 replicas need)."""
    keys["nodePools"][1].update(gpuSharing={"mode": "time-slicing", "replicas": 2}, maxNodes=3)


def both(*changes):
    return lambda keys: [change(keys) for change in changes]


@pytest.mark.parametrize("models, holds", [
    ([("bert-large", 9444), ("resnet50", 2000)], True),          # 11,444 MiB together: what a replica has, exactly
    ([("bert-large", 9445), ("resnet50", 2000)], False),         # one MiB more
    ([("bert-large", 12000)], False),                            # one model alone too large
])
def test_a_secondary_whose_replicas_cannot_hold_every_model_the_primary_serves_is_refused(models, holds):
    """Every replica loads the whole repository, so the primary's models must fit a secondary replica together; the
    primary's own replica (22,888 MiB) holds them all."""
    found = issues(declare(*models), halved_a10g)
    if holds:
        assert found == []                               # declared models replace the slot-for-slot comparison
        return
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:inference.triton.pool")]
    total = sum(mib for _, mib in models)
    assert found[0][2].startswith(f"cannot hold every model of prod-us-east-1 after failover: infer-a10g (A10G) gives "
                                  f"a replica 11,444 MiB of GPU memory, and every replica loads every model: "
                                  f"{total:,} MiB together (bert-large ")


def test_the_secondary_holds_its_own_models_beside_the_primarys():
    """The secondary's repository is the primary's, replicated, and what is published there: a model both declare
    counts once, at the larger figure."""
    found = issues(declare(("shared", 6000)), both(halved_a10g, declare(("shared", 5000), ("local", 5500))))
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:inference.triton.pool")]
    assert "11,500 MiB together (shared 6,000 MiB, local 5,500 MiB)" in found[0][2]
    assert dr_pair.declared_models(spec_of(PRIMARY, declare(("shared", 6000))).inference.triton,
                                   spec_of(SECONDARY, declare(("shared", 5000)))
                                   .inference.triton) == {"shared": 6000}


@pytest.mark.parametrize("change, path, words", [
    (declare(("bert-large", 20000), ("resnet50", 2889)), "gpu-cloud:inference.triton.models",
     "infer-l40s (L40S) gives a replica 22,888 MiB of GPU memory, and every replica loads every model: 22,889 MiB"),
    (declare(("resnet50", 2000), ("resnet50", 3000)), "gpu-cloud:inference.triton.models",
     "resnet50 declared twice"),
    (declare(("resnet50", 0)), "gpu-cloud:inference.triton.models[0].gpuMemoryMiB", "greater than 0"),
    (declare(("../resnet50", 2000)), "gpu-cloud:inference.triton.models[0].name", "is not a Triton model name"),
    (both(setting("inference", "triton", "enabled", value=False), declare(("resnet50", 2000))),
     "gpu-cloud:inference.triton.models", "set enabled, or leave models out"),
])
def test_declared_models_are_checked_by_key_before_anything_is_registered(change, path, words):
    found = [(p, m) for p, m in config_issues(PRIMARY, change) if p.startswith("gpu-cloud:inference.triton.models")]
    assert [p for p, _ in found] == [path] and words in found[0][1]


@pytest.mark.parametrize("change, ceiling, path", [
    # maxNodes 2: all that 2 replicas or fewer can reach (decisions/nodes/autoscaling.reachable_nodes)
    (lambda keys: (keys["inference"]["triton"].update(maxReplicas=2), keys["nodePools"][1].update(maxNodes=2)), 2,
     None),                                                                   # exactly the primary's 2: enough
    (lambda keys: (keys["inference"]["triton"].update(minReplicas=1, maxReplicas=1),
                   keys["nodePools"][1].update(maxNodes=2)), 1, "gpu-cloud:inference.triton.maxReplicas"),
    (lambda keys: keys["nodePools"][1].update(minNodes=0, desiredNodes=0, maxNodes=0), 0,
     "gpu-cloud:nodePools[1].maxNodes"),
])
def test_the_secondary_must_grow_to_every_slot_the_primary_always_runs(change, ceiling, path):
    assert dr_pair.serving(spec_of(SECONDARY, change)).ceiling == ceiling
    found = issues(None, change)
    assert [p for _, p, _ in found] == ([path] if path else [])
    if path:
        assert found[0][2] == (f"lets Triton grow to {ceiling} GPU slots, fewer than the 2 prod-us-east-1 always runs "
                               "(its minReplicas); the secondary must reach all of them")


def test_a_recovery_point_target_needs_models_from_the_replicated_bucket():
    outside = setting("inference", "triton", "modelRepository", value="s3://shared-models/triton")
    found = issues(None, outside)
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:inference.triton.modelRepository")]
    assert "prod-us-east-1's dr.rpoMinutes cannot hold for them" in found[0][2]
    assert issues(dropping("dr", "rpoMinutes"), outside) == []        # no target: nothing to hold


def test_internal_load_balancers_need_the_clients_named_in_both():
    found = issues(None, dropping("dr", "clientCidrs"))
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:dr.clientCidrs")]
    found = issues(None, setting("dr", "clientCidrs", value=["10.80.0.0/16"]))
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:dr.clientCidrs")]
    assert "one record, one set of clients" in found[0][2]


def test_clients_in_the_primarys_vpc_need_a_route_to_the_secondarys_after_failover():
    # Clients only in the primary's VPC, which routes the CI runners and nothing else. Alone, the stack cannot tell
    # (its peer's file is not at hand here); as a pair it can.
    clients = setting("dr", "clientCidrs", value=["10.64.0.0/16"])
    def unrouted(keys):
        clients(keys)
        keys["network"]["transitGateway"]["routes"] = ["10.0.0.0/22"]
    found = issues(unrouted, clients)
    assert [(stack, path) for stack, path, _ in found] == [(PRIMARY, "gpu-cloud:network.transitGateway.routes")]
    assert ("dr.clientCidrs 10.64.0.0/16 are in this VPC; after failover they call the peer's load balancer in "
            "10.80.0.0/16, which no route sends through the transit gateway") in found[0][2]
    assert issues(clients, clients) == []


def test_internet_facing_load_balancers_take_clients_anywhere():
    public = lambda keys: (keys["inference"]["triton"].update(scheme="internet-facing"),   # noqa: E731
                           keys["dr"].pop("clientCidrs"))
    assert issues(public, public) == []
    found = issues(public, None)
    assert [(stack, path) for stack, path, _ in found] == [(SECONDARY, "gpu-cloud:inference.triton.scheme")]


# --- one stack's DR keys, judged alone (decisions/config/validate.py)
# ------------------------------------------------------------
def config_issues(stack, change, peer_cidr=None):
    with pytest.raises(ConfigError) as raised:
        spec_of(stack, change, peer_cidr)
    return [(issue.path, issue.message) for issue in raised.value.issues]


@pytest.mark.parametrize("stack, change, path, words", [
    (PRIMARY, setting("dr", "rpoMinutes", value=14), "gpu-cloud:dr.rpoMinutes",
     "14 cannot be met: S3 Replication Time Control is designed to replicate 99.99 % of objects within 15 minutes, "
     "and its SLA commits to 99.9 % a month"),
    (PRIMARY, setting("dr", "rpoMinutes", value=0), "gpu-cloud:dr.rpoMinutes", "greater than or equal to 1"),
    (SECONDARY, setting("dr", "rpoMinutes", value=30), "gpu-cloud:dr.rpoMinutes",
     "is a primary's target: a secondary replicates nothing"),
    (PRIMARY, setting("dr", "clientCidrs", value=["10.64.0.0/33"]), "gpu-cloud:dr.clientCidrs[0]",
     "is not an IPv4 CIDR"),
    (PRIMARY, setting("dr", "clientCidrs", value=["172.20.0.0/16"]), "gpu-cloud:dr.clientCidrs[0]",
     "172.20.0.0/16 is neither in the VPC (10.64.0.0/16) nor in a network.transitGateway.routes range"),
    (PRIMARY, setting("inference", "triton", "portableModels", value="yes"),
     "gpu-cloud:inference.triton.portableModels", "'yes' is a string where true or false belongs"),
])
def test_a_stacks_own_dr_keys_are_checked_before_anything_is_registered(stack, change, path, words):
    found = config_issues(stack, change)
    assert [p for p, _ in found] == [path] and words in found[0][1], found


def test_clients_need_no_route_to_an_internet_facing_load_balancer():
    def public(keys):
        keys["inference"]["triton"]["scheme"] = "internet-facing"
        keys["dr"]["clientCidrs"] = ["172.20.0.0/16"]
    assert spec_of(PRIMARY, public).dr.client_cidrs == ("172.20.0.0/16",)


def test_dr_keys_without_a_role_are_refused_by_name():
    def no_role(keys):
        keys["dr"] = {"role": "none", "rpoMinutes": 15, "clientCidrs": ["10.64.0.0/16"]}
    # clientCidrs stand without a pair: they are who may reach the internal load balancer
    assert [p for p, _ in config_issues(PRIMARY, no_role)] == ["gpu-cloud:dr.rpoMinutes"]


def test_a_stack_whose_vpc_clients_have_no_route_to_the_peer_is_refused_with_the_peers_file_at_hand():
    unrouted = setting("network", "transitGateway", "routes", value=["10.0.0.0/22"])
    found = config_issues(SECONDARY, unrouted, peer_cidr="10.64.0.0/16")
    assert [p for p, _ in found] == ["gpu-cloud:dr.clientCidrs[0]", "gpu-cloud:network.transitGateway.routes"]
    assert spec_of(SECONDARY, peer_cidr="10.64.0.0/16")      # the shipped routes hold


# --- the recovery time ------------------------------------------------------------------------------------------------
DETECTION_INTERNAL = 10 * 3 + 60 * 3      # NLB checks, then 2 of 3 one-minute alarm periods
TTL = 60
REACTION = 30 + 120 + 15                  # a scrape, the 2-minute queue-time window, an HPA sync
# before the gate, kmod load, checks, verifier, report (decisions/nodes/boot.py)
BOOT_G5 = 240 + 300 + 60 + 120 + 60
NEW_NODE = 10 + BOOT_G5 + 300 + 300       # autoscaler scan, boot, registration, GPUs advertised
IMAGE_PULL = 600
MODELS = 90 * 10                          # the startup probe's budget


def seconds(recovery):
    return [(t.name, t.seconds) for t in recovery.terms], [(t.name, t.seconds) for t in recovery.terms[-1].parts]


def test_the_shipped_secondary_carries_the_primarys_minimum_at_once():
    recovery = dr_pair.recovery(spec_of(PRIMARY), spec_of(SECONDARY), 2)
    assert seconds(recovery) == ([("detection", DETECTION_INTERNAL), ("DNS TTL", TTL), ("scale-up", 0)], [])
    assert recovery.seconds == 270
    # Detection is the checks' and the alarm's arithmetic: what has no published bound is named; no new replica, so
    # no first copy of the models, and no capacity taken for granted.
    assert recovery.not_counted == (dr_pair.DETECTION_NOT_COUNTED["internal"],) and recovery.assumes == ()


def test_at_the_primarys_maximum_the_secondary_boots_a_node():
    # 8 replicas; the idle secondary keeps 1 node of 4 A10G slots, so one more node of 4.
    recovery = dr_pair.recovery(spec_of(PRIMARY), spec_of(SECONDARY), 8)
    assert seconds(recovery)[1] == [("autoscaler reaction", REACTION), ("1 new node", NEW_NODE),
                                    ("image pull", IMAGE_PULL), ("models load", MODELS)]
    assert recovery.seconds == DETECTION_INTERNAL + TTL + REACTION + NEW_NODE + IMAGE_PULL + MODELS == 3325
    # The startup probe's budget starts with Triton; the copy before it has no figure, and the estimate says so.
    assert recovery.not_counted == (dr_pair.DETECTION_NOT_COUNTED["internal"], dr_pair.FIRST_COPY_NOT_COUNTED)
    # The node's 1,390 s take on-demand capacity for granted: nothing reserves it, and the estimate says how to.
    (assumed,) = recovery.assumes
    assert assumed.startswith("EC2 has 1 x g5.12xlarge on-demand in eu-west-1 when the autoscaler asks; nothing "
                              "reserves it.")
    # The reservation holds the node the idle secondary keeps and the one it adds: a reserved pool launches into it only.
    assert "run pool infer-a10g on an On-Demand Capacity Reservation of 2 x g5.12xlarge" in assumed


def test_what_the_recovery_time_leaves_out_is_the_deployments_own_first_copy(stack_runs):
    pod = stack_runs[SECONDARY].one("kubernetes:apps/v1:Deployment", "inference-deployment").inputs["spec"][
        "template"]["spec"]
    first = pod["initContainers"][0]
    assert first["command"][-1] == "once" and f"init container {first['name']}," in dr_pair.FIRST_COPY_NOT_COUNTED
    assert "activeDeadlineSeconds" not in pod           # nothing bounds the copy's time


def test_the_pair_report_prints_what_the_recovery_time_leaves_out(capsys):
    """`python -m plan --dr-pair` prints not_counted after the terms it leaves out of: at the maximum (a new node,
    new replicas), not at the minimum (no new replica)."""
    from plan.__main__ import main
    assert main(["--dr-pair", PRIMARY, SECONDARY]) == 0
    lines = capsys.readouterr().out.splitlines()
    at_maximum = next(i for i, line in enumerate(lines) if line.startswith("Carrying its maximum"))
    detection = f"  not counted: {dr_pair.DETECTION_NOT_COUNTED['internal']}"
    assert [line for line in lines[:at_maximum] if line.startswith("  not counted: ")] == [detection]
    assert lines[at_maximum - 2].startswith("  total ")
    after = lines[at_maximum:]
    first_copy = after.index(f"  not counted: {dr_pair.FIRST_COPY_NOT_COUNTED}")
    assert after[first_copy - 2].startswith("  models load ") and after[first_copy - 1] == detection
    assert after[first_copy + 1].startswith("  assumes: EC2 has 1 x g5.12xlarge on-demand") and len(after) == first_copy + 2


@pytest.mark.parametrize("change, scale_up", [
    # one replica idle on its one node: a second fits there, beside the image it already has
    (setting("inference", "triton", "minReplicas", value=1), REACTION + MODELS),
    # two nodes idle and one replica: the new one may land on the node without the image
    (lambda keys: keys["inference"]["triton"].update(minReplicas=1) or keys["nodePools"][1].update(minNodes=2),
     REACTION + IMAGE_PULL + MODELS),
])
def test_a_smaller_secondary_scales_up_without_new_nodes(change, scale_up):
    recovery = dr_pair.recovery(spec_of(PRIMARY), spec_of(SECONDARY, change), 2)
    assert recovery.terms[-1].seconds == scale_up and recovery.seconds == DETECTION_INTERNAL + TTL + scale_up
    assert recovery.not_counted == (dr_pair.DETECTION_NOT_COUNTED["internal"], dr_pair.FIRST_COPY_NOT_COUNTED)
    assert recovery.assumes == ()                        # no new node


def test_an_internet_facing_primary_is_detected_by_route53_itself():
    public = lambda keys: (keys["inference"]["triton"].update(scheme="internet-facing"),   # noqa: E731
                           keys["dr"].pop("clientCidrs"))
    recovery = dr_pair.recovery(spec_of(PRIMARY, public), spec_of(SECONDARY, public), 2)
    assert recovery.terms[0].seconds == 10 * 3 and recovery.seconds == 30 + TTL
    assert recovery.not_counted == (dr_pair.DETECTION_NOT_COUNTED["internet-facing"],)


def test_a_load_beyond_the_secondary_has_no_recovery_time():
    four = lambda keys: (keys["inference"]["triton"].update(maxReplicas=4),   # noqa: E731
                         keys["nodePools"][1].update(maxNodes=3))                # all 4 replicas can reach
    recovery = dr_pair.recovery(spec_of(PRIMARY), spec_of(SECONDARY, four), 8)
    assert recovery.terms is None and recovery.seconds is None


def test_the_pair_report_says_what_protects_each_stacks_lustre_data(capsys):
    """/data is exported to each stack's own datasets bucket (FSx takes no backups of a linked file system), which the
    primary does not replicate: the pair's recovery point does not cover it, and the report says so."""
    from plan.__main__ import main
    assert main(["--dr-pair", PRIMARY, SECONDARY]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  /data ")]
    assert [line.split(": ", 1)[0].split()[-1] for line in lines] == [PRIMARY, SECONDARY]
    assert f"not replicated to {SECONDARY}; no FSx backups" in lines[0]
    assert "not replicated; no FSx backups" in lines[1] and "exported to the stack's datasets bucket" in lines[1]
    assert dr_pair.lustre_protection(spec_of("dev"), None) is None          # no storage.lustre, no line
    elsewhere = spec_of(PRIMARY, setting("storage", "lustre", "importPath", value="s3://acme-ml/datasets"))
    assert "exported to s3://acme-ml/datasets/" in dr_pair.lustre_protection(elsewhere, SECONDARY)
