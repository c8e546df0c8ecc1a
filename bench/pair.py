"""One tool against the bare forward, alone in a process of its own: ``bench_trace.py --isolated``.

``old_release.py`` runs neurarch-trace 0.1.3 this way because it must (it imports as
``neurarch_trace`` too): a child process that times only the bare forward and 0.1.3, in rounds.
The in-process rows time every tool in one process, in rotation with the others, the rehearsed
training step among them, which leaves the CPU caches and the allocator as it left them; a tool
that runs much Python between big kernels may pay for that more than the bare forward does. So
that every tool can be compared with 0.1.3 on the same footing, this child does for one of
``bench_trace.RUNNERS`` what 0.1.3's does: ``python bench/pair.py LABEL REPEATS TOOL [--cpu-time]
[--steady-allocator]`` builds the model labelled ``LABEL`` (``trace_models.models()``), times the
bare forward and ``TOOL`` in ``REPEATS`` rounds as ``bench_trace.py`` times its runners, and prints
one JSON line: the times of both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from trace_models import child_env, child_model, rounds, run_child

#: The tools a child can time alone (``bench_trace.RUNNERS``' columns, the bare forward aside).
TOOLS = ("neurarch-trace", "torchinfo", "FlopCounterMode")


def in_process(label: str, tool: str, repeats: int, cpu_time: bool, steady: bool) -> Optional[Dict[str, List[float]]]:
    """The times of the bare forward and of ``tool`` on the model ``label``, in a child process;
    None when the child failed (its last line on stderr)."""
    command = [sys.executable, str(Path(__file__).resolve()), label, str(repeats), tool]
    command += ["--cpu-time"] if cpu_time else []
    command += ["--steady-allocator"] if steady else []
    return run_child(command, child_env(), f"{tool} alone on {label}")


def _child(label: str, repeats: int, tool: str, cpu_time: bool, steady: bool) -> None:
    if tool not in TOOLS:
        raise SystemExit(f"unknown tool {tool!r}; give one of {', '.join(TOOLS)}")
    model, args, kwargs, clock = child_model(label, cpu_time, steady)
    from bench_trace import RUNNERS

    makers = dict(RUNNERS)
    base = RUNNERS[0][0]
    call = makers[tool](model, args, kwargs)
    if call is None:
        raise SystemExit(f"{tool} is not installed")
    print(json.dumps(rounds({base: makers[base](model, args, kwargs), tool: call}, repeats, clock)))


if __name__ == "__main__":
    flags = sys.argv[4:]
    _child(sys.argv[1], int(sys.argv[2]), sys.argv[3], "--cpu-time" in flags, "--steady-allocator" in flags)
