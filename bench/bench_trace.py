"""Benchmark: what tracing costs next to the forward pass it watches, against its peers, from a cold
start, and how it scales.

Run: ``python bench/bench_trace.py [--repeats 25] [--json bench/results/trace.json] [--cpu-time]
[--steady-allocator] [--isolated] [--only NAME] [--cli-repeats 5] [--skip-cli | --cli-only]
[--no-old-release]``

Needs ``torchinfo`` for its column (``pip install -e '.[bench]'``) and ``transformers`` for the
BERT, GPT-2 and ConvNeXt rows and the LLaMA meta rows; whatever is missing is left out. The column
of neurarch-trace 0.1.3, the older release under the PyPI name, comes from ``old_release.py``: it
is fetched once with ``pip download`` into ``~/.cache/neurarch-trace/bench/`` and loaded in this
process under another module name (it imports as ``neurarch_trace`` too); without a network, or
with ``--no-old-release``, it is left out.

``--cpu-time`` times with this process's CPU time and one torch thread instead of the wall clock:
on a machine other jobs share, wall-clock medians swing by 2x while CPU time stays within a few
percent. ``--steady-allocator`` has glibc's ``malloc`` keep the memory it frees, in this process and
in its children (:func:`allocator.steady_allocator`): no timed call page-faults, so a call's
time no longer depends on what the call before it left mapped. ``--only`` keeps the models whose
label contains NAME (``ResNet-50``, ``GPT-2``) and skips the rest of the benchmark. ``--isolated``
also times each tool alone with the bare forward in a child process of its own (``pair.py``;
0.1.3 through ``old_release.py``), so that no tool's time depends on what the others left in the
process (allocator state, caches).

Reports, in one run on this machine:

1. In-process, for ResNet-50, ViT-B/16 (the examples), BERT-base and GPT-2 configs (128 tokens) and
   ConvNeXt-T (transformers' ``ConvNextModel`` with its default, tiny config), 224 px images, batch
   1, CPU, ``eval()``: the time of every runner of :data:`RUNNERS` and its ratio to the bare
   no-grad forward: this project's trace alone (what the peers compute) and with the training-step
   rehearsal the command line adds (what the plan's memory comes from). The runners run in rounds,
   each round every runner once, in an order rotated by one each round, after one warm-up round;
   ``gc.collect()`` runs before each timed call, so a collection the previous runner left pending
   is nobody's. Reported: the median time of each
   over ``--repeats`` rounds, and its ratio to the bare forward from the round-paired differences
   (:func:`summarise`); and, as ``best_ratio``, its fastest round over the bare forward's fastest
   (:func:`best_ratio`); and, as ``against_peers``, the trace's time minus each peer's in the
   same round: its median, a 95% interval for that median, and the rounds the trace won
   (:func:`against_peers`; 0.1.3 among the peers).
2. The command line as a user runs it, whole process (``neurarch-trace
   examples/models/resnet.py:ResNet50 --input 1,3,224,224``, default device, ``--device cpu`` and
   ``--no-training-step``), next to 0.1.3's command with the same arguments,
   ``python -c "import torch"`` (the floor every torch tool pays) and a torchinfo script
   doing the same summary; in alternating rounds, medians of wall time and of the child's CPU time.
3. LLaMA-7B and LLaMA-3-70B configs on the meta device: the trace time (model build included),
   without and with the training-step rehearsal, and the peak resident memory, each in a fresh
   subprocess so the peak is its own.
4. Writing and reading back a graph of 10,000 nodes, and the trace time per layer of deep
   sequential models of 1,000 and 4,000 layers (linear scaling gives a ratio near 1).

Numbers are ratios against a baseline measured in the same process; no target is asserted here.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import old_release  # bench/, the script's own folder
import pair
import torch
from allocator import steady_allocator
from torch import nn
from trace_models import ROOT, Call, best_ratio, child_env, models, rounds, summarise

from neurarch_trace import read_graph, trace_model, write_graph  # noqa: E402
from neurarch_trace.contract.files import unwritable_folder, write_text  # noqa: E402
from neurarch_trace.trace.closed_form import reference_path  # noqa: E402

#: The clock the timings read: the wall clock, or this process's CPU time with ``--cpu-time``.
CLOCK = time.perf_counter


# --- the runners: how each tool makes one pass over a model ----------------------------------------


def bare(model: nn.Module, args: tuple, kwargs: dict) -> Call:
    """The baseline: the model's own forward without autograd, as inference runs it."""

    def run() -> None:
        with torch.no_grad():
            model(*args, **kwargs)

    return run


