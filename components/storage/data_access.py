"""What training jobs may do with the stack's data: the `trainer` service account in the training namespace and its
Pod Identity role, which reads and writes the datasets and checkpoints buckets, reads the models bucket, and nothing
else (statements in decisions/storage/data_access.py).

Jobs from `python -m jobs mpijob` run as this account (decisions/platform/mpijob.JOB_SERVICE_ACCOUNT); any pod of the
namespace may name it. Deleting objects is allowed where writing is: a job prunes its own old checkpoints, and
versioning keeps what it deleted for the bucket's noncurrent-version days (decisions/storage/buckets.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components.iam import ServiceAccountRole, ServiceAccountRoleArgs, policy_document
from decisions.platform.mpijob import JOB_SERVICE_ACCOUNT
from decisions.storage.data_access import DataBucket, trainer_statements


@dataclass(frozen=True)
class JobBucket:
    arn: pulumi.Input[str]
    key_arn: pulumi.Input[str]
    writable: bool = True                 # False: jobs may list and read it only (the models bucket)


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
        # The statements compute with the ARNs (decisions/storage/data_access.py), so they are resolved first.
        arns = pulumi.Output.all(*[pulumi.Output.all(b.arn, b.key_arn) for b in args.buckets])
        policy = arns.apply(lambda pairs: policy_document(*trainer_statements(
            [DataBucket(arn, key_arn, b.writable) for (arn, key_arn), b in zip(pairs, args.buckets)], args.region)))
        self.role = ServiceAccountRole(f"{name}-role", ServiceAccountRoleArgs(
            cluster_name=args.cluster_name, namespace=args.namespace_name, service_account=JOB_SERVICE_ACCOUNT,
            policy=policy), opts=child)
        self.register_outputs({"serviceAccount": JOB_SERVICE_ACCOUNT, "roleArn": self.role.role.arn})
