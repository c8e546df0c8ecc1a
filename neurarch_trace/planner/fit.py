"""GPU fit: the cheapest setup that holds one training step, at the largest batch it holds.

A card holds a batch when ``need = peak(batch) x headroom <= memory`` (headroom 1.15, from the GPU
table, shared with the other Neurarch sizing tools). Batches are powers of two from 1 up to
:data:`MAX_BATCH` (per GPU). A need within 15% of the card's memory is borderline.

One card first (:func:`fit`, and the first step of :func:`choose`): cards are tried cheapest per
hour first; the first card that holds batch 1 without activation checkpointing wins, at the
largest power-of-two batch it holds. This is the plan whenever one card holds the step.

Otherwise a cluster (:func:`choose`): every card kind x N GPUs (:data:`GPU_COUNTS`) x strategy
(:mod:`neurarch_trace.planner.strategy`) that holds batch 1 per GPU is a candidate, and the plan
takes the one that trains cheapest per unit of training (GPU-hours x price: the price per
GPU-hour over the card's throughput, x the step's FLOPs, which checkpointing raises by a forward
pass), then the fewest GPUs, then the lowest hourly price, then the strategy order (least
communication first). At the stated utilisation (:mod:`neurarch_trace.planner.cost`) GPU-hours do
not grow with N, so a cluster of one kind never costs less per unit than one card of that kind;
a cluster replaces a one-card plan only when it costs less both per hour and per unit (a cheaper
kind in numbers). LoRA and QLoRA fine-tuning exist to need fewer GPUs: when no card holds their
step as it is, one card with activation checkpointing (the cheapest per unit) comes before any
cluster. For one kind of card asked for by name (the request's ``gpu``), the question is
whether the user's card holds it: the fewest GPUs win, then the cheapest per unit (no
checkpointing before checkpointing), then the strategy order. Nothing holding on up to 64 GPUs,
:func:`smallest_cluster` says how many of the largest card ZeRO-3 with checkpointing would take.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable

from neurarch_trace.planner.gpus import MAX_GPUS, Gpu, GpuTable, gpu_table
from neurarch_trace.planner.memory import MemoryModel
from neurarch_trace.planner.strategy import (
    ZERO3_DIVIDED,
    Activations,
    Phase,
    Setup,
    States,
    footprint,
    strategy_options,
)

__all__ = ["CardFit", "Choice", "Fit", "GPU_COUNTS", "GPUS_PER_NODE", "MAX_BATCH", "choose", "fit",
           "largest_batch", "on_node_grid", "smallest_cluster"]

#: Largest batch the plan proposes for one GPU. A product choice, not a hardware limit: past a
#: thousand samples per step, single-GPU training is rarely batch-bound and large-batch training
#: needs learning-rate scaling of its own (Goyal et al. 2017 train ResNet-50 at 32 per GPU).
MAX_BATCH = 1024
#: GPUs per node: an 8-GPU server (DGX/HGX A100 and H100 systems hold 8; Modal rents at most 8 per
#: container), so clusters are 1 to 8 GPUs in one node, then whole nodes up to :data:`MAX_GPUS`.
GPUS_PER_NODE = 8
GPU_COUNTS: tuple[int, ...] = tuple(range(1, GPUS_PER_NODE + 1)) + tuple(
    range(2 * GPUS_PER_NODE, MAX_GPUS + 1, GPUS_PER_NODE))


@dataclass(frozen=True)
class CardFit:
    """The largest power-of-two batch ``gpu`` holds (0: not even one sample) and, at that batch
    (or at 1 when it holds none), the peak and the need in bytes."""

    gpu: Gpu
    batch: int
    peak_bytes: float
    need_bytes: float


@dataclass(frozen=True)
class Fit:
    """The chosen card (``None`` when no card holds batch 1) with its batch, peak and need in
    bytes, whether the need is borderline, and every card's own fit."""

    gpu: Gpu | None
    batch: int
    peak_bytes: float
    need_bytes: float
    borderline: bool
    headroom: float
    candidates: list[CardFit]

    @property
    def fits(self) -> bool:
        return self.gpu is not None


