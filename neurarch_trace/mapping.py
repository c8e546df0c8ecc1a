"""From a PyTorch module to a Neurarch component type and its hyperparameters.

The vocabulary and the exact parameter keys are fixed by ``shared/spec/neurarch-graph.md``. A class
this table does not know becomes ``customModule`` with its ``className`` and exact ``paramCount``:
the mapping never guesses a type, neither from a layer's shapes nor from its class name. Every type
it returns is checked against the contract's vocabulary (:data:`neurarch_trace.contract.TYPES`).

What is typed: torch.nn's layers by class (subclasses through the MRO): every public layer of
``torch.nn`` is in :data:`_TORCH_TABLE`, in :data:`CUSTOM_REASONS` (a ``customModule`` on purpose,
with the reason) or in :data:`NOT_LAYERS` (containers, bases, nn.Identity); ``tests/test_fidelity.py``
enumerates ``torch.nn`` and fails on a class in none of them. Classes of the transformers package:
the layers of :data:`_NAMED_TABLE` by exact name (activations, norms, GPT-2's ``Conv1D``; rotary
embeddings and RMS norms by their name's ending), and, cut off by ``--depth``, the containers of
:data:`_HF_CONTAINERS` by exact name (attention, MLP, mixture of experts, block, patch embedding).
A user's class is typed only through a torch.nn class it derives from.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.contract import check_type

__all__ = ["CUSTOM_REASONS", "NOT_LAYERS", "container_spec", "count_params", "is_passthrough", "is_whole_layer",
           "known_container", "layer_spec", "typed_class"]

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
    if type(value) is tuple and value and type(value[0]) is int and value.count(value[0]) == len(value):
        return value[0]  # (3, 3): most layers
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
        # a conv is a conv whatever its shapes: a stride-equals-kernel conv is no patch embedding
        # by that alone (transformers' patch embedding classes are, cut off by --depth)
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


def _pixel_shuffle(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        factor = mod.upscale_factor if kind == "pixelShuffle" else mod.downscale_factor
        return "upsample", {"scaleFactor": factor if kind == "pixelShuffle" else 1 / factor, "mode": kind}

    return spec


def _cell(kind: str) -> Callable[[nn.Module], Spec]:
    def spec(mod: nn.Module) -> Spec:
        p: dict[str, Any] = {"inputSize": mod.input_size, "hiddenSize": mod.hidden_size, "numLayers": 1}
        if not mod.bias:
            p["bias"] = False
        return kind, p

    return spec


def _rrelu(mod: nn.Module) -> Spec:
    # in eval() (the trace's mode) RReLU's negative slope is fixed at the middle of [lower, upper]
    return "leakyRelu", {"negativeSlope": (mod.lower + mod.upper) / 2}


# torch.nn layers of a family the vocabulary names with a type of other dimensions, or of the same
# function under another name: the closest type, with its documented keys.
_TORCH_TABLE.update({
    # the vocabulary's adaptive pools and pools are 2-d (and 1-d) types: the 1-d and 3-d layers take
    # them; outputSize, kernelSize and stride list every dim where they differ, the shapes say the dims
    nn.AdaptiveAvgPool1d: _adaptive("adaptiveAvgPool2d"),
    nn.AdaptiveAvgPool3d: _adaptive("adaptiveAvgPool2d"),
    nn.AdaptiveMaxPool1d: _adaptive("adaptiveMaxPool2d"),
    nn.AdaptiveMaxPool3d: _adaptive("adaptiveMaxPool2d"),
    nn.MaxPool3d: _pool("maxpool2d"),
    nn.AvgPool3d: _pool("avgpool2d"),
    nn.ConvTranspose1d: _conv("transposeConv2d"),
    nn.ConvTranspose3d: _conv("transposeConv2d"),
    # one step of one recurrent layer: the layer's type with numLayers 1
    nn.RNNCell: _cell("rnn"),
    nn.LSTMCell: _cell("lstm"),
    nn.GRUCell: _cell("gru"),
    # sub-pixel upsampling (Shi et al. 2016, "Real-Time Single Image and Video Super-Resolution Using
    # an Efficient Sub-Pixel Convolutional Neural Network"): channels to space by the factor, and back
    nn.PixelShuffle: _pixel_shuffle("pixelShuffle"),
    nn.PixelUnshuffle: _pixel_shuffle("pixelUnshuffle"),
    nn.CELU: _simple("elu"),  # ELU reparametrised to be continuously differentiable (Barron 2017)
    nn.RReLU: _rrelu,
    nn.Softmax2d: _simple("softmax"),  # softmax over the channels
    nn.Softmin: _simple("softmax"),  # softmax of -x
    nn.FeatureAlphaDropout: _simple("dropout", p="p"),
})

#: torch.nn layers that are a ``customModule`` on purpose, and why: the vocabulary has no type for
#: what they compute. Their FLOPs are counted from the operations they run, as every layer's are;
#: the note says what that comes to (elementwise, reductions and data movement count 0, the
#: convention of ``torch.utils.flop_counter``).
CUSTOM_REASONS: dict[type, str] = {
    **{cls: "padding: no vocabulary type; data movement, 0 FLOPs" for cls in (
        nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
        nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
        nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d)},
    nn.Bilinear: "x1ᵀ W x2 + b has no vocabulary type (linear is x W); 2 x out x in1 x in2 FLOPs per sample",
    nn.Unfold: "im2col: no vocabulary type; data movement, 0 FLOPs",
    nn.Fold: "col2im: no vocabulary type; data movement and the sums of overlaps, 0 FLOPs",
    nn.ChannelShuffle: "a channel permutation: no vocabulary type; data movement, 0 FLOPs",
    nn.Unflatten: "a reshape (flatten's inverse): no vocabulary type; 0 FLOPs",
    nn.MaxUnpool1d: "a scatter of pooled values: no vocabulary type; data movement, 0 FLOPs",
    nn.MaxUnpool2d: "a scatter of pooled values: no vocabulary type; data movement, 0 FLOPs",
    nn.MaxUnpool3d: "a scatter of pooled values: no vocabulary type; data movement, 0 FLOPs",
    nn.LPPool1d: "power-average pooling is no average or max pool; elementwise and sums, 0 FLOPs",
    nn.LPPool2d: "power-average pooling is no average or max pool; elementwise and sums, 0 FLOPs",
    nn.LPPool3d: "power-average pooling is no average or max pool; elementwise and sums, 0 FLOPs",
    nn.FractionalMaxPool2d: "max pooling at random fractional strides: no fixed kernelSize/stride; 0 FLOPs",
    nn.FractionalMaxPool3d: "max pooling at random fractional strides: no fixed kernelSize/stride; 0 FLOPs",
    nn.LocalResponseNorm: "local response normalisation: no vocabulary type; elementwise, 0 FLOPs",
    nn.CrossMapLRN2d: "local response normalisation: no vocabulary type; elementwise, 0 FLOPs",
    nn.CosineSimilarity: "a similarity of two inputs: no vocabulary type; elementwise and sums, 0 FLOPs",
    nn.PairwiseDistance: "a distance of two inputs: no vocabulary type; elementwise and sums, 0 FLOPs",
    **{cls: "an activation the vocabulary does not name; elementwise, 0 FLOPs" for cls in (
        nn.Hardtanh, nn.Hardshrink, nn.Softshrink, nn.Tanhshrink, nn.Softsign, nn.LogSigmoid, nn.Threshold)},
    **{cls: "a loss: no vocabulary type; elementwise and reductions, 0 FLOPs" for cls in (
        nn.L1Loss, nn.MSELoss, nn.CrossEntropyLoss, nn.CTCLoss, nn.NLLLoss, nn.PoissonNLLLoss, nn.GaussianNLLLoss,
        nn.KLDivLoss, nn.BCELoss, nn.BCEWithLogitsLoss, nn.MarginRankingLoss, nn.HingeEmbeddingLoss,
        nn.MultiLabelMarginLoss, nn.HuberLoss, nn.SmoothL1Loss, nn.SoftMarginLoss, nn.MultiLabelSoftMarginLoss,
        nn.CosineEmbeddingLoss, nn.MultiMarginLoss, nn.TripletMarginLoss, nn.TripletMarginWithDistanceLoss,
        *((nn.NLLLoss2d,) if hasattr(nn, "NLLLoss2d") else ()))},
    **({nn.LinearCrossEntropyLoss: "a classifier's linear fused with its cross-entropy loss: no vocabulary "
                                   "type; its matmul is counted"} if hasattr(nn, "LinearCrossEntropyLoss") else {}),
    nn.AdaptiveLogSoftmaxWithLoss: "an adaptive softmax (Grave et al. 2017) over a head and tail clusters: "
                                   "traced into its linears; cut off by --depth, no vocabulary type",
}

#: torch.nn classes that are no layer of their own: containers the trace descends into, abstract
#: bases, wrappers it looks through, and nn.Identity (no node: its output is its input).
NOT_LAYERS: dict[type, str] = {
    nn.Module: "the base class", nn.Sequential: "a container", nn.ModuleList: "a container",
    nn.ModuleDict: "a container", nn.ParameterList: "holds parameters, no forward",
    nn.ParameterDict: "holds parameters, no forward", nn.RNNBase: "the base of nn.RNN/LSTM/GRU",
    nn.RNNCellBase: "the base of the cells", nn.Identity: "no node: its output is its input",
    nn.DataParallel: "a wrapper: the model inside is traced",
    nn.TransformerEncoder: "a stack of encoder layers: a container (transformerBlock each)",
    nn.TransformerDecoder: "a stack of decoder layers: a container (transformerBlock each)",
    nn.Transformer: "an encoder and a decoder: a container",
    **({nn.Container: "the deprecated base of containers"} if hasattr(nn, "Container") else {}),
}

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


_LOOKED_UP: dict[type, Callable[[Any], Spec] | None] = {}


def _lookup(mod: nn.Module) -> Callable[[Any], Spec] | None:
    """The spec function of ``mod``'s class (the answer depends on the class alone: cached)."""
    cls = type(mod)
    try:
        return _LOOKED_UP[cls]
    except KeyError:
        fn = _LOOKED_UP[cls] = _find_spec(cls)
        return fn


