"""The recorded LLaMA graphs of test_sizes.py are what the tracer writes today, and the plan of a
fresh trace names the setups the issue asks for (torch and transformers; the meta device, so no
weights are allocated)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan

DATA = Path(__file__).parent / "data"
LLAMA3_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                  num_key_value_heads=8, vocab_size=128256)


def _trace(config: dict) -> dict:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    return trace_model(model, torch.randint(0, 1000, (1, 2048), device="meta"))


@pytest.mark.parametrize("name, config", [
    pytest.param("llama7b_meta2048", {}, marks=pytest.mark.slow),  # 2 s: the full run's
    pytest.param("llama3_70b_meta2048", LLAMA3_70B, marks=pytest.mark.slow),  # 4 s: the full run's
])
def test_recorded_graph_matches_a_fresh_trace(name: str, config: dict) -> None:
    fresh = _trace(config)
    with gzip.open(DATA / f"{name}.neurarch.json.gz", "rt", encoding="utf-8") as f:
        recorded = json.load(f)
    for key in ("params", "flops", "activationBytes", "bufferBytes"):
        assert fresh["measured"][key] == recorded["measured"][key], key
    shapes = lambda g: [(c["name"], c["type"], c.get("outputShape"), c["params"]) for c in g["components"]]  # noqa: E731
    assert shapes(fresh) == shapes(recorded)
    plan = make_plan(fresh)["plan"]
    # full training: several GPUs whose memory holds ZeRO-3's 16 bytes per parameter
    fit = plan["fit"]
    assert fit["gpus"] > 1 and fit["strategy"].startswith("zero")
    assert fit["totalMemoryGb"] * 1e9 >= 16 * fresh["measured"]["params"]
    assert plan["cost"]["training"]["usd"] > 0
    # QLoRA on one GPU, serving on a named setup
    qlora = make_plan(fresh, finetune="qlora")["plan"]
    assert qlora["fit"]["gpus"] == 1 and qlora["cost"]["training"]["usd"] > 0
    assert plan["serve"]["fits"] and plan["serve"]["peakGb"] > plan["serve"]["weightsGb"] / plan["serve"]["gpus"]


@pytest.mark.slow  # a 65B config traced and rehearsed on meta (3 s): the full run's
def test_qlora_paper_65b_on_one_48gb_gpu() -> None:
    """Dettmers et al. 2023 fine-tune LLaMA-65B on one 48 GB GPU. LLaMA-65B (hidden 8192, MLP 22016,
    80 layers, 64 heads, vocabulary 32000) has 65,285,660,672 parameters, 64,760,053,760 of them in
    the block linears: NF4 at 4.127 bits, 33.41 GB, + 525.6M others in 16 bits, 1.05 GB = 34.46 GB
    of base; + 18 B x 199.9M adapters (3.60 GB), a dequantised 8192 x 22016 weight (0.36 GB) and 1
    GB = 39.42 GB static. The activations are the rehearsed step's with the base in 16 bits: at
    1024 tokens, with checkpointing, one sample keeps every decoder layer's 16-bit input (80 x 1024
    x 8192 x 2 B = 1.34 GB) and one layer being recomputed, and not the 4.03 GB KV cache that
    transformers' default ``use_cache=True`` returns, which checkpointing turns off: 41.2 GB at
    batch 1, x 1.15 = 47.4 GB, on one card, as the paper did (with paged optimizers)."""
    config = dict(hidden_size=8192, intermediate_size=22016, num_hidden_layers=80, num_attention_heads=64,
                  num_key_value_heads=64, vocab_size=32000)
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    graph = trace_model(model, torch.randint(0, 1000, (1, 1024), device="meta"))
    assert graph["measured"]["params"] == 65_285_660_672
    plan = make_plan(graph, finetune="qlora", gpu="RTX-A6000")["plan"]
    linears = 80 * (4 * 8192**2 + 3 * 8192 * 22016)
    nf4 = (4 + 8 / 64 + 32 / (64 * 256)) / 8
    assert plan["finetune"]["quantizedParams"] == linears == 64_760_053_760
    assert plan["finetune"]["baseGb"] * 1e9 == pytest.approx(linears * nf4 + (65_285_660_672 - linears) * 2)
    fit = plan["fit"]
    assert (fit["gpus"], fit["strategy"], fit["batch"]) == (1, "single+ckpt", 1) and fit["needGb"] <= 48
    assert graph["measured"]["training"]["kvCacheBytesPerSample"] == 80 * 1024 * 8192 * (4 + 2)  # float32 keys
    assert plan["finetune"]["baseGb"] < 48 / 1.15  # the 4-bit base alone fits one card with headroom


def test_serving_splits_qwen2_heads_four_ways_on_eight_gpus() -> None:
    """Qwen2-7B's 28 query and 4 key/value heads (hidden 3584 = 28 x 128) do not split 8 ways:
    vLLM refuses tensor_parallel_size=8 ("Total number of attention heads (28) must be divisible by
    tensor parallel size (8)"). On a fixed 8 GPUs the plan serves it as tensor parallel 4 x 2
    pipeline stages; a config with 2 layers, traced on meta, has the same head counts."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=2,
                                      num_attention_heads=28, num_key_value_heads=4, vocab_size=1000)
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    graph = trace_model(model, torch.randint(0, 1000, (1, 64), device="meta"), training_step=False)
    answer = make_plan(graph, gpu="H100x8")
    serve = answer["plan"]["serve"]
    assert (serve["heads"], serve["kvHeads"], serve["headDim"], serve["layers"]) == (28, 4, 128, 2)
    assert (serve["gpus"], serve["tensorParallel"], serve["pipelineStages"]) == (8, 4, 2)
    rows = [line.strip("| ") for line in answer["text"].splitlines()]
    assert "tensor parallel 4 x pipeline 2 (28 heads, 4 KV)" in rows
    # one GPU holds it when free to choose: no pipeline, no extra row
    alone = make_plan(graph)
    assert (alone["plan"]["serve"]["gpus"], alone["plan"]["serve"]["pipelineStages"]) == (1, 1)
    assert "pipeline" not in alone["text"]
    # no rotary position table: serving defaults to the length training is sized for
    assert alone["plan"]["serve"]["context"] == 64
    assert make_plan(graph, seq_len=4096)["plan"]["serve"]["context"] == 4096
    # 16 GPUs: tensor parallel 4 leaves 4 pipeline stages for 2 layers, more than the model has;
    # it is sized on the 8 it can use
    crowded = make_plan(graph, gpu="H100x16")
    s16 = crowded["plan"]["serve"]
    assert (s16["gpus"], s16["gpusAsked"], s16["tensorParallel"], s16["pipelineStages"]) == (8, 16, 4, 2)
    assert s16["peakGb"] == pytest.approx(serve["peakGb"], rel=1e-12)  # the same split as on 8
    assert any(n.startswith("serving: sized on 8 of the 16 GPUs, the most this model splits over") and
               "28 query and 4 key/value heads" in n for n in crowded["plan"]["notes"])
    crowded_rows = [line.strip("| ") for line in crowded["text"].splitlines()]
    assert "8 of the 16 GPUs: the most it splits over" in crowded_rows
