"""The neurarch-trace command: the README's first command, flags, and every user error.

Most runs call ``neurarch_trace.cli.main`` in-process (torch is imported once); the front door
(console script, ``python -m``) and the runs that need a fresh interpreter use subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from graph_checks import assert_clean, by_name, sources_of
from helpers import run_cli as run

from neurarch_trace.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESNET = str(ROOT / "examples" / "models" / "resnet.py")
GPT = str(ROOT / "examples" / "models" / "gpt.py")


def run_subprocess(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=full_env, timeout=300)


@pytest.mark.slow
def test_readme_first_command(tmp_path):
    # the console script, as README's first command runs it
    proc = run_subprocess(["neurarch-trace", RESNET + ":ResNet18", "--input", "1,3,224,224"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == "wrote ResNet18.neurarch.json (68 layers, 77 connections)\n"
    graph = json.loads((tmp_path / "ResNet18.neurarch.json").read_text())
    assert_clean(graph)
    assert graph["name"] == "ResNet18"
    assert graph["measured"]["params"] == 11_689_512
    assert graph["description"] == (
        f"Traced by neurarch-trace from {RESNET}:ResNet18 with --input 1,3,224,224:float32."
    )


#: Run the command line, then print which of these modules the process imported.
IMPORTS_PROBE = (
    "import sys\n"
    "from neurarch_trace.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(sorted(m for m in ('torch._dynamo', 'sympy', 'requests', 'urllib3', 'transformers', 'IPython',\n"
    "                         'fastapi', 'uvicorn') if m in sys.modules))\n"
    "sys.exit(code)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_a_trace_imports_no_dynamo_and_no_http_client(tmp_path, device):
    # the command: torch._dynamo alone was a second of it, requests and transformers more
    args = [RESNET + ":ResNet50", "--input", "1,3,224,224", "--device", device, "-o", "r.json"]
    proc = run_subprocess([sys.executable, "-c", IMPORTS_PROBE, *args, "--no-training-step"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # ResNet-50's 102 MB of weights are over --device auto's 64 MiB: it is built on meta, whose
    # Python meta kernels would import sympy (lazy_sympy); on the CPU nothing of the list is imported
    assert proc.stdout == "[]\n"
    assert proc.stderr == "wrote r.json (174 layers, 191 connections)\n"
    # the rehearsed step's meta kernels would import sympy too, and PyTorch's _disable_dynamo
    # wrappers around them and the optimizer's step torch._dynamo (lazy_dynamo)
    proc = run_subprocess([sys.executable, "-c", IMPORTS_PROBE, *args], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[]\n"


@pytest.mark.slow
def test_the_model_code_runs_with_the_collector_on_and_the_imports_frozen(tmp_path):
    """The CLI turns the garbage collector off while torch imports and back on after: the model's
    own code (import, build, forward) runs with it on, torch's objects frozen out of it."""
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import gc, json, pathlib
        from torch import nn
        seen = {"import": [gc.isenabled(), gc.get_freeze_count()]}
        class Net(nn.Linear):
            def __init__(self):
                super().__init__(4, 2)
                seen["build"] = [gc.isenabled(), gc.get_freeze_count()]
            def forward(self, x):
                seen["forward"] = [gc.isenabled(), gc.get_freeze_count()]
                pathlib.Path("seen.json").write_text(json.dumps(seen))
                return super().forward(x)
    """))
    proc = run_subprocess(["neurarch-trace", "m.py:Net", "--input", "1,4", "-o", "-", "--no-training-step",
                           "--device", "cpu"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["import"][0] and seen["build"][0], seen
    assert seen["forward"][0] is False  # the trace pauses it (gc_paused): its records live to its end
    assert min(count for _, count in seen.values()) > 100_000, seen  # torch's objects, frozen


@pytest.mark.slow
def test_the_quick_exit_keeps_exit_codes_output_and_atexit_handlers(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import atexit, pathlib
        from torch import nn
        atexit.register(lambda: pathlib.Path("atexit-ran").write_text("yes"))
        def Net():
            return nn.Linear(4, 2)
    """))
    proc = run_subprocess(["neurarch-trace", "m.py:Net", "--input", "1,4", "-o", "-"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["measured"]["params"] == 10  # the whole graph, flushed
    assert (tmp_path / "atexit-ran").read_text() == "yes"
    proc = run_subprocess([sys.executable, "-m", "neurarch_trace", "m.py:Net", "--input", "1,5"], tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.slow
def test_python_dash_m_and_stdout(tmp_path):
    proc = run_subprocess([sys.executable, "-m", "neurarch_trace", GPT + ":TinyGPT", "--input", "1,32:long", "-o", "-"],
                          tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    graph = json.loads(proc.stdout)
    assert_clean(graph)
    assert by_name(graph)["idx"]["outputShape"] == [32]
    assert list(tmp_path.iterdir()) == []


def test_what_the_model_prints_goes_to_stderr_and_stdout_holds_the_graph(tmp_path, capfd):
    # at import, in the factory and in every forward (the trace and the rehearsed step's runs)
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        from torch import nn
        print("hello from import")
        class Loud(nn.Linear):
            def forward(self, x):
                print("forward says hi")
                return super().forward(x)
        def Net():
            print("building")
            return Loud(4, 2)
    """))
    code, out, err = run(["m.py:Net", "--input", "1,4", "-o", "-"], tmp_path, capfd)
    assert code == 0, err
    assert json.loads(out)["measured"]["params"] == 10
    assert err.splitlines()[:3] == ["hello from import", "building", "forward says hi"]
    assert set(err.splitlines()[2:]) == {"forward says hi"}
    code, out, err = run(["m.py:Net", "--input", "1,4", "-o", "g.json"], tmp_path, capfd)
    assert code == 0 and out == "" and err.splitlines()[-1] == "wrote g.json (1 layer, 2 connections)"


LOUD_BELOW_PYTHON = """
import os, subprocess, sys
from torch import nn
class Loud(nn.Linear):
    def __init__(self):
        super().__init__(4, 2)
        os.write(1, b"os.write to fd 1\\n")
        sys.__stdout__.write("sys.__stdout__\\n")
        sys.__stdout__.flush()
        subprocess.run(["echo", "a child process"], check=True)
"""


def test_what_is_written_to_descriptor_1_goes_to_stderr_too(tmp_path, capfd):
    (tmp_path / "m.py").write_text(LOUD_BELOW_PYTHON)
    code, out, err = run(["m.py:Loud", "--input", "1,4", "-o", "-"], tmp_path, capfd)
    assert code == 0, err
    assert json.loads(out)["measured"]["params"] == 10
    assert err.splitlines()[:3] == ["os.write to fd 1", "sys.__stdout__", "a child process"]


@pytest.mark.slow
def test_a_model_files_atexit_handler_prints_to_stderr(tmp_path):
    # run() calls the atexit handlers itself before its quick exit, after the graph is out
    (tmp_path / "m.py").write_text('import atexit\natexit.register(lambda: print("atexit says bye"))\n'
                                   + LOUD_BELOW_PYTHON)  # in a process of its own: this one's atexit stays clean
    proc = run_subprocess(["neurarch-trace", "m.py:Loud", "--input", "1,4", "-o", "-"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["measured"]["params"] == 10
    assert proc.stderr.splitlines()[-1] == "atexit says bye"


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_a_graph_stdout_cannot_take_is_one_line(tmp_path, capfd, monkeypatch, stdout):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    full = open("/dev/full", "w")  # every write fails with ENOSPC
    monkeypatch.setattr(sys, "stdout", full if stdout == "full" else None)  # None: started with >&-
    try:
        code, _, err = run(["good.py:Net", "--input", "1,4", "-o", "-"], tmp_path, capfd)
    finally:
        monkeypatch.undo()
        full.close()
    reason = "No space left on device" if stdout == "full" else "stdout is closed; give -o PATH to write a file"
    assert (code, err) == (1, f"neurarch-trace: cannot write the graph to stdout: {reason}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.py"]


@pytest.mark.parametrize("extra, message", [
    (["--hf-class", "AutoModel"], "--hf-class applies to hf: targets only: drop it"),  # the default, named
    (["--hf-class", "AutoModelForCausalLM"], "--hf-class applies to hf: targets only: drop it"),
    (["--name", ""], "--name needs a name, e.g. --name resnet50"),
    (["--name", "  "], "--name needs a name, e.g. --name resnet50"),
])
def test_options_that_do_not_apply_are_refused_before_the_trace(tmp_path, capfd, extra, message):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    code, out, err = run(["good.py:raises", "--input", "1,4", *extra], tmp_path, capfd)
    assert (code, out) == (1, "") and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.py"]


def test_version(capfd, tmp_path):
    assert main(["--version"]) == 0
    from neurarch_trace import __version__

    assert capfd.readouterr().out == f"neurarch-trace {__version__}\n"


def test_deterministic_files(tmp_path, capfd):
    for name in ("a.json", "b.json"):
        code, _, _ = run([GPT + ":TinyGPT", "--input", "2,16:long", "-o", name], tmp_path, capfd)
        assert code == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_module_target_from_working_directory(tmp_path, capfd):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("from torch import nn\nclass Head(nn.Linear):\n    pass\n")
    (pkg / "net.py").write_text(textwrap.dedent("""
        from torch import nn
        from mypkg.layers import Head
        def build():
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Head(8, 2))
        model = build()
    """))
    code, out, err = run(["mypkg.net:build", "--input", "3,4", "--name", "Tiny"], tmp_path, capfd)
    assert code == 0, err
    assert err == "wrote Tiny.neurarch.json (3 layers, 4 connections)\n"
    graph = json.loads((tmp_path / "Tiny.neurarch.json").read_text())
    assert [c["type"] for c in graph["components"]] == ["input", "linear", "relu", "linear", "output"]
    assert graph["measured"]["batchSize"] == 3
    code, _, err = run(["mypkg.net:model", "--input", "1,4", "-o", "inst.json"], tmp_path, capfd)
    assert code == 0, err


def test_file_target_with_sibling_import_and_dotted_attr(tmp_path, capfd):
    (tmp_path / "blocks.py").write_text("from torch import nn\ndef block():\n    return nn.Linear(6, 6)\n")
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        from torch import nn
        from blocks import block
        class Zoo:
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = block()
                def forward(self, x):
                    return self.a(x)
    """))
    code, _, err = run(["model.py:Zoo.Net", "--input", "1,6"], tmp_path, capfd)
    assert code == 0, err
    assert (tmp_path / "Net.neurarch.json").exists()


def test_small_vocabulary_long_input_and_keyword_inputs(tmp_path, capfd):
    (tmp_path / "m.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from fixture_models import SmallVocab, KwargsModel
    """))
    code, _, err = run(["m.py:SmallVocab", "--input", "2,40:long", "-o", "v.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "v.json").read_text())
    assert by_name(graph)["emb"]["params"] == {"vocabSize": 100, "embeddingDim": 12}
    assert graph["measured"]["inputs"] == [{"name": "ids", "shape": [2, 40], "dtype": "int64"}]
    code, _, err = run(
        ["m.py:KwargsModel", "--input", "1,9:long", "--input", "token_type_ids=1,9:long",
         "--input", "attention_mask=1,9:long", "-o", "k.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "k.json").read_text())
    assert_clean(graph)
    assert [c["name"] for c in graph["components"] if c["type"] == "input"] == [
        "input_ids", "token_type_ids", "attention_mask"]
    assert sources_of(graph, "fc") == ["attention_mask", "add"]


def test_depth_flag(tmp_path, capfd):
    code, _, err = run([RESNET + ":ResNet18", "--input", "1,3,64,64", "--depth", "1", "-o", "d1.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "d1.json").read_text())
    assert [c["name"] for c in graph["components"]] == [
        "x", "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc", "output"]
    code, _, err = run([RESNET + ":ResNet18", "--input", "1,3,64,64", "--depth", "2", "-o", "d2.json"], tmp_path, capfd)
    graph = json.loads((tmp_path / "d2.json").read_text())
    assert by_name(graph)["layer1.0"]["params"] == {"className": "BasicBlock", "paramCount": 73984}
    assert sum(1 for c in graph["components"] if c.get("scope") == "layer1") == 2


def test_a_keyword_the_forward_swallows_is_told(tmp_path, capfd):
    (tmp_path / "kw.py").write_text(textwrap.dedent("""
        from torch import nn
        class KW(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
            def forward(self, x, mask=None, **kwargs):
                return self.fc(x)
    """))
    code, _, err = run(["kw.py:KW", "--input", "1,4", "--input", "mask=1,4", "--input", "maks=1,4", "-o", "g.json"],
                       tmp_path, capfd)
    assert code == 0
    # 'mask' is named by the forward (it may read it into Python only); 'maks' went into **kwargs
    assert err == ("neurarch-trace: warning: kw.py:7: the forward ignored input 'maks': its **kwargs took it and "
                   "nothing flows from it to a layer or the output; check the name against the forward's arguments\n"
                   "wrote g.json (1 layer, 4 connections)\n")


def test_no_training_step_writes_the_same_graph_without_the_rehearsal(tmp_path, capfd):
    target = [RESNET + ":ResNet18", "--input", "2,3,32,32"]
    assert run([*target, "-o", "full.json"], tmp_path, capfd)[0] == 0
    code, _, err = run([*target, "--no-training-step", "-o", "bare.json"], tmp_path, capfd)
    assert code == 0 and err.startswith("wrote bare.json"), err
    full = json.loads((tmp_path / "full.json").read_text())
    bare = json.loads((tmp_path / "bare.json").read_text())
    # the rehearsal only adds: the step's measurements, and the bytes each layer saves for backward
    assert "training" in full["measured"] and "training" not in bare["measured"]
    assert any("savedBytes" in c["measured"] for c in full["components"])
    assert not any("savedBytes" in c["measured"] for c in bare["components"])
    strip = {"training", "flopsByKind", "device"}  # with the step, auto traces on meta
    assert full["measured"]["device"] == "meta" and bare["measured"]["device"] == "cpu"
    assert {k: v for k, v in full["measured"].items() if k not in strip} == \
        {k: v for k, v in bare["measured"].items() if k not in strip}
    assert [c["name"] for c in full["components"]] == [c["name"] for c in bare["components"]]
    assert full["connections"] == bare["connections"]


# --- errors: exit 1, one line on stderr, nothing written, an existing file untouched ----------

BAD_MODULE = """
from torch import nn
raise RuntimeError("cannot build on this machine")
"""

#: A module of a package, importing its sibling relatively: ``pkg/model.py`` alone cannot run.
RELATIVE = """
from .layers import Net
"""

GOOD_MODULE = """
from torch import nn
def raises():
    raise ValueError("missing config")
def not_a_module():
    return 42
def needs_args(width):
    return nn.Linear(width, width)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
    def forward(self, x):
        return self.fc(x)
"""


@pytest.mark.parametrize(
    "args, message",
    [
        (["nocolon"], "target 'nocolon' names no attribute: write path/to/file.py:Model"),
        (["missing.py:Net", "--input", "1,4"], "file missing.py does not exist: check the path (it is relative to "),
        # an absolute path is relative to nothing: the message says no folder
        (["/no-such-dir/missing.py:Net", "--input", "1,4"],
         "file /no-such-dir/missing.py does not exist: check the path\n"),
        (["bad.py:Net", "--input", "1,4"], "importing bad.py failed: RuntimeError: cannot build on this machine"),
        (["good.py:Nope", "--input", "1,4"],
         "good.py has no attribute 'Nope'; it offers Net, needs_args, not_a_module, raises"),
        (["good.py:raises", "--input", "1,4"], "calling raises() failed: ValueError: missing config"),
        (["good.py:not_a_module", "--input", "1,4"], "not_a_module() returned an int, not a torch.nn.Module"),
        (["good.py:needs_args", "--input", "1,4"], "calling needs_args() failed: TypeError"),
        (["good.py:Net", "--input", "1,x,4"], "--input '1,x,4': dimension 'x' is not a positive integer"),
        (["good.py:Net", "--input", "2,,4"], "--input '2,,4' has an empty dimension"),
        (["good.py:Net", "--input", "1,4", "-o", ""], "-o needs a file name, e.g. -o model.neurarch.json"),
        # sizes no tensor can have: a one-line error, not PyTorch's overflow (a C++ traceback)
        (["good.py:Net", "--input", "1000000000000000000000000000000,4"],
         "4,000,000,000,000,000,000,000,000,000,000 elements are more than any tensor can hold"),
        (["good.py:Net", "--input", "9223372036854775807,4", "--device", "meta"], "elements are more than any tensor"),
        (["good.py:Net", "--input", "1,4:float99"], "unknown dtype 'float99': use one of float32, float,"),
        (["good.py:Net", "--input", "1,4", "--dtype", "floaty"], "unknown dtype 'floaty'"),
        (["good.py:Net"], "no --input given"),
        (["good.py:Net", "--input", "1,5"], "the forward pass failed in layer 'fc' (Linear) after 0 layers with inputs "
                                            "x 1x5 float32: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        (["good.py:Net", "--input", "1,4:long"], "with inputs x 1x4 int64: RuntimeError"),
        (["good.py:Net", "--input", "1,4", "--bogus"], "unrecognized arguments: --bogus"),
        (["good.py:Net", "--input", "-1,4"],
         "argument -i/--input: expected one argument (sizes are positive, batch first: --input 1,3; a value that "
         "starts with '-' reads as an option)"),
        (["nodir/good.py:Net", "--input", "1,4"], "file nodir/good.py does not exist"),
        (["good.py:raises", "--input", "1,4", "--name", "x" * 300],  # refused before the factory runs
         "cannot write " + "x" * 60 + "...: the file name is longer than 255 bytes; give a shorter -o or --name"),
        (["good.py:raises", "--input", "1,4", "-o", "y" * 300 + ".json"], "the file name is longer than 255 bytes"),
        # a name that names no file: refused before the factory runs, not written to model.neurarch.json
        (["good.py:raises", "--input", "1,4", "--name", "\U0001f680\U0001f680"],
         "--name '\U0001f680\U0001f680' has no letter or digit to name the graph's file after; give a name with "
         "one, or -o FILE as well"),
        (["good.py:raises", "--input", "1,4", "--name", "..."], "--name '...' has no letter or digit"),
        (["good.py:raises", "--input", "1,4", "-o", "dangling"], "cannot write dangling: folder "),
        (["pkg/model.py:Net", "--input", "1,4"],
         "importing pkg/model.py failed: ImportError: attempted relative import with no known parent package; a "
         "file target is imported alone, without its package: name it as a module, pkg.model:Attr, from this "
         "folder"),
        (["pkg/sub/net.py:Net", "--input", "1,4"], "name it as a module, pkg.sub.net:Attr, from this folder"),
        (["flat/net.py:Net", "--input", "1,4"],
         "put it in a package (a folder with an __init__.py) and name it as package.module:Attr"),
    ],
)
def test_user_errors(tmp_path, capfd, args, message):
    (tmp_path / "bad.py").write_text(BAD_MODULE)
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    for folder in ("pkg", "pkg/sub", "flat"):
        (tmp_path / folder).mkdir()
        if folder != "flat":
            (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "model.py").write_text(RELATIVE)
    (tmp_path / "pkg" / "sub" / "net.py").write_text(RELATIVE)
    (tmp_path / "flat" / "net.py").write_text(RELATIVE)
    (tmp_path / "dangling").symlink_to(tmp_path / "no-such-folder" / "g.json")  # written through: its folder
    existing = tmp_path / "Net.neurarch.json"
    existing.write_text("earlier good graph")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(args, tmp_path, capfd)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("neurarch-trace: "), err
    assert message in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert existing.read_text() == "earlier good graph"


def test_failed_trace_keeps_an_earlier_file(tmp_path, capfd):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    code, _, _ = run(["good.py:Net", "--input", "1,4", "-o", "net.json"], tmp_path, capfd)
    assert code == 0
    good = (tmp_path / "net.json").read_bytes()
    code, _, err = run(["good.py:Net", "--input", "1,7", "-o", "net.json"], tmp_path, capfd)
    assert code == 1 and "mat1 and mat2" in err
    assert (tmp_path / "net.json").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.py", "net.json"]


def test_output_folder_missing(tmp_path, capfd):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    code, _, err = run(["good.py:Net", "--input", "1,4", "-o", "no/such/g.json"], tmp_path, capfd)
    assert code == 1 and "folder" in err and "does not exist" in err and err.count("\n") == 1


@pytest.mark.parametrize("output", ["/proc/g.neurarch.json", "/sys/g.neurarch.json", None])
def test_a_folder_that_takes_no_file_is_refused_before_the_trace(tmp_path, capfd, output):
    # ``raises`` fails when it is called: the folder's error instead of its own shows that no trace
    # ran. /proc takes no new file (ENOENT), /sys refuses even root (EACCES); None writes to the
    # current folder, here /proc
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    target = f"{tmp_path / 'good.py'}:raises"
    args = [target, "--input", "1,4"] + (["-o", output] if output else [])
    code, out, err = run(args, tmp_path if output else Path("/proc"), capfd)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "missing config" not in err and "Traceback" not in err
    if output is None:
        assert err == ("neurarch-trace: cannot write the graph in the current folder /proc: it takes no new "
                       "files; give -o PATH elsewhere (or -o - for stdout)\n")
    elif output.startswith("/proc"):
        assert err == f"neurarch-trace: cannot write {output}: it takes no new files (folder /proc)\n"
    else:
        assert err == f"neurarch-trace: cannot write {output}: Permission denied (folder /sys)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.py"]


def test_verbose_prints_traceback(tmp_path, capfd):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    code, _, err = run(["good.py:raises", "--input", "1,4", "--verbose"], tmp_path, capfd)
    assert code == 1
    assert "Traceback" in err and "ValueError: missing config" in err
    assert err.rstrip().splitlines()[-1] == "neurarch-trace: calling raises() failed: ValueError: missing config"


@pytest.mark.slow
def test_hf_without_transformers(tmp_path):
    # a transformers package that cannot be imported stands in for a machine without it
    fake = tmp_path / "shadow" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named transformers')\n")
    proc = run_subprocess(
        ["neurarch-trace", "hf:bert-base-uncased"], tmp_path,
        env={"PYTHONPATH": str(tmp_path / "shadow")},
    )
    assert proc.returncode == 1
    assert proc.stderr == (
        "neurarch-trace: hf: targets need the transformers package: pip install transformers "
        "(or pip install -e '.[hf]' in the neurarch-trace checkout)\n"
    )


@pytest.mark.slow
def test_hf_id_not_found_offline(tmp_path):
    # huggingface_hub reads HF_HUB_OFFLINE when it is imported: a fresh interpreter, as a user runs it
    proc = run_subprocess(["neurarch-trace", "hf:no-such-org/no-such-model"], tmp_path,
                          env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")})
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        "neurarch-trace: cannot find Hugging Face model 'no-such-org/no-such-model': HF_HUB_OFFLINE is set "
        "and it is not in the local cache; download it first or pass a local folder (hf:./path)\n"
    )
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("ident", ["acme/tiny llama", "acme/tiny-llama@main", "-acme/x"])
def test_a_malformed_hf_repo_id_is_called_malformed_not_missing(tmp_path, capfd, ident):
    pytest.importorskip("transformers")
    code, out, err = run([f"hf:{ident}", "--input", "1,8:long"], tmp_path, capfd)
    assert code == 1 and out == ""
    assert err == (f"neurarch-trace: hf:{ident} is not a Hugging Face repo id (name or namespace/name, of letters, "
                   "digits, '-', '_' and '.'): give one, such as hf:bert-base-uncased or hf:meta-llama/Llama-2-7b-hf, "
                   "or a local folder (hf:./path)\n")


def test_weights_asked_of_a_config_only_folder_say_to_leave_out_weights(tmp_path, capfd):
    transformers = pytest.importorskip("transformers")
    transformers.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            vocab_size=100).save_pretrained(tmp_path / "bert-config")
    code, out, err = run(["hf:./bert-config", "--weights", "--input", "1,8:long"], tmp_path, capfd)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("neurarch-trace: cannot load the weights of Hugging Face model './bert-config': ")
    assert err.endswith("; leave out --weights to trace it from its config.json alone (shapes, parameters and "
                        "FLOPs do not depend on the weights)\n")
    code, _, _ = run(["hf:./bert-config", "--input", "1,8:long", "--no-training-step"], tmp_path, capfd)
    assert code == 0


def test_user_class_named_like_a_known_layer_is_not_trusted(tmp_path, capfd):
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class RMSNorm(nn.Module):      # the name says norm, the forward is a matmul
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(8, 8))
            def forward(self, x):
                return x @ self.weight
        def Net():
            return nn.Sequential(nn.Linear(8, 8), RMSNorm())
    """))
    code, _, err = run(["m.py:Net", "--input", "1,8", "-o", "g.json"], tmp_path, capfd)
    assert code == 0, err
    node = by_name(json.loads((tmp_path / "g.json").read_text()))["1"]
    assert node["type"] == "customModule"
    assert node["params"] == {"className": "RMSNorm", "paramCount": 64}


def test_nested_attribute_typo_names_the_class(tmp_path, capfd):
    (tmp_path / "zoo.py").write_text("from torch import nn\nclass Zoo:\n    class Net(nn.Linear):\n        pass\n")
    code, _, err = run(["zoo.py:Zoo.Nett", "--input", "1,4"], tmp_path, capfd)
    assert code == 1
    assert err == "neurarch-trace: zoo.py:Zoo has no attribute 'Nett'; it offers Net\n"


def test_output_through_a_symlink_and_an_unwritable_place(tmp_path, capfd):
    (tmp_path / "good.py").write_text(GOOD_MODULE)
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    code, _, err = run(["good.py:Net", "--input", "1,4", "-o", "link.json"], tmp_path, capfd)
    assert code == 0, err
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real.json").read_text())["name"] == "Net"
    code, out, err = run(["good.py:Net", "--input", "1,4", "-o", "/proc/version"], tmp_path, capfd)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("neurarch-trace: cannot write /proc/version"), err
    assert "internal error" not in err


# --- user errors that showed as internal errors or as silence (issue 16.5) ----------------------

EDGE_MODULE = """
import sys
import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
    def forward(self, x):
        return self.fc(x)
class Exits(Net):
    def forward(self, x):
        sys.exit(3)
class ReturnsNone(Net):
    def forward(self, x):
        self.fc(x)
class Warns(Net):
    def forward(self, x):
        return torch.nn.functional.softmax(self.fc(x))
"""


def _one_line_error(err: str) -> None:
    assert err.count("\n") == 1 and err.startswith("neurarch-trace: "), err
    assert "internal error" not in err and "Traceback" not in err


def test_an_input_larger_than_memory_is_one_line(tmp_path, capfd):
    (tmp_path / "m.py").write_text(EDGE_MODULE)
    for extra in (["--device", "cpu"], ["--no-training-step"]):  # the CPU's inputs
        code, out, err = run(["m.py:Net", "--input", "100000000000,4", *extra], tmp_path, capfd)
        assert code == 1 and out == ""
        _one_line_error(err)
        assert "--input '100000000000,4': a 100000000000x4 float32 tensor takes 1,600.0 GB, more than this " in err
        assert "--device meta" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]
    # the default traces on the meta device, which allocates nothing
    code, out, err = run(["m.py:Net", "--input", "100000000000,4", "-o", "g.json"], tmp_path, capfd)
    assert code == 0 and err == "wrote g.json (1 layer, 2 connections)\n", err
    assert json.loads((tmp_path / "g.json").read_text())["measured"]["batchSize"] == 100_000_000_000


