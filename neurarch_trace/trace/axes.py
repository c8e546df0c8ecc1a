"""How torch functions move the batch axis: the rules :mod:`.batch` follows the data flow with.

Every tensor of the trace has a *batch state*:

* an axis ``>= 0``: the axis that descends from the inputs' batch axis;
* :data:`NO_BATCH`: no axis carries the batch (a parameter, a position table from
  ``torch.arange``, a result reduced or contracted over the batch);
* :data:`SAMPLE`: one item of the batch (``x[i]``, a tensor of a list of samples): it has no batch
  axis, its shape is already a sample's;
* :class:`Merged` ``(axis, extent)``: the batch is the outermost factor of ``axis`` (a reshape
  of ``(B, H, T, d)`` to ``(B*H, T, d)``, of ``(B, T, E)`` to ``(B*T, E)``, Swin's windows): the
  batchless shape divides that axis by the extent (``[H, T, d]``, ``[T, E]``);
* :data:`UNKNOWN`: the batch axis could not be followed (samples picked by a tensor index, an axis
  split inside the batch, a function whose result no rule or probe explains).

:func:`follow` gives the state of each output of one torch function from its operands' states and
shapes. The rules are the functions' own semantics, never a size match: a transpose swaps, a
permute permutes, a view keeps the axis whose size and offset (the product of the sizes before it)
survive, an index keeps, drops or moves it, a reduction over it removes it, a matmul keeps it on
the rows (``x @ W``) or the columns (``W @ x.T``) and contracts it otherwise, ``einsum`` follows its
letter, ``cat``/``stack`` keep or insert it. Any other function is treated as broadcasting
(outputs aligned to their operands from the last axis), which is what elementwise functions,
activations, normalisations, dropout, ``where``, ``masked_fill``, ``softmax``, ``cumsum``, ``pad``
and ``interpolate`` do: an axis keeps the batch when its size is the operand's batch size at the
aligned position; when no operand's batch axis survives that way, PyTorch's own function is run
again on shape-only (meta) copies with the batch axis resized (:func:`probe`), and an output axis
that follows the resize is the batch.

What a rule reads of a call is its function, its arguments' values (Python numbers, strings,
sizes, dims), its tensors' shapes, dtypes and states, its outputs' shapes and the batch size: never
a floating-point tensor's values, strides or identity. :func:`call_key` makes that a key, so that a
block repeated through a model (twelve identical transformer layers) is followed once.

One rule reads sizes: a tensor without a batch given explicit sizes (``cls_token.expand(x.shape[0],
-1, -1)``, ``x.new_zeros(x.shape[0], 8)``, ``torch.zeros(b, 8)``) comes from Python ints the trace
does not follow; the one axis given the batch size is taken as the batch (the idiom these calls
are), two or more such axes are UNKNOWN, none is NO_BATCH.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

import torch

__all__ = ["NO_BATCH", "SAMPLE", "UNKNOWN", "Call", "Merged", "call_key", "combine", "follow", "has_rule",
           "known", "sized_state", "SIZED_FACTORIES"]

NO_BATCH = -1
SAMPLE = -2
UNKNOWN = None


class Merged(NamedTuple):
    """The batch is the outermost factor of ``axis``; ``extent`` is the batch's share of its size."""

    axis: int
    extent: int


State = Union[None, int, Merged]

#: Tensor-less functions that make a tensor of given sizes (``torch.zeros(x.shape[0], 8)``): where
#: one of those sizes equals the batch size the batch axis cannot be told from the data flow.
SIZED_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "empty_strided"})


def known(state: State) -> bool:
    """The state names an axis (plain or merged)."""
    return isinstance(state, Merged) or (state is not None and state >= 0)


