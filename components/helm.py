"""Helm releases from the pinned charts in decisions/catalog/charts.yaml: one way to install a chart."""
from __future__ import annotations

from typing import Any, Mapping

import pulumi
from pulumi_kubernetes.helm.v3 import Release, ReleaseArgs, RepositoryOptsArgs

from decisions.catalog.charts import ChartPin


def pinned_release(resource_name: str, pin: ChartPin, *, release_name: str, namespace: str,
                   values: pulumi.Input[Mapping[str, Any]], opts: pulumi.ResourceOptions) -> Release:
    """A Release of exactly `pin`'s chart version (OCI charts carry their registry in the chart ref). `values` may
    be an Output when some value is known only once a resource exists."""
    return Release(resource_name, ReleaseArgs(
        name=release_name, chart=pin.chart_ref, version=pin.version, namespace=namespace,
        values=values if isinstance(values, pulumi.Output) else dict(values),
        repository_opts=None if pin.is_oci else RepositoryOptsArgs(repo=pin.repository)), opts=opts)
