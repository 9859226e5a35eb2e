"""Jobs that run in the cluster: the NCCL judge (nccl_judge.py, shipped to pods in a ConfigMap) and the command
that renders job manifests from a stack (`python -m jobs`)."""
