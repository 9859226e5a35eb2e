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
        # Helm releases and manifest files (yaml/v2) are not objects themselves.
        if not resource.type.startswith("kubernetes:") or resource.type.startswith(("kubernetes:helm.sh",
                                                                                    "kubernetes:yaml/")):
            continue
        if resource.type.endswith("Patch"):     # a server-side apply patch: part of an object, not an object
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


def _parent(keys, path):
    for part in path[:-1]:
        keys = keys[part]
    return keys


def setting(*path, value):
    """A change to stack keys: set the key at `path` (names and list indexes) to `value`."""
    def change(keys):
        _parent(keys, path)[path[-1]] = value
    return change


def dropping(*path):
    """A change to stack keys: remove the key at `path`."""
    def change(keys):
        del _parent(keys, path)[path[-1]]
    return change


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


@pytest.fixture(scope="session")
def stack_views(stack_runs):
    """Each shipped stack's preview views (plan/views.py), as the plan records them: {stack: {view: ViewFacts}}."""
    from plan.preview import preview_facts
    from plan.views import PREVIEW_VIEWS

    return {stack: {view: preview_facts(view, stack_config(stack), stack_runs[stack]) for view in PREVIEW_VIEWS}
            for stack in STACKS}


@pytest.fixture(scope="session")
def plan_documents(stack_runs, stack_views):
    """Each shipped stack's plan document as `python -m plan STACK --json` writes it (a JSON round trip, every
    view recorded, no verdict yet). Shared: copy before changing one."""
    import json

    from plan.document import build_document
    from plan.stackfile import load_stack

    return {stack: json.loads(json.dumps(build_document(load_stack(stack)[1], stack_runs[stack], {"violations": []},
                                                        views=stack_views[stack]))) for stack in STACKS}


# --- the plan CLI for several stacks in one process -----------------------------------------------------------
# Importing the Pulumi SDKs is most of a `python -m plan` run (~4 of ~5.5 s), so tests that only need the
# CLI's output for each shipped stack plan them all in one fresh process: `main(argv)` of `python -m plan`
# per argv, its stdout and stderr captured separately. Exit-code and traceback contracts keep their own
# `python -m plan` processes.
_PLAN_MANY = r"""
import contextlib, io, json, sys
from plan.__main__ import main
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(results, f)
"""


class PlanProcess:
    """`python -m plan ARGV` for each of `argvs`, in one background process (start several to run them side by
    side); `results()` waits and gives one CompletedProcess per argv."""

    def __init__(self, argvs, results_path: Path, env=None, timeout: float = 300):
        import json
        import subprocess

        self.argvs = [[str(a) for a in argv] for argv in argvs]
        self.path, self.timeout = Path(results_path), timeout
        self.proc = subprocess.Popen([sys.executable, "-c", _PLAN_MANY, str(self.path), json.dumps(self.argvs)],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def results(self):
        import json
        import subprocess

        try:
            stdout, stderr = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        assert self.proc.returncode == 0, f"plan process failed (exit {self.proc.returncode}):\n{stdout}\n{stderr}"
        found = json.loads(self.path.read_text(encoding="utf-8"))
        return [subprocess.CompletedProcess([sys.executable, "-m", "plan", *argv], r["returncode"], r["stdout"],
                                            r["stderr"]) for argv, r in zip(self.argvs, found)]

