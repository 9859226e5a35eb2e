"""The architecture picture (`python -m plan STACK --diagram PATH`)."""
import html
import re
import shutil
from pathlib import Path

import pytest

from plan import diagram
from plan.__main__ import main
from plan.document import build_document
from plan.stackfile import load_stack
from tests.conftest import missing


def document(stack_runs, stack):
    _, spec = load_stack(stack)
    run = stack_runs[stack]
    return build_document(spec, run, {"violations": [], "skipped": "test"}, run.warnings)


def boxes(dot: str) -> dict:
    """node id -> its label's lines."""
    return {node: label.split("\\n") for node, label in re.findall(r'^\s+(n\d+) \[label="((?:[^"\\]|\\.)*)"', dot, re.M)}


def box(dot: str, first_line: str):
    return next((node, lines) for node, lines in boxes(dot).items() if lines[0] == first_line)


def test_prod_picture_shows_each_layer_with_its_key_resources(stack_runs):
    dot = diagram.diagram_dot(document(stack_runs, "prod-us-east-1"))
    _, network = box(dot, "network")
    assert "VPC 10.64.0.0/16" in network and "3 NAT gateways" in network
    assert any(line.startswith("transit gateway tgw-") for line in network)
    _, cluster = box(dot, "cluster")
    assert "EKS 1.35: gpu-cloud-prod-us-east-1" in cluster and "API endpoint: private" in cluster
    _, h100 = box(dot, "train-h100")
    assert h100[2:] == ["p5.48xlarge (8 x H100)", "reserved, EFA, training", "nodes 4/4/4 (min/desired/max)",
                        "GPUs 32 at desired, 32 at max"]
    _, lustre = box(dot, "lustre")
    assert "FSx for Lustre 4,800 GiB at 500 MB/s/TiB" in lustre
    assert "replicated to the peer" in box(dot, "checkpoints")[1]
    peer, peer_lines = box(dot, "DR peer region eu-west-1")
    assert peer_lines[1] == "stack acme/gpu-cloud/prod-eu-west-1"
    replication, _ = box(dot, "replication")
    assert f"{peer} -> {replication} [style=dashed" in dot
    for layer in ("network", "cluster", "GPU node pools", "storage", "platform"):
        assert f'label="{layer}"' in dot


def test_links_follow_what_waits_for_what(stack_runs):
    dot = diagram.diagram_dot(document(stack_runs, "prod-us-east-1"))
    network, cluster, pool = box(dot, "network")[0], box(dot, "cluster")[0], box(dot, "train-h100")[0]
    assert f"{network} -> {cluster};" in dot
    assert f" -> {network};" not in dot        # the network waits for no component
    # Only the transitive reduction is drawn: the pools wait for the network, but through the cluster.
    assert f"{network} -> {pool};" not in dot
    datasets, lustre = box(dot, "datasets")[0], box(dot, "lustre")[0]
    assert f"{datasets} -> {lustre};" in dot


def test_dev_has_no_peer_and_no_file_system(stack_runs):
    labels = [lines[0] for lines in boxes(diagram.diagram_dot(document(stack_runs, "dev"))).values()]
    assert "dev-gpu-spot" in labels and "lustre" not in labels
    assert not any(label.startswith("DR peer") for label in labels)


def test_bad_paths_fail_before_the_plan_runs(tmp_path, monkeypatch, capsys):
    def no_run(*args, **kwargs):
        raise AssertionError("the plan ran")

    monkeypatch.setattr("plan.engine.run_program", no_run)
    for path, why in ((tmp_path / "picture.png", "must end in .svg or .dot"),
                      (tmp_path / "no-such-folder" / "picture.dot", "does not exist")):
        with pytest.raises(SystemExit) as exited:
            main(["dev", "--diagram", str(path)])
        assert exited.value.code == 4 and why in capsys.readouterr().err      # a usage error
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        main(["dev", "--diagram", str(tmp_path / "picture.svg")])
    assert "apt-get install graphviz" in capsys.readouterr().err


def test_cli_writes_the_dot_file(tmp_path, capsys):
    path = tmp_path / "dev.dot"
    assert main(["dev", "--no-policy", "--diagram", str(path)]) == 0
    assert path.read_text().startswith("digraph gpu_cloud {") and f"written to {path}" in capsys.readouterr().err


def test_svg_through_graphviz(stack_runs, tmp_path: Path):
    if shutil.which("dot") is None:
        missing("Graphviz's dot is not installed (.ci/run installs the Debian package graphviz)")
    path = tmp_path / "prod.svg"
    diagram.write_diagram(document(stack_runs, "prod-us-east-1"), path)
    svg = html.unescape(path.read_text())   # dot writes "-" as &#45;
    assert "<svg" in svg and "train-h100" in svg and "DR peer region eu-west-1" in svg


def test_the_committed_picture_shows_the_current_plan(stack_runs, tmp_path: Path):
    # The README shows docs/architecture-prod-us-east-1.svg: its words must be what the plan draws today (the
    # layout may differ between Graphviz versions; the boxes, their facts and the arrows' labels may not).
    if shutil.which("dot") is None:
        missing("Graphviz's dot is not installed (.ci/run installs the Debian package graphviz)")
    fresh = tmp_path / "prod.svg"
    diagram.write_diagram(document(stack_runs, "prod-us-east-1"), fresh)

    def words(path: Path) -> list:
        return sorted(html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text()))

    committed = Path(__file__).resolve().parent.parent / "docs/architecture-prod-us-east-1.svg"
    assert words(committed) == words(fresh), "redraw it: python -m plan prod-us-east-1 --no-policy " \
                                             "--diagram docs/architecture-prod-us-east-1.svg"
