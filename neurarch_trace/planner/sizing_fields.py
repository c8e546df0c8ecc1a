"""The plan's ``fit``, ``cost``, ``finetune`` and ``serve`` objects, from a :class:`~.sizing.Sizing`.

``fit`` and ``cost`` describe the requested mode's training setup. Their fields keep the meanings
of ``plan-api.md`` (``cost.peakGb`` at ``cost.batch``, the part ``activationGb`` that scales with
it, ``cost.assumptions`` containing ``at batch N``), now per GPU: ``fit.gpus`` GPUs of
``fit.gpu`` under ``fit.strategy``, each at batch ``fit.batch``. GB are 10^9 bytes.
"""

from __future__ import annotations

from typing import Any

from neurarch_trace.planner.analysis import Analysis
from neurarch_trace.planner.cost import BACKWARD_FACTOR
from neurarch_trace.planner.finetune import FROZEN_BACKWARD_FACTOR, NF4_BITS, activations_label
from neurarch_trace.planner.fit import MAX_BATCH
from neurarch_trace.planner.gpus import gpu_table
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES
from neurarch_trace.planner.serve import Serve
from neurarch_trace.planner.sizing import Sizing
from neurarch_trace.planner.steptime import EAGER_OPERATOR_SECONDS, StepTime
from neurarch_trace.planner.strategy import Setup, footprint, strategy_text
from neurarch_trace.text import plural

__all__ = ["cost_fields", "finetune_fields", "fit_fields", "serve_fields"]

_STATE_KEYS = {"weights": "weightsGb", "masterWeights": "masterWeightsGb", "gradients": "gradientsGb",
               "optimizer": "optimizerGb", "buffers": "buffersGb", "framework": "frameworkGb",
               "ddpBuckets": "ddpBucketsGb", "gathered": "gatheredLayerGb", "dequantBuffer": "dequantBufferGb"}


def _at(s: Sizing) -> tuple[Setup, int]:
    """The setup and per-GPU batch the peak is quoted at (batch 1 when nothing holds)."""
    return (s.choice.setup, s.choice.batch) if s.choice is not None else (s.singles[0][1], 1)


def fit_fields(s: Sizing) -> dict[str, Any]:
    """``plan.fit``."""
    table = gpu_table()
    setup, batch = _at(s)
    peak = setup.peak_bytes(batch)
    c = s.choice
    largest = table.largest
    fields: dict[str, Any] = {
        "fits": c is not None,
        "gpu": c.gpu.id if c else None,
        "memoryGb": c.gpu.memory_gb if c else None,
        "precision": c.gpu.precision if c else None,
        "batch": batch,
        "peakGb": peak / 1e9,
        "needGb": peak * table.headroom / 1e9,
        "headroom": table.headroom,
        "borderline": c.borderline if c else False,
        "maxBatch": MAX_BATCH,
        "largestGpu": {"gpu": largest.id, "memoryGb": largest.memory_gb},
        "cards": [
            {"gpu": gpu.id, "memoryGb": gpu.memory_gb, "usdPerHour": gpu.usd_per_hour, "batch": b,
             "peakGb": single.peak_bytes(b or 1) / 1e9, "needGb": single.peak_bytes(b or 1) * table.headroom / 1e9}
            for gpu, single, b in s.singles
        ],
        "gpus": setup.gpus,
        "strategy": setup.label,
        "checkpointing": setup.checkpoint,
        "totalMemoryGb": c.gpu.memory_gb * c.gpus if c else None,
        "modelStatesGb": s.tuning.states.zero_states / 1e9,
        "mode": s.tuning.mode,
        "requestedGpu": s.options.gpu.gpu.id if s.options.gpu else None,
        "requestedGpus": s.options.gpu.gpus if s.options.gpu else None,
        "needs": None,
    }
    if s.needs is not None:
        n, need_setup, card = s.needs
        fields["needs"] = {"gpu": card.id, "memoryGb": card.memory_gb, "gpus": n, "strategy": need_setup.label,
                           "peakGb": need_setup.peak_bytes(1) / 1e9}
    return fields


def _breakdown(a: Analysis, s: Sizing, setup: Setup, batch: int) -> dict[str, float]:
    parts = {_STATE_KEYS[k]: v / 1e9 for k, v in setup.at(batch).parts.items()}
    base = a.memory.breakdown(batch)
    for key in ("weightsGb", "masterWeightsGb", "gradientsGb", "optimizerGb"):
        parts.setdefault(key, 0.0)
    per_sample_keys = ("inputsGb", "layerActivationsGb", "attentionScoresGb", "lossGb", "backwardGb")
    activations = {k: base.get(k, 0.0) for k in per_sample_keys}
    _, per_sample = setup.line(batch)
    model_per_sample = a.memory.per_sample_bytes(batch)
    if per_sample != model_per_sample:  # checkpointing or adapters: the layers' share changes
        others = sum(v for k, v in activations.items() if k != "layerActivationsGb") * 1e9 / max(batch, 1)
        activations["layerActivationsGb"] = batch * (per_sample - others) / 1e9
    return {**{k: parts[k] for k in _STATE_KEYS.values() if k in parts}, **activations}


