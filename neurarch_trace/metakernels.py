"""Shape functions for the meta kernels that PyTorch runs as slow Python decompositions.

On the meta device an operation computes only its outputs' metadata (shape, strides, dtype). Most
meta kernels are C++; a few common ones are Python decompositions (``torch._decomp``) that run the
whole computation prim by prim, checks and type promotion included. Measured on torch 2.13 (one
CPU thread, AMD EPYC): a meta ``native_batch_norm`` takes 1.8 ms in eval mode and 4.3 ms when
training under bf16, its backward 3.2 ms, ``native_layer_norm`` 2 ms and its backward 3 ms,
``gelu_backward`` 2.4 ms, ``threshold_backward`` (ReLU's backward) 0.7 ms, where a C++ meta kernel
takes about 10 us. BatchNorm is 93 ms of a ResNet-50 forward's 100 ms on meta, and about 180 ms of
its rehearsed training step's 330 ms.

:class:`MetaKernels` answers those operations from their inputs' metadata alone, with fresh meta
tensors of the metadata PyTorch's own kernel gives, and hands every other call to PyTorch:

* only well-formed calls get a shortcut (meta tensors, dense floating inputs, per-channel tensors
  of the right length, more than one value per channel when BatchNorm trains): every error the
  kernel raises is still raised by the kernel;
* the first call of each *class* also runs PyTorch's kernel and compares every output's shape,
  strides, dtype and storage size. The class is the operation with each tensor argument's rank,
  dtype, stride order and size-one dimensions, and the flags (training, output masks, the GELU
  approximation); a class whose answers differ is left to PyTorch for the rest of the process. A
  PyTorch release that changes a meta kernel costs speed, never truth;
* meta tensors hold no values, so the in-place updates a kernel makes (BatchNorm's running
  statistics) change nothing that can be read, as ``FakeTensorMode``'s cache assumes too.

:class:`MetaKernelMode` is a dispatch mode that applies them to every operation of a forward pass
on the meta device (the tracer enters it below its FLOP mode, so it stays on inside the layers
whose FLOPs have a closed form, where the FLOP mode steps aside), when the model has a layer that
calls one of them (:func:`worth_a_mode`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional

import torch
from torch._prims_common import get_computation_dtype as _acc
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MetaKernels", "MetaKernelMode", "SHORTCUTS", "worth_a_mode"]

_aten = torch.ops.aten
_FLOATING = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
#: Plain tensors and parameters (a subclass may carry a layout or dtype rule of its own).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def _dense(t: torch.Tensor) -> bool:
    """True for a strided meta tensor of a floating dtype whose elements fill its storage span
    without gaps or overlaps, whatever the order of its dimensions."""
    if type(t) not in _PLAIN or not t.is_meta or t.dtype not in _FLOATING or t.layout is not torch.strided:
        return False
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _like(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=dtype or t.dtype, device="meta")


def _new(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, strides and dtype: an elementwise pair whose output layout follows both."""
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()


def _shaped(t: Any, shape: tuple) -> bool:
    """A plain floating meta tensor of exactly ``shape``."""
    return type(t) in _PLAIN and t.is_meta and tuple(t.shape) == shape and t.dtype in _FLOATING


def _per_channel(t: Optional[torch.Tensor], channels: int) -> bool:
    return t is None or _shaped(t, (channels,))


def _statistics(input: Any, normalized_shape: Any) -> Optional[tuple]:
    """LayerNorm's statistics shape, ``input.shape[:-k] + (1,) * k``, for a dense input whose last
    ``k`` dims are ``normalized_shape``; None otherwise."""
    k = len(normalized_shape)
    if not _dense(input) or k == 0 or k > input.dim() or tuple(input.shape[-k:]) != tuple(normalized_shape):
        return None
    return tuple(input.shape[:-k]) + (1,) * k


