"""Follow every storage a rehearsed training step allocates and frees.

:class:`StorageTracker` is a ``TorchDispatchMode``: it sits below autograd, so it sees every aten
operation the step runs, the backward's included (the autograd engine carries the mode stack into
its threads). After each operation it looks at the storages of the outputs. A storage it has not
seen is an allocation: it is recorded with its size (``UntypedStorage.nbytes()``, bytes) and the
kind of memory it is, and a ``weakref`` on the storage's Python object (which PyTorch keeps alive
exactly as long as the storage itself) records the free. A view or an in-place result shares a
storage it already knows, so an in-place ReLU or ``x += residual`` allocates nothing, as on a GPU.

Kinds (:data:`KINDS`): what a storage is, decided when it is allocated (by the phase of the step
and by what made it) and, for gradients, once the backward is done (the engine may hand a
backward op's output to ``param.grad`` without copying). The live bytes of each kind after every
allocation make a curve; :mod:`neurarch_trace.rehearsal.fit` turns the curves of runs at two batch
sizes into the state and per-sample parts of the peak.
"""

from __future__ import annotations

import signal
import threading
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neurarch_trace.rehearsal.metacache import MetaCache

__all__ = ["KINDS", "STATE_KINDS", "SAMPLE_KINDS", "StorageTracker"]

#: Batch-independent kinds (the training state) and what grows with the batch; bytes of both are
#: recorded per kind. ``other`` is what functional code makes once per step whatever the batch
#: (position tables, causal masks); the fit moves any batch-independent part of the per-sample
#: kinds there too.
STATE_KINDS = ("weights16", "masterWeights", "frozenWeights", "gradients", "optimizerMoments",
               "optimizerTemporaries", "buffers", "other")
SAMPLE_KINDS = ("inputs", "activations", "loss", "backward")
KINDS = STATE_KINDS + SAMPLE_KINDS
_INDEX = {kind: i for i, kind in enumerate(KINDS)}
#: The kind of a storage first seen in each phase of the step.
_PHASE_KIND = {"setup": "other", "forward": "activations", "loss": "loss", "backward": "backward",
               "optimizer": "optimizerTemporaries"}
_ADD = torch.ops.aten.add.Tensor
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


class _Record:
    __slots__ = ("nbytes", "kind", "ref", "ignored")

    def __init__(self, nbytes: int, kind: int) -> None:
        self.nbytes = nbytes
        self.kind = kind
        self.ref: weakref.ref | None = None
        self.ignored = False


