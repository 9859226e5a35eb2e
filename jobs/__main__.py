"""Render a job for a stack's pool as YAML on stdout, to pipe into `kubectl create -f -`.

    python -m jobs nccl-acceptance --stack STACK --pool POOL
    python -m jobs mpijob --stack STACK --pool POOL --name NAME --image IMAGE [--workers N]
                          [--checkpoint-uri S3URI] -- PROGRAM [ARGS...]
    python -m jobs pytorch-job --stack STACK --pool POOL --name NAME --image IMAGE [--nodes N]
                               [--checkpoint-uri S3URI] [--scratch SIZE] [--max-restarts N] -- SCRIPT [ARGS...]

nccl-acceptance: nccl-tests all_reduce_perf over two nodes of an EFA pool, judged against the instance type's
bus-bandwidth minimum; the verdict is an Event on the launcher pod and the MPIJob's own status.
mpijob: the training-job template (an MPIJob over EFA on whole nodes of the pool, in the training queue).
pytorch-job: `torchrun SCRIPT` on whole nodes of an EFA pool as a JobSet in the training queue, which comes back
after a node is lost (spec/jobset.py).

Reads only the stack file (no cloud account). Exit codes: 0 rendered, 2 a config or usage error (one line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

import yaml

from spec import jobset

EXIT_OK, EXIT_USAGE = 0, 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("nccl-acceptance", "NCCL all_reduce_perf over two nodes of an EFA pool"),
                            ("mpijob", "a training job over EFA (the template)"),
                            ("pytorch-job", "a torchrun job over EFA that survives node loss (JobSet)")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--stack", required=True, help="stack name, e.g. prod-us-east-1")
        command.add_argument("--stack-file", type=Path, help="stack file instead of stacks/Pulumi.STACK.yaml")
        command.add_argument("--pool", required=True, help="a nodePools name of the stack")
        if name == "mpijob":
            command.add_argument("--image", required=True, help="training image with Open MPI, sshd, NCCL and "
                                 "aws-ofi-nccl (as the EFA installer lays them out)")
            command.add_argument("--workers", type=int, default=2, help="whole nodes (default 2)")
            command.add_argument("program", nargs="+", help="after --: what mpirun runs on every GPU")
        if name == "pytorch-job":
            command.add_argument("--image", required=True, help="training image with PyTorch (torchrun), NCCL and "
                                 "aws-ofi-nccl")
            command.add_argument("--nodes", type=int, default=2, help="whole nodes (default 2)")
            command.add_argument("--scratch", help="size of the NVMe scratch at /scratch, a Kubernetes quantity "
                                 "(default: half a node's ephemeral storage on RAID0 pools, else "
                                 f"{jobset.ROOT_VOLUME_SCRATCH})")
            command.add_argument("--max-restarts", type=int, default=jobset.DEFAULT_MAX_RESTARTS,
                                 help="restarts after the program fails (node losses do not count; default "
                                 f"{jobset.DEFAULT_MAX_RESTARTS})")
            command.add_argument("program", nargs="+", help="after --: what torchrun runs (the script and its "
                                 "arguments), one process per GPU")
        if name != "nccl-acceptance":
            command.add_argument("--name", required=True, help="the job's name (checkpoints are kept under it)")
            command.add_argument("--checkpoint-uri", default="", help="s3:// prefix the job checkpoints to and "
                                 "resumes from (passed to every rank as CHECKPOINT_URI)")
    args = parser.parse_args(argv)
    try:
        print(yaml.dump(render(args), Dumper=_ReadableDumper, sort_keys=False), end="")
    except (LookupError, ValueError) as error:   # ConfigError and StackFileError included: one line, exit 2
        print(f"python -m jobs {args.command}: {error}".splitlines()[0], file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


class UnknownPool(LookupError):
    pass


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (the launcher scripts) as literal blocks, as a person would write them."""


_ReadableDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def render(args) -> dict:
    from plan.stackfile import StackFileError, load_stack
    from spec import acceptance, kueue, lustre, mpijob
    from spec.errors import ConfigError
    from spec.tenancy import TRAINING_NAMESPACE

    try:
        _, spec = load_stack(args.stack, args.stack_file)
    except (ConfigError, StackFileError) as error:
        raise ValueError(f"stack {args.stack}: {error}") from None
    pools = {pool.spec.name: pool for pool in spec.pools}
    if args.pool not in pools:
        raise UnknownPool(f"stack {args.stack} has no pool {args.pool!r}; its pools: {', '.join(pools)}")
    pool = pools[args.pool]
    if not kueue.flavors([pool], spec.catalog):
        raise ValueError(f"pool {args.pool} is an inference pool; the training queue does not place jobs there")
    if args.command == "nccl-acceptance":
        return acceptance.mpijob_manifest(
            pool, spec.catalog, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
            judge_configmap=acceptance.JUDGE_CONFIGMAP, service_account=acceptance.SERVICE_ACCOUNT)
    if args.checkpoint_uri and not args.checkpoint_uri.startswith("s3://"):
        raise ValueError(f"--checkpoint-uri {args.checkpoint_uri!r} is not an s3:// URI")
    if args.command == "pytorch-job":
        return jobset.pytorch_jobset(
            pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
            nodes=args.nodes, program=args.program, checkpoint_uri=args.checkpoint_uri,
            scratch=args.scratch or jobset.default_scratch(pool, spec.storage.nvme_scratch),
            mounts_lustre=lustre.mounts_lustre(pool, spec.storage.lustre is not None),
            max_restarts=args.max_restarts, rendezvous_timeout_s=kueue.pods_ready_timeout_s(spec.node_image.source))
    return mpijob.training_mpijob(
        pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
        workers=args.workers, program=args.program, checkpoint_uri=args.checkpoint_uri,
        worker_wait_s=kueue.pods_ready_timeout_s(spec.node_image.source))


if __name__ == "__main__":
    sys.exit(main())
