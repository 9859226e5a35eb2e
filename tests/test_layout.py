"""The layout shows the architecture: the decision layer and the components are grouped by the same layers, the
decision layer stays free of Pulumi, and nothing but tests/ is named like a test suite (code-map and coverage tools
leave such folders out as tests, and readers take them for tests)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Mapping, Set

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


def decision_imports(sources: Mapping[str, str]) -> Dict[str, Set[str]]:
    """Module -> the decisions modules it imports, at module level, in functions or under TYPE_CHECKING alike: each is
    a dependency a reader follows. `sources`: module name (decisions.x.y) -> its source (absolute imports only, as
    decisions/ writes them)."""
    graph: Dict[str, Set[str]] = {}
    for module, source in sources.items():
        imported: Set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[module] = {name for name in imported if name in sources and name != module}
    return graph


def import_cycle(graph: Mapping[str, Set[str]]) -> List[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph has none (depth-first search for a back edge)."""
    done: Set[str] = set()
    path: List[str] = []

    def visit(module: str) -> List[str]:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        path.append(module)
        for imported in sorted(graph[module]):
            cycle = visit(imported)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return []


def _decision_sources() -> Dict[str, str]:
    sources = {}
    for path in (ROOT / "decisions").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text()
    return sources


def test_the_decision_layer_has_no_import_cycle():
    """Each layer's rules live in that layer and config/ composes them without being imported back
    (docs/architecture.md): no decisions module reaches itself through its imports."""
    cycle = import_cycle(decision_imports(_decision_sources()))
    assert cycle == [], "import cycle in decisions/: " + " -> ".join(cycle)


def test_the_cycle_check_sees_every_kind_of_import():
    planted = {
        "decisions.config.validate": "from decisions.platform import kueue\n",
        "decisions.platform.kueue": "if TYPE_CHECKING:\n    from decisions.config.validate import ResolvedPool\n",
        "decisions.storage.lustre": "def f():\n    import decisions.storage.buckets\n",
        "decisions.storage.buckets": "from decisions.storage.lustre import X\n",
        "decisions.nodes.pools": "from decisions.storage import lustre\n",
    }
    graph = decision_imports(planted)
    assert graph["decisions.platform.kueue"] == {"decisions.config.validate"}
    assert import_cycle(graph) == ["decisions.config.validate", "decisions.platform.kueue", "decisions.config.validate"]
    del planted["decisions.config.validate"]
    assert import_cycle(decision_imports(planted)) == ["decisions.storage.lustre", "decisions.storage.buckets",
                                                       "decisions.storage.lustre"]
    del planted["decisions.storage.buckets"]
    assert import_cycle(decision_imports(planted)) == []
