"""The decision layer: the stack config model, its validation, the catalogs, and every pure decision made from them,
one sub-package per layer of the architecture (config, catalog, network, nodes, storage, platform, observability,
serving, cost). Data (YAML with sources and dates) sits beside the module that loads it.

Nothing here imports Pulumi: the offline plan, the policy pack and the tests call it directly; components/ turns
its decisions into resources.
"""
