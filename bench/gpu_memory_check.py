"""Check the card's numbers on a real GPU: peak memory and step time of training (full, with
activation checkpointing, LoRA) and the decode step of serving, against the planner's predictions.

Three steps, so that the GPU machine runs only PyTorch (and transformers, PEFT) and the prediction
runs where the project is installed::

    python bench/gpu_memory_check.py predict --out bench/results/gpu_cases.json      # here, no GPU
    python bench/gpu_memory_check.py measure --cases bench/results/gpu_cases.json \\
        --out rows.jsonl                                                             # on the GPU
    python bench/gpu_memory_check.py report --cases bench/results/gpu_cases.json \\
        --rows rows.jsonl --out bench/results/gpu_check.json                         # README's table

(``all`` does the three in one process on a machine that has both.)

**Predicted** (``predict``): each model is traced at batch 1 (the large LLaMA configs on the meta
device, as the CLI builds them), and the planner's own functions give, for one GPU:

* training: ``footprint(tuning(...), "single", 1, checkpoint).peak_bytes(batch)`` (the per-GPU
  peak behind ``plan.fit`` and ``plan.cost.peakGb``, for ``full``, ``lora`` or ``qlora`` at LoRA
  rank ``DEFAULT_RANK``; a LoRA or QLoRA case is traced with ``finetune=`` its mode, as the command
  line's ``--finetune`` traces, so its step is rehearsed, with checkpointing too where the case
  checkpoints; a ``kbit`` case is the card's ``plan.finetune.kbit`` line), less the plan's 1 GB
  framework allowance;
* serving: weights + KV cache + one decode step at ``context`` x ``batch`` (``planner.serve``),
  less the allowance;
* step time: training FLOPs x batch / (the GPU's dense bf16 peak x the plan's MFU), the number
  behind ``plan.cost``; the report gives the MFU the GPU actually reached instead.

``max_memory_allocated`` does not see the CUDA context, which the allowance stands for: ``measure``
records it separately as the process's device memory outside PyTorch's pool (``mem_get_info``).

**Measured** (``measure``), nothing from this project imported: the model is built on the GPU, and

* full training: float32 parameters, ``torch.autocast("cuda", torch.bfloat16)``, the loss the
  rehearsal computes (cross-entropy in float32 on the primary output), backward,
  ``torch.optim.AdamW(foreach=True)``; checkpointing is transformers'
  ``gradient_checkpointing_enable(use_reentrant=False)`` (one checkpoint per decoder layer);
* LoRA: the base in bfloat16, PEFT's ``LoraConfig(r, target_modules="all-linear")`` (PEFT keeps
  the adapters in float32), the same step over the adapters;
* serving: the model in bfloat16, ``eval()``, a prefill of ``context - 1`` tokens into the KV cache
  (``use_cache=True``, logits of the last token only), then one decode step, whose peak is read.

* QLoRA (set ``quantized``): the model saved once as a bf16 checkpoint and loaded back with
  ``BitsAndBytesConfig(load_in_4bit=True, nf4, double quantisation, bf16 compute)``, then PEFT's
  LoRA over it, with or without ``prepare_model_for_kbit_training`` (``kbit``); decode over NF4
  (``int4``) or LLM.int8 (``int8``) weights loaded the same way (bitsandbytes travels as a wheel).

The peak is ``torch.cuda.max_memory_allocated()`` over the third step (the first two allocate
AdamW's moments and settle the allocator), in GB = 10^9 bytes; ``max_memory_reserved`` shows what
the caching allocator held around it (the plan's x1.15 headroom stands for that). Step time is the
median of three timed steps, ``torch.cuda.synchronize()`` around each. The measured step also gives
each phase's peak (``phasesGb``: forward, loss, backward, optimizer), beside the plan's
(``predictedPhasesGb``, full training without checkpointing), and with ``measure --snapshot`` what
was alive at the step's peak, by call site (:func:`alive_at_peak`).

The rehearsal runs the model's own code, so ``predict`` must run with the transformers the GPU
machine has: ``predict`` records its versions and ``report`` warns when they differ from the
measured ones (GPT-NeoX's KV cache changed dtype between transformers 5.17 and 5.25).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import re
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))

GB = 1e9
LORA_RANK = 16  # the planner's DEFAULT_RANK; `predict` checks that they agree


# --- models: built the same way on both sides -----------------------------------------------------


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int = 32000,
           positions: int = 4096) -> Callable[..., nn.Module]:
    def build(attention: str = "sdpa") -> nn.Module:
        import transformers as tf
        config = tf.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                max_position_embeddings=positions, attn_implementation=attention)
        # use_cache stays True (the config's default): a plain training loop then keeps the forward's
        # KV cache in its output, and the trace runs on meta (with use_cache=False, transformers
        # looks at the position ids' values for packed sequences, which the meta device lacks)
        return tf.LlamaForCausalLM(config)
    return build


def _bert(attention: str = "sdpa") -> nn.Module:
    import transformers as tf
    return tf.BertModel(tf.BertConfig(attn_implementation=attention))


def _gpt2(attention: str = "sdpa") -> nn.Module:
    import transformers as tf
    return tf.GPT2LMHeadModel(tf.GPT2Config(use_cache=False, attn_implementation=attention))


def _resnet50(attention: str = "sdpa") -> nn.Module:
    import resnet
    return resnet.ResNet50()


def _vit(attention: str = "sdpa") -> nn.Module:
    import vit
    return vit.ViT_B_16()


def _hf(config_class: str, model_class: str, **fields: object) -> Callable[..., nn.Module]:
    """A transformers model of ``model_class`` from ``config_class(**fields)``."""
    def build(attention: str = "sdpa") -> nn.Module:
        import transformers as tf
        config = getattr(tf, config_class)(attn_implementation=attention, **fields)
        return getattr(tf, model_class)(config)
    return build


#: key -> (label, factory, input kind ("image" or "tokens"), vocabulary or classes, on meta to trace)
MODELS: dict[str, tuple[str, Callable[..., nn.Module], str, int, bool]] = {
    "resnet50": ("ResNet-50 224px", _resnet50, "image", 1000, False),
    "vit": ("ViT-B/16 224px", _vit, "image", 1000, False),
    "bert": ("BERT-base", _bert, "tokens", 30522, False),
    "gpt2": ("GPT-2 LM", _gpt2, "tokens", 50257, False),
    # TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 query and 4 key/value heads)
    "llama1b": ("LLaMA 1.1B (TinyLlama)", _llama(2048, 5632, 22, 32, 4), "tokens", 32000, True),
    # OpenLLaMA-3B's shape (hidden 3200, 26 layers, 32 heads)
    "llama3b": ("LLaMA 3B (OpenLLaMA)", _llama(3200, 8640, 26, 32, 32), "tokens", 32000, True),
    # LLaMA-7B's shape (Touvron et al. 2023, table 2: hidden 4096, 32 layers, 32 heads)
    "llama7b": ("LLaMA-7B", _llama(4096, 11008, 32, 32, 32), "tokens", 32000, True),
    # shapes of published checkpoints, for the third set (architectures not measured before)
    "pythia1b": ("Pythia-1B (GPT-NeoX)", _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=2048,
                 num_hidden_layers=16, num_attention_heads=8, intermediate_size=8192, vocab_size=50304),
                 "tokens", 50304, True),
    "qwen05b": ("Qwen2-0.5B", _hf("Qwen2Config", "Qwen2ForCausalLM", hidden_size=896, intermediate_size=4864,
                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                tie_word_embeddings=True), "tokens", 151936, True),
    "opt13b": ("OPT-1.3B", _hf("OPTConfig", "OPTForCausalLM", hidden_size=2048, ffn_dim=8192, num_hidden_layers=24,
               num_attention_heads=32, vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048),
               "tokens", 50272, True),
    "bertlarge": ("BERT-large", _hf("BertConfig", "BertModel", hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096), "tokens", 30522, True),
    "mistral7b": ("Mistral-7B", _hf("MistralConfig", "MistralForCausalLM"), "tokens", 32000, True),
    "qwen15b": ("Qwen2-1.5B", _hf("Qwen2Config", "Qwen2ForCausalLM", hidden_size=1536, intermediate_size=8960,
                num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                tie_word_embeddings=True), "tokens", 151936, True),
    "llama3_8b": ("LLaMA-3-8B", _llama(4096, 14336, 32, 32, 8, vocab=128256, positions=8192), "tokens", 128256, True),
    "pythia410m": ("Pythia-410M (GPT-NeoX)", _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=1024,
                   num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, vocab_size=50304),
                   "tokens", 50304, True),
}

#: A small stand-in for each large config, for a dry run of the harness on a CPU (``--shrink``).
SHRUNK = {"llama1b": _llama(256, 688, 2, 8, 2), "llama3b": _llama(320, 864, 2, 8, 8),
          "llama7b": _llama(256, 688, 2, 8, 8)}


def case(model: str, mode: str, batch: int, tokens: int | None = None, checkpoint: bool = False,
         traced: int | None = None, attention: str = "sdpa", precision: str = "bf16", kbit: bool = False) -> dict:
    """One measurement: ``traced`` tokens to trace at (default ``tokens``; else the plan rescales
    to ``tokens`` as ``--seq-len`` does), ``attention`` as the plan's option and the model's
    ``attn_implementation`` (``sdpa`` or ``eager``); ``precision`` the served weights' (``bf16``,
    ``int8``, ``int4``, the card's ``--quantize``); ``kbit``: a QLoRA base prepared with PEFT's
    ``prepare_model_for_kbit_training`` (which upcasts the parameters it leaves unquantised to
    float32), as transformers' and PEFT's QLoRA guides do."""
    tag = (f"{model}-{mode}{'-ckpt' if checkpoint else ''}{'-eager' if attention == 'eager' else ''}"
           + (f"-{precision}" if precision != "bf16" else "") + ("-kbit" if kbit else "") + f"-b{batch}"
           + (f"-t{tokens}" if tokens else "") + (f"-from{traced}" if traced and traced != tokens else ""))
    return {"id": tag, "model": model, "mode": mode, "batch": batch, "tokens": tokens, "checkpoint": checkpoint,
            "traced": traced or tokens, "attention": attention, "precision": precision, "kbit": kbit}


#: The cases, most telling first (a run cut short by its time limit keeps the ones done).
CASES = [
    case("llama7b", "lora", 1, 1024), case("llama7b", "lora", 4, 1024),
    case("llama7b", "lora", 8, 1024, checkpoint=True),
    case("llama7b", "serve", 4, 2048), case("llama7b", "serve", 16, 2048), case("llama7b", "serve", 8, 4096),
    case("llama3b", "full", 1, 2048), case("llama3b", "full", 2, 2048),
    case("llama3b", "full", 4, 2048, checkpoint=True),
    case("llama1b", "full", 2, 1024), case("llama1b", "full", 8, 1024),
    case("llama1b", "full", 32, 1024, checkpoint=True),
    case("gpt2", "full", 8, 512), case("gpt2", "full", 32, 512), case("gpt2", "full", 32, 512, checkpoint=True),
    case("bert", "full", 32, 128), case("bert", "full", 128, 128),
    case("vit", "full", 32), case("vit", "full", 128),
    case("resnet50", "full", 32), case("resnet50", "full", 128),
    # the plan needs two H100s for this; one H200 holds it or runs out of memory, either tells
    case("llama7b", "full", 1, 512, checkpoint=True),
]

#: A second set, predicted before it was measured: other batches and lengths, checkpointing on
#: BERT and GPT-2 at new sizes, plans rescaled from a short trace (``--seq-len``), and eager attention.
HELD_OUT = [
    case("llama1b", "full", 4, 2048, traced=256), case("llama1b", "full", 16, 2048, checkpoint=True, traced=256),
    case("llama1b", "full", 4, 1024, attention="eager"),
    case("llama1b", "full", 16, 1024, checkpoint=True, attention="eager"),
    case("gpt2", "full", 16, 1024, traced=128), case("gpt2", "full", 64, 1024, checkpoint=True),
    case("bert", "full", 32, 512), case("bert", "full", 128, 512, checkpoint=True),
    case("bert", "full", 64, 128, attention="eager"),
    case("llama3b", "full", 16, 2048, checkpoint=True), case("llama3b", "full", 4, 1024),
    case("llama7b", "lora", 2, 2048), case("llama7b", "lora", 16, 2048, checkpoint=True),
    case("llama7b", "serve", 32, 4096),
    case("vit", "full", 256), case("resnet50", "full", 256),
    case("llama7b", "full", 2, 1024, checkpoint=True),
]

#: A third set, predicted with the planner as it stands after the first two: architectures and
#: shapes no earlier run measured.
FRESH = [
    case("mistral7b", "lora", 4, 1024), case("mistral7b", "lora", 16, 1024, checkpoint=True),
    case("mistral7b", "serve", 16, 8192),
    case("pythia1b", "full", 8, 1024), case("pythia1b", "full", 32, 1024, checkpoint=True),
    case("qwen05b", "full", 4, 1024), case("qwen05b", "full", 16, 1024, checkpoint=True),
    case("opt13b", "full", 8, 1024), case("opt13b", "full", 32, 1024, checkpoint=True),
    case("bertlarge", "full", 32, 512), case("bertlarge", "full", 128, 512, checkpoint=True),
]
#: A fourth set, predicted after LoRA's 16-bit activations and the KV cache under checkpointing
#: were modelled from the first three: models and shapes none of them measured.
CONFIRM = [
    case("llama3_8b", "lora", 4, 2048), case("llama3_8b", "lora", 16, 2048, checkpoint=True),
    case("qwen15b", "lora", 8, 1024), case("qwen15b", "lora", 32, 1024, checkpoint=True),
    case("qwen15b", "full", 16, 2048, checkpoint=True),
    case("pythia410m", "full", 64, 2048, checkpoint=True), case("pythia410m", "full", 16, 2048),
    case("mistral7b", "lora", 4, 4096, checkpoint=True),
]
#: The rows the plan under-predicts (0.928 to 0.963), and two that it predicts within 1%, measured
#: phase by phase with what is alive at the step's peak (``measure --snapshot``), to find what the
#: rehearsal misses.
DIAGNOSE = [
    case("pythia410m", "full", 16, 2048), case("pythia410m", "full", 4, 2048),
    case("llama1b", "full", 4, 1024), case("llama1b", "full", 16, 1024, checkpoint=True, attention="eager"),
    case("llama1b", "full", 16, 1024, checkpoint=True),
    case("bert", "full", 32, 128), case("bert", "full", 64, 128, attention="eager"), case("gpt2", "full", 8, 512),
]
#: A fifth set: the card's 4-bit and 8-bit numbers, none measured before: QLoRA (NF4 base with
#: double quantisation, bf16 compute, through transformers' ``BitsAndBytesConfig`` from a saved
#: checkpoint, as a user loads one), and decode over int8 (LLM.int8) and NF4 weights.
QUANTIZED = [
    case("llama7b", "qlora", 4, 1024), case("llama7b", "qlora", 4, 1024, kbit=True),
    case("llama7b", "qlora", 16, 1024, checkpoint=True, kbit=True),
    case("llama7b", "serve", 16, 2048, precision="int4"), case("llama7b", "serve", 16, 2048, precision="int8"),
    # added after the first five were measured, predicted before they were: other models, both recipes
    case("mistral7b", "qlora", 4, 1024), case("mistral7b", "qlora", 4, 1024, kbit=True),
    case("qwen15b", "qlora", 8, 1024), case("qwen15b", "qlora", 8, 1024, kbit=True),
    case("llama7b", "qlora", 16, 1024, checkpoint=True),
]
#: A sixth set, predicted after eager attention's backward (its score matrices' gradients) was
#: measured into the plan from the 0.928 row: eager attention on models and shapes no set measured
#: with it, with and without checkpointing, LoRA and grouped-query attention among them.
EAGER = [
    case("qwen05b", "full", 16, 1024, checkpoint=True, attention="eager"),
    case("qwen05b", "full", 4, 1024, attention="eager"),
    case("pythia1b", "full", 8, 1024, attention="eager"),
    case("bertlarge", "full", 64, 512, checkpoint=True, attention="eager"),
    case("gpt2", "full", 32, 1024, checkpoint=True, attention="eager"),
    case("mistral7b", "lora", 8, 2048, checkpoint=True, attention="eager"),
]
#: A seventh set: every LoRA and QLoRA case measured above, predicted again once the plan sized
#: them from the fine-tuning step itself, rehearsed as PEFT and bitsandbytes run it
#: (``measured.training.adapters``, ``neurarch_trace/rehearsal/adapters.py``), against the rows
#: already measured (no new measurement: ``report`` over their rows).
ADAPTERS = [c for cases in (CASES, HELD_OUT, FRESH, CONFIRM, QUANTIZED, EAGER) for c in cases
            if c["mode"] in ("lora", "qlora")]
#: An eighth set, predicted with the rehearsed fine-tuning step and committed before it is measured:
#: models and layer kinds no LoRA or QLoRA row has measured (GPT-NeoX's fused query-key-value,
#: GPT-2's Conv1D, an encoder, TinyLlama's four key/value heads, LLaMA-3-8B's 128k vocabulary).
ADAPTERS_HELD_OUT = [
    case("qwen05b", "lora", 16, 1024), case("pythia1b", "lora", 8, 1024), case("gpt2", "lora", 16, 1024),
    case("bertlarge", "lora", 32, 512), case("llama1b", "qlora", 8, 2048), case("llama1b", "qlora", 8, 2048, kbit=True),
    case("llama3_8b", "qlora", 2, 2048, kbit=True), case("mistral7b", "qlora", 4, 2048, kbit=True),
]
#: A ninth set, predicted and committed before it was measured, after the LoRA and QLoRA steps were
#: rehearsed with activation checkpointing too (transformers' own, on meta): both QLoRA recipes, LoRA
#: over GPT-2's Conv1D, BERT-large, GPT-NeoX and Qwen2, each checkpointed.
ADAPTERS_CKPT_HELD_OUT = [
    case("llama3_8b", "qlora", 16, 2048, checkpoint=True, kbit=True),
    case("mistral7b", "qlora", 16, 2048, checkpoint=True, kbit=True),
    case("qwen15b", "qlora", 32, 1024, checkpoint=True, kbit=True),
    case("llama1b", "qlora", 32, 2048, checkpoint=True), case("llama1b", "qlora", 32, 2048, checkpoint=True, kbit=True),
    case("gpt2", "lora", 64, 1024, checkpoint=True), case("bertlarge", "lora", 128, 512, checkpoint=True),
    case("pythia1b", "lora", 32, 1024, checkpoint=True), case("qwen05b", "lora", 32, 1024, checkpoint=True),
]
#: A tenth set, predicted and committed before it was measured, after full training's checkpointed
#: step was rehearsed too: models, batches and lengths no set measured with checkpointing.
FULL_CKPT_HELD_OUT = [
    case("llama1b", "full", 64, 2048, checkpoint=True), case("qwen15b", "full", 24, 1024, checkpoint=True),
    case("pythia1b", "full", 24, 2048, checkpoint=True), case("gpt2", "full", 128, 1024, checkpoint=True),
    case("bertlarge", "full", 256, 512, checkpoint=True), case("qwen05b", "full", 16, 2048, checkpoint=True),
    case("llama3b", "full", 12, 4096, checkpoint=True),
]
SETS = {"first": CASES, "held-out": HELD_OUT, "fresh": FRESH, "confirm": CONFIRM, "diagnose": DIAGNOSE,
        "quantized": QUANTIZED, "eager": EAGER, "adapters": ADAPTERS, "adapters-held-out": ADAPTERS_HELD_OUT,
        "adapters-ckpt-held-out": ADAPTERS_CKPT_HELD_OUT, "full-ckpt-held-out": FULL_CKPT_HELD_OUT}


def make_batch(model: str, batch: int, tokens: int | None, device: str | torch.device) -> tuple[tuple, torch.Tensor]:
    """``(inputs, target)``: float32 images ``(batch, 3, 224, 224)`` and class ids, or token ids
    ``(batch, tokens)`` (the target is the ids themselves)."""
    _, _, kind, classes, _ = MODELS[model]
    if kind == "image":
        return (torch.randn(batch, 3, 224, 224, device=device),), torch.randint(0, classes, (batch,), device=device)
    ids = torch.randint(0, classes, (batch, tokens), device=device)
    return (ids,), ids


def loss_fn(out: Any, target: torch.Tensor) -> torch.Tensor:
    """The rehearsal's loss: cross-entropy in float32 on the primary output (over the last axis of a
    3-D output, the target taken modulo its width, as ``bench/training_memory.py`` does)."""
    x = out.logits if hasattr(out, "logits") else getattr(out, "last_hidden_state", out)
    if x.dim() == 2:
        return nn.functional.cross_entropy(x.float(), target)
    return nn.functional.cross_entropy(x.float().flatten(0, 1), (target % x.shape[-1]).flatten())


# --- predict (needs this project; no GPU) ---------------------------------------------------------


def predict(cases: list[dict], gpu_id: str, shrink: bool = False) -> dict:
    """The planner's numbers for each case (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    from neurarch_trace import trace_model
    from neurarch_trace.errors import NeedsValuesError
    from neurarch_trace.planner.analysis import analyse
    from neurarch_trace.planner.blocks import find_blocks
    from neurarch_trace.planner.finetune import DEFAULT_RANK, tuning
    from neurarch_trace.planner.gpus import gpu_table
    from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES
    from neurarch_trace.planner.serve import kv_layout, step_bytes, weight_bytes
    from neurarch_trace.planner.steptime import step_operators, step_time
    from neurarch_trace.planner.strategy import footprint

    if DEFAULT_RANK != LORA_RANK:
        raise SystemExit(f"LORA_RANK ({LORA_RANK}) differs from the planner's DEFAULT_RANK ({DEFAULT_RANK})")
    gpu = gpu_table().by_id(gpu_id)
    traced: dict[tuple, Any] = {}
    out = []
    for c in cases:
        finetune = c["mode"] if c["mode"] in ("lora", "qlora") else None  # the step itself rehearsed too
        key = (c["model"], c["traced"] if c["mode"] != "serve" else None, finetune)
        if key not in traced:
            label, factory, kind, _, on_meta = MODELS[c["model"]]
            factory = SHRUNK.get(c["model"], factory) if shrink else factory
            tokens = c["traced"] if c["mode"] != "serve" else 16
            torch.manual_seed(0)
            start = time.perf_counter()
            with torch.device("meta") if on_meta else contextlib.nullcontext():
                model = factory()
            inputs, _ = make_batch(c["model"], 1, tokens, "meta" if on_meta else "cpu")
            try:
                graph = trace_model(model, inputs, finetune=finetune)
            except NeedsValuesError:  # as the command line's --device auto: on the CPU instead
                torch.manual_seed(0)
                model = factory()
                graph = trace_model(model, make_batch(c["model"], 1, tokens, "cpu")[0], finetune=finetune)
            traced[key] = graph
            print(f"traced {label} at {tokens or '224px'} in {time.perf_counter() - start:.1f} s", flush=True)
            del model
        resized = c["mode"] != "serve" and c["tokens"] and c["tokens"] != c["traced"]
        a = analyse(traced[key], seq_len=c["tokens"] if resized else None, attention=c["attention"])
        blocks = find_blocks(a.structure, a.structure_counts)
        row = {**c, "label": MODELS[c["model"]][0], "gpu": gpu.id, "params": a.counts.params,
               "memorySource": a.memory.source}
        if c["mode"] == "serve":
            layout = kv_layout(a.structure)
            kv = layout.bytes_per_token() * c["tokens"] * c["batch"]
            weights = weight_bytes(a, c.get("precision", "bf16"))
            step = step_bytes(a, True, c["tokens"]) * c["batch"]
            row.update(predictedGb=(weights + kv + step) / GB, weightsGb=weights / GB, kvGb=kv / GB,
                       decodeStepGb=step / GB)
        else:
            step = tuning(a, blocks, c["mode"], DEFAULT_RANK)
            setup = footprint(step.states, step.acts, "single", 1, c["checkpoint"], step.others)
            row["activations"] = step.activations_source
            if c.get("kbit") and step.kbit is not None and (not c["checkpoint"] or step.kbit[1].checkpointed):
                # the card's line on prepare_model_for_kbit_training (plan.finetune.kbit)
                setup = footprint(step.kbit[0], step.kbit[1], "single", 1, c["checkpoint"])
                row["activations"] = "rehearsed (kbit)"
            phase = setup.at(c["batch"])
            if c["mode"] == "full" and not c["checkpoint"]:  # the phases of one GPU's full step
                phases: dict[str, float] = {}
                for line in a.memory.phases:
                    phases[line.phase] = max(phases.get(line.phase, 0.0), line.bytes(c["batch"]))
                row["predictedPhasesGb"] = {k: (v - FRAMEWORK_ALLOWANCE_BYTES) / GB for k, v in phases.items()}
            recipe = "qloraKbit" if c.get("kbit") else step.mode
            operators = step_operators(traced[key].get("measured", {}).get("training")).count(recipe, c["checkpoint"])
            timed = step_time(step.train_flops(c["checkpoint"]), c["batch"], gpu, a.mfu, operators)
            row.update(predictedGb=(setup.peak_bytes(c["batch"]) - FRAMEWORK_ALLOWANCE_BYTES) / GB,
                       predictedStateGb=(phase.static_bytes - FRAMEWORK_ALLOWANCE_BYTES) / GB,
                       predictedPerSampleGb=phase.per_sample_bytes / GB,
                       trainFlops=step.train_flops(c["checkpoint"]) * c["batch"], mfu=a.mfu,
                       predictedStepS=timed.seconds, predictedComputeS=timed.compute,
                       predictedDispatchS=timed.dispatch, operators=operators, trainable=step.trainable)
        out.append(row)
    import transformers
    return {"gpu": gpu.id, "peakTflops": gpu.peak_tflops, "frameworkAllowanceGb": FRAMEWORK_ALLOWANCE_BYTES / GB,
            "torch": torch.__version__, "transformers": transformers.__version__, "cases": out}


