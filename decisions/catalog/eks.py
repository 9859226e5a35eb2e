"""EKS Kubernetes version support dates: loads decisions/catalog/eks.yaml once. Pure: no Pulumi."""
from __future__ import annotations

from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

from decisions.catalog.data_files import read_yaml

EKS_PATH = Path(__file__).with_name("eks.yaml")


@lru_cache(maxsize=None)
def standard_support_end() -> Dict[str, date]:
    data = read_yaml(EKS_PATH)
    return {minor: date.fromisoformat(day) for minor, day in data["standardSupportEnd"].items()}


def version_warnings(kubernetes_version: str, today: date) -> List[str]:
    end = standard_support_end().get(kubernetes_version)
    if end is None or today < end:
        return []
    newer = [m for m, e in standard_support_end().items() if e > today]
    return [f"gpu-cloud:cluster.kubernetesVersion: {kubernetes_version} left EKS standard support on {end}; its "
            f"control plane is billed at the extended-support rate (six times the standard one)"
            + (f"; versions in standard support: {', '.join(newer)}" if newer else "")]
