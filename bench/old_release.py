"""neurarch-trace 0.1.3, the older release that holds the PyPI name, as a peer of ``bench_trace.py``.

:func:`locate` finds (or fetches, ``pip download --no-deps neurarch-trace==0.1.3``, once, into
``~/.cache/neurarch-trace/bench/``) its wheel and unpacks it. Nothing of it is copied into this
project. It imports as ``neurarch_trace`` too, so the benchmark runs it in one of two ways:

* in the benchmark's own process, beside this project, under another module name (:func:`load`:
  ``neurarch_trace_0_1_3``; its modules import one another only relatively, so nothing of it
  reaches this project's package, and the name it gives itself is checked): every tool in the
  same rounds, as the issue measured them, and a round-by-round difference against it;
* in a child process whose ``PYTHONPATH`` puts that folder first (``--isolated`` times each tool
  alone that way): ``python bench/old_release.py LABEL REPEATS [--cpu-time] [--steady-allocator]``
  times the bare no-grad forward and 0.1.3's ``trace_model(model, [inputs], name=...)`` (its own
  defaults: ``eval()``, autograd on) on the model of ``trace_models.models()`` labelled ``LABEL``,
  in rounds as ``bench_trace.py`` times its own runners, and prints one JSON line: the times of both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional

from trace_models import child_env, child_model, rounds, run_child

VERSION = "0.1.3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "neurarch-trace" / "bench"
FOLDER = CACHE / f"neurarch-trace-{VERSION}"
COLUMN = f"neurarch-trace {VERSION} (PyPI)"
#: The module name 0.1.3 is loaded under in the benchmark's process (:func:`load`).
ALIAS = "neurarch_trace_0_1_3"


def locate(fetch: bool = True) -> Optional[Path]:
    """The folder holding 0.1.3's ``neurarch_trace`` package, fetched from PyPI with pip when it is
    not there yet and ``fetch`` is set; None (and one line on stderr saying why) when it cannot be
    had (no network, no pip)."""
    if (FOLDER / "neurarch_trace" / "__init__.py").is_file():
        return FOLDER
    if not fetch:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                              "-d", tmp, f"neurarch-trace=={VERSION}"], capture_output=True, text=True, timeout=300)
        wheels = sorted(Path(tmp).glob("neurarch_trace-*.whl"))
        if got.returncode != 0 or not wheels:
            reason = (got.stderr.strip().splitlines() or ["no wheel"])[-1]
            print(f"neurarch-trace {VERSION} left out: pip could not download it ({reason})", file=sys.stderr)
            return None
        FOLDER.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(FOLDER)
    return FOLDER


def load(folder: Path) -> ModuleType:
    """0.1.3's package from ``folder`` (:func:`locate`), imported as :data:`ALIAS` beside this
    project's ``neurarch_trace``; its ``trace_model(model, [inputs], name=...)`` is the peer.

    Raises:
        ImportError: the folder holds no such package, or one that is not 0.1.3, or one that
            took the name ``neurarch_trace`` (an absolute import of its own name).
    """
    if ALIAS in sys.modules:
        return sys.modules[ALIAS]
    package = folder / "neurarch_trace"
    spec = importlib.util.spec_from_file_location(ALIAS, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    if spec is None or spec.loader is None:
        raise ImportError(f"no neurarch_trace package in {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ALIAS] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[ALIAS]
        raise
    if getattr(module, "__version__", None) != VERSION:
        raise ImportError(f"{package} is neurarch-trace {getattr(module, '__version__', '?')}, not {VERSION}")
    ours = sys.modules.get("neurarch_trace")
    if ours is not None and str(package) in str(getattr(ours, "__file__", "")):
        raise ImportError(f"0.1.3 was imported as neurarch_trace itself ({ours.__file__})")
    return module


def in_process(folder: Path, label: str, repeats: int, cpu_time: bool,
               steady: bool = False) -> Optional[Dict[str, List[float]]]:
    """The times of the bare forward and of 0.1.3's trace on the model ``label``, in a child (with
    ``steady``, under ``allocator.steady_allocator`` as the parent); None when the child failed
    (its last line on stderr)."""
    command = [sys.executable, str(Path(__file__).resolve()), label, str(repeats)]
    command += ["--cpu-time"] if cpu_time else []
    command += ["--steady-allocator"] if steady else []
    return run_child(command, child_env(folder), f"neurarch-trace {VERSION} on {label}")


def _child(label: str, repeats: int, cpu_time: bool, steady: bool) -> None:
    import torch

    model, args, kwargs, clock = child_model(label, cpu_time, steady)
    import neurarch_trace

    if getattr(neurarch_trace, "__version__", None) != VERSION:
        raise SystemExit(f"expected neurarch-trace {VERSION} first on PYTHONPATH, found {neurarch_trace.__file__}")

    def bare() -> None:
        with torch.no_grad():
            model(*args, **kwargs)

    def old() -> None:
        neurarch_trace.trace_model(model, list(args), name=type(model).__name__)

    print(json.dumps(rounds({"bare forward": bare, COLUMN: old}, repeats, clock)))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), "--cpu-time" in sys.argv[3:], "--steady-allocator" in sys.argv[3:])
