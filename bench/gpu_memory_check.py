"""Compare the plan's training-step predictions with a real GPU: peak memory and step time.

For each example model the script traces the model (CPU, batch 1), asks the planner library (no
HTTP) for the card's memory model, then runs real training steps on the GPU at several batch sizes
with mixed precision (``torch.autocast`` in bf16, fp32 master weights, ``torch.optim.AdamW``
foreach, the loss the rehearsal computes: cross-entropy in float32 on the primary output), and
reports, per model and batch:

* predicted peak = the memory model's peak at that batch (``analyse(graph).memory.peak_bytes``, the
  number behind ``plan.cost.peakGb``) minus the plan's 1 GB framework allowance
  (``max_memory_allocated`` does not see the CUDA context), against
  ``torch.cuda.max_memory_allocated()`` over the second step (GB = 10^9 bytes);
* predicted step time = 3 x forward FLOPs x batch / (the GPU's dense bf16 peak x the plan's MFU),
  against the median of timed steps after warm-up (``torch.cuda.synchronize`` around each).

Run on a machine with a CUDA GPU:

    python bench/gpu_memory_check.py --gpu H200 --out results/gpu_check.json

``--device cpu`` runs the same code path without measuring memory (a smoke test of the script).
This file needs only torch (and transformers for the BERT and GPT-2 configs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "models"))

from neurarch_trace import trace_model  # noqa: E402
from neurarch_trace.planner import make_plan  # noqa: E402
from neurarch_trace.planner.analysis import analyse  # noqa: E402
from neurarch_trace.planner.gpus import gpu_table  # noqa: E402
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES  # noqa: E402


def example_models(include_hf: bool):
    """(label, factory, make_batch(batch, device), loss_fn(output, batch))."""
    import gpt
    import resnet
    import vit

    def images(size: int, classes: int):
        def make(batch: int, device: str):
            images = torch.randn(batch, 3, size, size, device=device)
            return (images,), torch.randint(0, classes, (batch,), device=device)
        return make

    def tokens(length: int, vocab: int):
        def make(batch: int, device: str):
            ids = torch.randint(0, vocab, (batch, length), device=device)
            return (ids,), ids
        return make

    def classify(out, target):
        logits = out.logits if hasattr(out, "logits") else out
        return nn.functional.cross_entropy(logits.float(), target)

    def next_token(out, ids):
        # the rehearsal's loss on a 3-D output: cross-entropy over its last axis, in float32
        x = out.logits if hasattr(out, "logits") else getattr(out, "last_hidden_state", out)
        return nn.functional.cross_entropy(x.float().flatten(0, 1), (ids % x.shape[-1]).flatten())

    yield "ResNet-18 224px", resnet.ResNet18, images(224, 1000), classify
    yield "ResNet-50 224px", resnet.ResNet50, images(224, 1000), classify
    yield "ViT-B/16 224px", vit.ViT_B_16, images(224, 1000), classify
    yield "TinyGPT 256 tokens", gpt.TinyGPT, tokens(256, 8192), next_token
    if include_hf:
        import transformers

        yield ("BERT-base 128 tokens", lambda: transformers.BertModel(transformers.BertConfig()),
               tokens(128, 30522), next_token)
        yield ("GPT-2 LM 512 tokens",
               lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)),
               tokens(512, 50257), next_token)


def measure(factory, make_batch, loss_fn, batch: int, device: str, steps: int) -> dict:
    torch.manual_seed(0)
    model = factory().to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    inputs, target = make_batch(batch, device)
    dtype = torch.bfloat16

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype):
            out = model(*inputs)
            loss = loss_fn(out, target)
        loss.backward()
        optimizer.step()
        del out, loss

    step()  # the first step allocates the optimizer state: a steady step carries it
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak = max(peak, torch.cuda.max_memory_allocated())
    return {"measured_peak_gb": None if peak is None else peak / 1e9, "step_s": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H200", help="the GPU's id in neurarch_trace/data/gpus.json (for its peak)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default="8,32,128", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers configs")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    gpu = gpu_table().by_id(args.gpu)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for label, factory, make_batch, loss_fn in example_models(include_hf=not args.no_hf):
        torch.manual_seed(0)
        model = factory()
        inputs, _ = make_batch(1, "cpu")
        graph = trace_model(model, inputs)
        plan = make_plan(graph)["plan"]
        memory = analyse(graph).memory
        mfu = plan["cost"]["training"]["mfu"] if plan["cost"].get("training") else 0.40
        flops = plan["model"]["flops"]
        del model
        for batch in batches:
            predicted_gb = (memory.peak_bytes(batch) - FRAMEWORK_ALLOWANCE_BYTES) / 1e9
            predicted_s = 3 * flops * batch / (gpu.peak_tflops * 1e12 * mfu)
            try:
                got = measure(factory, make_batch, loss_fn, batch, args.device, args.steps)
            except torch.OutOfMemoryError:
                got = {"measured_peak_gb": None, "step_s": None, "oom": True}
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the step's model and optimizer are gone: start clean
            row = {"model": label, "batch": batch, "memory_source": memory.source,
                   "predicted_phase": memory.peak(batch).phase, "predicted_peak_gb": predicted_gb,
                   "predicted_step_s": predicted_s, "mfu": mfu, **got}
            if got.get("measured_peak_gb"):
                row["peak_ratio"] = predicted_gb / got["measured_peak_gb"]
            if got.get("step_s"):
                row["time_ratio"] = predicted_s / got["step_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        Path(args.out).write_text(json.dumps({"gpu": args.gpu, "device": device, "torch": torch.__version__,
                                              "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
