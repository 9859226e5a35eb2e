"""Reading the decision layer's data files: YAML that names its sources, checked by the model its loader gives."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Type, TypeVar

import yaml
from pydantic import BaseModel

Model = TypeVar("Model", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def load_model(path: Path, model: Type[Model]) -> Model:
    """The file at `path` validated as `model` (pydantic's ValidationError names each bad key)."""
    return model.model_validate(read_yaml(path))