def neurarch(model: nn.Module, args: tuple, kwargs: dict) -> Call:
    """This project's trace: ``trace_model(..., training_step=False)``, the graph dict built (shapes,
    parameters, FLOPs, edges), nothing written: what the peers compute."""
    return lambda: trace_model(model, args, kwargs=kwargs, training_step=False)


def neurarch_with_step(model: nn.Module, args: tuple, kwargs: dict) -> Call:
    """``trace_model`` as the command line runs it: the trace, then one mixed-precision AdamW
    training step rehearsed on the meta device (what the plan's memory comes from); no peer does
    this part."""
    return lambda: trace_model(model, args, kwargs=kwargs)


def neurarch_reference(model: nn.Module, args: tuple, kwargs: dict) -> Call:
    """This project's reference path: every aten call through the FLOP mode, autograd on (the tracer
    before its fast paths; the graphs are the same)."""

    def run() -> None:
        with reference_path():
            trace_model(model, args, kwargs=kwargs, training_step=False)

    return run


def torchinfo_summary(model: nn.Module, args: tuple, kwargs: dict) -> Optional[Call]:
    """torchinfo's ``summary`` (its hooks, a no-grad forward, the statistics; nothing printed)."""
    try:
        import torchinfo
    except ImportError:
        return None
    return lambda: torchinfo.summary(model, input_data=list(args), verbose=0, **kwargs)


def flop_counter(model: nn.Module, args: tuple, kwargs: dict) -> Call:
    """PyTorch's own ``FlopCounterMode`` around a no-grad forward."""
    from torch.utils.flop_counter import FlopCounterMode

    def run() -> None:
        with torch.no_grad(), FlopCounterMode(display=False):
            model(*args, **kwargs)

    return run


#: ``(column, make(model, args, kwargs) -> call or None)``; the first is the baseline of the ratios.
RUNNERS: List[Tuple[str, Callable[[nn.Module, tuple, dict], Optional[Call]]]] = [
    ("bare forward", bare),
    ("neurarch-trace", neurarch),
    ("neurarch-trace + training step", neurarch_with_step),
    ("torchinfo", torchinfo_summary),
    ("FlopCounterMode", flop_counter),
    ("neurarch-trace, reference path", neurarch_reference),
]


#: The peers this project's trace is compared with, round by round (:func:`against_peers`).
PEERS = ("torchinfo", "FlopCounterMode", old_release.COLUMN)


def old_release_trace(module: Any, model: nn.Module, args: tuple, kwargs: dict) -> Optional[Call]:
    """neurarch-trace 0.1.3's ``trace_model(model, [inputs], name=...)`` from ``module``
    (:func:`old_release.load`), with its own defaults (``eval()``, autograd on); None for a model
    called with keywords, which its ``trace_model`` does not take."""
    if kwargs:
        return None
    name = type(model).__name__
    return lambda: module.trace_model(model, list(args), name=name)


