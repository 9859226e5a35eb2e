"""jobs/triton_model_exporter.py: every model version of Triton's repository index as a gauge, 1 while READY, run as
the pod runs it (decisions/serving/triton.py exporter_command) against a stand-in Triton that answers a recorded
repository index, its exposition checked by `promtool check metrics`."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from decisions.observability import alert_rules
from decisions.serving import triton
from jobs import triton_model_exporter as exporter
from tests.conftest import require_tool
from tests.loopback import LoopbackServer, QuietHandler

# POST v2/repository/index with {"ready": false}, answered as the protocol defines it (server v2.71.0
# docs/protocol/extension_model_repository.md lines 84-100) and as Triton writes it: compact JSON, "version" only where
# Triton has one, "state" and "reason" only for a model it has tried to load, "reason" only where not empty (core
# r26.06 src/tritonserver.cc lines 3164-3183; model_repository_manager.cc lines 1235-1262: a model in two repositories
# is UNAVAILABLE with no version and the reason MODEL_READY_REASON_DUPLICATE; model_lifecycle.cc lines 638-643 and
# 654-657: "unloaded" once unloaded, the load's error when it failed).
RECORDED_INDEX = (
    '[{"name":"bert","version":"1","state":"UNAVAILABLE","reason":"unloaded"},'
    '{"name":"bert","version":"2","state":"READY"},'
    '{"name":"densenet_trt","version":"1","state":"UNAVAILABLE",'
    '"reason":"Internal: the plan was built for another GPU architecture"},'
    '{"name":"llama","version":"3","state":"LOADING"},'
    '{"name":"new_model"},'
    '{"name":"twice","state":"UNAVAILABLE","reason":"model appears in two or more repositories"}]')
# What each model version of it is: bert 1 was replaced by bert 2 under the version policy (left out), densenet_trt
# failed to load, llama is loading, new_model was synced and Triton has not polled it yet, twice cannot load.
EXPECTED = {("bert", "2"): 1, ("densenet_trt", "1"): 0, ("llama", "3"): 0, ("new_model", ""): 0, ("twice", ""): 0}


class FakeTriton:
    """Triton's HTTP endpoint on loopback, answering the repository index with `body` (and `status`); it keeps each
    request's path, body and Connection header."""

    def __init__(self, body: str, status: int = 200):
        self.requests = []
        owner = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                owner.requests.append((self.path, self.json_body(), self.headers.get("Connection")))
                self.answer(status, body.encode(), "application/json")

        self.server = LoopbackServer(Handler)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def run_exporter():
    """Start the exporter with the pod's own command, aimed at a given Triton; yields a function that does so and
    returns the /metrics URL."""
    started = []

    def start(triton_url: str) -> str:
        port = free_port()
        command = triton.exporter_command()
        command[command.index("--triton") + 1] = triton_url
        command[command.index("--port") + 1] = str(port)
        started.append(subprocess.Popen([sys.executable if part == "python3" else part for part in command],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}/metrics"
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the exporter did not listen on {port}: {started[-1].stderr.read1().decode()}")

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def scrape(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def samples(text: str):
    found = {}
    for line in text.splitlines():
        if line.startswith(alert_rules.TRITON_MODEL_READY_METRIC + "{"):
            labels, value = line[len(alert_rules.TRITON_MODEL_READY_METRIC) + 1:].rsplit("} ", 1)
            pairs = dict(part.split("=", 1) for part in labels.split(","))
            found[(json.loads(pairs["model"]), json.loads(pairs["version"]))] = int(value)
    return found


def test_every_model_version_of_the_index_is_one_gauge_ready_only_when_ready():
    versions = exporter.model_versions(json.loads(RECORDED_INDEX))
    assert {(v.model, v.version): int(v.ready) for v in versions} == EXPECTED


def test_the_pods_exporter_asks_triton_for_every_model_and_serves_valid_metrics(run_exporter):
    fake = FakeTriton(RECORDED_INDEX)
    try:
        status, content_type, text = scrape(run_exporter(fake.server.url))
    finally:
        fake.server.close()
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert samples(text) == EXPECTED
    assert alert_rules.TRITON_MODEL_READY_METRIC == exporter.METRIC
    # Every model, not only the ready ones; a connection of its own, closed with the answer, so that it never holds
    # Triton's HTTP stop (decisions/serving/triton.py, drains).
    assert fake.requests == [("/v2/repository/index", {"ready": False}, "close")]
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("status, body", [(400, '{"error":"failed to read the repository"}'), (200, '{"error":"x"}'),
                                          (200, "not json")])
def test_an_index_triton_cannot_give_is_a_failed_scrape_with_no_states(run_exporter, status, body):
    """Prometheus marks the target down; no model keeps a state it may no longer have."""
    fake = FakeTriton(body, status)
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            scrape(run_exporter(fake.server.url))
    finally:
        fake.server.close()
    assert failed.value.code == 503
    assert exporter.METRIC + "{" not in failed.value.read().decode()


def test_a_triton_that_does_not_answer_is_a_failed_scrape(run_exporter):
    with pytest.raises(urllib.error.HTTPError) as failed:
        scrape(run_exporter(f"http://127.0.0.1:{free_port()}"))
    assert failed.value.code == 503


def test_label_values_are_escaped_as_the_text_format_requires():
    text = exporter.exposition([exporter.ModelVersion('a"b\\c\nd', "1", True)])
    assert f'{exporter.METRIC}{{model="a\\"b\\\\c\\nd",version="1"}} 1' in text.splitlines()


def test_the_exporter_answers_within_the_time_the_drain_budget_gives_its_index_request():
    command = triton.exporter_command()
    assert float(command[command.index("--timeout") + 1]) == triton.HEALTH_CHECK_TIMEOUTS_S["model-ready"]
    assert command[command.index("--triton") + 1] == f"http://127.0.0.1:{triton.HTTP_PORT}"
