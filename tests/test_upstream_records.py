"""The functions that make tests/upstream/ and read its sources, on samples; and the records themselves held against
their sources by `scripts/upstream_records.py --check`, which needs the mirrors (CI has none) and takes about 90 s, so
it runs only with GPU_CLOUD_CHECK_RECORDS=1."""
import os
import subprocess
import sys

import pytest

from tests import upstream_records
from tests.conftest import ROOT
from tests.upstream_records import go_field_names, prune

SCHEMA = {
    "type": "object", "description": "a widget", "required": ["spec"],
    "properties": {
        "spec": {"type": "object", "description": "what it is",
                 "properties": {"size": {"type": "integer", "minimum": 1, "description": "how big"},
                                "mode": {"type": "string", "enum": ["a", "b"]},
                                "ports": {"type": "array", "items": {"type": "object", "properties": {
                                    "port": {"type": "integer"}, "name": {"type": "string"}}}},
                                "labels": {"type": "object", "additionalProperties": {
                                    "type": "object", "properties": {"value": {"type": "string"},
                                                                     "unused": {"type": "string"}}}}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
    },
}


def test_prune_keeps_what_the_objects_use_with_its_whole_schema_and_nothing_else():
    used = [{"spec": {"size": 2, "ports": [{"port": 80}], "labels": {"x": {"value": "1"}}}}, {"spec": {"mode": "a"}}]
    assert prune(SCHEMA, used) == {
        "type": "object", "required": ["spec"],
        "properties": {"spec": {"type": "object", "properties": {
            "size": {"type": "integer", "minimum": 1},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "ports": {"type": "array", "items": {"type": "object", "properties": {"port": {"type": "integer"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "value": {"type": "string"}}}}}}}}


def test_go_field_names_reads_struct_tags():
    source = 'type C struct {\n\tNamespace *string `json:"namespace,omitempty"`\n\tPort int `json:"port"`\n' \
             '\tConfigs []string `json:"mig-configs"`\n\tInternal string `json:"-"`\n}\n'
    assert go_field_names(source) == {"namespace", "port", "mig-configs"}


@pytest.mark.skipif(os.environ.get("GPU_CLOUD_CHECK_RECORDS") != "1",
                    reason="holding the records against their sources takes about 90 s: set GPU_CLOUD_CHECK_RECORDS=1")
def test_every_record_is_what_its_source_gives_now():
    # Not tests.conftest.missing: CI has no mirrors by design, so their absence is a skip there too.
    if not upstream_records.MIRROR.is_dir():
        pytest.skip(f"no mirrors at {upstream_records.MIRROR} (GPU_CLOUD_MIRROR): the records cannot be held against "
                    "their sources here")
    checked = subprocess.run([sys.executable, "scripts/upstream_records.py", "--check", "--mirror",
                              str(upstream_records.MIRROR)], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, f"{checked.stderr[-3000:]}{checked.stdout[-2000:]}"
