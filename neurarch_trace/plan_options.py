"""What a front end asks of the plan service, defined once: the plan options and the consent notice.

Every front end builds its plan options from :data:`PLAN_OPTIONS`: the command line hands each
:class:`Option` to ``argparse`` (``parser.add_argument(*option.flags, **option.kwargs)``), the
notebook magic to IPython's ``magic_arguments.argument`` (which takes the same arguments), through
:func:`add_options`. :class:`PlanChoices` reads the parsed values back and checks them before
anything is traced or sent; :func:`consent_notice` is the sentence shown before anything leaves the
machine. This module imports no torch and no IPython.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from neurarch_trace.contract import layer_count, read_graph
from neurarch_trace.errors import NeurarchError
from neurarch_trace.plan_client import (
    ATTENTION_KINDS,
    FAMILY_X,
    FINETUNE_MODES,
    GPU_COUNT,
    MAX_GPUS,
    MAX_USD_PER_HOUR,
    check_api,
    gpu_count,
    name_first,
)
from neurarch_trace.text import plural

__all__ = [
    "ATTENTION",
    "BASE",
    "CONTEXT",
    "FAIL_ON_BLOCK",
    "FINETUNE",
    "GPU",
    "NOTEBOOK_PLAN_OPTIONS",
    "PLAN",
    "PLAN_OPTIONS",
    "REPLAN_SHARE",
    "SEQ_LEN",
    "SHARE",
    "USD_PER_HOUR",
    "Option",
    "PlanChoices",
    "add_options",
    "block_verdict",
    "button_label",
    "consent_notice",
    "what_is_sent",
]

@dataclass(frozen=True)
class Option:
    """One command-line option: its ``flags`` and the keyword arguments of ``add_argument``."""

    flags: Tuple[str, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        """The attribute the parsed value lands on (``--fail-on-block`` -> ``fail_on_block``)."""
        return self.kwargs.get("dest") or self.flags[-1].lstrip("-").replace("-", "_")


#: The most tokens ``seq_len`` and ``context`` may be: the reference service refuses more
#: (``neurarch_trace/server/schemas.py``), so the command line says so before sending anything.
MAX_TOKENS = 2**31


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of tokens")
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"{value:,} tokens is more than the plan API takes (at most 2^31, "
                                         f"{MAX_TOKENS:,})")
    return value


def _finetune(text: str) -> str:
    """A fine-tuning mode, in any case (``LoRA``, ``QLoRA``), as ``--gpu`` takes card names."""
    if text.lower() not in FINETUNE_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fine-tuning mode: use full, lora or qlora")
    return text.lower()


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars per GPU-hour") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive price per GPU-hour")
    if value > MAX_USD_PER_HOUR:
        raise argparse.ArgumentTypeError(f"${value:,g} per GPU-hour is more than the plan API takes (at most "
                                         f"${MAX_USD_PER_HOUR:,}); give the price of one GPU for one hour")
    return value


def _gpu(text: str) -> str:
    """A ``--gpu`` value: a card name, with ``xN`` for N of them. Which names exist is the service's
    table; refused here, before a trace: a count of 0, one above :data:`MAX_GPUS`, a negative one
    after a digit or a space (``H100x-1``; in ``RTX-4090`` the minus is part of the name), an x with
    no count (``H100x``; the x of ``RTX`` is the name's) and two counts (``H100x8x2``). A count
    written first, as the card writes clusters (``8x H100``), is moved after the name."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no card: give one such as H100, H100x8 or RTX-4090")
    shown = text.strip()  # the messages quote what was typed
    text = name_first(text)  # 8x H100, as the card writes a cluster
    stripped = text.strip()
    last = stripped[-1]
    if last in "xX\u00d7*" and stripped[:-1].strip().isdigit():  # 2x: a count, and no card
        n = int(stripped[:-1]) if 1 <= int(stripped[:-1]) <= MAX_GPUS else 8
        raise argparse.ArgumentTypeError(f"{shown!r} names no card: give one with the count, "
                                         f"e.g. {n}x H100 or H100x{n}")
    if len(stripped) > 1 and last in "xX\u00d7*" and not (last in "xX" and FAMILY_X.search(stripped[:-1])):
        before = stripped[:-1].rstrip()
        if gpu_count(before) is not None:  # H100 x 8 x: a count, then an x more
            raise argparse.ArgumentTypeError(f"{shown!r} ends in an x with nothing after it: leave it out, "
                                             f"e.g. {before}")
        raise argparse.ArgumentTypeError(f"{shown!r} has no count after the {last}: give one, "
                                         f"e.g. {before}x8, or the card alone")
    count = gpu_count(text)
    inner = GPU_COUNT.fullmatch(stripped) if count is not None else None
    if inner is not None and gpu_count(inner.group("name")) is not None:
        card = GPU_COUNT.fullmatch(inner.group("name").strip())
        raise argparse.ArgumentTypeError(f"{shown!r} gives two counts: give the card once, with the number of "
                                         f"cards after the x, e.g. {card.group('name').strip()}x8")  # type: ignore[union-attr]
    if count == 0:
        raise argparse.ArgumentTypeError(f"{shown!r} asks for 0 cards: give 1 or more after the x, e.g. H100x8")
    if count is not None and count > MAX_GPUS:
        name = GPU_COUNT.fullmatch(stripped).group("name")  # type: ignore[union-attr]
        raise argparse.ArgumentTypeError(f"{shown!r} asks for {count:,} cards; a plan uses 1 to {MAX_GPUS} "
                                         f"(eight 8-GPU nodes): give fewer after the x, e.g. {name}x{MAX_GPUS}")
    if count is not None and count < 0:
        raise argparse.ArgumentTypeError(f"{shown!r} asks for a negative number of cards: give 1 to {MAX_GPUS} "
                                         f"after the x, e.g. H100x8")
    return stripped


