"""Inference and disaster recovery: Triton, the load balancer controller, DNS failover and the DR pair check."""
