"""Render a job for a stack's pool as YAML on stdout, to pipe into `kubectl create -f -`; and a Triton model's
config.pbtxt.

    python -m jobs job STACK --pool POOL --name NAME --image IMAGE [--gpus N] [--mig-profile PROFILE]
                       [JOB OPTIONS] -- PROGRAM [ARGS...]
    python -m jobs mpijob STACK --pool POOL --name NAME --image IMAGE [--nodes N] [JOB OPTIONS] -- PROGRAM [ARGS...]
    python -m jobs pytorch-job STACK --pool POOL --name NAME --image IMAGE [--nodes N] [JOB OPTIONS]
                               -- SCRIPT [ARGS...]
    python -m jobs nccl-acceptance STACK --pool POOL
    python -m jobs triton-config MODEL --backend BACKEND --max-batch-size N --preferred-batch-sizes N[,N...]
                                 --max-queue-delay-us US [--instances-per-gpu N] [--gpus I[,I...]]
                                 [--input NAME:TYPE:DIMS]... [--output NAME:TYPE:DIMS]...
    python -m jobs fit STACK --model MODEL [MODEL OPTIONS] [--json]

JOB OPTIONS: [--env KEY=VALUE]... [--volume CLAIM:/PATH[:ro]]... [--checkpoint-uri S3URI] [--scratch SIZE]
[--max-restarts N] [--max-run-time DURATION (the queue stops the job then; a capacity block admits it only if it
ends before the block closes: decisions/nodes/capacity_blocks.py)]. STACK may also be given as --stack STACK, as `python -m plan` accepts it too. mpijob's --workers
is the old name of its --nodes (it still works, with a note on stderr).
MODEL OPTIONS: [--hidden-size N --layers N --heads N [--kv-heads N] [--vocab N]] [--precision P] [--optimizer O]
[--batch N] [--sequence N] [--inference] [--recompute] [--attention eager|flash]; job, mpijob and pytorch-job take
--model and them too.

job: PROGRAM on one node of any pool of the training queue (spot and dev's included): the whole node, or --gpus N
(one share on time-sliced and MPS pools), as a batch/v1 Job that comes back after a disruption
(decisions/platform/single_job.py).
mpijob: the training-job template (an MPIJob over EFA on whole nodes of an EFA pool, in the training queue).
pytorch-job: `torchrun SCRIPT` on whole nodes of a pool of whole GPUs as a JobSet in the training queue, which comes
back after a node is lost (decisions/platform/jobset.py): over EFA on EFA pools, else over TCP, with a warning on
stderr of the bandwidth that gets.
Each of the three mounts /scratch, /dev/shm (the MPS server's on MPS pools), /data and /nccl-traces (where the stack
has storage.lustre) and every --volume, sets CHECKPOINT_DIR (and CHECKPOINT_URI with --checkpoint-uri) and every
--env (decisions/platform/job_options.py); the YAML's opening comment lists what is mounted.
nccl-acceptance: nccl-tests all_reduce_perf over two nodes of an EFA pool, judged against the instance type's
bus-bandwidth minimum; the verdict is an Event on the launcher pod and the MPIJob's own status.
triton-config: a model's config.pbtxt with dynamic batching (decisions/serving/triton.model_config_pbtxt), for the
models bucket (docs/inference.md). Here because this is the command that renders what a user hands to the running
platform, with no cloud account; it reads no stack.
fit: the GPU memory a model needs (a preset, or a transformer's parameter count and shape) in training or
inference, and the smallest placement on the training queue's pools that holds it: an MPS share, a MIG instance,
GPUs of one node or whole nodes, with the sharding it assumes; as a table, or JSON with --json
(decisions/platform/memory_fit.py). With --model, job, mpijob and pytorch-job pick that placement on --pool, or refuse
the --gpus, --mig-profile or --nodes given when the model does not fit them.

Reads only the stack file (no cloud account). Exit codes: 0 rendered, 2 a config or usage error (one line); fit: 0
placed, 1 no placement holds the model (the answer says why, with the figure).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

import yaml

from decisions.platform import job_options, jobset, mpijob, single_job
from decisions.serving import triton

EXIT_OK, EXIT_USAGE = 0, 2
EXIT_NO_FIT = 1                     # fit: no placement holds the model
DEFAULT_NODES = 2                   # mpijob's and pytorch-job's


def one_line(message: str) -> str:
    """An error on one line: its first line, and the first of the mistakes a stack's ConfigError lists under it (its
    first line only says how many there are), with how many more there are."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    more = f" (and {len(lines) - 2} more: python -m plan STACK lists them)" if len(lines) > 2 else ""
    return " ".join(lines[:2]) + more


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("nccl-acceptance", "NCCL all_reduce_perf over two nodes of an EFA pool"),
                            ("mpijob", "a training job over EFA (the template)"),
                            ("pytorch-job", "a torchrun job over EFA (TCP without) that survives node loss (JobSet)"),
                            ("job", "a job on one node of any pool of the training queue (a batch/v1 Job)")):
        command = commands.add_parser(name, help=help_text)
        _stack_arguments(command)
        command.add_argument("--pool", required=True, help="a nodePools name of the stack")
        if name == "mpijob":
            command.add_argument("--image", required=True, help="training image with Open MPI, sshd, NCCL and "
                                 "aws-ofi-nccl (as the EFA installer lays them out)")
            # Neither has a default (render supplies DEFAULT_NODES): argparse counts an option given with its
            # default's value as not given, and would let --workers 3 --nodes 2 through.
            nodes = command.add_mutually_exclusive_group()
            nodes.add_argument("--nodes", type=int, default=argparse.SUPPRESS,
                               help=f"whole nodes (default {DEFAULT_NODES})")
            nodes.add_argument("--workers", type=int, dest="nodes", action=_DeprecatedAlias, default=argparse.SUPPRESS,
                               help="the old name of --nodes")
            command.add_argument("--max-restarts", type=int, default=mpijob.TRAINING_BACKOFF_LIMIT,
                                 help="times mpirun runs again after a failure, a lost node's included (default "
                                 f"{mpijob.TRAINING_BACKOFF_LIMIT})")
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
            command.add_argument("--nodes", type=int, default=DEFAULT_NODES,
                                 help=f"whole nodes (default {DEFAULT_NODES})")
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
            command.add_argument("--max-run-time", metavar="DURATION",
                                 help="the longest the job runs once admitted (90m, 6h, 1d12h): the queue stops it "
                                 "then, and a capacity-block pool admits it only if it ends before the block closes")
            _model_arguments(command)
    _triton_config_arguments(commands.add_parser("triton-config", help="a Triton model's config.pbtxt with dynamic "
                                                 "batching"))
    _fit_arguments(commands.add_parser("fit", help="where a model fits: its GPU memory, and the smallest placement on "
                                       "the stack's pools"))
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
            print(one_line(f"python -m jobs triton-config: {error}"), file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    _name_the_stack(parser, args, tail)
    if args.command == "fit":
        return fit_command(args)
    args.placement_options = _named_options(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        manifest = job_options.declare_max_run_time(render(args), getattr(args, "max_run_time", None))
        print(opening_comment(args, manifest) + yaml.dump(manifest, Dumper=_ReadableDumper, sort_keys=False), end="")
    except (LookupError, ValueError) as error:   # ConfigError and StackFileError included: one line, exit 2
        print(one_line(f"python -m jobs {args.command}: {error}"), file=sys.stderr)
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


class _DeprecatedAlias(argparse.Action):
    """An option's old name: sets the option it names (its dest), with a note on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated; use --{self.dest} (the same value)", file=sys.stderr)
        setattr(namespace, self.dest, values)


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (the launcher scripts) as literal blocks, as a person would write them."""


_ReadableDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _stack_spec(args):
    """The stack's StackSpec, read as every command reads it (a config mistake is a ValueError naming the stack)."""
    from decisions.config.errors import ConfigError
    from plan.stackfile import StackFileError, load_stack

    try:
        return load_stack(args.stack, args.stack_file)[1]
    except (ConfigError, StackFileError) as error:
        raise ValueError(f"stack {args.stack}: {error}") from None


def render(args) -> dict:
    from decisions.nodes.pools import queue_flavor
    from decisions.platform import acceptance, kueue
    from decisions.platform.tenancy import TRAINING_NAMESPACE
    from decisions.storage import lustre

    spec = _stack_spec(args)
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
    reserved = job_options.PYTORCH_JOB_ENV_PREFIXES if args.command == "pytorch-job" else None
    env, volumes = job_options.parse_env(args.env, reserved), job_options.parse_volumes(args.volume)
    lustre_configured = spec.storage.lustre is not None
    storage = dict(mounts_lustre=lustre.mounts_lustre(pool, lustre_configured), lustre_configured=lustre_configured,
                   env=env, volumes=volumes)
    whole_node_scratch = jobset.default_scratch(pool, spec.storage.nvme_scratch)
    if args.command == "job":
        args.placement = _placement(args, spec, pool)
        _, share = single_job.gpu_request(pool, spec.catalog, args.gpus, args.mig_profile)
        return single_job.single_node_job(
            pool, spec.catalog, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE,
            image=args.image, program=args.program, gpus=args.gpus, mig_profile=args.mig_profile,
            checkpoint_uri=args.checkpoint_uri, max_restarts=args.max_restarts,
            scratch=args.scratch or single_job.default_scratch(whole_node_scratch, share), **storage)
    _multi_node_pool(args, spec, pool)
    args.placement = _placement(args, spec, pool)
    if args.command == "pytorch-job":
        manifest = jobset.pytorch_jobset(
            pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
            nodes=args.nodes, program=args.program, checkpoint_uri=args.checkpoint_uri,
            scratch=args.scratch or whole_node_scratch, max_restarts=args.max_restarts,
            rendezvous_timeout_s=kueue.pods_ready_timeout_s(spec.node_image.source), **storage)
        warning = jobset.socket_bandwidth_warning(pool)
        if warning:
            print(f"python -m jobs pytorch-job: warning: {warning}", file=sys.stderr)
        return manifest
    return mpijob.training_mpijob(
        pool, name=args.name, namespace=TRAINING_NAMESPACE, queue_name=kueue.LOCAL_QUEUE, image=args.image,
        workers=getattr(args, "nodes", DEFAULT_NODES), program=args.program, checkpoint_uri=args.checkpoint_uri,
        scratch=args.scratch or whole_node_scratch, max_restarts=args.max_restarts,
        worker_wait_s=kueue.pods_ready_timeout_s(spec.node_image.source), **storage)


def _multi_node_pool(args, spec, pool) -> None:
    """mpijob runs over EFA on whole GPUs, pytorch-job on whole GPUs (over EFA where the pool has it): on another
    pool, say so and point at `job`."""
    from decisions.nodes.pools import queue_flavor

    needs_efa = args.command == "mpijob"
    fits = lambda p: p.spec.gpu_sharing.mode == "none" and (p.efa or not needs_efa)  # noqa: E731
    if fits(pool):
        return
    fit = [p.spec.name for p in spec.pools if fits(p) and queue_flavor(p)]
    mode = pool.spec.gpu_sharing.mode
    why, needs = (("EFA is off", "through EFA and needs an EFA pool of whole GPUs") if needs_efa and not pool.efa
                  else (f"GPU sharing mode {mode!r}", "and needs a pool of whole GPUs"))
    raise ValueError(f"pool {pool.name}: {why}; {args.command} runs over several whole nodes {needs} (stack "
                     f"{args.stack} has {', '.join(fit) or 'none'}); for work on one node of {pool.name}: "
                     f"python -m jobs job {args.stack} --pool {pool.name} ...")


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
    if args.placement is not None:
        comment += _placement_comment(args.model, args.placement)
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


def _stack_arguments(command) -> None:
    # The stack positionally, as `python -m plan STACK` takes it, or with --stack.
    command.add_argument("stack_name", nargs="?", metavar="STACK", help="stack name, e.g. prod-us-east-1 "
                         "(or --stack STACK)")
    command.add_argument("--stack", help="the stack, as the positional STACK")
    command.add_argument("--stack-file", type=Path, help="stack file instead of stacks/Pulumi.STACK.yaml")


# The options that name a job's placement; with --model, the one named is checked instead of one being picked.
PLACEMENT_OPTIONS = ("--gpus", "--mig-profile", "--nodes", "--workers")
# The options that describe the model (decisions/platform/memory_fit.workload), by their argparse dest.
MODEL_OPTIONS = {"hidden_size": "--hidden-size", "layers": "--layers", "heads": "--heads", "kv_heads": "--kv-heads",
                 "vocab": "--vocab", "precision": "--precision", "optimizer": "--optimizer", "batch": "--batch",
                 "sequence": "--sequence", "inference": "--inference", "recompute": "--recompute",
                 "attention": "--attention"}


def _model_arguments(command, required: bool = False) -> None:
    """--model and what describes it, for the GPU memory estimate (decisions/platform/memory_fit.py)."""
    from decisions.platform.memory_fit import ATTENTIONS, OPTIMIZERS, load_model_data

    data = load_model_data()
    what = ("the job's model: its GPU memory is estimated, and the placement on --pool picked (the smallest that "
            "holds it), or the one --gpus, --mig-profile or --nodes names checked; "
            if not required else "the model: ")
    command.add_argument("--model", required=required, help=what + f"a preset ({', '.join(data.presets)}) or a "
                         "transformer's parameter count (7b, 350m) with --hidden-size, --layers, --heads and "
                         "--sequence")
    for option, help_text in (("--hidden-size", "a counted model's hidden size"), ("--layers", "its layers"),
                              ("--heads", "its attention heads"),
                              ("--kv-heads", "its key/value heads (default: --heads; fewer with grouped-query "
                               "attention)"),
                              ("--vocab", "the vocabulary of its language-model head (default none: a classifier)")):
        command.add_argument(option, type=int, help=help_text)
    command.add_argument("--precision", choices=list(data.precisions),
                         help="what weights are kept in (default: the preset's, bf16 for a counted model; int8 and "
                         "int4 for inference)")
    command.add_argument("--optimizer", type=lambda text: "adam" if text == "adamw" else text,
                         help=f"training's optimizer: {', '.join(OPTIMIZERS)} or adamw (default: the preset's, "
                         "adam for a counted model)")
    command.add_argument("--batch", type=int, help="samples per GPU (concurrent sequences in inference; default 1)")
    command.add_argument("--sequence", type=int, help="tokens per sample (the context kept in inference; default: "
                         "a preset's context length)")
    command.add_argument("--inference", action="store_true", help="estimate inference (weights and KV cache), not "
                         "training")
    command.add_argument("--recompute", action="store_true", help="training with full activation recomputation "
                         "(activation checkpointing)")
    command.add_argument("--attention", choices=list(ATTENTIONS), help="eager keeps the s x s attention scores, "
                         "flash does not (default: the preset's, flash for a counted model)")


def _named_options(words: List[str]) -> List[str]:
    """The PLACEMENT_OPTIONS the command line names, as argparse reads them (whole, with =VALUE, or abbreviated)."""
    named = [word.split("=", 1)[0] for word in words if word.startswith("--") and len(word) > 2]
    return [option for option in PLACEMENT_OPTIONS if any(option.startswith(word) for word in named)]


def _workload(args):
    from decisions.platform import memory_fit

    return memory_fit.workload(
        args.model, hidden=args.hidden_size, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
        vocab=args.vocab, precision=args.precision, optimizer=args.optimizer, batch=args.batch or 1,
        sequence=args.sequence, inference=args.inference, recompute=args.recompute, attention=args.attention)


def _node_hourly(spec) -> dict:
    """Each pool's node rate as the plan prices it (decisions/cost/cost.py), None where unpriced."""
    from decisions.cost.cost import pool_costs

    return {row.pool: row.node_hourly
            for row in pool_costs(spec.pools, spec.catalog, spec.region, assumed=spec.budget.assumed)}


def _placement(args, spec, pool):
    """With --model, the job's placement on `pool`: the one --gpus, --mig-profile or --nodes names, checked (a
    ValueError with the figure when the model does not fit it), or the smallest that holds it, set on `args`.
    None without --model. `args` as main parses them; a caller's own Namespace may leave the model options out."""
    from decisions.platform import memory_fit

    if getattr(args, "model", None) is None:
        described = [option for dest, option in MODEL_OPTIONS.items()
                     if getattr(args, dest, None) not in (None, False)]
        if described:
            raise ValueError(f"{described[0]} describes the model for the memory estimate: give --model too")
        return None
    workload, hourly = _workload(args), _node_hourly(spec).get(pool.name)
    if getattr(args, "placement_options", ()):
        if args.command == "job":
            single_job.gpu_request(pool, spec.catalog, args.gpus, args.mig_profile)
            slot = memory_fit.requested_slot(pool, spec.catalog, hourly, gpus=args.gpus, mig_profile=args.mig_profile)
        else:
            mpijob.check_whole_nodes(pool, args.nodes)
            slot = memory_fit.requested_slot(pool, spec.catalog, hourly, nodes=args.nodes)
        return memory_fit.check_request(workload, slot)
    placed = memory_fit.choose_on_pool(workload, pool, spec.catalog, hourly, whole_nodes=args.command != "job")
    if args.command != "job":
        args.nodes = placed.slot.nodes
    elif placed.slot.share != "mps":
        args.gpus, args.mig_profile = placed.slot.gpus, placed.slot.profile
    return placed


def _placement_comment(model: str, placement) -> str:
    from decisions.platform.memory_fit import GIB

    sharding = "" if placement.sharding == "none" else f", {placement.sharding}"
    return (f"# --model {model}: {placement.estimate.total / GIB:.1f} GiB per GPU on {placement.slot.describe()}"
            f"{sharding}\n")


def _fit_arguments(command) -> None:
    _stack_arguments(command)
    _model_arguments(command, required=True)
    command.add_argument("--json", action="store_true", help="the answer as JSON (gpuMemoryGiB per GPU, the "
                         "placement, the estimate's parts, each pool's answer)")


def fit_command(args) -> int:
    """`python -m jobs fit`: the model's GPU memory and its smallest placement on the stack's pools; exit 1 (the
    answer printed, with the figure) when none holds it."""
    from decisions.platform import memory_fit

    try:
        spec, workload = _stack_spec(args), _workload(args)
    except ValueError as error:
        print(one_line(f"python -m jobs fit: {error}"), file=sys.stderr)
        return EXIT_USAGE
    answer = memory_fit.fit(workload, spec.pools, spec.catalog, _node_hourly(spec))
    print(json.dumps(memory_fit.fit_document(answer, spec.stack), indent=2) if args.json
          else memory_fit.fit_report(answer, spec.stack), end="\n" if args.json else "")
    return EXIT_OK if answer.placement else EXIT_NO_FIT


if __name__ == "__main__":
    sys.exit(main())