class Call:
    """One torch function call: ``name``, ``args``, ``kwargs``, ``state_of(tensor)``, and the
    trace's batch size ``batch`` (for the rule on Python sizes only)."""

    __slots__ = ("name", "args", "kwargs", "state_of", "batch", "_pairs")

    def __init__(self, name: str, args: tuple, kwargs: dict, state_of: Callable[[torch.Tensor], State],
                 batch: int) -> None:
        self.name, self.args, self.kwargs, self.state_of, self.batch = name, args, kwargs, state_of, batch
        self._pairs: Optional[List[tuple]] = None

    def arg(self, index: int, key: str, default: Any = None) -> Any:
        """Positional argument ``index`` or keyword ``key``."""
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(key, default)

    def tensor_states(self) -> List[tuple]:
        """``(tensor, state)`` of every tensor argument, nested lists included, in order (read once)."""
        if self._pairs is not None:
            return self._pairs
        out = []
        state_of = self.state_of
        for values in (self.args, self.kwargs.values()) if self.kwargs else (self.args,):
            for value in values:
                if isinstance(value, torch.Tensor):
                    out.append((value, state_of(value)))
                elif isinstance(value, (list, tuple)):
                    for item in value:
                        if isinstance(item, torch.Tensor):
                            out.append((item, state_of(item)))
        self._pairs = out
        return out


def combine(states: Sequence[State]) -> State:
    """One state from several candidates: agreeing axes give that axis; axes that disagree, or an
    unknown operand where no axis is left, give UNKNOWN; otherwise SAMPLE over NO_BATCH."""
    axes = {s for s in states if known(s)}
    if len(axes) == 1:
        return axes.pop()
    if axes or any(s is UNKNOWN for s in states):
        return UNKNOWN
    return SAMPLE if SAMPLE in states else NO_BATCH


def _dim(d: Any, ndim: int) -> Optional[int]:
    if isinstance(d, torch.Tensor) and d.dim() == 0:
        d = int(d)
    if not isinstance(d, int) or isinstance(d, bool):
        return None
    return d + ndim if d < 0 else d


def _aligned(t: torch.Tensor, state: State, out: torch.Tensor) -> State:
    """Broadcasting: the operand's batch axis at the same place counted from the last axis, if
    its size is kept there."""
    if not known(state):
        return state
    p = state + out.dim() - t.dim()
    if 0 <= p < out.dim() and out.shape[p] == t.shape[state]:
        return p
    return UNKNOWN


def _front(t: torch.Tensor, state: State, out: torch.Tensor) -> State:
    """The output grows or shrinks at the end (``embedding``, ``one_hot``): the same axis counted
    from the front, if its size is kept."""
    if not known(state):
        return state
    return state if state < out.dim() and out.shape[state] == t.shape[state] else UNKNOWN


def broadcast(call: Call, out: torch.Tensor) -> State:
    """The default rule (see the module docstring)."""
    pairs = call.tensor_states()
    if len(pairs) == 1 and tuple(out.shape) == tuple(pairs[0][0].shape):
        return pairs[0][1]  # the common case: a shape-preserving function of one tensor
    return combine([_aligned(t, s, out) for t, s in pairs])


def _first(call: Call) -> tuple:
    for value in call.args:
        if isinstance(value, torch.Tensor):
            return value, call.state_of(value)
    return None, NO_BATCH


def _permuted(call: Call, out: torch.Tensor, order: Callable[[int], Optional[List[int]]]) -> State:
    """A permutation of the first tensor's axes: ``order(ndim)`` lists, for each output axis, the
    input axis it comes from."""
    x, state = _first(call)
    if x is None or not known(state):
        return state
    perm = order(x.dim())
    if perm is None or sorted(perm) != list(range(x.dim())):
        return UNKNOWN
    return perm.index(state)


def _transpose(call: Call, out: torch.Tensor) -> State:
    def order(n: int) -> Optional[List[int]]:
        a, b = _dim(call.arg(1, "dim0"), n), _dim(call.arg(2, "dim1"), n)
        if a is None or b is None:
            return None
        perm = list(range(n))
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    return _permuted(call, out, order)


