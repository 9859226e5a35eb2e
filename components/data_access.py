"""What training jobs may do with the stack's data: the `trainer` service account in the training namespace and its
Pod Identity role, which reads and writes the datasets, checkpoints and models buckets and nothing else.

Jobs from `python -m jobs mpijob` run as this account (spec/mpijob.JOB_SERVICE_ACCOUNT); any pod of the namespace
may name it. Deleting objects is allowed: a job prunes its own old checkpoints, and versioning keeps what it
deleted for the bucket's noncurrent-version days (spec/buckets.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from spec.mpijob import JOB_SERVICE_ACCOUNT


@dataclass(frozen=True)
class JobBucket:
    arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]


@dataclass(frozen=True)
class DataAccessArgs:
    cluster_name: pulumi.Input[str]
    namespace: pulumi.Input[str]          # the training namespace (from Tenancy, so it exists first)
    namespace_name: str                   # the same, as a plain name for the Pod Identity association
    region: str
    buckets: Sequence[JobBucket]


class DataAccess(pulumi.ComponentResource):
    def __init__(self, name: str, args: DataAccessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        if not args.buckets:
            raise ValueError("DataAccess needs at least one bucket")
        super().__init__("gpu-cloud:data_access:DataAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-sa", metadata=k8s.meta.v1.ObjectMetaArgs(name=JOB_SERVICE_ACCOUNT, namespace=args.namespace),
            opts=child)
        objects = [pulumi.Output.concat(b.arn, "/*") for b in args.buckets]
        self.role = ServiceAccountRole(f"{name}-role", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=args.namespace_name, service_account=JOB_SERVICE_ACCOUNT,
            policy=policy_document(
                {"Sid": "ListDataBuckets", "Effect": "Allow", "Action": "s3:ListBucket",
                 "Resource": [b.arn for b in args.buckets]},
                {"Sid": "ReadWriteData", "Effect": "Allow",
                 "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                 "Resource": objects},
                {"Sid": "UseDataKeysThroughS3", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                 "Resource": [b.key_arn for b in args.buckets],
                 "Condition": {"StringEquals": {"kms:ViaService": f"s3.{args.region}.amazonaws.com"}}})),
            opts=child)
        self.register_outputs({"serviceAccount": JOB_SERVICE_ACCOUNT, "roleArn": self.role.role.arn})