class StorageTracker(TorchDispatchMode):
    """Records allocations and frees of storages, by kind and phase.

    ``events`` lists ``(record, +1)`` for an allocation and ``(record, -1)`` for a free, in order;
    ``phases`` lists ``(phase, index into events)`` where each phase starts. ``on_op`` (optional) is
    called with ``(func, args, kwargs, out)`` after each operation (FLOP counting). Only storages on
    ``device`` (the device standing in for the GPU) are followed. With a ``cache``
    (:class:`~neurarch_trace.rehearsal.metacache.MetaCache`), repeated meta operations are answered
    from it.

    Like :class:`neurarch_trace.flops.FlopMode`, ``__torch_dispatch__`` is not wrapped in
    ``torch._disable_dynamo`` (``_should_skip_dynamo`` is False): that wrapper imports
    ``torch._dynamo`` on the first operation, about a second of a cold start, and the rehearsal never
    compiles.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self, on_op: Callable[[Any, tuple, dict, Any], None] | None = None, device: str = "meta",
                 cache: MetaCache | None = None, scalars: list | None = None) -> None:
        super().__init__()
        self.device = device
        self._cache = cache
        self._scalars = scalars or []
        self.scalars_read = 0
        self.events: list[tuple[_Record, int]] = []
        self.phases: list[tuple[str, int]] = [("setup", 0)]
        self.phase = "setup"
        self._live: dict[int, _Record] = {}
        self._override: int | None = None
        self._on_op = on_op
        self._closed = False
        self._pending: tuple[_Record, _Record, int, int] | None = None
        self._interrupted = False
        self._old_handler: Any = None
        #: aten operations dispatched since the setup phase ended (the step's forward, loss,
        #: backward and optimizer step; views and casts included): what eager PyTorch's CPU side
        #: pays for, one call at a time, whatever the batch
        self.operators = 0

    # --- phases and kinds ---------------------------------------------------------------------
    def start(self, phase: str) -> None:
        """Storages allocated from now on belong to ``phase`` (``forward``, ``loss``, ...)."""
        self.phase = phase
        self.phases.append((phase, len(self.events)))

    def register(self, t: torch.Tensor, kind: str) -> None:
        """Record ``t``'s storage (made outside the mode: parameters, inputs) as ``kind``; a storage
        already recorded takes the new kind."""
        record = self._see(t, _INDEX[kind])
        if record is not None:
            record.kind = _INDEX[kind]

    def ignore(self, t: torch.Tensor) -> None:
        """Know ``t``'s storage but count it as 0 bytes (stand-ins whose bytes are counted elsewhere)."""
        storage = t.untyped_storage()
        record = self._live.get(id(storage)) or self._new(storage, _INDEX["other"], 0)
        record.ignored = True

    def set_kind(self, t: torch.Tensor, kind: str) -> None:
        """Give ``t``'s storage, if recorded, the kind ``kind`` (for all of its life)."""
        record = self._lookup(t)
        if record is not None:
            record.kind = _INDEX[kind]

    def kind_of(self, t: torch.Tensor) -> str | None:
        """The kind of ``t``'s storage, ``None`` when it is not recorded."""
        record = self._lookup(t)
        return KINDS[record.kind] if record is not None else None

    def close(self) -> None:
        """Stop recording: frees after this point (the caller dropping its tensors) are ignored."""
        self._closed = True

    # --- Ctrl-C -------------------------------------------------------------------------------
    def __enter__(self) -> StorageTracker:
        """Enter the mode; Ctrl-C (SIGINT) is then held until the next operation (see
        :meth:`_interrupt`)."""
        self._interrupted = False
        self._old_handler = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old_handler = signal.signal(signal.SIGINT, self._interrupt)
        super().__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        super().__exit__(exc_type, exc, tb)
        if self._old_handler is not None:
            signal.signal(signal.SIGINT, self._old_handler)
            self._old_handler = None
        if self._interrupted and exc_type is None:
            raise KeyboardInterrupt

    def _interrupt(self, signum: int, frame: Any) -> None:
        """SIGINT while the mode is on: Python's own handler raises ``KeyboardInterrupt`` in whatever
        code runs, which may be a storage's weakref finaliser (``_free``), where the exception is
        printed as "Exception ignored" and the step goes on with a free left out. Held here instead,
        it is raised at the next operation (or when the mode exits), in the step's own frames."""
        self._interrupted = True

    # --- the mode -----------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self._interrupted:
            raise KeyboardInterrupt
        kwargs = kwargs or {}
        if self.phase != "setup":
            self.operators += 1
        if func is _LOCAL_SCALAR and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return self._scalar(args[0])
        out = self._cache.call(func, args, kwargs) if self._cache is not None else func(*args, **kwargs)
        if type(out) is torch.Tensor:
            self._see(out, None)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._see(item, None)
                elif isinstance(item, (tuple, list)):
                    for inner in item:
                        if isinstance(inner, torch.Tensor):
                            self._see(inner, None)
        if func is _ADD and self.phase == "backward" and not kwargs and type(out) is torch.Tensor:
            self._maybe_accumulation(args, out)
        if self._on_op is not None:
            self._on_op(func, args, kwargs, out)
        return out

    def _scalar(self, t: torch.Tensor) -> Any:
        """A tensor value read into Python (``.item()``, ``bool(t)``): the traced forward's value at
        the same position, which the meta device cannot compute."""
        index = self.scalars_read
        self.scalars_read += 1
        if index >= len(self._scalars):
            raise RuntimeError("Tensor.item() cannot be called on meta tensors (the traced forward read fewer values)")
        return self._scalars[index]

    def _maybe_accumulation(self, args: tuple, out: torch.Tensor) -> None:
        """The autograd engine sums two gradients for one tensor in place when it holds the only
        reference to the first (``InputBuffer::accumulate``, ``can_accumulate_inplace``), but never
        while a dispatch mode is active (``isTensorSubclassLike`` is then true for every tensor), so
        here the sum is a new tensor. When the first gradient dies right after the sum, it was that
        only reference: the sum's storage is booked as the first's, as the engine would have reused
        it. (A sum that some formula makes in the backward keeps its operand alive, or frees it later.)"""
        old = args[0] if args else None
        if (type(old) is not torch.Tensor or old.shape != out.shape or old.dtype != out.dtype
                or old.stride() != out.stride() or old.storage_offset() != 0 or not old.is_contiguous()):
            return
        old_record, new_record = self._lookup(old), self._lookup(out)
        if old_record is None or new_record is None or old_record.nbytes != new_record.nbytes:
            return
        self._pending = (new_record, old_record, len(self.events), id(out.untyped_storage()))

    # --- storages -----------------------------------------------------------------------------
    def _lookup(self, t: torch.Tensor) -> _Record | None:
        try:
            return self._live.get(id(t.untyped_storage()))
        except (RuntimeError, NotImplementedError):  # sparse and nested tensors have no one storage
            return None

    def _see(self, t: torch.Tensor, kind: int | None) -> _Record | None:
        if t.device.type != self.device:  # host tensors (AdamW's step counts) are not GPU memory
            return None
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        key = id(storage)
        record = self._live.get(key)
        if record is not None:
            if record.ignored:
                return record
            nbytes = storage.nbytes()
            if nbytes != record.nbytes:  # resized in place (``resize_``, an ``out=`` argument)
                self.events.append((record, -1))
                record.nbytes = nbytes
                self.events.append((record, 1))
            return record
        if kind is None:
            kind = _INDEX[_PHASE_KIND.get(self.phase, "other")]
        return self._new(storage, kind, storage.nbytes())

    def _new(self, storage: torch.UntypedStorage, kind: int, nbytes: int) -> _Record:
        key = id(storage)
        record = _Record(nbytes, kind)
        live, events = self._live, self.events

        def _free(_: weakref.ref, key: int = key) -> None:
            freed = live.pop(key, None)
            if freed is None or self._closed:
                return
            pending = self._pending
            if pending is not None and pending[1] is freed and len(events) == pending[2]:
                # an accumulation the engine would have made in place (_maybe_accumulation)
                events.pop()
                live[pending[3]] = freed
                freed.ref = pending[0].ref  # the sum's weakref reports the sum's free, as the old one's
                self._pending = None
                return
            events.append((freed, -1))

        record.ref = weakref.ref(storage, _free)
        live[key] = record
        events.append((record, 1))
        return record

    # --- results ------------------------------------------------------------------------------
    def curve(self) -> list[tuple[int, ...]]:
        """Live bytes per kind (in :data:`KINDS` order) after every allocation, in order."""
        live = [0] * len(KINDS)
        points: list[tuple[int, ...]] = []
        for record, sign in self.events:
            live[record.kind] += sign * record.nbytes
            if sign > 0:
                points.append(tuple(live))
        return points

    def phase_of_points(self) -> list[str]:
        """The phase of every point of :meth:`curve`."""
        marks = sorted(self.phases, key=lambda mark: mark[1])
        phases: list[str] = []
        mark = 0
        for index, (_, sign) in enumerate(self.events):
            while mark + 1 < len(marks) and marks[mark + 1][1] <= index:
                mark += 1
            if sign > 0:
                phases.append(marks[mark][0])
        return phases
