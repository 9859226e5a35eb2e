"""What the Pulumi engine shows the policy pack: on an update, on a later preview, and on a new stack's first preview.

The pack is judged by what the engine hands it, and that depends on the operation. From the engine's source
(pulumi/pulumi at commit 1b5949891b of 2026-08-21, line numbers at that commit; `git describe`: v3.259.0 and 14
commits, so first released in v3.260.0). The CLI the program runs under is Pulumi.yaml's `requiredPulumiVersion`,
which the CLI enforces; its floor is the pinned Python SDK's release (tests/test_views.py), newer than the source read
here: re-read the lines below at the floor's tag when a mirror has it.

- Resource policies get a resource's **inputs** after the provider's Check (`pkg/resource/deploy/step_generator.go`
  `analyzeAll`, line 3450: `Properties: resource.FromResourcePropertyMap(inputs)`, line 3465); stack policies get
  every resource's **outputs**, its state after the step (`AnalyzeResources`, line 3518: "Unlike Analyze,
  AnalyzeStack is called on the final outputs of each resource"). A provider is shown with its inputs. Both go out
  with `KeepUnknowns: true` (`pkg/resource/plugin/analyzer_plugin.go` lines 307 and 351), so a value the preview
  cannot know reaches the pack as the unknown sentinel, which pulumi_policy's proxy turns into an
  UnknownValueError when a policy reads it. The engine also gives each stack resource its property dependencies.
- A resource a preview creates has the outputs of the provider's preview Create: its inputs, with what the
  provider computes (IDs, ARNs, endpoints, host names) unknown. Its ID is empty, so the program sees it unknown too,
  and every input built from those values is unknown in turn (the SDK's own dry-run rules, run here for real).
- A provider whose configuration holds an unknown is not configured (`pkg/resource/plugin/provider_plugin.go`
  `Configure`, line 1054: "If any are unknown, do not configure the underlying plugin"): its Check returns the
  inputs as they are (`Check`, line 1168) and its preview Create "hand[s] back an empty property map" (`Create`,
  line 1403). So on a new stack, where the Kubernetes provider's kubeconfig waits for the cluster, every
  Kubernetes object (Helm releases included) reaches the stack policies as `{}`. A provider created in a preview
  has an unknown ID (`pkg/resource/deploy/providers/registry.go` line 947).
- A mandatory violation fails a preview as it fails an update (`pkg/resource/deploy/analyze_snapshot.go`
  `analyzeResource` sets sawError in a dry run too; `AnalyzeResources` likewise).

The three views:

- `update`: everything known: inputs for resource policies, inputs and what the provider computed for stack ones.
- `preview`: an existing stack previewing changes. Its providers are configured: they and everything their
  configuration is built from (the EKS cluster, and what the cluster was built from) exist. Every other resource
  is taken as one this preview creates, the worst case of a later change: any bucket, pool or object may be new.
- `first-preview`: a new stack. Everything is created; the Kubernetes provider's configuration is unknown, so
  everything under it is an empty map.

The views are got by running the program again under `pulumi preview`'s rules (plan/preview.py), and recorded in
the plan document as what differs from the update (`ViewFacts`), so that `--policy-check` can judge any view of a
written document. This module is what the pack sees; it needs no Pulumi SDK.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import copy
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple, Union

VIEWS = ("update", "preview", "first-preview")
PREVIEW_VIEWS = VIEWS[1:]
VIEW_NAMES = {"update": "an update", "preview": "a later preview", "first-preview": "a new stack's first preview"}
# The engine's unknown string, as it travels to a language SDK or an analyzer (pulumi/pulumi
# sdk/go/common/resource/plugin/rpc.go UnknownStringValue; the Python SDK's rpc.UNKNOWN, pulumi_policy's
# UNKNOWN_STRING_VALUE).
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
PROVIDER_PREFIX = "pulumi:providers:"
# How a secret travels: {SIG_KEY: SECRET_SIG, "value": ...} (sdk/go/common/resource/properties.go).
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
PathPart = Union[str, int]
Path = Tuple[PathPart, ...]


@dataclass(frozen=True)
class ViewFacts:
    """How one preview view differs from the update: which resources exist before it, which providers it cannot
    configure, which input values it cannot know, and which resources it does not register at all (made inside an
    apply of a value it cannot know)."""
    view: str
    existing: FrozenSet[str] = frozenset()
    unconfigured_providers: FrozenSet[str] = frozenset()
    unknown_inputs: Mapping[str, Tuple[Path, ...]] = field(default_factory=dict)
    absent: FrozenSet[str] = frozenset()

    def to_document(self) -> Dict[str, Any]:
        return {"existing": sorted(self.existing), "unconfiguredProviders": sorted(self.unconfigured_providers),
                "unknownInputs": {urn: [list(p) for p in paths] for urn, paths in sorted(self.unknown_inputs.items())},
                "absent": sorted(self.absent)}

    @classmethod
    def from_document(cls, view: str, recorded: Mapping[str, Any]) -> "ViewFacts":
        return cls(view=view, existing=frozenset(recorded["existing"]),
                   unconfigured_providers=frozenset(recorded["unconfiguredProviders"]),
                   unknown_inputs={urn: tuple(tuple(p) for p in paths)
                                   for urn, paths in recorded["unknownInputs"].items()},
                   absent=frozenset(recorded["absent"]))


# --- values -----------------------------------------------------------------------------------------------------
def unknown_paths(value: Any, at: Path = ()) -> List[Path]:
    """Where the unknown sentinel sits in a JSON value. A secret is one value (the plan document shows it as
    "[secret]"): unknown where what it wraps is."""
    if value == UNKNOWN:
        return [at]
    if isinstance(value, Mapping) and value.get(SIG_KEY) == SECRET_SIG:
        return [at] if unknown_paths(value.get("value")) else []
    if isinstance(value, Mapping):
        return [p for key, item in value.items() for p in unknown_paths(item, at + (key,))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in unknown_paths(item, at + (i,))]
    return []


def with_unknowns(value: Any, paths: Iterable[Path]) -> Any:
    """A copy of a JSON value with each path replaced by the unknown sentinel."""
    result = copy.deepcopy(value)
    for path in paths:
        if not path:
            return UNKNOWN
        node = result
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = UNKNOWN
    return result


def computed_outputs(inputs: Mapping[str, Any], state: Mapping[str, Any]) -> Dict[str, Any]:
    """What a provider adds to a resource's inputs to make its state: keys the inputs do not have, at any depth of
    nested objects (an EKS cluster's vpcConfig.clusterSecurityGroupId beside the subnets it was given)."""
    added: Dict[str, Any] = {}
    for key, value in state.items():
        if key not in inputs:
            added[key] = value
        elif isinstance(value, Mapping) and isinstance(inputs[key], Mapping):
            nested = computed_outputs(inputs[key], value)
            if nested:
                added[key] = nested
    return added


def merged(base: Any, extra: Any) -> Any:
    """`base` with `extra`'s keys laid over it, objects merged key by key."""
    if isinstance(base, Mapping) and isinstance(extra, Mapping):
        result = dict(base)
        for key, value in extra.items():
            result[key] = merged(base[key], value) if key in base else value
        return result
    return extra


def all_unknown(computed: Any) -> Any:
    """The same shape with every leaf the unknown sentinel: what a preview Create leaves of computed values."""
    if isinstance(computed, Mapping):
        return {key: all_unknown(value) for key, value in computed.items()}
    return UNKNOWN


def provider_urn(reference: Optional[str]) -> Optional[str]:
    """A provider reference is `URN::ID`."""
    return reference.rsplit("::", 1)[0] if reference else None


# --- the props each policy kind sees ----------------------------------------------------------------------------
def view_inputs(resource: Mapping[str, Any], facts: Optional[ViewFacts]) -> Dict[str, Any]:
    """A resource's inputs (plan document form) as resource policies see them in a view."""
    paths = facts.unknown_inputs.get(resource["urn"], ()) if facts else ()
    return with_unknowns(resource["inputs"], paths) if paths else resource["inputs"]


def view_outputs(resource: Mapping[str, Any], facts: Optional[ViewFacts]) -> Dict[str, Any]:
    """A resource's outputs (plan document form) as stack policies see them in a view."""
    computed = resource.get("computedOutputs") or {}
    if resource["type"].startswith(PROVIDER_PREFIX):      # the registry hands back a provider's inputs
        return view_inputs(resource, facts)
    if facts is None:
        return merged(resource["inputs"], computed)
    if resource.get("provider") in facts.unconfigured_providers:     # the document names a provider by URN
        return {}
    inputs = view_inputs(resource, facts)
    if resource["urn"] in facts.existing:
        return merged(merged(resource["inputs"], computed), inputs)
    return merged(inputs, all_unknown(computed))
