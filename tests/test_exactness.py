"""Exact statistics, and the forwards that break other tracers (issue: "Exact where other tools are
wrong"). Every expected number is computed here, independently of the tracer, with its working."""

from __future__ import annotations

import warnings
from pathlib import Path

import fixture_models as fm
import pytest
import torch
from graph_checks import assert_clean, by_name, sources_of
from helpers import load_example
from torch import nn

from neurarch_trace import trace_model

ROOT = Path(__file__).resolve().parents[1]


def unique_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields each Parameter once


def node_param_sum(graph: dict) -> int:
    return sum(c["measured"].get("params", 0) for c in graph["components"])


# --- totals ---------------------------------------------------------------------------------


def test_totals_and_per_node_fields():
    model = fm.TwoInput()
    model.meta.weight.requires_grad_(False)
    graph = trace_model(model, (torch.randn(2, 3, 8, 8), torch.randn(2, 5)))
    m = graph["measured"]
    assert m["params"] == unique_params(model) == 112 + 24 + 18
    assert m["frozenParams"] == 5 * 4 and m["trainableParams"] == m["params"] - 20
    assert m["paramBytes"] == 4 * m["params"]
    assert m["batchSize"] == 2
    assert m["inputs"] == [{"name": "image", "shape": [2, 3, 8, 8], "dtype": "float32"},
                           {"name": "input:meta", "shape": [2, 5], "dtype": "float32"}]
    from neurarch_trace import __version__

    assert m["tool"] == f"neurarch-trace/{__version__}"
    conv = by_name(graph)["conv"]["measured"]
    # conv 3->4, 3x3, 8x8 output, batch 2: 2 FLOPs x 2 x 4 x 8 x 8 x 3 x 3 x 3 MACs
    assert conv["flops"] == 2 * 2 * 4 * 8 * 8 * 3 * 3 * 3
    assert conv["outputDtype"] == "float32"
    assert conv["outputBytes"] == 2 * 4 * 8 * 8 * 4
    assert m["flops"] == m["layerFlops"] + m["functionalFlops"]
    assert m["flops"] == 2 * 2 * 4 * 64 * 27 + 2 * 2 * 5 * 4 + 2 * 2 * 8 * 2
    assert node_param_sum(graph) == m["params"]


