"""FSx for Lustre: the plain decisions in decisions/storage/lustre.py (sizes, tiers, EFA, the zone, backups) without
mocks, and components/storage/lustre.py under the mock engine (file system, key, logs, security group rules, S3
association, PV/PVC).

What users rely on: a size or tier FSx would refuse, or EFA where FSx cannot serve it, is a config error naming the
key; the file system sits in the zone of the EFA training pools; only Lustre's ports are open, and only between the
file system and the node groups; the data is encrypted with the stack's own key, which a destroy leaves; the bucket's
objects appear under /data and changes flow both ways, and that export, never FSx backups (which FSx does not take of
a linked file system), is what protects it; training pods mount it through a claim bound to a static volume that
names this file system, and a destroy leaves the claim to its namespace and the volume to the cluster.
"""
from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kubernetes
import pytest

from components.storage.lustre import Lustre, LustreArgs
from decisions.catalog.catalog import load_catalog
from decisions.config.model import Lustre as LustreConfig
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.storage import lustre
from tests.conftest import run_component, validate_kubernetes

FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
KEY = "aws:kms/key:Key"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
NAMESPACE = "kubernetes:core/v1:Namespace"

catalog = load_catalog()
CLIENTS = ("sg-0cluster", "sg-0other")
ZONES = ("use1-az1", "use1-az2", "use1-az4")


def pool(name, itype, workload="training", efa=False, zone=None) -> ResolvedPool:
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [itype], "capacity": "on-demand", "minNodes": 0, "desiredNodes": 0,
        "maxNodes": 2, "workload": workload, "efa": efa, "availabilityZone": zone})
    return ResolvedPool(spec=spec, types=(catalog.instance_types[itype],), efa=efa)


def config(**fields) -> LustreConfig:
    return LustreConfig.model_validate({"capacityGiB": 4800, "throughputPerTiB": 500, **fields})


# --- sizes and tiers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1200, 2400, 4800, 7200, 2400 * 40])
def test_persistent_2_sizes_are_1200_and_multiples_of_2400(size):
    assert lustre.size_issues(size, 250) == []


@pytest.mark.parametrize("size", [0, 1199, 1201, 2399, 2401, 3600, 4799])
def test_other_sizes_are_refused_at_the_capacity_key(size):
    (issue,) = lustre.size_issues(size, 250)
    assert issue[0] == ("storage", "lustre", "capacityGiB")
    assert "use 1200 or a multiple of 2400" in issue[1]


@pytest.mark.parametrize("size", range(1100, 7300, 100))
def test_the_spec_and_the_config_model_agree_on_sizes(size):
    try:
        LustreConfig.model_validate({"capacityGiB": size})
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == (lustre.size_issues(size, 250) == [])


@pytest.mark.parametrize("tier,ok", [(125, True), (250, True), (500, True), (1000, True), (124, False), (126, False),
                                     (200, False), (999, False), (1001, False), (0, False)])
def test_throughput_tiers_are_125_250_500_1000(tier, ok):
    issues = lustre.size_issues(2400, tier)
    assert (issues == []) == ok
    if not ok:
        assert issues[0][0] == ("storage", "lustre", "throughputPerTiB")
        assert "125, 250, 500, 1000" in issues[0][1]


def test_throughput_capacity_is_tib_times_tier():
    assert lustre.throughput_mbps(4800, 500) == 2343.75
    assert lustre.throughput_mbps(1200, 125) == 146.484375


# --- EFA: only where FSx supports it ----------------------------------------------------------------------------

def test_efa_without_any_efa_pool_is_refused_at_the_efa_key():
    (issue,) = lustre.lustre_issues(config(efa=True), [pool("train", "p5.48xlarge", efa=False)])
    assert issue[0] == ("storage", "lustre", "efa")
    assert "no node pool has EFA" in issue[1]