def _batch_norm(input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: Any,
                momentum: Any = 0.1, eps: Any = 1e-5) -> Any:
    """``aten.native_batch_norm``: ``(output like input, save_mean [C], save_invstd [C])``, the
    saved statistics in the accumulation dtype (float32 for half inputs), as on CUDA."""
    if not _dense(input) or input.dim() < 2:
        return None
    channels = input.shape[1]
    if not all(_per_channel(t, channels) for t in (weight, bias, running_mean, running_var)):
        return None
    if (running_mean is None) != (running_var is None):
        return None
    if training and (running_mean is not None and input.numel() <= channels):
        return None  # one value per channel: the kernel's own error
    if not training and running_mean is None:
        return None
    acc = _acc(input.dtype)
    return _like(input), _new((channels,), acc), _new((channels,), acc)


def _batch_norm_backward(grad_out: Any, input: Any, weight: Any, running_mean: Any, running_var: Any,
                         save_mean: Any, save_invstd: Any, train: Any, eps: Any, output_mask: Any) -> Any:
    """``aten.native_batch_norm_backward``: ``(grad_input like input, grad_weight [C], grad_bias
    [C])`` in the weight's dtype; the gradient of the input comes whatever the mask says (PyTorch's
    meta kernel computes it always), the others only where the mask asks."""
    if not _dense(input) or input.dim() < 2 or type(grad_out) not in _PLAIN or not _same(grad_out, input):
        return None
    channels = input.shape[1]
    if not all(_per_channel(t, channels) for t in (weight, running_mean, running_var, save_mean, save_invstd)):
        return None
    if (train and (save_mean is None or save_invstd is None)) or \
            (not train and (running_mean is None or running_var is None)):
        return None
    dtype = weight.dtype if weight is not None else input.dtype
    return (_like(input), _new((channels,), dtype) if output_mask[1] else None,
            _new((channels,), dtype) if output_mask[2] else None)


def _layer_norm(input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any = 1e-5) -> Any:
    """``aten.native_layer_norm``: ``(output like input, mean, rstd)``, the statistics of shape
    ``input.shape[:-k] + (1,) * k`` in the accumulation dtype."""
    stats = _statistics(input, normalized_shape)
    if stats is None or not all(t is None or _shaped(t, tuple(normalized_shape)) for t in (weight, bias)):
        return None
    acc = _acc(input.dtype)
    return _like(input), _new(stats, acc), _new(stats, acc)


def _layer_norm_backward(grad_out: Any, input: Any, normalized_shape: Any, mean: Any, rstd: Any, weight: Any,
                         bias: Any, output_mask: Any) -> Any:
    """``aten.native_layer_norm_backward``: ``(grad_input like input, grad_weight like weight,
    grad_bias like bias)``, each only where the mask asks."""
    stats = _statistics(input, normalized_shape)
    if stats is None or type(grad_out) not in _PLAIN or not _same(grad_out, input):
        return None
    if not (_shaped(mean, stats) and _shaped(rstd, stats)):
        return None
    out = []
    for wanted, t in ((output_mask[1], weight), (output_mask[2], bias)):
        if not wanted:
            out.append(None)
        elif _shaped(t, tuple(normalized_shape)):
            out.append(_like(t))
        else:
            return None
    return (_like(input) if output_mask[0] else None, out[0], out[1])


def _unary(self: Any, *args: Any, **kwargs: Any) -> Any:
    """An elementwise operation of one tensor (``aten.gelu``): an output like its input."""
    return _like(self) if _dense(self) else None


