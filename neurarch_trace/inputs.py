"""``--input DIMS[:dtype]`` specifications and the random tensors made from them.

A spec is ``[name=]D0,D1,...[:dtype]``, batch first: ``1,3,224,224``, ``1,16:long``,
``attention_mask=1,16:long``. Without ``name=`` the tensor is the next positional argument of
``forward``; with it, a keyword argument. Floats are ``torch.randn``; integers
``torch.randint(0, high)`` with ``high`` = min(1000, the smallest embedding table the model owns),
so token ids are always valid; an integer input whose name contains ``mask`` is all ones (every
token attended); bools are random. Tensors are made from a fixed seed, so two runs see the same
values.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import torch
from torch import nn

import neurarch_trace.walk as walk
from neurarch_trace.errors import InputSpecError
from neurarch_trace.text import gb, shape_text

__all__ = ["DTYPES", "InputSpec", "parse_input", "parse_dtype", "make_inputs", "token_high"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
    "long": torch.int64,
    "int64": torch.int64,
    "int": torch.int32,
    "int32": torch.int32,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "cfloat": torch.complex64,
    "complex128": torch.complex128,
}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEED = 0


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One parsed ``--input``: its keyword ``name`` (None for positional), ``shape`` with batch,
    and ``dtype`` (None: the command's default)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    name: str | None = None
    text: str = ""


def parse_dtype(text: str) -> torch.dtype:
    """A dtype name (``float32``, ``long``, ``bool``, ...) to a ``torch.dtype``.

    Raises:
        InputSpecError: an unknown name; the message lists the known ones.
    """
    dtype = DTYPES.get(text.strip().lower())
    if dtype is None:
        known = ", ".join(DTYPES)
        raise InputSpecError(f"unknown dtype {text!r}: use one of {known}")
    return dtype


#: The most elements an input may have: PyTorch counts a storage's bytes in an int64, and an element
#: takes up to 16 bytes (complex128).
MAX_ELEMENTS = (2**63 - 1) // 16


def parse_input(text: str) -> InputSpec:
    """Parse ``[name=]D0,D1,...[:dtype]``.

    Raises:
        InputSpecError: an empty spec, a dimension that is not a positive integer, a bad keyword
            name, or an unknown dtype.
    """
    raw = text.strip()
    name = None
    body = raw
    if "=" in raw:
        name, body = raw.split("=", 1)
        name = name.strip()
        if not _NAME.match(name):
            raise InputSpecError(
                f"--input {text!r}: {name!r} is not a keyword argument name; write NAME=DIMS[:dtype], "
                "e.g. attention_mask=1,16:long"
            )
    dtype = None
    if ":" in body:
        body, dtype_text = body.rsplit(":", 1)
        dtype = parse_dtype(dtype_text)
    dims_text = [d.strip() for d in body.split(",")]
    if not body.strip():
        raise InputSpecError(f"--input {text!r} has no dimensions: write the shape batch first, e.g. 1,3,224,224")
    if any(not d for d in dims_text):
        raise InputSpecError(f"--input {text!r} has an empty dimension: write the shape batch first, with one "
                             "size between each pair of commas, e.g. 1,3,224,224")
    dims = []
    for d in dims_text:
        if not d.isdigit() or int(d) <= 0:
            raise InputSpecError(
                f"--input {text!r}: dimension {d!r} is not a positive integer; write the shape batch first, "
                "e.g. 1,3,224,224"
            )
        dims.append(int(d))
    if math.prod(dims) > MAX_ELEMENTS:
        raise InputSpecError(f"--input {text!r}: {math.prod(dims):,} elements are more than any tensor can hold "
                             "(PyTorch counts a tensor's bytes in an int64); give a smaller shape")
    return InputSpec(shape=tuple(dims), dtype=dtype, name=name, text=raw)


def token_high(model: nn.Module | None, default: int = 1000) -> int:
    """The exclusive upper bound for random integer inputs: ``min(default, smallest embedding)``."""
    high = default
    if model is not None:
        for module in walk.modules(model):
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.num_embeddings > 0:
                high = min(high, module.num_embeddings)
    return max(high, 1)


def make_inputs(
    specs: list[InputSpec],
    model: nn.Module | None = None,
    *,
    default_dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    meta_hint: bool = True,
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Random tensors for ``specs``: ``(positional, keyword)``, made under a fixed seed.
    ``meta_hint``: a tensor too large for memory suggests ``--device meta`` (not for a live model,
    which is never moved).

    Raises:
        InputSpecError: a positional spec after a keyword one, a keyword given twice, or a tensor
            larger than this machine's memory (or one the allocator refuses).
    """
    generator = torch.Generator().manual_seed(SEED)
    high = token_high(model)
    args: list[torch.Tensor] = []
    kwargs: dict[str, torch.Tensor] = {}
    for spec in specs:
        dtype = spec.dtype or default_dtype
        if spec.name is None and kwargs:
            raise InputSpecError(
                f"--input {spec.text!r} is positional but follows a keyword input: put positional inputs first"
            )
        if spec.name is not None and spec.name in kwargs:
            raise InputSpecError(f"--input {spec.name}= is given twice")
        if str(device) == "meta":  # no values, no memory: shapes and dtypes are all a meta trace needs
            tensor = torch.empty(spec.shape, dtype=dtype, device="meta")
        else:
            tensor = _allocated(spec, dtype, high, generator, device, meta_hint)
        if spec.name is None:
            args.append(tensor)
        else:
            kwargs[spec.name] = tensor
    return args, kwargs


def memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (``sysconf``), or None where it cannot be read."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def _too_large(spec: InputSpec, dtype: torch.dtype, need: int, have: int | None, meta_hint: bool) -> InputSpecError:
    shown = f"{shape_text(list(spec.shape))} {str(dtype).replace('torch.', '')}"
    room = f"more than this machine's {gb(have)} of memory" if have else "more than this machine can allocate"
    meta = ", or trace shapes only with --device meta" if meta_hint else ""
    return InputSpecError(
        f"--input {spec.text!r}: a {shown} tensor takes {gb(need)}, {room}; give a smaller shape "
        f"(batch first, e.g. 1,3,224,224){meta}"
    )


def _allocated(spec: InputSpec, dtype: torch.dtype, high: int, gen: torch.Generator, device: str | torch.device,
               meta_hint: bool = True) -> torch.Tensor:
    """The random tensor of ``spec``, or an :class:`InputSpecError` when it cannot be allocated."""
    numel = 1
    for d in spec.shape:
        numel *= d
    need = numel * torch.empty((), dtype=dtype).element_size()
    have = memory_bytes()
    if have is not None and need > have:
        raise _too_large(spec, dtype, need, have, meta_hint)
    is_mask = bool(spec.name and "mask" in spec.name.lower())
    try:
        tensor = _random(spec.shape, dtype, high, gen, is_mask=is_mask)
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "alloc" not in str(exc).lower():
            raise
        raise _too_large(spec, dtype, need, have, meta_hint) from exc
    return tensor.to(device) if str(device) != "cpu" else tensor


def _random(shape: tuple[int, ...], dtype: torch.dtype, high: int, gen: torch.Generator, *,
            is_mask: bool) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=torch.float32 if not dtype.is_complex else dtype).to(dtype)
    if is_mask:
        return torch.ones(shape, dtype=dtype)
    return torch.randint(0, high, shape, generator=gen, dtype=dtype)