@pytest.mark.parametrize("itype,nitro", [("p4d.24xlarge", 3), ("p4de.24xlarge", 3), ("g5.48xlarge", 3),
                                         ("g4dn.metal", 3)])
def test_efa_with_only_pre_nitro_v4_clients_is_refused(itype, nitro):
    (issue,) = lustre.lustre_issues(config(efa=True), [pool("train", itype, efa=True, zone="use1-az1")])
    assert issue[0] == ("storage", "lustre", "efa")
    assert f"{itype} is Nitro v{nitro}" in issue[1] and "Nitro v4+" in issue[1]


@pytest.mark.parametrize("itype", ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
                                   "g6e.48xlarge", "g6.48xlarge"])
def test_efa_with_a_nitro_v4_or_newer_efa_pool_is_accepted(itype):
    assert lustre.lustre_issues(config(efa=True), [pool("train", itype, efa=True, zone="use1-az1")]) == []


def test_every_catalog_family_has_a_nitro_generation_and_trn2_is_excluded():
    assert {lustre.family(t) for t in catalog.instance_types} <= set(lustre.NITRO_GENERATION)
    assert "excludes the trn2 family" in lustre.efa_client_problem("trn2.48xlarge")
    assert "Nitro generation unknown" in lustre.efa_client_problem("x9z.large")


def test_efa_pools_that_fsx_cannot_serve_get_a_warning_when_another_qualifies():
    pools = [pool("train", "p5.48xlarge", efa=True, zone="use1-az1"),
             pool("old", "p4d.24xlarge", efa=True, zone="use1-az1")]
    assert lustre.lustre_issues(config(efa=True), pools) == []
    (warning,) = lustre.lustre_warnings(config(efa=True), pools)
    assert "pool old mounts over TCP" in warning


def test_fast_file_system_without_efa_gets_the_fsx_recommendation():
    pools = [pool("train", "p5.48xlarge", efa=True, zone="use1-az1")]
    assert lustre.lustre_warnings(config(capacityGiB=9600, throughputPerTiB=1000), pools) == []   # 9375 MB/s
    (warning,) = lustre.lustre_warnings(config(capacityGiB=12000, throughputPerTiB=1000), pools)  # 11719 MB/s
    assert "recommends EFA above 10,000 MB/s" in warning


def test_efa_off_is_never_an_issue():
    assert lustre.lustre_issues(config(efa=False), [pool("infer", "g5.48xlarge", workload="inference")]) == []


# --- the zone --------------------------------------------------------------------------------------------------

def test_zone_is_the_efa_training_pools_zone():
    pools = [pool("pinned", "g6e.12xlarge", zone="use1-az2"),
             pool("efa-a", "p5.48xlarge", efa=True, zone="use1-az4"),
             pool("efa-b", "p5e.48xlarge", efa=True, zone="use1-az4"),
             pool("infer-efa", "p5.48xlarge", workload="inference", efa=True, zone="use1-az1")]
    zones = {"pinned": ("use1-az2",), "efa-a": ("use1-az4",), "efa-b": ("use1-az4",), "infer-efa": ("use1-az1",)}
    chosen = lustre.lustre_zone(pools, zones, ZONES)
    assert chosen.zone_id == "use1-az4"
    assert "EFA training pools (efa-a, efa-b)" in chosen.reason
    assert lustre.zone_issues(pools, zones, efa=True) == []


def test_efa_training_pools_in_different_zones_are_refused_only_for_an_efa_file_system():
    pools = [pool("efa-a", "p5.48xlarge", efa=True, zone="use1-az1"),
             pool("efa-b", "p5.48xlarge", efa=True, zone="us-east-1b")]
    zones = {"efa-a": ("use1-az1",), "efa-b": ("use1-az2",)}
    (issue,) = lustre.zone_issues(pools, zones, efa=True)
    assert issue[0] == ("storage", "lustre")
    assert "efa-a in use1-az1, efa-b in use1-az2" in issue[1]
    # Over TCP, the second pool mounts across zones: the first EFA training pool's zone is chosen.
    assert lustre.zone_issues(pools, zones, efa=False) == []
    chosen = lustre.lustre_zone(pools, zones, ZONES)
    assert chosen.zone_id == "use1-az1" and "(efa-a)" in chosen.reason


