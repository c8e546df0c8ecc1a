"""``trace_model``: check the arguments, run one forward pass under the recorder, build the graph.

This module only orchestrates: the recorder (:mod:`.recorder`) records, the serialiser
(:mod:`.serialise`) writes the graph. The forward runs once, in ``eval()`` mode, without autograd
(no graph kept, activations freed as they go; :mod:`.closed_form` says what the fast paths are and
``reference_path()`` turns them off), again with autograd when the forward itself differentiates,
with PyTorch's fused attention fast paths off; the model's training flags are restored, every hook
removed, and the parameters, buffers and attributes the forward changed put back (:mod:`.guard`), in
``finally`` blocks. Then one training step is rehearsed on the meta device (:mod:`neurarch_trace.rehearsal`).
"""

from __future__ import annotations

import inspect
import operator
import warnings
from contextlib import nullcontext
from sys import _getframe
from types import CodeType, FunctionType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.modules.module as _global_hooks
from torch import nn
from torch.utils.hooks import RemovableHandle

import neurarch_trace.walk as walk
from neurarch_trace.contract.document import gc_paused
from neurarch_trace.errors import NeedsValuesError, OutOfMemoryError, TraceError, is_out_of_memory
from neurarch_trace.lazy_dynamo import compiled_code_run_eagerly, dynamo_left_unimported
from neurarch_trace.lazy_sympy import sympy_left_unimported
from neurarch_trace.metakernels import MetaKernelMode, worth_a_mode
from neurarch_trace.rehearsal import rehearse_training_step
from neurarch_trace.text import error_line
from neurarch_trace.trace.batch import sample_inputs
from neurarch_trace.trace.guard import fast_paths_off, state_kept
from neurarch_trace.trace.modules import Opaque, opaque_script_modules, unwrap_model
from neurarch_trace.trace.notices import model_warnings, warn_no_output, warn_positions_past_table, warn_unused_inputs
from neurarch_trace.trace.recorder import Recorder
from neurarch_trace.trace.records import Recording
from neurarch_trace.trace.serialise import build_graph
from neurarch_trace.trace.tensors import iter_tensors, named_tensors, output_tensors, tensor_text
from neurarch_trace.trace.training import attach_training

__all__ = ["trace_model"]


def _split_inputs(inputs: Any) -> Tuple[tuple, dict]:
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)):
        return tuple(inputs), {}
    raise TypeError(
        f"inputs must be a tensor, a sequence of tensors or a dict of keyword arguments, not {type(inputs).__name__}"
    )


def _input_names(model: nn.Module, n_args: int) -> List[str]:
    try:
        params = [
            p for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n_args]]
    return names + [f"input_{i}" for i in range(len(names), n_args)]


#: ``torch.nn.modules.module``'s global hook dicts (``register_module_forward_hook`` and the like).
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")

#: Per module class: whether an instance's ``forward`` attribute is what ``nn.Module.__call__``
#: runs (:func:`_wrappable`).
_WRAPPABLE: Dict[type, bool] = {}


def _wrappable_class(cls: type) -> bool:
    """``nn.Module.__call__`` (``_call_impl``) is the class's call, and its ``forward`` a plain
    function: then ``module(x)`` runs an instance's ``forward`` attribute, and nothing else does
    (a ``forward`` property or a ``__call__`` of the class's own would bypass or shadow it)."""
    wrappable = _WRAPPABLE.get(cls)
    if wrappable is None:
        forward = next((vars(base)["forward"] for base in cls.__mro__ if "forward" in vars(base)), None)
        wrappable = _WRAPPABLE[cls] = (cls.__call__ is nn.Module.__call__ and cls._call_impl is nn.Module._call_impl
                                       and isinstance(forward, FunctionType))
    return wrappable


#: The frames ``nn.Module.__call__`` runs ``self.forward`` from: ``_call_impl`` (its fast path),
#: the closure it runs hooks in, and ``_slow_forward`` (under ``torch.jit.trace``), by the ids of
#: their code objects, which live as long as ``nn.Module``: a code object's own hash is computed
#: from its bytecode and constants on every lookup, about 0.7 us, once per module call.
_CALL_CODE_IDS = frozenset(id(code) for code in (
    [nn.Module._call_impl.__code__, nn.Module._slow_forward.__code__]
    + [c for c in nn.Module._call_impl.__code__.co_consts if isinstance(c, CodeType)]
))


