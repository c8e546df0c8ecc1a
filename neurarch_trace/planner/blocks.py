"""Repeated blocks of a graph (the children of a ``ModuleList``), and what activation checkpointing
keeps of them.

A block is found from names and scopes: the first all-digit segment of a layer's module path marks
the block it belongs to, ``model.layers.3.mlp.up_proj`` -> block ``model.layers.3`` of the list
``model.layers`` (``transformer.h.N`` in GPT-2, ``encoder.layer.N`` in BERT, ``encoder.block.N`` and
``decoder.block.N`` in T5, ``layer1.N`` in a ResNet). A list needs two members or more.

Activation checkpointing (``torch.utils.checkpoint`` around each block, as transformers'
``gradient_checkpointing_enable()`` does per decoder layer) keeps, of each block, only the tensors
that leave it, its output, which is the next block's input; in the backward each block's forward
runs again, so one block's activations are alive at a time (Chen et al. 2016, "Training Deep Nets
with Sublinear Memory Cost", section 3; Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2, "full activation recomputation ... only
the input to each transformer layer is stored"). Per sample, each phase keeps::

    everything outside blocks (as without)
    + the outputs of block layers that feed a layer outside their block
    + in the backward, while a block is recomputed: the largest block's activations and the
      gradients of its largest layer output (``largest_output_bytes``)

and the backward's peak is the larger of that and the phase before any block is recomputed, with
the loss's transients (:func:`neurarch_trace.planner.finetune._activations` combines them).

A block's bytes are what the rehearsed training step saw it save for backward
(``measured.training.scopeSavedBytes``, functional code inside the block included) when the graph
has it, else the sum of its layers' ``measured.savedBytes`` or output elements at the memory
model's bytes per element. What leaves a block is its boundary layers' outputs
(``measured.outputBytes``: in their dtype as traced, float32 for a float model, which autocast
keeps for transformers' residual stream and halves for a convolutional net's: an overcount there;
a model stored in 16 bits counts them as the same model stored in float32, as its rehearsed step
held float32 master weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from neurarch_trace.contract import Graph, Node, numel, parse_shape
from neurarch_trace.planner.counts import Counts, measured_int
from neurarch_trace.planner.memory import ACTIVATION_BYTES, DTYPE_BYTES, INPUT_FLOAT_BYTES

__all__ = ["Block", "Blocks", "find_blocks", "layer_bytes", "output_bytes"]

_FLOAT = frozenset({"float64", "double", "float32", "float", "float16", "half", "bfloat16"})


@dataclass(frozen=True)
class Block:
    """One repeated block: ``key`` (``model.layers.3``), ``group`` (``model.layers``), its layer
    ids, learnable parameters, and ``saved_bytes`` (its activations per sample, at the traced
    input size)."""

    key: str
    group: str
    node_ids: tuple[str, ...]
    params: int
    saved_bytes: float


@dataclass
class Blocks:
    """The blocks of a graph with what checkpointing changes, per sample at the traced size:
    ``block_bytes`` (all blocks' activations), ``boundary_bytes`` (what leaves the blocks: kept under
    checkpointing) and ``largest_bytes`` (one block recomputed). ``largest_layer_params``: the
    most parameters one layer owns (what ZeRO-3 gathers at once)."""

    blocks: list[Block] = field(default_factory=list)
    block_bytes: float = 0.0
    boundary_bytes: float = 0.0
    largest_bytes: float = 0.0
    largest_layer_params: int = 0
    #: ``boundary_bytes`` with every floating output at 2 bytes: a model loaded in 16 bits (a LoRA
    #: base) keeps its residual stream so
    boundary_half_bytes: float = 0.0
    #: the largest output of one layer of the largest block, per sample, at autocast's 2 bytes per
    #: element: the gradients of it and of its input are what the block's backward holds besides its
    #: activations
    largest_output_bytes: float = 0.0

    @property
    def checkpoint_saving(self) -> float:
        """Bytes per sample that checkpointing frees (0 when it frees nothing)."""
        return max(0.0, self.block_bytes - self.boundary_bytes - self.largest_bytes)

    @property
    def layers(self) -> int:
        """How many blocks there are."""
        return len(self.blocks)


def _path_key(path: str | None) -> tuple[str, str] | None:
    if not path:
        return None
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1]), ".".join(parts[:i])
    return None


def block_of(node: Node) -> tuple[str, str] | None:
    """``(block key, list)`` of a layer from its name (its module path), else its scope."""
    return _path_key(node.name) or _path_key(node.scope)


def _dtype_name(raw: object) -> str | None:
    """``"float16"`` of ``"torch.float16"`` or ``"Float16"``; None for what is not a string."""
    return raw.rsplit(".", 1)[-1].lower() if isinstance(raw, str) else None


def layer_bytes(node: Node, batch: int) -> float:
    """What a layer keeps for backward per sample, in bytes: ``measured.savedBytes`` / batch when
    recorded, else its output elements (``measured.outputShapes`` or ``outputShape``) at 2 bytes
    for floats (autocast) and their own size for integers; 0 without shapes."""
    saved = measured_int(node.measured, "savedBytes")
    if saved is not None:
        return saved / max(1, batch)
    return autocast_output_bytes(node)


def autocast_output_bytes(node: Node) -> float:
    """A layer's outputs per sample at 2 bytes per floating element (autocast, or a model loaded in
    16 bits) and their own size for integers (``measured.outputShapes`` or ``outputShape``); 0
    without shapes."""
    shapes = node.measured.get("outputShapes")
    elements: int | None = None
    if isinstance(shapes, list) and shapes:
        parsed = [parse_shape(s)[0] for s in shapes]
        if all(p is not None for p in parsed):
            elements = sum(numel(p) for p in parsed if p is not None)
    if elements is None and node.output_shape is not None:
        elements = numel(node.output_shape)
    if elements is None:
        return 0.0
    dtype = _dtype_name(node.measured.get("outputDtype") or node.measured.get("dtype"))
    if node.type == "input":
        return elements * DTYPE_BYTES.get(dtype or "", INPUT_FLOAT_BYTES)
    if dtype in DTYPE_BYTES and dtype not in _FLOAT:
        return elements * DTYPE_BYTES[dtype]
    return elements * ACTIVATION_BYTES


#: 16-bit floating dtypes: a model stored in one trains with float32 master weights
#: (``measured.training.upcastParams``), which make its residual stream float32.
_HALF = frozenset({"float16", "half", "bfloat16"})


def output_bytes(node: Node, batch: int, upcast: bool = False) -> float:
    """What a layer's outputs take per sample, in bytes: ``measured.outputBytes`` / batch (their
    dtype as traced) when recorded, else :func:`layer_bytes`. ``upcast``: the model stores its
    trainable weights in 16 bits and the rehearsed step held them as float32 master weights, so a
    16-bit output counts at float32's 4 bytes, as in the same model stored in float32 (whose plan
    this one's then equals)."""
    recorded = measured_int(node.measured, "outputBytes")
    found = recorded / max(1, batch) if recorded is not None else layer_bytes(node, batch)
    if upcast and _dtype_name(node.measured.get("outputDtype")) in _HALF:
        return 2 * found
    return found


