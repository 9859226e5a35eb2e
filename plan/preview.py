"""The program run as `pulumi preview` runs it, answered as the engine answers in a preview view (plan/views.py).

The SDK runs in dry-run mode, so unknown values stay unknown and applies on them do not run, exactly as under the
real engine; `PreviewMonitor` stands in for the engine's answers to each registration (the rules and their sources
are in plan/views.py).
"""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Mapping, Set, Tuple

from google.protobuf import json_format, struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _sync_await

from plan.engine import ProgramRun, RecordingMonitor, RegisteredResource, _redact, property_dependencies, run_program
from plan.views import (PREVIEW_VIEWS, PROVIDER_PREFIX, UNKNOWN, Path, ViewFacts, all_unknown, computed_outputs,
                        merged, provider_urn, unknown_paths)

STACK_TYPE = "pulumi:pulumi:Stack"


class PreviewMonitor(RecordingMonitor):
    """Answers registrations as the engine does in a preview where `existing` resources are deployed (their state is
    the update run's) and the rest are created; records what the view cannot know."""

    def __init__(self, mocks, known: ProgramRun, existing: FrozenSet[str]):
        super().__init__(mocks)
        self.known = {r.urn: r for r in known.resources}
        self.existing = existing
        self.unconfigured: Set[str] = set()
        self.unknown: Dict[str, Tuple[Path, ...]] = {}

    def RegisterResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == STACK_TYPE:
            return resource_pb2.RegisterResourceResponse(urn=urn)
        known = self.known.get(urn)
        if known is None:
            raise AssertionError(f"{urn} is registered in a preview but not in the update: the plan cannot tell what "
                                 "the engine would answer for it")
        raw = json_format.MessageToDict(request.object, preserving_proto_field_name=True)
        paths = tuple(unknown_paths(raw))      # a secret that is unknown counts where it stands
        if paths:
            self.unknown[urn] = paths
        provider = provider_urn(request.provider)
        if request.type.startswith(PROVIDER_PREFIX):
            if any(unknown_paths(value) for key, value in raw.items() if key != "version"):
                self.unconfigured.add(urn)
            created = urn not in self.existing
            answer, rid = raw, (UNKNOWN if created else known.id)
        elif provider in self.unconfigured:
            answer, rid = {}, ""
        elif urn in self.existing:
            state = json_format.MessageToDict(_sync_await(rpc.serialize_properties(known.state, {})),
                                              preserving_proto_field_name=True)
            answer, rid = merged(state, raw), known.id
        else:
            answer, rid = merged(raw, all_unknown(computed_outputs(known.inputs, known.state))), ""
        self.resources[urn] = self.ResourceRegistration(urn, rid, known.state)
        self.registrations.append(RegisteredResource(
            urn=urn, type=request.type, name=request.name, custom=bool(request.custom),
            parent=request.parent or None, provider=request.provider or None, inputs=_redact(raw),
            dependencies=tuple(sorted(request.dependencies)), protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete), state={},
            property_dependencies=property_dependencies(request)))
        obj = struct_pb2.Struct()
        json_format.ParseDict(answer, obj)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=rid, object=obj)


def existing_in(view: str, run: ProgramRun) -> FrozenSet[str]:
    """What a view takes as deployed: nothing on a new stack; on an existing one, every provider and, transitively,
    everything it depends on (the resources its configuration is built from)."""
    if view != "preview":
        return frozenset()
    by_urn = {r.urn: r for r in run.resources}
    found: Set[str] = set()
    todo = [r.urn for r in run.resources if r.type.startswith(PROVIDER_PREFIX)]
    while todo:
        urn = todo.pop()
        if urn in found or urn not in by_urn:
            continue
        found.add(urn)
        todo.extend(by_urn[urn].dependencies)
    return frozenset(found)


def preview_facts(view: str, stack_config: Mapping[str, Any], run: ProgramRun, **run_options) -> ViewFacts:
    """Run the program as `view`'s preview would, after `run` (the update view of the same config)."""
    if view not in PREVIEW_VIEWS:
        raise ValueError(f"view {view!r} is not one of {', '.join(PREVIEW_VIEWS)}")
    existing = existing_in(view, run)
    monitors: List[PreviewMonitor] = []

    def monitor(mocks):
        monitors.append(PreviewMonitor(mocks, run, existing))
        return monitors[-1]

    run_program(stack_config, stack=run.stack, project=run.project, monitor=monitor, preview=True, **run_options)
    seen = {r.urn for r in monitors[0].registrations}
    return ViewFacts(view=view, existing=existing, unconfigured_providers=frozenset(monitors[0].unconfigured),
                     unknown_inputs=monitors[0].unknown,
                     absent=frozenset(r.urn for r in run.resources if r.urn not in seen and r.type != STACK_TYPE))