def _permute(call: Call, out: torch.Tensor) -> State:
    dims = call.args[1:] if len(call.args) > 2 else call.arg(1, "dims")
    if isinstance(dims, int):
        dims = [dims]
    return _permuted(call, out, lambda n: [_dim(d, n) for d in dims] if dims is not None else None)


def _movedim(call: Call, out: torch.Tensor) -> State:
    def order(n: int) -> Optional[List[int]]:
        src, dst = call.arg(1, "source"), call.arg(2, "destination")
        src = [src] if isinstance(src, int) else list(src)
        dst = [dst] if isinstance(dst, int) else list(dst)
        src, dst = [_dim(d, n) for d in src], [_dim(d, n) for d in dst]
        perm: List[Optional[int]] = [None] * n
        for s, d in zip(src, dst):
            perm[d] = s
        rest = iter(i for i in range(n) if i not in src)
        return [p if p is not None else next(rest) for p in perm]
    return _permuted(call, out, order)


def _property(call: Call, out: torch.Tensor) -> State:
    """``x.T``, ``x.mT``, ``x.H``, ``x.mH`` and shape-keeping ones (``x.real``, ``x.data``)."""
    x, state = _first(call)
    if x is None or not known(state):
        return state
    n = x.dim()
    if call.name in ("T", "H"):
        return n - 1 - state
    if call.name in ("mT", "mH") and n >= 2:
        return {n - 1: n - 2, n - 2: n - 1}.get(state, state)
    return broadcast(call, out)


def _reshaped(x: torch.Tensor, state: State, out: torch.Tensor) -> State:
    """A view of ``x`` as ``out.shape``. The batch occupies the outermost ``extent`` of its axis at
    an offset (the product of the sizes before it): the output axis at the same offset with that
    size carries it (a run of size-1 axes keeps its order); one at that offset whose size is a
    multiple carries it merged with what follows; anything else (the batch split) is UNKNOWN."""
    shape, new = x.shape, out.shape
    axis, extent = (state.axis, state.extent) if isinstance(state, Merged) else (state, shape[state])
    before = _prefix_products(shape, axis)  # before[j]: the product of the sizes before axis j
    offset = before[axis]
    rank = sum(1 for j in range(axis) if before[j] == offset)  # size-1 axes just before
    new_before = _prefix_products(new, len(new) - 1)
    at = [q for q in range(len(new)) if new_before[q] == offset]
    plain = [q for q in at if new[q] == extent]
    if plain:
        return plain[min(rank, len(plain) - 1)]
    merged = [q for q in at if new[q] % extent == 0 and new[q] > extent]
    return Merged(merged[0], extent) if merged else UNKNOWN


def _prefix_products(sizes: Sequence[int], last: int) -> List[int]:
    """``[prod(sizes[:0]), prod(sizes[:1]), ..., prod(sizes[:last])]`` (``last`` < ``len(sizes)``),
    in one pass."""
    out, p = [], 1
    for size in sizes[: last + 1]:
        out.append(p)
        p *= size
    return out


def _view(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state):
        return state
    return _reshaped(x, state, out)


def _squeeze(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state):
        return state
    dims = call.arg(1, "dim")
    n = x.dim()
    if dims is None:
        dropped = [i for i in range(n) if x.shape[i] == 1]
    else:
        dims = [dims] if not isinstance(dims, (list, tuple)) else dims
        dropped = [d for d in (_dim(d, n) for d in dims) if d is not None and x.shape[d] == 1]
    if state in dropped:
        return SAMPLE  # a batch of one squeezed away: one sample
    return state - sum(1 for d in dropped if d < state)


def _unsqueeze(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state):
        return state
    d = _dim(call.arg(1, "dim"), out.dim())
    return UNKNOWN if d is None else state + (1 if d <= state else 0)


