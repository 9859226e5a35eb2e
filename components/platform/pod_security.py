"""decisions/platform/pod_security.py's security contexts and volumes as pulumi_kubernetes' typed Args (the decisions
stay there)."""
from __future__ import annotations

from typing import Any, Mapping

import pulumi_kubernetes as kubernetes


def security_context(context: Mapping[str, Any]) -> kubernetes.core.v1.SecurityContextArgs:
    """A container's context from decisions.platform.pod_security.container_security_context."""
    capabilities = context["capabilities"]
    return kubernetes.core.v1.SecurityContextArgs(
        run_as_non_root=context.get("runAsNonRoot"), run_as_user=context.get("runAsUser"),
        run_as_group=context.get("runAsGroup"), read_only_root_filesystem=context["readOnlyRootFilesystem"],
        allow_privilege_escalation=context["allowPrivilegeEscalation"],
        capabilities=kubernetes.core.v1.CapabilitiesArgs(drop=capabilities["drop"], add=capabilities.get("add")),
        seccomp_profile=kubernetes.core.v1.SeccompProfileArgs(type=context["seccompProfile"]["type"]))


def pod_security_context(context: Mapping[str, Any]) -> kubernetes.core.v1.PodSecurityContextArgs:
    """A pod's context from decisions.platform.pod_security.pod_security_context."""
    return kubernetes.core.v1.PodSecurityContextArgs(
        run_as_non_root=context["runAsNonRoot"], run_as_user=context.get("runAsUser"),
        run_as_group=context.get("runAsGroup"),
        seccomp_profile=kubernetes.core.v1.SeccompProfileArgs(type=context["seccompProfile"]["type"]))


def empty_dir(name: str, size_limit: str) -> kubernetes.core.v1.VolumeArgs:
    """A writable path's emptyDir, bounded."""
    return kubernetes.core.v1.VolumeArgs(name=name, empty_dir=kubernetes.core.v1.EmptyDirVolumeSourceArgs(
        size_limit=size_limit))
