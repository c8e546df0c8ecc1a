"""The library entry points that tie target loading, inputs and the tracer together.

Front ends (the command line, the notebook magic) call these; they know nothing of argparse or
IPython.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.errors import InputSpecError, OutOfMemoryError, TargetError, TraceError, is_out_of_memory
from neurarch_trace.inputs import InputSpec, make_inputs
from neurarch_trace.lazy_dynamo import dynamo_left_unimported
from neurarch_trace.lazy_sympy import sympy_left_unimported
from neurarch_trace.targets import USE_CACHE_NOTE, OpenedTarget, open_target
from neurarch_trace.text import error_line, gb
from neurarch_trace.tracer import dtype_name, trace_model

__all__ = ["DEVICES", "trace_target", "trace_module", "describe_inputs"]

#: Where :func:`trace_target` builds and traces a model: ``auto`` chooses (see :func:`_trace_auto`);
#: ``cpu`` and ``meta`` never fall back.
DEVICES = ("auto", "cpu", "meta")


def describe_inputs(specs: Sequence[InputSpec], default_dtype: torch.dtype) -> str:
    """``--input 1,3,224,224`` style text of the inputs, for the graph's description."""
    parts = []
    for spec in specs:
        dims = ",".join(str(d) for d in spec.shape)
        dtype = dtype_name(spec.dtype or default_dtype)
        prefix = f"{spec.name}=" if spec.name else ""
        parts.append(f"--input {prefix}{dims}:{dtype}")
    return " ".join(parts)