def test_a_forward_calling_sys_exit_is_one_line(tmp_path, capfd):
    (tmp_path / "m.py").write_text(EDGE_MODULE)
    code, out, err = run(["m.py:Exits", "--input", "1,4"], tmp_path, capfd)
    assert code == 1 and out == ""
    _one_line_error(err)
    assert "the forward pass called sys.exit(3) after 0 layers" in err
    assert not (tmp_path / "Exits.neurarch.json").exists()


def test_a_forward_returning_none_says_so(tmp_path, capfd):
    (tmp_path / "m.py").write_text(EDGE_MODULE)
    code, out, err = run(["m.py:ReturnsNone", "--input", "1,4"], tmp_path, capfd)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == ("neurarch-trace: warning: m.py:15: ReturnsNone's forward returned no tensor: the graph's "
                        "output node is fed only by the layers whose results nothing used "
                        "(measured.syntheticConnections); return the outputs to connect them")
    # with no output there is no loss to train on: the step is not rehearsed, and the plan would estimate
    assert lines[1] == ("neurarch-trace: note: memory will be estimated from layer outputs: no output of the "
                        "model depends on a trainable parameter, so there is no backward")
    assert lines[2] == "wrote ReturnsNone.neurarch.json (1 layer, 3 connections)"


def test_a_model_warning_is_told_at_the_models_line(tmp_path, capfd):
    (tmp_path / "m.py").write_text(EDGE_MODULE)
    code, out, err = run(["m.py:Warns", "--input", "1,4", "-o", "-"], tmp_path, capfd)
    assert code == 0 and json.loads(out)["name"] == "Warns"
    assert err == ("neurarch-trace: warning: m.py:19: Implicit dimension choice for softmax has been deprecated. "
                   "Change the call to include dim=X as an argument. (UserWarning)\n")
    assert "provenance.py" not in err and "neurarch_trace" not in err


