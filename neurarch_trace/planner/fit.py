"""GPU fit: the cheapest card that holds one training step, at the largest batch it holds.

A card holds a batch when ``need = peak(batch) x headroom <= memory`` (headroom 1.15, from the GPU
table, shared with the other Neurarch sizing tools). Batches are powers of two from 1 up to
:data:`MAX_BATCH`. Cards are tried cheapest per hour first; the first card that holds batch 1 wins,
at the largest power-of-two batch it holds. A need within 15% of the card's memory is borderline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from neurarch_trace.planner.gpus import Gpu, GpuTable, gpu_table
from neurarch_trace.planner.memory import MemoryModel

__all__ = ["CardFit", "Fit", "MAX_BATCH", "fit"]

#: Largest batch the plan proposes for one GPU. A product choice, not a hardware limit: past a
#: thousand samples per step, single-GPU training is rarely batch-bound and large-batch training
#: needs learning-rate scaling of its own (Goyal et al. 2017 train ResNet-50 at 32 per GPU).
MAX_BATCH = 1024


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

    gpu: Optional[Gpu]
    batch: int
    peak_bytes: float
    need_bytes: float
    borderline: bool
    headroom: float
    candidates: List[CardFit]

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


def fit(memory: MemoryModel, table: Optional[GpuTable] = None) -> Fit:
    """The GPU fit of ``memory`` over ``table`` (the packaged one by default)."""
    table = table or gpu_table()
    candidates = [_card(memory, gpu, table.headroom) for gpu in table.cards]
    for card in candidates:  # cards are sorted cheapest first
        if card.batch:
            borderline = card.need_bytes > (1 - table.borderline_fraction) * card.gpu.memory_bytes
            return Fit(card.gpu, card.batch, card.peak_bytes, card.need_bytes, borderline, table.headroom, candidates)
    peak = memory.peak_bytes(1)
    return Fit(None, 1, peak, peak * table.headroom, False, table.headroom, candidates)