PLAN = Option(("--plan",), {
    "action": "store_true",
    "help": "send the graph (shapes and hyperparameters, never weights or code) to the plan service "
            "(NEURARCH_API, default www.neurarch.com) and show the card it returns; nothing is sent "
            "without --plan or --share",
})
SHARE = Option(("--share",), {
    "action": "store_true",
    "help": "implies --plan; also store the graph and card at a public, unguessable URL (anyone with "
            "the link can open it; never weights or source) and show 'Share: <url>' last",
})
#: ``--share`` of ``neurarch-trace plan``, which always plans.
REPLAN_SHARE = Option(("--share",), {
    "action": "store_true",
    "help": "also store the graph and card at a public, unguessable URL (anyone with the link can open it; "
            "never weights or source) and show 'Share: <url>' last",
})
BASE = Option(("--base",), {
    "metavar": "FILE",
    "default": None,
    "help": "a second .neurarch.json graph, the design being changed from; the card adds a diff",
})
FAIL_ON_BLOCK = Option(("--fail-on-block",), {
    "action": "store_true",
    "help": "exit 2 when the plan reports a blocker (the graph would not run)",
})
SEQ_LEN = Option(("--seq-len",), {
    "type": _positive_int,
    "default": None,
    "metavar": "N",
    "help": "tokens per sample to size a token model for (default: the traced length)",
})
ATTENTION = Option(("--attention",), {
    "type": str.lower,  # SDPA, Eager: in any case, as --gpu takes card names
    "choices": ATTENTION_KINDS,
    "default": None,
    "help": "the attention kernel training will use (default sdpa); only eager keeps the attention "
            "score matrices in memory",
})

FINETUNE = Option(("--finetune",), {
    "type": _finetune,
    "default": None,
    "metavar": "MODE",
    "help": "what the card's fit and cost size: full training (default), lora or qlora fine-tuning; "
            "lora and qlora also rehearse that step into the graph (without --plan too, for a later plan)",
})
CONTEXT = Option(("--context",), {
    "type": _positive_int,
    "default": None,
    "metavar": "N",
    "help": "tokens of context to size serving for (default: the length of a learned position table, else "
            "--seq-len, else the traced length)",
})
GPU = Option(("--gpu",), {
    "type": _gpu,
    "default": None,
    "metavar": "NAME[xN]",
    "help": "plan for this card or cluster only, e.g. H100, H100x8, RTX-4090 (cards you own included)",
})
USD_PER_HOUR = Option(("--usd-per-hour",), {
    "type": _price,
    "default": None,
    "metavar": "USD",
    "help": "price per GPU-hour of the --gpu card, for a card without a list price",
})

#: Every plan option, in the order the help lists them.
PLAN_OPTIONS: Tuple[Option, ...] = (PLAN, SHARE, BASE, FAIL_ON_BLOCK, SEQ_LEN, ATTENTION, FINETUNE, CONTEXT, GPU,
                                    USD_PER_HOUR)
