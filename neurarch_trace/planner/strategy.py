"""Training strategies over N GPUs and the memory each GPU needs: DDP, ZeRO-1/2/3 (FSDP full-shard),
with or without activation checkpointing.

The model states come from the memory model (:mod:`neurarch_trace.planner.memory`) by kind, as
:class:`States`; the strategies divide them. Two byte counts per trainable parameter are in play,
and each strategy uses the one of the engine that runs it:

* ``single`` and ``ddp``: PyTorch autocast with fp32 parameters, the memory model's
  2 + 4 + 4 + 8 = 18 bytes (16-bit weight copy, fp32 master weights, fp32 gradients, AdamW's two
  fp32 moments), whole on every GPU. DDP adds a copy of the gradients in its all-reduce buckets
  (``DistributedDataParallel(gradient_as_bucket_view=False)``, the default; PyTorch's DDP
  reference: setting it True "can reduce peak memory usage, where the saved memory size will be
  equal to the total gradients size").
* ``zero1``/``zero2``/``zero3``: ZeRO's count (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", section 3.1): 16-bit weights 2 + 16-bit gradients 2 +
  K = 12 bytes of optimizer state (fp32 master weights 4 and Adam's momentum and variance 4 + 4),
  16 bytes in all: the engine keeps gradients in 16 bits where autocast keeps them in fp32, the
  18 - 16 = 2 bytes of difference. Figure 1 and section 5 divide them over N data-parallel GPUs:
  ZeRO-1 (P_os) ``2 + 2 + 12/N``, ZeRO-2 (P_os+g) ``2 + (2 + 12)/N``, ZeRO-3 (P_os+g+p)
  ``(2 + 2 + 12)/N``. ZeRO-3 also gathers one layer's 16-bit weights and gradients at a time:
  4 bytes x the largest layer's parameters, as DeepSpeed's own
  ``estimate_zero3_model_states_mem_needs`` counts it (``deepspeed/runtime/zero/stage3.py``:
  ``largest_layer_memory = 4 * largest_layer_params``). PyTorch FSDP full-shard under mixed
  precision (Zhao et al. 2023, "PyTorch FSDP", section 3) shards fp32 weights 4, fp32 gradients 4
  and AdamW 8: the same 16 bytes divided by N, so ``zero3`` stands for both.

Every GPU also holds the buffers, a framework allowance (its own CUDA context) and the activations
of its own micro-batch; with checkpointing, only what leaves each block (:mod:`.blocks`).

A measured step (:mod:`.memory`) peaks in different phases at different batches (the optimizer
step at a small batch, the backward at a large one), each phase with its own states and bytes per
sample. A :class:`Setup` therefore holds one line ``static + batch x per_sample`` per phase, and
its peak at a batch is the largest line there: the main phase's (the one largest at batch 1), and
the ``others`` given to :func:`footprint`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Activations",
    "Phase",
    "STRATEGIES",
    "Setup",
    "States",
    "ZERO_GRADIENT_BYTES",
    "footprint",
    "strategy_options",
    "strategy_text",
]

#: Strategies in the order a plan prefers them on a given cluster (least communication first).
STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3")
#: 16-bit gradients, per trainable parameter, as ZeRO counts them (Rajbhandari et al. 2020, 3.1).
ZERO_GRADIENT_BYTES = 2

_TEXT = {"single": "one GPU", "ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3/FSDP"}


@dataclass(frozen=True)
class States:
    """What one replica holds besides activations, by kind, in bytes: ``weights`` (the 16-bit copy
    of every parameter; 4-bit for a QLoRA base), ``master`` (fp32 master weights), ``gradients``
    (as autocast keeps them), ``zero_gradients`` (16-bit, as ZeRO counts them), ``optimizer``,
    ``buffers``, ``framework`` (per GPU), ``extra`` (per GPU: a QLoRA dequantisation buffer),
    ``gather`` (ZeRO-3's one gathered layer) and ``ddp_buckets`` (DDP's all-reduce buckets: every
    trainable parameter's gradient, as autocast keeps them, allocated when DDP wraps the model and
    held in every phase, where ``gradients`` are the ones alive at the phase's peak)."""

    weights: float
    master: float
    gradients: float
    zero_gradients: float
    optimizer: float
    buffers: float
    framework: float
    gather: float
    extra: float = 0.0
    ddp_buckets: float = 0.0

    @property
    def single_bytes(self) -> float:
        """Everything on one GPU, as the single-GPU memory model counts it."""
        return (self.weights + self.master + self.gradients + self.optimizer + self.buffers
                + self.framework + self.extra)

    @property
    def zero_states(self) -> float:
        """ZeRO's model states (2 + 2 + 12 bytes per trainable parameter, frozen weights as held)."""
        return self.weights + self.zero_gradients + self.master + self.optimizer


@dataclass(frozen=True)
class Activations:
    """Activation bytes per sample: ``plain`` (every layer's output kept) and ``checkpointed``
    (``None`` when checkpointing frees nothing: no repeated blocks). ``checkpointed_phases``: the
    checkpointed step's own phases, rehearsed (each with its states: a checkpointed step peaks at
    other points, holding other gradients), which a checkpointed :func:`footprint` of this main
    phase takes instead, the first as its main phase; empty when not rehearsed."""

    plain: float
    checkpointed: float | None = None
    checkpointed_phases: tuple[Phase, ...] = ()


@dataclass(frozen=True)
class Setup:
    """One strategy on ``gpus`` GPUs: the per-GPU peak is ``static_bytes + batch x
    per_sample_bytes`` (before headroom); ``parts`` names the static part's pieces (bytes)."""

    strategy: str
    checkpoint: bool
    gpus: int
    static_bytes: float
    per_sample_bytes: float
    parts: dict[str, float]
    #: the other phases of the step, each as a one-phase setup of the same strategy; this one is
    #: the main phase (the one largest at batch 1), and ``parts`` describe it
    others: tuple[Setup, ...] = ()

    def at(self, batch: int) -> Setup:
        """The one-phase setup of the phase that peaks at ``batch`` (its ``parts`` name its state)."""
        return max((self, *self.others), key=lambda s: s.static_bytes + batch * s.per_sample_bytes)

    @property
    def lines(self) -> tuple[tuple[float, float], ...]:
        """Every phase's ``(static, per_sample)``, the main phase's first."""
        return tuple((s.static_bytes, s.per_sample_bytes) for s in (self, *self.others))

    def line(self, batch: int) -> tuple[float, float]:
        """The ``(static, per_sample)`` of the phase that peaks at ``batch``."""
        phase = self.at(batch)
        return phase.static_bytes, phase.per_sample_bytes

    def peak_bytes(self, batch: int) -> float:
        """Per-GPU peak at ``batch`` samples per GPU: the largest phase there."""
        static, per_sample = self.line(batch)
        return static + batch * per_sample

    @property
    def label(self) -> str:
        """``single``, ``ddp``, ``zero3+ckpt``: the plan's ``fit.strategy``."""
        return self.strategy + ("+ckpt" if self.checkpoint else "")


def strategy_text(strategy: str, checkpoint: bool) -> str:
    """How the card names a strategy: ``ZeRO-3/FSDP + checkpointing``."""
    return _TEXT[strategy] + (" + checkpointing" if checkpoint else "")


#: The parts of a ZeRO-3 setup divided among its cards (:func:`_divided`); the rest is per GPU.
ZERO3_DIVIDED = ("weights", "gradients", "masterWeights", "optimizer")


def _divided(states: States, strategy: str, n: int) -> dict[str, float]:
    if strategy in ("single", "ddp"):
        parts = {"weights": states.weights, "masterWeights": states.master, "gradients": states.gradients,
                 "optimizer": states.optimizer}
        if strategy == "ddp":
            parts["ddpBuckets"] = states.ddp_buckets
        return parts
    stage = int(strategy[-1])
    return {
        "weights": states.weights / n if stage >= 3 else states.weights,
        "gradients": states.zero_gradients / n if stage >= 2 else states.zero_gradients,
        "masterWeights": states.master / n,
        "optimizer": states.optimizer / n,
        **({"gathered": states.gather} if stage >= 3 else {}),
    }


Phase = tuple[States, Activations]


def footprint(states: States, acts: Activations, strategy: str, gpus: int, checkpoint: bool = False,
              others: tuple[Phase, ...] = ()) -> Setup:
    """The per-GPU memory of ``strategy`` on ``gpus`` GPUs, for the main phase ``(states, acts)``
    and the step's ``others`` phases. Raises ``ValueError`` for an unknown strategy, ``single`` on
    more than one GPU, or checkpointing without blocks."""
    if checkpoint and acts.checkpointed_phases:  # the checkpointed step as rehearsed
        (states, acts), *rest = acts.checkpointed_phases
        others = tuple(rest)
    main = _line_setup(states, acts, strategy, gpus, checkpoint)
    if not others:
        return main
    phases = tuple(_line_setup(s, a, strategy, gpus, checkpoint and a.checkpointed is not None) for s, a in others)
    return Setup(main.strategy, main.checkpoint, main.gpus, main.static_bytes, main.per_sample_bytes, main.parts,
                 phases)


def _line_setup(states: States, acts: Activations, strategy: str, gpus: int, checkpoint: bool) -> Setup:
    if strategy not in STRATEGIES or (strategy == "single") != (gpus == 1) or gpus < 1:
        raise ValueError(f"no strategy {strategy!r} on {gpus} GPUs")
    if checkpoint and acts.checkpointed is None:
        raise ValueError("activation checkpointing needs repeated blocks")
    parts = _divided(states, strategy, gpus)
    parts.update({"buffers": states.buffers, "framework": states.framework})
    if states.extra:
        parts["dequantBuffer"] = states.extra
    per_sample = acts.checkpointed if checkpoint and acts.checkpointed is not None else acts.plain
    return Setup(strategy, checkpoint, gpus, sum(parts.values()), per_sample, parts)


def strategy_options(gpus: int, can_checkpoint: bool) -> list[tuple[str, bool]]:
    """``(strategy, checkpoint)`` pairs to try on ``gpus`` GPUs, in the order of preference:
    without checkpointing first (it costs a forward pass), then the lower ZeRO stages."""
    names = ["single"] if gpus == 1 else list(STRATEGIES[1:])
    options = [(name, False) for name in names]
    if can_checkpoint:
        options += [(name, True) for name in names]
    return options
