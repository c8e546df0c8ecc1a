"""Rehearse one mixed-precision AdamW training step and measure the memory it needs.

:func:`rehearse_training_step` runs a real training step of the model (forward in ``train()``
mode, a loss on its primary output, backward, ``AdamW.step()``) on the meta device: every tensor
has its true shape and dtype and no values, so nothing is computed and nothing is allocated. A
dispatch mode (:mod:`.storage`) follows every storage the step allocates and frees; a torch
function mode (:mod:`.policy`) makes the step behave as CUDA training does (autocast's CUDA op lists
and weight-cast cache, fused attention kernels, bool dropout masks).

Why this mechanism. ``saved_tensors_hooks`` alone see what autograd keeps, not the transients of
the loss, the backward and the optimizer step, where the peak often falls. PyTorch's ``MemTracker``
(``torch.distributed._tools.mem_tracker``) follows storages with the same weakref technique but
needs ``torch.distributed``, reports per-module peaks rather than the curve a per-batch fit needs,
and knows nothing of CUDA's autocast. Fake CUDA tensors (``FakeTensorMode`` with
``device="cuda"``) would get the real autocast kernels but abort a CPU-only build. So: meta tensors,
a storage-tracking dispatch mode of our own (weakref finalisers on untyped storages, which PyTorch
keeps alive exactly as long as the storage), and autocast's policy applied above autograd.

Everything is measured, nothing is assumed about the model: state bytes come from the storages of
the meta parameters, their gradients, AdamW's moments and its temporaries; per-sample bytes from
runs at two batch sizes (:mod:`.fit`). What a meta step cannot see: allocator rounding and
fragmentation, cuDNN/cuBLAS workspaces, NCCL buffers, the CUDA context, kernels' internal scratch
memory, and tensors whose size depends on values (none can be made on meta).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.lazy_dynamo import compiled_code_run_eagerly, dynamo_left_unimported
from neurarch_trace.lazy_sympy import sympy_left_unimported
from neurarch_trace.rehearsal.adapters import RANK, RECIPES, adapted_layers
from neurarch_trace.rehearsal.attention import eager_backward_bytes, eager_extra_bytes
from neurarch_trace.rehearsal.checkpointing import checkpointed_layers
from neurarch_trace.rehearsal.fit import combine
from neurarch_trace.rehearsal.step import InputPlan, Rehearsal, RehearsalError, Run
from neurarch_trace.rehearsal.storage import KINDS
from neurarch_trace.rehearsal.user_hooks import user_hooks_left_out
from neurarch_trace.text import error_line

__all__ = ["rehearse_training_step", "STEP"]

#: What the rehearsed step is, as the graph records it.
STEP = ("train() forward under bf16 autocast (CUDA op lists), float32 loss on the primary output, "
        "backward, AdamW(foreach) step")


def _attention(run: Run) -> dict[str, Any]:
    """``measured.training.attention``: the calls, and what eager attention would keep and allocate
    in their place (all calls' score matrices; the largest backward's allocations, which run one
    call at a time)."""
    known: dict[tuple, tuple[int, int]] = {}
    eager = fused = backward = 0
    for call in run.attention.calls:
        if call not in known:
            known[call] = eager_extra_bytes(call)
            backward = max(backward, eager_backward_bytes(call))
        eager += known[call][0]
        fused += known[call][1]
    return {"sdpaCalls": len(run.attention.calls), "kernels": run.attention.kernels(),
            "eagerScoreBytesPerSample": round(eager / run.batch, 3),
            "fusedKeptBytesPerSample": round(fused / run.batch, 3),
            "eagerExtraBytesPerSample": round((eager - fused) / run.batch, 3),
            "eagerBackwardBytesPerSample": round(backward / run.batch, 3)}


def _try(rehearsal: Rehearsal, batch: int, tokens: int | None, flops: bool) -> Run | None:
    try:
        return rehearsal.run(batch, tokens, count_flops=flops, layers=False)
    except Exception:  # noqa: BLE001 - a second run that cannot be made only loses precision
        return None


def _half_weights(model: nn.Module, plan: InputPlan, batch: int, tokens: int | None) -> float | None:
    """Activation bytes per sample of the same step with the weights in 16 bits and none upcast,
    at the traced length: those of a LoRA or QLoRA step, whose frozen base is loaded in 16 bits and
    keeps a 16-bit residual stream where float32 master weights keep a float32 one: the most the
    forward and the loss hold at once, in one run of them at ``batch`` (no backward or optimizer
    step, which free activations and keep none; the forward's batch-independent tensors, a causal
    mask or a rotary table, count in it divided by the batch). Rehearsed only for a model with two
    linear layers or more (one adapts besides the output layer); ``None`` when it has fewer or the
    step cannot run so."""
    if sum(isinstance(m, nn.Linear) for m in walk.modules(model)) < 2:
        return None
    try:
        run = Rehearsal(model, plan, half_weights=True).forward(batch, tokens)
    except Exception:  # noqa: BLE001 - the full-training measurement stands without it
        return None
    activations = KINDS.index("activations")
    return round(max(point[activations] for point in run.points) / batch, 3) if run.points else None


def _peak(run: Run) -> int:
    return max((sum(point) for point in run.points), default=0)


def _growth(rehearsal: Rehearsal, batch: int, tokens: int | None, checkpoint: bool) -> tuple[float, int]:
    """Bytes the step's peak grows by per sample, from runs at ``batch`` and ``2 x batch``, and
    the aten operations the step dispatches (:attr:`Run.operators`)."""
    one = rehearsal.run(batch, tokens, layers=False, checkpoint=checkpoint)
    two = rehearsal.run(2 * batch, tokens, layers=False, checkpoint=checkpoint)
    return round(max(0, _peak(two) - _peak(one)) / batch, 3), one.operators


def _checkpointed_step(rehearsal: Rehearsal, batch: int, tokens: int | None, traced: int) -> dict[str, Any] | None:
    """``measured.training.checkpointed``: the same step with activation checkpointing as
    transformers' ``gradient_checkpointing_enable()`` applies it (:mod:`.checkpointing`), rehearsed
    at ``batch`` and ``2 x batch`` samples at the traced length and fitted as the plain step is
    (:func:`.fit.combine`: its phase peaks, ``stateBytes`` and ``perSampleBytes`` by kind, at the
    ``traced`` batch); ``None`` when it cannot be rehearsed (the plan then sizes checkpointing from
    the plain step's layers)."""
    try:
        one = rehearsal.run(batch, tokens, layers=False, checkpoint=True)
        two = rehearsal.run(2 * batch, tokens, layers=False, checkpoint=True)
    except Exception:  # noqa: BLE001 - the plain step stands; the plan falls back to its formula
        return None
    fitted = combine(one, two, None, None, batch=traced)
    return {key: fitted[key] for key in ("batchSizes", "peakPhase", "stateBytes", "activationBytesPerSample", "peaks",
                                         "operators")}


def _adapter_steps(model: nn.Module, plan: InputPlan, batch: int, tokens: int | None,
                   finetune: str) -> dict[str, Any] | None:
    """``measured.training.adapters``: the recipes of :mod:`.adapters` that ``finetune`` plans
    (``lora``; ``qlora`` and ``qloraKbit``), each rehearsed at ``batch`` and ``2 x batch`` samples
    (at the traced length), and the bytes its peak grows by per sample (``perSampleBytes``); for a
    model transformers checkpoints (:mod:`.checkpointing`), the same with activation checkpointing
    (``checkpointedPerSampleBytes``). A recipe that cannot be rehearsed is left out. ``None`` for a
    model PEFT's ``all-linear`` does not adapt (not a transformers ``PreTrainedModel``, no linear
    layer)."""
    layers = adapted_layers(model)
    if not layers:
        return None
    checkpointed = bool(checkpointed_layers(model))
    steps: dict[str, Any] = {}
    for recipe in RECIPES:
        if (recipe.name == "lora") != (finetune == "lora"):
            continue
        try:
            rehearsal = Rehearsal(model, plan, recipe=recipe)
            grows, operators = _growth(rehearsal, batch, tokens, False)
            steps[recipe.name] = {"perSampleBytes": grows, "operators": operators}
            if checkpointed:
                grows, operators = _growth(rehearsal, batch, tokens, True)
                steps[recipe.name].update(checkpointedPerSampleBytes=grows, checkpointedOperators=operators)
        except Exception:  # noqa: BLE001 - the plan sizes what is missing from full training instead
            continue
    return {"rank": RANK, "layers": len(layers), **steps} if steps else None


def _rehearse(model: nn.Module, plan: InputPlan, finetune: str | None = None) -> dict[str, Any]:
    """Runs at two batch sizes (and, for a token model, at half the length too), fitted. The
    smaller batch is at least 2: PyTorch treats a dimension of size 1 as contiguous whatever its
    stride, so a batch of 1 can skip a copy that every larger batch makes."""
    tokens = plan.tokens
    fit_tokens = tokens // 2 if tokens is not None and tokens >= 4 else None
    rehearsal = Rehearsal(model, plan)
    small = max(plan.batch, 2)
    first = rehearsal.run(small, tokens, count_flops=fit_tokens is not None)
    second = _try(rehearsal, 2 * small, tokens, False)
    third = fourth = None
    if fit_tokens is not None:
        third = _try(rehearsal, small, fit_tokens, True)
        fourth = _try(rehearsal, 2 * small, fit_tokens, False) if third is not None else None
    measured = combine(first, second, third, fourth, batch=plan.batch)
    half = _half_weights(model, plan, 2 * small, tokens)
    if half is not None:
        measured["halfWeightsActivationBytesPerSample"] = half
    checkpointed = _checkpointed_step(rehearsal, small, tokens, plan.batch) if checkpointed_layers(model) else None
    if checkpointed is not None:
        measured["checkpointed"] = checkpointed
    adapters = _adapter_steps(model, plan, small, tokens, finetune) if finetune in ("lora", "qlora") else None
    if adapters is not None:
        measured["adapters"] = adapters
    if first.cache_bytes:
        measured["kvCacheBytesPerSample"] = round(first.cache_bytes / first.batch, 3)
        if first.cache_saved_bytes:
            measured["kvCacheSavedBytesPerSample"] = round(first.cache_saved_bytes / first.batch, 3)
    measured["attention"] = _attention(first)
    measured["loss"] = first.loss
    if rehearsal.upcast:
        measured["upcastParams"] = rehearsal.upcast
    scale = plan.batch / small  # per-layer bytes at the traced batch size
    saved = {qual: [int(round(b * scale)) for b in calls] for qual, calls in first.saved.items()}
    return {"measured": measured, "savedBytes": saved}


def _attempt(model: nn.Module, plan: InputPlan, finetune: str | None, user_hooks: bool) -> dict[str, Any]:
    """:func:`_rehearse` in the model's train mode, with the user's own module hooks
    (:mod:`.user_hooks`) running or left out; an exception raised with hooks left out carries
    their number as ``user_hooks_left_out``."""
    walk.set_training(model, True)
    # the user's random stream is left where it was; the trace already told the model's warnings;
    # a TorchScript part runs its graph as written: its executor optimises the graph after a few
    # calls, which would make the first trace's step differ from the next ones'; a training
    # step has autograd on, whatever grad mode the caller traces under (no_grad, inference_mode);
    # the user's own hooks saw the traced forward and do not see the rehearsal's meta calls
    hooks = contextlib.nullcontext(0) if user_hooks else user_hooks_left_out(model)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), dynamo_left_unimported(), \
            sympy_left_unimported(), compiled_code_run_eagerly(), torch.jit.optimized_execution(False), \
            torch.inference_mode(False), torch.enable_grad(), hooks as left_out:
        warnings.simplefilter("ignore")
        try:
            return _rehearse(model, plan, finetune)
        except Exception as exc:
            exc.user_hooks_left_out = left_out  # type: ignore[attr-defined]
            raise