def _reduction(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    second = call.arg(1, "dim")
    if isinstance(second, torch.Tensor):  # torch.max(a, b): elementwise
        return broadcast(call, out)
    if x is None or not known(state):
        return state
    dims = call.arg(2, "dim") if call.name == "norm" else call.arg(1, "dim", call.kwargs.get("axis"))
    n = x.dim()
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return NO_BATCH  # over every axis
    dims = [dims] if not isinstance(dims, (list, tuple)) else dims
    reduced = {_dim(d, n) for d in dims}
    if None in reduced:
        return UNKNOWN
    if state in reduced:
        return NO_BATCH  # reduced over the batch: no sample's value any more
    keep = out.dim() == n
    return state if keep else state - sum(1 for d in reduced if d < state)


def _split(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state) or out.dim() != x.dim():
        return state if x is None or not known(state) else UNKNOWN
    return state  # along the batch or not, each piece keeps its axes


def _unbind(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state):
        return state
    d = _dim(call.arg(1, "dim", 0), x.dim())
    if d is None:
        return UNKNOWN
    return SAMPLE if d == state else state - (1 if d < state else 0)


def _operands(call: Call) -> List[tuple]:
    first = call.args[0] if call.args else call.kwargs.get("tensors", ())
    items = first if isinstance(first, (list, tuple)) else [first]
    return [(t, call.state_of(t)) for t in items if isinstance(t, torch.Tensor)]


def _cat(call: Call, out: torch.Tensor) -> State:
    pairs = _operands(call)
    states = [s for t, s in pairs if t.dim() == out.dim()]  # torch.cat skips empty 1-d tensors
    return combine(states)


def _stack(call: Call, out: torch.Tensor) -> State:
    pairs = _operands(call)
    d = _dim(call.arg(1, "dim", 0), out.dim())
    if d is None:
        return UNKNOWN
    states = [s for _, s in pairs]
    if states and all(s == SAMPLE for s in states):
        return d  # samples stacked: the batch is made here
    return combine([s + (1 if known(s) and d <= s else 0) if known(s) else s for s in states])


def _matmul_side(state: State, ndim: int, other: int, n: int, left: bool) -> State:
    """Where ``state`` of one matmul operand goes in an ``n``-dim result (``other``: the other
    operand's ndim); NO_BATCH when the batch is contracted."""
    if not known(state):
        return state
    if ndim == 1:
        return NO_BATCH
    row, col = ndim - 2, ndim - 1
    if (left and state == col) or (not left and state == row):
        return NO_BATCH  # contracted over the batch
    if left and state == row:
        return n - 1 if other == 1 else n - 2
    if not left and state == col:
        return n - 1
    return state + n - ndim if other >= 2 else state  # a leading (broadcast) axis


def _matmul_pair(a: torch.Tensor, sa: State, b: torch.Tensor, sb: State, out: torch.Tensor) -> State:
    n = out.dim()
    left = _matmul_side(sa, a.dim(), b.dim(), n, True)
    right = _matmul_side(sb, b.dim(), a.dim(), n, False)
    result = combine([left, right])
    if known(result):
        size = a.shape[sa] if known(sa) and left == result else b.shape[sb]
        if out.shape[result] != size:
            return UNKNOWN  # a batch of one broadcast against a real axis
    return result


_MATMUL_KEYS = ("input", "self", "other", "mat1", "mat2", "batch1", "batch2", "mat", "vec", "vec1", "vec2", "tensor")


def _matmul(call: Call, out: torch.Tensor) -> State:
    given = list(call.args) + [call.kwargs[k] for k in _MATMUL_KEYS if k in call.kwargs]
    pairs = [(t, call.state_of(t)) for t in given if isinstance(t, torch.Tensor)]
    if call.name in ("addmm", "baddbmm", "addbmm", "addmv", "addr") and len(pairs) == 3:
        pairs = pairs[1:]  # the added term broadcasts; the product decides
    if call.name == "__rmatmul__" and len(pairs) == 2:
        pairs = pairs[::-1]
    if len(pairs) != 2:
        return broadcast(call, out)
    (a, sa), (b, sb) = pairs
    if call.name in ("outer", "ger", "addr"):
        return combine([sa if known(sa) else sa, (sb + 1) if known(sb) else sb])
    if call.name == "addbmm":
        return NO_BATCH if known(sa) and sa == 0 else _matmul_pair(a, sa, b, sb, out)
    return _matmul_pair(a, sa, b, sb, out)


def _linear(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    if x is None or not known(state):
        return state
    return NO_BATCH if state == x.dim() - 1 else _aligned(x, state, out)


def _sdpa(call: Call, out: torch.Tensor) -> State:
    q, k, v = (call.arg(i, key) for i, key in enumerate(("query", "key", "value")))
    cands = []
    for t in (q, k, v):
        if isinstance(t, torch.Tensor):
            s = call.state_of(t)
            if known(s) and s >= t.dim() - 2 and t is not q:
                cands.append(NO_BATCH)  # keys or values over the batch: contracted
            elif known(s) and s == t.dim() - 1:
                cands.append(UNKNOWN)
            else:
                cands.append(_aligned(t, s, out) if known(s) else s)
    return combine(cands)


def _einsum(call: Call, out: torch.Tensor) -> State:
    equation = call.args[0] if call.args else None
    ops = list(call.args[1:])
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    if not isinstance(equation, str) or not all(isinstance(t, torch.Tensor) for t in ops):
        return broadcast(call, out)
    terms = _einsum_terms(equation.replace(" ", ""), [t.dim() for t in ops])
    if terms is None:
        return UNKNOWN
    inputs, output = terms
    cands = []
    for t, letters in zip(ops, inputs):
        s = call.state_of(t)
        if not known(s):
            cands.append(s)
            continue
        letter = letters[s]
        cands.append(output.index(letter) if letter in output else NO_BATCH)
    return combine(cands)


def _einsum_terms(eq: str, ndims: List[int]) -> Optional[tuple]:
    """Each operand's letters and the output's, with ``...`` spelled out as numbered dims
    (right-aligned across operands, as broadcasting does)."""
    lhs, arrow, rhs = eq.partition("->")
    parts = lhs.split(",")
    if len(parts) != len(ndims):
        return None
    width = 0
    inputs: List[List[str]] = []
    for part, n in zip(parts, ndims):
        if "..." in part:
            head, tail = part.split("...")
            k = n - len(head) - len(tail)
            width = max(width, k)
            inputs.append(list(head) + [f"<{i}>" for i in range(width - k, width)] + list(tail))
        else:
            inputs.append(list(part))
    # re-number ellipsis dims right-aligned to the widest
    for letters, part, n in zip(inputs, parts, ndims):
        if "..." in part:
            head, tail = part.split("...")
            k = n - len(head) - len(tail)
            letters[len(head):len(head) + k] = [f"<{i}>" for i in range(width - k, width)]
    if any(len(letters) != n for letters, n in zip(inputs, ndims)):
        return None
    ell = [f"<{i}>" for i in range(width)]
    if arrow:
        head, _, tail = rhs.partition("...")
        output = list(head) + (ell if "..." in rhs else []) + list(tail)
    else:
        counts: Dict[str, int] = {}
        for letters in inputs:
            for ch in letters:
                counts[ch] = counts.get(ch, 0) + 1
        output = ell + sorted(ch for ch, c in counts.items() if c == 1 and not ch.startswith("<"))
    return inputs, output


def _front_rule(call: Call, out: torch.Tensor) -> State:
    x, state = _first(call)
    return NO_BATCH if x is None else _front(x, state, out)


def sized_state(sizes: Sequence[Optional[int]], batch: int, otherwise: State = NO_BATCH) -> State:
    """The state of a tensor given explicit ``sizes`` (None: kept from the source), from a source
    without a batch (see the module docstring)."""
    hits = [q for q, size in enumerate(sizes) if size == batch]
    if len(hits) == 1:
        return hits[0]
    return UNKNOWN if hits else otherwise


def _size_args(call: Call) -> Optional[List[Any]]:
    rest = list(call.args[1:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple, torch.Size)):
        rest = list(rest[0])
    if not rest:
        rest = call.kwargs.get("size") or call.kwargs.get("sizes") or call.kwargs.get("shape") or []
        rest = list(rest) if isinstance(rest, (list, tuple, torch.Size)) else []
    return rest if all(isinstance(v, int) for v in rest) else None


def _sized(call: Call, out: torch.Tensor) -> State:
    """``expand``/``broadcast_to``/``repeat``/``new_zeros``...: sizes from Python ints. A batched
    source keeps its axis where broadcasting keeps it; a source without one gets
    :func:`sized_state` of the sizes it was given."""
    x, state = _first(call)
    fresh = call.name.startswith("new_")
    if x is None:
        return NO_BATCH
    if known(state) and not fresh:
        return _aligned(x, state, out) if call.name not in ("repeat", "tile") else broadcast(call, out)
    if state is UNKNOWN or state == SAMPLE:
        return state
    sizes = _size_args(call)
    if sizes is None or len(sizes) != out.dim():
        return UNKNOWN if call.batch in out.shape else NO_BATCH
    if call.name in ("repeat", "tile"):  # an axis repeated to the batch size
        offset = out.dim() - x.dim()
        sizes = [out.shape[q] if sizes[q] != 1 or q < offset else None for q in range(out.dim())]
    elif not fresh:
        sizes = [None if size == -1 else size for size in sizes]
    return sized_state(sizes, call.batch)


def _index(call: Call, out: torch.Tensor) -> State:
    """``x[index]`` with ints, slices, ``None`` and ``...``: a slice keeps the batch axis (moved by
    the axes dropped or added before it), an int on it leaves one sample. Tensor (advanced)
    indices are left to :func:`probe`."""
    x, state = _first(call)
    if x is None or not known(state):
        return state
    idx = call.args[1] if len(call.args) > 1 else None
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if not all(i is None or i is Ellipsis or isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool))
               for i in items) or items.count(Ellipsis) > 1:
        return UNKNOWN
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items = items[:at] + [slice(None)] * (x.dim() - used) + items[at + 1:]
    dim = pos = 0
    for item in items:
        if item is None:
            pos += 1
            continue
        if dim == state:
            return SAMPLE if isinstance(item, int) else pos
        pos += 0 if isinstance(item, int) else 1
        dim += 1
    return pos + (state - dim)  # past the index: the remaining axes follow in order


