"""What runs on the cluster: the GPU operator, the training queue (Kueue) and job templates (Job, MPIJob, JobSet), NCCL
acceptance, team tenancy and pod security."""
