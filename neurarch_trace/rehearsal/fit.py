"""From rehearsed runs to the peak of a training step at any batch size and sequence length.

Every allocation of a run is a point of the step's memory curve (live bytes per kind). Runs at two
batch sizes ``b1 < b2`` allocate the same storages in the same order, only larger, so each point is
a line in the batch: ``live(b) = state + b x per_sample``, solved per point and per kind. For a
token model two more runs at a shorter sequence (``L1 = L0 / 2``, both batch sizes) give each
point's per-sample bytes at ``L1`` too, which splits them into a part linear in the sequence length
and a part that grows with its square (score matrices, masks):
``per_sample(L) = lin x L / L0 + sq x (L / L0)^2``. The batch-independent bytes are taken at ``L0``
(what grows with the length there, position tables, is small).

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


class _Fit:
    """The lines of the runs: per point (and, on demand, per point and kind) the batch-independent
    bytes, the bytes per sample at ``L0``, and the part of those growing with ``L^2``."""

    def __init__(self, r1: Run, r2: Run | None, r3: Run | None, r4: Run | None = None) -> None:
        self.r1, self.r2, self.r3 = r1, r2, r3
        self.linear = _aligned(r1, r2)
        self.squares = (_aligned(r1, r3) and r1.tokens is not None and r3 is not None and r3.tokens is not None
                        and r3.tokens != r1.tokens)
        # with a fourth run (the larger batch at the shorter length) the per-sample bytes at L1 are a
        # slope too, free of what the step makes once whatever the batch (position tables)
        self.r4 = r4 if self.squares and self.linear and _aligned(r3, r4) and r4 is not None else None
        # totals per point (the per-kind split is made only for the points kept, by kinds())
        totals1 = [sum(p) for p in r1.points]
        if self.linear:
            assert r2 is not None
            db = r2.batch - r1.batch
            self.slopes = [(sum(p2) - t1) / db for p2, t1 in zip(r2.points, totals1)]
            self.states = [t1 - r1.batch * a for t1, a in zip(totals1, self.slopes)]
        else:
            self.states = [float(sum(p[k] for k in _STATE)) for p in r1.points]
            self.slopes = [sum(p[k] for k in _SAMPLE) / r1.batch for p in r1.points]
        self.sqs = [0.0] * len(totals1)
        if self.squares:
            assert r3 is not None and r1.tokens is not None and r3.tokens is not None
            l0, l1 = float(r1.tokens), float(r3.tokens)
            for i, p3 in enumerate(r3.points):
                if self.r4 is not None:
                    at_l1 = (sum(self.r4.points[i]) - sum(p3)) / (self.r4.batch - r3.batch)
                else:
                    at_l1 = (sum(p3) - self.states[i]) / r3.batch
                beta = (at_l1 / l1 - self.slopes[i] / l0) / (l1 - l0)
                self.sqs[i] = min(max(beta * l0 * l0, 0.0), max(self.slopes[i], 0.0))

    def kinds(self, i: int) -> tuple[list[float], list[float], list[float]]:
        p1 = self.r1.points[i]
        if self.linear:
            assert self.r2 is not None
            p2, db = self.r2.points[i], self.r2.batch - self.r1.batch
            slope = [(y - x) / db for x, y in zip(p1, p2)]
            state = [x - self.r1.batch * a for x, a in zip(p1, slope)]
        else:
            state = [float(p1[k]) if k in _STATE else 0.0 for k in range(len(KINDS))]
            slope = [p1[k] / self.r1.batch if k in _SAMPLE else 0.0 for k in range(len(KINDS))]
        sq = [0.0] * len(KINDS)
        if self.squares:
            assert self.r3 is not None and self.r1.tokens is not None and self.r3.tokens is not None
            l0, l1, p3 = float(self.r1.tokens), float(self.r3.tokens), self.r3.points[i]
            p4 = self.r4.points[i] if self.r4 is not None else None
            for k, at_l0 in enumerate(slope):
                if p4 is not None and self.r4 is not None:
                    at_l1 = (p4[k] - p3[k]) / (self.r4.batch - self.r3.batch)
                else:
                    at_l1 = (p3[k] - state[k]) / self.r3.batch
                beta = (at_l1 / l1 - at_l0 / l0) / (l1 - l0)
                sq[k] = min(max(beta * l0 * l0, 0.0), max(at_l0, 0.0))
        return state, slope, sq


def _front(totals: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The points that are the largest at some batch ``b >= 0`` of ``state + b x slope``: the upper
    convex hull of ``(slope, state)``, from the largest state (batch 0) to the largest slope."""
    pareto: list[tuple[float, float, int]] = []
    best = float("-inf")
    for state, slope, index in sorted(totals, key=lambda t: (-t[0], -t[1])):
        if slope > best:
            pareto.append((state, slope, index))
            best = slope
    hull: list[tuple[float, float, int]] = []
    for point in pareto:  # slopes increase, states decrease: keep the turns of the upper hull
        while len(hull) >= 2:
            (s1, a1, _), (s2, a2, _) = hull[-2], hull[-1]
            # hull[-1] is never the largest when its neighbours cross before it overtakes hull[-2]:
            # (s1 - s2) / (a2 - a1) >= (s2 - s3) / (a3 - a2)
            if (s1 - s2) * (point[1] - a2) >= (s2 - point[0]) * (a2 - a1):
                hull.pop()
            else:
                break
        hull.append(point)
    return hull


