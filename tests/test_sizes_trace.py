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


@pytest.mark.parametrize("name, config", [("llama7b_meta2048", {}), ("llama3_70b_meta2048", LLAMA3_70B)])
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
