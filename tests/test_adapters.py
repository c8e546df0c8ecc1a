"""The LoRA and QLoRA steps rehearsed as PEFT and bitsandbytes run them (rehearsal/adapters.py): which
layers are adapted, what each adapter saves for the backward, byte for byte, and how the plan uses
the rehearsed step."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan
from neurarch_trace.rehearsal import rehearse_training_step
from neurarch_trace.rehearsal.adapters import RANK, RECIPES, adapted_layers
from neurarch_trace.rehearsal.step import InputPlan, Rehearsal

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, INTER, LAYERS, HEADS, VOCAB = 64, 160, 2, 4, 512
BATCH, TOKENS = 2, 24


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return model.train()


def _recipe(name: str):
    return next(r for r in RECIPES if r.name == name)


def _saved(recipe: str) -> dict:
    """Bytes saved for the backward inside each module call of layer 1 (the first layer's input
    does not need a gradient), at BATCH x TOKENS."""
    model = _llama()
    plan = InputPlan((torch.zeros(1, TOKENS, dtype=torch.long, device="meta"),), {}, 1)
    run = Rehearsal(model, plan, recipe=_recipe(recipe)).run(BATCH, TOKENS)
    return {q.removeprefix("model.layers.1."): calls[0] for q, calls in run.saved.items()
            if q.startswith("model.layers.1.")}


def test_every_linear_layer_but_the_output_embedding_is_adapted() -> None:
    model = _llama()
    names = [x.name for x in adapted_layers(model)]
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert names == [f"model.layers.{i}.{n}" for i in range(LAYERS) for n in per_layer]
    assert "lm_head" not in names


def test_gpt2_conv1d_layers_are_adapted_with_their_transposed_weights() -> None:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    found = {x.name: x for x in adapted_layers(model)}
    assert sorted(found) == sorted(f"transformer.h.{i}.{n}" for i in range(2)
                                   for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    c_attn = found["transformer.h.0.attn.c_attn"]
    assert (c_attn.out_features, c_attn.in_features, c_attn.transposed) == (96, 32, True)


def test_a_model_peft_cannot_adapt_with_all_linear_gets_no_recipe() -> None:
    # PEFT takes target_modules="all-linear" for a transformers PreTrainedModel only
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    import vit
    assert adapted_layers(vit.ViT_B_16()) == []


def test_lora_adapters_each_save_a_16_bit_copy_of_their_input() -> None:
    # peft.tuners.lora.Linear casts the input to the adapter's float32 (_cast_input_dtype) and autocast
    # casts it back to a new bfloat16 tensor, which lora_A saves; lora_B saves lora_A's r-wide output.
    # The frozen base saves nothing of its own.
    saved = _saved("lora")
    rows = BATCH * TOKENS
    for name, fan_in in [("self_attn.q_proj", HIDDEN), ("self_attn.k_proj", HIDDEN), ("self_attn.v_proj", HIDDEN),
                         ("self_attn.o_proj", HIDDEN), ("mlp.gate_proj", HIDDEN), ("mlp.up_proj", HIDDEN),
                         ("mlp.down_proj", INTER)]:
        assert saved[name] == rows * (2 * fan_in + 2 * RANK), name


def test_qlora_adapters_share_their_input_and_the_4_bit_base_saves_nothing() -> None:
    # peft.tuners.lora.bnb.Linear4bit passes the input to lora_A as it is under autocast: q, k and v
    # share the norm's bfloat16 output, saved once (at q_proj, the first to save it); MatMul4Bit
    # saves only the packed weight
    saved = _saved("qlora")
    rows = BATCH * TOKENS
    assert saved["self_attn.q_proj"] == rows * (2 * HIDDEN + 2 * RANK)
    assert saved["self_attn.k_proj"] == saved["self_attn.v_proj"] == rows * 2 * RANK
    assert saved["mlp.gate_proj"] == rows * (2 * HIDDEN + 2 * RANK)
    assert saved["mlp.up_proj"] == rows * 2 * RANK


def test_kbit_makes_the_residual_stream_float32_and_each_adapter_copies_it() -> None:
    # prepare_model_for_kbit_training casts the norms to float32: their outputs are float32, which
    # autocast casts to a new bfloat16 copy for each adapter; Linear4bit returns its input's dtype
    saved = _saved("qloraKbit")
    rows = BATCH * TOKENS
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert saved[name] == rows * (2 * HIDDEN + 2 * RANK), name
    # RMSNorm keeps its input in float32 and one rsqrt per row in both recipes: here the residual
    # stream itself (already float32), there its float32 copy
    assert saved["input_layernorm"] == _saved("qlora")["input_layernorm"] == rows * (4 * HIDDEN + 4)


def test_the_step_is_rehearsed_for_the_mode_asked_only() -> None:
    model = _llama()
    ids = torch.zeros(1, TOKENS, dtype=torch.long, device="meta")
    assert "adapters" not in rehearse_training_step(model, (ids,), batch_size=1)["measured"]
    lora = rehearse_training_step(model, (ids,), batch_size=1, finetune="lora")["measured"]["adapters"]
    assert set(lora) == {"rank", "layers", "lora"} and (lora["rank"], lora["layers"]) == (RANK, 7 * LAYERS)
    qlora = rehearse_training_step(model, (ids,), batch_size=1, finetune="qlora")["measured"]["adapters"]
    assert set(qlora) == {"rank", "layers", "qlora", "qloraKbit"}
    # float32 where the 16-bit recipe is bfloat16: more per sample
    assert qlora["qloraKbit"]["perSampleBytes"] > qlora["qlora"]["perSampleBytes"] > 0
    # the model is as it was: no forward of an adapted module's own instance is left behind
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(not p.requires_grad or p.dtype == torch.float32 for p in model.parameters())


def test_trace_model_refuses_an_unknown_finetune_mode() -> None:
    with pytest.raises(ValueError, match="finetune must be None, 'full', 'lora' or 'qlora', not 'adapter'"):
        trace_model(nn.Linear(2, 2), torch.randn(1, 2), finetune="adapter")
    # any case, as on the command line
    ids = torch.zeros(1, TOKENS, dtype=torch.long, device="meta")
    graph = trace_model(_llama().eval(), ids, finetune="LoRA")
    assert set(graph["measured"]["training"]["adapters"]) == {"rank", "layers", "lora"}


@pytest.fixture(scope="module")
def qlora_graph() -> dict:
    torch.manual_seed(0)
    model = _llama().eval()
    return trace_model(model, torch.zeros(1, TOKENS, dtype=torch.long, device="meta"), finetune="qlora")


def test_the_plan_sizes_qlora_from_the_rehearsed_step(qlora_graph: dict) -> None:
    adapters = qlora_graph["measured"]["training"]["adapters"]
    plan = make_plan(qlora_graph, finetune="qlora", gpu="T4")["plan"]
    assert plan["finetune"]["activations"] == "rehearsed"
    # the same graph with the rehearsed step's bytes per sample one MB larger: the fit's peak at
    # its batch grows by exactly batch x 1 MB (the setup and its states unchanged)
    bigger = copy.deepcopy(qlora_graph)
    bigger["measured"]["training"]["adapters"]["qlora"]["perSampleBytes"] = adapters["qlora"]["perSampleBytes"] + 1e6
    other = make_plan(bigger, finetune="qlora", gpu="T4", seq_len=TOKENS)["plan"]
    base = make_plan(qlora_graph, finetune="qlora", gpu="T4", seq_len=TOKENS)["plan"]
    assert other["fit"]["batch"] == base["fit"]["batch"]
    assert other["fit"]["peakGb"] - base["fit"]["peakGb"] == pytest.approx(base["fit"]["batch"] * 1e6 / 1e9, rel=1e-9)
    # without the rehearsed step the plan estimates from full training, as before
    bare = copy.deepcopy(qlora_graph)
    del bare["measured"]["training"]["adapters"]
    assert make_plan(bare, finetune="qlora", gpu="T4")["plan"]["finetune"]["activations"] == "full training"
    assert make_plan(bare, finetune="qlora", gpu="T4")["plan"]["finetune"]["kbit"] is None


def test_the_card_gives_the_kbit_recipes_peak_on_its_setup(qlora_graph: dict) -> None:
    out = make_plan(qlora_graph, finetune="qlora", gpu="T4", seq_len=TOKENS)
    kbit, fit = out["plan"]["finetune"]["kbit"], out["plan"]["fit"]
    assert (kbit["gpu"], kbit["gpus"], kbit["batch"]) == (fit["gpu"], fit["gpus"], fit["batch"])
    adapters = qlora_graph["measured"]["training"]["adapters"]
    # the same states but the 16-bit weights in float32, and the kbit step's bytes per sample
    quantized = out["plan"]["finetune"]["quantizedParams"]
    params = out["plan"]["model"]["params"]
    extra = (params - quantized) * 2 + fit["batch"] * (adapters["qloraKbit"]["perSampleBytes"]
                                                        - adapters["qlora"]["perSampleBytes"])
    assert kbit["peakGb"] == pytest.approx(fit["peakGb"] + extra / 1e9, rel=1e-9)
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert "prepare_model_for_kbit_training (PEFT) makes them float32:" in text
    assert f"at batch {kbit['batch']:,}, no checkpointing (rehearsed)" in text
    assert "the step rehearsed as PEFT runs it" in text
    # "over" by the fit's own rule, the peak times the headroom against the card's memory
    assert kbit["needGb"] == pytest.approx(kbit["peakGb"] * 1.15, rel=1e-12)
    assert ("with x1.15 headroom: over" in text) == (kbit["needGb"] > kbit["memoryGb"])
    assert math.isfinite(kbit["peakGb"])


def test_where_the_activations_come_from_is_said_for_each_setup(qlora_graph: dict) -> None:
    # a new-user pass: a checkpointed plan said "rehearsed", and a graph without a step "full training"
    plan = make_plan(qlora_graph, finetune="qlora", gpu="T4", seq_len=TOKENS)["plan"]
    assert plan["fit"]["checkpointing"] is False and plan["finetune"]["activations"] == "rehearsed"
    long = make_plan(qlora_graph, finetune="qlora", gpu="T4", seq_len=65536)
    if long["plan"]["fit"]["checkpointing"]:
        assert long["plan"]["finetune"]["activations"] == "rehearsed, checkpointing from full training"
        assert "its checkpointing sized from full training's step" in " ".join(
            line.strip("| ").strip() for line in long["text"].splitlines())
    bare = copy.deepcopy(qlora_graph)
    del bare["measured"]["training"]
    assert make_plan(bare, finetune="qlora")["plan"]["finetune"]["activations"] == "layer outputs"
    scaled = copy.deepcopy(qlora_graph)
    del scaled["measured"]["training"]["adapters"]
    assert make_plan(scaled, finetune="qlora")["plan"]["finetune"]["activations"] == "full training"


class _PeftLinear(nn.Module):
    """A linear layer as PEFT adapts it, by its names: ``base_layer`` frozen, ``lora_A``/``lora_B``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.base_layer = nn.Linear(n, n).requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(n, 4, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(4, n, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


def test_a_model_with_lora_adapters_already_is_planned_as_it_trains() -> None:
    # a new-user pass: a PEFT model planned with --finetune lora got adapters on its adapters
    model = nn.Sequential(_PeftLinear(16), nn.ReLU(), _PeftLinear(16), nn.Linear(16, 2).requires_grad_(False))
    graph = trace_model(model, torch.randn(2, 16))
    for mode in ("lora", "qlora"):
        out = make_plan(graph, finetune=mode)
        finetune = out["plan"]["finetune"]
        assert (finetune["mode"], finetune["asked"], finetune["applied"]) == ("full", mode, False)
        # the trainable parameters as they are: the adapters (2 x (16 x 4 + 4 x 16)) and nothing frozen
        assert finetune["trainableParams"] == 2 * (16 * 4 + 4 * 16)
        assert "the model already has LoRA adapters (lora_A, lora_B)" in " ".join(
            line.strip("| ").strip() for line in out["text"].splitlines())
