"""What the tracer needs to know about modules before it hooks them: wrappers to look through,
TorchScript submodules to stand in for, recurrent layers in all their forms."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Tuple

import torch
from torch import nn

import neurarch_trace.walk as walk

__all__ = ["Opaque", "inner", "is_recurrent", "opaque_script_modules", "unwrap_model"]

#: How many wrappers deep :func:`unwrap_model` looks.
MAX_WRAPPERS = 16


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile``, nn.DataParallel and DistributedDataParallel wrappers,
    so that names and scopes carry no ``_orig_mod.``/``module.`` prefix. The compiled wrapper is
    never run: tracing is eager."""
    for _ in range(MAX_WRAPPERS):
        inner_model = getattr(model, "_orig_mod", None)
        if isinstance(inner_model, nn.Module):
            model = inner_model
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            break
    return model


class Opaque(nn.Module):
    """Stands in for a TorchScript submodule (which refuses Python hooks) during the trace: one
    opaque layer whose ``_neurarch_inner`` is the scripted module."""

    _neurarch_opaque = True

    def __init__(self, wrapped: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_neurarch_inner", wrapped)
        self.inner = wrapped

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def inner(module: nn.Module) -> nn.Module:
    """The module an :class:`Opaque` stands for, or ``module`` itself."""
    # the instance dict, not getattr: a miss on an nn.Module raises inside its __getattr__ (slow)
    return module.__dict__.get("_neurarch_inner", module)


@contextlib.contextmanager
def opaque_script_modules(tree: walk.Tree) -> Iterator[walk.Tree]:
    """Within the block, every TorchScript child of a Python module of ``tree`` (walked before)
    is replaced by an :class:`Opaque` wrapper; the children are put back on the way out, whatever
    happens. Yields the tree with the wrappers in: ``tree`` itself when the model holds no
    TorchScript child, else the model walked again."""
    swapped: List[Tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent in tree.modules:
            if isinstance(parent, torch.jit.ScriptModule):
                continue
            for name, child in list(parent._modules.items()):
                if isinstance(child, torch.jit.ScriptModule):
                    parent._modules[name] = Opaque(child)
                    swapped.append((parent, name, child))
        yield walk.Tree(tree.model) if swapped else tree
    finally:
        for parent, name, child in swapped:
            parent._modules[name] = child


def is_recurrent(module: nn.Module) -> bool:
    """nn.LSTM/GRU/RNN, and their quantized versions (which do not subclass nn.RNNBase)."""
    if isinstance(module, nn.RNNBase):
        return True
    return type(module).__module__.startswith("torch.ao.nn.quantized") and all(
        hasattr(module, attr) for attr in ("mode", "hidden_size", "num_layers", "bidirectional", "batch_first")
    )
