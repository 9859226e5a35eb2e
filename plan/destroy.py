"""What `pulumi destroy` does to a stack, from the plan's dependency graph: the order of the deletes, as the engine
computes it, and what each delete does.

The engine's rules, as pulumi/pulumi has them (pkg/resource/deploy and pkg/resource/graph at commit
1b5949891b3cefcb9974752b24a5ecef0acc86c8):
- **Order.** A destroy marks every resource for deletion (step_generator.go, GenerateDeletes) and deletes them in
  rounds (ScheduleDeletes): a resource goes only after every resource that depends on it has gone. What a resource
  depends on (dependency_graph.go, DependenciesOf): its provider, its parent, its dependencies, its property
  dependencies and its deletedWith target, and, where one of those is a component, that component's descendants
  registered before it (here: those that do not themselves depend on it; the plan document keeps no registration
  order, and the program's dependencies name no component anyway).
- **A protected resource refuses** (step.go, DeleteStep.Apply: deleteProtectedError, checked before anything else).
  The engine goes on past the refusal (step_executor.go, cancelDueToError) but skips every later delete of what the
  refused resource depends on, transitively, its parents included (deployment_executor.go, performPostSteps:
  erroredDeps from TransitiveDependenciesOf).
- **A resource read, not created** (a StackReference) is External: its delete is a no-op (step.go).
- **retainOnDelete**: the delete is a no-op; the resource leaves the state and stays in the cloud (step.go).
- **deletedWith**: when its target is marked for deletion too, the delete is a no-op: the target's deletion takes it
  (step.go, isDeletedWith). Marked, not done: in a destroy every resource is marked, so a resource goes with a target
  that then refuses, leaving the state while it still exists (`stranded`).
- Any other failure cancels what is left; nothing here fails but a refusal.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set

from plan.deploy_time import reachable, waits

DELETED = "deleted"          # the provider deletes it (a component: removed from the state, nothing to call)
GOES_WITH = "goes with"      # deletedWith: its target's deletion takes it; the engine calls nothing
RETAINED = "retained"        # retainOnDelete: it leaves the state and stays in the cloud
REFUSED = "refused"          # protected: `pulumi state unprotect` first
SKIPPED = "skipped"          # a refused resource depends on it, so the engine keeps it
READ = "read"                # External (read, not created): nothing to delete

# Resources the program reads rather than creates (the engine's ReadResource): External in the state.
READ_TYPES = ("pulumi:pulumi:StackReference",)


@dataclass(frozen=True)
class Deletion:
    urn: str
    name: str
    type: str
    round: int                       # 0 first; every delete of a round runs at once, after the round before
    outcome: str
    custom: bool = True              # False: a component, which has nothing of its own to delete
    deleted_with: Optional[str] = None

    @property
    def provider_deletes(self) -> bool:
        """Whether the provider's Delete runs (and, for a Kubernetes object, waits for it to be gone)."""
        return self.outcome == DELETED and self.custom


@dataclass(frozen=True)
class Destroy:
    deletions: Sequence[Deletion]    # in the order the engine runs them

    def of(self, urn: str) -> Deletion:
        return next(d for d in self.deletions if d.urn == urn)

    def named(self, type_token: str, name: str) -> Deletion:
        (found,) = [d for d in self.deletions if d.type == type_token and d.name == name]
        return found

    def with_outcome(self, outcome: str) -> List[Deletion]:
        return [d for d in self.deletions if d.outcome == outcome]

    @property
    def stranded(self) -> List[Deletion]:
        """What leaves the state although it still exists: it went with a target that refused or was skipped."""
        kept = {d.urn for d in self.deletions if d.outcome in (REFUSED, SKIPPED)}
        return [d for d in self.deletions if d.outcome == GOES_WITH and d.deleted_with in kept]