def _assumptions(a: Analysis, s: Sizing, setup: Setup, batch: int, attention: str | None) -> str:
    t = s.tuning
    where = f" on {setup.gpus} GPUs" if setup.gpus > 1 else ""
    tokens = f", {plural(a.work.seq_len, 'token')} per sample" if a.work.kind == "tokens" and a.work.seq_len else ""
    what = {"full": "mixed-precision AdamW step", "lora": "LoRA step", "qlora": "QLoRA step"}[t.mode]
    head = f"Training peak per GPU of one {what} at batch {batch} per GPU{where}{tokens}"
    if t.mode == "full" and setup.strategy in ("single", "ddp"):
        states = ("18 bytes per trainable parameter (16-bit weights 2, fp32 master weights 4, fp32 gradients 4, "
                  "AdamW moments 8)" + (" plus DDP's gradient buckets 4" if setup.strategy == "ddp" else ""))
    elif t.mode == "full":
        states = (f"{strategy_text(setup.strategy, False)} as ZeRO counts model states (Rajbhandari et al. 2020): "
                  "16-bit weights 2, 16-bit gradients 2, fp32 master weights and AdamW moments 12 bytes per "
                  "parameter, the stage's share divided over the GPUs"
                  + (", plus the largest layer gathered (4 bytes per parameter)" if setup.strategy == "zero3" else ""))
    else:
        base = f"NF4 base at {NF4_BITS:.3f} bits per weight (double quantisation)" if t.mode == "qlora" \
            else "16-bit frozen base"
        states = (f"{base}, rank-{t.rank} adapters at 18 bytes per parameter"
                  + (f", {strategy_text(setup.strategy, False)}" if setup.gpus > 1 else ""))
    if a.memory.source == "measured":
        acts = "the activations the rehearsed step measured" + (
            " with the base in 16 bits" if t.mode != "full" and a.memory.half_weights_ratio is not None else "")
        acts += ", of which only each block's input kept (activation checkpointing)" if setup.checkpoint else ""
    else:
        acts = "only each block's input kept (activation checkpointing)" if setup.checkpoint else \
            "every layer's output kept for backward at 2 bytes per element"
    return (f"{head}: {states}; {acts}" + (", eager attention scores" if attention == "eager" else "")
            + f"; a {FRAMEWORK_ALLOWANCE_BYTES / 1e9:g} GB framework allowance per GPU; a setup fits when the "
              f"per-GPU peak x {gpu_table().headroom:g} is within the card's memory.")


def _training(a: Analysis, s: Sizing) -> dict[str, Any] | None:
    cost, c = s.cost, s.choice
    if cost is None or c is None:
        return None
    backward = BACKWARD_FACTOR if s.tuning.mode == "full" else FROZEN_BACKWARD_FACTOR
    return {
        "unit": cost.unit.key, "per": cost.unit.phrase, "samples": cost.unit.samples, "flops": cost.flops,
        "seconds": cost.seconds, "hours": cost.seconds / 3600, "usd": cost.usd, "gpu": cost.gpu.id,
        "usdPerHour": cost.gpu.usd_per_hour, "peakTflops": cost.gpu.peak_tflops, "precision": cost.gpu.precision,
        "mfu": cost.mfu, "backwardFactor": backward, "gpus": cost.gpus, "gpuHours": cost.gpu_seconds / 3600,
        "clusterUsdPerHour": c.hourly, "flopsFactor": cost.flops_factor, "recompute": c.setup.checkpoint,
        "strategy": c.setup.label, "mode": s.tuning.mode, **_step_fields(cost.step),
    }


def _step_fields(step: StepTime | None) -> dict[str, Any]:
    """``plan.cost.training``'s step: its batch per GPU, seconds, the compute and the eager
    dispatch behind them, the operators counted and which bound it (:mod:`.steptime`)."""
    if step is None:
        return {}
    return {"stepBatch": step.batch, "stepSeconds": step.seconds, "computeSeconds": step.compute,
            "dispatchSeconds": step.dispatch if step.operators else None, "operators": step.operators,
            "bound": step.bound,
            "operatorSeconds": EAGER_OPERATOR_SECONDS}


def cost_fields(a: Analysis, s: Sizing, attention: str | None, legacy_assumptions: str | None) -> dict[str, Any]:
    """``plan.cost``; ``legacy_assumptions`` is the one-GPU full-training sentence, used as is
    when that is the plan."""
    setup, batch = _at(s)
    plain = s.tuning.mode == "full" and setup.strategy == "single" and not setup.checkpoint
    return {
        "batch": batch,
        "peakGb": setup.peak_bytes(batch) / 1e9,
        "activationGb": batch * setup.line(batch)[1] / 1e9,
        "staticGb": setup.line(batch)[0] / 1e9,
        "perSampleGb": setup.line(batch)[1] / 1e9,
        "breakdown": _breakdown(a, s, setup, batch),
        "seqLen": a.work.seq_len if a.work.kind == "tokens" else None,
        "attention": attention,
        "assumptions": legacy_assumptions if plain and legacy_assumptions else
        _assumptions(a, s, setup, batch, attention),
        "training": _training(a, s),
        "gpus": setup.gpus,
        "strategy": setup.label,
    }