def median_interval(values: List[float], confidence: float = 0.95) -> Tuple[float, float]:
    """A distribution-free interval for the median of ``values`` (order statistics): the k-th
    smallest to the k-th largest, k the largest rank with P(Binomial(n, 1/2) < k) <= (1 -
    confidence) / 2, as the sign test gives it (Conover, *Practical Nonparametric Statistics*,
    3rd ed., section 3.2). Needs at least 6 values for 95%; with fewer, the whole range."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n  # P(Binomial(n, 1/2) = k)
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def against_peers(times: Dict[str, List[float]], tool: str = "neurarch-trace") -> Dict[str, dict]:
    """``tool`` against each peer of :data:`PEERS` that ran, round by round: the median of
    (tool's time - peer's time) in the same round, in ms, its 95% interval
    (:func:`median_interval`), and the rounds in which the tool was faster. A difference whose
    interval straddles 0 is one this machine cannot resolve in this run."""
    out = {}
    for peer in PEERS:
        if peer not in times or tool not in times:
            continue
        diffs = [(a - b) * 1e3 for a, b in zip(times[tool], times[peer])]
        low, high = median_interval(diffs)
        out[peer] = {"median_ms": statistics.median(diffs), "interval_ms": [low, high],
                     "interval": "95% (sign test)" if len(diffs) >= 6 else "the whole range (fewer than 6 rounds)",
                     "rounds_faster": sum(d < 0 for d in diffs), "rounds": len(diffs)}
    return out


def bench_isolated(label: str, repeats: int, steady: bool) -> Dict[str, dict]:
    """Each tool of :data:`pair.TOOLS` alone in a child process with the bare forward, as 0.1.3
    runs (``--isolated``): its ratio and best ratio there, and the bare forward's median."""
    out: Dict[str, dict] = {}
    for tool in pair.TOOLS:
        child = pair.in_process(label, tool, repeats, CLOCK is time.process_time, steady)
        if child is None:
            continue
        seconds, ratio = summarise(child, RUNNERS[0][0])
        out[tool] = {"ratio": ratio[tool], "best_ratio": best_ratio(child, RUNNERS[0][0])[tool],
                     "seconds": seconds[tool], "bare_seconds": seconds[RUNNERS[0][0]]}
    return out


def bench_in_process(repeats: int, only: Optional[str] = None, old: Optional[Path] = None,
                     steady: bool = False, isolated: bool = False) -> List[dict]:
    """The in-process rows (see the module docstring); with ``old``, 0.1.3's folder
    (:func:`old_release.locate`), its column too: loaded in this process under another name
    (:func:`old_release.load`) and timed in the same rounds as the other tools; ``isolated``: each
    tool also alone in a child of its own with the bare forward (:func:`bench_isolated`; 0.1.3 in
    a child whose ``PYTHONPATH`` puts it first, under :func:`allocator.steady_allocator` with
    ``steady``, as this process runs)."""
    rows = []
    old_module = None
    if old is not None:
        try:
            old_module = old_release.load(old)
        except ImportError as exc:
            print(f"neurarch-trace {old_release.VERSION} left out of the in-process rows: {exc}", file=sys.stderr)
    for label, build in models():
        if only is not None and only.lower() not in label.lower():
            continue
        torch.manual_seed(0)
        model, args, kwargs = build()
        model.eval()
        calls = {}
        for column, make in RUNNERS:
            call = make(model, args, kwargs)
            if call is not None:
                calls[column] = call
        if old_module is not None:
            call = old_release_trace(old_module, model, args, kwargs)
            if call is not None:
                calls[old_release.COLUMN] = call
        times = rounds(calls, repeats, CLOCK)
        seconds, ratio = summarise(times, RUNNERS[0][0])
        best = best_ratio(times, RUNNERS[0][0])
        paired = against_peers(times)
        row = {"model": label, "seconds": seconds, "ratio": ratio, "best_ratio": best, "against_peers": paired}
        if isolated:
            row["isolated"] = bench_isolated(label, repeats, steady)
            # 0.1.3 alone: in a child of its own, against the bare forward timed there
            child = None if old is None else old_release.in_process(old, label, repeats, CLOCK is time.process_time,
                                                                     steady)
            if child is not None:
                old_seconds, old_ratio = summarise(child, RUNNERS[0][0])
                column = old_release.COLUMN
                row["isolated"][column] = {"ratio": old_ratio[column],
                                           "best_ratio": best_ratio(child, RUNNERS[0][0])[column],
                                           "seconds": old_seconds[column],
                                           "bare_seconds": old_seconds[RUNNERS[0][0]]}
        rows.append(row)
        shown = "  ".join(f"{k} {v * 1e3:.1f} ms ({ratio[k]:.3f}x, best {best[k]:.3f}x)" for k, v in seconds.items())
        versus = "; ".join(f"minus {peer} {p['median_ms']:+.1f} ms "
                           f"[{p['interval_ms'][0]:+.1f}, {p['interval_ms'][1]:+.1f}],"
                           f" faster in {p['rounds_faster']}/{p['rounds']}" for peer, p in paired.items())
        print(f"{label:34s} {shown}\n{'':34s} trace {versus}", flush=True)
        if repeats < 6:
            print(f"{'':34s} (with {repeats} rounds an interval is the whole range, not a 95% interval)", flush=True)
        if isolated:
            alone = "  ".join(f"{tool} {v['ratio']:.3f}x (best {v['best_ratio']:.3f}x)"
                              for tool, v in row["isolated"].items())
            print(f"{'':34s} each alone with the bare forward: {alone}", flush=True)
    return rows