def trace_target(
    target: str,
    specs: Sequence[InputSpec],
    *,
    default_dtype: torch.dtype = torch.float32,
    name: str | None = None,
    depth: int | None = None,
    device: str = "auto",
    weights: bool = False,
    hf_class: str = "AutoModel",
    quiet: bool = True,
    progress: Any = None,
    note: Optional[Callable[[str], None]] = None,
    training_step: bool = True,
    finetune: str | None = None,
) -> tuple[dict, str]:
    """Load ``target``, make seeded random inputs from ``specs`` and trace one forward pass.

    ``device`` is one of :data:`DEVICES`; ``auto`` (``cpu`` with ``weights``) is
    :func:`_trace_auto`: the model is first built on the meta device, where it costs nothing, and
    traced there (parameter counts, shapes and FLOPs are those of a CPU trace, without a byte of
    weights or activations), or on the CPU when that fails, or when it is small
    (:data:`AUTO_META_BYTES`) and ``training_step`` is off. A module-level model instance is
    traced where its tensors are.
    Every build starts from the random state the import left (seed 0 before the import).
    ``note`` is called with each line worth telling the user (the fallback to the CPU);
    ``training_step`` and ``finetune`` as :func:`~neurarch_trace.tracer.trace_model`'s.

    Returns ``(graph, model_name)``. Raises the errors of :func:`open_target`,
    :func:`make_inputs` and :func:`trace_model` (``TargetError``, ``InputSpecError``,
    ``TraceError``); ``ValueError`` for an unknown ``device``.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if progress is not None:
        progress.step("building the model")
    torch.manual_seed(0)
    with dynamo_left_unimported():  # building on meta runs PyTorch's Python kernels
        # the target's module is imported with PyTorch's modules as they are (what it imports at
        # import time is its own); its build and trace run PyTorch's meta kernels without sympy
        opened = open_target(target, weights=weights, hf_class=hf_class, quiet=quiet)
        rng = torch.get_rng_state()
        description = f"Traced by neurarch-trace from {target} with {describe_inputs(specs, default_dtype)}."
        settings = dict(default_dtype=default_dtype, name=name or opened.name, depth=depth,
                        description=description, progress=progress, training_step=training_step,
                        finetune=finetune)
        if device == "auto" and weights:
            device = "cpu"
        with sympy_left_unimported():
            if device == "auto":
                graph = _trace_auto(opened, specs, rng, settings, note)
            else:
                graph = _trace_on(opened, device, specs, rng, settings)
        if graph.get("measured", {}).get("device") == "meta" and USE_CACHE_NOTE in opened.notes:
            training = graph["measured"].get("training")
            if isinstance(training, dict) and "kvCacheBytesPerSample" in training:
                training["useCache"] = False  # the model as configured returns no cache: the plan drops it
            for line in opened.notes if note is not None else ():
                note(line)
        return graph, opened.name


#: ``auto`` traces a model whose parameters and buffers take at most this many bytes (16M float32
#: parameters) on the CPU when no training step is rehearsed. Measured here (2-core AMD EPYC, cold
#: starts without the step): when a meta trace still imported sympy (0.25 s), ResNet-18 (47 MB) took
#: 1.32 s on the CPU against 1.50 s on meta, ResNet-50 (102 MB) 1.50 s against 1.53 s; since
#: ``lazy_sympy``, ResNet-18 takes 1.76 s against 1.73 s (medians of 9, 2026-12-04): level, so the
#: rule stays. On a machine whose cores are busy the CPU forward's threads wait for them (3.2-3.9 s
#: against 2.4 s on meta, at load 2), so bigger models stay on meta. The rehearsed step runs on meta;
#: with it, every model is traced on meta first, and a small one is not built a second time with
#: its weights initialised (0.2 s of a ResNet-50 cold start).
AUTO_META_BYTES = 64 * 2**20

#: ``auto`` falls back from the meta device to the CPU only when the weights fit in this share of
#: physical memory.
CPU_FALLBACK_FRACTION = 0.5


def _trace_auto(opened: OpenedTarget, specs: Sequence[InputSpec], rng: torch.Tensor, settings: dict,
                note: Optional[Callable[[str], None]]) -> dict:
    """``--device auto``. The model is built on the meta device first and traced there, unless it
    is small (:data:`AUTO_META_BYTES`) and no training step is rehearsed: then it is built again on
    the CPU and traced there. When the meta trace fails (the forward needs real
    values: ``.item()``, a data-dependent shape, a copy to the CPU; or its dtypes are ones only a
    CPU check refuses) a small model is traced on the CPU without a word, and a big one whose
    weights fit in memory (:data:`CPU_FALLBACK_FRACTION`) with one ``note`` saying so. A build that
    fails on meta (an ``__init__`` reading values) is tried on the CPU the same way."""
    torch.set_rng_state(rng)
    if opened.instance:  # a model instance, built when its module was imported: where its tensors are
        model = opened.build("cpu").model
        return trace_module(model, specs, device=_device_of(model) or "cpu", **settings)
    try:
        model = opened.build("meta").model
    except TargetError as exc:
        why = _cause_line(exc)
    else:
        size = sum(t.numel() * t.element_size() for t in (*walk.parameters(model), *walk.buffers(model)))
        small = size <= AUTO_META_BYTES
        if small and not settings["training_step"]:
            del model
            try:
                return _trace_on(opened, "cpu", specs, rng, settings)
            except OutOfMemoryError as exc:  # small weights, big activations: meta allocates nothing
                return _meta_after_oom(opened, specs, rng, settings, note, exc)
        try:
            return trace_module(model, specs, device="meta", **settings)
        except (TraceError, InputSpecError) as exc:
            memory = _physical_memory()
            if not small and memory is not None and size > CPU_FALLBACK_FRACTION * memory:
                raise _too_big_for_the_cpu(exc, size, memory) from exc.__cause__
            why = _cause_line(exc)
        del model
        if small:  # what a small model gets anyway without the step: its CPU trace, or the CPU's error
            return _retrace(opened, "cpu", specs, rng, settings, None, "")
    try:
        return _retrace(opened, "cpu", specs, rng, settings, note,
                        f"the meta device could not run this model ({why}); built and traced it on the CPU")
    except TargetError as exc:  # the meta device cannot build it, and the CPU cannot hold it
        if exc.__cause__ is None or not is_out_of_memory(exc.__cause__):
            raise
        raise TargetError(f"the meta device could not build this model ({why}), and building it on the CPU ran "
                          f"out of memory ({_cause_line(exc)}): it reads values of weights too big for this "
                          "machine's memory") from exc.__cause__


def _too_big_for_the_cpu(exc: Exception, size: int, memory: int) -> Exception:
    """The meta device's error for a model whose weights are too big for a CPU trace, without its
    advice to trace on the CPU."""
    text = str(exc)
    advice = ": trace on the CPU instead (--device cpu)"
    if not text.endswith(advice):
        return exc
    return type(exc)(f"{text[: -len(advice)]}; a CPU trace, which has the values, needs its weights in memory: "
                     f"{gb(size)}, more than half of this machine's {gb(memory)}")


def _meta_after_oom(opened: OpenedTarget, specs: Sequence[InputSpec], rng: torch.Tensor, settings: dict,
                    note: Optional[Callable[[str], None]], exc: OutOfMemoryError) -> dict:
    """The CPU trace ran out of memory: the same on the meta device, with one ``note``; the CPU's
    error stands when meta cannot run the model either."""
    message = (f"the CPU ran out of memory tracing this model ({_cause_line(exc)}); built and traced it on the "
               "meta device")
    try:
        return _retrace(opened, "meta", specs, rng, settings, note, message)
    except (TraceError, InputSpecError, TargetError):
        raise exc from None


def _retrace(opened: OpenedTarget, device: str, specs: Sequence[InputSpec], rng: torch.Tensor, settings: dict,
             note: Optional[Callable[[str], None]], message: str) -> dict:
    """Build and trace on ``device`` after the first device failed; ``note`` the ``message`` once it worked."""
    if settings["progress"] is not None:
        settings["progress"].step(f"building the model on the {'CPU' if device == 'cpu' else 'meta device'}")
    graph = _trace_on(opened, device, specs, rng, settings)
    if note is not None:
        note(message)
    return graph


def _cause_line(exc: BaseException) -> str:
    """The one-line form of what ``exc`` wraps (the model's own error), else of ``exc``."""
    return error_line(exc.__cause__ if exc.__cause__ is not None else exc)


def _trace_on(opened: OpenedTarget, device: str, specs: Sequence[InputSpec], rng: torch.Tensor,
              settings: dict) -> dict:
    torch.set_rng_state(rng)
    return trace_module(opened.build(device).model, specs, device=device, **settings)


def _physical_memory() -> Optional[int]:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _device_of(model: nn.Module) -> Optional[str]:
    """The device type of the model's first parameter (else buffer); None for a model without."""
    for t in walk.parameters(model):
        return t.device.type
    for t in walk.buffers(model):
        return t.device.type
    return None


def trace_module(
    model: nn.Module,
    specs: Sequence[InputSpec],
    *,
    default_dtype: torch.dtype = torch.float32,
    name: str | None = None,
    depth: int | None = None,
    device: str = "cpu",
    description: str | None = None,
    progress: Any = None,
    training_step: bool = True,
    finetune: str | None = None,
) -> dict:
    """Trace an already-built ``model`` on random inputs made from ``specs`` (see :mod:`inputs`);
    ``training_step`` and ``finetune`` as :func:`~neurarch_trace.tracer.trace_model`'s."""
    args, kwargs = make_inputs(list(specs), model, default_dtype=default_dtype, device=device)
    if progress is not None:
        progress.step("tracing")
    return trace_model(
        model, args, kwargs=kwargs, name=name, depth=depth, description=description, progress=progress,
        training_step=training_step, finetune=finetune,
    )
