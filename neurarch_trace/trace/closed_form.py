"""Leaf layers whose FLOPs have a closed form in their shapes: counted from the hooks, not op by op.

The FLOP-counting dispatch mode (:class:`neurarch_trace.flops.FlopMode`) costs every aten call a
trip through Python. For the leaf layers below, the same count follows from the call's input and
output shapes and the layer's weight shape, so the recorder takes the mode off the dispatch stack
while such a layer runs and charges it the closed form instead (:func:`closed_form`). The formulas
are those :mod:`torch.utils.flop_counter` applies to the aten calls these layers make (one
multiply-add = 2 FLOPs, biases ignored):

* ``nn.Linear`` (and transformers' GPT-2 ``Conv1D``): ``aten.mm``/``addmm``/``mv``, or ``aten.linear``
  under ``torch.inference_mode()``: ``2 * rows * in_features * out_features``, ``rows`` the product
  of the input's leading dims.
* ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``: ``aten.convolution``:
  :func:`torch.utils.flop_counter.conv_flop_count` of the (batched) input, weight and output shapes.
* Normalisations, activations, pooling, embeddings, dropout, padding, flatten, pixel shuffles:
  elementwise, reduction and data-movement ops, which the convention counts as 0.

A call qualifies only when nothing else can run inside it (:func:`closed_form`): the class's own
``forward`` is the one the formula was written for (a subclass adds nothing but ``__init__`` and
the like; a parametrized, LoRA or quantization-aware subclass does not qualify), the module has no
hooks but the recorder's, no global forward hook is installed, and every tensor argument, weight and
bias is a plain real-valued ``torch.Tensor`` or ``nn.Parameter`` (no tensor subclass, no complex
dtype). Every other layer runs under the dispatch mode and is counted op by op, so formulas that
:mod:`neurarch_trace.flops` gains apply to them. Equality with the op-by-op count is checked per
type in ``tests/test_closed_form.py`` on many shapes, groups, strides, dilations, batch sizes,
dtypes and grad modes, and on whole graphs of the architecture sweep (``reference_path()``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Dict, Iterator, Optional, Tuple, Union

import torch
from torch import nn
from torch.utils.flop_counter import conv_flop_count

from neurarch_trace.trace.tensors import iter_tensors

__all__ = ["Formula", "ZERO_FLOP_FUNCTIONS", "closed_form", "enabled", "formula_for", "formula_kind", "module_formula",
           "plain_types", "reference_path"]

#: ``formula(module, first input's shape, first output's shape) -> FLOPs`` at the traced batch; a
#: shape is a ``torch.Size`` or a tuple of ints.
Shape = Tuple[int, ...]
Formula = Callable[[nn.Module, Shape, Optional[Shape]], int]


def _zero(module: nn.Module, x: Shape, out: Optional[Shape]) -> int:
    return 0


def _linear(module: nn.Module, x: Shape, out: Optional[Shape]) -> int:
    # F.linear folds every leading dim into rows: mm/addmm (2-D and more), mv (1-D)
    in_features, out_features = int(module.weight.shape[1]), int(module.weight.shape[0])
    return 2 * math.prod(x[:-1]) * in_features * out_features


def _hf_conv1d(module: nn.Module, x: Shape, out: Optional[Shape]) -> int:
    # transformers' Conv1D: addmm(bias, x.view(-1, in), weight) with weight (in, out)
    in_features, out_features = int(module.weight.shape[0]), int(module.weight.shape[1])
    return 2 * math.prod(x[:-1]) * in_features * out_features


def _conv(transposed: bool) -> Formula:
    def formula(module: nn.Module, x: Shape, out: Optional[Shape]) -> int:
        return int(conv_flop_count(list(x), list(module.weight.shape), list(out), transposed=transposed))

    _CONV_FORMULAS.add(formula)
    return formula


#: The convolution formulas (:func:`formula_kind`).
_CONV_FORMULAS: set = set()


_ZERO_TYPES = (
    # normalisations
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "RMSNorm", "LocalResponseNorm",
    # activations
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Hardswish",
    "Hardsigmoid", "Hardtanh", "Hardshrink", "Softshrink", "Tanhshrink", "Threshold", "Sigmoid", "LogSigmoid",
    "Tanh", "Softplus", "Softsign", "GLU", "Softmax", "Softmin", "LogSoftmax", "Softmax2d",
    # pooling
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "LPPool1d", "LPPool2d",
    # lookups, dropout, data movement
    "Embedding", "EmbeddingBag", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
    "FeatureAlphaDropout", "Flatten", "Unflatten", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d",
    "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d",
    "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d", "CircularPad2d",
    "CircularPad3d", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle",
)

#: torch.nn classes with a closed form (missing names in an older torch are skipped).
_TORCH: Dict[type, Formula] = {
    nn.Linear: _linear,
    nn.Conv1d: _conv(False),
    nn.Conv2d: _conv(False),
    nn.Conv3d: _conv(False),
    nn.ConvTranspose1d: _conv(True),
    nn.ConvTranspose2d: _conv(True),
    nn.ConvTranspose3d: _conv(True),
    **{getattr(nn, name): _zero for name in _ZERO_TYPES if hasattr(nn, name)},
}

#: transformers classes, by exact name (their module under ``transformers.``), whose own forward is
#: elementwise (activations, RMS and channel-first layer norms) or GPT-2's Conv1D.
_TRANSFORMERS: Dict[str, Formula] = {
    "Conv1D": _hf_conv1d,
    **{name: _zero for name in (
        "GELUActivation", "NewGELUActivation", "FastGELUActivation", "QuickGELUActivation",
        "AccurateGELUActivation", "GELUTanh", "PytorchGELUTanh", "ClippedGELUActivation", "SiLUActivation",
        "MishActivation", "LaplaceActivation", "ReLUSquaredActivation", "LinearActivation",
        "LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "GemmaRMSNorm", "MixtralRMSNorm",
        "T5LayerNorm", "ConvNextLayerNorm",
    )},
}

#: Class attributes a subclass may add and still run its base's forward unchanged.
_INERT = frozenset({
    "__module__", "__qualname__", "__doc__", "__init__", "__annotations__", "__dict__", "__weakref__",
    "__constants__", "_version", "extra_repr", "reset_parameters", "__firstlineno__", "__static_attributes__",
    "__parameters__", "__orig_bases__", "__slotnames__", "__abstractmethods__", "_abc_impl",
    "cls_to_become", "__annotate_func__", "__annotations_cache__",
})

_BY_CLASS: Dict[type, Optional[Formula]] = {}


def _torch_formula(cls: type) -> Optional[Formula]:
    for base in cls.__mro__:
        formula = _TORCH.get(base)
        if formula is not None:
            # every class between cls and the torch base adds nothing that changes the forward
            for sub in cls.__mro__[: cls.__mro__.index(base)]:
                if not set(vars(sub)) <= _INERT:
                    return None
            return formula
        if base is nn.Module:
            break
    return None


def _find_formula(cls: type) -> Optional[Formula]:
    formula = _torch_formula(cls)
    if formula is not None:
        return formula
    # a transformers class of the table, a torch layer's subclass with a forward of its own
    # included (ConvNextLayerNorm: nn.LayerNorm with permutes around it for channels-first input)
    module = cls.__module__
    if module.startswith("transformers."):
        formula = _TRANSFORMERS.get(cls.__name__)
        forward = vars(cls).get("forward")
        # the class's own forward, defined where the class is (not replaced by a hub kernel)
        if formula is not None and forward is not None and getattr(forward, "__module__", None) == module:
            return formula
    return None


def formula_for(cls: type) -> Optional[Formula]:
    """The closed form of layer class ``cls``, or None when its calls are counted op by op."""
    try:
        return _BY_CLASS[cls]
    except KeyError:
        formula = _BY_CLASS[cls] = _find_formula(cls)
        return formula


def formula_kind(formula: Formula) -> str:
    """The kind of work a closed form counts, as :func:`neurarch_trace.flops.flop_kind` names the
    aten operations it stands for: ``"convolution"`` or ``"matmul"``."""
    return "convolution" if formula in _CONV_FORMULAS else "matmul"


def _plain(t: torch.Tensor) -> bool:
    cls = type(t)
    return (cls is torch.Tensor or cls is nn.Parameter) and not t.is_complex()


def module_formula(module: nn.Module) -> Optional[Formula]:
    """The closed form of ``module`` as far as the module alone says (its class, its weights and
    biases plain tensors, a weight where the formula reads one), or None: what
    :func:`closed_form` checks before the call's own arguments, hooks and ``forward``."""
    formula = formula_for(type(module))
    if formula is None:
        return None
    for t in module._parameters.values():
        if t is not None and not _plain(t):
            return None
    if formula is not _zero and module._parameters.get("weight") is None:
        return None
    return formula


