"""Parameter ownership: which node a parameter or buffer is counted on.

The first layer call that uses a tensor owns it, so tied weights and shared modules count once: a
layer's first call owns its module's parameters and buffers not yet owned; a parameter read directly
in functional code (a ViT's ``cls_token``) is owned by the first node that consumes the result. The
model-wide totals (:func:`model_totals`) come from PyTorch's own iterators.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.trace.modules import inner, is_recurrent
from neurarch_trace.trace.records import LayerCall

__all__ = ["Ownership", "model_totals", "packed_param_count"]


class Ownership:
    """Owner (a record index) of every parameter and buffer claimed so far."""

    def __init__(self, tensors_by_key: Mapping[str, torch.Tensor]) -> None:
        self._owner: Dict[int, int] = {}
        self._by_key = tensors_by_key

    def claim_module(self, record: LayerCall, module: nn.Module) -> None:
        """Give ``record`` the parameters and buffers of ``module`` (and its children) not yet
        owned, counting their elements in ``own_params``/``own_buffers``."""
        # a leaf's own dicts are enough, and much cheaper than the recursive iterators
        leaf = not module._modules
        params = module._parameters.values() if leaf else walk.parameters(module)
        buffers = module._buffers.values() if leaf else walk.buffers(module)
        owner = self._owner
        for p in params:
            if p is not None and id(p) not in owner:
                owner[id(p)] = record.index
                record.own_params += p.numel()
        for b in buffers:
            if b is not None and id(b) not in owner:
                owner[id(b)] = record.index
                record.own_buffers += b.numel()

    def claim_key(self, record: LayerCall, key: str) -> None:
        """Give ``record`` the parameter or buffer of provenance key ``key`` if no one owns it."""
        t = self._by_key.get(key)
        if t is None or id(t) in self._owner:
            return
        self._owner[id(t)] = record.index
        if key.startswith("param:"):
            record.own_params += t.numel()
        else:
            record.own_buffers += t.numel()


def packed_param_count(module: nn.Module) -> int:
    """Elements of quantized packed weights and biases (they are not nn.Parameters)."""
    target = inner(module)
    if not target._modules and not type(target).__module__.startswith("torch.ao.nn.quantized"):
        return 0  # the common case: a float leaf layer
    total = 0
    for sub in walk.modules(target):
        # only a quantized layer's weight is read: reading a parametrized one runs its
        # parametrization (spectral_norm's power iteration writes its buffers in train mode)
        if not type(sub).__module__.startswith("torch.ao.nn.quantized"):
            continue
        weight = getattr(sub, "weight", None)
        try:
            if callable(weight):
                total += weight().numel()
                b = sub.bias() if callable(getattr(sub, "bias", None)) else None
                if b is not None:
                    total += b.numel()
            elif is_recurrent(sub):
                parts = list(sub.get_weight().values()) + list(sub.get_bias().values())
                total += sum(x.numel() for x in parts if isinstance(x, torch.Tensor))
        except Exception:  # noqa: BLE001 - an unusual packed layout: leave it out
            pass
    return total


def model_totals(model: nn.Module) -> Dict[str, Any]:
    """Unique parameters (each ``nn.Parameter`` once), trainable ones, their bytes, and buffers
    with their bytes, from ``model.parameters()``/``model.buffers()``."""
    params = trainable = param_bytes = buffers = buffer_bytes = 0
    # walked after the forward: a lazy layer's parameters are there now
    all_params, all_buffers = walk.parameters_and_buffers(model)
    for p in all_params:  # each Parameter once
        params += p.numel()
        param_bytes += p.numel() * p.element_size()
        if p.requires_grad:
            trainable += p.numel()
    for b in all_buffers:
        buffers += b.numel()
        buffer_bytes += b.numel() * b.element_size()
    return {
        "params": params,
        "trainable": trainable,
        "param_bytes": param_bytes,
        "buffers": buffers,
        "buffer_bytes": buffer_bytes,
    }
