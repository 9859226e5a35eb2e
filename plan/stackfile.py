"""Read a stack file the way the Pulumi CLI hands it to the program: with Pulumi.yaml defaults."""
from __future__ import annotations

import difflib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILE = ROOT / "Pulumi.yaml"


class StackFileError(Exception):
    """The stack file is missing or is not a Pulumi stack file."""


# libyaml's parser where PyYAML was built with it (the wheels are): about 10 times faster, which matters because the
# program reads its peer's stack file on every run. Only the parser is C; resolving plain scalars is CliLoader's.
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# How the Pulumi CLI reads a stack file and Pulumi.yaml: gopkg.in/yaml.v3 (pulumi/pulumi v3.259.0 sdk/go.mod line 34;
# sdk/go/common/encoding/marshal.go yamlMarshaler.Unmarshal, called by workspace/loaders.go LoadProjectStackBytes
# into an untyped `any`). yaml.v3 resolves plain scalars by its own rules (go-yaml/yaml v3.0.1 resolve.go resolve()),
# mostly YAML 1.2 where PyYAML is YAML 1.1: yes/no/on/off/y/n are strings, not booleans; 1:30 is a string, not 90;
# 0o17 and 1e3 are numbers, not strings. A leading-zero octal (0777) is 511 in both. The same resolve() is ported
# below, so the offline plan and `pulumi preview` read one file the same way.
_TAG = "tag:yaml.org,2002:"
_GO_WORDS = {**{w: "bool" for w in ("true", "True", "TRUE", "false", "False", "FALSE")},
             **{w: "null" for w in ("", "~", "null", "Null", "NULL")},
             **{w: "float" for w in (".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
                                     "-.inf", "-.Inf", "-.INF")},
             "<<": "merge"}
# strconv.ParseInt(s, 0, 64) after yaml.v3 drops every "_": sign, then 0b/0o/0x, a leading-zero octal, or decimal.
_GO_INT = re.compile(r"[-+]?(0[bB][01]+|0[oO][0-7]+|0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")        # resolve.go yamlStyleFloat
_GO_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")      # strconv.ParseFloat of a plain scalar starting "."


def _go_int(text: str) -> Optional[int]:
    """strconv.ParseInt(text without "_", 0, 64), then ParseUint for an unsigned one past int64; None if neither."""
    plain = text.replace("_", "")
    if not _GO_INT.fullmatch(plain):
        return None
    digits = plain.lstrip("+-")
    prefix = digits[:2].lower()
    if prefix in ("0b", "0o", "0x"):
        value = int(digits[2:], {"0b": 2, "0o": 8, "0x": 16}[prefix])
    else:
        value = int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)
    value = -value if plain[0] == "-" else value
    if -2**63 <= value < 2**63 or (value < 2**64 and plain[0] not in "+-"):
        return value
    return None


# PyYAML's own timestamp pattern, behind yaml.v3's quick check that a timestamp starts with four digits and "-".
_TIMESTAMP = next(regexp for tag, regexp in yaml.resolver.Resolver.yaml_implicit_resolvers["2"]
                  if tag.endswith("timestamp"))


def cli_scalar_tag(text: str) -> str:
    """The tag yaml.v3 gives a plain (unquoted) scalar: its resolve() for an untagged node."""
    if text in _GO_WORDS:
        return _TAG + _GO_WORDS[text]
    first = text[0]
    if first == ".":
        return _TAG + ("float" if _GO_DOT_FLOAT.fullmatch(text) else "str")
    if first not in "+-0123456789":
        return _TAG + "str"
    if re.match(r"[0-9]{4}-", text) and _TIMESTAMP.match(text):
        return _TAG + "timestamp"
    if _go_int(text) is not None:
        return _TAG + "int"
    return _TAG + ("float" if _GO_FLOAT.fullmatch(text.replace("_", "")) else "str")


class CliLoader(_BASE_LOADER):
    """PyYAML's safe loader with yaml.v3's scalar resolution and its refusal of a key written twice in one mapping
    (v3.0.1 decode.go mapping(): "mapping key ... already defined")."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0]:
            return cli_scalar_tag(value)
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node, deep=False):
        seen: Dict[Any, Any] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _TAG + "merge":
                earlier = seen.setdefault(key_node.value, key_node)     # by text, as v3 compares them
                if earlier is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"mapping key {key_node.value!r} is already defined at line "
                        f"{earlier.start_mark.line + 1} (the Pulumi CLI refuses a key written twice)", key_node.start_mark)
        return super().construct_mapping(node, deep)


def _construct_int(loader, node):
    value = _go_int(loader.construct_scalar(node))
    if value is None:
        raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not an integer", node.start_mark)
    return value


def _construct_float(loader, node):
    text = loader.construct_scalar(node)
    if _GO_WORDS.get(text) == "float":
        return float(text.replace(".", "").lower())          # nan, inf, +inf, -inf
    if _go_int(text) is not None:
        return float(_go_int(text))
    if not (_GO_FLOAT.fullmatch(text.replace("_", "")) or _GO_DOT_FLOAT.fullmatch(text)):
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a number", node.start_mark)
    return float(text.replace("_", ""))


def _construct_bool(loader, node):
    text = loader.construct_scalar(node)
    if _GO_WORDS.get(text) != "bool":
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not true or false", node.start_mark)
    return text.lower() == "true"


CliLoader.add_constructor(_TAG + "int", _construct_int)
CliLoader.add_constructor(_TAG + "float", _construct_float)
CliLoader.add_constructor(_TAG + "bool", _construct_bool)


def _read_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=CliLoader)


def project() -> Dict[str, Any]:
    return _read_yaml(PROJECT_FILE)


def stack_file_path(stack: str, project_file: Optional[Dict[str, Any]] = None) -> Path:
    return ROOT / (project_file or project()).get("stackConfigDir", ".") / f"Pulumi.{stack}.yaml"


def known_stacks() -> list:
    """The stacks with a file in the project's stack directory."""
    directory = ROOT / project().get("stackConfigDir", ".")
    return sorted(path.name[len("Pulumi."):-len(".yaml")] for path in directory.glob("Pulumi.*.yaml"))


