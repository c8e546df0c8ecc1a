"""What a training step holds and computes in each mode: full training, LoRA or QLoRA fine-tuning.

``full``: every parameter trains; the model states are the memory model's
(:mod:`neurarch_trace.planner.memory`), 18 bytes per trainable parameter on one GPU.

``lora`` (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", section 4): the
base is frozen in 16 bits (2 bytes per parameter, no gradient, no optimizer state) and each adapted
linear layer ``W (out x in)`` gains ``B (out x r) A (r x in)``: ``r x (in + out)`` trainable
parameters, rank ``r`` = :data:`DEFAULT_RANK` unless asked. The adapted layers are every linear
layer except the output layer, PEFT's ``target_modules="all-linear"`` ("all linear/Conv1D modules
are chosen, excluding the output layer"), which covers the attention and MLP projections that
Dettmers et al. 2023 (QLoRA, section 4) find must all be adapted to match full fine-tuning. The
adapters train as full training does (PEFT keeps them in fp32 under autocast): 18 bytes each.

``qlora`` (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", section 3): the
same adapters over a base whose adapted linear layers are stored in 4-bit NormalFloat (NF4) with
block size 64 and double quantisation: 4 bits per weight plus 8/64 + 32/(64 x 256) = 0.127 bits of
quantisation constants (:data:`NF4_BITS`); the other parameters (embeddings, norms, the output
layer, which transformers' bitsandbytes integration leaves unquantised) stay in 16 bits. Compute
runs in 16 bits: each quantised layer is dequantised to a 16-bit copy for its matmul
(bitsandbytes ``MatMul4Bit``: ``F.dequantize_4bit(B, quant_state).to(A.dtype)``), one layer at a
time. The optimizer states are paged (bitsandbytes' paged AdamW moves them to host memory only
under memory pressure), so they are counted on the GPU.

Activations are those of the step itself where the trace rehearsed it (``measured.training.adapters``,
:mod:`neurarch_trace.rehearsal.adapters`: PEFT's and bitsandbytes' own code paths, tensor for tensor;
within 1% of an H200's peak on LLaMA-7B), with activation checkpointing too where the model has
layers transformers checkpoints (``checkpointedPerSampleBytes``, :mod:`neurarch_trace.rehearsal.checkpointing`),
else with checkpointing sized from full training's.
Without that measurement they are estimated from full training's (every layer's output is still
kept for the backward through the frozen base: the adapters' ``A`` reads each adapted layer's
input), scaled to a 16-bit base, plus each adapter's ``r``-wide intermediate. For QLoRA the
rehearsal also sizes PEFT's ``prepare_model_for_kbit_training`` recipe (its QLoRA guide's), whose float32
residual stream the card reports beside the 16-bit one it fits (``Tuning.kbit``).

Training FLOPs per sample, with ``F`` the forward FLOPs and ``A`` the adapters' forward FLOPs
(``2 x r x (in + out)`` per row of each adapted layer)::

    full:        3 F                  (+ F with checkpointing: one more forward)
    lora, qlora: 2 F + 3 A            (+ F + A with checkpointing)

The backward of a matmul is two products the size of its forward, one for the input's gradient
and one for the weight's (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section
2.1: C = 6N per token = 3 x 2N); a frozen weight needs only the first, so the frozen base costs
2 x its forward, not 3 x. Hu et al. 2021 (section 4.2) measure the consequence: a 25% speedup of
LoRA training over full fine-tuning on GPT-3 175B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from neurarch_trace.contract import Graph, Node, numel
from neurarch_trace.planner.analysis import Analysis
from neurarch_trace.planner.blocks import Blocks
from neurarch_trace.planner.cost import BACKWARD_FACTOR
from neurarch_trace.planner.estimate import size
from neurarch_trace.planner.memory import (
    ACTIVATION_BYTES,
    ADAMW_BYTES,
    FROZEN_BYTES,
    GRADIENT_BYTES,
    MASTER_WEIGHT_BYTES,
    PACKED_BYTES,
    WEIGHT16_BYTES,
    PhasePeak,
)
from neurarch_trace.planner.strategy import ZERO_GRADIENT_BYTES, Activations, Phase, States

__all__ = [
    "DEFAULT_RANK",
    "FROZEN_BACKWARD_FACTOR",
    "MODES",
    "NF4_BITS",
    "NF4_BYTES",
    "Adapted",
    "Tuning",
    "adaptable_linears",
    "tuning",
]

#: The request's ``finetune`` values.
MODES = ("full", "lora", "qlora")
#: LoRA rank when none is asked for, stated on the card: between PEFT's ``LoraConfig`` default (8)
#: and the QLoRA paper's 64 (Dettmers et al. 2023, appendix B); Hu et al. 2021 (section 7.2, table
#: 6) find ranks of 1 to 8 already enough on GPT-3's query and value projections.
DEFAULT_RANK = 16
#: NF4 with double quantisation (Dettmers et al. 2023, section 3, "Double Quantization"): 4 bits
#: per weight + one 8-bit constant per block of 64 + one fp32 constant per 256 of those blocks:
#: 4 + 8/64 + 32/(64 x 256) = 4.126953125 bits (the paper rounds the constants to 0.127).
NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
NF4_BYTES = NF4_BITS / 8
#: Forward + backward through frozen weights: 2 x forward (the input-gradient product only).
FROZEN_BACKWARD_FACTOR = 2
#: Bytes per adapter parameter: fp32 adapter 4 + its 16-bit autocast copy 2 + fp32 gradient 4 +
#: AdamW 8, the memory model's full-training constants.
ADAPTER_BYTES = WEIGHT16_BYTES + MASTER_WEIGHT_BYTES + GRADIENT_BYTES + ADAMW_BYTES


@dataclass(frozen=True)
class Adapted:
    """One linear layer that gets an adapter: ``rows`` per sample at the traced size."""

    node: Node
    in_features: int
    out_features: int
    rows: int
    owns_params: bool


@dataclass
class Tuning:
    """A mode's step: the states and activations to fit, the training FLOPs per sample (without
    and with checkpointing), and for LoRA/QLoRA the adapters. ``applied`` is false when the mode
    asked for could not apply (no linear layer to adapt): the step is then full training and
    ``note`` says why."""

    mode: str
    asked: str
    rank: int | None
    states: States
    acts: Activations
    flops: float
    flops_checkpointed: float
    trainable: int
    adapted: list[Adapted] = field(default_factory=list)
    quantized_params: int = 0
    base_bytes: float = 0.0
    note: str | None = None
    #: the step's other phases (a measured step peaks in the optimizer step at a small batch and in
    #: the backward at a large one): ``(states, acts)`` each, sized like ``states`` and ``acts``
    others: tuple[Phase, ...] = ()
    #: ``"rehearsed"`` when the activations come from the LoRA/QLoRA step itself, rehearsed as PEFT
    #: runs it (``measured.training.adapters``), with and without checkpointing; ``"rehearsed,
    #: checkpointing from full training"`` when only without; else ``"estimated"`` from full training's
    activations_source: str = "estimated"
    #: QLoRA after PEFT's ``prepare_model_for_kbit_training`` (the non-4-bit weights in float32),
    #: rehearsed: its states and activations (``checkpointed`` None where checkpointing was not
    #: rehearsed); ``None`` when not rehearsed
    kbit: Phase | None = None

    @property
    def applied(self) -> bool:
        return self.mode == self.asked

    def train_flops(self, checkpoint: bool) -> float:
        """Training FLOPs per sample (forward, backward and any recompute)."""
        return self.flops_checkpointed if checkpoint else self.flops

    def flops_factor(self, checkpoint: bool, forward: float) -> float:
        """Training FLOPs per forward FLOP (3 for full training, 4 with checkpointing)."""
        return self.train_flops(checkpoint) / forward if forward else 0.0


def _is_output_layer(graph: Graph, node: Node) -> bool:
    succs = graph.succs.get(node.id, [])
    return bool(succs) and all(graph.by_id[s].type == "output" for s in succs)


def adaptable_linears(graph: Graph) -> list[Adapted]:
    """Every ``linear`` layer except the output layer (one whose outputs go only to output nodes),
    as PEFT's ``all-linear`` chooses them; a repeated call of a module adds rows, not parameters."""
    found: list[Adapted] = []
    for node in graph.layers:
        if node.type != "linear" or _is_output_layer(graph, node):
            continue
        fan_in = size(node.params, "inFeatures") or (node.input_shape[-1] if node.input_shape else None)
        fan_out = size(node.params, "outFeatures") or (node.output_shape[-1] if node.output_shape else None)
        if not fan_in or not fan_out:
            continue
        shape = node.input_shape or node.output_shape
        width = fan_in if node.input_shape else fan_out
        rows = max(1, numel(shape) // width) if shape else 1
        found.append(Adapted(node, fan_in, fan_out, rows, not isinstance(node.measured.get("sharedWith"), str)))
    return found


def _states(a: Analysis, blocks: Blocks, phase: PhasePeak) -> States:
    """The states of one phase of the memory model as the strategies divide them, by kind (16-bit,
    frozen and packed weights together; optimizer moments and the step's temporaries together;
    buffers and other state together). The phase's gradients are those alive at its peak (none
    before the backward), and ZeRO's the same kept in 16 bits (:data:`ZERO_GRADIENT_BYTES` of
    :data:`GRADIENT_BYTES`: a sharded engine makes each gradient shard as the backward reaches its
    layer, and the optimizer step's phase holds them all); DDP's buckets are every trainable
    parameter's gradient in every phase (fp32, as autocast keeps them): DDP allocates them when it
    wraps the model."""
    st = phase.state
    return States(
        weights=st.get("weights16", 0.0) + st.get("frozenWeights", 0.0),
        master=st.get("masterWeights", 0.0), gradients=st.get("gradients", 0.0),
        zero_gradients=st.get("gradients", 0.0) * ZERO_GRADIENT_BYTES / GRADIENT_BYTES,
        ddp_buckets=a.counts.trainable * GRADIENT_BYTES,
        optimizer=st.get("optimizerMoments", 0.0) + st.get("optimizerTemporaries", 0.0),
        buffers=st.get("buffers", 0.0) + st.get("other", 0.0), framework=st.get("framework", 0.0),
        gather=blocks.largest_layer_params * (WEIGHT16_BYTES + ZERO_GRADIENT_BYTES),
    )


def _phase(a: Analysis, blocks: Blocks, phase: PhasePeak) -> Phase:
    """One phase of the memory model: its states (:func:`_states`) and its bytes per sample."""
    return _states(a, blocks, phase), _activations(a, blocks, 0.0, phase)


def _full(a: Analysis, blocks: Blocks, asked: str, note: str | None) -> Tuning:
    """Full training: the memory model's phases, the one largest at batch 1 first; with checkpointing,
    the checkpointed step's own phases where it was rehearsed (``MemoryModel.checkpointed_phases``),
    else each phase's checkpointed bytes sized from its layers (:func:`_activations`)."""
    main = a.memory.peak(1)
    states, acts = _phase(a, blocks, main)
    others = tuple(_phase(a, blocks, p) for p in a.memory.phases if p is not main)
    if a.memory.checkpointed_phases:
        phases = tuple((_states(a, blocks, p), Activations(p.per_sample_bytes, p.per_sample_bytes))
                       for p in a.memory.checkpointed_phases)
        acts = Activations(acts.plain, phases[0][1].plain, phases)
    f = a.flops_per_sample
    return Tuning("full", asked, None, states, acts, BACKWARD_FACTOR * f,
                  (BACKWARD_FACTOR + 1) * f, a.counts.trainable, note=note, others=others)


def _activations(a: Analysis, blocks: Blocks, extra: float, phase: PhasePeak | None = None,
                 half_base: bool = False) -> Activations:
    """Bytes per sample of ``phase`` (the memory model's phase with the most, by default) plus
    ``extra``, and what the phase holds with activation checkpointing (``None`` when checkpointing
    frees nothing).

    With checkpointing, every phase holds what it did less the KV cache a transformers forward
    returns with ``use_cache`` (transformers turns it off when checkpointing: "`use_cache=True` is
    incompatible with gradient checkpointing. Setting `use_cache=False`"; what of it autograd saves
    as well goes with the block that saved it), less the blocks' insides
    (each block keeps its output, the next block's input) and less eager attention's score matrices
    (``before``: the forward, the loss and the backward down to the last block, the loss's
    transients included). A backward phase also meets the recompute of one block (``during``): it
    runs after the backward of the layers above the blocks (the loss and the output layer), whose
    transients are gone by then, so the phase holds the forward's activations outside the blocks,
    the blocks' outputs (at most what the phase held), one block's activations and score matrices
    (:func:`_scores_saving`), and that block's backward transients: the gradients of its largest
    layer output and of that layer's input, 16-bit under autocast, taken as twice the output, and
    with eager attention what one call's backward allocates beyond what it saved (its score
    matrices' gradients, measured: ``MemoryModel.eager_backward_bytes``). The phase's bytes are the larger
    of the two (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", section 3: the
    peak of the backward is the kept outputs plus one segment's activations; the two are not alive
    together with the loss's). Measured against real steps on an H200 (``bench/gpu_memory_check.py``).

    ``half_base``: the step of a LoRA or QLoRA base loaded in 16 bits, whose residual stream is
    16-bit where full training's float32 master weights keep it in float32. The tracer measures the
    step with the weights in 16 bits (``measured.training.halfWeightsActivationBytesPerSample``):
    the activations (the blocks' insides, the KV cache) scale by the measured ratio, the loss's
    float32 transients do not, and the blocks' outputs count at 2 bytes per element. Without that
    measurement, full training's activations, an overcount."""
    if phase is None:
        phase = max(a.memory.phases, key=lambda p: p.per_sample_bytes)
    ratio = a.memory.half_weights_ratio if half_base and a.memory.half_weights_ratio is not None else 1.0
    held = phase.per_sample.get("activations", 0.0) * ratio
    plain = phase.per_sample_bytes - phase.per_sample.get("activations", 0.0) + held + extra
    scale = a.work.scale
    scores = phase.per_sample.get("attentionScores", 0.0)
    freed_scores = _scores_saving(a, blocks, scores)
    if blocks.checkpoint_saving * scale + freed_scores <= 0:
        return Activations(plain, None)
    block_bytes = blocks.block_bytes * scale * ratio
    boundary = (blocks.boundary_half_bytes if ratio != 1.0 else blocks.boundary_bytes) * scale
    # the phase's activations: the KV cache the output holds (transformers returns none when
    # checkpointing), then the blocks' insides, then what lies outside the blocks
    cache = min((a.memory.kv_cache_bytes - a.memory.kv_cache_saved_bytes) * ratio, held)
    rest = held - cache
    before = plain - cache - max(0.0, min(rest, block_bytes) - boundary) - scores
    if phase.phase != "backward":
        return Activations(plain, max(before, 0.0))
    # an eager attention call's backward (its score matrices' gradients) runs in a block, so with
    # checkpointing inside the recompute, not before it
    eager_backward = a.memory.eager_backward_bytes
    before -= eager_backward
    outside = max(0.0, rest - block_bytes)
    transient = 2 * blocks.largest_output_bytes * scale
    during = (phase.per_sample.get("inputs", 0.0) + min(rest, outside + boundary) + blocks.largest_bytes * scale * ratio
              + scores - freed_scores + eager_backward + extra + transient)
    return Activations(plain, max(before, during, 0.0))


def _scores_saving(a: Analysis, blocks: Blocks, scores: float) -> float:
    """Bytes per sample of eager attention's score matrices (``scores``, all attention calls') that
    activation checkpointing frees: a checkpointed block keeps none of its own, and the block being
    recomputed holds its calls' alone. The memory model knows how many calls there are, not where
    they run: they are taken to be in the blocks, the largest block holding ``ceil(calls / blocks)``
    of them (one per block in a decoder stack; T5's decoder blocks, self- and cross-attention, two of
    18 calls in 12 blocks), and the calls of one size each."""
    calls = a.memory.attention_calls
    if scores <= 0 or calls <= 0 or blocks.layers < 2:
        return 0.0
    kept = min(calls, math.ceil(calls / blocks.layers))
    return scores * (1 - kept / calls)


def _state(a: Analysis, kind: str) -> float:
    """The largest bytes of one state kind over the memory model's phases."""
    return max(p.state.get(kind, 0.0) for p in a.memory.phases)


def _has_adapters(graph: Graph) -> bool:
    """The graph is of a model PEFT already adapted: layers named ``lora_A``/``lora_B`` (under
    ``base_model.model.``), whose frozen base and trainable adapters the traced step holds as they are."""
    return any(part in ("lora_A", "lora_B") for node in graph.layers for part in node.name.split("."))


def tuning(a: Analysis, blocks: Blocks, mode: str = "full", rank: int = DEFAULT_RANK) -> Tuning:
    """The step of ``mode`` (``full``, ``lora`` or ``qlora``) at LoRA rank ``rank``."""
    if mode == "full":
        return _full(a, blocks, "full", None)
    if _has_adapters(a.structure):
        return _full(a, blocks, mode, "the model already has LoRA adapters (lora_A, lora_B): the plan trains its "
                                      "trainable parameters as they are, as without --finetune")
    adapted = adaptable_linears(a.structure)
    if not adapted:
        name = "QLoRA" if mode == "qlora" else "LoRA"
        besides = " besides its output layer" if any(n.type == "linear" for n in a.structure.layers) else ""
        return _full(a, blocks, mode, f"{name} needs linear layers to adapt and this model has none"
                                      f"{besides}: the plan is for full training")
    c, scale = a.counts, a.work.scale
    trainable = sum(rank * (x.in_features + x.out_features) for x in adapted if x.owns_params)
    adapter_flops = sum(2 * rank * (x.in_features + x.out_features) * x.rows for x in adapted) * scale
    adapter_acts = sum(rank * x.rows for x in adapted) * ACTIVATION_BYTES * scale
    owned = [x for x in adapted if x.owns_params]
    quantized = sum(x.in_features * x.out_features for x in owned) if mode == "qlora" else 0
    base = (c.params - quantized) * FROZEN_BYTES + quantized * NF4_BYTES + c.packed * PACKED_BYTES
    largest_q = max((x.in_features * x.out_features for x in owned), default=0) if mode == "qlora" else 0
    states = States(
        weights=base + trainable * WEIGHT16_BYTES, master=trainable * MASTER_WEIGHT_BYTES,
        gradients=trainable * GRADIENT_BYTES, zero_gradients=trainable * ZERO_GRADIENT_BYTES,
        ddp_buckets=trainable * GRADIENT_BYTES, optimizer=trainable * ADAMW_BYTES,
        buffers=_state(a, "buffers") + _state(a, "other"),
        framework=_state(a, "framework"),
        gather=blocks.largest_layer_params * FROZEN_BYTES, extra=largest_q * WEIGHT16_BYTES,
    )
    f = a.flops_per_sample
    acts = _activations(a, blocks, adapter_acts, half_base=True)
    rehearsed = a.memory.adapter_bytes.get(mode)
    checkpointed = a.memory.adapter_checkpointed_bytes.get(mode)
    source = "estimated"
    if rehearsed is not None:  # the step itself, and checkpointed too where it was rehearsed so
        source = "rehearsed" if checkpointed is not None else "rehearsed, checkpointing from full training"
        if checkpointed is None and acts.checkpointed is not None:
            checkpointed = min(acts.checkpointed, rehearsed)
        acts = Activations(rehearsed, checkpointed)
    kbit = None
    kbit_bytes = a.memory.adapter_bytes.get("qloraKbit") if mode == "qlora" else None
    if kbit_bytes is not None:  # every parameter left in 16 bits made float32
        kbit = (replace(states, weights=states.weights + (c.params - quantized) * (MASTER_WEIGHT_BYTES - FROZEN_BYTES)),
                Activations(kbit_bytes, a.memory.adapter_checkpointed_bytes.get("qloraKbit")))
    return Tuning(
        mode, mode, rank, states, acts,
        FROZEN_BACKWARD_FACTOR * f + BACKWARD_FACTOR * adapter_flops,
        (FROZEN_BACKWARD_FACTOR + 1) * f + (BACKWARD_FACTOR + 1) * adapter_flops,
        trainable, adapted, quantized, base,
        activations_source=source, kbit=kbit,
    )


def activations_label(memory_source: str, step: Tuning, checkpoint: bool) -> str | None:
    """``plan.finetune.activations``: where a LoRA/QLoRA step's activations come from on a setup
    that checkpoints or not: ``rehearsed`` (the step itself, checkpointed as the setup is),
    ``rehearsed, checkpointing from full training`` (the setup checkpoints, which the rehearsal
    could not), ``full training`` (scaled from full training's rehearsed step) or ``layer
    outputs`` (no step was rehearsed: ``memory_source`` is not ``measured``); None for full training."""
    if step.mode == "full":
        return None
    if memory_source != "measured":
        return "layer outputs"
    if not step.activations_source.startswith("rehearsed"):
        return "full training"
    return step.activations_source if checkpoint else "rehearsed"