def test_without_efa_training_pools_the_first_pinned_training_pool_decides():
    pools = [pool("spread", "g6e.12xlarge"),                       # unpinned, even if the account offers one zone
             pool("infer", "g6e.12xlarge", workload="inference", zone="use1-az1"),
             pool("pinned", "g6e.12xlarge", zone="us-east-1b"), pool("later", "g6e.12xlarge", zone="use1-az4")]
    zones = {"spread": ("use1-az4",), "infer": ("use1-az1",), "pinned": ("use1-az2",), "later": ("use1-az4",)}
    chosen = lustre.lustre_zone(pools, zones, ZONES)
    assert chosen.zone_id == "use1-az2" and "training pool pinned" in chosen.reason


def test_without_pinned_training_pools_the_first_declared_zone():
    pools = [pool("spread", "g6e.12xlarge"), pool("infer", "g6e.12xlarge", workload="inference", zone="use1-az4")]
    chosen = lustre.lustre_zone(pools, {"spread": ZONES, "infer": ("use1-az4",)}, ZONES)
    assert chosen.zone_id == "use1-az1" and "first declared zone" in chosen.reason


# --- plain settings --------------------------------------------------------------------------------------------

def test_the_program_asks_fsx_for_no_backup_of_its_linked_file_system_and_exports_what_jobs_write():
    """FSx backs up no file system linked to S3 (FSx for Lustre User Guide, "Using data repositories"; CreateBackup),
    and this program links every one: its settings are the export of every change and no backup, which the rule the
    pack holds every file system to accepts in prod; the same file system asking for backups, or not exporting
    changes, is refused."""
    ours = dict(linked=True, export_events=lustre.EXPORT_EVENTS, backup_retention_days=lustre.BACKUP_RETENTION_DAYS,
                final_backup=lustre.FINAL_BACKUP)
    assert (lustre.BACKUP_RETENTION_DAYS, lustre.FINAL_BACKUP) == (0, False)
    assert set(lustre.EXPORT_PROTECTS) <= set(lustre.EXPORT_EVENTS)
    assert lustre.protection_problems(**ours, prod=True) == []
    assert lustre.protection_problems(**{**ours, "backup_retention_days": 14}, prod=False)
    assert lustre.protection_problems(**{**ours, "final_backup": True}, prod=False)
    assert lustre.protection_problems(**{**ours, "export_events": ("DELETED",)}, prod=True)


@pytest.mark.parametrize("linked,events,days,final,prod,words", [
    (True, ("NEW", "CHANGED", "DELETED"), 0, False, True, []),
    (True, ("NEW", "CHANGED"), 0, False, True, []),                  # deletes need not reach S3 to protect
    (True, ("NEW",), 0, False, True, ["does not export CHANGED"]),
    (True, (), 0, False, False, []),                                 # outside prod a link alone is allowed
    (True, ("NEW", "CHANGED"), 7, False, False, ["automatic backups (7 days)"]),   # ... never backups with it
    (True, ("NEW", "CHANGED"), 0, True, False, ["a final backup"]),
    (False, (), 14, True, True, []),
    (False, (), 0, True, True, ["neither linked to S3 with automatic export nor backed up"]),
    (False, (), 7, False, True, ["skips its final backup"]),
    (False, (), 0, False, False, []),                                # a dev scratch file system
])
def test_protection_problems_are_one_rule_for_the_pack_and_the_program(linked, events, days, final, prod, words):
    problems = lustre.protection_problems(linked, events, days, final, prod=prod)
    assert len(problems) == len(words) and all(w in p for w, p in zip(words, problems))


