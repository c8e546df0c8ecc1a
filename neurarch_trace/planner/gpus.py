"""The GPU cards a plan sizes training for, loaded from ``neurarch_trace/data/gpus.json``.

The table (id, memory in GB = 10^9 bytes, USD per GPU-hour) copies ``shared/spec/gpus.md`` so that
cards from the other Neurarch sizing tools agree; each card's peak dense 16-bit tensor throughput
comes from its datasheet, cited in the data file next to the number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Tuple

__all__ = ["Gpu", "GpuTable", "gpu_table"]


@dataclass(frozen=True)
class Gpu:
    """One card: ``memory_gb`` in GB (10^9 bytes), ``usd_per_hour`` on-demand list price,
    ``peak_tflops`` peak dense fp16/bf16 tensor throughput in TFLOPS (10^12 FLOP/s)."""

    id: str
    memory_gb: float
    usd_per_hour: float
    precision: str
    peak_tflops: float
    peak_source: str

    @property
    def memory_bytes(self) -> float:
        """Capacity in bytes (the table's GB are 10^9 bytes)."""
        return self.memory_gb * 1e9

    @property
    def label(self) -> str:
        """``T4 16 GB``: how the card names a GPU."""
        return f"{self.id} {self.memory_gb:g} GB"


@dataclass(frozen=True)
class GpuTable:
    """All cards, cheapest first (ties broken by larger memory, then by id), with the sizing rules
    the table comes with: ``headroom`` (need = peak x headroom) and ``borderline_fraction`` (a
    need within that fraction of a card's memory is borderline)."""

    cards: Tuple[Gpu, ...]
    price_date: str
    price_source: str
    headroom: float
    borderline_fraction: float

    def by_id(self, gpu_id: str) -> Gpu:
        """The card called ``gpu_id``; ``KeyError`` when there is none."""
        for card in self.cards:
            if card.id == gpu_id:
                return card
        raise KeyError(gpu_id)

    @property
    def largest(self) -> Gpu:
        """The card with the most memory (the cheapest of those, on a tie)."""
        return max(self.cards, key=lambda c: (c.memory_gb, -c.usd_per_hour))


@lru_cache(maxsize=1)
def gpu_table() -> GpuTable:
    """Read and check the packaged data file once per process."""
    text = resources.files("neurarch_trace").joinpath("data/gpus.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    cards = []
    for entry in raw["cards"]:
        card = Gpu(
            id=str(entry["id"]),
            memory_gb=float(entry["memoryGb"]),
            usd_per_hour=float(entry["usdPerHour"]),
            precision=str(entry["precision"]),
            peak_tflops=float(entry["peakDenseTflops16"]),
            peak_source=str(entry["peakSource"]),
        )
        if card.memory_gb <= 0 or card.usd_per_hour <= 0 or card.peak_tflops <= 0:
            raise ValueError(f"gpus.json: card {card.id} has a non-positive number")
        cards.append(card)
    cards.sort(key=lambda c: (c.usd_per_hour, -c.memory_gb, c.id))
    return GpuTable(
        cards=tuple(cards),
        price_date=str(raw["priceDate"]),
        price_source=str(raw["priceSource"]),
        headroom=float(raw["headroom"]),
        borderline_fraction=float(raw["borderlineFraction"]),
    )
