"""Read a stack file the way the Pulumi CLI hands it to the program: with Pulumi.yaml defaults."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT_FILE = ROOT / "Pulumi.yaml"


class StackFileError(Exception):
    """The stack file is missing or is not a Pulumi stack file."""


def project() -> Dict[str, Any]:
    with open(PROJECT_FILE, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def stack_file_path(stack: str) -> Path:
    return ROOT / project().get("stackConfigDir", ".") / f"Pulumi.{stack}.yaml"


def project_keys(config: Dict[str, Any], namespace: str = "gpu-cloud") -> Dict[str, Any]:
    """The `<namespace>:` keys of a stack config, without their namespace (what spec.validate takes)."""
    return {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{namespace}:")}


def load_stack_config(stack: str, path: Optional[Path] = None) -> Dict[str, Any]:
    """`config:` of the stack file (namespaced keys), with the project's declared defaults filled in."""
    path = Path(path) if path else stack_file_path(stack)
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle) or {}
    except FileNotFoundError:
        raise StackFileError(f"no stack file at {path}") from None
    except yaml.YAMLError as err:
        raise StackFileError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise StackFileError(f"{path}: expected a mapping with a `config:` mapping")
    config = dict(document.get("config") or {})
    name = project()["name"]
    for key, declaration in (project().get("config") or {}).items():
        full_key = key if ":" in key else f"{name}:{key}"
        if isinstance(declaration, dict) and "default" in declaration:
            config.setdefault(full_key, declaration["default"])
    return config


def peer_cidr(keys: Dict[str, Any]) -> Optional[str]:
    """The VPC CIDR of the DR peer stack named in `dr.peerStack` (`org/gpu-cloud/<stack>`), read from its
    stack file beside this one; None without a peer, or when its file or CIDR is missing."""
    peer = (keys.get("dr") or {}).get("peerStack") if isinstance(keys.get("dr"), dict) else None
    if not isinstance(peer, str):
        return None
    try:
        network = load_stack_config(peer.rsplit("/", 1)[-1]).get("gpu-cloud:network")
    except StackFileError:
        return None
    cidr = network.get("cidr") if isinstance(network, dict) else None
    return cidr if isinstance(cidr, str) else None
