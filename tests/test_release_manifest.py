"""Pinned release manifests applied object by object (decisions/platform/release_manifest.py,
components/platform/release_manifest.py): the kept copies are the pinned files, each object is the resource yaml/v2
would register, in an order the API server can take, and a changed copy stops the program before it registers
anything."""
from __future__ import annotations

import copy

import pulumi
import pytest

from decisions.catalog import charts
from decisions.nodes.pods import SYSTEM_NODE_LABELS, system_placement
from decisions.platform import release_manifest as rm
from plan.engine import run_program
from tests.conftest import stack_config
from tests.test_main import recording

# The kept copies and their digests, as decisions/catalog/charts.yaml pins them.
KEPT = {
    "mpi-operator": ("manifests/mpi-operator-v0.8.0.yaml",
                     "b38def13a94abe60b2a4b3485239d77f64892b8fbd202e9e435a6031b7500a8f", 9),
    "jobset": ("manifests/jobset-v0.12.0.yaml",
               "a41aaf12dd0b7b0a3d626b8d6107f32c3dc889d7e7830adc46b8cdb77a8963bb", 20),
}
NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "op-system"}}
CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com"}}
ACCOUNT = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "op", "namespace": "op-system"}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": "op-system"},
              "spec": {"template": {"spec": {"containers": [{"name": "op", "image": "op:1"}]}}}}
WEBHOOK = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": "op-webhook"}, "webhooks": []}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_each_kept_copy_is_the_file_its_pin_names(name):
    pin = charts.manifest(name)
    file, digest, objects = KEPT[name]
    assert (pin.file, pin.sha256) == (file, digest)
    assert charts.file_sha256(charts.CHARTS_PATH.parent / file) == digest
    assert len(charts.manifest_objects(name)) == objects


def test_a_changed_or_missing_copy_is_refused_naming_the_file_and_the_way_back(tmp_path):
    pin = charts.manifest("mpi-operator")
    (tmp_path / "manifests").mkdir()
    with pytest.raises(charts.ManifestDigestError, match="is missing; run scripts/vendor_manifests.py mpi-operator"):
        charts.read_manifest("mpi-operator", pin, tmp_path)
    original = (charts.CHARTS_PATH.parent / pin.file).read_bytes()
    (tmp_path / pin.file).write_bytes(original.replace(b"mpioperator/mpi-operator:0.8.0", b"evil/mpi-operator:0.8.0"))
    with pytest.raises(charts.ManifestDigestError, match=r"mpi-operator-v0\.8\.0\.yaml has sha256 [0-9a-f]{64}, not "
                                                         r"the pinned b38def13"):
        charts.read_manifest("mpi-operator", pin, tmp_path)
    (tmp_path / pin.file).write_bytes(original)
    assert len(charts.read_manifest("mpi-operator", pin, tmp_path)) == 9


def test_a_changed_copy_stops_the_program_before_anything_is_registered(monkeypatch):
    pins = charts.load_charts()
    tampered = pins.model_copy(update={"manifests": {
        **pins.manifests, "jobset": pins.manifests["jobset"].model_copy(update={"sha256": "0" * 64})}})
    monkeypatch.setattr(charts, "load_charts", lambda path=None: tampered)
    monkeypatch.setattr(charts, "manifest_objects", lambda name: charts.read_manifest(name, tampered.manifests[name]))
    monitor, kept = recording()
    with pytest.raises(pulumi.RunError, match="release manifest jobset v0.12.0: jobset-v0.12.0.yaml has sha256"):
        run_program(stack_config("dev"), stack="dev", monitor=monitor)
    assert [r.urn for r in kept[0].registrations] == []


@pytest.mark.parametrize("api_version,kind,token", [
    ("v1", "Namespace", "kubernetes:core/v1:Namespace"),
    ("v1", "Secret", "kubernetes:core/v1:Secret"),
    ("apps/v1", "Deployment", "kubernetes:apps/v1:Deployment"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition",
     "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"),
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "kubernetes:kueue.x-k8s.io/v1beta2:WorkloadPriorityClass"),
])
def test_type_tokens_are_the_providers(api_version, kind, token):
    assert rm.type_token(api_version, kind) == token


def test_names_are_yaml_v2s_under_the_prefix():
    # pulumi-kubernetes yaml/v2/yaml.go register: fmt.Sprintf("%s:%s", opts.ResourcePrefix, resourceName), the name
    # "<namespace>/<name>" for a namespaced object.
    assert rm.resource_name("ops-x", NAMESPACE) == "ops-x:op-system"
    assert rm.resource_name("ops-x", ACCOUNT) == "ops-x:op-system/op"


