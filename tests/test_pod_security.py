"""Every pod spec gpu-cloud itself creates is hardened (decisions/platform/pod_security.py): each rule over every
rendered pod spec of every shipped stack and over the `python -m jobs` templates, with each exception's reason written
in WAIVERS."""
from __future__ import annotations

import argparse
import copy
import json
from types import SimpleNamespace

import pytest

from decisions.platform import pod_security
from decisions.platform.pod_security import API_CALLERS, RULES, WAIVERS, Waiver, check_pod_spec
from decisions.platform.release_manifest import RELEASE_ANNOTATION
from tests.conftest import STACKS, validate_kubernetes

# Pods the program starts through third-party Helm charts and operator manifests: their vendors pin and harden them,
# and their values are checked against the pinned charts (tests/chart_values.py). Resource name -> why excepted.
THIRD_PARTY = {
    "gpu-operator-release": "NVIDIA GPU operator chart: its operands are privileged node agents (docs/security.md)",
    "gpu-operator-efa-device-plugin": "AWS EFA device plugin chart: a privileged node agent",
    "training-operators-mpi-operator": "the MPI Operator's release manifest (v0.8.0)",
    "training-operators-jobset": "JobSet's release manifest (v0.12.0)",
    "training-operators-kueue": "Kueue's chart",
    "lustre-csi-driver": "the FSx for Lustre CSI driver chart: a privileged node plugin",
    "monitoring-release": "kube-prometheus-stack's chart",
    "lb-controller-release": "the AWS Load Balancer Controller's chart",
    "autoscaler-release": "cluster-autoscaler's chart",
    "inference-prometheus-adapter": "prometheus-adapter's chart",
    "node-drain-nth": "aws-node-termination-handler's chart",
}
WORKLOAD_KINDS = ("Deployment", "Job", "CronJob", "DaemonSet", "StatefulSet", "Pod", "ReplicaSet")