def test_buffers_counted():
    model = load_example("resnet").ResNet18()
    graph = trace_model(model, torch.randn(1, 3, 32, 32))
    buffers = sum(b.numel() for b in model.buffers())
    assert graph["measured"]["buffers"] == buffers == 20 * (2 * 0 + 1) + 2 * sum(
        m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    assert sum(c["measured"].get("buffers", 0) for c in graph["components"]) == buffers


# --- 1. parameters and buffers read in forward --------------------------------------------------


def test_vit_class_token_and_position_embedding():
    model = fm.TinyViT()
    graph = trace_model(model, torch.randn(1, 3, 32, 32))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["cat"]["type"] == "concatenate"
    assert comps["cat"]["measured"]["params"] == model.cls_token.numel() == 32
    assert comps["cat"]["outputShape"] == [17, 32]
    assert comps["add"]["type"] == "add"
    assert comps["add"]["measured"]["params"] == model.pos_embed.numel() == 17 * 32
    assert sources_of(graph, "cat") == ["patch_embed"]
    assert sources_of(graph, "add") == ["cat"]
    # a conv with stride = kernel is a conv: its shapes do not make it a patch embedding (issue 16.3)
    assert comps["patch_embed"]["type"] == "conv2d"
    assert comps["patch_embed"]["params"] == {"inChannels": 3, "outChannels": 32, "kernelSize": 8, "stride": 8,
                                              "padding": 0}
    assert node_param_sum(graph) == unique_params(model) == graph["measured"]["params"]
    assert graph["measured"]["unusedParams"] == 0
    # the learned operands are named on the merge (issue 16.4): one edge in, two operands
    assert comps["cat"]["measured"]["paramOperands"] == [{"operand": 0, "params": ["cls_token"]}]
    assert comps["cat"]["measured"]["inputShapes"] == [[1, 32], [16, 32]]
    assert comps["add"]["measured"]["paramOperands"] == [{"operand": 1, "params": ["pos_embed"]}]
    assert comps["add"]["measured"]["inputShapes"] == [[17, 32], [1, 17, 32]]
    residuals = [c for c in graph["components"] if c["type"] == "add" and c["name"] != "add"]
    assert residuals and all("paramOperands" not in c["measured"] for c in residuals)


def test_learned_buffer_and_gated_operands():
    class Sinusoid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.register_buffer("table", torch.randn(5, 8))

        def forward(self, x):
            return self.fc(x) + self.table

    graph = trace_model(Sinusoid(), torch.randn(2, 5, 8))
    assert by_name(graph)["add"]["measured"]["paramOperands"] == [{"operand": 1, "buffers": ["table"]}]
    gated = trace_model(fm.GatedResidual(), torch.randn(1, 8))  # x + gate * block(x): both computed
    assert "paramOperands" not in by_name(gated)["add"]["measured"]


def test_learned_gate_owned_by_container():
    model = fm.GatedResidual()
    graph = trace_model(model, torch.randn(1, 8))
    assert_clean(graph)
    assert sources_of(graph, "add") == ["x", "block"]
    assert by_name(graph)["add"]["measured"]["params"] == 8  # the gate
    assert node_param_sum(graph) == unique_params(model) == 72 + 8 + 18


def test_totals_walk_yields_what_pytorch_iterators_yield():
    """The one walk behind ``measured.params`` and ``buffers`` gives each parameter and buffer
    once, in PyTorch's order, on a model with a tied weight, a module under two parents, a shared
    buffer and a None entry in a registry."""
    from neurarch_trace.walk import parameters_and_buffers

    model = fm.SharedParents()
    model.tied = nn.Linear(8, 8)
    model.tied.weight = model.enc[0].weight
    model.register_buffer("scale", torch.ones(3))
    model.enc[0].register_buffer("scale", model.scale)
    model.register_parameter("absent", None)
    params, buffers = parameters_and_buffers(model)
    assert [id(p) for p in params] == [id(p) for p in model.parameters()]
    assert [id(b) for b in buffers] == [id(b) for b in model.buffers()]
    assert len(buffers) == 1 and len(params) == len(list(model.parameters())) > 0
    graph = trace_model(model, torch.randn(1, 8))
    assert graph["measured"]["params"] == unique_params(model)
    assert graph["measured"]["buffers"] == 3


# --- 2. tied weights ----------------------------------------------------------------------------


def test_tied_lm_head_counted_once():
    model = fm.TiedLM()
    graph = trace_model(model, torch.randint(0, 64, (1, 5)))
    head = by_name(graph)["lm_head"]
    assert head["type"] == "lmHead"
    assert head["params"]["weightTied"] is True
    assert head["measured"]["params"] == 0
    assert graph["measured"]["params"] == unique_params(model) == 64 * 16 + 16 * 16 + 16
    assert node_param_sum(graph) == graph["measured"]["params"]
    # the head still costs its matmul: 5 tokens x 16 x 64 MACs
    assert head["measured"]["flops"] == 2 * 5 * 16 * 64


# --- 3. shared modules --------------------------------------------------------------------------


def test_module_under_two_parents():
    model = fm.SharedParents()
    graph = trace_model(model, torch.randn(1, 8))
    assert_clean(graph)
    assert [c["name"] for c in graph["components"]] == ["x", "enc.0", "enc.1", "dec.0", "dec.1", "output"]
    comps = by_name(graph)
    assert comps["enc.1"]["measured"]["params"] == 72
    assert comps["dec.0"]["measured"]["params"] == 0
    assert comps["dec.0"]["measured"]["sharedWith"] == comps["enc.1"]["id"]
    assert comps["dec.0"]["scope"] == "dec"
    assert node_param_sum(graph) == unique_params(model) == 72 + 72 + 27
    assert graph["measured"]["flops"] == 2 * (8 * 8 * 3 + 8 * 3)


# --- 4. output containers -----------------------------------------------------------------------


def test_nested_tuples_lists_named_tuple_and_dataclass():
    model = fm.Containers()
    graph = trace_model(model, torch.randn(2, 8))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["nested"]["measured"]["outputShapes"] == [[8], [8], [8]]
    assert comps["named"]["measured"]["outputShapes"] == [[8], [4]]
    assert comps["named"]["outputShape"] == [8]
    assert sources_of(graph, "output") == ["head", "named"]
    assert comps["output"]["measured"]["outputShapes"] == [[3], [4]]
    assert node_param_sum(graph) == unique_params(model)


def test_model_output_from_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=50)
    model = transformers.BertModel(cfg)
    graph = trace_model(model, torch.randint(0, 2, (1, 8)))
    assert sources_of(graph, "output") == ["encoder.layer.0.output.LayerNorm", "pooler.activation"]
    assert by_name(graph)["output"]["measured"]["outputShapes"] == [[8, 32], [32]]


