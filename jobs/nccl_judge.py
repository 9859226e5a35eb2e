#!/usr/bin/env python3
"""Judge an nccl-tests all_reduce_perf run against a bus-bandwidth minimum and publish the verdict.

Runs in the `judge` container beside the NCCL launcher (decisions/platform/acceptance.py renders both). Standard library
only: the judge image is a plain python image. It waits for the launcher's marker file (the launcher's exit code),
parses the output, prints one machine-readable summary line, posts a core/v1 Event on its own pod and exits
0 (pass) or 1 (fail). A failed Event post is printed and never changes the verdict.

Settings come from the environment: RESULT_FILE, MARKER_FILE, MIN_BUS_GBPS, POOL, INSTANCE_TYPE, SCOPE,
WAIT_SECONDS, and POD_NAME, POD_NAMESPACE, POD_UID from the downward API (HOSTNAME is not the pod's name:
the MPI operator sets the launcher's hostname to `<job>-launcher`).
"""
from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import List, NamedTuple, Optional

# The pod's projected service-account token and CA (SERVICEACCOUNT_DIR only moves it for tests).
SA_DIR = Path(os.environ.get("SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
PASSED, BELOW, FAILED = "NcclBandwidthPassed", "NcclBandwidthBelowMinimum", "NcclTestFailed"
SUMMARY_PREFIX = "NCCL_ACCEPTANCE "

# A result row as nccl-tests v2.16.9 prints it (src/common.cu, TimeTest and BenchTime):
#   "%12li  %12li  %8s  %6s  %6s" size, count, type, redop, root; then per place (out-of-place, in-place)
#   "  %7s  %6.2f  %6.2f  %5g" time, algbw, busbw, #wrong -- or "%5s" "N/A" for #wrong when run with -c 0.
# Bandwidths must be plain decimals: "inf" or "nan" (a zero time) never counts as a measurement.
_NUM = r"(\d+\.\d+)"
_WRONG = r"(N/A|\d+(?:\.\d+)?(?:e[+-]\d+)?)"
_PLACE = rf"\s+\S+\s+{_NUM}\s+{_NUM}\s+{_WRONG}"
ROW = re.compile(rf"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+{_PLACE}{_PLACE}\s*$")


class Row(NamedTuple):
    size: int                       # bytes
    out_of_place_busbw: float       # GB/s
    in_place_busbw: float           # GB/s
    wrong: Optional[float]          # wrong elements, both places together; None when the data was not checked


class Verdict(NamedTuple):
    passed: bool
    reason: str                     # the Event reason
    message: str
    measured_gbps: Optional[float]  # the lower busbw (out-of-place, in-place) at the largest size
    size: Optional[int]


def _wrong(text: str) -> Optional[float]:
    return None if text == "N/A" else float(text)


def parse_all_reduce(text: str) -> List[Row]:
    """The result rows of all_reduce_perf output; comment lines ('#'), NCCL log lines and anything else skipped."""
    rows = []
    for line in text.splitlines():
        match = ROW.match(line)
        if not match:
            continue
        size, _count, oop_alg, oop_bus, oop_wrong, ip_alg, ip_bus, ip_wrong = match.groups()
        wrongs = [_wrong(oop_wrong), _wrong(ip_wrong)]
        wrong = None if None in wrongs else sum(wrongs)
        rows.append(Row(int(size), float(oop_bus), float(ip_bus), wrong))
    return rows


def verdict(rows: List[Row], minimum_gbps: float, exit_code: int = 0) -> Verdict:
    """Pass only when the run exited 0, every row's data checked out, and at the largest message size both the
    out-of-place and the in-place bus bandwidth reach the minimum (bandwidth plateaus there; small sizes
    measure latency)."""
    if exit_code != 0:
        return Verdict(False, FAILED, f"all_reduce_perf exited with {exit_code}", None, None)
    if not rows:
        return Verdict(False, FAILED, "no result rows in the all_reduce_perf output", None, None)
    unchecked = [r.size for r in rows if r.wrong is None]
    if unchecked:
        return Verdict(False, FAILED, f"data not checked (#wrong N/A) at {unchecked[0]} B: run with -c 1", None, None)
    corrupt = [r for r in rows if r.wrong > 0]
    if corrupt:
        return Verdict(False, FAILED, f"{corrupt[0].wrong:g} wrong elements at {corrupt[0].size} B", None, None)
    size = max(r.size for r in rows)
    measured = min(min(r.out_of_place_busbw, r.in_place_busbw) for r in rows if r.size == size)
    if measured >= minimum_gbps:
        return Verdict(True, PASSED, f"bus bandwidth {measured:.2f} GB/s >= minimum {minimum_gbps:g} GB/s "
                       f"at {size} B", measured, size)
    return Verdict(False, BELOW, f"bus bandwidth {measured:.2f} GB/s < minimum {minimum_gbps:g} GB/s "
                   f"at {size} B", measured, size)


def _api_base() -> str:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def post_event(*, namespace: str, pod_name: str, pod_uid: str, reason: str, event_type: str, message: str,
               base_url: Optional[str] = None, token: Optional[str] = None,
               ca_file: Optional[str] = str(SA_DIR / "ca.crt"), timeout: float = 10.0) -> dict:
    """Create a core/v1 Event about this pod through the API server; returns the created Event.

    In the cluster base_url and token come from the service environment and the projected token; tests pass a
    plain-HTTP base_url, a token and ca_file=None."""
    base_url = base_url or _api_base()
    token = token if token is not None else (SA_DIR / "token").read_text(encoding="utf-8").strip()
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{pod_name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "namespace": namespace, "uid": pod_uid},
        "reason": reason, "type": event_type, "message": message[:1024],
        "source": {"component": "gpu-cloud-nccl-judge"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    request = urllib.request.Request(f"{base_url}/api/v1/namespaces/{namespace}/events", method="POST",
                                     data=json.dumps(event).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=ca_file) if base_url.startswith("https") else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return json.loads(response.read() or b"{}")


def _wait_for(marker: Path, seconds: float, poll: float = 5.0) -> Optional[int]:
    deadline = time.monotonic() + seconds
    while not marker.exists():
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)
    text = marker.read_text(encoding="utf-8").strip()
    return int(text) if text.isdigit() else 1     # an unreadable marker is a failed run


def main() -> int:
    env = os.environ
    minimum = float(env["MIN_BUS_GBPS"])
    exit_code = _wait_for(Path(env["MARKER_FILE"]), float(env.get("WAIT_SECONDS", "3300")),
                          float(env.get("POLL_SECONDS", "5")))
    if exit_code is None:
        result = Verdict(False, FAILED, f"no result from the NCCL container after {env.get('WAIT_SECONDS', '3300')} s",
                         None, None)
    else:
        output = Path(env["RESULT_FILE"])
        text = output.read_text(encoding="utf-8", errors="replace") if output.exists() else ""
        result = verdict(parse_all_reduce(text), minimum, exit_code)
    where = f"pool {env.get('POOL', '?')} ({env.get('INSTANCE_TYPE', '?')}), {env.get('SCOPE', '?')}"
    message = f"NCCL all_reduce_perf {where}: {result.message}"
    print(SUMMARY_PREFIX + json.dumps({
        "result": "pass" if result.passed else "fail", "reason": result.reason, "pool": env.get("POOL"),
        "instanceType": env.get("INSTANCE_TYPE"), "scope": env.get("SCOPE"), "busBandwidthGBps": result.measured_gbps,
        "minimumGBps": minimum, "sizeBytes": result.size, "exitCode": exit_code}, sort_keys=True), flush=True)
    try:
        post_event(namespace=env["POD_NAMESPACE"], pod_name=env["POD_NAME"], pod_uid=env["POD_UID"],
                   reason=result.reason, event_type="Normal" if result.passed else "Warning", message=message,
                   base_url=env.get("KUBE_API_URL"))
    except Exception as error:   # the verdict stands even when it cannot be published
        print(f"could not post the Event: {error}", file=sys.stderr)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
