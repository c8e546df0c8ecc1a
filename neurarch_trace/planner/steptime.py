"""Step time: how long one training step takes on a card, and what bounds it.

A step is bound by one of two things, whichever takes longer::

    compute  = training FLOPs of the batch / (peak dense 16-bit TFLOPS x 10^12 x MFU)
    dispatch = aten operators the step dispatches x EAGER_OPERATOR_SECONDS
    step     = max(compute, dispatch)

``compute`` is what the GPU must do (:mod:`neurarch_trace.planner.cost` gives the MFU). ``dispatch``
is what the host's CPU must do first: eager PyTorch runs each operator of the forward, the
backward and the optimizer step through Python and its dispatcher before the GPU can run its
kernel, one at a time, whatever the batch. The GPU runs ahead of the CPU only while its kernels
take longer than their dispatch; a small model at a small batch waits on the CPU instead, which is
why its measured utilisation is a fraction of a large model's (``bench/gpu_memory_check.py``).

The operators are counted in the rehearsed step itself (``measured.training.operators``, and for
the checkpointed and the LoRA/QLoRA steps their own counts; :mod:`neurarch_trace.rehearsal`): every
aten operation the step dispatches after its inputs exist, views and autocast's casts included,
batch-independent. A graph without them (traced by an older tool, or without the rehearsed step)
is sized by compute alone, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neurarch_trace.planner.counts import measured_int
from neurarch_trace.planner.gpus import Gpu

__all__ = ["EAGER_OPERATOR_SECONDS", "StepOperators", "StepTime", "shared_counts", "step_operators", "step_time"]

#: Host CPU time per aten operator of an eager PyTorch training step, in seconds: 12.9 us (Python,
#: the dispatcher, autograd's bookkeeping and the kernel launch; published breakdowns of that path
#: put it at 5 to 25 us an operator). It is a floor: the largest per-operator time that no step of
#: ``bench/gpu_memory_check.py``'s first set of rows undercuts (19 training steps on an H200 with
#: torch 2.11 and CUDA 13.0, ``bench/results/gpu_rows.jsonl``; the least, LLaMA-7B LoRA at
#: 1 x 1,024 tokens, 200.2 ms for 15,517 operators), checked on the 51 steps of the later sets,
#: none of which undercuts it either (README, "Memory"). The steps this floor binds took 12.9 to
#: 29.6 us an operator; a slower host, or a step with Python hooks of its own, takes longer.
EAGER_OPERATOR_SECONDS = 12.9e-6


@dataclass(frozen=True)
class StepOperators:
    """The aten operators one rehearsed step dispatches: ``full`` training's, ``checkpointed``
    (full training with activation checkpointing), and each LoRA/QLoRA recipe's ``(plain,
    checkpointed)`` by name (``lora``, ``qlora``, ``qloraKbit``); ``None`` where not rehearsed."""

    full: int | None = None
    checkpointed: int | None = None
    adapters: Mapping[str, tuple[int | None, int | None]] = None  # type: ignore[assignment]

    def chain(self, recipe: str, checkpoint: bool) -> list[tuple[str, int | None]]:
        """The counts :meth:`count` reads, in its order, each named by the step rehearsed
        (``lora+ckpt``, ``lora``, ``full+ckpt``, ``full``): the recipe's own step first, then the
        steps it adds operators to (checkpointing recomputes; LoRA/QLoRA add adapters)."""
        full = [("full+ckpt", self.checkpointed), ("full", self.full)] if checkpoint else [("full", self.full)]
        if recipe == "full":
            return full
        plain, checkpointed = (self.adapters or {}).get(recipe, (None, None))
        own = [(f"{recipe}+ckpt", checkpointed), (recipe, plain)] if checkpoint else [(recipe, plain)]
        return own + full

    def count(self, recipe: str, checkpoint: bool) -> int | None:
        """The count for ``recipe`` (``full``, ``lora``, ``qlora``, ``qloraKbit``) with or without
        checkpointing; ``None`` when no step was rehearsed. Where that step was not rehearsed but a
        step it adds operators to was (the recipe's plain step under checkpointing, which recomputes;
        full training under LoRA or QLoRA, which add adapters), that step's count, a lower bound."""
        return next((count for _, count in self.chain(recipe, checkpoint) if count), None)


def shared_counts(new: list[tuple[str, int | None]], base: list[tuple[str, int | None]]
                  ) -> tuple[int | None, int | None, str | None]:
    """Two steps' operators counted alike, for a diff: from their :meth:`StepOperators.chain`, the
    counts of the first step both graphs rehearsed, and its name; ``(None, None, None)`` when they
    share none (one graph has no counts: both are then timed by compute alone). Where one graph
    rehearsed its own step (a LoRA step, 4,202 operators for BERT-base) and the other only the step
    it adds to (full training, 2,373), both take the latter, a floor, rather than compare a count
    with a floor."""
    theirs = {key: count for key, count in base if count}
    for key, count in new:
        if count and key in theirs:
            return count, theirs[key], key
    return None, None, None


def step_operators(training: Any) -> StepOperators:
    """The counts in ``measured.training`` (a graph's); malformed or missing ones are ``None``."""
    if not isinstance(training, Mapping) or "error" in training:
        return StepOperators(adapters={})
    checkpointed = training.get("checkpointed")
    adapters = training.get("adapters")
    found: dict[str, tuple[int | None, int | None]] = {}
    if isinstance(adapters, Mapping):
        for name in ("lora", "qlora", "qloraKbit"):
            entry = adapters.get(name)
            if isinstance(entry, Mapping):
                found[name] = (_count(entry, "operators"), _count(entry, "checkpointedOperators"))
    return StepOperators(full=_count(training, "operators"),
                         checkpointed=_count(checkpointed, "operators") if isinstance(checkpointed, Mapping) else None,
                         adapters=found)


def _count(entry: Mapping[str, Any], key: str) -> int | None:
    value = measured_int(entry, key)
    return value if value else None


@dataclass(frozen=True)
class StepTime:
    """One step of ``batch`` samples per GPU: ``compute`` and ``dispatch`` seconds (above),
    ``seconds`` the larger, ``operators`` the count behind ``dispatch`` (``None``: not measured, and
    ``dispatch`` is 0)."""

    batch: int
    compute: float
    dispatch: float
    operators: int | None

    @property
    def seconds(self) -> float:
        return max(self.compute, self.dispatch)

    @property
    def bound(self) -> str | None:
        """``compute`` or ``dispatch``: which takes longer; ``None`` when the operators were not
        counted (``seconds`` is then the compute alone, and may be short of the step)."""
        if self.operators is None:
            return None
        return "dispatch" if self.dispatch > self.compute else "compute"


def step_time(train_flops_per_sample: float, batch: int, gpu: Gpu, mfu: float, operators: int | None,
              scaling: float = 1.0) -> StepTime:
    """The step of ``batch`` samples on one ``gpu`` at ``mfu`` x ``scaling`` of its peak, with
    ``operators`` dispatched (``None``: compute alone). Raises ``ValueError`` for a batch below 1."""
    if batch < 1:
        raise ValueError(f"a step holds at least one sample, not {batch}")
    compute = train_flops_per_sample * batch / (gpu.peak_tflops * 1e12 * mfu * scaling)
    dispatch = operators * EAGER_OPERATOR_SECONDS if operators else 0.0
    return StepTime(batch, compute, dispatch, operators)