def _kbit(s: Sizing) -> dict[str, Any] | None:
    """``plan.finetune.kbit``: the peak of the card's QLoRA setup after PEFT's
    ``prepare_model_for_kbit_training``, at the card's batch per GPU, where that step was rehearsed
    (with checkpointing too, when the setup checkpoints); else ``None``. Where the setup does not
    checkpoint and the step was rehearsed with checkpointing too, ``checkpointedPeakGb`` and
    ``checkpointedNeedGb`` give the same setup with checkpointing (else ``None``)."""
    kbit, choice = s.tuning.kbit, s.choice
    if kbit is None or choice is None or (choice.setup.checkpoint and kbit[1].checkpointed is None):
        return None
    setup = footprint(*kbit, choice.setup.strategy, choice.setup.gpus, choice.setup.checkpoint)
    peak = setup.peak_bytes(choice.batch)
    headroom = gpu_table().headroom
    checkpointed = None
    if not choice.setup.checkpoint and kbit[1].checkpointed is not None:
        checkpointed = footprint(*kbit, choice.setup.strategy, choice.setup.gpus, True).peak_bytes(choice.batch)
    return {"peakGb": peak / 1e9, "needGb": peak * headroom / 1e9, "batch": choice.batch,
            "gpus": choice.setup.gpus, "gpu": choice.gpu.id, "memoryGb": choice.gpu.memory_gb,
            "checkpointing": choice.setup.checkpoint, "headroom": headroom,
            "checkpointedPeakGb": None if checkpointed is None else checkpointed / 1e9,
            "checkpointedNeedGb": None if checkpointed is None else checkpointed * headroom / 1e9}


def _activations_source(a: Analysis, s: Sizing) -> str | None:
    """``plan.finetune.activations`` on the card's setup (:func:`.finetune.activations_label`)."""
    setup = s.choice.setup if s.choice is not None else (s.needs[1] if s.needs is not None else None)
    return activations_label(a.memory.source, s.tuning, setup is not None and setup.checkpoint)


def finetune_fields(a: Analysis, s: Sizing) -> dict[str, Any]:
    """``plan.finetune``: ``{mode, rank, trainableParams}`` and how they were found."""
    t = s.tuning
    total = a.counts.params + (t.trainable if t.mode != "full" else 0)
    return {
        "mode": t.mode,
        "asked": t.asked,
        "applied": t.applied,
        "rank": t.rank,
        "trainableParams": t.trainable,
        "trainablePercent": 100.0 * t.trainable / total if total else 0.0,
        "adaptedLayers": len(t.adapted),
        "quantizedParams": t.quantized_params,
        "baseGb": t.base_bytes / 1e9 if t.mode != "full" else None,
        "flopsPerSample": t.flops,
        "activations": _activations_source(a, s),
        "kbit": _kbit(s) if t.mode == "qlora" else None,
        "note": t.note,
    }


def _serve(v: Serve) -> dict[str, Any]:
    # 16-bit weights are named as the card runs them: fp16 on a card without bf16 (the T4, Turing),
    # the same 2 bytes per parameter
    precision = "fp16" if v.precision == "bf16" and v.gpu is not None and v.gpu.precision == "fp16" else v.precision
    return {
        "gpu": v.gpu.id if v.gpu else None, "memoryGb": v.gpu.memory_gb if v.gpu else None, "gpus": v.gpus,
        "precision": precision, "fits": v.fits, "batch": v.batch, "context": v.context,
        "tensorParallel": v.parallel[0] if v.parallel else None,
        "pipelineStages": v.parallel[1] if v.parallel else None, "gpusAsked": v.asked,
        "gpuShare": v.part,
        "peakGb": v.peak_bytes / 1e9, "needGb": v.need_bytes / 1e9, "weightsGb": v.weights_bytes / 1e9,
        "kvCacheGb": v.kv_bytes / 1e9, "stepGb": v.step_bytes / 1e9,
        "usdPerHour": v.gpu.usd_per_hour * v.gpus if v.gpu and v.gpu.usd_per_hour is not None else None,
    }


def serve_fields(s: Sizing) -> dict[str, Any]:
    """``plan.serve``: the shown setup, the KV layout read from the graph, and every precision."""
    v = s.serve
    layout = v.layout
    return {
        **_serve(v),
        "layers": layout.layers, "heads": layout.heads, "kvHeads": layout.kv_heads, "headDim": layout.head_dim,
        "kvWidth": layout.kv_width, "kvBytesPerToken": layout.bytes_per_token(),
        "options": [_serve(x) for x in s.serves],
    }
