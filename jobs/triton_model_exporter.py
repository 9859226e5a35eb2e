#!/usr/bin/env python3
"""Every model version in Triton's repository as a Prometheus gauge, for the alert TritonModelNotReady.

Runs beside Triton in its pod, the native sidecar model-ready-exporter (decisions/serving/triton.py), on the
standard-library python image. Each scrape of /metrics asks Triton for its repository index: POST v2/repository/index
with {"ready": false}, which lists every model in the repository, loaded or not (triton-inference-server/server
v2.71.0 docs/protocol/extension_model_repository.md lines 59-100). An entry is {"name", "version", "state", "reason"},
and Triton leaves out "version" when it has none for the model and "state" and "reason" when it has never tried to
load it (core r26.06 src/tritonserver.cc lines 3164-3183, src/model_repository_manager/model_repository_manager.cc
lines 1235-1262). The answer is one gauge per model version: 1 while its state is READY, 0 otherwise (LOADING,
UNLOADING, UNAVAILABLE with the load's error, or not tried yet). A version Triton unloaded on purpose (a newer one
replaced it under the version policy) is left out: Triton marks it UNAVAILABLE with the reason "unloaded"
(core r26.06 src/model_repository_manager/model_lifecycle.cc lines 638-643) and its own strict readiness passes over
it the same way (src/server.cc lines 441-447).

A scrape Triton does not answer within --timeout gets 503 and no series, so Prometheus marks the target down rather
than keep old states. Each index request is a connection of its own, closed with its answer: Triton's HTTP stop waits
for every open connection (decisions/serving/triton.py, drains).
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, List, Mapping, NamedTuple

METRIC = "gpu_cloud_triton_model_ready"
UNLOADED = "unloaded"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ModelVersion(NamedTuple):
    model: str
    version: str        # "" where the index gives none
    ready: bool


def model_versions(index: Iterable[Mapping[str, str]]) -> List[ModelVersion]:
    """The index's entries as model versions, those Triton unloaded on purpose left out."""
    return [ModelVersion(entry["name"], entry.get("version", ""), entry.get("state") == "READY") for entry in index
            if not (entry.get("state") == "UNAVAILABLE" and entry.get("reason") == UNLOADED)]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(versions: Iterable[ModelVersion]) -> str:
    """The Prometheus text format of the gauge, one sample per model version."""
    lines = [f"# HELP {METRIC} 1 while the model version is READY in Triton's repository index, else 0.",
             f"# TYPE {METRIC} gauge"]
    lines += [f'{METRIC}{{model="{_label(v.model)}",version="{_label(v.version)}"}} {int(v.ready)}'
              for v in versions]
    return "\n".join(lines) + "\n"


def repository_index(triton_url: str, timeout: float) -> list:
    """Triton's repository index, every model (raises OSError or ValueError when Triton does not answer with one)."""
    request = urllib.request.Request(f"{triton_url}/v2/repository/index", data=b'{"ready": false}', method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        index = json.load(response)
    if not isinstance(index, list):
        raise ValueError(f"the repository index is not a list: {index!r}")
    return index


def handler(triton_url: str, timeout: float):
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path != "/metrics":
                self._answer(404, "only /metrics\n")
                return
            try:
                body = exposition(model_versions(repository_index(triton_url, timeout)))
            except (OSError, ValueError, KeyError) as error:
                print(f"triton-model-exporter: repository index from {triton_url}: {error}", file=sys.stderr)
                self._answer(503, f"Triton's repository index: {error}\n")
                return
            self._answer(200, body)

        def _answer(self, status: int, text: str):
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # scrapes every 30 s would fill the log
            pass

    return Metrics


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="triton-model-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--triton", required=True, help="Triton's HTTP endpoint, http://127.0.0.1:8000")
    parser.add_argument("--port", type=int, required=True, help="the port /metrics is served on")
    parser.add_argument("--timeout", type=float, required=True, help="seconds Triton has to answer the index")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("", args.port), handler(args.triton.rstrip("/"), args.timeout))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
