"""The GPU platform on the cluster: the NVIDIA GPU operator (device plugin with per-pool time-slicing or MPS, MIG
manager with the MIG pools' layouts, DCGM exporter, node feature discovery, validator) and, where some pool has EFA,
the AWS EFA device plugin.

Values and configs come from decisions/platform/gpu_operator.py (which also says what runs where and why); this file
only turns them into resources.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

import pulumi
import pulumi_kubernetes as kubernetes
from pulumi_kubernetes.helm.v3 import Release

from components.cluster import SYSTEM_NODE_LABELS
from components.helm import pinned_release
from decisions.catalog import charts
from decisions.config.validate import ResolvedPool
from decisions.nodes.pools import Taint
from decisions.observability import dcgm
from decisions.platform import gpu_operator


@dataclass(frozen=True)
class GpuOperatorArgs:
    shared: Tuple[Tuple[str, int], ...]      # distinct (mode, replicas) of the time-slicing and MPS pools (may be empty)
    mig_layouts: Mapping[str, Mapping[str, int]]   # the MIG pools' layouts by config name (empty without MIG pools)
    node_taints: Tuple[Taint, ...]           # every taint GPU nodes carry, the GPU taint first
    efa: bool                                # some pool has EFA: install the EFA device plugin
    # What the operator needs in place first: the monitoring stack, whose ServiceMonitor CRD the operator looks for
    # when it makes the DCGM exporter's ServiceMonitor.
    after: Tuple[pulumi.Resource, ...] = ()

    @classmethod
    def for_pools(cls, pools: Sequence[ResolvedPool], after: Sequence[pulumi.Resource] = ()) -> "GpuOperatorArgs":
        """From the stack's pools."""
        return cls(shared=gpu_operator.replicated_sharing(pools), mig_layouts=gpu_operator.mig_layouts(pools),
                   node_taints=gpu_operator.gpu_node_taints(pools), efa=any(pool.efa for pool in pools),
                   after=tuple(after))


class GpuOperator(pulumi.ComponentResource):
    """The Kubernetes provider comes from the caller (`opts.providers["kubernetes"]`); children inherit it."""
    namespace: kubernetes.core.v1.Namespace
    device_plugin_config: kubernetes.core.v1.ConfigMap
    mig_config: Optional[kubernetes.core.v1.ConfigMap]
    dcgm_metrics: kubernetes.core.v1.ConfigMap
    release: Release
    efa_plugin: Optional[Release]

    def __init__(self, name: str, args: GpuOperatorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        # Plain decisions first: a bad argument fails before anything is registered.
        configs = gpu_operator.device_plugin_configs(args.shared)
        mig_config = gpu_operator.mig_manager_config(args.mig_layouts) if args.mig_layouts else None
        values = gpu_operator.operator_values(args.node_taints, SYSTEM_NODE_LABELS, mig_config=mig_config is not None)
        pin = charts.chart(charts.GPU_OPERATOR)
        efa = (gpu_operator.checked_efa_plugin_pin(charts.chart(charts.EFA_DEVICE_PLUGIN)),
               gpu_operator.efa_plugin_values(args.node_taints)) if args.efa else None

        super().__init__("gpu-cloud:gpu_operator:GpuOperator", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.namespace = kubernetes.core.v1.Namespace(
            f"{name}-namespace", metadata=kubernetes.meta.v1.ObjectMetaArgs(name=gpu_operator.NAMESPACE), opts=child)
        # The namespace's output, not the constant: the ConfigMap waits for its namespace.
        self.device_plugin_config = kubernetes.core.v1.ConfigMap(
            f"{name}-device-plugin-config",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=gpu_operator.DEVICE_PLUGIN_CONFIGMAP,
                                                       namespace=self.namespace.metadata.name),
            data=configs, opts=child)
        # Only with MIG pools: it replaces the MIG manager's own configs, which serve every other stack.
        self.mig_config = None
        if mig_config:
            self.mig_config = kubernetes.core.v1.ConfigMap(
                f"{name}-mig-config",
                metadata=kubernetes.meta.v1.ObjectMetaArgs(name=gpu_operator.MIG_MANAGER_CONFIGMAP,
                                                           namespace=self.namespace.metadata.name),
                data=mig_config, opts=child)
        # The DCGM exporter's counter file (decisions/observability/dcgm.py), named by the values'
        # dcgmExporter.config.name.
        self.dcgm_metrics = kubernetes.core.v1.ConfigMap(
            f"{name}-dcgm-metrics",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(name=dcgm.CONFIGMAP, namespace=self.namespace.metadata.name),
            data={dcgm.CSV_KEY: dcgm.metrics_csv()}, opts=child)
        # After the ConfigMaps: the device plugin's config-manager fails on a node whose config it cannot read, the
        # MIG manager without its config, and the exporter's pods do not start without theirs.
        configmaps = [self.device_plugin_config, self.dcgm_metrics] + ([self.mig_config] if self.mig_config else [])
        self.release = pinned_release(
            f"{name}-release", pin, release_name=gpu_operator.RELEASE_NAME, namespace=gpu_operator.NAMESPACE,
            values=values, opts=pulumi.ResourceOptions(parent=self, depends_on=[
                self.namespace, *configmaps, *args.after]))

        self.efa_plugin = None
        if efa:
            efa_pin, efa_values = efa
            self.efa_plugin = pinned_release(
                f"{name}-efa-device-plugin", efa_pin, release_name=gpu_operator.EFA_PLUGIN_RELEASE_NAME,
                namespace=gpu_operator.EFA_PLUGIN_NAMESPACE, values=efa_values, opts=child)

        self.register_outputs({
            "chartVersion": pin.version,
            "releaseStatus": self.release.status,
            "devicePluginConfigs": sorted(configs),
            "migConfigs": sorted(args.mig_layouts),
            "efaPluginStatus": self.efa_plugin.status if self.efa_plugin else None,
        })