def _find_spec(mod_cls: type) -> Callable[[Any], Spec] | None:
    for cls in mod_cls.__mro__:
        fn = _TORCH_TABLE.get(cls)
        if fn is not None:
            return fn
        if cls is nn.Module:
            break
    if not mod_cls.__module__.startswith(_THIRD_PARTY):
        return None  # a user's own class named RMSNorm is not trusted to be one: never guess
    name = mod_cls.__name__
    fn = _NAMED_TABLE.get(name)
    if fn is not None:
        return fn
    if name.endswith("RotaryEmbedding"):
        return _simple("rope")
    if name.endswith("RMSNorm"):  # LlamaRMSNorm, MixtralRMSNorm, Qwen3RMSNorm, ... (transformers only)
        return _rms_norm
    return None


def typed_class(cls: type) -> bool:
    """True when the torch.nn table gives instances of ``cls`` a vocabulary type (through its MRO),
    or types them as a container cut off by ``--depth``."""
    return any(c in _TORCH_TABLE or c in _TORCH_CONTAINERS for c in cls.__mro__)


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
    """The first attention inside a listed block: a listed attention class or nn.MultiheadAttention."""
    for sub in walk.modules(mod):
        if sub is mod:
            continue
        known = known_container(sub)
        if isinstance(sub, nn.MultiheadAttention) or (known is not None and known[0] == "attention"):
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