def test_each_object_answers_to_the_urn_its_yaml_v2_configfile_gave_it(stack_runs):
    """A stack deployed while the manifests were yaml/v2 ConfigFiles holds each object under
    ...$kubernetes:yaml/v2:ConfigFile$<type>::<ConfigFile name>:<namespace>/<name>. The component answers to the
    ConfigFile (its alias), and the engine gives each child the alias its parent's implies (pulumi/pulumi
    pkg/resource/deploy/step_generator.go inheritedChildAlias: the parent alias's qualified type, the child's type, and
    the child's name with the parent's name prefix swapped for the alias's), which must be that URN, or `pulumi up`
    creates the objects anew and deletes the old, the CRDs and every MPIJob and JobSet with them."""
    run = stack_runs["prod-us-east-1"]
    for component in run.of_type("gpu-cloud:release_manifest:ReleaseManifest"):
        assert component.aliases == ("type=kubernetes:yaml/v2:ConfigFile",)
        old_parent_type = component.urn.split("::")[2].replace("gpu-cloud:release_manifest:ReleaseManifest",
                                                                "kubernetes:yaml/v2:ConfigFile")
        key = component.name.removeprefix("training-operators-")
        for obj in charts.manifest_objects(key):
            metadata = obj["metadata"]
            scoped = f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"]
            group_version = obj["apiVersion"] if "/" in obj["apiVersion"] else f"core/{obj['apiVersion']}"
            child_type = f"kubernetes:{group_version}:{obj['kind']}"
            # what yaml/v2 registered: the ConfigFile (named as the component) as parent, "<name>:<scoped>"
            deployed = f"urn:pulumi:prod-us-east-1::gpu-cloud::{old_parent_type}${child_type}::{component.name}:{scoped}"
            (child,) = [c for c in run.children_of(component.urn) if c.type == child_type
                        and c.inputs["metadata"]["name"] == metadata["name"]
                        and c.inputs["metadata"].get("namespace") == metadata.get("namespace")]
            inherited = (f"urn:pulumi:prod-us-east-1::gpu-cloud::{old_parent_type}${child.type}::"
                         f"{component.name}{child.name.removeprefix(component.name)}")
            assert inherited == deployed


def plan(objects):
    return rm.release_objects(objects, prefix="ops-x", release="x@v1.0.0", system_node_labels=SYSTEM_NODE_LABELS)


def test_objects_go_in_tiers_keeping_the_files_order_within_one():
    planned = plan([WEBHOOK, DEPLOYMENT, ACCOUNT, CRD, NAMESPACE, {**ACCOUNT, "metadata": {"name": "op2",
                                                                                          "namespace": "op-system"}}])
    assert [(p.kind, p.body["metadata"]["name"], p.tier) for p in planned] == [
        ("Namespace", "op-system", 0), ("CustomResourceDefinition", "widgets.example.com", 1),
        ("ServiceAccount", "op", 2), ("ServiceAccount", "op2", 2), ("Deployment", "op", 3),
        ("ValidatingWebhookConfiguration", "op-webhook", 4)]


def test_every_object_is_annotated_and_workloads_placed_without_changing_the_release_objects():
    originals = [NAMESPACE, DEPLOYMENT]
    before = copy.deepcopy(originals)
    planned = {p.kind: p for p in plan(originals)}
    assert originals == before
    for p in planned.values():
        assert p.body["metadata"]["annotations"] == {rm.RELEASE_ANNOTATION: "x@v1.0.0"}
    pod = planned["Deployment"].body["spec"]["template"]["spec"]
    assert pod == {**DEPLOYMENT["spec"]["template"]["spec"], **system_placement(SYSTEM_NODE_LABELS)}
    assert "nodeSelector" not in planned["Namespace"].body


def test_a_workload_that_places_itself_or_a_list_or_a_nameless_object_is_refused():
    placed = copy.deepcopy(DEPLOYMENT)
    placed["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "x"}
    with pytest.raises(ValueError, match="sets nodeSelector itself"):
        plan([placed])
    with pytest.raises(ValueError, match="lists are not expanded"):
        plan([{"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"name": "l"}, "items": []}])
    with pytest.raises(ValueError, match="without apiVersion, kind or metadata.name"):
        plan([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}])
    with pytest.raises(ValueError, match="has no objects"):
        plan([])


def test_a_secrets_payload_is_a_secret_in_state():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "op-system"}}
    (planned,) = plan([secret])
    assert planned.secret_fields == ("data", "stringData")
    (account,) = plan([ACCOUNT])
    assert account.secret_fields == ()

