"""Checkov finds nothing unexplained on prod-us-east-1's plan: its `kubernetes` framework, run on every Kubernetes
object the program writes itself, fails no check that docs/security.md's Checkov table does not list for that object,
and the table lists nothing no check needs.

Checkov pins boto3 at a version the test tools contradict, so it lives in its own environment (requirements-checkov.txt,
`make test` installs it into .venv/checkov); locally a missing one skips, under CI it fails."""
from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess

import pytest
import yaml

from decisions.platform.release_manifest import RELEASE_ANNOTATION
from tests.conftest import ROOT, missing

STACK = "prod-us-east-1"
CHECKOV = ROOT / ".venv" / "checkov" / "bin" / "checkov"
SECTION = "## Checkov"
# What the issue found unfixed, now held: each check passes on each object (checkov's own resource names).
HELD = {
    "CKV_K8S_29": ("CronJob.training.nccl-efa-start-train-h100", "Deployment.kube-system.gpu-node-repair"),  # context
    "CKV_K8S_31": ("CronJob.training.nccl-efa-start-train-h100", "Deployment.kube-system.gpu-node-repair"),  # seccomp
    "CKV_K8S_40": ("Deployment.inference.triton", "Deployment.kube-system.gpu-node-repair"),               # UID
    "CKV_K8S_9": ("Deployment.kube-system.gpu-node-repair", "Deployment.inference.triton"),                # readiness
}


def checkov_binary() -> str:
    found = str(CHECKOV) if CHECKOV.exists() else shutil.which("checkov")
    if not found:
        missing("checkov is not installed (`make test` installs requirements-checkov.txt into .venv/checkov)")
    return found


def own_objects(document):
    """(file name, object) of every Kubernetes object a plan document holds that the program writes itself: not Helm
    releases (values only), not manifest components, not server-side patches, not a vendor's release manifest's."""
    for resource in document["resources"]:
        kind = resource["type"]
        if not kind.startswith("kubernetes:") or kind.startswith(("kubernetes:helm.sh", "kubernetes:yaml/")):
            continue
        if kind.endswith("Patch"):
            continue
        obj = {key: value for key, value in resource["inputs"].items() if not key.startswith("__")}
        if RELEASE_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {}):
            continue
        yield re.sub(r"[^A-Za-z0-9_.-]", "_", resource["name"]), obj


def scan(directory) -> dict:
    """Checkov's JSON report of `directory`, offline."""
    done = subprocess.run([checkov_binary(), "--directory", str(directory), "--framework", "kubernetes",
                           "--skip-download", "--output", "json"], capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]      # 1: some check failed
    report = json.loads(done.stdout)
    [report] = report if isinstance(report, list) else [report]
    assert report["check_type"] == "kubernetes", report.get("check_type")
    return report


def allow_list():
    """{check ID: [object patterns]} from docs/security.md's Checkov table, each row with its reason."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    allowed = {}
    for line in text[start:end].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `CKV"):
            continue
        check, objects, reason = re.findall(r"`([^`]+)`", cells[0])[0], re.findall(r"`([^`]+)`", cells[1]), cells[2]
        assert check not in allowed and objects and len(reason) > 80, line
        allowed[check] = objects
    return allowed


@pytest.fixture(scope="module")
def report(plan_documents, tmp_path_factory):
    """Checkov's report on the objects of the plan document `python -m plan prod-us-east-1 --json` writes."""
    directory = tmp_path_factory.mktemp("checkov")
    for number, (name, obj) in enumerate(own_objects(plan_documents[STACK])):   # names are unique per type only
        (directory / f"{number:03d}-{name}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
    return scan(directory)


def results(report, kind):
    return {(check["check_id"], check["resource"]) for check in report["results"][kind]}


def test_every_failed_check_is_listed_with_its_reason(report):
    allowed = allow_list()
    unexplained = sorted((check, resource) for check, resource in results(report, "failed_checks")
                         if not any(fnmatch.fnmatchcase(resource, pattern) for pattern in allowed.get(check, ())))
    assert unexplained == [], f"Checkov findings docs/security.md {SECTION!r} does not list: {unexplained}"


def test_the_table_lists_nothing_no_check_needs(report):
    failed = results(report, "failed_checks")
    stale = sorted((check, pattern) for check, patterns in allow_list().items() for pattern in patterns
                   if not any(c == check and fnmatch.fnmatchcase(resource, pattern) for c, resource in failed))
    assert stale == []


@pytest.mark.parametrize("check", sorted(HELD))
def test_what_the_issue_found_now_passes(report, check):
    """The security context and seccomp of the NCCL starter and the repair controller, Triton's and the controller's
    UID, the readiness probes: each a passed check on each object, so none is simply absent from the scan."""
    passed = results(report, "passed_checks")
    assert {(check, resource) for resource in HELD[check]} <= passed
