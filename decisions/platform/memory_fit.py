"""Where a model fits: its GPU memory, estimated from its size and how it runs, and the smallest placement on a stack's
pools that holds it (`python -m jobs fit`, and `--model` on the job commands). Pure: no Pulumi. The figures are data in
model_presets.yaml, each with its source.

The estimate, per GPU, in bytes (P parameters; s sequence, b batch per GPU, h hidden size, a attention heads, L layers,
v the vocabulary of a language-model head; w, x: bytes of a weight and of an activation in the precision)
---------------------------------------------------------------------------------------------------------------------
Training:
- weights P·w and gradients P·w; optimizer states P·(m + o), m the fp32 master copy mixed precision keeps (4 when w
  is under 4, else 0) and o the optimizer's own (Adam 8, SGD with momentum 4, SGD 0): mixed-precision Adam is ZeRO's
  2 + 2 + 12 = 16 bytes per parameter (Rajbhandari et al. 2020, section 3.1).
- activations of a transformer: per layer sbh(34 + 5as/h) in 16-bit (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", section 4.1). Its parts: 32sbh and 4as²b of 2-byte values, 2sbh and
  as²b of 1-byte dropout masks; so with x-byte values, sbh(16x + 2) + as²b(2x + 1) (66 and 9 in fp32). Flash attention
  keeps no s x s scores: the as²b term is 0. Full recomputation keeps each layer's input, x·sbh (the paper's 2sbh),
  and one layer's activations while it is recomputed. A language-model head adds the logits of the loss, kept in fp32
  as the paper counts them, 4sbv. A convolutional network's are its feature maps for one input (a preset's figure, in
  fp32) times b, scaled to x bytes.
- The activations are multiplied by trainingActivationFactor: what the backward pass and the allocator hold beyond
  them, fitted to HuggingFace's measurements (model_presets.yaml says which).
- On N GPUs with ZeRO-3 / FSDP full sharding, weights, gradients and optimizer states are divided by N, and each GPU
  also holds the one layer it gathers at a time, (P/L)·w of weights and of gradients (ZeRO's partitioned parameters
  are gathered for each layer's forward and backward pass, then dropped). Activations stay per GPU (b is the batch each
  GPU runs).
Inference:
- weights P·w, and the KV cache 2·L·k·(h/a)·x·b·s for k key/value heads (two vectors of h/a values per head, layer and
  token: Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention", section
  3, OPT-13B's 800 KB a token). Activations of one forward pass are not counted: nothing is kept for a backward pass.
- On N GPUs of one node, tensor parallelism divides the weights by N and gives each GPU its share of the key/value
  heads (at least one).
Both: runtimeOverheadMiB per GPU, the CUDA context and kernels.

Placements, smallest first
--------------------------
On the pools of the training queue (decisions/nodes/pools.queue_flavor), what one pod can be given there:
- an MPS share, its memory limit the GPU's memory / replicas in whole MiB (NVIDIA/k8s-device-plugin v0.20.0
  cmd/mps-control-daemon/mps/daemon.go lines 119-124 and 253-271: the MPS server's set_default_device_pinned_mem_limit
  of totalMemory/replicas/1024/1024 MiB; decisions/platform/gpu_operator.py);
- one MIG instance of a profile of the pool's layout, with its own memory (decisions/nodes/pools.slot_memory_mib);
- 1 to all GPUs of one node, or whole nodes of a pool of whole GPUs (decisions/platform/mpijob.check_whole_nodes).
A time-sliced share is never a placement: time-slicing does not partition memory (every replica sees the whole GPU),
so a share has no memory of its own to fit. Several GPUs replicate the model (data parallel) when it fits one of
them, and shard it (ZeRO-3 in training, tensor parallel in inference, on one node) when it does not. The smallest
placement reserves the least GPU memory, then costs the least an hour (the node's rate, decisions/cost, times the
part of the node's GPU memory it reserves).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Literal, Mapping, Optional, Sequence, Tuple, get_args

from pydantic import Field, model_validator

from decisions.catalog.data_files import DataModel, load_model
from decisions.config.model import REPLICATED_MODES
from decisions.nodes.pools import GPU_RESOURCE, mig_layout, mig_resource, queue_flavor, slot_memory_mib

PRESETS_PATH = Path(__file__).with_name("model_presets.yaml")
MIB, GIB = 2 ** 20, 2 ** 30
LOGIT_BYTES = 4                       # the loss's logits are fp32 (Korthikanti et al. 2022)
FEATURE_BYTES = 4                     # a preset's feature-map figure is in fp32
Attention = Literal["eager", "flash"]
Optimizer = Literal["sgd", "sgd-momentum", "adam"]
ATTENTIONS, OPTIMIZERS = get_args(Attention), get_args(Optimizer)
Sharding = Literal["none", "data-parallel", "zero-3", "tensor-parallel"]


class Precision(DataModel):
    weight_bytes: float = Field(alias="weightBytes", gt=0)
    activation_bytes: int = Field(alias="activationBytes", gt=0)
    training: bool
    trains_as: Optional[str] = Field(default=None, alias="trainsAs")


class Preset(DataModel):
    """A model as published: a transformer's shape, or a convolutional network's feature maps for one input."""
    kind: Literal["transformer", "cnn"]
    parameters: int = Field(gt=0)
    hidden: Optional[int] = Field(default=None, gt=0)
    layers: Optional[int] = Field(default=None, gt=0)
    heads: Optional[int] = Field(default=None, gt=0)
    kv_heads: Optional[int] = Field(default=None, alias="kvHeads", gt=0)
    lm_head_vocab: int = Field(default=0, alias="lmHeadVocab", ge=0)
    sequence: Optional[int] = Field(default=None, gt=0)
    attention: Attention = "flash"
    feature_mib_per_sample: Optional[float] = Field(default=None, alias="featureMiBPerSample", gt=0)
    precision: str = "bf16"           # a preset's own; a model given by its count trains as most LLMs now do
    optimizer: Optimizer = "adam"

    @model_validator(mode="after")
    def _shape_for_kind(self) -> "Preset":
        shape = (self.hidden, self.layers, self.heads, self.kv_heads, self.sequence)
        if self.kind == "transformer":
            if None in shape:
                raise ValueError("a transformer needs hidden, layers, heads, kvHeads and sequence")
            check_shape(self.hidden, self.heads, self.kv_heads)
        elif self.feature_mib_per_sample is None or any(value is not None for value in shape):
            raise ValueError("a cnn gives featureMiBPerSample, and no transformer shape")
        return self


class ModelData(DataModel):
    presets: Dict[str, Preset]
    precisions: Dict[str, Precision]
    optimizer_state_bytes: Dict[Optimizer, int] = Field(alias="optimizerStateBytes")
    master_weight_bytes: int = Field(alias="masterWeightBytes", gt=0)
    fp8_architectures: Tuple[str, ...] = Field(alias="fp8Architectures")
    runtime_overhead_mib: int = Field(alias="runtimeOverheadMiB", gt=0)
    training_activation_factor: float = Field(alias="trainingActivationFactor", ge=1)

    @model_validator(mode="after")
    def _names_resolve(self) -> "ModelData":
        for name, precision in self.precisions.items():
            if precision.trains_as is not None and precision.trains_as not in self.precisions:
                raise ValueError(f"precisions.{name}.trainsAs {precision.trains_as!r} is not a precision")
        for name, preset in self.presets.items():
            if preset.precision not in self.precisions:
                raise ValueError(f"presets.{name}.precision {preset.precision!r} is not a precision")
        return self


@lru_cache(maxsize=None)
def load_model_data(path: Path = PRESETS_PATH) -> ModelData:
    return load_model(path, ModelData)


def check_shape(hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of the {heads} attention heads")
    if heads % kv_heads:
        raise ValueError(f"{heads} attention heads are not a multiple of the {kv_heads} key/value heads")


# --- the workload ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A model and how it runs: `batch` per GPU (concurrent sequences in inference), `sequence` tokens (the context
    held in inference)."""
    name: str
    model: Preset
    precision: str
    optimizer: Optional[str]          # None in inference
    batch: int
    sequence: Optional[int]           # None for a convolutional network
    inference: bool
    recompute: bool
    attention: str

    def describe(self) -> str:
        m = self.model
        what = (f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} key/value)"
                if m.kind == "transformer" else "a convolutional network")
        run = (f"inference, {self.precision}, batch {self.batch} x {self.sequence} tokens of context"
               if self.inference else
               f"training, {self.precision}, {self.optimizer}, batch {self.batch} per GPU"
               + (f" x {self.sequence} tokens" if self.sequence else "")
               + (", full activation recomputation" if self.recompute else "")
               + (f", {self.attention} attention" if m.kind == "transformer" else ""))
        return f"{self.name} ({parameter_words(m.parameters)} parameters, {what}): {run}"


