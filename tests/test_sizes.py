"""Plans for every size, worked by hand: multi-GPU training, LoRA/QLoRA fine-tuning and serving.

The graphs are LlamaForCausalLM configs traced by neurarch-trace on the meta device at 2048 tokens
(batch 1), recorded gzipped so that these tests need neither torch nor the tracer:
``llama7b_meta2048`` is ``transformers.LlamaConfig()`` (LLaMA-7B: hidden 4096, MLP 11008, 32 layers,
32 heads, vocabulary 32000); ``llama3_70b_meta2048`` is LLaMA-3-70B (hidden 8192, MLP 28672, 80
layers, 64 query and 8 key/value heads, vocabulary 128256). test_scale.py traces the same configs
live and checks that these files are what the tracer writes.

Constants, each with its source in the planner: ZeRO's 2 + 2 + 12 bytes per parameter
(Rajbhandari et al. 2020) and the single-GPU autocast 2 + 4 + 4 + 8 = 18; ZeRO-3 gathers 4 bytes x
the largest layer (DeepSpeed's estimate_zero3_model_states_mem_needs); NF4 with double
quantisation at 4 + 8/64 + 32/(64 x 256) bits (Dettmers et al. 2023); checkpointing keeps what
leaves each block and recomputes one block (Chen et al. 2016; Korthikanti et al. 2022), 4 x
forward FLOPs instead of 3 x; LoRA's frozen base costs 2 x forward; the KV cache is 2 x layers x
kv_heads x head_dim x context x batch x 2 bytes (Kwon et al. 2023); 40% MFU on every GPU of a
cluster; a setup fits when its per-GPU peak x 1.15 is within the card; 1 GB framework allowance
per GPU; GB = 1e9 bytes.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from neurarch_trace.planner import OptionError, make_plan
from neurarch_trace.planner.analysis import analyse
from neurarch_trace.planner.blocks import find_blocks
from neurarch_trace.planner.card import WIDTH
from neurarch_trace.planner.gpus import gpu_table, parse_gpu
from neurarch_trace.planner.serve import kv_layout, serve

DATA = Path(__file__).parent / "data"

P7 = 6_738_415_616
P70 = 70_553_706_496
TOKENS = 2048
H100_FLOPS = 989.4e12 * 0.40  # dense bf16 x MFU
A100_FLOPS = 312e12 * 0.40


def load_gz(name: str) -> dict[str, Any]:
    with gzip.open(DATA / f"{name}.neurarch.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def llama7b() -> dict[str, Any]:
    return load_gz("llama7b_meta2048")


@pytest.fixture(scope="module")
def llama70b() -> dict[str, Any]:
    return load_gz("llama3_70b_meta2048")


def plan_of(doc: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return make_plan(doc, **kwargs)["plan"]


def row(label: str, value: str) -> str:
    return "| " + (label.ljust(16) + value).ljust(64) + " |"


# --- the graphs: what the plan reads -------------------------------------------------------------

#: LLaMA-7B activations per token per decoder layer, every layer output kept at 2 bytes:
#: input_layernorm, q, k, v, o, add, post_attention_layernorm, down, add (4096 each, 9 of them)
#: and gate, act, up (11008 each).
PER_TOKEN_LAYER_7B = (9 * 4096 + 3 * 11008) * 2  # 139,776 B
#: LLaMA-3-70B: norm, q, o, add, norm, down, add (8192 each, 7), k and v (1024 each), gate, act, up
PER_TOKEN_LAYER_70B = (7 * 8192 + 2 * 1024 + 3 * 28672) * 2  # 290,816 B


def test_the_graphs_blocks_and_activations(llama7b: dict[str, Any], llama70b: dict[str, Any]) -> None:
    a = analyse(llama7b)
    assert a.counts.params == P7 and a.work.traced_tokens == TOKENS
    b = find_blocks(a.graph, a.counts)
    assert b.layers == 32 and {x.group for x in b.blocks} == {"model.layers"}
    # q, k, v, o 4096^2 each, gate/up/down 4096 x 11008 each, two RMSNorms of 4096
    assert b.blocks[0].params == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096 == 202_383_360
    assert b.block_bytes == 32 * TOKENS * PER_TOKEN_LAYER_7B == 9_160_359_936
    # kept under checkpointing: each block's output (its last add: the residual stream, float32 as
    # traced and as transformers keeps it under autocast), 2048 x 4096 x 4 B, 32 times
    assert b.boundary_bytes == 32 * TOKENS * 4096 * 4 == 1_073_741_824
    assert b.largest_bytes == TOKENS * PER_TOKEN_LAYER_7B == 286_261_248
    assert b.largest_layer_params == 32000 * 4096  # the embedding and the LM head, 131,072,000 each
    # outside the blocks: ids 2048 x 8, embedding and final norm 2048 x 4096 x 2 each, the rotary
    # cos and sin 2 x 2048 x 128 x 2, the LM head 2048 x 32000 x 2; the loss 2048 x 32000 x (4 + 4)
    outside = TOKENS * 8 + 2 * TOKENS * 4096 * 2 + 2 * TOKENS * 128 * 2 + TOKENS * 32000 * 2
    assert a.memory.per_sample_bytes(1) == b.block_bytes + outside + TOKENS * 32000 * 8 == 9_850_339_328

    a70 = analyse(llama70b)
    assert a70.counts.params == P70
    b70 = find_blocks(a70.graph, a70.counts)
    assert b70.layers == 80
    assert b70.block_bytes == 80 * TOKENS * PER_TOKEN_LAYER_70B == 47_647_293_440
    assert b70.boundary_bytes == 80 * TOKENS * 8192 * 4
    assert b70.largest_layer_params == 128256 * 8192 == 1_050_673_152


def test_kv_layout_from_the_linears(llama7b: dict[str, Any], llama70b: dict[str, Any]) -> None:
    # k_proj and v_proj outFeatures = kv_heads x head_dim; the rotary embedding's output is one
    # angle per head dimension (128): 7B 4096 / 128 = 32 KV heads, 70B 1024 / 128 = 8
    # q_proj outFeatures = heads x head_dim: 7B 4096 / 128 = 32 query heads, 70B 8192 / 128 = 64
    for doc, layers, heads, queries in ((llama7b, 32, 32, 32), (llama70b, 80, 8, 64)):
        layout = kv_layout(analyse(doc).graph)
        assert (layout.layers, layout.kv_heads, layout.head_dim, layout.heads) == (layers, heads, 128, queries)
        assert layout.bytes_per_token() == 2 * layers * heads * 128 * 2
    # without a rotary embedding the head dimension is unknown; the KV cache is still exact
    no_rope = copy.deepcopy(llama7b)
    no_rope["components"] = [c for c in no_rope["components"] if c["type"] != "rope"]
    layout = kv_layout(analyse(no_rope).graph)
    assert (layout.kv_heads, layout.head_dim, layout.bytes_per_token()) == (None, None, 2 * 32 * 4096 * 2)
    assert layout.heads is None


@pytest.mark.parametrize("layers, gpus, part", [
    (28, 3, 10 / 28),          # 3 stages of 28 layers: 10, 9, 9; the fullest holds 10
    (80, 24, 27 / 80 / 8),     # LLaMA-3-70B, tensor parallel 8 x 3 stages: 27, 27, 26 layers
    (32, 8, 1 / 8),            # all tensor parallel: even
    (28, 8, 14 / 28 / 4),      # Qwen2-7B, 4 x 2 stages of 14: even
    (0, 8, 1 / 8),             # no layers in the graph: even
])
def test_the_fullest_pipeline_stage_sets_the_memory(layers: int, gpus: int, part: float) -> None:
    from neurarch_trace.planner.serve import KvLayout, share
    heads = {28: (28, 4), 80: (64, 8), 32: (32, 32), 0: (None, None)}[layers]
    assert share(KvLayout(layers=layers, heads=heads[0], kv_heads=heads[1]), gpus) == pytest.approx(part, rel=1e-12)


def test_the_card_shows_the_fullest_stage(llama7b: dict[str, Any]) -> None:
    """LLaMA-7B on 3 GPUs: 32 heads do not split 3 ways, so 3 pipeline stages of 11, 11 and 10
    layers; the card's per-GPU weights and KV cache are the fullest stage's 11/32, as its peak."""
    answer = make_plan(llama7b, gpu="H100x3")
    s = answer["plan"]["serve"]
    assert (s["tensorParallel"], s["pipelineStages"], s["gpuShare"]) == (1, 3, 11 / 32)
    weights, kv = s["weightsGb"] * 11 / 32, s["kvCacheGb"] * 11 / 32
    assert s["peakGb"] == pytest.approx(weights + kv + s["stepGb"] + 1.0, rel=1e-12)
    assert row("", f"{s['peakGb']:.1f} GB per GPU: weights {weights:.1f} GB, KV {kv:.1f} GB") in \
        answer["text"].splitlines()


def test_a_count_the_heads_may_not_divide_says_so_on_the_card() -> None:
    """GPT-2 has no rotary embedding, so the graph gives no head count: on a fixed 8 GPUs the card
    says that tensor parallelism of 8 needs 8 to divide the heads."""
    answer = make_plan(json.loads((DATA / "traced_gpt2.neurarch.json").read_text()), gpu="H100x8")
    assert answer["plan"]["serve"]["heads"] is None and answer["plan"]["serve"]["tensorParallel"] == 8
    assert row("", "tensor parallel 8, if 8 divides the heads") in answer["text"].splitlines()
    sixteen = make_plan(json.loads((DATA / "traced_gpt2.neurarch.json").read_text()), gpu="H100x16")["text"]
    assert row("", "tensor parallel 8 x pipeline 2, if 8 divides the") in sixteen.splitlines()


@pytest.mark.parametrize("heads, kv_heads, layers, gpus, split", [
    (32, 32, 32, 8, (8, 1)),     # LLaMA-7B: one node, all tensor parallel
    (64, 8, 80, 24, (8, 3)),     # LLaMA-3-70B on 3 nodes: 8 x 3 stages
    (28, 4, 28, 8, (4, 2)),      # Qwen2-7B: 28 heads do not split 8 ways (vLLM refuses), 4 x 2
    (28, 4, 28, 2, (2, 1)),
    (28, 4, 28, 7, (1, 7)),      # 7 divides 28 query heads but not 4 key/value heads, nor they it
    (12, 2, 28, 8, (4, 2)),      # Qwen2-1.5B: 12 heads split 4 ways; 2 key/value heads replicated
    (71, 1, 32, 8, (1, 8)),      # Falcon-7B: 71 query heads, a prime: pipeline stages only
    (71, 1, 32, 64, None),       # ... and 64 stages are more than its 32 layers
    (71, 1, 4, 5, None),
    (40, 8, 48, 16, (8, 2)),     # Qwen2.5-14B
    (32, 2, 32, 8, (8, 1)),      # 2 key/value heads replicated 4 times
    (24, 3, 32, 24, (1, 24)),    # 3 key/value heads: no degree over 1 that stays inside a node
    (24, 6, 32, 24, (2, 12)),    # 6 divides 24 but groups of 6 would cross 8-GPU nodes
    (None, None, 0, 8, (8, 1)),  # no head counts nor cached layers in the graph
    (None, None, 0, 24, (8, 3)),
    (None, None, 2, 24, None),
    (None, None, 0, 4, (4, 1)),
])
def test_serving_split_follows_the_head_and_layer_counts(heads: Any, kv_heads: Any, layers: int, gpus: int,
                                                         split: Any) -> None:
    from neurarch_trace.planner.serve import KvLayout
    assert KvLayout(layers=layers, heads=heads, kv_heads=kv_heads).split(gpus) == split


def test_kv_formula_reproduces_the_paged_attention_paper() -> None:
    """Kwon et al. 2023, section 3: OPT-13B's KV cache is 2 x 5120 x 40 x 2 = 800 KB per token."""
    comps = [{"id": "ids", "name": "ids", "type": "input", "params": {"shape": [8]}, "outputShape": [8]},
             {"id": "emb", "name": "embed_tokens", "type": "embedding",
              "params": {"vocabSize": 50272, "embeddingDim": 5120}, "inputShape": [8], "outputShape": [8, 5120]}]
    for i in range(40):
        for leaf in ("q_proj", "k_proj", "v_proj", "out_proj"):
            comps.append({"id": f"l{i}{leaf}", "name": f"decoder.layers.{i}.self_attn.{leaf}", "type": "linear",
                          "scope": f"decoder.layers.{i}.self_attn", "params": {"inFeatures": 5120, "outFeatures": 5120},
                          "inputShape": [8, 5120], "outputShape": [8, 5120]})
    comps.append({"id": "y", "name": "y", "type": "output", "params": {}, "inputShape": [8, 5120]})
    conns = [{"id": f"e{i}", "from": a["id"], "to": b["id"]} for i, (a, b) in enumerate(zip(comps, comps[1:]))]
    layout = kv_layout(analyse({"name": "OPT", "components": comps, "connections": conns}).graph)
    assert layout.layers == 40 and layout.bytes_per_token() == 2 * 5120 * 40 * 2 == 819_200


