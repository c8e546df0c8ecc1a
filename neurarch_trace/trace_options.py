"""What a front end asks of the tracer, defined once: the trace options and their checks.

The command line's trace parser and the notebook magic are both built from :data:`TRACE_OPTIONS`,
as both are from :data:`~neurarch_trace.plan_options.PLAN_OPTIONS`: each :class:`Option` goes to
``argparse`` or to IPython's ``magic_arguments.argument`` through
:func:`~neurarch_trace.plan_options.add_options`, so the names, defaults, choices and value checks
cannot drift between the two. :class:`TraceChoices` reads the parsed values back and applies the
checks every front end makes before anything is built (the same one-line errors).

Each front end adds what only it has: the command line its positional ``target``
(:data:`TARGET`), ``--version`` and ``-o -`` (the graph on stdout); the magic a target that may
also be a Python expression in the notebook, ``--input`` values naming notebook variables (a
variant of :data:`INPUT`, same flag and default) and ``--no-save``.

This module imports no torch and no IPython.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from neurarch_trace.errors import NeurarchError, TargetError
from neurarch_trace.plan_options import Option

__all__ = [
    "DEPTH",
    "DEVICE",
    "DEVICES",
    "DTYPE",
    "HF_CLASS",
    "HF_CLASS_DEFAULT",
    "HF_DEFAULT_INPUT",
    "INPUT",
    "NAME",
    "OUTPUT",
    "TARGET",
    "TARGET_FORMS",
    "TRACE_OPTIONS",
    "VERBOSE",
    "WEIGHTS",
    "explain_parse_error",
    "TraceChoices",
]

#: The three target forms, for help texts and errors.
TARGET_FORMS = "path/to/file.py:Attr, package.module:attr or hf:<repo-id or local folder>"
#: The ``--input`` an ``hf:`` target gets when none is given: one sequence of 16 token ids.
HF_DEFAULT_INPUT = "1,16"
#: The transformers class that builds an ``hf:`` model unless ``--hf-class`` names another.
HF_CLASS_DEFAULT = "AutoModel"

#: ``--device`` choices, each with what it means (the help lists them in this order).
DEVICES: Dict[str, str] = {
    "auto": "the default: built on PyTorch's meta device first and traced there; with --no-training-step, "
            "traced on the CPU when its weights take at most 64 MiB; on the CPU with a note when the forward "
            "needs real values (cpu with --weights)",
    "cpu": "the CPU",
    "meta": "PyTorch's meta device: shapes, parameters and FLOPs without allocating weights or activations "
            "(no fallback)",
}

TARGET = Option(("target",), {
    "help": TARGET_FORMS,
})
INPUT = Option(("-i", "--input"), {
    "action": "append",
    "default": [],
    "metavar": "[NAME=]DIMS[:dtype]",
    "help": "one per forward argument, batch first, e.g. 1,3,224,224 or 1,16:long or attention_mask=1,16:long "
            f"(NAME= passes it as a keyword argument); hf: targets default to {HF_DEFAULT_INPUT}",
})
DTYPE = Option(("--dtype",), {
    "default": None,
    "help": "dtype of inputs without a suffix (default float32; long for hf:)",
})
OUTPUT = Option(("-o", "--output"), {
    "default": None,
    "metavar": "PATH",
    "help": "where to write the graph (default ./<name>.neurarch.json); '-' writes to stdout",
})
NAME = Option(("--name",), {
    "default": None,
    "help": "the graph's name (default: the attribute, class or factory name, or the repo name for hf:)",
})
DEPTH = Option(("--depth",), {
    "type": int,
    "default": None,
    "metavar": "N",
    "help": "stop descending at depth N (1 = the model's children); a container cut off there is one node",
})
DEVICE = Option(("--device",), {
    "choices": tuple(DEVICES),
    "default": None,
    "help": "where the model is built and traced: " + "; ".join(f"{k}, {v}" for k, v in DEVICES.items()),
})
WEIGHTS = Option(("--weights",), {
    "action": "store_true",
    "help": "hf: only: load the checkpoint's real weights instead of building from config.json alone",
})
HF_CLASS = Option(("--hf-class",), {
    "default": None,  # None: not given (HF_CLASS_DEFAULT for hf:, refused on other targets)
    "metavar": "CLASS",
    "help": f"hf: only: the transformers class that builds the model (default {HF_CLASS_DEFAULT}, the bare "
            "model without a task head; e.g. AutoModelForCausalLM adds the LM head)",
})
NO_TRAINING_STEP = Option(("--no-training-step",), {
    "dest": "training_step",
    "action": "store_false",
    "help": "skip the rehearsed training step (0.1 to 0.25 s of ResNet-50's cold start, 1.6 s of LLaMA-7B's on "
            "meta; see README's Speed); a plan then estimates memory from the layers' outputs",
})
VERBOSE = Option(("--verbose",), {
    "action": "store_true",
    "help": "print the full traceback on failure",
})

#: Every trace option, in the order the help lists them (the positional :data:`TARGET` apart).
TRACE_OPTIONS: Tuple[Option, ...] = (INPUT, DTYPE, OUTPUT, NAME, DEPTH, DEVICE, WEIGHTS, HF_CLASS, NO_TRAINING_STEP,
                                     VERBOSE)


@dataclass(frozen=True)
class TraceChoices:
    """The trace options as parsed, read with :meth:`from_args` from an argparse namespace, and the
    checks every front end applies before it builds anything."""

    target: str = ""
    input: Tuple[str, ...] = ()
    dtype: Optional[str] = None
    output: Optional[str] = None
    name: Optional[str] = None
    depth: Optional[int] = None
    device: Optional[str] = None
    weights: bool = False
    hf_class: Optional[str] = None  # as given; None: not given
    training_step: bool = True
    #: ``--finetune``, a plan option the trace reads too: ``lora``/``qlora`` also rehearse that step
    finetune: Optional[str] = None
    verbose: bool = False

    @classmethod
    def from_args(cls, args: Any, *, target: Optional[str] = None) -> TraceChoices:
        """From ``args`` (``args.target`` unless ``target`` is given, as the magic's joined words)."""
        return cls(
            target=getattr(args, "target", "") if target is None else target,
            input=tuple(getattr(args, "input", None) or ()),
            dtype=getattr(args, "dtype", None),
            output=getattr(args, "output", None),
            name=getattr(args, "name", None),
            depth=getattr(args, "depth", None),
            device=getattr(args, "device", None),
            weights=bool(getattr(args, "weights", False)),
            hf_class=getattr(args, "hf_class", None),
            training_step=bool(getattr(args, "training_step", True)),
            finetune=getattr(args, "finetune", None),
            verbose=bool(getattr(args, "verbose", False)),
        )

    @property
    def is_hf(self) -> bool:
        """True for an ``hf:`` target."""
        return self.target.startswith("hf:")

    @property
    def hf_class_name(self) -> str:
        """The transformers class an ``hf:`` target is built with: ``--hf-class``, else
        :data:`HF_CLASS_DEFAULT`."""
        return self.hf_class or HF_CLASS_DEFAULT

    def check(self) -> None:
        """Refuse the option values that cannot go together, before anything is built.

        Raises:
            TargetError: ``--depth`` below 0; ``--weights`` or ``--hf-class`` (even ``AutoModel``) on
                a target other than ``hf:``; an empty ``--name``; ``--weights`` with ``--device
                meta`` (the meta device holds no values).
        """
        if self.depth is not None and self.depth < 0:
            raise TargetError(f"--depth must be 0 or more, not {self.depth}")
        if self.weights and not self.is_hf:
            raise TargetError("--weights applies to hf: targets only: drop it (a file or module target builds its "
                              "own weights)")
        if self.hf_class is not None and not self.is_hf:
            raise TargetError("--hf-class applies to hf: targets only: drop it (a file or module target builds its "
                              "own model)")
        if self.name is not None and not self.name.strip():
            raise TargetError("--name needs a name, e.g. --name resnet50 (leave it out for the model's class name)")
        if self.weights and self.device == "meta":
            raise TargetError("--weights loads real weights, which the meta device cannot hold: drop --device meta")

    def input_texts(self, *, example: str = "") -> list:
        """The ``--input`` values as given, or :data:`HF_DEFAULT_INPUT` for an ``hf:`` target.

        Raises:
            NeurarchError: no ``--input`` for a target other than ``hf:`` (``example`` is added to
                the message's example, e.g. the magic's ``, or ... --input batch``).
        """
        texts = list(self.input) or ([HF_DEFAULT_INPUT] if self.is_hf else [])
        if not texts:
            raise NeurarchError(
                f"no --input given: pass one per forward argument, batch first, e.g. --input 1,3,224,224{example}"
            )
        return texts

    def build_device(self) -> str:
        """Where a model the front end builds (a target, or a class the magic calls) is built and
        traced: ``--device`` when given, else ``auto`` (:func:`neurarch_trace.api.trace_target`),
        or the CPU with ``--weights``."""
        return self.device or ("cpu" if self.weights else "auto")

    def dtype_name(self) -> str:
        """The dtype of shape inputs without a suffix: ``--dtype``, else ``long`` for ``hf:``, else
        ``float32`` (a name for :func:`neurarch_trace.inputs.parse_dtype`)."""
        return self.dtype or ("long" if self.is_hf else "float32")


def explain_parse_error(message: str) -> str:
    """argparse's ``message`` with the reason added where argparse's own is misleading: a value
    starting with ``-`` (``--input -1,3``) reads as an option, hence "expected one argument"."""
    if message == "argument -i/--input: expected one argument":
        return message + (" (sizes are positive, batch first: --input 1,3; a value that starts with '-' reads as an "
                          "option)")
    return message
