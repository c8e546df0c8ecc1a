"""LoRA and QLoRA steps as PEFT and bitsandbytes run them, rehearsed on the meta device.

A LoRA step differs from full training in what autograd keeps, not only in what trains: the frozen
base saves nothing for its own weights' gradients, each adapter saves what its own matrices need,
and a 4-bit base changes dtypes along the way. Sizing that from full training's activations is a
guess; here the step itself runs, on meta tensors, with stand-ins that do what these libraries' code
does, tensor for tensor (PEFT 0.21, bitsandbytes 0.50, the versions measured on a GPU by
``bench/gpu_memory_check.py``):

* The adapted layers are PEFT's ``target_modules="all-linear"``: every ``nn.Linear`` (and
  transformers' GPT-2 ``Conv1D``) except the output embedding (``model.get_output_embeddings()``).
  PEFT accepts ``all-linear`` only for a transformers ``PreTrainedModel``, so only such a model is
  rehearsed this way (:func:`adapted_layers` returns none for another).
* Each adapter is ``lora_B(lora_A(x)) * scaling``, ``A (r x in)`` and ``B (out x r)`` trainable in
  float32 (PEFT's ``autocast_adapter_dtype=True``), ``lora_dropout=0`` (PEFT's default: an
  ``nn.Identity``), rank :data:`RANK`.
* ``lora`` (:data:`RECIPES`): the base loaded in bfloat16, every parameter frozen. PEFT's
  ``lora.Linear.forward`` casts the input to the adapter's dtype (``_cast_input_dtype``: a float32
  copy), which autocast casts back to a bfloat16 copy that ``lora_A`` saves: one copy per adapter.
* ``qlora``: the adapted layers stored in 4-bit NF4 (``bnb.nn.Linear4bit``; a packed ``uint8``
  tensor of half the weight's elements stands for them), the rest in bfloat16. ``Linear4bit.forward``
  casts its input to the compute dtype (bfloat16) and returns ``MatMul4Bit``'s output cast back to
  the input's dtype; ``MatMul4Bit`` dequantizes the weight for the product, saves only the packed
  weight and dequantizes again in the backward (:class:`_Dequantized`). PEFT's
  ``lora.bnb.Linear4bit.forward`` clones the base output ("defensively", as Tim Dettmers advises)
  and, under autocast, passes the input to the adapter as it is: the adapters share their input.
* ``qloraKbit``: ``qlora`` after ``peft.prepare_model_for_kbit_training`` (PEFT's and transformers'
  QLoRA guides; TRL's ``SFTTrainer`` called it before TRL 1.16): every parameter that is not 4-bit
  is cast to float32, so the embeddings and norms make a float32 residual stream and each 4-bit
  layer returns float32.

The step is then the rehearsal's own (:class:`~neurarch_trace.rehearsal.step.Rehearsal`): bf16
autocast, the loss, the backward, AdamW over the adapters. Checked against the same steps run on
an H200 (``bench/gpu_memory_check.py``, README's tables).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import neurarch_trace.walk as walk

__all__ = ["RANK", "RECIPES", "Adapted", "Recipe", "adapted_layers", "adapter_weights", "adapters_installed"]

#: The LoRA rank rehearsed: the plan's default (``neurarch_trace.planner.finetune.DEFAULT_RANK``).
RANK = 16
#: PEFT's default ``lora_alpha`` is 8: ``scaling = alpha / r``. Its value changes no byte.
_SCALING = 8 / RANK


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A fine-tuning step: ``quantized`` adapted layers stored in 4-bit NF4, ``kbit`` the rest
    cast to float32 by ``prepare_model_for_kbit_training``."""

    name: str
    quantized: bool
    kbit: bool


#: The recipes, by the name ``measured.training.adapters`` records them under.
RECIPES = (Recipe("lora", False, False), Recipe("qlora", True, False), Recipe("qloraKbit", True, True))


@dataclasses.dataclass
class Adapted:
    """One adapted layer: its qualified name, the module, its weight as ``(out, in)`` and whether
    it stores the weight transposed (``Conv1D``: ``(in, out)``)."""

    name: str
    module: nn.Module
    out_features: int
    in_features: int
    transposed: bool