# --- 1. full training: a ZeRO cluster -------------------------------------------------------------


def test_llama7b_full_training_needs_zero_over_several_gpus(llama7b: dict[str, Any]) -> None:
    plan = plan_of(llama7b)
    fit = plan["fit"]
    # ZeRO's model states, 16 B per parameter, alone exceed one 80 GB card: 107.8 GB
    assert fit["modelStatesGb"] * 1e9 == 16 * P7 == 107_814_649_856 > 80e9
    # and one card of any kind: 18 B/param + 1 GB + buffers (512 B) + batch 1's 9.85 GB, x 1.15 =
    # 151.96 GB > 141 GB (with checkpointing 123.8 x 1.15 = 142.4 GB > 141 GB: just)
    assert all(card["batch"] == 0 for card in fit["cards"])
    # The cheapest per unit is the H100 ($3.95/h / 989.4 TFLOPS); two of them under ZeRO-3, per
    # GPU: 16 B x P / 2 + the largest layer gathered, 4 B x 131,072,000 + 1 GB + 512 B, and batch
    # 1's activations (no checkpointing: 3 x forward is cheaper than 4 x): 65.28 GB, x 1.15 = 75.1
    # GB <= 80 (borderline; batch 2 needs 86.4). ZeRO-2 on two: 2P + 14P/2 + 1e9 + 9.85e9 = 71.5
    # GB, x 1.15 = 82.2 > 80.
    static = 16 * P7 / 2 + 4 * 131_072_000 + 1e9 + 512
    assert (fit["gpu"], fit["gpus"], fit["strategy"], fit["batch"], fit["borderline"]) == ("H100", 2, "zero3", 1, True)
    assert fit["peakGb"] == pytest.approx((static + 9_850_339_328) / 1e9, rel=1e-12) == pytest.approx(65.281952768)
    assert fit["totalMemoryGb"] == 160 >= fit["modelStatesGb"]
    cost = plan["cost"]
    assert cost["peakGb"] == fit["peakGb"] and cost["gpus"] == 2 and cost["strategy"] == "zero3"
    assert cost["breakdown"]["gatheredLayerGb"] == pytest.approx(0.524288)
    assert cost["breakdown"]["optimizerGb"] == pytest.approx(8 * P7 / 2 / 1e9)
    # a billion tokens = 1e9 / 2048 samples of 3 x 29.26 TFLOPs = 4.286e19 FLOPs; / (989.4e12 x
    # 0.40) = 30.1 GPU-hours, 15.0 h on 2 GPUs, x $3.95 = $118.84
    training = cost["training"]
    flops = 3 * 29_261_612_187_648 * 1e9 / TOKENS
    assert training["flops"] == pytest.approx(flops, rel=1e-12) == pytest.approx(4.2863689728e19)
    assert training["gpuHours"] == pytest.approx(flops / H100_FLOPS / 3600, rel=1e-12)
    assert training["gpuHours"] == pytest.approx(30.0854, rel=1e-5)
    assert training["hours"] == pytest.approx(training["gpuHours"] / 2, rel=1e-12)
    assert training["usd"] == pytest.approx(training["gpuHours"] * 3.95, rel=1e-12) == pytest.approx(118.837, rel=1e-5)
    assert (training["flopsFactor"], training["recompute"], training["clusterUsdPerHour"]) == (3.0, False, 7.9)
    lines = make_plan(llama7b)["text"].splitlines()
    assert row("GPU fit", "2x H100 80 GB at batch 1 per GPU bf16") in lines
    assert row("", "ZeRO-3/FSDP, 65.3 GB peak per GPU") in lines
    assert row("Training cost", "~$119 per billion tokens on 2x H100") in lines
    assert row("", "15.0 h on 2 GPUs at 40% of 989.4 TFLOPS bf16") in lines