def project_keys(config: Dict[str, Any], namespace: str = "gpu-cloud") -> Dict[str, Any]:
    """The `<namespace>:` keys of a stack config, without their namespace (what decisions.config.validate takes)."""
    return {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{namespace}:")}


# Namespaces a stack file may use: the project's, the AWS provider's (decisions/config/deployer.py) and the engine's
# own.
READ_NAMESPACES = ("aws", "pulumi")
# A project config declaration is a schema when it uses these keys; any other value is a plain default.
SCHEMA_KEYS = {"type", "description", "items", "default", "value", "secret"}
# `pulumi config set --secret` writes `{secure: <ciphertext>}`, which only the stack's secrets provider decrypts. The
# offline plan stands a well-formed value in for it (the program treats it as a secret, so it is shown nowhere), per
# key: a secret key without a stand-in cannot be planned offline.
OFFLINE_STAND_INS = {"gpu-cloud:alertWebhookUrl": "https://encrypted-in-the-stack-file.invalid/"}


def load_stack_config(stack: str, path: Optional[Path] = None) -> Dict[str, Any]:
    """`config:` of the stack file (namespaced keys), merged with Pulumi.yaml the way the Pulumi CLI does it
    (pulumi/pulumi sdk/go/common/workspace, ValidateStackConfigAndApplyProjectConfig): a declared key the stack
    leaves out takes its `default` or `value`, and without either it is missing; an explicitly typed key must
    have its type. Keys under a namespace gpu-cloud does not read are refused too. Raises StackFileError."""
    declared = project()
    path = Path(path) if path else stack_file_path(stack, declared)
    try:
        document = _read_yaml(path)
    except FileNotFoundError:
        known = ", ".join(known_stacks()) or "none"
        raise StackFileError(f"no stack file at {path} (stacks: {known})") from None
    except yaml.YAMLError as err:
        raise StackFileError(f"{path} is not valid YAML: {err}") from None
    except UnicodeDecodeError as err:
        raise StackFileError(f"{path} is not UTF-8 text (byte {err.start}): save it as UTF-8") from None
    except OSError as err:
        raise StackFileError(f"{path} cannot be read: {err.strerror}") from None
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise StackFileError(f"{path}: a stack file is a mapping with a `config:` mapping of keys such as "
                             "aws:region and gpu-cloud:environment; this one has none")
    name = declared["name"]
    config = {(key if ":" in key else f"{name}:{key}"): value for key, value in document["config"].items()}
    problems = _namespace_problems(config, name)
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            if key in OFFLINE_STAND_INS:
                config[key] = OFFLINE_STAND_INS[key]
            else:
                problems.append(f"'{key}' is encrypted (secure:) and the offline plan has no stand-in for it")
    missing = []
    for key, declaration in (declared.get("config") or {}).items():
        full_key = key if ":" in key else f"{name}:{key}"
        schema = declaration if isinstance(declaration, dict) and set(declaration) <= SCHEMA_KEYS else {"default": declaration}
        if full_key not in config:
            if "default" in schema or "value" in schema:
                config[full_key] = schema.get("default", schema.get("value"))
            else:
                missing.append(key)
        elif "type" in schema and not _has_type(config[full_key], schema):
            problems.append(f"Stack '{stack}' with configuration key '{key}' must be of type '{_type_name(schema)}'")
    if missing:
        problems.insert(0, f"Stack '{stack}' is missing configuration value{'s' if len(missing) > 1 else ''} "
                           + ", ".join(f"'{k}'" for k in missing))
    if problems:
        raise StackFileError(f"{path}: " + "; ".join(problems))
    return config


def _namespace_problems(config: Dict[str, Any], project_name: str) -> list:
    known = (project_name, *READ_NAMESPACES)
    problems = []
    for key in sorted(config):
        namespace = key.split(":", 1)[0]
        if namespace not in known:
            close = difflib.get_close_matches(namespace, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}:{key.split(':', 1)[1]}?)" if close else ""
            problems.append(f"{key}: gpu-cloud reads no `{namespace}:` keys{hint}; namespaces read: {', '.join(known)}")
    return problems


