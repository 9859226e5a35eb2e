"""Shared test fixtures: external validators and the Pulumi mock harness."""
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the repository root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VENV_BIN = Path(sys.executable).parent


def require_tool(name: str) -> str:
    """Path of an external validator (promtool, shellcheck, cloud-init, aws, ...).

    Locally a missing tool skips the test with the reason; under CI (``CI`` set) it fails,
    because `.ci/run` installs every tool and a silent skip there would hide a gap.
    """
    found = shutil.which(name) or shutil.which(name, path=str(VENV_BIN))
    if found:
        return found
    missing(f"{name} is not installed (.ci/run installs it)")


def missing(message: str) -> None:
    """Something a test needs and `.ci/run` provides is absent: skip locally with the reason, fail under CI."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def validate_kubernetes(run: "ProgramRun", version: str) -> int:
    """Validate every Kubernetes object `run` created directly (not Helm releases) with kubernetes-validate
    against Kubernetes `version`'s schemas, strictly (unknown fields fail); returns how many were checked.
    Custom resources have no schema there: the caller checks them against their CRDs."""
    import kubernetes_validate

    checked = 0
    for resource in run.resources:
        if not resource.type.startswith("kubernetes:") or resource.type.startswith("kubernetes:helm.sh"):
            continue
        group = resource.type.split(":")[1].split("/")[0]
        if "." in group and not group.endswith(".k8s.io"):      # a custom resource's API group
            continue
        obj = {key: value for key, value in resource.inputs.items() if not key.startswith("__")}
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    return checked


# --- the Pulumi mock harness (plan/engine.py), shared by every test ----------------------------
from plan.engine import ProgramRun, run_program  # noqa: E402
from plan.stackfile import load_stack_config  # noqa: E402

STACKS = ("prod-us-east-1", "prod-eu-west-1", "dev")


def stack_config(stack: str, overrides=None) -> dict:
    """A stack file's config (Pulumi.yaml defaults applied), with optional key overrides."""
    config = load_stack_config(stack)
    config.update(overrides or {})
    return config


def run_stack(stack: str, overrides=None, account=None) -> ProgramRun:
    """Run __main__.py for a stack file, with optional key overrides and a changed mock account
    (plan.engine.MockAccount; by default the offline plan's)."""
    return run_program(stack_config(stack, overrides), stack=stack, account=account)


def run_component(build, region: str = "us-east-1", stack: str = "test") -> ProgramRun:
    """Run `build()` (a function that creates one component) under the same mocks."""
    return run_program({"aws:region": region}, stack=stack, program=build)


@pytest.fixture(scope="session")
def stack_runs():
    """Each shipped stack run once per session (the runs are read-only for tests)."""
    return {stack: run_stack(stack) for stack in STACKS}