PARAMETER_COUNT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([kmbt]?)$", re.I)
SCALE = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "b": 10 ** 9, "t": 10 ** 12}


def parameter_count(text: str) -> Optional[int]:
    """'7b' -> 7,000,000,000; '350m', '25557032'; None when `text` is not a count."""
    match = PARAMETER_COUNT.match(text.strip())
    return round(float(match.group(1)) * SCALE[match.group(2).lower()]) if match else None


def parameter_words(count: int) -> str:
    for suffix, scale in (("B", 10 ** 9), ("M", 10 ** 6)):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:,}"


def workload(model: str, *, hidden: Optional[int] = None, layers: Optional[int] = None, heads: Optional[int] = None,
             kv_heads: Optional[int] = None, vocab: Optional[int] = None, precision: Optional[str] = None,
             optimizer: Optional[str] = None, batch: int = 1, sequence: Optional[int] = None,
             inference: bool = False, recompute: bool = False, attention: Optional[str] = None,
             data: Optional[ModelData] = None) -> Workload:
    """The workload `--model` and its options describe: a preset by name, or a transformer of `model` parameters
    ('7b', '350m') with its shape. A ValueError names the option and what it allows."""
    data = data or load_model_data()
    shape = {"--hidden-size": hidden, "--layers": layers, "--heads": heads, "--kv-heads": kv_heads, "--vocab": vocab}
    for option, value in {**shape, "--batch": batch, "--sequence": sequence}.items():
        least = 0 if option == "--vocab" else 1          # no vocabulary: a classifier
        if value is not None and value < least:
            raise ValueError(f"{option} {value}: at least {least}")
    if model in data.presets:
        given = [option for option, value in shape.items() if value is not None]
        if given:
            raise ValueError(f"--model {model} is a preset with its own shape; leave out {', '.join(given)} (or give "
                             "a parameter count as --model)")
        preset = data.presets[model]
    else:
        count = parameter_count(model)
        if not count:
            raise ValueError(f"--model {model!r}: give a preset ({', '.join(data.presets)}) or a transformer's "
                             "parameter count such as 7b or 350m with --hidden-size, --layers, --heads and --sequence")
        needed = {"--hidden-size": hidden, "--layers": layers, "--heads": heads, "--sequence": sequence}
        missing = [option for option, value in needed.items() if value is None]
        if missing:
            raise ValueError(f"--model {model}: a model given by its parameter count is a transformer; give "
                             f"{', '.join(missing)} (convolutional networks: a preset, such as resnet50)")
        check_shape(hidden, heads, kv_heads or heads)
        preset = Preset(kind="transformer", parameters=count, hidden=hidden, layers=layers, heads=heads,
                        kvHeads=kv_heads or heads, lmHeadVocab=vocab or 0, sequence=sequence)
    precision = precision or preset.precision
    if precision not in data.precisions:
        raise ValueError(f"--precision {precision}: one of {', '.join(data.precisions)}")
    if not inference and not data.precisions[precision].training:
        trainable = [name for name, p in data.precisions.items() if p.training]
        raise ValueError(f"--precision {precision} is a weight format for inference: add --inference, or train in "
                         f"{', '.join(trainable)}")
    if inference and (optimizer or recompute):
        raise ValueError(f"{'--optimizer' if optimizer else '--recompute'} is for training; inference keeps no "
                         "optimizer states and no activations for a backward pass")
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(f"--optimizer {optimizer}: one of {', '.join(OPTIMIZERS)} (adamw counts as adam)")
    if attention is not None and attention not in ATTENTIONS:
        raise ValueError(f"--attention {attention}: one of {', '.join(ATTENTIONS)}")
    if preset.kind == "cnn":
        for option, value in (("--sequence", sequence), ("--attention", attention), ("--recompute", recompute or None)):
            if value is not None:
                raise ValueError(f"--model {model} is a convolutional network: {option} does not apply")
    return Workload(name=model, model=preset, precision=precision,
                    optimizer=None if inference else (optimizer or preset.optimizer), batch=batch,
                    sequence=None if preset.kind == "cnn" else (sequence or preset.sequence), inference=inference,
                    recompute=recompute, attention=attention or preset.attention)