def _has_type(value: Any, schema: Dict[str, Any]) -> bool:
    kind = schema["type"]
    if kind == "array":
        return isinstance(value, list) and all(_has_type(v, schema.get("items") or {"type": "string"}) for v in value)
    return {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)}[kind](value)


def _type_name(schema: Dict[str, Any]) -> str:
    return f"array<{_type_name(schema.get('items') or {'type': 'string'})}>" if schema["type"] == "array" else schema["type"]


def peer_cidr(keys: Dict[str, Any]) -> Optional[str]:
    """The VPC CIDR of the DR peer stack named in `dr.peerStack` (`org/gpu-cloud/<stack>`), read from its
    stack file beside this one; None without a peer, or when its file or CIDR is missing (read_peer_cidr says why)."""
    return read_peer_cidr(keys)[0]


def read_peer_cidr(keys: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(the DR peer's VPC CIDR, a warning): the warning when `dr.peerStack` names a peer whose stack file cannot be
    read, or sets no network.cidr, so that the check that the two VPCs do not overlap did not run."""
    peer = (keys.get("dr") or {}).get("peerStack") if isinstance(keys.get("dr"), dict) else None
    if not isinstance(peer, str):
        return None, None
    skipped = "the check that this stack's network.cidr does not overlap the peer's VPC was skipped"
    try:
        network = load_stack_config(peer.rsplit("/", 1)[-1]).get("gpu-cloud:network")
    except StackFileError as error:
        return None, f"gpu-cloud:dr.peerStack: the stack file of {peer} could not be read ({error}); {skipped}"
    cidr = network.get("cidr") if isinstance(network, dict) else None
    if not isinstance(cidr, str):
        return None, f"gpu-cloud:dr.peerStack: the stack file of {peer} sets no gpu-cloud:network.cidr; {skipped}"
    return cidr, None


def peer_region(peer_stack: Optional[str]) -> Optional[str]:
    """The aws:region of the DR peer stack (`org/gpu-cloud/<stack>`), from its stack file beside this one; None
    without a peer or when its file cannot be read (the bill then lists the replication's transfer as a gap)."""
    if not peer_stack:
        return None
    try:
        region = load_stack_config(peer_stack.rsplit("/", 1)[-1]).get("aws:region")
    except StackFileError:
        return None
    return region if isinstance(region, str) else None


def load_stack(stack: str, path: Optional[Path] = None):
    """A stack's config and its validated spec, with no cloud account (what the plan and `python -m jobs` read).
    Raises StackFileError or decisions.config.errors.ConfigError."""
    config = load_stack_config(stack, path)
    return config, _validated(stack, config, path)


def _validated(stack: str, config: Dict[str, Any], path: Optional[Path]):
    from decisions.config.deployer import aws_settings
    from decisions.config.errors import ConfigError
    from decisions.config.model import NAMESPACE
    from decisions.config.validate import load_stack_spec

    keys = project_keys(config, NAMESPACE)
    try:
        spec = load_stack_spec(keys, stack=stack, region=config.get("aws:region"), peer_cidr=peer_cidr(keys))
        aws_settings(project_keys(config, "aws"))   # an `aws:` key the program would not pass to its provider
    except ConfigError as error:
        if path is None:
            raise
        # Another file planned under the stack's name (--stack-file): the mistakes are in that file.
        raise ConfigError(error.issues, source=str(path)) from None
    return spec


def load_stack_past_budget(stack: str, path: Optional[Path], refusal) -> Optional[Tuple[Dict[str, Any], Any]]:
    """For `--against`, which shows what a change would do even where the stack refuses it: a stack that `refusal`
    (load_stack's ConfigError) refuses for its budget alone, as (its config without gpu-cloud:budget,
    so that the program, which refuses it too (layers.prepare), runs; its spec with the budget, so that the document
    records it and the pack judges it). None when the refusal is anything else: the stack cannot be planned.

    Nothing decides "over budget" here: the refusal must be exactly what the config check's own rule says of this
    spec (decisions/config/validate.py budget_issues, decisions/cost/cost.py over_budget); its other checks ran and
    passed, since the budget is checked only when nothing else is wrong."""
    from decisions.config.errors import ConfigError
    from decisions.config.model import Budget
    from decisions.config.validate import budget_issues
    from pydantic import ValidationError

    config = load_stack_config(stack, path)
    budget = config.get("gpu-cloud:budget")
    if not isinstance(budget, dict) or "maxHourlyUsd" not in budget:
        return None
    # unpriced goes with it: it acknowledges gaps in a budget and is refused without one
    config["gpu-cloud:budget"] = {k: v for k, v in budget.items() if k not in ("maxHourlyUsd", "unpriced")}
    try:
        spec = replace(_validated(stack, config, path), budget=Budget.model_validate(budget))
    except (ConfigError, ValidationError):
        return None
    return (config, spec) if budget_issues(spec, None) == list(refusal.issues) else None
