"""The layer stack: which module's forward is running, the scope it runs in, and its path.

The pre-hook pushes one frame per module call and the post-hook pops it, so the stack mirrors the
Python call stack of ``forward`` methods: a *scope* frame for a container the trace descends into,
a *layer* frame for a module that becomes one node, a *skip* frame for a call that gets no node
(nn.Identity, or any call inside a layer).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from torch import nn

import neurarch_trace.walk as walk

__all__ = ["LAYER", "SCOPE", "SKIP", "LayerStack", "Names"]

SKIP = "skip"
SCOPE = "scope"
LAYER = "layer"
_SKIP_FRAME = (SKIP, None)


class LayerStack:
    """Frames of the running module calls: ``(SCOPE, qualname)``, ``(LAYER, record)`` or
    ``(SKIP, None)``, innermost last."""

    def __init__(self, tree: walk.Tree) -> None:
        self._model = tree.model
        #: the frames, innermost last (the recorder's leaf path appends its layer frames itself)
        self.frames: List[Tuple[str, Any]] = []
        self.scopes: List[Tuple[str, nn.Module]] = []  # the scope frames' (qualname, module), innermost last
        # the path of each module under each parent (a module reached two ways has two paths)
        self._child_names: Dict[int, Dict[int, str]] = {}
        self._default_qual: Dict[int, str] = {}
        # no module registered twice: each module has one path, which is the path it is called as
        # (a child of the running scope is that scope's path and its name; any other module its
        # one path, or its class name when it is not in the tree)
        self._one_path = tree.paths is tree.named_modules
        if self._one_path:
            self._default_qual = {id(mod): qual for qual, mod in tree.paths}
            return
        for qual, mod in tree.paths:
            self._default_qual.setdefault(id(mod), qual)
            self._child_names[id(mod)] = {id(c): n for n, c in mod._modules.items() if c is not None}

    def push_skip(self) -> None:
        self.frames.append(_SKIP_FRAME)

    def push_scope(self, qual: str, module: nn.Module) -> None:
        self.frames.append((SCOPE, qual))
        self.scopes.append((qual, module))

    def push_layer(self, record: Any) -> None:
        self.frames.append((LAYER, record))

    def pop(self) -> Tuple[str, Any]:
        """The innermost frame, removed."""
        frame = self.frames.pop()
        if frame[0] is SCOPE:
            self.scopes.pop()
        return frame

    def current_scope(self) -> str:
        """The path of the innermost scope (``""`` at the top level)."""
        return self.scopes[-1][0] if self.scopes else ""

    def running_layer(self) -> Optional[Any]:
        """The record of the innermost running layer, or None."""
        for kind, value in reversed(self.frames):
            if kind is LAYER:
                return value
        return None

    def qualname(self, module: nn.Module) -> str:
        """The path of ``module`` as called now: its name under the running scope's module, else
        its first path in the model, else its class name (a module from outside the model)."""
        if module is self._model:
            return ""
        if self._one_path:
            return self._default_qual.get(id(module), type(module).__name__)
        if self.scopes:
            parent_qual, parent = self.scopes[-1]
            child = self._child_names.get(id(parent), {}).get(id(module))
            if child is not None:
                return f"{parent_qual}.{child}" if parent_qual else child
        return self._default_qual.get(id(module), type(module).__name__)


class Names:
    """Unique node names: ``base``, then ``base#2``, ``base#3``, ... (a counter per base keeps this
    O(1))."""

    def __init__(self) -> None:
        self._taken: Set[str] = set()
        self._next: Dict[str, int] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def reserve(self, name: str) -> None:
        """Take ``name`` without a suffix (``output``)."""
        self._taken.add(name)

    def unique(self, base: str) -> str:
        """``base``, or ``base#k`` with the smallest free ``k``, taken."""
        name = base
        n = self._next.get(base, 1)
        while name in self._taken:
            n += 1
            name = f"{base}#{n}"
        self._next[base] = n
        self._taken.add(name)
        return name
