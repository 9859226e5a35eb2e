"""Render a job for a stack's pool as YAML on stdout, to pipe into `kubectl create -f -`; and a Triton model's
config.pbtxt.

    python -m jobs job STACK --pool POOL --name NAME --image IMAGE [--gpus N] [--mig-profile PROFILE]
                       [JOB OPTIONS] -- PROGRAM [ARGS...]
    python -m jobs mpijob STACK --pool POOL --name NAME --image IMAGE [--workers N] [JOB OPTIONS] -- PROGRAM [ARGS...]
    python -m jobs pytorch-job STACK --pool POOL --name NAME --image IMAGE [--nodes N] [JOB OPTIONS]
                               -- SCRIPT [ARGS...]
    python -m jobs nccl-acceptance STACK --pool POOL
    python -m jobs triton-config MODEL --backend BACKEND --max-batch-size N --preferred-batch-sizes N[,N...]
                                 --max-queue-delay-us US [--instances-per-gpu N] [--gpus I[,I...]]
                                 [--input NAME:TYPE:DIMS]... [--output NAME:TYPE:DIMS]...

JOB OPTIONS: [--env KEY=VALUE]... [--volume CLAIM:/PATH[:ro]]... [--checkpoint-uri S3URI] [--scratch SIZE]
[--max-restarts N (job, pytorch-job)]. STACK may also be given as --stack STACK, as `python -m plan` accepts it too.

job: PROGRAM on one node of any pool of the training queue (spot and dev's included): the whole node, or --gpus N
(one share on time-sliced and MPS pools), as a batch/v1 Job that comes back after a disruption
(decisions/platform/single_job.py).
mpijob: the training-job template (an MPIJob over EFA on whole nodes of an EFA pool, in the training queue).
pytorch-job: `torchrun SCRIPT` on whole nodes of an EFA pool as a JobSet in the training queue, which comes back
after a node is lost (decisions/platform/jobset.py).
Each of the three mounts /scratch, /dev/shm, /data (where the stack has storage.lustre) and every --volume, sets
CHECKPOINT_DIR (and CHECKPOINT_URI with --checkpoint-uri) and every --env (decisions/platform/job_options.py); the
YAML's opening comment lists what is mounted.
nccl-acceptance: nccl-tests all_reduce_perf over two nodes of an EFA pool, judged against the instance type's
bus-bandwidth minimum; the verdict is an Event on the launcher pod and the MPIJob's own status.
triton-config: a model's config.pbtxt with dynamic batching (decisions/serving/triton.model_config_pbtxt), for the
models bucket (docs/inference.md). Here because this is the command that renders what a user hands to the running
platform, with no cloud account; it reads no stack.

Reads only the stack file (no cloud account). Exit codes: 0 rendered, 2 a config or usage error (one line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

import yaml

from decisions.platform import job_options, jobset, single_job
from decisions.serving import triton

EXIT_OK, EXIT_USAGE = 0, 2


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("nccl-acceptance", "NCCL all_reduce_perf over two nodes of an EFA pool"),
                            ("mpijob", "a training job over EFA (the template)"),
                            ("pytorch-job", "a torchrun job over EFA that survives node loss (JobSet)"),
                            ("job", "a job on one node of any pool of the training queue (a batch/v1 Job)")):
        command = commands.add_parser(name, help=help_text)
        # The stack positionally, as `python -m plan STACK` takes it, or with --stack.
        command.add_argument("stack_name", nargs="?", metavar="STACK", help="stack name, e.g. prod-us-east-1 "
                             "(or --stack STACK)")
        command.add_argument("--stack", help="the stack, as the positional STACK")
        command.add_argument("--stack-file", type=Path, help="stack file instead of stacks/Pulumi.STACK.yaml")
        command.add_argument("--pool", required=True, help="a nodePools name of the stack")
        if name == "mpijob":
            command.add_argument("--image", required=True, help="training image with Open MPI, sshd, NCCL and "
                                 "aws-ofi-nccl (as the EFA installer lays them out)")
            command.add_argument("--workers", type=int, default=2, help="whole nodes (default 2)")
            command.add_argument("program", nargs="*", help="after --: what mpirun runs on every GPU")
        if name == "job":
            command.add_argument("--image", required=True, help="the job's image")
            command.add_argument("--gpus", type=int, help="GPUs (MIG instances on MIG pools) to take; default the "
                                 "whole node, or one share on time-sliced and MPS pools (the most they grant a pod)")
            command.add_argument("--mig-profile", help="on a MIG pool with several profiles, the one --gpus counts")
            command.add_argument("--max-restarts", type=int, default=jobset.DEFAULT_MAX_RESTARTS,
                                 help="restarts after the program fails (disruptions do not count; default "
                                 f"{jobset.DEFAULT_MAX_RESTARTS})")
            command.add_argument("program", nargs="*", help="after --: the command the job runs, and its arguments")
        if name == "pytorch-job":
            command.add_argument("--image", required=True, help="training image with PyTorch (torchrun), NCCL and "
                                 "aws-ofi-nccl")
            command.add_argument("--nodes", type=int, default=2, help="whole nodes (default 2)")
            command.add_argument("--max-restarts", type=int, default=jobset.DEFAULT_MAX_RESTARTS,
                                 help="restarts after the program fails (node losses do not count; default "
                                 f"{jobset.DEFAULT_MAX_RESTARTS})")
            command.add_argument("program", nargs="*", help="after --: what torchrun runs (the script and its "
                                 "arguments), one process per GPU")
        if name != "nccl-acceptance":
            command.add_argument("--name", required=True, help="the job's name (checkpoints are kept under it)")
            command.add_argument("--checkpoint-uri", default="", help="s3:// prefix the job checkpoints to and "
                                 "resumes from (passed to every rank as CHECKPOINT_URI), such as "
                                 "s3://<the stack's checkpoints bucket>/NAME")
            command.add_argument("--scratch", help="size of the scratch emptyDir at /scratch, a Kubernetes quantity "
                                 "(default: half a node's ephemeral storage on NVMe RAID0 pools, else "
                                 f"{jobset.ROOT_VOLUME_SCRATCH}; a job's share of that on part of a node)")
            command.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                                 help="an environment variable for the program (repeat for more); replaces a "
                                 "template default of the same name")
            command.add_argument("--volume", action="append", default=[], metavar="CLAIM:/PATH[:ro]",
                                 help="mount a PersistentVolumeClaim of the training namespace at /PATH, read-only "
                                 "with :ro (repeat for more)")
    _triton_config_arguments(commands.add_parser("triton-config", help="a Triton model's config.pbtxt with dynamic "
                                                 "batching"))
    argv = list(sys.argv[1:] if argv is None else argv)
    # What follows `--` is the program, split off here: argparse would give its first word to STACK.
    tail = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:len(argv) - len(tail) - 1] if "--" in argv else argv)
    if args.command == "triton-config":
        if tail:
            parser.error(f"triton-config: unrecognized arguments: -- {' '.join(tail)}")
        try:
            print(triton_config(args), end="")
        except ValueError as error:
            print(f"python -m jobs triton-config: {error}".splitlines()[0], file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    _name_the_stack(parser, args, tail)
    try:
        manifest = render(args)
        print(opening_comment(args, manifest) + yaml.dump(manifest, Dumper=_ReadableDumper, sort_keys=False), end="")
    except (LookupError, ValueError) as error:   # ConfigError and StackFileError included: one line, exit 2
        print(f"python -m jobs {args.command}: {error}".splitlines()[0], file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _name_the_stack(parser, args, tail: List[str]) -> None:
    """args.stack from STACK or --stack, and args.program from the rest: with --stack, every positional word is the
    program's (as before STACK was positional); without it, the first is the stack."""
    words = ([args.stack_name] if args.stack_name else []) + list(getattr(args, "program", []) or [])
    if not args.stack:
        if not words:
            parser.error(f"{args.command}: name the stack: python -m jobs {args.command} STACK (or --stack STACK)")
        args.stack = words.pop(0)
    elif words and words[0] == args.stack:
        parser.error(f"{args.command}: the stack is named twice ({args.stack} and --stack {args.stack})")
    program = words + tail
    if hasattr(args, "program"):
        if not program:
            parser.error(f"{args.command}: give the program after --, e.g. -- python train.py")
        args.program = program
    elif program:
        parser.error(f"{args.command}: unrecognized arguments: {' '.join(program)}")