def _names(text: str) -> frozenset:
    return frozenset(text.split())


#: transformers containers typed when cut off by ``--depth``, by exact class name (the class, or the
#: first class of its MRO, must be defined in the transformers package): attention, MLP, mixture of
#: experts, transformer block and patch embedding classes of the common architectures. Any other
#: container, a user's own included whatever its name, is a ``customModule``.
_HF_CONTAINERS: dict[str, str] = {
    **dict.fromkeys(_names("""
        AlbertAttention BartAttention BeitAttention BeitSelfAttention BertAttention BertCrossAttention
        BertSelfAttention BloomAttention CLIPAttention CohereAttention DbrxAttention DebertaV2Attention
        DeiTAttention DeiTSelfAttention Dinov2Attention Dinov2SelfAttention DisentangledSelfAttention
        DistilBertSelfAttention MultiHeadSelfAttention ElectraAttention ElectraCrossAttention
        ElectraSelfAttention FalconAttention GPT2Attention GPTJAttention GPTNeoAttention GPTNeoSelfAttention
        GPTNeoXAttention GemmaAttention Gemma2Attention Gemma3Attention GraniteAttention JambaAttention
        LlamaAttention MBartAttention MT5Attention MT5LayerCrossAttention MT5LayerSelfAttention
        MistralAttention MixtralAttention MptAttention OPTAttention OlmoAttention PhiAttention Phi3Attention
        Qwen2Attention Qwen2MoeAttention Qwen3Attention Qwen3MoeAttention RobertaAttention
        RobertaCrossAttention RobertaSelfAttention SegformerAttention SegformerEfficientSelfAttention
        SiglipAttention Starcoder2Attention SwinAttention SwinSelfAttention T5Attention
        T5LayerCrossAttention T5LayerSelfAttention ViTAttention ViTSelfAttention Wav2Vec2Attention
        WhisperAttention XLMRobertaAttention XLMRobertaCrossAttention XLMRobertaSelfAttention
    """), "attention"),
    **dict.fromkeys(_names("""
        BeitMLP BloomMLP CLIPMLP CohereMLP DbrxFFN DeiTMLP Dinov2MLP Dinov2SwiGLUFFN FFN FalconMLP GPT2MLP
        GPTJMLP GPTNeoMLP GPTNeoXMLP GemmaMLP Gemma2MLP Gemma3MLP GraniteMLP JambaMLP LlamaMLP MistralMLP
        MixtralBlockSparseTop2MLP MptMLP OlmoMLP PhiMLP Phi3MLP Qwen2MLP Qwen2MoeMLP Qwen3MLP Qwen3MoeMLP
        SegformerMLP SegformerMixMLP SiglipMLP Starcoder2MLP SwinMLP ViTMLP Wav2Vec2FeedForward
    """), "mlp"),
    **dict.fromkeys(_names("""
        MixtralSparseMoeBlock Qwen2MoeSparseMoeBlock Qwen3MoeSparseMoeBlock JambaSparseMoeBlock
    """), "moe"),
    **dict.fromkeys(_names("""
        AlbertLayer BartDecoderLayer BartEncoderLayer BeitLayer BertLayer BloomBlock CLIPEncoderLayer
        CohereDecoderLayer DbrxBlock DebertaV2Layer DeiTLayer Dinov2Layer ElectraLayer FalconDecoderLayer
        GPT2Block GPTJBlock GPTNeoBlock GPTNeoXLayer GemmaDecoderLayer Gemma2DecoderLayer Gemma3DecoderLayer
        GraniteDecoderLayer JambaAttentionDecoderLayer LlamaDecoderLayer MBartDecoderLayer MBartEncoderLayer
        MT5Block MistralDecoderLayer MixtralDecoderLayer MptBlock OPTDecoderLayer OlmoDecoderLayer
        PhiDecoderLayer Phi3DecoderLayer Qwen2DecoderLayer Qwen2MoeDecoderLayer Qwen3DecoderLayer
        Qwen3MoeDecoderLayer RobertaLayer SegformerLayer SiglipEncoderLayer Starcoder2DecoderLayer SwinLayer
        T5Block TransformerBlock ViTLayer Wav2Vec2EncoderLayer Wav2Vec2EncoderLayerStableLayerNorm
        WhisperDecoderLayer WhisperEncoderLayer XLMRobertaLayer
    """), "block"),
    **dict.fromkeys(_names("""
        ViTPatchEmbeddings DeiTPatchEmbeddings BeitPatchEmbeddings Dinov2PatchEmbeddings SwinPatchEmbeddings
    """), "patch"),
}

