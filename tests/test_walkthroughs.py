"""What the README invites a user to do keeps the project green: its "Add a stack" and "Add a GPU pool" steps, done
on a copy of the checkout exactly as the README shows them, give a stack that plans, and the suite's checks that
enumerate the stacks in stacks/ still pass with it there.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_docs import READER, _checkout_copy, _expect_lines, blocks

README = ROOT / "README.md"
STACK = "dev-alice"


def _readme_stack_block() -> str:
    """The README's "Add a stack" commands: the `run` block that writes the new stack file."""
    (block,) = [b for b in blocks(README) if b.kind == "run" and f"stacks/Pulumi.{STACK}.yaml" in b.text]
    return block.text


def _readme_pool() -> str:
    """The README's "Add a GPU pool" entry, as the page shows it."""
    (block,) = [b for b in blocks(README) if b.language == "yaml" and b.text.startswith("- name:")]
    return block.text


def _readme_budget() -> str:
    """The README's budget that acknowledges the pool's missing price."""
    (block,) = [b for b in blocks(README) if b.language == "yaml" and b.text.startswith("gpu-cloud:budget:")]
    return block.text


def replace_budget(stack_file: Path, budget: str) -> None:
    """Put `budget` (a `gpu-cloud:budget:` key and its lines) in place of the stack file's own, as a user does."""
    lines = stack_file.read_text(encoding="utf-8").splitlines()
    start = lines.index("  gpu-cloud:budget:")
    end = start + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    lines[start:end] = ["  " + line for line in budget.rstrip("\n").splitlines()]
    stack_file.write_text("\n".join(lines) + "\n", encoding="utf-8")


def append_pool(stack_file: Path, pool: str) -> None:
    """Append an entry to `gpu-cloud:nodePools`, as a user does in an editor: after the list's last line, indented
    as a list item under the key."""
    lines = stack_file.read_text(encoding="utf-8").splitlines()
    start = lines.index("  gpu-cloud:nodePools:") + 1
    end = start
    while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
        end += 1
    lines[end:end] = ["    " + line if line.strip() else line for line in pool.rstrip("\n").splitlines()]
    stack_file.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}, **READER}


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """A copy of the checkout after the README's "Add a stack", then its "Add a GPU pool" on that stack."""
    copy = _checkout_copy(tmp_path_factory.mktemp("walk"))
    (copy / "stacks" / f"Pulumi.{STACK}.yaml").unlink(missing_ok=True)     # the README writes it afresh
    added = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_stack_block()], cwd=copy, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    assert f"gpu-cloud plan: stack {STACK} (project gpu-cloud, region us-east-1)" in added.stdout
    append_pool(copy / "stacks" / f"Pulumi.{STACK}.yaml", _readme_pool())
    refused = subprocess.run([sys.executable, "-m", "plan", STACK, "--quiet"], cwd=copy, env=_env(),
                             capture_output=True, text=True, timeout=600)
    replace_budget(copy / "stacks" / f"Pulumi.{STACK}.yaml", _readme_budget())
    copy.joinpath("refused.txt").write_text(f"{refused.returncode}\n{refused.stdout}{refused.stderr}")
    return copy


def test_the_added_stack_deploys_from_a_laptop_not_through_devs_transit_gateway(walked):
    from plan.stackfile import CliLoader

    config = yaml.load((walked / "stacks" / f"Pulumi.{STACK}.yaml").read_text(), Loader=CliLoader)["config"]
    cluster, network = config["gpu-cloud:cluster"], config["gpu-cloud:network"]
    assert cluster["deployerAccess"] == "public" and cluster["publicAccessCidrs"] == [f"{READER['MY_IP']}/32"]
    assert "privateAccessCidrs" not in cluster and "transitGateway" not in network
    assert network["cidr"] == "10.97.0.0/18"          # its own range, not dev's 10.96.0.0/18
    assert [p["name"] for p in config["gpu-cloud:nodePools"]] == ["dev-gpu-spot", "batch-h200-spot"]


def test_the_readme_stack_step_needs_the_readers_address(tmp_path):
    """Without MY_IP the step stops at once and says what to set, rather than write a stack nobody can deploy from."""
    env = {k: v for k, v in _env().items() if k != "MY_IP"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_stack_block()], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "set MY_IP to your public IPv4 address" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_readme_pool_is_refused_for_its_missing_price_until_the_budget_acknowledges_it(walked, tmp_path):
    code, refused = walked.joinpath("refused.txt").read_text().split("\n", 1)
    assert code == "2" and "Traceback" not in refused
    assert "gpu-cloud:nodePools[1] (pool batch-h200-spot): no on-demand price for p5e.48xlarge in us-east-1" in refused
    assert "python scripts/refresh_prices.py --write" in refused
    assert "add batch-h200-spot to gpu-cloud:budget.unpriced" in refused
    document_path = tmp_path / "plan.json"
    result = subprocess.run([sys.executable, "-m", "plan", STACK, "--json", str(document_path)], cwd=walked,
                            env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads(document_path.read_text())
    assert document["policy"]["violations"] == []
    assert [u["name"] for u in document["cost"]["unpriced"] if u["acknowledged"]] == ["batch-h200-spot"]
    assert ("  unpriced  1 acknowledged unpriced (batch-h200-spot), left out of every total (listed under Hourly "
            "cost)") in result.stdout.splitlines()
    assert re.search(r"^  batch-h200-spot +p5en\.48xlarge", result.stdout, re.M)     # in the capacity table


def test_the_checks_that_enumerate_stacks_pass_with_the_added_stack(walked):
    """The suite's own stack-enumerating tests, run in the copy that holds the new stack, and the docs block that
    prints the stack list."""
    checks = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_stackfile.py", "tests/test_plan.py::test_missing_stack_file_is_a_config_error_that_lists_the_stacks",
         "tests/test_plan.py::test_help_lists_the_stacks_the_exit_codes_and_an_example"],
        cwd=walked, env=_env(), capture_output=True, text=True, timeout=600)
    assert checks.returncode == 0, checks.stdout[-4000:] + checks.stderr[-2000:]
    from plan.stackfile import known_stacks

    assert f"stacks: dev, {STACK}, prod-eu-west-1" in subprocess.run(
        [sys.executable, "-m", "plan", "--help"], cwd=walked, capture_output=True, text=True, timeout=120).stdout
    assert STACK not in known_stacks()             # the checkout itself is untouched
    found = blocks(ROOT / "docs" / "plan.md")         # the page's blocks, run in the copy
    (i, block), = [(i, b) for i, b in enumerate(found) if b.kind == "run" and "--help" in b.text]
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=walked, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and f"{STACK}" in result.stdout
    _expect_lines(found[i + 1].text, result.stdout, found[i + 1])


