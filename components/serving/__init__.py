"""Triton inference, the AWS Load Balancer Controller and Route 53 failover."""
