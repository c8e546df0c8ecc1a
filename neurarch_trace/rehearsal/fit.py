"""From rehearsed runs to the peak of a training step at any batch size and sequence length.

Every allocation of a run is a point of the step's memory curve (live bytes per kind). Runs at two
batch sizes ``b1 < b2`` allocate the same storages in the same order, only larger, so each point is
a line in the batch: ``live(b) = state + b x per_sample``, solved per point and per kind. For a
token model a third run at a shorter sequence (``L1 = L0 / 2``) splits each point's per-sample
bytes into a part linear in the sequence length and a part that grows with its square (score
matrices, masks): ``per_sample(L) = lin x L / L0 + sq x (L / L0)^2``.

The peak at a batch ``B`` and length ``L`` is the largest point; :func:`combine` keeps the points
that are largest somewhere on a grid of batches (1 to 4096) and lengths (L0/8 to 32 x L0), and, for
every phase, the points that are its largest (the "phase peaks"): a handful of lines whose maximum
is the peak. Where the runs do not line up (a model whose forward changes with the batch) the
per-sample part of each point is what it holds of batch-sized kinds (inputs, activations, loss and
backward transients) divided by the batch, and the state is the rest.
"""

from __future__ import annotations

from typing import Any

from neurarch_trace.rehearsal.step import Run
from neurarch_trace.rehearsal.storage import KINDS, SAMPLE_KINDS, STATE_KINDS

__all__ = ["combine", "GRID_BATCHES", "GRID_RATIOS"]

GRID_BATCHES = tuple(2**k for k in range(13))  # 1 ... 4096
GRID_RATIOS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_STATE = [KINDS.index(k) for k in STATE_KINDS]
_SAMPLE = [KINDS.index(k) for k in SAMPLE_KINDS]
_OTHER = KINDS.index("other")
_ACTIVATIONS = KINDS.index("activations")


def _aligned(a: Run, b: Run | None) -> bool:
    return b is not None and len(a.points) == len(b.points) and a.phases == b.phases


def _lines(r1: Run, r2: Run | None) -> tuple[list[list[float]], list[list[float]]]:
    """Per point and kind: the batch-independent bytes and the bytes per sample."""
    states: list[list[float]] = []
    slopes: list[list[float]] = []
    if _aligned(r1, r2):
        assert r2 is not None
        db = r2.batch - r1.batch
        for p1, p2 in zip(r1.points, r2.points):
            slope = [(y - x) / db for x, y in zip(p1, p2)]
            states.append([x - r1.batch * s for x, s in zip(p1, slope)])
            slopes.append(slope)
        return states, slopes
    for p1 in r1.points:
        states.append([float(p1[k]) if k in _STATE else 0.0 for k in range(len(KINDS))])
        slopes.append([p1[k] / r1.batch if k in _SAMPLE else 0.0 for k in range(len(KINDS))])
    return states, slopes


def _squares(r1: Run, r3: Run | None, states: list, slopes: list) -> list[list[float]] | None:
    """Per point and kind, the part of the per-sample bytes at ``L0`` that grows with ``L^2``."""
    if not _aligned(r1, r3) or r1.tokens is None or r3 is None or r3.tokens is None or r3.tokens == r1.tokens:
        return None
    l0, l1 = float(r1.tokens), float(r3.tokens)
    squares = []
    for point, state, slope in zip(r3.points, states, slopes):
        row = []
        for k, at_l0 in enumerate(slope):
            at_l1 = (point[k] - state[k]) / r3.batch
            beta = (at_l1 / l1 - at_l0 / l0) / (l1 - l0)
            row.append(min(max(beta * l0 * l0, 0.0), max(at_l0, 0.0)))
        squares.append(row)
    return squares