class UnknownPool(LookupError):
    pass


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (the launcher scripts) as literal blocks, as a person would write them."""


_ReadableDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def render(args) -> dict:
    from decisions.config.errors import ConfigError
    from decisions.nodes.pools import queue_flavor
    from decisions.platform import acceptance, kueue, mpijob
    from decisions.platform.tenancy import TRAINING_NAMESPACE
    from decisions.storage import lustre
    from plan.stackfile import StackFileError, load_stack

    try:
        _, spec = load_stack(args.stack, args.stack_file)
    except (ConfigError, StackFileError) as error:
        raise ValueError(f"stack {args.stack}: {error}") from None
    pools = {pool.spec.name: pool for pool in spec.pools}
    if args.pool not in pools:
        raise UnknownPool(f"stack {args.stack} has no pool {args.pool!r}; its pools: {', '.join(pools)}")
    pool = pools[args.pool]
    if not queue_flavor(pool):
        queue_pools = [p.spec.name for p in spec.pools if queue_flavor(p)]
        raise ValueError(f"pool {args.pool} is an inference pool; the training queue does not place jobs there "
                         f"(its pools in stack {args.stack}: {', '.join(queue_pools) or 'none'})")
    if args.command == "nccl-acceptance":
        return acceptance.mpijob_manifest(
            pool, spec.catalog, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
            judge_configmap=acceptance.JUDGE_CONFIGMAP, service_account=acceptance.SERVICE_ACCOUNT)
    if args.checkpoint_uri and not args.checkpoint_uri.startswith("s3://"):
        raise ValueError(f"--checkpoint-uri {args.checkpoint_uri!r} is not an s3:// URI")
    # PET_* only where torchrun reads them.
    reserved = job_options.TORCHRUN_ENV_PREFIXES if args.command == "pytorch-job" else None
    env, volumes = job_options.parse_env(args.env, reserved), job_options.parse_volumes(args.volume)
    lustre_configured = spec.storage.lustre is not None
    storage = dict(mounts_lustre=lustre.mounts_lustre(pool, lustre_configured), lustre_configured=lustre_configured,
                   env=env, volumes=volumes)
    whole_node_scratch = jobset.default_scratch(pool, spec.storage.nvme_scratch)
    if args.command == "job":
        _, share = single_job.gpu_request(pool, spec.catalog, args.gpus, args.mig_profile)
        return single_job.single_node_job(
            pool, spec.catalog, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
            image=args.image, program=args.program, gpus=args.gpus, mig_profile=args.mig_profile,
            checkpoint_uri=args.checkpoint_uri, max_restarts=args.max_restarts,
            scratch=args.scratch or single_job.default_scratch(whole_node_scratch, share), **storage)
    _multi_node_pool(args, spec, pool)
    if args.command == "pytorch-job":
        return jobset.pytorch_jobset(
            pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
            nodes=args.nodes, program=args.program, checkpoint_uri=args.checkpoint_uri,
            scratch=args.scratch or whole_node_scratch, max_restarts=args.max_restarts,
            rendezvous_timeout_s=kueue.pods_ready_timeout_s(spec.node_image.source), **storage)
    return mpijob.training_mpijob(
        pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
        workers=args.workers, program=args.program, checkpoint_uri=args.checkpoint_uri,
        scratch=args.scratch or whole_node_scratch,
        worker_wait_s=kueue.pods_ready_timeout_s(spec.node_image.source), **storage)


def _multi_node_pool(args, spec, pool) -> None:
    """mpijob and pytorch-job run over EFA on whole GPUs: on another pool, say so and point at `job`."""
    mode = pool.spec.gpu_sharing.mode
    if pool.efa and mode == "none":
        return
    from decisions.nodes.pools import queue_flavor

    fit = [p.spec.name for p in spec.pools if p.efa and p.spec.gpu_sharing.mode == "none" and queue_flavor(p)]
    why = "EFA is off" if not pool.efa else f"GPU sharing mode {mode!r}"
    raise ValueError(f"pool {pool.name}: {why}; {args.command} runs over several whole nodes through EFA and needs "
                     f"an EFA pool of whole GPUs (stack {args.stack} has {', '.join(fit) or 'none'}); for work on one "
                     f"node of {pool.name}: python -m jobs job {args.stack} --pool {pool.name} ...")


def _program_container(manifest: dict) -> tuple:
    """(pod spec, container, env) of the container that runs the user's program in a rendered template: the Job's
    only container, the JobSet's trainer, or the MPIJob's workers (whose ranks get the launcher's forwarded env)."""
    kind = manifest["kind"]
    if kind == "Job":
        pod = manifest["spec"]["template"]["spec"]
        env_from = pod["containers"][0]
    elif kind == "JobSet":
        pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        env_from = pod["containers"][0]
    else:
        replicas = manifest["spec"]["mpiReplicaSpecs"]
        pod = replicas["Worker"]["template"]["spec"]
        env_from = replicas["Launcher"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in env_from.get("env") or [] if "value" in e}
    return pod, pod["containers"][0], env


def opening_comment(args, manifest: dict) -> str:
    """YAML comment lines before a job template: what it is, and what its program finds mounted (nothing before
    the NCCL acceptance test, which runs no program of the user's)."""
    if args.command == "nccl-acceptance":
        return ""
    from decisions.storage import lustre

    pod, container, env = _program_container(manifest)
    what = f"python -m jobs {args.command}: {manifest['kind']} {args.name} on pool {args.pool} of stack {args.stack}"
    comment = job_options.mounts_comment(what, pod, container, env)
    if lustre.FILE_SYSTEM_PATH not in {mount["mountPath"] for mount in container.get("volumeMounts") or []}:
        comment += f"# no {lustre.FILE_SYSTEM_PATH}: stack {args.stack} has no storage.lustre\n"
    return comment


def _triton_config_arguments(command) -> None:
    command.add_argument("model", metavar="MODEL", help="the model's name, as its directory in the repository")
    command.add_argument("--backend", required=True, help="Triton backend: onnxruntime, tensorrt, pytorch, python, ...")
    command.add_argument("--max-batch-size", type=int, required=True, help="the largest batch (at least 1)")
    command.add_argument("--preferred-batch-sizes", required=True, metavar="N[,N...]",
                         help="batch sizes the dynamic batcher aims for, comma-separated")
    command.add_argument("--max-queue-delay-us", type=int, required=True,
                         help="the longest a request waits for a batch to fill, in microseconds")
    command.add_argument("--instances-per-gpu", type=int, default=1, help="copies of the model on each GPU (default 1)")
    command.add_argument("--gpus", metavar="I[,I...]", help="the GPUs (indices) it runs on; default every GPU the "
                         "pod has")
    for tensor in ("input", "output"):
        command.add_argument(f"--{tensor}", action="append", default=[], metavar="NAME:TYPE:DIMS",
                             help=f"an {tensor} tensor, e.g. {tensor}0:TYPE_FP32:3,224,224 (DIMS without the batch "
                             "dimension, -1 for a variable one); leave out for backends that read it from the model")


def _integers(option: str, text: str) -> List[int]:
    try:
        return [int(word) for word in text.split(",")]
    except ValueError:
        raise ValueError(f"{option} {text!r}: give whole numbers separated by commas, e.g. 8,16") from None


def triton_config(args) -> str:
    """config.pbtxt of `args` (the triton-config subcommand), through decisions/serving/triton.model_config_pbtxt."""
    return triton.model_config_pbtxt(
        args.model, backend=args.backend, max_batch_size=args.max_batch_size,
        preferred_batch_sizes=_integers("--preferred-batch-sizes", args.preferred_batch_sizes),
        max_queue_delay_us=args.max_queue_delay_us, instances_per_gpu=args.instances_per_gpu,
        gpus=_integers("--gpus", args.gpus) if args.gpus else None,
        inputs=[triton.parse_tensor("--input", text) for text in args.input],
        outputs=[triton.parse_tensor("--output", text) for text in args.output])


if __name__ == "__main__":
    sys.exit(main())
