"""The layout shows the architecture: the decision layer and the components are grouped by the same layers, the
decision layer stays free of Pulumi, and nothing but tests/ is named like a test suite (code-map and coverage tools
leave such folders out as tests, and readers take them for tests)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import List, Set

from tests.conftest import ROOT

# Folder and module names that common tooling and readers take for test suites: pytest's default python_files
# (test_*.py, *_test.py), RSpec-style spec/ and specs/, Jest's __tests__, and the usual test/testing folders.
TEST_SUITE_NAME = re.compile(r"^(tests?|testing|specs?|__tests__|test_.*|.*_tests?|.*_spec|spec_.*)$")
LAYERS = ("config", "catalog", "network", "nodes", "storage", "platform", "observability", "serving", "cost")


def tracked_files() -> List[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [Path(name) for name in listed.decode().split("\0") if name]


def named_like_tests(paths: List[Path]) -> Set[str]:
    """Folders and Python modules outside tests/ whose name reads as a test suite."""
    found = set()
    for path in paths:
        if path.parts[0] == "tests":
            continue
        for depth, part in enumerate(path.parts[:-1]):
            if TEST_SUITE_NAME.match(part):
                found.add("/".join(path.parts[:depth + 1]) + "/")
        if path.suffix == ".py" and TEST_SUITE_NAME.match(path.stem):
            found.add(str(path))
    return found


def test_only_tests_is_named_like_a_test_suite():
    assert named_like_tests(tracked_files()) == set()


def test_the_name_check_catches_what_tools_take_for_tests():
    planted = [Path(p) for p in ("spec/model.py", "decisions/specs/x.yaml", "plan/__tests__/a.js",
                                 "jobs/test_nccl.py", "userdata/render_test.py", "tests/test_model.py",
                                 "decisions/config/validate.py", "docs/testing.md")]
    assert named_like_tests(planted) == {"spec/", "decisions/specs/", "plan/__tests__/", "jobs/test_nccl.py",
                                         "userdata/render_test.py"}


def _sub_packages(root: Path) -> Set[str]:
    return {p.parent.name for p in root.glob("*/__init__.py")}


def test_the_decision_layer_is_grouped_by_the_architectures_layers():
    decisions = ROOT / "decisions"
    assert _sub_packages(decisions) == set(LAYERS)
    loose = sorted(p.name for p in decisions.glob("*.py") if p.name not in ("__init__.py", "requirements.py"))
    assert loose == [], f"modules of decisions/ outside a layer: {loose}"
    for layer in LAYERS:
        docstring = ast.get_docstring(ast.parse((decisions / layer / "__init__.py").read_text()))
        assert docstring, f"decisions/{layer}/__init__.py says what the layer holds"


def test_components_group_by_the_same_layers():
    components = ROOT / "components"
    assert _sub_packages(components) <= set(LAYERS)
    assert len(_sub_packages(components)) >= 4


def test_the_decision_layer_imports_no_pulumi():
    """What the plan, the policy pack and the tests call without mocks: no Pulumi SDK behind it."""
    importing = []
    for path in sorted((ROOT / "decisions").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importing += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name.split(".")[0].startswith("pulumi") or name.split(".")[0] == "components"]
    assert importing == []