def _front(totals: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The points not beaten at every batch by another: decreasing state, increasing slope."""
    front: list[tuple[float, float, int]] = []
    best = float("-inf")
    for state, slope, index in sorted(totals, key=lambda t: (-t[0], -t[1])):
        if slope > best:
            front.append((state, slope, index))
            best = slope
    return front


def _chosen(states: list, slopes: list, squares: list | None, phases: list[str], batch: int) -> list[int]:
    state_tot = [sum(row) for row in states]
    slope_tot = [sum(row) for row in slopes]
    sq_tot = [sum(row) for row in squares] if squares is not None else [0.0] * len(states)
    chosen: dict[int, None] = {}
    batches = sorted(set(GRID_BATCHES) | {batch})
    for ratio in GRID_RATIOS if squares is not None else (1.0,):
        per = [(a - q) * ratio + q * ratio * ratio for a, q in zip(slope_tot, sq_tot)]
        front = _front([(s, a, i) for i, (s, a) in enumerate(zip(state_tot, per))])
        for b in batches:
            chosen.setdefault(max(front, key=lambda t: t[0] + b * t[1])[2], None)
    for phase in dict.fromkeys(phases):  # each phase's own largest points
        front = _front([(state_tot[i], slope_tot[i], i) for i, p in enumerate(phases) if p == phase])
        for b in batches:
            chosen.setdefault(max(front, key=lambda t: t[0] + b * t[1])[2], None)
    return sorted(chosen)


def _entry(i: int, states: list, slopes: list, squares: list | None, phase: str) -> dict[str, Any]:
    state = {kind: 0.0 for kind in STATE_KINDS}
    per_sample: dict[str, float] = {}
    seq2: dict[str, float] = {}
    for k, kind in enumerate(KINDS):
        if kind in STATE_KINDS:
            state[kind] += states[i][k]
            if slopes[i][k]:
                per_sample["activations"] = per_sample.get("activations", 0.0) + slopes[i][k]
        else:
            state["other"] += states[i][k]  # batch-independent bytes of a batch-sized kind
            per_sample[kind] = per_sample.get(kind, 0.0) + slopes[i][k]
        if squares is not None and squares[i][k]:
            target = kind if kind in SAMPLE_KINDS else "activations"
            seq2[target] = seq2.get(target, 0.0) + squares[i][k]
    entry: dict[str, Any] = {
        "phase": phase,
        "stateBytes": {k: int(round(v)) for k, v in state.items() if round(v)},
        "perSampleBytes": {k: round(v, 3) for k, v in per_sample.items() if round(v, 3)},
    }
    if squares is not None:
        entry["seqSquaredBytes"] = {k: round(v, 3) for k, v in seq2.items() if round(v, 3)}
    return entry


def _flops_seq_squared(r1: Run, r3: Run | None) -> float | None:
    """The fraction of forward FLOPs at ``L0`` that grows with ``L^2`` (attention scores)."""
    if r3 is None or r1.tokens is None or r3.tokens is None or not r1.flops or r3.tokens == r1.tokens:
        return None
    l0, l1 = float(r1.tokens), float(r3.tokens)
    beta = (r3.flops / l1 - r1.flops / l0) / (l1 - l0)
    return round(min(max(beta * l0 * l0 / r1.flops, 0.0), 1.0), 6)


def combine(r1: Run, r2: Run | None, r3: Run | None) -> dict[str, Any]:
    """The ``measured.training`` fields (``docs/measured.md``) from a run at the traced batch
    ``r1``, one at a larger batch ``r2`` and, for a token model, one at a shorter sequence ``r3``
    (each may be ``None`` where it could not run)."""
    states, slopes = _lines(r1, r2)
    squares = _squares(r1, r3, states, slopes)
    chosen = _chosen(states, slopes, squares, r1.phases, r1.batch)
    peaks = [_entry(i, states, slopes, squares, r1.phases[i]) for i in chosen]
    totals = [sum(states[i]) + r1.batch * sum(slopes[i]) for i in range(len(states))]
    top = max(range(len(totals)), key=totals.__getitem__)
    head = _entry(top, states, slopes, squares, r1.phases[top])
    linear = _aligned(r1, r2)
    saved = ((r2.saved_total - r1.saved_total) / (r2.batch - r1.batch)) if linear and r2 else r1.saved_total / r1.batch
    out: dict[str, Any] = {
        "batchSizes": [r1.batch] + ([r2.batch] if linear and r2 else []),
        "tokens": [r1.tokens] + ([r3.tokens] if squares is not None and r3 else []) if r1.tokens else None,
        "peakPhase": head["phase"],
        "stateBytes": head["stateBytes"],
        "activationBytesPerSample": round(sum(head["perSampleBytes"].values()), 3),
        "seqSquaredBytesPerSample": round(sum(head.get("seqSquaredBytes", {}).values()), 3) if squares else None,
        "savedBytesPerSample": round(saved, 3),
        "peaks": peaks,
    }
    fraction = _flops_seq_squared(r1, r3)
    if fraction is not None:
        out["flopsSeqSquaredFraction"] = fraction
    return out