#: torch.nn containers typed when cut off by ``--depth`` (exact classes, subclasses through the MRO).
_TORCH_CONTAINERS: dict[type, str] = {nn.TransformerEncoderLayer: "block", nn.TransformerDecoderLayer: "block"}


def known_container(mod: nn.Module) -> tuple[str, str] | None:
    """``(family, class name)`` of a container the mapping knows (see :data:`_HF_CONTAINERS`), or
    None."""
    for cls in type(mod).__mro__:
        family = _TORCH_CONTAINERS.get(cls)
        if family is not None:
            return family, cls.__name__
        if cls.__module__.startswith(_THIRD_PARTY) and cls.__name__ in _HF_CONTAINERS:
            return _HF_CONTAINERS[cls.__name__], cls.__name__
        if cls is nn.Module:
            break
    return None


def container_spec(mod: nn.Module, *, param_count: int) -> Spec:
    """The ``(type, params)`` of a container cut off by ``--depth`` (see :func:`_container_spec`)."""
    kind, params = _container_spec(mod, param_count=param_count)
    return check_type(kind), params


def _present(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if v is not None}


def _attention_spec(mod: nn.Module, name: str) -> Spec:
    embed, heads, kv = _attention_dims(mod)
    if embed is None:
        lins = _linears(mod)
        if lins:
            embed = _in_out(lins[0])[0]
    if heads is not None and kv is not None and kv < heads:
        return "groupedQueryAttention", _present({"embedDim": embed, "numHeads": heads, "numKVHeads": kv})
    low = name.lower()
    kind = "attention"
    if "cross" in low:
        kind = "crossModalAttention"
    elif "causal" in low:
        kind = "causalAttention"
    elif "selfattention" in low:
        kind = "selfAttention"
    return kind, _present({"embedDim": embed, "numHeads": heads})


