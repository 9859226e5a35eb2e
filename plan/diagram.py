"""The architecture picture of a planned stack, from its plan document: one box per component with its key
resources (network, cluster, GPU pools with capacity and GPUs, storage, platform, the DR peer region), grouped by
layer, and an arrow from each component to the components that wait for it (the plan's dependency graph, lifted to
components and cut to its transitive reduction so the picture stays readable). Graphviz DOT; SVG through `dot`.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from plan.deploy_time import reachable
from plan.document import LAYER_ORDER, POOL_TYPE, layer, reading_order, top_level

SUFFIXES = (".svg", ".dot")
STACK_REFERENCE = "pulumi:pulumi:StackReference"



class DiagramError(Exception):
    pass


def check_diagram_path(path: Path) -> None:
    """Fail before anything runs when the picture cannot be written: wrong suffix, no folder, no `dot` for SVG."""
    if path.suffix not in SUFFIXES:
        raise DiagramError(f"--diagram {path}: the file name must end in .svg or .dot")
    if not path.parent.is_dir():
        raise DiagramError(f"--diagram {path}: folder {path.parent} does not exist")
    if path.suffix == ".svg" and shutil.which("dot") is None:
        raise DiagramError(f"--diagram {path}: SVG needs the `dot` program of Graphviz, which is not installed "
                           "(Debian: apt-get install graphviz); or write a .dot file")


def write_diagram(document: Mapping[str, Any], path: Path) -> None:
    check_diagram_path(path)
    dot = diagram_dot(document)
    if path.suffix == ".dot":
        path.write_text(dot, encoding="utf-8")
        return
    done = subprocess.run(["dot", "-Tsvg", "-o", str(path)], input=dot.encode("utf-8"), capture_output=True,
                          timeout=120)
    if done.returncode != 0:
        raise DiagramError(f"dot could not lay out the picture: {done.stderr.decode(errors='replace').strip()}")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _kind(type_token: str) -> str:
    return type_token.rsplit(":", 1)[-1]


def _plural(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


class _Facts:
    """A component's custom resources (all descendants), by type, for its label."""

    def __init__(self, resources: List[Mapping[str, Any]]):
        self.resources = resources

    def of(self, kind: str) -> List[Mapping[str, Any]]:
        return [r for r in self.resources if _kind(r["type"]) == kind]

    def first(self, kind: str) -> Mapping[str, Any]:
        found = self.of(kind)
        return found[0]["inputs"] if found else {}

    def releases(self) -> List[str]:
        return [f"{str(r['inputs'].get('chart', r['name'])).rsplit('/', 1)[-1]} {r['inputs'].get('version', '')}".strip()
                for r in self.of("Release")]


def _network(facts: _Facts, document: Mapping[str, Any]) -> List[str]:
    vpc = facts.first("Vpc")
    zones = document["outputs"].get("zones") or []
    endpoints = facts.of("VpcEndpoint")
    lines = [f"VPC {vpc.get('cidrBlock', '?')}",
             f"{_plural(len(facts.of('Subnet')), 'subnet')} in " + (", ".join(z["zoneName"] for z in zones) or "?"),
             f"{_plural(len(facts.of('NatGateway')), 'NAT gateway')}",
             f"{_plural(len(endpoints), 'VPC endpoint')} "
             f"({sum(1 for e in endpoints if e['inputs'].get('vpcEndpointType') == 'Interface')} interface)"]
    if facts.of("VpcAttachment"):
        lines.append(f"transit gateway {facts.first('VpcAttachment').get('transitGatewayId', '')}")
    return lines


def _cluster(facts: _Facts, document: Mapping[str, Any]) -> List[str]:
    eks = facts.first("Cluster")
    access = eks.get("vpcConfig") or {}
    endpoint = " + ".join(kind for kind, on in (("private", access.get("endpointPrivateAccess")),
                                                ("public", access.get("endpointPublicAccess"))) if on) or "?"
    lines = [f"EKS {eks.get('version', '?')}: {document['outputs'].get('clusterName', '')}", f"API endpoint: {endpoint}"]
    for group in facts.of("NodeGroup"):
        scaling = group["inputs"].get("scalingConfig") or {}
        lines.append(f"system nodes: {', '.join(group['inputs'].get('instanceTypes') or [])} "
                     f"x {int(scaling.get('minSize', 0))}-{int(scaling.get('maxSize', 0))}")
    addons = sorted(r["inputs"].get("addonName", r["name"]) for r in facts.of("Addon"))
    if addons:
        lines.append("add-ons: " + ", ".join(addons))
    return lines


def _pool(name: str, document: Mapping[str, Any]) -> List[str]:
    row = next((r for r in document.get("capacity") or [] if r["pool"] == name), None)
    if row is None:
        return []
    efa = ", EFA" if row["efa"] else ""
    return [f"{', '.join(row['instanceTypes'])} ({row['gpusPerNode']} x {row['gpuModel']})",
            f"{row['capacity']}{efa}, {row['workload']}",
            f"nodes {row['minNodes']}/{row['desiredNodes']}/{row['maxNodes']} (min/desired/max)",
            f"GPUs {row['gpusAtDesired']} at desired, {row['gpusAtMax']} at max"]


def _bucket(facts: _Facts, document: Mapping[str, Any]) -> List[str]:
    name = facts.first("Bucket").get("bucket", "")
    row = next((b for b in (document.get("storage") or {}).get("buckets") or [] if b["name"] == name), None)
    lines = [name, "own KMS key, versioned"]
    if row and row.get("replication"):
        lines.append("replicated to the peer" if row["replication"]["role"] == "primary" else "receives the peer's replicas")
    return lines