def test_the_protection_says_where_the_data_is_and_whether_it_reaches_the_peer():
    own = lustre.protection_summary(None, "prod-eu-west-1")
    assert own.startswith("exported to the stack's datasets bucket (NEW, CHANGED, DELETED): versioned, old versions "
                          "kept 30 days, not replicated to prod-eu-west-1")           # datasets is not replicated
    assert own.endswith("no FSx backups (FSx backs up no file system linked to S3)")
    assert "exported to s3://acme/datasets/ (NEW, CHANGED, DELETED; importPath)" in lustre.protection_summary(
        "s3://acme/datasets", None)


def test_data_repository_paths_are_prefixes():
    assert lustre.s3_prefix("s3://acme/datasets") == "s3://acme/datasets/"
    assert lustre.s3_prefix("s3://acme/") == "s3://acme/"
    with pytest.raises(ValueError):
        lustre.s3_prefix("/data")


def test_maintenance_time_is_in_fsx_format():
    assert lustre.WEEKLY_MAINTENANCE_START == "7:03:00"             # d:HH:MM, Sunday 03:00 UTC


# --- the component ---------------------------------------------------------------------------------------------

def build(efa=False, import_path="s3://acme-ml/datasets", bucket=None, clients=CLIENTS,
          capacity=4800, tier=500):
    def program():
        cluster = aws.eks.Cluster("cluster", role_arn="arn:aws:iam::123456789012:role/eks",
                                  vpc_config=aws.eks.ClusterVpcConfigArgs(subnet_ids=["subnet-az4"]))
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        namespace = kubernetes.core.v1.Namespace(
            "training", metadata=kubernetes.meta.v1.ObjectMetaArgs(name="training"),
            opts=pulumi.ResourceOptions(provider=k8s))
        component = Lustre("lustre", LustreArgs(
            cluster_name="gpu-cloud-test", capacity_gib=capacity, throughput_per_tib=tier,
            efa=efa, vpc_id="vpc-0123", subnet_id="subnet-az4", client_security_group_ids=list(clients),
            region="us-east-1", account_id="123456789012", partition="aws", dns_suffix="amazonaws.com",
            log_retention_days=30, namespace=namespace, namespace_name="training", cluster=cluster,
            import_path=import_path, datasets_bucket=bucket),
            opts=pulumi.ResourceOptions(providers={"kubernetes": k8s}))
        pulumi.export("fileSystemId", component.file_system_id)
        pulumi.export("dnsName", component.dns_name)
        pulumi.export("mountName", component.mount_name)
        pulumi.export("securityGroupId", component.security_group_id)
        pulumi.export("pvcName", component.pvc_name)
    return program


@pytest.fixture(scope="module")
def run():
    return run_component(build())


@pytest.fixture(scope="module")
def efa_run():
    return run_component(build(efa=True, clients=CLIENTS[:1]))


def rules(run, kind):
    return {(r.inputs["securityGroupId"], r.inputs["ipProtocol"], r.inputs.get("fromPort"), r.inputs.get("toPort"),
             r.inputs["referencedSecurityGroupId"]) for r in run.of_type(kind)}


def test_file_system_is_persistent_2_lustre_2_15_lz4_with_the_configured_size(run):
    fs = run.one(FS).inputs
    assert (fs["deploymentType"], fs["storageType"], fs["fileSystemTypeVersion"], fs["dataCompressionType"]) == \
        ("PERSISTENT_2", "SSD", "2.15", "LZ4")
    assert fs["storageCapacity"] == 4800 and fs["perUnitStorageThroughput"] == 500
    assert fs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    assert fs["efaEnabled"] is False
    assert fs["subnetIds"] == "subnet-az4"
    assert fs["securityGroupIds"] == [run.one(SG).state["id"]]


