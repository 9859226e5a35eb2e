"""scripts/vendor_manifests.py: refresh a kept release manifest from its release, checked against the pinned sha256,
with urllib against a loopback server that redirects as GitHub's release downloads do."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import yaml

from decisions.catalog import charts
from scripts import vendor_manifests
from tests.conftest import ROOT
from tests.loopback import LoopbackServer, QuietHandler

RELEASE = (b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: op-system\n---\n"
           b"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: op\n  namespace: op-system\n"
           b"spec:\n  replicas: 1\n")


class Release:
    """What the release serves now; /download/... redirects to /asset, as a GitHub release asset URL does."""
    body = RELEASE


class Handler(QuietHandler):
    def do_GET(self):
        if self.path.startswith("/download/"):
            self.send_response(302)
            self.send_header("Location", "/asset")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/asset":
            self.answer(200, Release.body, "application/octet-stream")
        else:
            self.answer(404, b"Not Found")


@pytest.fixture()
def server():
    served = LoopbackServer(Handler)
    Release.body = RELEASE
    yield served
    served.close()


@pytest.fixture()
def kept(tmp_path, server):
    """A pin of RELEASE served by `server`, its copy kept under tmp_path, and a charts file holding its digest."""
    digest = hashlib.sha256(RELEASE).hexdigest()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests/op-v1.0.0.yaml").write_bytes(RELEASE)
    (tmp_path / "charts.yaml").write_text(f"manifests:\n  op:\n    sha256: {digest}\n")
    # model_construct: the pin's own rules want https, which the loopback server does not speak.
    pin = charts.ManifestPin.model_construct(url=f"{server.url}/download/v1.0.0/manifests.yaml", version="v1.0.0",
                                             file="manifests/op-v1.0.0.yaml", sha256=digest, source="test")
    return tmp_path, pin


def refresh(kept, pin_new=False):
    directory, pin = kept
    return vendor_manifests.vendor("op", pin, directory=directory, charts_file=directory / "charts.yaml",
                                   pin_new=pin_new)


def test_a_kept_copy_that_is_the_release_is_left_as_it_is(kept):
    code, lines = refresh(kept)
    assert code == 0 and "the kept copy is the release's file" in lines[0]


def test_a_damaged_copy_is_restored_from_a_release_whose_digest_is_the_pins(kept):
    directory, _ = kept
    (directory / "manifests/op-v1.0.0.yaml").write_bytes(RELEASE[:40])
    code, lines = refresh(kept)
    assert code == 0 and "kept the release's file" in lines[0]
    assert (directory / "manifests/op-v1.0.0.yaml").read_bytes() == RELEASE


def test_a_release_in_other_bytes_but_the_same_objects_is_told_apart_and_changes_nothing(kept):
    directory, pin = kept
    Release.body = yaml.safe_dump_all(yaml.safe_load_all(RELEASE), explicit_start=True, indent=4).encode()
    assert Release.body != RELEASE
    code, lines = refresh(kept)
    assert code == 1 and f"not the pinned {pin.sha256}" in lines[0]
    assert lines[1] == "  the same objects as the kept copy, in other bytes; --pin keeps the release's bytes"
    assert (directory / "manifests/op-v1.0.0.yaml").read_bytes() == RELEASE


def test_a_release_with_other_objects_names_each_and_changes_nothing(kept):
    directory, _ = kept
    Release.body = RELEASE.replace(b"replicas: 1", b"replicas: 2") + (
        b"---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: op\n  namespace: op-system\n")
    code, lines = refresh(kept)
    assert code == 1
    assert lines[1:] == ["  added ServiceAccount op-system/op (v1)", "  changed Deployment op-system/op (apps/v1)",
                         "  review, then --pin keeps the release's file"]
    assert (directory / "manifests/op-v1.0.0.yaml").read_bytes() == RELEASE


def test_pin_keeps_the_release_and_its_digest(kept):
    directory, pin = kept
    Release.body = RELEASE.replace(b"replicas: 1", b"replicas: 3")
    code, lines = refresh(kept, pin_new=True)
    digest = hashlib.sha256(Release.body).hexdigest()
    assert code == 0 and digest in lines[0]
    assert (directory / "manifests/op-v1.0.0.yaml").read_bytes() == Release.body
    assert (directory / "charts.yaml").read_text() == f"manifests:\n  op:\n    sha256: {digest}\n"


def test_a_failed_download_is_an_error_not_a_change(kept):
    directory, pin = kept
    missing = pin.model_copy(update={"url": pin.url.replace("/download/", "/gone/")})
    with pytest.raises(OSError, match="404"):
        vendor_manifests.vendor("op", missing, directory=directory, charts_file=directory / "charts.yaml")
    assert (directory / "manifests/op-v1.0.0.yaml").read_bytes() == RELEASE


def test_the_command_checks_the_kept_copies_offline_and_refuses_an_unpinned_name():
    script = [sys.executable, str(ROOT / "scripts/vendor_manifests.py")]
    checked = subprocess.run(script + ["--check"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines() == ["jobset v0.12.0: 20 objects, sha256 as pinned",
                                           "mpi-operator v0.8.0: 9 objects, sha256 as pinned"]
    unknown = subprocess.run(script + ["kueue"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert unknown.returncode == 2 and "not pinned: kueue; pinned: jobset, mpi-operator" in unknown.stderr