def test_llama70b_full_training_cluster(llama70b: dict[str, Any]) -> None:
    plan = plan_of(llama70b)
    fit = plan["fit"]
    states = 16 * P70  # 1,128.9 GB of ZeRO model states
    acts = 50_342_150_144  # per sample, every layer output kept
    # checkpointing keeps each block's float32 output (80 x 2048 x 8192 x 4 B): 8.06 GB. The backward
    # peaks before any block is recomputed: the loss's transients over a 128,256-token vocabulary
    # outweigh one recomputed block (0.60 GB) with its gradients
    acts_ckpt = acts - (47_647_293_440 - 80 * TOKENS * 8192 * 4)
    fixed = 4 * 1_050_673_152 + 1e9 + 512  # the gathered LM head, framework, buffers
    # Cheapest per unit: H200 without checkpointing (4.54 x 3 / 989.4 = 0.01377 per unit) beats the
    # H100 with it (3.95 x 4 / 989.4 = 0.01597), which is the only way an H100 holds it (without:
    # 1,128.9 / (80 / 1.15 - 55.5) = 81 GPUs > 64). H200: (141 / 1.15 - 55.5 GB) per GPU for the
    # states: 16.8 -> 24 GPUs (whole 8-GPU nodes past 8)
    assert acts_ckpt == pytest.approx(8_063_565_824)
    assert (fit["gpu"], fit["gpus"], fit["strategy"], fit["batch"]) == ("H200", 24, "zero3", 1)
    assert fit["peakGb"] == pytest.approx((states / 24 + fixed + acts) / 1e9, rel=1e-12)
    assert fit["peakGb"] == pytest.approx(102.58, rel=1e-4)
    assert fit["totalMemoryGb"] == 24 * 141 >= states / 1e9
    # 3 x 295.67 TFLOPs x 1e9 / 2048 = 4.331e20 FLOPs / (989.4e12 x 0.4) = 304.0 GPU-h x $4.54
    training = plan["cost"]["training"]
    flops = 3 * 295_674_138_591_232 * 1e9 / TOKENS
    assert training["gpuHours"] == pytest.approx(flops / H100_FLOPS / 3600, rel=1e-12) == pytest.approx(304.0, rel=1e-4)
    assert training["usd"] == pytest.approx(training["gpuHours"] * 4.54, rel=1e-12) == pytest.approx(1380.15, rel=1e-5)
    # On H100s only (--gpu H100): the fewest that hold it, with checkpointing: per GPU 55.70 GB for
    # the states -> 20.3 -> 24; at 24 the batch is 2: 47.04 + 5.20 + 2 x 8.66 = 69.56 GB, x 1.15 =
    # 79.99 <= 80 (batch 4: 104.2)
    h100 = plan_of(llama70b, gpu="H100")
    assert (h100["fit"]["gpus"], h100["fit"]["strategy"], h100["fit"]["batch"]) == (24, "zero3+ckpt", 2)
    assert h100["fit"]["peakGb"] == pytest.approx((states / 24 + fixed + 2 * acts_ckpt) / 1e9, rel=1e-12)
    assert h100["cost"]["training"]["flopsFactor"] == 4.0  # one more forward pass: +33%


