"""Validation harness: real training steps on the CPU against the card's memory predictions.

For each model, at several batch sizes, the harness runs REAL mixed-precision AdamW training steps
on the CPU (real tensors, real ``torch.optim.AdamW(foreach=True)``, a real loss and backward),
behaving as CUDA training does (:mod:`cuda_on_cpu`: CUDA's autocast policy at the dispatcher,
bool dropout masks, a fused attention kernel), and measures the live bytes with PyTorch's
profiler: every allocation and free the CPU allocator reports (``profile_memory=True``), each
attributed to the phase (``record_function``) it falls in. The bytes alive before the measured step
(parameters, gradients of the previous step, AdamW's moments, buffers, the batch) are added from
the tensors themselves. Each phase's peak is then fitted over the batch sizes as
``state + batch x per_sample`` (least squares).

The prediction is the planner's memory model for the graph that ``trace_model`` writes at batch 1
(``neurarch_trace.planner.analysis.analyse(graph).memory``, the numbers behind the card), less its
1 GB framework allowance, which a CPU run has no counterpart for. Nothing here calls the
rehearsal's code: the measuring is the profiler's and the CUDA behaviour is this file's own.

Usage:

    python bench/training_memory.py                      # every model, README's table
    python bench/training_memory.py --models resnet18,gpt2 --out bench/results/training_memory.json

The step measured is the second of two (the first allocates AdamW's moments), written as::

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):   # CUDA's policy, see cuda_on_cpu
        output = model(*inputs)
        loss = loss_fn(output, target)
    loss.backward()
    optimizer.step()
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples" / "models"))

from cuda_on_cpu import CudaOnCpu  # noqa: E402

from neurarch_trace import trace_model  # noqa: E402
from neurarch_trace.planner.analysis import analyse  # noqa: E402
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES  # noqa: E402

PHASES = ("forward", "loss", "backward", "optimizer")


# --- the measurement ------------------------------------------------------------------------------


def _storages(objects: list) -> int:
    """Bytes of the distinct CPU storages of the tensors in ``objects`` (nested lists and dicts)."""
    seen: dict[int, int] = {}
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                storage = obj.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return sum(seen.values())


#: Operations that only allocate, and the copies type conversion makes: transparent when deciding
#: which operation an allocation belongs to.
_FACTORIES = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::zeros_like",
                        "aten::ones", "aten::ones_like", "aten::full", "aten::new_empty", "aten::new_zeros",
                        "aten::new_empty_strided", "aten::resize_"})
_COPIES = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
_POINTWISE: dict[str, bool] = {}


def _pointwise(name: str) -> bool:
    """Whether an aten operation is elementwise (``torch.Tag.pointwise``): a TensorIterator kernel,
    which on the CPU copies an input of another dtype to a temporary and on CUDA casts in place."""
    if name not in _POINTWISE:
        packet = getattr(torch.ops.aten, name.split("::", 1)[-1], None)
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
        _POINTWISE[name] = any(torch.Tag.pointwise in op.tags for op in overloads)
    return _POINTWISE[name]


def _walk(prof: Any) -> tuple[list[tuple], list[tuple[str, int, int]]]:
    """Allocations ``(time, bytes, ptr, owner end, may be scratch)`` and phase ranges. The owner is
    the nearest operation that is not a factory or a copy; an allocation may be a CPU kernel's
    scratch when the owner made it itself, when a factory made it for a kernel (not for a copy), or
    when the owner is elementwise (a dtype-promotion temporary)."""
    raw, phases = [], []
    stack = [(node, None, None, None, None) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, owner, owner_end, parent, grandparent = stack.pop()
        tag = str(node.tag)
        if tag == "_EventType.TorchOp":
            if node.name.startswith("phase:"):
                phases.append((node.name[len("phase:"):], node.start_time_ns, node.end_time_ns))
            elif node.name not in _FACTORIES and node.name not in _COPIES:
                owner, owner_end = node.name, node.end_time_ns
            stack.extend((child, owner, owner_end, node.name, parent) for child in node.children)
            continue
        if tag == "_EventType.Allocation" and node.extra_fields.device.type == "cpu":
            own = parent is not None and parent == owner
            workspace = parent in _FACTORIES and grandparent not in _COPIES
            promotion = owner is not None and owner.startswith("aten::") and _pointwise(owner)
            raw.append((node.start_time_ns, int(node.extra_fields.alloc_size), node.extra_fields.ptr, owner_end,
                        own or workspace or promotion))
        stack.extend((child, owner, owner_end, parent, grandparent) for child in node.children)
    raw.sort(key=lambda e: e[0])
    return raw, sorted(phases, key=lambda p: p[1])


def _events(prof: Any) -> tuple[list[tuple[int, int, bool]], list[tuple[str, int, int]]]:
    """``(time, bytes, scratch)`` of every CPU allocation (+) and free (-), and ``(phase, start, end)``
    ranges. ``scratch`` marks both events of a block a CPU kernel makes and frees before it
    returns, that CUDA's kernels do not make (oneDNN's packed copy of a GEMM operand; the float32
    copy of a bf16 operand TensorIterator makes on the CPU for ``fp32 + bf16``, where CUDA casts
    inside the kernel): no tensor the step holds."""
    raw, phases = _walk(prof)
    made: dict[int, tuple[int, Any, bool]] = {}
    scratch: set[int] = set()
    for index, (when, nbytes, ptr, end, candidate) in enumerate(raw):
        if nbytes > 0:
            made[ptr] = (index, end, candidate)
        elif ptr in made:
            first, end_made, was_candidate = made.pop(ptr)
            if was_candidate and end_made is not None and when <= end_made:
                scratch.update((first, index))
    events = [(when, nbytes, i in scratch) for i, (when, nbytes, _, _, _) in enumerate(raw)]
    return events, phases


def phase_peaks(prof: Any, baseline: int, step: str) -> dict[str, dict[str, int]]:
    """Per phase of the step whose phases are named ``<phase><step>``: the largest live bytes of
    tensors (``tensors``) and with kernel workspaces (``all``); ``baseline`` = bytes alive when
    profiling began (parameters, buffers, the batch)."""
    events, phases = _events(prof)
    peaks = {name[: -len(step)]: {"tensors": 0, "all": 0} for name, _, _ in phases if name.endswith(step)}
    live_tensors = live_all = baseline
    for when, nbytes, scratch in events:
        live_all += nbytes
        live_tensors += 0 if scratch else nbytes
        for name, start, end in phases:
            if start <= when <= end and name.endswith(step):
                peak = peaks[name[: -len(step)]]
                peak["tensors"] = max(peak["tensors"], live_tensors)
                peak["all"] = max(peak["all"], live_all)
                break
    return peaks


def measure(model: nn.Module, make_batch: Callable[[int], tuple], loss_fn: Callable, batch: int,
            emulation: CudaOnCpu) -> dict[str, dict[str, int]]:
    """Peak live bytes per phase of the second of two real training steps at ``batch`` (both are
    profiled, so that the frees of the first step's gradients are seen)."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    inputs, target = make_batch(batch)
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {})

    def step(n: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        with record_function(f"phase:forward{n}"), torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(*args, **kwargs)
        with record_function(f"phase:loss{n}"), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(output, target)
        emulation.clear_cache()  # leaving the autocast region drops the weight casts
        with record_function(f"phase:backward{n}"):
            loss.backward()
        with record_function(f"phase:optimizer{n}"):
            optimizer.step()
        del output, loss

    # nothing made before profiling may be freed while it runs: the allocator reports the free of a
    # block from an earlier profiling session, but not of one from before any
    model.zero_grad(set_to_none=True)
    gc.collect()
    baseline = _storages([list(model.parameters()), list(model.buffers()), list(args), kwargs, target])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(1)
        step(2)
    return phase_peaks(prof, baseline, "2")


# --- models ---------------------------------------------------------------------------------------


def _images(size: int, classes: int) -> Callable[[int], tuple]:
    def make(batch: int) -> tuple:
        return (torch.randn(batch, 3, size, size),), torch.randint(0, classes, (batch,))
    return make


def _tokens(length: int, vocab: int, decoder: bool = False) -> Callable[[int], tuple]:
    """Token ids ``(batch, length)``; with ``decoder``, keyword inputs with decoder ids too."""
    def make(batch: int) -> tuple:
        ids = torch.randint(0, vocab, (batch, length))
        if decoder:
            return {"input_ids": ids, "decoder_input_ids": torch.randint(0, vocab, (batch, length))}, ids
        return (ids,), ids
    return make


def _audio(frames: int, tokens: int, vocab: int) -> Callable[[int], tuple]:
    """Whisper's inputs: 80 log-mel bins x ``frames`` and ``tokens`` decoder token ids."""
    def make(batch: int) -> tuple:
        ids = torch.randint(0, vocab, (batch, tokens))
        return {"input_features": torch.randn(batch, 80, frames), "decoder_input_ids": ids}, ids
    return make


def _classify(out: Any, target: torch.Tensor) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.float(), target)


