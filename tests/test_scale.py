"""Any size: the meta device, 70B-parameter configs, thousands of layers, progress on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from graph_checks import assert_clean, by_name
from helpers import run_cli as cli
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.errors import TraceError

ROOT = Path(__file__).resolve().parents[1]
RESNET = str(ROOT / "examples" / "models" / "resnet.py")


def test_meta_device_matches_cpu(tmp_path, capfd):
    code, _, err = cli([RESNET + ":ResNet18", "--input", "2,3,64,64", "--device", "cpu", "-o", "cpu.json"], tmp_path,
                       capfd)
    assert code == 0, err
    code, _, err = cli([RESNET + ":ResNet18", "--input", "2,3,64,64", "--device", "meta", "-o", "meta.json"],
                       tmp_path, capfd)
    assert code == 0, err
    cpu = json.loads((tmp_path / "cpu.json").read_text())
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["measured"]["device"] == "meta" and cpu["measured"]["device"] == "cpu"
    for field in ("params", "flops", "buffers", "activationBytes"):
        assert meta["measured"][field] == cpu["measured"][field], field
    assert meta["components"] == cpu["components"]
    assert meta["connections"] == cpu["connections"]


def test_meta_forward_needing_values_fails_in_one_line(tmp_path, capfd):
    (tmp_path / "dyn.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class Dyn(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
            def forward(self, x):
                y = self.fc(x)
                return y[y > 0]
    """))
    code, out, err = cli(["dyn.py:Dyn", "--input", "1,4", "--device", "meta"], tmp_path, capfd)
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert "needs real tensor values, which the meta device does not have" in err
    assert "trace on the CPU instead (--device cpu)" in err
    assert not (tmp_path / "Dyn.neurarch.json").exists()
    code, _, err = cli(["dyn.py:Dyn", "--input", "1,4"], tmp_path, capfd)
    assert code == 0, err


LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                 num_key_value_heads=8, vocab_size=128256)


def llama_params(h: int, inter: int, layers: int, heads: int, kv: int, vocab: int, tied: bool) -> int:
    """Closed form: embeddings, per layer q/k/v/o, a SwiGLU MLP and two RMSNorms, a final norm, the head."""
    head_dim = h // heads
    per_layer = h * h + 2 * h * kv * head_dim + h * h + 3 * h * inter + 2 * h
    return vocab * h + layers * per_layer + h + (0 if tied else vocab * h)


def test_llama3_70b_config_traces_on_meta():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**LLAMA_70B)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    graph = trace_model(model, torch.randint(0, 1000, (1, 128), device="meta"))
    expected = llama_params(8192, 28672, 80, 64, 8, 128256, tied=False)
    assert graph["measured"]["params"] == expected == 70_553_706_496
    assert graph["measured"]["device"] == "meta"
    comps = by_name(graph)
    assert comps["model.layers.79.self_attn.k_proj"]["params"] == {"inFeatures": 8192, "outFeatures": 1024,
                                                                    "bias": False}
    assert comps["lm_head"]["type"] == "lmHead"
    assert comps["lm_head"]["params"]["weightTied"] is False
    # 2 FLOPs per weight per token for every matrix (the embedding is a lookup), plus attention
    matmul_params = expected - 128256 * 8192 - 80 * 2 * 8192 - 8192
    attention = 80 * 4 * 128 * 128 * 8192
    assert graph["measured"]["flops"] == 2 * 128 * matmul_params + attention
    assert_clean(graph)


