"""Serving: the smallest setup that holds the weights, the KV cache and one decode step.

Per GPU, on N GPUs (tensor parallelism splits every matmul's weights and the attention heads, so
the KV cache, across the N: Shoeybi et al. 2019, "Megatron-LM", section 3)::

    peak = (weights + KV cache) / N + decode activations + framework allowance

(with pipeline stages, the fullest stage's part instead of 1/N: :func:`share`)

* weights: bf16, 2 bytes per parameter; int8, 1 byte per weight of every linear layer except the
  output layer plus one fp32 scale per output row (LLM.int8's vector-wise quantisation, Dettmers
  et al. 2022, section 3.2; bitsandbytes ``Linear8bitLt``); int4, NF4 at 4.127 bits
  (:data:`~neurarch_trace.planner.finetune.NF4_BITS`); what is not quantised stays in 16 bits.
* KV cache, in 16 bits whatever the weights (vLLM's default ``kv_cache_dtype="auto"``)::

      2 (key and value) x layers x kv_heads x head_dim x context x batch x 2 bytes

  as the PagedAttention paper counts it (Kwon et al. 2023, section 3: "the KV cache of a single
  token demands 800 KB of space, calculated as 2 (key and value vectors) x 5120 (hidden state
  size) x 40 (number of layers) x 2 (bytes per FP16)" for OPT-13B).
* decode activations: per sequence, one token's largest layer (its input and output alive
  together) in 16 bits, plus the token's logits in fp32 (sampling upcasts them).

How the graph gives layers, key/value heads and head dimension: each attention block's key and
value projections are linear layers named ``k_proj``/``v_proj`` (LLaMA, Mistral, Qwen, OPT, ViT),
``key``/``value`` (BERT), ``k``/``v`` (T5); their ``outFeatures`` is ``kv_heads x head_dim`` each
(an attention layer typed as such, ``nn.MultiheadAttention``, gives its width and head counts).
A fused projection (``c_attn`` in GPT-2, ``query_key_value``, ``qkv_proj``, ``Wqkv``) holds the
queries too: its ``outFeatures`` minus the queries' width (the ``inFeatures`` of the block's output
projection, else the model width) is the keys' and values'. ``layers`` is how many blocks have
them. The head dimension is the last dimension of the rotary embedding's output (``rope``, one
angle per head dimension) when the model has one; without it the KV cache is still exact (it
needs only ``kv_heads x head_dim``) and the card gives that product alone. Attention under an
``encoder`` scope is not cached (an encoder runs once, it does not decode); a model with no cached
attention (an encoder, a CNN, an MLP) is served one forward at a time, and its step is one
forward's largest layer at the context (token models) or per sample; for a token model the plan
notes that no key/value projection was found, since its KV cache, if it has one, is then missing.

The setup: the fewest GPUs (1 to 8, 16, 24, ... 64; powers of two up to 8, as tensor parallelism
needs the head count divisible by N: vLLM checks that "Total number of attention heads must be
divisible by tensor parallel size"; past 8, nodes of 8 in pipeline) that hold batch 1 at the
context with x 1.15 headroom, on the cheapest card per hour among those, then the larger card;
then the largest power-of-two batch that setup holds. Prefill (the prompt's forward) is not
sized: chunked prefill bounds it. How the N split: tensor parallelism of the largest degree up to
8 that the head counts allow, pipeline stages for the rest, at most one per layer
(:meth:`KvLayout.split`; Qwen2-7B's 28 query and 4 key/value heads on 8 GPUs: 4 x 2); a count
the model cannot use is skipped. The memory per GPU is the fullest GPU's: a pipeline stage holds
whole layers (3 stages over 28 layers hold 10 on one, :func:`share`); the embedding and output
layer, on the end stages, are spread with the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from neurarch_trace.contract import Graph, Node, numel
from neurarch_trace.planner.analysis import Analysis
from neurarch_trace.planner.estimate import size
from neurarch_trace.planner.finetune import NF4_BYTES, adaptable_linears
from neurarch_trace.planner.fit import MAX_BATCH
from neurarch_trace.planner.gpus import Gpu, GpuTable
from neurarch_trace.planner.memory import ACTIVATION_BYTES, FRAMEWORK_ALLOWANCE_BYTES, PACKED_BYTES, WEIGHT16_BYTES
from neurarch_trace.planner.workload import position_table

__all__ = ["KV_BYTES", "PRECISIONS", "SERVE_GPU_COUNTS", "KvLayout", "Serve", "kv_layout", "serve",
           "serve_all", "default_context"]

#: Weight formats a plan sizes serving in, most precise first.
PRECISIONS = ("bf16", "int8", "int4")
#: KV cache bytes per element: 16 bits (vLLM's ``kv_cache_dtype="auto"`` = the model's dtype).
KV_BYTES = 2
#: LLM.int8: one fp32 absmax scale per output row (bitsandbytes ``Linear8bitLt``'s ``SCB``).
INT8_ROW_SCALE_BYTES = 4
#: The logits of the token being decoded, upcast to fp32 for sampling.
LOGIT_BYTES = 4
SERVE_GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
#: GPUs per node, the largest tensor-parallel degree (NVLink within one 8-GPU node: DGX H100).
TENSOR_PARALLEL_MAX = 8

_Q = frozenset({"q_proj", "query", "q", "wq", "q_lin", "query_proj"})
_K = frozenset({"k_proj", "key", "k", "wk", "k_lin", "key_proj"})
_V = frozenset({"v_proj", "value", "v", "wv", "v_lin", "value_proj"})
_FUSED = frozenset({"c_attn", "query_key_value", "qkv", "qkv_proj", "wqkv", "in_proj"})
_OUT = frozenset({"o_proj", "c_proj", "out_proj", "o", "wo", "dense", "out_lin"})


@dataclass
class KvLayout:
    """Key/value projections found: ``layers`` cached blocks, ``kv_width`` (the sum over them of
    the keys' and values' widths, = 2 x kv_heads x head_dim x layers when all blocks agree),
    ``head_dim``, ``kv_heads`` and ``heads`` (the queries') when the rotary embedding gives the
    head dimension."""

    layers: int = 0
    kv_width: int = 0
    head_dim: int | None = None
    kv_heads: int | None = None
    heads: int | None = None

    def bytes_per_token(self) -> int:
        """KV cache bytes of one token of one sequence."""
        return self.kv_width * KV_BYTES

    def split(self, gpus: int) -> tuple[int, int] | None:
        """``(tensor_parallel, pipeline_stages)`` on ``gpus`` GPUs, or ``None`` when the model cannot
        use that many. The tensor-parallel degree is the largest divisor of ``gpus`` up to 8 (one
        NVLink node; past one node, a divisor of 8, so no group crosses nodes) that divides the
        query heads and divides the key/value heads or is divided by them (they are then
        replicated), as vLLM checks ("Total number of attention heads must be divisible by tensor
        parallel size"); the rest are pipeline stages, each needing at least one of the cached
        ``layers`` when the graph has them. Without head counts in the graph any degree is taken to
        divide them. Weights and KV cache split over all ``gpus`` either way (pipeline stages hold
        whole layers)."""
        for degree in range(min(gpus, TENSOR_PARALLEL_MAX), 0, -1):
            if gpus % degree or (gpus > TENSOR_PARALLEL_MAX and TENSOR_PARALLEL_MAX % degree):
                continue
            if self.heads and self.heads % degree:
                continue
            if self.kv_heads and self.kv_heads % degree and degree % self.kv_heads:
                continue
            stages = gpus // degree
            return (degree, stages) if not self.layers or stages <= self.layers else None
        return None


def _leaf(node: Node) -> str:
    return node.name.rsplit(".", 1)[-1].split("#")[0].lower()


def _features(node: Node, key: str, fallback: int | None) -> int | None:
    return size(node.params, key) or fallback


def _encoder(scope: str) -> bool:
    return any("encoder" in part.lower() for part in scope.split("."))


def _typed_widths(graph: Graph) -> list[int]:
    """Keys' and values' widths of attention layers typed as such (``nn.MultiheadAttention`` is
    ``multiHeadAttention``: E wide each; ``groupedQueryAttention``: kv_heads x E / heads each)."""
    widths = []
    for node in graph.layers:
        if node.type not in ("multiHeadAttention", "groupedQueryAttention") or _encoder(node.scope or node.name):
            continue
        width = size(node.params, "embedDim") or size(node.params, "hiddenDim") or (
            node.input_shape[-1] if node.input_shape else None)
        heads, kv_heads = size(node.params, "numHeads"), size(node.params, "numKVHeads")
        if width and node.type == "groupedQueryAttention" and heads and kv_heads:
            width = kv_heads * (width // heads)
        if width:
            widths.append(2 * width)
    return widths


def kv_layout(graph: Graph) -> KvLayout:
    """The key/value projections of ``graph``'s decoder attention (empty when none)."""
    scopes: dict[str, list[Node]] = {}
    for node in graph.layers:
        if node.type == "linear" and node.scope and not _encoder(node.scope):
            scopes.setdefault(node.scope, []).append(node)
    layout = KvLayout()
    widths: list[int] = []
    queries_widths: list[int] = []
    for nodes in scopes.values():
        by_leaf = {_leaf(n): n for n in nodes}
        out = lambda n: _features(n, "outFeatures", n.output_shape[-1] if n.output_shape else None)  # noqa: E731
        k = next((by_leaf[name] for name in _K if name in by_leaf), None)
        v = next((by_leaf[name] for name in _V if name in by_leaf), None)
        fused = next((by_leaf[name] for name in _FUSED if name in by_leaf), None)
        q = next((by_leaf[name] for name in _Q if name in by_leaf), None)
        width = queries = None
        if k is not None and v is not None and out(k) and out(v):
            width = out(k) + out(v)
            queries = out(q) if q is not None else None
        elif fused is not None and out(fused):
            proj = next((by_leaf[name] for name in _OUT if name in by_leaf), None)
            queries = _features(proj, "inFeatures", None) if proj is not None else None
            queries = queries or _features(fused, "inFeatures", fused.input_shape[-1] if fused.input_shape else None)
            width = out(fused) - queries if queries and out(fused) > queries else None
        if width:
            widths.append(width)
            if queries:
                queries_widths.append(queries)
    widths += _typed_widths(graph)
    layout.layers, layout.kv_width = len(widths), sum(widths)
    rope = next((n for n in graph.layers if n.type == "rope" and n.output_shape), None)
    if rope is not None and widths and len(set(widths)) == 1:
        head_dim = rope.output_shape[-1]
        if head_dim and widths[0] % (2 * head_dim) == 0:
            layout.head_dim, layout.kv_heads = head_dim, widths[0] // (2 * head_dim)
            if len(queries_widths) == len(widths) and len(set(queries_widths)) == 1 and \
                    queries_widths[0] % head_dim == 0:
                layout.heads = queries_widths[0] // head_dim
    return layout


def default_context(a: Analysis) -> int | None:
    """The model's own maximum when the graph says it (a learned position table: an embedding
    named ``wpe`` or ``*position*``, its ``vocabSize``), else the tokens the plan sizes training
    for (``--seq-len``, by default the traced tokens); ``None`` for a model that does not take
    tokens."""
    if a.work.kind != "tokens":
        return None
    table = position_table(a.structure)
    return table[1] if table is not None else (a.work.seq_len or a.work.traced_tokens)


def weight_bytes(a: Analysis, precision: str) -> float:
    """Weights in ``precision`` (``bf16``, ``int8`` or ``int4``), plus buffers, in bytes."""
    c = a.counts
    base = c.params * WEIGHT16_BYTES + c.packed * PACKED_BYTES + c.buffer_bytes
    if precision == "bf16":
        return base
    owned = [x for x in adaptable_linears(a.structure) if x.owns_params]
    weights = sum(x.in_features * x.out_features for x in owned)
    if precision == "int8":
        return base - weights * WEIGHT16_BYTES + weights + sum(x.out_features for x in owned) * INT8_ROW_SCALE_BYTES
    return base - weights * WEIGHT16_BYTES + weights * NF4_BYTES


def step_bytes(a: Analysis, cached: bool, context: int | None) -> float:
    """Activations of one step of one sequence, in bytes: a decode step (one token) when
    ``cached``; else one forward, at ``context`` tokens for a token model, per sample otherwise."""
    largest = 0
    for node in a.structure.layers:
        elements = (numel(node.input_shape) if node.input_shape else 0) + (
            numel(node.output_shape) if node.output_shape else 0)
        largest = max(largest, elements)
    traced = a.work.traced_tokens if a.work.kind == "tokens" and a.work.traced_tokens else None
    if traced is None:
        return largest * ACTIVATION_BYTES
    if not cached:
        return largest * ACTIVATION_BYTES * (context or traced) / traced
    outputs = a.graph.outputs
    logits = numel(outputs[0].input_shape) / traced if outputs and outputs[0].input_shape else 0
    return largest / traced * ACTIVATION_BYTES + logits * LOGIT_BYTES


@dataclass
class Serve:
    """A serving setup: ``gpu`` x ``gpus`` (``gpu`` is ``None`` when nothing holds batch 1 on up to
    64 GPUs), ``precision``, ``context``, ``batch`` (the largest power of two it holds), and at that
    batch the per-GPU ``peak_bytes`` with its parts (whole-model ``weights_bytes`` and
    ``kv_bytes``, per-sequence ``step_bytes``)."""

    precision: str
    context: int | None
    gpu: Gpu | None
    gpus: int
    batch: int
    peak_bytes: float
    need_bytes: float
    weights_bytes: float
    kv_bytes: float
    step_bytes: float
    layout: KvLayout = field(default_factory=KvLayout)
    #: The GPUs asked for when more than the model can split over (``gpus`` is then the most it can).
    asked: int | None = None

    @property
    def fits(self) -> bool:
        return self.gpu is not None

    @property
    def parallel(self) -> tuple[int, int] | None:
        """``(tensor_parallel, pipeline_stages)`` of the ``gpus`` (:meth:`KvLayout.split`); ``None``
        when the model has too few layers or heads to use them all."""
        return self.layout.split(self.gpus)

    @property
    def part(self) -> float:
        """The part of the weights and KV cache on the fullest GPU (:func:`share`)."""
        return share(self.layout, self.gpus)


def share(layout: KvLayout, gpus: int) -> float:
    """The part of the weights and KV cache on the fullest of ``gpus`` GPUs: ``1 / gpus`` split
    evenly, but a pipeline stage holds whole layers, so over ``p`` stages of ``L`` cached layers the
    fullest holds ``ceil(L / p)`` of them, split ``t`` ways: ``ceil(L / p) / (L t)`` (28 layers on 3
    stages: 10/28 = 0.357, not 1/3). Layers the graph does not give: even."""
    split = layout.split(gpus)
    if split is None or not layout.layers:
        return 1 / gpus
    tensor, stages = split
    return -(-layout.layers // stages) / (layout.layers * tensor)


def _peak(weights: float, kv_per_seq: float, step: float, part: float, batch: int) -> float:
    return (weights + kv_per_seq * batch) * part + step * batch + FRAMEWORK_ALLOWANCE_BYTES


def serve(a: Analysis, cards: Sequence[Gpu], table: GpuTable, precision: str = "bf16",
          context: int | None = None, batch: int = 1, gpus: int | None = None) -> Serve:
    """The serving setup of ``a`` in ``precision`` at ``context`` tokens (default
    :func:`default_context`) holding at least ``batch`` sequences, over ``cards`` (cheapest per
    hour first); ``gpus`` fixes the number of GPUs, or, when the model cannot split over that many
    (:meth:`KvLayout.split`), the most below it that it can (``asked`` keeps the number asked)."""
    layout = kv_layout(a.structure) if a.work.kind == "tokens" else KvLayout()
    asked = None
    if gpus is not None and layout.split(gpus) is None:
        asked, gpus = gpus, next(n for n in range(gpus, 0, -1) if layout.split(n))
    context = context if context is not None else default_context(a)
    cached = layout.layers > 0
    kv_per_seq = layout.bytes_per_token() * (context or 0) if cached else 0.0
    weights = weight_bytes(a, precision)
    step = step_bytes(a, cached, context)
    head = table.headroom
    for n in ((gpus,) if gpus is not None else [n for n in SERVE_GPU_COUNTS if layout.split(n)]):
        part = share(layout, n)
        for gpu in cards:
            def holds(b: int, part: float = part, gpu: Gpu = gpu) -> bool:
                return _peak(weights, kv_per_seq, step, part, b) * head <= gpu.memory_bytes
            if holds(batch):
                best = batch
                while best * 2 <= MAX_BATCH and holds(best * 2):
                    best *= 2
                peak = _peak(weights, kv_per_seq, step, part, best)
                return Serve(precision, context, gpu, n, best, peak, peak * head, weights, kv_per_seq * best,
                             step * best, layout, asked)
    n = gpus or 1
    peak = _peak(weights, kv_per_seq, step, share(layout, n), batch)
    return Serve(precision, context, None, n, batch, peak, peak * head, weights, kv_per_seq * batch,
                 step * batch, layout, asked)


def serve_all(a: Analysis, cards: Sequence[Gpu], table: GpuTable, context: int | None = None,
              gpus: int | None = None) -> list[Serve]:
    """:func:`serve` at batch 1 in each of :data:`PRECISIONS`."""
    return [serve(a, cards, table, p, context, 1, gpus) for p in PRECISIONS]
