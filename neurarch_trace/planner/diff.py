"""The diff of a design against its base: numbers compared like for like, layers matched by name.

Both graphs are sized on the same terms, the new design's card's: the same mode (full training,
LoRA or QLoRA, as ``--finetune`` asks), the same setup (the card's strategy on its number of
GPUs, with or without activation checkpointing), the same batch per GPU (the card's, batch 1 when
nothing fits), and for cost the same card, cluster and unit of training; a token model is read at
the card's tokens per sample. So a delta is what the change itself costs on the setup the card
shows, not a different card, mode, length or batch being chosen. Where the card fits nothing, the
peaks compare on the cluster it says is needed, at batch 1, and nothing is priced. A base that LoRA
cannot adapt is sized for full training (``finetune`` names both modes); ``sources`` says whether
each peak was measured or estimated, and ``baseBlockers`` counts the base's blockers.

That holds only for two models of one kind (:mod:`.workload`: images, token sequences, other).
A ResNet against a GPT-2 has no common sample: FLOPs per sample, the peak at a batch and the cost
of an epoch of ImageNet-1k mean different things for each, so they are not compared
(``comparable`` is false, ``kinds`` names both, and those deltas are null); parameters and layers
still are.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from neurarch_trace.contract import Graph, Node
from neurarch_trace.planner.analysis import Analysis
from neurarch_trace.planner.blocks import find_blocks
from neurarch_trace.planner.cost import Unit, cluster_cost
from neurarch_trace.planner.finetune import activations_label, tuning
from neurarch_trace.planner.sizing import Sizing
from neurarch_trace.planner.steptime import shared_counts, step_operators
from neurarch_trace.planner.strategy import footprint

__all__ = ["diff", "layer_changes"]


def _signature(node: Node) -> Dict[str, Any]:
    return {
        "type": node.type,
        "params": dict(node.params),
        "inputShape": list(node.input_shape) if node.input_shape else None,
        "outputShape": list(node.output_shape) if node.output_shape else None,
    }


#: The component types that are not layers.
_ENDPOINTS = ("input", "output")


def _layers_by_name(graph: Graph) -> Dict[str, Node]:
    """The first node of each name, input and output nodes left out."""
    by_name: Dict[str, Node] = {}
    for node in graph.nodes:
        if node.type not in _ENDPOINTS:
            by_name.setdefault(node.name, node)
    return by_name


def _prefixes(names: List[str]) -> List[str]:
    """The first scope of each dotted name, with its dot (``model.`` of ``model.layers.0.mlp``)."""
    return sorted({name.split(".", 1)[0] + "." for name in names if "." in name})


def _matches(new_names: List[str], base_names: Dict[str, Node], new_prefix: str, base_prefix: str) -> int:
    """How many new layers name a base layer once ``new_prefix`` is taken off the new names and
    ``base_prefix`` off the base's."""
    base = {name[len(base_prefix):] for name in base_names if name.startswith(base_prefix)}
    return sum(1 for name in new_names if name.startswith(new_prefix) and name[len(new_prefix):] in base)


def _name_alignment(new_by_name: Dict[str, Node], base_by_name: Dict[str, Node]) -> Tuple[str, str]:
    """``(new prefix, base prefix)``: the outer scope to take off the layer names of each graph
    (:func:`_layers_by_name`) so that they match, or ``("", "")``. The same model loaded as a bare
    backbone and with a task head names its layers ``layers.0.mlp`` and ``model.layers.0.mlp``
    (transformers' ``AutoModel`` and ``AutoModelForCausalLM``; ``bert.`` for BERT's heads): the
    outer scope that matches the most layers is taken, and only when it matches more than the
    names as they are."""
    new_names = list(new_by_name)
    best, best_count = ("", ""), _matches(new_names, base_by_name, "", "")
    candidates = [(p, "") for p in _prefixes(new_names)] + [("", p) for p in _prefixes(list(base_by_name))]
    for new_prefix, base_prefix in candidates:
        count = _matches(new_names, base_by_name, new_prefix, base_prefix)
        if count > best_count:
            best, best_count = (new_prefix, base_prefix), count
    return best


