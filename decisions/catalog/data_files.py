"""Reading the decision layer's data files: YAML that names its sources, checked by the model its loader gives."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Type, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict

Model = TypeVar("Model", bound=BaseModel)


class DataModel(BaseModel):
    """A data file's entries: read-only, no key the model does not name (a misspelt key is an error), and fields
    given by their camelCase alias or their own name."""
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def load_model(path: Path, model: Type[Model]) -> Model:
    """The file at `path` validated as `model` (pydantic's ValidationError names each bad key)."""
    return model.model_validate(read_yaml(path))