def _per_token(out: Any, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last axis of a (N, L, V) output, in float32 (the rehearsal's rule for
    3-D outputs; for a base model's hidden states, V is the width)."""
    x = out.logits if hasattr(out, "logits") else (out.last_hidden_state if hasattr(out, "last_hidden_state") else out)
    target = ids % x.shape[-1]
    return nn.functional.cross_entropy(x.float().flatten(0, 1), target.flatten())


def models() -> dict[str, tuple]:
    """label -> (factory, make_batch, loss, batches)."""
    import resnet
    import transformers as tf
    import vit

    def llama() -> nn.Module:
        return tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                                                  num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                                                  max_position_embeddings=1024))

    return {
        "resnet18": ("ResNet-18 224px", resnet.ResNet18, _images(224, 1000), _classify, (2, 4, 8)),
        "resnet50": ("ResNet-50 224px", resnet.ResNet50, _images(224, 1000), _classify, (2, 4, 8)),
        "vit": ("ViT-B/16 224px", vit.ViT_B_16, _images(224, 1000), _classify, (2, 4, 8)),
        "bert": ("BERT-base 128 tokens", lambda: tf.BertModel(tf.BertConfig()), _tokens(128, 30522), _per_token,
                 (2, 4, 8)),
        "gpt2": ("GPT-2 LM 512 tokens", lambda: tf.GPT2LMHeadModel(tf.GPT2Config()), _tokens(512, 50257), _per_token,
                 (1, 2, 4)),
        "llama": ("LLaMA-style 8L GQA 256 tokens", llama, _tokens(256, 32000), _per_token, (2, 4, 8)),
        "convnext": ("ConvNeXt-T 224px", lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(num_labels=1000)),
                     _images(224, 1000), _classify, (2, 4, 8)),
        "whisper": ("Whisper-tiny 30 s audio + 64 tokens",
                    lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig()), _audio(3000, 64, 51865), _per_token,
                    (2, 4, 8)),
        # T5 passes its learned position bias to SDPA as a mask that needs a gradient: CUDA's
        # memory-efficient kernel gives one, and no fused CPU kernel does, so this harness cannot
        # emulate it (the rehearsal runs the memory-efficient kernel); kept out of the default set
        "t5": ("T5-small 128+128 tokens", lambda: tf.T5ForConditionalGeneration(tf.T5Config()),
               _tokens(128, 32128, decoder=True), _per_token, (2, 4, 8)),
    }


