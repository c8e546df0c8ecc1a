"""The user's own module hooks, taken out while the training step is rehearsed.

The rehearsed step runs the model's forward and backward several more times, on meta tensors and
at batch sizes of its own (:mod:`neurarch_trace.rehearsal`). A hook a user registered to watch the
model (``register_forward_hook(lambda m, i, o: store.update(out=o))``, an activation statistic, a
gradient logger) would see those calls as the model's: after a trace, the user's ``store`` would
hold a meta tensor at the rehearsal's batch in place of the traced forward's output. The traced
forward itself is a real forward, so every hook sees it, as under torchinfo.

Hooks that compute part of the model stay: those defined by PyTorch (``weight_norm``, pruning,
spectral norm, parametrizations, quantization observers) and the libraries whose layers a traced
model is made of (transformers' ``enable_input_require_grads``, PEFT, accelerate, bitsandbytes),
and this project's own. A user's hook can be part of the model too (one that reshapes an output):
when the step fails without the user's hooks, it is rehearsed again with them
(:func:`neurarch_trace.rehearsal.rehearse_training_step`). The rule reads where a hook's code is
defined: the module of a function, of a bound method's object, of a callable object's class,
through ``functools.partial``. Hooks are put back afterwards in their order, with their handles
still valid (the same dict entries).

Covers forward pre-hooks, forward hooks and backward (pre-)hooks, on every module of the tree and
the global ones (``torch.nn.modules.module.register_module_forward_hook`` and the like).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.nn.modules import module as _module

import neurarch_trace.walk as walk

__all__ = ["LIBRARIES", "is_library_hook", "user_hooks_left_out"]

#: Top-level packages whose hooks compute part of a model and stay in the rehearsal.
LIBRARIES = frozenset({"torch", "transformers", "peft", "accelerate", "bitsandbytes", "neurarch_trace"})

#: The per-module hook dicts a call runs (``nn.Module._call_impl``).
_MODULE_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
#: The global ones, by their name in ``torch.nn.modules.module`` (absent names are skipped).
_GLOBAL_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks")


def _origin(hook: Any) -> str:
    """The module name where ``hook``'s code is defined ("" when none is found)."""
    target = hook
    while isinstance(target, functools.partial):
        target = target.func
    owner = getattr(target, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):  # a bound method: its object's class
        return type(owner).__module__ or ""
    name = getattr(target, "__module__", None)
    if not isinstance(name, str):  # a callable object: its class
        name = type(target).__module__
    return name or ""


def is_library_hook(hook: Any) -> bool:
    """True for a hook defined in one of :data:`LIBRARIES` (kept in the rehearsal)."""
    return _origin(hook).split(".", 1)[0] in LIBRARIES


def _take_out(hooks: dict, kept: list) -> None:
    """Remove the user's hooks from ``hooks``, remembering the dict as it was in ``kept``."""
    if not hooks:
        return
    users = [key for key, hook in hooks.items() if not is_library_hook(hook)]
    if users:
        kept.append((hooks, list(hooks.items())))
        for key in users:
            del hooks[key]


def _put_back(kept: list) -> None:
    """Every dict of ``kept`` as it was, in its order; an entry added meanwhile stays, after them."""
    for hooks, items in kept:
        before = {key for key, _ in items}
        added = [(key, hook) for key, hook in hooks.items() if key not in before]
        hooks.clear()
        hooks.update(items)
        hooks.update(added)


@contextlib.contextmanager
def user_hooks_left_out(model: nn.Module) -> Iterator[int]:
    """Within the block, the user's module hooks (see the module docstring) are out of ``model``'s
    modules and of the global registries; after it, whatever happens, they are back as they were.
    Yields how many were left out."""
    kept: list = []
    try:
        for module in walk.modules(model):
            for name in _MODULE_DICTS:
                hooks = module.__dict__.get(name)
                if isinstance(hooks, dict):
                    _take_out(hooks, kept)
        for name in _GLOBAL_DICTS:
            hooks = getattr(_module, name, None)
            if isinstance(hooks, dict):
                _take_out(hooks, kept)
        yield sum(len(items) - len(hooks) for hooks, items in kept)
    finally:
        _put_back(kept)