# --- the command line, cold ---------------------------------------------------------------------

RESNET = str(ROOT / "examples" / "models" / "resnet.py")
TORCHINFO_SCRIPT = (
    "import sys; sys.path.insert(0, {models!r}); import torch, torchinfo, resnet; "
    "torchinfo.summary(resnet.ResNet50(), input_size=(1, 3, 224, 224), verbose=0)"
)


Command = Tuple[List[str], Dict[str, str]]  # the command line and its environment


def cli_commands(out_dir: str, old: Optional[Path] = None) -> Dict[str, Command]:
    """The cold starts to time, by row name; with ``old`` (0.1.3's folder), 0.1.3's own command with
    the same arguments, that folder first on its ``PYTHONPATH``. Every child runs in ``out_dir``
    (:func:`bench_cli`): ``python -m`` puts its working directory first on ``sys.path``, and run
    from this checkout's root, this checkout's package would shadow 0.1.3's (until 2026-12-02 the
    0.1.3 row timed this project)."""
    exe = [sys.executable, "-m", "neurarch_trace"]
    target = [RESNET + ":ResNet50", "--input", "1,3,224,224"]
    env = child_env()
    commands = {
        "neurarch-trace (default device)": (exe + target + ["-o", os.path.join(out_dir, "a.neurarch.json")], env),
        "neurarch-trace --device cpu": (exe + target + ["--device", "cpu", "-o", os.path.join(out_dir, "b.json")],
                                        env),
        "neurarch-trace --no-training-step": (exe + target + ["--no-training-step", "-o",
                                                             os.path.join(out_dir, "c.json")], env),
        "python -c 'import torch'": ([sys.executable, "-c", "import torch"], env),
    }
    _check_package(env, out_dir, str(ROOT / "neurarch_trace"))
    if old is not None:
        old_env = child_env(old)
        _check_package(old_env, out_dir, str(old / "neurarch_trace"))
        commands[f"neurarch-trace {old_release.VERSION} (PyPI)"] = (
            exe + target + ["-o", os.path.join(out_dir, "d.neurarch.json")], old_env)
    try:
        import torchinfo  # noqa: F401
    except ImportError:
        return commands
    commands["torchinfo script"] = ([sys.executable, "-c",
                                     TORCHINFO_SCRIPT.format(models=str(ROOT / "examples" / "models"))], env)
    return commands


def _check_package(env: Dict[str, str], cwd: str, folder: str) -> None:
    """Raise SystemExit unless ``python -m neurarch_trace`` run with ``env`` in ``cwd`` imports the
    package in ``folder`` (this checkout's or 0.1.3's: both are named ``neurarch_trace``)."""
    found = subprocess.run([sys.executable, "-c", "import neurarch_trace; print(neurarch_trace.__file__)"],
                           capture_output=True, text=True, env=env, cwd=cwd).stdout.strip()
    if os.path.dirname(os.path.realpath(found)) != os.path.realpath(folder):
        raise SystemExit(f"the cold-start child imports neurarch_trace from {found or 'nowhere'}, not from {folder}")