def test_file_system_and_key_are_protected_and_the_key_encrypts_it(run):
    fs, key = run.one(FS), run.one(KEY)
    assert fs.protect and key.protect
    assert key.retain_on_delete and not fs.retain_on_delete   # a destroy leaves the key, unprotected or not
    assert key.inputs["enableKeyRotation"] is True
    assert fs.inputs["kmsKeyId"] == key.state["arn"]


def test_warnings_and_errors_go_to_an_fsx_log_group_encrypted_with_the_key(run):
    group, key = run.one(LOG_GROUP), run.one(KEY)
    assert group.inputs["name"].startswith("/aws/fsx/")
    assert group.inputs["kmsKeyId"] == key.state["arn"] and group.inputs["retentionInDays"] == 30
    assert run.one(FS).inputs["logConfiguration"] == {"level": "WARN_ERROR", "destination": group.state["arn"]}
    assert group.inputs["name"] in key.inputs["policy"]           # CloudWatch Logs may use the key for this group only


def test_the_file_system_asks_for_no_backup_and_exports_what_is_written():
    run = run_component(build())
    fs = run.one(FS)
    assert fs.inputs["automaticBackupRetentionDays"] == 0 and fs.inputs["skipFinalBackup"] is True
    assert not {"dailyAutomaticBackupStartTime", "finalBackupTags"} & set(fs.inputs)
    assert fs.inputs["copyTagsToBackups"] is True    # as deployed stacks have it: a change would replace (ForceNew)
    assert fs.inputs["weeklyMaintenanceStartTime"] == "7:03:00"
    assert fs.custom_timeouts == {}                    # no final backup to wait for: the provider's 30 minutes
    assert run.one(DRA).inputs["s3"]["autoExportPolicy"] == {"events": ["NEW", "CHANGED", "DELETED"]}


@pytest.mark.parametrize("stack", ["prod-us-east-1", "prod-eu-west-1"])
def test_the_plan_never_asks_for_backups_of_a_linked_file_system(stack_runs, stack):
    run = stack_runs[stack]
    (fs,) = run.of_type(FS)
    links = [a for a in run.of_type(DRA) if fs.urn in a.property_dependencies.get("fileSystemId", ())]
    assert links, "every file system the program builds is linked to S3"
    assert lustre.protection_problems(
        linked=True, export_events=links[0].inputs["s3"]["autoExportPolicy"]["events"],
        backup_retention_days=int(fs.inputs["automaticBackupRetentionDays"]),
        final_backup=not fs.inputs["skipFinalBackup"], prod=True) == []


def test_lustre_ports_exactly_from_and_to_the_file_system_group_and_each_client(run):
    fs_sg = run.one(SG).state["id"]
    peers = (fs_sg, *CLIENTS)
    expected_fs = {(fs_sg, "tcp", low, high, peer) for low, high in ((988, 988), (1018, 1023)) for peer in peers}
    expected_clients = {(client, "tcp", low, high, fs_sg) for low, high in ((988, 988), (1018, 1023))
                        for client in CLIENTS}
    assert rules(run, INGRESS) == expected_fs | expected_clients
    assert rules(run, EGRESS) == expected_fs | expected_clients
    for rule in run.of_type(INGRESS) + run.of_type(EGRESS):
        assert not {"cidrIpv4", "cidrIpv6", "prefixListId"} & set(rule.inputs), rule.name


def test_without_efa_no_all_traffic_rule(run):
    assert all(r.inputs["ipProtocol"] == "tcp" for r in run.of_type(INGRESS) + run.of_type(EGRESS))


