"""Benchmark: what tracing costs next to the forward pass it watches, and how it scales.

Run: ``python bench/bench_trace.py [--repeats 5] [--json bench/results/trace.json] [--cpu-time] [--only NAME]``

``--cpu-time`` times with this process's CPU time and one torch thread instead of the wall clock:
on a machine other jobs share, wall-clock medians swing by 2x while CPU time stays within a few
percent (the ratio is then the tracer's CPU overhead on a single-threaded forward). ``--only``
keeps the forward-vs-trace models whose label contains NAME (``ResNet-50``, ``GPT-2``) and skips
the rest.

Reports, in one run on this machine:

1. For a ResNet-50-like CNN, a ViT-B/16-like model, a BERT-base config and a GPT-2 config: the bare
   forward time, the trace time without the training-step rehearsal (``training_step=False``) and
   with it (the default), and their ratios (medians of ``--repeats`` runs each, alternating the
   three after one warm-up of each). All run the same way: ``eval()`` mode, autograd enabled (the
   tracer runs the forward so), CPU, batch 1; images 224 px, 128 tokens.
2. For LLaMA-7B and LLaMA-3-70B configs on the meta device: the trace time (model build included)
   with and without the rehearsal, and the peak resident memory, each in a fresh subprocess so the
   peak is its own; and, in a fresh process, the one-time cost of the rehearsal's first meta
   operations (PyTorch imports its meta kernels, ``torch._refs`` and sympy on first use).
3. Writing and reading back a graph of 10,000 nodes, and the trace time per layer of deep
   sequential models of 1,000 and 4,000 layers (linear scaling gives a ratio near 1).

Numbers are ratios against a baseline measured in the same process; no target is asserted here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))

from neurarch_trace import read_graph, trace_model, write_graph  # noqa: E402

#: The clock the timings read: the wall clock, or this process's CPU time with ``--cpu-time``.
CLOCK = time.perf_counter


def paired_medians(*fns, repeats: int) -> tuple[float, ...]:
    """Median times of functions run alternately (A, B, C, A, B, C, ...) after one warm-up each, so
    that drift in the machine's load hits all alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = CLOCK()
            fn()
            spent.append(CLOCK() - start)
    return tuple(statistics.median(t) for t in times)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return statistics.median(times)


def models():
    import resnet
    import vit

    yield "ResNet-50 (1x3x224x224)", resnet.ResNet50(), (torch.randn(1, 3, 224, 224),), {}
    yield "ViT-B/16 (1x3x224x224)", vit.ViT_B_16(), (torch.randn(1, 3, 224, 224),), {}
    try:
        import transformers
    except ImportError:
        return
    ids = torch.randint(0, 1000, (1, 128))
    yield "BERT-base config (1x128 tokens)", transformers.BertModel(transformers.BertConfig()), (ids,), {}
    cfg = transformers.GPT2Config()
    cfg.use_cache = False
    yield "GPT-2 config (1x128 tokens)", transformers.GPT2Model(cfg), (ids,), {}


def bench_forward_vs_trace(repeats: int, only: str | None = None) -> list[dict]:
    rows = []
    for label, model, args, kwargs in models():
        if only is not None and only not in label:
            continue
        model.eval()

        def bare(model=model, args=args, kwargs=kwargs) -> None:
            with torch.enable_grad():
                model(*args, **kwargs)

        def traced(model=model, args=args, kwargs=kwargs) -> None:
            trace_model(model, args, kwargs=kwargs, training_step=False)

        def rehearsed(model=model, args=args, kwargs=kwargs) -> None:
            trace_model(model, args, kwargs=kwargs)

        forward, trace, full = paired_medians(bare, traced, rehearsed, repeats=repeats)
        rows.append({"model": label, "forward_s": forward, "trace_s": trace, "ratio": trace / forward,
                     "trace_with_step_s": full, "step_ratio": full / trace})
        print(f"{label:34s} forward {forward * 1e3:8.1f} ms  trace {trace * 1e3:8.1f} ms  ratio {trace / forward:5.2f}x"
              f"  with the step {full * 1e3:8.1f} ms ({full / trace:4.2f}x the trace)", flush=True)
    return rows


META_SCRIPT = r"""
import json, sys, time
start = time.perf_counter()
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from neurarch_trace import trace_model
cfg = LlamaConfig(**json.loads(sys.argv[1]))
step = sys.argv[2] == "step"
t0 = time.perf_counter()
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
graph = trace_model(model, torch.randint(0, 1000, (1, 128), device="meta"), training_step=step)
t1 = time.perf_counter()
# VmHWM, not ru_maxrss: a child's ru_maxrss can carry the parent's peak across fork
hwm_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"trace_s": t1 - t0, "total_s": t1 - start, "params": graph["measured"]["params"],
                  "flops": graph["measured"]["flops"], "nodes": len(graph["components"]),
                  "peak_rss_gib": hwm_kib / 2**20}))
"""