def _scope_saved(graph: Graph) -> dict[str, float]:
    """``measured.training.scopeSavedBytes``: the bytes each container's first call saved for
    backward (functional code inside it included), at the traced batch, by module path."""
    training = graph.measured.get("training")
    raw = training.get("scopeSavedBytes") if isinstance(training, dict) else None
    if not isinstance(raw, dict):
        return {}
    found: dict[str, float] = {}
    for key, calls in raw.items():
        first = calls[0] if isinstance(calls, list) and calls else None
        if isinstance(key, str) and measured_int({"n": first}, "n") is not None:
            found[key] = float(first)
    return found


def find_blocks(graph: Graph, counts: Counts) -> Blocks:
    """The repeated blocks of ``graph`` (an empty :class:`Blocks` when it has none)."""
    params = {lc.node.id: lc.params for lc in counts.layers}
    largest_layer = max(params.values(), default=0)
    members: dict[str, list[Node]] = {}
    groups: dict[str, dict[str, None]] = {}
    where: dict[str, str] = {}
    for node in graph.layers:
        key = block_of(node)
        if key is None:
            continue
        members.setdefault(key[0], []).append(node)
        groups.setdefault(key[1], {})[key[0]] = None
        where[node.id] = key[0]
    repeated = {k for keys in groups.values() if len(keys) >= 2 for k in keys}
    where = {node_id: key for node_id, key in where.items() if key in repeated}
    if not repeated:
        return Blocks(largest_layer_params=largest_layer)
    batch = counts.batch_size
    scopes = _scope_saved(graph)
    blocks = []
    for group, keys in groups.items():
        for key in keys:
            if key in repeated:
                nodes = members[key]
                saved = scopes.get(key)
                blocks.append(Block(key, group, tuple(n.id for n in nodes), sum(params.get(n.id, 0) for n in nodes),
                                    saved / max(1, batch) if saved is not None
                                    else sum(layer_bytes(n, batch) for n in nodes)))
    training = graph.measured.get("training")
    upcast = isinstance(training, dict) and (measured_int(training, "upcastParams") or 0) > 0
    boundary = boundary_half = 0.0
    for node_id, key in where.items():
        if any(where.get(s) != key for s in graph.succs.get(node_id, [])):
            node = graph.by_id[node_id]
            boundary += output_bytes(node, batch, upcast)
            boundary_half += autocast_output_bytes(node)
    largest = max(blocks, key=lambda b: b.saved_bytes)
    return Blocks(
        blocks=blocks,
        block_bytes=sum(b.saved_bytes for b in blocks),
        boundary_bytes=boundary,
        boundary_half_bytes=boundary_half,
        largest_bytes=largest.saved_bytes,
        largest_layer_params=largest_layer,
        largest_output_bytes=max((numel(graph.by_id[i].output_shape) * ACTIVATION_BYTES
                                  for i in largest.node_ids if graph.by_id[i].output_shape), default=0),
    )