def test_output_under_a_file_says_it_is_a_file(tmp_path, capfd):
    (tmp_path / "m.py").write_text(EDGE_MODULE)
    (tmp_path / "good.json").write_text("earlier")
    code, out, err = run(["m.py:Net", "--input", "1,4", "-o", "good.json/x.json"], tmp_path, capfd)
    assert code == 1
    _one_line_error(err)
    assert err == f"neurarch-trace: cannot write good.json/x.json: {tmp_path / 'good.json'} is a file, not a folder\n"
    assert (tmp_path / "good.json").read_text() == "earlier"


def test_hf_without_network_fails_within_seconds(tmp_path, capfd, monkeypatch, refused_port):
    import time

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{refused_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    code, out, err = run(["hf:no-such-org/no-such-model"], tmp_path, capfd)
    assert time.monotonic() - start < 10  # huggingface_hub's own retries took 30 s
    assert code == 1 and out == ""
    _one_line_error(err)
    assert err.startswith(f"neurarch-trace: cannot reach the Hugging Face hub (127.0.0.1:{refused_port}: ")
    assert err.endswith("and 'no-such-org/no-such-model' is not in the local cache: connect and try again, "
                        "or pass a local folder (hf:./path)\n")


def test_hub_check_times_out_on_a_silent_address():
    import time

    from neurarch_trace.targets import hub_unreachable

    start = time.monotonic()
    # a TEST-NET-1 address (RFC 5737): nothing answers, so the connection can only time out
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", "https://192.0.2.1")
        why = hub_unreachable(timeout=0.5)
    assert why is not None and why.startswith("192.0.2.1:443")
    assert time.monotonic() - start < 3


@pytest.mark.slow
def test_hf_without_network_uses_the_local_cache(tmp_path, refused_port):
    # a hub cache as huggingface_hub lays it out: refs/main names the snapshot holding config.json
    repo = tmp_path / "hf-home" / "hub" / "models--tiny-org--tiny-bert"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    (snapshot / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 50}))
    env = {"HF_HOME": str(tmp_path / "hf-home"), "HF_ENDPOINT": f"http://127.0.0.1:{refused_port}"}
    proc = run_subprocess(["neurarch-trace", "hf:tiny-org/tiny-bert", "-o", "t.json"], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "t.json").read_text())["measured"]["params"] > 0


def test_a_model_attribute_shadowing_a_module_method(tmp_path, capfd):
    # torchview's report: submodules kept in a plain list named `modules` (issue 16.1)
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Embedding(10, 4)
                self.modules = [self.a]
            def forward(self, x):
                return self.modules[0](x)
    """))
    code, _, err = run(["m.py:Net", "--input", "2,4", "-o", "g.json"], tmp_path, capfd)
    assert code == 0, err
    assert [c["type"] for c in json.loads((tmp_path / "g.json").read_text())["components"]] == [
        "input", "linear", "output"]


def test_a_long_list_of_what_a_file_offers_says_it_is_cut(tmp_path, capfd):
    (tmp_path / "many.py").write_text("from torch import nn\n" + "".join(
        f"class M{i:02d}(nn.Module):\n    pass\n" for i in range(15)))
    code, _, err = run(["many.py:Nope", "--input", "1,4"], tmp_path, capfd)
    assert code == 1
    assert err == ("neurarch-trace: many.py has no attribute 'Nope'; it offers "
                   + ", ".join(f"M{i:02d}" for i in range(12)) + ", and 3 more\n")