def pod_spec_of(kind: str, obj: dict) -> dict:
    spec = obj["spec"]
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def workload_of(kind: str, obj: dict) -> str:
    """Which workload a registered pod template is, from its labels; an unknown one fails the test (classify it)."""
    template = obj["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else obj["spec"]["template"]
    labels = template["metadata"]["labels"]
    name, component = labels.get("app.kubernetes.io/name"), labels.get("app.kubernetes.io/component")
    known = {("triton", None): "triton", ("gpu-node-repair", None): "node-repair",
             ("kueue-webhook-ready", None): "kueue-webhook-probe",
             ("nccl-acceptance", "within-node"): "nccl-nvlink",
             ("nccl-acceptance", "across-nodes-start"): "nccl-efa-start"}
    assert (name, component) in known, f"an unclassified pod spec: {kind} with labels {labels}"
    return known[(name, component)]


def mpijob_pods(prefix: str, mpijob: dict):
    for role, replica in mpijob["spec"]["mpiReplicaSpecs"].items():
        yield f"{prefix}-{role.lower()}", replica["template"]["spec"]


def stack_pod_specs(run):
    """(where, workload, pod spec) of every pod template the program registers itself, the MPIJob the scheduled
    across-node check creates included."""
    for resource in run.resources:
        kind = resource.type.rsplit(":", 1)[-1]
        if not resource.type.startswith("kubernetes:") or kind not in WORKLOAD_KINDS:
            continue
        if RELEASE_ANNOTATION in resource.inputs["metadata"].get("annotations", {}):
            continue    # a release manifest's own workload: THIRD_PARTY
        workload = workload_of(kind, resource.inputs)
        pod = pod_spec_of(kind, resource.inputs)
        yield f"{run.stack}/{resource.name}", workload, pod
        for container in pod["containers"]:
            for env in container.get("env") or []:
                if env["name"] == "MPIJOB":
                    for role, spec in mpijob_pods("nccl-efa", json.loads(env["value"])):
                        yield f"{run.stack}/{resource.name} MPIJOB", role, spec


def template_pod_specs():
    """(where, workload, pod spec) of the `python -m jobs` templates: the single-node Job on every pool of the queue
    of every stack, the multi-node ones on every EFA training pool."""
    from decisions.platform import kueue
    from jobs.__main__ import render
    from plan.stackfile import load_stack

    for stack in STACKS:
        spec = load_stack(stack)[1]
        for pool in spec.pools:
            if not kueue.flavors([pool], spec.catalog):
                continue
            common = dict(stack=stack, stack_file=None, pool=pool.spec.name, image="example.com/train:1",
                          program=["train.py"], name="job", checkpoint_uri="", scratch=None,
                          max_restarts=3, workers=2, nodes=2, env=["A=1"], volume=["models:/models:ro"], gpus=None,
                          mig_profile=None)
            job = render(argparse.Namespace(command="job", **common))
            yield f"{stack}/{pool.spec.name} python -m jobs job", "single-node-job", job["spec"]["template"]["spec"]
            if pool.spec.gpu_sharing.mode != "none" or pool.spec.max_nodes < 2:
                continue
            # pytorch-job on every pool of whole GPUs (over TCP without EFA), the MPI ones on EFA pools only
            for command in ("nccl-acceptance", "mpijob", "pytorch-job") if pool.efa else ("pytorch-job",):
                manifest = render(argparse.Namespace(command=command, **common))
                where = f"{stack}/{pool.spec.name} python -m jobs {command}"
                if command == "pytorch-job":
                    job = manifest["spec"]["replicatedJobs"][0]["template"]
                    yield where, "pytorch-jobset", job["spec"]["template"]["spec"]
                else:
                    prefix = "nccl-efa" if command == "nccl-acceptance" else "training-mpijob"
                    for role, pod in mpijob_pods(prefix, manifest):
                        yield where, role, pod


@pytest.fixture(scope="module")
def pod_specs(stack_runs):
    found = [entry for stack in STACKS for entry in stack_pod_specs(stack_runs[stack])]
    return found + list(template_pod_specs())


def test_every_workload_is_found(pod_specs):
    """The pod specs the rules run over: each kind the project creates, so a rule cannot pass over nothing."""
    assert {workload for _, workload, _ in pod_specs} == {
        "triton", "node-repair", "kueue-webhook-probe", "nccl-nvlink", "nccl-efa-start", "nccl-efa-launcher",
        "nccl-efa-worker", "training-mpijob-launcher", "training-mpijob-worker", "pytorch-jobset", "single-node-job"}


def test_every_pod_spec_holds_every_rule(pod_specs):
    broken = [f"{where}: {problem}" for where, workload, pod in pod_specs for problem in check_pod_spec(workload, pod)]
    assert broken == []


def _declared_and_used(pod_specs):
    """Every (workload, container, rule) WAIVERS declares, and those some pod spec needs (pod_security.waivers_in_use:
    without the waiver, check_pod_spec reports a new problem of its rule for its container)."""
    used = {key for _, workload, pod in pod_specs for key in pod_security.waivers_in_use(workload, pod)}
    declared = {(w, c, r) for w, by_container in pod_security.WAIVERS.items() for c, rules in by_container.items()
                for r in rules}
    return declared, used


def test_every_waiver_is_used_and_has_a_reason(pod_specs):
    declared, used = _declared_and_used(pod_specs)
    assert declared == used
    for workload, container, rule in declared:
        assert rule in RULES and len(WAIVERS[workload][container][rule].reason) > 40
    assert all(len(reason) > 40 for reason in API_CALLERS.values())
    assert set(API_CALLERS) <= {workload for _, workload, _ in pod_specs}


def test_a_waiver_no_pod_needs_is_not_used(pod_specs, monkeypatch):
    """Triton runs as nobody: a non-root waiver for it is stale; the NCCL workers' sshd runs as root, yet their
    seccomp profile is RuntimeDefault, so a seccomp waiver beside their used ones is stale too, and so is a "*"
    seccomp waiver for the repair controller, whose containers all run RuntimeDefault."""
    planted = {("triton", "triton", "non-root"), ("nccl-efa-worker", "worker", "seccomp"),
               ("node-repair", "*", "seccomp")}
    waivers = {**WAIVERS, "triton": {"triton": {"non-root": Waiver("x" * 50)}},
               "nccl-efa-worker": {"worker": {**WAIVERS["nccl-efa-worker"]["worker"], "seccomp": Waiver("x" * 50)}},
               "node-repair": {"*": {"seccomp": Waiver("x" * 50)}}}
    monkeypatch.setattr(pod_security, "WAIVERS", waivers)
    declared, used = _declared_and_used(pod_specs)
    assert declared - used == planted
    assert ("nccl-efa-worker", "worker", "non-root") in used


def test_a_waiver_for_every_container_is_used_when_a_container_needs_it(pod_specs, monkeypatch):
    """The single-node Job's waivers, restated for "*": each still lets its container pass, so each is used."""
    monkeypatch.setattr(pod_security, "WAIVERS", {**WAIVERS, "single-node-job": {"*": WAIVERS["single-node-job"]["job"]}})
    declared, used = _declared_and_used(pod_specs)
    assert declared == used
    assert {("single-node-job", "*", rule) for rule in WAIVERS["single-node-job"]["job"]} <= used


def test_third_party_pods_are_exactly_the_listed_charts_and_manifests(stack_runs):
    found = {r.name for stack in STACKS for r in stack_runs[stack].resources
             if r.type.startswith("kubernetes:helm.sh") or r.type == "gpu-cloud:release_manifest:ReleaseManifest"}
    assert found == set(THIRD_PARTY)
    # ... and every workload those manifests hold is one of theirs, not the program's
    for stack in STACKS:
        run = stack_runs[stack]
        manifests = {r.urn for r in run.resources if r.type == "gpu-cloud:release_manifest:ReleaseManifest"}
        annotated = {r.urn for r in run.resources if r.type.startswith("kubernetes:")
                     and RELEASE_ANNOTATION in (r.inputs.get("metadata") or {}).get("annotations", {})}
        assert annotated == {r.urn for r in run.resources if r.parent in manifests}


def test_the_hardened_workloads_validate_against_kubernetes(stack_runs):
    """The changed objects (every pod-creating object the program registers) against Kubernetes' own schemas."""
    for stack in STACKS:
        workloads = [r for r in stack_runs[stack].resources
                     if r.type.startswith("kubernetes:") and r.type.rsplit(":", 1)[-1] in WORKLOAD_KINDS]
        assert validate_kubernetes(SimpleNamespace(resources=workloads), "1.35") == len(workloads) >= 2


# --- each rule catches its bug ---------------------------------------------------------------------------------------
def _hardened():
    return {"automountServiceAccountToken": False,
            "securityContext": pod_security.pod_security_context(),
            "containers": [{"name": "app", "image": pod_security.image("python"),
                            "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
                            "securityContext": pod_security.container_security_context()}],
            "initContainers": [{"name": "init", "image": pod_security.image("python"),
                                "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
                                "securityContext": pod_security.container_security_context()}]}


def _bug(change):
    pod = _hardened()
    change(pod)
    return pod


BUGS = {
    "root": ("non-root", lambda p: p["containers"][0]["securityContext"].update(runAsUser=0, runAsNonRoot=False)),
    "low uid": ("non-root", lambda p: p["initContainers"][0]["securityContext"].update(runAsUser=1000)),
    "no seccomp": ("seccomp", lambda p: (p["securityContext"].pop("seccompProfile"),
                                         p["containers"][0]["securityContext"].pop("seccompProfile"))),
    "unconfined": ("seccomp", lambda p: p["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"})),
    "keeps NET_RAW": ("capabilities", lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
        drop=["NET_RAW"])),
    "adds a capability": ("capabilities", lambda p: p["initContainers"][0]["securityContext"]["capabilities"].update(
        add=["IPC_LOCK"])),
    "escalation": ("capabilities", lambda p: p["containers"][0]["securityContext"].update(
        allowPrivilegeEscalation=True)),
    "writable root": ("read-only-root", lambda p: p["containers"][0]["securityContext"].update(
        readOnlyRootFilesystem=False)),
    "token by default": ("service-account-token", lambda p: p.pop("automountServiceAccountToken")),
    "projected token": ("service-account-token", lambda p: p.update(volumes=[{"name": "t", "projected": {
        "sources": [{"serviceAccountToken": {"path": "token"}}]}}])),
    "no memory limit": ("resources", lambda p: p["initContainers"][0]["resources"].pop("limits")),
    "no cpu request": ("resources", lambda p: p["containers"][0]["resources"].pop("requests")),
    "by tag": ("image-digest", lambda p: p["containers"][0].update(image="public.ecr.aws/docker/library/python:3.13")),
}