def test_efa_file_system_allows_all_traffic_with_itself_and_the_clients_by_group_id(efa_run):
    fs_sg = efa_run.one(SG).state["id"]
    client = CLIENTS[0]
    everything = {(fs_sg, "-1", None, None, fs_sg), (fs_sg, "-1", None, None, client),
                  (client, "-1", None, None, fs_sg)}
    assert {r for r in rules(efa_run, INGRESS) if r[1] == "-1"} == everything
    assert {r for r in rules(efa_run, EGRESS) if r[1] == "-1"} == everything
    fs = efa_run.one(FS)
    assert fs.inputs["efaEnabled"] is True and fs.inputs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    rule_urns = {r.urn for r in efa_run.of_type(INGRESS) + efa_run.of_type(EGRESS)
                 if r.inputs["securityGroupId"] == fs_sg}
    assert rule_urns <= set(fs.dependencies), "FSx checks the group's rules when it creates the file system"


def test_data_repository_association_links_the_import_path_to_data_both_ways(run):
    dra = run.one(DRA)
    assert dra.inputs["dataRepositoryPath"] == "s3://acme-ml/datasets/"
    assert dra.inputs["fileSystemPath"] == "/data"
    assert dra.inputs["fileSystemId"] == run.one(FS).state["id"]
    events = ["NEW", "CHANGED", "DELETED"]
    assert dra.inputs["s3"] == {"autoImportPolicy": {"events": events}, "autoExportPolicy": {"events": events}}
    assert dra.inputs["batchImportMetaDataOnCreate"] is True and dra.inputs["deleteDataInFilesystem"] is False
    assert dra.custom_timeouts.get("create") == "30m"


def test_without_an_import_path_the_datasets_bucket_is_linked():
    run = run_component(build(import_path=None, bucket="acme-datasets-us-east-1"))
    assert run.one(DRA).inputs["dataRepositoryPath"] == "s3://acme-datasets-us-east-1/"


def test_static_volume_names_this_file_system_and_the_claim_binds_to_it(run):
    fs, pv, pvc = run.one(FS), run.one(PV).inputs, run.one(PVC)
    csi = pv["spec"]["csi"]
    assert csi["driver"] == "fsx.csi.aws.com"
    assert csi["volumeHandle"] == fs.state["id"]
    assert csi["volumeAttributes"] == {"dnsname": fs.state["dnsName"], "mountname": fs.state["mountName"]}
    assert pv["spec"]["capacity"] == {"storage": "4800Gi"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] and pv["spec"]["mountOptions"] == ["flock"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" and pv["spec"]["storageClassName"] == ""
    assert pv["spec"]["claimRef"] == {"namespace": "training", "name": pvc.inputs["metadata"]["name"]}
    claim = pvc.inputs
    assert claim["metadata"]["namespace"] == "training"
    assert claim["spec"]["volumeName"] == pv["metadata"]["name"] and claim["spec"]["storageClassName"] == ""
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "4800Gi"}}
    assert run.one(NAMESPACE).urn in pvc.dependencies, "the claim waits for its namespace"


def test_a_destroy_leaves_the_claim_to_its_namespace_and_the_volume_to_the_cluster(run):
    """Neither is deleted by the engine on a destroy, where a pod mounting the claim would hold it (pvc-protection)
    and the volume bound to it (pv-protection) past pulumi-kubernetes' 10 minutes (tests/test_destroy.py)."""
    namespace, pv, pvc = run.one(NAMESPACE), run.one(PV), run.one(PVC)
    assert pvc.deleted_with == namespace.urn and pvc.protect
    assert pv.deleted_with == run.one("aws:eks/cluster:Cluster").urn and not pv.protect
    assert namespace.urn not in pv.dependencies, "the volume's claimRef names the namespace, not its output"


def test_kubernetes_objects_are_valid_for_1_35(run):
    assert validate_kubernetes(run, "1.35") == 3       # the namespace, the PV and the claim


def test_outputs(run):
    fs = run.one(FS).state
    assert run.outputs == {"fileSystemId": fs["id"], "dnsName": fs["dnsName"], "mountName": fs["mountName"],
                           "securityGroupId": run.one(SG).state["id"], "pvcName": "lustre-data"}


