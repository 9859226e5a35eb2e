#!/usr/bin/env python3
"""Wait until Kueue's admission webhooks answer through the API server: exit 0 then, 1 at the deadline.

Runs as the Job `kueue-webhook-ready`, which the stack's ResourceFlavors and ClusterQueue wait for
(components/platform/training.py). Kueue's pod reports Ready once its webhook server listens (kueue v0.19.2
cmd/kueue/main.go, setupProbeEndpoints), yet the API server can still fail to call the webhook for a while after
(kubernetes-sigs/kueue issue 13036, open: 502s for 10 to 30 s after the Deployment is Ready), and pulumi-kubernetes
does not retry a create that a webhook refused. So this asks the API server to create a ResourceFlavor with
`dryRun=All`: the request goes through Kueue's mutating and validating webhooks for ResourceFlavors (both declare
`sideEffects=None`, so they take dry-run requests: pkg/webhooks/resourceflavor_webhook.go at v0.19.2) and nothing
is stored. It is the check Kueue's own end-to-end scripts make before they create queues (kubernetes-sigs/kueue
PR 12016, `kubectl create --dry-run=server`).

Standard library only (the image is a plain python image). Settings from the environment: DEADLINE_SECONDS
(default 300), INTERVAL_SECONDS (default 5); the API server from the pod's service environment and its projected
token and CA (SERVICEACCOUNT_DIR only moves them for tests). Every attempt is printed, so `kubectl logs` of the Job
says why it waited.
"""
from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Tuple

SA_DIR = Path(os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
API_PATH = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors?dryRun=All"
PROBE_FLAVOR = "gpu-cloud-webhook-probe"
PREFIX = "kueue-webhook-probe: "


class Outcome(NamedTuple):
    ready: bool
    attempts: int
    last: str           # what the last attempt got


def probe_flavor() -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": PROBE_FLAVOR},
            "spec": {}}


def api_base() -> str:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def try_once(base_url: str, token: str, ca_file: Optional[str], timeout: float = 10.0) -> Tuple[bool, str]:
    """One dry-run create: (whether the webhooks took it, what the API server said)."""
    request = urllib.request.Request(f"{base_url}{API_PATH}", method="POST", data=json.dumps(probe_flavor()).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                              "Accept": "application/json"})
    context = ssl.create_default_context(cafile=ca_file) if base_url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return True, f"HTTP {response.status}: the webhooks admitted a dry-run ResourceFlavor"
    except urllib.error.HTTPError as error:     # the API server's Status object says why
        try:
            message = json.loads(error.read() or b"{}").get("message", "")
        except ValueError:
            message = ""
        return False, f"HTTP {error.code}: {message or error.reason}"
    except (urllib.error.URLError, OSError) as error:
        return False, f"no answer from the API server: {getattr(error, 'reason', error)}"


def wait_until_ready(attempt: Callable[[], Tuple[bool, str]], deadline_s: float, interval_s: float,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     log: Callable[[str], None] = print) -> Outcome:
    """Attempt every `interval_s` until one succeeds or `deadline_s` has passed (at least one attempt)."""
    end = clock() + deadline_s
    attempts = 0
    while True:
        attempts += 1
        ready, said = attempt()
        log(f"{PREFIX}attempt {attempts}: {said}")
        if ready or clock() + interval_s > end:
            return Outcome(ready, attempts, said)
        sleep(interval_s)


def main() -> int:
    deadline = float(os.environ.get("DEADLINE_SECONDS", "300"))
    interval = float(os.environ.get("INTERVAL_SECONDS", "5"))
    token = (SA_DIR / "token").read_text(encoding="utf-8").strip()
    base = api_base()
    outcome = wait_until_ready(lambda: try_once(base, token, str(SA_DIR / "ca.crt")), deadline, interval,
                               log=lambda line: print(line, flush=True))
    if outcome.ready:
        print(f"{PREFIX}ready after {outcome.attempts} attempt(s)", flush=True)
        return 0
    print(f"{PREFIX}not ready after {deadline:g} s ({outcome.attempts} attempts); last: {outcome.last}. Check the "
          "kueue-controller-manager pods and the webhook configurations' caBundle in namespace kueue-system.",
          file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
