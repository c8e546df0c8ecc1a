"""FLOP counting for one traced forward pass.

Units: floating-point operations, one multiply-add = 2 FLOPs, the convention of
``torch.utils.flop_counter`` (which this module uses as its base): matrix multiplications,
convolutions and attention are counted; elementwise, normalisation, reduction and data-movement
operations count 0. Bias additions are ignored, as that counter ignores them.

Where the counter reports nothing or too little on the CPU, this module adds formulas:

* ``aten._scaled_dot_product_flash_attention_for_cpu`` (the CPU kernel behind
  ``F.scaled_dot_product_attention``): the counter's own ``sdpa_flop_count`` (Q·Kᵀ plus P·V,
  ``4·B·H·Lq·Lk·E``; the causal mask is ignored, as the counter ignores it for the CUDA kernels).
* Recurrent layers (nn.LSTM/GRU/RNN), whose CPU kernels (``mkldnn_rnn_layer``) have no formula:
  :func:`rnn_flops`.
* Composite operations that reach the dispatcher undecomposed when autograd is off (under
  ``torch.inference_mode()``): ``aten.linear``, ``aten.matmul``, ``aten.conv*d``,
  ``aten.scaled_dot_product_attention``, with the same formulas as their decompositions.
* ``aten._grouped_mm``, the grouped GEMM of mixture-of-experts layers: 2 x output elements x K.
* Complex-valued matrix products count 4x: one complex multiply-add is 4 real multiplies and 4 real
  adds (8 FLOPs against 2).
* Dynamically quantized linear layers (``quantized::linear_dynamic``): :func:`linear_flops` from
  the unpacked weight's shape.
* ``aten._trilinear`` (nn.Bilinear, ``F.bilinear``): one multiply-add per term of the broadcast
  product of its three operands, ``2 x N x out x in1 x in2`` for a bilinear layer.
* Interpolation (``upsample_*``, ``grid_sampler_*``) is data movement with weights, counted 0 like
  every elementwise op, whatever the mode (nearest, linear, bilinear, bicubic, trilinear): listed by
  exact name, so no mode is taken for a costly op because of a word in its name.

An operation that does cost FLOPs but has no formula (a custom C++ op, an FFT, a quantized kernel
outside the cases above) is reported by name as *uncounted*, never as a silent zero.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch
from torch.utils import flop_counter as _fc
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FlopMode", "flop_kind", "rnn_flops", "linear_flops", "op_flops"]

_aten = torch.ops.aten
_LOCAL_SCALAR = _aten._local_scalar_dense.default


def sdpa_flops(query: Any, key: Any, value: Any) -> int:
    """FLOPs of scaled dot-product attention on query, key and value shapes ``(..., length, head
    dim)`` (``(batch, heads, length, head dim)`` as a rule): the two batched matrix products,
    ``q @ k^T`` and ``scores @ v``, at 2 FLOPs a multiply-add, over the query's leading dims
    (grouped key/value heads are broadcast to the query's); softmax and scaling are not counted.
    On 4-D shapes this is ``torch.utils.flop_counter.sdpa_flop_count`` (tested equal), without its
    per-call checks, which cost 40 us a call."""
    rows = 1
    for d in query[:-2]:
        rows *= int(d)
    s_q, d_q = int(query[-2]), int(query[-1])
    return 2 * rows * s_q * int(key[-2]) * (d_q + int(value[-1]))


def _sdpa_flops(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return sdpa_flops(query.shape, key.shape, value.shape)


# Formulas this module adds, keyed by op packet, with the same signature as the registry's.
_EXTRA: dict[Any, Callable[..., int]] = {}
if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _EXTRA[_aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops


def _vector_flops(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    # dot/vdot: n multiply-adds; mv: m*n.
    return 2 * int(a.numel()) if a.dim() == 1 else 2 * int(a.shape[0]) * int(a.shape[1])


def _addmv_flops(bias: Any, mat: Any, vec: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return 2 * int(mat.shape[0]) * int(mat.shape[1])  # the added vector is ignored, as for addmm


def _addbmm_flops(bias: Any, b1: Any, b2: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    batch, m, k = (int(d) for d in b1.shape)
    return 2 * batch * m * k * int(b2.shape[-1])


def _linear_flops(x: Any, weight: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    # aten.linear reaches the dispatcher undecomposed under inference_mode: x @ weight.T
    out_features, in_features = int(weight.shape[0]), int(weight.shape[-1])
    rows = int(x.numel()) // in_features if in_features else 0
    return 2 * rows * in_features * out_features


def _matmul_flops(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    # every output element is a dot product over a's last dim
    k = int(a.shape[-1])
    out_numel = int(out_val.numel()) if isinstance(out_val, torch.Tensor) else 0
    return 2 * out_numel * k


def _conv_flops(x: Any, weight: Any, *args: Any, out_val: Any = None, transposed: bool = False, **kwargs: Any) -> int:
    return int(_fc.conv_flop_count(list(x.shape), list(weight.shape), list(out_val.shape), transposed=transposed))


def _conv_transpose_flops(x: Any, weight: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return _conv_flops(x, weight, out_val=out_val, transposed=True)


# Composite ops that reach a dispatch mode undecomposed when autograd is off (inference_mode).
for _name, _formula in (("linear", _linear_flops), ("matmul", _matmul_flops),
                        ("conv1d", _conv_flops), ("conv2d", _conv_flops), ("conv3d", _conv_flops),
                        ("conv_transpose1d", _conv_transpose_flops),
                        ("conv_transpose2d", _conv_transpose_flops),
                        ("conv_transpose3d", _conv_transpose_flops),
                        ("scaled_dot_product_attention", _sdpa_flops),
                        # grouped GEMM of mixture-of-experts layers: each token's row meets its
                        # expert's K x N matrix, 2 x out elements x K (the forward's 2-D x 3-D form)
                        ("_grouped_mm", _matmul_flops)):
    if hasattr(_aten, _name):
        _EXTRA[getattr(_aten, _name)] = _formula

def _trilinear_flops(i1: Any, i2: Any, i3: Any, expand1: Any, expand2: Any, expand3: Any, sumdim: Any,
                     *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """Each operand with size-1 dims inserted at its ``expand`` positions, broadcast together: one
    multiply-add per element of that product (the ``sumdim`` axes are summed over)."""
    shapes = []
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        shape = list(t.shape)
        for d in sorted(expand):
            shape.insert(d, 1)
        shapes.append(shape)
    terms = 1
    for sizes in zip(*shapes):
        terms *= max(int(d) for d in sizes)
    return 2 * terms


if hasattr(_aten, "_trilinear"):
    _EXTRA[_aten._trilinear] = _trilinear_flops

for _name, _formula in (("dot", _vector_flops), ("vdot", _vector_flops), ("mv", _vector_flops),
                        ("addmv", _addmv_flops), ("addbmm", _addbmm_flops)):
    if hasattr(_aten, _name):
        _EXTRA[getattr(_aten, _name)] = _formula

# aten ops that perform real arithmetic: one of these without a formula is reported as uncounted.
# Everything else in aten is elementwise, a reduction, a normalisation or data movement, which the
# counter's convention counts as 0.
_COSTLY_FRAGMENTS = ("lstm", "gru", "rnn", "attention", "fft", "stft", "matmul", "einsum",
                     "bilinear", "tensordot", "cdist", "linear", "conv")
_MATMUL_NAME = re.compile(r"mm($|_)")  # mm, addmm, _int_mm, _weight_int8pack_mm; not cummax
_NOT_COSTLY = ("convert", "_conv_depthwise2d_backward")  # names that contain a fragment by accident
#: Interpolation: weighted gathers, 0 by the counter's convention (see the module docstring).
_FREE_OPS = frozenset({
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "upsample_trilinear3d",
    "grid_sampler", "grid_sampler_2d", "grid_sampler_3d", "_grid_sampler_2d_cpu_fallback", "affine_grid_generator",
})
_FREE_NAMESPACES = ("aten", "prim", "prims")

# Uncounted ops that a node-level formula covers (the node replaces its count with the formula).
NODE_FORMULA_OPS = frozenset(
    {
        "aten.mkldnn_rnn_layer",
        "aten.quantized_lstm",
        "aten.quantized_gru",
        "aten.lstm",
        "aten.gru",
        "aten.rnn_tanh",
        "aten.rnn_relu",
        "aten._thnn_fused_lstm_cell",
        "aten._thnn_fused_gru_cell",
        "quantized.linear_dynamic",
        "quantized.linear_dynamic_fp16",
        "quantized.linear",
    }
)


def _is_costly(name: str, namespace: str) -> bool:
    if namespace not in _FREE_NAMESPACES:
        return True
    base = name.split(".", 1)[1] if "." in name else name
    if base in _FREE_OPS or any(word in base for word in _NOT_COSTLY):
        return False
    return any(frag in base for frag in _COSTLY_FRAGMENTS) or bool(_MATMUL_NAME.search(base))


def _shape(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.shape
    if isinstance(x, (list, tuple)):
        return type(x)(_shape(v) for v in x)
    return x


def _registry_formula(packet: Any) -> Callable[..., int] | None:
    """The counter's formula for ``packet`` as a function of shapes (``out_shape=`` keyword).

    The registry wraps each formula in ``shape_wrapper``, which maps a pytree over every call;
    calling the wrapped function with shapes made here does the same work in a fraction of the
    time (``__wrapped__`` is set by ``functools.wraps``)."""
    wrapped = _fc.flop_registry.get(packet)
    if wrapped is None:
        return None
    raw = getattr(wrapped, "__wrapped__", None)
    if raw is None:
        return lambda *args, out_val=None, **kwargs: wrapped(*args, out_val=out_val, **kwargs)

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return raw(*(_shape(a) for a in args), out_shape=_shape(out_val),
                   **{k: _shape(v) for k, v in kwargs.items()})

    return formula


# Per operator overload: (formula or None, its name, whether it costs FLOPs without a formula).
_CLASSIFIED: dict[Any, tuple[Callable[..., int] | None, str, bool]] = {}


def _classify(func: Any) -> tuple[Callable[..., int] | None, str, bool]:
    entry = _CLASSIFIED.get(func)
    if entry is None:
        packet = func._overloadpacket
        name = str(packet)
        formula = _registry_formula(packet) or _EXTRA.get(packet)
        costly = formula is None and _is_costly(name, getattr(func, "namespace", "aten"))
        entry = _CLASSIFIED[func] = (formula, name, costly)
    return entry


def _count(formula: Callable[..., int], args: tuple, kwargs: dict, out: Any) -> int:
    flops = int(formula(*args, **kwargs, out_val=out))
    if isinstance(out, torch.Tensor) and out.is_complex():
        flops *= 4  # a complex multiply-add is 4 real multiplies and 4 real adds
    return flops


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int | None:
    """FLOPs of one aten call, or ``None`` when it costs FLOPs that no formula counts.

    Returns 0 for operations the counter's convention does not count (elementwise and the like).
    """
    formula, _, costly = _classify(func)
    if formula is not None:
        return _count(formula, args, kwargs, out)
    return None if costly else 0


class FlopMode(TorchDispatchMode):
    """A dispatch mode that hands each operation's FLOPs to ``sink(flops, op_name)``.

    ``flops`` is ``None`` for an operation that could not be counted. With ``scalars`` (a list),
    every tensor value the forward reads into Python (``.item()``, ``bool(t)``: ``aten._local_scalar_dense``)
    is appended to it, in order.

    :meth:`suspend` takes the mode off the dispatch stack (while a layer whose FLOPs have a closed
    form runs) and :meth:`resume` puts it back; they pair up, and :meth:`restore` puts back
    whatever an exception left popped.

    ``__torch_dispatch__`` is not wrapped in ``torch._disable_dynamo`` (``_should_skip_dynamo``
    is False): the wrapper imports ``torch._dynamo`` on the first operation (about a second of a
    cold start) and adds a call per operation, and the trace never compiles.
    """

    def __init__(self, sink: Callable[[int | None, str], None], scalars: list | None = None) -> None:
        super().__init__()
        self._sink = sink
        self._scalars = scalars
        self._popped: list[bool] = []
        #: Called with ``(func, args)`` before each matrix product runs (the tracer's dtype check on
        #: the meta device, whose kernels skip it); None: no check.
        self.check: Callable[[Any, tuple], None] | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def suspend(self) -> bool:
        """Pop this mode off the dispatch stack if it is on top; True when it was popped."""
        depth = torch._C._len_torch_dispatch_stack()
        popped = depth > 0 and torch._C._get_dispatch_stack_at(depth - 1) is self
        if popped:
            torch._C._pop_torch_dispatch_stack(None)
        self._popped.append(popped)
        return popped

    def resume(self) -> None:
        """Push back what the matching :meth:`suspend` popped."""
        if self._popped and self._popped.pop():
            torch._C._push_on_torch_dispatch_stack(self)

    def restore(self) -> None:
        """Push back everything still popped (a forward raised inside a layer)."""
        while self._popped:
            self.resume()

    def call_outside(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)`` with this mode off the dispatch stack when it is on top
        (:meth:`suspend` and :meth:`resume` around one call, in one frame)."""
        depth = torch._C._len_torch_dispatch_stack()
        if depth > 0 and torch._C._get_dispatch_stack_at(depth - 1) is self:
            torch._C._pop_torch_dispatch_stack(None)
            try:
                return func(*args, **kwargs)
            finally:
                torch._C._push_on_torch_dispatch_stack(self)
        return func(*args, **kwargs)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if self.check is not None and func.overloadpacket in MATRIX_PRODUCTS:
            self.check(func, args)
        out = func(*args, **kwargs)
        if func is _LOCAL_SCALAR and self._scalars is not None:
            self._scalars.append(out)
        entry = _CLASSIFIED.get(func) or _classify(func)
        if entry[0] is not None:
            flops = _count(entry[0], args, kwargs, out)
            if flops:
                self._sink(flops, entry[1])
        elif entry[2]:
            self._sink(None, entry[1])
        return out


#: The matrix products whose CPU and CUDA kernels want every operand of one dtype.
MATRIX_PRODUCTS = frozenset(getattr(_aten, name) for name in (
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear")
    if hasattr(_aten, name))


def same_dtype_operands(func: Any, args: tuple) -> None:
    """Raise ``RuntimeError`` when the tensor operands of a matrix product ``func`` have different
    dtypes, as the CPU and CUDA kernels do (``expected m1 and m2 to have the same dtype``)."""
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    if len(dtypes) > 1:
        names = " and ".join(sorted(str(d).replace("torch.", "") for d in dtypes))
        raise RuntimeError(f"{func.overloadpacket.__name__} of {names} operands, which PyTorch's CPU and CUDA "
                           "kernels refuse (a matrix product takes one dtype)")


def flop_kind(op: str) -> str:
    """The kind of work an operation's FLOPs are: ``"convolution"`` (``aten.convolution``,
    ``aten.conv2d``, ...) or ``"matmul"`` (matrix products, attention's included, and anything else
    counted). ``op`` is the name :class:`FlopMode` reports. Attention has no kind of its own: the
    CPU runs a fused kernel where the meta device runs its matrix products one by one, and the kinds
    must not depend on the device."""
    base = op.rsplit(".", 1)[-1]
    if "conv" in base and not any(word in base for word in _NOT_COSTLY):
        return "convolution"
    return "matmul"


def linear_flops(in_features: int, out_features: int, rows: int) -> int:
    """FLOPs of ``rows`` vectors through a dense ``in_features -> out_features`` map:
    ``2 * rows * in_features * out_features`` (bias ignored)."""
    return 2 * rows * in_features * out_features


def rnn_flops(module: torch.nn.RNNBase, seq_len: int, batch: int) -> int:
    """FLOPs of an nn.LSTM/GRU/RNN forward over ``seq_len`` steps for ``batch`` sequences.

    Per layer, direction and step, the gate matrix products ``W_ih·x`` and ``W_hh·h``:
    ``2 * G * H * (I_l + H_r)`` with ``G`` = 4 gates (LSTM), 3 (GRU) or 1 (RNN), ``H`` the hidden
    size, ``I_l`` the layer's input width (``input_size`` for the first layer, ``D * H_r`` after),
    ``H_r`` the recurrent width (``proj_size`` when set, else ``H``); an LSTM projection adds
    ``2 * H * proj_size``. Gate nonlinearities, elementwise products and biases are ignored
    (the same convention as ``torch.utils.flop_counter``).
    """
    mode = getattr(module, "mode", "RNN_TANH")
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    hidden = module.hidden_size
    proj = getattr(module, "proj_size", 0) or 0
    rec = proj or hidden
    dirs = 2 if module.bidirectional else 1
    total = 0
    for layer in range(module.num_layers):
        width_in = module.input_size if layer == 0 else dirs * rec
        per_step = 2 * gates * hidden * (width_in + rec)
        if proj:
            per_step += 2 * hidden * proj
        total += dirs * per_step
    return total * seq_len * batch
