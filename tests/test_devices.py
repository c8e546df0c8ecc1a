"""The meta device against the CPU, and ``--device auto``.

A model built on the meta device has no values: a trace there must give the CPU's graph all the
same (parameters, shapes, FLOPs, edges), for every fixture, example and architecture of the sweep;
the models whose forward needs real values are named here. ``--device auto`` (the default) builds on
meta first and traces there (a small model on the CPU when no training step is rehearsed), and falls
back to the CPU when meta cannot run the model: with one note for a big model.
"""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch
from helpers import EXAMPLES
from helpers import run_cli as cli
from test_closed_form import ARCHITECTURES, FIXTURES
from torch import nn

from neurarch_trace import api, trace_model
from neurarch_trace.errors import TraceError
from neurarch_trace.trace.tensors import dtype_name


def to_meta(value):
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, dict):
        return {k: to_meta(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta(v) for v in value)
    return value


def without_device(graph: dict) -> dict:
    measured = {k: v for k, v in graph["measured"].items() if k != "device"}
    if graph["id"] == "withscripted":
        # TorchScript's profiling executor runs other graphs on a module's first calls, so its
        # rehearsed step's bytes depend on how often it was called before, not on the device
        measured.pop("training", None)
    return {**graph, "measured": measured}


why = [""]


def meta_against_cpu(make_model, make_inputs) -> bool:
    """Trace on the CPU and on meta and assert the graphs are the same; False when the meta trace
    needs real values (it must then say so)."""
    torch.manual_seed(0)
    inputs = make_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = trace_model(make_model(), inputs)
        with torch.device("meta"):
            model = make_model()
        try:
            meta = trace_model(model, to_meta(inputs))
        except TraceError as exc:
            why[0] = str(exc)
            return False
    assert meta["measured"]["device"] == "meta" and cpu["measured"]["device"] == "cpu"
    assert sum(cpu["measured"]["flopsByKind"].values()) == cpu["measured"]["flops"]  # every FLOP has a kind
    assert [c["measured"].get("flops") for c in meta["components"]] == \
        [c["measured"].get("flops") for c in cpu["components"]]
    assert without_device(meta) == without_device(cpu)
    return True


#: Fixtures whose forward meta cannot run (none: TorchScript submodules and LSTMs run there too).
FIXTURES_NEEDING_VALUES: set = set()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "ResNet50" else n
                                  for n in sorted(FIXTURES)])  # ResNet-50: a second each way, the full run's
def test_fixtures_on_meta_are_the_cpu_graphs(name):
    ran = meta_against_cpu(*FIXTURES[name])
    assert ran == (name not in FIXTURES_NEEDING_VALUES), why[0]


#: Architectures of the sweep that meta cannot run: BART's decoder asks whether its padding mask is
#: all ones (transformers' ``sdpa_mask``, a ``.item()``), and
#: Mixtral's experts call ``torch._grouped_mm``, whose meta kernel takes bfloat16 only (the CPU
#: kernel takes float32). ``--device auto`` traces them on the CPU.
ARCHITECTURES_NEEDING_VALUES = {"bart": "needs real tensor values", "mixtral": "Expected inputs of BF16 type"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_transformers_sweep_on_meta_is_the_cpu_graphs(arch):
    transformers = pytest.importorskip("transformers")
    make_config, make_inputs = ARCHITECTURES[arch]
    config = make_config()
    ran = meta_against_cpu(lambda: transformers.AutoModel.from_config(config), make_inputs)
    assert ran == (arch not in ARCHITECTURES_NEEDING_VALUES), why[0]
    if not ran:
        assert ARCHITECTURES_NEEDING_VALUES[arch] in why[0]


# --- --device auto ----------------------------------------------------------------------------

MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 4)
        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    class Dyn(nn.Module):  # a data-dependent shape: meta cannot run it
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
        def forward(self, x):
            y = self.fc(x)
            return y[y > 0]

    class InitReads(nn.Module):  # __init__ reads a value: meta cannot build it
        def __init__(self):
            super().__init__()
            rates = torch.linspace(0, 0.1, 3)
            self.blocks = nn.ModuleList(nn.Dropout(float(r)) for r in rates)
            self.fc = nn.Linear(4, 4)
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.fc(x)

    class Greedy(nn.Module):  # small weights, a working buffer no CPU can allocate (512 TiB a sample)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
        def forward(self, x):
            scratch = torch.zeros(x.shape[0], 2**46, device=x.device)
            return self.fc(x) + scratch[:, :4]

    built = Net()  # an instance: its weights are real already
    on_meta = Net().to("meta")  # an instance with no values at all

    class FixedDevice(nn.Module):  # a tensor made on the CPU whatever the device: a device mismatch on meta
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
        def forward(self, x):
            return self.fc(x) + torch.arange(4, device="cpu")

    class InitTypeError(nn.Module):  # a TypeError from inside __init__, not from the call's arguments
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.scale = float(self.fc.weight.detach().numpy().std())
        def forward(self, x):
            return self.fc(x) * self.scale

    class Vast(nn.Module):  # 4 TiB of weights: no CPU builds it
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2**40))
        def forward(self, x):
            return x * self.w[:4]
