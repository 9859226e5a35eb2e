"""The policy pack offline: a plan document turned into the arguments the Pulumi engine gives CrossGuard.

`pulumi preview --policy-pack policy` sends each resource to the pack's Analyze (one ResourceValidationArgs per
resource and policy) and the whole stack to AnalyzeStack (StackValidationArgs of PolicyResource objects, parents
and dependencies linked). This module builds the same objects from the document's resources (engine-view inputs),
calls the same validate functions (policy/policies.py) and records what they report the way the engine's
diagnostics name it: policyName, policyPackName, policyPackVersion, enforcementLevel, message (the policy's
description, a newline, what it reported), description, urn. It follows pulumi_policy 1.21's
_PolicyAnalyzerServicer: per-policy config and enforcement level, remediate counted as mandatory, disabled skipped,
a value unknown during preview an advisory note, not_applicable() recorded apart.

Each view (plan/views.py: update, preview, first-preview) gives the policies what the engine would in that
operation: resource policies a resource's inputs, stack policies its outputs, with the values that operation
cannot know as the engine's unknown sentinel, and a resource under an unconfigured provider as an empty map.
"""
from __future__ import annotations

import difflib
import inspect
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pulumi_policy import (EnforcementLevel, PolicyCustomTimeouts, PolicyProviderResource, PolicyResource,
                           PolicyResourceOptions, ResourceValidationArgs, ResourceValidationPolicy,
                           StackValidationArgs, StackValidationPolicy)
from pulumi_policy.deserialize import deserialize_properties
from pulumi_policy.policy import _NotApplicableError
from pulumi_policy.proxy import UnknownValueError, unknown_checking_proxy

from plan.document import resources_in_reading_order
from plan.views import VIEWS, ViewFacts, view_inputs, view_outputs
from policy.policies import PACK_ENFORCEMENT, PACK_NAME, POLICIES, initial_config

ROOT = Path(__file__).resolve().parent.parent
LEVELS = {level.value: level for level in EnforcementLevel}
REPORTED_LEVELS = ("advisory", "mandatory")      # what a diagnostic can carry (remediate reports as mandatory)


class PolicyConfigError(ValueError):
    """A pack config (the --policy-pack-config file's format) that names an unknown policy, level or key."""


def _unknown(what: str, word: Any, valid) -> str:
    """`'gpu-pool-instance-type' is not a policy of the pack; did you mean 'gpu-pool-instance-types'? policies: ...`"""
    valid = list(valid)
    close = difflib.get_close_matches(str(word), valid, n=1) if isinstance(word, str) else []
    return (f"{word!r} is not {what}" + (f"; did you mean {close[0]!r}?" if close else "")
            + f" (valid: {', '.join(valid)})")


class PolicyViewError(ValueError):
    """A view the document cannot give (it was written without the preview views, or the name is not a view)."""


def pack_version() -> str:
    import yaml

    return str(yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text(encoding="utf-8"))["version"])


def resolve_config(policies, user: Optional[Mapping[str, Any]] = None,
                   initial: Optional[Mapping[str, Any]] = None) -> Dict[str, Tuple[EnforcementLevel, Dict[str, Any]]]:
    """Each policy's (enforcement level, properties): the pack's initial config, then the user's on top, as the
    CLI merges them. A value is a level ("advisory") or an object ({"enforcementLevel": ..., key: value}); the key
    "all" sets every policy's level."""
    names = {p.name: p for p in policies}
    levels: Dict[str, EnforcementLevel] = {}
    properties: Dict[str, Dict[str, Any]] = {name: {} for name in names}
    for source, config in (("initial config", initial or {}), ("policy config", user or {})):
        if not isinstance(config, Mapping):
            raise PolicyConfigError(f"{source} is not an object")
        for name, value in config.items():
            if name != "all" and name not in names:
                raise PolicyConfigError(f"{source}: " + _unknown("a policy of the pack", name,
                                                                   ["all"] + sorted(names)))
            level, props = (value, {}) if isinstance(value, str) else (
                (value.get("enforcementLevel"), {k: v for k, v in value.items() if k != "enforcementLevel"})
                if isinstance(value, Mapping) else (None, None))
            if props is None:
                raise PolicyConfigError(f"{source}: {name}: expected a level or an object")
            if level is not None:
                if level not in LEVELS:
                    raise PolicyConfigError(f"{source}: {name}: enforcement level " + _unknown(
                        "a level", level, LEVELS))
                for target in (names if name == "all" else [name]):
                    levels[target] = LEVELS[level]
            if props:
                if name == "all":
                    raise PolicyConfigError(f"{source}: \"all\" takes only an enforcement level")
                schema = names[name].config_schema
                known = ["enforcementLevel"] + (sorted(schema.properties) if schema is not None else [])
                unknown = [k for k in props if k not in known]
                if unknown:
                    raise PolicyConfigError(f"{source}: {name}: " + "; ".join(
                        _unknown("a key of this policy", k, known) for k in unknown))
                properties[name].update(props)
    return {name: (levels.get(name, policy.enforcement_level or PACK_ENFORCEMENT), properties[name])
            for name, policy in names.items()}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def _seconds(duration: Optional[str]) -> float:
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in _DURATION.findall(duration or ""))


def _props(inputs: Mapping[str, Any]):
    return unknown_checking_proxy(deserialize_properties(dict(inputs)))


def _options(resource: Mapping[str, Any]) -> PolicyResourceOptions:
    timeouts = resource.get("customTimeouts") or {}
    return PolicyResourceOptions(
        protect=bool(resource.get("protect")), ignore_changes=list(resource.get("ignoreChanges") or []),
        delete_before_replace=resource.get("deleteBeforeReplace"), aliases=list(resource.get("aliases") or []),
        custom_timeouts=PolicyCustomTimeouts(_seconds(timeouts.get("create")), _seconds(timeouts.get("update")),
                                             _seconds(timeouts.get("delete"))),
        additional_secret_outputs=[], parent=resource.get("parent"))


