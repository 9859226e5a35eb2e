"""The stack's data: S3 buckets, their cross-region replication, who may read and write them, and FSx for Lustre."""