def test_a_fixed_cluster_too_small_says_what_would_hold(llama70b: dict[str, Any]) -> None:
    plan = plan_of(llama70b, gpu="A100-80x8")
    assert plan["fit"]["fits"] is False and plan["cost"]["training"] is None
    # ZeRO-3 + checkpointing on A100-80s: (80 / 1.15 - 13.86 GB: the gathered LM head 4.20, the
    # framework 1, one sample 8.66) = 55.70 GB per GPU for 1,128.9 GB: 20.3 -> 21 hold it, and the
    # count is given as the planner counts clusters, in whole 8-GPU nodes past 8: 24, what
    # --gpu A100-80 picks
    needs = plan["fit"]["needs"]
    assert (needs["gpu"], needs["gpus"], needs["strategy"]) == ("A100-80", 24, "zero3+ckpt")
    assert needs["peakGb"] == pytest.approx((16 * P70 / 24 + 4 * 1_050_673_152 + 1e9 + 512 + 8_063_565_824) / 1e9)
    picked = plan_of(llama70b, gpu="A100-80")["fit"]
    assert (picked["gpus"], picked["strategy"]) == (24, "zero3+ckpt")
    lines = make_plan(llama70b, gpu="A100-80x8")["text"].splitlines()
    assert row("GPU fit", "8x A100-80 does not hold a training step") in lines
    assert row("", "ZeRO-3 + checkpointing needs 24x A100-80 80 GB") in lines
    assert row("", f"(3 nodes of 8, {needs['peakGb']:.1f} GB peak per GPU)") in lines
    # past 64 GPUs the count is not one --gpu NAMExN takes (1 to 64): the card says so
    a10g = make_plan(llama70b, gpu="A10G")
    assert a10g["plan"]["fit"]["needs"]["gpus"] == 152
    text = " ".join(line.strip("| ") for line in a10g["text"].splitlines())
    assert "needs 152x A10G 24 GB (19 nodes of 8, more than the 64 a plan sizes; 20.7 GB peak per GPU)" in text


# --- 2. fine-tuning -------------------------------------------------------------------------------

QUANTIZED_70B = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672)  # every block linear
ADAPTERS_70B = 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))
NF4 = (4 + 8 / 64 + 32 / (64 * 256)) / 8  # bytes per weight: 4.127 bits