def _card(memory: MemoryModel, gpu: Gpu, headroom: float) -> CardFit:
    best = 0
    batch = 1
    while batch <= MAX_BATCH and memory.peak_bytes(batch) * headroom <= gpu.memory_bytes:
        best = batch
        batch *= 2
    at = best or 1
    peak = memory.peak_bytes(at)
    return CardFit(gpu=gpu, batch=best, peak_bytes=peak, need_bytes=peak * headroom)


def fit(memory: MemoryModel, table: GpuTable | None = None) -> Fit:
    """The GPU fit of ``memory`` over ``table`` (the packaged one by default)."""
    table = table or gpu_table()
    candidates = [_card(memory, gpu, table.headroom) for gpu in table.cards]
    for card in candidates:  # cards are sorted cheapest first
        if card.batch:
            borderline = card.need_bytes > (1 - table.borderline_fraction) * card.gpu.memory_bytes
            return Fit(card.gpu, card.batch, card.peak_bytes, card.need_bytes, borderline, table.headroom, candidates)
    peak = memory.peak_bytes(1)
    return Fit(None, 1, peak, peak * table.headroom, False, table.headroom, candidates)


@dataclass(frozen=True)
class Choice:
    """A training setup on a card: ``setup`` (strategy, GPUs, per-GPU memory), the largest
    power-of-two ``batch`` per GPU it holds, the per-GPU peak and need at that batch (bytes),
    whether the need is borderline, and the training FLOPs of one sample (with any recompute)."""

    gpu: Gpu
    setup: Setup
    batch: int
    peak_bytes: float
    need_bytes: float
    borderline: bool
    train_flops: float

    @property
    def gpus(self) -> int:
        return self.setup.gpus

    @property
    def hourly(self) -> float | None:
        """USD per hour of the whole cluster; ``None`` for a card without a price."""
        return None if self.gpu.usd_per_hour is None else self.gpu.usd_per_hour * self.gpus

    @property
    def unit_price(self) -> float:
        """What a unit of training costs, up to a common factor: FLOPs per sample x USD per
        GPU-hour / TFLOPS (a card without a price counts 1 USD, so only FLOPs and speed rank)."""
        return self.train_flops * (self.gpu.usd_per_hour or 1.0) / self.gpu.peak_tflops


def largest_batch(setup: Setup, gpu: Gpu, headroom: float) -> int:
    """The largest power-of-two batch per GPU, up to :data:`MAX_BATCH`, whose need fits ``gpu``
    in every phase of the step; 0 when not even one sample does."""
    if setup.peak_bytes(1) * headroom > gpu.memory_bytes:
        return 0
    room = float(MAX_BATCH)
    for static, per_sample in setup.lines:
        if per_sample > 0:
            room = min(room, (gpu.memory_bytes / headroom - static) / per_sample)
    batch = 1
    while batch * 2 <= room:
        batch *= 2
    while batch > 1 and setup.peak_bytes(batch) * headroom > gpu.memory_bytes:  # float edge
        batch //= 2
    return batch


def _choice(gpu: Gpu, setup: Setup, table: GpuTable, flops: Callable[[bool], float]) -> Choice | None:
    batch = largest_batch(setup, gpu, table.headroom)
    if not batch:
        return None
    peak = setup.peak_bytes(batch)
    need = peak * table.headroom
    borderline = need > (1 - table.borderline_fraction) * gpu.memory_bytes
    return Choice(gpu, setup, batch, peak, need, borderline, flops(setup.checkpoint))


def _candidates(states: States, acts: Activations, cards: Iterable[Gpu], table: GpuTable,
                flops: Callable[[bool], float], counts: Sequence[int],
                others: tuple[Phase, ...]) -> list[tuple[tuple, Choice]]:
    found = []
    for gpu in cards:
        for n in counts:
            for order, (strategy, checkpoint) in enumerate(strategy_options(n, acts.checkpointed is not None)):
                choice = _choice(gpu, footprint(states, acts, strategy, n, checkpoint, others), table, flops)
                if choice is not None:
                    found.append(((choice.unit_price, n, choice.hourly or 0.0, order), choice))
                    break  # the first strategy that holds is preferred on this cluster
    return found


