"""A pinned release manifest (decisions/catalog/charts.yaml `manifests`) as the resources `pulumi up` registers.

The program applies the repository's copy of each manifest object by object (components/platform/release_manifest.py)
instead of a `kubernetes.yaml.v2.ConfigFile`, whose objects the provider registers only at run time, where neither the
offline plan, the policy pack's tests nor any check built on the plan can see them. Each object becomes the resource
the ConfigFile would have registered: the type token of its apiVersion and kind, and the name yaml/v2 gives it
(pulumi/pulumi-kubernetes provider/pkg/provider/yaml/v2/yaml.go `register`, lines 345-352 at v4.32.0-27:
"<prefix>:<namespace>/<name>", or "<prefix>:<name>" for a cluster-scoped object, the prefix being the ConfigFile's
name, configfile.go lines 92-99), so that a stack deployed with the ConfigFile keeps its objects.

What the program changes in an object, and nothing else:
- every object carries RELEASE_ANNOTATION (the manifest and its version): on the cluster it says where the object
  comes from, and the policy pack tells a release's own namespace from a team's by it (policy/policies.py
  k8s_namespace_default_deny);
- every workload (Deployment, StatefulSet, DaemonSet) runs on the system nodes: neither manifest selects or tolerates
  anything, so with the system nodes tainted CriticalAddonsOnly and every GPU node tainted, they would run nowhere.

The order (TIERS) is the one `kubectl apply` of a whole manifest cannot give and yaml/v2 approximates (its
docstring, pulumi_kubernetes/yaml/v2/ConfigFile.py "Dependency ordering": a namespace before namespaced objects, CRDs
before what uses them): the namespace, then the CRDs, then what the controller runs with (accounts, RBAC,
configuration, its certificate's Secret, Services), then the controller, which Pulumi waits for until it is ready,
then the webhook configurations, so that the API server is never told to call a webhook nobody serves yet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence, Tuple

from decisions.nodes.pods import system_placement

RELEASE_ANNOTATION = "gpu-cloud.io/release"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
# kind -> tier; a kind not named is a supporting object (tier 2).
TIERS: Mapping[str, int] = {
    "Namespace": 0,
    "CustomResourceDefinition": 1,
    **{kind: 3 for kind in WORKLOAD_KINDS},
    "MutatingWebhookConfiguration": 4,
    "ValidatingWebhookConfiguration": 4,
    "APIService": 4,
}
SUPPORT_TIER = 2


@dataclass(frozen=True)
class ManifestObject:
    """One object of a release manifest as the program registers it."""
    type_token: str                  # kubernetes:<group>/<version>:<kind>, core/v1 for the core group
    resource_name: str               # yaml/v2's name for it under the manifest's prefix
    body: Mapping[str, Any]          # the object, with the release annotation (and placement) added
    tier: int                        # TIERS: it waits for every object of a lower tier

    @property
    def kind(self) -> str:
        return self.body["kind"]

    @property
    def secret_fields(self) -> Tuple[str, ...]:
        """A Secret's payload is a secret in Pulumi's state, as yaml/v2 marks it (yaml.go: data, stringData)."""
        return ("data", "stringData") if self.type_token == "kubernetes:core/v1:Secret" else ()


def type_token(api_version: str, kind: str) -> str:
    """`apps/v1`, `Deployment` -> `kubernetes:apps/v1:Deployment`; the core group (`v1`) is `core/v1`."""
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{kind}"


def resource_name(prefix: str, obj: Mapping[str, Any]) -> str:
    """yaml/v2's name for the object under `prefix` (a colon, not the program's usual dash: the engine matches a
    deployed child by it)."""
    metadata = obj["metadata"]
    scoped = f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"]
    return f"{prefix}:{scoped}"


def release_label(name: str, version: str) -> str:
    return f"{name}@{version}"


def release_objects(objects: Sequence[Mapping[str, Any]], *, prefix: str, release: str,
                    system_node_labels: Mapping[str, str]) -> Tuple[ManifestObject, ...]:
    """The manifest's objects in registration order (by tier, the file's order within one), each annotated with
    `release` and, for a workload, placed on the system nodes. `objects` are not changed."""
    if not objects:
        raise ValueError(f"release manifest {release} has no objects")
    placement = system_placement(system_node_labels)
    planned = []
    for obj in objects:
        kind = obj.get("kind")
        if not kind or not obj.get("apiVersion") or not (obj.get("metadata") or {}).get("name"):
            raise ValueError(f"release manifest {release}: an object without apiVersion, kind or metadata.name: "
                             f"{str(obj)[:100]}")
        if kind.endswith("List"):
            raise ValueError(f"release manifest {release}: {kind} lists are not expanded; list their items")
        body = _annotated(obj, release)
        if kind in WORKLOAD_KINDS:
            body = _placed(body, placement)
        planned.append(ManifestObject(type_token=type_token(obj["apiVersion"], kind),
                                      resource_name=resource_name(prefix, obj), body=body,
                                      tier=TIERS.get(kind, SUPPORT_TIER)))
    names = [p.resource_name + p.type_token for p in planned]
    if len(set(names)) != len(names):
        raise ValueError(f"release manifest {release}: two objects of one kind share a name and namespace")
    return tuple(sorted(planned, key=lambda p: p.tier))     # sorted() is stable: the file's order within a tier


def _annotated(obj: Mapping[str, Any], release: str) -> Dict[str, Any]:
    metadata = dict(obj["metadata"])
    metadata["annotations"] = {**(metadata.get("annotations") or {}), RELEASE_ANNOTATION: release}
    return {**obj, "metadata": metadata}


def _placed(workload: Mapping[str, Any], placement: Mapping[str, Any]) -> Dict[str, Any]:
    """The workload's pod template with the system nodes' selector and tolerations; a manifest that already places
    its pods is refused rather than overridden in silence."""
    spec = dict(workload["spec"])
    template = dict(spec["template"])
    pod = dict(template["spec"])
    taken = [key for key in placement if pod.get(key)]
    if taken:
        raise ValueError(f"{workload['kind']} {workload['metadata']['name']} sets {', '.join(taken)} itself; "
                         "decide its placement in decisions/platform/release_manifest.py")
    pod.update(placement)
    template["spec"] = pod
    spec["template"] = template
    return {**workload, "spec": spec}