def _elementwise_backward(grad_output: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """An elementwise backward of two same-layout tensors (``threshold_backward``,
    ``gelu_backward``): a gradient like them."""
    if not _dense(self) or type(grad_output) not in _PLAIN or not _same(grad_output, self):
        return None
    return _like(self)


#: aten overload -> its shape function (``None``: leave the call to PyTorch).
SHORTCUTS: Dict[Any, Callable[..., Any]] = {
    _aten.native_batch_norm.default: _batch_norm,
    _aten.native_batch_norm_backward.default: _batch_norm_backward,
    _aten.native_layer_norm.default: _layer_norm,
    _aten.native_layer_norm_backward.default: _layer_norm_backward,
    _aten.gelu.default: _unary,
    _aten.gelu_backward.default: _elementwise_backward,
    _aten.threshold_backward.default: _elementwise_backward,
}

#: class key -> whether the shortcut gave PyTorch's answer (one process, one PyTorch).
_VERIFIED: Dict[Any, bool] = {}


def _rank(strides: tuple) -> tuple:
    order = sorted(set(strides))
    return tuple(order.index(s) for s in strides)


def _class_key(func: Any, args: tuple, kwargs: dict) -> Any:
    """What a shortcut's rule depends on besides the sizes it reads: per tensor its rank, dtype,
    stride order and size-one dimensions; per list its length (a shape) or its value (a mask);
    flags and strings by value; floats (eps, momentum) not at all."""
    parts: list = [func]
    for name, value in (*((None, a) for a in args), *kwargs.items()):
        if name is not None:
            parts.append(name)
        if type(value) in _PLAIN:
            shape = tuple(value.shape)
            parts.append((value.dtype, len(shape), _rank(value.stride()), tuple(s == 1 for s in shape)))
        elif isinstance(value, (list, tuple)):
            parts.append(tuple(value) if all(type(v) is bool for v in value) else ("len", len(value)))
        elif type(value) is float:
            parts.append(float)
        else:
            parts.append(value)
    return tuple(parts)


def _describe(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.stride(), out.dtype, out.device.type, out.storage_offset(),
                out.untyped_storage().nbytes())
    if isinstance(out, (tuple, list)):
        return (type(out), tuple(_describe(item) for item in out))
    return out


class MetaKernels:
    """``call(func, args, kwargs)``: ``func(*args, **kwargs)``, answered by its shape function when
    it has one (:data:`SHORTCUTS`) and the call's class matched PyTorch's kernel (see the module
    docstring). ``shortcuts`` counts the calls answered so (for the benchmark)."""

    def __init__(self) -> None:
        self.shortcuts = 0

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        shortcut = SHORTCUTS.get(func)
        if shortcut is None:
            return func(*args, **kwargs)
        try:
            fast = shortcut(*args, **kwargs)
        except (TypeError, IndexError):  # arguments of another form than the schema's usual one
            fast = None
        if fast is None:
            return func(*args, **kwargs)
        key = _class_key(func, args, kwargs)
        verified = _VERIFIED.get(key)
        if verified:
            self.shortcuts += 1
            return fast
        if verified is None:  # the class's first call: PyTorch's own answer, compared
            out = func(*args, **kwargs)
            _VERIFIED[key] = _describe(out) == _describe(fast)
            return out
        return func(*args, **kwargs)


#: The layers whose forward runs an operation of :data:`SHORTCUTS` (subclasses included).
LAYERS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GELU)


def worth_a_mode(modules: Iterable[torch.nn.Module]) -> bool:
    """True when one of ``modules`` is a :data:`LAYERS` layer. The mode costs every operation of a
    forward a trip through Python (about 1 us; 39 ms of a LLaMA-7B meta trace's 0.39 s, whose RMS
    norms and SiLUs have C++ meta kernels), so a forward with no such layer runs without it."""
    return any(isinstance(m, LAYERS) for m in modules)


class MetaKernelMode(TorchDispatchMode):
    """A dispatch mode that runs every operation through :class:`MetaKernels` (for a forward pass
    on the meta device). Like the FLOP mode, it is not wrapped in ``torch._disable_dynamo``, which
    imports ``torch._dynamo`` on first use."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = MetaKernels()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        if func not in SHORTCUTS:
            return func(*args, **(kwargs or {}))
        return self.kernels.call(func, args, kwargs or {})
