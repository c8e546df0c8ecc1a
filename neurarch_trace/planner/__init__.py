"""The planner: a graph in, the card and its machine-readable plan out. Pure Python, no torch.

    >>> from neurarch_trace.planner import make_plan
    >>> answer = make_plan(graph, source={"target": "models/resnet.py:ResNet18"})
    >>> print(answer["text"])                 # the card, at most 68 columns
    >>> answer["plan"]["run"]["legal"], answer["plan"]["cost"]["peakGb"]

One concept per module: :mod:`neurarch_trace.contract` indexes and validates the document,
:mod:`.verify` finds blockers, :mod:`.estimate` and :mod:`.counts` count parameters and FLOPs
(measured first), :mod:`.workload` says what a sample is, :mod:`.memory` sizes a training step,
:mod:`.blocks` finds the repeated blocks, :mod:`.finetune` sizes LoRA and QLoRA, :mod:`.strategy`
divides the step over GPUs (DDP, ZeRO, FSDP), :mod:`.fit` picks the card or cluster, :mod:`.cost`
prices training, :mod:`.serve` sizes serving, :mod:`.sizing` ties the request's options to them,
:mod:`.lint` finds warnings, :mod:`.diff` compares with a base, :mod:`.card` renders. The plan
service (:mod:`neurarch_trace.server`) is one caller of :func:`make_plan`; anything else may call it
directly.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from neurarch_trace.errors import GraphError
from neurarch_trace.planner.analysis import Analysis, analyse
from neurarch_trace.planner.card import render
from neurarch_trace.planner.cost import training_unit
from neurarch_trace.planner.diff import diff as diff_against
from neurarch_trace.planner.fit import Fit
from neurarch_trace.planner.fit import fit as fit_gpu
from neurarch_trace.planner.gpus import gpu_table
from neurarch_trace.planner.memory import (
    ACTIVATION_BYTES,
    ADAMW_BYTES,
    FRAMEWORK_ALLOWANCE_BYTES,
    GRADIENT_BYTES,
    MASTER_WEIGHT_BYTES,
    WEIGHT16_BYTES,
)
from neurarch_trace.planner.sizing import OptionError, Sizing, check_options, sizing
from neurarch_trace.planner.sizing_fields import cost_fields, finetune_fields, fit_fields, serve_fields
from neurarch_trace.text import plural

__all__ = ["ATTENTION_MODES", "GraphError", "OptionError", "PLAN_SCHEMA", "make_plan", "target_label"]

#: Identifies the layout of the ``plan`` object (bumped on an incompatible change).
PLAN_SCHEMA = "neurarch-plan/1"
#: The request's ``attention`` values (``plan-api.md``).
ATTENTION_MODES = ("sdpa", "flash", "eager")
_BYTES_PER_TRAINABLE = WEIGHT16_BYTES + MASTER_WEIGHT_BYTES + GRADIENT_BYTES + ADAMW_BYTES


def target_label(target: Optional[str]) -> Optional[str]:
    """The file or module part of a target as typed: ``models/resnet.py:ResNet18`` gives
    ``models/resnet.py``; a target without a ``:Attr`` suffix and every ``hf:`` target
    (``hf:bert-base-uncased``, ``hf:tiny_model``) is kept."""
    if not target:
        return None
    if target.startswith("hf:"):
        return target
    head, sep, tail = target.rpartition(":")
    if sep and head and tail and all(part.isidentifier() for part in tail.split(".")):
        return head
    return target


def _assumptions(a: Analysis, fit: Fit, attention: Optional[str]) -> str:
    parts = [
        f"Training peak of one mixed-precision AdamW step at batch {fit.batch}",
        f"{plural(a.work.seq_len, 'token')} per sample" if a.work.kind == "tokens" and a.work.seq_len else None,
    ]
    head = ", ".join(p for p in parts if p)
    tail = (f"and a {FRAMEWORK_ALLOWANCE_BYTES / 1e9:g} GB framework allowance; a card fits when the "
            f"peak x {fit.headroom:g} is within its memory.")
    if a.memory.source == "measured":
        peak = a.memory.peak(fit.batch)
        state_gb = (peak.state_bytes - FRAMEWORK_ALLOWANCE_BYTES) / 1e9
        return (
            f"{head}: measured by rehearsing the step (bf16 autocast with CUDA's op lists, fused "
            f"attention{' replaced by eager score matrices' if attention == 'eager' else ''}, AdamW "
            f"foreach), peak in the {peak.phase} phase: {state_gb:.3g} GB of state and "
            f"{peak.per_sample_bytes / 1e6:.4g} MB per sample, " + tail
        )
    return (
        f"{head}: estimated, {_BYTES_PER_TRAINABLE} bytes per trainable parameter (16-bit weights "
        f"{WEIGHT16_BYTES}, fp32 master weights {MASTER_WEIGHT_BYTES}, fp32 gradients {GRADIENT_BYTES}, "
        f"AdamW moments {ADAMW_BYTES}), every layer's output kept for backward at {ACTIVATION_BYTES} bytes "
        f"per element" + (", eager attention scores" if attention == "eager" else "") + ", " + tail
    )


def _layers(a: Analysis) -> List[Dict[str, Any]]:
    return [
        {
            "id": lc.node.id,
            "name": lc.node.name,
            "type": lc.node.type,
            "scope": lc.node.scope,
            "inputShape": list(lc.node.input_shape) if lc.node.input_shape else None,
            "outputShape": list(lc.node.output_shape) if lc.node.output_shape else None,
            "params": lc.params,
            "paramsSource": lc.params_source,
            "flops": lc.flops,
            "flopsSource": lc.flops_source,
        }
        for lc in a.counts.layers
    ]


def _check_options(seq_len: Optional[int], attention: Optional[str]) -> None:
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= 2**31):
        raise ValueError("seq_len must be a positive integer of at most 2^31")
    if attention is not None and attention not in ATTENTION_MODES:
        raise ValueError("attention must be one of sdpa, flash or eager")


def _memory(a: Analysis, sized: Sizing, batch: int) -> Dict[str, Any]:
    """The plan's ``memory`` (:meth:`MemoryModel.as_plan` at ``batch``), its ``peakPhase`` the
    phase that peaks per GPU in the chosen setup at its batch per GPU (or in the cluster the card
    says it needs, at one sample), where the setup divides the memory model's phases (full
    training): on several GPUs the states are divided and the phase that peaks can be another than
    on one. Where that setup checkpoints, ``checkpointed`` is true when the checkpointed step was
    rehearsed (the phase is then one of that step's), false when checkpointing is sized from the
    plain step's layers."""
    memory = a.memory.as_plan(batch)
    phases = a.memory.phases
    if sized.tuning.mode != "full" and phases:
        # a LoRA or QLoRA step is one line: its states and the activations of the phase with the
        # most bytes per sample (finetune.tuning); the full-training phases are kept for reference
        memory["peakPhase"] = max(phases, key=lambda p: p.per_sample_bytes).phase
        return memory
    if sized.choice is not None:
        setup, at = sized.choice.setup, sized.choice.batch
    elif sized.needs is not None and sized.needs[0] is not None:
        setup, at = sized.needs[1], 1
    else:
        return memory
    if setup.checkpoint and a.memory.source == "measured":
        memory["checkpointed"] = bool(a.memory.checkpointed_phases)
    if setup.checkpoint and a.memory.checkpointed_phases:
        names = [p.phase for p in a.memory.checkpointed_phases]  # the checkpointed step as rehearsed
    else:
        main = a.memory.peak(1)  # the setup's own line; its others in the memory model's order
        names = [main.phase] + [p.phase for p in phases if p is not main]
    if len(names) < 2 or len(names) != len(setup.lines):
        return memory
    peak = setup.at(at)
    memory["peakPhase"] = next(name for name, s in zip(names, (setup, *setup.others)) if s is peak)
    return memory


def make_plan(
    graph: Any,
    *,
    source: Optional[Mapping[str, Any]] = None,
    base: Any = None,
    seq_len: Optional[int] = None,
    attention: Optional[str] = None,
    finetune: Optional[str] = None,
    context: Optional[int] = None,
    gpu: Optional[str] = None,
    usd_per_hour: Optional[float] = None,
) -> Dict[str, Any]:
    """The card and plan for ``graph`` (a loaded ``.neurarch.json`` dict).

    ``source`` is the request's ``source`` object (its ``target`` heads the card); ``base`` a
    second graph to diff against; ``seq_len`` tokens per sample for a token model; ``attention``
    ``sdpa``, ``flash`` or ``eager``; ``finetune`` ``full`` (default), ``lora`` or ``qlora``: what
    ``plan.fit`` and ``plan.cost`` size; ``context`` tokens of context for serving (default: the
    length of a learned position table, else ``seq_len``, else the traced length); ``gpu`` ``NAME``
    or ``NAMExN``: plan for that card
    or cluster only; ``usd_per_hour`` its price per GPU-hour (needed for a card without a list
    price). Returns ``{"text": card, "plan": {...}}``. Raises :class:`GraphError` when ``graph`` or
    ``base`` is not a graph, ``ValueError`` (one sentence) for a bad option: :class:`OptionError`
    for ``finetune``, ``context``, ``gpu`` and ``usd_per_hour`` (an unknown ``gpu`` names the
    known cards).
    """
    _check_options(seq_len, attention)
    options = check_options(finetune, context, gpu, usd_per_hour)
    a = analyse(graph, what="model", seq_len=seq_len, attention=attention, context=options.context)
    # a token base is read at the card's tokens per sample (per-token costs compare at one length);
    # a base of another kind ignores it
    base_len = a.work.seq_len if a.work.kind == "tokens" else seq_len
    b = analyse(base, what="base", seq_len=base_len, attention=attention) if base is not None else None
    fit = fit_gpu(a.memory)
    unit = training_unit(a.work)
    sized = sizing(a, options)
    cost = cost_fields(a, sized, attention, _assumptions(a, fit, attention))
    target = source.get("target") if isinstance(source, Mapping) else None
    table = gpu_table()
    plan: Dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "model": {
            "name": a.graph.name,
            "target": target_label(target if isinstance(target, str) else None),
            "layers": a.layer_count,
            "params": a.counts.params,
            "trainableParams": a.counts.trainable,
            "frozenParams": a.counts.frozen,
            "paramsSource": "measured" if a.counts.exact_params else "estimated",
            "flops": a.flops_per_sample,
            "flopsSource": "measured" if a.counts.exact_flops else "estimated",
            "flopsComplete": a.counts.flops_complete,
            "input": {
                "kind": a.work.kind,
                "shape": list(a.work.input_shape) if a.work.input_shape else None,
                "describe": a.work.describe(),
                "tracedTokens": a.work.traced_tokens,
            },
        },
        "run": {
            "legal": not a.blockers,
            "blockers": [issue.message for issue in a.blockers],
            "details": [issue.as_dict() for issue in a.blockers],
        },
        "fit": fit_fields(sized),
        "memory": _memory(a, sized, cost["batch"]),
        "cost": cost,
        "finetune": finetune_fields(a, sized),
        "serve": serve_fields(sized),
        "warnings": [issue.message for issue in a.warnings],
        "warningDetails": [issue.as_dict() for issue in a.warnings],
        "layers": _layers(a),
        "diff": diff_against(a, b, sized, unit) if b is not None else None,
        "notes": list(a.work.notes) + list(a.memory.notes) + (
            [f"{len(a.memory.layers_without_shape)} layers without an outputShape add no activation memory"]
            if a.memory.layers_without_shape else []
        ) + sized.notes,
        "prices": {"date": table.price_date, "source": table.price_source},
    }
    return {"text": render(plan), "plan": plan}