def _run_child(command: Command, cwd: str) -> Tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one child process run in ``cwd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command[0], check=True, capture_output=True, env=command[1], cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_cli(repeats: int, old: Optional[Path] = None) -> List[dict]:
    print("command line, cold: examples/models/resnet.py:ResNet50 --input 1,3,224,224, "
          f"medians of {repeats} alternating runs", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        commands = cli_commands(tmp, old)
        names = list(commands)
        for name in names:  # warm the file cache (and write this package's bytecode)
            _run_child(commands[name], tmp)
        walls: Dict[str, List[float]] = {n: [] for n in names}
        cpus: Dict[str, List[float]] = {n: [] for n in names}
        for r in range(repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                wall, cpu = _run_child(commands[name], tmp)
                walls[name].append(wall)
                cpus[name].append(cpu)
    rows = []
    for name in names:
        row = {"command": name, "wall_s": statistics.median(walls[name]), "cpu_s": statistics.median(cpus[name])}
        rows.append(row)
        print(f"{name:34s} whole process {row['wall_s']:5.2f} s wall, {row['cpu_s']:5.2f} s CPU", flush=True)
    return rows


# --- big models on the meta device, and scale ------------------------------------------------------

META_SCRIPT = r"""
import json, sys, time
start = time.perf_counter()
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from neurarch_trace import trace_model
cfg = LlamaConfig(**json.loads(sys.argv[1]))
t0 = time.perf_counter()
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
graph = trace_model(model, torch.randint(0, 1000, (1, 128), device="meta"), training_step=sys.argv[2] == "1")
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


def bench_meta() -> List[dict]:
    rows = []
    try:
        import transformers  # noqa: F401 - the subprocesses need it
    except ImportError:
        return rows
    for label, cfg in LLAMA.items():
        for step in (False, True):
            out = subprocess.run([sys.executable, "-c", META_SCRIPT, json.dumps(cfg), "1" if step else "0"],
                                 capture_output=True, text=True, check=True)
            row = {"model": label, "training_step": step, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{label:34s} {'+ step' if step else 'trace '} build+trace {row['trace_s']:6.2f} s "
                  f"(process {row['total_s']:5.2f} s)  peak RSS {row['peak_rss_gib']:.2f} GiB  "
                  f"params {row['params'] / 1e9:.2f}B", flush=True)
    return rows


def median_time(fn: Call, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        gc.collect()
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return statistics.median(times)


def deep(n: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(4, 4) if i % 2 == 0 else nn.ReLU() for i in range(n)))


def bench_scaling_and_io(repeats: int) -> dict:
    x = torch.randn(1, 4)
    per_layer = {}
    for n in (1000, 4000):
        model = deep(n)
        per_layer[n] = median_time(lambda model=model: trace_model(model, x, training_step=False),
                                   max(1, repeats // 2)) / n
    graph = trace_model(deep(9998), x, training_step=False)
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


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def commit() -> Optional[str]:
    """The checkout's commit (``git rev-parse --short HEAD``, with ``+changes`` when the work tree
    differs from it), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def check_arguments(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the command line, in one line that says what to do, or None: a round
    count below 1, ``--cli-only`` with ``--skip-cli``, a ``--only`` that names no model, a
    ``--json`` path that is a folder, or whose folder is a file, does not exist or takes no new
    file (checked before the benchmark runs for minutes)."""
    for flag, value in (("--repeats", args.repeats), ("--cli-repeats", args.cli_repeats)):
        if value < 1:
            return f"{flag} {value}: give a whole number of rounds, at least 1"
    if args.cli_only and args.skip_cli:
        return "--cli-only and --skip-cli leave nothing to run; give one of them"
    if args.only is not None and not args.cli_only:
        labels = [label for label, _ in models()]
        if not any(args.only.lower() in label.lower() for label in labels):
            return f"--only {args.only!r} names no model; give part of one of: " + ", ".join(labels)
    if args.json:
        target = Path(args.json)
        if target.is_dir():
            return f"--json {args.json} is a folder; give a file path such as {target / 'trace.json'}"
        if target.parent.is_file():
            return f"--json {args.json}: {target.parent} is a file, not a folder; give another path"
        if not target.parent.is_dir():
            return f"--json {args.json}: the folder {target.parent} does not exist; create it or give another path"
        reason = unwritable_folder(str(target.parent))
        if reason is not None:
            return f"--json {args.json}: cannot write in {target.parent} ({reason}); give another path"
    return None


def write_json(target: Path, results: Dict[str, Any]) -> None:
    """Write ``results`` to ``target`` whole or not at all (:func:`write_text`, as graphs are
    written: an interrupted write leaves the previous file as it was)."""
    write_text(json.dumps(results, indent=2) + "\n", target)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line on stderr and exit status 1."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"bench_trace.py: {message}; see --help", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    parser = _Parser(description=" ".join(__doc__.split("\n\n", 1)[0].split()))
    parser.add_argument("--repeats", type=int, default=25, help="timed rounds per model (at least 1)")
    parser.add_argument("--cli-repeats", type=int, default=5, help="runs of each cold command (at least 1)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with process CPU time and one torch thread (for a shared machine)")
    parser.add_argument("--steady-allocator", action="store_true",
                        help="have glibc's malloc keep freed memory, so no timed call page-faults (in-process rows)")
    parser.add_argument("--isolated", action="store_true",
                        help="also time each tool alone with the bare forward in a child process, as 0.1.3 is timed")
    parser.add_argument("--only", default=None, metavar="NAME",
                        help="only the in-process models whose label contains NAME; skip the rest")
    parser.add_argument("--skip-cli", action="store_true", help="leave out the command-line cold starts")
    parser.add_argument("--cli-only", action="store_true", help="only the command-line cold starts")
    parser.add_argument("--no-old-release", action="store_true",
                        help=f"leave out neurarch-trace {old_release.VERSION} (else fetched once with pip)")
    args = parser.parse_args()
    problem = check_arguments(args)
    if problem:
        print(f"bench_trace.py: {problem}", file=sys.stderr)
        sys.exit(1)
    if args.steady_allocator and not args.cli_only:
        problem = steady_allocator()
        if problem:
            print(f"bench_trace.py: --steady-allocator: {problem}; leave the flag out", file=sys.stderr)
            sys.exit(1)
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
        torch.set_num_threads(1)
    torch.manual_seed(0)
    load = os.getloadavg()
    print(f"machine: {machine()}; torch threads {torch.get_num_threads()}; load {load[0]:.2f} {load[1]:.2f}")
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print(f"bench_trace.py: note: load {load[0]:.2f} on {os.cpu_count()} cores: other work shares them, and "
              "wall-clock ratios will be noisy (--cpu-time moves less)", file=sys.stderr)
    results: Dict[str, Any] = {
        "machine": machine(),
        "commit": commit(),
        "repeats": args.repeats,
        "cli_repeats": args.cli_repeats,
        "clock": "process CPU time, 1 torch thread" if args.cpu_time else "wall clock",
        "allocator": "glibc malloc keeping freed memory (--steady-allocator)" if args.steady_allocator
        else "glibc malloc defaults",
        "load_at_start": list(load),
    }
    old = None if args.no_old_release else old_release.locate()
    if args.cli_only:
        results["cli"] = bench_cli(args.cli_repeats, old)
    else:
        results["in_process"] = bench_in_process(args.repeats, args.only, old, args.steady_allocator, args.isolated)
    if args.only is None and not args.cli_only:
        if not args.skip_cli:
            results["cli"] = bench_cli(args.cli_repeats, old)
        results["meta"] = bench_meta()
        results["scaling_and_io"] = bench_scaling_and_io(args.repeats)
        results["peak_rss_gib_this_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    results["load_at_end"] = list(os.getloadavg())
    if args.json:
        try:
            write_json(Path(args.json), results)
        except OSError as exc:
            print(f"bench_trace.py: {exc.strerror or exc}; the results are above", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