#: The options that size the plan and need ``--plan``/``--share``: (flag, attribute).
SIZING_FLAGS: Tuple[Tuple[str, str], ...] = (("--seq-len", "seq_len"), ("--attention", "attention"),
                                             ("--finetune", "finetune"), ("--context", "context"),
                                             ("--gpu", "gpu"), ("--usd-per-hour", "usd_per_hour"))
#: The plan options the notebook magic takes: all of them, as the command line's trace command.
NOTEBOOK_PLAN_OPTIONS: Tuple[Option, ...] = PLAN_OPTIONS


def add_options(add: Callable[..., Any], options: Sequence[Option] = PLAN_OPTIONS) -> list:
    """``add(*option.flags, **option.kwargs)`` for each option, in order; returns the results.

    ``add`` is ``parser.add_argument`` (or an argument group's) for argparse, or
    ``IPython.core.magic_arguments.argument`` for a magic (its results are decorators).
    """
    return [add(*option.flags, **dict(option.kwargs)) for option in options]


@dataclass(frozen=True)
class PlanChoices:
    """The plan options as parsed: read with :meth:`from_args` from an argparse namespace (any
    option the front end does not take reads as its default)."""

    plan: bool = False
    share: bool = False
    base: Optional[str] = None
    fail_on_block: bool = False
    seq_len: Optional[int] = None
    attention: Optional[str] = None
    finetune: Optional[str] = None
    context: Optional[int] = None
    gpu: Optional[str] = None
    usd_per_hour: Optional[float] = None

    @classmethod
    def from_args(cls, args: Any) -> PlanChoices:
        return cls(
            plan=bool(getattr(args, "plan", False)),
            share=bool(getattr(args, "share", False)),
            base=getattr(args, "base", None),
            fail_on_block=bool(getattr(args, "fail_on_block", False)),
            seq_len=getattr(args, "seq_len", None),
            attention=getattr(args, "attention", None),
            finetune=getattr(args, "finetune", None),
            context=getattr(args, "context", None),
            gpu=getattr(args, "gpu", None),
            usd_per_hour=getattr(args, "usd_per_hour", None),
        )

    @property
    def sends(self) -> bool:
        """True when the user asked for anything to be sent (``--plan`` or ``--share``)."""
        return self.plan or self.share

    @property
    def flag(self) -> str:
        """The flag that asked for the plan, for messages: ``--share`` or ``--plan``."""
        return "--share" if self.share else "--plan"

    def check_flags(self, *, later: bool = False) -> None:
        """Refuse the options that act on a plan when none is asked for.

        ``later``: the front end can plan after the trace (the notebook's result and its plan
        button), so ``--base`` and the sizing options are kept for that plan instead of refused;
        ``--fail-on-block`` still needs ``--plan``/``--share`` (there is no verdict to act on).

        Raises:
            NeurarchError: ``--base``, ``--fail-on-block`` or a sizing option (``--seq-len``,
                ``--attention``, ``--context``, ``--gpu``, ``--usd-per-hour``) without
                ``--plan``/``--share``; ``--usd-per-hour`` without ``--gpu``. ``--finetune`` is
                taken alone: the trace rehearses its step into the graph for a later ``plan``.
        """
        if (self.sends or later) and self.usd_per_hour is not None and self.gpu is None:
            raise NeurarchError("--usd-per-hour needs --gpu: it prices the card named there")
        if self.sends:
            return
        if not later:
            if self.base is not None:
                raise NeurarchError("--base needs --plan or --share: it is what the plan's diff compares to")
            for flag, dest in SIZING_FLAGS:
                # --finetune lora|qlora also rehearses that step into the graph, for a plan made later
                if dest != "finetune" and getattr(self, dest) is not None:
                    raise NeurarchError(f"{flag} needs --plan or --share: it sizes the plan")
        if self.fail_on_block:
            raise NeurarchError("--fail-on-block needs --plan or --share: it reads the plan's verdict")

    def prepare(self, *, later: bool = False) -> Optional[dict]:
        """Before any tracing: check the service address and load the ``--base`` graph.

        Returns the base graph, or None. ``later`` as in :meth:`check_flags`: the base graph is
        loaded for a plan asked after the trace too (the service address is checked only when a
        plan is asked now). Raises what :meth:`check_flags` raises,
        :class:`~neurarch_trace.plan_client.PlanError`
        for a ``NEURARCH_API`` that is not an http(s) URL, and :class:`~neurarch_trace.errors.GraphError`
        (``--base: ...``) for a base file that is missing, not JSON or not a graph.
        """
        self.check_flags(later=later)
        if not self.sends and not later:
            return None
        if self.sends:
            check_api()
        if self.base is None:
            return None
        try:
            return read_graph(os.path.expanduser(self.base))
        except NeurarchError as err:
            raise type(err)(f"--base: {err}") from err

    def sizing(self) -> Dict[str, Any]:
        """The sizing options (``seq_len``, ``attention``, ``finetune``, ``context``, ``gpu``,
        ``usd_per_hour``) as keyword arguments of
        :func:`~neurarch_trace.plan_client.request_plan`, None where not given."""
        return {dest: getattr(self, dest) for _, dest in SIZING_FLAGS}

    def request_options(self) -> Dict[str, Any]:
        """The keyword arguments of :func:`~neurarch_trace.plan_client.request_plan` they set."""
        return {"share": self.share, **self.sizing()}

    def ignored(self, plan: Any) -> List[str]:
        """What the returned ``plan`` did not apply of these options, one sentence each: a token
        length (``--seq-len``, ``--context``) given for a model whose input is not tokens
        (``plan.model.input.kind``). Empty when everything applied or the plan does not say."""
        model = plan.get("model") if isinstance(plan, dict) else None
        given = model.get("input") if isinstance(model, dict) else None
        kind = given.get("kind") if isinstance(given, dict) else None
        if not isinstance(kind, str) or kind == "tokens":
            return []
        lengths = (("--seq-len", self.seq_len), ("--context", self.context))
        flags = [flag for flag, value in lengths if value is not None]
        if not flags:
            return []
        what = {"image": "images", "other": "no tokens", "unknown": "an input of unknown shape"}.get(kind, kind)
        two = len(flags) > 1
        return [f"{' and '.join(flags)} {'size' if two else 'sizes'} a token model; this model takes {what}: "
                f"{'they change' if two else 'it changes'} nothing on the card"]


