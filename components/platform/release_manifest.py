"""A pinned release manifest applied object by object (decisions/platform/release_manifest.py says how and why).

`KubernetesObject` registers one object under its own type token with its fields as they are, which is what the
provider's yaml/v2 does with each object of a file (yaml.go: `yamlv2.RegisterResource(ctx, apiVersion, kind, name,
kubernetes.UntypedArgs(obj.Object))`) and what the Node SDK's CustomResource sends; Python's
kubernetes.apiextensions.CustomResource cannot, as it sends apiVersion, kind, metadata and spec only
(pulumi-kubernetes 4.34.2 pulumi_kubernetes/apiextensions/CustomResource.py lines 143-157), and objects such as a
ClusterRole (`rules`) or a Kueue WorkloadPriorityClass (`value`) carry their fields beside metadata.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import pulumi
from pulumi_kubernetes import _utilities as kubernetes_utilities

from decisions.catalog import charts
from decisions.platform.release_manifest import release_label, release_objects, type_token

# What a stack deployed before gpu-cloud kept the manifests applied them with: the component answers to it, and its
# children (named as yaml/v2 named them) to theirs, so a deployed stack keeps its objects instead of deleting them (and
# every MPIJob and JobSet with their CRDs). The engine gives each child its parent's alias (pulumi/pulumi
# pkg/resource/deploy/step_generator.go generateAliases, inheritedChildAlias: the parent's old URN's type, the child's
# type and name).
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"


class KubernetesObject(pulumi.CustomResource):
    """A Kubernetes object registered with its fields as they are: `body` holds apiVersion, kind, metadata and the
    rest at the top level. The provider checks it against the cluster's schema, as for any typed object."""

    def __init__(self, resource_name: str, body: Mapping[str, Any], opts: Optional[pulumi.ResourceOptions] = None,
                 secret_fields: Tuple[str, ...] = ()):
        props = {key: pulumi.Output.secret(value) if key in secret_fields else value for key, value in body.items()}
        # The typed classes' defaults first (the provider plugin's version, as each of them merges them), then the
        # caller's options.
        defaults = pulumi.ResourceOptions.merge(kubernetes_utilities.get_resource_opts_defaults(),
                                                pulumi.ResourceOptions(
                                                    additional_secret_outputs=list(secret_fields) or None))
        super().__init__(type_token(body["apiVersion"], body["kind"]), resource_name, props,
                         pulumi.ResourceOptions.merge(defaults, opts))


@dataclass(frozen=True)
class ReleaseManifestArgs:
    manifest: str                             # a key of decisions/catalog/charts.yaml `manifests`
    system_node_labels: Mapping[str, str]     # the system nodes, where its workloads run


class ReleaseManifest(pulumi.ComponentResource):
    """Every object of one release manifest, each waiting for the objects of the tiers before it. The Kubernetes
    provider comes from the caller; children inherit it. A resource that depends on the component waits for all of
    it (the Deployment included, which the provider awaits until it is ready)."""
    objects: Dict[str, KubernetesObject]

    def __init__(self, name: str, args: ReleaseManifestArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a changed copy or an object the program cannot place fails before anything is
        # registered. The objects are named under this component's name, as yaml/v2 named them under the ConfigFile's.
        release = release_label(args.manifest, charts.manifest(args.manifest).version)
        objects = release_objects(charts.manifest_objects(args.manifest), prefix=name, release=release,
                                  system_node_labels=args.system_node_labels)
        super().__init__("gpu-cloud:release_manifest:ReleaseManifest", name, None, pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=CONFIG_FILE)])))
        self.objects = {}
        before: List[KubernetesObject] = []     # every object of the tiers already registered
        tier: List[KubernetesObject] = []
        current = objects[0].tier
        for obj in objects:
            if obj.tier != current:
                before, tier, current = before + tier, [], obj.tier
            resource = KubernetesObject(obj.resource_name, obj.body, secret_fields=obj.secret_fields,
                                        opts=pulumi.ResourceOptions(parent=self, depends_on=list(before)))
            self.objects[obj.resource_name] = resource
            tier.append(resource)
        self.register_outputs({"release": release, "objects": len(self.objects)})
