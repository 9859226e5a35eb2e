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


# --- read as the Pulumi CLI reads it: gopkg.in/yaml.v3 (plan/stackfile.py CliLoader) ----------------------------------
# Each plain scalar whose meaning differs between YAML 1.1 (PyYAML's SafeLoader) and the CLI's parser, with what each
# reads: yaml.v3 v3.0.1 resolve.go resolve() for the CLI.
DIFFERING = [
    # YAML 1.1 booleans: strings to the CLI.
    *[(word, word, word.lower() in ("yes", "y", "on")) for word in
      ("yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF")],
    ("1:30", "1:30", 90),                    # sexagesimal: no base 60 in yaml.v3
    ("-1:30", "-1:30", -90),
    ("1:30.5", "1:30.5", 90.5),
    ("0o17", 15, "0o17"),                    # YAML 1.2 octal: a number to the CLI, a string to 1.1
    ("1e3", 1000.0, "1e3"),                  # an exponent without a dot or a sign: a float to the CLI
    ("1.0e3", 1000.0, "1.0e3"),
    ("08", 8.0, "08"),                       # not octal, so yaml.v3's float pattern takes it
]
SAME = [("0777", 511), ("0x1F", 31), ("0b101", 5), ("1_000", 1000), ("true", True), ("False", False), ("~", None),
        ("null", None), (".inf", float("inf")), ("-.Inf", float("-inf")), ("3.5", 3.5), ("+12", 12), ("1.35", 1.35),
        ("10.96.0.0/18", "10.96.0.0/18"), ("0 6 * * 0", "0 6 * * 0"),
        ("y", "y"), ("n", "n")]       # booleans in the YAML 1.1 spec, but PyYAML never resolved them either


@pytest.mark.parametrize("plain, cli, yaml11", DIFFERING, ids=[d[0] for d in DIFFERING])
def test_a_scalar_yaml_1_1_reads_otherwise_is_read_as_the_cli_reads_it(plain, cli, yaml11):
    from plan.stackfile import CliLoader

    assert yaml.load(f"v: {plain}", Loader=CliLoader)["v"] == cli and type(cli) is type(
        yaml.load(f"v: {plain}", Loader=CliLoader)["v"])
    assert yaml.load(f"v: {plain}", Loader=yaml.SafeLoader)["v"] == yaml11       # what the plan used to read
    assert yaml.load(f"v: '{plain}'", Loader=CliLoader)["v"] == plain            # quoted: a string to both


@pytest.mark.parametrize("plain, value", SAME, ids=[s[0] for s in SAME])
def test_a_scalar_both_read_alike_is_unchanged(plain, value):
    from plan.stackfile import CliLoader

    read = yaml.load(f"v: {plain}", Loader=CliLoader)["v"]
    assert read == value and type(read) is type(value)
    assert yaml.load(f"v: {plain}", Loader=yaml.SafeLoader)["v"] == value


def test_keys_are_read_as_the_cli_reads_them_and_a_key_written_twice_is_refused(tmp_path):
    from plan.stackfile import CliLoader

    assert yaml.load("{no: 1, on: 2}", Loader=CliLoader) == {"no": 1, "on": 2}        # 1.1: {False: 1, True: 2}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text((ROOT / "stacks/Pulumi.dev.yaml").read_text() + "  gpu-cloud:environment: prod\n")
    with pytest.raises(StackFileError, match=r"is not valid YAML: .*'gpu-cloud:environment' is already defined at "
                                             r"line 4 \(the Pulumi CLI refuses a key written twice\)"):
        load_stack_config("dev", path)


def test_efa_no_is_the_string_no_and_its_error_says_to_write_false(tmp_path):
    from decisions.config.errors import ConfigError
    from plan.stackfile import load_stack

    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text((ROOT / "stacks/Pulumi.dev.yaml").read_text().replace("efa: false", "efa: no"))
    assert load_stack_config("dev", path)["gpu-cloud:nodePools"][0]["efa"] == "no"
    with pytest.raises(ConfigError) as raised:
        load_stack("dev", path)
    assert str(raised.value).splitlines()[1:] == [
        "  - gpu-cloud:nodePools[0].efa (pool dev-gpu-spot): 'no' is a string where true or false belongs: the Pulumi "
        "CLI reads stack files as YAML 1.2, where no is a string and only true and false are booleans; write efa: false"]


def test_a_config_error_in_another_stack_file_names_that_file(tmp_path):
    from decisions.config.errors import ConfigError
    from plan.stackfile import load_stack

    path = tmp_path / "alice.yaml"
    path.write_text((ROOT / "stacks/Pulumi.dev.yaml").read_text().replace("maxNodes: 3", "maxNodes: '3'"))
    with pytest.raises(ConfigError) as raised:
        load_stack("dev", path)
    assert str(raised.value).startswith(f"invalid stack config in {path} (1 mistake):")
    # The stack's own file: the stack names it (the plan says "config error in stack dev").
    assert ConfigError(raised.value.issues).source is None


def test_every_stack_in_the_stack_directory_loads_and_validates():
    """Whatever stacks/ holds (the shipped stacks, and any a user added as the README shows), each plans offline."""
    from plan.stackfile import known_stacks, load_stack

    stacks = known_stacks()
    assert {"dev", "prod-eu-west-1", "prod-us-east-1"} <= set(stacks)
    for stack in stacks:
        config, spec = load_stack(stack)
        assert spec.stack == stack and config["aws:region"] == spec.region


def test_a_dr_peer_whose_cidr_cannot_be_read_comes_with_a_warning(monkeypatch):
    """The CIDR-overlap check needs the peer's network.cidr: an unreadable peer file or a file without it is said,
    with the peer's name, and a readable one is not."""
    import plan.stackfile as stackfile
    from plan.stackfile import read_peer_cidr
    assert read_peer_cidr({"dr": {"peerStack": "acme/gpu-cloud/prod-eu-west-1"}}) == ("10.80.0.0/16", None)
    assert read_peer_cidr({}) == (None, None) and read_peer_cidr({"dr": {"role": "primary"}}) == (None, None)
    cidr, warning = read_peer_cidr({"dr": {"peerStack": "acme/gpu-cloud/prod-nowhere"}})
    assert cidr is None and warning.startswith("gpu-cloud:dr.peerStack: the stack file of acme/gpu-cloud/prod-nowhere "
                                               "could not be read (no stack file at ")
    assert warning.endswith("the check that this stack's network.cidr does not overlap the peer's VPC was skipped")
    monkeypatch.setattr(stackfile, "load_stack_config", lambda stack: {"gpu-cloud:network": {"zones": []}})
    cidr, warning = read_peer_cidr({"dr": {"peerStack": "acme/gpu-cloud/prod-eu-west-1"}})
    assert cidr is None and "acme/gpu-cloud/prod-eu-west-1 sets no gpu-cloud:network.cidr" in warning
