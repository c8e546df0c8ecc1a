"""The GPU memory one training step needs: mixed precision (fp16 or bf16 autocast) with AdamW.

The peak is linear in the batch::

    peak(batch) = static + batch x per_sample

    static     = trainable params x (WEIGHT16 + MASTER + GRADIENT + ADAMW)    2 + 4 + 4 + 8 = 18 bytes
               + frozen params x WEIGHT16 + packed quantized weights x PACKED
               + buffers (measured bytes, or BatchNorm running statistics)
               + FRAMEWORK_ALLOWANCE
    per_sample = sum over every layer (and input) of its output elements x bytes per element,
                 scaled by seq_len / traced tokens for a resized token model,
               + the model's primary output x LOSS (the loss runs in float32),
               + with eager attention, heads x L x L x EAGER_SCORE per attention-typed layer.

Bytes are bytes; GB in the plan are 10^9 bytes, as the GPU table's capacities. What the model
ignores, each an approximation in one direction or the other:

* every layer's output is taken as kept for backward once: in-place activations (which share
  their input's storage) and views are counted again (over), while extra saved tensors are not
  counted (under): dropout masks, max-pool indices, normalisation statistics, the inputs of
  functional code between layers;
* autocast runs some ops in float32 (softmax, layer_norm): their outputs are counted at 16 bits
  (under), except the loss, which is counted (:data:`LOSS_BYTES`);
* transient memory (the gradient of the activation being back-propagated, cuDNN workspaces) is
  not modelled beyond the fixed allowance; the GPU table's 1.15
  headroom (``gpus.json``) covers it and allocator fragmentation;
* no activation checkpointing, no ZeRO/FSDP sharding, one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from neurarch_trace.contract import ATTENTION_TYPES, Graph, Node, numel, parse_shape
from neurarch_trace.planner.counts import Counts
from neurarch_trace.planner.estimate import size
from neurarch_trace.planner.workload import Workload

__all__ = [
    "ADAMW_BYTES",
    "ACTIVATION_BYTES",
    "EAGER_SCORE_BYTES",
    "FRAMEWORK_ALLOWANCE_BYTES",
    "FROZEN_BYTES",
    "INPUT_FLOAT_BYTES",
    "INPUT_TOKEN_BYTES",
    "LOSS_BYTES",
    "GRADIENT_BYTES",
    "MASTER_WEIGHT_BYTES",
    "MemoryModel",
    "PACKED_BYTES",
    "WEIGHT16_BYTES",
    "memory_model",
]

# Per learnable parameter, mixed precision with AdamW: 18 bytes, as Hugging Face's "Model training
# anatomy" (transformers docs, "Anatomy of Model's Memory") counts it for torch.autocast training.
#: fp32 master weights: the model's own parameters under autocast (Micikevicius et al. 2018,
#: "Mixed Precision Training", section 3.1).
MASTER_WEIGHT_BYTES = 4
#: 16-bit copy of each weight that autocast casts and caches for the forward and backward.
WEIGHT16_BYTES = 2
#: Gradients, accumulated in fp32 on the fp32 parameters (HF "Model training anatomy"; ZeRO,
#: Rajbhandari et al. 2020, section 3.1, counts 2 bytes for 16-bit gradients instead).
GRADIENT_BYTES = 4
#: AdamW's two fp32 moments (exp_avg and exp_avg_sq in torch.optim.AdamW; Loshchilov & Hutter 2019).
ADAMW_BYTES = 8
#: A frozen parameter needs no master copy, gradient or optimizer state: only its 16-bit weights,
#: 2 bytes, as ZeRO (Rajbhandari et al. 2020, section 3.1) counts them (frozen weights left in
#: fp32 under plain autocast would take 4 + 2).
FROZEN_BYTES = 2
#: Elements of quantized packed weights: int8, 1 byte (torch.ao packed linear/conv params).
PACKED_BYTES = 1
#: Activations under autocast: fp16 or bf16, 2 bytes per element (Korthikanti et al. 2022,
#: "Reducing Activation Recomputation in Large Transformer Models", section 4.1, counts the same).
ACTIVATION_BYTES = 2
#: The training batch as the data loader hands it over: float32 images/features, int64 token ids.
INPUT_FLOAT_BYTES = 4
INPUT_TOKEN_BYTES = 8
#: Eager attention keeps the softmax output (heads x L x L) in 16 bits for the backward of the
#: softmax and of scores x V. Korthikanti et al. 2022, section 4.1, count 5 bytes per score when
#: attention dropout is on (its 1-byte mask and 2-byte output); SDPA and flash kernels keep only
#: O(L) statistics and recompute the scores.
EAGER_SCORE_BYTES = 2
#: The loss on the model's primary output runs in float32: transformers' ForCausalLMLoss upcasts the
#: logits (``logits.float()``, transformers/loss/loss_utils.py) and autocast runs log_softmax and
#: nll_loss in float32 (PyTorch's autocast op reference, "CUDA Ops that can autocast to float32");
#: cross-entropy keeps the fp32 log-probabilities for its backward. 4 + 4 bytes per output element:
#: for a language model's logits (vocabulary-sized per token) this is often the largest activation.
LOSS_BYTES = 8
#: CUDA context, loaded kernels and library handles, present before the first tensor: Hugging
#: Face's "Model training anatomy" measured 1,343 MiB (1.41 GB) on a V100 with CUDA 11.2, which
#: loaded every kernel eagerly; CUDA 11.7+ lazy module loading (PyTorch's default since 1.13)
#: loads only the kernels used, so a round 1 GB is allowed.
FRAMEWORK_ALLOWANCE_BYTES = 1_000_000_000

#: Bytes per element of the dtypes the tracer writes in ``measured.outputDtype``.
DTYPE_BYTES: Dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
}
_FLOAT_DTYPES = frozenset({"float64", "double", "float32", "float", "float16", "half", "bfloat16"})


@dataclass
class MemoryModel:
    """``static_bytes`` (independent of the batch) by part, and ``per_sample_bytes`` (activations
    of one sample) by part. All bytes."""

    weights_bytes: int
    master_weight_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    framework_bytes: int
    activation_bytes_per_sample: float
    attention_bytes_per_sample: float
    loss_bytes_per_sample: float = 0.0
    layers_without_shape: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def static_bytes(self) -> int:
        return (self.weights_bytes + self.master_weight_bytes + self.gradient_bytes
                + self.optimizer_bytes + self.buffer_bytes + self.framework_bytes)

    @property
    def per_sample_bytes(self) -> float:
        return self.activation_bytes_per_sample + self.attention_bytes_per_sample + self.loss_bytes_per_sample

    def peak_bytes(self, batch: int) -> float:
        """Training peak at ``batch`` samples, before any headroom."""
        return self.static_bytes + batch * self.per_sample_bytes

    def activation_bytes(self, batch: int) -> float:
        """The part of the peak that scales with the batch."""
        return batch * self.per_sample_bytes

    def breakdown(self, batch: int) -> Dict[str, float]:
        """Every part of the peak at ``batch``, in GB (10^9 bytes)."""
        return {
            "weightsGb": self.weights_bytes / 1e9,
            "masterWeightsGb": self.master_weight_bytes / 1e9,
            "gradientsGb": self.gradient_bytes / 1e9,
            "optimizerGb": self.optimizer_bytes / 1e9,
            "buffersGb": self.buffer_bytes / 1e9,
            "frameworkGb": self.framework_bytes / 1e9,
            "layerActivationsGb": batch * self.activation_bytes_per_sample / 1e9,
            "attentionScoresGb": batch * self.attention_bytes_per_sample / 1e9,
            "lossGb": batch * self.loss_bytes_per_sample / 1e9,
        }


def _dtype(value: Any) -> Optional[str]:
    return value.rsplit(".", 1)[-1].lower() if isinstance(value, str) else None


def _output_elements(node: Node) -> Optional[int]:
    """Elements of every tensor output per sample: ``measured.outputShapes`` when recorded, else
    the primary ``outputShape``."""
    shapes = node.measured.get("outputShapes")
    if isinstance(shapes, list) and shapes:
        parsed = [parse_shape(s)[0] for s in shapes]
        if all(p is not None for p in parsed):
            return sum(numel(p) for p in parsed if p is not None)
    return numel(node.output_shape) if node.output_shape is not None else None


def _element_bytes(node: Node, work: Workload) -> int:
    dtype = _dtype(node.measured.get("outputDtype") or node.measured.get("dtype"))
    if node.type == "input":
        if dtype in DTYPE_BYTES:
            return DTYPE_BYTES[dtype]
        return INPUT_TOKEN_BYTES if work.kind == "tokens" else INPUT_FLOAT_BYTES
    if dtype in DTYPE_BYTES and dtype not in _FLOAT_DTYPES:
        return DTYPE_BYTES[dtype]  # integer and bool outputs keep their size under autocast
    return ACTIVATION_BYTES


def _score_elements(node: Node) -> int:
    """heads x L x L for one attention-typed layer with a known head count; L is the number of
    vectors of the layer's width in its input (self-attention: keys = queries)."""
    heads = size(node.params, "numHeads")
    width = size(node.params, "hiddenDim") or size(node.params, "embedDim")
    shape = node.input_shape
    if heads is None or shape is None:
        return 0
    width = width or shape[-1]
    tokens = max(1, numel(shape) // width)
    return heads * tokens * tokens


def memory_model(graph: Graph, counts: Counts, work: Workload, attention: Optional[str]) -> MemoryModel:
    """The memory model of ``graph``; ``attention`` is ``eager``, ``sdpa``, ``flash`` or ``None``
    (taken as SDPA, PyTorch's and Hugging Face's default)."""
    activations = 0
    missing: List[str] = []
    for node in graph.nodes:
        if node.type == "output":
            continue
        elements = _output_elements(node)
        if elements is None:
            missing.append(node.name)
            continue
        activations += elements * _element_bytes(node, work)
    outputs = [n for n in graph.nodes if n.type == "output"]
    primary = outputs[0].input_shape if outputs else None
    loss = numel(primary) * LOSS_BYTES if primary is not None else 0
    scores = 0
    notes: List[str] = []
    if attention == "eager":
        attention_layers = [n for n in graph.nodes if n.type in ATTENTION_TYPES]
        scores = sum(_score_elements(n) for n in attention_layers) * EAGER_SCORE_BYTES
        if not attention_layers:
            notes.append("eager attention asked for, but no layer is typed as attention: score matrices "
                         "computed in functional code (as Hugging Face models do) are not counted")
    return MemoryModel(
        weights_bytes=counts.trainable * WEIGHT16_BYTES + counts.frozen * FROZEN_BYTES + counts.packed * PACKED_BYTES,
        master_weight_bytes=counts.trainable * MASTER_WEIGHT_BYTES,
        gradient_bytes=counts.trainable * GRADIENT_BYTES,
        optimizer_bytes=counts.trainable * ADAMW_BYTES,
        buffer_bytes=counts.buffer_bytes,
        framework_bytes=FRAMEWORK_ALLOWANCE_BYTES,
        activation_bytes_per_sample=activations * work.scale,
        attention_bytes_per_sample=scores * work.scale * work.scale,
        loss_bytes_per_sample=loss * work.scale,
        layers_without_shape=missing,
        notes=notes,
    )