def test_llama70b_qlora_numbers(llama70b: dict[str, Any]) -> None:
    plan = plan_of(llama70b, finetune="qlora")
    ft = plan["finetune"]
    assert QUANTIZED_70B == 68_451_041_280 and ADAPTERS_70B == 207_093_760
    assert (ft["mode"], ft["rank"]) == ("qlora", 16)
    assert (ft["trainableParams"], ft["quantizedParams"]) == (ADAPTERS_70B, QUANTIZED_70B)
    assert ft["adaptedLayers"] == 80 * 7  # q, k, v, o, gate, up, down; not the LM head
    # base: the block linears in NF4, the 2,102,665,216 others (embedding, LM head, norms) in 16 bits
    base = QUANTIZED_70B * NF4 + (P70 - QUANTIZED_70B) * 2
    assert ft["baseGb"] * 1e9 == pytest.approx(base, rel=1e-12) == pytest.approx(39.517110272e9)
    # one card: base + 18 B per adapter parameter + one 16-bit dequantised 8192 x 28672 weight + 1
    # GB + buffers = 44.71 GB static; without checkpointing + 50.38 GB of activations (the model's
    # + 560 adapters x 2048 x 16 x 2 B) = 95.09 GB, x 1.15 = 109.4 GB: only the H200 (141 GB) holds
    # it without checkpointing, and it is the plan (one card first, cheapest per hour)
    static = base + 18 * ADAPTERS_70B + 2 * 8192 * 28672 + 1e9 + 512
    acts = 50_342_150_144 + 560 * TOKENS * 16 * 2
    fit = plan["fit"]
    assert (fit["gpu"], fit["gpus"], fit["strategy"], fit["batch"]) == ("H200", 1, "single", 1)
    assert fit["peakGb"] == pytest.approx((static + acts) / 1e9, rel=1e-12) == pytest.approx(95.093, rel=1e-4)
    # cost: the frozen base 2 x forward + adapters 3 x their forward (2 x 207.1M x 2048 FLOPs)
    training = plan["cost"]["training"]
    per_sample = 2 * 295_674_138_591_232 + 3 * 2 * ADAPTERS_70B * TOKENS
    assert training["flops"] == pytest.approx(per_sample * 1e9 / TOKENS, rel=1e-12)
    assert training["backwardFactor"] == 2
    assert training["usd"] == pytest.approx(per_sample * 1e9 / TOKENS / H100_FLOPS / 3600 * 4.54, rel=1e-12)
    text = make_plan(llama70b, finetune="qlora")["text"].splitlines()
    assert row("Fine-tune", "QLoRA r=16: 207.1M trainable params (0.29%)") in text
    # no step rehearsed in this graph: the activations are estimated from layer outputs, and the row says so
    at = text.index(row("", "adapters on 560 linear layers, NF4 base 39.5 GB"))
    assert text[at + 1] == row("", "activations estimated from layer outputs")
    # which recipe that is, and what the other (prepare_model_for_kbit_training) measured on a GPU
    card = make_plan(llama70b, finetune="qlora")["text"]
    assert "non-4-bit weights sized in 16 bits; prepare_model_for_kbit_training" in " ".join(
        line.strip("| ").strip() for line in card.splitlines())
    assert "prepare_model_for_kbit_training" not in make_plan(llama70b, finetune="lora")["text"]


def test_llama70b_qlora_fits_one_80gb_card_not_one_48gb_card(llama70b: dict[str, Any]) -> None:
    # One A100-80: with checkpointing, per sample 50.38 - (47.65 - 5.37) = 8.10 GB (each block's
    # float32 output kept); batch 2: 44.71 + 16.20 = 60.92 GB, x 1.15 = 70.1 <= 80 (batch 4: 88.7 GB)
    static = QUANTIZED_70B * NF4 + (P70 - QUANTIZED_70B) * 2 + 18 * ADAPTERS_70B + 2 * 8192 * 28672 + 1e9 + 512
    freed = 47_647_293_440 - 80 * TOKENS * 8192 * 4
    per_sample = 50_342_150_144 + 560 * TOKENS * 16 * 2 - freed
    for card in ("A100-80", "H100"):
        fit = plan_of(llama70b, finetune="qlora", gpu=card)["fit"]
        assert (fit["gpu"], fit["gpus"], fit["strategy"], fit["batch"]) == (card, 1, "single+ckpt", 2)
        assert fit["peakGb"] == pytest.approx((static + 2 * per_sample) / 1e9, rel=1e-12)
        assert fit["peakGb"] == pytest.approx(60.92, rel=1e-3)
    # a 48 GB card: the 44.71 GB static part alone, x 1.15 = 51.4 GB, exceeds it; two with ZeRO-3
    # divide the base. (The QLoRA paper's 65B on one 48 GB GPU is LLaMA-65B, whose 32,000-token
    # vocabulary keeps 1.05 GB in 16 bits where LLaMA-3-70B's 128,256 keep 4.2 GB.)
    assert static * 1.15 > 48e9
    fit = plan_of(llama70b, finetune="qlora", gpu="L40S")["fit"]
    assert (fit["gpus"], fit["strategy"]) == (2, "zero3+ckpt")
    assert plan_of(llama70b, finetune="qlora", gpu="L40Sx1")["fit"]["fits"] is False


def test_llama7b_lora_and_qlora(llama7b: dict[str, Any]) -> None:
    adapters = 32 * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008))
    quantized = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    acts = 9_850_339_328 + 224 * TOKENS * 16 * 2
    lora = plan_of(llama7b, finetune="lora")
    assert lora["finetune"]["trainableParams"] == adapters == 39_976_960
    # LoRA: the 16-bit base 13.48 GB + 18 x 40.0M + 1 GB; batch 1: 25.04 GB x 1.15 = 28.8 > 24 GB;
    # the L40S (48 GB) at batch 2: 15.20 + 2 x 9.87 = 34.93 GB, x 1.15 = 40.2 (batch 4: 62.9)
    static = P7 * 2 + 18 * adapters + 1e9 + 512
    assert (lora["fit"]["gpu"], lora["fit"]["batch"]) == ("L40S", 2)
    assert lora["fit"]["peakGb"] == pytest.approx((static + 2 * acts) / 1e9, rel=1e-12)
    qlora = plan_of(llama7b, finetune="qlora")
    # QLoRA: 3.87 GB base + 0.72 GB adapters + 0.09 GB dequantised 4096 x 11008 + 1 GB, + 9.87 GB
    # at batch 1 = 15.54 GB, x 1.15 = 17.9 GB: one L4 (24 GB), not a T4 (16 GB)
    static_q = quantized * NF4 + (P7 - quantized) * 2 + 18 * adapters + 2 * 4096 * 11008 + 1e9 + 512
    assert (qlora["fit"]["gpu"], qlora["fit"]["gpus"], qlora["fit"]["batch"]) == ("L4", 1, 1)
    assert qlora["fit"]["peakGb"] == pytest.approx((static_q + acts) / 1e9, rel=1e-12) == pytest.approx(15.54, rel=1e-3)