# --- measure (torch, transformers and PEFT only) --------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _outside_pool_gb(device: torch.device) -> float | None:
    """Device memory this process holds outside PyTorch's pool (CUDA context, kernels, library
    handles), in GB: used device memory less what the caching allocator has reserved. Assumes
    nothing else runs on the GPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GB


def _start_peak(device: torch.device) -> dict[str, Any]:
    """Empty the allocator's cache and start a new peak; the bytes allocated now (``stateGb``)."""
    if device.type != "cuda":
        return {}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {"stateGb": torch.cuda.memory_allocated() / GB}


def _peak(device: torch.device) -> dict[str, Any]:
    """The peak since :func:`_start_peak`: allocated, reserved and outside PyTorch's pool (GB)."""
    if device.type != "cuda":
        return {}
    return {"measuredGb": torch.cuda.max_memory_allocated() / GB,
            "reservedGb": torch.cuda.max_memory_reserved() / GB, "outsidePoolGb": _outside_pool_gb(device)}


#: Where :func:`_quantized` saves each model's random bf16 checkpoint (one per model, kept for the run).
CHECKPOINTS = Path("/tmp/neurarch-gpu-check")


def _in_bf16(factory: Callable[..., nn.Module], device: torch.device) -> nn.Module:
    """``factory()`` built on ``device`` with bfloat16 as the default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device:
            return factory()
    finally:
        torch.set_default_dtype(default)


def _quantized(c: dict, factory: Callable[..., nn.Module], device: torch.device, shrink: bool) -> nn.Module:
    """The model loaded as a user loads a 4-bit (``qlora``, ``int4``) or 8-bit (``int8``) one:
    ``from_pretrained(checkpoint, quantization_config=BitsAndBytesConfig(...), dtype=bfloat16)``
    over a bf16 checkpoint of the random model, saved once per model. NF4 with double
    quantisation and bf16 compute, the QLoRA paper's setting (Dettmers et al. 2023, section 3)."""
    import transformers as tf
    folder = CHECKPOINTS / (c["model"] + ("-shrunk" if shrink else ""))
    if not (folder / "config.json").exists():
        model = _in_bf16(factory, device)
        model.save_pretrained(folder)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if c["mode"] == "qlora" or c.get("precision") == "int4":
        config = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                       bnb_4bit_compute_dtype=torch.bfloat16)
    else:
        config = tf.BitsAndBytesConfig(load_in_8bit=True)
    where = {"": device.index or 0} if device.type == "cuda" else "cpu"
    return tf.AutoModelForCausalLM.from_pretrained(folder, quantization_config=config, dtype=torch.bfloat16,
                                                   device_map=where)