def closed_form(module: nn.Module, args: tuple, kwargs: dict,
                formula: Union[Formula, None, bool] = False, traced: Optional[Callable] = None) -> Optional[Formula]:
    """The closed form for this call of ``module`` with ``args``/``kwargs``, or None when the call
    must be counted op by op (see the module docstring for the conditions); ``formula``, when
    given, is :func:`module_formula` of ``module`` (read once per module by the recorder).

    The recorder runs around the module's forward either as one pre-hook and one forward hook
    (``traced`` None: then any other hook, or a ``forward`` instance attribute, is the user's) or
    as the ``forward`` instance attribute ``traced`` (then any hook at all is the user's)."""
    if formula is False:
        formula = module_formula(module)
    if formula is None:
        return None
    hooks = 1 if traced is None else 0
    if len(module._forward_pre_hooks) != hooks or len(module._forward_hooks) != hooks or \
            module.__dict__.get("forward") is not traced:
        return None
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):  # most calls: one tensor
        first = args[0]
        if not _plain(first):
            return None
    else:
        first = None
        for t in iter_tensors(args):
            if not _plain(t):
                return None
            if first is None:
                first = t
        if first is None:
            return None
        if kwargs and not all(_plain(t) for t in iter_tensors(kwargs)):
            return None
    if formula is not _zero and formula is not _linear and formula is not _hf_conv1d and \
            first.dim() != module._parameters["weight"].dim():
        return None  # an unbatched convolution: counted op by op, as it always was
    return formula