""")


@pytest.fixture
def models(tmp_path):
    (tmp_path / "m.py").write_text(MODELS)
    return tmp_path


def read(path):
    return json.loads(path.read_text())


def test_auto_traces_on_meta_with_the_step_and_a_small_model_on_the_cpu_without(models, capfd, monkeypatch):
    # with the training step (the default) the rehearsal pays for the meta device: the trace runs there
    code, _, err = cli(["m.py:Net", "--input", "2,3,8,8", "-o", "auto.json"], models, capfd)
    assert code == 0 and err.count("\n") == 1, err
    code, _, err = cli(["m.py:Net", "--input", "2,3,8,8", "--device", "cpu", "-o", "cpu.json"], models, capfd)
    assert code == 0, err
    auto, cpu = read(models / "auto.json"), read(models / "cpu.json")
    assert auto["measured"]["device"] == "meta" and cpu["measured"]["device"] == "cpu"
    assert without_device(auto) == without_device(cpu)
    # without it a small model is built again on the CPU (faster than meta's first use)
    code, _, err = cli(["m.py:Net", "--input", "2,3,8,8", "--no-training-step", "-o", "a.json"], models, capfd)
    assert code == 0 and err.count("\n") == 1, err
    code, _, err = cli(["m.py:Net", "--input", "2,3,8,8", "--no-training-step", "--device", "cpu", "-o", "c.json"],
                       models, capfd)
    assert code == 0, err
    assert read(models / "a.json")["measured"]["device"] == "cpu"
    assert read(models / "a.json") == read(models / "c.json")
    monkeypatch.setattr(api, "AUTO_META_BYTES", 0)  # every model is big: meta, step or not
    code, _, err = cli(["m.py:Net", "--input", "2,3,8,8", "--no-training-step", "-o", "big.json"], models, capfd)
    assert code == 0 and "the meta device could not run" not in err, err
    big = read(models / "big.json")
    assert big["measured"]["device"] == "meta"
    assert without_device(big) == without_device(read(models / "c.json"))


@pytest.mark.slow
def test_auto_without_the_step_keeps_the_cpu_for_models_up_to_64_mib(tmp_path, capfd):
    # ResNet-18's 11.7M float32 parameters (47 MB) are built on the CPU, ResNet-50's 25.6M (102 MB)
    # on meta (api.AUTO_META_BYTES); the graphs are the same either way
    graphs = {}
    for attr in ("ResNet18", "ResNet50"):
        for device in ("auto", "meta" if attr == "ResNet18" else "cpu"):
            code, _, err = cli([str(EXAMPLES / "resnet.py") + ":" + attr, "--input", "1,3,64,64", "--no-training-step",
                                "--device", device, "-o", f"{attr}-{device}.json"], tmp_path, capfd)
            assert code == 0 and err.count("\n") == 1, err
            graphs[attr, device] = read(tmp_path / f"{attr}-{device}.json")
    assert graphs["ResNet18", "auto"]["measured"]["device"] == "cpu"
    assert graphs["ResNet50", "auto"]["measured"]["device"] == "meta"
    assert graphs["ResNet18", "auto"]["measured"]["params"] == 11_689_512  # torchvision's resnet18
    assert without_device(graphs["ResNet18", "auto"]) == without_device(graphs["ResNet18", "meta"])
    assert without_device(graphs["ResNet50", "auto"]) == without_device(graphs["ResNet50", "cpu"])


POSITIONS = """
import torch
from torch import nn
class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 4)
        self.position_embedding = nn.Embedding(8, 4)
    def forward(self, ids):
        return self.tok(ids) + self.position_embedding(torch.arange(ids.shape[1], device=ids.device))
