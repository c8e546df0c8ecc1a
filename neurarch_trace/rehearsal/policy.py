"""CUDA mixed-precision behaviour, emulated for a step rehearsed on the meta device.

``torch.autocast("cuda")`` does nothing to meta tensors, and this package must not create CUDA
tensors (a CPU build aborts the process on them), so :class:`CudaAutocast` applies CUDA autocast's
policy itself. It is a ``TorchFunctionMode``: it runs above autograd, so the casts it makes are
recorded by autograd and each operation saves for backward the tensors (and dtypes) that it saves
under real autocast, which is the point of autocast's own design ("casts ... autograd-exposed and
precede autograd history recording, so that for lower_precision_fp ops, input tensors are saved
for backward in lower_precision_fp", ``aten/src/ATen/autocast_mode.h``).

The op lists are autocast's CUDA lists, ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` (norm) and
``AT_FORALL_PROMOTE`` in ``aten/src/ATen/autocast_mode.h`` (PyTorch 2.x), registered for
``AutocastCUDA`` in ``aten/src/ATen/autocast_mode.cpp``; the same lists are documented in PyTorch's
"Automatic Mixed Precision package" page, "CUDA Ops that can autocast to float16 / to float32".
They are matched by the Python-level name of the call (``torch.mm``, ``Tensor.mm``, ``F.linear``);
a Python function that is not on a list runs with the mode still active (``redispatch_function``),
so the operations inside it are seen. Additions, each marked below: ``lstm``/``gru``/``rnn_*``
(cuDNN's RNN has its own autocast registration, ``aten/src/ATen/cudnn/AutocastRNN.cpp``) and
``cross_entropy`` (a C++ composite of ``log_softmax`` and ``nll_loss``, both on the fp32 lists).

Policies, as ``autocast_mode.h`` defines them: *lower precision* casts floating inputs (not
float64) to the 16-bit type, caching the cast of a float32 leaf that requires grad (a parameter)
for the rest of the autocast region (one 16-bit copy of each weight per forward); *fp32* casts
16-bit inputs to float32; *fp32, optional dtype* passes ``dtype=torch.float32`` when the first
input is floating; *promote* casts every floating input to the widest of them.

Two more CUDA behaviours: ``F.dropout`` in training runs ``native_dropout`` (CUDA's fused kernel,
which keeps a bool mask; the generic path the meta device would take keeps a mask of the input's
dtype), and ``F.scaled_dot_product_attention`` runs the fused kernel CUDA would pick
(:mod:`neurarch_trace.rehearsal.attention`).
"""

from __future__ import annotations

import types
import weakref
from typing import Any, Callable

import torch
from torch.nn import functional as F  # noqa: N812 - the usual name
from torch.overrides import TorchFunctionMode

__all__ = ["CudaAutocast", "LOWER_PRECISION", "FP32", "FP32_SET_OPT_DTYPE", "PROMOTE", "policy_of"]

#: ``AT_FORALL_LOWER_PRECISION_FP``, plus the Python names of the same calls (``__matmul__``,
#: ``linalg_multi_dot``) and cuDNN's RNNs (``AutocastRNN.cpp``: ``lstm``, ``gru``, ``rnn_tanh``,
#: ``rnn_relu``).
LOWER_PRECISION = frozenset({
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__",
    "__rmatmul__", "einsum", "mm", "mv", "linalg_vecdot", "vecdot", "linear", "addbmm", "baddbmm", "bmm",
    "chain_matmul", "linalg_multi_dot", "multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
    "lstm", "gru", "rnn_tanh", "rnn_relu",  # cuDNN RNN autocast (AutocastRNN.cpp)
})
#: ``AT_FORALL_FP32``, plus ``__pow__``/``__rpow__`` (``pow`` by operator) and ``cross_entropy``
#: (``cross_entropy_loss``: ``log_softmax`` and ``nll_loss``, both fp32 under autocast).
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "native_layer_norm", "rms_norm",
    "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "cross_entropy", "cross_entropy_loss",  # composites of fp32 ops
})
#: ``AT_FORALL_FP32_SET_OPT_DTYPE``, and ``norm`` (``fp32_append_dtype``: a float32 result, the same).
FP32_SET_OPT_DTYPE = frozenset({
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
    "norm",
})
#: ``AT_FORALL_PROMOTE``.
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
})

_LOWER, _FP32, _SET_DTYPE, _PROMOTE = 1, 2, 3, 4
_POLICY: dict[str, int] = {
    **{name: _LOWER for name in LOWER_PRECISION},
    **{name: _FP32 for name in FP32},
    **{name: _SET_DTYPE for name in FP32_SET_OPT_DTYPE},
    **{name: _PROMOTE for name in PROMOTE},
}
_NAMES = {_LOWER: "lower precision", _FP32: "fp32", _SET_DTYPE: "fp32 (dtype)", _PROMOTE: "promote"}
_PYTHON_FUNCTION = (types.FunctionType, types.MethodType)
#: Python modules whose functions are composites of other torch calls worth seeing one by one
#: (``F.multi_head_attention_forward``, ``F.interpolate``, ``F.normalize``). ``Tensor``'s own Python
#: methods are thin wrappers and are called as they are.
_LOOK_INSIDE = frozenset({"torch.nn.functional", "torch.functional"})
_DROPOUTS = (F.dropout, torch.dropout)


