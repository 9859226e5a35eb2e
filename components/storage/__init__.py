"""The stack's S3 buckets, their replication to the DR peer, the data-access roles and FSx for Lustre."""