# --- 5. sequence-first layouts ------------------------------------------------------------------


def test_sequence_first_lstm_states():
    model = fm.SeqFirstLSTM()
    graph = trace_model(model, torch.randn(3, 6, 10))
    comps = by_name(graph)
    assert comps["lstm"]["inputShape"] == [6, 10]
    # output (L, N, H) -> [6, 20]; h_n and c_n (layers, N, H) -> [2, 20]
    assert comps["lstm"]["measured"]["outputShapes"] == [[6, 20], [2, 20], [2, 20]]
    assert comps["head"]["inputShape"] == [20]


def test_sequence_first_transformer_and_attention():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)  # batch_first=False
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    graph = trace_model(model, torch.randn(7, 3, 16))  # (L=7, N=3, E=16)
    assert_clean(graph)
    assert graph["measured"]["batchSize"] == 3
    comps = by_name(graph)
    assert comps["layers.0.self_attn"]["inputShape"] == [7, 16]
    assert comps["layers.0.self_attn"]["outputShape"] == [7, 16]
    assert comps["layers.0.linear1"]["outputShape"] == [7, 32]
    assert comps["layers.0.add"]["outputShape"] == [7, 16]
    assert comps["output"]["inputShape"] == [7, 16]
    assert comps["x" if "x" in comps else "src"]["outputShape"] == [7, 16]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g1 = trace_model(model, torch.randn(7, 3, 16), depth=2)
    assert by_name(g1)["layers.0"]["type"] == "transformerBlock"
    assert by_name(g1)["layers.0"]["outputShape"] == [7, 16]


# --- 6. no_grad / inference_mode ----------------------------------------------------------------


def test_no_grad_and_inference_mode_regions():
    model = fm.PartlyNoGrad()
    graph = trace_model(model, torch.randn(1, 8))
    assert_clean(graph)
    assert sources_of(graph, "mid") == ["features"]
    assert sources_of(graph, "add") == ["mid", "features"]
    assert sources_of(graph, "head") == ["add"]
    # the head runs under inference_mode, where aten.linear arrives undecomposed: still counted
    assert by_name(graph)["head"]["measured"]["flops"] == 2 * 8 * 2
    assert graph["measured"]["uncountedOps"] == []


# --- 7. wrapped models --------------------------------------------------------------------------