#: ``torch.overrides.redispatch_function`` (PyTorch 2.13+); without it Python composites run as
#: one call under the mode, their inner calls unseen.
_REDISPATCH = getattr(torch.overrides, "redispatch_function", None)


def policy_of(name: str) -> str | None:
    """The autocast policy of a call by its Python name (``"linear"`` -> ``"lower precision"``)."""
    policy = _POLICY.get(name)
    return _NAMES[policy] if policy else None


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast to ``dtype`` (bf16 by default), CUDA dropout and fused attention.

    ``on_weight_cast(t)`` is called with each cached 16-bit copy of a parameter; ``sdpa`` replaces
    ``F.scaled_dot_product_attention`` (called with the inputs already cast). Autocast applies while
    ``torch.is_autocast_enabled("cuda")`` is true, so a region the model itself runs under
    ``torch.autocast("cuda", enabled=False)`` keeps float32 as it would on a GPU.
    """

    def __init__(self, *, sdpa: Callable[..., Any], on_weight_cast: Callable[[torch.Tensor], None],
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self._sdpa = sdpa
        self._on_weight_cast = on_weight_cast
        self._dtype = dtype
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._inside: set[int] = set()

    def clear_cache(self) -> None:
        """Drop the cached weight casts, as leaving the outermost autocast region does."""
        self._cache.clear()

    def __torch_function__(self, func: Callable, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        policy = _POLICY.get(name)
        if policy is not None and torch.is_autocast_enabled("cuda"):
            args, kwargs = self._apply(policy, args, kwargs)
        if name == "scaled_dot_product_attention":
            return self._sdpa(*args, **kwargs)
        if name == "dropout" and func in _DROPOUTS:
            routed = _cuda_dropout(func, args, kwargs)
            if routed is not None:
                return routed
        if (policy is None and isinstance(func, _PYTHON_FUNCTION) and id(func) not in self._inside
                and getattr(func, "__module__", None) in _LOOK_INSIDE and _REDISPATCH is not None):
            self._inside.add(id(func))  # a function that reaches its own handler again is run as it is
            try:
                with self:
                    return _REDISPATCH(func, types_, args, kwargs)
            finally:
                self._inside.discard(id(func))
        return func(*args, **kwargs)

    # --- the policies ---------------------------------------------------------------------------
    def _apply(self, policy: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if policy == _LOWER:
            cast = self._lower
        elif policy == _FP32:
            cast = _to_fp32
        elif policy == _SET_DTYPE:
            first = next((a for a in _tensors(args)), None)
            if _floating(first) and kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        else:
            widest = _widest(list(_tensors(args)) + list(_tensors(kwargs.values())))
            if widest is None:
                return args, kwargs

            def cast(t: torch.Tensor) -> torch.Tensor:
                return self._lower(t) if widest == self._dtype else _to(t, widest)
        return _map(cast, args), {k: _map(cast, v) for k, v in kwargs.items()}

    def _lower(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype in (self._dtype, torch.float64):
            return t
        cacheable = t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
        if not cacheable:
            return t.to(self._dtype)
        hit = self._cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        out = t.to(self._dtype)
        self._cache[id(t)] = (weakref.ref(t), out)
        self._on_weight_cast(out)
        return out


def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not t.is_floating_point() or t.dtype in (dtype, torch.float64):
        return t
    return t.to(dtype)


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    return _to(t, torch.float32)


def _widest(tensors: list) -> torch.dtype | None:
    dtypes = [t.dtype for t in tensors if t.is_floating_point()]
    if not dtypes:
        return None
    widest = dtypes[0]
    for dtype in dtypes[1:]:
        widest = torch.promote_types(widest, dtype)
    return widest


def _tensors(values: Any) -> Any:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _map(cast: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return cast(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        mapped = [_map(cast, v) for v in value]
        return mapped if isinstance(value, list) else type(value)(mapped) if type(value) is tuple else tuple(mapped)
    return value


def _cuda_dropout(func: Callable, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``native_dropout`` for an out-of-place dropout in training, as CUDA's ``dropout`` runs it
    (``aten/src/ATen/native/Dropout.cpp``: the fused kernel when the input is on CUDA and
    ``0 < p < 1``); ``None`` when the call is left as it is."""
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x = bound.get("input")
    p = float(bound.get("p", 0.5))
    training = bool(bound.get("training", bound.get("train", True)))
    if not isinstance(x, torch.Tensor) or not training or bound.get("inplace", False) or not 0.0 < p < 1.0:
        return None
    if x.numel() == 0 or not x.is_floating_point():
        return None
    return torch.native_dropout(x, p, True)[0]