LLAMA = {
    "LLaMA-7B config (meta, 1x128)": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                          num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "LLaMA-3-70B config (meta, 1x128)": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                             num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
}


def bench_meta() -> list[dict]:
    rows = []
    try:
        import transformers  # noqa: F401 - the subprocesses need it
    except ImportError:
        return rows
    for label, cfg in LLAMA.items():
        for step in ("plain", "step"):
            out = subprocess.run([sys.executable, "-c", META_SCRIPT, json.dumps(cfg), step], capture_output=True,
                                 text=True, check=True)
            row = {"model": label, "training_step": step == "step", **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{label:34s} {'with the step' if step == 'step' else 'trace only':14s} build+trace "
                  f"{row['trace_s']:6.2f} s (process {row['total_s']:5.2f} s)  peak RSS {row['peak_rss_gib']:.2f} GiB  "
                  f"params {row['params'] / 1e9:.2f}B", flush=True)
    return rows


COLD_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch, resnet
from neurarch_trace import trace_model
model, x = resnet.ResNet18(), torch.randn(1, 3, 224, 224)
t0 = time.perf_counter(); trace_model(model, x, training_step=False); t1 = time.perf_counter()
trace_model(model, x); t2 = time.perf_counter()
trace_model(model, x); t3 = time.perf_counter()
print(json.dumps({"trace_s": t1 - t0, "first_with_step_s": t2 - t1, "second_with_step_s": t3 - t2}))
"""


def bench_cold() -> dict:
    """In a fresh process: a trace, then the first and the second trace with the step (the first
    pays PyTorch's one-time import of its meta kernels)."""
    out = subprocess.run([sys.executable, "-c", COLD_SCRIPT, str(ROOT / "examples" / "models")], capture_output=True,
                         text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"fresh process, ResNet-18: trace {row['trace_s']:.2f} s; first trace with the step "
          f"{row['first_with_step_s']:.2f} s, second {row['second_with_step_s']:.2f} s", flush=True)
    return row


def deep(n: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(4, 4) if i % 2 == 0 else nn.ReLU() for i in range(n)))


def bench_scaling_and_io(repeats: int) -> dict:
    x = torch.randn(1, 4)
    per_layer = {}
    for n in (1000, 4000):
        model = deep(n)
        per_layer[n] = median_time(lambda model=model: trace_model(model, x), max(1, repeats // 2)) / n
    graph = trace_model(deep(9998), x)
    assert len(graph["components"]) == 10_000
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.neurarch.json")
        write_s = median_time(lambda: write_graph(graph, path), repeats)
        read_s = median_time(lambda: read_graph(path, strict=True), repeats)
        size = os.path.getsize(path)
    row = {
        "trace_us_per_layer_1000": per_layer[1000] * 1e6,
        "trace_us_per_layer_4000": per_layer[4000] * 1e6,
        "scaling_ratio_4000_vs_1000": per_layer[4000] / per_layer[1000],
        "write_10k_s": write_s,
        "read_10k_s": read_s,
        "file_bytes_10k": size,
    }
    print(f"deep chain: {row['trace_us_per_layer_1000']:.0f} us/layer at 1,000 layers, "
          f"{row['trace_us_per_layer_4000']:.0f} us/layer at 4,000 (ratio {row['scaling_ratio_4000_vs_1000']:.2f})")
    print(f"10,000-node graph: write {write_s * 1e3:.0f} ms, read+validate {read_s * 1e3:.0f} ms, "
          f"{size / 1e6:.1f} MB", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with process CPU time and one torch thread (for a shared machine)")
    parser.add_argument("--only", default=None, metavar="NAME",
                        help="only the forward-vs-trace models whose label contains NAME; skip the rest")
    args = parser.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
        torch.set_num_threads(1)
    torch.manual_seed(0)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"Python {platform.python_version()}")
    print(f"machine: {machine}; torch threads {torch.get_num_threads()}")
    results = {
        "machine": machine,
        "clock": "process CPU time, 1 torch thread" if args.cpu_time else "wall clock",
        "forward_vs_trace": bench_forward_vs_trace(args.repeats, args.only),
    }
    if args.only is None:
        results["meta"] = bench_meta()
        results["cold"] = bench_cold()
        results["scaling_and_io"] = bench_scaling_and_io(args.repeats)
        results["peak_rss_gib_this_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