def _is_conv1d(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")


def adapted_layers(model: nn.Module) -> list[Adapted]:
    """The layers PEFT's ``target_modules="all-linear"`` adapts in ``model`` (see the module
    docstring); empty for a model that is not a transformers ``PreTrainedModel`` (PEFT refuses
    ``all-linear`` for it)."""
    output = getattr(model, "get_output_embeddings", None)
    if output is None or not any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):
        return []
    try:
        head = output()
    except Exception:  # noqa: BLE001 - a model without an output embedding has none to leave out
        head = None
    found: list[Adapted] = []
    for name, module in walk.named_modules(model):
        if module is head:
            continue
        weight = module._parameters.get("weight")
        if weight is None or weight.dim() != 2:
            continue
        if type(module).forward is nn.Linear.forward:
            found.append(Adapted(name, module, int(weight.shape[0]), int(weight.shape[1]), False))
        elif _is_conv1d(module):
            found.append(Adapted(name, module, int(weight.shape[1]), int(weight.shape[0]), True))
    return found


class _Dequantized(torch.autograd.Function):
    """bitsandbytes' ``MatMul4Bit``: ``x @ dequantize(W).T`` with the dequantized weight a
    temporary, the packed weight the only tensor saved, the weight dequantized again for the
    input's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int],  # type: ignore[override]
                bias: torch.Tensor | None) -> torch.Tensor:
        weight = torch.empty(shape, dtype=torch.bfloat16, device=x.device).to(x.dtype)
        out = F.linear(x, weight, None if bias is None else bias.to(x.dtype))
        ctx.shape = shape
        ctx.save_for_backward(packed)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        weight = torch.empty(ctx.shape, dtype=torch.bfloat16, device=grad.device).to(grad.dtype)
        return grad @ weight, None, None, None


def _adapted_forward(layer: Adapted, recipe: Recipe, lora_a: torch.Tensor, lora_b: torch.Tensor) -> Any:
    """The forward of ``layer`` under PEFT's LoRA layer for ``recipe`` (see the module docstring).
    ``layer.module.weight`` and ``.bias`` are read at call time: the rehearsal's meta copies."""
    module = layer.module
    shape = (layer.out_features, layer.in_features)

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        weight, bias = module.weight, module._parameters.get("bias")
        if recipe.quantized:  # bnb.nn.Linear4bit under peft.tuners.lora.bnb.Linear4bit
            dtype = x.dtype
            result = _Dequantized.apply(x.to(torch.bfloat16), weight, shape, bias).to(dtype)
            result = result.clone()
            return result + F.linear(F.linear(x, lora_a), lora_b) * _SCALING
        # peft.tuners.lora.Linear over nn.Linear / Conv1D
        result = F.linear(x, weight.t() if layer.transposed else weight, bias)
        dtype = result.dtype
        cast = x.to(lora_a.dtype) if x.dtype != lora_a.dtype else x
        result = result + F.linear(F.linear(cast, lora_a), lora_b) * _SCALING
        return result.to(dtype)

    return forward


def adapter_weights(layers: list[Adapted], rank: int = RANK) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Meta ``(lora_A, lora_B)`` of each layer: ``(r, in)`` and ``(out, r)``, float32, trainable."""
    return [(torch.empty(rank, x.in_features, device="meta", requires_grad=True),
             torch.empty(x.out_features, rank, device="meta", requires_grad=True)) for x in layers]


@contextlib.contextmanager
def adapters_installed(layers: list[Adapted], recipe: Recipe,
                       weights: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Within the block, each adapted module's ``forward`` is the recipe's (an instance
    attribute, as the tracer's own wrappers are); the modules' own come back after, whatever
    happens."""
    installed: list[nn.Module] = []
    try:
        for layer, (a, b) in zip(layers, weights):
            if "forward" in layer.module.__dict__:
                raise RuntimeError(f"{layer.name} has a forward of its own instance")
            layer.module.__dict__["forward"] = _adapted_forward(layer, recipe, a, b)
            installed.append(layer.module)
        yield
    finally:
        for module in installed:
            module.__dict__.pop("forward", None)
