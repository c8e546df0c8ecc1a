"""Parameter and FLOP formulas per layer type, for graphs that carry no measured numbers.

One registry filled by a decorator (:func:`formula`); each formula sees a node's ``params`` and its
batchless shapes only, and returns an :class:`Estimate`. Conventions, matching the tracer's
``measured`` fields (``docs/measured.md``) and ``torch.utils.flop_counter``:

* FLOPs are per sample (batchless shapes), one multiply-add = 2 FLOPs.
* Only matrix multiplications, convolutions and attention matmuls are counted; elementwise ops,
  activations, normalisation, pooling, softmax and bias additions count 0, as the counter counts them.
* Types in :data:`~neurarch_trace.contract.ZERO_COST_TYPES` cost nothing.
* ``None`` means "not known": a type with no formula (``customModule``, containers cut off by a
  depth limit, anything outside the vocabulary) or a layer whose shapes are missing. The caller
  reports such layers as of unknown cost instead of silently counting zero.
* Parameter counts are PyTorch's exact counts for the module the type stands for, with the
  defaults of that module (``bias`` true unless ``bias: false``), unlike the format's readers,
  which always add a bias and ignore ``bidirectional``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from neurarch_trace.contract import MAX_DIM, ZERO_COST_TYPES, Node, is_int, numel

__all__ = [
    "Estimate",
    "UNKNOWN",
    "estimate",
    "has_formula",
    "kernel",
    "size",
]


@dataclass(frozen=True)
class Estimate:
    """``params``: learnable parameters; ``flops``: forward FLOPs per sample. ``None``: unknown."""

    params: Optional[int]
    flops: Optional[int]


UNKNOWN = Estimate(params=None, flops=None)

_Formula = Callable[[Node], Estimate]
_FORMULAS: Dict[str, _Formula] = {}


def formula(*types: str) -> Callable[[_Formula], _Formula]:
    """Register the decorated function as the formula for ``types``."""

    def register(func: _Formula) -> _Formula:
        for node_type in types:
            _FORMULAS[node_type] = func
        return func

    return register


def has_formula(node_type: str) -> bool:
    """True when ``node_type`` has a formula or is known to cost nothing."""
    return node_type in _FORMULAS or node_type in ZERO_COST_TYPES


def estimate(node: Node) -> Estimate:
    """The estimate for one node; :data:`UNKNOWN` when its type has no formula."""
    if node.type in ZERO_COST_TYPES:
        return Estimate(params=0, flops=0)
    func = _FORMULAS.get(node.type)
    return func(node) if func is not None else UNKNOWN


# --- reading params -------------------------------------------------------------------------------


def size(params: Mapping[str, Any], key: str, default: Optional[int] = None) -> Optional[int]:
    """A positive integer param no larger than 2^40, else ``default`` (absent) or ``None``."""
    value = params.get(key)
    if value is None:
        return default
    if is_int(value) and 1 <= value <= MAX_DIM:
        return value
    return None


def kernel(params: Mapping[str, Any], key: str, ndim: int) -> Optional[Tuple[int, ...]]:
    """A kernel-like param as ``ndim`` positive sizes: a scalar means the same in every dim."""
    value = params.get(key)
    if is_int(value):
        values = [value] * ndim
    elif isinstance(value, list) and len(value) == ndim:
        values = value
    else:
        return None
    if all(is_int(v) and 1 <= v <= MAX_DIM for v in values):
        return tuple(values)
    return None


def _flag(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key)
    return value if isinstance(value, bool) else default


def _prod(values: Tuple[int, ...]) -> int:
    return numel(values)


def _last(shape: Optional[Tuple[int, ...]]) -> Optional[int]:
    return shape[-1] if shape else None


def _first(shape: Optional[Tuple[int, ...]]) -> Optional[int]:
    return shape[0] if shape else None


def _rows(shape: Optional[Tuple[int, ...]], width: int) -> Optional[int]:
    """Vectors of ``width`` in ``shape`` (tokens x ... for a layer applied to the last dim)."""
    if not shape:
        return None
    return max(1, numel(shape) // width)


# --- formulas -------------------------------------------------------------------------------------


@formula("linear")
def _linear(node: Node) -> Estimate:
    p = node.params
    fan_in = size(p, "inFeatures") or _last(node.input_shape)
    fan_out = size(p, "outFeatures") or _last(node.output_shape)
    if fan_in is None or fan_out is None:
        return UNKNOWN
    params = fan_in * fan_out + (fan_out if _flag(p, "bias", True) else 0)
    rows = _rows(node.input_shape, fan_in) if node.input_shape else _rows(node.output_shape, fan_out)
    # addmm: 2 * rows * in * out; the bias add is elementwise and not counted.
    flops = None if rows is None else 2 * rows * fan_in * fan_out
    return Estimate(params, flops)


def _conv(node: Node, ndim: int) -> Estimate:
    p = node.params
    c_in = size(p, "inChannels") or _first(node.input_shape)
    c_out = size(p, "outChannels") or _first(node.output_shape)
    k = kernel(p, "kernelSize", ndim)
    groups = size(p, "groups", 1)
    if c_in is None or c_out is None or k is None or groups is None:
        return UNKNOWN
    c_in_group = max(1, c_in // groups)
    params = c_out * c_in_group * _prod(k) + (c_out if _flag(p, "bias", True) else 0)
    # flop_counter's conv_flop_count: 2 * (output elements) * (input channels per group) * kernel
    # volume; padding, stride and dilation act only through the output shape, the bias is ignored.
    flops = None if node.output_shape is None else 2 * numel(node.output_shape) * c_in_group * _prod(k)
    return Estimate(params, flops)


@formula("conv1d")
def _conv1d(node: Node) -> Estimate:
    return _conv(node, 1)


@formula("conv2d")
def _conv2d(node: Node) -> Estimate:
    return _conv(node, 2)


@formula("conv3d")
def _conv3d(node: Node) -> Estimate:
    return _conv(node, 3)


@formula("transposeConv2d")
def _transpose_conv2d(node: Node) -> Estimate:
    p = node.params
    c_in = size(p, "inChannels") or _first(node.input_shape)
    c_out = size(p, "outChannels") or _first(node.output_shape)
    k = kernel(p, "kernelSize", 2)
    groups = size(p, "groups", 1)
    if c_in is None or c_out is None or k is None or groups is None:
        return UNKNOWN
    c_out_group = max(1, c_out // groups)
    params = c_in * c_out_group * _prod(k) + (c_out if _flag(p, "bias", True) else 0)
    # Transposed: flop_counter takes the *input* spatial size: 2 * (input elements) * (output
    # channels per group) * kernel volume.
    flops = None if node.input_shape is None else 2 * numel(node.input_shape) * c_out_group * _prod(k)
    return Estimate(params, flops)


@formula("depthwiseConv2d")
def _depthwise_conv2d(node: Node) -> Estimate:
    p = node.params
    c_in = size(p, "inChannels") or _first(node.input_shape)
    k = kernel(p, "kernelSize", 2)
    multiplier = size(p, "depthMultiplier", 1)
    if c_in is None or k is None or multiplier is None:
        return UNKNOWN
    c_out = c_in * multiplier
    params = c_out * _prod(k) + (c_out if _flag(p, "bias", True) else 0)
    # Each output element reads one input channel: 2 * (output elements) * kernel volume.
    flops = None if node.output_shape is None else 2 * numel(node.output_shape) * _prod(k)
    return Estimate(params, flops)


@formula("patchEmbed")
def _patch_embed(node: Node) -> Estimate:
    p = node.params
    patch = kernel(p, "patchSize", 2)
    dim = size(p, "embedDim")
    chans = size(p, "inChans") or _first(node.input_shape)
    if patch is None or dim is None or chans is None:
        return UNKNOWN
    params = dim * chans * _prod(patch) + dim
    # A conv with stride = kernel: every output element reads chans * patch area inputs.
    flops = None if node.output_shape is None else 2 * numel(node.output_shape) * chans * _prod(patch)
    return Estimate(params, flops)


@formula("embedding", "embeddingBag")
def _embedding(node: Node) -> Estimate:
    vocab = size(node.params, "vocabSize")
    dim = size(node.params, "embeddingDim") or _last(node.output_shape)
    if vocab is None or dim is None:
        return UNKNOWN
    return Estimate(vocab * dim, 0)  # a table lookup: no counted FLOPs


def _recurrent(node: Node, gates: int) -> Estimate:
    p = node.params
    inp = size(p, "inputSize") or _last(node.input_shape)
    hidden = size(p, "hiddenSize")
    layers = size(p, "numLayers", 1)
    if inp is None or hidden is None or layers is None:
        return UNKNOWN
    directions = 2 if _flag(p, "bidirectional", False) else 1
    bias = _flag(p, "bias", True)
    # Sequence length: the first dim of a batch_first [T, I] input; an unsequenced input is T = 1.
    steps = node.input_shape[0] if node.input_shape and len(node.input_shape) >= 2 else 1

    def layer_params(layer_in: int) -> int:
        # Per direction: W_ih (gates*H x in), W_hh (gates*H x H), b_ih and b_hh (gates*H each).
        return directions * gates * (hidden * layer_in + hidden * hidden + (2 * hidden if bias else 0))

    def layer_flops(layer_in: int) -> int:
        # Per step and direction, the two matmuls; the gate nonlinearities are elementwise (0).
        return directions * steps * 2 * gates * hidden * (layer_in + hidden)

    # Layer 0 reads the input; layers 1..L-1 all read the previous layer's H x directions.
    upper = hidden * directions
    params = layer_params(inp) + (layers - 1) * layer_params(upper)
    flops = layer_flops(inp) + (layers - 1) * layer_flops(upper)
    return Estimate(params, flops if node.input_shape else None)


@formula("lstm")
def _lstm(node: Node) -> Estimate:
    return _recurrent(node, 4)


@formula("gru")
def _gru(node: Node) -> Estimate:
    return _recurrent(node, 3)


@formula("rnn")
def _rnn(node: Node) -> Estimate:
    return _recurrent(node, 1)


def _attention_flops(tokens: int, width: int) -> int:
    """QK^T and scores x V for self-attention over ``tokens`` tokens: 2 * (2 * L * L * E).
    Assumes keys and values have as many tokens as the queries (self-attention)."""
    return 4 * tokens * tokens * width


@formula("multiHeadAttention")
def _multi_head_attention(node: Node) -> Estimate:
    p = node.params
    width = size(p, "hiddenDim") or size(p, "embedDim") or _last(node.input_shape)
    if width is None:
        return UNKNOWN
    # nn.MultiheadAttention: in_proj (3E x E + 3E) and out_proj (E x E + E).
    params = 4 * width * width + (4 * width if _flag(p, "bias", True) else 0)
    tokens = _rows(node.input_shape, width)
    flops = None if tokens is None else 8 * tokens * width * width + _attention_flops(tokens, width)
    return Estimate(params, flops)


@formula("groupedQueryAttention")
def _grouped_query_attention(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    heads = size(p, "numHeads")
    kv_heads = size(p, "numKVHeads")
    if width is None or heads is None or kv_heads is None:
        return UNKNOWN
    kv_width = kv_heads * (width // heads)
    # q and o projections E x E, k and v E x kv_width; bias-free (LLaMA) unless bias: true.
    params = 2 * width * width + 2 * width * kv_width
    if _flag(p, "bias", False):
        params += 2 * width + 2 * kv_width
    tokens = _rows(node.input_shape, width)
    if tokens is None:
        return Estimate(params, None)
    flops = 2 * tokens * (2 * width * width + 2 * width * kv_width) + _attention_flops(tokens, width)
    return Estimate(params, flops)


@formula("transformerBlock")
def _transformer_block(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    ff = size(p, "ffDim")
    if width is None or ff is None:
        return UNKNOWN
    # nn.TransformerEncoderLayer: self-attention 4E^2 + 4E, linear1 E*F + F, linear2 F*E + E,
    # two LayerNorms 2E each.
    params = 4 * width * width + 4 * width + 2 * width * ff + ff + width + 4 * width
    tokens = _rows(node.input_shape, width)
    if tokens is None:
        return Estimate(params, None)
    flops = 8 * tokens * width * width + _attention_flops(tokens, width) + 4 * tokens * width * ff
    return Estimate(params, flops)


@formula("feedForward")
def _feed_forward(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    ff = size(p, "ffDim")
    if width is None or ff is None:
        return UNKNOWN
    params = 2 * width * ff + ff + width  # Linear(E, F) and Linear(F, E), with biases
    tokens = _rows(node.input_shape, width)
    return Estimate(params, None if tokens is None else 4 * tokens * width * ff)


@formula("swiglu")
def _swiglu(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    inner = size(p, "intermediateSize")
    if width is None or inner is None:
        return UNKNOWN
    params = 3 * width * inner  # gate, up (E x I) and down (I x E), bias-free as in LLaMA
    tokens = _rows(node.input_shape, width)
    return Estimate(params, None if tokens is None else 6 * tokens * width * inner)


@formula("moeLayer")
def _moe_layer(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    experts = size(p, "numExperts")
    inner = size(p, "expertDim")
    top_k = size(p, "topK", 1)
    if width is None or experts is None or inner is None or top_k is None:
        return UNKNOWN
    # Router E x N plus N gated (SwiGLU, as Mixtral) bias-free experts of 3 E x D matrices; each
    # token runs the router and top_k experts. Ignores shared experts and capacity-factor drops.
    params = width * experts + experts * 3 * width * inner
    tokens = _rows(node.input_shape, width)
    if tokens is None:
        return Estimate(params, None)
    flops = 2 * tokens * width * experts + top_k * 6 * tokens * width * inner
    return Estimate(params, flops)


@formula("lmHead")
def _lm_head(node: Node) -> Estimate:
    p = node.params
    width = size(p, "embedDim") or _last(node.input_shape)
    vocab = size(p, "vocabSize") or _last(node.output_shape)
    if width is None or vocab is None:
        return UNKNOWN
    if _flag(p, "weightTied", False):
        params = 0  # the weight is the embedding table's, counted there
    else:
        params = width * vocab + (vocab if _flag(p, "bias", False) else 0)
    tokens = _rows(node.input_shape, width)
    return Estimate(params, None if tokens is None else 2 * tokens * width * vocab)


def _norm(node: Node, key: str, per_feature: int, affine_default: bool) -> Estimate:
    features = size(node.params, key) or _first(node.input_shape)
    if features is None:
        return UNKNOWN
    affine = _flag(node.params, "affine", affine_default)
    return Estimate(per_feature * features if affine else 0, 0)


@formula("batchNorm")
def _batch_norm(node: Node) -> Estimate:
    return _norm(node, "numFeatures", 2, True)  # weight and bias per channel


@formula("instanceNorm")
def _instance_norm(node: Node) -> Estimate:
    return _norm(node, "numFeatures", 2, False)  # nn.InstanceNorm*d defaults to affine=False


@formula("groupNorm")
def _group_norm(node: Node) -> Estimate:
    return _norm(node, "numChannels", 2, True)


def normalized_shape(node: Node) -> Optional[Tuple[int, ...]]:
    """``normalizedShape`` as a tuple (a number means one dim); ``None`` when absent or invalid."""
    value = node.params.get("normalizedShape")
    if is_int(value):
        value = [value]
    if isinstance(value, list) and value and all(is_int(v) and 1 <= v <= MAX_DIM for v in value):
        return tuple(value)
    return None


@formula("layerNorm")
def _layer_norm(node: Node) -> Estimate:
    shape = normalized_shape(node) or ((node.input_shape[-1],) if node.input_shape else None)
    if shape is None:
        return UNKNOWN
    if not _flag(node.params, "elementwiseAffine", True):
        return Estimate(0, 0)
    return Estimate(numel(shape) * (2 if _flag(node.params, "bias", True) else 1), 0)


@formula("rmsNorm")
def _rms_norm(node: Node) -> Estimate:
    shape = normalized_shape(node) or ((node.input_shape[-1],) if node.input_shape else None)
    if shape is None:
        return UNKNOWN
    affine = _flag(node.params, "elementwiseAffine", True)
    return Estimate(numel(shape) if affine else 0, 0)  # a weight, no bias


@formula("prelu")
def _prelu(node: Node) -> Estimate:
    count = size(node.params, "numParameters", 1)
    return Estimate(count, 0) if count is not None else UNKNOWN


@formula("customModule")
def _custom_module(node: Node) -> Estimate:
    count = node.params.get("paramCount")
    params = count if is_int(count) and 0 <= count <= 2**53 else None
    return Estimate(params, None)  # its FLOPs are never known without a measurement
