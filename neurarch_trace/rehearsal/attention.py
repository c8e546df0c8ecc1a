"""Attention as CUDA runs it in training, and what eager attention would keep instead.

:class:`FusedAttention` stands in for ``F.scaled_dot_product_attention`` during a rehearsal and
runs the kernel PyTorch's CUDA backend picks for 16-bit inputs (``sdp_utils.cpp``): FlashAttention
(``aten._scaled_dot_product_flash_attention``) without a mask when the head sizes match and are
at most 256, else the memory-efficient kernel (``aten._scaled_dot_product_efficient_attention``),
which takes the mask as an additive bias (a bool mask is first turned into one, as
``convert_boolean_attn_mask`` does). Both keep for backward only the inputs, the output and a
float32 log-sum-exp per query row (Dao et al. 2022, "FlashAttention", section 3.1: the
``O(N^2)`` score matrix is recomputed in the backward, never stored), and random-number offsets
for dropout instead of a mask. Both have meta kernels. Inputs that are not 4-D fall back to the
math path, as on CUDA.

Each call's shapes are recorded; :func:`eager_extra_bytes` then measures, for each distinct call,
how many more bytes eager attention (the scores materialised: ``softmax(QK^T / sqrt(d) + mask)V``
with the softmax in float32 and its output cast back to 16 bits, as transformers'
``eager_attention_forward`` and any hand-written attention under autocast compute it, dropout
keeping a bool mask) saves for backward than the fused kernel: the ``--attention eager`` term;
and :func:`eager_backward_bytes` how many more its backward allocates on top of what it saved (the
score matrices' gradients), which the peak meets once, in whichever call's backward runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812 - the usual name

from neurarch_trace.rehearsal.storage import KINDS, StorageTracker

__all__ = ["FusedAttention", "eager_backward_bytes", "eager_extra_bytes"]

_aten = torch.ops.aten
#: The largest head size FlashAttention-2 supports (``check_head_dim_size_flash`` in sdp_utils.cpp).
FLASH_MAX_HEAD_DIM = 256


class FusedAttention:
    """A callable with ``F.scaled_dot_product_attention``'s signature. ``calls`` holds one
    signature per call: ``(q shape, k shape, v shape, dtype, mask shape or None, mask dtype,
    dropout_p, kernel)``."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> torch.Tensor:
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
            self._record(query, key, value, attn_mask, dropout_p, "math")
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        half = query.dtype in (torch.float16, torch.bfloat16)
        same_dims = query.shape[-1] == key.shape[-1] == value.shape[-1] <= FLASH_MAX_HEAD_DIM
        if attn_mask is None and half and same_dims:
            # FlashAttention-2 takes fewer key/value heads than query heads as they are (its
            # ``num_heads_k``; Dao 2023, "FlashAttention-2", section 3): grouped-query attention
            # keeps the key and value heads unrepeated, and their gradients are their own size
            self._record(query, key, value, None, dropout_p, "flash")
            return _aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                             scale=scale)[0]
        if enable_gqa and key.shape[-3] != query.shape[-3]:  # the other kernels take them repeated
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        bias = None
        if attn_mask is not None:
            bias = attn_mask
            if bias.dtype == torch.bool:
                bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
                    bias.logical_not(), float("-inf"))
            shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            bias = bias.expand(shape)
        self._record(query, key, value, attn_mask, dropout_p, "efficient")
        compute_lse = query.requires_grad or key.requires_grad or value.requires_grad
        return _aten._scaled_dot_product_efficient_attention(query, key, value, bias, compute_lse, dropout_p,
                                                             is_causal, scale=scale)[0]

    def _record(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout_p: float,
                kernel: str) -> None:
        mask_shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else None
        mask_dtype = mask.dtype if isinstance(mask, torch.Tensor) else None
        self.calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, mask_shape, mask_dtype,
                           float(dropout_p), kernel))

    def kernels(self) -> dict[str, int]:
        """How many calls ran each kernel."""
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call[-1]] = counts.get(call[-1], 0) + 1
        return counts


