"""From a PyTorch module to a Neurarch component type and its hyperparameters.

The vocabulary and the exact parameter keys are fixed by ``shared/spec/neurarch-graph.md``. A class
this table does not know becomes ``customModule`` with its ``className`` and exact ``paramCount``:
the mapping never guesses a type from a layer's shapes. Every type it returns is checked against the
contract's vocabulary (:data:`neurarch_trace.contract.TYPES`). Third-party classes are recognised by exact
class name only (the transformers layers every checkpoint uses), never by a loose pattern; the one
exception is a container cut off by ``--depth``, whose class name is read for what it says
(attention, MLP, decoder layer, ...), as the issue asks.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.contract import check_type

__all__ = ["layer_spec", "container_spec", "is_whole_layer", "is_passthrough", "count_params"]

Spec = tuple[str, dict[str, Any]]


def count_params(module: nn.Module) -> int:
    """Unique learnable parameters of ``module`` and its children (``numel`` summed once each)."""
    seen: set[int] = set()
    total = 0
    for p in walk.parameters(module):
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _scalar_or_list(value: Any) -> Any:
    """``kernelSize``/``stride``/``padding``: a number when every dim agrees, a list otherwise."""
    if isinstance(value, (tuple, list)):
        vals = [int(v) if not isinstance(v, str) else v for v in value]
        if vals and all(v == vals[0] for v in vals):
            return vals[0]
        return vals
    return int(value) if not isinstance(value, str) else value


def _conv_padding(mod: nn.Module) -> Any:
    pad = mod.padding
    if isinstance(pad, str):  # 'valid' or 'same' (stride 1): the per-dim amount PyTorch applies
        if pad == "valid":
            return 0
        return _scalar_or_list([d * (k - 1) // 2 for d, k in zip(mod.dilation, mod.kernel_size)])
    return _scalar_or_list(pad)


def _linear(mod: nn.Linear) -> Spec:
    p: dict[str, Any] = {"inFeatures": mod.in_features, "outFeatures": mod.out_features}
    if mod.bias is None:
        p["bias"] = False
    return "linear", p


def _conv(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        k = _scalar_or_list(mod.kernel_size)
        s = _scalar_or_list(mod.stride)
        ks = list(mod.kernel_size)
        st = list(mod.stride)
        if (
            kind == "conv2d"
            and ks == st
            and min(ks) > 4
            and mod.in_channels <= 4
            and mod.groups == 1
        ):
            return "patchEmbed", {
                "patchSize": k,
                "embedDim": mod.out_channels,
                "inChans": mod.in_channels,
            }
        if (
            kind == "conv2d"
            and mod.groups == mod.in_channels
            and mod.groups > 1
            and mod.out_channels % mod.in_channels == 0
        ):
            p = {
                "inChannels": mod.in_channels,
                "kernelSize": k,
                "depthMultiplier": mod.out_channels // mod.in_channels,
                "stride": s,
                "padding": _conv_padding(mod),
            }
        else:
            p = {
                "inChannels": mod.in_channels,
                "outChannels": mod.out_channels,
                "kernelSize": k,
                "stride": s,
                "padding": _conv_padding(mod),
            }
            if mod.groups != 1:
                p["groups"] = mod.groups
        dil = _scalar_or_list(mod.dilation)
        if dil != 1:
            p["dilation"] = dil
        if mod.bias is None:
            p["bias"] = False
        if kind == "transposeConv2d":
            p["outputPadding"] = _scalar_or_list(mod.output_padding)
        return ("depthwiseConv2d" if "depthMultiplier" in p else kind), p

    return spec


def _pool(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        stride = mod.stride if mod.stride is not None else mod.kernel_size
        p = {"kernelSize": _scalar_or_list(mod.kernel_size), "stride": _scalar_or_list(stride)}
        pad = _scalar_or_list(mod.padding)
        if pad != 0:
            p["padding"] = pad
        return kind, p

    return spec


def _adaptive(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        out = mod.output_size
        vals = list(out) if isinstance(out, (tuple, list)) else [out]
        if kind == "adaptiveAvgPool2d" and all(v == 1 for v in vals):
            return "globalAvgPool2d", {"outputSize": 1}
        return kind, {"outputSize": _scalar_or_list(out) if None not in vals else vals}

    return spec


def _upsample(mod: nn.Upsample) -> Spec:
    p: dict[str, Any] = {"mode": mod.mode}
    if mod.scale_factor is not None:
        sf = mod.scale_factor
        p["scaleFactor"] = _scalar_or_list(sf) if isinstance(sf, (tuple, list)) else sf
        if isinstance(p["scaleFactor"], float) and p["scaleFactor"].is_integer():
            p["scaleFactor"] = int(p["scaleFactor"])
    if mod.size is not None:
        p["size"] = _scalar_or_list(mod.size)
    return "upsample", p


def _embedding(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        return kind, {"vocabSize": mod.num_embeddings, "embeddingDim": mod.embedding_dim}

    return spec


def _rnn(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        p: dict[str, Any] = {
            "inputSize": mod.input_size,
            "hiddenSize": mod.hidden_size,
            "numLayers": mod.num_layers,
        }
        if mod.bidirectional:
            p["bidirectional"] = True
        if getattr(mod, "proj_size", 0):
            p["projSize"] = mod.proj_size
        if not mod.bias:
            p["bias"] = False
        return kind, p

    return spec


def _mha(mod: nn.MultiheadAttention) -> Spec:
    return "multiHeadAttention", {"hiddenDim": mod.embed_dim, "numHeads": mod.num_heads}


def _norm_shape(shape: Any) -> Any:
    vals = list(shape) if isinstance(shape, (tuple, list, torch.Size)) else [shape]
    return int(vals[0]) if len(vals) == 1 else [int(v) for v in vals]


def _layer_norm(mod: nn.Module) -> Spec:
    return "layerNorm", {"normalizedShape": _norm_shape(mod.normalized_shape)}


def _rms_norm(mod: nn.Module) -> Spec:
    shape = getattr(mod, "normalized_shape", None)
    if shape is None:
        weight = getattr(mod, "weight", None)
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
    return "rmsNorm", ({"normalizedShape": _norm_shape(shape)} if shape is not None else {})


def _hf_conv1d(mod: nn.Module) -> Spec:
    # transformers.pytorch_utils.Conv1D (GPT-2): a linear layer whose weight is stored transposed,
    # shape (in_features, out_features).
    p: dict[str, Any] = {"inFeatures": int(mod.weight.shape[0]), "outFeatures": int(mod.nf)}
    if getattr(mod, "bias", None) is None:
        p["bias"] = False
    return "linear", p


def _simple(kind: str, **fields: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        return kind, {key: getattr(mod, attr) for key, attr in fields.items()}

    return spec


# Exact torch.nn classes. Subclasses resolve through the MRO, so NonDynamicallyQuantizableLinear is
# a linear and SyncBatchNorm a batchNorm.
_TORCH_TABLE: dict[type, Callable[[Any], Spec]] = {
    nn.Linear: _linear,
    nn.Conv1d: _conv("conv1d"),
    nn.Conv2d: _conv("conv2d"),
    nn.Conv3d: _conv("conv3d"),
    nn.ConvTranspose2d: _conv("transposeConv2d"),
    nn.MaxPool1d: _pool("maxpool1d"),
    nn.MaxPool2d: _pool("maxpool2d"),
    nn.AvgPool1d: _pool("avgpool1d"),
    nn.AvgPool2d: _pool("avgpool2d"),
    nn.AdaptiveAvgPool2d: _adaptive("adaptiveAvgPool2d"),
    nn.AdaptiveMaxPool2d: _adaptive("adaptiveMaxPool2d"),
    nn.Upsample: _upsample,
    nn.Embedding: _embedding("embedding"),
    nn.EmbeddingBag: _embedding("embeddingBag"),
    nn.LSTM: _rnn("lstm"),
    nn.GRU: _rnn("gru"),
    nn.RNN: _rnn("rnn"),
    nn.MultiheadAttention: _mha,
    nn.BatchNorm1d: _simple("batchNorm", numFeatures="num_features"),
    nn.BatchNorm2d: _simple("batchNorm", numFeatures="num_features"),
    nn.BatchNorm3d: _simple("batchNorm", numFeatures="num_features"),
    nn.SyncBatchNorm: _simple("batchNorm", numFeatures="num_features"),
    nn.LayerNorm: _layer_norm,
    nn.GroupNorm: _simple("groupNorm", numGroups="num_groups", numChannels="num_channels"),
    nn.InstanceNorm1d: _simple("instanceNorm", numFeatures="num_features"),
    nn.InstanceNorm2d: _simple("instanceNorm", numFeatures="num_features"),
    nn.InstanceNorm3d: _simple("instanceNorm", numFeatures="num_features"),
    nn.Dropout: _simple("dropout", p="p"),
    nn.Dropout1d: _simple("dropout", p="p"),
    nn.Dropout2d: _simple("dropout", p="p"),
    nn.Dropout3d: _simple("dropout", p="p"),
    nn.AlphaDropout: _simple("dropout", p="p"),
    nn.PReLU: _simple("prelu", numParameters="num_parameters"),
    nn.LeakyReLU: _simple("leakyRelu", negativeSlope="negative_slope"),
    nn.ReLU: _simple("relu"),
    nn.ReLU6: _simple("relu6"),
    nn.ELU: _simple("elu"),
    nn.SELU: _simple("selu"),
    nn.GELU: _simple("gelu"),
    nn.SiLU: _simple("swish"),
    nn.Mish: _simple("mish"),
    nn.Hardswish: _simple("hardSwish"),
    nn.Hardsigmoid: _simple("hardSigmoid"),
    nn.Sigmoid: _simple("sigmoid"),
    nn.Tanh: _simple("tanh"),
    nn.Softmax: _simple("softmax"),
    nn.LogSoftmax: _simple("logSoftmax"),
    nn.Softplus: _simple("softplus"),
    nn.GLU: _simple("glu"),
    nn.Flatten: _simple("flatten"),
}
if hasattr(nn, "RMSNorm"):
    _TORCH_TABLE[nn.RMSNorm] = _rms_norm

# Quantized modules (torch.ao.nn.quantized): their weights live in packed params, not nn.Parameters.
try:  # pragma: no branch - present in every supported torch
    import torch.ao.nn.quantized as _nnq
    import torch.ao.nn.quantized.dynamic as _nnqd

    def _qlinear(mod: Any) -> Spec:
        w = mod.weight()
        p: dict[str, Any] = {"inFeatures": int(w.shape[1]), "outFeatures": int(w.shape[0])}
        if mod.bias() is None:
            p["bias"] = False
        return "linear", p

    _TORCH_TABLE[_nnq.Linear] = _qlinear
    _TORCH_TABLE[_nnqd.Linear] = _qlinear
    _TORCH_TABLE[_nnq.Conv1d] = _conv("conv1d")
    _TORCH_TABLE[_nnq.Conv2d] = _conv("conv2d")
    _TORCH_TABLE[_nnq.Conv3d] = _conv("conv3d")
    _TORCH_TABLE[_nnqd.LSTM] = _rnn("lstm")
    _TORCH_TABLE[_nnqd.GRU] = _rnn("gru")
except ImportError:  # pragma: no cover
    pass

# Third-party layers recognised by exact class name, only when the class comes from these packages
# (transformers' activations, norms, GPT-2's Conv1D and rotary embeddings).
_THIRD_PARTY = ("transformers.",)
_NAMED_TABLE: dict[str, Callable[[Any], Spec]] = {
    "Conv1D": _hf_conv1d,
    "GELUActivation": _simple("gelu"),
    "NewGELUActivation": _simple("gelu"),
    "FastGELUActivation": _simple("gelu"),
    "QuickGELUActivation": _simple("gelu"),
    "AccurateGELUActivation": _simple("gelu"),
    "GELUTanh": _simple("gelu"),
    "BloomGelu": _simple("gelu"),
    "PytorchGELUTanh": _simple("gelu"),
    "ClippedGELUActivation": _simple("gelu"),
    "SiLUActivation": _simple("swish"),
    "MishActivation": _simple("mish"),
    "LlamaRMSNorm": _rms_norm,
    "MistralRMSNorm": _rms_norm,
    "Qwen2RMSNorm": _rms_norm,
    "Qwen3RMSNorm": _rms_norm,
    "GemmaRMSNorm": _rms_norm,
    "T5LayerNorm": _rms_norm,
    "RMSNorm": _rms_norm,
}

# Modules that are one node even though they own children (besides every class the table knows).
_WHOLE: tuple[type, ...] = (nn.MultiheadAttention, nn.RNNBase)


def _lookup(mod: nn.Module) -> Callable[[Any], Spec] | None:
    for cls in type(mod).__mro__:
        fn = _TORCH_TABLE.get(cls)
        if fn is not None:
            return fn
        if cls is nn.Module:
            break
    if not type(mod).__module__.startswith(_THIRD_PARTY):
        return None  # a user's own class named RMSNorm is not trusted to be one: never guess
    name = type(mod).__name__
    fn = _NAMED_TABLE.get(name)
    if fn is not None:
        return fn
    if name.endswith("RotaryEmbedding"):
        return _simple("rope")
    if name.endswith("RMSNorm"):  # LlamaRMSNorm, MixtralRMSNorm, Qwen3RMSNorm, ... (transformers only)
        return _rms_norm
    return None


def is_whole_layer(mod: nn.Module) -> bool:
    """A module the table knows: one node even when it has children (nn.MultiheadAttention, a
    quantized Linear holding its packed parameters in a child)."""
    return isinstance(mod, _WHOLE) or _lookup(mod) is not None


def is_passthrough(mod: nn.Module) -> bool:
    """Modules that get no node: their output is their input (nn.Identity)."""
    return type(mod) is nn.Identity


def layer_spec(mod: nn.Module, *, param_count: int) -> Spec:
    """The ``(type, params)`` of a leaf layer.

    ``param_count`` is the layer's exact learnable-parameter count (the caller counts packed
    quantized weights too); it becomes ``paramCount`` of a ``customModule``.
    """
    fn = _lookup(mod)
    if fn is not None:
        try:
            kind, params = fn(mod)
        except (AttributeError, TypeError, RuntimeError):
            pass  # a subclass that broke the attributes the table reads: fall through, don't guess
        else:
            return check_type(kind), params
    return "customModule", {"className": type(mod).__name__, "paramCount": param_count}


# --- containers cut off by --depth -------------------------------------------------------------

_EMBED_ATTRS = ("embed_dim", "hidden_size", "d_model", "hidden_dim", "dim", "n_embd", "all_head_size")
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "nhead")
_KV_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")


def _read_int(mod: nn.Module, attrs: tuple[str, ...]) -> int | None:
    sources = [mod, getattr(mod, "config", None)]
    for src in sources:
        if src is None:
            continue
        for attr in attrs:
            val = getattr(src, attr, None)
            if isinstance(val, int) and not isinstance(val, bool) and val > 0:
                return val
    return None


def _find_attention(mod: nn.Module) -> nn.Module | None:
    for sub in walk.modules(mod):
        if sub is not mod and ("attention" in type(sub).__name__.lower() or isinstance(sub, nn.MultiheadAttention)):
            return sub
    return None


def _linears(mod: nn.Module) -> list[nn.Module]:
    return [m for m in walk.modules(mod) if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"]


def _in_out(lin: nn.Module) -> tuple[int, int]:
    if isinstance(lin, nn.Linear):
        return lin.in_features, lin.out_features
    return int(lin.weight.shape[0]), int(lin.nf)


def _attention_dims(mod: nn.Module) -> tuple[int | None, int | None, int | None]:
    if isinstance(mod, nn.MultiheadAttention):
        return mod.embed_dim, mod.num_heads, None
    embed = _read_int(mod, _EMBED_ATTRS)
    heads = _read_int(mod, _HEAD_ATTRS)
    kv = _read_int(mod, _KV_ATTRS)
    return embed, heads, kv


def _ff_dims(mod: nn.Module) -> tuple[int | None, int | None]:
    lins = _linears(mod)
    if not lins:
        return None, None
    first_in, first_out = _in_out(lins[0])
    return first_in, first_out


def container_spec(mod: nn.Module, *, param_count: int) -> Spec:
    """The ``(type, params)`` of a container cut off by ``--depth`` (see :func:`_container_spec`)."""
    kind, params = _container_spec(mod, param_count=param_count)
    return check_type(kind), params


def _container_spec(mod: nn.Module, *, param_count: int) -> Spec:
    """The ``(type, params)`` of a container cut off by ``--depth``.

    Table layers first; then the class name is read for what it says: ``*Attention*`` becomes
    ``groupedQueryAttention`` (fewer key/value heads than query heads), ``selfAttention``,
    ``causalAttention``, ``crossModalAttention`` or ``attention``; ``*MLP*``/``*FeedForward*``/``*FFN*``
    becomes ``swiglu`` (gate/up/down projections) or ``feedForward``; ``*MoE*``/``*SparseMoe*`` a
    ``moeLayer``; ``*Layer``/``*Block`` holding an attention a ``transformerBlock``; ``*Residual*``
    ``residual``; ``*SqueezeExcit*``/``SE*Block`` ``seBlock``; ``*Rotary*`` ``rope``;
    ``*Positional*`` ``positionalEncoding``. Dimensions are read from the module (or its
    ``config``) when it exposes them; anything else is a ``customModule``.
    """
    if _lookup(mod) is not None:
        return layer_spec(mod, param_count=param_count)
    name = type(mod).__name__
    low = name.lower()
    p: dict[str, Any] = {}
    if "attention" in low or low.endswith("attn"):
        embed, heads, kv = _attention_dims(mod)
        if embed is None:
            lins = _linears(mod)
            if lins:
                embed = _in_out(lins[0])[0]
        if heads is not None and kv is not None and kv < heads:
            p = {"embedDim": embed, "numHeads": heads, "numKVHeads": kv}
            return "groupedQueryAttention", {k: v for k, v in p.items() if v is not None}
        kind = "attention"
        if "cross" in low:
            kind = "crossModalAttention"
        elif "causal" in low:
            kind = "causalAttention"
        elif "selfattention" in low:
            kind = "selfAttention"
        p = {"embedDim": embed, "numHeads": heads}
        return kind, {k: v for k, v in p.items() if v is not None}
    if "moe" in low:
        experts = getattr(mod, "experts", None)
        if isinstance(experts, (nn.ModuleList, list)):
            n_exp = len(experts)
        else:
            n_exp = _read_int(mod, ("num_experts", "num_local_experts"))
        top_k = _read_int(mod, ("top_k", "num_experts_per_tok"))
        embed, ff = _ff_dims(experts[0]) if isinstance(experts, nn.ModuleList) and len(experts) else (None, None)
        p = {"embedDim": embed or _read_int(mod, _EMBED_ATTRS), "numExperts": n_exp, "expertDim": ff, "topK": top_k}
        return "moeLayer", {k: v for k, v in p.items() if v is not None}
    if "mlp" in low or "feedforward" in low or "ffn" in low:
        names = dict(walk.named_children(mod))
        if {"gate_proj", "up_proj", "down_proj"} <= names.keys():
            embed, inter = _in_out(names["up_proj"])
            return "swiglu", {"embedDim": embed, "intermediateSize": inter}
        embed, ff = _ff_dims(mod)
        return "feedForward", {k: v for k, v in {"embedDim": embed, "ffDim": ff}.items() if v is not None}
    if "rotary" in low:
        return "rope", {}
    if "positional" in low:
        return "positionalEncoding", {k: v for k, v in {"embedDim": _read_int(mod, _EMBED_ATTRS)}.items() if v}
    if "squeezeexcit" in low or (low.startswith("se") and low.endswith("block")):
        return "seBlock", {}
    if "residual" in low:
        return "residual", {}
    if (low.endswith("layer") or low.endswith("block")) and _find_attention(mod) is not None:
        attn = _find_attention(mod)
        embed, heads, _ = _attention_dims(attn) if attn is not None else (None, None, None)
        if embed is None:
            embed = _read_int(mod, _EMBED_ATTRS)
        if heads is None:
            heads = _read_int(mod, _HEAD_ATTRS)
        ff = None
        for sub in walk.modules(mod):
            sub_low = type(sub).__name__.lower()
            if sub is not mod and ("mlp" in sub_low or "feedforward" in sub_low or "intermediate" in sub_low):
                names = dict(walk.named_children(sub))
                ff = _in_out(names["up_proj"])[1] if "up_proj" in names else _ff_dims(sub)[1]
                break
        if ff is None and isinstance(getattr(mod, "linear1", None), nn.Linear):
            ff = mod.linear1.out_features  # nn.TransformerEncoderLayer / DecoderLayer
        p = {"embedDim": embed, "numHeads": heads, "ffDim": ff}
        return "transformerBlock", {k: v for k, v in p.items() if v is not None}
    return "customModule", {"className": name, "paramCount": param_count}