def test_hf_config_only_folder(tmp_path, capfd):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)
    cfg.save_pretrained(tmp_path / "cfg-only")
    assert sorted(p.name for p in (tmp_path / "cfg-only").iterdir()) == ["config.json"]
    code, _, err = cli(["hf:cfg-only", "--device", "meta", "-o", "g.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "g.json").read_text())
    assert graph["measured"]["device"] == "meta"
    # AutoModel builds the bare LlamaModel: no LM head
    assert graph["measured"]["params"] == llama_params(256, 512, 2, 8, 2, 1000, tied=True)
    with torch.device("meta"):
        reference = transformers.AutoModel.from_config(cfg)
    assert graph["measured"]["params"] == sum(p.numel() for p in reference.parameters())


def test_thousands_of_layers():
    n = 3000
    model = nn.Sequential(*(nn.Linear(4, 4) if i % 2 == 0 else nn.ReLU() for i in range(n)))
    graph = trace_model(model, torch.randn(1, 4))
    assert len(graph["components"]) == n + 2
    assert len(graph["connections"]) == n + 1
    assert graph["components"][-1]["inputs"] == [f"n{n}"]  # the output takes the last layer
    assert graph["components"][-2]["inputs"] == [f"n{n - 1}"]
    assert graph["measured"]["params"] == (n // 2) * 20
    assert_clean(graph)


def test_many_merges_in_one_scope_and_a_wide_concatenation():
    class Wide(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.branches = nn.ModuleList(nn.Linear(4, 1) for _ in range(n))

        def forward(self, x):
            total = x
            for branch in self.branches:
                total = total + branch(x)
            return torch.cat([b(x) for b in self.branches], dim=1) + total.sum(1, keepdim=True)

    graph = trace_model(Wide(1500), torch.randn(1, 4))
    names = [c["name"] for c in graph["components"]]
    assert names.count("add") == 1 and "add#1501" in names
    cat = by_name(graph)["cat"]
    assert len(cat["inputs"]) == 1500
    assert cat["outputShape"] == [1500]


SLOW_MODEL = """
import time
from torch import nn

class Slow(nn.Module):  # longer than the progress line's redraw interval (0.1 s)
    def forward(self, x):
        time.sleep(0.3)
        return x * 2

def Net():
    return nn.Sequential(nn.Linear(4, 4), Slow(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
"""


def test_progress_only_on_a_terminal(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_MODEL)
    script = [sys.executable, "-m", "neurarch_trace", "slow.py:Net", "--input", "1,4", "-o", "p.json"]
    # stderr is a terminal: progress lines, then the final line
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.chdir(tmp_path)
        os.execv(sys.executable, script)
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0
    assert "building the model" in text and "traced 3 layers" in text
    # the step's rehearsal is a phase of its own, after the layers (a new-user pass: a silent stall)
    assert text.index("rehearsing the training step") > text.index("traced 3 layers")
    assert "\x1b[Kwrote p.json" in text
    assert text.rstrip().endswith("wrote p.json (5 layers, 6 connections)")
    # not a terminal: nothing but the final line
    proc = subprocess.run(script, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0
    assert proc.stderr == "wrote p.json (5 layers, 6 connections)\n"
    assert proc.stdout == ""


def test_trace_error_on_meta_is_a_trace_error():
    class Item(nn.Module):
        def forward(self, x):
            return x * float(x.sum())

    with pytest.raises(TraceError, match="meta device"):
        trace_model(nn.Sequential(nn.Linear(2, 2), Item()).to("meta"), torch.randn(1, 2, device="meta"))


def test_meta_inputs_allocate_nothing(tmp_path, capfd):
    # 1 x 3 x 100,000 x 100,000 float32 would be 120 GB on the CPU
    (tmp_path / "conv.py").write_text(
        "from torch import nn\n"
        "def Net():\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 16, stride=16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))\n")
    code, _, err = cli(["conv.py:Net", "--input", "1,3,100000,100000", "--device", "meta", "-o", "g.json"],
                       tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "g.json").read_text())
    assert by_name(graph)["0"]["outputShape"] == [8, 6250, 6250]
    # 8 x 6250 x 6250 outputs, each 3 x 16 x 16 multiply-adds
    assert graph["measured"]["flops"] == 2 * 8 * 6250 * 6250 * 3 * 16 * 16


def test_a_progress_callback_with_steps_hears_of_the_rehearsal() -> None:
    calls = []

    class Steps:
        def __call__(self, layers: int) -> None:
            calls.append(layers)

        def step(self, text: str) -> None:
            calls.append(text)

    trace_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(2, 4), progress=Steps())
    assert calls == [1, 2, 3, "rehearsing the training step"]
    calls.clear()
    trace_model(nn.Sequential(nn.Linear(4, 2)), torch.randn(2, 4), progress=Steps(), training_step=False)
    assert calls == [1]
    seen = []  # a plain callable still works: counts only
    trace_model(nn.Sequential(nn.Linear(4, 2)), torch.randn(2, 4), progress=seen.append)
    assert seen == [1]
