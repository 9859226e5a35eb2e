#!/usr/bin/env python3
"""Start one scheduled NCCL across-node acceptance run: create its MPIJob, unless the pool's last run is unfinished.

Runs as the Job of the CronJob `nccl-efa-start-<pool>` (decisions/platform/acceptance.py renders it; a CronJob can only
create Jobs, and the test is an MPIJob). The MPIJob is the one `python -m jobs nccl-acceptance` prints, passed in MPIJOB
as JSON; its `generateName` gives every run its own name, and its judge gives the verdict (an Event, the MPIJob's
status, the NcclAcceptanceFailed alert). This script only starts it.

A run still queued or running for the pool (an MPIJob with the same labels and neither a Succeeded nor a Failed
condition, kubeflow/mpi-operator v0.8.0 pkg/apis/kubeflow/v2beta1/types.go JobConditionType) means the pool has been
busy since the last slot: no second run is queued behind it. But a run unfinished STALE_AFTER_S after its creation
is stuck (mpi-operator v0.8.0 counts activeDeadlineSeconds from the launcher, which starts only once the workers run:
pkg/controller/mpi_job_controller.go lines 636 and 1542, so a run that never gets its workers never times out), and
it would skip every later slot in silence: then the script fails, naming the run and how to clear it, and its Job's
failure raises kube-prometheus-stack's KubeJobFailed (88.5.3 templates/prometheus/rules-1.14/kubernetes-apps.yaml
line 555). Exit 0 after creating or skipping, 1 when a run is stuck or the API server refused or did not answer.

Standard library only (the image is a plain python image). The API server from the pod's service environment and
its service account token and CA (SERVICEACCOUNT_DIR moves them, KUBE_API_URL replaces the address: tests only).
"""
from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

SA_DIR = Path(os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
FINISHED = ("Succeeded", "Failed")
PREFIX = "nccl-submit: "


def _api_base() -> str:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def unfinished(mpijobs: List[dict]) -> List[str]:
    """The names of the MPIJobs that have neither succeeded nor failed yet."""
    def done(job: dict) -> bool:
        return any(c.get("type") in FINISHED and c.get("status") == "True"
                   for c in job.get("status", {}).get("conditions", []))
    return [job["metadata"]["name"] for job in mpijobs if not done(job)]


def _call(method: str, url: str, token: str, ca_file: Optional[str], body: Optional[dict] = None,
          timeout: float = 30.0) -> dict:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                              "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return json.loads(response.read() or b"{}")


class StuckRun(Exception):
    """A run of the pool has been unfinished for longer than a run can take."""


def stuck(mpijobs: List[dict], names: List[str], stale_after_s: Optional[float], now: datetime) -> List[str]:
    """Of the unfinished runs `names`, those created more than `stale_after_s` before `now`."""
    if stale_after_s is None:
        return []
    created = {job["metadata"]["name"]: job["metadata"].get("creationTimestamp") for job in mpijobs}
    return [name for name in names if created.get(name) and
            (now - datetime.strptime(created[name], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
             ).total_seconds() > stale_after_s]


def submit(mpijob: dict, base_url: str, token: str, ca_file: Optional[str], stale_after_s: Optional[float] = None,
           now: Optional[datetime] = None) -> str:
    """Create `mpijob` unless a run with its labels is unfinished; returns what was done, for the log. Raises
    StuckRun when an unfinished run is older than `stale_after_s`."""
    namespace = mpijob["metadata"]["namespace"]
    collection = f"{base_url}/apis/kubeflow.org/v2beta1/namespaces/{namespace}/mpijobs"
    selector = ",".join(f"{key}={value}" for key, value in sorted(mpijob["metadata"]["labels"].items()))
    listed = _call("GET", f"{collection}?{urllib.parse.urlencode({'labelSelector': selector})}", token, ca_file)
    items = listed.get("items", [])
    running = unfinished(items)
    old = stuck(items, running, stale_after_s, now or datetime.now(timezone.utc))
    if old:
        raise StuckRun(f"{', '.join(old)} unfinished for more than {stale_after_s / 3600:g} h blocks every later run; "
                       f"see why with `kubectl -n {namespace} describe mpijob {old[0]}`, then delete it")
    if running:
        return f"skipped: {', '.join(running)} has not finished"
    created = _call("POST", collection, token, ca_file, mpijob)
    return f"created MPIJob {namespace}/{created['metadata']['name']}"


def main() -> int:
    mpijob = json.loads(os.environ["MPIJOB"])
    base = os.environ.get("KUBE_API_URL") or _api_base()
    token = (SA_DIR / "token").read_text(encoding="utf-8").strip()
    stale_after_s = float(os.environ["STALE_AFTER_S"]) if os.environ.get("STALE_AFTER_S") else None
    try:
        print(PREFIX + submit(mpijob, base, token, str(SA_DIR / "ca.crt"), stale_after_s), flush=True)
    except StuckRun as error:
        print(f"{PREFIX}{error}", file=sys.stderr, flush=True)
        return 1
    except urllib.error.HTTPError as error:        # the API server's Status object says why
        try:
            message = json.loads(error.read() or b"{}").get("message", "")
        except ValueError:
            message = ""
        print(f"{PREFIX}HTTP {error.code}: {message or error.reason}", file=sys.stderr, flush=True)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"{PREFIX}no answer from the API server: {getattr(error, 'reason', error)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