def _lustre(facts: _Facts, document: Mapping[str, Any]) -> List[str]:
    lustre = (document.get("storage") or {}).get("lustre") or {}
    return [f"FSx for Lustre {lustre.get('capacityGiB', '?'):,} GiB at {lustre.get('throughputPerTiB', '?')} MB/s/TiB",
            f"linked to {lustre.get('importPath', '?')}"] if lustre else []


def _generic(facts: _Facts, document: Mapping[str, Any]) -> List[str]:
    releases = facts.releases()
    lines = [f"Helm: {', '.join(releases)}"] if releases else []
    counts = Counter(_kind(r["type"]) for r in facts.resources if _kind(r["type"]) != "Release")
    lines += [", ".join(f"{n} {kind}" for kind, n in counts.most_common(4))] if counts else []
    return lines


LABELS: Dict[str, Callable[[_Facts, Mapping[str, Any]], List[str]]] = {
    "gpu-cloud:network:Network": _network,
    "gpu-cloud:cluster:EksCluster": _cluster,
    "gpu-cloud:buckets:SecureBucket": _bucket,
    "gpu-cloud:lustre:Lustre": _lustre,
}


def _reduce(edges: Set[Tuple[str, str]]) -> Set[Tuple[str, str]]:
    """Drop u->v when v is reached from u through another successor w (one that does not lead back to u)."""
    succ: Dict[str, Set[str]] = {}
    for u, v in edges:
        succ.setdefault(u, set()).add(v)

    reached = {node: reachable(node, succ) for node in succ}
    return {(u, v) for u, v in edges
            if not any(w != v and v in reached.get(w, ()) and u not in reached.get(w, ()) for w in succ[u])}


def _peer_region(document: Mapping[str, Any], consumers: List[Mapping[str, Any]]) -> Optional[str]:
    """The peer's region, as the ARNs the peer's outputs gave its consumers show it."""
    own = document["region"]
    for resource in consumers:
        for region in re.findall(r"arn:aws[\w-]*:[\w-]+:([a-z]{2}(?:-[a-z]+)+-\d):", str(resource["inputs"])):
            if region != own:
                return region
    return None


def diagram_dot(document: Mapping[str, Any]) -> str:
    resources = document["resources"]
    by_urn = {r["urn"]: r for r in resources}

    # Boxes: every top-level component, and each stack reference (the peer); providers draw nothing.
    boxes = [r for r in resources if top_level(r, by_urn) is r and (not r["custom"] or r["type"] == STACK_REFERENCE)]
    box_of = {r["urn"]: top_level(r, by_urn)["urn"] for r in resources}
    members: Dict[str, List[Mapping[str, Any]]] = {}
    for r in resources:
        if r["custom"]:
            members.setdefault(box_of[r["urn"]], []).append(r)

    edges: Set[Tuple[str, str]] = set()
    for r in resources:
        waits = list(r.get("dependencies") or []) + ([r["provider"]] if r.get("provider") else [])
        for urn in waits:
            if urn in by_urn and box_of[urn] != box_of[r["urn"]]:
                edges.add((box_of[urn], box_of[r["urn"]]))
    boxed = {b["urn"] for b in boxes}
    edges = _reduce({(u, v) for u, v in edges if u in boxed and v in boxed})

    ids = {b["urn"]: f"n{i}" for i, b in enumerate(sorted(boxes, key=lambda b: b["urn"]))}
    layers: Dict[str, List[str]] = {}
    peers = sorted((b for b in boxes if b["type"] == STACK_REFERENCE), key=lambda b: b["name"])
    for box in sorted((b for b in boxes if b["type"] != STACK_REFERENCE), key=reading_order(document)):
        if box["type"] == POOL_TYPE:
            facts_lines = _pool(box["name"], document)
        else:
            facts_lines = LABELS.get(box["type"], _generic)(_Facts(members.get(box["urn"], [])), document)
        label = "\n".join([box["name"], f"({_kind(box['type'])})"] + facts_lines)
        layers.setdefault(layer(box["type"]), []).append(
            f"    {ids[box['urn']]} [label={_quote(label)}];")

    lines = ["digraph gpu_cloud {",
             f"  label={_quote(document['stack'] + ' (' + document['region'] + '): components and what waits for what')};",
             "  labelloc=t; rankdir=LR; newrank=true; compound=true; fontname=Helvetica;",
             "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=Helvetica, fontsize=10];",
             "  edge [color=gray40, arrowsize=0.7];"]
    for i, group in enumerate(sorted(layers, key=lambda name: LAYER_ORDER.index(name))):
        lines += [f"  subgraph cluster_{i} {{", f"    label={_quote(group)}; style=\"rounded,filled\"; "
                  "fillcolor=gray95; color=gray70;"] + layers[group] + ["  }"]
    for peer in peers:
        consumers = [by_urn[v] for u, v in edges if u == peer["urn"]] + \
                    [r for r in resources if peer["urn"] in (r.get("dependencies") or [])]
        region = _peer_region(document, consumers)
        name = str(peer["inputs"].get("name", peer["name"]))
        label = "\n".join(["DR peer region" + (f" {region}" if region else ""), f"stack {name}"])
        lines.append(f"  {ids[peer['urn']]} [label={_quote(label)}, style=\"rounded,dashed\"];")
    peer_urns = {p["urn"] for p in peers}
    for u, v in sorted(edges):
        style = " [style=dashed, label=\"peer outputs\", fontsize=9]" if u in peer_urns else ""
        lines.append(f"  {ids[u]} -> {ids[v]}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def diagram_argument(text: str) -> Path:
    """argparse type of `--diagram`: the path, checked before the plan runs (a bad one is a usage error)."""
    import argparse

    path = Path(text)
    try:
        check_diagram_path(path)
    except DiagramError as error:
        raise argparse.ArgumentTypeError(str(error).split(": ", 1)[1]) from None
    return path