# compile imports torch._dynamo: seconds, the full run's
@pytest.mark.parametrize("wrap", [pytest.param("compile", marks=pytest.mark.slow), "dataparallel", "ddp"])
def test_wrapped_models_trace_as_the_inner_model(wrap, tmp_path):
    model = fm.SharedParents()
    if wrap == "compile":
        wrapped = torch.compile(model)
    elif wrap == "dataparallel":
        wrapped = nn.DataParallel(model)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
        try:
            wrapped = nn.parallel.DistributedDataParallel(model)
            graph = trace_model(wrapped, torch.randn(1, 8))
        finally:
            dist.destroy_process_group()
        assert [c["name"] for c in graph["components"]] == ["x", "enc.0", "enc.1", "dec.0", "dec.1", "output"]
        return
    graph = trace_model(wrapped, torch.randn(1, 8))
    assert [c["name"] for c in graph["components"]] == ["x", "enc.0", "enc.1", "dec.0", "dec.1", "output"]
    assert all("module." not in c.get("scope", "") and "_orig_mod" not in c.get("scope", "")
               for c in graph["components"])
    assert graph["measured"]["params"] == unique_params(model)


# --- 8. TorchScript submodules ------------------------------------------------------------------


def test_torchscript_submodule_is_one_opaque_node():
    model = fm.WithScripted()
    graph = trace_model(model, torch.randn(1, 8))
    assert_clean(graph)
    node = by_name(graph)["scripted"]
    assert node["type"] == "customModule"
    assert node["params"] == {"className": "Sequential", "paramCount": 8 * 16 + 16 + 16 * 8 + 8}
    assert node["measured"]["flops"] == 2 * (8 * 16 + 16 * 8)
    assert sources_of(graph, "post") == ["scripted"]
    assert isinstance(model.scripted, torch.jit.ScriptModule)  # put back after the trace
    scripted_whole = torch.jit.script(nn.Sequential(nn.Linear(4, 4)))
    graph = trace_model(scripted_whole, torch.randn(1, 4))
    assert [c["type"] for c in graph["components"]] == ["input", "customModule", "output"]
    assert graph["measured"]["params"] == 20


# --- 9. keyword arguments, token ids and masks --------------------------------------------------


def test_keyword_inputs_with_mask():
    model = fm.KwargsModel()
    ids = torch.randint(0, 120, (2, 9))
    graph = trace_model(model, {"input_ids": ids, "token_type_ids": torch.zeros(2, 9, dtype=torch.long),
                                "attention_mask": torch.ones(2, 9, dtype=torch.long)})
    assert_clean(graph)
    assert [c["name"] for c in graph["components"] if c["type"] == "input"] == [
        "input_ids", "token_type_ids", "attention_mask"]
    assert sources_of(graph, "add") == ["tok", "typ"]
    assert sources_of(graph, "fc") == ["attention_mask", "add"]
    assert by_name(graph)["input_ids"]["outputShape"] == [9]


# --- 10. quantized and complex ------------------------------------------------------------------


def test_dynamically_quantized_model():
    float_model = fm.LSTMTagger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qmodel = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear, nn.LSTM}, dtype=torch.qint8)
        graph = trace_model(qmodel, torch.randint(0, 500, (2, 7)))
        reference = trace_model(fm.LSTMTagger(), torch.randint(0, 500, (2, 7)))
    assert_clean(graph)
    comps = by_name(graph)
    lstm_params = sum(p.numel() for p in fm.LSTMTagger().lstm.parameters())
    head_params = 96 * 9 + 9
    assert comps["lstm"]["type"] == "lstm" and comps["lstm"]["measured"]["packedParams"] == lstm_params
    assert comps["classifier"]["type"] == "linear"
    assert comps["classifier"]["measured"]["packedParams"] == head_params
    assert graph["measured"]["packedParams"] == lstm_params + head_params
    assert graph["measured"]["params"] == unique_params(qmodel) == 500 * 32  # only the float embedding
    assert graph["measured"]["flops"] == reference["measured"]["flops"]
    assert graph["measured"]["uncountedOps"] == []


