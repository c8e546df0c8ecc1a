"""Activation checkpointing as transformers applies it, for a rehearsed step.

``model.gradient_checkpointing_enable()`` (transformers 5.x; ``activation_checkpointing_enable``
from 5.2x) checkpoints every ``GradientCheckpointingLayer`` (one decoder or encoder layer) with
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, its default, and turns the KV cache
off inside the layer: ``use_cache=False``, ``cache``/``past_key_values``/``layer_past`` None unless
the class sets ``_can_checkpoint_with_cache`` (``modeling_layers.GradientCheckpointingLayer``; the
message "Caching is incompatible with gradient checkpointing"). The rehearsal installs the same
thing on the model's layers for the length of one step (:func:`checkpointing_installed`), leaving
the model's own flags alone: the layer keeps only its inputs, and the backward recomputes its
forward, under what ``recompute`` enters (the meta device and the rehearsal's autocast, which
``torch.utils.checkpoint`` re-enters for CUDA's own autocast in the same place: its
``context_fn``'s second context runs around the recompute). ``gradient_checkpointing_enable()``
also calls ``enable_input_require_grads()`` for a model whose ``main_input_name`` is ``input_ids``:
the input embeddings' output requires grad, so a frozen base (LoRA, QLoRA) carries a gradient back
to it. The rehearsal does the same (:func:`input_embeddings`). Checked against transformers' own
mechanism, each phase's peak to the byte (``tests/test_checkpointing.py``), and against real steps
on an H200 (``bench/gpu_memory_check.py``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import neurarch_trace.walk as walk

__all__ = ["checkpointed_layers", "checkpointing_installed", "input_embeddings"]

#: The keyword arguments a checkpointed layer gets as None: the names transformers' layers give the
#: KV cache (``GradientCheckpointingLayer.forward_with_checkpointing``).
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


def checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    """The modules ``gradient_checkpointing_enable()`` checkpoints: every instance of a transformers
    ``GradientCheckpointingLayer`` subclass (by the class name in its MRO: nothing of transformers is
    imported), in module order; empty for a model without one."""
    return [m for m in walk.modules(model)
            if any(c.__name__ == "GradientCheckpointingLayer" and c.__module__.startswith("transformers.")
                   for c in type(m).__mro__[1:])]


def input_embeddings(model: nn.Module) -> list[nn.Module]:
    """The modules ``enable_input_require_grads()`` hooks, for a model whose ``main_input_name`` is
    ``input_ids``: the input embeddings (``get_input_embeddings()``) of every transformers
    ``PreTrainedModel`` in it, each once; empty for any other model."""
    if getattr(model, "main_input_name", None) != "input_ids":
        return []
    found: dict[int, nn.Module] = {}
    for module in walk.modules(model):
        if not any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__):
            continue
        try:
            embeddings = module.get_input_embeddings()
        except Exception:  # noqa: BLE001 - NotImplementedError and the like: transformers skips it too
            continue
        if isinstance(embeddings, nn.Module):
            found.setdefault(id(embeddings), embeddings)
    return list(found.values())


def _requires_grad(module: nn.Module, args: Any, output: Any) -> None:
    if isinstance(output, torch.Tensor) and output.is_floating_point():
        output.requires_grad_(True)


def _without_cache(module: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if not getattr(module, "_can_checkpoint_with_cache", False):
        for name in _CACHE_KWARGS:
            if kwargs.get(name) is not None:
                kwargs[name] = None
    return kwargs


def _checkpointed(module: nn.Module, forward: Callable[..., Any],
                  recompute: Callable[[], AbstractContextManager[Any]]) -> Callable[..., Any]:
    def contexts() -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        return contextlib.nullcontext(), recompute()

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # no backward to recompute for (transformers' own test)
            return forward(*args, **kwargs)
        # meta tensors have no random state to keep
        return checkpoint(functools.partial(forward, **_without_cache(module, kwargs)), *args,
                          use_reentrant=False, preserve_rng_state=False, context_fn=contexts)

    return checkpointed_forward


@contextlib.contextmanager
def checkpointing_installed(model: nn.Module,
                            recompute: Callable[[], AbstractContextManager[Any]]) -> Iterator[None]:
    """Within the block, each of ``model``'s :func:`checkpointed_layers` runs its ``forward`` under
    activation checkpointing (an instance attribute over whatever ``forward`` it had, as the tracer's
    own wrappers are), and its :func:`input_embeddings` return outputs that require grad (a forward
    hook); ``recompute()`` makes the context the backward recomputes a layer in. The model is as it
    was after, whatever happens."""
    installed: list[tuple[nn.Module, Any]] = []
    hooks = []
    try:
        for module in checkpointed_layers(model):
            own = module.__dict__.get("forward")
            module.__dict__["forward"] = _checkpointed(module, module.forward, recompute)
            installed.append((module, own))
        hooks = [m.register_forward_hook(_requires_grad) for m in input_embeddings(model)]
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for module, own in reversed(installed):
            if own is None:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = own