# --- the estimate ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """Bytes one GPU holds, by part."""
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    kv_cache: float
    runtime: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.kv_cache + self.runtime

    def parts_gib(self) -> Dict[str, float]:
        return {"weightsGiB": self.weights / GIB, "gradientsGiB": self.gradients / GIB,
                "optimizerStatesGiB": self.optimizer_states / GIB, "activationsGiB": self.activations / GIB,
                "kvCacheGiB": self.kv_cache / GIB, "runtimeGiB": self.runtime / GIB}


def trained_precision(w: Workload, data: ModelData) -> Precision:
    precision = data.precisions[w.precision]
    return data.precisions[precision.trains_as] if precision.trains_as else precision


def activation_bytes(w: Workload, data: Optional[ModelData] = None) -> float:
    """What training keeps for the backward pass on one GPU, before trainingActivationFactor (module docstring)."""
    data = data or load_model_data()
    x = trained_precision(w, data).activation_bytes
    m = w.model
    if m.kind == "cnn":
        return m.feature_mib_per_sample * MIB * w.batch * x / FEATURE_BYTES
    s, b, h, a = w.sequence, w.batch, m.hidden, m.heads
    per_score = 2 * x + 1 if w.attention == "eager" else 0
    layer = s * b * h * (16 * x + 2) + a * s * s * b * per_score
    kept = m.layers * (x * s * b * h) + layer if w.recompute else m.layers * layer
    return kept + LOGIT_BYTES * s * b * m.lm_head_vocab