DEFAULT = ("resnet18", "resnet50", "vit", "bert", "gpt2", "llama", "convnext", "whisper")


# --- prediction and comparison --------------------------------------------------------------------


def _fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares ``(state, per_sample)`` of ``bytes = state + batch x per_sample``."""
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (y - mean_y) for b, y in points) / var if var else 0.0
    return mean_y - slope * mean_b, slope


def predict(graph: dict) -> Any:
    return analyse(graph).memory


def predict_formula(graph: dict) -> Any:
    """The memory model the plan falls back to without a measured step (the layer-output formula)."""
    doc = {**graph, "measured": {k: v for k, v in graph["measured"].items() if k != "training"}}
    return analyse(doc).memory


def _predicted_phase(memory: Any, phase: str, batch: int) -> float:
    """The planner's peak for ``phase`` at ``batch`` (its largest line of that phase), less the
    framework allowance; the overall peak when no line has that phase (an estimated model)."""
    lines = [p for p in memory.phases if p.phase == phase] or memory.phases
    return max(p.bytes(batch) for p in lines) - FRAMEWORK_ALLOWANCE_BYTES


def run_model(key: str, spec: tuple) -> dict[str, Any]:
    label, factory, make_batch, loss_fn, batches = spec
    torch.manual_seed(0)
    model = factory()
    inputs, _ = make_batch(1)
    start = time.perf_counter()
    graph = trace_model(model, inputs)  # outside the emulation: the product runs as a user runs it
    trace_s = time.perf_counter() - start
    memory = predict(graph)
    formula = predict_formula(graph)
    with CudaOnCpu() as emulation:
        if emulation.uncovered:
            print(f"note: CUDA autocast ops this harness has no policy for: {emulation.uncovered}")
        measured = {b: measure(model, make_batch, loss_fn, b, emulation) for b in batches}
    tensors = {b: {phase: peak["tensors"] for phase, peak in measured[b].items()} for b in batches}
    big = max(batches)
    phase = max(tensors[big], key=tensors[big].get)
    busiest = max(("forward", "loss", "backward"), key=lambda p: tensors[big].get(p, 0))
    fits = {}
    for name in dict.fromkeys((phase, busiest)):
        # the phase's bytes at each batch, measured and predicted, fitted alike: state + batch x per sample
        state, per_sample = _fit([(b, tensors[b][name]) for b in batches])
        p_state, p_per_sample = _fit([(b, _predicted_phase(memory, name, b)) for b in batches])
        fits[name] = {"measured_per_sample": per_sample, "predicted_per_sample": p_per_sample,
                      "measured_state": state, "predicted_state": p_state}
    rows = []
    for b in batches:
        real = max(tensors[b].values())
        pred = memory.peak_bytes(b) - FRAMEWORK_ALLOWANCE_BYTES
        rows.append({"batch": b, "measured_peak": real, "measured_phase": max(tensors[b], key=tensors[b].get),
                     "measured_peak_with_workspaces": max(p["all"] for p in measured[b].values()),
                     "predicted_peak": pred, "predicted_phase": memory.peak(b).phase, "ratio": pred / real,
                     "formula_peak": formula.peak_bytes(b) - FRAMEWORK_ALLOWANCE_BYTES,
                     "phases": measured[b],
                     "predicted_phases": {p: _predicted_phase(memory, p, b) for p in measured[b]}})
    return {"key": key, "model": label, "source": memory.source, "trace_s": trace_s, "phase": phase,
            "activations_phase": busiest, "fits": fits, **fits[phase], "rows": rows}


def _print(result: dict[str, Any]) -> None:
    r = result
    print(f"{r['model']} [{r['source']}, traced in {r['trace_s']:.2f} s]", flush=True)
    for phase, f in r["fits"].items():
        ratio = f["predicted_per_sample"] / f["measured_per_sample"]
        print(f"  {phase}: per sample {f['predicted_per_sample'] / 1e6:.1f} MB predicted / "
              f"{f['measured_per_sample'] / 1e6:.1f} MB measured ({ratio:.3f}x);"
              f" state {f['predicted_state'] / 1e6:.1f} / {f['measured_state'] / 1e6:.1f} MB "
              f"({f['predicted_state'] / f['measured_state']:.3f}x)", flush=True)
    for row in r["rows"]:
        print(f"    batch {row['batch']:3d}: peak {row['predicted_peak'] / 1e9:.3f} GB predicted "
              f"({row['predicted_phase']}) / {row['measured_peak'] / 1e9:.3f} GB measured ({row['measured_phase']}) "
              f"= {row['ratio']:.3f}x (with CPU kernel workspaces {row['measured_peak_with_workspaces'] / 1e9:.3f} GB)",
              flush=True)


def add_formula(path: Path) -> None:
    """Trace each model of a results file again and add the formula's peak to its rows."""
    data = json.loads(path.read_text())
    zoo = models()
    for result in data["results"]:
        if "error" in result:
            continue
        _, factory, make_batch, _, _ = zoo[result["key"]]
        torch.manual_seed(0)
        formula = predict_formula(trace_model(factory(), make_batch(1)[0]))
        for row in result["rows"]:
            row["formula_peak"] = formula.peak_bytes(row["batch"]) - FRAMEWORK_ALLOWANCE_BYTES
    path.write_text(json.dumps(data, indent=2) + "\n")


def table(results: list[dict[str, Any]]) -> str:
    """README's validation table (markdown) from the results."""
    lines = ["| model | batch | peak: predicted / measured | phase | per sample, predicted / measured | "
             "state, predicted / measured | largest gap | formula / measured |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | | not measured: {r['error'].splitlines()[0][:80]} | | | |")
            continue
        fits = r["fits"]
        for i, row in enumerate(r["rows"]):
            phase = list(fits)[i] if i < len(fits) else ""
            fit = fits.get(phase)
            per = (f"{phase}: {fit['predicted_per_sample'] / 1e6:.2f} / {fit['measured_per_sample'] / 1e6:.2f} MB "
                   f"({fit['predicted_per_sample'] / fit['measured_per_sample']:.3f}x)") if fit else ""
            state = (f"{fit['predicted_state'] / 1e6:.1f} / {fit['measured_state'] / 1e6:.1f} MB "
                     f"({fit['predicted_state'] / fit['measured_state']:.3f}x)") if fit else ""
            gap = max(abs(row["predicted_phases"][k] - v["tensors"]) for k, v in row["phases"].items())
            formula = f"{row['formula_peak'] / row['measured_peak']:.2f}x" if "formula_peak" in row else ""
            lines.append(f"| {r['model'] if i == 0 else ''} | {row['batch']} | {row['predicted_peak'] / 1e9:.3f} / "
                         f"{row['measured_peak'] / 1e9:.3f} GB ({row['ratio']:.3f}x) | {row['measured_phase']} | "
                         f"{per} | {state} | {gap / 1e3:.1f} KB | {formula} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT), help="comma-separated keys: " + ",".join(models()))
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--formula", default=None, metavar="JSON",
                        help="add the formula's predictions to a results file (trace only, no steps) and exit")
    parser.add_argument("--table", default=None, metavar="JSON",
                        help="print README's table from a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["results"]))
        return
    if args.formula:
        add_formula(Path(args.formula))
        return
    zoo = models()
    results = []
    for key in args.models.split(","):
        try:
            results.append(run_model(key, zoo[key]))
        except Exception as exc:  # noqa: BLE001 - one model that cannot run does not stop the table
            print(f"{zoo[key][0]}: could not be measured: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            results.append({"key": key, "model": zoo[key][0], "error": f"{type(exc).__name__}: {exc}"})
            continue
        _print(results[-1])
        gc.collect()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
