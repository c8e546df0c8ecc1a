"""Trace one forward pass of a PyTorch model into a ``.neurarch.json`` graph.

How it works
------------
* **Nodes.** A pre-hook/post-hook pair around every module's forward records one node per call of a
  *layer*: a leaf module, a module the mapping table knows as a whole (nn.MultiheadAttention,
  nn.LSTM), a TorchScript submodule (opaque), or a container cut off by ``depth``. Work inside a
  layer is not looked into any further. nn.Identity gets no node.
  (The pair runs from a wrapper set as the module's ``forward`` while the trace runs, which keeps
  ``nn.Module.__call__`` on its fast path, or, for a module with hooks of its own, as two forward
  hooks after the user's: ``run._install_hooks``. Either way only ``module(x)`` calls are seen.)
* **Edges.** Every tensor carries its *provenance*: the set of nodes (and directly-read parameters)
  its value was computed from without passing through another layer. A layer's output gets
  ``{that layer}``; functional code between layers (``x + residual``, ``torch.cat``, reshapes,
  attention matmuls, RoPE arithmetic) runs under a ``TorchFunctionMode`` that gives each result the
  union of its operands' provenance, whatever the grad mode (so ``torch.no_grad()`` and
  ``torch.inference_mode()`` regions and integer paths are followed too). A layer's incoming edges
  are the provenance of its inputs. An add/sub, a concatenation or a stack whose operands come from
  different producers becomes an ``add``, ``concatenate`` or ``stack`` node (in-place ``+=`` too).
* **Statistics.** A ``TorchDispatchMode`` counts each aten operation's FLOPs with
  ``torch.utils.flop_counter``'s formulas (plus :mod:`neurarch_trace.flops`) and charges them to the
  innermost running layer, or to the functional total when no layer runs. The standard leaf layers
  (linear, convolutions, norms, activations, pooling, ...) are counted from their shapes with the
  same formulas instead, with the mode off the stack while they run, and so are torch functions of
  0 FLOPs between layers (:mod:`.closed_form`); ``closed_form.reference_path()`` turns these fast
  paths off, and the tests check that both give the same graphs. Parameters are owned by the first
  call that uses them (tied weights and shared modules count once).
* **Cost.** The forward runs without autograd. A hook runs between a model's kernels, with cold
  CPU caches: it reads what must be read while the call runs (provenance, shapes) and leaves the
  rest (names, ownership, types, closed-form FLOPs) to one pass after the forward.

The parts, one job each::

    run         trace_model: checks the arguments, runs the forward once, builds the graph
    guard       fast paths off for the trace; the model's parameters, buffers, attributes put back
    notices     the model's warnings told at its own line; a forward that returned no tensor
    recorder    the hooks and the flow/FLOP callbacks; one LayerCall per node
    records     LayerCall and Recording: the per-node data, with fields and units
    stack       which layer is running, its scope and path; unique names
    provenance  where each tensor's value came from; the flow mode between layers
    merges      add / concatenate / stack nodes
    batch       the batch axis of each tensor, followed from the inputs; shapes without it
    axes        how each torch function moves the batch axis
    ownership   which node owns each parameter and buffer; model totals
    kinds       a layer call's type and params; node-level FLOP formulas
    closed_form leaf layers and torch functions whose FLOPs follow from shapes; the reference path
    modules     wrappers, TorchScript stand-ins, recurrent layers
    tensors     walking and naming the tensors in arguments and outputs
    serialise   a Recording to the graph dict
"""

from __future__ import annotations

from neurarch_trace.trace.modules import unwrap_model
from neurarch_trace.trace.run import trace_model
from neurarch_trace.trace.tensors import dtype_name

__all__ = ["trace_model", "unwrap_model", "dtype_name"]