def choose(states: States, acts: Activations, flops: Callable[[bool], float], cards: Sequence[Gpu],
           table: GpuTable | None = None, gpus: int | None = None, fewest: bool = False,
           others: tuple[Phase, ...] = (), one_card: bool = False) -> Choice | None:
    """The training setup for ``states`` and ``acts`` (and the step's ``others`` phases) over
    ``cards`` (cheapest per hour first), by the rule of this module; ``flops(checkpoint)`` gives
    the training FLOPs per sample;
    ``gpus`` fixes the cluster size; ``fewest`` ranks the fewest GPUs first (a card asked for by
    name); ``one_card`` (LoRA and QLoRA) takes one card with checkpointing, the cheapest per unit,
    before any cluster when no card holds the step without it. ``None`` when nothing holds batch
    1 on up to 64 GPUs."""
    table = table or gpu_table()
    single = None
    if gpus in (None, 1):
        for gpu in cards:
            single = _choice(gpu, footprint(states, acts, "single", 1, others=others), table, flops)
            if single is not None:
                break
    counts = (gpus,) if gpus is not None else GPU_COUNTS
    found = _candidates(states, acts, cards, table, flops, counts, others)
    if fewest and found:
        return min(found, key=lambda item: (item[0][1], item[0][0], item[0][3]))[1]
    alone = [item for item in found if item[1].gpus == 1]
    if one_card and single is None and alone:
        return min(alone, key=lambda item: item[0])[1]
    if not found:
        return single
    # options were tried without checkpointing first; rank all of them by the rule
    best = min(found, key=lambda item: item[0])[1]
    if single is None:
        return best
    cheaper = (best.gpus > 1 and best.hourly is not None and single.hourly is not None
               and best.hourly <= single.hourly and best.unit_price < single.unit_price)
    return best if cheaper else single


def _undivided(phase: Setup) -> float:
    """One phase's bytes at one sample per GPU that ZeRO-3 does not divide."""
    return phase.static_bytes - sum(phase.parts.get(k, 0.0) for k in ZERO3_DIVIDED) + phase.per_sample_bytes


def smallest_cluster(states: States, acts: Activations, gpu: Gpu, table: GpuTable | None = None,
                     others: tuple[Phase, ...] = ()) -> tuple[int | None, Setup]:
    """How many ``gpu`` cards ZeRO-3 (with checkpointing when the model has blocks) would need to
    hold one sample per GPU, counted as the planner counts clusters (whole 8-GPU nodes past 8:
    :func:`on_node_grid`), and that setup; ``(None, setup at 64)`` when no number would: what
    is not divided (buffers, framework, the gathered layer, one sample's activations) alone
    exceeds one card."""
    table = table or gpu_table()
    checkpoint = acts.checkpointed is not None
    probe = footprint(states, acts, "zero3", MAX_GPUS, checkpoint, others)
    # each phase's part that no number of cards divides (a checkpointed step's rehearsed phases
    # have states of their own): no number holds one sample when the largest exceeds a card
    if max(_undivided(phase) for phase in (probe, *probe.others)) * table.headroom >= gpu.memory_bytes:
        return None, probe
    peak = probe.at(1)
    divided = sum(peak.parts.get(k, 0.0) for k in ZERO3_DIVIDED) * MAX_GPUS
    room = gpu.memory_bytes / table.headroom - _undivided(peak)

    def holds(count: int) -> bool:
        return footprint(states, acts, "zero3", count, checkpoint, others).peak_bytes(1) * table.headroom \
            <= gpu.memory_bytes

    # a first guess from the phase that peaks on 64 cards, whose undivided part is the largest; on
    # fewer cards another phase (the optimizer step's, with no activations) may peak, and fewer hold
    n = max(2, math.ceil(divided / room))
    while not holds(n):
        n += 1
    while n > 2 and holds(n - 1):
        n -= 1
    n = on_node_grid(n)
    return n, footprint(states, acts, "zero3", n, checkpoint, others)


def on_node_grid(n: int) -> int:
    """``n`` GPUs as the planner counts them (:data:`GPU_COUNTS`, and on past 64): 1 to 8 in one
    node, then whole 8-GPU nodes (``21`` -> ``24``)."""
    return n if n <= GPUS_PER_NODE else -(-n // GPUS_PER_NODE) * GPUS_PER_NODE
