"""Keep ``torch._dynamo`` unimported while the tracer runs PyTorch's own Python code.

PyTorch wraps some of its Python functions in ``torch._disable_dynamo`` (``torch/_compile.py``):
the Python references and decompositions that are the meta device's kernels for elementwise
operations and batch norm (``torch._refs``, ``torch._decomp``), and ``Optimizer.zero_grad`` and
``add_param_group``. The wrapper's first call imports ``torch._dynamo`` (0.6-0.8 s on torch 2.13,
more than the rest of a ResNet-50 trace) to mark the function as one that ``torch.compile`` must
not trace, and caches the marked function in the wrapped function's ``__dynamo_disable``
attribute.

A process that has not imported ``torch._dynamo`` compiles nothing, so nothing can trace these
functions: :func:`dynamo_left_unimported` caches each one as its own disabled form for the duration
of a block and takes the caches it put there away again on the way out, so a ``torch.compile``
later in the process (a notebook) marks them as usual. When ``torch._dynamo`` is already imported
(a compiled model) the block changes nothing.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator, List

import torch

__all__ = ["dynamo_left_unimported", "compiled_code_run_eagerly"]

#: The modules whose functions and tables are scanned for ``_disable_dynamo`` wrappers: the meta
#: device's Python kernels, the optimizer base class, activation checkpointing.
SCANNED_MODULES = (
    "torch._refs", "torch._refs.nn.functional", "torch._refs.special", "torch._refs.linalg",
    "torch._refs.fft", "torch._prims", "torch._decomp.decompositions", "torch._meta_registrations",
    "torch.optim.optimizer", "torch.utils.checkpoint",
)

#: The attribute ``torch._disable_dynamo`` caches the disabled function in.
CACHE = "__dynamo_disable"

_WRAPPERS: List[Any] = []  # the wrapped functions found, once per process
_depth = 0


def _inner_code() -> Any:
    """The code object of every ``torch._disable_dynamo`` wrapper (one per torch build)."""
    return torch._disable_dynamo(lambda: None).__code__


def _candidates() -> Iterator[Any]:
    for name in SCANNED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type):
                yield from list(vars(value).values())
            else:
                yield value
    from torch._decomp import decomposition_table, meta_table

    yield from list(decomposition_table.values())
    yield from list(meta_table.values())


def _inner_functions(function: Any) -> Iterator[Any]:
    """What a decorator's function calls: its ``__wrapped__`` and the functions in its closure
    (``functools.wraps(prim)`` on a reference points ``__wrapped__`` at the primitive, not at the
    wrapper below)."""
    wrapped = getattr(function, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType):
        yield wrapped
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, types.FunctionType):
            yield value


def _wrapped_functions() -> List[Any]:
    """Every function under a ``_disable_dynamo`` wrapper reachable from :data:`SCANNED_MODULES`
    and the decomposition tables through decorators (``out_wrapper`` over the type-promotion
    wrapper over the reference), once per process."""
    if _WRAPPERS:
        return _WRAPPERS
    code, found, seen = _inner_code(), {}, set()
    slot = code.co_freevars.index("fn")
    todo = [v for v in _candidates() if isinstance(v, types.FunctionType)]
    while todo:
        function = todo.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        if function.__code__ is code:  # the wrapper's ``fn``: ``wraps`` may have changed ``__wrapped__``
            wrapped = function.__closure__[slot].cell_contents
            found[id(wrapped)] = wrapped
        todo.extend(_inner_functions(function))
    _WRAPPERS.extend(found.values())
    return _WRAPPERS


@contextlib.contextmanager
def dynamo_left_unimported() -> Iterator[None]:
    """A block in which PyTorch's ``_disable_dynamo`` wrappers do not import ``torch._dynamo``.

    Nests; thread-unsafe as PyTorch's own cache is. Nothing is done when ``torch._dynamo`` is
    imported already. Raises nothing of its own."""
    global _depth
    placed = [] if _depth or "torch._dynamo" in sys.modules else _place()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for fn in placed:
            if fn.__dict__.get(CACHE) is fn:
                delattr(fn, CACHE)


def _place() -> List[Any]:
    """Cache each wrapped function as its own disabled form where no cache is yet; returns them."""
    placed = []
    for fn in _wrapped_functions():
        if CACHE not in fn.__dict__:
            setattr(fn, CACHE, fn)
            placed.append(fn)
    return placed


@contextlib.contextmanager
def compiled_code_run_eagerly() -> Iterator[None]:
    """A block in which code under ``torch.compile`` (a compiled submodule, a compiled function in
    a forward) runs as plain Python (``torch.compiler.set_stance("force_eager")``, PyTorch 2.6+), so
    the tracer's hooks and dispatch modes see each of its layers and operations as in an eager
    model, and dynamo does not compile the tracer's own code (a compiled submodule took 17 s and
    about 40 recompilations per trace, with a step that differed between the CPU and meta). Only
    when ``torch._dynamo`` is imported: a process that has not imported it has nothing compiled.
    Raises nothing of its own."""
    if "torch._dynamo" not in sys.modules or not hasattr(torch.compiler, "set_stance"):
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield
