"""Shared test helpers: the repository root, the example models, the command line in-process."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from neurarch_trace.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "models"


def load_example(name: str) -> ModuleType:
    """Import ``examples/models/<name>.py`` as a module (registered, so dataclasses work)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_cli(args: list[str], cwd: Path, capfd) -> tuple[int, str, str]:
    """Run ``neurarch-trace ARGS`` in-process from ``cwd``: ``(exit code, stdout, stderr)``."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        code = main(args)
    finally:
        os.chdir(old)
    out, err = capfd.readouterr()
    return code, out, err
