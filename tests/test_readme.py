"""README's two commands: one installs and runs the main job, the other installs what the tests need
and runs them, and ``.ci/run`` runs that second one verbatim."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> List[str]:
    """The indented command lines of README's "Install and the two commands" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install and the two commands", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    return [line for line in lines if not line.startswith("#")]


def test_two_commands() -> None:
    main_job, tests = _commands()
    # the main job installs the package, then traces (the trace itself: test_cli's test_readme_first_command)
    install, trace = main_job.split(" && ")
    assert shlex.split(install)[:2] == ["pip", "install"] and "-e" in shlex.split(install)
    assert shlex.split(trace) == ["neurarch-trace", "examples/models/resnet.py:ResNet18", "--input", "1,3,224,224"]
    steps = tests.split(" && ")
    assert shlex.split(steps[0])[:2] == ["pip", "install"] and ".[test]" in shlex.split(steps[0])
    assert steps[-2:] == ["ruff check .", "python -m pytest"]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, tests = _commands()
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == tests


def test_the_test_extra_brings_what_the_command_runs() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = project["optional-dependencies"]["test"]
    names = {re.split(r"[\[<>=~! ]", requirement, maxsplit=1)[0] for requirement in extra}
    for package in ("pytest", "ruff"):
        assert package in names, package