@pytest.mark.parametrize("change,message", [
    ({"capacity": 3600}, "1200 or a multiple of 2400"),
    ({"tier": 200}, "125, 250, 500, 1000"),
    ({"import_path": None}, "S3 data repository"),
    ({"clients": ()}, "client_security_group_ids is empty"),
])
def test_bad_arguments_fail_before_anything_is_registered(change, message):
    with pytest.raises(Exception, match=message):
        run_component(build(**change))


def test_the_csi_driver_is_the_pinned_chart_with_its_controller_on_system_nodes_before_the_claim(run):
    from components.cluster import SYSTEM_NODE_LABELS
    from decisions.catalog import charts
    from tests.chart_values import assert_values_confirmed, set_paths

    release = run.one("kubernetes:helm.sh/v3:Release")
    pin = charts.chart(charts.FSX_CSI_DRIVER)
    assert (release.inputs["chart"], release.inputs["version"], release.inputs["namespace"]) == \
        ("aws-fsx-csi-driver", "1.17.0", "kube-system")
    assert release.inputs["repositoryOpts"] == {"repo": pin.repository}
    assert release.inputs["values"] == {"controller": {"nodeSelector": SYSTEM_NODE_LABELS}}
    assert release.urn in run.one("kubernetes:core/v1:PersistentVolumeClaim").dependencies
    # Every value set is a key of the pinned chart's values.yaml, at the line the code cites
    # (tests/upstream/chart-values/, held against the chart's source by scripts/upstream_records.py --check), and every
    # path the code cites is set.
    assert_values_confirmed(release.inputs["values"], pin, lustre.CSI_VALUE_PATHS)
    assert sorted(set_paths(release.inputs["values"], lustre.CSI_VALUE_PATHS)) == sorted(lustre.CSI_VALUE_PATHS)


@pytest.mark.parametrize("stack, expected", [
    ("prod-us-east-1", {"train-h100": True, "finetune-a100-80gb-spot": True, "finetune-a100-40gb-spot": True,
                        "infer-l40s": False}),
    ("dev", None),   # no file system: no pool installs a client
])
def test_nodes_of_pools_that_mount_lustre_get_the_client_and_the_gate_check(stack_runs, stack, expected):
    import base64
    run = stack_runs[stack]
    seen = {}
    for lt in run.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        user_data = base64.b64decode(lt.inputs["userData"]).decode()
        seen[lt.name.removesuffix("-lt")] = "export GPU_CLOUD_LUSTRE=true\n" in user_data
        assert ("export GPU_CLOUD_LUSTRE=true\n" in user_data) != ("export GPU_CLOUD_LUSTRE=false\n" in user_data)
    assert seen == (expected if expected is not None else {name: False for name in seen})


def test_without_efa_the_file_system_waits_only_for_the_rules_fsx_checks(run):
    """FSx checks Lustre traffic within its own group at creation; the rules naming the clients' group (the EKS
    cluster's) need the cluster, about 12 minutes, and the file system does not wait for them."""
    fs_sg = run.one(SG).state["id"]
    fs = run.one(FS)
    own = {r.urn for r in run.of_type(INGRESS) + run.of_type(EGRESS)
           if r.inputs["securityGroupId"] == fs_sg and r.inputs["referencedSecurityGroupId"] == fs_sg}
    clients = {r.urn for r in run.of_type(INGRESS) + run.of_type(EGRESS)
               if fs_sg in (r.inputs["securityGroupId"], r.inputs["referencedSecurityGroupId"])} - own
    assert own and own <= set(fs.dependencies)
    assert clients and not clients & set(fs.dependencies)


