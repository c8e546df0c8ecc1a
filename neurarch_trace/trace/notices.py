"""Warnings raised while the model's forward runs, told as the model's, not the tracer's.

PyTorch attributes a warning to the frame ``stacklevel`` above its ``warnings.warn``; during the
trace the frames in between include the tracer's flow mode and hooks, so a warning the user's own
``F.softmax(x)`` provokes was shown as ``neurarch_trace/trace/provenance.py:93``. :func:`model_warnings`
catches the warnings of the forward (under the filters in force, so an ignored warning stays
ignored) and, after it, issues each once (same category, text and place) again as a
:class:`~neurarch_trace.errors.TraceWarning` at the innermost frame of the model's own code, the
file and line a user can open, with the layer that was running: ``good.py:19: TraceWarning:
Implicit dimension choice for softmax has been deprecated ... (in layer 'head', Linear)``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from neurarch_trace.errors import TraceWarning

__all__ = ["model_warnings", "warn_no_output", "warn_positions_past_table", "warn_unused_inputs"]

#: Frames from these folders are not the model's: the standard library's warnings, torch, the tracer.
_NOT_THE_MODEL = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (
    sys.modules["warnings"], sys.modules["torch"], sys.modules["neurarch_trace"]))


def _model_frame(filename: str, lineno: int) -> Tuple[str, int, str]:
    """``(file, line, module name)`` of the innermost frame outside torch, the tracer and the
    standard library; the warning's own place when there is none."""
    frame: Optional[Any] = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_NOT_THE_MODEL) and not path.startswith("<"):
            return path, frame.f_lineno, str(frame.f_globals.get("__name__") or "")
        frame = frame.f_back
    return filename, lineno, ""


Caught = Tuple[str, type, str, int, str, str]


@contextlib.contextmanager
def model_warnings(running: Callable[[], str]) -> Iterator[List[Caught]]:
    """Within the block, warnings are caught with the place in the model's code that caused them
    and ``running()`` (the layer running then, ``in layer 'fc' (Linear)``, or ``""``); after it
    each distinct one is issued again there (see the module docstring). Yields the list of what
    was caught."""
    caught: List[Caught] = []

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        place, number, module = _model_frame(filename, lineno)
        caught.append((str(message), category, place, number, module, running()))

    with warnings.catch_warnings():
        warnings.showwarning = show
        try:
            yield caught
        finally:
            warnings.showwarning = show  # the forward may have replaced it
    _reissue(caught)


def _reissue(caught: List[Caught]) -> None:
    seen: Dict[Tuple[str, type, str, int], None] = {}
    for message, category, place, number, module, running in caught:
        key = (message, category, place, number)
        if key in seen:
            continue
        seen[key] = None
        text = f"{message} ({running}; {category.__name__})" if running else f"{message} ({category.__name__})"
        name = module or os.path.splitext(os.path.basename(place))[0]
        warnings.warn_explicit(text, TraceWarning, place, number, module=name, registry={})


def _forward_place(model: Any) -> Tuple[str, int]:
    """``(file, first line)`` of the model class's ``forward``, through the decorators that wrap
    it (transformers' ``@can_return_tuple``, ``functools.wraps``: ``inspect.unwrap``)."""
    forward = getattr(type(model), "forward", None)
    try:
        forward = inspect.unwrap(forward) if forward is not None else None
    except ValueError:  # a __wrapped__ cycle
        pass
    code = getattr(forward, "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else ("<unknown>", 0)


def warn_unused_inputs(model: Any, names: List[str]) -> None:
    """Keyword inputs that ``forward`` does not name and no layer, merge or output used (its
    ``**kwargs`` swallowed them: a misspelt name): say so, at the model's ``forward``. Their node
    keeps a dead-end edge to the output (``measured.syntheticConnections``)."""
    if not names:
        return
    place, number = _forward_place(model)
    listed = ", ".join(repr(n) for n in names)
    warnings.warn_explicit(
        f"the forward ignored input {listed}: its **kwargs took it and nothing flows from it to a layer or "
        "the output; check the name against the forward's arguments",
        TraceWarning, place, number, module=os.path.splitext(os.path.basename(place))[0], registry={})


def warn_no_output(model: Any, model_name: str) -> None:
    """The forward returned no tensor (``None``, or only Python values): say so, at the model's
    ``forward``."""
    place, number = _forward_place(model)
    warnings.warn_explicit(
        f"{model_name}'s forward returned no tensor: the graph's output node is fed only by the layers "
        "whose results nothing used (measured.syntheticConnections); return the outputs to connect them",
        TraceWarning, place, number, module=os.path.splitext(os.path.basename(place))[0], registry={})


def _position_table(qualname: str) -> bool:
    """A module path that names a learned position table: GPT-2's ``wpe``, BERT's
    ``position_embeddings``, OPT's ``embed_positions`` (the planner's rule,
    ``planner.workload.position_table``)."""
    leaf = qualname.rsplit(".", 1)[-1].lower()
    return leaf == "wpe" or "position" in leaf


def warn_positions_past_table(model: Any, records: List[Any], input_count: int) -> None:
    """On the meta device, whose kernels read no index: each call of a learned position table
    (an ``nn.Embedding`` named as :func:`_position_table` says) indexed with more positions (its
    input's last dimension) than the table holds: its rows less the ``offset`` of OPT's and BART's
    tables (``OPTLearnedPositionalEmbedding`` adds 2 to every position). A real device raises
    ``index out of range`` there, so the trace stands for a forward that cannot run: say so, at the
    model's ``forward``. Indices that come from an input (``position_ids`` given, packed sequences
    whose positions restart) are the caller's values and are not judged. ``records``: the
    recording's :class:`~.records.LayerCall` records, settled, shapes still raw; the first
    ``input_count`` are the inputs."""
    from torch import nn

    told = set()
    for record in records:
        module = record.module
        if not isinstance(module, nn.Embedding) or id(module) in told or not _position_table(record.qualname):
            continue
        if any(isinstance(key, int) and key < input_count for key in record.sources):
            continue  # position ids the caller gave
        offset = getattr(module, "offset", 0)
        offset = offset if isinstance(offset, int) and 0 <= offset < module.num_embeddings else 0
        most = module.num_embeddings - offset
        raw = record.input_shape
        positions = raw[0][-1] if raw is not None and raw[0] else None
        if positions is not None and positions > most:
            told.add(id(module))
            place, number = _forward_place(model)
            rows = f"{module.num_embeddings:,} rows" + (f" ({most:,} positions after its offset of {offset})"
                                                        if offset else "")
            warnings.warn_explicit(
                f"{record.qualname} is a position table of {rows}, indexed with {positions:,} positions: on a "
                f"real device this forward raises 'index out of range' (the meta device checks no index); trace "
                f"at most {most:,} tokens",
                TraceWarning, place, number, module=os.path.splitext(os.path.basename(place))[0], registry={})