def _saved_bytes(fn: Any, inputs: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages ``fn(*inputs)`` saves for backward, its inputs' excluded, and
    integer tensors too: the fused kernels' random-number seed and offset, which CUDA keeps on the
    host (bool dropout masks are counted)."""
    known = {id(t.untyped_storage()) for t in inputs}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        integer = not t.is_floating_point() and t.dtype != torch.bool
        if id(storage) not in known and t.device.type == "meta" and not integer:
            saved[id(storage)] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    del out
    return sum(saved.values())


def _eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, dropout_p: float) -> torch.Tensor:
    """Eager attention under CUDA autocast: 16-bit matmuls, the softmax in float32 cast back."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout_p > 0.0:
        probs = torch.native_dropout(probs, dropout_p, True)[0]
    return torch.matmul(probs, value)


def _call_inputs(call: tuple) -> tuple[list[torch.Tensor], float, str]:
    """Meta inputs ``[q, k, v(, additive mask)]`` of a recorded call (the key and value heads
    repeated for grouped-query attention, a bool mask made additive), its dropout and kernel."""
    q_shape, k_shape, v_shape, dtype, mask_shape, mask_dtype, dropout_p, kernel = call
    with torch.device("meta"):
        q = torch.empty(q_shape, dtype=dtype, requires_grad=True)
        k = torch.empty(k_shape, dtype=dtype, requires_grad=True)
        v = torch.empty(v_shape, dtype=dtype, requires_grad=True)
        mask = torch.empty(mask_shape, dtype=mask_dtype) if mask_shape is not None else None
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: both paths repeat the key/value heads
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    bias = mask
    if mask is not None and mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=dtype, device="meta").masked_fill(mask.logical_not(), float("-inf"))
    return [q, k, v] + ([bias] if bias is not None else []), dropout_p, kernel


def eager_backward_bytes(call: tuple) -> int:
    """Bytes that eager attention's backward allocates, at its peak, beyond what its forward saved,
    for one recorded call at its own batch size, in score-sized tensors (queries x keys per head):
    the gradients of the score matrices (the softmax's in float32, and their 16-bit casts), while
    the saved scores are still alive.
    Measured by running the call's forward and backward on the meta device under
    :class:`~neurarch_trace.rehearsal.storage.StorageTracker` (the incoming gradient and the
    output are not counted: they belong to the layers around it). ``0`` for a call that ran the
    math path, whose backward the rehearsed step already ran."""
    inputs, dropout_p, kernel = _call_inputs(call)
    if kernel == "math":
        return 0
    tracker = StorageTracker()
    with tracker:
        tracker.start("forward")
        out = _eager(inputs[0], inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None, dropout_p)
        tracker.ignore(out)
        grad = torch.empty(out.shape, dtype=out.dtype, device="meta")
        tracker.ignore(grad)
        tracker.start("backward")
        torch.autograd.backward(out, grad, inputs=[t for t in inputs[:3] if t.requires_grad])
    # the score-sized storages alone (queries x keys per head, in any dtype: the softmax's float32,
    # its 16-bit cast, a bool dropout mask and their gradients), alive during the backward: the
    # inputs' gradients and other per-query tensors grow with the queries, are the layer's own and
    # are counted as the block's transients
    q, k = inputs[0], inputs[1]
    scores = q.shape[:-1].numel() * k.shape[-2]
    counted = {KINDS.index("activations"), KINDS.index("backward")}
    backward_from = dict(tracker.phases)["backward"]
    live = peak = 0
    kept = None  # the score-sized bytes alive when the backward starts: what the forward saved
    for index, (record, sign) in enumerate(tracker.events):
        if kept is None and index >= backward_from:
            kept = peak = live
        if record.nbytes < scores or record.kind not in counted:
            continue
        live += sign * record.nbytes
        if kept is not None:
            peak = max(peak, live)
    return max(0, peak - kept) if kept is not None else 0


def eager_extra_bytes(call: tuple) -> tuple[int, int]:
    """``(eager, fused)``: the bytes eager attention saves for backward (the score matrices: they
    grow with queries x keys) and those the fused kernel saves instead (its output and log-sum-exp:
    they grow with the queries), for one recorded call at its own batch size; ``(0, 0)`` for a call
    that already ran the math path."""
    inputs, dropout_p, kernel = _call_inputs(call)
    if kernel == "math":
        return 0, 0
    fused = FusedAttention()
    fused_bytes = _saved_bytes(lambda a, b, c, *m: fused(a, b, c, m[0] if m else None, dropout_p), inputs)
    eager_bytes = _saved_bytes(lambda a, b, c, *m: _eager(a, b, c, m[0] if m else None, dropout_p), inputs)
    return eager_bytes, fused_bytes
