"""The GPU cards a plan sizes training for, loaded from ``neurarch_trace/data/gpus.json``.

The table (id, memory in GB = 10^9 bytes, USD per GPU-hour) copies ``shared/spec/gpus.md`` so that
cards from the other Neurarch sizing tools agree; each card's peak dense 16-bit tensor throughput
comes from its datasheet, cited in the data file next to the number.

Besides the rented cards (:attr:`GpuTable.cards`, each with a list price), the file lists cards
people own (:attr:`GpuTable.own_cards`: RTX 4090, RTX 3090, RTX A6000, L40) with their memory and
throughput but no price. Those are sized only when asked for by name (:func:`parse_gpu`, the
request's ``gpu``: ``NAME`` or ``NAMExN``) and priced only with a price the user gives.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["MAX_GPUS", "Gpu", "GpuRequest", "GpuTable", "gpu_table", "parse_gpu"]

#: Most GPUs a plan puts in one cluster (the issue's range, 1 to 64: eight 8-GPU nodes).
MAX_GPUS = 64


@dataclass(frozen=True)
class Gpu:
    """One card: ``memory_gb`` in GB (10^9 bytes), ``usd_per_hour`` on-demand list price (``None``
    for a card without one), ``peak_tflops`` peak dense fp16/bf16 tensor throughput in TFLOPS
    (10^12 FLOP/s)."""

    id: str
    memory_gb: float
    usd_per_hour: float | None
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

    @property
    def priced(self) -> bool:
        """Whether the card has an hourly price (a list price or one the user gave)."""
        return self.usd_per_hour is not None


@dataclass(frozen=True)
class GpuRequest:
    """What the request's ``gpu`` asks for: one kind of card and, with ``NAMExN``, how many
    (``gpus`` is ``None`` for a bare ``NAME``: the plan then picks how many)."""

    gpu: Gpu
    gpus: int | None


@dataclass(frozen=True)
class GpuTable:
    """All rented cards, cheapest first (ties broken by larger memory, then by id), the owned cards
    without a price, and the sizing rules the table comes with: ``headroom`` (need = peak x
    headroom) and ``borderline_fraction`` (a need within that fraction of a card's memory is
    borderline)."""

    cards: tuple[Gpu, ...]
    price_date: str
    price_source: str
    headroom: float
    borderline_fraction: float
    own_cards: tuple[Gpu, ...] = ()

    def by_id(self, gpu_id: str) -> Gpu:
        """The card called ``gpu_id`` (rented or owned); ``KeyError`` when there is none."""
        for card in self.cards + self.own_cards:
            if card.id == gpu_id:
                return card
        raise KeyError(gpu_id)

    @property
    def largest(self) -> Gpu:
        """The rented card with the most memory (the cheapest of those, on a tie)."""
        return max(self.cards, key=lambda c: (c.memory_gb, -(c.usd_per_hour or 0.0)))

    @property
    def names(self) -> tuple[str, ...]:
        """Every card id, rented first."""
        return tuple(c.id for c in self.cards + self.own_cards)


def _card(entry: dict, priced: bool) -> Gpu:
    price = entry.get("usdPerHour")
    card = Gpu(
        id=str(entry["id"]),
        memory_gb=float(entry["memoryGb"]),
        usd_per_hour=float(price) if price is not None else None,
        precision=str(entry["precision"]),
        peak_tflops=float(entry["peakDenseTflops16"]),
        peak_source=str(entry["peakSource"]),
    )
    if priced and card.usd_per_hour is None:
        raise ValueError(f"gpus.json: rented card {card.id} has no usdPerHour")
    numbers = [card.memory_gb, card.peak_tflops] + ([card.usd_per_hour] if card.usd_per_hour is not None else [])
    if any(n <= 0 for n in numbers):  # type: ignore[operator]
        raise ValueError(f"gpus.json: card {card.id} has a non-positive number")
    return card


@lru_cache(maxsize=1)
def gpu_table() -> GpuTable:
    """Read and check the packaged data file once per process."""
    text = resources.files("neurarch_trace").joinpath("data/gpus.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    cards = [_card(entry, priced=True) for entry in raw["cards"]]
    cards.sort(key=lambda c: (c.usd_per_hour, -c.memory_gb, c.id))
    return GpuTable(
        cards=tuple(cards),
        price_date=str(raw["priceDate"]),
        price_source=str(raw["priceSource"]),
        headroom=float(raw["headroom"]),
        borderline_fraction=float(raw["borderlineFraction"]),
        own_cards=tuple(_card(entry, priced=False) for entry in raw.get("ownCards", [])),
    )


def _key(name: str) -> str:
    """Names compared without case, spaces, hyphens or underscores: ``rtx 4090`` = ``RTX-4090``."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def _lookup(table: GpuTable, name: str) -> Gpu | None:
    wanted = _key(name)
    for card in table.cards + table.own_cards:
        if _key(card.id) == wanted:
            return card
    return None


def parse_gpu(spec: str, table: GpuTable | None = None, usd_per_hour: float | None = None) -> GpuRequest:
    """The card (and count) named by ``spec``: ``H100``, ``H100x8``, ``8x H100``, ``rtx 4090``, ``RTX-4090x2``.

    ``usd_per_hour``, when given, becomes that card's price per GPU-hour (a list price is replaced).
    Raises ``ValueError`` with one sentence naming the known cards for an unknown name, or for a
    count outside 1 to :data:`MAX_GPUS`.
    """
    table = table or gpu_table()
    text = spec.strip() if isinstance(spec, str) else ""
    first = re.fullmatch(r"([0-9]+)\s*[x\u00d7*]\s*([a-z].*)", text, flags=re.IGNORECASE)
    if first:  # a count written first, as the card writes clusters: 8x H100
        text = f"{first.group(2).strip()}x{first.group(1)}"
    card, count = _lookup(table, text), None
    if card is None:
        match = re.fullmatch(r"(.+?)\s*[x\u00d7*]\s*(-?[0-9]+)", text, flags=re.IGNORECASE)
        if match:
            card, count = _lookup(table, match.group(1)), int(match.group(2))
    if card is None:
        raise ValueError(f"unknown GPU {text!r}: known cards are {', '.join(table.names)} "
                         f"(add xN for N of them, e.g. H100x8)")
    if count is not None and not 1 <= count <= MAX_GPUS:
        raise ValueError(f"gpu {text!r} asks for {count} GPUs; a plan uses 1 to {MAX_GPUS}")
    if usd_per_hour is not None:
        card = dataclasses.replace(card, usd_per_hour=float(usd_per_hour))
    return GpuRequest(card, count)
