"""Keep sympy unimported while the tracer runs PyTorch's meta kernels on plain sizes.

sympy is PyTorch's library for symbolic shapes (``torch.compile``, dynamic shapes); importing it
takes 0.3-0.45 s, on this project's development machine (torch 2.13, 2026-12-04) more than the
rest of a ResNet-50 trace on the meta device. Eager PyTorch imports it lazily, and a trace on the
meta device used to import it on its first layer, through two kinds of call:

* PyTorch's Python meta kernels (``torch/_meta_registrations.py``, ``torch._refs``,
  ``torch._prims_common``) and ``torch._check`` import their size predicates from
  ``torch.fx.experimental.symbolic_shapes`` at call time (``expect_true``, ``guard_or_false``,
  ``sym_eq`` and a few more), and that module imports sympy;
* type promotion (``torch._prims_common.elementwise_dtypes``, behind every elementwise Python
  reference) and ``torch.sym_not`` import sympy for one test, ``isinstance(x, sympy.Basic)``.

A trace's sizes are plain ``int`` and its conditions plain ``bool``, for which each of those
predicates is one line of Python, and a process that has not imported sympy holds no sympy object,
so that ``isinstance`` is false for every argument. :func:`sympy_left_unimported` makes use of
both for the duration of a block, when sympy is not imported yet:

* a stand-in for ``torch.fx.experimental.symbolic_shapes`` sits in ``sys.modules`` (and on its
  package). It answers the predicates for plain ``bool``/``int``/``float`` arguments exactly as
  PyTorch's own code does (quoted in each function). For anything else (a ``SymInt``, a
  ``SymBool``, a name it does not define) it imports the real module, puts it in its place and
  hands the call to it, so results are PyTorch's own either way, and a process that meets symbolic
  shapes (``torch.compile``, a ``FakeTensor``) gets the real module;
* ``elementwise_dtypes`` (where ``torch._prims_common`` and ``torch._meta_registrations`` hold
  it) and ``torch.sym_not`` run with a momentary ``sympy`` in ``sys.modules`` for the length of the
  call, whose ``Basic`` is a class of its own: no object is an instance of it, as none is of
  sympy's while sympy is unimported. Any other name imports the real sympy.

On the way out everything is put back as it was, except a real module imported meanwhile, which
stays. A module first imported inside the block (a model file that a build imports lazily) may
have taken a stand-in function at import time (``from torch.fx.experimental.symbolic_shapes import
statically_known_true``): on the way out it is given the real one, the real module being imported
for it then, as it would have been. Once the real module is imported, every stand-in function
hands every call to it. Not thread-safe: another thread importing sympy inside the block would
meet the stand-ins.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import sys
import types
from typing import Any, Iterator

import torch

__all__ = ["sympy_left_unimported", "MODULE"]

#: The module the stand-in stands for.
MODULE = "torch.fx.experimental.symbolic_shapes"
_PARENT, _, _LEAF = MODULE.rpartition(".")

_depth = 0
#: The real module once a stand-in has imported it: from then on every stand-in function hands
#: every call to it, plain values too.
_REAL: Any = None
#: The stand-in module and its functions: id -> (the object, the real name it stands for; None for
#: the module). One stand-in serves every block of the process.
_STANDING: dict = {}
_STAND_IN: Any = None


def _real() -> types.ModuleType:
    """Import the real module in the stand-in's place (and on its parent package); return it. The
    stand-in's own names then point at the real module's, for whoever holds the stand-in."""
    global _REAL
    current = sys.modules.get(MODULE)
    if current is not None and not getattr(current, "_neurarch_stand_in", False):
        _REAL = current
        return current
    sys.modules.pop(MODULE, None)
    parent = sys.modules.get(_PARENT)
    if parent is not None and getattr(getattr(parent, _LEAF, None), "_neurarch_stand_in", False):
        delattr(parent, _LEAF)
    real = importlib.import_module(MODULE)  # binds itself on the parent package as it loads
    _REAL = real
    if current is not None:
        for name, value in list(vars(current).items()):
            if _standing(value) and hasattr(real, name):
                setattr(current, name, getattr(real, name))
    return real


def _guard(name: str):
    """``expect_true``, ``guard_or_false``, ``guard_or_true``, ``statically_known_true``: PyTorch's
    code returns a plain ``bool`` argument as it is (after ``isinstance(a, SymBool)`` is false)."""
    def predicate(a: Any, *rest: Any) -> Any:
        if type(a) is bool and _REAL is None:
            return a
        return getattr(_real(), name)(a, *rest)
    predicate.__name__ = predicate.__qualname__ = name
    return predicate


def is_nested_int(s: Any) -> Any:
    """PyTorch: ``isinstance(s, torch.SymInt) and s.node.is_nested_int()``: false for a plain
    number."""
    if (type(s) is int or type(s) is float or type(s) is bool) and _REAL is None:
        return False
    return _real().is_nested_int(s)


def has_guarding_hint(a: Any) -> Any:
    """PyTorch: ``a.node.has_hint()`` for a symbolic value, else ``True``."""
    if (type(a) is int or type(a) is float or type(a) is bool) and _REAL is None:
        return True
    return _real().has_guarding_hint(a)


def _hint(name: str):
    """``guarding_hint_or_throw``, ``guard_int``: PyTorch returns a plain ``int`` (or ``bool``,
    for the first) as it is."""
    def hint(a: Any, *rest: Any) -> Any:
        if (type(a) is int or (type(a) is bool and name == "guarding_hint_or_throw")) and _REAL is None:
            return a
        return getattr(_real(), name)(a, *rest)
    hint.__name__ = hint.__qualname__ = name
    return hint


def optimization_hint(a: Any, fallback: Any = None) -> Any:
    """PyTorch returns a plain ``int`` as it is."""
    if type(a) is int and _REAL is None:
        return a
    return _real().optimization_hint(a, fallback)


def free_unbacked_symbols(x: Any) -> Any:
    """PyTorch collects the sympy expressions of ``x`` (a strided tensor's sizes, strides and
    storage offset; a number's none) into an ``OrderedSet``: empty when they are plain numbers."""
    plain = x is None or type(x) in (int, float, bool, str) or (
        isinstance(x, torch.Tensor) and x.layout is torch.strided and _plain_ints(x.shape)
        and _plain_ints(x.stride()) and type(x.storage_offset()) is int)
    if plain and _REAL is None:
        from torch.utils._ordered_set import OrderedSet
        return OrderedSet()
    return _real().free_unbacked_symbols(x)


def _deferred(name: str):
    """A name that meta kernels import beside the predicates but call seldom (or only on symbolic
    values): the real module's function, imported when first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_real(), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


#: Functions a meta kernel imports in one ``from ... import`` with the predicates, whose plain-value
#: answer needs sympy or warns (``guard_size_oblivious`` is deprecated).
DEFERRED = ("guard_size_oblivious", "has_free_symbols", "free_symbols",
            "_constrain_range_for_size", "constrain_range", "_advise_is_size", "_advise_is_bounded")


def _plain_ints(x: Any) -> bool:
    return all(type(v) is int for v in x)


def sym_eq(x: Any, y: Any) -> Any:
    """PyTorch: on two sequences, ``False`` when their lengths differ, else ``True & (x0 == y0) &
    ...``; on two ints, ``x == y``. Plain ints give a plain ``bool`` either way."""
    if _REAL is None:
        if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)) and _plain_ints(x) and _plain_ints(y):
            return len(x) == len(y) and all(a == b for a, b in zip(x, y))
        if type(x) is int and type(y) is int:
            return x == y
    return _real().sym_eq(x, y)


def _join(name: str, op: Any):
    """``sym_and``, ``sym_or``: PyTorch returns ``x`` alone as it is, else folds ``operator.and_``
    (``or_``) over the arguments, which for plain bools is a plain bool."""
    def join(x: Any, *others: Any) -> Any:
        if not others and _REAL is None:
            return x
        if _REAL is None and type(x) is bool and all(type(y) is bool for y in others):
            for y in others:
                x = op(x, y)
            return x
        return getattr(_real(), name)(x, *others)
    join.__name__ = join.__qualname__ = name
    return join


def _stand_in() -> types.ModuleType:
    """The stand-in module (made once per process)."""
    global _STAND_IN
    if _STAND_IN is None:
        _STAND_IN = _new_stand_in()
    return _STAND_IN


def _new_stand_in() -> types.ModuleType:
    module = types.ModuleType(MODULE, "Stands in for PyTorch's module while neurarch-trace traces "
                                      "(neurarch_trace.lazy_sympy).")
    module._neurarch_stand_in = True
    for name in ("expect_true", "guard_or_false", "guard_or_true", "statically_known_true"):
        setattr(module, name, _guard(name))
    module.is_nested_int = is_nested_int
    module.has_guarding_hint = has_guarding_hint
    for name in ("guarding_hint_or_throw", "guard_int"):
        setattr(module, name, _hint(name))
    module.optimization_hint = optimization_hint
    module.free_unbacked_symbols = free_unbacked_symbols
    for name in DEFERRED:
        setattr(module, name, _deferred(name))
    module.sym_eq = sym_eq
    module.sym_and = _join("sym_and", operator.and_)
    module.sym_or = _join("sym_or", operator.or_)
    module.__getattr__ = _other_name  # PEP 562: every other name
    for name, value in list(vars(module).items()):
        if callable(value) and not name.startswith("__"):
            _STANDING[id(value)] = (value, name)
    _STANDING[id(module)] = (module, None)
    return module


def _standing(value: Any) -> bool:
    """Whether ``value`` is a stand-in module or one of its functions."""
    entry = _STANDING.get(id(value))
    return entry is not None and entry[0] is value


def _take_back(before: set) -> None:
    """Give every module imported during the block (and each class it defines) the real objects
    for the stand-ins it took at import time (``from torch.fx.experimental.symbolic_shapes import
    statically_known_true``): the real module is imported then, and only then."""
    for key in [k for k in list(sys.modules) if k not in before]:
        module = sys.modules.get(key)
        if _standing(module):
            continue
        try:
            namespaces = [module, *(v for v in vars(module).values()
                                    if isinstance(v, type) and v.__module__ == key)]
        except TypeError:  # no __dict__
            continue
        for namespace in namespaces:
            for attr, value in list(vars(namespace).items()):
                wrapper = type(value) if isinstance(value, (staticmethod, classmethod)) else None
                inner = value.__func__ if wrapper else value
                if not _standing(inner):
                    continue
                real = _real()
                name = _STANDING[id(inner)][1]
                replacement = real if name is None else getattr(real, name)
                setattr(namespace, attr, wrapper(replacement) if wrapper else replacement)


def _other_name(name: str) -> Any:
    """A name the stand-in does not define: the real module's. The import system's own questions
    (``__path__`` from every ``from ... import``) are answered as for a plain module."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return getattr(_real(), name)


class _NoSympyObject:
    """Stands for ``sympy.Basic`` while sympy is unimported: nothing is an instance of it."""


def _real_name(module: str, name: str) -> Any:
    """``module.name`` from the real module, imported now in a momentary stand-in's place."""
    current = sys.modules.get(module)
    if current is not None and getattr(current, "_neurarch_stand_in", False):
        del sys.modules[module]
    return getattr(importlib.import_module(module), name)


def _deferred_in(module: str, name: str) -> Any:
    """A callable standing for ``module.name`` (a function or class a kernel imports and does not
    use on plain sizes): the real one, imported when first called."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return _real_name(module, name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


def _momentary_module(module: str, names: dict) -> types.ModuleType:
    stand_in = types.ModuleType(module, f"{module}, unimported (neurarch_trace.lazy_sympy)")
    stand_in._neurarch_stand_in = True
    for name, value in names.items():
        setattr(stand_in, name, value)

    def other(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _real_name(module, name)
    stand_in.__getattr__ = other
    return stand_in


#: The momentary stand-ins (one per module, made once): each answers the names given here, and any
#: other by importing the real module.
MOMENTARY = {
    "sympy": _momentary_module("sympy", {"Basic": _NoSympyObject}),
    "torch.utils._sympy.functions": _momentary_module(
        "torch.utils._sympy.functions", {"Max": _deferred_in("torch.utils._sympy.functions", "Max")}),
}


def _momentary(function: Any, modules: tuple) -> Any:
    """``function``, run with a momentary stand-in in ``sys.modules`` for each of ``modules`` not
    imported yet (see :data:`MOMENTARY` and the module docstring)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        if "sympy" in sys.modules:
            return function(*args, **kwargs)
        placed = {m: MOMENTARY[m] for m in modules if m not in sys.modules}
        sys.modules.update(placed)
        try:
            return function(*args, **kwargs)
        finally:
            for m, stand_in in placed.items():
                if sys.modules.get(m) is stand_in:
                    del sys.modules[m]
    run.__wrapped__ = function
    run.__name__ = run.__qualname__ = function.__name__
    run.__doc__ = function.__doc__
    return run


#: (module, attribute, the modules it imports for nothing a plain size needs): each place the
#: meta kernels look such a function up. ``elementwise_dtypes`` and ``sym_not`` import sympy for
#: ``isinstance(x, sympy.Basic)``; ``_is_non_overlapping_and_dense_or_false`` (behind every meta
#: ``.to(dtype)``) imports ``Max`` from ``torch.utils._sympy.functions`` and does not use it.
MOMENTARY_HOMES = (
    ("torch", "sym_not", ("sympy",)),
    ("torch._prims_common", "elementwise_dtypes", ("sympy",)),
    ("torch._meta_registrations", "elementwise_dtypes", ("sympy",)),
    ("torch._prims_common", "_is_non_overlapping_and_dense_or_false", ("torch.utils._sympy.functions",)),
)


@contextlib.contextmanager
def sympy_left_unimported() -> Iterator[None]:
    """A block in which PyTorch's meta kernels on plain sizes do not import sympy (see the module
    docstring).

    Nests; not thread-safe (the block changes ``sys.modules`` and four PyTorch module attributes for
    the process). Nothing is done when sympy or ``torch.fx.experimental.symbolic_shapes`` is
    imported already. Raises nothing of its own."""
    global _depth
    placed, swapped, before = None, [], set()
    parent = sys.modules.get(_PARENT)
    if not _depth and "sympy" not in sys.modules and MODULE not in sys.modules and parent is not None:
        before = set(sys.modules)
        placed = _stand_in()
        sys.modules[MODULE] = placed
        setattr(parent, _LEAF, placed)
        for home, name, modules in MOMENTARY_HOMES:
            namespace = sys.modules.get(home)
            original = getattr(namespace, name, None)
            if callable(original):
                setattr(namespace, name, _momentary(original, modules))
                swapped.append((namespace, name, original))
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for namespace, name, original in swapped:
            setattr(namespace, name, original)
        if placed is not None:
            _take_back(before)
            if sys.modules.get(MODULE) is placed:
                del sys.modules[MODULE]
            if getattr(parent, _LEAF, None) is placed:
                delattr(parent, _LEAF)