def test_lora_without_linear_layers_says_so_on_the_card() -> None:
    doc = json.loads((DATA / "tiny_cnn.neurarch.json").read_text())
    answer = make_plan(doc, finetune="lora")
    plan = answer["plan"]
    # tiny_cnn's only linear layer is its output layer, which LoRA (PEFT's all-linear) leaves out
    assert plan["finetune"]["applied"] is False and plan["finetune"]["mode"] == "full"
    assert plan["finetune"]["note"].startswith("LoRA needs linear layers to adapt")
    assert plan["fit"]["gpu"] == "T4" and plan["cost"]["training"]["backwardFactor"] == 3
    assert row("Fine-tune", "LoRA needs linear layers to adapt and this model") in answer["text"].splitlines()
    assert plan["notes"][-1] == plan["finetune"]["note"]
    assert plan["finetune"]["note"] == ("LoRA needs linear layers to adapt and this model has none besides its output "
                                        "layer: the plan is for full training")
    # a model with no linear layer at all is not told about an output layer it does not have
    no_linear = copy.deepcopy(doc)
    for node in no_linear["components"]:
        if node["type"] == "linear":
            node["type"] = "customModule"
    assert make_plan(no_linear, finetune="lora")["plan"]["finetune"]["note"] == (
        "LoRA needs linear layers to adapt and this model has none: the plan is for full training")


# --- 3. serving -----------------------------------------------------------------------------------


def test_llama7b_serves_in_bf16_on_one_24gb_card_at_a_short_context(llama7b: dict[str, Any]) -> None:
    plan = plan_of(llama7b)
    s = plan["serve"]
    weights = P7 * 2 + 512  # bf16 + buffers
    kv_per_token = 2 * 32 * 32 * 128 * 2  # 524,288 B: 2 x layers x kv_heads x head_dim x 2 B
    # a decode step: the LM head's input and output for one token (4096 + 32000) x 2 B + the
    # token's logits in fp32, 32000 x 4 B
    step = (4096 + 32000) * 2 + 32000 * 4
    # batch 1 at the traced 2048 tokens: 13.48 + 1.07 + 1 GB = 15.55 GB, x 1.15 = 17.9 <= 24: the
    # cheapest 24 GB card, an L4; batch 4: 18.77 GB x 1.15 = 21.6 (batch 8: 25.4 > 24)
    assert (s["gpu"], s["gpus"], s["precision"], s["context"], s["batch"]) == ("L4", 1, "bf16", 2048, 4)
    assert s["kvCacheGb"] * 1e9 == kv_per_token * 2048 * 4
    assert s["peakGb"] * 1e9 == pytest.approx(weights + 4 * (kv_per_token * 2048 + step) + 1e9, rel=1e-12)
    assert (s["kvHeads"], s["headDim"], s["layers"], s["kvBytesPerToken"]) == (32, 128, 32, kv_per_token)
    # the 24 GB cards asked for by name, at batch 1 and a short context
    a = analyse(llama7b)
    table = gpu_table()
    for name in ("L4", "RTX-4090", "RTX-3090", "A10G"):
        one = serve(a, [parse_gpu(name).gpu], table, "bf16", context=2048, batch=1, gpus=1)
        assert one.fits and one.batch == 4  # 21.6 GB of need at batch 4 on any 24 GB card
        assert one.need_bytes == pytest.approx((weights + 4 * (kv_per_token * 2048 + step) + 1e9) * 1.15)
        # 128K tokens x batch 8: the KV cache alone is 524,288 x 131,072 x 8 = 549.8 GB
        long = serve(a, [parse_gpu(name).gpu], table, "bf16", context=131_072, batch=8, gpus=1)
        assert not long.fits and long.kv_bytes == kv_per_token * 131_072 * 8 == 549_755_813_888
    # over HTTP terms: context 131072 on an RTX 4090 does not hold one sequence (68.7 GB of KV)
    card = plan_of(llama7b, context=131_072, gpu="RTX-4090x1")["serve"]
    assert card["fits"] is False and card["kvCacheGb"] == pytest.approx(kv_per_token * 131_072 / 1e9)
    # and the smallest setup that holds 128K x 8: 8 GPUs (fewest), the only 8-GPU kind with room is
    # the H200: (13.48 + 549.76) / 8 + 1 + 8 x 0.0002 = 71.4 GB, x 1.15 = 82.1 <= 141
    big = serve(a, table.cards, table, "bf16", context=131_072, batch=8)
    assert (big.gpu.id, big.gpus) == ("H200", 8)