def kv_cache_bytes(w: Workload, data: Optional[ModelData] = None) -> float:
    """The KV cache of `w.batch` sequences of `w.sequence` tokens on one GPU (0 for a convolutional network)."""
    m = w.model
    if m.kind == "cnn":
        return 0.0
    x = (data or load_model_data()).precisions[w.precision].activation_bytes
    return 2 * m.layers * m.kv_heads * (m.hidden // m.heads) * x * w.batch * w.sequence


def estimate(w: Workload, gpus: int = 1, sharding: Sharding = "none", data: Optional[ModelData] = None) -> Estimate:
    """Bytes per GPU of `w` on `gpus` GPUs under `sharding` (module docstring)."""
    data = data or load_model_data()
    runtime = data.runtime_overhead_mib * MIB
    p = w.model.parameters
    if w.inference:
        weights = p * data.precisions[w.precision].weight_bytes
        kv = kv_cache_bytes(w, data)
        if sharding == "tensor-parallel":
            heads = w.model.kv_heads
            weights, kv = weights / gpus, kv * max(1, math.ceil(heads / gpus)) / heads
        return Estimate(weights, 0.0, 0.0, 0.0, kv, runtime)
    trained = trained_precision(w, data)
    wb = trained.weight_bytes
    master = data.master_weight_bytes if wb < data.master_weight_bytes else 0
    weights, gradients = p * wb, p * wb
    states = p * (master + data.optimizer_state_bytes[w.optimizer])
    if sharding == "zero-3":
        gathered = p / w.model.layers * wb
        weights, gradients, states = weights / gpus + gathered, gradients / gpus + gathered, states / gpus
    activations = activation_bytes(w, data) * data.training_activation_factor
    return Estimate(weights, gradients, states, activations, 0.0, runtime)


# --- placements -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slot:
    """What one job can be given on a pool: `gpus` GPUs (an MPS share or a MIG instance counts as one) of
    `memory_mib` each, on `nodes` nodes."""
    pool: str
    share: Literal["mps", "mig", "gpus"]
    profile: Optional[str]            # the MIG profile
    memory_mib: int                   # per GPU, share or instance
    gpus: int
    nodes: int
    gpu_model: str
    architecture: str
    node_memory_mib: int              # the GPU memory of one of the pool's nodes
    node_hourly: Optional[float]      # decisions/cost: the pool's node rate; None where unpriced
    efa: bool

    @property
    def reserved_mib(self) -> int:
        return self.memory_mib * self.gpus

    @property
    def hourly(self) -> Optional[float]:
        return None if self.node_hourly is None else self.node_hourly * self.reserved_mib / self.node_memory_mib

    def describe(self) -> str:
        # "an A100", "an H100", "an L4", "a T4": the article as the model's first letter is spoken.
        of_gpu = f"{'an' if self.gpu_model[0] in 'AEFHILMNORSX' else 'a'} {self.gpu_model}"
        if self.share == "mps":
            return f"an MPS share of {of_gpu} (memory limit {self.memory_mib:,} MiB)"
        several = self.gpus > 1
        memory = f"{self.memory_mib:,} MiB{' each' * several}"
        if self.share == "mig":
            return f"{self.gpus if several else 'a'} MIG {self.profile} instance{'s' * several} of {of_gpu} ({memory})"
        # Across nodes, NCCL runs over EFA, or over TCP where the pool has none (pytorch-job only: jobs/__main__.py).
        where = f"{self.nodes} nodes over {'EFA' if self.efa else 'TCP'}" if self.nodes > 1 else "one node"
        return f"{self.gpus} {self.gpu_model} GPU{'s' * several} ({memory}) on {where}"


@dataclass(frozen=True)
class Placement:
    slot: Slot
    sharding: Sharding
    estimate: Estimate                # per GPU

    @property
    def fits(self) -> bool:
        return self.estimate.total <= self.slot.memory_mib * MIB

    def document(self) -> dict:
        s = self.slot
        return {"pool": s.pool, "share": s.share, "migProfile": s.profile,
                "memoryLimitMiB": s.memory_mib if s.share == "mps" else None, "gpuMemoryMiB": s.memory_mib,
                "gpus": s.gpus, "nodes": s.nodes, "sharding": self.sharding,
                "reservedGiB": round(s.reserved_mib / 1024, 2),
                "hourlyUsd": None if s.hourly is None else round(s.hourly, 2),
                "interconnect": None if s.nodes == 1 else ("EFA" if s.efa else "TCP")}


def pool_slots(pool, catalog, node_hourly: Optional[float], *, single_node: bool = True,
               whole_nodes: bool = True) -> List[Slot]:
    """The slots of `pool` (a decisions.config.stack.ResolvedPool): its MPS share, one instance of each MIG profile
    of its layout, 1 to all GPUs of one node (`single_node`), 1 to maxNodes whole nodes (`whole_nodes`; a whole node
    is counted once); none on a time-sliced pool."""
    mode, per_node = pool.spec.gpu_sharing.mode, pool.gpus_per_node
    gpu = pool.primary_type.gpu
    base = Slot(pool=pool.name, share="gpus", profile=None, memory_mib=gpu.memory_mib, gpus=1, nodes=1,
                gpu_model=gpu.model, architecture=catalog.gpus[gpu.model].architecture,
                node_memory_mib=gpu.memory_mib * per_node, node_hourly=node_hourly, efa=pool.efa)
    if mode == "mps":
        return [replace(base, share="mps", memory_mib=slot_memory_mib(pool, GPU_RESOURCE))]
    if mode == "mig":
        return [replace(base, share="mig", profile=profile, memory_mib=slot_memory_mib(pool, mig_resource(profile)))
                for profile in sorted(mig_layout(pool, catalog))]
    if mode in REPLICATED_MODES:
        return []
    counts = [(n, 1) for n in range(1, per_node + 1)] if single_node else []
    if whole_nodes:
        counts += [(per_node * k, k) for k in range(2 if single_node else 1, pool.spec.max_nodes + 1)]
    return [replace(base, gpus=n, nodes=k) for n, k in counts]


def place_on(w: Workload, slot: Slot, data: Optional[ModelData] = None) -> Placement:
    """`w` on `slot`: on one GPU as it is; on several, replicated where it fits one of them, else sharded."""
    data = data or load_model_data()
    one = estimate(w, data=data)
    if slot.gpus == 1 or one.total <= slot.memory_mib * MIB:
        return Placement(slot, "none" if slot.gpus == 1 else "data-parallel", one)
    sharding: Sharding = "tensor-parallel" if w.inference else "zero-3"
    return Placement(slot, sharding, estimate(w, slot.gpus, sharding, data))


def unplaceable(w: Workload, slot: Slot, data: Optional[ModelData] = None) -> Optional[str]:
    """Why `w` cannot use `slot` whatever its memory, or None."""
    data = data or load_model_data()
    if w.precision == "fp8" and slot.architecture not in data.fp8_architectures:
        return (f"{slot.gpu_model} ({slot.architecture}) has no fp8 tensor cores (fp8 runs on "
                f"{', '.join(data.fp8_architectures)})")
    if slot.gpus == 1 or estimate(w, data=data).total <= slot.memory_mib * MIB:
        return None
    if slot.share == "mig":
        return "a model larger than one MIG instance is not sharded across instances (each is a device of its own)"
    if w.model.kind == "cnn":
        return "sharding a convolutional network across GPUs is not estimated"
    if w.inference and slot.nodes > 1:
        return "inference is sharded across the GPUs of one node only"
    return None


def smallest(placements: Sequence[Placement]) -> Optional[Placement]:
    """The fitting placement that reserves the least GPU memory, then costs the least an hour."""
    fitting = [p for p in placements if p.fits]
    return min(fitting, key=lambda p: (p.slot.reserved_mib, math.inf if p.slot.hourly is None else p.slot.hourly,
                                       p.slot.pool)) if fitting else None


@dataclass(frozen=True)
class PoolFit:
    """One pool's answer: its smallest placement that fits, or why none does."""
    pool: str
    placement: Optional[Placement]
    why_not: Optional[str]


TIME_SLICED = ("time-sliced shares are not placements: time-slicing does not partition memory (every replica sees "
               "the whole GPU), so a share has no memory limit to fit")


def pool_fit(w: Workload, pool_name: str, slots: Sequence[Slot], data: Optional[ModelData] = None) -> PoolFit:
    """The smallest of `slots` (one pool's) that holds `w`, or why none does, with the figure."""
    data = data or load_model_data()
    if not slots:
        return PoolFit(pool_name, None, TIME_SLICED)
    reasons = [unplaceable(w, slot, data) for slot in slots]
    placements = [place_on(w, slot, data) for slot, reason in zip(slots, reasons) if reason is None]
    best = smallest(placements)
    if best is not None:
        return PoolFit(pool_name, best, None)
    if not placements:
        return PoolFit(pool_name, None, next(r for r in reasons if r))
    largest = max(placements, key=lambda p: (p.slot.reserved_mib, -p.estimate.total))
    sharing = "" if largest.sharding == "none" else f", {largest.sharding}"
    return PoolFit(pool_name, None, f"needs {largest.estimate.total / GIB:.1f} GiB per GPU on its largest placement "
                                    f"({largest.slot.describe()}{sharing}), which has "
                                    f"{largest.slot.memory_mib / 1024:.1f} GiB")


@dataclass(frozen=True)
class Fit:
    workload: Workload
    placement: Optional[Placement]
    pools: Tuple[PoolFit, ...]
    one_gpu: Estimate                 # unsharded: the figure a refusal gives
    left_out: Tuple[str, ...]         # the inference pools: the training queue places no job there

    @property
    def refusal(self) -> Optional[str]:
        if self.placement is not None:
            return None
        return (f"{self.workload.name} needs {self.one_gpu.total / GIB:.1f} GiB on one GPU, and no placement on the "
                "training queue's pools holds it")


def fit(w: Workload, pools: Sequence, catalog, node_hourly: Mapping[str, Optional[float]],
        data: Optional[ModelData] = None) -> Fit:
    """The smallest placement of `w` on the training queue's `pools` (ResolvedPools; the others are left out), each
    pool's own smallest, and why a pool holds none. `node_hourly`: pool name -> its node's rate."""
    data = data or load_model_data()
    answers = tuple(pool_fit(w, pool.name, pool_slots(pool, catalog, node_hourly.get(pool.name)), data)
                    for pool in pools if queue_flavor(pool))
    best = smallest([a.placement for a in answers if a.placement is not None])
    return Fit(w, best, answers, estimate(w, data=data), tuple(pool.name for pool in pools if not queue_flavor(pool)))


def requested_slot(pool, catalog, node_hourly: Optional[float], *, gpus: Optional[int] = None,
                   mig_profile: Optional[str] = None, nodes: Optional[int] = None) -> Slot:
    """The slot a job command names on `pool`: `nodes` whole nodes, or on one node `gpus` GPUs (default all), the MPS
    share, or `gpus` instances (default 1) of `mig_profile` (default the layout's first). The command has checked
    the numbers against the pool (decisions/platform/single_job.gpu_request, mpijob.check_whole_nodes)."""
    if nodes is not None:
        return next(s for s in pool_slots(pool, catalog, node_hourly, single_node=False) if s.nodes == nodes)
    slots = pool_slots(pool, catalog, node_hourly, whole_nodes=False)
    if not slots:
        raise ValueError(f"pool {pool.name}: {TIME_SLICED}")
    if pool.spec.gpu_sharing.mode == "mig":
        profile = mig_profile or slots[0].profile
        return replace(next(s for s in slots if s.profile == profile), gpus=gpus or 1)
    if pool.spec.gpu_sharing.mode == "mps":
        return slots[0]
    return next(s for s in slots if s.gpus == (gpus or pool.gpus_per_node))


def check_request(w: Workload, slot: Slot, data: Optional[ModelData] = None) -> Placement:
    """`w` on the slot a job command names, or a ValueError with the figure when it does not fit there."""
    data = data or load_model_data()
    reason = unplaceable(w, slot, data)
    if reason is not None:
        raise ValueError(f"--model {w.name}: {reason}")
    placed = place_on(w, slot, data)
    if not placed.fits:
        sharding = "" if placed.sharding == "none" else f" ({placed.sharding})"
        raise ValueError(f"--model {w.name} needs {placed.estimate.total / GIB:.1f} GiB per GPU on "
                         f"{slot.describe()}{sharding}, which has {slot.memory_mib / 1024:.1f} GiB; "
                         "python -m jobs fit names a placement that holds it")
    return placed


def choose_on_pool(w: Workload, pool, catalog, node_hourly: Optional[float], *, whole_nodes: bool,
                   data: Optional[ModelData] = None) -> Placement:
    """The smallest placement of `w` on `pool` that a job command renders: whole nodes (`whole_nodes`: mpijob,
    pytorch-job) or part of one node (job). A ValueError with the figure when none holds it."""
    slots = pool_slots(pool, catalog, node_hourly, single_node=not whole_nodes, whole_nodes=whole_nodes)
    answer = pool_fit(w, pool.name, slots, data)
    if answer.placement is None:
        raise ValueError(f"--model {w.name}: pool {pool.name} {answer.why_not}; python -m jobs fit names a "
                         "placement that holds it")
    return answer.placement


# --- what `python -m jobs fit` prints -------------------------------------------------------------------------------
PART_NAMES = (("weights", "weights"), ("gradients", "gradients"), ("optimizer_states", "optimizer states"),
              ("activations", "activations"), ("kv_cache", "KV cache"), ("runtime", "runtime"))


def _parts(e: Estimate) -> str:
    shown = [f"{words} {getattr(e, field) / GIB:.1f}" for field, words in PART_NAMES if getattr(e, field)]
    return f"{e.total / GIB:.1f} GiB = " + " + ".join(shown)


def fit_document(f: Fit, stack: str) -> dict:
    """The answer as data: `gpuMemoryGiB` per GPU where it is placed (on one GPU when refused), its parts, the
    placement, each pool's own smallest placement or why it has none."""
    w, m = f.workload, f.workload.model
    held = f.placement.estimate if f.placement else f.one_gpu
    shape = ({"hidden": m.hidden, "layers": m.layers, "heads": m.heads, "kvHeads": m.kv_heads,
              "lmHeadVocab": m.lm_head_vocab} if m.kind == "transformer" else
             {"featureMiBPerSample": m.feature_mib_per_sample})
    return {
        "stack": stack,
        "model": {"name": w.name, "kind": m.kind, "parameters": m.parameters, **shape},
        "workload": {"mode": "inference" if w.inference else "training", "precision": w.precision,
                     "optimizer": w.optimizer, "batch": w.batch, "sequence": w.sequence, "recompute": w.recompute,
                     "attention": w.attention if m.kind == "transformer" else None},
        "gpuMemoryGiB": round(held.total / GIB, 2),
        "estimate": {name: round(value, 2) for name, value in held.parts_gib().items()},
        "placement": f.placement.document() if f.placement else None,
        "pools": [{"pool": p.pool, "placement": p.placement.document() if p.placement else None,
                   "gpuMemoryGiB": round(p.placement.estimate.total / GIB, 2) if p.placement else None,
                   "whyNot": p.why_not} for p in f.pools],
        "leftOut": list(f.left_out),
        "refusal": f.refusal,
    }


def fit_report(f: Fit, stack: str) -> str:
    """The answer as a person reads it: the workload, its estimate, the placement (or the refusal with the figure),
    then each pool's own smallest placement, and why a pool has none."""
    lines = [f"python -m jobs fit {stack}: {f.workload.describe()}",
             f"on one GPU: {_parts(f.one_gpu)}"]
    if f.placement is None:
        lines.append(f"no placement: {f.refusal}")
    else:
        p = f.placement
        cost = "unpriced" if p.slot.hourly is None else f"${p.slot.hourly:.2f}/hour"
        sharding = "" if p.sharding == "none" else f", {p.sharding}"
        lines.append(f"placement: pool {p.slot.pool}, {p.slot.describe()}{sharding}, {cost}")
        if p.sharding in ("zero-3", "tensor-parallel"):
            lines.append(f"per GPU there: {_parts(p.estimate)}")
    rows = [("pool", "smallest placement that holds it", "sharding", "GiB/GPU", "of GiB", "$/hour")]
    for answer in f.pools:
        at = answer.placement
        rows.append((answer.pool, at.slot.describe() if at else "none (below)", at.sharding if at else "-",
                     f"{at.estimate.total / GIB:.1f}" if at else "-", f"{at.slot.memory_mib / 1024:.1f}" if at else "-",
                     "-" if at is None or at.slot.hourly is None else f"{at.slot.hourly:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    table.insert(1, "  ".join("-" * width for width in widths))
    lines += [""] + table
    refused = [f"  {answer.pool}: {answer.why_not}" for answer in f.pools if answer.why_not]
    lines += ["", "pools without a placement:"] + refused if refused else []
    if f.left_out:
        lines.append(f"left out: {', '.join(f.left_out)} (inference: the training queue places no job there)")
    return "\n".join(lines) + "\n"