def _to_meta(value: Any, resize: Callable[[torch.Tensor], tuple]) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(resize(value), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_to_meta(v, resize) for v in value) if not hasattr(value, "_fields") else value
    return value


def probe(call: Call, func: Callable, outs: Sequence[torch.Tensor]) -> List[State]:
    """Run ``func`` twice on shape-only (meta) copies of its tensors, every batched one with its
    batch axis resized (two sizes no axis has): an output axis whose size follows is the batch;
    none or several, UNKNOWN. For functions no rule reads; a function that fails on meta tensors
    (a data-dependent shape) gives UNKNOWN."""
    sizes = [int(d) for t, _ in call.tensor_states() for d in t.shape]
    first = max(sizes + [call.batch]) + 3
    runs = []
    for size in (first, first + 4):
        def resize(t: torch.Tensor, size: int = size) -> tuple:
            state = call.state_of(t)
            shape = [int(d) for d in t.shape]
            if known(state) and state < len(shape):
                shape[state] = size
            return tuple(shape)
        try:
            result = func(*(_to_meta(a, resize) for a in call.args),
                          **{k: _to_meta(v, resize) for k, v in call.kwargs.items()})
        except Exception:  # noqa: BLE001 - any failure on meta: the batch cannot be followed
            return [UNKNOWN] * len(outs)
        result = result if isinstance(result, (list, tuple)) else (result,)
        runs.append([r for r in result if isinstance(r, torch.Tensor)])
    states: List[State] = []
    for i, out in enumerate(outs):
        a = runs[0][i] if i < len(runs[0]) else None
        b = runs[1][i] if i < len(runs[1]) else None
        if a is None or b is None or a.dim() != out.dim() or b.dim() != out.dim():
            states.append(UNKNOWN)
            continue
        moved = [q for q in range(out.dim()) if a.shape[q] != b.shape[q]]
        states.append(moved[0] if len(moved) == 1 else UNKNOWN)
    return states


