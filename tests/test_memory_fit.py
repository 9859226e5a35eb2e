"""Where a model fits (decisions/platform/memory_fit.py): the estimate held to published measurements within 15 %, its
formula's parts at values that tell right from wrong, and the placement: an MPS share or a MIG instance before a whole
GPU, several GPUs sharded only when one does not hold the model, never a time-sliced share, and a refusal with the
figure when nothing holds it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from decisions.catalog.catalog import load_catalog
from decisions.config.model import NodePool
from decisions.config.validate import ResolvedPool
from decisions.platform import memory_fit
from decisions.platform.memory_fit import GIB, MIB, Estimate, Placement, estimate, workload

CATALOG = load_catalog()
DATA = memory_fit.load_model_data()
GB, MB_HF = 10 ** 9, MIB        # HuggingFace's "MB" is nvidia-ml-py's used // 1024**2: MiB
# bigcode/octocoder as HuggingFace's guide runs it: 15.5B parameters, StarCoder's shape (n_embd 6144, n_layer 40,
# n_head 48, one key/value head: multi-query attention), a prompt of about 20 tokens and 60 new ones.
OCTOCODER = dict(model="15.5b", hidden=6144, layers=40, heads=48, kv_heads=1, inference=True, sequence=80)
OPT_13B = dict(model="13b", hidden=5120, layers=40, heads=40, inference=True, precision="fp16")

# (what was measured, the workload, the part of the estimate it is, the published figure in bytes, the source)
PUBLISHED = [
    ("ResNet-50 training, batch 64", dict(model="resnet50", batch=64), "total", 11 * GB,
     "the design's scheduling requirement: 'ResNet-50 at batch 64: about 11 GB' (issue #39)"),
    ("BERT-large fp32 AdamW training, batch 4 x 512 tokens, V100", dict(model="bert-large", batch=4), "total",
     14949 * MB_HF, "HuggingFace transformers docs/source/en/model_memory_anatomy.md: 'GPU memory occupied: "
                    "14949 MB.'"),
    ("BERT-large fp32 AdamW training, batch 1 x 512 tokens, V100", dict(model="bert-large", batch=1), "total",
     8681 * MB_HF, "HuggingFace transformers docs/source/zh/perf_train_gpu_one.md (gradient accumulation, batch 1): "
                   "'GPU memory occupied: 8681 MB.'"),
    ("BERT-large fp32 weights on the GPU", dict(model="bert-large", inference=True, precision="fp32"), "weights",
     (2631 - 1343) * MB_HF, "model_memory_anatomy.md: 2631 MB with the model loaded, 1343 MB before it"),
    ("octocoder bf16 inference, peak allocated", dict(OCTOCODER, precision="bf16"), "total", 29.0260648727417 * GIB,
     "HuggingFace transformers docs/source/en/llm_tutorial_optimization.md: torch.cuda.max_memory_allocated()"),
    ("octocoder 8-bit inference, peak allocated", dict(OCTOCODER, precision="int8"), "total", 15.219234466552734 * GIB,
     "llm_tutorial_optimization.md, load_in_8bit=True"),
    ("octocoder 4-bit inference, peak allocated", dict(OCTOCODER, precision="int4"), "total", 9.543574333190918 * GIB,
     "llm_tutorial_optimization.md, load_in_4bit=True"),
    ("Llama-2-7B fp16 weights loaded by vLLM", dict(model="llama-2-7b", inference=True, precision="fp16"), "weights",
     12.5562 * GIB, "vllm-project/vllm pull request 6234, its log: 'Loading model weights took 12.5562 GB' (GiB: "
                    "vLLM divides by 2**30) after the 9.98 GB and 3.50 GB safetensors of Llama-2-7b-hf"),
    ("Llama-2-7B fp16 chat, nvidia-smi", dict(model="llama-2-7b", inference=True, precision="fp16", sequence=512),
     "total", 13213 * MIB, "lm-sys/FastChat issue 2005: 13213MiB on a 3090 without 8-bit quantization"),
    ("Llama-2-7B 8-bit chat, nvidia-smi", dict(model="llama-2-7b", inference=True, precision="int8", sequence=512),
     "total", 7843 * MIB, "lm-sys/FastChat issue 2005: 7843MiB when using 8-bit"),
    ("OPT-13B KV cache of one token", dict(OPT_13B, sequence=1), "kv_cache", 800 * 1024,
     "Kwon et al. 2023 (vLLM, PagedAttention), section 3: 800 KB = 2 x 5120 x 40 x 2 bytes"),
    ("OPT-13B KV cache of a 2048-token request", dict(OPT_13B, sequence=2048), "kv_cache", 1.6 * GB,
     "Kwon et al. 2023, section 3: 'as much as 1.6 GB'"),
    ("octocoder KV cache of 16,000 tokens with one key/value head per query head",
     dict(OCTOCODER, kv_heads=48, sequence=16000, precision="fp16"), "kv_cache", 15 * GB,
     "llm_tutorial_optimization.md, section 3.2: 7,864,320,000 values, 'around 15 GB' in float16"),
]


def part(estimated: Estimate, name: str) -> float:
    return estimated.total if name == "total" else getattr(estimated, name)


@pytest.mark.parametrize("what, kwargs, name, published, source", PUBLISHED, ids=[case[0] for case in PUBLISHED])
def test_the_estimate_is_within_15_percent_of_each_published_figure(what, kwargs, name, published, source):
    got = part(estimate(workload(**kwargs)), name)
    assert abs(got / published - 1) <= 0.15, f"{what}: {got / GIB:.2f} GiB against {published / GIB:.2f} ({source})"


def test_multi_query_attention_keeps_octocoders_16000_tokens_under_400_mb():
    # llm_tutorial_optimization.md, section 3.2.2: one key/value head "from 15 GB to less than 400 MB".
    assert estimate(workload(**dict(OCTOCODER, sequence=16000, precision="fp16"))).kv_cache < 400 * 10 ** 6


# --- the formula's parts --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision, optimizer, per_parameter", [
    ("bf16", "adam", 16),             # ZeRO section 3.1: 2 + 2 + 12
    ("fp16", "sgd-momentum", 12),     # 2 + 2 + master 4 + momentum 4
    ("bf16", "sgd", 8),               # 2 + 2 + master 4
    ("fp32", "adam", 16),             # 4 + 4 + 8, no master copy
    ("fp32", "sgd-momentum", 12),
    ("fp32", "sgd", 8),
    ("fp8", "adam", 16),              # trains as bf16
])
def test_model_states_take_their_bytes_per_parameter(precision, optimizer, per_parameter):
    e = estimate(workload("bert-large", precision=precision, optimizer=optimizer))
    assert e.weights + e.gradients + e.optimizer_states == per_parameter * 335141888


TINY = dict(model="1m", hidden=4, layers=3, heads=2, batch=5, sequence=7)   # s 7, b 5, h 4, a 2, L 3


@pytest.mark.parametrize("precision, attention, per_layer", [
    ("bf16", "eager", 7 * 5 * 4 * 34 + 2 * 7 * 7 * 5 * 5),   # Korthikanti: sbh(34 + 5as/h)
    ("bf16", "flash", 7 * 5 * 4 * 34),                       # no s x s scores kept
    ("fp32", "eager", 7 * 5 * 4 * 66 + 2 * 7 * 7 * 5 * 9),   # 4-byte values, 1-byte masks
])
def test_transformer_activations_are_korthikantis_per_layer(precision, attention, per_layer):
    assert memory_fit.activation_bytes(workload(**TINY, precision=precision, attention=attention)) == 3 * per_layer


def test_full_recomputation_keeps_each_layers_input_and_one_layer():
    w = workload(**TINY, precision="bf16", attention="flash", recompute=True)
    assert memory_fit.activation_bytes(w) == 3 * (2 * 7 * 5 * 4) + 7 * 5 * 4 * 34


def test_a_language_model_head_adds_its_fp32_logits():
    with_head = workload(**dict(TINY, vocab=100), precision="bf16", attention="flash")
    without = workload(**TINY, precision="bf16", attention="flash")
    assert memory_fit.activation_bytes(with_head) - memory_fit.activation_bytes(without) == 4 * 7 * 5 * 100


def test_training_holds_the_fitted_factor_over_the_activations_it_counts():
    w = workload("bert-large", batch=4)
    assert estimate(w).activations == memory_fit.activation_bytes(w) * DATA.training_activation_factor == \
        memory_fit.activation_bytes(w) * 1.3


def test_a_cnns_activations_are_its_feature_maps_per_sample_scaled_to_the_precision():
    assert memory_fit.activation_bytes(workload("resnet50", batch=64)) == 64 * 107 * MIB
    assert memory_fit.activation_bytes(workload("resnet50", batch=64, precision="bf16")) == 32 * 107 * MIB


def test_grouped_query_attention_shrinks_the_kv_cache_by_its_heads():
    # Llama-2-70B: 80 layers, 8 key/value heads of 128: 320 KiB a token in 16-bit, an eighth of 64 heads' worth.
    w = workload("llama-2-70b", inference=True, sequence=1)
    assert memory_fit.kv_cache_bytes(w) == 2 * 80 * 8 * 128 * 2 == 320 * 1024


def test_zero_3_divides_the_model_states_and_adds_the_layer_it_gathers():
    w = workload("llama-2-7b")
    one, eight = estimate(w), estimate(w, 8, "zero-3")
    layer = 6738419712 / 32 * 2
    assert eight.weights == one.weights / 8 + layer and eight.gradients == one.gradients / 8 + layer
    assert eight.optimizer_states == one.optimizer_states / 8
    assert (eight.activations, eight.runtime) == (one.activations, one.runtime)


def test_tensor_parallel_inference_divides_weights_and_key_value_heads():
    w = workload("llama-2-70b", inference=True)
    one, two, sixteen = estimate(w), estimate(w, 2, "tensor-parallel"), estimate(w, 16, "tensor-parallel")
    assert two.weights == one.weights / 2 and two.kv_cache == one.kv_cache / 2
    assert sixteen.kv_cache == one.kv_cache / 8          # 8 key/value heads: each GPU keeps at least one


# --- placements -----------------------------------------------------------------------------------------------------
def pool(name, instance_type, sharing=None, workload_kind="training", max_nodes=2, efa=False):
    spec = NodePool.model_validate({
        "name": name, "instanceTypes": [instance_type], "capacity": "on-demand", "minNodes": 0, "desiredNodes": 0,
        "maxNodes": max_nodes, "workload": workload_kind, "gpuSharing": sharing or {"mode": "none"}})
    return ResolvedPool(spec=spec, types=(CATALOG.instance_types[instance_type],), efa=efa)


MPS_A100 = pool("mps-a100", "p4de.24xlarge", {"mode": "mps", "replicas": 8})          # 10,240 MiB a share
MPS_A100_4 = pool("mps-a100-4", "p4de.24xlarge", {"mode": "mps", "replicas": 4})      # 20,480 MiB a share
MIG_H100 = pool("mig-h100", "p5.48xlarge", {"mode": "mig", "migProfiles": {"1g.10gb": 4, "3g.40gb": 1}})
WHOLE_L4 = pool("whole-l4", "g6.12xlarge")                                             # 22,888 MiB GPUs
WHOLE_A100 = pool("whole-a100", "p4de.24xlarge", efa=True)
WHOLE_H100 = pool("whole-h100", "p5.48xlarge", efa=True)
SLICED_L40S = pool("sliced-l40s", "g6e.12xlarge", {"mode": "time-slicing", "replicas": 4})
HOURLY = {"whole-a100": 27.45, "whole-h100": 55.04, "whole-l4": 4.6}


def fit(w, *pools, hourly=None):
    return memory_fit.fit(w, pools, CATALOG, HOURLY if hourly is None else hourly)


def test_an_mps_share_is_chosen_over_a_whole_gpu_when_it_holds_the_model():
    w = workload("resnet50", batch=16)                  # about 3.7 GiB
    answer = fit(w, WHOLE_L4, MPS_A100)
    slot = answer.placement.slot
    assert (slot.pool, slot.share, slot.memory_mib) == ("mps-a100", "mps", 81920 // 8)
    assert answer.placement.document()["memoryLimitMiB"] == 10240
    # A batch its 10 GiB limit does not hold goes to the whole L4.
    assert fit(workload("resnet50", batch=64), WHOLE_L4, MPS_A100).placement.slot.pool == "whole-l4"


def test_a_mig_instance_is_chosen_when_it_is_the_smallest_that_holds_the_model():
    w = workload("resnet50", batch=16)
    answer = fit(w, WHOLE_L4, MPS_A100_4, MIG_H100)
    assert (answer.placement.slot.share, answer.placement.slot.profile) == ("mig", "1g.10gb")
    # Past 10 GiB: the 20 GiB share, then the 22.4 GiB L4, then the 3g.40gb instance, each the least that holds it.
    by_batch = {batch: fit(workload("resnet50", batch=batch), WHOLE_L4, MPS_A100_4, MIG_H100).placement.slot
                for batch in (96, 140, 200)}
    assert [(s.share, s.profile, s.memory_mib) for s in by_batch.values()] == [
        ("mps", None, 20480), ("gpus", None, 22888), ("mig", "3g.40gb", 40960)]


def test_a_model_too_big_for_one_gpu_is_sharded_across_the_fewest_gpus_that_hold_it():
    w = workload("llama-2-7b")                          # 124.5 GiB on one GPU
    answer = fit(w, WHOLE_A100)
    placed = answer.placement
    assert (placed.slot.gpus, placed.slot.nodes, placed.sharding) == (2, 1, "zero-3")
    assert placed.estimate.total <= 81920 * MIB < memory_fit.estimate(w).total
    assert memory_fit.place_on(w, replace(placed.slot, gpus=1)).fits is False


def test_whole_nodes_are_placed_when_one_node_is_not_enough():
    w = workload("llama-2-70b", recompute=True)
    placed = fit(w, WHOLE_H100).placement
    assert (placed.slot.gpus, placed.slot.nodes, placed.sharding) == (16, 2, "zero-3")
    assert placed.document()["interconnect"] == "EFA"


def test_several_gpus_replicate_a_model_one_of_them_holds():
    w = workload("resnet50", batch=64)
    placed = memory_fit.place_on(w, memory_fit.requested_slot(WHOLE_A100, CATALOG, None, gpus=4))
    assert (placed.sharding, placed.estimate) == ("data-parallel", estimate(w))


def test_equal_memory_goes_to_the_cheaper_pool():
    w = workload("llama-2-7b")
    assert fit(w, WHOLE_H100, WHOLE_A100).placement.slot.pool == "whole-a100"
    assert fit(w, WHOLE_H100, WHOLE_A100, hourly={"whole-a100": 99.0, "whole-h100": 1.0}).placement.slot.pool == \
        "whole-h100"


def test_a_time_sliced_share_is_never_a_placement_and_the_answer_says_why():
    answer = fit(workload("resnet50", batch=1), SLICED_L40S)
    assert answer.placement is None
    assert "time-slicing does not partition memory" in answer.pools[0].why_not


def test_a_model_that_fits_nowhere_is_refused_with_its_figure():
    w = workload("llama-2-70b")                         # activations alone outgrow an 80 GB GPU
    answer = fit(w, WHOLE_H100, WHOLE_A100, MPS_A100)
    assert answer.placement is None
    assert answer.refusal == f"llama-2-70b needs {estimate(w).total / GIB:.1f} GiB on one GPU, and no placement on " \
                             "the training queue's pools holds it"
    why = {p.pool: p.why_not for p in answer.pools}
    on_both_nodes = estimate(w, 16, "zero-3").total / GIB
    assert why["whole-h100"] == f"needs {on_both_nodes:.1f} GiB per GPU on its largest placement (16 H100 GPUs " \
                                "(81,920 MiB each) on 2 nodes over EFA, zero-3), which has 80.0 GiB"
    assert memory_fit.fit_document(answer, "s")["gpuMemoryGiB"] == round(estimate(w).total / GIB, 2)


def test_fits_is_at_most_the_slots_memory():
    slot = memory_fit.requested_slot(WHOLE_L4, CATALOG, None, gpus=1)
    exactly = Estimate(0, 0, 0, 0, 0, slot.memory_mib * MIB)
    assert Placement(slot, "none", exactly).fits
    assert not Placement(slot, "none", replace(exactly, runtime=slot.memory_mib * MIB + 1)).fits


def test_fp8_is_placed_only_on_gpus_with_fp8():
    w = workload("llama-2-7b", inference=True, precision="fp8")
    answer = fit(w, WHOLE_A100, WHOLE_H100)
    assert answer.placement.slot.pool == "whole-h100"
    assert "A100 80GB (ampere) has no fp8" in {p.pool: p.why_not for p in answer.pools}["whole-a100"]


def test_inference_pools_are_left_out():
    answer = fit(workload("resnet50"), pool("infer-l4", "g6.12xlarge", workload_kind="inference"), WHOLE_L4)
    assert [p.pool for p in answer.pools] == ["whole-l4"] and answer.left_out == ("infer-l4",)
    report = memory_fit.fit_report(answer, "s")
    assert "left out: infer-l4 (inference: the training queue places no job there)" in report


def test_a_requested_slot_too_small_is_refused_with_the_figure():
    w = workload("llama-2-7b")
    slot = memory_fit.requested_slot(WHOLE_A100, CATALOG, None, gpus=1)
    with pytest.raises(ValueError, match=r"needs 124\.5 GiB per GPU on 1 A100 80GB GPU \(81,920 MiB\) on one node"):
        memory_fit.check_request(w, slot)


# --- what the options allow -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(model="gpt-5"), "--model 'gpt-5': give a preset (resnet50, bert-large"),
    (dict(model="7b", hidden=4096), "give --layers, --heads"),
    (dict(model="llama-2-7b", layers=3), "leave out --layers"),
    (dict(model="llama-2-7b", precision="int4"), "--precision int4 is a weight format for inference"),
    (dict(model="llama-2-7b", precision="fp64"), "--precision fp64: one of fp32, bf16"),
    (dict(model="llama-2-7b", inference=True, optimizer="adam"), "--optimizer is for training"),
    (dict(model="resnet50", sequence=128), "resnet50 is a convolutional network: --sequence does not apply"),
    (dict(model="7b", hidden=4096, layers=32, heads=48, sequence=2048), "hidden size 4096 is not a multiple of the 48"),
    (dict(model="7b", hidden=4096, layers=32, heads=32), "give --sequence"),
    (dict(model="7b", hidden=4096, layers=0, heads=32, sequence=2048), "--layers 0: at least 1"),
    (dict(model="0b", hidden=4096, layers=32, heads=32, sequence=2048), "--model '0b': give a preset"),
    (dict(model="llama-2-7b", batch=0), "--batch 0: at least 1"),
])
def test_a_workload_the_estimate_cannot_take_names_the_option(kwargs, words):
    with pytest.raises(ValueError) as raised:
        workload(**kwargs)
    assert words in str(raised.value)


def test_every_preset_names_a_precision_the_estimate_knows_and_parses():
    assert set(DATA.presets) == {"resnet50", "bert-large", "llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-2-70b"}
    assert memory_fit.parameter_count("7b") == 7 * 10 ** 9 and memory_fit.parameter_count("350M") == 350 * 10 ** 6
    assert memory_fit.parameter_count("llama") is None
