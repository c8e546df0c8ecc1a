"""What a layer call is: its vocabulary type and params (from :mod:`neurarch_trace.mapping`), an
``lmHead`` for a linear tied to the embeddings, and the node-level FLOP formulas where the CPU
kernels have none (see :mod:`neurarch_trace.flops`)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.flops import NODE_FORMULA_OPS, linear_flops, rnn_flops
from neurarch_trace.mapping import container_spec, is_whole_layer, layer_spec
from neurarch_trace.trace.modules import inner, is_recurrent
from neurarch_trace.trace.records import LayerCall
from neurarch_trace.trace.tensors import iter_tensors

__all__ = ["LayerKinds", "apply_node_formula"]


class LayerKinds:
    """Types layer calls of one model. ``lmHead`` needs to know the model's embedding weights and
    its ``get_output_embeddings()`` (transformers), read once here."""

    def __init__(self, tree: walk.Tree) -> None:
        model = tree.model
        self._embedding_weights = {id(m.weight) for m in tree.modules if isinstance(m, nn.Embedding)}
        out_emb = None
        get_out = getattr(model, "get_output_embeddings", None)
        if callable(get_out):
            try:
                out_emb = get_out()
            except Exception:  # noqa: BLE001 - a model's own accessor may not apply
                out_emb = None
        self._output_embeddings: Optional[nn.Module] = out_emb if isinstance(out_emb, nn.Module) else None

    def assign(self, record: LayerCall, module: nn.Module, param_count: int) -> None:
        """Set ``record.type`` and ``record.params`` for a call of ``module``, whose exact
        learnable-parameter count (packed quantized weights included) is ``param_count``."""
        if getattr(type(module), "_neurarch_opaque", False):
            wrapped = module._neurarch_inner
            class_name = getattr(wrapped, "original_name", None) or type(wrapped).__name__
            record.type, record.params = "customModule", {"className": class_name, "paramCount": param_count}
        elif module._modules and not is_whole_layer(module):
            record.type, record.params = container_spec(module, param_count=param_count)
        else:
            record.type, record.params = layer_spec(inner(module), param_count=param_count)
        if record.type == "linear":
            self._maybe_lm_head(record, module)

    def _maybe_lm_head(self, record: LayerCall, module: nn.Module) -> None:
        weight = getattr(module, "weight", None)
        tied = isinstance(weight, torch.Tensor) and id(weight) in self._embedding_weights
        if tied or (self._output_embeddings is not None and module is self._output_embeddings):
            p = record.params
            record.type = "lmHead"
            record.params = {
                "embedDim": p["inFeatures"],
                "vocabSize": p["outFeatures"],
                "bias": p.get("bias", True),
                "weightTied": bool(tied),
            }


def recurrent_flops(target: nn.Module, args: tuple) -> Optional[int]:
    """:func:`~neurarch_trace.flops.rnn_flops` of a call of the recurrent layer ``target`` with
    ``args``, over its input's sequence and batch (``(N, L, H_in)`` with ``batch_first``, else
    ``(L, N, H_in)``; ``(L, H_in)`` unbatched; a PackedSequence's data is ``(tokens, H_in)``); None
    when the first argument holds no tensor of 2 dims or more."""
    x: Any = next(iter_tensors(args), None)
    if x is None or x.dim() < 2:
        return None
    if x.dim() == 3:
        seq, batch = (x.shape[1], x.shape[0]) if target.batch_first else (x.shape[0], x.shape[1])
    else:  # unbatched (L, H_in)
        seq, batch = x.shape[0], 1
    return rnn_flops(target, int(seq), int(batch))


def apply_node_formula(record: LayerCall, module: nn.Module, args: tuple, outs: list) -> None:
    """Replace the dispatch count where the CPU kernels have no formula: recurrent layers
    (:func:`~neurarch_trace.flops.rnn_flops` over the input's sequence and batch) and dynamically
    quantized linears (:func:`~neurarch_trace.flops.linear_flops` from the unpacked weight)."""
    target = inner(module)
    covered = {op for op in record.uncounted if op in NODE_FORMULA_OPS}
    if is_recurrent(target):
        flops = recurrent_flops(target, args)
        if flops is not None:
            record.flops = flops
            record.uncounted -= covered
    elif covered and hasattr(target, "weight") and callable(target.weight) and outs:
        w = target.weight()
        out_features, in_features = int(w.shape[0]), int(w.shape[1])
        rows = outs[0].numel() // out_features
        record.flops += linear_flops(in_features, out_features, rows)
        record.uncounted -= covered