_RULES: Dict[str, Callable[[Call, torch.Tensor], State]] = {
    **dict.fromkeys(("transpose", "transpose_", "swapaxes", "swapdims", "swapaxes_", "swapdims_", "t", "t_"),
                    _transpose),
    **dict.fromkeys(("permute",), _permute),
    **dict.fromkeys(("movedim", "moveaxis"), _movedim),
    **dict.fromkeys(("T", "mT", "H", "mH", "real", "imag", "data", "grad"), _property),
    **dict.fromkeys(("view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "ravel"), _view),
    **dict.fromkeys(("squeeze", "squeeze_"), _squeeze),
    **dict.fromkeys(("unsqueeze", "unsqueeze_"), _unsqueeze),
    **dict.fromkeys(("sum", "mean", "nansum", "nanmean", "prod", "amax", "amin", "max", "min", "argmax",
                     "argmin", "std", "var", "std_mean", "var_mean", "logsumexp", "norm", "all", "any",
                     "median", "nanmedian", "mode", "count_nonzero", "aminmax"), _reduction),
    **dict.fromkeys(("split", "chunk", "tensor_split", "split_with_sizes", "hsplit", "vsplit", "dsplit",
                     "unsafe_split", "unsafe_chunk"), _split),
    **dict.fromkeys(("unbind",), _unbind),
    **dict.fromkeys(("cat", "concat", "concatenate"), _cat),
    **dict.fromkeys(("stack",), _stack),
    **dict.fromkeys(("matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm", "mv",
                     "addmv", "outer", "ger", "addr", "dot", "vdot", "inner"), _matmul),
    **dict.fromkeys(("linear", "bilinear"), _linear),
    **dict.fromkeys(("scaled_dot_product_attention",), _sdpa),
    **dict.fromkeys(("einsum",), _einsum),
    **dict.fromkeys(("embedding", "one_hot", "embedding_bag"), _front_rule),
    **dict.fromkeys(("expand", "broadcast_to", "repeat", "tile", "new_zeros", "new_ones", "new_empty",
                     "new_full", "new_tensor"), _sized),
    **dict.fromkeys(("__getitem__",), _index),
}


def has_rule(name: str) -> bool:
    """Whether a rule of its own follows function ``name`` (else :func:`broadcast` does)."""
    return name in _RULES


class _Uncached(Exception):
    """An argument :func:`call_key` cannot key (a value no rule is known to read exactly)."""


#: Argument types keyed by value; ``bool`` and ``float`` keep their type in the key (``True == 1``).
_BY_VALUE = frozenset({int, str, type(None)})
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_TYPED = frozenset({bool, float, type(Ellipsis), torch.dtype, torch.device, torch.memory_format, torch.layout})


def _key(value: Any, state_of: Callable[[torch.Tensor], State]) -> Any:
    cls = type(value)
    if cls in _BY_VALUE:
        return value
    if isinstance(value, torch.Tensor):
        # an integer or 0-d tensor may be read as a value (an index, a dim); a subclass may be anything
        if cls not in _PLAIN_TENSORS:
            raise _Uncached
        shape, dtype = tuple(value.shape), value.dtype
        if not shape or not dtype.is_floating_point:
            raise _Uncached
        return (torch.Tensor, shape, dtype, state_of(value))
    if cls in _TYPED:
        return (cls, value)
    if cls is tuple or cls is list or cls is torch.Size:
        for v in value:
            if type(v) is not int:
                return (cls, tuple([_key(v, state_of) for v in value]))
        return (cls, tuple(value))  # Python ints (a view's shape, a permutation): keyed by value
    if cls is slice:
        return (slice, _key(value.start, state_of), _key(value.stop, state_of), _key(value.step, state_of))
    raise _Uncached


def call_key(func: Callable, name: str, args: tuple, kwargs: dict, outs: Sequence[torch.Tensor],
             state_of: Callable[[torch.Tensor], State], batch: int) -> Optional[tuple]:
    """A hashable key of everything :func:`follow` reads of this call (see the module docstring),
    or None when an argument is not keyed: an integer, boolean or 0-d tensor (whose values an
    index or a dim may be read from), a tensor subclass, or any value of another type than Python
    numbers, strings, ``None``, ``...``, slices, tuples, lists, sizes, dtypes, devices, layouts and
    memory formats. Calls with equal keys get equal states."""
    try:
        keyed = [a if type(a) is int else _key(a, state_of) for a in args]
        if kwargs:
            keyed.append(tuple([(k, _key(v, state_of)) for k, v in kwargs.items()]))
        return (func, name, batch, tuple(keyed), tuple([tuple(o.shape) for o in outs]))
    except _Uncached:
        return None
    except TypeError:  # pragma: no cover - an unhashable value inside a keyed one
        return None


def follow(call: Call, func: Callable, outs: Sequence[torch.Tensor]) -> List[State]:
    """The batch state of each output tensor of ``call`` (see the module docstring); ``func`` is
    the function called, run again on meta tensors (:func:`probe`) when the default rule or an
    advanced index loses a batched operand's axis. The rules see a merged axis as its axis; the
    extent is put back on the result (views read it themselves)."""
    rule = _RULES.get(call.name, broadcast)
    pairs = call.tensor_states()
    extents = set()
    plain_in = False
    for _, s in pairs:
        if type(s) is int:
            plain_in = plain_in or s >= 0
        elif isinstance(s, Merged):
            extents.add(s.extent)
    if extents and rule is not _view:
        real = call.state_of
        call.state_of = lambda t: _axis(real(t))
        call._pairs = [(t, _axis(st)) for t, st in pairs]
    states = []
    for out in outs:
        try:
            states.append(rule(call, out))
        except (TypeError, ValueError, IndexError, StopIteration, RuntimeError):  # arguments the rule does not read
            states.append(UNKNOWN)
    if (rule is broadcast or rule is _index) and UNKNOWN in states and _probe_allowed(func) and any(
            known(s) for _, s in pairs):
        probed = probe(call, func, outs)
        states = [p if s is UNKNOWN else s for s, p in zip(states, probed)]
    if extents and rule is not _view:
        states = [_remerge(s, out, extents, plain_in) for s, out in zip(states, outs)]
    return states


def _axis(state: State) -> State:
    return state.axis if isinstance(state, Merged) else state


def _remerge(state: State, out: torch.Tensor, extents: set, plain_in: bool) -> State:
    if not known(state) or isinstance(state, Merged):
        return UNKNOWN if state == SAMPLE else state
    if len(extents) != 1 or plain_in:
        return UNKNOWN
    extent = next(iter(extents))
    size = out.shape[state]
    if size == extent:
        return state
    return Merged(state, extent) if size % extent == 0 else UNKNOWN


def _probe_allowed(func: Callable) -> bool:
    """PyTorch's own functions only: a probe runs the function again, and a user's Python function
    (an autograd.Function's ``apply``) may have effects."""
    module = getattr(func, "__module__", None) or ""
    owner = getattr(func, "__objclass__", None) or getattr(getattr(func, "__self__", None), "__class__", None)
    return module.startswith("torch") or (owner is not None and owner.__module__.startswith("torch"))