def _traced_forward(module: nn.Module, forward: Callable[..., Any], pre: Callable[..., None],
                    post: Callable[..., None]) -> Callable[..., Any]:
    """``forward`` between the recorder's ``pre(module, args, kwargs)`` and ``post(module, args,
    kwargs, output)``, as a forward pre-hook and forward hook with kwargs would run them: when the
    module is called (``module(x)``), not when code calls ``module.forward(x)`` itself, which
    runs no hook either."""
    def forward_traced(*args: Any, **kwargs: Any) -> Any:
        if id(_getframe(1).f_code) not in _CALL_CODE_IDS:
            return forward(*args, **kwargs)
        pre(module, args, kwargs)
        output = forward(*args, **kwargs)
        post(module, args, kwargs, output)
        return output

    forward_traced.__wrapped__ = forward  # inspect.signature(module.forward) reads the model's own
    return forward_traced


def _install_hooks(tree: walk.Tree, recorder: Recorder, progress: Optional[Callable[[int], None]],
                   hooked: list, wrapped: list) -> int:
    """The recorder's pre-hook and post-hook around every Python module's forward (TorchScript
    ones refuse hooks). Returns the hooks' key for :func:`_remove_hooks`; with ``progress``, the
    pre-hook also reports the layer calls recorded so far.

    A module with no hooks of its own, when no global hook is installed, gets its ``forward``
    wrapped instead (an instance attribute, appended to ``wrapped``; the recorder is told with
    :meth:`Recorder.traced_forward`): ``nn.Module.__call__`` then takes its fast path, which a
    hook would turn into the general one (``_call_impl``'s ``inner``: every hook dict read, a
    closure, the backward hooks' checks). That path costs a no-op hook pair 11 to 22 us a module
    call, about 2 ms of a ResNet-50 or GPT-2 trace (``bench/bench_trace.py``). Every other module
    (user hooks, a forward of its own instance, a class whose call is not ``nn.Module``'s) gets
    the hooks themselves, appended to ``hooked``, so they run in the same order as before: after
    the user's pre-hooks, after the user's forward hooks.

    The hooks go straight into the modules' hook dicts under one key, as ``register_forward_hook``
    puts them (last, flagged ``with_kwargs``), without a ``RemovableHandle`` each: for a model of a
    few hundred modules that is half a millisecond, a good part of the trace's fixed cost."""
    pre: Callable[..., None] = recorder.pre_hook
    if progress is not None:
        first = len(recorder.records)
        seen = [first]

        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            recorder.pre_hook(module, args, kwargs)
            if len(recorder.records) != seen[0]:
                seen[0] = len(recorder.records)
                progress(seen[0] - first)

    key = RemovableHandle.next_id
    RemovableHandle.next_id += 1
    post = recorder.post_hook
    wrap = not any(getattr(_global_hooks, name, None) for name in _GLOBAL_HOOKS)
    for module in tree.modules:
        if isinstance(module, torch.jit.ScriptModule):
            continue
        own = module.__dict__
        if wrap and "forward" not in own and not (module._forward_pre_hooks or module._forward_hooks
                                                  or module._backward_hooks or module._backward_pre_hooks) \
                and _wrappable_class(type(module)):
            traced = own["forward"] = _traced_forward(module, module.forward, pre, post)
            recorder.traced_forward(module, traced)
            wrapped.append((module, traced))
            continue
        module._forward_pre_hooks[key] = pre
        module._forward_pre_hooks_with_kwargs[key] = True
        module._forward_hooks[key] = post
        module._forward_hooks_with_kwargs[key] = True
        hooked.append(module)
    return key


def _remove_hooks(hooked: list, wrapped: list, key: int) -> None:
    for module in hooked:
        module._forward_pre_hooks.pop(key, None)
        module._forward_pre_hooks_with_kwargs.pop(key, None)
        module._forward_hooks.pop(key, None)
        module._forward_hooks_with_kwargs.pop(key, None)
    for module, traced in wrapped:
        own = module.__dict__
        if own.get("forward") is traced:
            del own["forward"]


def _on_meta(model: nn.Module, args: tuple, kwargs: dict) -> bool:
    tensors = list(iter_tensors(args)) + list(iter_tensors(kwargs))
    return any(t.is_meta for t in tensors) or any(p.is_meta for p in walk.parameters(model))