def test_16_bit_serving_is_named_as_the_card_runs_it() -> None:
    # the T4 (Turing) has no bf16: its 16-bit weights are fp16, the same 2 bytes (its datasheet,
    # neurarch_trace/data/gpus.json); the L4 runs bf16
    bert = json.loads((Path(__file__).parent / "data" / "traced_bert.neurarch.json").read_text())
    weights = []
    for name, precision in {"T4": "fp16", "L4": "bf16"}.items():
        answer = make_plan(bert, gpu=f"{name}x1")
        s = answer["plan"]["serve"]
        assert (s["gpu"], s["precision"]) == (name, precision)
        assert [o["precision"] for o in s["options"]] == [precision, "int8", "int4"]
        weights.append(s["weightsGb"])
        assert f"{name} {gpu_table().by_id(name).memory_gb:g} GB {precision}," in answer["text"]
    assert weights[0] == weights[1]  # the bytes do not change with the name


def test_llama70b_serving(llama70b: dict[str, Any]) -> None:
    plan = plan_of(llama70b)
    s = plan["serve"]
    weights = P70 * 2 + 512
    kv_per_token = 2 * 80 * 8 * 128 * 2  # 327,680 B
    step = (8192 + 128256) * 2 + 128256 * 4
    # bf16: 141.1 GB of weights fit no one card; on two, per GPU 70.55 + 0.34 + 1 GB = 71.9 GB,
    # x 1.15 = 82.7: only two H200s (an A100-80 or H100 holds 69.6 GB); the batch then grows to 128
    assert (s["gpu"], s["gpus"], s["precision"], s["batch"]) == ("H200", 2, "bf16", 128)
    assert s["peakGb"] * 1e9 == pytest.approx((weights + 128 * kv_per_token * 2048) / 2 + 128 * step + 1e9, rel=1e-12)
    options = {o["precision"]: o for o in s["options"]}
    # int8: 1 B per block-linear weight + an fp32 scale per output row, the rest in 16 bits: 72.68
    # GB on one H200; int4 (NF4): 39.52 GB + 0.33 + 1 GB = 40.85 GB x 1.15 = 47.0 <= 48: one L40S
    rows = 80 * (8192 + 1024 + 1024 + 8192 + 28672 * 2 + 8192)
    int8 = QUANTIZED_70B + 4 * rows + (P70 - QUANTIZED_70B) * 2 + 512
    assert options["int8"]["weightsGb"] * 1e9 == pytest.approx(int8, rel=1e-12)
    assert (options["int8"]["gpu"], options["int8"]["gpus"]) == ("H200", 1)
    assert (options["int4"]["gpu"], options["int4"]["gpus"], options["int4"]["batch"]) == ("L40S", 1, 1)
    assert options["int4"]["weightsGb"] * 1e9 == pytest.approx(QUANTIZED_70B * NF4 + (P70 - QUANTIZED_70B) * 2 + 512)


def test_context_defaults_to_the_position_table() -> None:
    # GPT-2 learns 1024 positions (wpe); LLaMA has none in the graph: the traced length
    gpt2 = plan_of(json.loads((DATA / "traced_gpt2.neurarch.json").read_text()))
    assert gpt2["serve"]["context"] == 1024
    # GPT-2's fused c_attn (3 x 64 wide): keys and values are 192 - 64 (c_proj's input)
    assert gpt2["serve"]["kvWidth"] == 2 * 2 * 64 and gpt2["serve"]["layers"] == 2
    bert = plan_of(json.loads((DATA / "traced_bert.neurarch.json").read_text()), context=128)
    assert bert["serve"]["context"] == 128 and bert["serve"]["layers"] == 0  # an encoder caches nothing
    assert bert["notes"][-1].startswith("serving: no decoder key/value projections found")
    # an attention layer typed as such (nn.MultiheadAttention, 64 wide): keys and values 64 each
    tiny = {"name": "TinyLM", "components": [
        {"id": "ids", "name": "ids", "type": "input", "params": {"shape": [16]}, "outputShape": [16]},
        {"id": "emb", "name": "emb", "type": "embedding", "params": {"vocabSize": 1000, "embeddingDim": 64},
         "inputShape": [16], "outputShape": [16, 64]},
        {"id": "attn", "name": "attn", "type": "multiHeadAttention", "params": {"hiddenDim": 64, "numHeads": 4},
         "inputShape": [16, 64], "outputShape": [16, 64]},
        {"id": "y", "name": "y", "type": "output", "params": {}, "inputShape": [16, 64]}],
        "connections": [{"id": "e0", "from": "ids", "to": "emb"}, {"id": "e1", "from": "emb", "to": "attn"},
                        {"id": "e2", "from": "attn", "to": "y"}]}
    serve_plan = plan_of(tiny)["serve"]
    assert (serve_plan["layers"], serve_plan["kvBytesPerToken"], serve_plan["context"]) == (1, 2 * 64 * 2, 16)


# --- 4. the user's own hardware -------------------------------------------------------------------