def _build(c: dict, device: torch.device, shrink: bool) -> nn.Module:
    factory = MODELS[c["model"]][1]
    factory = SHRUNK.get(c["model"], factory) if shrink else factory
    factory = functools.partial(factory, attention=c.get("attention", "sdpa"))
    torch.manual_seed(0)
    if c["mode"] == "full":
        with device:
            return factory()
    if c["mode"] == "qlora" or c.get("precision", "bf16") != "bf16":
        model = _quantized(c, factory, device, shrink)
    else:  # LoRA and serving: a 16-bit base, built in bfloat16 on the device
        model = _in_bf16(factory, device)
    if c["mode"] in ("lora", "qlora"):
        import peft
        if c.get("kbit"):
            model = peft.prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=c["checkpoint"],
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_RANK, target_modules="all-linear"))
    return model


#: The frames :func:`alive_at_peak` names: the model's, PEFT's, bitsandbytes' and this file's code
#: (not PyTorch's, whose path may be anywhere: the GPU machine's Python lives under /opt/torch/).
_OWN_CODE = re.compile(r"/(transformers|peft|bitsandbytes)/|gpu_memory_check\.py$|/examples/models/")


def _frame(frame: dict) -> str:
    return f"{Path(frame['filename']).name}:{frame['line']}:{frame['name']}"


