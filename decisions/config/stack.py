"""A validated stack: the StackSpec that decisions/config/validate.py builds and every layer reads.

It lives apart from the validator so that the layers the validator composes (platform, serving, ...) can name these
types without importing the validator back: the decision layer's imports form no cycle (tests/test_layout.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Tuple

from decisions.catalog.catalog import Catalog, InstanceType
from decisions.config.model import Budget, Cluster, Dr, Inference, Monitoring, Network, NodePool, Repair, Storage, \
    Tenancy, Training
from decisions.nodes.amis import NodeImage
from decisions.observability import logs


def resource_tags(tags: Mapping[str, str], environment: str, stack: str) -> Dict[str, str]:
    """The stack's tags with the three gpu-cloud sets itself."""
    return {**tags, "environment": environment, "stack": stack, "managed-by": "gpu-cloud"}


def cluster_name(project: str, stack: str) -> str:
    """The EKS cluster's fixed physical name (subnet, autoscaler and ASG names derive from it)."""
    return f"{project}-{stack}"


@dataclass(frozen=True)
class ResolvedPool:
    """A node pool with its catalog facts resolved: what the components build from."""

    spec: NodePool
    types: Tuple[InstanceType, ...]
    efa: bool

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def primary_type(self) -> InstanceType:
        return self.types[0]

    @property
    def gpus_per_node(self) -> int:
        return self.primary_type.gpu.count


@dataclass(frozen=True)
class StackSpec:
    project: str
    stack: str
    region: str
    environment: str
    tags: Mapping[str, str]
    network: Network
    cluster: Cluster
    node_image: NodeImage
    pools: Tuple[ResolvedPool, ...]
    storage: Storage
    inference: Inference
    monitoring: Monitoring
    dr: Dr
    budget: Budget
    tenancy: Tenancy
    training: Training
    repair: Repair
    catalog: Catalog = field(repr=False, compare=False)

    @property
    def cluster_name(self) -> str:
        return cluster_name(self.project, self.stack)

    @property
    def resource_tags(self) -> Dict[str, str]:
        """The merged tag map for every taggable AWS resource."""
        return resource_tags(self.tags, self.environment, self.stack)

    def pool(self, name: str) -> ResolvedPool:
        return next(p for p in self.pools if p.name == name)

    @property
    def log_retention_days(self) -> int:
        """How long every log the stack writes is kept, a value CloudWatch Logs accepts
        (decisions/observability/logs.py)."""
        return logs.log_retention_days(self.environment, self.monitoring.log_retention_days)