#: Tensor methods, torch functions and torch.nn.functional functions that dispatch only aten ops
#: of 0 FLOPs and none without a formula (views, copies, elementwise arithmetic, comparisons,
#: reductions, concatenation, factories), for plain tensors. Between layers the flow mode takes the
#: FLOP mode off the dispatch stack around them (:func:`neurarch_trace.trace.provenance`'s
#: ``FlowMode``); every other call keeps it. ``tests/test_closed_form.py`` runs each one under the
#: FLOP mode and checks that it counts nothing. Never here: matrix products, convolutions,
#: attention, interpolation, anything a formula of :mod:`neurarch_trace.flops` may count; nor a
#: function that can read a tensor's value into Python (``item``, ``bool(t)``, ``repeat_interleave``
#: with tensor repeats): the FLOP mode records those values, which the rehearsal replays.
_ZERO_TENSOR_METHODS = (
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "split", "chunk",
    "unbind", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten", "narrow", "select", "t",
    "__getitem__", "__setitem__", "to", "float", "half", "bfloat16", "long", "int", "bool", "type_as", "clone",
    "detach", "repeat", "masked_fill", "masked_fill_", "add", "add_", "sub", "sub_", "mul",
    "mul_", "div", "div_", "neg", "pow", "sqrt", "rsqrt", "exp", "log", "abs", "tanh", "sigmoid", "relu",
    "softmax", "log_softmax", "clamp", "mean", "sum", "amax", "argmax", "cumsum", "eq", "ne", "lt", "gt", "le",
    "ge", "all", "any", "flip", "roll", "tril", "triu", "__rsub__", "__rtruediv__", "__neg__", "__pow__",
    "__eq__", "__and__", "__or__", "__invert__", "size", "dim",
)
_ZERO_TORCH_FUNCTIONS = (
    "cat", "concat", "stack", "arange", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "empty",
    "empty_like", "where", "tril", "triu", "cumsum", "diff", "tanh", "exp", "sigmoid", "masked_fill", "flatten",
    "reshape", "transpose", "permute", "unsqueeze", "squeeze", "split", "chunk",
)
_ZERO_FUNCTIONAL = ("dropout", "softmax", "log_softmax", "gelu", "silu", "relu", "pad", "layer_norm", "embedding")
ZERO_FLOP_FUNCTIONS: frozenset = frozenset(
    [getattr(torch.Tensor, name) for name in _ZERO_TENSOR_METHODS if hasattr(torch.Tensor, name)]
    + [getattr(torch, name) for name in _ZERO_TORCH_FUNCTIONS if hasattr(torch, name)]
    + [getattr(torch.nn.functional, name) for name in _ZERO_FUNCTIONAL if hasattr(torch.nn.functional, name)]
)


def plain_types(types: tuple) -> bool:
    """``types`` of a ``__torch_function__`` call name no tensor subclass (which could dispatch
    anything)."""
    for cls in types:
        if cls is not torch.Tensor and cls is not nn.Parameter:
            return False
    return True


_state = {"enabled": True}


def enabled() -> bool:
    """Whether traces use closed forms and the other fast paths (False inside :func:`reference_path`)."""
    return _state["enabled"]


@contextlib.contextmanager
def reference_path() -> Iterator[None]:
    """Within the block, traces take the reference path: every aten call through the dispatch mode,
    the forward with autograd enabled, as before the fast paths. Tests compare its graphs with the
    fast path's; the benchmark reports both."""
    previous = _state["enabled"]
    _state["enabled"] = False
    try:
        yield
    finally:
        _state["enabled"] = previous