def _moe_spec(mod: nn.Module) -> Spec:
    experts = getattr(mod, "experts", None)
    if isinstance(experts, (nn.ModuleList, list)):
        n_exp = len(experts)
    else:
        n_exp = _read_int(mod, ("num_experts", "num_local_experts"))
    top_k = _read_int(mod, ("top_k", "num_experts_per_tok"))
    embed, ff = _ff_dims(experts[0]) if isinstance(experts, nn.ModuleList) and len(experts) else (None, None)
    return "moeLayer", _present({"embedDim": embed or _read_int(mod, _EMBED_ATTRS), "numExperts": n_exp,
                                 "expertDim": ff, "topK": top_k})


def _mlp_spec(mod: nn.Module) -> Spec:
    names = dict(walk.named_children(mod))
    if {"gate_proj", "up_proj", "down_proj"} <= names.keys():
        embed, inter = _in_out(names["up_proj"])
        return "swiglu", {"embedDim": embed, "intermediateSize": inter}
    embed, ff = _ff_dims(mod)
    return "feedForward", _present({"embedDim": embed, "ffDim": ff})


def _block_spec(mod: nn.Module, param_count: int) -> Spec:
    """A listed block holding an attention: its width, heads and feed-forward width, read from its
    attention and MLP children (transformers' own structure) or its config."""
    attn = _find_attention(mod)
    if attn is None:
        return "customModule", {"className": type(mod).__name__, "paramCount": param_count}
    embed, heads, _ = _attention_dims(attn)
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
    return "transformerBlock", _present({"embedDim": embed, "numHeads": heads, "ffDim": ff})


def _patch_spec(mod: nn.Module, param_count: int) -> Spec:
    conv = getattr(mod, "projection", None)
    if not isinstance(conv, nn.Conv2d):
        return "customModule", {"className": type(mod).__name__, "paramCount": param_count}
    return "patchEmbed", {"patchSize": _scalar_or_list(conv.kernel_size), "embedDim": conv.out_channels,
                          "inChans": conv.in_channels}


def _container_spec(mod: nn.Module, *, param_count: int) -> Spec:
    """The ``(type, params)`` of a container cut off by ``--depth``: a table layer as such; a
    container :func:`known_container` knows by its family (attention: ``groupedQueryAttention``
    when it has fewer key/value heads than query heads, else ``selfAttention``,
    ``crossModalAttention``, ``causalAttention`` or ``attention`` as its class says; MLP: ``swiglu``
    with gate/up/down projections, else ``feedForward``; ``moeLayer``; ``transformerBlock`` for a
    block holding an attention; ``patchEmbed``), with the dimensions read from the module or its
    ``config``; anything else a ``customModule``: a class name is never read for what it might be."""
    if _lookup(mod) is not None:
        return layer_spec(mod, param_count=param_count)
    known = known_container(mod)
    if known is None:
        return "customModule", {"className": type(mod).__name__, "paramCount": param_count}
    family, name = known
    if family == "attention":
        return _attention_spec(mod, name)
    if family == "moe":
        return _moe_spec(mod)
    if family == "mlp":
        return _mlp_spec(mod)
    if family == "patch":
        return _patch_spec(mod, param_count)
    return _block_spec(mod, param_count)
