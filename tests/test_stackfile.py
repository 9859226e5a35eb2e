"""Stack files read as the Pulumi CLI reads them: Pulumi.yaml's declarations, types, and namespaces."""
from pathlib import Path

import pytest
import yaml

from plan.stackfile import StackFileError, load_stack_config
from tests.conftest import ROOT


def stack_file(tmp_path: Path, change) -> Path:
    document = yaml.safe_load((ROOT / "stacks/Pulumi.dev.yaml").read_text())
    change(document["config"])
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def refused(tmp_path, change) -> str:
    with pytest.raises(StackFileError) as raised:
        load_stack_config("dev", stack_file(tmp_path, change))
    return str(raised.value)


def test_a_declared_key_without_default_is_required_as_the_cli_requires_it(tmp_path):
    message = refused(tmp_path, lambda c: c.pop("gpu-cloud:environment"))
    assert "Stack 'dev' is missing configuration value 'environment'" in message
    message = refused(tmp_path, lambda c: [c.pop("gpu-cloud:environment"), c.pop("gpu-cloud:tags")])
    assert "Stack 'dev' is missing configuration values 'environment', 'tags'" in message


def test_an_optional_key_left_out_takes_its_declared_default(tmp_path):
    config = load_stack_config("dev", stack_file(tmp_path, lambda c: [c.pop("gpu-cloud:budget"), c.pop("gpu-cloud:dr", None)]))
    assert config["gpu-cloud:budget"] == {} and config["gpu-cloud:dr"] == {"role": "none"}


def test_an_explicitly_typed_key_must_have_its_type(tmp_path):
    message = refused(tmp_path, lambda c: c.update({"gpu-cloud:environment": 5}))
    assert "Stack 'dev' with configuration key 'environment' must be of type 'string'" in message


def test_a_key_without_namespace_is_the_projects(tmp_path):
    def unqualified(config):
        config["environment"] = config.pop("gpu-cloud:environment")
    assert load_stack_config("dev", stack_file(tmp_path, unqualified))["gpu-cloud:environment"] == "dev"


@pytest.mark.parametrize("key,hint", [
    ("gpucloud:budget", "did you mean gpu-cloud:budget?"),
    ("gpu_cloud:budget", "did you mean gpu-cloud:budget?"),
    ("kubernetes:context", "namespaces read: gpu-cloud, aws, pulumi"),
])
def test_a_namespace_gpu_cloud_does_not_read_is_refused_not_ignored(tmp_path, key, hint):
    message = refused(tmp_path, lambda c: c.update({key: {"maxHourlyUsd": 1}}))
    assert f"{key}: gpu-cloud reads no `{key.split(':')[0]}:` keys" in message and hint in message


def test_a_stack_file_without_its_config_map_says_so(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("aws:region: us-east-1\n")
    with pytest.raises(StackFileError) as raised:
        load_stack_config("dev", path)
    assert "a mapping with a `config:` mapping" in str(raised.value)


def test_the_shipped_stacks_satisfy_the_project_declarations():
    for stack in ("prod-us-east-1", "prod-eu-west-1", "dev"):
        assert load_stack_config(stack)["gpu-cloud:environment"] in ("prod", "dev")


def test_a_stack_file_that_is_not_utf8_or_not_readable_is_named(tmp_path):
    latin = tmp_path / "Pulumi.latin.yaml"
    latin.write_bytes("config:\n  gpu-cloud:environment: d\xe9v\n".encode("latin-1"))
    with pytest.raises(StackFileError, match=r"Pulumi\.latin\.yaml is not UTF-8 text"):
        load_stack_config("latin", latin)
    folder = tmp_path / "Pulumi.folder.yaml"
    folder.mkdir()
    with pytest.raises(StackFileError, match=r"Pulumi\.folder\.yaml cannot be read"):
        load_stack_config("folder", folder)