def test_complex_valued_linear():
    model = fm.ComplexLinear()
    graph = trace_model(model, torch.randn(1, 8, dtype=torch.complex64))
    fc = by_name(graph)["fc"]
    assert fc["measured"]["outputDtype"] == "complex64"
    assert fc["measured"]["outputBytes"] == 4 * 8
    assert graph["measured"]["params"] == unique_params(model) == 36
    assert graph["measured"]["inputs"][0]["dtype"] == "complex64"
    assert fc["measured"]["flops"] == 4 * 2 * 8 * 4  # complex multiply-add = 4 real ones


def test_uncounted_operation_is_never_a_silent_zero():
    class FFTMix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return torch.fft.rfft(self.fc(x)).abs()

    class Spectral(nn.Module):
        def forward(self, x):
            return torch.fft.irfft(torch.fft.rfft(x))

    graph = trace_model(FFTMix(), torch.randn(1, 16))
    assert graph["measured"]["uncountedOps"] == ["aten._fft_r2c"]
    model = nn.Sequential(nn.Linear(16, 16), Spectral())
    graph = trace_model(model, torch.randn(1, 16))
    node = by_name(graph)["1"]
    assert node["measured"]["flops"] is None
    assert node["measured"]["uncounted"] == ["aten._fft_c2r", "aten._fft_r2c"]


# --- an independent check of the FLOP totals: closed forms for five architectures --------------


def resnet18_flops(image: int) -> int:
    """Convolutions and the classifier of ResNet-18, 2 FLOPs per multiply-add."""
    total = 0
    side = image // 2
    total += 2 * 3 * 64 * 7 * 7 * side * side  # stem
    side //= 2  # max pool
    in_c = 64
    for stage, planes in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            out_side = side // stride
            total += 2 * in_c * planes * 9 * out_side * out_side  # conv1
            total += 2 * planes * planes * 9 * out_side * out_side  # conv2
            if stride != 1 or in_c != planes:
                total += 2 * in_c * planes * out_side * out_side  # 1x1 projection
            in_c, side = planes, out_side
    return total + 2 * 512 * 1000


def transformer_layer_flops(tokens: int, width: int, ff: int) -> int:
    """Q, K, V and output projections, Q·Kᵀ and P·V, and a two-matrix MLP."""
    return 4 * 2 * tokens * width * width + 2 * 2 * tokens * tokens * width + 2 * 2 * tokens * width * ff


def test_flops_closed_form_resnet18():
    graph = trace_model(load_example("resnet").ResNet18(), torch.randn(1, 3, 224, 224))
    assert graph["measured"]["flops"] == resnet18_flops(224) == 3_628_146_688


def test_flops_closed_form_vit():
    graph = trace_model(fm.TinyViT(), torch.randn(1, 3, 32, 32))
    tokens, width = 17, 32
    patch = 2 * 3 * 32 * 8 * 8 * 16  # 16 patches of 8x8x3 to 32 channels
    expected = patch + 2 * transformer_layer_flops(tokens, width, 64) + 2 * width * 10
    assert graph["measured"]["flops"] == expected


def test_flops_closed_form_bert_and_gpt2():
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256, vocab_size=100))
    graph = trace_model(bert, torch.randint(0, 2, (1, 24)))
    assert graph["measured"]["flops"] == 3 * transformer_layer_flops(24, 64, 256) + 2 * 64 * 64  # + pooler
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_layer=3, n_head=4, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0))
    graph = trace_model(gpt2, torch.randint(0, 100, (2, 20)))
    per_sample = 3 * transformer_layer_flops(20, 64, 256) + 2 * 20 * 64 * 100  # + tied LM head
    assert graph["measured"]["flops"] == 2 * per_sample


def test_flops_closed_form_lstm_tagger():
    graph = trace_model(fm.LSTMTagger(), torch.randint(0, 500, (2, 7)))
    steps, emb, hidden, tags, dirs, gates = 2 * 7, 32, 48, 9, 2, 4
    layer0 = dirs * 2 * gates * hidden * (emb + hidden)
    layer1 = dirs * 2 * gates * hidden * (dirs * hidden + hidden)
    expected = steps * (layer0 + layer1) + steps * 2 * (dirs * hidden) * tags
    assert graph["measured"]["flops"] == expected