@pytest.mark.parametrize("command", ["job", "mpijob", "pytorch-job"])
def test_what_a_job_writes_under_data_is_inside_the_link_that_exports_it(stack_runs, command):
    """The claim's volume is the file system's root; the data repository association links its /data directory. A job
    mounts that directory (subPath) at /data, and a --volume of the claim the same, so a file written at /data/x is
    /data/x in the file system, under the link, exported to S3: the file system's only protection."""
    import argparse
    from decisions.platform import job_options
    from jobs.__main__ import render

    (dra,) = stack_runs["prod-eu-west-1"].of_type(DRA)
    pool = "train-a100"
    args = argparse.Namespace(command=command, stack="prod-eu-west-1", stack_file=None, pool=pool,
                              image="example.com/train:1", program=["train.py"], name="job", checkpoint_uri="",
                              scratch=None, max_restarts=3, workers=2, nodes=2, env=[],
                              volume=["lustre-data:/shared"], gpus=None, mig_profile=None)
    manifest = render(args)
    pods = [manifest["spec"]["template"]["spec"]] if command == "job" else \
        [r["template"]["spec"] for r in manifest["spec"]["mpiReplicaSpecs"].values()] if command == "mpijob" else \
        [manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]]
    mounts = []
    for pod in pods:
        claims = {v["name"] for v in pod.get("volumes", []) if (v.get("persistentVolumeClaim") or {}).get("claimName")
                  == lustre.PVC_NAME}
        mounts += [m for container in pod["containers"] for m in container.get("volumeMounts", [])
                   if m["name"] in claims]
    assert {m["mountPath"] for m in mounts} == {"/data", "/shared", job_options.TRACES_PATH}
    assert all("/" + m.get("subPath", "") == dra.inputs["fileSystemPath"] == "/data" for m in mounts
               if m["mountPath"] != job_options.TRACES_PATH)
    # The one mount outside the link, on purpose: the flight recorder's dumps, diagnostics never exported (a sibling
    # directory of the file system, not one under the link).
    [traces] = [m for m in mounts if m["mountPath"] == job_options.TRACES_PATH]
    assert not ("/" + traces["subPath"] + "/").startswith(dra.inputs["fileSystemPath"] + "/")


# --- pools that mount it launch in its zone (decisions/storage/lustre.py in_file_system_zone) ------------------
def test_pools_that_mount_it_without_efa_launch_in_its_zone_unless_they_spread():
    """Reads from another zone are billed on both sides (decisions/cost/transfer.py): prod-us-east-1's spot A100
    pools, which mount /data over TCP, launch where the file system is (the EFA training pool's zone), while the
    inference pool, which does not mount it, keeps every zone."""
    from dataclasses import replace

    from plan.stackfile import load_stack

    spec = load_stack("prod-us-east-1")[1]
    everywhere = {p.name: ZONES for p in spec.pools}
    everywhere["train-h100"] = ("use1-az1",)                  # pinned (availabilityZone), EFA
    moved = lustre.in_file_system_zone(spec, everywhere)
    assert moved == {"train-h100": ("use1-az1",), "finetune-a100-80gb-spot": ("use1-az1",),
                     "finetune-a100-40gb-spot": ("use1-az1",), "infer-l40s": ZONES}
    # spreadAcrossZones keeps a pool's zones (and the plan warns what its reads cost)
    spread = replace(spec, pools=tuple(
        replace(p, spec=p.spec.model_copy(update={"spread_across_zones": True}))
        if p.name == "finetune-a100-40gb-spot" else p for p in spec.pools))
    assert lustre.in_file_system_zone(spread, everywhere)["finetune-a100-40gb-spot"] == ZONES
    # a pool whose types the file system's zone does not offer keeps the zones that do
    elsewhere = {**everywhere, "finetune-a100-80gb-spot": ("use1-az2", "use1-az4")}
    assert lustre.in_file_system_zone(spec, elsewhere)["finetune-a100-80gb-spot"] == ("use1-az2", "use1-az4")
    # no file system: nothing moves
    assert lustre.in_file_system_zone(replace(spec, storage=spec.storage.model_copy(update={"lustre": None})),
                                      everywhere) == everywhere