"""


def test_a_meta_trace_past_a_position_table_warns(tmp_path, capfd):
    # a real device raises 'index out of range' past the table's 8 rows; meta checks no index
    (tmp_path / "p.py").write_text(POSITIONS)
    code, _, err = cli(["p.py:Positions", "--input", "2,10:long", "--device", "cpu", "-o", "cpu.json"], tmp_path,
                       capfd)
    assert code == 1 and "index out of range" in err and not (tmp_path / "cpu.json").exists(), err
    code, _, err = cli(["p.py:Positions", "--input", "2,10:long", "-o", "meta.json"], tmp_path, capfd)
    assert code == 0, err
    lines = err.splitlines()
    assert lines == [  # at the model's forward
        "neurarch-trace: warning: p.py:9: position_embedding is a position table of 8 rows, indexed with 10 "
        "positions: on a real device this forward raises 'index out of range' (the meta device checks no index); "
        "trace at most 8 tokens",
        "wrote meta.json (3 layers, 5 connections)"], err
    for tokens, depth in ((8, None), (10, 0)):  # within the table no word; a depth that cuts the table still tells
        args = ["p.py:Positions", "--input", f"2,{tokens}:long", "-o", "g.json"] + (
            ["--depth", str(depth)] if depth is not None else [])
        code, _, err = cli(args, tmp_path, capfd)
        assert code == 0 and ("position table of 8 rows" in err) == (tokens == 10), err


def test_auto_traces_a_small_model_meta_cannot_run_on_the_cpu_without_a_word(models, capfd):
    code, out, err = cli(["m.py:Dyn", "--input", "1,4", "-o", "g.json"], models, capfd)
    assert code == 0 and out == "", err
    lines = err.splitlines()  # its step is rehearsed on meta, which cannot run it: that is said
    assert len(lines) == 2 and "the meta device could not run" not in err, err
    assert lines[0].startswith("neurarch-trace: note: memory will be estimated from layer outputs: the training step")
    assert lines[1] == "wrote g.json (1 layer, 2 connections)"
    assert read(models / "g.json")["measured"]["device"] == "cpu"


@pytest.mark.parametrize("attr, why", [("Dyn", "meta"), ("InitReads", "meta")])
def test_auto_falls_back_to_the_cpu_with_one_note(models, capfd, monkeypatch, attr, why):
    monkeypatch.setattr(api, "AUTO_META_BYTES", 0)
    code, out, err = cli([f"m.py:{attr}", "--input", "1,4", "-o", "g.json"], models, capfd)
    assert code == 0 and out == "", err
    lines = err.splitlines()
    assert lines[0].startswith("neurarch-trace: note: the meta device could not run this model (")
    assert lines[0].endswith("); built and traced it on the CPU") and why in lines[0]
    if attr == "Dyn":  # its forward needs values, and the training step is rehearsed on meta: it says so
        assert lines[1].startswith("neurarch-trace: note: memory will be estimated from layer outputs: the "
                                   "training step")
    assert len(lines) == (3 if attr == "Dyn" else 2), err
    assert lines[-1].startswith("wrote g.json")
    assert read(models / "g.json")["measured"]["device"] == "cpu"
    # --device meta never falls back; it says what to do
    code, _, err = cli([f"m.py:{attr}", "--input", "1,4", "--device", "meta", "-o", "m.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert err.rstrip().endswith("(--device cpu)"), err


def test_auto_traces_on_meta_when_the_cpu_runs_out_of_memory(models, capfd):
    code, out, err = cli(["m.py:Greedy", "--input", "2,4", "-o", "g.json", "--no-training-step"], models, capfd)
    assert code == 0 and out == "", err
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("neurarch-trace: note: the CPU ran out of memory tracing this model (RuntimeError: ")
    assert lines[0].endswith("); built and traced it on the meta device")
    assert lines[1] == "wrote g.json (1 layer, 2 connections)"
    assert read(models / "g.json")["measured"]["device"] == "meta"
    # --device cpu: one line that says what to do, nothing written
    code, _, err = cli(["m.py:Greedy", "--input", "2,4", "--device", "cpu", "-o", "c.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("neurarch-trace: the forward pass ran out of memory after 0 layers with inputs "
                          "x 2x4 float32 (")
    assert err.rstrip().endswith("or trace on the meta device, which allocates nothing (--device meta)")
    assert not (models / "c.json").exists()


def test_auto_keeps_an_instance_where_it_is_and_big_weights_off_the_cpu(models, capfd, monkeypatch):
    monkeypatch.setattr(api, "AUTO_META_BYTES", 0)
    code, _, err = cli(["m.py:built", "--input", "2,3,8,8", "-o", "g.json"], models, capfd)
    assert code == 0 and "the meta device could not run" not in err, err
    assert read(models / "g.json")["measured"]["device"] == "cpu"
    # weights that would not fit in memory are never built on the CPU: the meta error stands
    monkeypatch.setattr(api, "_physical_memory", lambda: 10)
    code, _, err = cli(["m.py:Dyn", "--input", "1,4", "-o", "d.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert "needs real tensor values, which the meta device does not have" in err
    assert not (models / "d.json").exists()


@pytest.mark.parametrize("big", [False, True])
def test_auto_errors_are_the_cpu_errors(models, capfd, monkeypatch, big):
    if big:
        monkeypatch.setattr(api, "AUTO_META_BYTES", 0)
    # the meta kernels accept a long input into a float linear layer; the CPU does not
    for attr in ("Dyn", "Net"):
        shape = "1,4" if attr == "Dyn" else "1,3,8,8"
        code, _, err = cli([f"m.py:{attr}", "--input", f"{shape}:long", "-o", "g.json"], models, capfd)
        assert code == 1 and err.count("\n") == 1, err
        assert f"with inputs x {shape.replace(',', 'x')} int64: RuntimeError" in err
        assert not (models / "g.json").exists()


def test_the_meta_device_refuses_the_dtypes_the_cpu_refuses():
    # an int64 or float16 input into a float32 linear layer runs on meta kernels, not on the CPU's
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    for dtype in (torch.int64, torch.float16):
        with pytest.raises(TraceError) as caught:
            trace_model(model, torch.ones(2, 4, dtype=dtype, device="meta"))
        assert f"layer '0' (Linear) got an input of dtype {dtype_name(dtype)} for its float32 weights, which " \
               "PyTorch's CPU and CUDA kernels refuse" in str(caught.value)
        assert "meta device does not have" not in str(caught.value)  # not a NeedsValuesError
        with pytest.raises(TraceError):  # the CPU refuses it too
            trace_model(nn.Sequential(nn.Linear(4, 3)), torch.ones(2, 4, dtype=dtype))
    # a matrix product in functional code: the FLOP mode checks it on meta as the CPU kernel does
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            return x @ self.w

    with torch.device("meta"):
        functional = Functional()
    with pytest.raises(TraceError, match=r"mm of float16 and float32 operands, which PyTorch's CPU and CUDA kernels "
                                         r"refuse"):
        trace_model(functional, torch.ones(2, 4, dtype=torch.float16, device="meta"))
    with pytest.raises(TraceError, match="expected m1 and m2 to have the same dtype"):
        trace_model(Functional(), torch.ones(2, 4, dtype=torch.float16))
    assert trace_model(functional, torch.ones(2, 4, device="meta"), training_step=False)["measured"]["flops"] == 48
    # under autocast the layer casts its input: both devices run it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graph = trace_model(model, torch.ones(2, 4, dtype=torch.bfloat16, device="meta"), training_step=False)
    assert graph["measured"]["params"] == 15


def test_trace_model_never_moves_a_live_model():
    model = nn.Sequential(nn.Linear(4, 4))
    graph = trace_model(model, torch.randn(1, 4))
    assert graph["measured"]["device"] == "cpu"
    assert model[0].weight.device.type == "cpu"


def test_an_instance_on_meta_is_traced_there_with_or_without_the_step(models, capfd):
    for extra in ([], ["--no-training-step"]):
        code, _, err = cli(["m.py:on_meta", "--input", "2,3,8,8", "-o", "g.json", *extra], models, capfd)
        assert code == 0 and "the meta device could not run" not in err, err
        assert read(models / "g.json")["measured"]["device"] == "meta"


def test_a_device_mismatch_is_not_called_a_need_for_values(models, capfd):
    code, _, err = cli(["m.py:FixedDevice", "--input", "2,4", "--device", "meta", "-o", "g.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert "Tensor on device cpu is not on the expected device meta!; the model holds tensors on another device " \
           "than its inputs" in err
    assert "needs real tensor values" not in err
    code, _, err = cli(["m.py:FixedDevice", "--input", "2,4", "-o", "g.json"], models, capfd)  # auto: the CPU
    assert code == 0 and "the meta device could not run" not in err, err
    assert read(models / "g.json")["measured"]["device"] == "cpu"


def test_a_type_error_inside_init_is_not_blamed_on_arguments(models, capfd):
    code, _, err = cli(["m.py:InitTypeError", "--input", "2,4", "--device", "meta", "-o", "g.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert "called with no arguments" not in err and err.rstrip().endswith("build it on the CPU instead (--device cpu)")


def test_weights_no_cpu_can_hold_are_one_line_that_says_so(models, capfd, monkeypatch):
    code, _, err = cli(["m.py:Vast", "--input", "1,4", "--device", "cpu", "-o", "g.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("neurarch-trace: building Vast() ran out of memory (")
    assert err.rstrip().endswith("build it on the meta device, which allocates nothing (--device meta)")
    # meta cannot run Dyn, and the CPU could not hold its weights: that is said, not "trace on the CPU"
    monkeypatch.setattr(api, "AUTO_META_BYTES", 0)
    monkeypatch.setattr(api, "_physical_memory", lambda: 10)
    code, _, err = cli(["m.py:Dyn", "--input", "1,4", "-o", "d.json"], models, capfd)
    assert code == 1 and err.count("\n") == 1, err
    assert "needs real tensor values, which the meta device does not have" in err
    assert "a CPU trace, which has the values, needs its weights in memory: " in err and "(--device cpu)" not in err


def test_a_config_without_a_kv_cache_traces_on_meta_with_one_note(tmp_path, capfd):
    """transformers' decoders look at the position ids' values for packed sequences when a config
    says ``use_cache: false`` (many fine-tuned checkpoints do) and no attention mask is given: the
    meta device builds such a config with the cache on, says so once, and gives the CPU's layers,
    shapes, parameters and FLOPs."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=500, use_cache=False)
    cfg.save_pretrained(tmp_path / "nocache")
    with torch.device("meta"):
        plain = transformers.LlamaModel(cfg)
    with pytest.raises(TraceError, match="needs real tensor values"):
        trace_model(plain, torch.zeros(1, 16, dtype=torch.long, device="meta"), training_step=False)
    args = ["hf:./nocache", "--input", "1,16:long", "--hf-class", "AutoModelForCausalLM"]
    graphs = {}
    for device in ("meta", "cpu"):
        code, _, err = cli([*args, "--device", device, "-o", f"{device}.json"], tmp_path, capfd)
        assert code == 0, err
        assert ("note: config.json says use_cache: false; traced with use_cache true" in err) == (device == "meta"), err
        assert sum("use_cache" in line for line in err.splitlines()) == (device == "meta"), err
        graphs[device] = json.loads((tmp_path / f"{device}.json").read_text())
    meta, cpu = graphs["meta"], graphs["cpu"]
    assert meta["measured"]["device"] == "meta" and cpu["measured"]["device"] == "cpu"
    for key in ("params", "trainableParams", "flops"):
        assert meta["measured"][key] == cpu["measured"][key], key
    def layers(graph: dict) -> list:
        return [(n["name"], n["type"], n.get("outputShape")) for n in graph["components"]
                if n["type"] not in ("input", "output")]
    assert layers(meta) == layers(cpu) and len(layers(cpu)) > 20
    assert json.loads((tmp_path / "nocache" / "config.json").read_text())["use_cache"] is False  # the file is as it was
    # the step the model runs as configured holds no KV cache: the plan takes it out, as the CPU never had it
    training = meta["measured"]["training"]
    assert training["useCache"] is False and training["kvCacheBytesPerSample"] > 0
    assert "kvCacheBytesPerSample" not in cpu["measured"]["training"]
    from neurarch_trace.planner.analysis import analyse
    lines = {device: [(p.phase, p.per_sample_bytes) for p in analyse(graph).memory.phases]
             for device, graph in graphs.items()}
    # the value tensors of the cache are what flash attention saves as they are: held without the
    # cache too until the backward frees them, so only a backward line past that point differs, by
    # at most their bytes (2 layers x 16 tokens x 2 key/value heads x 16 x 2 B)
    shared = training["kvCacheSavedBytesPerSample"]
    assert shared == 2 * 16 * 2 * 16 * 2
    assert [phase for phase, _ in lines["meta"]] == [phase for phase, _ in lines["cpu"]]
    for (phase, meta_bytes), (_, cpu_bytes) in zip(lines["meta"], lines["cpu"]):
        if phase == "backward":
            assert 0 <= meta_bytes - cpu_bytes <= shared
        else:
            assert meta_bytes == cpu_bytes, phase