def rehearse_training_step(model: nn.Module, args: tuple, kwargs: Mapping[str, Any] | None = None, *,
                           batch_size: int, scalars: list | None = None,
                           finetune: str | None = None) -> dict[str, Any]:
    """Rehearse one training step of ``model`` called as ``model(*args, **kwargs)`` (the traced
    inputs; ``batch_size`` is their batch size) and return plain dicts. ``scalars`` are the tensor
    values the traced forward read into Python, in order (``.item()``, ``if mask.all():``): meta
    tensors have none, so the rehearsed forward is given the same answers, provided it asks as many
    questions (transformers' check for packed sequences is one). ``finetune`` (``"lora"``,
    ``"qlora"``) also rehearses that step (``measured.training.adapters``, :mod:`.adapters`):

    * ``"measured"``: the ``measured.training`` object of ``docs/measured.md`` (bytes, at the traced
      batch size where a field is not per sample), or ``{"error": "<one line>"}`` when the step
      could not be rehearsed (an operation that needs values, which meta tensors do not have);
    * ``"savedBytes"``: bytes saved for backward inside each module call, at ``batch_size`` (from
      the run at ``max(batch_size, 2)``, scaled), by the module's qualified name as the tracer names
      it (``""`` is the root), one entry per call.

    The model is not modified (its parameters, buffers and training flags are as before) and
    nothing is printed. Hooks the user registered on its modules do not run in the rehearsal
    (:mod:`.user_hooks`), unless the step fails without them (a hook that reshapes an output).
    Never raises for a model that fails: the failure is the ``error``.
    """
    flags = {m: m.training for m in walk.modules(model)}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # frees in a fixed order, the same in every run
    plan = InputPlan(tuple(args), kwargs or {}, batch_size, scalars)
    try:
        try:
            return _attempt(model, plan, finetune, user_hooks=False)
        except Exception as exc:  # noqa: BLE001 - retried below, or reported as the error
            if not getattr(exc, "user_hooks_left_out", 0):
                raise
        # a hook of the user's is part of the model (it reshapes an output): it runs in the step
        return _attempt(model, plan, finetune, user_hooks=True)
    except RehearsalError as exc:
        return {"measured": {"error": str(exc)}, "savedBytes": {}}
    except Exception as exc:  # noqa: BLE001 - the trace stands; the plan falls back to its formula
        reason = f"the training step could not be rehearsed on the meta device ({error_line(exc)})"
        return {"measured": {"error": reason}, "savedBytes": {}}
    finally:
        for module, flag in flags.items():
            module.training = flag
        if gc_was_enabled:
            gc.enable()
