"""The functions that make tests/upstream/ and read its sources, on samples. The records themselves are held against
their sources by `scripts/upstream_records.py --check` (it needs the mirrors, which CI does not have)."""
import yaml

from tests.upstream_records import go_json_fields, prune, yaml_key_lines

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


def test_go_json_fields_reads_struct_tags():
    source = 'type C struct {\n\tNamespace *string `json:"namespace,omitempty"`\n\tPort int `json:"port"`\n' \
             '\tInternal string `json:"-"`\n}\n'
    assert go_json_fields(source) == {"namespace", "port"}


def test_yaml_key_lines_gives_each_key_path_its_line_without_entering_lists():
    text = "# comment\nimage:\n  tag: v1\ncontroller:\n  nodeSelector: {}\n  tolerations:\n    - key: a\n"
    assert yaml_key_lines(text) == {"image": 2, "image.tag": 3, "controller": 4, "controller.nodeSelector": 5,
                                    "controller.tolerations": 6}
    assert yaml.safe_load(text)["controller"]["tolerations"] == [{"key": "a"}]
