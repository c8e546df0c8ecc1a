"""The errors neurarch-trace raises for things a user can fix.

Every front end (command line, notebook magic) shows ``str(error)`` as one line and exits 1; the
message says what went wrong and what to do.

    NeurarchError            base: one user-readable line
    ├── TargetError          the model could not be located, imported or built
    ├── InputSpecError       a malformed ``--input`` / unknown dtype
    ├── TraceError           the forward pass raised (wraps the model's own error)
    │   └── NeedsValuesError the forward needs real tensor values, which the meta device has not
    └── GraphError           a graph file or dict that breaks the format contract

    TraceWarning             (a UserWarning) something the trace noticed that the user should know:
                             a warning the model's forward raised, told at the model's own line, or
                             a forward that returned no tensor
"""

from __future__ import annotations


class NeurarchError(Exception):
    """Base class: ``str(err)`` is one line telling the user what went wrong and what to do."""


class TargetError(NeurarchError):
    """The target (``file.py:Attr``, ``pkg.mod:attr``, ``hf:...``) could not be turned into a model."""


class InputSpecError(NeurarchError, ValueError):
    """A ``--input DIMS[:dtype]`` specification that cannot be parsed."""


class TraceError(NeurarchError, RuntimeError):
    """The model's forward pass raised; the original exception is chained as ``__cause__``."""


class NeedsValuesError(TraceError):
    """A forward on the meta device reached an operation that needs real values (``.item()``, a
    data-dependent shape, a copy to the CPU): ``--device auto`` traces on the CPU instead."""


class OutOfMemoryError(TraceError):
    """The forward ran out of host memory (the CPU allocator refused a tensor): ``--device auto``
    traces a small model's big inputs on the meta device instead."""


class GraphError(NeurarchError, ValueError):
    """A graph that breaks the ``.neurarch.json`` contract, or a file that is not one."""


class TraceWarning(UserWarning):
    """A warning about the traced model (see the module docstring); ``str()`` is one line."""


def is_out_of_memory(exc: BaseException) -> bool:
    """``exc`` says the CPU allocator refused a tensor (``DefaultCPUAllocator: can't allocate
    memory``, or its ``alloc_cpu.cpp`` enforce under a memory limit), or Python ran out of memory."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "alloc_cpu.cpp" in text
