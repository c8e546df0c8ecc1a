"""The request's sizing options (``finetune``, ``context``, ``gpu``, ``usd_per_hour``) and what the
plan sizes from them: the training setup of the mode (:mod:`.finetune`, :mod:`.fit`), its cost
(:mod:`.cost`) and the serving setup (:mod:`.serve`). :mod:`.sizing_fields` turns it into the
plan's ``fit``, ``cost``, ``finetune`` and ``serve`` objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from neurarch_trace.planner.analysis import Analysis
from neurarch_trace.planner.blocks import Blocks, find_blocks
from neurarch_trace.planner.cost import ClusterCost, cluster_cost, training_unit
from neurarch_trace.planner.finetune import DEFAULT_RANK, MODES, Tuning, tuning
from neurarch_trace.planner.fit import Choice, choose, largest_batch, smallest_cluster
from neurarch_trace.planner.gpus import Gpu, GpuRequest, GpuTable, gpu_table, parse_gpu
from neurarch_trace.planner.serve import Serve, serve_all
from neurarch_trace.planner.steptime import step_operators
from neurarch_trace.planner.strategy import Setup, footprint

__all__ = ["MAX_CONTEXT", "MAX_USD_PER_HOUR", "OptionError", "Options", "Sizing", "check_options", "sizing"]

#: Largest context accepted (2^31 tokens, as ``seq_len``).
MAX_CONTEXT = 2**31
#: Largest price per GPU-hour accepted: above any GPU's on-demand price by far.
MAX_USD_PER_HOUR = 10_000.0


class OptionError(ValueError):
    """A sizing option the plan cannot take; ``str(err)`` is one sentence saying which and why."""


@dataclass(frozen=True)
class Options:
    """The checked options: ``finetune`` mode, LoRA ``rank``, serving ``context`` (``None``: the
    model's default), the requested hardware (``None``: any rented card) and its price."""

    finetune: str = "full"
    rank: int = DEFAULT_RANK
    context: int | None = None
    gpu: GpuRequest | None = None
    usd_per_hour: float | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(finetune: str | None = None, context: int | None = None, gpu: str | None = None,
                  usd_per_hour: float | None = None, table: GpuTable | None = None) -> Options:
    """The options as :class:`Options`; raises :class:`OptionError` (a ``ValueError``) with one
    sentence for a bad value:
    a ``finetune`` not in ``full``/``lora``/``qlora`` (in any case), a ``context`` that is not a positive integer
    of at most 2^31, an unknown ``gpu`` (the sentence names the known cards), a ``usd_per_hour``
    that is not a positive number of at most :data:`MAX_USD_PER_HOUR`, or a ``usd_per_hour``
    without a ``gpu`` to price."""
    try:
        return _options(finetune, context, gpu, usd_per_hour, table)
    except OptionError:
        raise
    except ValueError as exc:  # parse_gpu's sentence
        raise OptionError(str(exc)) from None


def _options(finetune: str | None, context: int | None, gpu: str | None, usd_per_hour: float | None,
             table: GpuTable | None) -> Options:
    mode = "full" if finetune is None else finetune.lower() if isinstance(finetune, str) else finetune
    if mode not in MODES:  # any case, as the command line's --finetune
        raise OptionError(f"finetune must be one of full, lora or qlora, not {finetune!r}")
    if context is not None and (not _is_int(context) or not 1 <= context <= MAX_CONTEXT):
        raise OptionError(f"context must be a positive integer of at most 2^31 tokens, not {context!r}")
    if usd_per_hour is not None:
        if (isinstance(usd_per_hour, bool) or not isinstance(usd_per_hour, (int, float))
                or not math.isfinite(usd_per_hour) or not 0 < usd_per_hour <= MAX_USD_PER_HOUR):
            raise OptionError(f"usd_per_hour must be a positive number of dollars per GPU-hour of at most "
                              f"{MAX_USD_PER_HOUR:,.0f}, not {usd_per_hour!r}")
        if gpu is None:
            raise OptionError("usd_per_hour prices the card named by gpu: give gpu too")
    if gpu is not None and not isinstance(gpu, str):
        raise OptionError(f"gpu must be a card name such as H100 or H100x8, not {gpu!r}")
    request = parse_gpu(gpu, table, usd_per_hour) if gpu is not None else None
    return Options(mode, DEFAULT_RANK, context, request, usd_per_hour)


@dataclass
class Sizing:
    """Everything sized for one request. ``choice``: the training setup (``None`` when nothing
    holds one step on up to 64 GPUs; then ``needs`` is ``(gpus or None, setup, card)`` for the
    smallest ZeRO-3 cluster of the largest card). ``singles``: each card's own single-GPU fit
    ``(card, setup, batch)`` in the mode. ``serves``: serving in each precision; ``serve`` the one
    the card shows (bf16 when anything holds it)."""

    options: Options
    tuning: Tuning
    blocks: Blocks
    cards: tuple[Gpu, ...]
    choice: Choice | None
    cost: ClusterCost | None
    needs: tuple[int | None, Setup, Gpu] | None
    singles: list[tuple[Gpu, Setup, int]] = field(default_factory=list)
    serves: list[Serve] = field(default_factory=list)
    mfu: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def serve(self) -> Serve:
        return next((s for s in self.serves if s.fits), self.serves[0])

    @property
    def setup(self) -> Setup:
        """The setup the plan's peak is quoted for: the choice's, else one card at batch 1."""
        return self.choice.setup if self.choice is not None else self.singles[0][1]


def sizing(a: Analysis, options: Options, table: GpuTable | None = None) -> Sizing:
    """Size ``a`` for ``options``."""
    table = table or gpu_table()
    blocks = find_blocks(a.structure, a.structure_counts)
    step = tuning(a, blocks, options.finetune, options.rank)
    cards = (options.gpu.gpu,) if options.gpu is not None else table.cards
    fixed = options.gpu.gpus if options.gpu is not None else None
    choice = choose(step.states, step.acts, step.train_flops, cards, table, fixed, options.gpu is not None,
                    step.others, one_card=step.mode != "full")
    mfu = a.mfu
    cost = None
    if choice is not None:
        operators = step_operators(a.graph.measured.get("training")).count(step.mode, choice.setup.checkpoint)
        cost = cluster_cost(choice.train_flops, training_unit(a.work), choice.gpu, choice.gpus, mfu,
                            a.flops_per_sample, choice.batch, operators)
    needs = None
    if choice is None:
        largest = cards[0] if options.gpu is not None else table.largest
        n, setup = smallest_cluster(step.states, step.acts, largest, table, step.others)
        needs = (n, setup, largest)
    singles = []
    for gpu in cards:
        setup = footprint(step.states, step.acts, "single", 1, others=step.others)
        singles.append((gpu, setup, largest_batch(setup, gpu, table.headroom)))
    serves = serve_all(a, cards, table, options.context, fixed)
    notes = [step.note] if step.note else []
    layout = serves[0].layout
    if serves[0].asked is not None:
        heads = f"{layout.heads} query and {layout.kv_heads} key/value heads" if layout.heads else "its heads"
        notes.append(f"serving: sized on {serves[0].gpus} of the {fixed} GPUs, the most this model splits over: "
                     f"tensor parallelism of at most 8 that divides {heads}, times at most one pipeline "
                     f"stage per layer ({layout.layers})")
    if a.work.kind == "tokens" and not layout.layers:
        notes.append("serving: no decoder key/value projections found (k_proj/v_proj, key/value, k/v, c_attn, "
                     "qkv_proj, or an attention layer), so no KV cache is counted")
    return Sizing(options, step, blocks, cards, choice, cost, needs, singles, serves, mfu, notes)