# docs/how-to.md "Add a region", done on a copy for ap-south-1 (the page's own example of a refused region): the
# catalog, the zones and the prices, then a stack there. What the page says to write, written as a user would.
REGION, REGION_STACK, REGION_ZONES = "ap-south-1", "dev-mumbai", ["aps1-az1", "aps1-az2"]


def _write_stack(copy: Path) -> None:
    """Step 5: the stack, from dev: the region, its zones, no transit gateway (dev's hub is in us-east-1), deployed
    from the reader's address."""
    config = yaml.safe_load((copy / "stacks" / "Pulumi.dev.yaml").read_text(encoding="utf-8"))["config"]
    config["aws:region"] = REGION
    network = config["gpu-cloud:network"]
    network["zones"] = REGION_ZONES
    network.pop("transitGateway", None)
    cluster = config["gpu-cloud:cluster"]
    cluster.pop("privateAccessCidrs", None)
    cluster.update(deployerAccess="public", publicAccessCidrs=[f"{READER['MY_IP']}/32"])
    (copy / "stacks" / f"Pulumi.{REGION_STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False),
                                                                encoding="utf-8")


def _add_region(copy: Path) -> None:
    """Steps 1 to 3: the catalog, the zones and the prices."""
    catalog = copy / "decisions" / "catalog" / "catalog.yaml"
    text = catalog.read_text(encoding="utf-8")
    # The type dev's pool uses gets the region, without a sourced price.
    head, rest = text.split("\n  g6.12xlarge:\n", 1)
    rest = rest.replace("      us-east-1: ", f"      {REGION}: {{onDemandUsd: null}}\n      us-east-1: ", 1)
    catalog.write_text(head + "\n  g6.12xlarge:\n" + rest, encoding="utf-8")
    zones = copy / "decisions" / "network" / "zones.yaml"
    zones.write_text(zones.read_text(encoding="utf-8").replace(
        "\nregions:\n", f"\nregions:\n  {REGION}: {{zoneIdPrefix: aps1, eksUnsupportedZoneIds: [],\n"
                        f"    gpuZoneIds: [{', '.join(REGION_ZONES)}]}}\n", 1), encoding="utf-8")
    # A prices entry with nothing sourced yet: every fixed cost is a listed gap.
    prices = copy / "decisions" / "cost" / "prices.yaml"
    prices.write_text(prices.read_text(encoding="utf-8").replace("\nregions:\n", f"\nregions:\n  {REGION}: {{}}\n", 1),
                      encoding="utf-8")


def _plan(copy: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plan", REGION_STACK], cwd=copy, env=_env(), capture_output=True,
                          text=True, timeout=300)


def test_the_add_a_region_steps_give_a_stack_that_plans_with_its_gaps_listed(tmp_path):
    copy = _checkout_copy(tmp_path)
    _write_stack(copy)
    refused = _plan(copy)
    assert refused.returncode == 2 and "'ap-south-1' has no GPU instance types in the catalog" in refused.stderr
    _add_region(copy)
    # step 5: the budget sees the pool and the fixed costs the region has no price for, and says how to acknowledge
    unpriced = _plan(copy)
    assert unpriced.returncode == 2, unpriced.stdout[-3000:] + unpriced.stderr[-3000:]
    mistakes = re.findall(r"^  - (gpu-cloud:[^ :]+)", unpriced.stderr, re.M)
    assert mistakes == ["gpu-cloud:nodePools[0]", "gpu-cloud:budget.unpriced"], unpriced.stderr
    names = [name for listed in re.findall(r"add ([a-z0-9, -]+) to gpu-cloud:budget.unpriced", unpriced.stderr)
             for name in listed.split(", ")]
    assert names[0] == "dev-gpu-spot" and "nat-gateways" in names
    stack_file = copy / "stacks" / f"Pulumi.{REGION_STACK}.yaml"
    config = yaml.safe_load(stack_file.read_text(encoding="utf-8"))
    config["config"]["gpu-cloud:budget"]["unpriced"] = names
    stack_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    result = _plan(copy)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"gpu-cloud plan: stack {REGION_STACK} (project gpu-cloud, region {REGION})" in result.stdout
    assert re.search(r"^  total \(incomplete: \d+ items? unpriced\)", result.stdout, re.M), result.stdout[-2000:]
    assert "Policy (pack gpu-cloud v1.0.0), as an update shows it: no violations" in result.stdout
