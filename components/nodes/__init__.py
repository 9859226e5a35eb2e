"""GPU node pools, their drain on interruption and termination, their repair, and the cluster-autoscaler."""