def _needs_values(exc: BaseException) -> bool:
    text = str(exc).lower()
    if _device_mismatch(exc):
        return False
    return "meta" in text or "data-dependent" in text or "item()" in text


def _device_mismatch(exc: BaseException) -> bool:
    """Tensors of one operation on two devices (``Tensor on device cpu is not on the expected device
    meta!``, ``Expected all tensors to be on the same device``): not a value the meta device lacks."""
    text = str(exc)
    return "is not on the expected device" in text or "to be on the same device" in text


def _needs_autograd(exc: Optional[BaseException]) -> bool:
    """The forward failed for want of autograd (it calls torch.autograd.grad or backward)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("does not require grad" in text or "grad_fn" in text
                                               or "differentiated Tensors" in text)


def _trace_error(exc: Exception, recorder: Recorder, model: nn.Module, args: tuple, kwargs: dict,
                 tensors: List[Tuple[str, torch.Tensor]]) -> TraceError:
    where = recorder.where()
    if _on_meta(model, args, kwargs) and _needs_values(exc):
        return NeedsValuesError(
            f"the forward pass needs real tensor values, which the meta device does not have, {where} "
            f"({error_line(exc)}): trace on the CPU instead (--device cpu)"
        )
    shown = ", ".join(f"{n} {tensor_text(t)}" for n, t in tensors)
    if is_out_of_memory(exc):
        return OutOfMemoryError(
            f"the forward pass ran out of memory {where} with inputs {shown} ({error_line(exc)}): trace a "
            "smaller batch (shapes are batchless and a plan sizes any batch), or trace on the meta device, "
            "which allocates nothing (--device meta)"
        )
    if _device_mismatch(exc):
        return TraceError(
            f"the forward pass failed {where} with inputs {shown}: {error_line(exc)}; the model holds tensors on "
            "another device than its inputs (a tensor made with a fixed device=, or weights moved by hand): "
            "trace it with --device set to where its weights are"
        )
    if isinstance(exc, NotImplementedError) and _NO_FORWARD in str(exc):  # nn.Module's _forward_unimplemented
        return TraceError(
            f"the forward pass failed {where}: {error_line(exc)}; define forward(self, ...) in that class "
            "(nn.Module has none of its own)"
        )
    return TraceError(
        f"the forward pass failed {where} with inputs {shown}: {error_line(exc)}; "
        "check the input shapes and dtypes against what the model's forward expects"
    )


#: What ``nn.Module`` raises when a class defines no ``forward`` (``Module._forward_unimplemented``).
_NO_FORWARD = 'is missing the required "forward" function'


def _forward(recorder: Recorder, model: nn.Module, args: tuple, kwargs: dict,
             tensors: List[Tuple[str, torch.Tensor]], progress: Optional[Callable[[int], None]],
             with_grad: bool = False) -> Any:
    """Run the forward once under the hooks, the FLOP mode and the flow mode; put everything back."""
    tree = recorder.tree
    training = [(m, m.training) for m in tree.modules]  # the flags to put back
    hooked: list = []
    wrapped: list = []
    key = -1
    try:
        key = _install_hooks(tree, recorder, progress, hooked, wrapped)
        if any([flag for _, flag in training]):
            walk.set_training(model, False)
        # the fast path runs the forward without autograd (no graph, activations freed as they go);
        # the reference path and a forward that needs autograd (torch.autograd.grad) run with it
        grad = torch.no_grad() if recorder.without_grad and not with_grad else torch.enable_grad()
        # on meta, below the FLOP mode: it stays on inside the layers where the FLOP mode steps aside
        shapes = MetaKernelMode() if recorder.on_meta and worth_a_mode(tree.modules) else nullcontext()
        with grad, shapes, recorder.flop_mode, recorder.flow:
            try:
                return model(*args, **kwargs)
            finally:
                recorder.flow.restore()  # a forward that raised inside a layer left the modes popped
                recorder.flop_mode.restore()
    except Exception as exc:
        raise _trace_error(exc, recorder, model, args, kwargs, tensors) from exc
    except SystemExit as exc:  # sys.exit() in a forward: no traceback, and no silent exit either
        raise TraceError(
            f"the forward pass called sys.exit({exc.code!r}) {recorder.where()}: a forward must return its "
            "outputs; trace a model whose forward does not exit"
        ) from exc
    finally:
        _remove_hooks(hooked, wrapped, key)
        for module, flag in training:
            if module.training != flag:  # nn.Module.__setattr__ is slow: only what changed
                module.training = flag


def trace_model(
    model: nn.Module,
    inputs: Any,
    *,
    kwargs: Optional[Mapping[str, Any]] = None,
    name: Optional[str] = None,
    depth: Optional[int] = None,
    description: Optional[str] = None,
    progress: Optional[Callable[[int], None]] = None,
    training_step: bool = True,
    finetune: Optional[str] = None,
) -> dict:
    """Run one forward pass of ``model`` on ``inputs`` and return the ``.neurarch.json`` graph.

    Args:
        model: any ``nn.Module``; ``torch.compile``, nn.DataParallel and DDP wrappers are traced as
            the model inside them.
        inputs: one tensor, a sequence of tensors (positional arguments) or a dict (keyword
            arguments), batch first. The first dim of the first tensor is the batch size; an
            argument that is a list of dicts is a list of samples, its length the batch size.
        kwargs: more keyword arguments, passed after positional ``inputs``.
        name: the graph's name (default: the model's class name).
        depth: stop descending at this depth (1 = the root's children); a container cut off there
            is one node. ``None`` descends to the leaves.
        description: the top-level ``description`` (default: says what traced it and the inputs).
        progress: called with the number of layer calls recorded so far, from the hooks; its
            ``step(text)``, if any, with ``"rehearsing the training step"`` before the step.
        training_step: after the trace, rehearse one mixed-precision AdamW training step on the
            meta device (:mod:`neurarch_trace.rehearsal`) and record what it needs in
            ``measured.training`` and each layer's ``measured.savedBytes``; a step that cannot be
            rehearsed leaves ``measured.training.error`` and the trace stands.
        finetune: ``"lora"`` or ``"qlora"``: with the training step, also rehearse that fine-tuning
            step as PEFT (and bitsandbytes, for QLoRA: with and without PEFT's
            ``prepare_model_for_kbit_training``) run it, for a transformers model
            (``measured.training.adapters``; :mod:`neurarch_trace.rehearsal.adapters`); ``None`` or
            ``"full"``: not.

    Returns:
        The graph as a dict (see ``shared/spec/neurarch-graph.md`` and ``docs/measured.md``):
        shapes batchless, FLOPs at the traced batch size, one multiply-add = 2 FLOPs.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``inputs`` has another type, ``depth`` is
            not an int, or ``training_step`` is not a bool (or 0/1).
        ValueError: ``finetune`` is not ``None``, ``"full"``, ``"lora"`` or ``"qlora"`` (in any case).
        ValueError: no input tensor, a 0-d first input, a batch of 0 samples, or ``depth`` below 0.
        TraceError: the forward pass raised (or called ``sys.exit``); the message says how far the
            trace got and repeats the model's own complaint; the original exception is chained.

    Warns:
        TraceWarning: each warning the forward raised, issued again at the model's own line with
            the layer that was running; and a forward that returned no tensor.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    depth, finetune = _checked_options(depth, finetune, training_step)
    model = unwrap_model(model)
    if isinstance(model, torch.jit.ScriptModule):
        model = Opaque(model)  # a scripted model refuses hooks: trace it as one opaque layer
    args, call_kwargs = _split_inputs(inputs)
    call_kwargs = {**call_kwargs, **kwargs} if kwargs else call_kwargs
    named_inputs = list(zip(_input_names(model, len(args)), args)) + list(call_kwargs.items())
    tensors = [pair for n, value in named_inputs for pair in named_tensors(n, value)]
    if not tensors:
        raise ValueError("inputs hold no tensor: give at least one input tensor, batch first")
    if tensors[0][1].dim() == 0:
        raise ValueError(
            f"input {tensors[0][0]!r} is a 0-d tensor: inputs are batch first, e.g. shape (1, 3, 224, 224)"
        )
    if sample_inputs(named_inputs)[0] == 0:
        raise ValueError(f"input {tensors[0][0]!r} of shape {tuple(tensors[0][1].shape)} holds a batch of 0 samples: "
                         "give at least one, e.g. shape (1, ...)")
    graph_name = name or type(model).__name__

    # a trace makes many small objects that live to its end; the meta kernels are PyTorch's Python.
    # The records are freed (by reference counting) when _traced_graph returns, before the collection
    # that re-enabling the collector sets off, which then walks the graph alone.
    with gc_paused(), dynamo_left_unimported(), sympy_left_unimported(), compiled_code_run_eagerly():
        return _traced_graph(model, args, call_kwargs, named_inputs, tensors, depth, graph_name, progress,
                             training_step, description, finetune)


def _is_flag(value: Any) -> bool:
    """``True``/``False``, 0/1, or numpy's bool: what a flag argument may be."""
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return True
    return isinstance(value, int) and value in (0, 1)


def _checked_options(depth: Any, finetune: Any, training_step: Any = True) -> Tuple[Optional[int], Optional[str]]:
    """``depth`` as an int (or None) and ``finetune`` in lower case, once both are checked
    (:func:`trace_model`'s TypeError and ValueError; the case of a mode does not matter, as on the
    command line: ``"QLoRA"``)."""
    if depth is not None:  # an int, or what stands for one (numpy's): not a bool, a float or a string
        if isinstance(depth, bool) or not hasattr(type(depth), "__index__"):
            raise TypeError(f"depth must be an int or None, not {type(depth).__name__}")
        depth = operator.index(depth)
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be 0 or more, not {depth}")
    if not _is_flag(training_step):  # "no" is truthy: it would rehearse a step asked to be left out
        raise TypeError(f"training_step must be True or False, not {training_step!r}")
    mode = finetune.lower() if isinstance(finetune, str) else finetune
    if mode not in (None, "full", "lora", "qlora"):
        raise ValueError(f"finetune must be None, 'full', 'lora' or 'qlora', not {finetune!r}")
    return depth, mode


def _traced_graph(model: nn.Module, args: tuple, call_kwargs: dict, named_inputs: List[Tuple[str, Any]],
                  tensors: List[Tuple[str, torch.Tensor]], depth: Optional[int], graph_name: str,
                  progress: Optional[Callable[[int], None]], training_step: bool, description: Optional[str],
                  finetune: Optional[str] = None) -> dict:
    """:func:`trace_model`'s work once its arguments are checked: the trace (again at full depth
    when ``depth`` cuts it), the model's warnings, the rehearsed step, the graph."""
    recording, output = _record(model, args, call_kwargs, named_inputs, tensors, depth, graph_name, progress)
    # the plan sizes the model, not the view a depth cuts
    recording, full_recording = _at_full_depth(recording, model, args, call_kwargs, named_inputs, tensors, depth,
                                               graph_name)
    _warn(model, graph_name, output, recording, full_recording, call_kwargs)
    step = None
    if training_step:  # its forward rebinds what the traced one did (a counter, a cache): put back
        if progress is not None and callable(getattr(progress, "step", None)):
            progress.step("rehearsing the training step")  # a phase of its own, seconds on a large model
        with state_kept(walk.Tree(model), values=False):
            step = rehearse_training_step(model, args, call_kwargs, batch_size=recording.batch_size,
                                          scalars=recording.scalars, finetune=finetune)
    full = None if full_recording is None else _graph(full_recording, None, step, model, named_inputs,
                                                      graph_name, description)
    return _graph(recording, full, step, model, named_inputs, graph_name, description)


def _warn(model: nn.Module, graph_name: str, output: Any, recording: Recording, full: Optional[Recording],
          kwargs: dict) -> None:
    """What the trace tells of the model (:mod:`.notices`): a forward that returned no tensor,
    keyword inputs its ``**kwargs`` swallowed, and on meta a position table indexed past its rows
    (read at full depth: a depth may cut the table into a node)."""
    if not output_tensors(output):
        warn_no_output(model, graph_name)
    warn_unused_inputs(model, _unused_inputs(recording, _swallowed_keywords(model, kwargs)))
    if recording.on_meta:
        read = full or recording
        warn_positions_past_table(model, read.records, read.input_count)


def _graph(recording: Recording, full: Optional[dict], step: Optional[dict], model: nn.Module,
           named_inputs: List[Tuple[str, Any]], name: str, description: Optional[str]) -> dict:
    """The graph of ``recording`` with the step and, when a depth cut it, the full-depth graph."""
    graph = build_graph(recording, model=model, named_inputs=named_inputs, name=name, description=description)
    attach_training(graph, recording, step, full)
    return graph


def _at_full_depth(recording: Recording, model: nn.Module, args: tuple, kwargs: dict,
                   named_inputs: List[Tuple[str, Any]], tensors: List[Tuple[str, torch.Tensor]],
                   depth: Optional[int], graph_name: str) -> Tuple[Recording, Optional[Recording]]:
    """``(the cut recording, the full-depth one)`` of a trace cut at ``depth``, whose ``recording``
    is given (``(recording, None)`` at full depth). When the layer that tells the batch (a
    sequence-first nn.LSTM fed the input) is inside a node of the cut, the cut trace runs again,
    reading the inputs as the full one learned to."""
    if depth is None:
        return recording, None
    full = _quietly(_record, model, args, kwargs, named_inputs, tensors, None, graph_name, None)[0]
    if full.fed_shape is not None and recording.fed_shape is None:
        recording = _quietly(_record, model, args, kwargs, named_inputs, tensors, depth, graph_name, None,
                             (full.batch_size, full.fed_shape))[0]
    return recording, full


def _quietly(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` with its warnings not shown: the same forward again, whose warnings the
    first trace told already."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args)


def _swallowed_keywords(model: nn.Module, kwargs: dict) -> set:
    """The keyword arguments ``forward`` does not name, which only its ``**kwargs`` takes."""
    if not kwargs:
        return set()
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return set()
    return {k for k in kwargs if k not in params}


def _unused_inputs(recording: Recording, keywords: set) -> List[str]:
    """The names of the input records, of a keyword in ``keywords`` (one ``forward`` does not name),
    that no other record has as a source: a misspelt keyword its ``**kwargs`` swallowed. (An input
    the forward names may be read only into Python: transformers drops an all-ones attention mask.)"""
    if not keywords:
        return []
    used = {key for record in recording.records for key in record.sources}
    return [r.name for r in recording.records[: recording.input_count]
            if r.index not in used and r.name.split(".", 1)[0] in keywords]


def _record(model: nn.Module, args: tuple, kwargs: dict, named_inputs: List[Tuple[str, Any]],
            tensors: List[Tuple[str, torch.Tensor]], depth: Optional[int], graph_name: str,
            progress: Optional[Callable[[int], None]],
            learned: Optional[Tuple[int, tuple]] = None) -> Tuple[Recording, Any]:
    """One forward pass under a recorder cut at ``depth``: the recording and the forward's output;
    once more with autograd if the forward needs it (it calls ``torch.autograd.grad``). The model
    comes back as it was (:mod:`.guard`), its fused fast paths off while it runs. ``learned``:
    ``(batch size, fed shape)`` a full-depth trace of the call learned from a sequence-first layer
    (:meth:`~.recorder.Recorder.adopt_batch`)."""
    batch, samples = sample_inputs(named_inputs)
    batch_size = batch if batch is not None else int(tensors[0][1].shape[0])

    def new_recorder() -> Recorder:
        recorder = Recorder(tree, depth=depth, batch_size=batch_size, root_name=graph_name,
                            samples=frozenset(samples))
        for input_name, t in tensors:
            recorder.add_input(input_name, t)
        if learned is not None:
            recorder.adopt_batch(*learned)
        return recorder

    # the module tree with the scripted parts wrapped, walked once (twice with TorchScript parts)
    with fast_paths_off(), opaque_script_modules(walk.Tree(model)) as tree:
        recorder = new_recorder()
        with model_warnings(lambda: recorder.running()):
            # settling the records reads the layers' weights: a parametrized one is computed again,
            # and spectral_norm's power iteration writes its buffers in train mode; those are put back too
            try:
                with state_kept(tree):
                    output = _forward(recorder, model, args, kwargs, tensors, progress)
                    recording = recorder.finish(output)
            except TraceError as exc:
                if not (recorder.without_grad and _needs_autograd(exc.__cause__)):
                    raise
                tree = walk.Tree(model)  # the first forward may have registered parameters (lazy layers)
                recorder = new_recorder()  # the forward differentiates (torch.autograd.grad): again, with autograd
                with state_kept(tree):
                    output = _forward(recorder, model, args, kwargs, tensors, progress, with_grad=True)
                    recording = recorder.finish(output)
        recorder.close()  # freed by reference counting, not left to the cyclic collector
        return recording, output
