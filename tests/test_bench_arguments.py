"""bench/bench_trace.py refuses a bad command line before it runs for minutes, in one line, and
writes its JSON whole or not at all."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import bench_trace  # noqa: E402


def _args(**overrides: object) -> argparse.Namespace:
    values = dict(repeats=25, cli_repeats=5, json=None, only=None, cli_only=False, skip_cli=False)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_good_arguments_pass() -> None:
    assert bench_trace.check_arguments(_args()) is None
    assert bench_trace.check_arguments(_args(only="ResNet-50", repeats=1, cli_repeats=1)) is None
    assert bench_trace.check_arguments(_args(only="resnet")) is None  # in any case, as --gpu takes names


def test_the_interval_says_when_it_is_not_a_95_percent_one() -> None:
    times = {"neurarch-trace": [0.10, 0.11, 0.12], "torchinfo": [0.12, 0.12, 0.12]}
    few = bench_trace.against_peers(times)["torchinfo"]
    assert few["interval"] == "the whole range (fewer than 6 rounds)"
    assert [round(v, 6) for v in few["interval_ms"]] == [-20.0, 0.0] and few["rounds_faster"] == 2
    times = {tool: values * 3 for tool, values in times.items()}
    assert bench_trace.against_peers(times)["torchinfo"]["interval"] == "95% (sign test)"


def test_the_commit_is_recorded() -> None:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    got = bench_trace.commit()
    assert got is not None and got.split("+")[0] == head.stdout.strip()


@pytest.mark.parametrize("overrides, expected", [
    (dict(repeats=0), "--repeats 0: give a whole number of rounds, at least 1"),
    (dict(repeats=-3), "--repeats -3: give"),
    (dict(cli_repeats=0), "--cli-repeats 0: give"),
    (dict(cli_only=True, skip_cli=True), "--cli-only and --skip-cli leave nothing to run"),
    (dict(only="NoSuchModel"), "'NoSuchModel' names no model; give part of one of: ResNet-50 (1x3x224x224), "),
])
def test_bad_rounds_and_models_are_refused(overrides: dict, expected: str) -> None:
    problem = bench_trace.check_arguments(_args(**overrides))
    assert problem is not None and expected in problem and "\n" not in problem


def test_a_json_path_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    problem = bench_trace.check_arguments(_args(json=str(tmp_path)))
    assert problem == f"--json {tmp_path} is a folder; give a file path such as {tmp_path / 'trace.json'}"
    missing = tmp_path / "no" / "such" / "out.json"
    problem = bench_trace.check_arguments(_args(json=str(missing)))
    assert problem is not None and f"the folder {missing.parent} does not exist" in problem
    assert not missing.parent.exists()
    a_file = tmp_path / "r.json"
    a_file.write_text("{}")
    problem = bench_trace.check_arguments(_args(json=str(a_file / "x.json")))
    assert problem == f"--json {a_file / 'x.json'}: {a_file} is a file, not a folder; give another path"
    problem = bench_trace.check_arguments(_args(json="/proc/out.json"))  # a folder nobody can write in
    assert problem is not None and problem.startswith("--json /proc/out.json: cannot write in /proc (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # the probe left nothing behind


def test_the_json_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    bench_trace.write_json(target, {"clock": "wall clock", "load_at_start": [0.5, 0.25, 0.0]})
    assert json.loads(target.read_text()) == {"clock": "wall clock", "load_at_start": [0.5, 0.25, 0.0]}
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would make it, not mkstemp's 0600
    with pytest.raises(TypeError):  # not serialisable: raised while writing the temporary file
        bench_trace.write_json(target, {"clock": object()})
    assert json.loads(target.read_text())["clock"] == "wall clock"  # the previous file, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]  # no temporary file left behind


@pytest.mark.slow  # the script in a fresh interpreter, which imports torch first: the full run's
def test_the_script_says_it_in_one_line_and_exits_1(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_trace.py"), "--repeats", "0",
                             "--json", str(tmp_path / "out.json")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr == "bench_trace.py: --repeats 0: give a whole number of rounds, at least 1\n"
    assert result.stdout == "" and not (tmp_path / "out.json").exists()
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_trace.py"), "--repeats", "abc"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr == "bench_trace.py: argument --repeats: invalid int value: 'abc'; see --help\n"


_FAULTS = """
import ctypes, resource, sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "steady":
    from allocator import steady_allocator
    assert steady_allocator() is None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 40 << 20  # above glibc's largest adaptive mmap threshold (32 MiB): mapped afresh each time by default
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_steady_allocator_stops_page_faults_on_memory_freed_before() -> None:
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _FAULTS, str(ROOT / "bench"), mode],
                              capture_output=True, text=True, timeout=60, check=True)
        return int(done.stdout)

    assert faults("default") > 40 * 256 // 2  # 40 MiB of 4 KiB pages mapped and faulted in again
    assert faults("steady") < 50  # the same block, kept by malloc: touched without a fault