def view_facts(document: Mapping[str, Any], view: str) -> Optional[ViewFacts]:
    """What `view` changes from the update, as the document recorded it (None for the update itself)."""
    if view not in VIEWS:
        raise PolicyViewError(f"policy view {view!r} is not one of {', '.join(VIEWS)}")
    if view == "update":
        return None
    recorded = (document.get("policyViews") or {}).get(view)
    if recorded is None:
        raise PolicyViewError(f"the plan document records no {view} view (written by an older plan, or with "
                              "--no-policy): plan the stack again with --json")
    return ViewFacts.from_document(view, recorded)


def engine_arguments(document: Mapping[str, Any], view: str = "update"):
    """(the resources the view registers, one ResourceValidationArgs factory per resource, the stack's
    PolicyResource list), as the engine builds them for `view`, in reading order, so that violations name pools in
    the stack file's order."""
    facts = view_facts(document, view)
    resources = [r for r in resources_in_reading_order(document) if facts is None or r["urn"] not in facts.absent]
    providers = {r["urn"]: PolicyProviderResource(r["type"], _props(view_inputs(r, facts)), r["urn"], r["name"])
                 for r in resources if r["type"].startswith("pulumi:providers:")}

    def provider_of(resource):
        return providers.get(resource.get("provider") or "")

    # pulumi_policy's analyzer proxies a resource's props anew for each policy (policy.py, Analyze); the policies only
    # read them, so one proxy per resource serves them all, at a 24th of the cost (a CRD's schema is 10,000 nodes).
    proxied: Dict[str, Any] = {}

    def resource_args(resource, config):
        if resource["urn"] not in proxied:
            proxied[resource["urn"]] = _props(view_inputs(resource, facts))
        return ResourceValidationArgs(resource["type"], proxied[resource["urn"]], resource["urn"],
                                      resource["name"], _options(resource), provider_of(resource), config, {})

    stack = [PolicyResource(r["type"], _props(view_outputs(r, facts)), r["urn"], r["name"], _options(r),
                            provider_of(r), None, [], {}) for r in resources]
    by_urn = {r.urn: r for r in stack}
    for raw, resource in zip(resources, stack):
        resource.parent = by_urn.get(raw.get("parent"))
        resource.dependencies.extend(by_urn[d] for d in raw.get("dependencies") or [] if d in by_urn)
        resource.property_dependencies.update({key: [by_urn[d] for d in urns if d in by_urn]
                                               for key, urns in (raw.get("propertyDependencies") or {}).items()})
    return resources, resource_args, stack


def _await(result) -> None:
    if inspect.isawaitable(result):
        import asyncio

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(result)
        finally:
            loop.close()


def run_pack(document: Mapping[str, Any], user_config: Optional[Mapping[str, Any]] = None,
             policies=None, view: str = "update") -> Dict[str, Any]:
    """The pack's verdict on a plan document in one view: {"pack", "version", "view", "violations",
    "notApplicable"}."""
    policies = POLICIES if policies is None else policies
    section = document.get("cost") or {}
    settings = resolve_config(policies, user_config, initial_config(section.get("budgetMaxHourlyUsd"),
                                                                    section.get("budgetUnpriced") or (),
                                                                    section.get("budgetAssumed")))
    version = pack_version()
    resources, resource_args, stack = engine_arguments(document, view)
    violations: List[Dict[str, Any]] = []
    not_applicable: List[Dict[str, str]] = []

    def reporter(policy, level, default_urn):
        def report(message: str, urn: Optional[str] = None) -> None:
            violations.append({
                "policyName": policy.name, "policyPackName": PACK_NAME, "policyPackVersion": version,
                "description": policy.description,
                "message": policy.description + (f"\n{message}" if message else ""),
                "enforcementLevel": level.value, "urn": default_urn or urn or ""})
        return report

    def call(policy, level, args, default_urn):
        try:
            _await(policy.validate(args, reporter(policy, level, default_urn)))
        except UnknownValueError as error:
            violations.append({
                "policyName": policy.name, "policyPackName": PACK_NAME, "policyPackVersion": version,
                "description": policy.description,
                "message": f"can't run policy '{policy.name}' from policy pack '{PACK_NAME}@v{version}' during "
                           f"preview: {error.message}", "enforcementLevel": "advisory", "urn": ""})
        except _NotApplicableError as error:
            not_applicable.append({"policyName": policy.name, "reason": error.reason or ""})

    for policy in policies:
        level, properties = settings[policy.name]
        if level == EnforcementLevel.DISABLED:
            continue
        if level == EnforcementLevel.REMEDIATE:
            level = EnforcementLevel.MANDATORY
        if isinstance(policy, ResourceValidationPolicy):
            for resource in resources:
                call(policy, level, resource_args(resource, dict(properties)), resource["urn"])
        elif isinstance(policy, StackValidationPolicy):
            call(policy, level, StackValidationArgs(stack, dict(properties), {}), None)
    return {"pack": PACK_NAME, "version": version, "view": view, "violations": violations,
            "notApplicable": list({json.dumps(n, sort_keys=True): n for n in not_applicable}.values())}


def load_config(path: Path) -> Mapping[str, Any]:
    """A pack config file (the format of `pulumi preview --policy-pack-config`)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PolicyConfigError(f"cannot read policy config {path}: {error}") from error
    if not isinstance(config, Mapping):
        raise PolicyConfigError(f"policy config {path} is not a JSON object")
    return config


def mandatory(violations: List[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    return [v for v in violations if v.get("enforcementLevel") == "mandatory"]
