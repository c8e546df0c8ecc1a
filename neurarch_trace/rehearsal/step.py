"""One mixed-precision AdamW training step, rehearsed on the meta device.

The user's model is never modified: :class:`Rehearsal` makes meta copies of its parameters and
buffers (so BatchNorm's running statistics update the copies), calls it through
``torch.func.functional_call`` in ``train()`` mode (the caller restores the flags) and steps
``torch.optim.AdamW(foreach=True)``, the multi-tensor implementation that is PyTorch's default for
parameters on a GPU (on flat stand-ins of the same total size, :class:`_ProxyAdamW`). The step is the usual loop::

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        output = model(*inputs)
        loss = loss_fn(output, target)      # see _loss
    loss.backward()
    optimizer.step()

with the optimizer's moments already allocated (a step of a run that has started: the first step
allocates them in ``optimizer.step()``, every later step carries them through the backward).
Nothing is computed: meta tensors have shapes and dtypes, no values.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree

import neurarch_trace.walk as walk
from neurarch_trace.flops import op_flops
from neurarch_trace.rehearsal.adapters import Recipe, adapted_layers, adapter_weights, adapters_installed
from neurarch_trace.rehearsal.attention import FusedAttention
from neurarch_trace.rehearsal.checkpointing import checkpointed_layers, checkpointing_installed
from neurarch_trace.rehearsal.metacache import MetaCache
from neurarch_trace.rehearsal.policy import CudaAutocast
from neurarch_trace.rehearsal.storage import StorageTracker

__all__ = ["InputPlan", "Rehearsal", "Run", "RehearsalError"]

#: Kinds of storage whose bytes count as "saved for backward" by a layer (the training state,
#: 16-bit weight copies included, is not an activation).
_ACTIVATION_KINDS = frozenset({"activations", "inputs", "other", "loss"})


class RehearsalError(Exception):
    """The step cannot be rehearsed for a reason the user can act on; ``str()`` is one line."""


@dataclasses.dataclass
class Run:
    """What one rehearsed step measured. ``points``: live bytes per kind after every allocation
    (:data:`~neurarch_trace.rehearsal.storage.KINDS` order); ``phases``: the phase of each point;
    ``saved``: bytes saved for backward inside each module call, by qualified name, one entry per
    call in call order; ``flops``: forward FLOPs (counted only when asked); ``loss``: what the loss
    was computed on."""

    batch: int
    tokens: int | None
    points: list[tuple[int, ...]]
    phases: list[str]
    saved: dict[str, list[int]]
    saved_total: int
    flops: int
    attention: FusedAttention
    loss: dict[str, Any]
    #: bytes of the key/value cache the forward returned (``past_key_values``; 0 when none)
    cache_bytes: int = 0
    #: the part of ``cache_bytes`` autograd saved for backward too (a value tensor the attention
    #: kernel saves as it is), which a step without the cache keeps through the forward as well
    cache_saved_bytes: int = 0
    #: aten operations the step dispatched (:attr:`StorageTracker.operators`)
    operators: int = 0


class InputPlan:
    """How to remake the traced inputs on the meta device at another batch size and sequence
    length. A tensor's batch axis is its first axis of the traced batch size (none when no axis
    has it); for a token model (the first input is integer ids of shape ``(batch, tokens)``) every
    other axis of the traced length is a sequence axis."""

    def __init__(self, args: tuple, kwargs: Mapping[str, Any], batch: int, scalars: list | None = None) -> None:
        self.args, self.kwargs, self.batch = args, dict(kwargs), batch
        self.scalars = list(scalars or [])
        leaves = [t for t in pytree.tree_leaves((args, self.kwargs)) if isinstance(t, torch.Tensor)]
        first = leaves[0] if leaves else None
        self.tokens: int | None = None
        if (first is not None and first.dim() == 2 and int(first.shape[0]) == batch
                and not first.is_floating_point() and not first.is_complex() and first.dtype != torch.bool):
            self.tokens = int(first.shape[1])

    def make(self, batch: int, tokens: int | None) -> tuple[tuple, dict]:
        def remake(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            shape = [int(d) for d in value.shape]
            axis = shape.index(self.batch) if self.batch in shape else None
            for i, dim in enumerate(shape):
                if i == axis:
                    shape[i] = batch
                elif self.tokens is not None and tokens is not None and dim == self.tokens:
                    shape[i] = tokens
            out = torch.empty(shape, dtype=value.dtype, device="meta")
            return out.requires_grad_(True) if value.requires_grad and value.is_floating_point() else out

        args, kwargs = pytree.tree_map(remake, (self.args, self.kwargs))
        return tuple(args), kwargs


#: 16-bit floating dtypes. A trainable parameter stored in one (a checkpoint built from a
#: ``config.json`` whose ``torch_dtype`` is ``bfloat16``, a model ``.half()``-ed by hand) is rehearsed
#: as a float32 master weight: mixed-precision training keeps the weights AdamW updates, their
#: gradients and its moments in float32 and casts 16-bit copies for the matrix products
#: (Micikevicius et al. 2018, "Mixed Precision Training", section 3.1; ``torch.amp``'s recipe). In
#: 16 bits the step would count 2 bytes for each of them instead of 4, half the training state.
_HALF = frozenset({torch.float16, torch.bfloat16})


def _meta_copy(t: torch.Tensor, requires_grad: bool, half: torch.dtype | None = None) -> torch.Tensor:
    """A meta tensor like ``t``; a trainable 16-bit floating one in float32 (:data:`_HALF`), or,
    with ``half``, every floating one in that 16-bit dtype (a model loaded in 16 bits)."""
    trainable = requires_grad and t.is_floating_point()
    if half is not None:
        dtype = half if t.is_floating_point() else t.dtype
    else:
        dtype = torch.float32 if trainable and t.dtype in _HALF else t.dtype
    out = torch.empty_like(t, device="meta", dtype=dtype)
    return out.requires_grad_(trainable)


def _output_tensors(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a model's output, in order (tensors, sequences, mappings, dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 8 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return []
    if isinstance(obj, Mapping):
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    else:
        return []
    return [t for value in values for t in _output_tensors(value, depth + 1)]


def _cache_bytes(output: Any, saved: set | None = None) -> int:
    """Bytes of the tensors under a transformers output's ``cache`` (``past_key_values`` before
    transformers 5.2x; a ``Cache`` object's layers, or the legacy tuples), each storage once: the KV
    cache a forward with ``use_cache`` returns, which transformers turns off in training with
    gradient checkpointing. Model outputs are mappings (``ModelOutput`` is an ``OrderedDict``).
    Storages in ``saved`` (ids of what autograd saved for backward) are left out: a value the
    attention kernel saves as it is stays alive without the cache too."""
    if not isinstance(output, Mapping):
        return 0
    keys = output.keys()  # ``name in output`` of a deprecated name makes transformers 5.2x warn
    cache = output["cache"] if "cache" in keys else output["past_key_values"] if "past_key_values" in keys else None
    seen: dict[int, int] = {}

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if saved is None or id(storage) not in saved:
                seen[id(storage)] = storage.nbytes()  # the same storage object for every view of it
            return
        if depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
            return
        if isinstance(obj, Mapping):
            values = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            values = list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, nn.Module)):
            values = list(vars(obj).values())
        else:
            return
        for value in values:
            visit(value, depth + 1)

    if cache is not None:
        visit(cache, 0)
    return sum(seen.values())


def _loss(output: Any, tracker: StorageTracker) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The loss on the primary output (the first floating tensor output that requires grad), in
    float32 as transformers' losses compute it (``logits.float()``): cross-entropy over the class
    axis for 2-D ``(N, C)`` and 4-D+ ``(N, C, ...)`` outputs, over the last axis of 3-D
    ``(N, L, V)`` token logits; mean squared error for 1-D or 0-D outputs. Returns the loss, the
    target (part of the batch: the caller keeps it for the whole step) and what was computed."""
    candidates = [t for t in _output_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not candidates:
        raise RehearsalError("no output of the model depends on a trainable parameter, so there is no backward")
    out = candidates[0]
    logits = out.float()
    if out.dim() >= 2:
        shape = (out.shape[0],) + tuple(out.shape[1:-1]) if out.dim() == 3 else (out.shape[0],) + tuple(out.shape[2:])
        target = torch.empty(shape, dtype=torch.int64, device="meta")
        tracker.register(target, "inputs")
        if out.dim() == 3:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        else:
            loss = nn.functional.cross_entropy(logits, target)
        kind = "cross-entropy"
    else:
        target = torch.empty(out.shape, dtype=torch.float32, device="meta")
        tracker.register(target, "inputs")
        loss = nn.functional.mse_loss(logits, target)
        kind = "mean squared error"
    return loss, target, {"kind": kind, "shape": [int(d) for d in out.shape]}


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


class _Layers:
    """Module calls during the forward, named as the tracer names them, and the bytes each call
    saves for backward (a storage saved by several calls counts at the first; a call's total
    includes the calls inside it)."""

    def __init__(self, model: nn.Module, tracker: StorageTracker) -> None:
        self.model, self.tracker = model, tracker
        self.default: dict[int, str] = {}
        self.children: dict[int, dict[int, str]] = {}
        for qual, mod in walk.named_modules(model, remove_duplicate=False):
            self.default.setdefault(id(mod), qual)
            self.children[id(mod)] = {id(c): n for n, c in mod._modules.items() if c is not None}
        self.stack: list[tuple[nn.Module, str, int]] = []
        self.calls: dict[str, int] = {}
        self.saved: dict[str, list[int]] = {}
        self.seen: set[int] = set()
        self.total = 0

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module is self.model:
            qual = ""
        elif self.stack:
            parent, parent_qual, _ = self.stack[-1]
            child = self.children.get(id(parent), {}).get(id(module))
            qual = (f"{parent_qual}.{child}" if parent_qual else child) if child is not None else self.default.get(
                id(module), type(module).__name__)
        else:
            qual = self.default.get(id(module), type(module).__name__)
        call = self.calls.get(qual, 0)
        self.calls[qual] = call + 1
        self.saved.setdefault(qual, []).append(0)
        self.stack.append((module, qual, call))

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self.stack and self.stack[-1][0] is module:
            self.stack.pop()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            return t
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.seen or self.tracker.kind_of(t) not in _ACTIVATION_KINDS:
            return t
        self.seen.add(key)
        nbytes = storage.nbytes()
        self.total += nbytes
        for _, qual, call in self.stack:
            self.saved[qual][call] += nbytes
        return t

    def hooks(self) -> list:
        handles = []
        for module in walk.modules(self.model):
            if isinstance(module, torch.jit.ScriptModule):
                continue
            handles.extend(walk.register_hooks(module, self.pre, self.post))
        return handles


class _ProxyAdamW:
    """``torch.optim.AdamW(foreach=True)`` stepping one flat stand-in parameter per dtype.

    The multi-tensor implementation groups the parameters by device and dtype and runs each
    ``_foreach_`` operation on a whole group at once: every temporary it makes (``_foreach_sqrt``
    of the second moments) is the group's total size, allocated together and freed together. A
    flat parameter of the group's total size therefore allocates, frees and keeps exactly the
    bytes the real parameters would (the moments included, which AdamW allocates itself on the
    warm-up step), in a dozen meta operations instead of a dozen per parameter."""

    def __init__(self, trainable: list[torch.Tensor]) -> None:
        sizes: dict[torch.dtype, int] = {}
        for p in trainable:
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
        self.params = [torch.empty(n, dtype=dtype, device="meta", requires_grad=True) for dtype, n in sizes.items()]
        self.grads = [torch.empty_like(p) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-3, foreach=True) if self.params else None
        self.step()  # allocates the moments: a step of a run that has started carries them

    def register(self, tracker: StorageTracker) -> None:
        for p, g in zip(self.params, self.grads):
            tracker.ignore(p)  # the real meta parameters and gradients are counted
            tracker.ignore(g)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.register(value, "optimizerMoments")

    def step(self) -> None:
        if self.optimizer is None:
            return
        for p, g in zip(self.params, self.grads):
            p.grad = g
        with torch.no_grad():
            _undecorated(type(self.optimizer).step)(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)


def _undecorated(function: Any) -> Any:
    """``function`` under its ``functools.wraps`` decorators. ``Optimizer.step``'s decorators open
    a profiler range, run the step hooks users registered on every optimizer (not this one's to
    run) and switch grad mode off around a ``torch._dynamo.graph_break()``, whose import is most of
    a second of a cold start; the step itself runs as PyTorch runs it, under ``no_grad``."""
    while getattr(function, "__wrapped__", None) is not None:
        function = function.__wrapped__
    return function


class _Autocast:
    """CUDA autocast's global flags on for the forward: code that asks ``torch.is_autocast_enabled()``
    sees what it would on a GPU, and a ``torch.autocast("cuda", enabled=False)`` region inside the
    model turns the emulation off as it turns autocast off."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        self.was = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)

    def __exit__(self, *exc: Any) -> None:
        torch.set_autocast_enabled("cuda", self.was[0])
        torch.set_autocast_dtype("cuda", self.was[1])


@contextlib.contextmanager
def _recompute(dtype: torch.dtype, tracker: StorageTracker) -> Iterator[None]:
    """What a checkpointed layer's forward is recomputed under in the backward: the meta device and
    the forward's autocast, a region of its own (``torch.utils.checkpoint`` enters CUDA autocast
    afresh around the recompute, so its 16-bit weight copies are dropped when the layer is done)."""
    autocast = CudaAutocast(sdpa=FusedAttention(), on_weight_cast=lambda t: tracker.set_kind(t, "weights16"),
                            dtype=dtype)
    with _Autocast(dtype), torch.device("meta"), autocast:
        try:
            yield
        finally:
            autocast.clear_cache()


def _every_slot(model: nn.Module, copies: dict) -> dict:
    """``copies`` (meta copies by first name) under the name of every slot that holds one:
    a weight tied between two modules (GPT-2's ``lm_head.weight`` is ``wte.weight``) sits in two
    slots and both are swapped; a module registered under two parents is one slot, swapped once
    (``functional_call``'s own ``tie_weights`` swaps it twice and restores the copy)."""
    first: dict = {}
    slots: dict = {}
    for prefix, module in walk.named_modules(model):
        for registry in (module._parameters, module._buffers):
            for key, value in registry.items():
                if value is not None:
                    name = f"{prefix}.{key}" if prefix else key
                    known = first.setdefault(id(value), name)
                    if known in copies:
                        slots[name] = copies[known]
    return slots


class Rehearsal:
    """Meta copies of ``model``'s parameters and buffers, and the optimizer, shared by the runs of
    one rehearsal; :meth:`run` rehearses one step at a batch size and sequence length."""

    def __init__(self, model: nn.Module, plan: InputPlan, dtype: torch.dtype = torch.bfloat16,
                 half_weights: bool = False, recipe: Recipe | None = None) -> None:
        """``half_weights``: the parameters and floating buffers in ``dtype`` (the model as loaded
        with ``torch_dtype=bfloat16``, as a LoRA base is), none upcast to float32 masters.
        ``recipe``: a LoRA or QLoRA step (:mod:`.adapters`) over that 16-bit base, frozen: the
        adapters train; a quantized recipe stores the adapted layers' weights packed in 4 bits,
        and ``kbit`` casts every other parameter to float32."""
        self.model, self.plan, self.dtype = model, plan, dtype
        half = dtype if half_weights or recipe is not None else None
        named = list(walk.named_parameters(model))
        self.params = {n: _meta_copy(p, p.requires_grad and recipe is None, half) for n, p in named}
        #: trainable parameters (elements) stored in 16 bits and rehearsed as float32 master weights
        self.upcast = 0 if half is not None else sum(p.numel() for n, p in named if self.params[n].dtype != p.dtype)
        self.buffers = {n: _meta_copy(b, False, half) for n, b in walk.named_buffers(model)}
        self.recipe = recipe
        self.adapted = adapted_layers(model) if recipe is not None else []
        self.adapters = adapter_weights(self.adapted)
        if recipe is not None:
            self._frozen_base(recipe)
        self.tensors = _every_slot(model, {**self.params, **self.buffers})
        self.trainable = [p for p in self.params.values() if p.requires_grad] + [t for ab in self.adapters for t in ab]
        self.stepped = list(self.trainable)  # the parameters AdamW steps: those that get a gradient
        self.adamw = _ProxyAdamW(self.stepped)
        self.cache = MetaCache()

    def _frozen_base(self, recipe: Recipe) -> None:
        """The base of ``recipe``: the adapted layers' weights packed in 4 bits (two NF4 values a
        byte; their quantisation constants are the plan's to count) when quantized, every other
        floating parameter in float32 with ``kbit``."""
        packed = {f"{layer.name}.weight" if layer.name else "weight" for layer in self.adapted}
        for name, p in self.params.items():
            if recipe.quantized and name in packed:
                self.params[name] = torch.empty((p.numel() + 1) // 2, dtype=torch.uint8, device="meta")
            elif recipe.kbit and p.is_floating_point():
                self.params[name] = torch.empty_like(p, dtype=torch.float32)

    def _register(self, tracker: StorageTracker, inputs: Any) -> None:
        for p in self.params.values():
            tracker.register(p, "masterWeights" if p.requires_grad else "frozenWeights")
        for a, b in self.adapters:
            tracker.register(a, "masterWeights")
            tracker.register(b, "masterWeights")
        for b in self.buffers.values():
            tracker.register(b, "buffers")
        self.adamw.register(tracker)
        for t in pytree.tree_leaves(inputs):
            if isinstance(t, torch.Tensor):
                tracker.register(t, "inputs")

    def forward(self, batch: int, tokens: int | None) -> Run:
        """The step's forward and loss alone at ``batch`` (the activations it keeps; no backward, no
        optimizer step). Raises as :meth:`run`."""
        run, _ = self._run(batch, tokens, False, False, forward_only=True)
        return run

    def run(self, batch: int, tokens: int | None, *, count_flops: bool = False, layers: bool = True,
            checkpoint: bool = False) -> Run:
        """One step at ``batch`` samples of ``tokens`` tokens. Raises whatever the model raises on
        the meta device, or :class:`RehearsalError`. ``layers``: record the bytes each module call
        saves for backward (``Run.saved``; module hooks cost a little). AdamW keeps no state for a parameter that never
        gets a gradient (one the loss does not depend on): when the step finds some, it is rehearsed
        again with AdamW stepping only the others. ``checkpoint``: with activation checkpointing as
        transformers' ``gradient_checkpointing_enable()`` applies it (:mod:`.checkpointing`);
        raises :class:`RehearsalError` for a model without a layer it checkpoints."""
        if checkpoint and not checkpointed_layers(self.model):
            raise RehearsalError("the model has no layer transformers checkpoints (GradientCheckpointingLayer)")
        run, stepped = self._run(batch, tokens, count_flops, layers, checkpoint=checkpoint)
        if len(stepped) != len(self.stepped):
            self.stepped = stepped
            self.adamw = _ProxyAdamW(stepped)
            run, _ = self._run(batch, tokens, count_flops, layers, checkpoint=checkpoint)
        return run

    def _run(self, batch: int, tokens: int | None, count_flops: bool, record_layers: bool,
             forward_only: bool = False, checkpoint: bool = False) -> tuple[Run, list[torch.Tensor]]:
        args, kwargs = self.plan.make(batch, tokens)
        flops = [0]

        def on_op(func: Any, a: tuple, kw: dict, out: Any) -> None:
            if tracker.phase == "forward":
                flops[0] += op_flops(func, a, kw, out) or 0

        tracker = StorageTracker(on_op=on_op if count_flops else None, cache=self.cache, scalars=self.plan.scalars)
        attention = FusedAttention()
        autocast = CudaAutocast(sdpa=attention, on_weight_cast=lambda t: tracker.set_kind(t, "weights16"),
                                dtype=self.dtype)
        layers = _Layers(self.model, tracker)
        handles = layers.hooks() if record_layers else []
        pack = layers.pack if record_layers else _same
        recipe = (adapters_installed(self.adapted, self.recipe, self.adapters) if self.recipe is not None
                  else contextlib.nullcontext())
        checkpointing = (checkpointing_installed(self.model, lambda: _recompute(self.dtype, tracker))
                         if checkpoint else contextlib.nullcontext())
        # the meta copies in the model's slots from the forward to the end of the backward, which
        # recomputes checkpointed layers: torch.func.functional_call's own context, held longer
        swapped = _reparametrize_module(self.model, self.tensors, tie_weights=False)  # each slot once (_every_slot)
        try:
            with tracker, recipe, checkpointing, swapped:
                self._register(tracker, (args, kwargs))
                tracker.start("forward")
                with torch.autograd.graph.saved_tensors_hooks(pack, _same), _Autocast(self.dtype):
                    with torch.device("meta"), autocast:
                        output = self.model(*args, **kwargs)
                        tracker.start("loss")
                        cache_bytes = _cache_bytes(output)
                        cache_saved = cache_bytes - _cache_bytes(output, layers.seen) if record_layers else 0
                        loss, target, loss_info = _loss(output, tracker)
                    autocast.clear_cache()
                if tracker.scalars_read != len(self.plan.scalars):
                    raise RehearsalError(
                        f"the forward read {tracker.scalars_read} tensor values where the traced one read "
                        f"{len(self.plan.scalars)}, so the traced values cannot stand in for them on the meta device")
                stepped = list(self.stepped)
                if not forward_only:
                    tracker.start("backward")
                    loss.backward()
                    stepped = [p for p in self.trainable if p.grad is not None]
                    for p in stepped:
                        tracker.set_kind(p.grad, "gradients")
                    tracker.start("optimizer")
                    self.adamw.step()
                tracker.close()
                del output, loss, target
        finally:
            for handle in handles:
                handle.remove()
            for p in self.trainable:
                p.grad = None
        run = Run(batch=batch, tokens=tokens, points=tracker.curve(), phases=tracker.phase_of_points(),
                  saved=layers.saved, saved_total=layers.total, flops=flops[0], attention=attention, loss=loss_info,
                  cache_bytes=cache_bytes, cache_saved_bytes=cache_saved, operators=tracker.operators)
        return run, stepped
