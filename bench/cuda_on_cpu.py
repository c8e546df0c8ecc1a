"""CUDA training behaviour for real training steps on the CPU, for the memory harness.

This module is the harness's own emulation, written apart from the product's
(``neurarch_trace.rehearsal``) and working at another level: it changes PyTorch's *dispatcher* for
real CPU tensors, where the product applies a policy by Python name to meta tensors. Inside
:class:`CudaOnCpu`:

* ``torch.autocast("cpu", dtype=torch.bfloat16)`` follows **CUDA's** autocast policy: every
  operation with an ``AutocastCUDA`` kernel in this PyTorch build gets an ``AutocastCPU`` kernel
  that casts as CUDA's does (the policy of each operation from ``aten/src/ATen/autocast_mode.h``:
  ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``,
  ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``, ``AT_FORALL_PROMOTE``), caching the 16-bit cast of
  each parameter for the autocast region as ``cached_cast`` does; every operation that has only a
  CPU autocast kernel gets one that does not cast. The kernels run at the Autocast dispatch key,
  above autograd, as autocast's own do, so composites decompose into listed operations exactly as
  on a GPU.
* ``aten::dropout`` runs ``native_dropout`` (CUDA's fused kernel, bool mask) in training.
* ``aten::scaled_dot_product_attention`` runs a fused kernel: the CPU FlashAttention kernel, which
  keeps for backward what CUDA's flash and memory-efficient kernels keep (inputs, output, a float32
  log-sum-exp per row, the mask when there is one). Its dropout is not applied: CUDA's fused
  kernels keep random-number offsets, not a mask, so the bytes are the same.

Leaving the context removes every registration (``torch.library.Library._destroy``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["CudaOnCpu", "POLICY"]

_LOWER = ("_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
          "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
          "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
          "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
          "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
          "cudnn_convolution", "cudnn_convolution_transpose")
_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
         "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
         "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
         "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
         "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
         "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
         "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
         "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
         "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
         "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
         # fp32_append_dtype (norm): run in float32
         "norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim")
_SET_DTYPE = ("prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
              "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
              "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList")
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add")
#: aten op (``name`` or ``name.overload``) -> CUDA autocast policy.
POLICY: dict[str, str] = {
    **{op: "lower" for op in _LOWER}, **{op: "fp32" for op in _FP32},
    **{op: "set_dtype" for op in _SET_DTYPE}, **{op: "promote" for op in _PROMOTE},
    "binary_cross_entropy": "banned",
}
_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _overload(qualified: str) -> Any:
    name, _, overload = qualified.partition(".")
    packet = getattr(torch.ops.aten, name)
    return getattr(packet, overload or "default")


def _ops_with_kernel(key: str) -> set[str]:
    return {name[len("aten::"):] for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)}


class CudaOnCpu:
    """A context in which real CPU training steps allocate as CUDA's would (see the module docstring).
    ``clear_cache()`` drops the cached weight casts: call it where the autocast region ends."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.uncovered = sorted(_ops_with_kernel("AutocastCUDA") - set(POLICY))

    def clear_cache(self) -> None:
        self._cache.clear()

    # --- casts ------------------------------------------------------------------------------------
    def _lower(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype in (self.dtype, torch.float64):
            return t
        if t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
            hit = self._cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
            out = t.to(self.dtype)
            self._cache[id(t)] = (t, out)
            return out
        return t.to(self.dtype)

    @staticmethod
    def _fp32(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
            return t.float()
        return t

    def _kernel(self, op: Any, policy: str) -> Any:
        schema_args = [a.name for a in op._schema.arguments]

        def kernel(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = self._cast(policy, schema_args, list(args), dict(kwargs))
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
                return op(*args, **kwargs)

        return kernel

    def _cast(self, policy: str, names: list[str], args: list, kwargs: dict) -> tuple[list, dict]:
        if policy == "banned":
            raise RuntimeError("binary_cross_entropy is unsafe to autocast (CUDA autocast refuses it)")
        if policy == "none":
            return args, kwargs
        if policy == "set_dtype":
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.is_floating_point() and "dtype" in names:
                index = names.index("dtype")
                if index < len(args):
                    args[index] = args[index] if args[index] is not None else torch.float32
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            return args, kwargs
        if policy == "promote":
            floats = [t.dtype for t in _tensors(args, kwargs) if t.is_floating_point()]
            if not floats:
                return args, kwargs
            widest = floats[0]
            for dtype in floats[1:]:
                widest = torch.promote_types(widest, dtype)

            def cast(t: Any) -> Any:
                if widest == self.dtype:
                    return self._lower(t)
                return t.to(widest) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        else:
            cast = self._lower if policy == "lower" else self._fp32
        return [_map(cast, a) for a in args], {k: _map(cast, v) for k, v in kwargs.items()}

    # --- the context ------------------------------------------------------------------------------
    def __enter__(self) -> CudaOnCpu:
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
            warnings.simplefilter("ignore")
            self._register()
        return self

    def _register(self) -> None:
        self._lib = torch.library.Library("aten", "IMPL")
        cpu_only = _ops_with_kernel("AutocastCPU")
        for qualified, policy in POLICY.items():
            try:
                op = _overload(qualified)
            except (AttributeError, RuntimeError):
                continue  # not in this PyTorch build
            self._lib.impl(qualified, self._kernel(op, policy), "AutocastCPU")
        for qualified in sorted(cpu_only - set(POLICY)):
            try:
                op = _overload(qualified)
            except (AttributeError, RuntimeError):
                continue
            self._lib.impl(qualified, self._kernel(op, "none"), "AutocastCPU")
        self._lib.impl("dropout", _dropout, "CompositeImplicitAutograd")
        self._lib.impl("scaled_dot_product_attention", _fused_attention, "CompositeImplicitAutograd")

    def __exit__(self, *exc: Any) -> None:
        self._cache.clear()
        self._lib._destroy()


def _tensors(args: list, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _map(cast: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return cast(value)
    if isinstance(value, (list, tuple)):
        return type(value)(cast(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:  # noqa: A002 - aten's name
    if not train or p == 0.0 or input.numel() == 0:
        return input
    if p == 1.0:
        return input * 0.0
    return torch.native_dropout(input, p, True)[0]


def _fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                     dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                     enable_gqa: bool = False) -> torch.Tensor:
    if query.dim() != 4:
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if enable_gqa and key.shape[1] != query.shape[1]:
        repeat = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # as convert_boolean_attn_mask does
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)
    return out