def layer_changes(new: Graph, base: Graph) -> Dict[str, Any]:
    """Layers added, removed and changed (type, params or shapes), matched by name: every
    component but the ``input`` and ``output`` nodes, as the card counts layers (a new input size
    shows in the other deltas, not as two changed layers). Names are matched after
    :func:`_name_alignment`'s outer scopes are taken off, which ``prefixes`` then gives (absent when
    none was); each list keeps the names as its own graph has them."""
    new_by_name, base_by_name = _layers_by_name(new), _layers_by_name(base)
    new_prefix, base_prefix = _name_alignment(new_by_name, base_by_name)
    base_key = {name[len(base_prefix):]: name for name in base_by_name if name.startswith(base_prefix)}
    new_key = {name[len(new_prefix):]: name for name in new_by_name if name.startswith(new_prefix)}
    paired = {name: base_key[key] for key, name in new_key.items() if key in base_key}
    added = [name for name in new_by_name if name not in paired]
    matched = set(paired.values())
    removed = [name for name in base_by_name if name not in matched]
    changed = []
    for name, node in new_by_name.items():
        if name not in paired:
            continue
        before, after = _signature(base_by_name[paired[name]]), _signature(node)
        fields = [key for key in after if after[key] != before[key]]
        if fields:
            changed.append({"name": name, "fields": fields})
    out: Dict[str, Any] = {"added": added, "removed": removed, "changed": changed}
    if new_prefix or base_prefix:
        out["prefixes"] = {"new": new_prefix, "base": base_prefix}
    if (added or removed) and _same_at_full_depth(new, base):
        out["depthOnly"] = True
    return out


def _same_at_full_depth(new: Graph, base: Graph) -> bool:
    """Both graphs trace the same model, cut at different ``--depth``: the same layer count at
    full depth (``measured.layers``), parameters and FLOPs, though not the same nodes."""
    keys = ("layers", "params", "flops")
    a = tuple(new.measured.get(k) for k in keys)
    b = tuple(base.measured.get(k) for k in keys)
    return all(isinstance(x, int) and not isinstance(x, bool) for x in a) and a == b


def _delta(base: float, new: float) -> Dict[str, float]:
    return {"base": base, "new": new, "delta": new - base}


def diff(new: Analysis, base: Analysis, sized: Sizing, unit: Unit) -> Dict[str, Any]:
    """The ``plan.diff`` object (numbers unrounded; GB are 10^9 bytes per GPU, USD per ``unit``),
    both models sized as ``sized`` sized the new one (see the module docstring)."""
    comparable = new.work.kind == base.work.kind
    out: Dict[str, Any] = {
        "baseName": base.graph.name,
        "comparable": comparable,
        "kinds": {"new": new.work.kind, "base": base.work.kind},
        "params": _delta(base.counts.params, new.counts.params),
        "flops": None,
        "peakGb": None,
        "costUsd": None,
        "layers": layer_changes(new.graph, base.graph),
        "baseBlockers": len(base.blockers),
    }
    if not comparable:
        return out
    step = tuning(base, find_blocks(base.structure, base.structure_counts), sized.tuning.mode, sized.options.rank)
    out["sources"] = {"new": new.memory.source, "base": base.memory.source}
    out["finetune"] = {"new": sized.tuning.mode, "base": step.mode}
    out["flops"] = _delta(base.flops_per_sample, new.flops_per_sample)
    choice = sized.choice
    if choice is not None:
        setup, batch, gpu = choice.setup, choice.batch, choice.gpu
    elif sized.needs is not None and sized.needs[0] is not None:  # the cluster the card says it needs
        _, setup, gpu = sized.needs
        batch = 1
    else:  # nothing holds one sample: the card sizes nothing to compare with
        return out
    checkpoint = setup.checkpoint and step.acts.checkpointed is not None
    if sized.tuning.mode != "full":  # the two LoRA/QLoRA steps' activations may come from different places
        out["activations"] = {"new": activations_label(new.memory.source, sized.tuning, setup.checkpoint),
                              "base": activations_label(base.memory.source, step, setup.checkpoint)}
    base_setup = footprint(step.states, step.acts, setup.strategy, setup.gpus, checkpoint, step.others)
    out["peakGb"] = {**_delta(base_setup.peak_bytes(batch) / 1e9, setup.peak_bytes(batch) / 1e9),
                     "batch": batch, "gpus": setup.gpus, "strategy": setup.label, "finetune": sized.tuning.mode}
    if choice is None:  # the card prices no setup that does not fit
        return out
    base_train = step.flops_checkpointed if checkpoint else step.flops
    own_ops = sized.cost.step.operators if sized.cost is not None and sized.cost.step is not None else None
    new_ops, base_ops, shared = shared_counts(
        step_operators(new.graph.measured.get("training")).chain(sized.tuning.mode, setup.checkpoint),
        step_operators(base.graph.measured.get("training")).chain(step.mode, checkpoint))
    if shared is None and own_ops is not None:  # like for like: a graph without counts is timed by compute alone
        out["costTiming"] = "compute"
    elif shared is not None and new_ops != own_ops:  # the new card's own count, but not the base's step
        out["costTiming"] = shared
    new_cost = cluster_cost(choice.train_flops, unit, gpu, setup.gpus, new.mfu, batch=batch, operators=new_ops)
    base_cost = cluster_cost(base_train, unit, gpu, setup.gpus, base.mfu, batch=batch, operators=base_ops)
    if new_cost.usd is not None and base_cost.usd is not None:
        out["costUsd"] = {**_delta(base_cost.usd, new_cost.usd), "unit": unit.key, "per": unit.phrase,
                          "gpu": gpu.id, "gpus": setup.gpus}
    return out
