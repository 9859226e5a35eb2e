"""The VPC's subnet layout and the zones the cluster and each pool use."""
