"""The type vocabulary of ``.neurarch.json`` and the parameter keys each type carries.

Source: ``shared/spec/neurarch-graph.md`` ("Vocabulary and parameter keys"). :data:`TYPES` maps every
type to the keys the spec lists for it, in the spec's order; the type families below are the
groupings the tracer, the verifier, the estimator, the memory model and the warnings read. This is
the one place a type name is spelled out: the tracer's mapping table checks every type it emits
against :data:`TYPES` when it is built, and the planner's rules take their families from here.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Tuple

__all__ = [
    "ACTIVATION_TYPES",
    "ATTENTION_TYPES",
    "CONV_TYPES",
    "KERNEL_KEYS",
    "MERGE_TYPES",
    "NORM_TYPES",
    "POSITIVE_KEYS",
    "TYPES",
    "VOCABULARY",
    "WEIGHT_TYPES",
    "ZERO_COST_TYPES",
    "check_type",
]


def _keys(text: str) -> Tuple[str, ...]:
    return tuple(text.split())


_CONV_KEYS = _keys("inChannels outChannels kernelSize stride padding dilation groups bias")
_POOL_KEYS = _keys("kernelSize stride")

#: Every type of the vocabulary and the parameter keys the spec lists for it (``()``: none).
TYPES: Mapping[str, Tuple[str, ...]] = MappingProxyType({
    "input": _keys("shape"),
    "output": (),
    "linear": _keys("inFeatures outFeatures bias"),
    "conv1d": _CONV_KEYS,
    "conv2d": _CONV_KEYS,
    "conv3d": _CONV_KEYS,
    "transposeConv2d": _CONV_KEYS + ("outputPadding",),
    "depthwiseConv2d": _keys("inChannels kernelSize depthMultiplier"),
    "patchEmbed": _keys("patchSize embedDim inChans"),
    "maxpool1d": _POOL_KEYS,
    "maxpool2d": _POOL_KEYS,
    "avgpool1d": _POOL_KEYS,
    "avgpool2d": _POOL_KEYS,
    "adaptiveAvgPool2d": _keys("outputSize"),
    "adaptiveMaxPool2d": _keys("outputSize"),
    "globalAvgPool2d": (),
    "upsample": _keys("scaleFactor"),
    "embedding": _keys("vocabSize embeddingDim"),
    "embeddingBag": _keys("vocabSize embeddingDim"),
    "lstm": _keys("inputSize hiddenSize numLayers bidirectional"),
    "gru": _keys("inputSize hiddenSize numLayers bidirectional"),
    "rnn": _keys("inputSize hiddenSize numLayers bidirectional"),
    "multiHeadAttention": _keys("hiddenDim numHeads"),
    "groupedQueryAttention": _keys("embedDim numHeads numKVHeads"),
    "transformerBlock": _keys("embedDim numHeads ffDim"),
    "feedForward": _keys("embedDim ffDim"),
    "swiglu": _keys("embedDim intermediateSize"),
    "moeLayer": _keys("embedDim numExperts expertDim topK"),
    "lmHead": _keys("embedDim vocabSize bias weightTied"),
    "batchNorm": _keys("numFeatures"),
    "layerNorm": _keys("normalizedShape"),
    "rmsNorm": _keys("normalizedShape"),
    "groupNorm": _keys("numGroups numChannels"),
    "instanceNorm": _keys("numFeatures"),
    "dropout": _keys("p"),
    "prelu": _keys("numParameters"),
    "leakyRelu": _keys("negativeSlope"),
    **{name: () for name in _keys(
        "relu relu6 elu selu gelu swish mish hardSwish hardSigmoid sigmoid tanh softmax logSoftmax "
        "softplus glu flatten"
    )},
    "add": (),
    "concatenate": (),
    "stack": (),
    "customModule": _keys("className paramCount"),
    # containers cut off by a depth limit
    "attention": _keys("embedDim numHeads"),
    "selfAttention": _keys("embedDim numHeads"),
    "causalAttention": _keys("embedDim numHeads"),
    "crossModalAttention": _keys("embedDim numHeads"),
    "positionalEncoding": _keys("embedDim"),
    "rope": (),
    "seBlock": (),
    "residual": (),
})

#: Every type name of the vocabulary.
VOCABULARY = frozenset(TYPES)

#: Merge points in the data flow: the tracer's merge nodes.
MERGE_TYPES = frozenset({"add", "concatenate", "stack"})

#: Types that own no parameters and cost 0 counted FLOPs (activations, dropout, merges, pooling,
#: reshapes): known to be free, so they never count as "unknown cost".
ZERO_COST_TYPES = frozenset(_keys(
    "input output dropout relu relu6 elu selu gelu swish mish hardSwish hardSigmoid sigmoid tanh "
    "softmax logSoftmax softplus glu leakyRelu flatten maxpool1d maxpool2d avgpool1d avgpool2d "
    "adaptiveAvgPool2d adaptiveMaxPool2d globalAvgPool2d upsample rope"
)) | MERGE_TYPES

#: Types whose layer computes attention scores (the eager-attention memory term reads these).
ATTENTION_TYPES = frozenset(_keys(
    "multiHeadAttention groupedQueryAttention transformerBlock attention selfAttention causalAttention "
    "crossModalAttention"
))

#: Convolutions (channels first), patch embeddings included.
CONV_TYPES = frozenset(_keys("conv1d conv2d conv3d transposeConv2d depthwiseConv2d patchEmbed"))

#: Layers that hold weights a classifier or a deep plain net is made of.
WEIGHT_TYPES = frozenset(_keys(
    "linear lstm gru rnn multiHeadAttention groupedQueryAttention transformerBlock feedForward swiglu "
    "moeLayer lmHead embedding embeddingBag"
)) | CONV_TYPES

#: Elementwise nonlinearities.
ACTIVATION_TYPES = frozenset(_keys(
    "relu relu6 elu selu gelu swish mish hardSwish hardSigmoid sigmoid tanh leakyRelu prelu softplus glu"
))

#: Normalisation layers.
NORM_TYPES = frozenset(_keys("batchNorm layerNorm rmsNorm groupNorm instanceNorm"))

#: Params that are sizes: a positive integer when present.
POSITIVE_KEYS = _keys(
    "inFeatures outFeatures inChannels outChannels numFeatures numGroups numChannels numHeads "
    "numKVHeads hiddenDim embedDim ffDim intermediateSize vocabSize embeddingDim inputSize "
    "hiddenSize numLayers numExperts expertDim topK inChans depthMultiplier numParameters groups"
)
#: Params that are a positive integer or a list of them.
KERNEL_KEYS = ("kernelSize", "stride", "dilation", "patchSize")


def check_type(name: str) -> str:
    """Return ``name`` when it is a type of the vocabulary.

    Raises:
        ValueError: an unknown type (a programming error in a producer's table).
    """
    if name not in TYPES:
        raise ValueError(f"{name!r} is not a type of the .neurarch.json vocabulary")
    return name
