"""jobs/kueue_webhook_probe.py: the Job that holds the stack's Kueue objects until Kueue's webhooks answer.

The script runs for real, over TLS, against a stand-in for the API server built as the real one answers: the
pod's projected token and CA, `POST /apis/kueue.x-k8s.io/v1beta2/resourceflavors?dryRun=All`, a Status object
with code 500 and the webhook's failure while Kueue's webhook cannot be called (the message is the one
kubernetes-sigs/kueue issue 13036 shows), 404 while the CRD is not served yet, and 201 with the object once the
webhooks admit it (a dry-run create answers like a real one and stores nothing)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from decisions.platform import kueue
from jobs import kueue_webhook_probe as probe
from tests.conftest import ROOT, missing
from tests.loopback import LoopbackServer, QuietHandler

TOKEN = "probe-token"
WEBHOOK_502 = ('Internal error occurred: failed calling webhook "mresourceflavor.kb.io": failed to call webhook: Post '
               '"https://kueue-webhook-service.kueue-system.svc:443/mutate-kueue-x-k8s-io-v1beta2-resourceflavor?'
               'timeout=10s": proxy error from localhost:9443 while dialing 10.244.0.7:9443, code 502: 502 Bad Gateway')
NOT_SERVED = "the server could not find the requested resource"


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    """Answers ResourceFlavor creates as the API server does while Kueue comes up: `script` lists the answers in
    order (("404"|"500"|"201")); after it runs out, every answer is the last one."""

    def __init__(self, tls_dir: Path, script):
        self.script, self.requests = list(script), []
        server = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                url = urlparse(self.path)
                body = self.json_body()
                server.requests.append({"path": url.path, "query": parse_qs(url.query), "body": body,
                                        "authorization": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    code, answer = 401, _status(401, "Unauthorized", "Unauthorized")
                elif url.path != "/apis/kueue.x-k8s.io/v1beta2/resourceflavors":
                    code, answer = 404, _status(404, "NotFound", NOT_SERVED)
                else:
                    step = server.script[min(len(server.requests), len(server.script)) - 1]
                    code, answer = {"404": (404, _status(404, "NotFound", NOT_SERVED)),
                                    "500": (500, _status(500, "InternalError", WEBHOOK_502)),
                                    "201": (201, {**body, "metadata": {**body["metadata"], "uid": "dry-run"}})}[step]
                self.answer(code, answer)

        self.httpd = LoopbackServer(Handler, tls=(tls_dir / "tls.crt", tls_dir / "tls.key"))
        self.port = self.httpd.port

    def close(self):
        self.httpd.close()


@pytest.fixture(scope="module")
def pod_dir(tmp_path_factory):
    """The pod's projected service-account directory (token, ca.crt) and a serving certificate for 127.0.0.1."""
    openssl = shutil.which("openssl")
    if openssl is None:
        missing("openssl is not installed (it makes the fake API server's certificate)")
    directory = tmp_path_factory.mktemp("sa")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(directory / "tls.key"),
                    "-out", str(directory / "tls.crt")], check=True, capture_output=True)
    shutil.copy(directory / "tls.crt", directory / "ca.crt")
    (directory / "token").write_text(TOKEN + "\n")
    return directory


def run_probe(pod_dir, server, deadline="20", interval="0.1"):
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port),
           "SERVICEACCOUNT_DIR": str(pod_dir), "DEADLINE_SECONDS": deadline, "INTERVAL_SECONDS": interval}
    return subprocess.run([sys.executable, str(ROOT / "jobs/kueue_webhook_probe.py")], env=env, capture_output=True,
                          text=True, timeout=60)


def test_it_waits_through_an_unserved_crd_and_a_failing_webhook_then_completes(pod_dir):
    server = FakeApiServer(pod_dir, ["404", "500", "500", "201"])
    try:
        result = run_probe(pod_dir, server)
    finally:
        server.close()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"kueue-webhook-probe: attempt 1: HTTP 404: {NOT_SERVED}"
    assert lines[1] == f"kueue-webhook-probe: attempt 2: HTTP 500: {WEBHOOK_502}"
    assert lines[3].startswith("kueue-webhook-probe: attempt 4: HTTP 201")
    assert lines[-1] == "kueue-webhook-probe: ready after 4 attempt(s)"
    # Every attempt was a dry run, with the pod's token, of a ResourceFlavor the webhooks check.
    assert len(server.requests) == 4
    for request in server.requests:
        assert request["query"] == {"dryRun": ["All"]} and request["authorization"] == f"Bearer {TOKEN}"
        assert request["body"] == probe.probe_flavor()
        assert request["body"]["apiVersion"] == kueue.API_VERSION


def test_it_gives_up_at_its_deadline_with_the_last_reason(pod_dir):
    server = FakeApiServer(pod_dir, ["500"])
    try:
        result = run_probe(pod_dir, server, deadline="1", interval="0.3")
    finally:
        server.close()
    assert result.returncode == 1
    assert 3 <= len(server.requests) <= 5
    assert "not ready after 1 s" in result.stderr and WEBHOOK_502 in result.stderr
    assert "kueue-controller-manager" in result.stderr


def test_a_server_it_cannot_trust_is_not_an_answer(pod_dir, tmp_path):
    """The CA is the pod's: a server with another certificate never counts as Kueue answering."""
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(other / "tls.key"),
                    "-out", str(other / "tls.crt")], check=True, capture_output=True)
    server = FakeApiServer(other, ["201"])
    try:
        result = run_probe(pod_dir, server, deadline="0.5", interval="0.2")
    finally:
        server.close()
    assert result.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in result.stdout


def test_the_retry_loop_stops_at_its_deadline_to_the_attempt():
    """Attempts at 0, 5 and 10 s for a 10 s deadline; none after it, and at least one however short it is."""
    now = [0.0]
    seen = []

    def attempt():
        seen.append(now[0])
        return False, "HTTP 500"

    outcome = probe.wait_until_ready(attempt, 10, 5, clock=lambda: now[0],
                                     sleep=lambda s: now.__setitem__(0, now[0] + s), log=lambda line: None)
    assert seen == [0, 5, 10] and outcome == probe.Outcome(False, 3, "HTTP 500")
    now[0], seen[:] = 0.0, []
    assert probe.wait_until_ready(attempt, 0, 5, clock=lambda: now[0], sleep=lambda s: None,
                                  log=lambda line: None).attempts == 1
    answers = iter([(False, "HTTP 500"), (True, "HTTP 201")])
    assert probe.wait_until_ready(lambda: next(answers), 10, 5, clock=lambda: now[0], sleep=lambda s: None,
                                  log=lambda line: None) == probe.Outcome(True, 2, "HTTP 201")


def test_the_script_ships_as_the_configmap_and_needs_only_the_standard_library():
    assert kueue.webhook_probe_configmap()["data"][kueue.WEBHOOK_PROBE_SCRIPT_KEY] == \
        (ROOT / "jobs/kueue_webhook_probe.py").read_text()
    source = (ROOT / "jobs/kueue_webhook_probe.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "json", "os", "ssl", "sys", "time", "urllib", "pathlib", "typing"}