# --- more forwards from public bug reports -------------------------------------------------------


def test_list_input_lazy_layer_and_weight_norm():
    from torch.nn.utils.parametrizations import weight_norm

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.LazyLinear(8)
            self.b = weight_norm(nn.Linear(8, 3))

        def forward(self, xs):
            return self.b(self.a(xs[0]) + self.a(xs[1]))

    model = Model()
    graph = trace_model(model, ([torch.randn(2, 5), torch.randn(2, 5)],))
    assert_clean(graph)
    assert [c["name"] for c in graph["components"]] == ["xs.0", "xs.1", "a", "a#2", "add", "b", "output"]
    assert by_name(graph)["a"]["params"] == {"inFeatures": 5, "outFeatures": 8}  # materialised
    # weight norm keeps the direction (3x8) and the magnitude (3x1) plus the bias
    assert by_name(graph)["b"]["measured"]["params"] == 3 * 8 + 3 + 3
    assert graph["measured"]["params"] == unique_params(model) == 48 + 30


def test_layer_without_tensor_input_and_layer_without_tensor_output():
    class Queries(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 8))

        def forward(self):
            return self.weight

    class Logger(nn.Module):
        def forward(self, x):
            self.last_norm = float(x.detach().norm())
            return None

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.queries = Queries()
            self.proj = nn.Linear(8, 8)
            self.log = Logger()

        def forward(self, x):
            q = self.queries()
            y = self.proj(x) @ q.T
            self.log(y)
            return y

    graph = trace_model(Model(), torch.randn(2, 8))
    assert_clean(graph)
    comps = by_name(graph)
    assert sources_of(graph, "queries") == ["x"]  # fed by nothing: a synthetic edge from the input
    assert sources_of(graph, "output") == ["queries", "proj", "log"]  # the logger is a dead end
    synthetic = set(graph["measured"]["syntheticConnections"])
    assert {e["id"] for e in graph["connections"] if e["to"] == comps["queries"]["id"]} <= synthetic
    assert comps["log"]["measured"]["outputShapes"] == []
    assert comps["queries"]["measured"]["params"] == 32


def test_hidden_states_tuple_output_and_star_args():
    class StarArgs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, *xs):
            hidden = [sum(xs)]
            for layer in self.layers:
                hidden.append(layer(hidden[-1]))
            return hidden[-1], tuple(hidden)

    graph = trace_model(StarArgs(), (torch.randn(1, 4), torch.randn(1, 4)))
    assert_clean(graph)
    assert [c["name"] for c in graph["components"] if c["type"] == "input"] == ["input_0", "input_1"]
    assert sources_of(graph, "add") == ["input_0", "input_1"]
    assert sources_of(graph, "output") == ["layers.2", "add", "layers.0", "layers.1"]


def test_rezero_sequential_with_own_weights():
    # torchinfo #137: a Sequential subclass owning a parameter it reads in forward
    class ReZero(nn.Sequential):
        def __init__(self, *blocks: nn.Module) -> None:
            super().__init__(*blocks)
            self.register_parameter("weights", nn.Parameter(torch.zeros(len(blocks))))

        def forward(self, x):
            for k, block in enumerate(self):
                x = x + self.weights[k] * block(x)
            return x

    model = ReZero(nn.Linear(2, 2), nn.Linear(2, 2))
    graph = trace_model(model, torch.randn(1, 2))
    assert_clean(graph)
    assert graph["measured"]["params"] == 14 == unique_params(model)
    assert node_param_sum(graph) == 14
    assert sources_of(graph, "add") == ["x", "0"] and sources_of(graph, "add#2") == ["add", "1"]


