"""GPU nodes: pools' labels and taints, EFA interfaces, AMIs and drivers, boot timing, pods per node, NVMe scratch,
draining, the autoscaler, the fault model and repair."""