def block_verdict(blocked: Optional[bool], blockers: Sequence[str]) -> Optional[str]:
    """What ``--fail-on-block`` says of a plan, without the front end's consequence (the command
    line adds ``; exit 2``): None when the plan reports no blocker, ``the plan reports 2 blockers``
    when it reports some, and a sentence saying it cannot tell when the plan carries no verdict
    (``blocked`` None; :func:`~neurarch_trace.plan_client.plan_blocked`)."""
    if blocked is None:
        return "the plan carries no plan.run verdict, so --fail-on-block cannot tell whether the graph is blocked"
    if not blocked:
        return None
    n = len(blockers)
    return f"the plan reports {plural(n, 'blocker') if n else 'that the graph would not run'}"


# --- consent ----------------------------------------------------------------------------------


def what_is_sent(graph: Mapping[str, Any], base: Optional[Mapping[str, Any]] = None, *, detail: str = "") -> str:
    """``the graph (68 layers)`` (``detail`` after the count: ``; no weights``), and ``the base
    graph (N layers)`` when there is one."""
    what = f"the graph ({plural(layer_count(graph), 'layer')}{detail})"
    if base is not None:
        what += f" and the base graph ({plural(layer_count(base), 'layer')})"
    return what


def consent_notice(graph: Mapping[str, Any], base: Optional[Mapping[str, Any]], *, share: bool, host: str,
                   notebook: bool = False) -> str:
    """The sentence shown before anything is sent: what, to which host, and what ``share`` means.

    The command line's: ``Sending the graph (62 layers) to HOST for the plan; add --share for a
    public link.``; the notebook's (``notebook=True``) also says what a graph holds and that
    nothing is stored without ``--share``.
    """
    detail = "; shapes and hyperparameters, no weights" if notebook else ""
    if share:
        purpose = "for the plan and a public share link (anyone with the link can open it)"
    elif notebook:
        purpose = "for the plan; nothing is stored (add --share for a public link)"
    else:
        purpose = "for the plan; add --share for a public link"
    return f"Sending {what_is_sent(graph, base, detail=detail)} to {host} {purpose}."


def button_label(graph: Mapping[str, Any], *, has_base: bool, host: str, share: bool, planned: bool) -> str:
    """The notebook's plan button, short enough for one button: ``Get the plan: send the graph
    (68 layers, no weights) to HOST``; ``planned``: a card is shown and only the link is missing."""
    n = plural(layer_count(graph), "layer")
    what = f"the graphs ({n} and the base, no weights)" if has_base else f"the graph ({n}, no weights)"
    if planned:
        return f"Get a public share link: send {what} to {host}"
    if share:
        return f"Get the plan and a public link: send {what} to {host}"
    return f"Get the plan: send {what} to {host}"