def test_owned_cards_fit_and_batch_and_cost_only_with_a_price(llama7b: dict[str, Any]) -> None:
    table = gpu_table()
    own = {c.id: (c.memory_gb, c.usd_per_hour, c.peak_tflops) for c in table.own_cards}
    assert own == {"RTX-4090": (24, None, 165.2), "RTX-3090": (24, None, 71), "RTX-A6000": (48, None, 154.8),
                   "L40": (48, None, 181.05)}
    assert all(c.peak_source for c in table.own_cards)
    assert [c.id for c in table.cards] == ["T4", "L4", "A10G", "L40S", "A100-40", "A100-80", "H100", "H200"]
    plan = plan_of(llama7b, finetune="qlora", gpu="rtx 4090")
    assert (plan["fit"]["gpu"], plan["fit"]["gpus"], plan["fit"]["batch"]) == ("RTX-4090", 1, 1)
    training = plan["cost"]["training"]
    assert training["usd"] is None and training["gpuHours"] > 0
    text = make_plan(llama7b, finetune="qlora", gpu="rtx 4090")["text"].splitlines()
    assert row("Training cost", "n/a: RTX-4090 has no list price; give") in text
    # on several such cards the card gives the wall-clock time too (a new-user pass: it gave GPU-hours alone)
    two = make_plan(llama7b, finetune="qlora", gpu="RTX-4090x2")
    hours = two["plan"]["cost"]["training"]["hours"]
    assert "on 2 GPUs," in " ".join(line.strip("| ").strip() for line in two["text"].splitlines())
    assert hours == pytest.approx(two["plan"]["cost"]["training"]["gpuHours"] / 2, rel=1e-12)
    # a price under a cent is printed as given, not as $0.00
    cheap = make_plan(llama7b, finetune="qlora", gpu="RTX-4090", usd_per_hour=0.0012)["text"]
    assert "$0.0012/h" in cheap and "$0.00/h" not in cheap
    priced = plan_of(llama7b, finetune="qlora", gpu="RTX-4090", usd_per_hour=0.35)["cost"]["training"]
    assert priced["usd"] == pytest.approx(priced["gpuHours"] * 0.35, rel=1e-12)
    # the 4090's dense bf16 rate with fp32 accumulate, 165.2 TFLOPS, at 40%
    assert priced["gpuHours"] == pytest.approx(priced["flops"] / (165.2e12 * 0.4) / 3600, rel=1e-12)


def test_gpu_names_and_counts() -> None:
    assert (parse_gpu("H100x8").gpu.id, parse_gpu("H100x8").gpus) == ("H100", 8)
    assert (parse_gpu("rtx-4090").gpu.id, parse_gpu("rtx-4090").gpus) == ("RTX-4090", None)
    assert (parse_gpu("RTX 4090x2").gpu.id, parse_gpu("RTX 4090x2").gpus) == ("RTX-4090", 2)
    assert parse_gpu("a100-80").gpu.id == "A100-80" and parse_gpu("L40").gpu.id == "L40"
    with pytest.raises(ValueError, match=r"^gpu 'RTX-4090x-2' asks for -2 GPUs"):  # not the name's own '-'
        parse_gpu("RTX-4090x-2")


@pytest.mark.parametrize("kwargs, sentence", [
    ({"gpu": "B200"}, "unknown GPU 'B200': known cards are T4, L4, A10G, L40S, A100-40, A100-80, H100, H200, "
                      "RTX-4090, RTX-3090, RTX-A6000, L40 (add xN for N of them, e.g. H100x8)"),
    ({"gpu": "H100x65"}, "gpu 'H100x65' asks for 65 GPUs; a plan uses 1 to 64"),
    ({"gpu": "H100x-1"}, "gpu 'H100x-1' asks for -1 GPUs; a plan uses 1 to 64"),
    ({"gpu": "RTX-4090x0"}, "gpu 'RTX-4090x0' asks for 0 GPUs; a plan uses 1 to 64"),
    ({"finetune": "adapter"}, "finetune must be one of full, lora or qlora, not 'adapter'"),
    ({"context": 0}, "context must be a positive integer of at most 2^31 tokens, not 0"),
    ({"context": "2k"}, "context must be a positive integer of at most 2^31 tokens, not '2k'"),
    ({"usd_per_hour": 1.0}, "usd_per_hour prices the card named by gpu: give gpu too"),
    ({"gpu": "L40", "usd_per_hour": 0}, "usd_per_hour must be a positive number of dollars per GPU-hour of at most "
                                         "10,000, not 0"),
    ({"gpu": "L40", "usd_per_hour": 123456}, "usd_per_hour must be a positive number of dollars per GPU-hour of at "
                                              "most 10,000, not 123456"),
    # a count in other digits than ASCII's is no count: int() would read Arabic-Indic eight as 8
    ({"gpu": "H100x\u0668"}, "unknown GPU 'H100x\u0668': known cards are T4, L4, A10G, L40S, A100-40, A100-80, "
                              "H100, H200, RTX-4090, RTX-3090, RTX-A6000, L40 (add xN for N of them, e.g. H100x8)"),
    ({"gpu": "H100x\uff18"}, "unknown GPU 'H100x\uff18': known cards are T4, L4, A10G, L40S, A100-40, A100-80, "
                              "H100, H200, RTX-4090, RTX-3090, RTX-A6000, L40 (add xN for N of them, e.g. H100x8)"),
])
def test_bad_options_are_one_sentence(kwargs: dict[str, Any], sentence: str) -> None:
    doc = json.loads((DATA / "mlp.neurarch.json").read_text())
    with pytest.raises(OptionError) as info:
        make_plan(doc, **kwargs)
    assert str(info.value) == sentence


# --- small models read as today; every card fits 68 columns ---------------------------------------


@pytest.mark.parametrize("name", ["mlp", "tiny_cnn", "resnet50", "traced_gpt2", "traced_bert", "traced_vit"])
def test_small_models_stay_on_one_gpu(name: str) -> None:
    plan = plan_of(json.loads((DATA / f"{name}.neurarch.json").read_text()))
    assert (plan["fit"]["gpus"], plan["fit"]["strategy"], plan["cost"]["training"]["gpus"]) == (1, "single", 1)
    assert plan["fit"]["gpu"] == "T4"


def test_every_new_card_fits_68_columns(llama7b: dict[str, Any], llama70b: dict[str, Any]) -> None:
    requests = [{}, {"finetune": "lora"}, {"finetune": "qlora"}, {"gpu": "RTX-4090"}, {"gpu": "A100-80x8"},
                {"gpu": "L40x2", "usd_per_hour": 0.9, "finetune": "qlora"}, {"context": 131_072}]
    for doc in (llama7b, llama70b):
        for kwargs in requests:
            for line in make_plan(doc, source={"target": "hf:meta-llama/x"}, **kwargs)["text"].splitlines():
                assert len(line) == WIDTH, line