def test_parameter_returned_and_inplace_scaling_of_the_input():
    # torchinfo #54 (a module that returns its parameter) and pytorch-summary #148 (x *= self.p)
    class Returns(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Parameter(torch.zeros(16, 64))

        def forward(self, x):
            return self.layer

    graph = trace_model(Returns(), torch.randn(1, 4))
    assert graph["measured"]["params"] == 1024 == node_param_sum(graph)
    assert_clean(graph)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.ones(1))
            self.conv1 = nn.Conv1d(1, 2, kernel_size=3)

        def forward(self, x):
            x *= self.p
            return self.conv1(x)

    graph = trace_model(Scaled(), torch.rand(4, 1, 10))
    assert_clean(graph)
    assert graph["measured"]["params"] == 9 == node_param_sum(graph)
    assert by_name(graph)["conv1"]["measured"]["params"] == 9  # its own 8 and the scale it consumes


def test_distribution_output_does_not_break_the_trace():
    # torchinfo #329: a forward returning torch.distributions.Categorical
    from torch.distributions import Categorical

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(10, 5)
            self.final = nn.LogSoftmax(dim=-1)

        def forward(self, x):
            return Categorical(logits=self.final(self.linear(x)))

    graph = trace_model(Policy(), torch.randn(1, 10))
    assert_clean(graph)
    assert [c["name"] for c in graph["components"]] == ["x", "linear", "final", "output"]
    assert sources_of(graph, "output") == ["final"]
    # Categorical keeps `logits` and `_param` as one tensor: one output (issue 16.2)
    dist = Policy()(torch.randn(1, 10))
    assert dist.logits is dist._param
    assert by_name(graph)["output"]["measured"]["outputShapes"] == [[5]]


def test_a_tensor_returned_twice_is_one_output():
    class Twice(nn.Module):
        def forward(self, x):
            y = x * 2
            return y, [x, y]

    model = nn.Sequential(nn.Linear(4, 4), Twice())
    graph = trace_model(model, torch.randn(3, 4))
    assert_clean(graph)
    twice = by_name(graph)["1"]["measured"]
    assert twice["outputShapes"] == [[4], [4]]  # y and x, y once
    assert twice["outputBytes"] == 2 * 3 * 4 * 4  # two tensors of 3x4 float32, not three
    assert by_name(graph)["output"]["measured"]["outputShapes"] == [[4], [4]]


# --- attributes that shadow nn.Module methods (issue 16.1) ----------------------------------------


@pytest.mark.parametrize("make", [fm.ShadowedMethods, fm.ShadowedChild])
def test_attributes_shadowing_module_methods(make):
    model = make()
    with pytest.raises(TypeError):  # PyTorch's own iterators call the shadowed attributes
        list(nn.Module.modules(model))
    graph = trace_model(model, torch.randn(3, 8))
    assert_clean(graph)
    prefix = "inner." if make is fm.ShadowedChild else ""
    layers = [f"{prefix}blocks.0", f"{prefix}blocks.1", f"{prefix}norm"] + (["head"] if prefix else [])
    assert [c["name"] for c in graph["components"]] == ["x", *layers, "output"]
    # blocks 8->8 and 8->4 with biases, the norm's weight and bias, and ShadowedChild's 4->2 head
    expected = (8 * 8 + 8) + (8 * 4 + 4) + 2 * 4 + (4 * 2 + 2 if prefix else 0)
    assert graph["measured"]["params"] == expected == node_param_sum(graph)
    assert graph["measured"]["buffers"] == 4 + 4 + 1  # running mean, running var, batches tracked
    assert by_name(graph)[f"{prefix}norm"]["type"] == "batchNorm"
    # the flags as they were (a new module trains), the hooks gone, the attributes untouched
    target = model.inner if prefix else model
    assert target.training and target.norm.training and target.blocks[0].training
    assert not target.blocks[0]._forward_hooks and not target.blocks[0]._forward_pre_hooks
    assert target.modules == list(target.blocks) and target.eval == "accuracy" and target.train == [True]
