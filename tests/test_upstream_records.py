"""tests/upstream/ against the sources it records (where their mirrors are), and the functions that make and read it
on samples (everywhere)."""
import pytest
import yaml

from tests import crds, upstream_records
from tests.upstream_records import go_json_fields, prune, record, restrict, yaml_key_lines

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


def test_restrict_recovers_a_faithful_record_and_not_a_doctored_one():
    recorded = prune(SCHEMA, [{"spec": {"size": 2, "ports": [{"name": "x"}]}}])
    assert restrict(SCHEMA, recorded) == recorded
    for doctored in ({**recorded, "required": []},                                           # a rule dropped
                     {**recorded, "properties": {**recorded["properties"], "sise": {"type": "integer"}}}):  # invented
        assert restrict(SCHEMA, doctored) != doctored


def test_go_json_fields_reads_struct_tags():
    source = 'type C struct {\n\tNamespace *string `json:"namespace,omitempty"`\n\tPort int `json:"port"`\n' \
             '\tInternal string `json:"-"`\n}\n'
    assert go_json_fields(source) == {"namespace", "port"}


def test_yaml_key_lines_gives_each_key_path_its_line_without_entering_lists():
    text = "# comment\nimage:\n  tag: v1\ncontroller:\n  nodeSelector: {}\n  tolerations:\n    - key: a\n"
    assert yaml_key_lines(text) == {"image": 2, "image.tag": 3, "controller": 4, "controller.nodeSelector": 5,
                                    "controller.tolerations": 6}
    assert yaml.safe_load(text)["controller"]["tolerations"] == [{"key": "a"}]


# --- the records against their sources: only where the mirrors are (CI has none; scripts/upstream_records.py) -----

def _source(recorded):
    text = upstream_records.show(recorded["repo"], recorded["tag"], recorded["path"])
    if text is None:
        pytest.skip(f"{recorded['repo']} is not mirrored at {upstream_records.MIRROR}: the record is checked "
                    "against its source where it is")
    assert upstream_records.blob(recorded["repo"], recorded["tag"], recorded["path"]) == recorded["blob"]
    return text


def test_kueue_fields_record_is_what_the_source_declares():
    recorded = record("kueue-configuration-fields.json")
    assert sorted(go_json_fields(_source(recorded))) == recorded["fields"]


def test_fsx_values_record_is_the_charts_keys_and_lines():
    recorded = record("fsx-csi-driver-values.json")
    assert yaml_key_lines(_source(recorded)) == recorded["keys"]


@pytest.mark.parametrize("crd_name", sorted(record(crds.RECORD)["crds"]))
def test_crd_record_is_a_pruning_of_the_pinned_crd(crd_name):
    recorded = record(crds.RECORD)["crds"][crd_name]
    assert crds.source(crd_name) == (recorded["repo"], recorded["tag"], recorded["path"])
    _source(recorded)
    full = {v["name"]: v for v in crds.from_mirror(crd_name)["spec"]["versions"]}
    for version, kept in recorded["versions"].items():
        assert kept["storage"] == bool(full[version].get("storage"))
        assert restrict(full[version]["schema"]["openAPIV3Schema"], kept["schema"]) == kept["schema"]