def test_a_hardened_pod_passes():
    assert check_pod_spec("example", _hardened()) == []


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_rule_catches_its_bug(bug):
    rule, change = BUGS[bug]
    found = check_pod_spec("example", _bug(change))
    assert found and all(problem.startswith(f"{rule}: ") for problem in found), found


def test_a_waiver_excuses_only_its_workload_container_and_rule(monkeypatch):
    waivers = {"example": {"app": {"read-only-root": Waiver("a reason long enough to be a written reason, really")}}}
    monkeypatch.setattr(pod_security, "WAIVERS", waivers)
    writable = lambda name: _bug(lambda p: [c["securityContext"].update(readOnlyRootFilesystem=False)  # noqa: E731
                                            for c in p["containers"] + p["initContainers"] if c["name"] == name])
    assert check_pod_spec("example", writable("app")) == []
    assert check_pod_spec("other", writable("app")) != []
    assert check_pod_spec("example", writable("init")) != []
    assert check_pod_spec("example", _bug(BUGS["root"][1])) != []


@pytest.mark.parametrize("uid, holds", [(9999, False), (10000, True), (65534, True), (0, False)])
def test_non_root_starts_at_uid_10000(uid, holds):
    pod = _bug(lambda p: p["containers"][0]["securityContext"].update(runAsUser=uid))
    assert (check_pod_spec("example", pod) == []) is holds


