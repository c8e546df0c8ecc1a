"""``torch._dynamo`` stays unimported through a trace and its rehearsed step, and PyTorch's
``_disable_dynamo`` wrappers are left as they were found (``neurarch_trace.lazy_dynamo``).

Each check runs in a fresh interpreter: whether a module is imported is a property of a process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: A model whose meta kernels are PyTorch's Python references and decompositions (batch norm,
#: layer norm, GELU, ``torch.zeros`` in ``__init__``), traced on meta with the step rehearsed.
SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    from neurarch_trace import trace_model

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.token = nn.Parameter(torch.zeros(1, 8))
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 4)
        def forward(self, x):
            y = self.bn(self.conv(x)).mean((2, 3)) + self.token
            return self.fc(nn.functional.gelu(self.norm(y)))

    if sys.argv[1] == "compiled-before":
        import torch._dynamo
    with torch.device("meta"):
        model = Net()
    graph = trace_model(model, torch.randn(2, 3, 8, 8, device="meta"))
    assert "error" not in graph["measured"]["training"], graph["measured"]["training"]
    print("dynamo imported:", "torch._dynamo" in sys.modules)
    from neurarch_trace.lazy_dynamo import CACHE, _wrapped_functions
    print("caches left:", sum(1 for fn in _wrapped_functions() if fn.__dict__.get(CACHE) is fn))
    import torch._dynamo
    torch._refs.add(torch.ones(2, device="meta"), torch.ones(2, device="meta"))  # dynamo marks it now
    inner = [f for f in _wrapped_functions() if CACHE in f.__dict__]
    print("marked by dynamo:", all(f.__dict__[CACHE] is not f for f in inner) and len(inner) > 0)
""")


def run(mode: str) -> str:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_a_meta_trace_and_its_step_import_no_dynamo_and_leave_the_wrappers_as_found():
    out = run("fresh")
    assert out == "dynamo imported: False\ncaches left: 0\nmarked by dynamo: True\n"


@pytest.mark.slow
def test_a_process_that_imported_dynamo_keeps_dynamo_marking_the_wrappers():
    out = run("compiled-before")
    assert out == "dynamo imported: True\ncaches left: 0\nmarked by dynamo: True\n"


#: A model with a ``torch.compile``d submodule, and the same model eager: one graph, CPU and meta.
COMPILED = textwrap.dedent("""
    import json, sys, time, warnings
    import torch
    from torch import nn
    from neurarch_trace import trace_model

    class Net(nn.Module):
        def __init__(self, compiled):
            super().__init__()
            self.fc = nn.Linear(16, 8)
            head = nn.Sequential(nn.Linear(8, 8), nn.GELU())
            self.head = torch.compile(head, backend="aot_eager", dynamic=True) if compiled else head
        def forward(self, x):
            return self.head(self.fc(x))

    graphs = {}
    for compiled in (False, True):
        for device in ("cpu", "meta"):
            torch.manual_seed(0)
            with torch.device(device):
                model = Net(compiled)
            g = trace_model(model, torch.randn(2, 16, device=device))
            g["measured"].pop("device")
            graphs[(compiled, device)] = g
    eager = graphs[(False, "cpu")]
    def step(g):  # the compiled tree has one scope more, head._orig_mod, with head's saved bytes
        training = dict(g["measured"]["training"])
        scopes = training.pop("scopeSavedBytes")
        return {**g["measured"], "training": training}, {k: v for k, v in scopes.items() if k != "head._orig_mod"}
    print(all(step(g) == step(eager) for g in graphs.values())
          and graphs[(True, "cpu")]["measured"] == graphs[(True, "meta")]["measured"],
          [c["type"] for c in graphs[(True, "meta")]["components"]],
          eager["measured"]["training"]["activationBytesPerSample"])
""")


@pytest.mark.slow
def test_a_compiled_submodule_is_traced_and_rehearsed_as_the_eager_one():
    # dynamo compiled the tracer's own code around it: 17 s and about 40 recompilations per trace,
    # and a step that differed between the CPU and meta and between calls (a new-user pass)
    proc = subprocess.run([sys.executable, "-c", COMPILED], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True ['input', 'linear', 'linear', 'gelu', 'output'] 88.0\n"
    assert "recompil" not in proc.stderr