def unprotect(resources: Iterable[Mapping[str, Any]], urns: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
    """`pulumi state unprotect`: copies of `resources` with `protect` off on `urns`, or on all (`--all`)."""
    chosen = None if urns is None else set(urns)
    return [{**r, "protect": False} if chosen is None or r["urn"] in chosen else dict(r) for r in resources]


def dependencies_of(resource: Mapping[str, Any], known: Mapping[str, Mapping[str, Any]]) -> Set[str]:
    """The URNs in `known` the engine makes `resource` outlive: what it waits for on creation (dependencies, parent,
    provider: plan/deploy_time.py waits), its property dependencies and its deletedWith target."""
    found = {urn for urn, _ in waits(resource, known)}
    found |= {urn for urns in (resource.get("propertyDependencies") or {}).values() for urn in urns}
    if resource.get("deletedWith"):
        found.add(resource["deletedWith"])
    return {urn for urn in found if urn in known and urn != resource["urn"]}


def _direct(known: Mapping[str, Mapping[str, Any]]) -> Dict[str, Set[str]]:
    return {urn: dependencies_of(r, known) for urn, r in known.items()}


def _graph(known: Mapping[str, Mapping[str, Any]]) -> Dict[str, Set[str]]:
    """DependenciesOf: the direct dependencies, and a component dependency's descendants."""
    direct = _direct(known)
    children: Dict[str, Set[str]] = {}
    for urn, r in known.items():
        if r.get("parent") in known:
            children.setdefault(r["parent"], set()).add(urn)

    graph = {urn: set(deps) for urn, deps in direct.items()}
    for urn, deps in direct.items():
        parent = known[urn].get("parent")
        # a component it depends on (its parent is no such dependency): that component's descendants too
        for dep in [d for d in deps if d != parent and not known[d].get("custom", True)]:
            graph[urn] |= {d for d in reachable(dep, children) if urn not in reachable(d, direct)}
    return graph


def rounds(resources: Sequence[Mapping[str, Any]]) -> List[List[str]]:
    """The engine's delete rounds (ScheduleDeletes): peel off, round by round, what depends on nothing left, then
    reverse, so that everything depending on a resource is gone before it. Each round sorted by URN."""
    known = {r["urn"]: r for r in resources}
    graph = _graph(known)
    condemned, peeled = set(known), []
    while condemned:
        ready = sorted(urn for urn in condemned if not graph[urn] & condemned)
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(condemned)[:5]}")
        peeled.append(ready)
        condemned -= set(ready)
    return list(reversed(peeled))


def destroy(resources: Sequence[Mapping[str, Any]]) -> Destroy:
    """`pulumi destroy` of the plan document's `resources` (each with urn, type, name, custom, parent, provider,
    dependencies, propertyDependencies, deletedWith, protect, retainOnDelete), as the engine runs it."""
    known = {r["urn"]: r for r in resources}
    direct = _direct(known)
    marked = set(known)            # GenerateDeletes marks every resource of a destroy
    kept: Set[str] = set()         # what the refusals keep: their transitive dependencies (TransitiveDependenciesOf)
    deletions: List[Deletion] = []
    for index, urns in enumerate(rounds(resources)):
        refused = []
        for urn in urns:
            r = known[urn]
            if urn in kept:
                outcome = SKIPPED
            elif r.get("protect"):
                outcome = REFUSED
                refused.append(urn)
            elif r["type"] in READ_TYPES:
                outcome = READ
            elif r.get("retainOnDelete"):
                outcome = RETAINED
            elif r.get("deletedWith") in marked:
                outcome = GOES_WITH
            else:
                outcome = DELETED
            deletions.append(Deletion(urn=urn, name=r["name"], type=r["type"], round=index, outcome=outcome,
                                      custom=bool(r.get("custom", True)), deleted_with=r.get("deletedWith")))
        for urn in refused:        # the next round starts without them
            kept |= reachable(urn, direct)
    return Destroy(deletions=tuple(deletions))
