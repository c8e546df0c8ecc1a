"""The models and the timing of ``bench_trace.py``, shared with its child processes
(``old_release.py`` runs neurarch-trace 0.1.3, which imports as ``neurarch_trace`` too, in a process
of its own): nothing here imports this project.

The models: ResNet-50 and ViT-B/16 (``examples/models``), and, with transformers, GPT-2 and
BERT-base configs (1x128 token ids) and ConvNeXt-T (``ConvNextModel``, default config), batch 1,
224 px images, random weights (``torch.manual_seed(0)`` before each build).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "examples" / "models") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples" / "models"))

Call = Callable[[], Any]
Model = Tuple[nn.Module, tuple, dict]


def child_env(first_on_path: Optional[Path] = None) -> Dict[str, str]:
    """The environment of a benchmark's child process: this one's, with bytecode caching on, as
    Python runs by default (a sandbox that sets PYTHONDONTWRITEBYTECODE would have every child
    compile its packages again); with ``first_on_path``, that folder first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if first_on_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(first_on_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_child(command: List[str], env: Dict[str, str], what: str) -> Optional[Dict[str, List[float]]]:
    """Run a timing child (``old_release.py``, ``pair.py``) and return the times its last stdout
    line holds (JSON); None when it failed, with its last stderr line, after ``what``, on stderr."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"{what}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_model(label: str, cpu_time: bool, steady: bool) -> Tuple[nn.Module, tuple, dict, Callable[[], float]]:
    """In a timing child: the model labelled ``label`` (built after ``torch.manual_seed(0)``, in
    ``eval()``), its inputs, and the clock, set up as ``bench_trace.py`` sets up its own process
    (``cpu_time``: process CPU time and one torch thread; ``steady``: ``allocator.steady_allocator``).
    Raises ``SystemExit`` when the allocator cannot be made steady."""
    if steady:
        from allocator import steady_allocator

        problem = steady_allocator()
        if problem:
            raise SystemExit(f"--steady-allocator: {problem}")
    clock: Callable[[], float] = time.perf_counter
    if cpu_time:
        clock = time.process_time
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model, args, kwargs = dict(models())[label]()
    model.eval()
    return model, args, kwargs, clock


def models() -> List[Tuple[str, Callable[[], Model]]]:
    """``(label, build)`` of the in-process models; the transformers ones when it is installed."""
    import resnet
    import vit

    image = (torch.randn(1, 3, 224, 224),)
    rows: List[Tuple[str, Callable[[], Model]]] = [
        ("ResNet-50 (1x3x224x224)", lambda: (resnet.ResNet50(), image, {})),
        ("ViT-B/16 (1x3x224x224)", lambda: (vit.ViT_B_16(), image, {})),
    ]
    try:
        import transformers
    except ImportError:
        return rows
    ids = (torch.randint(0, 1000, (1, 128)),)

    def gpt2() -> Model:
        cfg = transformers.GPT2Config()
        cfg.use_cache = False
        return transformers.GPT2Model(cfg), ids, {}

    rows += [
        ("GPT-2 config (1x128 tokens)", gpt2),
        ("BERT-base config (1x128 tokens)", lambda: (transformers.BertModel(transformers.BertConfig()), ids, {})),
        ("ConvNeXt-T config (1x3x224x224)",
         lambda: (transformers.ConvNextModel(transformers.ConvNextConfig()), image, {})),
    ]
    return rows


def rounds(calls: Dict[str, Call], repeats: int,
           clock: Callable[[], float] = time.perf_counter) -> Dict[str, List[float]]:
    """The times of each call in ``repeats`` rounds; each round runs every call once, starting one
    further along each round, after a warm-up round; a ``gc.collect()`` before each call; timed
    by ``clock``."""
    names = list(calls)
    for name in names:
        calls[name]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            gc.collect()
            start = clock()
            calls[name]()
            times[name].append(clock() - start)
    return times


def summarise(times: Dict[str, List[float]], base: str) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Median seconds of each call, and its ratio to ``base``: 1 + the median over rounds of its
    time minus the base's time in the same round, over the base's median. Pairing by round takes
    out most of a shared machine's drift, which moves a whole round at once."""
    seconds = {name: statistics.median(t) for name, t in times.items()}
    base_times = times[base]
    ratio = {name: 1 + statistics.median(a - b for a, b in zip(t, base_times)) / seconds[base]
             for name, t in times.items()}
    return seconds, ratio


def best_ratio(times: Dict[str, List[float]], base: str) -> Dict[str, float]:
    """Each call's fastest round over the base's fastest round: what is left when the machine's
    other work (which only ever adds time) is least in the way; on this shared machine it moves
    less between runs than the median (``timeit``'s advice for the same reason)."""
    fastest = min(times[base])
    return {name: min(t) / fastest for name, t in times.items()}