def alive_at_peak(trace: list[dict], top: int = 30) -> dict[str, Any]:
    """What was allocated at the highest point of an allocator trace (``torch.cuda.memory._snapshot()
    ["device_traces"][0]``, recorded with Python stacks): the bytes by call site, the three
    innermost Python frames of the model's, PEFT's, bitsandbytes' or this file's code, largest first,
    and the peak in GB counted from the trace (allocations made before the recording, the
    parameters and AdamW's moments, are not in it)."""
    def replay(events: list[dict]) -> tuple[dict[int, dict], int, int]:
        live: dict[int, dict] = {}
        total = peak = peak_at = 0
        for i, event in enumerate(events):
            if event.get("action") == "alloc":
                live[event["addr"]] = event
                total += event["size"]
                if total > peak:
                    peak, peak_at = total, i
            elif event.get("action") == "free_requested" and event.get("addr") in live:
                total -= live.pop(event["addr"])["size"]
        return live, peak, peak_at

    _, peak, peak_at = replay(trace)
    at_peak, _, _ = replay(trace[:peak_at + 1])
    sites: dict[str, list[int]] = {}
    for event in at_peak.values():
        frames = [f for f in event.get("frames", []) if _OWN_CODE.search(f.get("filename", ""))]
        where = " < ".join(_frame(f) for f in frames[:4]) or "(no Python frame: the backward)"
        entry = sites.setdefault(where, [0, 0])
        entry[0] += event["size"]
        entry[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {"tracedPeakGb": peak / GB,
            "sites": [{"gb": round(b / GB, 4), "tensors": n, "where": where} for where, (b, n) in ranked]}


def _train(model: nn.Module, c: dict, device: torch.device, steps: int, snapshot: bool = False) -> dict:
    model.train()
    if c["checkpoint"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    inputs, target = make_batch(c["model"], c["batch"], c["tokens"], device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            out = model(*inputs)
            loss = loss_fn(out, target)
        loss.backward()
        optimizer.step()
        del out, loss

    def phased_step() -> dict[str, float]:
        """The same step, with the allocated peak of each phase (GB; ``torch.cuda`` only): the
        peak statistics are reset at each boundary, so the largest phase peak is the step's peak."""
        phases: dict[str, float] = {}

        def mark(phase: str) -> None:
            _sync(device)
            if device.type == "cuda":
                phases[phase] = torch.cuda.max_memory_allocated() / GB
                reserved.append(torch.cuda.max_memory_reserved() / GB)
                torch.cuda.reset_peak_memory_stats()

        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            out = model(*inputs)
            mark("forward")
            loss = loss_fn(out, target)
            mark("loss")
        loss.backward()
        mark("backward")
        optimizer.step()
        mark("optimizer")
        del out, loss
        return phases

    step()
    step()
    _sync(device)
    row = _start_peak(device)
    reserved: list[float] = []
    if snapshot and device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    phases = phased_step()
    _sync(device)
    if snapshot and device.type == "cuda":
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        row["alive"] = alive_at_peak(trace)
    if phases:
        row["phasesGb"] = phases
        row.update(measuredGb=max(phases.values()), outsidePoolGb=_outside_pool_gb(device),
                   reservedGb=max(reserved))
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    row["stepS"] = statistics.median(times)
    row["trainableMeasured"] = sum(p.numel() for p in params)
    return row


@torch.no_grad()
def _serve(model: nn.Module, c: dict, device: torch.device) -> dict:
    model.eval()
    vocab = MODELS[c["model"]][3]
    prompt = torch.randint(0, vocab, (c["batch"], c["tokens"] - 1), device=device)
    out = model(prompt, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    del out
    _sync(device)
    row = _start_peak(device)
    start = time.perf_counter()
    step = model(token, past_key_values=cache, use_cache=True)
    logits = step.logits[:, -1].float()
    _sync(device)
    row["stepS"] = time.perf_counter() - start
    row.update(_peak(device))
    del step, logits, cache
    return row


def measure(cases: list[dict], out: Path, device: torch.device, steps: int = 3, shrink: bool = False,
            snapshot: bool = False) -> None:
    """Measure every case, one JSON line each appended to ``out`` as it finishes; a case that runs
    out of memory or fails is recorded as such and the next one runs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as sink:
        info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "torch": torch.__version__}
        with contextlib.suppress(ImportError):
            import transformers
            info["transformers"] = transformers.__version__
        with contextlib.suppress(ImportError):
            import peft
            info["peft"] = peft.__version__
        with contextlib.suppress(ImportError):
            import bitsandbytes
            info["bitsandbytes"] = bitsandbytes.__version__
        sink.write(json.dumps({"info": info}) + "\n")
        model, built = None, None
        for c in cases:
            start = time.perf_counter()
            row: dict[str, Any] = {"id": c["id"]}
            try:
                key = (c["model"], c["mode"], c.get("attention"), c.get("precision"), c.get("kbit"))
                if built != key or c["mode"] == "full":
                    model = built = None
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    model, built = _build(c, device, shrink), key
                elif c["mode"] in ("lora", "qlora") and hasattr(model, "gradient_checkpointing_disable"):
                    model.gradient_checkpointing_disable()
                row.update(_serve(model, c, device) if c["mode"] == "serve"
                           else _train(model, c, device, steps, snapshot))
            except torch.OutOfMemoryError:
                row["oom"] = True
                model = built = None
            except Exception as exc:  # noqa: BLE001 - one case's failure is recorded, the rest run
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                row["traceback"] = traceback.format_exc()[-2000:]
                model = built = None
            row["wallS"] = round(time.perf_counter() - start, 2)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()


# --- report ---------------------------------------------------------------------------------------


def report(predicted: dict, rows_path: Path) -> dict:
    """Predictions and measurements side by side, with the ratios (predicted / measured)."""
    lines = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    info = next((line["info"] for line in lines if "info" in line), {})
    measured = {line["id"]: line for line in lines if "id" in line}
    # the rehearsal runs the model's own code: a prediction made with another transformers than the
    # one measured compares two different programs (GPT-NeoX's key/value cache is float32 in 5.17
    # and half that in 5.25, 0.2 GB per sample of Pythia-410M at 2,048 tokens)
    skew = predicted.get("transformers") != info.get("transformers")
    if skew:
        print(f"warning: predicted with transformers {predicted.get('transformers', '(not recorded)')}, measured "
              f"with {info.get('transformers')}: predict again with the measured version", file=sys.stderr)
    rows = []
    for c in predicted["cases"]:
        got = measured.get(c["id"])
        if got is None:
            continue
        row = {**c, **{k: v for k, v in got.items() if k != "traceback"}}
        if got.get("measuredGb"):
            row["peakRatio"] = c["predictedGb"] / got["measuredGb"]
            if got.get("outsidePoolGb") is not None:
                # what the card prints (the peak with its framework allowance) against the device
                # memory the process used (the allocated peak and what lies outside PyTorch's pool)
                row["cardRatio"] = ((c["predictedGb"] + predicted["frameworkAllowanceGb"])
                                    / (got["measuredGb"] + got["outsidePoolGb"]))
        if got.get("stepS") and c.get("trainFlops"):
            row["measuredMfu"] = c["trainFlops"] / (got["stepS"] * predicted["peakTflops"] * 1e12)
            row["timeRatio"] = c["predictedStepS"] / got["stepS"]
        rows.append(row)
    return {"gpu": predicted["gpu"], **info, "predictedWith": {k: predicted.get(k) for k in ("torch", "transformers")},
            "rows": rows}


def table(result: dict) -> str:
    """README's table (markdown)."""
    head = ("| model | step | batch x tokens | predicted peak | measured peak | ratio | card / device | reserved | "
            "step time | predicted step | time ratio | MFU (plan assumes) |")
    lines = [head, "|" + "---|" * 12]
    for r in result["rows"]:
        shape = f"{r['batch']} x {r['tokens']}" if r.get("tokens") else f"{r['batch']}"
        if r.get("traced") and r["traced"] != r.get("tokens") and r["mode"] != "serve":
            shape += f" (traced at {r['traced']})"
        mode = ({"full": "full", "lora": "LoRA r16", "qlora": "QLoRA r16", "serve": "decode"}[r["mode"]]
                + (f" {r['precision']}" if r.get("precision", "bf16") != "bf16" else "")
                + (" (kbit)" if r.get("kbit") else "")
                + (" + ckpt" if r["checkpoint"] else "") + (", eager" if r.get("attention") == "eager" else ""))
        if r.get("oom"):
            got = "out of memory"
            lines.append(f"| {r['label']} | {mode} | {shape} | {r['predictedGb']:.2f} GB | {got} | | | | | | | |")
            continue
        if r.get("error"):
            lines.append(f"| {r['label']} | {mode} | {shape} | {r['predictedGb']:.2f} GB | error | | | | | | | |")
            continue
        mfu = f"{r['measuredMfu']:.0%} ({r['mfu']:.0%})" if r.get("measuredMfu") is not None else ""
        card = f"{r['cardRatio']:.3f}x" if r.get("cardRatio") else ""
        got = (f"{r['measuredGb']:.2f} GB | {r['peakRatio']:.3f}x | {card} | {r['reservedGb']:.2f} GB"
               if r.get("measuredGb") else "| | |")  # a CPU dry run measures no memory
        step = ""
        if r.get("predictedStepS"):
            bound = "dispatch" if r.get("predictedDispatchS", 0) > r.get("predictedComputeS", 0) else "compute"
            step = f"{r['predictedStepS'] * 1e3:.0f} ms ({bound}) | {r['timeRatio']:.2f}x"
        else:
            step = "|"
        lines.append(f"| {r['label']} | {mode} | {shape} | {r['predictedGb']:.2f} GB | {got} | "
                     f"{r['stepS'] * 1e3:.0f} ms | {step} | {mfu} |")
    return "\n".join(lines)


def time_summary(results: list[dict]) -> str:
    """The step-time model over every training row of ``results`` (``report`` outputs): the range
    and median of predicted / measured, before (compute alone, at the plan's MFU) and now (the
    longer of compute and eager dispatch, ``planner/steptime.py``), and how many rows' measured
    step was shorter than their predicted dispatch alone (the floor undercut)."""
    rows = {r["id"]: r for result in results for r in result["rows"] if r.get("timeRatio") and r.get("stepS")}
    if not rows:
        return "no timed training rows"
    now = sorted(r["timeRatio"] for r in rows.values())
    before = sorted(r["predictedComputeS"] / r["stepS"] for r in rows.values() if r.get("predictedComputeS"))
    undercut = [i for i, r in rows.items() if r.get("predictedDispatchS", 0) > r["stepS"]]
    return (f"{len(rows)} training steps: predicted / measured {now[0]:.2f} to {now[-1]:.2f}, median "
            f"{statistics.median(now):.2f} (compute alone: {before[0]:.2f} to {before[-1]:.2f}, median "
            f"{statistics.median(before):.2f}); dispatch floor above the measured step on {len(undercut)} "
            f"row(s){': ' + ', '.join(undercut) if undercut else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="trace the models and write the planner's predictions (no GPU)")
    p.add_argument("--gpu", default="H200", help="the GPU's id in neurarch_trace/data/gpus.json (for its peak)")
    p.add_argument("--only", default=None, help="comma-separated case ids or model keys")
    p.add_argument("--set", default="first", choices=sorted(SETS), help="which cases (CASES, HELD_OUT, FRESH, CONFIRM)")
    p.add_argument("--shrink", action="store_true", help="small stand-ins for the large configs (a dry run)")
    p.add_argument("--out", required=True)
    m = sub.add_parser("measure", help="run the cases on the GPU (imports torch, transformers, peft only)")
    m.add_argument("--cases", required=True)
    m.add_argument("--out", required=True, help="JSON lines, appended as each case finishes")
    m.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    m.add_argument("--steps", type=int, default=3, help="timed steps per training case")
    m.add_argument("--shrink", action="store_true")
    m.add_argument("--snapshot", action="store_true",
                   help="record the measured step's allocations and report what is alive at its peak, by call site")
    t = sub.add_parser("times", help="the step-time model over several reports (gpu_check*.json)")
    t.add_argument("reports", nargs="+")
    r = sub.add_parser("report", help="predictions and measurements side by side")
    r.add_argument("--cases", required=True)
    r.add_argument("--rows", required=True)
    r.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.command == "predict":
        cases = SETS[args.set]
        if args.only:
            wanted = set(args.only.split(","))
            cases = [c for c in cases if c["id"] in wanted or c["model"] in wanted]
        result = predict(cases, args.gpu, args.shrink)
        result["shrunk"] = args.shrink
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        for row in result["cases"]:
            print(f"{row['id']}: {row['predictedGb']:.3f} GB")
    elif args.command == "measure":
        predicted = json.loads(Path(args.cases).read_text())
        measure(predicted["cases"], Path(args.out), torch.device(args.device), args.steps,
                args.shrink or predicted.get("shrunk", False), args.snapshot)
    elif args.command == "times":
        print(time_summary([json.loads(Path(p).read_text()) for p in args.reports]))
    else:
        result = report(json.loads(Path(args.cases).read_text()), Path(args.rows))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(table(result))


if __name__ == "__main__":
    main()