def test_a_capability_waiver_allows_its_capabilities_and_still_needs_drop_all(monkeypatch):
    monkeypatch.setattr(pod_security, "WAIVERS", {"example": {"app": {"capabilities": Waiver(
        "x" * 50, capabilities=("IPC_LOCK",))}}})
    caps = lambda **c: _bug(lambda p: p["containers"][0]["securityContext"].update(capabilities=c))  # noqa: E731
    assert check_pod_spec("example", caps(drop=["ALL"], add=["IPC_LOCK"])) == []
    assert check_pod_spec("example", caps(drop=["ALL"], add=["IPC_LOCK", "NET_ADMIN"])) != []
    assert check_pod_spec("example", caps(add=["IPC_LOCK"])) != []


def test_an_api_caller_keeps_its_token(monkeypatch):
    pod = _bug(lambda p: p.pop("automountServiceAccountToken"))
    monkeypatch.setattr(pod_security, "API_CALLERS", {"example": "x" * 50})
    assert check_pod_spec("example", pod) == []


# --- images ----------------------------------------------------------------------------------------------------------
def test_images_keep_their_tag_and_pin_a_digest_or_say_why_not():
    images = pod_security.load_images()
    assert images["triton"].ref == ("nvcr.io/nvidia/tritonserver:26.07-py3@sha256:"
                                    "551599c0812bb706121410a71abda07f9920d25e6c66edf1ec07a375e49f5f90")
    assert images["python"].ref == ("public.ecr.aws/docker/library/python:3.13-slim@sha256:"
                                    "ffb752e139c0a19692a43af8d8523b274222dd68eebad5d583b45c2201c6e30a")
    assert {name for name, i in images.items() if i.digest is None} == {"aws-cli", "nccl-tests"}
    assert set(pod_security.unpinned()) == {"public.ecr.aws/aws-cli/aws-cli:2.36.7",
                                            "public.ecr.aws/hpc-cloud/nccl-tests:cuda12.8.1-efa1.43.2-ofiv1.16.3-"
                                            "ncclv2.27.7-1-testsv2.16.9"}
    # Each refresh command prints the kind of digest recorded: Triton's is its linux/amd64 image manifest (the
    # source names that platform), python's the index that multi-platform builds pin.
    assert images["triton"].refresh == "crane digest --platform linux/amd64 nvcr.io/nvidia/tritonserver:26.07-py3"
    assert images["python"].refresh == "crane digest public.ecr.aws/docker/library/python:3.13-slim"


@pytest.mark.parametrize("entry, message", [
    ({"repository": "r", "tag": "t", "digest": "sha256:abc", "source": "s", "refresh": "crane digest r:t"},
     "not sha256"),
    ({"repository": "r", "tag": "t", "digest": None, "refresh": "crane digest r:t"}, "no reason"),
    ({"repository": "r", "tag": "t", "digest": "sha256:" + "a" * 64, "refresh": "crane digest r:t"}, "source"),
    ({"repository": "r", "tag": "t", "digest": None, "reason": "x"}, "refresh must be the command"),
    # a command copied from another entry prints another image's digest
    ({"repository": "r", "tag": "t", "digest": None, "reason": "x", "refresh": "crane digest r:u"}, "digest of r:t"),
])
def test_a_bad_images_entry_is_refused(tmp_path, monkeypatch, entry, message):
    import yaml
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump({"images": {"x": entry}}))
    monkeypatch.setattr(pod_security, "IMAGES_PATH", path)
    pod_security.load_images.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            pod_security.load_images()
    finally:
        pod_security.load_images.cache_clear()


def test_the_shared_contexts():
    context = pod_security.container_security_context()
    assert context == {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "readOnlyRootFilesystem": True,
                       "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                       "seccompProfile": {"type": "RuntimeDefault"}}
    root = pod_security.container_security_context(None, read_only_root=False, add=("IPC_LOCK",))
    assert "runAsUser" not in root and root["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert copy.deepcopy(pod_security.pod_security_context())["seccompProfile"] == {"type": "RuntimeDefault"}
