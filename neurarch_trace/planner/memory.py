"""The GPU memory one training step needs: mixed precision (fp16 or bf16 autocast) with AdamW.

The memory model is a list of *phase peaks*, each a line in the batch::

    peak(batch) = max over phase peaks p of (p.state + batch x p.per_sample)

A phase peak (:class:`PhasePeak`) holds its state bytes by kind (:data:`STATE_KINDS`: 16-bit weight
copies, fp32 master weights, frozen weights, gradients, optimizer moments, optimizer temporaries,
buffers, other, framework) and its per-sample bytes by kind (:data:`SAMPLE_KINDS`: the batch, the
activations, eager attention scores, the loss, backward transients), so that a strategy can divide
the state by the number of GPUs or the activations by a recomputation factor.

**Measured** (``source == "measured"``): the graph carries ``measured.training``, the tracer's
rehearsal of a real step (``docs/measured.md``): forward, loss, backward and ``AdamW.step()`` with
CUDA's autocast policy, fused attention and bool dropout masks, every storage followed. Its phase
peaks are used as they are, with the part of the per-sample bytes that grows with the sequence
length squared scaled by ``(seq_len / L0)^2`` and the rest by ``seq_len / L0``, and with eager
attention's score matrices added (measured per attention call) when ``attention == "eager"``.

**Estimated** (``source == "estimated"``, a graph without that measurement): one line::

    state      = trainable params x (WEIGHT16 + MASTER + GRADIENT + ADAMW)    2 + 4 + 4 + 8 = 18 bytes
               + frozen params x WEIGHT16 + packed quantized weights x PACKED + buffers
    per_sample = every layer's (and input's) output elements x bytes per element,
                 scaled by seq_len / traced tokens for a resized token model,
               + the primary output x LOSS (the loss runs in float32),
               + with eager attention, heads x L x L x EAGER_SCORE per attention-typed layer,

which ignores in-place sharing (over), dropout masks, pooling indices and float32 autocast outputs
(under), and the optimizer step's temporaries.

Both add :data:`FRAMEWORK_ALLOWANCE_BYTES` for the CUDA context, which no rehearsal sees. Bytes are
bytes; GB in the plan are 10^9 bytes, as the GPU table's capacities. Not modelled: allocator
fragmentation and rounding, cuDNN/cuBLAS workspaces (the GPU table's 1.15 headroom covers them),
activation checkpointing, ZeRO/FSDP sharding; one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from neurarch_trace.contract import ATTENTION_TYPES, Graph, Node, numel, parse_shape
from neurarch_trace.planner.counts import Counts, measured_int
from neurarch_trace.planner.estimate import size
from neurarch_trace.planner.workload import Workload

__all__ = [
    "ADAMW_BYTES",
    "ACTIVATION_BYTES",
    "EAGER_SCORE_BYTES",
    "FRAMEWORK_ALLOWANCE_BYTES",
    "FROZEN_BYTES",
    "GRADIENT_BYTES",
    "INPUT_FLOAT_BYTES",
    "INPUT_TOKEN_BYTES",
    "LOSS_BYTES",
    "MASTER_WEIGHT_BYTES",
    "MemoryModel",
    "PACKED_BYTES",
    "PhasePeak",
    "SAMPLE_KINDS",
    "STATE_KINDS",
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
#: 2 bytes, as ZeRO (Rajbhandari et al. 2020, section 3.1) counts them.
FROZEN_BYTES = 2
#: Elements of quantized packed weights: int8, 1 byte (torch.ao packed linear/conv params).
PACKED_BYTES = 1
#: Activations under autocast: fp16 or bf16, 2 bytes per element (Korthikanti et al. 2022,
#: "Reducing Activation Recomputation in Large Transformer Models", section 4.1, counts the same).
ACTIVATION_BYTES = 2
#: The training batch as the data loader hands it over: float32 images/features, int64 token ids.
INPUT_FLOAT_BYTES = 4
INPUT_TOKEN_BYTES = 8
#: Eager attention keeps the softmax output (heads x L x L) in 16 bits for the backward (the
#: estimate only; a measured graph measures it per attention call).
EAGER_SCORE_BYTES = 2
#: The loss on the model's primary output runs in float32 (``logits.float()`` in transformers'
#: losses; log_softmax and nll_loss are on autocast's fp32 list): 4 + 4 bytes per output element
#: in the estimate (a measured graph measures the loss and its backward).
LOSS_BYTES = 8
#: CUDA context, loaded kernels and library handles, present before the first tensor: Hugging
#: Face's "Model training anatomy" measured 1,343 MiB (1.41 GB) on a V100 with CUDA 11.2, which
#: loaded every kernel eagerly; CUDA 11.7+ lazy module loading (PyTorch's default since 1.13)
#: loads only the kernels used, so a round 1 GB is allowed.
FRAMEWORK_ALLOWANCE_BYTES = 1_000_000_000

#: Kinds of batch-independent bytes, and of bytes per sample (``measured.training`` uses the same
#: names, plus ``framework`` and ``attentionScores`` which only the plan adds).
STATE_KINDS = ("weights16", "masterWeights", "frozenWeights", "gradients", "optimizerMoments",
               "optimizerTemporaries", "buffers", "other", "framework")
SAMPLE_KINDS = ("inputs", "activations", "attentionScores", "loss", "backward")
#: Bounds on what a ``measured.training`` object from an untrusted graph may say.
_MAX_BYTES = 1e18
_MAX_PEAKS = 64

#: Bytes per element of the dtypes the tracer writes in ``measured.outputDtype``.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
}
_FLOAT_DTYPES = frozenset({"float64", "double", "float32", "float", "float16", "half", "bfloat16"})


@dataclass(frozen=True)
class PhasePeak:
    """One line of the peak: ``state`` bytes by kind (framework included) and ``per_sample``
    bytes by kind, at the planned sequence length."""

    phase: str
    state: Mapping[str, float]
    per_sample: Mapping[str, float]

    @property
    def state_bytes(self) -> float:
        return sum(self.state.values())

    @property
    def per_sample_bytes(self) -> float:
        return sum(self.per_sample.values())

    def bytes(self, batch: int) -> float:
        return self.state_bytes + batch * self.per_sample_bytes


@dataclass
class MemoryModel:
    """The phase peaks of a training step; ``source`` is ``"measured"`` or ``"estimated"`` and
    ``reason`` says why a graph was estimated (``None`` when measured)."""

    source: str
    phases: list[PhasePeak]
    reason: str | None = None
    layers_without_shape: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the activations of the step with the weights in 16 bits (a LoRA or QLoRA base) over those of
    #: this step, both measured (``measured.training.halfWeightsActivationBytesPerSample``); ``None``
    #: when not
    half_weights_ratio: float | None = None
    #: bytes per sample of the KV cache a transformers forward with ``use_cache`` returns, which the
    #: step holds until its output is freed (``measured.training.kvCacheBytesPerSample``, sized for
    #: the planned length); transformers turns the cache off with gradient checkpointing
    kv_cache_bytes: float = 0.0
    #: the part of ``kv_cache_bytes`` autograd saves too (``kvCacheSavedBytesPerSample``: a value the
    #: attention kernel keeps as it is), which checkpointing frees with the block, not with the cache
    kv_cache_saved_bytes: float = 0.0
    #: the attention calls whose eager score matrices ``attentionScores`` holds (measured SDPA calls,
    #: or attention-typed layers when estimated); 0 when it holds none
    attention_calls: int = 0
    #: bytes per sample that one eager attention call's backward allocates beyond what it saved
    #: (``measured.training.attention.eagerBackwardBytesPerSample``, sized for the planned length),
    #: counted in the backward phase's ``backward`` transients; 0 unless ``--attention eager``
    eager_backward_bytes: float = 0.0
    #: bytes per sample of the peak of each LoRA/QLoRA step rehearsed as PEFT and bitsandbytes run
    #: it (``measured.training.adapters``: ``lora``, ``qlora``, ``qloraKbit``), sized for the
    #: planned length and attention; absent when not rehearsed
    adapter_bytes: Mapping[str, float] = field(default_factory=dict)
    #: the same steps with activation checkpointing as transformers applies it
    #: (``checkpointedPerSampleBytes``), rehearsed where the model has layers it checkpoints
    adapter_checkpointed_bytes: Mapping[str, float] = field(default_factory=dict)
    #: the full training step with activation checkpointing as transformers applies it, rehearsed
    #: (``measured.training.checkpointed``): its phase peaks, sized as :attr:`phases` are, the one
    #: largest at batch 1 first; empty when
    #: not rehearsed (checkpointing is then sized from the plain step's layers and blocks)
    checkpointed_phases: list[PhasePeak] = field(default_factory=list)

    def peak(self, batch: int) -> PhasePeak:
        """The phase peak that is largest at ``batch``."""
        return max(self.phases, key=lambda p: p.bytes(batch))

    def peak_bytes(self, batch: int) -> float:
        """Training peak at ``batch`` samples, before any headroom."""
        return self.peak(batch).bytes(batch)

    def static_bytes(self, batch: int) -> float:
        """The batch-independent part of the peak at ``batch``."""
        return self.peak(batch).state_bytes

    def per_sample_bytes(self, batch: int) -> float:
        """Bytes per sample of the peak at ``batch``."""
        return self.peak(batch).per_sample_bytes

    def activation_bytes(self, batch: int) -> float:
        """The part of the peak at ``batch`` that scales with the batch."""
        return batch * self.per_sample_bytes(batch)

    def breakdown(self, batch: int) -> dict[str, float]:
        """Every part of the peak at ``batch``, in GB (10^9 bytes)."""
        p = self.peak(batch)
        s, a = p.state, p.per_sample
        return {
            "weightsGb": (s.get("weights16", 0) + s.get("frozenWeights", 0)) / 1e9,
            "masterWeightsGb": s.get("masterWeights", 0) / 1e9,
            "gradientsGb": s.get("gradients", 0) / 1e9,
            "optimizerGb": s.get("optimizerMoments", 0) / 1e9,
            "optimizerTemporariesGb": s.get("optimizerTemporaries", 0) / 1e9,
            "buffersGb": s.get("buffers", 0) / 1e9,
            "otherGb": s.get("other", 0) / 1e9,
            "frameworkGb": s.get("framework", 0) / 1e9,
            "inputsGb": batch * a.get("inputs", 0) / 1e9,
            "layerActivationsGb": batch * a.get("activations", 0) / 1e9,
            "attentionScoresGb": batch * a.get("attentionScores", 0) / 1e9,
            "lossGb": batch * a.get("loss", 0) / 1e9,
            "backwardGb": batch * a.get("backward", 0) / 1e9,
        }

    def as_plan(self, batch: int) -> dict[str, Any]:
        """The plan's ``memory`` object at ``batch``: where the numbers come from and every phase
        peak (GB)."""
        return {
            "source": self.source,
            "reason": self.reason,
            "peakPhase": self.peak(batch).phase,
            "phases": [
                {"phase": p.phase, "stateGb": {k: v / 1e9 for k, v in p.state.items() if v},
                 "perSampleGb": {k: v / 1e9 for k, v in p.per_sample.items() if v},
                 "peakGb": p.bytes(batch) / 1e9}
                for p in self.phases
            ],
        }


# --- measured ------------------------------------------------------------------------------------


def _bytes_map(value: Any, kinds: tuple[str, ...]) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    out: dict[str, float] = {}
    for kind, n in value.items():
        if kind not in kinds or isinstance(n, bool) or not isinstance(n, (int, float)):
            return None
        if not math.isfinite(n) or not 0 <= n <= _MAX_BYTES:
            return None
        out[kind] = float(n)
    return out


def _measured_phase(raw: Any, scale: float, eager: tuple[float, float]) -> PhasePeak | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("phase"), str):
        return None
    state = _bytes_map(raw.get("stateBytes", {}), STATE_KINDS)
    per_sample = _bytes_map(raw.get("perSampleBytes", {}), SAMPLE_KINDS)
    squared = _bytes_map(raw.get("seqSquaredBytes", {}), SAMPLE_KINDS)
    if state is None or per_sample is None or squared is None:
        return None
    sized: dict[str, float] = {}
    for kind, n in per_sample.items():
        sq = min(squared.get(kind, 0.0), n)
        sized[kind] = (n - sq) * scale + sq * scale * scale
    scores, fused = eager
    if (scores or fused) and raw["phase"] in ("forward", "loss", "backward"):
        # eager keeps the score matrices (queries x keys) instead of the fused kernel's output and
        # log-sum-exp (queries): sized for the planned length, each by its own power
        sized["attentionScores"] = scores * scale * scale - fused * scale
    state["framework"] = float(FRAMEWORK_ALLOWANCE_BYTES)
    return PhasePeak(raw["phase"], state, sized)


def _measured(graph: Graph, work: Workload, attention: str | None) -> tuple[MemoryModel | None, str]:
    """The measured model, or ``None`` and the reason it cannot be used."""
    training = graph.measured.get("training")
    if not isinstance(training, dict):
        return None, "the graph has no measured training step (traced by an older tool, or without one)"
    if isinstance(training.get("error"), str):
        return None, f"the training step was not rehearsed: {training['error']}"
    peaks = training.get("peaks")
    if not isinstance(peaks, list) or not 0 < len(peaks) <= _MAX_PEAKS:
        return None, "measured.training.peaks is missing or malformed"
    eager = (0.0, 0.0)
    notes: list[str] = []
    if attention == "eager":
        att = training.get("attention")
        att = att if isinstance(att, dict) else {}
        parts = _bytes_map({k: att[k] for k in ("eagerScoreBytesPerSample", "fusedKeptBytesPerSample") if k in att},
                           ("eagerScoreBytesPerSample", "fusedKeptBytesPerSample"))
        if parts:
            eager = (parts.get("eagerScoreBytesPerSample", 0.0), parts.get("fusedKeptBytesPerSample", 0.0))
        calls = att.get("sdpaCalls")
        if not calls:
            notes.append("eager attention asked for, but the model calls no scaled_dot_product_attention: "
                         "attention it computes itself was measured as it runs")
    phases = [_measured_phase(raw, work.scale, eager) for raw in peaks]
    if any(p is None for p in phases):
        return None, "measured.training.peaks is malformed"
    eager_backward = 0.0
    if attention == "eager" and any(eager):
        # the gradients of one call's score matrices, while every activation is still alive: the
        # backward phase meets them once (each call's backward runs alone), sized like the scores
        eager_backward = (_positive_bytes(att, "eagerBackwardBytesPerSample") or 0.0) * work.scale * work.scale
        phases = [p if p.phase != "backward" else PhasePeak(
            p.phase, p.state, {**p.per_sample, "backward": p.per_sample.get("backward", 0.0) + eager_backward})
            for p in phases]
    kv = (_positive_bytes(training, "kvCacheBytesPerSample") or 0.0) * work.scale
    kv_saved = min(kv, (_positive_bytes(training, "kvCacheSavedBytesPerSample") or 0.0) * work.scale)
    kv_dropped = 0.0
    if training.get("useCache") is False and kv:
        kv_dropped = kv
        # traced with a KV cache its config turns off (a meta build needs one): the step the model
        # runs holds none, so each phase's activations are without it; until the backward has freed
        # them, the cache tensors autograd saved too (a value the attention kernel keeps as it is)
        # are held without the cache as well: kept through the backward, where the step peaks
        # before it frees them (a later, smaller backward peak is then over by at most their bytes)
        def without_cache(p: PhasePeak) -> PhasePeak:
            dropped = kv - kv_saved if p.phase in ("forward", "loss", "backward") else kv
            return PhasePeak(p.phase, p.state,
                             {**p.per_sample, "activations": max(0.0, p.per_sample.get("activations", 0.0) - dropped)})

        phases = [p if p.phase == "setup" else without_cache(p) for p in phases if p is not None]
        kv = kv_saved = 0.0
    calls = (measured_int(att, "sdpaCalls") or 0) if attention == "eager" and any(eager) else 0
    scores = max((p.per_sample.get("attentionScores", 0.0) for p in phases if p is not None), default=0.0)
    adapters = _adapter_bytes(training, work.scale, scores + eager_backward, kv_dropped)
    # the checkpointed steps as rehearsed, with the kernel the trace ran: eager attention's score
    # matrices live only while their block runs or is recomputed, which may or may not be where a
    # checkpointed step peaks, so under an eager what-if checkpointing is sized from the layers
    what_if = calls > 0
    checkpointed = {} if what_if else _adapter_bytes(training, work.scale, 0.0, 0.0, "checkpointedPerSampleBytes")
    checkpointed_phases = [] if what_if else _checkpointed_phases(training, work.scale)
    if not what_if and "checkpointed" in training and not checkpointed_phases:
        notes.append("measured.training.checkpointed is malformed: checkpointing is sized from the plain step's layers")
    return MemoryModel("measured", [p for p in phases if p is not None], notes=notes, attention_calls=calls,
                       checkpointed_phases=checkpointed_phases,
                       half_weights_ratio=_half_weights_ratio(training, peaks), kv_cache_bytes=kv,
                       kv_cache_saved_bytes=kv_saved,
                       eager_backward_bytes=eager_backward, adapter_bytes=adapters,
                       adapter_checkpointed_bytes=checkpointed), ""


def _checkpointed_phases(training: Mapping[str, Any], scale: float) -> list[PhasePeak]:
    """``measured.training.checkpointed``'s phase peaks, sized for the planned length as the plain
    step's are, the one largest at batch 1 first (a footprint's main phase); empty when absent or
    malformed (the plan then sizes checkpointing from the plain step's layers)."""
    raw = training.get("checkpointed")
    peaks = raw.get("peaks") if isinstance(raw, dict) else None
    if not isinstance(peaks, list) or not 0 < len(peaks) <= _MAX_PEAKS:
        return []
    phases = [_measured_phase(peak, scale, (0.0, 0.0)) for peak in peaks]
    if any(p is None for p in phases):
        return []
    return sorted(phases, key=lambda p: -p.bytes(1))  # type: ignore[union-attr]


def _adapter_bytes(training: Mapping[str, Any], scale: float, eager: float, kv_dropped: float,
                   key: str = "perSampleBytes") -> dict[str, float]:
    """``measured.training.adapters``' bytes per sample of each recipe (``key``: without or with
    activation checkpointing), rescaled to the planned length (linearly, as the step's
    activations), plus ``eager`` (eager attention's score matrices and one call's backward, where
    the plan asks for eager attention and the trace ran SDPA) less ``kv_dropped`` (a KV cache the
    model's config turns off); malformed entries are left out."""
    adapters = training.get("adapters")
    if not isinstance(adapters, dict):
        return {}
    found: dict[str, float] = {}
    for name in ("lora", "qlora", "qloraKbit"):
        entry = adapters.get(name)
        per_sample = _positive_bytes(entry, key) if isinstance(entry, dict) else None
        if per_sample is not None:
            found[name] = max(0.0, per_sample * scale + eager - kv_dropped)
    return found


def _half_weights_ratio(training: Mapping[str, Any], peaks: list) -> float | None:
    """``halfWeightsActivationBytesPerSample`` over the activations of the phase peak with the most
    bytes per sample, both at the traced length; ``None`` when absent or malformed."""
    half = _positive_bytes(training, "halfWeightsActivationBytesPerSample")
    top = max(peaks, key=lambda p: sum(p.get("perSampleBytes", {}).values()), default=None)
    full = top.get("perSampleBytes", {}).get("activations", 0) if isinstance(top, dict) else 0
    if half is None or not full:
        return None
    return half / full


def _positive_bytes(training: Mapping[str, Any], key: str) -> float | None:
    """``training[key]`` when it is a byte count above 0 (:func:`_bytes_map`'s bounds), else None."""
    found = _bytes_map({key: training.get(key)}, (key,))
    return found[key] if found and found[key] > 0 else None


# --- estimated -----------------------------------------------------------------------------------


def _dtype(value: Any) -> str | None:
    return value.rsplit(".", 1)[-1].lower() if isinstance(value, str) else None


def _output_elements(node: Node) -> int | None:
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


def _estimated(graph: Graph, counts: Counts, work: Workload, attention: str | None, reason: str) -> MemoryModel:
    activations = 0
    missing: list[str] = []
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
    notes: list[str] = []
    attention_layers: list[Node] = []
    if attention == "eager":
        attention_layers = [n for n in graph.nodes if n.type in ATTENTION_TYPES]
        scores = sum(_score_elements(n) for n in attention_layers) * EAGER_SCORE_BYTES
        if not attention_layers:
            notes.append("eager attention asked for, but no layer is typed as attention: score matrices "
                         "computed in functional code (as Hugging Face models do) are not counted")
    state = {
        "weights16": float(counts.trainable * WEIGHT16_BYTES + counts.frozen * FROZEN_BYTES
                           + counts.packed * PACKED_BYTES),
        "masterWeights": float(counts.trainable * MASTER_WEIGHT_BYTES),
        "gradients": float(counts.trainable * GRADIENT_BYTES),
        "optimizerMoments": float(counts.trainable * ADAMW_BYTES),
        "buffers": float(counts.buffer_bytes),
        "framework": float(FRAMEWORK_ALLOWANCE_BYTES),
    }
    per_sample = {
        "activations": activations * work.scale,
        "attentionScores": scores * work.scale * work.scale,
        "loss": loss * work.scale,
    }
    return MemoryModel("estimated", [PhasePeak("step", state, per_sample)], reason=reason,
                       layers_without_shape=missing, notes=notes,
                       attention_calls=len(attention_layers) if scores else 0)


def memory_model(graph: Graph, counts: Counts, work: Workload, attention: str | None) -> MemoryModel:
    """The memory model of ``graph``: measured when the graph carries a rehearsed training step,
    estimated otherwise. ``attention`` is ``eager``, ``sdpa``, ``flash`` or ``None`` (taken as SDPA,
    PyTorch's and Hugging Face's default)."""
    model, reason = _measured(graph, work, attention)
    if model is not None:
        return model
    return _estimated(graph, counts, work, attention, reason)