def _chosen(fit: _Fit, phases: list[str], batch: int) -> list[int]:
    chosen: dict[int, None] = {}
    batches = sorted(set(GRID_BATCHES) | {batch})
    for ratio in GRID_RATIOS if fit.squares else (1.0,):
        per = [(a - q) * ratio + q * ratio * ratio for a, q in zip(fit.slopes, fit.sqs)]
        front = _front([(s, a, i) for i, (s, a) in enumerate(zip(fit.states, per))])
        for b in batches:
            chosen.setdefault(max(front, key=lambda t: t[0] + b * t[1])[2], None)
    for phase in dict.fromkeys(phases):  # each phase's own largest points
        front = _front([(fit.states[i], fit.slopes[i], i) for i, p in enumerate(phases) if p == phase])
        for b in batches:
            chosen.setdefault(max(front, key=lambda t: t[0] + b * t[1])[2], None)
    return sorted(chosen)


def _entry(fit: _Fit, i: int, phase: str) -> dict[str, Any]:
    states, slopes, squares = fit.kinds(i)
    state = {kind: 0.0 for kind in STATE_KINDS}
    per_sample: dict[str, float] = {}
    seq2: dict[str, float] = {}
    for k, kind in enumerate(KINDS):
        if kind in STATE_KINDS:
            state[kind] += states[k]
            if slopes[k]:
                per_sample["activations"] = per_sample.get("activations", 0.0) + slopes[k]
        else:
            state["other"] += states[k]  # batch-independent bytes of a batch-sized kind
            per_sample[kind] = per_sample.get(kind, 0.0) + slopes[k]
        if squares[k]:
            target = kind if kind in SAMPLE_KINDS else "activations"
            seq2[target] = seq2.get(target, 0.0) + squares[k]
    entry: dict[str, Any] = {
        "phase": phase,
        "stateBytes": {k: int(round(v)) for k, v in state.items() if round(v)},
        "perSampleBytes": {k: round(v, 3) for k, v in per_sample.items() if round(v, 3)},
    }
    if fit.squares:
        entry["seqSquaredBytes"] = {k: round(v, 3) for k, v in seq2.items() if round(v, 3)}
    return entry


def _flops_seq_squared(r1: Run, r3: Run | None) -> float | None:
    """The fraction of forward FLOPs at ``L0`` that grows with ``L^2`` (attention scores)."""
    if r3 is None or r1.tokens is None or r3.tokens is None or not r1.flops or r3.tokens == r1.tokens:
        return None
    l0, l1 = float(r1.tokens), float(r3.tokens)
    beta = (r3.flops / l1 - r1.flops / l0) / (l1 - l0)
    return round(min(max(beta * l0 * l0 / r1.flops, 0.0), 1.0), 6)


def combine(r1: Run, r2: Run | None, r3: Run | None, r4: Run | None = None, *,
            batch: int | None = None) -> dict[str, Any]:
    """The ``measured.training`` fields (``docs/measured.md``) from a run at the traced batch
    ``r1``, one at a larger batch ``r2`` and, for a token model, runs at a shorter sequence at both
    batches, ``r3`` and ``r4`` (each may be ``None`` where it could not run). The headline fields
    (``peakPhase``, ``stateBytes``, ...) are at ``batch`` (default: ``r1``'s)."""
    fit = _Fit(r1, r2, r3, r4)
    batch = batch or r1.batch
    peaks = [_entry(fit, i, r1.phases[i]) for i in _chosen(fit, r1.phases, batch)]
    top = max(range(len(fit.states)), key=lambda i: fit.states[i] + batch * fit.slopes[i])
    head = _entry(fit, top, r1.phases[top])
    saved = r1.saved_total / r1.batch  # the layer-by-layer record is made in the first run only
    tokens = None
    if r1.tokens is not None:
        tokens = [r1.tokens] + ([r3.tokens] if fit.squares and r3 is not None else [])
    out: dict[str, Any] = {
        "batchSizes": [r1.batch] + ([r2.batch] if fit.linear and r2 is not None else []),
        "tokens": tokens,
        "peakPhase": head["phase"],
        "stateBytes": head["stateBytes"],
        "activationBytesPerSample": round(sum(head["perSampleBytes"].values()), 3),
        "seqSquaredBytesPerSample": round(sum(head.get("seqSquaredBytes", {}).values()), 3) if fit.squares else None,
        "savedBytesPerSample": round(saved, 3),
        "peaks": peaks,
        "operators": r1.operators,
    }
    fraction = _flops_seq_squared(r1, r3)
    if fraction is not None:
        out["flopsSeqSquaredFraction"] = fraction
    return out
